"""Generation from a ``transformers`` causal LM with the project's own decoding loop.

The loop never calls ``model.generate``, so nothing in the model's ``generation_config`` (a stored
temperature, a ``top_k=50`` default, a repetition penalty, extra EOS ids) can change sampling: the
only settings are those of :class:`~creditlab.types.SamplingParams`, recorded in
``HFBackend.last_effective`` after each call.

Per step (batch of A active rows, vocabulary V): logits (A, V) -> ``log_softmax(logits / T)``
(T = 1 when greedy) gives the reported log-prob of the chosen token and the reported entropy
of the step (``Completion.entropies``, one exp and sum over V per step); the token is the argmax
(``temperature == 0``) or a draw after top-k then top-p truncation of the temperature-scaled
distribution, by inverse CDF from one uniform per row and step. The uniforms of a forward batch
(N rows x max_new_tokens) are drawn from the call's seeded generator before its first step, so
a row's draws do not depend on when the other rows end or whether finished rows were dropped.
Rows are left-padded; ``position_ids`` come from the attention mask, so a row's result does not
depend on the other rows of the batch (up to float rounding).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from creditlab.accel import Choice, choose
from creditlab.accel.fused_decode import FusedDecoder
from creditlab.backends.kv_cache import gatherable, make_cache, plain_kv, shared_contexts
from creditlab.backends.prefix_store import PrefixStore, feed_last, keep_rows, past_cache
from creditlab.backends.sampling import (
    END_REASONS,
    SAMPLERS,
    SamplingPlan,
    check_requests,
    end_rows,
    make_plan,
    sample_tokens,
    validate_sampling,
)
from creditlab.errors import ConfigError
from creditlab.interfaces import DecodeWatch, GenerationBackend
from creditlab.step.forward import CACHE_KEY, accepts_logits_to_keep, cache_of, keep_last, position_ids
from creditlab.types import Completion, GenerationRequest, Mean, SamplingParams, Sum


class HFBackend(GenerationBackend):
    """Samples from the very ``transformers`` module being trained (no weight copy).

    Requests are split into forward batches of at most ``max_batch_size`` rows (sorted by context
    length when there is more than one batch), each decoded with a KV cache. Finished rows stay
    in the batch until ``compact_fraction`` of the batch has finished, then they are dropped from
    the batch and the cache (which rows are dropped when changes no draw: see the module
    docstring). The model is put in eval mode during generation and every module's
    train/eval flag is restored afterwards.

    Stop strings: one that is exactly one token (e.g. an added ``</thought>`` token) is matched by
    id; any other is matched in the decoded text of the *generated* tokens (as vLLM does: a match
    inside the prompt or prefix does not count). The sequence ends after the token completing it.
    The tokenizer's ``eos_token_id`` ends a row and is kept in ``response_ids``.
    ``Completion.text`` is ``decode(response_ids, skip_special_tokens=True)``.
    """

    watches = True  # generate_watched: thought-by-thought generation in one pass

    @dataclass
    class Config:
        """Attributes:
        max_batch_size: Requests per forward batch.
        use_cache: Decode with a KV cache (``False`` re-runs the whole sequence each step).
        compact_fraction: Drop finished rows from the batch once this fraction of it finished.
        preallocate_kv: Write the KV cache in place into a preallocated buffer (full-attention
            models only; others fall back to ``DynamicCache``).
        share_prefill: Prefill each distinct context (``prompt_ids + prefix_ids``) of a forward
            batch once and copy its KV cache rows and last logits to every row that has it
            (when every cache layer is a full-attention, sliding-window or preallocated one;
            otherwise every row is prefilled). Sampling is unchanged: the same RNG draws in the
            same order, on the same logits per row up to float rounding (the prefill runs with
            fewer rows).
        accelerator: ``auto``, ``none``, ``fused`` or ``compile`` (:mod:`creditlab.accel`; the
            shipped YAML reads ``model.accelerator``): ``fused`` runs the one-token decoding steps
            of a float32 Llama/Qwen2 model straight from its parameters with about half the ops
            of its forward (same logits up to float rounding; ``use_cache=False`` always runs the
            model's own forward); ``auto`` does so where the model is supported; ``compile`` and
            ``none`` run the model's forward (compiled or not by the model loader).
        dtype: Decoding's matrix products: ``auto`` (the model's dtype), ``float32`` or
            ``bfloat16`` (fused steps from bfloat16 weight copies, the rest float32; the prefill
            and unfused models under autocast): 1.6-2.1x faster on a CPU with bfloat16 units;
            the log-probs' gap to the trainer's shows in ``train/backend/logprob_*``.
        prefix_cache_mb: Keep what the fused steps decoded (keys/values, at most this many MB,
            until the weights change) for a later request that continues it: the next thought, a
            reset, a Monte-Carlo continuation (:mod:`creditlab.backends.prefix_store`); 0 = off.
        sampler: ``inverse_cdf`` (the module docstring) or ``multinomial`` (per step, draws
            depend on the whole batch; with ``compact_fraction=0.25``: runs before issue 40).
        fused_shared_context_min: With fused decoding, rows that share a context of at least
            this many tokens (prompt + prefix, padded) keep one copy of its keys/values, read once
            per group at every step; shorter contexts are copied to every row (two matrix
            products less per layer and step, which is cheaper when the context is short).
        sync_every: Decoding steps between two looks at which rows have finished (the one host
            sync of the loop without text stops: it ends the loop and compacts the batch);
            0 = every step on the CPU, where a look costs nothing, and every 8 on an accelerator,
            whose queue of kernels would otherwise drain at every token. Rows that finished go
            on decoding until the next look; what they sample after their end is cut off.
        fused_copy_budget_mb: The fused steps concatenate and transpose the projection weights
            into copies (made once per ``generate`` call) when these take at most this many MB;
            above it they read the module weights in place (a little slower).
        """

        max_batch_size: int = 256
        use_cache: bool = True
        compact_fraction: float = 0.125
        preallocate_kv: bool = True
        share_prefill: bool = True
        accelerator: str = "auto"
        dtype: str = "auto"
        sampler: str = "inverse_cdf"
        prefix_cache_mb: float = 1024.0
        fused_copy_budget_mb: float = 512.0
        fused_shared_context_min: int = 32
        sync_every: int = 0

        def __post_init__(self) -> None:
            if self.sampler not in SAMPLERS:
                raise ConfigError(f"backend.sampler must be {' or '.join(SAMPLERS)}, got '{self.sampler}'")
            if self.dtype not in ("auto", "float32", "bfloat16"):
                raise ConfigError(f"backend.dtype must be auto, float32 or bfloat16, got '{self.dtype}'")

    def __init__(self, config: Config | None = None, *, model, tokenizer) -> None:
        super().__init__(config, model=model, tokenizer=tokenizer)
        if self.config.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.config.max_batch_size}")
        if self.config.sync_every < 0:
            raise ValueError(f"sync_every must be >= 0 (0: automatic), got {self.config.sync_every}")
        if not 0 <= self.config.compact_fraction <= 1:
            raise ValueError(f"compact_fraction must be in [0, 1], got {self.config}")
        #: The dtype of decoding's matrix products (``Config.dtype``).
        self.dtype: torch.dtype = (next(model.parameters()).dtype if self.config.dtype == "auto"
                                   else getattr(torch, self.config.dtype))
        #: Settings actually used by the last ``generate`` call (TESTING trap 7).
        self.last_effective: dict = {}
        self._keeps_logits = accepts_logits_to_keep(model)  # only the last position's (keep_last)
        self._stats = dict.fromkeys(("tokens", "prefill_tokens", "seconds", "calls"), 0.0)
        #: The speed path (``path``: ``fused``, ``compile`` or ``none``), recorded with the run.
        self.accelerator: Choice = choose(self.config.accelerator, model)
        self._fused: FusedDecoder | None = None
        self._store = PrefixStore(self.config.prefix_cache_mb)
        self._weights_version = -1  # of the weights the stored keys/values were computed with

    # ----------------------------------------------------------------------------- public API
    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Completion]:
        """One completion per request, in request order (see the class docstring)."""
        return self._run(requests, sampling, None)

    def generate_watched(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams, watch: DecodeWatch
    ) -> list[Completion]:
        """:meth:`generate`, with ``watch`` shown each live row's tokens (on the host, every
        step) and ending rows where it says."""
        return self._run(requests, sampling, watch)

    def _run(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams, watch: DecodeWatch | None
    ) -> list[Completion]:
        validate_sampling(sampling)
        requests = list(requests)
        context = getattr(self.model.config, "max_position_embeddings", None)
        check_requests(requests, sampling, context)
        plan = self._plan(sampling)
        self.last_effective = {**dataclasses.asdict(plan), "greedy": plan.greedy}
        requested = (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens)
        used = (plan.temperature, plan.top_p, plan.top_k, plan.max_new_tokens)
        if requested != used or tuple(sampling.stop) != plan.stop:
            raise RuntimeError(f"effective sampling {used} differs from requested {requested}")
        if not requests:
            return []

        start = time.perf_counter()
        gen = torch.Generator(device=self._device())
        gen.manual_seed(plan.seed)
        modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()
        results: list[Completion | None] = [None] * len(requests)
        bs = self.config.max_batch_size
        order = list(range(len(requests)))
        if len(requests) > bs:
            order.sort(key=lambda i: len(requests[i].prompt_ids) + len(requests[i].prefix_ids))
        try:
            with torch.inference_mode():
                self._fused = None  # the fused steps' decoder, with this call's weights
                fused = self.accelerator.path == "fused"
                version = sum(p._version for p in self.model.parameters())  # bumps at every write
                if version != self._weights_version:
                    self._store.clear()
                    self._weights_version = version
                if fused and self.config.use_cache and plan.max_new_tokens > 1:
                    self._fused = FusedDecoder.build(
                        self.model, self.config.fused_copy_budget_mb, self.dtype)
                for lo in range(0, len(order), bs):
                    idx = order[lo : lo + bs]
                    batch = self._generate_batch([requests[i] for i in idx], plan, gen,
                                                 None if watch is None else (watch, idx))
                    for i, c in zip(idx, batch):
                        results[i] = c
        finally:
            self._fused = None  # drop the weight copies
            for module, mode in modes:
                module.training = mode
        self._stats["seconds"] += time.perf_counter() - start
        self._stats["calls"] += 1
        self._stats["tokens"] += sum(len(c.logprobs) for c in results)  # type: ignore[union-attr]
        return results  # type: ignore[return-value]

    def load_weights(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        """No-op when ``state_dict`` is None (the backend samples from the trained module itself);
        otherwise the tensors are copied into the module (``load_state_dict``, strict)."""
        if state_dict is not None:
            with torch.no_grad():
                self.model.load_state_dict(state_dict, strict=True)

    def release(self) -> None:  # the stored keys/values (prefix_cache_mb)
        self._store.clear()

    def describe(self) -> dict[str, Any]:
        """The speed path this backend chose (:mod:`creditlab.accel`), recorded with the run."""
        return {"accelerator": self.accelerator.record()}

    def metrics(self) -> dict[str, float]:
        """Generated tokens, prefilled tokens (the contexts' tokens run through the first forward
        of a batch: each distinct context once when shared, none of what the prefix store holds,
        and none when only each context's last token is new: it is fed as a decoding step),
        calls, seconds and tokens/s since the last call (then reset)."""
        s = self._stats
        out: dict[str, float] = {k: Sum(v) for k, v in s.items()}
        out["tokens_per_s"] = Mean(s["tokens"] / s["seconds"] if s["seconds"] > 0 else 0.0)
        self._stats = dict.fromkeys(s, 0.0)
        return out

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _plan(self, sp: SamplingParams) -> SamplingPlan:  # a method: benchmarks patch it
        return make_plan(self.tokenizer, sp)

    def _forward(self, **kwargs: Any) -> Any:
        """The model's forward, under ``torch.autocast`` when ``dtype`` is not the model's own
        (otherwise in the caller's autocast state: a run's bf16-mixed precision stays on)."""
        if self.dtype == next(self.model.parameters()).dtype:
            return self.model(**kwargs)
        with torch.autocast(self._device().type, dtype=self.dtype):
            return self.model(**kwargs)

    def _generate_batch(
        self, reqs: list[GenerationRequest], plan: SamplingPlan, gen: torch.Generator,
        watch: tuple[DecodeWatch, list[int]] | None = None,
    ) -> list[Completion]:
        """Decode one forward batch of N requests (N <= max_batch_size); ``watch``: a watch and
        each request's index in the call."""
        device = self._device()
        n, max_new = len(reqs), plan.max_new_tokens
        contexts = [tuple(r.prompt_ids) + tuple(r.prefix_ids) for r in reqs]
        out_tokens = torch.full((n, max(max_new, 1)), plan.pad_token_id, dtype=torch.long, device=device)
        out_logp = torch.zeros((2, n, max(max_new, 1)), dtype=torch.float32, device=device)  # log-probs, entropies
        ended_at = torch.full((n,), max_new, dtype=torch.long, device=device)  # a row's length
        why = torch.zeros((n,), dtype=torch.long, device=device)  # index into END_REASONS
        if max_new > 0:
            self._decode(contexts, plan, gen, device, out_tokens, out_logp, ended_at, why, watch)

        tokens, (logps, ents) = out_tokens.tolist(), out_logp.tolist()  # the batch's one copy to the host
        lengths, reasons = ended_at.tolist(), [END_REASONS[i] for i in why.tolist()]
        responses = [tuple(r.prefix_ids) + tuple(tokens[i][: lengths[i]]) for i, r in enumerate(reqs)]
        texts = self.tokenizer.batch_decode([list(x) for x in responses], skip_special_tokens=True,
                                            clean_up_tokenization_spaces=False)
        return [
            Completion(
                prompt_ids=tuple(r.prompt_ids),
                response_ids=responses[i],
                logprobs=tuple(logps[i][: lengths[i]]),
                entropies=tuple(ents[i][: lengths[i]]),
                finish_reason=reasons[i],
                text=texts[i],
                prefix_len=len(r.prefix_ids),
            )
            for i, r in enumerate(reqs)
        ]

    def _decode(self, contexts, plan, gen, device, out_tokens, out_logp, ended_at, why, watch=None) -> None:
        """The decoding loop; fills, on the model's device and in place, ``out_tokens`` (N, max_new),
        ``out_logp`` (2, N, max_new: log-probs, then entropies; both valid up to each row's
        length), and per row ``ended_at`` (N,) its length and ``why`` (N,) the index of its
        finish reason in :data:`END_REASONS` (rows that do not finish keep ``max_new``, 0)."""
        n, max_new, pad = len(contexts), plan.max_new_tokens, plan.pad_token_id
        width = max(len(c) for c in contexts)
        ids = torch.tensor([(pad,) * (width - len(c)) + c for c in contexts], device=device)
        # The attention mask of every step, preallocated: step s >= 1 reads columns [0, width + s)
        # (left padding, then one column per generated token).
        mask = torch.ones((n, width + max_new), dtype=torch.long, device=device)
        mask[:, :width] = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=device)
        pos = position_ids(mask[:, :width])
        has_pad = any(len(c) < width for c in contexts)
        last_pos = pos[:, -1].clone()  # (A,) position of each row's latest token
        rows = torch.arange(n, device=device)  # batch row -> request row
        alive = torch.ones(n, dtype=torch.bool, device=device)
        use_cache = self.config.use_cache
        # (N, max_new) float64: row i's uniform of step s, whatever the batch looks like then
        legacy = self.config.sampler == "multinomial"
        uniforms = None if plan.greedy or legacy else torch.rand(
            (n, max_new), generator=gen, dtype=torch.float64, device=device)
        cache = make_cache(self.model, width + max_new, self.config.preallocate_kv) if use_cache else None
        stop_ids = torch.tensor(plan.stop_token_ids, dtype=torch.long, device=device)
        shared = None
        if use_cache and self.config.share_prefill and gatherable(cache):
            shared = shared_contexts(contexts)
        every = self.config.sync_every or (1 if device.type == "cpu" else 8)
        last_only = {"logits_to_keep": keep_last(1, device)} if self._keeps_logits else {}
        fused = self._fused if use_cache and max_new > 1 else None
        feed_ids, feed_pos, lead = ids, pos, 0
        for step in range(max_new):
            cols = width + step
            if step == 0 and (shared is not None or fused is not None):
                # Prefill each distinct context once, then give its cache rows and last logits
                # to the rows that share it: every row sees the logits it would have computed.
                # The fused steps keep one copy of each context's keys/values (and read it once
                # per group); otherwise the cache rows are copied to every row.
                first, inverse = shared if shared is not None else (range(n), range(n))
                first = torch.tensor(first, device=device)
                inverse = torch.tensor(inverse, device=device)
                distinct = [contexts[i] for i in first.tolist()]
                hits = self._store.match(distinct) if fused is not None else [(0, None)] * len(distinct)
                feed, reused = (ids[first], mask[first, :cols], pos[first]), any(n for n, _ in hits)
                logits = feed_last(fused, self.model, hits, distinct, inverse, pad, device, max_new,
                                   self.config.fused_shared_context_min) if reused else None
                lead = int(logits is not None)  # 1: the contexts' last tokens fed as a step
                if lead:
                    cache = None  # the fused steps own the keys/values, started from the store
                else:
                    if reused:  # stored keys/values for what continues a stored row, prefill the rest
                        cache = make_cache(self.model, max(n for n, _ in hits) + width, True)
                        feed = past_cache(cache, hits, distinct, pad, device)
                    out = self._forward(input_ids=feed[0], attention_mask=feed[1], position_ids=feed[2],
                                        use_cache=True, **{CACHE_KEY: cache}, **last_only)
                    cache, logits = cache_of(out), out.logits[:, -1, :][inverse]
                    self._stats["prefill_tokens"] += sum(len(c) - n for c, (n, _) in zip(distinct, hits))
                    if fused is not None and plain_kv(cache):
                        fused.start(cache, inverse, feed[1].bool() if has_pad or reused else None,
                                    max_new - 1, self.config.fused_shared_context_min)
                        cache = None  # the fused steps own the keys/values from here
                    else:
                        fused = None
                        cache.batch_select_indices(inverse)
            elif fused is not None:
                logits = fused.step(feed_ids[:, 0], feed_pos[:, 0])
            else:
                out = self._forward(
                    input_ids=feed_ids,
                    attention_mask=mask[:, :cols],
                    position_ids=feed_pos,
                    use_cache=use_cache,
                    **{CACHE_KEY: cache},
                    **last_only,
                )
                if use_cache:
                    cache = cache_of(out)
                logits = out.logits[:, -1, :]
                if step == 0:
                    self._stats["prefill_tokens"] += sum(len(c) for c in contexts)
            u = uniforms[rows, step] if uniforms is not None else (gen if legacy else None)
            tok, logp, ent = sample_tokens(logits.float(), plan, u)
            out_tokens[rows, step] = tok  # finished rows too: past their length, cut off
            out_logp[:, rows, step] = torch.stack([logp, ent])

            end_rows(self.tokenizer, plan, step, tok, out_tokens, rows, alive, ended_at, why, stop_ids, watch)
            n_dead = 0 if (step + 1) % every else len(rows) - int(alive.sum())  # a look at the host
            done = step + 1 == max_new or n_dead == len(rows)  # rows alive at the end: "length"
            compact = bool(n_dead) and n_dead >= self.config.compact_fraction * len(rows)
            if fused is not None and (done or compact) and self.config.prefix_cache_mb > 0:
                keep_rows(self._store, fused, rows, None if done else ~alive, contexts, out_tokens, ended_at, lead)
            if done:
                return
            if compact:
                keep = alive.nonzero().squeeze(1)
                rows, alive, tok = rows[keep], alive[keep], tok[keep]
                mask, last_pos = mask[keep], last_pos[keep]
                if fused is not None:
                    fused.select(keep)
                elif use_cache:
                    cache.batch_select_indices(keep)
                else:
                    ids, pos = ids[keep], pos[keep]
            last_pos = last_pos + 1
            if use_cache:
                feed_ids, feed_pos = tok[:, None], last_pos[:, None]
            else:
                ids = torch.cat([ids, tok[:, None]], dim=1)
                pos = torch.cat([pos, last_pos[:, None]], dim=1)
                feed_ids, feed_pos = ids, pos
