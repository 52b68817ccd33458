"""What the memory plan (:mod:`creditlab.run.memory`) needs of a model before it loads: its
:class:`Shape` from its config alone, and the longest prompt in its tokens.

Where the config comes from, in order (:func:`load_shape`):

* a recipe model: its ``creditlab.model_recipe_config`` entry point (``(config, tokenizer)``,
  nothing built);
* a local folder or a hub id: ``config.json`` through ``AutoConfig`` (the hub's, or the cache's);
* a hub id this machine cannot reach: the file shipped in ``creditlab/run/model_configs/`` for
  that id (the shipped presets' models; sources in its README). No tokenizer then: prompts are
  measured in characters, an upper bound for byte-pair tokenizers.

The parameter and layer shapes come from the model built on torch's ``meta`` device (no weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from creditlab.errors import ConfigError
from creditlab.registry import registry
from creditlab.run.models import ModelConfig
from creditlab.step.policy import encode_prompt
from creditlab.step.token_logprobs import fused_head_of

#: Shipped ``config.json`` files of the presets' hub models, named ``<owner>--<name>.json``.
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "model_configs"


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model, from its config (``linears``: ``(name, in, out)`` of
    every linear layer but the output head, for LoRA)."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int
    linears: tuple[tuple[str, int, int], ...]
    fusable_head: bool = False


def shape_of(config: Any, trust_remote_code: bool = False) -> Shape:
    """The :class:`Shape` of a ``transformers`` config: the model built on the ``meta`` device (the
    random number generators untouched: at run start, the run draws what it drew without it)."""
    text = config.get_text_config()
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    head = model.get_output_embeddings()
    linears = tuple((n, m.in_features, m.out_features) for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and m is not head)
    heads = text.num_attention_heads
    return Shape(
        params=sum(p.numel() for p in model.parameters()), layers=text.num_hidden_layers,
        hidden=text.hidden_size, intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads, vocab=text.vocab_size,
        linears=linears, fusable_head=fused_head_of(model, "on") is not None,
    )


def lora_linears(shape: Shape, targets: Any) -> list[tuple[str, int, int]]:
    """The linear layers LoRA adapts: ``all-linear`` (every one but the output head, as peft) or
    those whose name is a target or ends with ``.<target>``."""
    if targets == "all-linear":
        return list(shape.linears)
    names = [targets] if isinstance(targets, str) else list(targets)
    return [lin for lin in shape.linears if any(lin[0] == t or lin[0].endswith("." + t) for t in names)]


def shipped_config(hub_id: str) -> tuple[Any, Path] | None:
    """``(config, file)`` shipped for ``hub_id`` (``owner/name``, compared without regard to
    case, as the hub does), or ``None`` when none is."""
    want = hub_id.strip("/").replace("/", "--").lower() + ".json"
    for file in sorted(SHIPPED_CONFIGS.glob("*.json")):
        if file.name.lower() == want:
            values = json.loads(file.read_text())
            return AutoConfig.for_model(values.pop("model_type"), **values), file
    return None


def load_shape(model: ModelConfig) -> tuple[Shape, Any, str]:
    """``(shape, tokenizer or None, where it came from)`` without loading weights or building a
    recipe's checkpoint.

    Raises:
        ConfigError: No config to read: a folder without ``config.json``, a hub id this machine
            cannot reach and no shipped config holds, or a recipe that registers no shape.
    """
    if not model.name_or_path:
        shapes = registry("model_recipe_config")
        if model.recipe not in shapes:
            raise ConfigError(
                f"model.recipe={model.recipe} builds its checkpoint when the run starts and registers no "
                f"shape (entry-point group 'creditlab.model_recipe_config'), so its size is unknown before it "
                f"is built: run it once, then pass the folder it printed as 'model:' as model.name_or_path."
            )
        try:
            config, tokenizer = shapes.get(model.recipe)(dict(model.recipe_args))
        except ValueError as exc:
            raise ConfigError(f"model.recipe_args: {exc}") from exc
        return shape_of(config), tokenizer, "its creditlab.model_recipe_config entry, nothing built"
    path = model.name_or_path
    local = Path(path).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():
        have = ", ".join(sorted(p.name for p in local.iterdir())[:8]) or "nothing"
        raise ConfigError(
            f"model.name_or_path={path} is a folder without config.json (it holds: {have}). Point it at a "
            f"folder written by save_pretrained (config.json, weights, tokenizer), or at a hub model id."
        )
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as exc:
        shipped = None if local.exists() else shipped_config(path)
        if shipped is None:
            raise ConfigError(
                f"cannot read the config of model.name_or_path={path}: {str(exc).strip().rstrip('.')}. Pass a "
                f"local folder holding config.json, or a hub id on a machine with network access (HF_HUB_OFFLINE "
                f"unset); configs ship for the presets' hub models only ({_shipped_names()})."
            ) from exc
        config, file = shipped
        where = f"the config shipped with creditlab, {file.parent.name}/{file.name} (the hub is not reachable here)"
        return shape_of(config, model.trust_remote_code), None, where
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError):
        tokenizer = None
    return shape_of(config, model.trust_remote_code), tokenizer, f"{path}/config.json"


def _shipped_names() -> str:
    return ", ".join(f.stem.replace("--", "/") for f in sorted(SHIPPED_CONFIGS.glob("*.json")))


def prompt_tokens(problems: list[Any], tokenizer: Any, chat_template: Any) -> tuple[int, str]:
    """``(tokens, how)`` of the longest prompt, encoded as rollouts encode it (the 500 longest by
    characters); without a tokenizer its characters (an upper bound for byte-pair tokenizers).

    Raises:
        ConfigError: The tokenizer encodes every one of those prompts to no token (an empty or
            unfitting tokenizer: every prompt would reach the model empty).
    """
    longest = sorted((p.prompt for p in problems), key=len, reverse=True)[:500]
    if tokenizer is None or not longest:
        return len(longest[0]) if longest else 0, "characters (no tokenizer)"
    tokens = max(len(encode_prompt(tokenizer, t, chat_template)) for t in longest)
    if tokens == 0 and longest[0]:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"the tokenizer of {name} encodes every prompt to no token (e.g. {longest[0][:60]!r}): it is "
            "empty or does not fit this text; give model.name_or_path a folder whose tokenizer encodes "
            "the task's prompts, or pass --prompt-tokens N to plan without it")
    return tokens, "tokens"
