"""A virtual-time cluster: a large cluster's order of events, replayed in one process.

Stellaris' claims are about staleness in the tens (128 rollout cores, up to 64 learners); two
cores produce about two. The virtual cluster runs the engine's real parts — the
:class:`~dask_rl.control.launch.LaunchPolicy` that decides what starts, the
:class:`~dask_rl.runtime.parameter_actor.ParameterActor` with its strategy, the rollout
task's pull-and-collect (:func:`~dask_rl.runtime.tasks.collect_held`) and the learner task's
learn-and-push (:func:`~dask_rl.runtime.tasks.learn_pulled`) on real environments and real
networks, the driver's learner ids and synchronous rounds
(:class:`~dask_rl.runtime.learners.LearnerTasks`) — in the order a cluster of ``slots`` rollout
slots and ``max_learners`` learners would produce, with a discrete-event clock in place of
the cluster. Each task's duration is drawn from a :class:`TaskTime` (measured here and scaled,
or given), so who pulls which version and when each push lands — staleness, the threshold's
waits, the truncation's peers — follow that cluster; only wall time differs.

The clock
---------
Events are ``(virtual time, sequence, action)``, run in time order (ties in the order they were
scheduled). A rollout pulls and collects when it starts and its trajectory is ready after a
drawn rollout time. A learner pulls (``pull_learner``) when it starts; a strategy that does
not admit it yet (SSP) leaves it waiting until the next push, when it asks again; its update
is computed, and pushed, after a drawn learner time, on the snapshot it pulled. A learner fed
where its data is (``learner.fused``, as the driver decides it) collects, pulls after the
rollout time and pushes after the learner time; a launch queued behind its slot collects as
soon as the slot's environments are free (the running task has collected and is learning:
:meth:`RunState.slot_lock` is held for the collection only), so a slot's next collection
overlaps its last learner, as on a worker with a thread free for it. The run stops as the
driver's does, in its order: at ``stop.env_steps`` learned (draining what was collected), at
``stop.wall_s`` of *virtual* time — exactly then, before any task that ends later — (rollouts
in flight are dropped, learners in flight push if they end within the driver's
:data:`~dask_rl.runtime.driver.LEARNER_DRAIN_S`, the rest are abandoned), or at
``stop.env_steps`` collected (draining).

Deviations from a real cluster, each on purpose
-----------------------------------------------
* Calls to the parameter actor, and the driver's own work, take no virtual time: the actor is
  not a bottleneck here (``benchmarks/simulate_scale.py`` models that part). A submitted task
  starts at once: the cluster has a thread for every slot and learner, and by default a core
  for each; with ``cores`` the running tasks share that many equally (processor sharing,
  the model of this machine's threads), so that a task's time follows what runs beside it.
* A learner's update is computed at the moment it ends, so Stellaris' truncation sees the
  peers computing at that moment at the versions they pulled (a real peer publishes its local
  parameters after each epoch; here it has not published yet).
* Ignored: evaluations and so the target-return stop, checkpoints and faults (a run ends on
  its env-step or wall budget). Refused with one line: an adaptive cluster (``cluster.adapt``:
  it changes who learns where), sampled replay learners (DQN), population-based training,
  evolution strategies and ``learner.optimizer_state: local`` (moments kept per worker thread).
* A learner that SSP does not admit asks again at every push, however long that takes; a real
  one gives up after ``checkpoint.actor_timeout_s``.

Examples
--------
>>> cfg = load_pipeline("pipelines/ppo_cartpole.yaml", ["stop.env_steps=4096"])
>>> result = VirtualCluster(cfg, slots=8, rollout_time=TaskTime(1.0, 0.5),
...                         learn_time=TaskTime(0.5)).run()
>>> result["summary"]["staleness"]["mean"]
"""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from dask_rl.algos import registry
from dask_rl.algos.replay import ReplayAlgorithm
from dask_rl.config import ConfigError, public_dict
from dask_rl.config.schema import PipelineConfig
from dask_rl.control.launch import FusedLaunch, LaunchPolicy, LearnerLaunch
from dask_rl.control.replay import TrajectoryReplay
from dask_rl.control.schedule import RECENT_EPISODES, learner_seed
from dask_rl.data import PolicySnapshot, Trajectory
from dask_rl.runtime.driver import LEARNER_DRAIN_S
from dask_rl.runtime.families import family_of
from dask_rl.runtime.learners import LearnerTasks
from dask_rl.runtime.parameter_actor import ParameterActor
from dask_rl.runtime.plugins import RunState
from dask_rl.runtime.tasks import collect_held, learn_pulled
from dask_rl.staleness import STRATEGIES

RUN = "virtual"
PROGRESS_EVERY_S = 5.0   # of real time, between progress calls
# learner statistics each push's record keeps
STATS = {"learn_s": "learner/time_s", "cross_policies": "learner/cross_policies",
         "cross_forward_s": "learner/cross_forward_s",
         "cross_exchange_s": "learner/cross_exchange_s",
         "is_truncated_frac": "losses/is_truncated_frac"}


@dataclass(frozen=True)
class TaskTime:
    """How long a task takes, in virtual seconds: drawn from ``samples`` (measured times,
    with replacement) when given, else log-normal with mean ``mean`` and shape ``sigma``
    (``sigma = 0``: always ``mean``)."""

    mean: float
    sigma: float = 0.0
    samples: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.mean > 0 or self.sigma < 0 or any(not s > 0 for s in self.samples):
            raise ConfigError(f"a task time needs mean > 0, sigma >= 0 and samples > 0, got "
                              f"mean {self.mean}, sigma {self.sigma}")

    @classmethod
    def parse(cls, text: str) -> "TaskTime":
        """``MEAN`` or ``MEAN:SIGMA`` (seconds; log-normal shape)."""
        mean, _, sigma = text.partition(":")
        try:
            values = float(mean), float(sigma) if sigma else 0.0
        except ValueError:
            raise ConfigError(f"a task time is MEAN or MEAN:SIGMA in seconds, got {text!r}"
                              ) from None
        return cls(*values)

    @classmethod
    def measured(cls, samples: list[float], scale: float = 1.0) -> "TaskTime":
        """Measured durations, each times ``scale``."""
        if not samples:
            raise ConfigError("a measured task time needs at least one sample")
        scaled = tuple(float(s) * scale for s in samples)
        return cls(float(np.mean(scaled)), 0.0, scaled)

    def draw(self, rng: np.random.Generator) -> float:
        if self.samples:
            return self.samples[int(rng.integers(len(self.samples)))]
        if self.sigma == 0:
            return self.mean
        return float(rng.lognormal(np.log(self.mean) - self.sigma ** 2 / 2, self.sigma))

    def describe(self) -> dict:
        """What a results file records of it."""
        if self.samples:
            q = np.quantile(self.samples, [0.05, 0.5, 0.95])
            return {"kind": "measured", "n": len(self.samples), "mean": self.mean,
                    "p05": float(q[0]), "p50": float(q[1]), "p95": float(q[2])}
        return {"kind": "lognormal" if self.sigma else "fixed", "mean": self.mean,
                "sigma": self.sigma}


@dataclass(eq=False)
class _Batch:
    """A collected trajectory (what the launch policy holds; hashed by identity)."""

    slot: int
    trajectory: Trajectory


@dataclass(eq=False)
class _Learning:
    """One learner task on its way through the clock."""

    learner_id: str
    first_use: bool
    lr: float
    concurrent: int
    slot: int | None = None          # a fused task's slot
    batch: _Batch | None = None
    snapshot: PolicySnapshot | None = None
    asked: float | None = None       # virtual time of its first pull
    waited: float = 0.0              # virtual seconds until the strategy admitted it


class _Clock:
    """Virtual time and the tasks running on it. Each task needs ``work`` seconds of one core;
    with ``cores`` None every task has a core of its own (its work is its duration), else the
    running tasks share ``cores`` cores equally (processor sharing: each progresses at
    ``min(1, cores / running)``), as threads on a machine with fewer cores than tasks. A task's
    action runs when its work is done; ties in the order the tasks started."""

    def __init__(self, cores: float | None = None):
        if cores is not None and not cores > 0:
            raise ConfigError(f"cores: must be > 0, got {cores}")
        self.cores = cores
        self.now = 0.0
        self.seq = itertools.count()
        self.heap: list = []                         # own cores: (end, seq, action, args)
        self.shared: dict[int, list] = {}            # shared cores: seq -> [work left, ...]
        self.updated = 0.0                           # when the work left was last counted

    @property
    def busy(self) -> bool:
        return bool(self.heap or self.shared)

    def at(self, work: float, action: Callable, *args: Any) -> None:
        """Start a task of ``work`` core-seconds now; ``action(*args)`` when it is done."""
        if self.cores is None:
            heapq.heappush(self.heap, (self.now + work, next(self.seq), action, args))
            return
        self._progress()
        self.shared[next(self.seq)] = [work, action, args]

    def peek(self) -> float:
        """When the next task ends (``busy`` only)."""
        if self.cores is None:
            return self.heap[0][0]
        self._progress()
        return self.now + min(task[0] for task in self.shared.values()) / self._rate()

    def advance(self, t: float) -> None:
        """Move the clock to ``t`` (no later than :meth:`peek`): the tasks progress."""
        self._progress()
        self.now = t
        self._progress()

    def clear(self) -> int:
        """Drop every task; how many there were."""
        n = len(self.heap) + len(self.shared)
        self.heap.clear()
        self.shared.clear()
        return n

    def next(self) -> tuple[Callable, tuple]:
        """Advance to the next task's end; its action and arguments."""
        if self.cores is None:
            self.now, _, action, args = heapq.heappop(self.heap)
            return action, args
        self._progress()
        seq = min(self.shared, key=lambda k: (self.shared[k][0], k))
        self.now += max(self.shared[seq][0], 0.0) / self._rate()
        self._progress()
        _, action, args = self.shared.pop(seq)
        return action, args

    def _rate(self) -> float:
        return min(1.0, self.cores / len(self.shared)) if self.shared else 1.0

    def _progress(self) -> None:
        done = (self.now - self.updated) * self._rate()
        for task in self.shared.values():
            task[0] -= done
        self.updated = self.now


class VirtualCluster:
    """One training run of ``cfg`` on a virtual cluster of ``slots`` rollout slots and
    ``cfg.learner.max_learners`` learners; :meth:`run` returns the results (a dict, JSON-ready).

    ``seed`` draws the task times (the run's own randomness is ``cfg.seed``'s, as on a
    cluster); ``progress(result_so_far)`` is called every few seconds of real time. With
    ``cores`` the tasks share that many cores (a task time is then its work on one core):
    the machine this runs on, to compare with a real run here; without, every task has its
    own, as on a cluster.
    """

    def __init__(self, cfg: PipelineConfig, *, slots: int, rollout_time: TaskTime,
                 learn_time: TaskTime, seed: int = 0, cores: float | None = None,
                 progress: Callable[[dict], None] | None = None, torch_threads: int = 1):
        algorithm = registry.build(cfg.algo)
        if isinstance(algorithm, ReplayAlgorithm):
            raise ConfigError(f"algo.name: the virtual cluster does not emulate sampled replay "
                              f"learners ({cfg.algo.name}); it runs on-policy and IMPACT-style "
                              f"learners")
        if family_of(type(algorithm)).name != "learner" or cfg.population is not None:
            raise ConfigError(f"algo.name: the virtual cluster runs gradient learners without "
                              f"a population, got {cfg.algo.name!r}"
                              + (" with population" if cfg.population is not None else ""))
        if cfg.cluster.adapt is not None:
            raise ConfigError("cluster.adapt: the virtual cluster has a fixed number of slots "
                              "and learners (--slots, learner.max_learners); remove adapt")
        if cfg.learner.optimizer_state != "shared":
            raise ConfigError("learner.optimizer_state: the virtual cluster does not model "
                              "moments kept per worker thread ('local'); use 'shared'")
        if slots < 1:
            raise ConfigError(f"slots: must be >= 1, got {slots}")
        self.cfg = cfg
        self.algorithm = algorithm
        self.rollout_time = rollout_time
        self.learn_time = learn_time
        self.seed = seed
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 7]))
        self.progress = progress
        self.torch_threads = torch_threads
        needs = algorithm.needs
        self.replay = (TrajectoryReplay(replay=needs.replay, capacity=needs.replay_capacity)
                       if needs.replay > 1 else None)
        synchronous = STRATEGIES[cfg.aggregation.strategy].synchronous
        # as the driver decides it (Driver.connect), on a cluster that does not adapt
        fused = cfg.learner.fused and self.replay is None and cfg.learner.gpus == 0
        self.policy: LaunchPolicy[_Batch] = LaunchPolicy(
            slots=0, max_learners=cfg.learner.max_learners,
            max_ready=cfg.rollout.max_ready or cfg.learner.max_learners,
            synchronous=synchronous, replay=self.replay, fused=fused)
        self.policy.resize(slots)
        self.slots = slots
        # what LearnerTasks asks of its driver
        self.hparams: dict[str, float] = {}
        self.env_steps = 0
        self.tasks = LearnerTasks(self)
        self.clock = _Clock(cores)
        self.collected = 0                       # env steps collected
        self.returns: collections.deque[float] = collections.deque(maxlen=RECENT_EPISODES)
        self.episodes = 0
        self.updates = 0
        self.rounds = 0
        self.pushes: list[dict] = []
        self.waiting: list[_Learning] = []       # learners the strategy has not admitted yet
        self.admission_waits: list[float] = []   # virtual seconds each admitted one waited
        self.collecting: set[int] = set()        # fused slots whose environments are held
        self.queued: dict[int, collections.deque[_Learning]] = collections.defaultdict(
            collections.deque)
        self.dropped_rollouts = 0
        self.rollouts: list[dict] = []           # each rollout apart: started, ended, status
        self.stop_reason: str | None = None
        self.stopped_at: float | None = None
        self.abandoned = 0                       # tasks still running at the drain's deadline
        self.state: RunState | None = None
        self.actor: ParameterActor | None = None

    # ---- what LearnerTasks asks of its driver ---------------------------------------------------
    def actor_call(self, method: str, *args: Any, on_loss: str = "raise", **kwargs: Any) -> Any:
        return getattr(self.actor, method)(*args, **kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """As :meth:`ActorHandle.call`: the tasks' way to the actor (in-process here)."""
        return getattr(self.actor, method)(*args, **kwargs)

    key = RUN      # the handle's actor key and incarnation, as the tasks ask of a handle
    epoch = RUN

    # ---- the run --------------------------------------------------------------------------------
    def run(self) -> dict:
        from dask_rl.runtime.driver import initial_parameters

        cfg = self.cfg
        t0 = time.perf_counter()
        self.state = RunState(RUN, cfg, torch_threads=self.torch_threads)
        self.state.setup(SimpleNamespace(name=0, address="virtual"))
        params, moments = initial_parameters(cfg, self.algorithm)
        self.actor = ParameterActor(
            params, cfg.aggregation, moments=moments,
            keep_versions=4 * cfg.learner.max_learners if cfg.learner.is_truncation else 0,
            learners=cfg.learner.max_learners,
            target_every=self.algorithm.needs.target_network_every, run=RUN, epoch=RUN)
        last_progress = time.perf_counter()
        try:
            self._launch()
            while self.clock.busy:
                if self._wall_reached() or self._drain_expired():
                    continue
                action, args = self.clock.next()
                action(*args)
                self._check_stop()
                self._launch()
                if self.progress and time.perf_counter() - last_progress > PROGRESS_EVERY_S:
                    last_progress = time.perf_counter()
                    self.progress(self._summary(time.perf_counter() - t0))
            if not self.policy.finished and not self.abandoned:
                waiting = ", ".join(j.learner_id for j in self.waiting) or "none"
                raise RuntimeError(f"the virtual cluster stalled at {self.clock.now:.3f} s: "
                                   f"nothing is scheduled and the run has not ended "
                                   f"(learners waiting for admission: {waiting})")
        finally:
            self.state.teardown(None)
        return {"config": public_dict(cfg),
                "cluster": {"slots": self.slots, "max_learners": cfg.learner.max_learners,
                            "fused": self.policy.fused, "seed": self.seed,
                            "cores": self.clock.cores,
                            "rollout_time": self.rollout_time.describe(),
                            "learn_time": self.learn_time.describe()},
                "summary": self._summary(time.perf_counter() - t0),
                "actor": _jsonable(self.actor.metrics()),
                "pushes": self.pushes, "rollouts": self.rollouts}

    def _launch(self) -> None:
        """Start what the launch policy decides (as :meth:`Driver._launch`)."""
        launches = self.policy.decide()
        if launches.fused and self.policy.synchronous:
            self.tasks.announce([f.slot for f in launches.fused])
        for fused in launches.fused:
            self._start_fused(fused)
        for launch in launches.learners:
            self._start_learner(launch)
        if launches.rollouts and self.policy.synchronous:
            self.tasks.announce(launches.rollouts)
        for slot in launches.rollouts:
            self._collect(slot, None)

    def _check_stop(self) -> None:
        """As :meth:`Driver._check_stop`, on the virtual clock and in its order: env steps
        learned (drain), the wall budget (no drain), env steps collected (drain)."""
        if self.policy.stopping:
            return
        stop = self.cfg.stop
        if self.env_steps >= stop.env_steps:
            reason = "env_steps"
        elif stop.wall_s is not None and self.clock.now >= stop.wall_s:
            reason = "wall_s"
        elif self.collected >= stop.env_steps:
            reason = "env_steps"
        else:
            return
        self.stop_reason, self.stopped_at = reason, self.clock.now
        self.policy.stop(drain=reason == "env_steps")

    def _wall_reached(self) -> bool:
        """The wall budget falls before the next task ends: the run stops at it exactly."""
        wall_s = self.cfg.stop.wall_s
        if self.policy.stopping or wall_s is None or self.clock.peek() <= wall_s:
            return False
        self.clock.advance(max(wall_s, self.clock.now))
        self._check_stop()
        return True

    def _drain_expired(self) -> bool:
        """A stop without drain waits :data:`LEARNER_DRAIN_S` for the learners in flight, as
        the driver does; whatever would end later is abandoned."""
        if not self.policy.stopping or self.policy.draining:
            return False
        deadline = self.stopped_at + LEARNER_DRAIN_S
        if self.clock.peek() <= deadline:
            return False
        self.clock.advance(deadline)
        self.abandoned = self.clock.clear()
        return True

    # ---- rollouts -------------------------------------------------------------------------------
    def _collect(self, slot: int, job: _Learning | None) -> None:
        """A rollout (or a fused task's collection) starts on ``slot``: pull if due, collect;
        it is over after a drawn rollout time."""
        traj = collect_held(self.state, slot, self, None, time.perf_counter())
        delay = self.rollout_time.draw(self.rng)
        if job is None:
            self.rollouts.append({"slot": slot, "started": self.clock.now, "ended": None,
                                  "status": "running"})
            self.clock.at(delay, self._rollout_done, _Batch(slot, traj), self.rollouts[-1])
        else:
            job.batch = _Batch(slot, traj)
            self.clock.at(delay, self._collected, job)

    def _rollout_done(self, batch: _Batch, record: dict) -> None:
        record["ended"] = self.clock.now
        if self.policy.stopping and not self.policy.draining:
            self.dropped_rollouts += 1       # cancelled at the end of the run
            record["status"] = "dropped"
            self.policy.rollout_failed(batch.slot)
            return
        record["status"] = "collected"
        self.collected += self.cfg.batch_size
        self.policy.rollout_done(batch.slot, batch)
        self.tasks.collected(batch.slot, batch)

    # ---- learners -------------------------------------------------------------------------------
    def _job(self, learner_id: str, first_use: bool, concurrent: int,
             slot: int | None = None) -> _Learning:
        return _Learning(learner_id, first_use, self.tasks.learning_rate(), concurrent, slot)

    def _start_learner(self, launch: LearnerLaunch[_Batch]) -> None:
        job = self._job(self.tasks.learner_id(launch.trajectory, launch.first_use),
                        launch.first_use, launch.concurrent)
        job.batch = launch.trajectory
        self._pull(job)

    def _start_fused(self, launch: FusedLaunch) -> None:
        job = self._job(self.tasks.fused_learner_id(launch.slot), True, launch.concurrent,
                        slot=launch.slot)
        if launch.slot in self.collecting:     # it waits for the slot's environments
            self.queued[launch.slot].append(job)
        else:
            self.collecting.add(launch.slot)
            self._collect(launch.slot, job)

    def _collected(self, job: _Learning) -> None:
        """A fused task has collected: the slot's environments go to the task queued behind
        it, and this one learns."""
        slot = job.slot
        self.collecting.discard(slot)
        if self.queued[slot]:
            self.collecting.add(slot)
            self._collect(slot, self.queued[slot].popleft())
        self._pull(job)

    def _pull(self, job: _Learning) -> None:
        """The learner asks for the current version; it computes for a drawn learner time if
        admitted, else it waits for the next push."""
        if job.asked is None:
            job.asked = self.clock.now
        snapshot = self.actor.pull_learner(job.learner_id, opt_state=True)
        if snapshot is None:
            self.waiting.append(job)
            return
        job.snapshot = snapshot
        job.waited = self.clock.now - job.asked
        self.admission_waits.append(job.waited)
        self.clock.at(self.learn_time.draw(self.rng), self._push, job)

    def _push(self, job: _Learning) -> None:
        """The learner's update on the snapshot it pulled, pushed now; the driver takes its
        report (as :meth:`LearnerTasks.done` / ``fused_done``)."""
        seq = int(job.learner_id[1:])
        report = learn_pulled(RUN, self.state, job.snapshot, job.batch.trajectory, self,
                              job.learner_id, job.lr, learner_seed(self.cfg.seed, seq), None,
                              job.first_use, seq, t0=time.perf_counter())
        waiting, self.waiting = self.waiting, []
        for other in waiting:               # a push may admit a waiting learner (SSP)
            self._pull(other)
        self.updates = max(self.updates, report.ack.version)
        if job.first_use:
            self.env_steps += report.trajectory_steps
            self.returns.extend(report.episode_returns)
            self.episodes += len(report.episode_returns)
        recent = float(np.mean(self.returns)) if self.returns else None
        self.pushes.append({
            "t": self.clock.now, "env_steps": self.env_steps, "learner": job.learner_id,
            "first_use": job.first_use, "status": report.ack.status,
            "staleness": report.ack.staleness, "weight": report.ack.weight,
            "version_pulled": report.version_pulled, "policy_lag": report.policy_lag,
            "concurrent": job.concurrent, "return_recent": recent,
            "pulled_at": job.asked + job.waited, "admission_wait": job.waited,
            # what the update cost in real seconds, and the truncation's part of it
            **{key: report.stats[stat] for key, stat in STATS.items() if stat in report.stats}})
        if job.slot is not None:
            self.collected += report.trajectory_steps
            round_ended = self.policy.fused_done(job.slot)
        else:
            round_ended = self.policy.learner_done(job.first_use)
        if round_ended:
            self.rounds += 1
            self.actor.round_end(**({"reward": recent} if recent is not None else {}))

    # ---- results --------------------------------------------------------------------------------
    def _summary(self, real_s: float) -> dict:
        stale = np.array([p["staleness"] for p in self.pushes if p["status"] != "rejected"])
        staleness = ({"mean": float(stale.mean()), "p50": float(np.quantile(stale, 0.5)),
                      "p99": float(np.quantile(stale, 0.99)), "max": int(stale.max()),
                      "n": int(stale.size)} if stale.size else None)
        waits = np.array(self.admission_waits)
        return {"virtual_s": self.clock.now, "real_s": real_s, "env_steps": self.env_steps,
                "env_steps_collected": self.collected, "updates": self.updates,
                "rounds": self.rounds, "episodes": self.episodes,
                "return_recent": float(np.mean(self.returns)) if self.returns else None,
                "staleness": staleness,
                "admission": {"waited": int((waits > 0).sum()),
                              "wait_s_mean": float(waits.mean()) if waits.size else 0.0},
                "dropped_rollouts": self.dropped_rollouts, "stop_reason": self.stop_reason,
                "stopped_at": self.stopped_at, "abandoned": self.abandoned}


def _jsonable(metrics: dict) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else
                v.item() if isinstance(v, np.generic) else v) for k, v in metrics.items()}
