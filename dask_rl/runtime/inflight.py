"""The tasks a driver holds in flight, each with the part that handles its result.

No dispatch on kinds: a :class:`Task` carries its handlers (``done``, ``lost``), put there by
the part that submitted it, and how the end of a run treats it (``at_end``).

A task's end is watched on the client's event loop, not by the driver's thread: when a
future finishes, its result (a learner's report, an evaluation) is fetched there at once and
the future queued for the driver, which takes it with its result in hand. The driver's thread
no longer waits for a round trip per result (`benchmarks/task_cost.py`: the fetch was most of
a learner's 10-12 ms of handling on a loaded 2-core machine), and no wait is built anew over
every future in flight on each pass of its loop.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from typing import Any, Callable, Iterator

from distributed import Future

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Task:
    """What the driver remembers of a future it holds, and who handles it: ``done`` takes the
    task's result (or, when ``fetch`` is False, its future: a trajectory stays where it is);
    ``lost`` undoes what a failed task leaves behind; ``at_end`` says whether the end of a
    run waits for it (``wait``), keeps it (``keep``) or cancels it (``cancel``)."""

    kind: str                 # a label (logs, failure counts, task-time accounting)
    done: Callable[[Any, "Task"], None]
    lost: Callable[["Task"], None] | None = None
    fetch: bool = True
    at_end: str = "cancel"
    slot: int = -1
    learner_id: str = ""
    first_use: bool = True    # learner: the trajectory's first learning (not a replay)
    concurrent: int = 0       # learner: learners in flight when it was launched, itself included
    submitted: float = dataclasses.field(default_factory=time.monotonic)


class InFlight:
    """Futures and their :class:`Task` s, watched on ``client``'s event loop."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.tasks: dict[Future, Task] = {}
        self._ended: queue.SimpleQueue[Future] = queue.SimpleQueue()   # in the order they end
        self._fetched: dict[Future, tuple[bool, Any]] = {}   # (ok, result or its exception)

    def hold(self, fut: Future, kind: str, done: Callable[[Any, Task], None], **task: Any
             ) -> None:
        t = Task(kind, done, **task)
        self.tasks[fut] = t
        self.client.loop.add_callback(self._watch, fut, t.fetch)

    async def _watch(self, fut: Future, fetch: bool) -> None:
        """On the event loop: wait for ``fut`` to end (finished, failed or cancelled), fetch a
        finished one's result if its task wants it, then queue it for the driver. A result
        whose worker is lost meanwhile is fetched once Dask has computed it again."""
        try:
            await fut._state.wait()   # what Future.result awaits, without fetching
            if fetch and fut.status == "finished" and fut in self.tasks:
                try:
                    fetched = (True, await fut._result())
                except Exception as e:   # lost, or failed when computed again
                    fetched = (False, e)
                if fut in self.tasks:    # not dropped meanwhile
                    self._fetched[fut] = fetched
        except Exception:   # the client is closing: the driver is ending
            logger.debug("watching %s", fut.key, exc_info=True)
            return
        self._ended.put(fut)

    def fetched(self, fut: Future) -> tuple[bool, Any] | None:
        """``(True, result)`` or ``(False, exception)`` of a task whose result was fetched on
        the event loop, or None if it was not (yet)."""
        return self._fetched.pop(fut, None)

    def running(self, kind: str) -> bool:
        """Whether a task of ``kind`` is in flight."""
        return any(t.kind == kind for t in self.tasks.values())

    def at_end(self, which: str) -> list[Future]:
        """The futures the end of a run treats as ``which`` (``wait``, ``keep``, ``cancel``)."""
        return [f for f, t in self.tasks.items() if t.at_end == which]

    def pop(self, fut: Future) -> Task:
        """The task of ``fut``, no longer held (its fetched result stays for :meth:`fetched`)."""
        return self.tasks.pop(fut)

    def drop(self, futures: list[Future]) -> None:
        for fut in futures:
            self.tasks.pop(fut, None)
            self._fetched.pop(fut, None)

    def clear(self) -> list[Future]:
        """Forget every task; their futures (to cancel)."""
        futures = list(self.tasks)
        self.tasks.clear()
        self._fetched.clear()
        return futures

    def wait_some(self, timeout: float) -> list[Future]:
        """Held futures that ended within ``timeout`` seconds (possibly none), with their
        results fetched (:meth:`fetched`) where their tasks want them."""
        if not self.tasks:  # e.g. no worker yet: nothing to wait for, do not spin
            time.sleep(min(timeout, 0.1))
            return []
        try:
            ended = [self._ended.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                ended.append(self._ended.get_nowait())
            except queue.Empty:
                break
        return [f for f in ended if f in self.tasks]

    def __contains__(self, fut: object) -> bool:
        return fut in self.tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Future]:
        return iter(self.tasks)
