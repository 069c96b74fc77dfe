import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"

os.environ.setdefault("OMP_NUM_THREADS", "1")

# Worker processes of the LocalClusters this session starts come from one forkserver that has
# imported what every worker imports (torch, Gymnasium, Dask, dask-rl's worker modules): the
# one dask-rl's embedded clusters fork from (dask_rl.runtime.worker_start), started here and
# used by every LocalCluster of the session, also those the tests build themselves. Workers
# are separate processes all the same, each made by the forkserver for its own start.
def _fork_workers_from_a_preloaded_server() -> None:
    import dask

    from dask_rl.runtime.worker_start import warm_start

    warm_start()
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})


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
