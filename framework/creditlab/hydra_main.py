"""The Hydra-decorated main used by ``creditlab train`` (one job, or each job of a sweep)."""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from creditlab.config import CONF_DIR
from creditlab.errors import InputError, RegistryError
from creditlab.launch import RankFailed, run


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Run one job; returns the final held-out pass@1 (a sweeper's objective)."""
    try:
        summary = run(cfg, HydraConfig.get().runtime.output_dir)
    except (InputError, RegistryError, FileNotFoundError) as exc:
        print(f"creditlab: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except RankFailed as exc:
        print(f"creditlab: error: {exc}", file=sys.stderr)
        sys.exit(1)
    return summary.get("eval_pass@1_last")
