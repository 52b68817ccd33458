"""The Hydra-decorated main used by ``creditlab train`` (one job, or each job of a sweep).

Hydra's own records of a job (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``) are
written by :func:`creditlab.run.launch.run` once the run holds its folder (``hydra.output_subdir`` is
null in ``conf/train.yaml``), so a run refused for a busy or different run folder overwrites none
of them. A run stopped by a signal ends with the signal's exit status and the command that resumes it.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from creditlab.errors import InputError, RegistryError
from creditlab.run.config import CONF_DIR
from creditlab.run.launch import RankFailed, run
from creditlab.run.rundir_guard import RunStopped

#: Overrides a resume command replaces: where the run is, and how it resumes (``auto``).
RESUME_REPLACES = ("run_dir", "resume")


def resume_command(overrides: list[str], out_dir: str | Path) -> str:
    """``creditlab train <overrides> run_dir=<out_dir>``: the job's own overrides (a sweep job's
    values included), its folder pinned and ``resume`` left to its default (``auto``)."""
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in RESUME_REPLACES]
    return shlex.join(["creditlab", "train", *kept, f"run_dir={out_dir}"])


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Run one job; returns the final held-out pass@1 (a sweeper's objective)."""
    hydra_cfg = HydraConfig.get()
    out_dir = hydra_cfg.runtime.output_dir
    overrides = list(hydra_cfg.overrides.task)
    records = {
        ".hydra/config.yaml": OmegaConf.to_yaml(cfg),
        ".hydra/hydra.yaml": OmegaConf.to_yaml(HydraConfig.instance().cfg),
        ".hydra/overrides.yaml": OmegaConf.to_yaml(OmegaConf.create(overrides)),
    }
    try:
        summary = run(cfg, out_dir, records)
    except (InputError, RegistryError, FileNotFoundError) as exc:
        print(f"creditlab: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except RankFailed as exc:
        print(f"creditlab: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except RunStopped as exc:
        print(f"creditlab: {exc}\n  resume with: {resume_command(overrides, out_dir)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before training started: nothing was trained
        print(f"creditlab: interrupted (Ctrl-C) before training started\n"
              f"  run again with: {resume_command(overrides, out_dir)}", file=sys.stderr)
        sys.exit(130)
    return summary.get("eval_pass@1_last")
