"""Decoding tokens/s on a CUDA device against its memory-bandwidth limit, every decoding path side
by side in one run.

One decoding step of B rows must read every weight once and each row's keys/values once, so

    tokens/s <= B * bandwidth / (weight bytes + B * mean context * KV bytes per token)

with bf16 weights and a bf16 cache as the floor of bytes (what a serving engine moves). The
bandwidth is measured in the same run (a 1 GiB device-to-device copy, bytes read + written).
Each variant decodes the same B distinct random prompts of ``--prompt-tokens`` tokens, at T = 1,
every row held to ``--new-tokens`` (no EOS), with the HF backend:

* ``forward-fp32``: the model's own forward, float32 (``model.accelerator=none``);
* ``forward-autocast``: the same under bf16 autocast (``backend.dtype=bfloat16``);
* ``forward-bf16``: the model's own forward on a bfloat16 copy of the weights;
* ``fused-fp32`` / ``fused-bf16``: the fused decoding steps (``backend.dtype`` float32 /
  bfloat16: bf16 copies of the weights made once per call);
* ``trainer-gpu``: what ``trainer=gpu`` runs: ``model.accelerator=auto`` on the float32 policy,
  inside Lightning's bf16-mixed autocast;
* ``generate-dynamic`` / ``generate-static``: ``transformers``' own ``generate`` on the bfloat16
  copy, with its dynamic cache, or with a static cache, which compiles the decoding step
  (``torch.compile``, CUDA graphs) on CUDA: the library's paths, as references.

The model is random (no hub): a Qwen2.5-0.5B shape (494M parameters, 151,936-token vocabulary)
by default, or ``--shape smollm2`` (SmolLM2-135M's shape) or ``tiny`` (to try the script on a CPU).

Usage::

    python benchmarks/decode_cuda.py                                  # 16,64,256 rows x 256 tokens
    python benchmarks/decode_cuda.py --device cpu --shape tiny --batch 4 --new-tokens 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

SHAPES = {  # Qwen2 configs: (hidden, intermediate, layers, heads, kv heads, vocab, tied)
    "qwen0.5b": (896, 4864, 24, 14, 2, 151936, True),
    "smollm2": (576, 1536, 30, 9, 3, 49152, True),
    "tiny": (64, 128, 2, 2, 1, 512, True),
}
VARIANTS = ("trainer-gpu", "fused-bf16", "forward-bf16", "fused-fp32", "forward-fp32", "forward-autocast",
            "generate-dynamic", "generate-static")


def build_model(shape: str, device: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                      tie_word_embeddings=tied, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(cfg).float().eval()


class LibraryGenerate:
    """``model.generate`` behind the backend's ``generate(requests, sampling)`` (equal-length
    prompts, T = 1, no EOS): what ``transformers`` alone gives."""

    def __init__(self, model, static: bool) -> None:
        self.model, self.static = model, static

    @property
    def path(self) -> str:  # "graph" once generate compiled the model's step
        return "graph" if hasattr(self.model, "_compiled_call") else "eager"

    def generate(self, requests, sampling) -> list:
        import types

        import torch

        ids = torch.tensor([r.prompt_ids for r in requests], device=self.model.device)
        torch.manual_seed(sampling.seed or 0)
        out = self.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
            top_p=1.0, max_new_tokens=sampling.max_new_tokens, min_new_tokens=sampling.max_new_tokens,
            pad_token_id=0, eos_token_id=None, **({"cache_implementation": "static"} if self.static else {}))
        return [types.SimpleNamespace(response_ids=row[ids.shape[1]:].tolist()) for row in out]


def copy_bandwidth(device: str) -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy (median of 10)."""
    import torch

    if device != "cuda":
        return float("nan")
    x = torch.randn(2**28, device=device)
    y = torch.empty_like(x)
    times = []
    for _ in range(12):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return 2 * x.numel() * 4 / statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen0.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", default="16,64,256")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per variant and B, after one untimed")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers: the char tokenizer
    from creditlab.backends.hf import HFBackend
    from creditlab.types import GenerationRequest, SamplingParams
    from tests.helpers import char_tokenizer

    tok = char_tokenizer()
    model = build_model(args.shape, args.device)
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2  # K and V, bf16
    bandwidth = copy_bandwidth(args.device)
    bf16_model = None
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"{name}; torch {torch.__version__}; {args.shape} shape, {params / 1e6:.0f}M parameters; "
          f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; prompts {args.prompt_tokens} + {args.new_tokens} new tokens")

    def backend(variant: str) -> tuple[HFBackend | LibraryGenerate, str]:
        nonlocal bf16_model
        base = HFBackend.Config(fused_copy_budget_mb=1 << 16)  # the copies fit a GPU
        m = model
        if variant in ("forward-bf16", "generate-dynamic", "generate-static"):
            bf16_model = bf16_model or build_model(args.shape, args.device).to(torch.bfloat16)
            m = bf16_model
        if variant.startswith("generate-"):
            return LibraryGenerate(m, static=variant == "generate-static"), "eager"
        conf = {"forward-fp32": dict(accelerator="none", dtype="float32"),
                "forward-autocast": dict(accelerator="none", dtype="bfloat16"),
                "forward-bf16": dict(accelerator="none"),
                "fused-fp32": dict(accelerator="fused", dtype="float32"),
                "fused-bf16": dict(accelerator="fused", dtype="bfloat16"),
                "trainer-gpu": dict(accelerator="auto")}[variant]
        b = HFBackend(dataclasses.replace(base, **conf), model=m, tokenizer=tok)
        plan = b._plan
        b._plan = lambda sp, plan=plan: dataclasses.replace(plan(sp), eos_token_id=None)  # no EOS
        return b, b.accelerator.path


    gen = torch.Generator().manual_seed(0)

    def measure(variant: str) -> list[dict]:
        """Tokens/s of one variant at every B (printed), as rows."""
        b, path = backend(variant)
        out = []
        for rows in (int(x) for x in args.batch.split(",")):
            rates = []
            for r in range(-1, args.rounds):  # round -1 warms up, untimed
                ids = torch.randint(5, cfg.vocab_size, (rows, args.prompt_tokens), generator=gen)
                reqs = [GenerationRequest(tuple(row.tolist())) for row in ids]
                sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=r + 1)
                ctx = torch.autocast(args.device, dtype=torch.bfloat16, enabled=variant == "trainer-gpu")
                if args.device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with ctx:
                    done = b.generate(reqs, sp)
                seconds = time.perf_counter() - t0
                n = sum(len(c.response_ids) for c in done)
                assert n == rows * args.new_tokens, (n, rows * args.new_tokens)
                if r >= 0:
                    rates.append(n / seconds)
            rate = statistics.median(rates)
            path = getattr(b, "path", path) if isinstance(b, LibraryGenerate) else path
            step_bytes = 2 * params + rows * (args.prompt_tokens + args.new_tokens / 2) * kv_per_token
            bound = rows * bandwidth / step_bytes
            out.append(dict(variant=variant, path=path, rows=rows, tokens_per_s=rate, bound=bound))
            print(f"{variant:>17} {path:>6} {rows:4d} {rate:9.0f} {1e3 * rows / rate:8.2f} {bound:12.0f} "
                  f"{rate / bound:9.3f}")
        return out

    rows_out = []
    print(f"{'variant':>17} {'path':>6} {'B':>4} {'tok/s':>9} {'ms/step':>8} {'bound tok/s':>12} {'of bound':>9}")
    for variant in args.variants.split(","):
        try:
            rows_out += measure(variant)
        except Exception as e:  # one broken path must not lose the others' rows
            print(f"{variant:>17} failed: {type(e).__name__}: {e}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=name, torch=torch.__version__, shape=args.shape,
                                                   bandwidth=bandwidth, rows=rows_out), indent=1))


if __name__ == "__main__":
    main()
