"""A simulation of 1 to 1,024 asynchronous learners: staleness, waste, error, saturation.

This machine has 2 cores, so many learners are *simulated*, honestly labelled as such: a
discrete-event model drives the real sans-IO aggregation strategies (``dask_rl.staleness``)
with N learners on a noisy quadratic with a known optimum, ``f(x) = 1/2 sum_i h_i (x_i - 1)^2``
(d = 64, curvatures h_i in [0.05, 1], gradient noise 0.5 / sqrt(batch)). Each learner pulls
the current version, computes for a heavy-tailed time (log-normal, mean 1 time unit, sigma 0.8
— the shape of learner-task times measured on busy clusters), pushes, and pulls again. The
number of active learners changes over time (all, then half, then all again: actors leave and
return). The parameter actor is a single-server queue whose service time per push is measured
here, through Dask actor calls to a real ``ParameterActor`` on a worker process (its update
math alone is reported beside it), for an MLP (CartPole) and the Nature CNN (Atari); the
simulation uses the CNN's, in units of its learner-task time, so that saturation shows within
1,024 learners. One actor saturates at ``gradients/s = 1 / service time``, i.e. at
``learners = learner time / service time``; sharding the parameters over k actors divides the
service time by k.

    python benchmarks/simulate_scale.py

Prints a table (mean / p99 staleness, updates per time unit, dropped gradients, final error
relative to the start) for N in {1, 4, 16, 64, 256, 1024} and every strategy; writes
``benchmarks/results/simulate_scale.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import heapq
import json
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
# (parameters, seconds of one learner task measured on this machine's CPU)
MODELS = {"MLP 64x64 (CartPole PPO)": (10_000, 0.045),
          "Nature CNN (Atari PPO)": (1_700_000, 2.5)}
SIMULATED = "Nature CNN (Atari PPO)"


class Quadratic:
    def __init__(self, rng: np.random.Generator):
        self.h = np.linspace(0.05, 1.0, DIM)
        self.opt = np.ones(DIM)
        self.rng = rng

    def error(self, x: np.ndarray) -> float:
        return float(0.5 * np.sum(self.h * (x - self.opt) ** 2))

    def gradient(self, x: np.ndarray, batch: int = 16) -> np.ndarray:
        noise = self.rng.normal(0, 0.5 / np.sqrt(batch), DIM)
        return self.h * (x - self.opt) + noise


def simulate(strategy: str, n: int, *, horizon: float, lr: float, service_s: float,
             seed: int = 0) -> dict:
    """One run of ``n`` learners for ``horizon`` time units (learner mean time = 1)."""
    rng = np.random.default_rng(seed)
    problem = Quadratic(rng)
    s = make_strategy(STRATEGIES[strategy], learners=n)
    x = np.zeros(DIM)
    start_error = problem.error(x)
    versions = {0: x.copy()}
    gradients: dict[int, np.ndarray] = {}
    arrival_staleness: dict[int, int] = {}
    applied_staleness: list[int] = []  # exact values; the strategies' histogram caps at 31
    active = np.ones(n, bool)
    events: list[tuple[float, int]] = []  # (time, learner)
    held: dict[int, int] = {}

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

    blocked: list[int] = []  # learners a read gate (SSP) has not admitted yet

    def start(learner: int, now: float) -> None:
        if not s.admit(f"L{learner}"):
            blocked.append(learner)
            return
        held[learner] = s.version
        s.on_learner_started(f"L{learner}", s.version)
        latency = rng.lognormal(mean=-0.32, sigma=0.8)  # mean ~1
        heapq.heappush(events, (now + latency, learner))

    def retry_blocked(now: float) -> None:
        waiting, blocked[:] = list(blocked), []
        for b in waiting:
            start(b, now)

    for i in range(n):
        start(i, 0.0)
    # a synchronous baseline's learners wait for the round's update before pulling again
    waiting_for_update: list[int] = []
    actor_free = 0.0
    waits, updates, gid = [], 0, 0
    while events:
        t, learner = heapq.heappop(events)
        if t > horizon:
            break
        # actors leave in the middle third: half the learners stop after their push
        phase_half = horizon / 3 <= t < 2 * horizon / 3
        # the parameter actor serves one push at a time
        begin = max(t, actor_free)
        waits.append(begin - t)
        actor_free = begin + service_s
        v = held.pop(learner)
        gradients[gid] = problem.gradient(versions[v])
        version_before = s.version
        arrival_staleness[gid] = version_before - v
        decisions = s.on_gradient(Arrival(gid, f"L{learner}", v))
        gid += 1
        for d in decisions:
            apply(d)
        # keep only versions someone still holds (memory)
        keep = set(held.values()) | {s.version}
        for old in [k for k in versions if k not in keep]:
            del versions[old]
        if phase_half and learner % 2 == 1:
            active[learner] = False
            for d in s.on_learner_lost(f"L{learner}"):  # nothing to wait for from it
                apply(d)
            continue
        if s.synchronous:
            waiting_for_update.append(learner)
            if s.version != version_before:
                for w in waiting_for_update:
                    start(w, begin + service_s)
                waiting_for_update.clear()
        else:
            start(learner, max(begin + service_s, t))
        # learners that left come back in the last third
        if t >= 2 * horizon / 3:
            for other in np.flatnonzero(~active)[:4]:
                active[other] = True
                start(int(other), t)
        retry_blocked(max(begin + service_s, t))
        if gid % n == 0:  # a round: about one gradient per learner
            s.on_round_end()
    values = np.asarray(applied_staleness)
    return {"strategy": strategy, "learners": n, "updates": updates,
            "updates_per_time": updates / horizon, "gradients": gid,
            "dropped": s.stats.dropped,
            "staleness_mean": float(values.mean()) if len(values) else 0.0,
            "staleness_p99": float(np.percentile(values, 99)) if len(values) else 0.0,
            "staleness_max": int(values.max()) if len(values) else 0,
            "actor_wait_mean": float(np.mean(waits)) if waits else 0.0,
            "final_error": problem.error(x) / start_error,
            "strategy_metrics": {k: v for k, v in s.metrics().items()
                                 if not isinstance(v, list)}}


def measure_service_time(size: int, repeats: int = 200) -> float:
    """Seconds the real ParameterActor spends on one push (async strategy) of ``size`` floats."""
    from dask_rl.runtime.parameter_actor import ParameterActor

    actor = ParameterActor(np.zeros(size, np.float32), AsyncConfig(alpha0=0.01))
    g = np.random.default_rng(0).normal(size=size).astype(np.float32)
    for i in range(5):
        actor.push(g, actor.current.version, "w")
    t0 = time.perf_counter()
    for i in range(repeats):
        actor.push(g, actor.current.version, "L")
    return (time.perf_counter() - t0) / repeats


def measure_dask_service_time(size: int, pushes: int = 300, in_flight: int = 32) -> float:
    """Seconds per push through Dask: a real ParameterActor on a worker process, pushes sent
    as actor calls (gradient over the wire, as learners send them) with ``in_flight`` of them
    outstanding, so the actor's worker is the bottleneck. An upper bound on its service time:
    the sending client shares this machine's two cores."""
    from distributed import Client, LocalCluster

    from dask_rl.runtime.parameter_actor import ParameterActor

    g = np.random.default_rng(0).normal(size=size).astype(np.float32)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as c:
        actor = c.submit(ParameterActor, np.zeros(size, np.float32), AsyncConfig(alpha0=0.01),
                         actor=True).result()
        for _ in range(5):
            actor.push(g, 0, "w").result()
        t0 = time.perf_counter()
        pending = []
        for i in range(pushes):
            pending.append(actor.push(g, 0, "L"))
            if len(pending) >= in_flight:
                pending.pop(0).result()
        for f in pending:
            f.result()
        return (time.perf_counter() - t0) / pushes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learners", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024])
    ap.add_argument("--horizon", type=float, default=60.0, help="time units (learner mean = 1)")
    ap.add_argument("--lr", type=float, default=0.2)

    ap.add_argument("--out", default=str(HERE / "results" / "simulate_scale"))
    args = ap.parse_args()

    math_only = {name: measure_service_time(size) for name, (size, _) in MODELS.items()}
    service = {name: measure_dask_service_time(size) for name, (size, _) in MODELS.items()}
    for name in MODELS:
        print(f"parameter-actor service time per push, {name}: {math_only[name] * 1e3:.3f} ms "
              f"of update math, {service[name] * 1e3:.3f} ms through Dask actor calls")
    # The simulated actor serves pushes as the Atari CNN's does, in units of its learner time,
    # so that its saturation shows within 1,024 learners.
    size, learner_s = MODELS[SIMULATED]
    service_units = service[SIMULATED] / learner_s
    rows = []
    for n in args.learners:
        for strategy in STRATEGIES:
            t0 = time.perf_counter()
            r = simulate(strategy, n, horizon=args.horizon, lr=args.lr,
                         service_s=service_units)
            rows.append(r)
            print(f"N={n:5d} {strategy:9s}: staleness {r['staleness_mean']:7.2f} "
                  f"(p99 {r['staleness_p99']:6.1f}), updates/t {r['updates_per_time']:8.1f}, "
                  f"dropped {r['dropped']:6d}, error {r['final_error']:.3g} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)

    saturation = []
    for name, s in service.items():
        size, learner_s = MODELS[name]
        for shards in (1, 4, 16):
            per_push = s / shards
            saturation.append({"model": name, "params": size, "learner_s": learner_s,
                               "shards": shards, "service_ms": per_push * 1e3,
                               "math_ms": math_only[name] / shards * 1e3,
                               "max_gradients_per_s": 1 / per_push,
                               "learners_at_saturation": learner_s / per_push})
    lines = ["| learners | strategy | mean staleness | p99 | updates / unit | dropped | "
             "actor queue wait (units) | final error (rel.) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['learners']} | {r['strategy']} | {r['staleness_mean']:.2f} | "
                     f"{r['staleness_p99']:.0f} | {r['updates_per_time']:.1f} | {r['dropped']} "
                     f"| {r['actor_wait_mean']:.4f} | {r['final_error']:.3g} |")
    lines += ["", "Parameter actor saturation (service time per push measured here through Dask "
              "actor calls, of which the update math is the next column; learner task times "
              "measured here; shards modelled as independent queues):", "",
              "| model | params | learner task s | shards | service ms / push | of it math ms | "
              "max gradients/s | learners at saturation |", "|---|---|---|---|---|---|---|---|"]
    for s in saturation:
        lines.append(f"| {s['model']} | {s['params']:,} | {s['learner_s']} | {s['shards']} | "
                     f"{s['service_ms']:.3f} | {s['math_ms']:.3f} | "
                     f"{s['max_gradients_per_s']:.0f} | "
                     f"{s['learners_at_saturation']:.0f} |")
    md = "\n".join(lines)
    print("\n(simulated learners on a synthetic objective; service times measured here)\n")
    print(md)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(md + "\n")
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "service_s": service,
                                                    "math_s": math_only,
                                                    "saturation": saturation,
                                                    "args": vars(args)}, indent=1))
    _plot(rows, out.with_suffix(".png"))
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for strategy in STRATEGIES:
        mine = [r for r in rows if r["strategy"] == strategy]
        ns = [r["learners"] for r in mine]
        a.plot(ns, [max(r["final_error"], 1e-6) for r in mine], marker="o", label=strategy)
        b.plot(ns, [max(r["staleness_mean"], 1e-2) for r in mine], marker="o", label=strategy)
    for ax, title in ((a, "final error / initial error"), (b, "mean staleness (versions)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("simulated learners")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Simulated asynchronous learners on a noisy quadratic (not measured runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
