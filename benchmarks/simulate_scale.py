"""One parameter actor under many learners: measured inputs, a checked queue model, a simulation.

The script has four parts. Parts 1 to 3 are measurements on this machine. Part 4 is a simulation,
and is labelled as one everywhere it reports.

1. **Learner task time (measured).** One real PPO update,
   ``Learner(cfg, obs_space, action_space).update(snapshot, traj, lr=..., seed=...)``, on a real
   trajectory from ``Collector(cfg, seed=0).collect(cfg.rollout.steps)``, one torch thread (as on
   a 1-thread worker), the snapshot pulled from an in-process ``ParameterActor`` with
   ``pull(learner_id=..., learner_state=True)``. Two models: the MLP of
   ``pipelines/ppo_cartpole.yaml`` and the Nature CNN of ``pipelines/ppo_pong.yaml`` (Atari,
   ale_py). The mean over the repeats is the learner time ``C`` of that model.
2. **Parameter actor service times (measured).** A real ``ParameterActor`` runs as a Dask actor on
   worker A of a ``LocalCluster`` of two worker processes. A task on worker B (where the learners
   of part 3 run) calls it through ``ActorHandle``, as learner tasks do, with three kinds of call:
   a learner pull (``pull_learner``: parameters, and the learners' Adam moments unless they stay
   with the learners), a push (delta, and the moments unless they stay) and a rollout pull
   (``pull(newer_than=-1)``: parameters only), on each path of ``--paths`` (``uncombined``: one
   message per call, moments with the actor, the path before call combining; ``combined``:
   training's default; ``combined-local``: and ``learner.optimizer_state = local``). For each
   kind, the *service time* ``s`` is the wall time per call with ``--in-flight`` threads of
   that task calling at once (default 16, a combined trip's most calls; the actor's worker is
   the bottleneck; an upper bound, because the calling process shares this machine's two
   cores), and the *round trip* ``rtt`` is the mean time of one call with nothing else
   outstanding. With combining, ``s`` is the cost per call of full trips, and the calls per
   trip are reported. The update math alone (the method called in-process) is reported beside
   them.
3. **Real learners against the real actor (measured), and the model with the same inputs.**
   N learners (``--learners``, default 2 4 8 16 32; N = 1 always runs first) are N
   long-running tasks on worker B of ``LocalCluster(n_workers=2, threads_per_worker=max(N),
   processes=True)``, one thread each; the actor is alone on worker A. Each learner loops
   ``pull_learner`` -> ``time.sleep(compute)`` -> ``push`` for ``--warmup-s`` + ``--measure-s``
   seconds; all start together. The compute is a sleep, not real work: on 2 cores, N real
   learners would take the CPU from the actor, while on a cluster they run on other machines;
   a sleep keeps the actor the contended resource. Its length is ``--compute-scale`` x the
   MLP's measured learner time (default 1), so that the actor saturates near ``N*`` (below)
   within 2 to 32 learners. Measured in the window after the warm-up: pushes/s, mean pull and
   push latency, mean staleness (``PushAck.staleness``) and the mean sleep actually slept.
   One learner never queues behind another, so the run with N = 1 calibrates the part of each
   call that is not the actor's queue: its latencies are the baseline, and the measured queue
   wait of a call at N learners is its mean latency minus the N = 1 one. (A call made after an
   idle pause, as a learner makes it, takes longer than part 2's tight-loop ``rtt``.) The same
   discrete-event model as part 4 then runs with the same N, the same MLP service times, the
   N = 1 latencies as round trips, the same (measured) compute time, the ``async`` strategy,
   the same warm-up and window. The table puts model and measurement side by side with the
   relative error ``(model - measured) / measured``. The N = 1 row matches by construction;
   the others are predictions.
4. **Many learners (simulated).** The real sans-IO strategies (``dask_rl.staleness``) driven
   by 1 to 1,024 simulated learners (``--sim-learners``) on a noisy quadratic with a known
   optimum, ``f(x) = 1/2 sum_i h_i (x_i - 1)^2`` (d = 64, curvatures h_i in [0.05, 1],
   gradient noise 0.5 / sqrt(16)). Time is in units of the measured learner time of
   ``--sim-model`` (default the CNN); the actor's service times and round trips are that
   model's measured ones, in the same units. Learner times are log-normal with mean 1 and
   shape ``--sigma`` (default 0.8: an assumption of heavy tails, not a measurement; part 1
   reports the spread measured here). Learners come and go: in the middle third of the
   horizon every odd learner leaves after its push; in the last third they return, four per
   push. Reported per strategy and N: final error relative to the start, mean / p99 applied
   staleness, updates per unit time, dropped gradients, mean queue wait of pulls and pushes.

The model (parts 3 and 4)
-------------------------
The actor is one first-come-first-served server. Request ``i`` of kind k (learner pull,
push, rollout pull) reaches it at ``a_i`` and is served for the constant ``s_k``:
``begin_i = max(a_i, end_(i-1))``, ``end_i = begin_i + s_k``, queue wait
``W_i = begin_i - a_i``. The rest of a call's round trip, ``d_k = max(rtt_k - s_k, 0)``
(client, transport), does not occupy the actor (``rtt_k``: in part 3 the N = 1 latency, in
part 4 part 2's round trip): half of it is spent before arrival and half after service, so
a call's latency is ``d_k + W_i + s_k``. A learner's cycle is: send a pull; when it returns,
compute for ``C`` (fixed in part 3; log-normal in part 4); send a push; when it returns, send
the next pull. A strategy that does not admit a learner yet (SSP) leaves it waiting until the
next push, when its pull is sent again. A synchronous strategy's learners pull again only
after the update. With ``--rollout-pulls`` r (part 4 only; default 1: one trajectory per
learner task), every push is followed by r rollout pulls at the actor. The version a pull
returns and the staleness of a push (version when served minus version pulled, as
``PushAck.staleness``) follow from the order of service. One actor thus serves at most
``1 / (s_pull + s_push + r s_rollout)`` learner tasks per second; below that, N learners
make ``N / (C + rtt_pull + rtt_push)`` pushes per second, so it saturates near
``N* = (C + rtt_pull + rtt_push) / (s_pull + s_push + r s_rollout)``. Assumptions: constant
service times (their measured means), no other load on the
actor (evaluations, checkpoints, heartbeats), compute that does not slow the actor down.

Running it
----------
::

    python benchmarks/simulate_scale.py                    # everything, ~10 min on 2 cores
    python benchmarks/simulate_scale.py --quick --measure-s 2 --learners 2 4 \\
        --sim-learners 1 4 16 --horizon 5 --out /tmp/simulate_scale_smoke

``--inputs results.json`` takes the measured inputs of parts 1 and 2 from an earlier run's JSON
instead of measuring them again. Writes ``benchmarks/results/simulate_scale.{json,md,png}``
(``--out`` sets the stem): every setting, seed and measured input, part 3's model vs
measurement table and part 4's simulated table.
"""

from __future__ import annotations

import argparse
import heapq
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dask_rl.staleness import (  # noqa: E402
    Arrival,
    AsyncConfig,
    SoftsyncConfig,
    SSPConfig,
    StellarisConfig,
    SyncConfig,
    make_strategy,
)

STRATEGIES = {"sync": SyncConfig(), "async": AsyncConfig(), "ssp": SSPConfig(bound=4),
              "softsync": SoftsyncConfig(n=4), "stellaris": StellarisConfig(),
              # the paper's v = 3 damps a 1,000-version-stale gradient only to 1/10; v = 1
              # (alpha0 / delta, like n-softsync) is the setting for very many learners
              "stellaris-v1": StellarisConfig(smoothness=1.0)}
DIM = 64
PIPELINES = {"mlp": ("MLP 64x64 (CartPole PPO)", HERE.parent / "pipelines" / "ppo_cartpole.yaml"),
             "cnn": ("Nature CNN (Atari PPO)", HERE.parent / "pipelines" / "ppo_pong.yaml")}
KINDS = ("pull", "push", "rollout_pull")
# how learners reach the actor -> (call combining, Adam moments kept by the learners):
# uncombined, moments with the actor (the path before combining); combined (training's
# default); combined-local (learner.optimizer_state = local)
PATHS = {"uncombined": (False, False), "combined": (True, False),
         "combined-local": (True, True)}


# ---- the model -------------------------------------------------------------------------------
class Quadratic:
    """``f(x) = 1/2 sum_i h_i (x_i - 1)^2`` with noisy gradients."""

    def __init__(self, rng: np.random.Generator):
        self.h = np.linspace(0.05, 1.0, DIM)
        self.opt = np.ones(DIM)
        self.rng = rng

    def error(self, x: np.ndarray) -> float:
        return float(0.5 * np.sum(self.h * (x - self.opt) ** 2))

    def gradient(self, x: np.ndarray, batch: int = 16) -> np.ndarray:
        noise = self.rng.normal(0, 0.5 / np.sqrt(batch), DIM)
        return self.h * (x - self.opt) + noise


class FifoActor:
    """The parameter actor as one first-come-first-served server.

    Requests must be offered in order of arrival (the event loop pops them in time order), so
    that ``begin = max(arrival, previous end)`` is first-come-first-served.
    """

    def __init__(self) -> None:
        self.free = 0.0
        self.log: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}

    def serve(self, kind: str, arrival: float, service: float) -> tuple[float, float]:
        """Queue a request; returns when its service begins and ends."""
        begin = max(arrival, self.free)
        self.free = begin + service
        self.log[kind].append((arrival, begin, self.free))
        return begin, self.free


def simulate(strategy: str, n: int, *, horizon: float, lr: float = 0.2, pull_s: float = 0.0,
             push_s: float = 0.0, rollout_pull_s: float = 0.0, rollout_pulls: int = 0,
             pull_delay: float = 0.0, push_delay: float = 0.0, compute: float = 1.0,
             sigma: float = 0.8, churn: bool = True, warmup: float = 0.0, seed: int = 0,
             service_s: float | None = None) -> dict:
    """``n`` learners against one FIFO parameter actor for ``horizon`` time units.

    Parameters
    ----------
    strategy
        A key of :data:`STRATEGIES`; the real strategy decides what becomes of each push.
    n
        Learners at the start.
    horizon
        Simulated time; events after it are not run.
    lr
        Step size on the quadratic.
    pull_s, push_s, rollout_pull_s
        The actor's service time of a learner pull, a push and a rollout pull.
    rollout_pulls
        Rollout pulls queued at the actor after every push.
    pull_delay, push_delay
        The part of a call's round trip outside the actor (``rtt - s``); half before arrival,
        half after service.
    compute
        Mean learner compute time between a pull's return and the push's send.
    sigma
        Log-normal shape of the compute time; 0 makes it fixed.
    churn
        Learners leave in the middle third of the horizon and return in the last third.
    warmup
        Pulls and pushes that complete before this time are left out of the means and rates.
    seed
        Seeds the compute times and the gradient noise.
    service_s
        Older name of ``push_s`` (``stellaris_threshold.py`` passes it).

    Returns
    -------
    dict
        ``updates``, ``updates_per_time``, ``pushes_per_time`` (pushes returned in the window,
        per unit time), ``pull_wait_mean``, ``push_wait_mean``, ``rollout_pull_wait_mean``,
        ``pull_latency_mean``, ``push_latency_mean``, ``arrival_staleness_mean`` (every push,
        as ``PushAck.staleness``), ``staleness_mean`` / ``_p99`` / ``_max`` (applied gradients
        only), ``actor_busy_share``, ``final_error`` (relative to the start), the strategy's
        metrics and the inputs.
    """
    if service_s is not None:
        push_s = service_s
    rng = np.random.default_rng(seed)
    problem = Quadratic(rng)
    s = make_strategy(STRATEGIES[strategy], learners=n)
    actor = FifoActor()
    x = np.zeros(DIM)
    start_error = problem.error(x)
    versions = {0: x.copy()}
    gradients: dict[int, np.ndarray] = {}
    arrival_staleness: dict[int, int] = {}
    applied_staleness: list[int] = []  # exact values; the strategies' histogram caps at 31
    active = np.ones(n, bool)
    held: dict[int, int] = {}
    events: list[tuple[float, int, str, int]] = []  # (time, order, kind, learner)
    order = 0
    # completed calls: (time the caller has the answer, queue wait[, staleness])
    pulls_done: list[tuple[float, float]] = []
    pushes_done: list[tuple[float, float, int]] = []
    blocked: list[int] = []  # learners a read gate (SSP) has not admitted yet
    waiting_for_update: list[int] = []  # a synchronous baseline's learners
    updates, gid = 0, 0
    mu = -0.5 * sigma**2  # log-normal with mean 1

    def schedule(t: float, kind: str, learner: int) -> None:
        nonlocal order
        heapq.heappush(events, (t, order, kind, learner))
        order += 1

    def send_pull(learner: int, t: float) -> None:
        schedule(t + pull_delay / 2, "pull", learner)

    def apply(decision) -> None:
        nonlocal x, updates
        for i in decision.drop:
            gradients.pop(i, None)
            arrival_staleness.pop(i, None)
        if decision.apply:
            applied_staleness.extend(arrival_staleness.pop(i) for i, _ in decision.apply)
            x = x - lr * sum(w * gradients.pop(i) for i, w in decision.apply)
            versions[s.version] = x.copy()
            updates += 1

    for i in range(n):
        send_pull(i, 0.0)
    while events:
        t, _, kind, learner = heapq.heappop(events)
        if t > horizon:
            break
        if kind == "pull":
            begin, end = actor.serve("pull", t, pull_s)
            back = end + pull_delay / 2
            pulls_done.append((back, begin - t))
            if not s.admit(f"L{learner}"):
                blocked.append(learner)
                continue
            held[learner] = s.version
            s.on_learner_started(f"L{learner}", s.version)
            c = compute * (rng.lognormal(mu, sigma) if sigma > 0 else 1.0)
            schedule(back + c + push_delay / 2, "push", learner)
            continue
        # a push
        begin, end = actor.serve("push", t, push_s)
        back = end + push_delay / 2
        for _ in range(rollout_pulls):  # the rollouts feeding the next learner tasks
            actor.serve("rollout_pull", t, rollout_pull_s)
        v = held.pop(learner)
        gradients[gid] = problem.gradient(versions[v])
        version_before = s.version
        arrival_staleness[gid] = version_before - v
        pushes_done.append((back, begin - t, version_before - v))
        decisions = s.on_gradient(Arrival(gid, f"L{learner}", v))
        gid += 1
        for d in decisions:
            apply(d)
        keep = set(held.values()) | {s.version}  # versions someone still holds (memory)
        for old in [k for k in versions if k not in keep]:
            del versions[old]
        if churn and horizon / 3 <= t < 2 * horizon / 3 and learner % 2 == 1:
            active[learner] = False  # it leaves after its push
            for d in s.on_learner_lost(f"L{learner}"):  # nothing to wait for from it
                apply(d)
        elif s.synchronous:
            waiting_for_update.append(learner)
            if s.version != version_before:
                for w in waiting_for_update:
                    send_pull(w, back)
                waiting_for_update.clear()
        else:
            send_pull(learner, back)
        if churn and t >= 2 * horizon / 3:  # learners that left come back
            for other in np.flatnonzero(~active)[:4]:
                active[other] = True
                send_pull(int(other), t)
        waiting, blocked[:] = list(blocked), []
        for b in waiting:  # a refused learner asks again
            send_pull(b, back)
        if gid % n == 0:  # a round: about one gradient per learner
            s.on_round_end()

    window = horizon - warmup
    pulls = [p for p in pulls_done if warmup <= p[0] <= horizon]
    pushes = [p for p in pushes_done if warmup <= p[0] <= horizon]
    rollout_waits = [b - a for a, b, _ in actor.log["rollout_pull"] if warmup <= a <= horizon]
    busy = sum(min(e, horizon) - max(b, warmup) for k in KINDS for _, b, e in actor.log[k]
               if e > warmup and b < horizon)
    values = np.asarray(applied_staleness)
    return {"strategy": strategy, "learners": n, "updates": updates,
            "updates_per_time": updates / horizon, "gradients": gid,
            "dropped": s.stats.dropped,
            "pushes_per_time": len(pushes) / window,
            "pull_wait_mean": _mean([w for _, w in pulls]),
            "push_wait_mean": _mean([w for _, w, _ in pushes]),
            "rollout_pull_wait_mean": _mean(rollout_waits),
            "pull_latency_mean": pull_delay + pull_s + _mean([w for _, w in pulls]),
            "push_latency_mean": push_delay + push_s + _mean([w for _, w, _ in pushes]),
            "arrival_staleness_mean": _mean([st for _, _, st in pushes]),
            "staleness_mean": float(values.mean()) if len(values) else 0.0,
            "staleness_p99": float(np.percentile(values, 99)) if len(values) else 0.0,
            "staleness_max": int(values.max()) if len(values) else 0,
            "actor_busy_share": busy / window,
            "final_error": problem.error(x) / start_error,
            "strategy_metrics": {k: v for k, v in s.metrics().items()
                                 if not isinstance(v, list)},
            "inputs": {"horizon": horizon, "lr": lr, "pull_s": pull_s, "push_s": push_s,
                       "rollout_pull_s": rollout_pull_s, "rollout_pulls": rollout_pulls,
                       "pull_delay": pull_delay, "push_delay": push_delay,
                       "compute": compute, "sigma": sigma, "churn": churn, "warmup": warmup,
                       "seed": seed}}


def _mean(xs) -> float:
    return float(np.mean(xs)) if len(xs) else 0.0


# ---- part 1: learner task time -----------------------------------------------------------------
def measure_learner_time(model: str, *, warmup: int, repeats: int, device: str,
                         seed: int) -> dict:
    """Seconds of one real PPO update of ``model`` ("mlp" or "cnn") on a real trajectory.

    Parameters
    ----------
    model
        A key of :data:`PIPELINES`.
    warmup, repeats
        Updates run first and not timed; updates timed.
    device
        ``learner.device`` override (``cpu`` by default: this machine).
    seed
        The pipeline's seed and the collector's.

    Returns
    -------
    dict
        The times of every repeat, their mean, median and coefficient of variation, the
        parameter count, the samples per update and the effective config.
    """
    import torch

    from dask_rl.api import resolve
    from dask_rl.config import public_dict
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model
    from dask_rl.roles.collector import Collector
    from dask_rl.roles.learner import Learner
    from dask_rl.runtime.parameter_actor import ParameterActor

    torch.set_num_threads(1)  # a learner task on a 1-thread worker (RunState's default)
    name, pipeline = PIPELINES[model]
    overrides = [f"seed={seed}", f"learner.device={device}"]
    cfg = resolve(pipeline, overrides)
    spaces = env_spaces(cfg.env)
    params = get_flat(make_model(*spaces, cfg.model, seed=cfg.seed))
    actor = ParameterActor(params, cfg.aggregation)
    collector = Collector(cfg, seed=seed)
    collector.load(actor.pull())
    t0 = time.perf_counter()
    traj = collector.collect(cfg.rollout.steps)
    collect_s = time.perf_counter() - t0
    collector.close()
    learner = Learner(cfg, *spaces)
    times = []
    for k in range(warmup + repeats):
        snapshot = actor.pull(learner_id="L", learner_state=True)
        t0 = time.perf_counter()
        update = learner.update(snapshot, traj, lr=cfg.learner.lr, seed=k)
        elapsed = time.perf_counter() - t0
        actor.push(update.delta, update.version, "L", opt_state=update.opt_state)
        if k >= warmup:
            times.append(elapsed)
    x = np.asarray(times)
    return {"model": name, "pipeline": str(pipeline.relative_to(HERE.parent)),
            "overrides": overrides, "config": public_dict(cfg), "params": int(params.size),
            "samples": int(traj.env_steps), "collect_s": collect_s, "warmup": warmup,
            "repeats": repeats, "times_s": times, "mean_s": float(x.mean()),
            "median_s": float(np.median(x)),
            "cv": float(x.std(ddof=1) / x.mean()) if len(x) > 1 else None,
            "torch_threads": 1, "device": device}


# ---- part 2: service times -------------------------------------------------------------------
def _payload(size: int, seed: int, local: bool) -> tuple[np.ndarray, dict | None]:
    """A push's delta and Adam moments (what a learner sends), ``size`` floats each; no
    moments when they stay with the learner (``local``)."""
    rng = np.random.default_rng(seed)
    delta = (1e-6 * rng.standard_normal(size)).astype(np.float32)
    opt = None if local else {"m": np.zeros(size, np.float32),
                              "v": np.zeros(size, np.float32), "t": 1}
    return delta, opt


def _service_task(actor, size: int, calls: int, in_flight: int, local: bool) -> dict:
    """On the learners' worker: per call kind, the round trip of one call at a time and the
    wall time per call with ``in_flight`` threads calling at once (the service time), each
    call made as a learner task makes it (``ActorHandle.call``, combined or not as the
    handle says)."""
    import contextvars
    import itertools
    import threading

    from dask_rl.runtime import combiner

    delta, opt = _payload(size, 0, local)
    # one push with Adam moments first, so that learner pulls carry them as in training
    actor.call("push", delta, 0, "prime", opt_state=opt, seq=-1)
    seqs = itertools.count()

    def one(kind: str, i: int):
        if kind == "pull":
            return actor.call("pull_learner", f"L{i % 64}", opt_state=not local)
        if kind == "push":
            return actor.call("push", delta, 0, f"L{i % 64}", opt_state=opt, seq=next(seqs))
        return actor.call("pull", newer_than=-1)

    out = {}
    per_thread = max(calls // in_flight, 1)
    for kind in KINDS:
        for i in range(3):  # warm-up
            one(kind, i)
        t0 = time.perf_counter()
        for i in range(calls):
            one(kind, i)
        rtt = (time.perf_counter() - t0) / calls
        errors: list[BaseException] = []

        def body(j: int) -> None:
            try:
                for i in range(per_thread):
                    one(kind, j * per_thread + i)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)

        # each thread runs in a copy of this task's context, so that it knows its worker
        # (``get_worker``) and its calls take the handle's path (combined or not), as a
        # learner task's do
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(body, j))
                   for j in range(in_flight)]
        before = _trips(combiner, actor.key)
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if errors:
            raise errors[0]
        sent, trips = (a - b for a, b in zip(_trips(combiner, actor.key), before))
        out[kind] = {"service_s": wall / (per_thread * in_flight), "rtt_s": rtt,
                     "calls_per_trip": sent / trips if trips else None}
    return out


def _trips(combiner, key: str) -> tuple[int, int]:
    """Calls and trips of this process's combiner of calls to the actor ``key``."""
    counts = combiner.counts(key)
    return counts["calls"], counts["trips"]


def _math_only(size: int, aggregation, repeats: int, local: bool) -> dict:
    """Seconds of each call's method alone, called in this process (no Dask)."""
    from dask_rl.runtime.parameter_actor import ParameterActor

    actor = ParameterActor(np.zeros(size, np.float32), aggregation, learners=64)
    delta, opt = _payload(size, 0, local)
    actor.push(delta, 0, "prime", opt_state=opt)
    calls = {"pull": lambda i: actor.pull_learner(f"L{i % 64}", opt_state=not local),
             "push": lambda i: actor.push(delta, 0, f"L{i % 64}", opt_state=opt),
             "rollout_pull": lambda i: actor.pull(newer_than=-1)}
    out = {}
    for kind, call in calls.items():
        call(0)
        t0 = time.perf_counter()
        for i in range(repeats):
            call(i)
        out[kind] = (time.perf_counter() - t0) / repeats
    return out


# ---- part 3: real learners -------------------------------------------------------------------
def _learner_loop(actor, learner_id: str, seq0: int, size: int, compute_s: float,
                  start_at: float, stop_at: float, local: bool) -> list[tuple]:
    """One learner: pull, sleep ``compute_s``, push, until ``stop_at`` (wall clock)."""
    delta, opt = _payload(size, seq0, local)
    time.sleep(max(0.0, start_at - time.time()))
    rows, seq = [], seq0
    while time.time() < stop_at:
        t0 = time.time()
        snapshot = actor.call("pull_learner", learner_id, opt_state=not local)
        t1 = time.time()
        if snapshot is None:  # not admitted (SSP only); the benchmark's async admits all
            continue
        time.sleep(compute_s)
        t2 = time.time()
        ack = actor.call("push", delta, snapshot.version, learner_id, opt_state=opt, seq=seq)
        t3 = time.time()
        seq += 1
        rows.append((t0, t1, t2, t3, int(ack.staleness), ack.status))
    return rows


def _new_actor(client, worker: str, size: int, aggregation, learners: int, path: str):
    from dask_rl.runtime.handle import ActorHandle
    from dask_rl.runtime.parameter_actor import ParameterActor

    future = client.submit(ParameterActor, np.zeros(size, np.float32), aggregation,
                           learners=learners, actor=True, pure=False, workers=[worker])
    return future, ActorHandle(future.result(), timeout=120.0, combine=PATHS[path][0])


def measure_real_learners(client, actor_worker: str, learner_worker: str, *, n: int,
                          size: int, aggregation, compute_s: float, warmup_s: float,
                          window_s: float, path: str) -> dict:
    """N learner loops against a fresh actor; pushes/s, latencies and staleness in the window
    after the warm-up."""
    future, actor = _new_actor(client, actor_worker, size, aggregation, n, path)
    start_at = time.time() + 1.5 + 0.02 * n  # every task is running by then
    stop_at = start_at + warmup_s + window_s
    loops = [client.submit(_learner_loop, actor, f"L{i}", i * 10**7, size, compute_s,
                           start_at, stop_at, PATHS[path][1], pure=False,
                           workers=[learner_worker])
             for i in range(n)]
    results = client.gather(loops)
    client.cancel([future])
    late = sum(1 for rows in results if rows and rows[0][0] > start_at + 0.05)
    begin = start_at + warmup_s
    pulls = [r[1] - r[0] for rows in results for r in rows if begin <= r[1] <= stop_at]
    cycles = [r for rows in results for r in rows if begin <= r[3] <= stop_at]
    pushes = [r[3] - r[2] for r in cycles]
    return {"learners": n, "path": path, "pushes": len(cycles),
            "pushes_per_s": len(cycles) / window_s,
            "pull_latency_s": _mean(pulls), "push_latency_s": _mean(pushes),
            "staleness_mean": _mean([r[4] for r in cycles]),
            "compute_s_nominal": compute_s,
            "compute_s_measured": _mean([r[2] - r[1] for r in cycles]),
            "statuses": {st: sum(1 for r in cycles if r[5] == st)
                         for st in {r[5] for r in cycles}},
            "late_starts": late}


def _rel(model: float, measured: float) -> float | None:
    return (model - measured) / measured if measured else None


def compare(measured: dict, service: dict, baseline: dict, *, warmup_s: float,
            window_s: float, seed: int) -> dict:
    """The model with a real run's N and compute time, the MLP's service times and the N = 1
    run's latencies as round trips; returns the measurement (with its queue waits: latency
    minus the N = 1 latency), the model's figures and the relative errors."""
    measured = {**measured,
                "pull_wait_s": measured["pull_latency_s"] - baseline["pull_latency_s"],
                "push_wait_s": measured["push_latency_s"] - baseline["push_latency_s"]}
    s = {k: service[k]["service_s"] for k in ("pull", "push")}
    d = {k: max(baseline[f"{k}_latency_s"] - s[k], 0.0) for k in ("pull", "push")}
    m = simulate("async", measured["learners"], horizon=warmup_s + window_s,
                 pull_s=s["pull"], push_s=s["push"], pull_delay=d["pull"],
                 push_delay=d["push"], compute=measured["compute_s_measured"], sigma=0.0,
                 churn=False, warmup=warmup_s, seed=seed)
    model = {"pushes_per_s": m["pushes_per_time"], "pull_latency_s": m["pull_latency_mean"],
             "push_latency_s": m["push_latency_mean"], "pull_wait_s": m["pull_wait_mean"],
             "push_wait_s": m["push_wait_mean"], "staleness_mean": m["arrival_staleness_mean"],
             "actor_busy_share": m["actor_busy_share"]}
    errors = {k: _rel(model[k], measured[k]) for k in model if k in measured}
    return {"learners": measured["learners"], "path": measured["path"], "measured": measured,
            "model": model,
            "relative_error": errors, "model_inputs": m["inputs"]}


# ---- driver ----------------------------------------------------------------------------------
def measure_learner_times(args: argparse.Namespace) -> dict:
    """Part 1: the learner time of both models."""
    learner = {}
    for key in PIPELINES:
        warmup, repeats = ((1, args.repeats) if key == "mlp"
                           else (args.cnn_warmup, args.cnn_repeats))
        t0 = time.perf_counter()
        learner[key] = measure_learner_time(key, warmup=warmup, repeats=repeats,
                                            device=args.device, seed=args.seed)
        print(f"learner time, {learner[key]['model']}: {learner[key]['mean_s']:.3f} s mean "
              f"over {repeats} ({learner[key]['params']:,} params, "
              f"{learner[key]['samples']} samples; {time.perf_counter() - t0:.0f} s)",
              flush=True)
    return learner


def measure_service(client, actor_worker: str, learner_worker: str, learner: dict,
                    args: argparse.Namespace) -> dict:
    """Part 2: the actor's service times and round trips of both models on every path
    (``{path: {model: ...}}``), called from the learners' worker."""
    from dask_rl.config import from_dict

    service: dict = {}
    for path in args.paths:
        service[path] = {}
        local = PATHS[path][1]
        for key, lt in learner.items():
            aggregation = from_dict(lt["config"]).aggregation
            future, actor = _new_actor(client, actor_worker, lt["params"], aggregation, 64,
                                       path)
            calls = args.calls if key == "mlp" else max(args.calls // 5, 2 * args.in_flight)
            dask = client.submit(_service_task, actor, lt["params"], calls, args.in_flight,
                                 local, pure=False, workers=[learner_worker]).result()
            client.cancel([future])
            math = _math_only(lt["params"], aggregation, max(calls // 3, 5), local)
            service[path][key] = {"model": lt["model"], "params": lt["params"], "calls": calls,
                                  "in_flight": args.in_flight, "aggregation": str(aggregation),
                                  **{k: {**dask[k], "math_s": math[k]} for k in KINDS}}
            print(f"actor service time, {path}, {lt['model']}: "
                  + ", ".join(f"{k} {dask[k]['service_s'] * 1e3:.2f} ms (rtt "
                              f"{dask[k]['rtt_s'] * 1e3:.2f}, math {math[k] * 1e3:.3f})"
                              for k in KINDS), flush=True)
    return service


def saturation(learner: dict, service: dict, rollout_pulls: int,
               cluster_learners: int) -> list[dict]:
    """The model's saturation point of one actor, per path and model (a prediction; part 3
    checks it for the MLP), and the share of a cluster of ``cluster_learners`` learners that
    one actor keeps busy."""
    rows = []
    for path, per_model in service.items():
        for key, lt in learner.items():
            sv = per_model[key]
            per_task = sv["pull"]["service_s"] + sv["push"]["service_s"] \
                + rollout_pulls * sv["rollout_pull"]["service_s"]
            cycle = lt["mean_s"] + sv["pull"]["rtt_s"] + sv["push"]["rtt_s"]
            n_star = cycle / per_task
            rows.append({"path": path, "model": lt["model"], "params": lt["params"],
                         "learner_s": lt["mean_s"], "actor_s_per_task": per_task,
                         "rollout_pulls": rollout_pulls, "max_tasks_per_s": 1 / per_task,
                         "learners_at_saturation": n_star,
                         "cluster_learners": cluster_learners,
                         "cluster_share_served": min(1.0, n_star / cluster_learners)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="few repeats and calls (a smoke run): see the defaults below")
    ap.add_argument("--inputs", help="take parts 1-2 (learner and service times) from this "
                                     "results JSON instead of measuring them")
    ap.add_argument("--repeats", type=int, help="timed MLP updates (20; quick 3)")
    ap.add_argument("--cnn-repeats", type=int, help="timed CNN updates (5; quick 1)")
    ap.add_argument("--cnn-warmup", type=int, help="untimed CNN updates first (1; quick 0)")
    ap.add_argument("--device", default="cpu", help="learner.device of part 1")
    ap.add_argument("--calls", type=int,
                    help="actor calls per kind for the MLP, a fifth for the CNN (300; quick 30)")
    ap.add_argument("--in-flight", type=int, default=16,
                    help="threads calling at once when measuring a service time (16: a "
                         "combined trip's most calls)")
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS),
                    help="how learners reach the actor, measured side by side in parts 2-3")
    ap.add_argument("--sim-path", choices=list(PATHS), default="combined",
                    help="whose service times part 4 uses (combined: training's default)")
    ap.add_argument("--cluster-learners", type=int, default=1024,
                    help="the cluster size the saturation table is stated for")
    ap.add_argument("--learners", type=int, nargs="+", default=[2, 4, 8, 16, 32],
                    help="real learners of part 3")
    ap.add_argument("--measure-s", type=float, default=20.0,
                    help="measured window per N in part 3 (seconds)")
    ap.add_argument("--warmup-s", type=float, help="warm-up before the window (2; quick 0.5)")
    ap.add_argument("--compute-scale", type=float, default=1.0,
                    help="part 3's sleep = this x the MLP's measured learner time")
    ap.add_argument("--sim-learners", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024])
    ap.add_argument("--sim-model", choices=list(PIPELINES), default="cnn",
                    help="whose measured times part 4 uses")
    ap.add_argument("--horizon", type=float, default=60.0,
                    help="part 4, in learner times (learner mean = 1)")
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--sigma", type=float, default=0.8,
                    help="log-normal shape of part 4's learner times (an assumption)")
    ap.add_argument("--rollout-pulls", type=int, default=1,
                    help="rollout pulls per push in part 4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "simulate_scale"),
                    help="output stem: writes .json, .md and .png")
    args = ap.parse_args()
    for name, full, quick in (("repeats", 20, 3), ("cnn_repeats", 5, 1), ("cnn_warmup", 1, 0),
                              ("calls", 300, 30), ("warmup_s", 2.0, 0.5)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    t_start = time.perf_counter()

    import dask
    import distributed
    import torch
    from distributed import Client, LocalCluster

    from dask_rl.config import from_dict

    if args.sim_path not in args.paths:
        ap.error(f"--sim-path {args.sim_path} is not among --paths")
    if args.inputs:
        previous = json.loads(Path(args.inputs).read_text())
        learner, service = previous["learner_times"], previous["service_times"]
        missing = [p for p in args.paths if p not in service]
        if missing:
            ap.error(f"{args.inputs} has no service times for {', '.join(missing)} (an "
                     "older results file?): measure them again without --inputs")
        service = {p: service[p] for p in args.paths}
        source = f"read from {args.inputs}"
        print(f"measured inputs {source}")
    else:
        learner, service = measure_learner_times(args), {}
        source = "measured by this run"
    threads = max(args.learners)
    comparison = []
    with dask.config.set({"distributed.worker.profile.enabled": False}), \
            LocalCluster(n_workers=2, threads_per_worker=threads, processes=True,
                         dashboard_address=":0", silence_logs=50) as cluster, \
            Client(cluster) as client:
        actor_worker, learner_worker = sorted(client.scheduler_info()["workers"])
        if not service:
            service = measure_service(client, actor_worker, learner_worker, learner, args)
        aggregation = from_dict(learner["mlp"]["config"]).aggregation
        compute_s = args.compute_scale * learner["mlp"]["mean_s"]
        for n in [1] + [n for n in args.learners if n != 1]:  # N = 1 first: the calibration
            for path in args.paths:  # side by side at each N
                mlp = service[path]["mlp"]
                measured = measure_real_learners(
                    client, actor_worker, learner_worker, n=n, size=mlp["params"],
                    aggregation=aggregation, compute_s=compute_s, warmup_s=args.warmup_s,
                    window_s=args.measure_s, path=path)
                baseline = next((c["measured"] for c in comparison
                                 if c["path"] == path and c["learners"] == 1), measured)
                row = compare(measured, mlp, baseline, warmup_s=args.warmup_s,
                              window_s=args.measure_s, seed=args.seed)
                comparison.append(row)
                me, mo = row["measured"], row["model"]
                print(f"N={n:3d} real learners, {path:14s}: pushes/s "
                      f"{me['pushes_per_s']:7.1f} (model {mo['pushes_per_s']:7.1f}), staleness "
                      f"{me['staleness_mean']:5.2f} (model {mo['staleness_mean']:5.2f}), push "
                      f"wait {me['push_wait_s'] * 1e3:6.2f} ms (model "
                      f"{mo['push_wait_s'] * 1e3:6.2f})", flush=True)

    # part 4: simulated learners, in units of the simulated model's learner time
    unit = learner[args.sim_model]["mean_s"]
    sim = service[args.sim_path][args.sim_model]
    sim_inputs = {"model": learner[args.sim_model]["model"], "path": args.sim_path,
                  "time_unit_s": unit,
                  "pull_s": sim["pull"]["service_s"] / unit,
                  "push_s": sim["push"]["service_s"] / unit,
                  "rollout_pull_s": sim["rollout_pull"]["service_s"] / unit,
                  "rollout_pulls": args.rollout_pulls,
                  "pull_delay": max(sim["pull"]["rtt_s"] - sim["pull"]["service_s"], 0) / unit,
                  "push_delay": max(sim["push"]["rtt_s"] - sim["push"]["service_s"], 0) / unit,
                  "sigma": args.sigma, "horizon": args.horizon, "lr": args.lr,
                  "seed": args.seed, "churn": True}
    rows = []
    for n in args.sim_learners:
        for strategy in STRATEGIES:
            t0 = time.perf_counter()
            r = simulate(strategy, n, horizon=args.horizon, lr=args.lr,
                         pull_s=sim_inputs["pull_s"], push_s=sim_inputs["push_s"],
                         rollout_pull_s=sim_inputs["rollout_pull_s"],
                         rollout_pulls=args.rollout_pulls,
                         pull_delay=sim_inputs["pull_delay"],
                         push_delay=sim_inputs["push_delay"], sigma=args.sigma,
                         seed=args.seed)
            r["run_s"] = time.perf_counter() - t0
            rows.append(r)
            print(f"N={n:5d} {strategy:12s} (simulated): staleness {r['staleness_mean']:7.2f} "
                  f"(p99 {r['staleness_p99']:6.1f}), updates/t {r['updates_per_time']:8.1f}, "
                  f"dropped {r['dropped']:6d}, error {r['final_error']:.3g} "
                  f"({r['run_s']:.1f} s)", flush=True)

    sat = saturation(learner, service, args.rollout_pulls, args.cluster_learners)
    md = _markdown(learner, service, source, comparison, rows, sat, sim_inputs, args)
    print()
    print(md)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(md + "\n")
    settings = {**vars(args), "strategies": {k: str(v) for k, v in STRATEGIES.items()},
                "quadratic": {"dim": DIM, "curvatures": [0.05, 1.0], "noise": 0.5 / 4},
                "cluster": {"kind": "LocalCluster", "n_workers": 2,
                            "threads_per_worker": threads, "processes": True,
                            "actor_worker": "worker A, alone",
                            "learners": "long-running tasks on worker B"},
                "part3_compute_s": args.compute_scale * learner["mlp"]["mean_s"],
                "part3_learners_run": [1] + [n for n in args.learners if n != 1],
                "part3_round_trips": "latencies of the N = 1 run (calibration)",
                "versions": {"python": platform.python_version(), "numpy": np.__version__,
                             "torch": torch.__version__, "distributed": distributed.__version__},
                "machine": platform.platform(), "wall_s": time.perf_counter() - t_start}
    out.with_suffix(".json").write_text(json.dumps(
        {"settings": settings, "inputs_source": source, "learner_times": learner,
         "service_times": service, "saturation_model": sat, "real_vs_model": comparison,
         "simulation": {"label": "simulated learners on a synthetic objective",
                        "inputs": sim_inputs, "rows": rows}}, indent=1, default=str))
    from stats import record_commit
    record_commit(out.with_suffix(".json"))
    _plot(rows, comparison, out.with_suffix(".png"))
    print(f"\nwrote {out.with_suffix('.json')}, .md, .png "
          f"({time.perf_counter() - t_start:.0f} s)")
    return 0


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.0f}%"


def _markdown(learner: dict, service: dict, source: str, comparison: list, rows: list,
              sat: list, sim_inputs: dict, args: argparse.Namespace) -> str:
    lines = [f"Inputs ({source}): learner task time of one PPO update (1 torch thread) and the "
             "parameter actor's service time per call through Dask actor calls, per path "
             "(uncombined: one call per message, Adam moments with the actor, the path before "
             "combining; combined: call combining, training's default; combined-local: and "
             "learner.optimizer_state = local): wall time per call with "
             f"{args.in_flight} threads calling at once; rtt: one call at a time; math: the "
             "method alone, in-process.", "",
             "| path | model | params | learner s (mean) | CV | pull ms (rtt, math) | "
             "push ms (rtt, math) | rollout pull ms (rtt, math) | calls per trip |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path, per_model in service.items():
        for key, lt in learner.items():
            sv = per_model[key]
            cells = [f"{sv[k]['service_s'] * 1e3:.2f} ({sv[k]['rtt_s'] * 1e3:.2f}, "
                     f"{sv[k]['math_s'] * 1e3:.3f})" for k in KINDS]
            cv = "n/a" if lt.get("cv") is None else f"{lt['cv']:.2f}"
            trips = " / ".join("—" if sv[k].get("calls_per_trip") is None
                               else f"{sv[k]['calls_per_trip']:.1f}" for k in KINDS)
            lines.append(f"| {path} | {lt['model']} | {lt['params']:,} | {lt['mean_s']:.3f} | "
                         f"{cv} | " + " | ".join(cells) + f" | {trips} |")
    lines += ["", "One actor's saturation in the model (a prediction; the next table checks it "
              "for the MLP): actor seconds per learner task = pull + push + "
              f"{args.rollout_pulls} rollout pull(s); the last column is the share of a "
              f"{args.cluster_learners:,}-learner cluster one actor keeps busy.", "",
              "| path | model | actor ms per task | max learner tasks/s | learners at "
              f"saturation | share of {args.cluster_learners:,} learners |",
              "|---|---|---|---|---|---|"]
    for r in sat:
        lines.append(f"| {r['path']} | {r['model']} | {r['actor_s_per_task'] * 1e3:.2f} | "
                     f"{r['max_tasks_per_s']:.0f} | {r['learners_at_saturation']:.0f} | "
                     f"{r['cluster_share_served']:.1%} |")
    compute = args.compute_scale * learner["mlp"]["mean_s"]
    lines += ["", f"Real learners vs the model (MLP actor, {args.measure_s:g} s window after "
              f"{args.warmup_s:g} s warm-up; compute = sleep of {compute * 1e3:.1f} ms; wait = "
              "mean latency - that at N = 1 on the same path; error = (model - measured) / "
              "measured; N = 1 calibrates the model's round trips, so it matches by "
              "construction; the model serves one call at a time, which combining is not):", "",
              "| N | path | pushes/s measured | model | error | pull wait ms measured | model | "
              "push wait ms measured | model | staleness measured | model | error |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in comparison:
        me, mo, er = c["measured"], c["model"], c["relative_error"]
        lines.append(f"| {c['learners']} | {c['path']} | {me['pushes_per_s']:.1f} | "
                     f"{mo['pushes_per_s']:.1f} | {_pct(er['pushes_per_s'])} | "
                     f"{me['pull_wait_s'] * 1e3:.2f} | {mo['pull_wait_s'] * 1e3:.2f} | "
                     f"{me['push_wait_s'] * 1e3:.2f} | {mo['push_wait_s'] * 1e3:.2f} | "
                     f"{me['staleness_mean']:.2f} | {mo['staleness_mean']:.2f} | "
                     f"{_pct(er['staleness_mean'])} |")
    lines += ["", f"Simulated learners on a noisy quadratic (not measured runs): time in units "
              f"of the {sim_inputs['model']}'s measured learner time "
              f"({sim_inputs['time_unit_s']:.3f} s); actor service per pull / push / rollout "
              f"pull {sim_inputs['pull_s']:.2e} / {sim_inputs['push_s']:.2e} / "
              f"{sim_inputs['rollout_pull_s']:.2e} units (measured, path "
              f"{sim_inputs['path']}); learner times log-normal, sigma {args.sigma:g} "
              f"(assumed); horizon {args.horizon:g}.", "",
              "| learners | strategy | mean staleness | p99 | updates / unit | dropped | "
              "pull wait (units) | push wait (units) | final error (rel.) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['learners']} | {r['strategy']} | {r['staleness_mean']:.2f} | "
                     f"{r['staleness_p99']:.0f} | {r['updates_per_time']:.1f} | {r['dropped']} "
                     f"| {r['pull_wait_mean']:.4f} | {r['push_wait_mean']:.4f} | "
                     f"{r['final_error']:.3g} |")
    return "\n".join(lines)


def _plot(rows: list[dict], comparison: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (c, a, b) = plt.subplots(1, 3, figsize=(17, 4))
    for route in dict.fromkeys(r["path"] for r in comparison):
        mine = [r for r in comparison if r["path"] == route]
        ns = [r["learners"] for r in mine]
        line, = c.plot(ns, [r["measured"]["pushes_per_s"] for r in mine], marker="o",
                       label=f"{route}: measured")
        c.plot(ns, [r["model"]["pushes_per_s"] for r in mine], marker="x", ls="--",
               color=line.get_color(), label=f"{route}: model")
    c.set_xscale("log", base=2)
    c.set_xlabel("real learners (MLP actor)")
    c.set_title("pushes/s: measured vs model")
    c.grid(alpha=0.3)
    c.legend(fontsize=8)
    for strategy in STRATEGIES:
        mine = [r for r in rows if r["strategy"] == strategy]
        sim_ns = [r["learners"] for r in mine]
        a.plot(sim_ns, [max(r["final_error"], 1e-6) for r in mine], marker="o", label=strategy)
        b.plot(sim_ns, [max(r["staleness_mean"], 1e-2) for r in mine], marker="o",
               label=strategy)
    for ax, title in ((a, "simulated: final error / initial error"),
                      (b, "simulated: mean staleness (versions)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("simulated learners")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
