"""The SRPO paper presets' encoding on a short run (issue 14): ``rollout.chat_template=false``
with a chat-templated model — rollout and evaluation prompts are the plain text, the
self-localization prompt alone goes through the chat template (as the official code)."""

import pytest
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics
from creditlab.step import policy
from creditlab_resets import selectors

from tests.unit.test_chat_template import save_chat_model

pytestmark = pytest.mark.slow


def test_plain_rollouts_with_a_chat_templated_localizer(tmp_path, monkeypatch):
    _, tok = save_chat_model(tmp_path / "model")
    encoded: dict[str, list[str]] = {"handle": [], "localizer": []}

    def recorder(kind):
        def encode(tokenizer, text, *setting):
            ids = original(tokenizer, text, *setting)
            encoded[kind].append(tok.decode(list(ids)))
            return ids
        return encode

    original = policy.encode_prompt
    monkeypatch.setattr(policy, "encode_prompt", recorder("handle"))
    monkeypatch.setattr(selectors, "encode_prompt", recorder("localizer"))
    out = tmp_path / "run"
    cfg = compose([
        "logger=none", f"run_dir={out}", "threads=1",
        f"model.name_or_path={tmp_path / 'model'}", "model.hints.localization_template=paper",
        "method=srpo", "task.num_train=16", "task.num_test=4", "prompts_per_step=2",
        "rollout.thoughts=true", "rollout.max_thoughts=3", "rollout.max_thought_tokens=6",
        "rollout.chat_template=false", "reset_selector.max_new_tokens=8",
        "eval.every=2", "eval.problems=2", "trainer.max_steps=2",
    ])
    run(cfg, out)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r] == [1, 2]
    # rollouts (and evaluation, through the same handle): the plain prompt, never a chat turn
    assert len(encoded["handle"]) > 4
    assert not any("[user]" in t or "[assistant]" in t for t in encoded["handle"])
    # localization: a chat turn with the generation prompt
    assert encoded["localizer"], "no seed was localized"
    for text in encoded["localizer"]:
        assert text.startswith("<bos>[user]\n") and text.endswith("[assistant]\n") and "Step 1:" in text
