"""HFBackend on CUDA: generation and continuation from a token-id prefix, fp32 and bf16.

The tiny fp32 model (``tests.helpers``: 2 layers, hidden 64, init std 0.1) is decoded greedily on
the CPU and on CUDA; CUDA must give the same tokens, log-probs and entropies.

Tolerances (and why):

* ``FP32_TOL = 1e-4`` (log-probs and entropies, fp32 CUDA vs fp32 CPU, and CUDA sampler vs CUDA
  teacher-forced forward). The two devices run the same fp32 math with other kernels (GEMM
  blocking, SDPA, reduction order): differences of ~1e-6 in the logits (|logit| < 3.3 for this
  model); 1e-4 is the CPU suite's own sampler-vs-trainer tolerance (tests/unit/test_hf_backend.py)
  and still catches a silent bf16/TF32 cast (errors of 1e-3 to 1e-2).
* ``FP32_TIE = 1e-4``: a greedy token is compared only while the CPU's top-2 log-prob margin at that
  step is at least this (100x the expected fp32 difference); after a closer near-tie the devices
  may rightly pick different tokens and the row is compared no further. On this model and these
  prompts no margin is that small (measured on the CPU: smallest 3e-4), so every token is compared;
  the test also asserts that at least 90% are.
* ``BF16_TOL = 0.1``: bf16 keeps 8 significant bits, so each logit is rounded by up to ~0.01 at
  this scale and the layers add up such errors. Measured on the CPU in bf16 for this model: sampler
  vs bf16 teacher-forced forward 0.016 at most, vs the fp32 forward 0.028; 0.1 leaves room for
  CUDA's bf16 kernels while a wrong position or token (log-probs near -3.4, spread ~1) still fails.
* ``BF16_TIE = 0.1``: in bf16 a greedy token must be the argmax of the bf16 teacher-forced forward
  wherever that forward's top-2 margin is at least this.

Tests move deep copies of the CPU model to CUDA, so both devices start from the same weights.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers import THOUGHT, tiny_model_and_tokenizer, with_token_bias

FP32_TOL = 1e-4
FP32_TIE = 1e-4
BF16_TOL = 0.1
BF16_TIE = 0.1
MAX_NEW = 32

PROMPTS = ["1+2=", "hello world, how are", "x", "abc def ghi jkl mno", "Q: 17*3?"]
#: Token-id prefixes for "continue": a response already begun (one holds the added </thought>).
PREFIXES = ["ab", " 12", "x=" + THOUGHT, "", "7*3 is"]
#: For the stop/EOS test: with the biases below, rows end by EOS, by the </thought> stop and by
#: the length limit, after 1 to 32 tokens (measured on the CPU), so finished rows are compacted.
STOP_PROMPTS = ["1+2=", "hello world, how are", "x", "abc def ghi jkl mno", "Q: 17*3?", "12+7=",
                "zz top", "what is 3*4?"]
STOP_BIAS = 1.0


@pytest.fixture(scope="module")
def cpu_pair():
    """The tiny fp32 model on the CPU and its character tokenizer."""
    return tiny_model_and_tokenizer(seed=0)


def _backend(model, tok, accelerator="none"):
    from creditlab.backends.hf import HFBackend

    return HFBackend(HFBackend.Config(accelerator=accelerator), model=model, tokenizer=tok)


def _on_cuda(model, dtype=torch.float32):
    return copy.deepcopy(model).to(device="cuda", dtype=dtype).eval()


def _cuda_backend(model, tok, accelerator):
    """A backend over a CUDA copy of ``model``. ``auto`` must pick the fused decoding steps for
    this fp32 Llama; where it declines them (e.g. a ``transformers`` outside the fused path's
    tested range, such as the GPU image's 5.17), the test is skipped with the reason."""
    backend = _backend(_on_cuda(model), tok, accelerator)
    if accelerator == "auto" and backend.accelerator.path != "fused":
        pytest.skip(f"model.accelerator=auto declined the fused decoder: {backend.accelerator.reason}")
    assert backend.accelerator.path == ("fused" if accelerator == "auto" else "none")
    return backend


def _requests(tok, kind, prompts=PROMPTS):
    """``generate``: the bare prompts; ``continue``: each with its token-id prefix."""
    from creditlab.types import GenerationRequest

    def enc(text):
        return tuple(tok.encode(text, add_special_tokens=False))

    prefixes = PREFIXES if kind == "continue" else [""] * len(prompts)
    return [GenerationRequest(enc(p), enc(x)) for p, x in zip(prompts, prefixes)]


def _greedy(backend, reqs, **kw):
    from creditlab.types import SamplingParams

    return backend.generate(reqs, SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW, **kw))


def _teacher(model, c, temperature=1.0):
    """(R, V) float32 ``log_softmax(logits / T)`` predicting each response token of ``c`` (its
    prefix included) from one plain forward on the model's device; returned on the CPU."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(c.prompt_ids) + list(c.response_ids)], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    p = len(c.prompt_ids)
    return torch.log_softmax(logits[p - 1 : -1] / temperature, -1).cpu()


def _margins(lp):
    top = lp.topk(2, -1).values
    return top[:, 0] - top[:, 1]


def _settled(lp, start, tie):
    """Leading generated tokens (from response position ``start``) whose top-2 margin is >= tie."""
    small = (_margins(lp[start:]) < tie).nonzero()
    return int(small[0]) if len(small) else len(lp) - start


def _chosen(lp, c):
    """(N,) log-probs in ``lp`` of the generated (non-prefix) tokens of ``c``."""
    new = torch.tensor(c.response_ids[c.prefix_len :], dtype=torch.long)
    return lp[c.prefix_len :].gather(1, new[:, None]).squeeze(1)


def _assert_same_as_cpu(cpu_model, cpu_out, gpu_out):
    """CUDA completions equal the CPU's up to each row's first fp32 near-tie (``FP32_TIE``):
    prefix, tokens, log-probs and entropies (``FP32_TOL``), and the whole completion (length and
    finish reason) when the row has no near-tie. Returns (tokens compared, tokens generated)."""
    compared = total = 0
    for i, (c, g) in enumerate(zip(cpu_out, gpu_out)):
        assert (g.prompt_ids, g.prefix_len) == (c.prompt_ids, c.prefix_len), i
        k = c.prefix_len
        assert g.response_ids[:k] == c.response_ids[:k], f"row {i}: prefix not kept"
        n = _settled(_teacher(cpu_model, c), k, FP32_TIE)
        assert g.response_ids[k : k + n] == c.response_ids[k : k + n], f"row {i}: greedy tokens differ"
        for name in ("logprobs", "entropies"):
            got, want = torch.tensor(getattr(g, name)[:n]), torch.tensor(getattr(c, name)[:n])
            assert torch.allclose(got, want, atol=FP32_TOL), (i, name, (got - want).abs().max())
        if n == len(c.logprobs):
            assert (g.response_ids, g.finish_reason, g.text) == (c.response_ids, c.finish_reason, c.text), i
        compared, total = compared + n, total + len(c.logprobs)
    return compared, total


@pytest.mark.parametrize("kind", ["generate", "continue"])
@pytest.mark.parametrize("accelerator", ["none", "auto"])
def test_greedy_fp32_on_cuda_equals_cpu(cpu_pair, fp32_matmuls, accelerator, kind):
    """Same greedy tokens, log-probs and entropies as the CPU, with the model's own forward
    (``none``) and with the fused decoding steps (``auto`` picks them for this fp32 Llama)."""
    model, tok = cpu_pair
    reqs = _requests(tok, kind)
    cpu_out = _greedy(_backend(model, tok), reqs)
    gpu_out = _greedy(_cuda_backend(model, tok, accelerator), reqs)
    compared, total = _assert_same_as_cpu(model, cpu_out, gpu_out)
    assert compared >= 0.9 * total, f"only {compared} of {total} tokens compared (near-ties)"


@pytest.mark.parametrize("kind", ["generate", "continue"])
def test_greedy_bf16_on_cuda_is_consistent_and_close_to_fp32(cpu_pair, kind):
    """A bf16 copy on CUDA: each greedy token is the argmax of the bf16 teacher-forced forward
    (where that is no near-tie), its log-probs equal that forward's and are close to the fp32
    CPU forward's on the same tokens (``BF16_TOL``); prefixes are kept and not scored."""
    model, tok = cpu_pair
    reqs = _requests(tok, kind)
    gpu_model = _on_cuda(model, torch.bfloat16)
    out = _greedy(_backend(gpu_model, tok, "auto"), reqs)
    checked = 0
    for i, (r, c) in enumerate(zip(reqs, out)):
        k = c.prefix_len
        assert c.response_ids[:k] == r.prefix_ids and len(c.logprobs) == len(c.response_ids) - k
        lp_bf16, lp_fp32 = _teacher(gpu_model, c), _teacher(model, c)
        new = torch.tensor(c.response_ids[k:], dtype=torch.long)
        clear = _margins(lp_bf16[k:]) >= BF16_TIE
        assert torch.equal(lp_bf16[k:].argmax(-1)[clear], new[clear]), f"row {i}: not the argmax"
        checked += int(clear.sum())
        got = torch.tensor(c.logprobs)
        for name, lp in (("bf16 forward", lp_bf16), ("fp32 CPU forward", lp_fp32)):
            diff = (got - _chosen(lp, c)).abs().max()
            assert diff <= BF16_TOL, f"row {i}: log-probs off the {name} by {diff:.4f}"
        ent = -(lp_bf16[k:].exp() * lp_bf16[k:]).sum(-1)
        assert torch.allclose(torch.tensor(c.entropies), ent, atol=BF16_TOL), i
    assert checked >= len(out) * MAX_NEW // 2, f"only {checked} tokens clear of bf16 near-ties"


def test_sampling_on_cuda_is_seeded_and_scores_like_the_trainer(cpu_pair, fp32_matmuls):
    """Temperature/top-p/top-k sampling with the CUDA generator: the same seed gives the same
    completions from two new backends; the reported log-probs and entropies are those of
    ``log_softmax(logits / T)`` before truncation, as the CUDA and the CPU teacher-forced forwards
    give them (``FP32_TOL``). A second call on one backend may reuse the keys/values the first
    stored (``backend.prefix_cache_mb``: here the continued prompts): the same tokens, log-probs
    within float rounding."""
    from creditlab.types import SamplingParams

    model, tok = cpu_pair
    gpu_model = _on_cuda(model)
    backend = _backend(gpu_model, tok, "auto")
    reqs = _requests(tok, "generate") + _requests(tok, "continue")
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=24, seed=11)
    a, b = backend.generate(reqs, sp), _backend(gpu_model, tok, "auto").generate(reqs, sp)
    assert a == b, "same seed, different completions on CUDA"
    again = backend.generate(reqs, sp)
    assert [c.response_ids for c in again] == [c.response_ids for c in a]
    for c, d in zip(a, again):
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(d.logprobs), atol=FP32_TOL)
    for i, (r, c) in enumerate(zip(reqs, a)):
        assert c.response_ids[: c.prefix_len] == r.prefix_ids
        got = torch.tensor(c.logprobs)
        for where, m in (("cuda", gpu_model), ("cpu", model)):
            lp = _teacher(m, c, 0.7)
            assert torch.allclose(got, _chosen(lp, c), atol=FP32_TOL), (i, where)
            ent = -(lp[c.prefix_len :].exp() * lp[c.prefix_len :]).sum(-1)
            assert torch.allclose(torch.tensor(c.entropies), ent, atol=FP32_TOL), (i, where)


@pytest.mark.parametrize("accelerator", ["none", "auto"])
def test_stops_eos_and_row_compaction_on_cuda_equal_cpu(cpu_pair, fp32_matmuls, accelerator):
    """Rows that end at different steps (EOS, a one-token stop string, the length limit; a text
    stop that is checked every step) leave the CUDA batch as on the CPU: same tokens, lengths and
    finish reasons."""
    model, tok = cpu_pair
    biased = with_token_bias(model, {tok.eos_token_id: STOP_BIAS, tok.convert_tokens_to_ids(THOUGHT): STOP_BIAS})
    reqs = _requests(tok, "generate", STOP_PROMPTS)
    stop = (THOUGHT, "zz")
    cpu_out = _greedy(_backend(biased, tok), reqs, stop=stop)
    assert {c.finish_reason for c in cpu_out} == {"eos", "stop", "length"}  # the rows end differently
    gpu_out = _greedy(_cuda_backend(biased, tok, accelerator), reqs, stop=stop)
    compared, total = _assert_same_as_cpu(biased, cpu_out, gpu_out)
    assert compared >= 0.9 * total, f"only {compared} of {total} tokens compared (near-ties)"
