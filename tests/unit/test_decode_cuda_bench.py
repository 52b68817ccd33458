"""benchmarks/decode_cuda.py runs on a CPU too (``--device cpu --shape tiny``): every variant
decodes each row to the budget through the path it names, so the script a lent GPU runs is
checked where CI runs."""

from __future__ import annotations

import json
import sys

from tests.helpers import load_script

PATHS = {"fused-fp32": "fused", "fused-bf16": "fused", "trainer-gpu": "fused", "forward-fp32": "none",
         "forward-bf16": "none", "generate-static": "eager"}  # no CUDA: generate compiles nothing


def test_every_variant_decodes_to_the_budget_on_its_path(tmp_path, monkeypatch) -> None:
    bench = load_script("benchmarks/decode_cuda.py")
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", [
        "decode_cuda.py", "--device", "cpu", "--shape", "tiny", "--batch", "2,3", "--new-tokens", "5",
        "--prompt-tokens", "4", "--rounds", "1", "--variants", ",".join(PATHS), "--json", str(out)])
    bench.main()  # asserts every row decoded exactly --new-tokens tokens
    rows = json.loads(out.read_text())["rows"]
    assert [(r["variant"], r["rows"]) for r in rows] == [(v, b) for v in PATHS for b in (2, 3)]
    assert all(r["path"] == PATHS[r["variant"]] and r["tokens_per_s"] > 0 for r in rows), rows
