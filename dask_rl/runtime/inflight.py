"""The tasks a driver holds in flight, each with the part that handles its result.

No dispatch on kinds: a :class:`Task` carries its handlers (``done``, ``lost``), put there by
the part that submitted it, and how the end of a run treats it (``at_end``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator

from distributed import Future, wait


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
    """Futures and their :class:`Task` s."""

    def __init__(self) -> None:
        self.tasks: dict[Future, Task] = {}

    def hold(self, fut: Future, kind: str, done: Callable[[Any, Task], None], **task: Any
             ) -> None:
        self.tasks[fut] = Task(kind, done, **task)

    def running(self, kind: str) -> bool:
        """Whether a task of ``kind`` is in flight."""
        return any(t.kind == kind for t in self.tasks.values())

    def at_end(self, which: str) -> list[Future]:
        """The futures the end of a run treats as ``which`` (``wait``, ``keep``, ``cancel``)."""
        return [f for f, t in self.tasks.items() if t.at_end == which]

    def pop(self, fut: Future) -> Task:
        return self.tasks.pop(fut)

    def drop(self, futures: list[Future]) -> None:
        for fut in futures:
            self.tasks.pop(fut, None)

    def clear(self) -> list[Future]:
        """Forget every task; their futures (to cancel)."""
        futures = list(self.tasks)
        self.tasks.clear()
        return futures

    def wait_some(self, timeout: float) -> list[Future]:
        """Futures that completed within ``timeout`` seconds (possibly none)."""
        if not self.tasks:  # e.g. no worker yet: nothing to wait for, do not spin
            time.sleep(min(timeout, 0.1))
            return []
        try:
            done, _ = wait(list(self.tasks), timeout=timeout, return_when="FIRST_COMPLETED")
        except TimeoutError:
            return []
        return list(done)

    def __contains__(self, fut: object) -> bool:
        return fut in self.tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Future]:
        return iter(self.tasks)
