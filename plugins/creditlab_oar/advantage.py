"""OAR-P and OAR-G advantage estimators (Outcome-Grounded Advantage Reshaping).

Li et al., "Outcome-Grounded Advantage Reshaping for Fine-Grained Credit Assignment in
Mathematical Reasoning", arXiv 2601.07408; code fragment github.com/Valsure/
Outcome-Grounded-Advantage-Reshaping (``OAR-main.py``, no licence: read, not copied).

Both estimators compute ``A_{i,t} = A_i * w_{i,t}``: ``A_i`` is the GRPO group advantage
(:func:`creditlab.step.advantages.group_advantages`, knobs ``std``/``eps``/``zero_std_tol``), ``w`` the
bi-level weights of :func:`creditlab_oar.reshape.reshape_weights` over the trained reasoning tokens
of row i (answer tokens, EOS and rows with fewer than two such tokens keep weight 1); values are
exactly 0 where ``loss_mask`` is 0. Rows with ``A_i = 0`` are not probed (their advantages are 0
whatever the weights). The token importance ``I_t`` comes from the outcome probe of
:mod:`creditlab_oar.probe`:

* **OAR-P** (``oar_p``) [code: ``calculate_token_importance_perturbation``]: for every trained
  reasoning position t, the probe with token t replaced by ``mask_token_id`` (default: the pad id;
  attention stays on it, as in the code) is read out without grad, batched over rows and positions
  in chunks of ``chunk_size`` sequences; ``I_t = KL(P || P^(t))`` (``last``, ``answer_mean``) or
  ``phi - phi^(t)`` (``answer_joint``). [ours, the same numbers up to float rounding] Each
  perturbed probe is a branch of its clean probe: it runs from the replaced token on, against the
  clean probe's KV cache (``PolicyHandle.branch_read_logits`` / ``branch_logprobs``), and logits
  are computed at the read positions only; the code runs every perturbed sequence in full.
* **OAR-G** (``oar_g``) [code: ``calculate_token_importance_gradient``]: Gaussian noise
  ``eps ~ N(0, sigma^2)`` on the reasoning-token embeddings, ``J = KL(P0 || P_noisy)`` or
  ``phi0 - phi_noisy``, and ``I_t = |sum_d dJ/dE_{t,d}(E + eps) * E_{t,d}|`` (E clean, as the code).

  Exact, in one clean pass and one noisy pass per chunk of rows: the clean teacher ``P0``
  (mean logits, ``last``/``answer_mean`` rows only) is read without grad (``read_logits``), then ``PolicyHandle.input_gradients(..., embedding_offset=eps)`` runs the forward on ``E + eps``
  and one backward gives ``dJ/dE`` there (its objective gets the read positions' logits only,
  gathered once: ``read=``). ``answer_joint`` rows need no clean pass: ``phi0`` is a
  constant and ``J = -phi_noisy`` has the same gradient. [ours] ``sigma = 0`` (``answer_joint``
  only): no noise, the plain input gradient of ``-phi`` (one forward, one backward); rows that
  fell back to ``last`` get importance 0 (the gradient of ``KL(P0 || P)`` vanishes at
  ``P = P0``), hence weight 1, and are not sent to the policy.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from creditlab import (
    STD_OPTIONS,
    AdvantageEstimator,
    Advantages,
    ConfigError,
    Mean,
    PolicyHandle,
    RolloutBatch,
    Sum,
    broadcast,
    group_advantages,
)

from creditlab_oar.probe import (
    DIST_MODES,
    MODES,
    Probe,
    answer_logprob,
    build_probe,
    kl_from_logits,
    mean_read_logits,
    pad_right,
    per_probe,
    probe_divergence,
    read_mask,
    text_ids,
)
from creditlab_oar.reshape import NEGATIVE_OPTIONS, reshape_weights

#: Counters summed over ``estimate`` calls; ratios are formed in :func:`_summarize`.
_COUNTS = (
    "groups", "zero_std_groups", "singleton_groups", "rows", "abs_sum", "probed_rows",
    "reasoning_tokens", "high_tokens", "high_weight_sum", "low_weight_sum", "marker_missing",
    "answer_fallback", "probe_forwards", "probe_tokens", "probe_s",
)


@dataclass
class OARConfig:
    """Knobs shared by OAR-P and OAR-G.

    Attributes:
        mode: Probe read-out: ``last``, ``answer_mean`` or ``answer_joint``
            (:mod:`creditlab_oar.probe`).
        cue: Conclude-cue text appended after the reasoning.
        answer_marker: Text whose last occurrence in the decoded response starts the answer
            (matched on text, so a marker merged by BPE with a space or ``$`` is found;
            :func:`~creditlab_oar.probe.find_marker`).
        q: Tier-splitting quantile of the normalized scores, in [0, 1]. Paper value unknown (ours).
        beta: High-tier boost, >= 0. Paper value unknown (ours).
        w_floor: Lowest low-tier weight (the code's 0.1), in [0, 1].
        preserve_mass: Rescale reasoning weights to sum to L (the code's ``sum_to_L``).
        negative: Negative importance (``answer_joint``): ``signed`` (``sign(I) log(1+|I|)``,
            the code's order, ours) or ``clamp`` (to 0). See :mod:`creditlab_oar.reshape`.
        chunk_size: Sequences per probe forward (OAR-P) / rows per gradient call (OAR-G); 0 = all.
        std: GRPO group std: ``sample``, ``population`` or ``none``.
        eps: Added to the group std.
        zero_std_tol: Groups whose std is below this get advantage 0.
    """

    mode: str = "last"
    cue: str = "\\boxed{"
    answer_marker: str = "\\boxed{"
    q: float = 0.5
    beta: float = 1.0
    w_floor: float = 0.1
    preserve_mass: bool = True
    negative: str = "signed"
    chunk_size: int = 64
    std: str = "sample"
    eps: float = 1e-6
    zero_std_tol: float = 1e-8

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"advantage.{key} must be {what}; got {getattr(self, key)!r}.")

        need(self.mode in MODES, "mode", f"one of {', '.join(MODES)}")
        need(self.std in STD_OPTIONS, "std", f"one of {', '.join(STD_OPTIONS)}")
        need(isinstance(self.cue, str), "cue", "a string")
        need(isinstance(self.answer_marker, str), "answer_marker", "a string")
        need(0.0 <= self.q <= 1.0, "q", "in [0, 1]")
        need(self.beta >= 0.0, "beta", ">= 0")
        need(0.0 <= self.w_floor <= 1.0, "w_floor", "in [0, 1]")
        need(self.negative in NEGATIVE_OPTIONS, "negative", f"one of {', '.join(NEGATIVE_OPTIONS)}")
        need(isinstance(self.chunk_size, int) and self.chunk_size >= 0, "chunk_size", "an int >= 0")
        need(self.eps >= 0, "eps", ">= 0")
        need(self.zero_std_tol >= 0, "zero_std_tol", ">= 0")


def _summarize(c: dict[str, float]) -> dict[str, float]:
    """Metrics from summed counters (ratios of sums, 0 when a denominator is 0)."""

    def ratio(a: float, b: float) -> float:
        return a / b if b else 0.0

    low_tokens = c["reasoning_tokens"] - c["high_tokens"]
    out: dict[str, float] = {
        k: Sum(c[k]) for k in ("groups", "zero_std_groups", "singleton_groups", "probed_rows",
                               "reasoning_tokens", "marker_missing", "answer_fallback",
                               "probe_forwards", "probe_tokens", "probe_s")
    }
    out.update(
        abs_mean=Mean(ratio(c["abs_sum"], c["rows"])),
        high_tier_frac=Mean(ratio(c["high_tokens"], c["reasoning_tokens"])),
        high_tier_weight_mean=Mean(ratio(c["high_weight_sum"], c["high_tokens"])),
        low_tier_weight_mean=Mean(ratio(c["low_weight_sum"], low_tokens)),
    )
    return out


class _OARAdvantage(AdvantageEstimator):
    """Shared OAR machinery: group advantages, probes, reshaping, metrics."""

    Config = OARConfig

    def __init__(self, config: OARConfig | None = None) -> None:
        super().__init__(config)
        self._call = dict.fromkeys(_COUNTS, 0.0)

    # -- the estimator ------------------------------------------------------------------------
    def estimate(self, batch: RolloutBatch, ctx: PolicyHandle) -> Advantages:
        """Reshaped advantages of ``batch``.

        Args:
            batch: Uses ``rewards``/``group_ids`` (B,), ``loss_mask``/``response_*`` (B, T),
                ``input_ids``/``attention_mask`` (B, P+T) and each trajectory's finish reason.
            ctx: The current policy (probe forwards / input gradients, ``tokenizer``, ``rng``).

        Returns:
            ``Advantages`` with values (B, T) (dtype of ``loss_mask``): ``A_i * w_{i,t}`` on trained
            tokens, exactly 0 where ``loss_mask`` is 0. Metrics of this batch: group counts,
            ``abs_mean`` (mean |A_i|), ``probed_rows``, ``reasoning_tokens`` (tokens reshaped),
            ``high_tier_frac``, ``high_tier_weight_mean``/``low_tier_weight_mean`` (mean weight per
            tier, after mass preservation), ``marker_missing`` (probed rows without the answer
            marker), ``answer_fallback`` (rows read in ``last`` mode instead of an answer mode),
            ``probe_forwards``/``probe_tokens`` (sequences and real tokens sent to the policy for
            probing) and ``probe_s`` (seconds).
        """
        batch = batch.to("cpu")  # per-row bookkeeping runs on the host: one copy (advantages go back once)
        cfg = self.config
        self._call = dict.fromkeys(_COUNTS, 0.0)
        adv, gm = group_advantages(
            batch.rewards, batch.group_ids, cfg.std, cfg.eps, cfg.zero_std_tol
        )
        dtype = batch.loss_mask.dtype if batch.loss_mask.is_floating_point() else adv.dtype
        rows = [i for i in range(batch.size) if adv[i] != 0]
        importance, reasoning = self.importance(batch, ctx, rows)
        weights, high = reshape_weights(
            importance, reasoning, cfg.q, cfg.beta, cfg.w_floor, cfg.preserve_mass, cfg.negative
        )
        values = broadcast(adv.to(dtype), batch.loss_mask) * weights.to(dtype)

        for key in ("groups", "zero_std_groups", "singleton_groups"):
            self._add(key, gm[key])
        self._add("rows", batch.size)
        self._add("abs_sum", float(adv.abs().sum()))
        self._add("reasoning_tokens", float(reasoning.sum()))
        self._add("high_tokens", float(high.sum()))
        self._add("high_weight_sum", float(weights[high].sum()))
        self._add("low_weight_sum", float(weights[reasoning & ~high].sum()))
        return Advantages(values=values, metrics=self.call_metrics())

    def call_metrics(self) -> dict[str, float]:
        """The metrics of the counts since the last :meth:`estimate` began (its own, or those of
        :meth:`importance` calls made since)."""
        return _summarize(self._call)

    def _add(self, key: str, value: float) -> None:
        """Count into this call's metrics."""
        self._call[key] += value

    def importance(
        self, batch: RolloutBatch, ctx: PolicyHandle, rows: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw token importance of the trained reasoning tokens.

        Args:
            batch: The rollout batch.
            ctx: The current policy.
            rows: Rows to probe (default: all).

        Returns:
            ``(importance, reasoning)``, both (B, T): ``importance`` float32 ``I_t`` (0 elsewhere);
            ``reasoning`` bool, the trained reasoning tokens of probed rows with at least two of
            them (the tokens the weights are computed over).
        """
        cfg = self.config
        t0 = time.perf_counter()
        tok = ctx.tokenizer
        eos_id = getattr(tok, "eos_token_id", None) if tok is not None else None
        marker, cue = text_ids(cfg.answer_marker, ctx), text_ids(cfg.cue, ctx)
        rows = range(batch.size) if rows is None else rows
        probes = [build_probe(batch, r, marker, cue, cfg.mode, eos_id, cfg.answer_marker, tok,
                              cue_is_marker=cfg.cue == cfg.answer_marker) for r in rows]
        probes = [p for p in probes if p.scored.numel() >= 2]
        importance = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device="cpu")
        reasoning = torch.zeros(batch.loss_mask.shape, dtype=torch.bool, device="cpu")
        if probes:
            for p, scores in zip(probes, self._scores(probes, ctx)):
                importance[p.row, p.scored] = scores.float()
                reasoning[p.row, p.scored] = True
        self._add("probed_rows", len(probes))
        self._add("marker_missing", sum(not p.marker_found for p in probes))
        self._add("answer_fallback", sum(p.fallback for p in probes))
        self._add("probe_s", time.perf_counter() - t0)
        return importance, reasoning

    @abc.abstractmethod
    def _scores(self, probes: Sequence[Probe], ctx: PolicyHandle) -> list[torch.Tensor]:
        """One (L,) float tensor of importance per probe, over ``probe.scored``."""

    @staticmethod
    def _pad_id(ctx: PolicyHandle) -> int:
        tok = ctx.tokenizer
        pad = getattr(tok, "pad_token_id", None) if tok is not None else None
        return int(pad) if pad is not None else 0


#: OAR-P's perturbed probes per block, in forwards of ``chunk_size``: blocks of one chunk ran
#: credit-bench's OAR-P on SmolLM2 27% slower (128 against 101 s; the branches of one probe pad to
#: its longest), all probes in one block peaked at 8.2 GiB.
BLOCK_CHUNKS = 8


class OARPAdvantage(_OARAdvantage):
    """OAR-P: token importance by counterfactual replacement (no grad, batched and chunked)."""

    @dataclass
    class Config(OARConfig):
        """Attributes: as :class:`OARConfig`, plus
        mask_token_id: Token that replaces a reasoning token (``None`` = the tokenizer's pad id,
            0 without tokenizer).
        """

        mask_token_id: int | None = None

        def __post_init__(self) -> None:
            super().__post_init__()
            if self.mask_token_id is not None and self.mask_token_id < 0:
                raise ConfigError(
                    f"advantage.mask_token_id must be >= 0; got {self.mask_token_id!r}."
                )

    def _scores(self, probes: Sequence[Probe], ctx: PolicyHandle) -> list[torch.Tensor]:
        """The clean read-outs in chunks of probes, then every perturbed probe as a branch of its
        clean probe: it continues the clean KV cache from the replaced token (blocks of whole
        probes, ``chunk_size`` branches a call; a block's trunks are the clean probes of its rows)."""
        cfg = self.config
        pad = self._pad_id(ctx)
        mask_id = pad if cfg.mask_token_id is None else int(cfg.mask_token_id)
        scores = [torch.zeros(p.scored.numel(), dtype=torch.float64, device="cpu") for p in probes]
        for dist in (True, False):
            mine = [i for i, p in enumerate(probes) if (p.mode in DIST_MODES) == dist]
            step = cfg.chunk_size or max(len(mine), 1)
            clean: dict[int, torch.Tensor] = {}
            for s in range(0, len(mine), step):
                part = mine[s : s + step]
                ids, att = pad_right([probes[i].ids for i in part], pad)
                self._add("probe_forwards", len(part))
                self._add("probe_tokens", float(att.sum()))
                if dist:
                    vals = mean_read_logits(ctx, ids, att, [probes[i] for i in part])
                else:
                    vals = answer_logprob(ctx, ids, att, [probes[i].cue_end for i in part],
                                          [probes[i].answer_len for i in part])
                clean.update(zip(part, vals))
            # blocks of whole probes, BLOCK_CHUNKS x chunk_size perturbed probes at most (more only
            # when one probe has more): each clean probe runs once as a trunk, a block's read logits
            # and KL temporaries, (branches, V) float64, stay bounded, and the handle still sorts
            # many probes' branches by length into its forwards (one probe's run from 1 to N tokens)
            blocks: list[list[tuple[int, int]]] = []
            for i in mine:
                n = probes[i].scored.numel()
                if not n:
                    continue
                if not blocks or len(blocks[-1]) + n > BLOCK_CHUNKS * step:
                    blocks.append([])
                blocks[-1].extend((i, k) for k in range(n))
            for jobs in blocks:
                vals = self._perturbed(jobs, probes, ctx, mask_id, pad, dist)
                base = torch.stack([clean[i] for i, _ in jobs])
                delta = kl_from_logits(base, vals) if dist else base - vals
                for (i, k), d in zip(jobs, delta):
                    scores[i][k] = d
        return scores

    def _perturbed(
        self, jobs: Sequence[tuple[int, int]], probes: Sequence[Probe], ctx: PolicyHandle,
        mask_id: int, pad: int, dist: bool,
    ) -> torch.Tensor:
        """Read-outs of the probes ``(i, k)`` (probe ``i`` with scored token ``k`` replaced by
        ``mask_id``): (J, V) mean logits (``dist``) or (J,) ``phi``, float64. One call: the clean
        probes run once as trunks, the branches ``chunk_size`` at a time (the handle sorts them by
        length, so a forward runs little padding)."""
        trunks = list(dict.fromkeys(i for i, _ in jobs))  # the jobs' clean probes, in order
        local = {i: j for j, i in enumerate(trunks)}
        trunk_ids, trunk_att = pad_right([probes[i].ids for i in trunks], pad)
        at = [probes[i].reasoning_start + int(probes[i].scored[k]) for i, k in jobs]
        mask = torch.tensor([mask_id], dtype=torch.long, device="cpu")
        branch_ids, branch_att = pad_right(
            [torch.cat([mask, probes[i].ids[a + 1 :].cpu()]) for (i, _), a in zip(jobs, at)], pad)
        rows = torch.tensor([local[i] for i, _ in jobs], device="cpu")
        at_t = torch.tensor(at, device="cpu")
        self._add("probe_forwards", len(jobs))
        self._add("probe_tokens", float(trunk_att.sum() + branch_att.sum()))
        if dist:
            read = torch.zeros(branch_ids.shape, dtype=torch.bool, device="cpu")
            for j, ((i, _), a) in enumerate(zip(jobs, at)):
                read[j, [r - a for r in probes[i].read_positions]] = True
            logits = ctx.branch_read_logits(trunk_ids, trunk_att, rows, at_t, branch_ids, branch_att, read,
                                            chunk=self.config.chunk_size)
            return torch.stack([z.double().mean(0) for z in
                                per_probe(logits, [probes[i] for i, _ in jobs])]).cpu()
        lp = ctx.branch_logprobs(trunk_ids, trunk_att, rows, at_t, branch_ids, branch_att,
                                 chunk=self.config.chunk_size).double().cpu()
        out = []
        for j, ((i, _), a) in enumerate(zip(jobs, at)):
            p = probes[i]
            out.append(lp[j, p.cue_end - a : p.cue_end - a + p.answer_len].sum() / max(p.answer_len, 1))
        return torch.stack(out)


def reasoning_noise(
    probes: Sequence[Probe], embeddings: torch.Tensor, sigma: float, generator: torch.Generator
) -> torch.Tensor:
    """OAR-G's noise: N(0, sigma^2) on each probe's reasoning-token embeddings, 0 elsewhere.

    Drawn in float64 on the CPU generator, row by row in probe order (so the draws do not depend on
    padding, chunking, device or model dtype), then cast to the embeddings' dtype and device.

    Args:
        probes: N probes, row j of ``embeddings`` from ``probes[j].ids``.
        embeddings: (N, L, D).

    Returns:
        (N, L, D).
    """
    noise = torch.zeros_like(embeddings)
    d = embeddings.shape[-1]
    for j, p in enumerate(probes):
        draw = torch.randn((p.n_reasoning, d), generator=generator, dtype=torch.float64) * sigma
        noise[j, p.reasoning_start : p.reasoning_start + p.n_reasoning] = draw.to(noise)
    return noise


def grad_chunks(probes: Sequence[Probe], rows: int, ctx: PolicyHandle) -> list[list[Probe]]:
    """``probes`` cut into consecutive runs, one gradient call each: ``rows`` at a time, or with
    ``rows = 0`` as many as keep within the handle's ``micro_batch_size`` rows and
    ``micro_batch_tokens`` padded tokens (run length x its longest sequence; a longer sequence
    goes alone). The order is kept, so the noise draws in the same order however they are cut."""
    if rows:
        return [list(probes[s : s + rows]) for s in range(0, len(probes), rows)]
    max_rows, max_tokens = int(ctx.micro_batch_size), int(ctx.micro_batch_tokens)
    out: list[list[Probe]] = []
    width = 0
    for p in probes:
        wider = max(width, len(p.ids))
        if out and (0 < max_rows <= len(out[-1]) or 0 < max_tokens < (len(out[-1]) + 1) * wider):
            out.append([])
            wider = len(p.ids)
        if not out:
            out.append([])
        out[-1].append(p)
        width = wider
    return out


class OARGAdvantage(_OARAdvantage):
    """OAR-G: token importance by input gradient x input at noise-perturbed embeddings."""

    @dataclass
    class Config(OARConfig):
        """Attributes: as :class:`OARConfig` (``mode`` defaults to ``answer_mean``, the code's
        default for this variant; ``chunk_size`` = rows per gradient call, 0 = as many
        consecutive rows as the handle's ``micro_batch_size`` and ``micro_batch_tokens`` allow,
        like the update's micro-batches, all of them when it sets neither), plus
        sigma: Std of the Gaussian embedding noise (the code's 1e-3); must be > 0 in the KL modes;
            0 in ``answer_joint`` = the plain input gradient (fallback rows keep weight 1).
        """

        mode: str = "answer_mean"
        chunk_size: int = 0
        sigma: float = 1e-3

        def __post_init__(self) -> None:
            super().__post_init__()
            if not self.sigma >= 0 or (self.mode in DIST_MODES and self.sigma == 0):
                raise ConfigError(
                    f"advantage.sigma must be > 0 (>= 0 for mode answer_joint); got {self.sigma!r}."
                )

    def _scores(self, probes: Sequence[Probe], ctx: PolicyHandle) -> list[torch.Tensor]:
        cfg = self.config
        pad = self._pad_id(ctx)
        out: list[torch.Tensor] = []
        for chunk in grad_chunks(probes, cfg.chunk_size, ctx):
            scores = [torch.zeros(p.scored.numel(), dtype=torch.float64, device="cpu") for p in chunk]
            # sigma = 0 (answer_joint only): fallback (KL) rows have zero gradient; skip them.
            live = [j for j, p in enumerate(chunk) if cfg.sigma > 0 or p.mode not in DIST_MODES]
            sub = [chunk[j] for j in live]
            if not sub:
                out.extend(scores)
                continue
            ids, att = pad_right([p.ids for p in sub], pad)
            teachers: list[torch.Tensor | None] = [None] * len(sub)
            noise = None
            if cfg.sigma > 0:
                dist = [j for j, p in enumerate(sub) if p.mode in DIST_MODES]
                if dist:  # the clean teachers: no grad, logits at the read positions only
                    rows = torch.tensor(dist, device="cpu")  # the noisy pass's padding
                    self._add("probe_forwards", len(dist))
                    self._add("probe_tokens", float(att[rows].sum()))
                    clean = mean_read_logits(ctx, ids[rows], att[rows], [sub[j] for j in dist])
                    for j, z in zip(dist, clean):
                        teachers[j] = z
                template = self._embedding_template(ids, att, ctx)
                shape = (*ids.shape, template.shape[-1])
                noise = reasoning_noise(sub, template.new_zeros(shape), cfg.sigma, ctx.rng)

            def objective(emb: torch.Tensor, logits: torch.Tensor, sub=sub, teachers=teachers):
                return probe_divergence(logits, sub, teachers).sum()  # at E + eps, (K, V) read logits

            self._add("probe_forwards", len(sub))
            self._add("probe_tokens", float(att.sum()))
            # the prompts carry no noise and no read-out: the handle may run each once, no grad
            emb, grad = ctx.input_gradients(ids, att, objective, embedding_offset=noise,
                                            read=read_mask(sub, ids.shape[1]),
                                            frozen=min(p.reasoning_start for p in sub))
            saliency = (grad.double() * emb.double()).sum(-1).abs().cpu()  # (N, L), E clean
            for k, (j, p) in enumerate(zip(live, sub)):
                scores[j] = saliency[k, p.reasoning_start + p.scored]
            out.extend(scores)
        return out

    def _embedding_template(
        self, ids: torch.Tensor, att: torch.Tensor, ctx: PolicyHandle
    ) -> torch.Tensor:
        """(1, 1, D) embeddings of one token: the width, dtype and device the noise needs; one
        one-token pass on the estimator's first call, kept for the later ones."""
        if getattr(self, "_template", None) is None:
            self._add("probe_forwards", 1)
            self._add("probe_tokens", 1.0)
            self._template, _ = ctx.input_gradients(
                ids[:1, :1], att[:1, :1], lambda e, _logits: (e * 0).sum(), read=att[:1, :1] > 0)
        return self._template
