"""Call combining on a real LocalCluster: learners on one worker process push to the actor on
another through ActorHandle; concurrent calls share trips, every push is taken exactly once,
and each gradient is charged the staleness of its own pulled version."""

import time

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)

LEARNERS, PUSHES = 8, 25


def _learner(actor, i: int, pushes: int, size: int, start_at: float) -> list[tuple[int, object]]:
    """One learner task: pull and push ``pushes`` times; every (version pulled, ack)."""
    delta = np.full(size, 1e-3, np.float32)
    time.sleep(max(0.0, start_at - time.time()))
    out = []
    for j in range(pushes):
        snap = actor.call("pull_learner", f"L{i}")
        out.append((snap.version, actor.call("push", delta, snap.version, f"L{i}",
                                             seq=i * 1000 + j)))
    return out


def _counts(key: str) -> dict:
    from dask_rl.runtime import combiner

    return combiner.counts(key)


def test_concurrent_pushes_share_trips_and_each_is_taken_once_with_its_own_staleness():
    from distributed import Client, LocalCluster

    from dask_rl.runtime.handle import ActorHandle
    from dask_rl.runtime.parameter_actor import ParameterActor
    from dask_rl.staleness import AsyncConfig

    size = 5000
    with LocalCluster(n_workers=2, threads_per_worker=LEARNERS, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as client:
        actor_worker, learner_worker = sorted(client.scheduler_info()["workers"])
        future = client.submit(ParameterActor, np.zeros(size, np.float32),
                               AsyncConfig(alpha0=1.0), learners=LEARNERS, actor=True,
                               workers=[actor_worker])
        actor = ActorHandle(future.result(), timeout=60)
        start_at = time.time() + 1.0  # every learner task running by then
        tasks = [client.submit(_learner, actor, i, PUSHES, size, start_at, pure=False,
                               workers=[learner_worker]) for i in range(LEARNERS)]
        rows = [row for rows in client.gather(tasks) for row in rows]
        counts = client.run(_counts, actor.key, workers=[learner_worker])[learner_worker]
        metrics = actor.call("metrics")
        params = actor.call("pull").params

    total = LEARNERS * PUSHES
    assert len(rows) == total
    assert all(ack.status == "applied" for _, ack in rows)
    # exactly once: every push taken once, one version each (async), nothing refused
    assert metrics["actor/pushes"] == total and metrics["pushes/distinct"] == total
    assert metrics["pushes/refused"] == 0 and metrics["version"] == total
    assert sorted(ack.version for _, ack in rows) == list(range(1, total + 1))
    np.testing.assert_allclose(params, -1e-3 * total, rtol=1e-4)
    # each gradient is charged its own staleness: the version it was applied on minus the
    # version its learner pulled (async applies each push as one update)
    assert all(ack.staleness == ack.version - 1 - pulled for pulled, ack in rows)
    assert max(ack.staleness for _, ack in rows) > 0  # the learners did overlap
    # every push and learner pull went through the combiner, and they shared trips
    assert counts["by_method"] == {"push": total, "pull_learner": total}
    assert counts["calls"] == 2 * total and counts["trips"] < total, counts
