"""Every method preset on the real model, a few steps each, with and without LoRA
(docs/real-model.md, the table "Every preset on SmolLM2-135M").

    python sweeps/real_model_presets.py                       # 10 presets x {full, LoRA}, 3 steps each
    python sweeps/real_model_presets.py --methods grpo,srpo --lora off trainer.max_steps=5

Runs ``creditlab train model=smollm2_135m_arith method=<preset>`` once per preset and LoRA
setting, one at a time, each in its own process (so that each one's peak resident memory is its
own: ``os.wait4``), and prints a table: mean step time (seconds; split into generation and update,
the rest being estimation and logging), peak memory, mean training reward, and the error of a run
that failed. Extra arguments are overrides for every run. Results go to ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("grpo", "dr_grpo", "rrpo", "srpo", "srpo_oracle", "vineppo", "ibpo", "rredcot", "oar_p", "oar_g")
#: Shared by every run: a few short steps of 4 prompts x 8 completions, no evaluation.
BASE = ("model=smollm2_135m_arith", "logger=none", "trainer.max_steps=3", "prompts_per_step=4",
        "eval.every=0", "checkpoint_every=1000")


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_one(method: str, lora: bool, out: Path, overrides: list[str]) -> dict:
    """One preset's run: its step times, peak memory, reward, or the error it ended with."""
    run_dir = out / f"{method}{'-lora' if lora else ''}"
    args = [str(Path(sys.executable).parent / "creditlab"), "train", *BASE, f"method={method}",
            f"model.lora.enabled={str(lora).lower()}", f"run_dir={run_dir}", "resume=null", *overrides]
    log = (out / f"{run_dir.name}.log").open("w")
    start = time.time()
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _, status, usage = os.wait4(proc.pid, 0)
    log.close()
    rows = [r for r in read_rows(run_dir / "metrics.jsonl") if "time/step_s" in r]
    result = {"method": method, "lora": lora, "ok": os.waitstatus_to_exitcode(status) == 0,
              "wall_s": round(time.time() - start, 1), "peak_rss_gib": round(usage.ru_maxrss / 2**20, 2),
              "steps": len(rows)}
    if rows:
        later = rows[1:] or rows  # the first step includes warm-up (allocations, first calls)
        for key in ("time/step_s", "time/generate_s", "time/update_s"):
            result[key.split("/")[1]] = round(statistics.mean(r[key] for r in later), 2)
        result["reward"] = round(statistics.mean(r["train/reward/mean"] for r in rows), 3)
    if not result["ok"]:
        tail = (out / f"{run_dir.name}.log").read_text().strip().splitlines()[-3:]
        result["error"] = " | ".join(tail)[-400:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated presets")
    parser.add_argument("--lora", choices=("both", "on", "off"), default="both")
    parser.add_argument("--out", default="runs/real_model_presets", help="where runs and results.json go")
    args, overrides = parser.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loras = {"both": (False, True), "on": (True,), "off": (False,)}[args.lora]
    results = []
    print("| preset | LoRA | step s | generate s | update s | peak GiB | reward | ok |")
    print("|---|---|---|---|---|---|---|---|")
    for method in args.methods.split(","):
        for lora in loras:
            r = run_one(method.strip(), lora, out, overrides)
            results.append(r)
            (out / "results.json").write_text(json.dumps(results, indent=2))
            print(f"| {r['method']} | {'yes' if lora else 'no'} | {r.get('step_s', '-')} | {r.get('generate_s', '-')} | "
                  f"{r.get('update_s', '-')} | {r['peak_rss_gib']} | {r.get('reward', '-')} | "
                  f"{'yes' if r['ok'] else 'no: ' + r.get('error', '')} |", flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
