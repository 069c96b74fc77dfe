"""The accounting every fault test checks: exactly-once pushes, counters that agree, every
trajectory and env step counted once, every rollback counted (test_faults, test_recovery)."""

import collections
import json
from pathlib import Path

import numpy as np

from dask_rl.checkpoint import CheckpointStore
from dask_rl.data.metrics import read_metrics
from dask_rl.policy import find_store


def check_run(run_dir: Path, summary: dict, budget: str = "env_steps") -> list[dict]:
    """The run ended on its ``budget`` (``env_steps`` or ``wall_s``) with its ``summary.json``,
    and every push, update, trajectory, env step and rollback is accounted for; returns the
    run's records."""
    s = summary
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for key in ("stop_reason", "updates", "recoveries", "gradients_applied", "pushes_refused"):
        assert on_disk[key] == s[key], (key, on_disk[key], s[key])
    assert s["stop_reason"] == budget, s
    records = read_metrics(run_dir / "metrics.jsonl")

    # exactly once: what the final actor holds (its checkpoint, written after the last push)
    state, _ = CheckpointStore(find_store(run_dir)[0]).load()
    actor = state["actor"]
    strategy = actor["strategy"]
    stats = strategy["stats"]
    distinct = len(np.asarray(actor["seen"]))
    assert distinct > 0
    # every push taken reached the strategy once: a repeat would arrive without a new number
    assert stats["arrived"] == distinct - int(actor["rejected"]), \
        (stats, distinct, actor["refused"])
    assert stats["applied"] + stats["dropped"] <= stats["arrived"], stats
    # the version is the number of updates the strategy made, and the summary says so
    assert int(actor["version"]) == int(strategy["version"]) == stats["updates"] \
        == s["updates"], (actor["version"], stats, s["updates"])
    assert s["gradients_applied"] == stats["applied"], (s, stats)
    assert s["pushes_refused"] == int(actor["refused"]), (s, actor["refused"])

    # what every recovery rolled back is counted, and never beyond its checkpoint
    recoveries = [r for r in records if r["kind"] == "recovery"]
    assert len(recoveries) == s["recoveries"], (recoveries, s)
    assert all(r["version"] <= r["version_lost"] for r in recoveries), recoveries
    assert s["updates_discarded"] == sum(max(r["version_lost"] - r["version"], 0)
                                         for r in recoveries), (s, recoveries)
    assert s["env_steps_discarded"] == sum(max(r["env_steps_discarded"], 0)
                                           for r in recoveries), (s, recoveries)

    learners = [r for r in records if r["kind"] == "learner"]
    if not learners:  # ES: no learner tasks, no trajectories
        return records
    # each learner (its push's sequence number) reported once
    repeats = [k for k, n in collections.Counter(r["learner"] for r in learners).items() if n > 1]
    assert not repeats, repeats
    # learners learned on versions that existed: after a recovery, the new actor's (from its
    # checkpoint's version on), never the lost actor's newer ones
    bounds = [(r["time"], r["version"]) for r in recoveries]
    for r in learners:
        floor = max((v for t, v in bounds if t < r["time"]), default=0)
        assert floor <= r["version_pulled"] <= r["version_after"], (r, bounds)
    # every trajectory learned from or dropped, every env step counted once
    batch = learners[0]["trajectory_steps"]
    assert s["trajectories_produced"] == s["trajectories_consumed"] + s["dropped_trajectories"], s
    assert s["env_steps_collected"] == s["trajectories_produced"] * batch, s
    assert s["env_steps"] == s["trajectories_consumed"] * batch, s
    assert sum(r["trajectory_steps"] for r in learners if not r["replay"]) == s["env_steps"], s
    return records
