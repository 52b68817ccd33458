"""The ``resets`` rollout strategy of RRPO and SRPO — "Credit Assignment with Resets in Language
Model Reasoning", arXiv 2605.25507 (METHODS.md §2; official code github.com/Ankur-Samanta/SRPO).

Per prompt and step, the :class:`~creditlab_resets.buffer.ResetBuffer` spends the budget of
``rollout.group_size`` trainable chains on a base group of fresh chains plus ``R`` reset groups of
``K`` continuations of failed chains (*seeds*), each continued from the thought the run's
:class:`~creditlab.ResetSelector` picks (``random`` = RRPO, ``self_localize`` = SRPO, ``oracle``).
Its settings sit in the ``rollout`` config section beside the core's sampling keys
(``conf/rollout/resets.yaml``). Metrics (``train/rollout/reset/*``): fallback rate, seeds and draws
per prompt, discarded and speculative chains, suffix success, the mean reset position and, on
tasks with a step oracle, how often the reset hits the first wrong thought (exact, early, late,
clean prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from creditlab import (
    ConfigError,
    Mean,
    PolicyHandle,
    Problem,
    RolloutConfig,
    RolloutStrategy,
    SampleFn,
    Sum,
    Trajectory,
)

from creditlab_resets.buffer import ResetBuffer, parse_split


class ResetsRolloutStrategy(RolloutStrategy):
    """``resets``: the reset buffer of RRPO/SRPO (see the module docstring)."""

    uses_reset_selector = True

    @dataclass
    class Config:
        """Attributes:
        split: ``"RxK"``: per prompt, R reset groups of K suffixes plus a base group of
            ``group_size - R*K`` fresh chains (``1x4`` is the paper's default; ``2x4``, ``1x8``).
        max_seed_draws: Fresh chains drawn per prompt while looking for seeds (failed chains).
        mask_prefix: Suffixes train only after their reset prefix; ``false`` is the ``no_mask``
            ablation (the prefix tokens get the suffix's advantage too).
        draw_ahead: A prompt still lacking seeds after the first draw round draws all its
            remaining draws at once (at most two draw rounds; unused chains are counted as
            ``reset/speculative``); ``false`` draws as many as it can place, round after round.
        """

        split: str = "1x4"
        max_seed_draws: int = 12
        mask_prefix: bool = True
        draw_ahead: bool = True

        def __post_init__(self) -> None:
            parse_split(self.split)
            if self.max_seed_draws < 1:
                raise ConfigError(f"rollout.max_seed_draws must be >= 1, got {self.max_seed_draws}")

    @classmethod
    def check(cls, config: Config, rollout: RolloutConfig) -> None:
        """The split must fit ``rollout.group_size``."""
        parse_split(config.split, rollout.group_size)

    def __init__(self, config: Config | None = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if self.reset_selector is None:
            raise ConfigError("rollout=resets needs a reset selector (reset_selector=random, "
                              "self_localize or oracle)")
        cfg, tok = self.config, self.tokenizer
        self.buffer = ResetBuffer(
            self.rollout.group_size, cfg.split, cfg.max_seed_draws, self.rollout.success_reward,
            cfg.mask_prefix, tok.encode(self.rollout.delimiter, add_special_tokens=False),
            tok.eos_token_id, cfg.draw_ahead,
        )
        self._counts: dict[str, float] = {}

    def collect(
        self, problems: Sequence[Problem], ctx: PolicyHandle, sample: SampleFn, seed: int
    ) -> list[Trajectory]:
        prompts = [ctx.encode(p.prompt) for p in problems]
        result = self.buffer.build(problems, prompts, sample, self.reset_selector, ctx, seed)
        for key, value in result.stats.items():
            self._counts[key] = self._counts.get(key, 0.0) + float(value)
        return result.trajectories

    def metrics(self) -> dict[str, float]:
        """The rates of METHODS.md §2 over the :meth:`collect` calls since the last call."""
        c, self._counts = self._counts, {}
        if not c:
            return {}
        prompts, seeds = max(c["prompts"], 1.0), max(c["seeds"], 1.0)
        out = {
            "reset/fallback_rate": Mean(c["fallback"] / prompts),
            "reset/seeds_per_prompt": Mean(c["seeds"] / prompts),
            "reset/draws_per_prompt": Mean(c["draws"] / prompts),
            "reset/discarded": Sum(c["discarded"]),
            "reset/speculative": Sum(c["speculative"]),
            "reset/suffix_success": Mean(c["suffix_correct"] / max(c["suffixes"], 1.0)),
            "reset/position": Mean(c["reset_thought"] / seeds),
            "reset/position_relative": Mean(c["reset_relative"] / seeds),
        }
        if c["oracle_known"] > 0:
            for key in ("oracle_exact", "oracle_early", "oracle_late", "clean_prefix"):
                out[f"reset/{key}"] = Mean(c[key] / c["oracle_known"])
        return out
