"""Metrics out of a run: ``RUN_DIR/metrics.jsonl``, and a sink for live listeners.

Every record is one flat JSON object with a ``kind`` (``learner``, ``eval``, ``checkpoint``,
``recovery``, ``run``, ...) and the run's counters at that moment. The runtime passes a
``sink`` that forwards each record to the scheduler as a Dask event on topic :data:`TOPIC`
(Pub/Sub is gone, FACTS.md), where the ``/rl`` dashboard page reads it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Callable

import numpy as np

logger = logging.getLogger(__name__)

TOPIC = "dask-rl"


def clean(value: Any) -> Any:
    """Plain JSON / msgpack values: numpy scalars to Python, NaN and inf to None."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return clean(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends records to a JSONL file and hands each to ``sink`` (best effort)."""

    def __init__(self, path: str | os.PathLike, *,
                 sink: Callable[[dict[str, Any]], None] | None = None, run: str = ""):
        self.path = os.fspath(path)
        self.sink = sink
        self.run = run
        self._file = open(self.path, "a", buffering=1)
        self.lost = 0  # records that could not be written (a full disk): the run goes on

    def write(self, kind: str, record: dict[str, Any]) -> dict[str, Any]:
        rec = clean({"kind": kind, "time": time.time(), "run": self.run, **record})
        try:
            self._file.write(json.dumps(rec) + "\n")
        except (OSError, ValueError) as e:   # a full disk; the file closed at the run's end
            if not self.lost:
                logger.warning("cannot write %s (%s): metrics records are lost until it "
                               "works again; training goes on", self.path, e)
            self.lost += 1
        if self.sink is not None:
            try:
                self.sink(rec)
            except Exception:  # the dashboard is best effort; the file is the record
                logger.debug("could not forward a metrics record", exc_info=True)
        return rec

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:  # the buffered tail could not be flushed (a full disk)
            logger.warning("could not flush %s", self.path)


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl``: the JSON objects in it, one a line (a torn line
    from a crash, bytes that are not UTF-8 or JSON nested past the parser's depth are
    skipped)."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict):
                out.append(record)
    return out
