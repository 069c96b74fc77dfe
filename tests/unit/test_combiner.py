"""Call combining (dask_rl.runtime.combiner) with plain threads, and the parameter actor's
batched calls against the same calls made one at a time."""

import threading
import time

import numpy as np
import pytest

from dask_rl.runtime.combiner import Combiner
from dask_rl.runtime.parameter_actor import ParameterActor
from dask_rl.staleness import AsyncConfig, StellarisConfig


class GatedServer:
    """A send function that records its trips; the first trip waits for ``gate``, so that the
    test can queue calls behind it in a known order."""

    def __init__(self, fail_trip: int | None = None, gated: int = 1):
        self.gate = threading.Event()
        self.fail_trip, self.gated = fail_trip, gated
        self.trips: list[list[int]] = []
        self.timeouts: list[float | None] = []
        self.lock = threading.Lock()

    def __call__(self, calls, timeout=None):
        with self.lock:
            self.trips.append([args[0] for _, args, _ in calls])
            self.timeouts.append(timeout)
            n = len(self.trips)
        if n <= self.gated:
            self.gate.wait(10)
        if n == self.fail_trip:
            raise ConnectionError("the actor went away")
        return [args[0] * 10 for _, args, _ in calls]


def _queue_calls(combiner, values, timeout=None):
    """Start one thread per value, each only once the previous one's call is in the
    combiner (so arrival order is the order of ``values``)."""
    results, errors, threads = {}, {}, []

    def one(v):
        try:
            results[v] = combiner.call(("f", (v,), {}), timeout=timeout)
        except Exception as exc:  # noqa: BLE001
            errors[v] = exc

    for v in values:
        before = combiner.calls
        t = threading.Thread(target=one, args=(v,))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 10
        while combiner.calls == before and time.monotonic() < deadline:
            time.sleep(0.001)
    return results, errors, threads


def _queue_array_calls(combiner, sizes):
    """Like :func:`_queue_calls`, each call ``("push", (v, array of sizes[v] bytes))``."""
    results, threads = {}, []
    for v, n in sizes.items():  # each thread's call in the combiner before the next starts
        before = combiner.calls

        def one(v=v, n=n):
            results[v] = combiner.call(("push", (v, np.zeros(n, np.uint8)), {}))
        threads.append(threading.Thread(target=one))
        threads[-1].start()
        while combiner.calls == before:
            time.sleep(0.001)
    return results, threads


def _join(threads):
    for t in threads:
        t.join(10)
        assert not t.is_alive()


def test_a_call_alone_goes_at_once_in_a_trip_of_its_own():
    server = GatedServer()
    server.gate.set()
    c = Combiner(server, max_in_flight=1)
    assert c.call(("f", (7,), {})) == 70
    assert c.call(("f", (8,), {})) == 80
    assert server.trips == [[7], [8]] and c.trips == 2 and c.calls == 2


def test_calls_that_queue_behind_a_trip_travel_together_in_arrival_order():
    server = GatedServer()
    c = Combiner(server, max_batch=16, max_in_flight=1)
    results, errors, threads = _queue_calls(c, range(20))
    server.gate.set()
    _join(threads)
    assert not errors
    assert results == {v: 10 * v for v in range(20)}  # each caller gets its own answer
    # the first went alone and at once; the 19 queued behind it went in two trips (16 at
    # most), in the order they arrived
    assert server.trips == [[0], list(range(1, 17)), [17, 18, 19]]


def test_a_trip_carries_at_most_max_bytes_of_arrays_and_a_bigger_call_goes_alone():
    class Server(GatedServer):
        def __call__(self, calls, timeout=None):
            with self.lock:
                self.trips.append([args[0] for _, args, _ in calls])
                n = len(self.trips)
            if n == 1:
                self.gate.wait(10)
            return [0 for _ in calls]

    server = Server()
    c = Combiner(server, max_batch=16, max_bytes=1000)
    sizes = {0: 10, 1: 400, 2: 400, 3: 400, 4: 2000, 5: 100, 6: 100}  # bytes of each call
    results, threads = _queue_array_calls(c, sizes)
    server.gate.set()
    _join(threads)
    assert len(results) == 7
    # 400 + 400 fit 1000, a third would not; the 2000-byte call goes alone; 100 + 100 after
    assert server.trips == [[0], [1, 2], [3], [4], [5, 6]]


def test_calls_with_large_arrays_take_their_own_lane_and_small_calls_pass_them():
    class Server(GatedServer):  # trips whose first call is 0 or 1 wait for the gate
        def __call__(self, calls, timeout=None):
            values = [args[0] for _, args, _ in calls]
            with self.lock:
                self.trips.append(values)
            if values[0] in (0, 1):
                self.gate.wait(10)
            return [v * 10 for v in values]

    server = Server()
    c = Combiner(server, max_batch=16, large_call_bytes=1000)
    sizes = {0: 5000, 1: 10, 2: 5000, 3: 10, 4: 20, 5: 5000}  # bytes of each call's array
    results, threads = _queue_array_calls(c, sizes)
    deadline = time.monotonic() + 10
    while len(server.trips) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    # the large call 0 and the small call 1 are on the wire side by side, one per lane; each
    # lane's later calls queue behind its own trip only
    assert sorted(server.trips) == [[0], [1]] and not results
    server.gate.set()
    _join(threads)
    assert results == {v: 10 * v for v in sizes}
    assert sorted(server.trips[2:]) == [[2, 5], [3, 4]]


def test_a_failed_trip_fails_its_calls_only_and_the_next_trip_still_goes():
    server = GatedServer(fail_trip=2)
    c = Combiner(server, max_batch=4, max_in_flight=1)
    results, errors, threads = _queue_calls(c, range(8))
    server.gate.set()
    _join(threads)
    assert server.trips == [[0], [1, 2, 3, 4], [5, 6, 7]]
    assert set(errors) == {1, 2, 3, 4}
    assert all(isinstance(e, ConnectionError) for e in errors.values())
    assert results == {0: 0, 5: 50, 6: 60, 7: 70}
    assert c.call(("f", (99,), {})) == 990  # nothing left stuck


def test_two_trips_go_side_by_side_and_calls_queue_only_behind_both():
    server = GatedServer(gated=2)
    c = Combiner(server, max_in_flight=2)
    results, errors, threads = _queue_calls(c, range(6))
    deadline = time.monotonic() + 10
    while len(server.trips) < 2 and time.monotonic() < deadline:  # both senders arrived
        time.sleep(0.001)
    # calls 0 and 1 went at once, each alone; 2-5 waited behind them for one trip
    assert sorted(server.trips) == [[0], [1]] and not results
    server.gate.set()
    _join(threads)
    assert not errors and results == {v: 10 * v for v in range(6)}
    assert sorted(server.trips[:2]) == [[0], [1]] and server.trips[2:] == [[2, 3, 4, 5]]


def test_a_caller_that_gives_up_is_withdrawn_and_nothing_hangs():
    server = GatedServer()
    c = Combiner(server, max_in_flight=1)
    results, errors, threads = _queue_calls(c, [0], timeout=5)  # the sender, held
    r2, e2, t2 = _queue_calls(c, [1, 2, 3], timeout=0.05)
    _join(t2)
    assert set(e2) == {1, 2, 3} and all(isinstance(e, TimeoutError) for e in e2.values())
    server.gate.set()
    _join(threads)
    assert results == {0: 0} and server.trips == [[0]]  # the withdrawn were never sent
    assert c.call(("f", (5,), {})) == 50 and server.trips[-1] == [5]


@pytest.mark.parametrize("aggregation", [AsyncConfig(alpha0=0.5), StellarisConfig(alpha0=1.0)])
def test_a_batch_is_served_exactly_as_the_same_calls_one_by_one(aggregation):
    """The staleness each gradient is charged, its weight, its status and the parameters
    after are the same whether the calls come one at a time or combined in trips."""
    alone = ParameterActor(np.zeros(6, np.float32), aggregation, learners=4)
    combined = ParameterActor(np.zeros(6, np.float32), aggregation, learners=4)
    rng = np.random.default_rng(0)
    calls = []  # (method, args, kwargs): learners pull, then push on what they pulled
    versions = {}
    for step in range(24):
        lid = f"L{step % 4}"
        if lid not in versions:
            calls.append(("pull_learner", (lid,), {}))
            versions[lid] = True
        else:
            delta = rng.standard_normal(6).astype(np.float32)
            calls.append(("push", (delta, int(rng.integers(0, 1 + step // 4)), lid),
                          {"seq": step}))
            del versions[lid]
    one_by_one = [None] * len(calls)
    for i in range(0, len(calls), 5):  # a trip's pushes first, then its pulls, one by one
        trip = list(range(i, min(i + 5, len(calls))))
        for j in [j for j in trip if calls[j][0] == "push"] + \
                [j for j in trip if calls[j][0] != "push"]:
            m, a, k = calls[j]
            one_by_one[j] = getattr(alone, m)(*a, **k)
    batched = []
    for i in range(0, len(calls), 5):  # trips of five consecutive calls, methods mixed
        batched += [v for ok, v in combined.call_many(calls[i:i + 5]).items]
    assert any(len({m for m, _, _ in calls[i:i + 5]}) > 1 for i in range(0, len(calls), 5))
    for x, y in zip(one_by_one, batched):
        if hasattr(x, "staleness"):
            assert (x.status, x.version, x.staleness, x.weight) == \
                (y.status, y.version, y.staleness, y.weight)
        else:
            assert (x is None) == (y is None)
            if x is not None:
                assert x.version == y.version
    np.testing.assert_array_equal(alone.pull().params, combined.pull().params)
    assert alone.metrics()["actor/pushes"] == combined.metrics()["actor/pushes"]


def test_a_call_that_raises_in_a_batch_fails_alone():
    a = ParameterActor(np.zeros(2, np.float32), AsyncConfig())
    out = a.call_many([("push", (np.ones(2, np.float32), 0, "A"), {}),
                       ("push", (np.ones(2, np.float32), 0, "B"), {"no_such_arg": 1}),
                       ("push", (np.ones(2, np.float32), 1, "C"), {})]).items
    assert [ok for ok, _ in out] == [True, False, True]
    assert isinstance(out[1][1], TypeError)
    assert out[2][1].status == "applied" and a.pull().version == 2
    with pytest.raises(ValueError, match="not combined"):
        a.call_many([("pull", (), {}), ("state_dict", (), {})])


def test_the_sender_spends_what_is_left_of_its_own_time():
    server = GatedServer()
    c = Combiner(server)
    results, errors, threads = _queue_calls(c, [0], timeout=5)  # held at the gate
    r2, e2, t2 = _queue_calls(c, [1], timeout=2.0)
    time.sleep(0.3)
    server.gate.set()
    _join(threads + t2)
    assert r2 == {1: 10} and server.trips == [[0], [1]]
    assert server.timeouts[0] == pytest.approx(5, abs=0.2)
    assert 1.0 < server.timeouts[1] < 1.8  # 2 s less the ~0.3 s it waited in the queue


def test_an_interrupted_sender_fails_its_trip_and_frees_the_next():
    class Interrupting:
        trips = 0

        def __call__(self, calls, timeout=None):
            self.trips += 1
            if self.trips == 1:
                raise KeyboardInterrupt
            return [args[0] for _, args, _ in calls]

    c = Combiner(Interrupting())
    with pytest.raises(KeyboardInterrupt):  # the sender's own interruption, re-raised
        c.call(("f", (1,), {}))
    assert c.call(("f", (2,), {})) == 2  # nothing left in flight


def test_a_trip_of_pulls_carries_the_parameters_once():
    """Dask pickles a list's items one by one; the answers travel as one object, so pulls
    of one version share one copy of the parameters on the wire."""
    from distributed.protocol import dumps, to_serialize

    a = ParameterActor(np.random.default_rng(0).standard_normal(50_000).astype(np.float32),
                       AsyncConfig())

    def wire(x):
        return sum(len(frame) for frame in dumps({"result": to_serialize(x)}))

    one = wire(a.call_many([("pull", (), {})]))
    eight = a.call_many([("pull", (), {})] * 8)
    learners = a.call_many([("pull_learner", (f"L{i}",), {}) for i in range(8)])
    mixed = a.call_many([("pull", (), {}), ("pull_learner", ("L9",), {})] * 4)
    assert wire(eight) < 1.1 * one and wire(learners) < 1.1 * one and wire(mixed) < 1.1 * one
    # pushes between the pulls: served first, so the pulls share the newest version
    delta = np.full(50_000, 1e-3, np.float32)
    around = a.call_many([c for i in range(4) for c in
                          (("pull", (), {}), ("push", (delta, 0, f"P{i}"), {}))])
    assert [ok for ok, _ in around.items] == [True] * 8
    pulls = [v for _, v in around.items[0::2]]
    assert {p.version for p in pulls} == {a.pull().version}  # after all four pushes
    assert wire(around) < 1.1 * one
    assert wire(eight.items) > 7 * one  # what a plain list would have cost


def test_an_actor_key_that_comes_back_elsewhere_gets_a_new_combiner():
    from dask_rl.runtime.combiner import _registry, combiner_for

    def make():
        return Combiner(GatedServer())

    first = combiner_for("parameter-actor-0-run", ("tcp://a", "0-x"), make)
    assert combiner_for("parameter-actor-0-run", ("tcp://a", "0-x"), make) is first
    again = combiner_for("parameter-actor-0-run", ("tcp://c", "0-y"), make)
    assert again is not first  # a later driver's actor of the same name, on another worker
    assert not [k for k in _registry if k[0] == "parameter-actor-0-run" and k[1][0] == "tcp://a"]
