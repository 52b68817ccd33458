"""A short SRPO run from a saved model directory whose tokenizer has a chat template
(``model.name_or_path=<dir>``, the path a hub id takes): every prompt the run encodes — rollouts,
self-localization, evaluation — goes through the template, and the run trains."""

import json
from pathlib import Path

import pytest
import torch
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics
from creditlab.step import policy
from creditlab_resets import selectors

from tests.unit.test_chat_template import save_chat_model

pytestmark = pytest.mark.slow


def test_srpo_run_with_a_chat_templated_local_model(tmp_path, monkeypatch):
    model_dir = tmp_path / "model"
    _, tok = save_chat_model(model_dir)
    encoded: list[tuple[int, ...]] = []
    original = policy.encode_prompt

    def recording(tokenizer, text, *setting):
        ids = original(tokenizer, text, *setting)
        encoded.append(ids)
        return ids

    monkeypatch.setattr(policy, "encode_prompt", recording)
    monkeypatch.setattr(selectors, "encode_prompt", recording)  # the localizer encodes on its own
    out = tmp_path / "run"
    cfg = compose([
        "logger=none", f"run_dir={out}", "threads=1",
        f"model.name_or_path={model_dir}", "model.hints.localization_template=paper",
        "method=srpo", "task.num_train=16", "task.num_test=4", "prompts_per_step=2",
        "rollout.thoughts=true", "rollout.max_thoughts=3", "rollout.max_thought_tokens=6",
        "reset_selector.max_new_tokens=8", "loss.updates_per_batch=2",
        "eval.every=2", "eval.problems=2", "trainer.max_steps=2",
    ])
    threads = torch.get_num_threads()
    run(cfg, out)
    # threads=1 held for the run only: a thread count left behind changed the floats of the next
    # run in this process (thread-count-dependent reductions), which a fresh process did not share
    assert torch.get_num_threads() == threads
    train = [r for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert json.loads((out / "environment.json").read_text())["model_path"] == str(model_dir)
    assert len(encoded) > 4
    texts = [tok.decode(list(ids)) for ids in encoded]
    for ids, text in zip(encoded, texts):  # decoded: the helper tokenizer maps "\n\n" to <unk>
        assert ids[0] == tok.bos_token_id and text.startswith("<bos>[user]\n"), text[:40]
        assert text.endswith("[assistant]\n"), text[-40:]
    assert any("Step 1:" in t for t in texts), "the self-localization prompt goes through it too"
    assert Path(out / "summary.json").is_file()
