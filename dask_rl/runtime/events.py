"""Records to the scheduler's event log without waiting for it.

``Client.log_event`` is a synchronous round trip to the scheduler: the driver's thread waits
for the scheduler's reply before it can hand out the next task. A learner's result wrote two
or three records (`benchmarks/task_cost.py` measured 1.4 ms each under load, on the driver's
critical path). An :class:`EventSender` queues a record and returns; one coroutine on the
client's event loop sends the queue in order, one call at a time, so the scheduler sees the
records in the order they were written. The dashboard and the adaptive policy read them
there; ``metrics.jsonl`` is written by the driver itself and never waits for this.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)


class EventSender:
    """Sends ``(topic, record)`` pairs to the scheduler in order, in the background.

    Best effort, like the dashboard it feeds: a record the scheduler does not take (it is
    gone) is counted in :attr:`lost` and the rest are still tried."""

    def __init__(self, client: Any):
        self.client = client
        self._pending: collections.deque[tuple[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._sending = False
        self._idle = threading.Event()
        self._idle.set()
        self.lost = 0

    def send(self, topic: str, record: Any) -> None:
        """Queue ``record`` under ``topic``; returns at once."""
        with self._lock:
            self._pending.append((topic, record))
            if self._sending:
                return
            self._sending = True
            self._idle.clear()
        self.client.loop.add_callback(self._drain)

    async def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._sending = False
                    self._idle.set()
                    return
                topic, record = self._pending.popleft()
            try:
                await self.client.scheduler.log_event(topic=topic, msg=record)
            except Exception:   # the scheduler is gone or closing: the file has the record
                self.lost += 1
                logger.debug("an event for the scheduler was lost", exc_info=True)

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the queue to be sent; whether it was."""
        return self._idle.wait(timeout)
