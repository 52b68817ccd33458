"""Contract (issue 55, item 7): every estimator with its credit weight at zero reproduces GRPO.

With the knob that scales its credit term (the part that differs from GRPO's group-normalized
outcome advantage, METHODS.md §0-§1) switched off, an estimator's per-token advantages equal the
``grpo`` estimator's under the same normalisation settings (``std``, ``eps``, ``zero_std_tol``),
*exactly* (``torch.equal``, same dtype): every estimator covered computes GRPO's ``A_i`` with
:func:`creditlab.group_advantages` and, with its credit off, multiplies it by weights that are
exactly 1.0 (or leaves the rewards untouched), so no float re-ordering is involved and no
tolerance is granted. As a guard that the comparison can fail, the same knob switched on gives
different advantages on the same batch.

The batch (:func:`batch`) is built with the project's :func:`creditlab.testing.make_batch`: six
groups of four, mixed groups, an all-wrong and an all-right group, a partial-credit group,
responses of different lengths, reset suffixes (``trainable_from > 0``, some rows with nothing
trained) and segments (IBPO aligns segments first). The policy is the project's tiny random Llama
(:func:`tests.helpers.tiny_model_and_tokenizer`), so OAR's probes see real, position-dependent
importance, with a scripted sampler behind IBPO's ``repair`` requests.

:data:`EXCLUDED` names, with the reason, every registered estimator that has no such knob;
:func:`test_every_registered_estimator_is_covered_or_excluded` fails when an estimator is
registered without being added to :data:`CASES` or to :data:`EXCLUDED`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

import pytest
import torch
from creditlab import REGISTRIES, Advantages, Completion, Segments, Trajectory, build_part
from creditlab.step.policy import ModelPolicyHandle
from creditlab.testing import make_batch

from tests.helpers import tiny_model_and_tokenizer

GROUP_SIZE = 4
#: One row per trajectory, one line per group.
REWARDS = (
    1.0, 0.0, 0.0, 1.0,  # mixed
    0.0, 0.0, 0.0, 0.0,  # all wrong (zero-std group: GRPO gives exactly 0)
    1.0, 1.0, 1.0, 1.0,  # all right (zero-std group)
    0.0, 1.0, 0.0, 0.0,  # one right
    1.0, 1.0, 0.0, 1.0,  # one wrong
    0.25, 1.0, 0.5, 0.0,  # partial credit (three outcomes)
)
#: Reset suffixes: a row trains from this response position on (clamped to its length, so a
#: short row with a large value trains on nothing).
TRAINABLE_FROM = (
    0, 0, 2, 0,
    0, 1, 0, 0,
    0, 0, 0, 3,
    2, 0, 0, 0,
    0, 0, 4, 0,
    0, 1, 0, 0,
)
SEGMENT_LEN = 3


@cache
def policy():
    """The project's tiny random Llama and its char tokenizer (OAR's probes need a model whose
    read-out depends on earlier tokens; a bigram fake gives every token importance 0, weight 1)."""
    return tiny_model_and_tokenizer(seed=3)


def batch():
    """The rollout batch every case is estimated on (see the module docstring)."""
    _, tok = policy()
    b = make_batch(groups=len(REWARDS) // GROUP_SIZE, group_size=GROUP_SIZE, vocab=len(tok),
                   max_len=14, seed=11, rewards=REWARDS, trainable_from=TRAINABLE_FROM)
    lengths = [len(t.completion.response_ids) for t in b.trajectories]
    spans = tuple(tuple((a, min(a + SEGMENT_LEN, n)) for a in range(0, n, SEGMENT_LEN))
                  for n in lengths)
    return replace(b, segments=Segments(spans))


def repairs(problems, requests, seed):
    """IBPO ``repair``'s scripted sampler: the attempt (read back from the repair prompt) with its
    second half rewritten, so the repair keeps some of the attempt's tokens and replaces others."""
    _, tok = policy()
    out = []
    for problem, request in zip(problems, requests):
        prompt = tok.decode(list(request.prompt_ids))
        # (the char tokenizer encodes the prompt's "\n\n" as one <unk>)
        attempt = prompt.split("Attempt:\n", 1)[1].rsplit("Rewritten attempt:", 1)[0]
        attempt = attempt.removesuffix(tok.unk_token).strip()
        ids = tok.encode(attempt, add_special_tokens=False)
        fixed = (*ids[: len(ids) // 2], *tok.encode("fixed", add_special_tokens=False))
        logprobs = tuple(-0.1 for _ in fixed)
        completion = Completion(tuple(request.prompt_ids), fixed, logprobs, "eos", "")
        out.append(Trajectory(problem, completion, 1.0, -1, 0))
    return out


def fresh_ctx() -> ModelPolicyHandle:
    """A new policy handle per estimate (its rng restarts: OAR-G's noise, reward_flip's draws)."""
    model, tok = policy()
    rng = torch.Generator().manual_seed(0)
    return ModelPolicyHandle(model, tok, None, rng, rollout_fn=repairs)


#: GRPO's normalisation settings the comparison runs under (each estimator gets the same ones).
NORMS = (
    {"std": "sample"},  # TRL/verl, GRPO's default
    {"std": "population", "eps": 0.0},  # the SRPO code's
    {"std": "none"},  # Dr. GRPO's centring
)


@dataclass(frozen=True)
class Case:
    """One estimator configuration whose credit term is off.

    Attributes:
        name: Registered estimator name.
        zero: Options (YAML keys) that switch its credit term off.
        nonzero: Option sets that switch (part of) it back on; each must change the advantages.
        reason: ``None`` when ``zero`` must reproduce GRPO exactly; else what differs (the case is
            a strict xfail: it must keep failing until the estimator changes).
        label: Tells cases of one estimator apart in test ids.
        ran: ``(metric, predicate)`` pairs the zero-credit estimate's metrics must satisfy: the
            credit machinery ran on this batch (rows probed, groups aligned, repairs made) and its
            output was weighted away, rather than never computed.
    """

    name: str
    zero: dict
    nonzero: tuple[dict, ...]
    reason: str | None = None
    label: str = ""
    ran: tuple[tuple[str, Callable[[float], bool]], ...] = ()

    @property
    def id(self) -> str:
        return self.name + (f"[{self.label}]" if self.label else "")


OAR_BETA_ONLY = (
    "OAR's beta only scales the high-tier boost 1 + beta (n - tau) / (1 - tau); at beta = 0 the "
    "low tier (n < tau) still gets max(n / tau, w_floor) < 1 (w_floor = 0.1) and mass "
    "preservation raises the other tokens above 1, so the tokens' advantages differ from GRPO's "
    "(the row's sum is GRPO's). GRPO needs beta = 0 *and* w_floor = 1 (or q = 0)."
)


def POSITIVE(x: float) -> bool:  # noqa: N802 - read as a constant in CASES
    return x > 0


def ZERO(x: float) -> bool:  # noqa: N802
    return x == 0


def PROPER_FRACTION(x: float) -> bool:  # noqa: N802 - some tokens marked, not all
    return 0 < x < 1


CASES: tuple[Case, ...] = (
    # OAR-P / OAR-G: A_{i,t} = A_i * w_t; the reshaping has two strengths, the high-tier boost
    # `beta` and the low-tier suppression 1 - `w_floor`. Both off: every weight is exactly 1.0.
    *(
        Case(name, {"beta": 0.0, "w_floor": 1.0},
             ({"beta": 1.0, "w_floor": 1.0}, {"beta": 0.0, "w_floor": 0.1},
              {"beta": 1.0, "w_floor": 0.1}),
             label="beta=0,w_floor=1",
             ran=(("probed_rows", POSITIVE), ("reasoning_tokens", POSITIVE)))
        for name in ("oar_p", "oar_g")
    ),
    # ... `beta` alone at 0 is not GRPO (documented here as a strict xfail).
    *(
        Case(name, {"beta": 0.0}, ({"beta": 1.0},), reason=OAR_BETA_ONLY, label="beta=0")
        for name in ("oar_p", "oar_g")
    ),
    # IBPO: shared tokens get weight w_min, divergent ones 1, then mass preservation; the credit
    # strength is 1 - w_min, off at w_min = 1 (every weight exactly 1.0), in both modes.
    Case("ibpo", {"w_min": 1.0}, ({"w_min": 0.1}, {"w_min": 0.0}), label="contrast",
         ran=(("mixed_groups", POSITIVE), ("divergent_frac", PROPER_FRACTION))),
    Case("ibpo", {"mode": "repair", "w_min": 1.0}, ({"mode": "repair", "w_min": 0.1},),
         label="repair", ran=(("repair_requests", POSITIVE), ("repair_failures", ZERO),
                              ("divergent_frac", PROPER_FRACTION))),
    # reward_flip (a control): rewards flipped with probability `rate` before GRPO's statistics;
    # at rate 0 nothing is flipped.
    Case("reward_flip", {"rate": 0.0}, ({"rate": 0.25},)),
)

#: Registered estimators without a credit weight whose zero is GRPO, and why.
EXCLUDED: dict[str, str] = {
    "grpo": "the reference itself",
    "dr_grpo": "GRPO's own class with std='none' by default: no credit term; GRPO at std='none' "
               "(one of NORMS) is its advantage",
    "mc_value": "no knob and no GRPO term: its advantages are V(s_{t+1}) - V(s_t) of Monte-Carlo "
                "continuations, never group-normalized (`rollouts` only sets K)",
    "rredcot": "`mix` weighs the plain GRPO advantage that is *added* to the redistributed credit; "
               "the credit itself has no scale knob (mix = 0 is pure redistribution; norm and "
               "single_outcome only renormalize it), so no setting turns it off",
    "oracle_credit": "no knob: the control zeroes a blamed row's advantage before the oracle's "
                     "first wrong thought (test_controls.py checks it against GRPO)",
    "sham_credit": "no knob: zeroes as many of a blamed row's tokens as oracle_credit, at random",
    "anti_credit": "no knob: zeroes a blamed row's advantage from the first wrong thought on",
    "raft": "no knob and no GRPO term: A_i = 1 on a success, 0 otherwise, never centred or "
            "normalized (`threshold` only sets what a success is)",
}


def registered() -> set[str]:
    """This distribution's registered advantage estimators (as tests/contract does)."""
    reg = REGISTRIES["advantage"]
    return {n for n in reg.names() if reg.entries[n].dist == "creditlab"}


def estimate(name: str, options: dict, norm: dict) -> Advantages:
    est = build_part("advantage", {"name": name, **norm, **options})
    return est.estimate(batch(), fresh_ctx())


def grpo_of(name: str, options: dict, norm: dict) -> torch.Tensor:
    """GRPO's advantages under the normalisation the configured estimator actually uses."""
    cfg = build_part("advantage", {"name": name, **norm, **options}).config
    grpo = build_part("advantage", {"name": "grpo", "std": cfg.std, "eps": cfg.eps,
                                    "zero_std_tol": cfg.zero_std_tol})
    return grpo.estimate(batch(), fresh_ctx()).values


def _params():
    for case in CASES:
        marks = ([pytest.mark.xfail(strict=True, raises=AssertionError, reason=case.reason)]
                 if case.reason else [])
        for norm in NORMS:
            yield pytest.param(case, norm, marks=marks, id=f"{case.id}-{norm['std']}")


def test_the_batch_is_not_trivial():
    b = batch()
    groups = [REWARDS[i : i + GROUP_SIZE] for i in range(0, len(REWARDS), GROUP_SIZE)]
    assert any(set(g) == {0.0} for g in groups) and any(set(g) == {1.0} for g in groups)
    assert sum(len(set(g)) > 1 for g in groups) >= 3
    lengths = b.response_mask.sum(1)
    trained = b.loss_mask.sum(1)
    assert len(set(lengths.tolist())) >= 5, "responses of different lengths"
    assert bool((trained < lengths).any()), "some reset suffixes"
    for norm in NORMS:
        assert bool((grpo_of("grpo", {}, norm) != 0).any())


@pytest.mark.parametrize("case,norm", list(_params()))
def test_credit_weight_zero_is_grpo_exactly(case: Case, norm: dict):
    out = estimate(case.name, case.zero, norm)
    for key, ok in case.ran:
        value = float(out.metrics[key])
        assert ok(value), f"{case.id}: the credit did not run: {key}={value} ({ok.__name__})"
    got, want = out.values, grpo_of(case.name, case.zero, norm)
    assert got.dtype == want.dtype and got.shape == want.shape
    diff = float((got.double() - want.double()).abs().max())
    assert torch.equal(got, want), f"{case.id} {case.zero} differs from GRPO by up to {diff:.3g}"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if c.reason is None])
def test_credit_weight_nonzero_differs(case: Case):
    """The guard: the comparison above can fail (each nonzero setting moves some advantage). One
    normalisation suffices: the knobs act on the weights, whatever divides ``A_i``."""
    norm = NORMS[0]
    want = grpo_of(case.name, case.zero, norm)
    for options in case.nonzero:
        got = estimate(case.name, options, norm).values
        diff = float((got.double() - want.double()).abs().max())
        assert diff > 1e-3, f"{case.id} with {options} is still GRPO (max |diff| {diff:.3g})"


def test_every_registered_estimator_is_covered_or_excluded():
    covered = {c.name for c in CASES}
    assert not covered & set(EXCLUDED), "an estimator is both covered and excluded"
    assert covered | set(EXCLUDED) == registered(), (
        "a registered estimator is neither in CASES (its credit weight at zero must reproduce "
        "GRPO) nor in EXCLUDED (with the reason it has no such knob): "
        f"{sorted(registered() - covered - set(EXCLUDED))}; stale: "
        f"{sorted((covered | set(EXCLUDED)) - registered())}"
    )
