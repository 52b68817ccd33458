"""Scale-path presets: trainer=ddp builds on the CPU; the GPU presets (ddp_gpu, fsdp, deepspeed)
compose, validate and bind to their strategy classes without a GPU or deepspeed installed; the
SLURM launcher preset composes with its plug-in and fails with a message naming the extra
without it."""

import inspect

import creditlab.run.compose
import pytest
from creditlab import cli
from creditlab.errors import ConfigError
from creditlab.run.compose import CONF_DIR, compose
from creditlab.run.config import validate
from hydra.utils import get_class, instantiate


def test_ddp_preset_builds_a_two_rank_gloo_trainer():
    cfg = compose(["trainer=ddp"])
    assert validate(cfg)["launch"].world_size == 2
    node = dict(cfg.trainer)
    node.update(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer = instantiate(node)
    assert type(trainer.strategy).__name__ == "DDPStrategy" and trainer.num_devices == 2
    assert trainer.strategy._process_group_backend == "gloo"


@pytest.mark.parametrize("preset,strategy", [
    ("ddp_gpu", "DDPStrategy"), ("fsdp", "FSDPStrategy"), ("deepspeed", "DeepSpeedStrategy"),
])
def test_gpu_presets_compose_validate_and_bind(preset, strategy):
    cfg = compose([f"trainer={preset}"])
    layout = validate(cfg)["launch"]
    assert layout.devices == cfg.trainer.devices and layout.world_size == 8
    node = dict(cfg.trainer.strategy)
    cls = get_class(node.pop("_target_"))
    assert cls.__name__ == strategy
    inspect.signature(cls).bind(**node)  # every key is an argument (deepspeed need not be installed)
    assert "precision" in cfg.trainer and cfg.trainer.accelerator == "gpu"
    if preset == "fsdp":  # the wrap policy resolves to the decoder layer classes
        policy = instantiate(cfg.trainer.strategy.auto_wrap_policy)
        names = {c.__name__ for c in policy._module_classes}
        assert {"LlamaDecoderLayer", "Qwen2DecoderLayer"} <= names


def _hydra_cfg(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=True)


def test_slurm_launcher_preset_composes_with_its_plugin():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = _hydra_cfg("hydra/launcher=slurm", "trainer=ddp_gpu", "trainer.devices=4", "trainer.num_nodes=2")
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.nodes) == (4, 4, 2)
    validate(compose(["hydra/launcher=slurm", "trainer=ddp_gpu"]))


def test_slurm_launcher_without_its_plugin_names_the_extra(monkeypatch, capsys):
    monkeypatch.setattr(creditlab.run.compose, "_plugin_installed", lambda module: False)
    with pytest.raises(ConfigError, match=r"pip install 'creditlab\[slurm\]'"):
        compose(["hydra/launcher=slurm"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "-m", "hydra/launcher=slurm", "seed=0,1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "creditlab[slurm]" in err and "hydra/launcher=slurm" in err
