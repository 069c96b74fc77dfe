"""Worker plugins: per-worker state that outlives single tasks.

:class:`RunState` is registered once per run and holds, on every worker, the live rollout
environments (one :class:`~dask_rl.roles.collector.Collector` per rollout slot seen there,
so episodes continue across tasks), the policy version each of them holds, one learner per
worker thread, and for evolution strategies the shared noise table — built from its seed when
the plugin is set up on the worker (workers that join later build their own), never sent over
the network — and one ES evaluator per thread. It also pins torch to the worker's share of the
cores and teaches ``dask.sizeof`` the real size of torch tensors (FACTS.md: otherwise 80 bytes).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
from distributed import WorkerPlugin, get_worker

from dask_rl.config.schema import PipelineConfig

logger = logging.getLogger(__name__)


def register_torch_sizeof() -> None:
    """Make ``dask.sizeof`` count a tensor's bytes (idempotent)."""
    import torch
    from dask.sizeof import sizeof

    if torch.Tensor not in sizeof._lookup:
        @sizeof.register(torch.Tensor)
        def _sizeof_tensor(t: torch.Tensor) -> int:
            return int(t.element_size() * t.nelement()) + 64


class RunState(WorkerPlugin):
    """The worker side of one training run, found by tasks under ``name``.

    ``noise`` is the ``(seed, size)`` of an ES run's noise table.
    """

    def __init__(self, name: str, cfg: PipelineConfig, *,
                 noise: tuple[int, int] | None = None, torch_threads: int = 1):
        self.name = name
        self.cfg = cfg
        self.noise_spec = noise
        self.torch_threads = torch_threads

    def setup(self, worker: Any) -> None:
        import torch

        torch.set_num_threads(self.torch_threads)
        register_torch_sizeof()
        self.worker = worker
        self.lock = threading.Lock()
        self.collectors: dict[int, Any] = {}
        self.slot_locks: dict[int, threading.Lock] = {}
        self.created: dict[int, int] = {}
        self.learners: dict[int, Any] = {}
        self.es_evaluators: dict[int, Any] = {}
        self.spaces = None
        self._algorithm = None
        self.noise = None if self.noise_spec is None else noise_table(*self.noise_spec)

    def teardown(self, worker: Any) -> None:
        for collector in self.collectors.values():
            collector.close()
        self.collectors.clear()
        self.learners.clear()

    def slot_lock(self, slot: int) -> threading.Lock:
        """Held by a task while it collects on slot ``slot`` here: a slot's environments
        serve one task at a time (a task queued behind its slot's running one, or one
        started after a discard while the old one still runs, waits for it)."""
        with self.lock:
            return self.slot_locks.setdefault(slot, threading.Lock())

    def collector(self, slot: int):
        """The persistent environments of rollout slot ``slot`` on this worker."""
        from dask_rl.roles.collector import Collector

        with self.lock:
            collector = self.collectors.get(slot)
            if collector is None:
                n = self.created.get(slot, 0)
                self.created[slot] = n + 1
                # Seeds differ per run seed, slot, worker and re-creation, reproducibly.
                seed = int(np.random.SeedSequence(
                    [self.cfg.seed, slot, _worker_index(self.worker), n]).generate_state(1)[0])
                collector = Collector(self.cfg, seed=seed, slot=slot)
                self.collectors[slot] = collector
                self.spaces = (collector.env.single_observation_space,
                               collector.env.single_action_space)
            return collector

    def algorithm(self):
        """The run's algorithm (pure: one for all threads)."""
        if self._algorithm is None:
            from dask_rl.algos import registry

            self._algorithm = registry.build(self.cfg.algo)
        return self._algorithm

    def _per_thread(self, store: dict, make):
        """The calling thread's object in ``store`` (networks are not shared by threads)."""
        ident = threading.get_ident()
        with self.lock:
            obj = store.get(ident)
            if obj is None:
                obj = store[ident] = make()
            return obj

    def learner(self):
        """This thread's learner."""
        from dask_rl.envs import env_spaces
        from dask_rl.roles.learner import Learner

        def make():
            self.spaces = self.spaces or env_spaces(self.cfg.env)
            return Learner(self.cfg, *self.spaces)

        return self._per_thread(self.learners, make)

    def es_evaluator(self):
        """This thread's evaluator of perturbed policies."""
        from dask_rl.roles.es_evaluator import ESEvaluator

        return self._per_thread(self.es_evaluators, lambda: ESEvaluator(self.cfg, self.noise))


_TABLES: dict[tuple[int, int], np.ndarray] = {}
_TABLES_LOCK = threading.Lock()


def noise_table(seed: int, size: int) -> np.ndarray:
    """The ES noise table, built once per worker process and shared by its runs."""
    from dask_rl.algos import es

    with _TABLES_LOCK:
        key = (seed, size)
        if key not in _TABLES:
            _TABLES.clear()  # one table at a time: they are large
            _TABLES[key] = es.noise_table(seed, size)
        return _TABLES[key]


def run_state(name: str) -> RunState:
    """The :class:`RunState` of run ``name`` on the worker executing this task."""
    worker = get_worker()
    try:
        return worker.plugins[name]
    except KeyError:
        raise RuntimeError(f"worker {worker.address} has no state for run {name!r} "
                           "(was the run's worker plugin registered?)") from None


def _worker_index(worker: Any) -> int:
    name = worker.name
    if isinstance(name, int):
        return name
    return int.from_bytes(str(name).encode()[-4:].rjust(4, b"\0"), "big")

