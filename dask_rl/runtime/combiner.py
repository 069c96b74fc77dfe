"""Call combining: concurrent calls of one kind from one worker process travel as one.

A Dask actor call costs the actor's worker a message, a turn of its event loop and a hand-off
to the actor's thread, far more than the update math of a small model
(``benchmarks/parameter_service.py`` measures both). Learner and rollout tasks on one worker
process call the same parameter actor at once. A :class:`Combiner` sends a call at once when
no trip is on the wire (a caller alone waits no longer than before), and every call that
arrives while one is waits for the next trip, in which all of them travel together
(:meth:`~dask_rl.runtime.parameter_actor.ParameterActor.call_many`). The actor serves a trip's
calls one by one, in arrival order, under one hold of its lock, exactly as it would have served
them one at a time: each push keeps its own version, sequence number, staleness and
acknowledgement. No timer, no batch size to tune: the trips pace themselves by the actor's
round trip, and batches grow only when calls queue (Nagle-like "self-clocking").

The first caller waiting when a trip returns sends the next trip; so no thread sends for
others after its own call is answered. A caller that gives up (``timeout``) is withdrawn from
the queue; one already chosen to send goes on and sends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

Call = tuple[tuple, dict]  # (args, kwargs) of one call

# Combining pays for models whose calls cost the actor more in messages than in bytes. A
# 1.7M-parameter CNN moves ~20 MB per learner pull and per push (parameters and the
# learners' Adam moments): one trip of such pushes serialises what separate calls overlap,
# and made fewer pushes/s than uncombined calls (benchmarks/parameter_service.py: 16 and 64
# learners, 0.78x and 0.53x), so handles combine only for models of at most this many bytes.
COMBINE_MAX_BYTES = 1 << 20


@dataclass(eq=False)
class _Waiter:
    call: Call
    event: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    answered: bool = False
    batch: list[_Waiter] | None = None  # set when this caller is to send that trip


class Combiner:
    """Combines concurrent calls into trips of at most ``max_batch`` calls, with at most
    ``max_in_flight`` trips on the wire at once.

    Parameters
    ----------
    send
        Sends one trip: takes the calls, returns their results in the same order (or raises:
        every call of the trip then raises it).
    max_batch
        Calls per trip at most (a bound on one message's size: 16 CNN pushes are ~320 MB).
    max_in_flight
        Trips on the wire at once. With 1 (the default), a caller that finds a trip on the
        wire waits for its round trip; with 2, two callers go side by side and batches form
        only behind two trips: a little less latency with few callers, smaller batches under
        load (``benchmarks/parameter_service.py``, MLP, 2 worker processes of callers: 64
        learners + 64 samplers made 2.0x the pushes/s of uncombined calls with 2 and 2.4x
        with 1; 4 + 4 made 0.92-0.96x with 1, in two runs).
    """

    def __init__(self, send: Callable[[list[Call]], list[Any]], *, max_batch: int = 16,
                 max_in_flight: int = 1):
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._send = send
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._queue: list[_Waiter] = []
        self._in_flight = 0
        self.calls = 0  # counters: calls made and trips sent
        self.trips = 0

    def call(self, call: Call, *, timeout: float | None = None) -> Any:
        """Make one call, ``(args, kwargs)``, through the combiner and wait for its result."""
        me = _Waiter(call)
        with self._lock:
            self.calls += 1
            self._queue.append(me)
            batch = self._take()
        if batch is None:  # wait: for an answer, or to be chosen to send a trip
            if not me.event.wait(timeout):
                self._give_up(me)
            if me.answered:
                return self._outcome(me)
            batch = me.batch
        assert batch is not None
        self._trip(batch)
        if not me.answered and not me.event.wait(timeout):  # sent others' calls, not ours
            self._give_up(me)
        return self._outcome(me)

    def _take(self) -> list[_Waiter] | None:
        """Under the lock: the next trip's calls, if one may go now."""
        if not self._queue or self._in_flight >= self.max_in_flight:
            return None
        self._in_flight += 1
        self.trips += 1
        batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
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
            if me in self._queue:
                self._queue.remove(me)
        raise TimeoutError("a combined call to the parameter actor was not answered in time")

    def _trip(self, batch: list[_Waiter]) -> None:
        try:
            results = self._send([w.call for w in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for {len(batch)} combined calls")
        except BaseException as exc:  # every call of the trip fails with the trip
            for w in batch:
                w.error = exc
        else:
            for w, r in zip(batch, results):
                w.result = r
        with self._lock:
            for w in batch:
                w.answered = True
                w.event.set()
            self._in_flight -= 1
            nxt = self._take()
            if nxt is not None:  # the first caller of the next trip sends it
                nxt[0].batch = nxt
                nxt[0].event.set()


_registry: dict[tuple[str, str], Combiner] = {}
_registry_lock = threading.Lock()


def combiner_for(key: str, method: str, make: Callable[[], Combiner]) -> Combiner:
    """This process's combiner of ``method`` calls to the actor ``key`` (made on first use)."""
    with _registry_lock:
        combiner = _registry.get((key, method))
        if combiner is None:
            combiner = _registry[(key, method)] = make()
        return combiner
