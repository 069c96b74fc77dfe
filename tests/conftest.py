import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"

os.environ.setdefault("OMP_NUM_THREADS", "1")

# Worker processes of the LocalClusters this session starts come from one forkserver that has
# imported what every worker imports (torch, Gymnasium, Dask, dask-rl's worker modules), as
# Dask's own test suite does: a 2-worker cluster is up and has run a torch task in ~0.3 s
# instead of ~4.7 s with spawn (Dask's default, which dask-rl's embedded clusters keep, and
# which every test that runs the CLI in a subprocess still uses). Workers are separate
# processes all the same, each made by the forkserver for its own start.
WORKER_PRELOAD = ["distributed", "numpy", "torch", "gymnasium", "dask_rl.runtime.tasks",
                  "dask_rl.runtime.plugins", "dask_rl.roles.collector", "dask_rl.roles.learner",
                  "dask_rl.roles.evaluation"]


def _fork_workers_from_a_preloaded_server() -> None:
    import dask

    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    from distributed.utils import get_mp_context

    get_mp_context().set_forkserver_preload(WORKER_PRELOAD)


_fork_workers_from_a_preloaded_server()


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
