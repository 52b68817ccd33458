"""Test-wide settings: no hub access, W&B offline, two threads, a private model cache."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(2)

import pytest  # noqa: E402


def pytest_configure(config):
    """``CREDITLAB_EXPECT_CPU_CAPABILITY`` (set by ``make test-numerics``): stop before any test
    unless torch runs that capability's kernels, so a restriction that did not take effect
    (a misspelt value, a CPU without it) is never a green run on the machine's own kernels."""
    want = os.environ.get("CREDITLAB_EXPECT_CPU_CAPABILITY")
    got = torch.backends.cpu.get_cpu_capability()
    if want and got != want:
        raise pytest.UsageError(
            f"CREDITLAB_EXPECT_CPU_CAPABILITY={want}, but torch runs {got} kernels "
            f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY')!r}); set ATEN_CPU_CAPABILITY "
            f"to avx2 or default, which this CPU must support")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run faster on one thread when the machine is busy (OpenMP barriers)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
