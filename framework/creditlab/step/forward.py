"""Training-time forward passes that skip repeated work: each distinct prompt is run once.

A GRPO batch holds G completions of each prompt, so a plain forward over ``prompt + response``
runs every prompt G times. :func:`response_logits` runs each *distinct* prompt once with
``use_cache=True``, gathers the prompt's KV cache (and its last logits) to the rows by index, then
runs only the response columns against that cache. The result equals the plain forward's logits
(up to float rounding) and is differentiable through both passes: the prompt's keys/values are a
function of the parameters, and indexing them sums each row's gradient back into the shared prompt.

Layout (see :class:`~creditlab.types.RolloutBatch`): ``input_ids`` (b, P+T) is a left-padded
prompt in columns ``[0, P)`` then a right-padded response in ``[P, P+T)``; the logits at column
``P + t - 1`` predict response token ``t``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache

try:  # transformers >= 4.56: per-layer cache objects
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - older transformers: no sharing, plain forward only
    DynamicLayer = None

__all__ = [
    "CACHE_KEY", "accepts_logits_to_keep", "branch_logits", "cache_of", "dynamic_rope", "keep_last",
    "position_ids", "prefix_cache", "response_hidden", "response_logits", "unique_rows",
]

#: The keyword a model's forward takes its KV cache by, which is also the field of the output that
#: returns it: ``transformers`` 5.24 renamed ``past_key_values`` to ``cache`` (the old name still
#: works there but warns, and goes in 5.40). Call ``model(..., **{CACHE_KEY: cache})``.
CACHE_KEY = "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"


def cache_of(output: Any) -> Any:
    """The KV cache a model's forward returned (``output.cache``, or ``past_key_values`` before
    ``transformers`` 5.24)."""
    return getattr(output, CACHE_KEY)

_DROPOUT_CONFIG_KEYS = (
    "attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "activation_dropout",
)


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether ``model.forward`` (or, for wrappers like PEFT, the base model's) takes it."""
    params = inspect.signature(model.forward).parameters
    if "logits_to_keep" in params:
        return True
    base = getattr(model, "get_base_model", None)
    wraps = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return bool(wraps and callable(base) and accepts_logits_to_keep(base()))


def dynamic_rope(model: Any) -> bool:
    """Whether the model's rotary embedding rescales its frequencies with the longest position it
    is called with (``dynamic``/``longrope`` RoPE; ``transformers`` keeps that as module state):
    then a prompt run apart from its response gets other frequencies than the full sequence."""
    base = getattr(model, "get_base_model", None)
    inner = base() if callable(base) else model
    rotary = getattr(getattr(inner, "model", None), "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default")
    if isinstance(rope_type, dict):  # per layer type
        return any("dynamic" in str(t) or t == "longrope" for t in rope_type.values())
    return "dynamic" in str(rope_type) or rope_type == "longrope"


def keep_last(n: int, device: torch.device) -> torch.Tensor:
    """``logits_to_keep`` for the last ``n`` positions as an index tensor, not the int ``n``: the int
    slices the hidden states into a non-contiguous view, and a frozen LM head (LoRA) multiplied by
    such a view is copied once per batch row by ``torch.matmul`` (0.27 GB a row for a 151,936 x 896
    bf16 head); indexing makes a small contiguous copy of the hidden states instead. Same logits."""
    return torch.arange(-n, 0, device=device)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions counting only real tokens (left padding gets 0), from the (B, L) mask."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def unique_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)`` for the distinct rows of a 2-D tensor.

    ``first`` (U,) is the index of one row of each distinct value (in order of first appearance),
    ``inverse`` (B,) maps each row to its position in ``first``: ``x[first][inverse] == x``.
    """
    if x.shape[0] == 0:
        empty = torch.zeros(0, dtype=torch.long, device=x.device)
        return empty, empty
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    # renumber the groups by first appearance so the result does not depend on the value order
    b = x.shape[0]
    first_of = torch.full((int(inverse.max()) + 1,), b, dtype=torch.long, device=x.device)
    first_of.scatter_reduce_(0, inverse, torch.arange(b, device=x.device), reduce="amin")
    order = torch.argsort(first_of)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=x.device)
    return first_of[order], rank[inverse]


def _unshareable_mode(model: Any) -> bool:
    """Whether the model's training mode forbids a shared prompt pass: dropout is active (each row
    would get the same dropout mask on its prompt) or gradient checkpointing is on (it drops
    the KV cache).

    Checkpointing is what ``transformers`` checks: a module whose ``gradient_checkpointing`` flag
    is on and that is itself in training mode, with gradients enabled. It is looked for before
    the model's own flag, since :func:`creditlab.run.models.enable_gradient_checkpointing` sets
    ``training`` on the decoder layers only, in a policy kept in eval mode.
    """
    if torch.is_grad_enabled() and any(
        getattr(m, "gradient_checkpointing", False) is True and m.training for m in model.modules()
    ):
        return True
    if not getattr(model, "training", False):
        return False
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0 and module.training:
            return True
    config = getattr(model, "config", None)
    return any(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for v in (getattr(config, k, 0) for k in _DROPOUT_CONFIG_KEYS)
    )


def _shared_prompt_cache(model: Any) -> Any | None:
    """An empty ``DynamicCache`` for ``model`` when prompt sharing is supported, else ``None``.

    Supported: every layer is a plain full-attention ``DynamicLayer`` (a sliding-window, linear
    attention or quantized layer could not simply be gathered and extended).
    """
    if DynamicLayer is None:
        return None
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - no config, or a cache this transformers cannot build
        return None
    layers = getattr(cache, "layers", None)
    if not layers or not all(type(layer) is DynamicLayer for layer in layers):
        return None
    return cache


def _plain(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, p: int, keep: bool, decoder: Any = None,
) -> torch.Tensor:
    """The full forward over prompt + response, computing only what the response logits need:
    the last column (it predicts nothing) is not run, and only the logits of columns
    ``[p-1, p+T-1)`` go through the LM head (when the model takes ``logits_to_keep``). With
    ``decoder`` (the model's decoder stack), its final hidden states at those columns instead."""
    t = ids.shape[1] - p
    net = model if decoder is None else decoder
    if p < 1 or t < 1:  # nothing to save; the plain slice (empty when p == 0)
        pos = position_ids(mask)
        out = net(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        return _states(out, decoder)[:, p - 1 : -1]
    ids, mask = ids[:, :-1], mask[:, :-1]
    kwargs = {"logits_to_keep": keep_last(t, ids.device)} if keep and decoder is None else {}
    pos = position_ids(mask)
    out = net(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **kwargs)
    return out.logits if kwargs else _states(out, decoder)[:, p - 1 :]


def _states(out: Any, decoder: Any) -> torch.Tensor:
    """The logits of a causal LM's output, or the final hidden states of a decoder's."""
    return out.logits if decoder is None else out.last_hidden_state


def response_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    share_prompts: bool = True,
) -> torch.Tensor:
    """(b, T, V) float logits predicting each response token of a prompt/response batch.

    Equal (up to float rounding) to ``forward_logits(model, input_ids, attention_mask)[:,
    prompt_len - 1 : -1]``, but only the logits of the predicting positions are computed and,
    with ``share_prompts``, each distinct prompt (same ids and mask in columns ``[0, P)``) is run
    once; the last column, whose logits predict nothing, is never run. Falls back to the plain
    full forward when no prompt repeats, when the prompt or the response is empty, when the model
    does not take ``logits_to_keep``, when its cache is not a plain full-attention
    ``DynamicCache``, under gradient checkpointing, when dropout is active (rows sharing a
    prompt pass would share its dropout mask), or when its RoPE is dynamic (its frequencies
    depend on the longest position of the call).

    Args:
        model: A ``transformers`` causal LM.
        input_ids: (b, P+T) long, left-padded prompt then right-padded response.
        attention_mask: (b, P+T), 1 on real tokens.
        prompt_len: P.
        share_prompts: Run each distinct prompt once (``False``: always the plain forward).
    """
    return _response(model, input_ids, attention_mask, prompt_len, share_prompts).float()


def response_hidden(
    model: Any,
    decoder: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    share_prompts: bool = True,
) -> torch.Tensor:
    """(b, T, H) final hidden states (after the decoder's last norm) at the positions that predict
    each response token: what :func:`response_logits` would feed the LM head, with no head run.

    The same passes as :func:`response_logits` (each distinct prompt once when that applies), run
    through ``decoder``, the causal LM ``model``'s decoder stack (``model.get_decoder()``); the
    model itself decides whether prompts can be shared. Dtype: the model's.
    """
    return _response(model, input_ids, attention_mask, prompt_len, share_prompts, decoder)


def _response(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
    share_prompts: bool, decoder: Any = None,
) -> torch.Tensor:
    p = int(prompt_len)
    t = input_ids.shape[1] - p
    keep = accepts_logits_to_keep(model)
    net = model if decoder is None else decoder
    if not share_prompts or p < 1 or t < 1 or input_ids.shape[0] < 2 or not (keep or net is decoder):
        return _plain(model, input_ids, attention_mask, p, keep, decoder)
    if dynamic_rope(model):  # a prompt run alone would get other RoPE frequencies
        return _plain(model, input_ids, attention_mask, p, keep, decoder)
    key = torch.cat([input_ids[:, :p], attention_mask[:, :p].to(input_ids.dtype)], dim=1)
    first, inverse = unique_rows(key)
    if len(first) == input_ids.shape[0] or _unshareable_mode(model):
        return _plain(model, input_ids, attention_mask, p, keep, decoder)
    cache = _shared_prompt_cache(model)
    if cache is None:
        return _plain(model, input_ids, attention_mask, p, keep, decoder)

    # 1. Each distinct prompt once; only the last position's logits (they predict token 0).
    prompt_mask = attention_mask[first, :p]
    last = {} if decoder is not None else {"logits_to_keep": keep_last(1, input_ids.device)}
    out = net(
        input_ids=input_ids[first, :p],
        attention_mask=prompt_mask,
        position_ids=position_ids(prompt_mask),
        use_cache=True,
        **last,
        **{CACHE_KEY: cache},
    )
    head = _states(out, decoder)[:, -1:][inverse]  # (b, 1, V), or (b, 1, H)
    if t == 1:
        return head
    # 2. Gather the prompt KV to the rows (differentiable; gradients sum into the shared prompt).
    cache = _select_cache(cache_of(out), inverse.to(input_ids.device))
    # 3. The response columns but the last (its logits predict nothing) against the cache, with
    #    the full mask and positions counted over the whole row.
    mask = attention_mask[:, :-1]
    out = net(
        input_ids=input_ids[:, p:-1],
        attention_mask=mask,
        position_ids=position_ids(mask)[:, p:],
        use_cache=True,
        **{CACHE_KEY: cache},
    )
    return torch.cat([head, _states(out, decoder)], dim=1)


def _select_cache(cache: Any, index: torch.Tensor, columns: int | None = None) -> Any:
    """A new ``DynamicCache`` holding rows ``index`` of ``cache`` (``cache`` is left as it is), and
    only its first ``columns`` positions when given.

    ``index_select``, not advanced indexing (``DynamicLayer.batch_select_indices``): its backward
    sums the rows' gradients into the shared prompt in a fixed order, where indexing's backward
    (``index_put_`` with accumulation) adds them with atomics on the CPU, in an order that
    changes from run to run (measured: gradients differing by ~4e-9 between two runs of one
    command, so no two runs had the same metrics).
    """
    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        keys, values = layer.keys[:, :, :columns], layer.values[:, :, :columns]
        out.update(keys.index_select(0, index), values.index_select(0, index), i)
    return out


def prefix_cache(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, decoder: Any = None) -> Any | None:
    """The KV cache of every row's (B, s) prefix, each distinct prefix run once without grad and
    gathered to its rows (a new ``DynamicCache``), to continue with grad from column ``s``; or
    ``None`` when no prefix repeats or the cache cannot be shared (as :func:`response_logits`
    decides: dynamic RoPE, gradient checkpointing, active dropout, another cache type). Runs
    ``decoder`` (the model's decoder stack) when given, so no head is computed."""
    if input_ids.shape[0] < 2 or input_ids.shape[1] < 1 or dynamic_rope(model) or _unshareable_mode(model):
        return None
    first, inverse = unique_rows(torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1))
    cache = _shared_prompt_cache(model) if len(first) < input_ids.shape[0] else None
    if cache is None:
        return None
    mask = attention_mask[first]
    last = {} if decoder is not None else {"logits_to_keep": keep_last(1, input_ids.device)}
    with torch.no_grad():
        (model if decoder is None else decoder)(input_ids=input_ids[first], attention_mask=mask,
                                                position_ids=position_ids(mask), use_cache=True,
                                                **last, **{CACHE_KEY: cache})
    return _select_cache(cache, inverse.to(input_ids.device))


@torch.no_grad()
def branch_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: torch.Tensor,
    at: torch.Tensor,
    branch_ids: torch.Tensor,
    branch_mask: torch.Tensor,
    chunk: int = 0,
    decoder: Any = None,
    after_each: bool = False,
) -> torch.Tensor | None:
    """(J, M, V) logits predicting each branch token, each trunk run once (see
    :meth:`creditlab.interfaces.PolicyHandle.branch_logprobs` for the arguments).

    The trunks (B, L), right-padded, run once with ``use_cache=True``. Branch ``j`` then re-feeds
    token ``at[j] - 1`` of its trunk followed by ``branch_ids[j]``, at positions ``at[j] - 1 ...``,
    against the trunk's cached keys/values masked to columns ``< at[j] - 1``: the logits at
    branch column ``t`` predict ``branch_ids[j, t]`` from ``trunk[:at[j]] + branch_ids[j, :t]``,
    as a full forward over that sequence would (up to float rounding). ``chunk`` > 0 runs the
    branches that many at a time, longest first, each chunk cut to its own longest branch and to
    the cache columns it reads (no padding is run); the trunks run only up to the last column a
    branch reads. With ``decoder`` (``model``'s decoder stack), the (J, M, H) final
    hidden states there instead, in the model's dtype (no LM head run). With ``after_each``, the
    outputs *at* each branch token instead (column ``t``: the distribution following
    ``trunk[:at[j]] + branch_ids[j, :t + 1]``; no trunk token is re-fed), for
    :meth:`~creditlab.interfaces.PolicyHandle.branch_read_logits`. Returns ``None`` when the
    model's cache cannot be gathered (not plain full attention, dynamic RoPE, or no
    ``logits_to_keep``): the caller falls back.
    """
    if dynamic_rope(model) or not accepts_logits_to_keep(model) or bool((at < 1).any()):
        return None
    cache = _shared_prompt_cache(model)
    if cache is None:
        return None
    net = model if decoder is None else decoder
    start = at if after_each else at - 1  # the first branch position; the cache holds columns < start
    upto = max(int(start.max()), 1) if len(rows) else 1  # no branch reads a trunk column past this
    ids_t, mask_t = input_ids[:, :upto], attention_mask[:, :upto]
    last = {} if decoder is not None else {"logits_to_keep": keep_last(1, input_ids.device)}
    model_out = net(
        input_ids=ids_t, attention_mask=mask_t, position_ids=position_ids(mask_t),
        use_cache=True, **last, **{CACHE_KEY: cache},
    )
    trunk_cache = cache_of(model_out)
    cols = torch.arange(upto, device=input_ids.device)
    lengths = branch_mask.sum(1)
    order = torch.argsort(lengths, descending=True, stable=True)  # chunks of similar lengths
    step = chunk or max(len(rows), 1)
    result = None
    for s in range(0, len(rows), step):
        idx = order[s : s + step]
        r, a, b0 = rows[idx], at[idx], start[idx]
        m = max(int(lengths[idx].max()), 1)  # this chunk's longest branch: later columns are padding
        ids, bmask = branch_ids[idx, :m], branch_mask[idx, :m]
        # re-feed trunk token at - 1 so its output predicts branch token 0 (not with after_each)
        first = input_ids[r, a - 1].unsqueeze(1)[:, :0 if after_each else 1]  # (j, 0 or 1)
        c = max(int(b0.max()), 1)  # cache columns this chunk reads
        past = (cols[None, :c] < b0[:, None]) & (mask_t[r, :c] > 0)
        mask = torch.cat([past.long(), torch.ones_like(first), bmask.long()], dim=1)
        pos = b0[:, None] + torch.arange(m + first.shape[1], device=ids.device)[None, :]
        out = net(
            input_ids=torch.cat([first, ids], dim=1), attention_mask=mask, position_ids=pos,
            use_cache=True, **{CACHE_KEY: _select_cache(trunk_cache, r, c)},
        )
        states = _states(out, decoder)
        states = states if after_each else states[:, :-1]
        states = states.float() if decoder is None else states
        if result is None:
            result = states.new_zeros((len(rows), branch_ids.shape[1], states.shape[-1]))
        result[idx, :m] = states
    return result
