"""What the driver's thread no longer waits for: results fetched on the client's event loop
(``InFlight``) and records sent to the scheduler in the background (``EventSender``), on a
real in-process scheduler and worker."""

import threading
import time

import pytest
from distributed import Client, LocalCluster

from dask_rl.runtime.events import EventSender
from dask_rl.runtime.inflight import InFlight


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as c:
        yield c


def _report(x, delay=0.0):
    time.sleep(delay)
    return {"x": x}


def _fails():
    raise ValueError("boom")


def _taken(inflight, n, timeout=10.0):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += inflight.wait_some(0.5)
    return got


def test_a_result_is_in_hand_when_the_driver_takes_its_future(client):
    inflight = InFlight(client)
    futures = [client.submit(_report, i, 0.05 * i, pure=False) for i in range(3)]
    for f in futures:
        inflight.hold(f, "learner", lambda r, t: None)
    got = _taken(inflight, 3)
    assert set(got) == set(futures)
    assert got == sorted(got, key=futures.index)   # in the order they ended
    for i, f in enumerate(futures):
        assert inflight.fetched(f) == (True, {"x": i})
        assert inflight.fetched(f) is None   # taken once


def test_a_future_kept_where_it_lies_is_not_fetched_and_a_failure_is_not_a_result(client):
    inflight = InFlight(client)
    kept = client.submit(_report, 1, pure=False)
    failed = client.submit(_fails, pure=False)
    inflight.hold(kept, "rollout", lambda r, t: None, fetch=False)
    inflight.hold(failed, "learner", lambda r, t: None)
    assert set(_taken(inflight, 2)) == {kept, failed}
    assert inflight.fetched(kept) is None
    assert inflight.fetched(failed) is None and failed.status == "error"


def test_a_dropped_or_cleared_future_never_comes_back(client):
    inflight = InFlight(client)
    slow = client.submit(_report, 1, 0.3, pure=False)
    cleared = client.submit(_report, 2, 0.3, pure=False)
    kept = client.submit(_report, 3, 0.6, pure=False)
    inflight.hold(slow, "learner", lambda r, t: None)
    inflight.hold(cleared, "learner", lambda r, t: None)
    inflight.hold(kept, "learner", lambda r, t: None)
    inflight.drop([slow])
    del inflight.tasks[cleared]
    assert _taken(inflight, 1) == [kept]
    assert inflight.fetched(slow) is None


def test_records_reach_the_scheduler_in_order_without_the_caller_waiting(client):
    sender = EventSender(client)
    caller = threading.get_ident()
    seen_on = []
    real = client.scheduler.log_event

    async def log_event(**kw):   # where each call to the scheduler is made
        seen_on.append(threading.get_ident())
        return await real(**kw)

    client.scheduler.log_event = log_event
    try:
        for i in range(50):
            sender.send("dask-rl-test-order", {"i": i})
        assert sender.flush(10)
    finally:
        del client.scheduler.log_event
    assert [m["i"] for _, m in client.get_events("dask-rl-test-order")] == list(range(50))
    assert seen_on and caller not in seen_on   # the event loop's thread sent them
    assert sender.lost == 0


def test_records_the_scheduler_cannot_take_are_counted_as_lost():
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as c:
        sender = EventSender(c)

        async def gone(**kw):
            raise OSError("the scheduler is gone")

        c.scheduler.log_event = gone
        sender.send("dask-rl-test-lost", {"i": 0})
        sender.send("dask-rl-test-lost", {"i": 1})
        assert sender.flush(10)
        assert sender.lost == 2
