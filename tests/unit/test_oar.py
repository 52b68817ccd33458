"""OAR-P / OAR-G (arXiv 2601.07408): reshaping, probes, importance against brute force and finite
differences, and the estimator contract on a real tiny model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.registry import build_part, registry
from creditlab.step.forward import position_ids
from creditlab.step.policy import ModelPolicyHandle
from creditlab.step.rollout import collate
from creditlab.testing import check_part, pad_batch
from creditlab.types import Completion, Problem, Trajectory
from creditlab_oar.advantage import OARGAdvantage, OARPAdvantage, reasoning_noise
from creditlab_oar.probe import build_probe, last_occurrence, pad_right, text_ids
from creditlab_oar.reshape import reshape_weights

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import assert_close_fp, lm_length

pytestmark = pytest.mark.usefixtures("one_thread")
MARKER = "\\boxed{"
PROMPT = "Start 2, *7, +5. "


# -- reshaping ----------------------------------------------------------------------------------
def _imp(scores):
    """Importance whose log1p is ``scores``."""
    return torch.tensor([math.expm1(s) for s in scores], dtype=torch.float64)


def test_reshape_hand_computed_tiers_floor_and_mass():
    imp = _imp([0.0, 0.25, 0.5, 1.0])  # n = [0, .25, .5, 1]; tau = quantile_.5 = .375
    mask = torch.ones(4, dtype=torch.bool)
    raw, high = reshape_weights(imp, mask, q=0.5, beta=1.0, w_floor=0.1, preserve_mass=False)
    want = torch.tensor([0.1, 0.25 / 0.375, 1 + 0.125 / 0.625, 2.0], dtype=torch.float64)
    torch.testing.assert_close(raw, want)  # 0/.375 = 0 is floored to 0.1
    assert high.tolist() == [False, False, True, True]
    w, _ = reshape_weights(imp, mask, q=0.5, beta=1.0, w_floor=0.1)
    torch.testing.assert_close(w, want * 4 / want.sum())
    torch.testing.assert_close(w.sum(), torch.tensor(4.0, dtype=torch.float64))
    w2, _ = reshape_weights(imp, mask, q=0.5, beta=3.0, w_floor=0.5, preserve_mass=False)
    want2 = torch.tensor([0.5, 0.25 / 0.375, 1 + 3 * 0.2, 4.0], dtype=torch.float64)
    torch.testing.assert_close(w2, want2)


def _reference(scores, q, beta, floor):
    """The formula of the authors' fragment (with its 1e-8 terms), in numpy."""
    s = np.log1p(np.asarray(scores, dtype=np.float64))
    rng = s.max() - s.min() if s.max() > s.min() else 1.0
    n = (s - s.min()) / rng
    tau = np.quantile(n, q)
    w = np.ones_like(n)
    low = n < tau
    w[low] = np.maximum(n[low] / (tau + 1e-8), floor)
    w[~low] = 1.0 + beta * (n[~low] - tau) / (1.0 - tau + 1e-8)
    return w * (len(w) / (w.sum() + 1e-8))


@pytest.mark.parametrize("q,beta,floor", [(0.5, 1.0, 0.1), (0.8, 0.5, 0.1), (0.3, 2.0, 0.0)])
def test_reshape_matches_the_code_formula_per_row_with_masks(q, beta, floor):
    gen = torch.Generator().manual_seed(0)
    imp = torch.rand(5, 9, generator=gen, dtype=torch.float64) * 3
    lengths = [9, 4, 7, 2, 5]
    mask = torch.arange(9)[None] < torch.tensor(lengths)[:, None]
    imp_garbage = torch.where(mask, imp, torch.full_like(imp, 1e6))  # values outside mask ignored
    w, _ = reshape_weights(imp_garbage, mask, q=q, beta=beta, w_floor=floor)
    for r, n in enumerate(lengths):
        want = _reference(imp[r, :n].numpy(), q, beta, floor)
        np.testing.assert_allclose(w[r, :n].numpy(), want, rtol=1e-6)
        assert (w[r, n:] == 1).all()


def test_reshape_edge_cases_never_nan():
    mask = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    nan = float("nan")
    imp = torch.tensor([[5.0, 1, 2, 3], [7.0, 0, 0, 0], [2.0, 2, 2, 9], [-3.0, 0.5, nan, 1]])
    w, high = reshape_weights(imp, mask)
    assert torch.isfinite(w).all()
    assert (w[0] == 1).all() and (w[1] == 1).all()  # L = 0, L = 1
    assert (w[2] == 1).all() and high[2, :3].all()  # constant row: weight 1 (code: n = 0, high)
    torch.testing.assert_close(w[3].sum(), torch.tensor(4.0))  # negative / NaN importance -> 0
    assert w.dtype == torch.float32
    row = _imp([0.0, 0.2, 0.6, 1.0]).float()[None]
    ones = torch.ones_like(row, dtype=torch.bool)
    for q in (0.0, 1.0):  # tau = 0 (no low tier) and tau = 1 (high tier = the max only, weight 1)
        raw, hi = reshape_weights(row, ones, q=q, beta=1.0, preserve_mass=False)
        assert torch.isfinite(raw).all()
        want = [1.0, 1.2, 1.6, 2.0] if q == 0 else [0.1, 0.2, 0.6, 1.0]
        torch.testing.assert_close(raw[0], torch.tensor(want), atol=1e-6, rtol=0)
        assert hi[0].tolist() == ([True] * 4 if q == 0 else [False, False, False, True])
        w, _ = reshape_weights(row, ones, q=q, beta=1.0)
        torch.testing.assert_close(w.sum(), torch.tensor(4.0))
    with pytest.raises(ValueError):
        reshape_weights(row, ones, q=1.5)


def test_reshape_negative_importance_signed_or_clamped():
    imp = torch.tensor([-0.5, 0.0, 0.5, 1.0], dtype=torch.float64)
    ones = torch.ones(4, dtype=torch.bool)
    kw = dict(q=0.5, beta=1.0, w_floor=0.1, preserve_mass=False)
    signed, _ = reshape_weights(imp, ones, negative="signed", **kw)
    s = torch.tensor([-math.log(1.5), 0.0, math.log(1.5), math.log(2.0)], dtype=torch.float64)
    n = (s - s[0]) / (s[-1] - s[0])
    tau = (n[1] + n[2]) / 2
    want = torch.stack([torch.tensor(0.1, dtype=torch.float64), n[1] / tau,
                        1 + (n[2] - tau) / (1 - tau), torch.tensor(2.0, dtype=torch.float64)])
    torch.testing.assert_close(signed, want)  # the masked-helps-the-answer token ranks lowest
    clamped, _ = reshape_weights(imp, ones, negative="clamp", **kw)
    n2 = math.log(1.5) / math.log(2)  # n = [0, 0, n2, 1], tau = n2 / 2
    want = torch.tensor([0.1, 0.1, 1 + (n2 / 2) / (1 - n2 / 2), 2.0], dtype=torch.float64)
    torch.testing.assert_close(clamped, want)
    with pytest.raises(ValueError):
        reshape_weights(imp, ones, negative="abs")


# -- probes and batches on the tiny char model -------------------------------------------------
@pytest.fixture(scope="module")
def model_tok():
    model, tok = tiny_model_and_tokenizer(seed=3)
    return model, tok


def _traj(tok, reasoning, answer, reward, finish="eos", trainable_from=0, group=0, prompt=PROMPT):
    """A trajectory ``reasoning (+ marker + answer) (+ eos)``; ``answer=None``: no marker."""
    ids = tok.encode(reasoning) + (tok.encode(MARKER + answer) if answer is not None else [])
    if finish == "eos":
        ids = ids + [tok.eos_token_id]
    c = Completion(tuple(tok.encode(prompt)), tuple(ids), tuple([-0.1] * len(ids)), finish, "")
    return Trajectory(Problem("p", prompt, "19"), c, reward, group, trainable_from)


def _batch(tok):
    """One mixed group: a correct chain, a wrong one, one without marker (truncated), one with two
    markers and a reset prefix of 4 tokens; plus a group whose outcomes are all equal."""
    trajs = [
        _traj(tok, "2*7=14</thought>14+5=", "19}</thought>", 1.0),
        _traj(tok, "2*7=15</thought>15+5=", "20}", 0.0, prompt="Start 2, *7. "),
        _traj(tok, "2*7=14</thought>14+5=19", None, 0.0, finish="length"),
        _traj(tok, "try \\boxed{3} no, 2*7+5=", "19}", 1.0, trainable_from=4),
        _traj(tok, "1+1=", "2}", 1.0, group=1),
        _traj(tok, "1+2=", "3}", 1.0, group=1),
    ]
    return collate(trajs, tok.pad_token_id)


def _ctx(model, tok, seed=0):
    return ModelPolicyHandle(model, tok, None, torch.Generator().manual_seed(seed))


def test_probe_split_marker_eos_and_fallback(model_tok):
    model, tok = model_tok
    batch, ctx = _batch(tok), _ctx(*model_tok)
    marker = text_ids(MARKER, ctx)
    assert last_occurrence([1, 2, 3, 1, 2], [1, 2]) == 3 and last_occurrence([1, 2], []) is None
    cue = tuple(tok.encode("So \\boxed{"))
    p0 = build_probe(batch, 0, marker, cue, "answer_joint", tok.eos_token_id)
    reasoning = tok.encode("2*7=14</thought>14+5=")
    answer = tok.encode("19}</thought>")
    assert p0.ids.tolist() == tok.encode(PROMPT) + reasoning + list(cue) + answer
    assert p0.n_reasoning == len(reasoning) and p0.scored.tolist() == list(range(len(reasoning)))
    assert p0.mode == "answer_joint" and p0.answer_len == len(tok.encode("19}</thought>"))
    p2 = build_probe(batch, 2, marker, cue, "answer_joint", tok.eos_token_id)  # no marker, no EOS
    assert p2.fallback and p2.mode == "last" and not p2.marker_found
    assert p2.n_reasoning == len(tok.encode("2*7=14</thought>14+5=19"))
    p3 = build_probe(batch, 3, marker, (), "last", tok.eos_token_id)  # last marker, reset prefix
    assert p3.n_reasoning == len(tok.encode("try \\boxed{3} no, 2*7+5="))
    assert p3.scored[0] == 4 and p3.read_positions == [p3.ids.numel() - 1]


# -- OAR-P against a brute-force loop ------------------------------------------------------------
def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double()


def _readout(model, ids, mode, prefix_len, answer):
    """Brute force, one unpadded sequence: distribution logits (last/answer_mean) or phi."""
    logits = _logits(model, ids)
    if mode == "last":
        return logits[prefix_len - 1]
    pos = list(range(prefix_len - 1, prefix_len - 1 + len(answer)))
    if mode == "answer_mean":
        return logits[pos].mean(0)
    return torch.log_softmax(logits[pos], -1).gather(-1, torch.tensor(answer)[:, None]).mean()


def _kl(p, q):
    """KL(softmax p || softmax q), a float64 tensor (differentiable in q)."""
    lp, lq = torch.log_softmax(p.double(), -1), torch.log_softmax(q.double(), -1)
    return (lp.exp() * (lp - lq)).sum()


@pytest.mark.parametrize("mode", ["last", "answer_mean", "answer_joint"])
@pytest.mark.numerics
def test_oar_p_importance_equals_brute_force(model_tok, mode):
    model, tok = model_tok
    batch = _batch(tok)
    cue = "Thus \\boxed{"
    est = OARPAdvantage(OARPAdvantage.Config(mode=mode, cue=cue, chunk_size=7, mask_token_id=5))
    imp, reasoning = est.importance(batch, _ctx(model, tok), rows=[0, 1, 2, 3])
    specs = {  # row: (reasoning text, answer text or None, first trained position)
        0: ("2*7=14</thought>14+5=", "19}</thought>", 0),
        1: ("2*7=15</thought>15+5=", "20}", 0),
        2: ("2*7=14</thought>14+5=19", None, 0),
        3: ("try \\boxed{3} no, 2*7+5=", "19}", 4),
    }
    for row, (text, answer, start) in specs.items():
        prompt = tok.encode(batch.trajectories[row].problem.prompt)
        reason, cue_ids = tok.encode(text), tok.encode(cue)
        eff = mode if answer is not None else "last"
        ans = tok.encode(answer) if (answer is not None and eff != "last") else []
        prefix_len = len(prompt) + len(reason) + len(cue_ids)
        clean = _readout(model, prompt + reason + cue_ids + ans, eff, prefix_len, ans)
        want = []
        for t in range(start, len(reason)):
            masked = list(reason)
            masked[t] = 5
            pert = _readout(model, prompt + masked + cue_ids + ans, eff, prefix_len, ans)
            want.append(float(clean - pert) if eff == "answer_joint" else float(_kl(clean, pert)))
        got = imp[row, start : len(reason)]
        assert reasoning[row].nonzero().flatten().tolist() == list(range(start, len(reason)))
        want = torch.tensor(want, dtype=torch.float64)
        # a difference of two float32 readouts (log-probs or a KL of log-probs) of a few nats
        n = lm_length(model.config, len(prompt) + len(reason) + len(cue_ids) + len(ans))
        assert_close_fp(got.double(), want, length=n, scale=max(1.0, float(clean.abs().max())),
                        dtype=torch.float32)
        assert want.abs().max() > 1e-4  # the probe does see the reasoning
    assert not reasoning[4:].any()
    m = est.call_metrics()
    assert m["answer_fallback"] == (1 if mode != "last" else 0) and m["marker_missing"] == 1
    n_scored = sum(len(tok.encode(s[0])) - s[2] for s in specs.values())
    assert m["probe_forwards"] == n_scored + 4


@pytest.mark.numerics
def test_oar_p_chunking_does_not_change_importance(model_tok, monkeypatch):
    batch, ctx = _batch(model_tok[1]), _ctx(*model_tok)
    a, _ = OARPAdvantage(OARPAdvantage.Config(chunk_size=0)).importance(batch, ctx)
    monkeypatch.setattr("creditlab_oar.advantage.BLOCK_CHUNKS", 1)  # blocks of one chunk, to see them
    calls = []
    reads = ctx.branch_read_logits
    ctx.branch_read_logits = lambda ids, att, rows, *a, **k: calls.append((len(ids), len(rows))) or reads(ids, att, rows, *a, **k)
    b, _ = OARPAdvantage(OARPAdvantage.Config(chunk_size=3)).importance(batch, ctx)
    # the same readouts in other batch shapes: log-prob differences (KLs) of log-probs of ~1 nat
    assert_close_fp(a, b, length=lm_length(ctx.model.config, batch.input_ids.shape[1]), scale=1.0)
    # blocks of whole probes: each clean probe is a trunk once, and a call holds at most 3 branches
    # unless one probe alone has more (its read logits and KL stay bounded by chunk_size)
    assert len(calls) > 1 and sum(t for t, _ in calls) <= batch.size  # no trunk twice
    assert all(j <= 3 or t == 1 for t, j in calls)


@pytest.mark.numerics
def test_oar_g_cuts_gradient_calls_by_the_handles_rows_and_tokens(model_tok):
    """chunk_size 0: consecutive rows under the handle's micro_batch_size / micro_batch_tokens, as
    the update cuts its micro-batches; the same importance (the noise drawn in the same order)."""
    from creditlab_oar.advantage import grad_chunks

    model, tok = model_tok
    batch = _batch(tok)
    est = OARGAdvantage(OARGAdvantage.Config(mode="answer_mean"))
    ctx = _ctx(model, tok, seed=3)
    calls = []
    grads = ctx.input_gradients
    ctx.input_gradients = lambda ids, *a, **k: calls.append(tuple(ids.shape)) or grads(ids, *a, **k)
    whole, _ = est.importance(batch, ctx)
    width = max(w for _, w in calls)
    assert calls[-1][0] == 6  # the one-token template pass, then every probed row in one call
    ctx = _ctx(model, tok, seed=3)
    ctx.micro_batch_tokens = 2 * width  # two of the widest rows a call
    calls.clear()
    grads = ctx.input_gradients
    ctx.input_gradients = lambda ids, *a, **k: calls.append(tuple(ids.shape)) or grads(ids, *a, **k)
    cut, _ = OARGAdvantage(OARGAdvantage.Config(mode="answer_mean")).importance(batch, ctx)
    assert len(calls) >= 3 and all(b * w <= 2 * width for b, w in calls)
    # saliency |sum_d grad_d emb_d| of a KL's gradient at noise sigma: p - q of distributions that
    # differ by O(sigma), so its terms are ~1/sigma larger than it (the rounding is theirs)
    assert_close_fp(cut, whole, length=lm_length(model.config, width, backward=True) + model.config.hidden_size,
                    scale=float(whole.abs().max()) / est.config.sigma)
    # the runs themselves: rows x longest <= the budget, a longer sequence alone, order kept
    fake = [SimpleNamespace(ids=torch.zeros(n, dtype=torch.long)) for n in (5, 5, 5, 12, 3, 30, 2)]
    ctx.micro_batch_tokens, ctx.micro_batch_size = 24, 0
    runs = grad_chunks(fake, 0, ctx)
    assert [[len(p.ids) for p in r] for r in runs] == [[5, 5, 5], [12, 3], [30], [2]]
    ctx.micro_batch_tokens, ctx.micro_batch_size = 0, 2
    assert [len(r) for r in grad_chunks(fake, 0, ctx)] == [2, 2, 2, 1]
    assert [len(r) for r in grad_chunks(fake, 3, ctx)] == [3, 3, 1]  # chunk_size set: it rules
    ctx.micro_batch_size = 0
    assert [len(r) for r in grad_chunks(fake, 0, ctx)] == [7]  # no bound: one call


# -- OAR-G against brute force and finite differences -------------------------------------------
def _oar_g_setup(model, tok, mode, sigma, seed=5):
    batch = collate([_traj(tok, "2*7=14</thought>14+5=", "19}</thought>", 1.0),
                     _traj(tok, "2*7=15</thought>15+5=", "20}", 0.0)], tok.pad_token_id)
    est = OARGAdvantage(OARGAdvantage.Config(mode=mode, sigma=sigma))
    imp, _ = est.importance(batch, _ctx(model, tok, seed))
    marker = tuple(tok.encode(MARKER))
    probes = [build_probe(batch, r, marker, marker, mode, tok.eos_token_id) for r in range(2)]
    ids, att = pad_right([p.ids for p in probes], tok.pad_token_id)
    e0 = model.get_input_embeddings()(ids).detach()
    noise = reasoning_noise(probes, e0, sigma, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        clean = model(inputs_embeds=e0, attention_mask=att, position_ids=position_ids(att)).logits

    def objective(emb):
        """J at input embeddings ``emb``, summed over rows, teacher from the clean forward."""
        logits = model(inputs_embeds=emb, attention_mask=att, position_ids=position_ids(att)).logits
        total = torch.zeros((), dtype=torch.float64)
        for j, p in enumerate(probes):
            pos = p.read_positions
            if p.mode == "answer_joint":
                tgt = p.ids[p.cue_end : p.cue_end + p.answer_len][:, None]
                lp0 = torch.log_softmax(clean[j, pos].double(), -1)
                lp = torch.log_softmax(logits[j, pos].double(), -1)
                total = total + lp0.gather(-1, tgt).mean() - lp.gather(-1, tgt).mean()
            else:
                total = total + _kl(clean[j, pos].mean(0), logits[j, pos].mean(0))
        return total

    return imp, probes, e0, noise, objective, est


def _rms_norm64(self, x):
    """Llama's RMSNorm without its float32 round trip (so a float64 model is float64 throughout)."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.fixture(scope="module")
def model64():
    import types

    model, tok = tiny_model_and_tokenizer(seed=3)
    model = model.double()
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_rms_norm64, module)
    return model, tok


SIGMA = OARGAdvantage.Config().sigma  # the default, the code's 1e-3


@pytest.mark.parametrize("mode", ["last", "answer_mean", "answer_joint"])
def test_oar_g_is_the_exact_noisy_gradient(model64, mode):
    """The paper's I_t = |<dJ/dE (E + eps), E_t>| at the default sigma, against a hand forward on
    inputs_embeds = E + eps and autograd (float64 model: equal to rounding)."""
    model, tok = model64
    imp, probes, e0, noise, J, est = _oar_g_setup(model, tok, mode, SIGMA)
    assert SIGMA == 1e-3
    e = (e0 + noise).requires_grad_(True)
    (grad,) = torch.autograd.grad(J(e), e)
    exact = (grad * e0).sum(-1).abs()
    for j, p in enumerate(probes):
        got, want = imp[p.row, p.scored].double(), exact[j, p.reasoning_start + p.scored]
        assert want.max() > 1e-6  # the noise does move the read-out
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-12)  # I is stored as float32
    # one noisy pass over both rows, a clean read-out pass (KL modes) and the one-token pass that
    # gives the noise its width (the estimator's first call only)
    assert est.call_metrics()["probe_forwards"] == (5 if mode != "answer_joint" else 3)


@pytest.mark.parametrize("mode", ["last", "answer_joint"])
def test_oar_g_gradient_times_input_matches_finite_differences(model64, mode):
    """What OAR-G computes, |<dJ/dE (E + eps), E_t>|, by central differences of J at E + eps along
    E_t (a step far below the noise, so the difference resolves the noise-driven gradient)."""
    model, tok = model64
    imp, probes, e0, noise, J, _ = _oar_g_setup(model, tok, mode, SIGMA)
    k = 1e-5
    with torch.no_grad():
        for j, p in enumerate(probes):
            for t in p.scored.tolist()[::3]:
                pos = p.reasoning_start + t
                d = torch.zeros_like(e0)
                d[j, pos] = e0[j, pos]
                want = abs(float(J(e0 + noise + k * d)) - float(J(e0 + noise - k * d))) / (2 * k)
                got = float(imp[p.row, t])
                assert abs(got - want) <= 1e-4 * want + 1e-12, (t, got, want)


def test_oar_g_sigma_zero_is_the_plain_input_gradient(model64, model_tok):
    model, tok = model64
    imp, probes, e0, _, J, est = _oar_g_setup(model, tok, "answer_joint", 0.0)
    e = e0.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(J(e), e)
    want = (grad * e0).sum(-1).abs()
    for j, p in enumerate(probes):
        got = imp[p.row, p.scored].double()
        want_j = want[j, p.reasoning_start + p.scored]
        torch.testing.assert_close(got, want_j, rtol=1e-6, atol=1e-12)
    assert est.call_metrics()["probe_forwards"] == 2  # no clean pass
    # a row that falls back to ``last`` has zero gradient at sigma = 0: importance 0, weight 1,
    # and is not sent to the policy
    batch = _batch(model_tok[1])
    est = OARGAdvantage(OARGAdvantage.Config(mode="answer_joint", sigma=0.0))
    imp, reasoning = est.importance(batch, _ctx(*model_tok), rows=[0, 2])
    assert reasoning[2].any() and (imp[2] == 0).all() and (imp[0][reasoning[0]] > 0).any()
    assert est.call_metrics()["probe_forwards"] == 1


# -- the estimators ------------------------------------------------------------------------------
ESTIMATORS = [
    (OARPAdvantage, {"mode": "last"}),
    (OARPAdvantage, {"mode": "answer_joint", "chunk_size": 5}),
    (OARGAdvantage, {"mode": "answer_mean"}),
    (OARGAdvantage, {"mode": "last", "chunk_size": 2}),
]
IDS = [f"{c.__name__}-{o['mode']}" for c, o in ESTIMATORS]


@pytest.mark.parametrize("cls,options", ESTIMATORS, ids=IDS)
@pytest.mark.numerics
def test_estimator_properties_on_a_real_model(model_tok, cls, options):
    model, tok = model_tok
    batch = _batch(tok)
    est = cls(cls.Config(**options))
    out = est.estimate(batch, _ctx(model, tok, seed=11))
    v = out.values
    assert v.shape == batch.loss_mask.shape and torch.isfinite(v).all()
    assert (v[batch.loss_mask == 0] == 0).all()
    assert (v[4:] == 0).all()  # the all-equal group
    again = est.estimate(batch, _ctx(model, tok, seed=11)).values
    assert torch.equal(v, again)
    padded = est.estimate(pad_batch(batch, 5, tok.pad_token_id), _ctx(model, tok, seed=11)).values
    n = lm_length(model.config, batch.input_ids.shape[1] + 5, backward=True)  # OAR-G: gradients
    assert_close_fp(padded[:, : v.shape[1]], v, length=n)
    assert (padded[:, v.shape[1] :] == 0).all()
    # A_{i,t} = A_i * w_t: marker, answer and EOS keep A_i; reasoning weights sum to L (mass).
    n0 = int(batch.response_mask[0].sum())
    reason0 = len(tok.encode("2*7=14</thought>14+5="))
    a_row0 = float(v[0, n0 - 1])  # EOS
    assert a_row0 > 0
    torch.testing.assert_close(v[0, reason0:n0], torch.full((n0 - reason0,), a_row0))
    mass = torch.tensor(a_row0 * reason0)
    torch.testing.assert_close(v[0, :reason0].sum(), mass, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(v[0, :reason0], torch.full((reason0,), a_row0))  # reshaped
    m = out.metrics
    assert all(math.isfinite(float(x)) for x in m.values())
    assert m["probed_rows"] == 4 and 0 < m["high_tier_frac"] < 1 and m["high_tier_weight_mean"] > 1
    assert m["probe_forwards"] > 0
    assert est.call_metrics()["probed_rows"] == 4  # the last of three calls: per call
    assert est.metrics() == {}  # one channel: the metrics travel with the advantages


@pytest.mark.parametrize("cls,options", ESTIMATORS, ids=IDS)
def test_single_outcome_groups_give_zeros_without_probing(model_tok, cls, options):
    model, tok = model_tok
    trajs = [
        _traj(tok, "2*7=14</thought>", "14}", 1.0, group=0),
        _traj(tok, "2*7=1", "1}", 1.0, group=0),
        _traj(tok, "9*9=81", "81}", 0.0, group=1),
    ]
    batch = collate(trajs, tok.pad_token_id)
    est = cls(cls.Config(**options))
    out = est.estimate(batch, _ctx(model, tok))
    assert (out.values == 0).all() and out.metrics["probe_forwards"] == 0


def test_oar_g_noise_depends_on_the_seed(model_tok):
    model, tok = model_tok
    batch, est = _batch(tok), OARGAdvantage(OARGAdvantage.Config(mode="last"))
    a = est.estimate(batch, _ctx(model, tok, seed=1)).values
    b = est.estimate(batch, _ctx(model, tok, seed=2)).values
    assert not torch.equal(a, b)


@pytest.mark.parametrize("name", ["oar_p", "oar_g"])
def test_registered_builds_from_options_and_passes_the_contract(name):
    cls = registry("advantage").get(name)
    assert cls is {"oar_p": OARPAdvantage, "oar_g": OARGAdvantage}[name]
    part = build_part("advantage", {"name": name, "q": 0.7, "beta": 2})
    assert part.config.q == 0.7 and part.config.beta == 2.0
    for mode in ("last", "answer_mean", "answer_joint"):
        check_part("advantage", cls(cls.Config(mode=mode)))


@pytest.mark.parametrize(
    "cls,options",
    [
        (OARPAdvantage, {"mode": "first"}),
        (OARPAdvantage, {"q": 1.5}),
        (OARPAdvantage, {"beta": -1.0}),
        (OARPAdvantage, {"w_floor": 2.0}),
        (OARPAdvantage, {"chunk_size": -1}),
        (OARPAdvantage, {"std": "ddof"}),
        (OARPAdvantage, {"mask_token_id": -2}),
        (OARPAdvantage, {"negative": "abs"}),
        (OARGAdvantage, {"sigma": 0.0}),
        (OARGAdvantage, {"sigma": -1e-3, "mode": "answer_joint"}),
    ],
)
def test_bad_config_is_a_config_error(cls, options):
    with pytest.raises(ConfigError):
        cls.Config(**options)
    OARGAdvantage.Config(sigma=0.0, mode="answer_joint")  # plain input gradient: allowed
