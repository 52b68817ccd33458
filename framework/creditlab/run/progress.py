"""What a run prints while it trains: one progress bar counting RL steps, and nothing twice.

Lightning's own bar counts epochs and batches (``Epoch 0/-2``, since a run is bounded by steps,
not epochs) and shows ``v_num``; :class:`StepProgressBar` shows ``RL step 37/60`` with the
training reward and the latest held-out accuracy, and picks up at the resumed step.
:func:`quiet_library_output` drops what libraries print that says nothing about the run.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any

from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import BatchesProcessedColumn, CustomBarColumn, CustomTimeColumn
from rich.progress import TextColumn

#: Lines of other libraries that are adverts or warnings about their own internals.
_DROPPED_LOG_LINES = re.compile(r"Tip: For seamless cloud logging|litlogger|litmodels")


class StepProgressBar(RichProgressBar):
    """A rich progress bar over the run's ``total`` RL steps (``module.rl_step`` done so far;
    Lightning's batch counter restarts on a resume and counts optimizer updates)."""

    def __init__(self, total: int) -> None:
        super().__init__(leave=True)
        self.total = total

    def _get_train_description(self, current_epoch: int) -> str:
        return "RL step"

    def configure_columns(self, trainer: Any) -> list:
        theme = self.theme
        return [
            TextColumn("[progress.description]{task.description}"),
            CustomBarColumn(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                            pulse_style=theme.progress_bar_pulse),
            BatchesProcessedColumn(style=theme.batch_progress),
            CustomTimeColumn(style=theme.time),
        ]

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._show(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._show(pl_module)

    def _show(self, pl_module: Any) -> None:
        if self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.update(self.train_progress_bar_id, total=self.total, completed=pl_module.rl_step)
            self.refresh()

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


class _DropLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _DROPPED_LOG_LINES.search(record.getMessage())


def quiet_library_output() -> None:
    """Drop Lightning's advert for its logging product and a deprecation warning Lightning raises
    about torch's pytree API (neither is about the run, and neither can be acted on by its user)."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLines) for f in logger.filters):
            logger.addFilter(_DropLines())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
