"""Policy-gradient losses: per-token losses, KL estimators and the full policy loss.

Everything here is a pure function of tensors. Shapes: ``B`` sequences (``b`` in one micro-batch),
``T`` response positions, ``V`` vocabulary entries. A position is *trained* when its
``loss_mask > 0``; the mask value is used as a weight (``ℓ·M``), so 0/1 masks give the usual sums.

Aggregation over a mini-batch, with denominators that make the loss invariant to micro-batching,
gradient accumulation and data parallel, is in :mod:`creditlab.step.aggregation`.

**Garbage safety.** Values at untrained positions (old/ref log-probs, advantages, padding columns)
never reach the loss or the gradient: they are replaced by 0 with ``torch.where`` *before* any
``exp``, so even ``inf``/``NaN`` there is harmless. The policy log-probs themselves must be finite
(they come from the model's logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from creditlab.errors import ConfigError
from creditlab.step.aggregation import AGG_MODES, MiniBatchStats, aggregate

MODES = ("reinforce", "clip")
KL_ESTIMATORS = ("k1", "k2", "k3")
#: The log-ratio is clamped to ±this before ``exp`` in the clipped surrogate (as verl does), so an
#: extreme mismatch cannot overflow to ``inf``. It changes nothing for |log ρ| <= 20.
LOG_RATIO_CLAMP = 20.0
#: How each metric of :func:`policy_loss` combines over micro-batches, mini-batches and ranks:
#: ``sum`` (an additive share of the mini-batch value) or ``max``.
LOSS_METRICS = {
    "loss": "sum", "pg_loss": "sum", "clip_frac": "sum", "dual_clip_frac": "sum",
    "ratio_mean": "sum", "ratio_max": "max", "kl": "sum",
    "backend/logprob_abs_diff_mean": "sum", "backend/logprob_abs_diff_max": "max",
    "backend/logprob_kl": "sum", "backend/tis_weight_mean": "sum", "backend/tis_clip_frac": "sum",
}
#: The metrics of :data:`LOSS_METRICS` that are exactly zero on a row whose advantages are all
#: zero (without a KL term): the only ones that stay over every row when such rows are skipped.
ZERO_WITHOUT_ADVANTAGE = frozenset({"loss", "pg_loss"})


@dataclass
class LossConfig:
    """Policy-loss settings.

    Attributes:
        mode: ``"reinforce"`` (``-A·log π``) or ``"clip"`` (PPO clipped surrogate).
        agg: Aggregation mode, one of :data:`AGG_MODES` (see the module docstring).
        clip_eps_low: ε_low; the ratio is clipped below at ``1 - clip_eps_low``. In [0, 1).
        clip_eps_high: ε_high; the ratio is clipped above at ``1 + clip_eps_high``. >= 0.
        dual_clip: Dual-clip constant c > 1 for tokens with A < 0 (loss capped at ``-c·A``),
            or ``None``.
        kl_coef: β, weight of the KL-to-reference penalty added to every token's loss. >= 0.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (see :func:`kl_penalty`).
        norm_constant: ``T_max`` for ``seq-mean-token-sum-norm`` (required and > 0 then).
        updates_per_batch: Optimizer updates (mini-batches) per rollout batch. >= 1.
        micro_batch_size: Sequences per forward/backward; 0 = the whole mini-batch.
        micro_batch_tokens: Padded tokens per forward/backward at most (rows x their longest
            prompt + longest response); 0 = no token budget. With one, the rows are sorted by
            length and packed (:mod:`creditlab.step.packing`). Every micro-batch is cut to its
            own longest prompt and response either way. ``auto`` (the default): the run sets it
            at start from the memory plan and the memory the machine or device has
            (:func:`creditlab.run.memory.auto_token_budget`: 0 when the whole mini-batch fits);
            unresolved (a module built without the runner), it means 0 (:attr:`token_budget`).
        tis_cap: Truncated importance sampling (TESTING trap 4): multiply each token's
            policy-gradient loss by ``min(π_old / π_engine, tis_cap)`` (detached), where π_engine
            is the generation backend's probability of the sampled token and π_old the
            trainer's before the update; corrects for the engine sampling from a slightly
            different distribution than the trainer scores (e.g. vLLM in bf16). ``None`` = off;
            else >= 1 (e.g. 2.0).
        fused_head: How log-probs and entropies are computed from the model's last hidden
            states (:mod:`creditlab.step.token_logprobs`): ``auto`` (the fused, tiled LM head
            for a supported model with a vocabulary of >= 1,024 tokens: no (rows, tokens, V)
            logits), ``on`` (fused for any supported model), ``off`` (always the full logits).
        skip_zero_advantage: Run no forward or backward for rows with no non-zero advantage on
            a trained token (a GRPO group whose rewards are all equal): without a KL term their
            gradient is exactly zero, and the denominators still count their tokens, so the
            update equals the full one up to float rounding. ``loss`` and ``pg_loss`` stay exact;
            the other per-token metrics (entropy, ratios, clip fractions, engine mismatch) become
            means over the rows run (absent at a step where none ran), and ``train/skipped_rows``
            logs the share skipped. Needs ``kl_coef == 0``.
    """

    mode: str = "clip"
    agg: str = "seq-mean-token-mean"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    norm_constant: float | None = None
    updates_per_batch: int = 1
    micro_batch_size: int = 0
    micro_batch_tokens: int | str = "auto"
    tis_cap: float | None = None
    fused_head: str = "auto"
    skip_zero_advantage: bool = False

    def __post_init__(self) -> None:
        def bad(name: str, want: str) -> ConfigError:
            return ConfigError(f"LossConfig.{name} must be {want}; got {getattr(self, name)!r}.")

        if self.mode not in MODES:
            raise bad("mode", f"one of {', '.join(MODES)}")
        if self.agg not in AGG_MODES:
            raise bad("agg", f"one of {', '.join(AGG_MODES)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise bad("kl_estimator", f"one of {', '.join(KL_ESTIMATORS)}")
        if not 0.0 <= self.clip_eps_low < 1.0:
            raise bad("clip_eps_low", "in [0, 1)")
        if not self.clip_eps_high >= 0.0:
            raise bad("clip_eps_high", ">= 0")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise bad("dual_clip", "null or a number > 1")
        if not self.kl_coef >= 0.0:
            raise bad("kl_coef", ">= 0")
        if not isinstance(self.skip_zero_advantage, bool):
            raise bad("skip_zero_advantage", "true or false")
        if self.skip_zero_advantage and self.kl_coef > 0:
            raise ConfigError(f"LossConfig.skip_zero_advantage needs kl_coef == 0 (the KL term trains every "
                              f"row); got kl_coef={self.kl_coef!r}: set loss.kl_coef=0 or "
                              f"loss.skip_zero_advantage=false.")
        if self.agg == "seq-mean-token-sum-norm":
            if self.norm_constant is None or not self.norm_constant > 0:
                raise bad("norm_constant", "a number > 0 (T_max) when agg is "
                          "'seq-mean-token-sum-norm'")
        elif self.norm_constant is not None and not self.norm_constant > 0:
            raise bad("norm_constant", "null or a number > 0")
        if isinstance(self.updates_per_batch, bool) or not (
            isinstance(self.updates_per_batch, int) and self.updates_per_batch >= 1
        ):
            raise bad("updates_per_batch", "an integer >= 1")
        if isinstance(self.micro_batch_size, bool) or not (
            isinstance(self.micro_batch_size, int) and self.micro_batch_size >= 0
        ):
            raise bad("micro_batch_size", "an integer >= 0 (0 = whole mini-batch)")
        if self.micro_batch_tokens != "auto" and (isinstance(self.micro_batch_tokens, bool) or not (
            isinstance(self.micro_batch_tokens, int) and self.micro_batch_tokens >= 0
        )):
            raise bad("micro_batch_tokens", "auto (sized from the memory plan) or an integer >= 0 "
                      "(0 = no token budget), e.g. 8192")
        if self.tis_cap is not None and not self.tis_cap >= 1.0:
            raise bad("tis_cap", "null (off) or a number >= 1, e.g. 2.0")
        if isinstance(self.fused_head, bool):  # YAML's true/false
            self.fused_head = "on" if self.fused_head else "off"
        if self.fused_head not in ("auto", "on", "off"):
            raise bad("fused_head", "one of auto, on, off")

    @property
    def token_budget(self) -> int:
        """``micro_batch_tokens`` as the update packs by it: an unresolved ``auto`` is 0 (no budget)."""
        return 0 if self.micro_batch_tokens == "auto" else int(self.micro_batch_tokens)


# ---------------------------------------------------------------------------------------------
# Log-probabilities, entropy, KL
# ---------------------------------------------------------------------------------------------
def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}.")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def gather_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probabilities of ``ids`` under ``softmax(logits / temperature)``.

    Computed as ``logit[id]/τ - logsumexp(logits/τ)`` without materializing the full log-softmax.
    Half-precision logits are upcast to float32.

    Args:
        logits: (B, T, V).
        ids: (B, T) long, each in [0, V) (pad ids included).
        temperature: τ > 0, the sampling temperature.

    Returns:
        (B, T) float log-probs.
    """
    z = _scaled(logits, temperature)
    picked = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` at every position.

    Args:
        logits: (B, T, V).
        temperature: τ > 0.

    Returns:
        (B, T) float entropies ``logsumexp(z) - Σ_v softmax(z)_v z_v`` with ``z = logits/τ``.
    """
    z = _scaled(logits, temperature)
    p = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (p * z).sum(-1)


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token estimator of KL(π_θ ‖ π_ref) from samples of π (Schulman's k1/k2/k3).

    With ``d = log π - log π_ref``: k1 = ``d``; k2 = ``d²/2``; k3 = ``exp(-d) + d - 1`` (>= 0,
    computed as ``expm1(-d) + d``). k1 and k3 are unbiased for KL(π‖π_ref) in value. As losses
    (per-sample gradient, sample held fixed) their expected gradients differ: k1 → 0,
    k2 → ∇KL(π‖π_ref), k3 → ∇KL(π_ref‖π); ``tests/unit/test_losses.py`` checks all three.

    Args:
        logprobs: (B, T) log π_θ of the sampled tokens (with grad).
        ref_logprobs: (B, T) log π_ref of the same tokens.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        (B, T) per-token KL estimates.
    """
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.expm1(-d) + d
    raise ValueError(f"kl estimator must be one of {', '.join(KL_ESTIMATORS)}; got {estimator!r}.")


# ---------------------------------------------------------------------------------------------
# Per-token loss
# ---------------------------------------------------------------------------------------------
def _token_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss, ratio, clipped by the trust region, clipped by dual-clip; all (B, T)."""
    ratio = torch.exp((logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    no = torch.zeros_like(logprobs, dtype=torch.bool)
    if cfg.mode == "reinforce":
        return -advantages * logprobs, ratio, no, no
    surr = ratio * advantages
    surr_clipped = ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * advantages
    objective = torch.minimum(surr, surr_clipped)
    clipped = surr_clipped < surr
    dual = no
    if cfg.dual_clip is not None:
        # For A < 0 the objective is bounded below by c·A, i.e. the loss is at most -c·A = c|A|.
        floor = cfg.dual_clip * advantages
        dual = (advantages < 0) & (floor > objective)
        objective = torch.where(dual, floor, objective)
    return -objective, ratio, clipped, dual


def token_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token policy-gradient loss (no KL, no masking).

    * ``reinforce``: ``ℓ = -A · log π``.
    * ``clip``: ``ℓ = -min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A)``, ``ρ = exp(log π - log π_old)``;
      with dual-clip c and A < 0: ``ℓ = min(that, -c·A)`` (objective ``max(min(...), c·A)``).

    Args:
        logprobs: (B, T) log π_θ (with grad).
        old_logprobs: (B, T) log π_old (no grad).
        advantages: (B, T).
        cfg: Loss settings.

    Returns:
        ``(loss, clipped)``: (B, T) loss and (B, T) bool, True where a clip (trust region or
        dual) is active, i.e. where the token's gradient is zeroed by clipping.
    """
    loss, _, clipped, dual = _token_loss(logprobs, old_logprobs, advantages, cfg)
    return loss, clipped | dual


# ---------------------------------------------------------------------------------------------
# Full policy loss
# ---------------------------------------------------------------------------------------------
def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: LossConfig,
    stats: MiniBatchStats,
    ref_logprobs: torch.Tensor | None = None,
    engine_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token loss (times the TIS weight when ``cfg.tis_cap`` is set) + ``kl_coef``·KL,
    aggregated into this micro-batch's contribution.

    Args:
        logprobs: (b, T) log π_θ of the response tokens (with grad).
        old_logprobs: (b, T) log π_old, or ``None`` for ``logprobs.detach()`` (one update per
            batch: the ratio is then exactly 1).
        advantages: (b, T).
        loss_mask: (b, T).
        cfg: Loss settings.
        stats: Whole-mini-batch denominators (:class:`MiniBatchStats`).
        ref_logprobs: (b, T) log π_ref; required when ``cfg.kl_coef > 0``. When given with
            ``kl_coef == 0`` the KL is only measured.
        engine_logprobs: (b, T) log-probs of the response tokens under the generation backend
            (``RolloutBatch.gen_logprobs``); required when ``cfg.tis_cap`` is set. When given,
            the mismatch between engine and trainer (``old_logprobs``) is measured.

    Returns:
        ``(loss, metrics)``. ``loss`` is the contribution (see :func:`aggregate`). Metrics are
        detached scalars, each this micro-batch's *additive share* of the mini-batch value (token
        means over ``stats.num_tokens``, not multiplied by ``world_size``): sum them over all
        micro-batches and all ranks, except the maxima (:data:`LOSS_METRICS`). Keys: ``loss``
        (the loss at the configured aggregation), ``pg_loss`` (without KL, token mean),
        ``clip_frac`` (trust-region clipped tokens), ``dual_clip_frac``, ``ratio_mean``,
        ``ratio_max``, and ``kl`` (token-mean KL estimate) when ``ref_logprobs`` is given. With
        ``engine_logprobs`` (``d = log π_engine - log π_old`` per trained token):
        ``backend/logprob_abs_diff_mean`` (token mean of ``|d|``), ``backend/logprob_abs_diff_max``
        (combines by max), ``backend/logprob_kl`` (token mean of the k3
        estimate of KL(π_engine ‖ π_old), the tokens being samples of the engine); with
        ``tis_cap`` also ``backend/tis_weight_mean`` and ``backend/tis_clip_frac`` (tokens whose
        weight was capped).
    """
    if old_logprobs is None:
        old_logprobs = logprobs.detach()
    if cfg.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("LossConfig.kl_coef > 0 needs ref_logprobs.")
    if cfg.tis_cap is not None and engine_logprobs is None:
        raise ValueError("LossConfig.tis_cap needs engine_logprobs (the backend's log-probs).")
    trained = loss_mask > 0

    def safe(x: torch.Tensor) -> torch.Tensor:
        return torch.where(trained, x, torch.zeros_like(x))

    lp, old, adv = safe(logprobs), safe(old_logprobs.detach()), safe(advantages.detach())
    pg, ratio, clipped, dual = _token_loss(lp, old, adv, cfg)
    eng = safe(engine_logprobs.detach()) if engine_logprobs is not None else None
    tis = None
    if eng is not None and cfg.tis_cap is not None:
        raw = torch.exp((old - eng).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        tis = (raw.clamp(max=cfg.tis_cap), raw > cfg.tis_cap)
        pg = pg * tis[0]
    per_token = pg
    kl = None
    if ref_logprobs is not None:
        kl = kl_penalty(lp, safe(ref_logprobs.detach()), cfg.kl_estimator)
        if cfg.kl_coef > 0:
            per_token = pg + cfg.kl_coef * kl
    loss = aggregate(per_token, loss_mask, cfg, stats)

    with torch.no_grad():
        weight = torch.where(trained, loss_mask, torch.zeros_like(loss_mask)).to(lp.dtype)
        n_tok = float(stats.num_tokens) if stats.num_tokens > 0 else 1.0

        def share(x: torch.Tensor) -> torch.Tensor:
            x = torch.where(trained, x.to(lp.dtype), torch.zeros_like(lp))
            return (x * weight).sum().detach() / n_tok

        metrics = {
            "loss": loss.detach() / stats.world_size,
            "pg_loss": share(pg),
            "clip_frac": share(clipped),
            "dual_clip_frac": share(dual),
            "ratio_mean": share(ratio),
            "ratio_max": torch.where(trained, ratio, torch.zeros_like(ratio)).max().detach()
            if ratio.numel()
            else ratio.new_zeros(()),
        }
        if kl is not None:
            metrics["kl"] = share(kl)
        if eng is not None:
            diff = (eng - old).abs()
            metrics["backend/logprob_abs_diff_mean"] = share(diff)
            metrics["backend/logprob_abs_diff_max"] = (
                torch.where(trained, diff, torch.zeros_like(diff)).max()
                if diff.numel() else diff.new_zeros(())
            )
            metrics["backend/logprob_kl"] = share(kl_penalty(eng, old, "k3"))
        if tis is not None:
            metrics["backend/tis_weight_mean"] = share(tis[0])
            metrics["backend/tis_clip_frac"] = share(tis[1])
    return loss, metrics
