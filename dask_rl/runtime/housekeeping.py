"""Scheduler housekeeping for long runs: let go of what Dask keeps about finished work.

A training run submits tens of short tasks a second for hours or days. Distributed's scheduler
forgets each task once its result is released, but keeps, for its own lifetime, some
bookkeeping about work already forgotten (dask/distributed#7977):

* every **span** — a new default span each time the scheduler went idle and got work again —
  with every task group it ever aggregated, including groups recreated each time the last
  task of a name (``learner-…``) was forgotten;
* one metadata entry per ``submit`` on the span it went to;
* the same task groups on the last 100 ``computations``.

For dask-rl's task pattern that is about half a kilobyte per task in the scheduler's process
(the driver's, for an embedded cluster): over minutes 5-20 of the soak the driver grew 31 MB
without this housekeeping and 16 MB with it (docs/benchmarks.md).
:func:`tidy_scheduler` removes only references to work the scheduler has already forgotten:
forgotten task groups leave spans and computations, duplicate metadata entries are merged,
and spans left empty are dropped once they have stayed empty for ``grace_s`` (workers report
metrics per span with their heartbeats, so a span must outlive its last report). Span
statistics (durations, bytes) then cover only work not yet forgotten.

Trainers run it on the scheduler every :data:`EVERY_S` seconds; it touches distributed's
internals, so any error is logged once and housekeeping is switched off for the run.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

EVERY_S = 60.0
GRACE_S = 120.0

# span id -> when this scheduler process first saw the span empty
_empty_since: dict[str, float] = {}


def tidy_scheduler(dask_scheduler, grace_s: float = GRACE_S) -> dict[str, int]:
    """Drop the scheduler's references to forgotten work; counts of what went.

    Run it on the scheduler: ``client.run_on_scheduler(tidy_scheduler)``.
    """
    s = dask_scheduler
    live = {id(tg) for tg in s.task_groups.values()}
    dropped = {"task_groups": 0, "metadata": 0, "spans": 0}

    def forget(groups: set) -> None:
        dead = [tg for tg in groups if id(tg) not in live]
        groups.difference_update(dead)
        dropped["task_groups"] += len(dead)

    for computation in s.computations:
        forget(computation.groups)
    ext = s.extensions.get("spans")
    if ext is None:
        return dropped
    now = time.monotonic()
    for span in list(ext.spans.values()):
        forget(span.groups)
        collections = (span.metadata or {}).get("collections")
        if collections and len(collections) > 1:
            unique = list({repr(c): c for c in collections}.values())
            dropped["metadata"] += len(collections) - len(unique)
            collections[:] = unique
        if span.groups or span.children:
            _empty_since.pop(span.id, None)
        elif now - _empty_since.setdefault(span.id, now) >= grace_s:
            _drop_span(ext, span)
            dropped["spans"] += 1
    return dropped


def _drop_span(ext, span) -> None:
    del ext.spans[span.id]
    _empty_since.pop(span.id, None)
    for index, key in [(ext.spans_search_by_name, span.name),
                       *((ext.spans_search_by_tag, tag) for tag in span.name)]:
        siblings = index.get(key)
        if siblings is not None:
            siblings[:] = [sp for sp in siblings if sp is not span]
            if not siblings:
                del index[key]
    parent = span.parent
    owner = parent.children if parent is not None else ext.root_spans
    owner[:] = [sp for sp in owner if sp is not span]


class Housekeeper:
    """Calls :func:`tidy_scheduler` through a client every ``every_s`` seconds."""

    def __init__(self, client, every_s: float = EVERY_S):
        self.client = client
        self.every_s = every_s
        self.last = time.monotonic()
        self.enabled = True

    def maybe_tidy(self) -> dict[str, int] | None:
        if not self.enabled or time.monotonic() - self.last < self.every_s:
            return None
        self.last = time.monotonic()
        try:
            return self.client.run_on_scheduler(tidy_scheduler)
        except Exception as e:  # an older/newer distributed, or dask-rl missing there
            self.enabled = False
            logger.warning("scheduler housekeeping is off for this run (%s: %s); the "
                           "scheduler's memory may grow slowly with the number of tasks",
                           type(e).__name__, e)
            return None
