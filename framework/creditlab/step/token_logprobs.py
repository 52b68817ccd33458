"""Per-token log-probabilities and entropies of a causal LM's response tokens, by the fused LM head
(:mod:`creditlab.step.fused_head`) where the model allows it: no ``(rows, tokens, V)`` logits.

The fused path runs the model's decoder stack to its final hidden states (the shared-prompt passes
of :func:`creditlab.step.forward.response_hidden`), keeps only the positions asked for (the
response's real tokens: padding is never sent through the head) and hands ``(N, H)`` hidden states,
the head's weight and the targets to :func:`~creditlab.step.fused_head.fused_logprob_entropy`. The
unfused path is the previous one (:func:`~creditlab.step.forward.response_logits`, then
:func:`~creditlab.step.losses.gather_logprobs`), kept for heads the fused path cannot reproduce.

When the head is fused (:func:`fused_head_of`): the model's ``get_output_embeddings()`` is exactly a
``torch.nn.Linear`` (not a LoRA-wrapped or quantized head), it has a ``get_decoder()``, and its
``config.model_type`` is one whose forward is ``lm_head(decoder(...).last_hidden_state)`` with
nothing after the head (:data:`PLAIN_HEAD_MODEL_TYPES`; Gemma 2's soft-capping, Cohere's or
Granite's logit scales are not, and fall back). ``fused`` off, or a vocabulary below
:data:`FUSED_MIN_VOCAB` under ``auto``, also falls back (the demo's 20-token toy: no memory to
save, and the unfused path keeps its numbers bit for bit).
"""

from __future__ import annotations

from typing import Any

import torch

from creditlab.step.forward import response_hidden, response_logits
from creditlab.step.fused_head import fused_logprob_entropy
from creditlab.step.losses import entropy_from_logits, gather_logprobs

__all__ = ["FUSED_HEAD_MODES", "FUSED_MIN_VOCAB", "PLAIN_HEAD_MODEL_TYPES", "fused_head_of",
           "response_logprobs", "select_logprobs"]

#: ``loss.fused_head`` values: ``auto`` fuses a supported head of at least :data:`FUSED_MIN_VOCAB`
#: tokens, ``on`` any supported head, ``off`` none.
FUSED_HEAD_MODES = ("auto", "on", "off")
#: Under ``auto``, vocabularies below this keep the materialised logits (tiny models).
FUSED_MIN_VOCAB = 1024
#: ``config.model_type`` values whose causal-LM forward applies a plain linear head to the decoder's
#: last hidden state and nothing after it (``transformers`` 5.24).
PLAIN_HEAD_MODEL_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "olmo3", "phi3", "smollm3", "gemma",
    "qwen2_moe", "qwen3_moe", "mixtral",
})


def fused_head_of(model: Any, mode: str = "on") -> tuple[Any, torch.Tensor, torch.Tensor | None] | None:
    """``(decoder, weight (V, H), bias (V,) | None)`` when ``model``'s LM head can be fused under
    ``mode`` (see the module docstring), else ``None``. PEFT wrappers are looked through (their
    adapters live inside the decoder's layers, which run as they are)."""
    if mode not in FUSED_HEAD_MODES:
        raise ValueError(f"fused_head must be one of {', '.join(FUSED_HEAD_MODES)}; got {mode!r}.")
    if mode == "off":
        return None
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    try:
        head, decoder = model.get_output_embeddings(), model.get_decoder()
    except (AttributeError, NotImplementedError):
        return None
    if type(head) is not torch.nn.Linear or decoder is None or decoder is model:
        return None
    if mode == "auto" and head.weight.shape[0] < FUSED_MIN_VOCAB:
        return None
    return decoder, head.weight, head.bias


def select_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
    positions: torch.Tensor, temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprob, entropy)`` (b, T) float32 through the fused head at ``positions`` only (zeros
    elsewhere), from hidden states (b, T, H), targets (b, T) long and positions (b, T) bool."""
    index = positions.nonzero(as_tuple=True)
    lp, ent = fused_logprob_entropy(hidden[index], weight, targets[index], bias, temperature=temperature)
    zeros = torch.zeros(targets.shape, dtype=lp.dtype, device=lp.device)
    return zeros.index_put(index, lp), zeros.index_put(index, ent)


def response_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    targets: torch.Tensor,
    positions: torch.Tensor,
    temperature: float = 1.0,
    fused: str = "auto",
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities (differentiable) and entropies (detached) of each response token.

    Args:
        model: A ``transformers`` causal LM (or a PEFT wrapper of one).
        input_ids: (b, P+T) long, left-padded prompt then right-padded response.
        attention_mask: (b, P+T), 1 on real tokens.
        prompt_len: P.
        targets: (b, T) long, the response tokens.
        positions: (b, T), nonzero where a value is wanted (the response mask).
        temperature: τ > 0; the distribution is ``softmax(logits / τ)``.
        fused: ``loss.fused_head`` (:data:`FUSED_HEAD_MODES`).
        with_entropy: Return the entropies (else ``None``; the fused path has them for free).

    Returns:
        ``(logprob, entropy)``, each (b, T) float32. Fused: exactly 0 off ``positions``; unfused:
        the values of every position, as :func:`~creditlab.step.losses.gather_logprobs` gives them.
    """
    head = fused_head_of(model, fused)
    if head is None:
        logits = response_logits(model, input_ids, attention_mask, prompt_len)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach(), temperature)
        return gather_logprobs(logits, targets, temperature), entropy
    decoder, weight, bias = head
    hidden = response_hidden(model, decoder, input_ids, attention_mask, prompt_len)
    lp, ent = select_logprobs(hidden, weight, bias, targets, positions.bool(), temperature)
    return lp, ent.detach() if with_entropy else None
