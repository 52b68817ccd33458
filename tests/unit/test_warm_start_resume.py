"""A warm start killed part-way and started again from its resume point ends with the same weights,
bit for bit, as one that never stopped (creditlab_arith.resume); a point made for another build is
refused, not mixed in."""

from __future__ import annotations

import pytest
import torch

from creditlab_arith import model as recipe
from creditlab_arith import sft_loop
from creditlab_arith import resume

DATA = [([1, 5, 6, 7, 2], 2, 1.0), ([1, 8, 9, 2], 1, 1.0), ([1, 5, 9, 9, 8, 2], 3, 1.0)] * 3  # 9 rows


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2))


def _args(**extra) -> dict:
    # 4 rows a step over 9 rows: the data order crosses epochs between resume points
    # checks every 4 steps (scores above half the target, below it)
    return {**recipe.resolve_args({"steps": 12, "batch_size": 4, "validate_every": 4}), "lr": 3e-3,
            "stop_at_pass1": 0.5, **extra}


class Killed(Exception):
    """Stands in for the process being killed."""


def test_resumed_warm_start_equals_an_uninterrupted_one(tmp_path, monkeypatch) -> None:
    whole = _model()
    scores = iter([0.3, 0.35, 0.4])
    want = sft_loop.warm_start(whole, DATA, 0, _args(), lambda: next(scores))

    path = tmp_path / "point.pt"
    saves, after, real_save, real_loss = [], [], resume.save, sft_loop._summed_loss

    def counted_save(*a, **k):
        saves.append(a[-1]["step"])
        return real_save(*a, **k)

    def dies_after_the_second_point(*a, **k):  # in step 7 or 8, past the point after step 6
        if len(saves) == 2:
            after.append(1)
            if len(after) > 2:
                raise Killed
        return real_loss(*a, **k)

    monkeypatch.setattr(resume, "save", counted_save)
    monkeypatch.setattr(sft_loop, "_summed_loss", dies_after_the_second_point)
    scores = iter([0.3, 0.35, 0.4])
    with pytest.raises(Killed):
        sft_loop.warm_start(_model(), DATA, 0, _args(resume_path=path, save_every=3), lambda: next(scores))
    monkeypatch.undo()
    saved = torch.load(path, weights_only=False)["loop"]
    assert saves[:2] == [3, 6] and saved["step"] == 6 and saved["checks"] == [(4, 0.3)]

    again = _model()  # a fresh process: the same initial weights, then the resume point
    scores = iter([0.35, 0.4])  # the checks still to come (the one at step 4 is in the point)
    got = sft_loop.warm_start(again, DATA, 0, _args(resume_path=path, save_every=3), lambda: next(scores))

    for (name, a), b in zip(whole.named_parameters(), again.parameters()):
        assert torch.equal(a, b), name
    assert got["resumed_at"] == [6] and "resumed_at" not in want
    assert got["validation"] == want["validation"] == [(4, 0.3), (8, 0.35), (12, 0.4)]
    assert (got["first_loss"], got["final_loss"], got["steps_run"]) == \
        (want["first_loss"], want["final_loss"], want["steps_run"])


def test_a_point_of_another_build_is_refused(tmp_path, capsys) -> None:
    path = tmp_path / "point.pt"
    sft_loop.warm_start(_model(), DATA, 0, {**_args(resume_path=path, save_every=2), "steps": 5})
    assert torch.load(path, weights_only=False)["loop"]["step"] == 4  # none after the last step
    # another length: starts over, from the model's own weights
    fresh, ref = _model(), _model()
    opt = torch.optim.AdamW(fresh.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    assert resume.load(path, fresh, opt, sched, torch.Generator(), steps=12) is None
    assert "made for 5 steps, not 12; starting over" in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), ref.parameters()))
    # other parameters (a frozen layer): refused too
    for p in fresh.model.layers.parameters():
        p.requires_grad_(False)
    assert resume.load(path, fresh, opt, sched, torch.Generator(), steps=5) is None
    assert "its parameters are not this model's" in capsys.readouterr().out
    assert resume.load(tmp_path / "none.pt", fresh, opt, sched, torch.Generator(), steps=5) is None
