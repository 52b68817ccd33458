"""``creditlab eval``: a preset or a run's checkpoint on a task split or a user's file, both accuracy
lines with intervals, every problem's record, and one-line errors before the model loads."""

from __future__ import annotations

import json
import math

import pytest
from creditlab.cli import main
from creditlab.run import evaluate as ev

from tests.helpers import check_finished_run

#: The tiny model (its shipped warm start) answering in a few tokens: fast, scored 0 mostly.
TINY = ["rollout.max_new_tokens=12", "seed=3"]
NATALIA = {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                       "clips in May. How many clips did Natalia sell altogether in April and May?",
           "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
                     "clips altogether in April and May.\n#### 72"}


def _file(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_intervals_by_hand():
    acc = ev.wilson(3, 10)  # Wilson 95%: 0.3 [0.1078, 0.6032]
    assert acc.mean == 0.3 and math.isclose(acc.low, 0.10779, abs_tol=1e-4) and math.isclose(acc.high, 0.60322, abs_tol=1e-4)
    t = ev.t_interval([0.25, 0.5, 0.75, 0.5], 4)  # mean 0.5, sd 0.204124, t(0.975, 3) = 3.182446
    assert t.mean == 0.5 and math.isclose(t.high - 0.5, 3.182446 * 0.204124 / 2, rel_tol=1e-5)
    assert ev.t_interval([0.0, 1.0, 1.0, 0.0], 4).low == 0.0  # clipped to [0, 1]
    assert acc.line("greedy").startswith("greedy accuracy: 0.300 [0.108, 0.603] (95% interval, 10 problems)")
    assert "x 4 samples" in t.line("sampled")


def test_a_file_on_the_tiny_model_prints_both_lines_and_writes_records(tmp_path, capsys):
    data = _file(tmp_path, [NATALIA, {"question": "What is 2 + 2?", "answer": "#### 4"},
                            {"question": "Tom has 3 pens and buys 4. How many?", "answer": "So 7.\n#### 7"}])
    out = tmp_path / "eval"
    main(["eval", *TINY, "--data", data, "--samples", "2", "--out", str(out)])
    lines = capsys.readouterr().out.splitlines()
    greedy = next(line for line in lines if line.startswith("greedy accuracy: "))
    sampled = next(line for line in lines if line.startswith("sampled accuracy: "))
    assert "(95% interval, 3 problems)" in greedy and "3 problems x 2 samples" in sampled
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in records] == ["72", "4", "7"]
    assert all(len(r["samples"]) == 2 and isinstance(r["greedy"]["text"], str) for r in records)
    assert "first_wrong_step" in records[0]["greedy"] or records[0]["greedy"]["correct"]  # it has an oracle
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "word_problems" and summary["greedy"]["problems"] == 3
    assert summary["sampled"]["samples"] == 2 and summary["cpu"]["torch_capability"]
    noise = next(line for line in lines if line.startswith("noise: standard error "))  # its two sources
    assert "with 4 samples" in noise and "with 6 problems" in noise and set(summary["noise"]) == {"between", "within"}


@pytest.mark.parametrize("rows,message", [
    (['{"question": "q", "answer": "#### 3"', ], "invalid JSON on line 1"),
    ([{"question": "How many?", "answer": "#### many"}], "must be a number"),
    ([{"question": "How many?", "answer": "three"}], "has no '####' marker"),
    ([{"prompt": "How many?", "answer": "#### 3"}], "missing field 'question'"),
])
def test_a_file_of_the_wrong_shape_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch, rows, message):
    monkeypatch.setattr(ev, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as exc:
        main(["eval", *TINY, "--data", _file(tmp_path, rows), "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv,message", [
    (["--data", "/nowhere.jsonl"], "--data /nowhere.jsonl: no such file"),
    (["--samples", "-1"], "--samples must be >= 0"),
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--frobnicate"], "unknown option --frobnicate"),
    (["run_dir=/nowhere"], "run_dir=/nowhere: no config.yaml there"),
    (["model=nope"], "unknown model 'nope'"),
])
def test_bad_options_are_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(ev, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as exc:
        main(["eval", *argv, "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err, err


@pytest.mark.slow
def test_a_runs_checkpoint_is_evaluated_with_its_own_config(tmp_path, capsys, monkeypatch):
    """``run_dir=``: the run's config and its newest checkpoint's weights (not the warm start's)."""
    import torch
    from creditlab.run.compose import compose
    from creditlab.run.launch import run as launch

    from tests.integration.conftest import SMALL

    run = tmp_path / "run"
    launch(compose([*SMALL, f"run_dir={run}", "trainer.max_steps=2", "eval.every=0"]), run)
    check_finished_run(run, 2)
    # mark the checkpoint's weights, so that loading them shows (this small run may learn nothing)
    path = run / "checkpoints" / "last.ckpt"
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["state_dict"]["policy.model.norm.weight"] += 0.5
    torch.save(state, path)
    loaded, real = [], ev.load_checkpoint

    def spy(model, checkpoint):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        real(model, checkpoint)
        loaded.append((checkpoint, max(float((v - before[k]).abs().max()) for k, v in model.state_dict().items())))

    monkeypatch.setattr(ev, "load_checkpoint", spy)
    capsys.readouterr()
    main(["eval", f"run_dir={run}", "--problems", "6", "--samples", "0", "--out", str(tmp_path / "a")])
    (checkpoint, moved), = loaded
    assert checkpoint.name == "last.ckpt" and moved == pytest.approx(0.5)  # the checkpoint's weights
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["checkpoint"] == str(checkpoint) and summary["task"] == "arith"
    with pytest.raises(SystemExit):
        main(["eval", f"run_dir={run}", "model=tiny", "--out", str(tmp_path / "c")])
    assert "the run's own parts are evaluated" in capsys.readouterr().err
