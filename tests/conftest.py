import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def pipelines() -> Path:
    return PIPELINES


@pytest.fixture(autouse=True, scope="session")
def _torch_threads():
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    yield
