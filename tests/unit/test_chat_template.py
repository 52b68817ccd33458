"""Chat templates: a model directory whose tokenizer has one is prompted through it.

A tiny Llama and the character-level tokenizer are saved with ``save_pretrained`` together with a
small Jinja chat template, then loaded back by :func:`creditlab.run.models.load_policy` as any model
path would be. Prompts must be the rendered template with the generation prompt; the response
is what the model generates after it; thought-by-thought generation and reset continuations stay
on token ids (the template is applied once, to the prompt, never to a response prefix).
"""

from __future__ import annotations

import pytest
import torch
from creditlab.backends.hf import HFBackend
from creditlab.run.models import ModelConfig, load_policy
from creditlab.step.generation import ThoughtConfig, completion_spans, generate_thoughts
from creditlab.step.policy import ModelPolicyHandle, encode_prompt
from creditlab.types import GenerationRequest, SamplingParams

from tests.helpers import THOUGHT, tiny_model_and_tokenizer, with_token_bias

pytestmark = pytest.mark.usefixtures("one_thread")

#: A chat template in the style of instruct models: a BOS, one turn per message with a role
#: header, and an assistant header as the generation prompt.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]\n{% endif %}"
)
PROMPT = "What is 2+3? End each step with </thought>."


def save_chat_model(path, seed: int = 0):
    """Save a tiny Llama and a char tokenizer with :data:`TEMPLATE` into ``path``."""
    model, tok = tiny_model_and_tokenizer(seed=seed)
    tok.chat_template = TEMPLATE
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def rendered(tok, text: str) -> tuple[int, ...]:
    """The ids of the template rendered by hand: BOS, the user turn, the assistant header."""
    body = f"[user]\n{text}\n[assistant]\n"
    return (tok.bos_token_id, *tok.encode(body, add_special_tokens=False))


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat_model")
    save_chat_model(path)
    model, tok, where = load_policy(ModelConfig(name_or_path=str(path)))
    assert where == str(path)
    return model, tok


def test_loaded_tokenizer_keeps_the_template_and_prompts_go_through_it(chat_model):
    model, tok = chat_model
    assert tok.chat_template, "save_pretrained/from_pretrained must keep the chat template"
    ids = encode_prompt(tok, PROMPT)
    assert ids == rendered(tok, PROMPT)
    assert tok.decode(list(ids), skip_special_tokens=True).endswith("[assistant]\n")
    handle = ModelPolicyHandle(model, tok, HFBackend(model=model, tokenizer=tok), torch.Generator())
    assert handle.encode(PROMPT) == ids, "parts encode prompts as the rollout does"
    # Without a template, the same tokenizer encodes the bare text.
    tok_plain = type(tok).from_pretrained(tok.name_or_path)
    tok_plain.chat_template = None
    assert encode_prompt(tok_plain, PROMPT) == tuple(tok_plain.encode(PROMPT))


def test_response_is_what_the_model_generates_after_the_generation_prompt(chat_model):
    model, tok = chat_model
    ids = encode_prompt(tok, PROMPT)
    backend = HFBackend(model=model, tokenizer=tok)
    (out,) = backend.generate([GenerationRequest(ids)], SamplingParams(temperature=0.0, max_new_tokens=12))
    assert out.prompt_ids == ids and out.prefix_len == 0
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False, max_new_tokens=len(out.response_ids), pad_token_id=tok.pad_token_id,
        )[0].tolist()
    assert ref[: len(ids)] == list(ids)
    assert list(out.response_ids) == ref[len(ids) :], "the response continues the template"
    assert out.text == tok.decode(list(out.response_ids), skip_special_tokens=True)
    assert "[assistant]" not in out.text


def test_thoughts_and_reset_prefixes_stay_on_token_ids_after_the_template(tmp_path):
    save_chat_model(tmp_path, seed=1)
    model, tok, _ = load_policy(ModelConfig(name_or_path=str(tmp_path)))
    delim = tok.convert_tokens_to_ids(THOUGHT)
    model = with_token_bias(model, {delim: 4.0})  # thoughts end early and often
    backend = HFBackend(model=model, tokenizer=tok)
    ids = encode_prompt(tok, PROMPT)
    cfg = ThoughtConfig(delimiter=THOUGHT, max_thoughts=4, max_thought_tokens=10, final_marker="")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    (chain,) = generate_thoughts(backend, [GenerationRequest(ids)], greedy, cfg)
    assert chain.prompt_ids == ids, "every thought round continues the same templated prompt"
    spans = completion_spans(chain, (delim,), tok.eos_token_id)
    assert len(spans) >= 2, spans
    # A reset after the first thought: the prefix is the chain's own ids, never re-tokenized text,
    # and the continuation under the same prompt ids reproduces the greedy chain.
    cut = spans[0][1]
    prefix = chain.response_ids[:cut]
    (suffix,) = generate_thoughts(backend, [GenerationRequest(ids, prefix)], greedy, cfg)
    assert suffix.prompt_ids == ids and suffix.prefix_len == cut
    assert suffix.response_ids[:cut] == prefix
    assert suffix.response_ids == chain.response_ids
    # Sampled (not greedy) suffixes still start with the exact prefix ids.
    sampled = SamplingParams(temperature=1.0, max_new_tokens=10, seed=5)
    outs = generate_thoughts(backend, [GenerationRequest(ids, prefix)] * 3, sampled, cfg)
    assert all(o.response_ids[:cut] == prefix and o.prompt_ids == ids for o in outs)


@pytest.mark.parametrize("preset", ["olmo-3-7b-instruct", "qwen2.5-14b-instruct", "qwen2.5-7b-instruct"])
def test_paper_model_presets_name_hub_ids_and_fail_clearly_offline(preset, monkeypatch):
    from creditlab.errors import ConfigError
    from creditlab.run.compose import compose
    from creditlab.run.config import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = validate(compose([f"model={preset}"]))["model"]
    assert "/" in model.name_or_path and model.dtype == "bfloat16"
    assert (model.lora.r, model.lora.alpha, model.lora.target_modules) == (64, 64, "all-linear")
    if preset != "qwen2.5-14b-instruct":
        return  # one offline load is enough (~5 s)
    with pytest.raises(ConfigError, match=r"(?s)could not load model 'Qwen/Qwen2.5-14B-Instruct'.*model\.name_or_path"):
        load_policy(model)
