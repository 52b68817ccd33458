"""A run with ``trainer.precision=auto`` (issue 54, item 2) says what it chose and why, records the
choice in ``config.yaml`` and ``environment.json``, and trains with it; on this machine's CPU the
choice is :func:`creditlab.run.precision.choose`'s (bf16-mixed where it reports bf16 units, fp32
elsewhere and under ``ATEN_CPU_CAPABILITY=avx2``)."""

from __future__ import annotations

import json

import pytest
import yaml

from creditlab.run import precision
from creditlab.run.compose import compose
from creditlab.run.launch import run
from tests.helpers import check_finished_run
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow


def test_auto_precision_is_said_recorded_and_used(tmp_path, capsys):
    expected, why = precision.choose("cpu")
    decode = "; decoding too (backend.dtype=bfloat16)" if expected == "bf16-mixed" else ""
    run(compose([*SMALL, "trainer.max_steps=2", "threads=1", "trainer.precision=auto"]), tmp_path)
    assert f"[creditlab] trainer.precision=auto: {expected}{decode}, because {why}" in capsys.readouterr().err
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["trainer"]["precision"] == expected
    assert saved["backend"]["dtype"] == ("bfloat16" if decode else "auto")
    assert json.loads((tmp_path / "environment.json").read_text())["precision"].startswith(
        f"trainer.precision=auto: {expected}")
    check_finished_run(tmp_path, 2)
