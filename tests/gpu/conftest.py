"""The GPU suite (``tests/gpu``): the code paths that run only on a CUDA device.

Every test in this folder gets the ``gpu`` marker. Where CUDA is absent (CPU machines, CI) each
one is skipped at collection with the reason :data:`REASON`, so no fixture runs: no model is built,
no warm start is trained, nothing heavier than ``torch`` is imported (the test modules import
creditlab inside their fixtures and tests). On a CUDA machine: ``pytest tests/gpu -q``
(docs/gpu.md).

The 3-step training runs share one warm-started tiny model per session through the integration
tests' ``model_cache`` fixture (``CREDITLAB_CACHE`` set to a session temporary folder).
"""

from pathlib import Path

import pytest
import torch

from tests.integration.conftest import model_cache  # noqa: F401  (autouse: session CREDITLAB_CACHE)

#: Whether this process sees a CUDA device.
HAS_CUDA = torch.cuda.is_available()
#: The skip reason shown by ``pytest -rs`` on machines without CUDA.
REASON = "needs CUDA (torch.cuda.is_available() is False)"

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark this folder's tests ``gpu`` and, without CUDA, skip them before any fixture runs.

    (The hook sees every collected item of the session, so it picks this folder's by path.)
    """
    for item in items:
        if _HERE not in Path(str(item.path)).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if not HAS_CUDA:
            item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture
def fp32_matmuls():
    """Full-precision float32 matmuls and convolutions on CUDA (no TF32) for the test's body:
    CPU-equality checks need them, whatever a library or the user set before."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])
