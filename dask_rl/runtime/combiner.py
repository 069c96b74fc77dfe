"""Call combining: concurrent calls from one worker process to one actor travel as one.

A Dask actor call costs the actor's worker a message, a turn of its event loop and a hand-off
to the actor's thread, far more than the update math of a small model
(``benchmarks/parameter_service.py`` measures both). Learner and rollout tasks on one worker
process call the same parameter actor at once. A :class:`Combiner` sends a call at once when
no trip is on the wire (a caller alone waits no longer than before), and every call that
arrives while one is waits for the next trip, in which all of them travel together
(:meth:`~dask_rl.runtime.parameter_actor.ParameterActor.call_many`): pushes, learner pulls and
rollout pulls in one trip, in the order they were made, so a process has one trip on the wire,
not one per kind of call. Calls that carry large arrays (a big model's pushes: ~20 MB for a
Nature-CNN push with its Adam moments) take a lane of their own, with its own trips, so a
process's cheap pulls do not queue behind tens of megabytes on the wire. The actor serves a
trip's calls one by one (its pushes first, then its pulls, each in that order: the calls of a
trip come from different threads), under one hold of its lock, exactly as it would have
served them one at a time: each push keeps its own version, sequence number, staleness and
acknowledgement. No timer, no batch size to tune: the trips pace themselves by the actor's
round trip, and batches grow only when calls queue (Nagle-like "self-clocking").

The first caller waiting when a trip returns sends the next trip; so no thread sends for
others after its own call is answered. A call's ``timeout`` covers its wait and its trip: a
caller that gives up is withdrawn from the queue, one already chosen to send goes on and sends
with what is left of its time. A trip that fails fails its calls (each caller raises), and
the next trip goes regardless.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


@dataclass
class TripAnswers:
    """An actor's answers to one trip, ``(ok, value)`` per call, in one object: Dask
    serialises a list's items one by one, so pulls of one version would each carry the
    parameters; pickled whole, arrays shared by several answers travel once."""

    items: list[tuple[bool, Any]]


Call = tuple[str, tuple, dict]  # (method, args, kwargs) of one call


@dataclass(eq=False)
class _Waiter:
    call: Call
    event: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    answered: bool = False
    batch: list[_Waiter] | None = None  # set when this caller is to send that trip
    lane: int = 0  # 1: the lane of calls with large arrays

    @functools.cached_property
    def nbytes(self) -> int:
        """The bytes of the call's numpy arguments (and of arrays in a dict argument)."""
        return _nbytes((*self.call[1], *self.call[2].values()))


def _nbytes(values: tuple) -> int:
    total = 0
    for v in values:
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif isinstance(v, dict):
            total += _nbytes(tuple(v.values()))
    return total


class Combiner:
    """Combines concurrent calls into trips of at most ``max_batch`` calls and ``max_bytes``
    of arrays, with at most ``max_in_flight`` trips on the wire at once in each of two lanes:
    calls with ``large_call_bytes`` of arrays or more in one, the rest in the other.

    Parameters
    ----------
    send
        Sends one trip: ``send(calls, timeout)`` returns the calls' results in the same order
        (or raises an ``Exception``: every call of the trip then raises it).
    max_batch
        Calls per trip at most. Trips mix pushes and pulls, so they grow with every kind of
        call (``benchmarks/parameter_service.py``, MLP, 64 + 64: trips of a mixed 16 held the
        actor at 13-14k calls per second of its CPU, of 32 at 17.6k).
    max_bytes
        The numpy arrays' bytes a trip carries at most (its message's size: one Nature-CNN
        push with its Adam moments is ~20 MB); a call bigger than that travels alone.
    max_in_flight
        Trips on the wire at once. With 1 (the default), a caller that finds a trip on the
        wire waits for its round trip; with 2, two callers go side by side and batches form
        only behind two trips: a little less latency with few callers, smaller batches under
        load (``benchmarks/parameter_service.py``, MLP, 2 worker processes of callers: 64
        learners + 64 samplers made 2.0x the pushes/s of uncombined calls with 2 and 2.4-2.7x
        with 1; 4 + 4 made 0.92-0.96x with 1).
    large_call_bytes
        Calls carrying at least this many bytes of arrays travel in a lane of their own (one
        MB: an MLP's calls stay in one mixed lane, a Nature-CNN's pushes get their own). In
        one lane, a CNN's mixed trip of ~10 calls carried ~60 MB and every pull waited behind
        it (``benchmarks/parameter_service.py``, CNN, 64 + 64: sampler pull p50 630-780 ms).
    """

    def __init__(self, send: Callable[[list[Call], float | None], list[Any]], *,
                 max_batch: int = 32, max_bytes: int = 64 << 20, max_in_flight: int = 1,
                 large_call_bytes: int = 1 << 20):
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._send = send
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight
        self.large_call_bytes = large_call_bytes
        self._lock = threading.Lock()
        self._queues: tuple[list[_Waiter], list[_Waiter]] = ([], [])  # per lane
        self._in_flight = [0, 0]
        self.trips = 0  # counters: trips sent and calls made per method
        self.by_method: dict[str, int] = {}

    @property
    def calls(self) -> int:
        """Calls made through this combiner."""
        return sum(self.by_method.values())

    def call(self, call: Call, *, timeout: float | None = None) -> Any:
        """Make one call, ``(method, args, kwargs)``, through the combiner and wait for its
        result: ``timeout`` seconds at most in all, waiting and sending (the trip a caller
        sends gets what is left of its own time)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        me = _Waiter(call)
        me.lane = int(me.nbytes >= self.large_call_bytes)
        with self._lock:
            self.by_method[call[0]] = self.by_method.get(call[0], 0) + 1
            self._queues[me.lane].append(me)
            batch = self._take(me.lane)
        if batch is None:  # wait: for an answer, or to be chosen to send a trip
            if not me.event.wait(seconds_left(deadline)):
                self._give_up(me)
            if me.answered:
                return self._outcome(me)
            batch = me.batch
        assert batch is not None and me in batch  # a sender always carries its own call
        self._trip(batch, seconds_left(deadline))
        return self._outcome(me)

    def _take(self, lane: int) -> list[_Waiter] | None:
        """Under the lock: the lane's next trip's calls, if one may go now."""
        queue = self._queues[lane]
        if not queue or self._in_flight[lane] >= self.max_in_flight:
            return None
        self._in_flight[lane] += 1
        self.trips += 1
        n, size = 1, queue[0].nbytes
        while n < min(self.max_batch, len(queue)) and size + queue[n].nbytes <= self.max_bytes:
            size += queue[n].nbytes
            n += 1
        batch = queue[:n]
        del queue[:n]
        return batch

    @staticmethod
    def _outcome(waiter: _Waiter) -> Any:
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    def _give_up(self, me: _Waiter) -> None:
        with self._lock:
            if me.event.is_set():  # answered or chosen just now: go on as if in time
                return
            if me in self._queues[me.lane]:
                self._queues[me.lane].remove(me)
        raise TimeoutError("a combined call to the parameter actor was not answered in time")

    def _trip(self, batch: list[_Waiter], timeout: float | None) -> None:
        lane = batch[0].lane
        interrupted: BaseException | None = None
        try:
            results = self._send([w.call for w in batch], timeout)
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for {len(batch)} combined calls")
            for w, r in zip(batch, results):
                w.result = r
        except Exception as exc:  # every call of the trip fails with the trip
            for w in batch:
                w.error = exc
        except BaseException as exc:  # e.g. KeyboardInterrupt: the sender's own, not theirs
            interrupted = exc
            for w in batch:
                w.error = RuntimeError("the thread sending this combined call was interrupted")
        finally:
            with self._lock:
                for w in batch:
                    w.answered = True
                    w.event.set()
                self._in_flight[lane] -= 1
                nxt = self._take(lane)
                if nxt is not None:  # the first caller of the next trip sends it
                    nxt[0].batch = nxt
                    nxt[0].event.set()
        if interrupted is not None:
            raise interrupted


def seconds_left(deadline: float | None) -> float | None:
    """Seconds to ``deadline`` (None: no deadline), at least a little."""
    return None if deadline is None else max(deadline - time.monotonic(), 1e-3)


_registry: dict[tuple, Combiner] = {}
_registry_lock = threading.Lock()


def counts(key: str) -> dict[str, Any]:
    """Calls made (in all and per method) and trips sent by this process's combiner of calls
    to the actor ``key`` (what benchmarks and tests read to see that calls shared trips)."""
    with _registry_lock:  # combiner_for keeps one per key: its current incarnation's
        c = next((c for (k, _), c in _registry.items() if k == key), None)
        if c is None:
            return {"calls": 0, "trips": 0, "by_method": {}}
        return {"calls": c.calls, "trips": c.trips, "by_method": dict(c.by_method)}


def combiner_for(key: str, incarnation: tuple, make: Callable[[], Combiner]) -> Combiner:
    """This process's combiner of calls to the actor ``key`` in its ``incarnation`` (its
    address and epoch: a key can come back, a later driver's actor elsewhere), made on first
    use; combiners of the key's other incarnations go."""
    with _registry_lock:
        combiner = _registry.get((key, incarnation))
        if combiner is None:
            for old in [k for k in _registry if k[0] == key and k[1] != incarnation]:
                del _registry[old]
            combiner = _registry[(key, incarnation)] = make()
        return combiner
