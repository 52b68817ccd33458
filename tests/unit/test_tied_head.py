"""A tied output head (``tie_word_embeddings``, as SmolLM2's) is sent to a generation engine once:
``drop_tied_head`` leaves ``lm_head.weight`` out, and a model built from the same config and
loaded from what is left is the same model."""

from __future__ import annotations

import torch
from creditlab.run.models import LoraConfig, apply_lora, drop_tied_head, merged_state_dict
from transformers import LlamaForCausalLM

from tests.helpers import tiny_model_and_tokenizer


def test_a_tied_head_is_left_out_and_rebuilt_from_the_config():
    model, _ = tiny_model_and_tokenizer(seed=1, tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    full = merged_state_dict(model)
    sent = drop_tied_head(model, full)
    assert set(full) - set(sent) == {"lm_head.weight"}
    rebuilt = LlamaForCausalLM(model.config)  # what an engine does: the config ties the head
    missing, unexpected = rebuilt.load_state_dict(sent, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected
    rebuilt.tie_weights()
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_an_untied_head_and_a_lora_model_keep_what_they_must():
    untied, _ = tiny_model_and_tokenizer(seed=1)
    full = merged_state_dict(untied)
    assert drop_tied_head(untied, full) is full and "lm_head.weight" in full
    tied, _ = tiny_model_and_tokenizer(seed=1, tied=True)
    peft_model = apply_lora(tied, LoraConfig(enabled=True, r=2, alpha=4.0))
    sent = drop_tied_head(peft_model, merged_state_dict(peft_model))
    assert "lm_head.weight" not in sent and "model.embed_tokens.weight" in sent
    assert not any("lora_" in k for k in sent)
