"""Reset selectors of RRPO / SRPO / oracle (plugins/creditlab_resets): parser, prompt, selectors."""

from __future__ import annotations

import pytest
import torch
from creditlab.errors import ConfigError, InputError
from creditlab.registry import build_part, registry
from creditlab.step.generation import thought_spans
from creditlab.testing import FakePolicyHandle
from creditlab.types import Completion, Problem, ResetPoint, Trajectory
from creditlab_resets.localize import localization_prompt, parse_localization
from creditlab_resets.selectors import (
    OracleResetSelector,
    RandomResetSelector,
    SelfLocalizeResetSelector,
)

DELIM = "</thought>"


# -- helpers ------------------------------------------------------------------------------------
def _seed(problem: Problem, text: str, tok, *, eos: bool = False) -> tuple[Trajectory, tuple]:
    """A failed chain of ``problem`` whose response is ``text`` tokenized, and its thought spans."""
    ids = tuple(tok(text, add_special_tokens=False)["input_ids"])
    if eos:
        ids += (tok.eos_token_id,)
    delim = tok(DELIM, add_special_tokens=False)["input_ids"]
    completion = Completion((1, 2), ids, tuple(-0.5 for _ in ids), "eos", text)
    return Trajectory(problem, completion, 0.0, 0, role="seed"), thought_spans(ids, delim)


@pytest.fixture(scope="module")
def char_tok():
    from tests.helpers import char_tokenizer

    return char_tokenizer()


@pytest.fixture(scope="module")
def arith_problems():
    from creditlab_arith.task import ArithTask

    task = ArithTask(ArithTask.Config(num_train=1, num_test=40, min_steps=3, max_steps=4))
    return task.load("test")


# -- parser -------------------------------------------------------------------------------------
PARSE_TABLE = [
    # (answer text, n, expected (N, status))
    ("\\boxed{3}", 5, (3, "boxed")),
    ("Reasoning...\n\\boxed{ 4 }", 5, (4, "boxed")),
    ("maybe \\boxed{2}, no: \\boxed{4}", 5, (4, "boxed")),  # the last box wins
    ("\\boxed{0}", 5, (1, "no_error")),
    ("The derailing step is Step 3.", 5, (3, "step_phrase")),
    ("step 2 looks fine but STEP 4 is wrong", 5, (4, "step_phrase")),  # last phrase, any case
    ("\\boxed{Step 3}", 5, (3, "step_phrase")),  # not an integer: the phrase inside still counts
    ("Step 2 is wrong. \\boxed{9}", 5, (2, "step_phrase")),  # boxed out of range falls through
    ("\\boxed{7}", 5, (1, "fallback")),  # out of range, nothing else: parse failure, not clamped
    ("\\boxed{-1}", 5, (1, "fallback")),
    ("\\boxed{2} then \\boxed{9}", 5, (1, "fallback")),  # only the last box is consulted
    ("Step 9 is wrong", 5, (1, "fallback")),  # the last phrase out of range
    ("footstep 2", 5, (1, "fallback")),  # a phrase must start a word
    ("\\boxed{3", 5, (1, "fallback")),  # unclosed box
    ("\\boxed{\\text{2}}", 5, (1, "fallback")),
    ("garbage ###", 5, (1, "fallback")),
    ("", 5, (1, "fallback")),
    ("\\boxed{1}", 1, (1, "boxed")),
    ("\\boxed{2}", 1, (1, "fallback")),
    ("\\boxed{0}", 1, (1, "no_error")),
    ("Step 1", 1, (1, "step_phrase")),
    ("\\boxed{2}", 0, (1, "no_thoughts")),
]


@pytest.mark.parametrize(
    "text,n,expected", PARSE_TABLE, ids=[repr(t)[:40] for t, _, _ in PARSE_TABLE]
)
def test_parse_localization(text, n, expected):
    assert parse_localization(text, n) == expected


def test_parse_localization_never_raises():
    assert parse_localization(None, 4) == (1, "fallback")  # type: ignore[arg-type]


# -- prompt -------------------------------------------------------------------------------------
def test_localization_prompt_content():
    thoughts = ["7+5=12</thought>", "  12*3=35 </thought>", "", "35-4=\\boxed{31}</thought>"]
    prompt = localization_prompt("Start 7, +5, *3, -4.", thoughts)
    assert "Start 7, +5, *3, -4." in prompt
    assert "Step 1: 7+5=12\nStep 2: 12*3=35\nStep 3: \nStep 4: 35-4=\\boxed{31}" in prompt
    assert DELIM not in prompt
    assert "Step 5" not in prompt and "from 1 to 4" in prompt
    assert "\\boxed{N}" in prompt
    lower = prompt.lower()
    assert "wrong" in lower and "do not solve" in lower and "justified" in lower


def test_localization_prompt_custom_delimiter():
    prompt = localization_prompt("q", ["a\n\n", "b\n\n"], delimiter="\n\n")
    assert "Step 1: a\nStep 2: b\n" in prompt


# -- random (RRPO) ------------------------------------------------------------------------------
def _plain_seed(n_thoughts: int) -> tuple[Trajectory, tuple]:
    ids = tuple(range(1, 2 * n_thoughts + 1))
    spans = tuple((2 * i, 2 * i + 2) for i in range(n_thoughts))
    completion = Completion((1,), ids, tuple(-0.1 for _ in ids), "eos", "")
    return Trajectory(Problem("p", "q", "1"), completion, 0.0, 0, role="seed"), spans


def test_random_is_deterministic_under_the_step_generator():
    traj, spans = _plain_seed(7)
    sel = RandomResetSelector()

    def draws(seed):
        ctx = FakePolicyHandle(seed=seed)
        return [sel.select(traj, spans, ctx).segment for _ in range(40)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_random_is_uniform_over_thoughts():
    n, draws = 6, 6000
    traj, spans = _plain_seed(n)
    sel = RandomResetSelector()
    ctx = FakePolicyHandle(seed=0)
    points = [sel.select(traj, spans, ctx) for _ in range(draws)]
    counts = torch.bincount(torch.tensor([p.segment for p in points]), minlength=n)
    assert len(counts) == n  # every segment in [0, n-1], each drawn
    assert (counts - draws / n).abs().max() < 0.15 * draws / n  # > 5 sigma
    assert points[0].info["n_thoughts"] == n
    assert points[0].info["reset_point"] == points[0].segment + 1
    m = sel.metrics()
    assert m["selections"] == draws
    assert abs(m["reset_point_mean"] - 3.5) < 0.1
    assert abs(m["reset_point_rel_mean"] - 3.5 / n) < 0.02
    assert sel.metrics() == {}  # reset after reporting


def test_random_without_thoughts():
    traj, _ = _plain_seed(1)
    point = RandomResetSelector().select(traj, (), FakePolicyHandle())
    assert point.segment == 0 and point.info["status"] == "no_thoughts"


# -- self_localize (SRPO) -----------------------------------------------------------------------
CHAINS = [
    ("Start 7, +5, *3.", "7+5=12</thought>12*3=35</thought>35=\\boxed{35}</thought>"),
    ("Start 2, *4, -1.", "2*4=8</thought>8-1=\\boxed{6}</thought>"),
    ("Start 9, -3, +2.", "9-3=6</thought>6+2=\\boxed{9}</thought>"),
]


class _Recorder:
    """A scripted ``generate_fn`` answering request i with ``answers[i]`` and recording calls."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, requests, sampling):
        self.calls.append((list(requests), sampling))
        return [
            Completion(r.prompt_ids, (5,) * 3, (-0.2,) * 3, "eos", self.answers[i])
            for i, r in enumerate(requests)
        ]


def test_self_localize_one_batched_call(char_tok):
    seeds = [_seed(Problem(f"p{i}", q, "0"), t, char_tok) for i, (q, t) in enumerate(CHAINS)]
    gen = _Recorder(["I think Step 1 is fine, Step 2 is not.\n\\boxed{2}", "\\boxed{0}", "no idea"])
    ctx = FakePolicyHandle(tokenizer=char_tok, generate_fn=gen, seed=5)
    sel = SelfLocalizeResetSelector()
    points = sel.select_many([t for t, _ in seeds], [s for _, s in seeds], ctx)

    assert len(gen.calls) == 1
    requests, sampling = gen.calls[0]
    assert len(requests) == 3
    assert sampling.temperature == 0.3 and sampling.top_p == 1.0 and sampling.max_new_tokens == 64
    assert sampling.stop == () and isinstance(sampling.seed, int)
    texts = [char_tok.decode(r.prompt_ids) for r in requests]
    assert all(r.prefix_ids == () for r in requests)
    assert "Start 7, +5, *3." in texts[0] and "Step 2: 12*3=35\nStep 3: 35=\\boxed{35}" in texts[0]
    assert "Step 1: 2*4=8\nStep 2: 8-1=\\boxed{6}" in texts[1] and "Step 3" not in texts[1]
    assert "Start 9, -3, +2." in texts[2]
    assert not any(DELIM in t for t in texts)

    assert [p.segment for p in points] == [1, 0, 0]
    assert [p.info["status"] for p in points] == ["boxed", "no_error", "fallback"]
    assert [p.info["reset_point"] for p in points] == [2, 1, 1]
    assert [p.info["n_thoughts"] for p in points] == [3, 2, 2]
    assert points[2].info["localization"] == "no idea"

    m = sel.metrics()
    assert m["localizations"] == 3 and m["selections"] == 3
    assert m["parse_failure_rate"] == pytest.approx(1 / 3)
    assert m["no_error_rate"] == pytest.approx(1 / 3)
    assert m["boxed_rate"] == pytest.approx(1 / 3) and m["step_phrase_rate"] == 0
    assert m["reset_point_mean"] == pytest.approx(4 / 3)
    assert m["reset_point_rel_mean"] == pytest.approx((2 / 3 + 1 / 2 + 1 / 2) / 3)
    assert m["localization_tokens"] == 9
    assert sel.metrics() == {}


def test_self_localize_seed_is_drawn_from_the_step_generator(char_tok):
    traj, spans = _seed(Problem("p", *CHAINS[0][:1], "0"), CHAINS[0][1], char_tok)

    def run(seed):
        gen = _Recorder(["\\boxed{1}"])
        ctx = FakePolicyHandle(tokenizer=char_tok, generate_fn=gen, seed=seed)
        SelfLocalizeResetSelector().select(traj, spans, ctx)
        return gen.calls[0][1].seed

    assert run(1) == run(1) != run(2)


def test_self_localize_skips_seeds_without_thoughts(char_tok):
    traj, spans = _seed(Problem("p", "Start 1, +1.", "2"), "1+1=\\boxed{3}</thought>", char_tok)
    gen = _Recorder(["Step 1 \\boxed{1}"])
    ctx = FakePolicyHandle(tokenizer=char_tok, generate_fn=gen)
    cfg = SelfLocalizeResetSelector.Config(temperature=0.0, max_new_tokens=8)
    sel = SelfLocalizeResetSelector(cfg)
    points = sel.select_many([traj, traj], [(), spans], ctx)
    assert len(gen.calls) == 1 and len(gen.calls[0][0]) == 1
    assert gen.calls[0][1].temperature == 0.0 and gen.calls[0][1].max_new_tokens == 8
    info = {"n_thoughts": 0, "reset_point": 1, "status": "no_thoughts", "localization": ""}
    assert points[0] == ResetPoint(0, info)
    assert points[1].segment == 0 and points[1].info["status"] == "boxed"
    assert sel.select_many([traj], [()], ctx)[0].segment == 0 and len(gen.calls) == 1  # no call


def test_self_localize_problem_field(char_tok):
    problem = Problem(
        "p7", "Solve step by step: Start 1, +1.", "2", metadata={"question": "Start 1, +1."}
    )
    traj, spans = _seed(problem, "1+1=\\boxed{3}</thought>", char_tok)
    gen = _Recorder(["\\boxed{1}"])
    ctx = FakePolicyHandle(tokenizer=char_tok, generate_fn=gen)
    config = SelfLocalizeResetSelector.Config
    SelfLocalizeResetSelector(config(problem_field="question")).select(traj, spans, ctx)
    shown = char_tok.decode(gen.calls[0][0][0].prompt_ids)
    assert "Start 1, +1." in shown and "Solve step by step" not in shown
    with pytest.raises(InputError, match="nope.*p7"):
        SelfLocalizeResetSelector(config(problem_field="nope")).select(traj, spans, ctx)


def test_self_localize_config_through_registry():
    options = {"name": "self_localize", "temperature": 0.0, "max_new_tokens": 128}
    part = build_part("reset_selector", options)
    assert isinstance(part, SelfLocalizeResetSelector) and part.config.temperature == 0.0
    with pytest.raises(ConfigError, match="temperature"):
        build_part("reset_selector", {"name": "self_localize", "temperature": -1.0})
    with pytest.raises(ConfigError):
        build_part("reset_selector", {"name": "self_localize", "top_p": 0.0})
    assert registry("reset_selector").get("random") is RandomResetSelector
    assert registry("reset_selector").get("oracle") is OracleResetSelector


# -- oracle -------------------------------------------------------------------------------------
def _corrupt(thought: str) -> str:
    """The thought with its result (plain or boxed) increased by one."""
    head, result = thought.rsplit("=", 1)
    if result.startswith("\\boxed{"):
        return f"{head}=\\boxed{{{int(result[7:-1]) + 1}}}"
    return f"{head}={int(result) + 1}"


def test_oracle_finds_the_corrupted_thought(arith_problems):
    from creditlab_arith.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(DELIM)
    ctx = FakePolicyHandle(tokenizer=tok)
    sel = OracleResetSelector()
    checked = 0
    for problem in arith_problems[:10]:
        gold = list(problem.metadata["thoughts"])
        for k in range(len(gold)):
            thoughts = gold[:k] + [_corrupt(gold[k])] + gold[k + 1 :]
            traj, spans = _seed(problem, "".join(t + DELIM for t in thoughts), tok, eos=True)
            assert len(spans) == len(gold) + 1  # the EOS token is a span of its own
            point = sel.select(traj, spans, ctx)
            assert point.segment == k, (problem.prompt, thoughts)
            assert point.info["status"] == "oracle" and not point.info["clamped"]
            checked += 1
    assert checked >= 30
    m = sel.metrics()
    assert m["selections"] == checked and m["no_error_rate"] == 0 and m["clamped_rate"] == 0


def test_oracle_no_error_and_clamping(arith_problems):
    from creditlab_arith.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer(DELIM)
    ctx = FakePolicyHandle(tokenizer=tok)
    problem = arith_problems[0]
    gold = list(problem.metadata["thoughts"])
    sel = OracleResetSelector()
    traj, spans = _seed(problem, "".join(t + DELIM for t in gold), tok)
    point = sel.select(traj, spans, ctx)
    assert point.segment == 0 and point.info["status"] == "no_error"
    assert point.info["oracle_raw"] is None
    # One correct thought, the rest missing: the oracle blames thought 1 (absent) -> clamped to 0.
    traj, spans = _seed(problem, gold[0] + DELIM, tok)
    point = sel.select(traj, spans, ctx)
    assert point.segment == 0 and point.info["clamped"] and point.info["oracle_raw"] == 1
    m = sel.metrics()
    assert m["no_error_rate"] == 0.5 and m["clamped_rate"] == 0.5


def test_oracle_without_oracle_is_an_input_error(char_tok):
    traj, spans = _seed(Problem("gsm8k-test-17", "q", "1"), "a</thought>", char_tok)
    with pytest.raises(InputError) as err:
        OracleResetSelector().select(traj, spans, FakePolicyHandle(tokenizer=char_tok))
    msg = str(err.value)
    assert "gsm8k-test-17" in msg and "reset_selector=random" in msg and "self_localize" in msg


def test_self_localize_compact_template(char_tok):
    traj, spans = _seed(Problem("p", *CHAINS[0][:1], "0"), CHAINS[0][1], char_tok)
    gen = _Recorder([" \\boxed{3}"])
    ctx = FakePolicyHandle(tokenizer=char_tok, generate_fn=gen)
    sel = SelfLocalizeResetSelector(SelfLocalizeResetSelector.Config(template="compact"))
    point = sel.select(traj, spans, ctx)
    text = char_tok.decode(gen.calls[0][0][0].prompt_ids)
    assert text.startswith("Check: Start 7, +5, *3.\nStep 1: ") and text.endswith("\nFirst wrong step:")
    assert point.segment == 2 and point.info["status"] == "boxed"
    with pytest.raises(ConfigError, match="template"):
        SelfLocalizeResetSelector.Config(template="nope")
