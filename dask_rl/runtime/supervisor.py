"""Keeping the parameter actor alive: create it, watch it, re-create it.

Dask actors are not resilient: when the worker holding one dies, the actor is gone, and
nothing re-creates it (FACTS.md). The :class:`ActorSupervisor` owns the actor's lifecycle for
the driver: it creates the actor, pings it every ``checkpoint.heartbeat_s`` with a timeout of
``checkpoint.actor_timeout_s`` (so a hung actor stalls the run for at most that long), and on
loss creates a fresh actor (``pure=False``, a new key) on a live worker, into which the driver
loads the latest checkpoint.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from typing import Any, Callable

import numpy as np
from distributed import Client

from dask_rl.config.schema import PipelineConfig
from dask_rl.runtime.cluster import special_workers
from dask_rl.runtime.handle import ActorHandle
from dask_rl.runtime.parameter_actor import ParameterActor

logger = logging.getLogger(__name__)


class ActorSupervisor:
    """Creates and watches one trainer's parameter actor.

    Parameters
    ----------
    client
        The run's client.
    cfg
        The pipeline (aggregation strategy, learners, heartbeat settings).
    name
        Prefix of the actor's task keys.
    params, moments
        The actor's initial parameters and running statistics.
    aggregation, optimizer
        How the actor applies gradients (default: the pipeline's aggregation, plain SGD).
    target_every
        Keep a target network refreshed every this many updates (the algorithm's
        :attr:`~dask_rl.algos.base.Needs.target_network_every`); None keeps none.
    workers
        Where the actor may live (e.g. a parameter worker group); None for anywhere.
    wait
        ``wait(future, timeout)``: how its waits block (default ``future.result(timeout)``);
        the driver's gives up when the run is interrupted
        (:meth:`~dask_rl.runtime.run.Run.wait_for`).
    """

    def __init__(self, client: Client, cfg: PipelineConfig, name: str, params: np.ndarray, *,
                 moments: dict | None = None, aggregation: Any = None, optimizer: str = "sgd",
                 target_every: int | None = None, workers: list[str] | None = None,
                 wait: Callable[[Any, float | None], Any] | None = None):
        self.client = client
        self.cfg = cfg
        self.name = name
        self.params = params
        self.moments = moments
        self.aggregation = aggregation or cfg.aggregation
        self.optimizer = optimizer
        self.target_every = target_every
        self.workers = workers
        self._wait = wait or (lambda future, timeout: future.result(timeout=timeout))
        self.generation = itertools.count()
        self.last_beat = time.monotonic()
        self.handle = self._create()

    def _create(self, avoid: str | None = None) -> ActorHandle:
        cfg = self.cfg
        keep = 4 * cfg.learner.max_learners if cfg.learner.is_truncation else 0
        workers = self.workers or special_workers(self.client)[0] or None
        if avoid is not None:
            # Dask runs all sync actor methods of a worker on one thread: a hung actor there
            # would stall its successor too.
            live = [w for w in self.client.scheduler_info(n_workers=-1)["workers"] if w != avoid]
            workers = [w for w in (workers or live) if w != avoid] or None
        placement = {"workers": workers, "allow_other_workers": True} if workers else {}
        generation = next(self.generation)
        epoch = f"{generation}-{uuid.uuid4().hex[:8]}"  # unique across driver processes too
        future = self.client.submit(
            ParameterActor, self.params, self.aggregation, moments=self.moments,
            keep_versions=keep, learners=cfg.learner.max_learners, optimizer=self.optimizer,
            target_every=self.target_every, run=self.name, epoch=epoch,
            actor=True, pure=False, key=f"parameter-actor-{generation}-{self.name}",
            **placement)
        create_s = max(cfg.checkpoint.actor_timeout_s, 60.0)
        try:
            actor = self._wait(future, create_s)
        except TimeoutError:
            raise RuntimeError(
                f"the parameter actor could not be created within "
                f"{create_s:g} s: no worker took the task "
                f"(are all workers paused for memory, or none of the allowed ones alive?)"
            ) from None
        channel = None
        if cfg.cluster.actor_transport == "direct":
            channel = self._wait(actor.open_channel(), create_s)
        handle = ActorHandle(actor, timeout=cfg.checkpoint.actor_timeout_s, epoch=epoch,
                             channel=channel)
        self._future = future  # keeps the actor alive
        return handle

    @property
    def address(self) -> str:
        """The worker holding the actor now."""
        return self.handle.actor._address

    def alive(self, timeout: float | None = None) -> bool:
        """Whether the actor answers a ping within ``timeout`` seconds."""
        timeout = self.cfg.checkpoint.actor_timeout_s if timeout is None else timeout
        try:
            self._wait(self.handle.submit("ping"), timeout)
            return True
        except Exception as e:  # the actor's worker is gone or the call timed out
            logger.warning("parameter actor did not answer a ping: %r", e)
            return False

    def heartbeat_due(self) -> bool:
        if time.monotonic() - self.last_beat < self.cfg.checkpoint.heartbeat_s:
            return False
        self.last_beat = time.monotonic()
        return True

    def close(self) -> None:
        """Release the actor: its worker frees it and its parameters (a user's cluster
        outlives the run)."""
        try:
            self.client.cancel(self._future)
        except Exception:
            logger.debug("releasing the actor", exc_info=True)

    def replace(self) -> ActorHandle:
        """A fresh actor on a live worker (the caller restores its state)."""
        old, address = self.handle, self.address
        try:
            self.client.cancel(self._future)
        except Exception:
            logger.debug("cancelling the lost actor", exc_info=True)
        self.handle = self._create(avoid=address)
        logger.warning("re-created the parameter actor %s as %s on %s", old.key, self.handle.key,
                       self.address)
        return self.handle
