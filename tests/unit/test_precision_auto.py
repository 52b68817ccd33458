"""``trainer.precision=auto`` (issue 54, item 2): bf16-mixed only where the CPU reports bf16 units
(AVX512-BF16, AMX) with torch's AVX-512 kernels, or on a GPU with bf16; the choice is written into
the config in place of ``auto`` with a line saying why, and a resume where ``auto`` would choose
otherwise is refused rather than mixing two precisions in one run."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from creditlab.run import precision
from creditlab.run.compose import compose
from creditlab.run.config import validate
from creditlab.run.rundir_guard import RunDirError, check_resume


def cpu(monkeypatch, avx512_bf16: bool, amx: bool, level: str) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: level)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(("avx512_bf16", "amx", "level", "units"), [
    (True, False, "AVX512", "AVX512-BF16"),      # AMD Zen 4
    (True, True, "AVX512", "AVX512-BF16 and AMX"),  # Intel Sapphire Rapids
    (False, True, "AVX512", "AMX"),
])
def test_a_cpu_with_bf16_units_gets_bf16_and_says_which(monkeypatch, avx512_bf16, amx, level, units):
    cpu(monkeypatch, avx512_bf16, amx, level)
    chosen, why = precision.choose("cpu")
    assert chosen == "bf16-mixed" and units in why and "AVX512" in why


def test_a_cpu_without_bf16_units_stays_fp32(monkeypatch):
    cpu(monkeypatch, False, False, "AVX512")  # AVX-512 without BF16 (Skylake-X, Ice Lake)
    assert precision.choose("cpu") == ("32-true", precision.choose("cpu")[1])
    assert "no bf16 instructions" in precision.choose("cpu")[1]
    cpu(monkeypatch, False, False, "AVX2")  # an AVX2-only CPU
    assert precision.choose("auto")[0] == "32-true"


@pytest.mark.parametrize("level", ["AVX2", "DEFAULT"])
def test_kernels_restricted_below_avx512_are_the_stand_in_for_a_cpu_without_bf16(monkeypatch, level):
    cpu(monkeypatch, True, False, level)  # ATEN_CPU_CAPABILITY=avx2 / default on a Zen 4
    chosen, why = precision.choose("cpu")
    assert chosen == "32-true" and level in why and "ATEN_CPU_CAPABILITY" in why


def test_a_gpu_gets_bf16_where_it_supports_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    assert precision.choose("gpu") == ("bf16-mixed", "the GPU (NVIDIA H200) supports bf16")
    assert precision.choose("auto")[0] == "bf16-mixed"  # Lightning's auto picks the GPU too
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert precision.choose("cuda")[0] == "32-true"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.choose("gpu")[0] == "32-true"


def test_validate_writes_the_choice_into_the_config(monkeypatch):
    cpu(monkeypatch, True, False, "AVX512")
    cfg = compose(["trainer.precision=auto"])
    checked = validate(cfg)
    assert cfg.trainer.precision == "bf16-mixed" and cfg.backend.dtype == "bfloat16"  # decoding follows
    assert checked["precision"].startswith("trainer.precision=auto: bf16-mixed; decoding too (backend.dtype=bfloat16), "
                                           "because this CPU reports AVX512-BF16")
    assert "precision: bf16-mixed" in OmegaConf.to_yaml(cfg)  # what config.yaml records
    plain = compose([])
    assert validate(plain)["precision"] is None and plain.trainer.precision == "32-true"  # the default is untouched


def test_auto_on_a_cpu_is_the_bf16_arm_of_the_equivalence_sweep(monkeypatch):
    """Where auto picks bf16 on a CPU it sets the two keys that ``precision=bf16`` sets (the arm
    sweeps/bf16_equivalence.yaml tests); a dtype given by hand is kept; fp32 leaves decoding alone."""
    cpu(monkeypatch, True, False, "AVX512")
    auto, arm = compose(["trainer.precision=auto"]), compose(["precision=bf16"])
    validate(auto)
    assert (auto.trainer.precision, auto.backend.dtype) == (arm.trainer.precision, arm.backend.dtype)
    kept = compose(["trainer.precision=auto", "backend.dtype=float32"])
    validate(kept)
    assert (kept.trainer.precision, kept.backend.dtype) == ("bf16-mixed", "float32")
    cpu(monkeypatch, False, False, "AVX2")
    fp32 = compose(["trainer.precision=auto"])
    assert validate(fp32)["precision"].startswith("trainer.precision=auto: 32-true, because")
    assert fp32.backend.dtype == "auto"
    assert (compose(["precision=fp32"]).trainer.precision, compose(["precision=fp32"]).backend.dtype) == ("32-true", "auto")


def test_a_misspelt_precision_still_names_auto_among_the_choices():
    from creditlab.errors import ConfigError
    with pytest.raises(ConfigError, match="auto"):
        validate(compose(["trainer.precision=automatic"]))


def test_a_resume_where_auto_would_choose_otherwise_is_refused(monkeypatch, tmp_path):
    """Started with auto on a bf16 CPU (config.yaml: bf16-mixed), resumed with auto where it picks
    fp32 (here: the AVX2 stand-in): the guard names trainer.precision before anything runs."""
    cpu(monkeypatch, True, False, "AVX512")
    first = compose(["trainer.precision=auto", "resume=auto"])
    validate(first)
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(first, resolve=True))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 3, "train/reward/mean": 0.5}) + "\n")
    same = compose(["trainer.precision=auto", "resume=auto"])
    validate(same)
    assert check_resume(same, tmp_path) is None  # the same machine chooses the same
    cpu(monkeypatch, True, False, "AVX2")
    other = compose(["trainer.precision=auto", "resume=auto"])
    validate(other)
    with pytest.raises(RunDirError, match="trainer.precision"):
        check_resume(other, tmp_path)
