"""The dashboard's view of runs, built from the records the runtime emits.

:class:`RunViews` consumes the same records that go to ``metrics.jsonl`` and to the Dask event
topic ``dask-rl`` — live on the scheduler (fed by a scheduler plugin) or offline from a file
(:class:`FileFollower`) — and keeps, per run, bounded time series and the latest state: returns,
steps/s, learners in flight, the staleness histogram, the threshold beta_k, gradient counters,
checkpoints, recoveries, TianJi's allocation decisions (adaptive clusters) and, for populations,
a member table. :meth:`RunViews.snapshot` is the JSON served at ``/rl/metrics.json``; the Bokeh
page draws from it.

A record is data from a file anyone can hand over, or from another version of dask-rl: every
field is checked for its type as it comes in (a number that is not one is dropped, a name that
is not text too), and a record that cannot be used is skipped and counted in the snapshot's
``skipped``, never raised. Text (run, algorithm and environment names) is kept as given: the
page escapes it where it becomes HTML.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAX_POINTS = 5000
# The kinds the page draws, and the ones the runtime also emits that it only counts. Any other
# kind comes from a newer or foreign writer: skipped and counted, so that a record whose
# fields mean something else is never drawn as if it were ours.
DRAWN_KINDS = frozenset({"learner", "generation", "round", "eval", "checkpoint", "allocation",
                         "recovery", "lineage", "run"})
COUNTED_KINDS = frozenset({"rollout", "replay", "stall", "rescale", "resume",
                           "checkpoint_failed", "phase"})
MAX_UNKNOWN_KINDS = 50  # distinct unknown kind names remembered (a hostile file has many)


def number(value: Any) -> int | float | None:
    """A finite JSON number, else None (a bool is not a count; NaN is not valid JSON; an
    integer past 2**53 is not exact in the browser, and past a float's range breaks the
    formatting)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and abs(value) > 2**53:
        return None
    return value


def _text(value: Any) -> str | None:
    """A name: text as given, a number as its text, anything else None."""
    if isinstance(value, str):
        return value
    return None if number(value) is None else str(value)


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


class BadRecord(ValueError):
    """A record of a known kind whose fields cannot be used."""


class _Run:
    def __init__(self, name: str):
        self.name = name
        self.series: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=MAX_POINTS))
        self.latest: dict[str, Any] = {}
        self.histogram: list[int | float] = []
        self.members: dict[int, dict] = {}
        self.counts = collections.Counter()
        self.info: dict[str, Any] = {}

    def add(self, kind: str, rec: dict) -> None:
        """Fold one record in; raises :class:`BadRecord` before changing anything."""
        t = number(rec.get("time"))
        if kind == "lineage":
            self._lineage(rec)  # the one kind that can be refused: checked first
        elif kind == "learner" or kind == "generation":
            point = {"time": t, "env_steps": number(rec.get("env_steps")),
                     "wall_s": number(rec.get("wall_s")),
                     "return": number(rec.get("charts/return_recent")),
                     "steps_per_s": number(rec.get("steps_per_s")),
                     "learners": number(rec.get("learners/in_flight")),
                     "staleness": number(rec.get("staleness"))}
            self.series["train"].append(point)
            self.latest.update({k: v for k, v in point.items() if v is not None})
            self.latest["updates"] = number(rec.get("updates"))
        elif kind == "round":
            self.series["round"].append({
                "time": t, "env_steps": number(rec.get("env_steps")),
                "beta": number(rec.get("threshold/beta")),
                "staleness_mean": number(rec.get("staleness/mean")),
                "applied": number(rec.get("gradients/applied")),
                "buffered": number(rec.get("gradients/buffered")),
                "dropped": number(rec.get("gradients/dropped")),
                "active": number(rec.get("learners/active")),
                "lr_scale": number(rec.get("lr_scale"))})
            histogram = rec.get("staleness/histogram")
            # a tuple when it came as a Dask event (msgpack's arrays), a list from a file
            if isinstance(histogram, (list, tuple)) and histogram and \
                    all(number(c) is not None for c in histogram):
                self.histogram = list(histogram)
            for key in ("gradients/applied", "gradients/buffered", "gradients/dropped",
                        "gradients/rejected", "threshold/beta", "staleness/mean",
                        "staleness/max"):
                if key in rec:
                    self.latest[key] = number(rec[key])
        elif kind == "eval":
            self.series["eval"].append({"time": t, "env_steps": number(rec.get("env_steps")),
                                        "wall_s": number(rec.get("wall_s")),
                                        "return": number(rec.get("mean_return"))})
            self.latest["eval_return"] = number(rec.get("mean_return"))
        elif kind == "checkpoint":
            self.series["checkpoint"].append({"time": t, "env_steps": number(rec.get("env_steps")),
                                              "seconds": number(rec.get("seconds")),
                                              "name": _text(rec.get("name"))})
        elif kind == "allocation":
            point = {"time": t, "env_steps": number(rec.get("env_steps")),
                     "wall_s": number(rec.get("wall_s")), "actors": number(rec.get("actors")),
                     "learners": number(rec.get("learners")), "bound": _text(rec.get("bound"))}
            self.series["allocation"].append(point)
            self.latest["allocation"] = point
        elif kind == "recovery":
            self.series["recovery"].append({"time": t, "env_steps": number(rec.get("env_steps")),
                                            "reason": _text(rec.get("reason"))})
        elif kind == "run":
            if rec.get("event") == "start":
                cfg = _dict(rec.get("config"))
                env = _dict(cfg.get("env"))
                self.info = {"algorithm": _text(_dict(cfg.get("algo")).get("name")),
                             "env_id": _text(env.get("entry_point")) or _text(env.get("id")),
                             "strategy": _text(_dict(cfg.get("aggregation")).get("strategy")),
                             "started": t}
            else:
                self.info["finished"] = t
                self.latest["final_return"] = number(rec.get("final_return"))
        self.counts[kind] += 1

    def _lineage(self, rec: dict) -> None:
        member = number(rec.get("member"))
        if member is None or member != int(member):
            raise BadRecord(f"lineage record without a member number: {rec.get('member')!r}")
        m = int(member)
        row = self.members.setdefault(m, {"member": m, "parent": None, "score": None,
                                          "hparams": {}})
        hparams = rec.get("hparams")
        if isinstance(hparams, dict) and hparams:
            row["hparams"] = {str(k): v if number(v) is not None else _text(v)
                              for k, v in hparams.items()}
        if rec.get("event") == "exploit":
            row["parent"] = number(rec.get("parent"))
        if number(rec.get("score")) is not None:
            row["score"] = rec["score"]
        row["env_steps"] = number(rec.get("env_steps"))

    def snapshot(self) -> dict:
        return {"run": self.name, "info": self.info, "latest": self.latest,
                "counts": dict(self.counts), "staleness_histogram": self.histogram,
                "series": {k: list(v) for k, v in self.series.items()},
                "population": sorted(self.members.values(), key=lambda r: r["member"])}


class RunViews:
    """Every run's view; thread-safe (the scheduler feeds it, HTTP handlers read it)."""

    def __init__(self):
        self.runs: dict[str, _Run] = {}
        self.lock = threading.Lock()
        self.records = 0
        self.skipped: collections.Counter = collections.Counter()
        self.unknown_kinds: collections.Counter = collections.Counter()

    def add(self, rec: Any) -> bool:
        """Fold one record in; False (and counted in ``skipped``) when it is not usable."""
        if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
            self.skip("not a record")
            return False
        kind = rec["kind"]
        if kind not in DRAWN_KINDS and kind not in COUNTED_KINDS:
            shown = kind[:100]
            with self.lock:
                self.skipped["unknown kind"] += 1
                if shown in self.unknown_kinds or len(self.unknown_kinds) < MAX_UNKNOWN_KINDS:
                    self.unknown_kinds[shown] += 1
            return False
        name = rec.get("run")
        name = "run" if name is None or name == "" else _text(name)
        if name is None:
            self.skip("bad fields")
            return False
        with self.lock:
            run = self.runs.get(name) or _Run(name)
            try:
                run.add(kind, rec)
            except Exception as e:
                # BadRecord is expected; anything else is a field shape not foreseen here, and
                # one record must never stop the page or the scheduler plugin that feeds it
                logger.debug("skipped a %s record of run %r: %r", kind, name, e)
                self.skipped["bad fields"] += 1
                return False
            self.runs[name] = run
            self.records += 1
        return True

    def skip(self, reason: str) -> None:
        """Count a record that never reached :meth:`add` (a line that is not JSON)."""
        with self.lock:
            self.skipped[reason] += 1

    def snapshot(self) -> dict:
        with self.lock:
            return {"records": self.records, "skipped": dict(self.skipped),
                    "unknown_kinds": dict(self.unknown_kinds),
                    "runs": {name: run.snapshot() for name, run in self.runs.items()}}


class FileFollower:
    """Reads the new complete lines of every ``metrics.jsonl`` under the run directories.

    A line still being written waits for the next :meth:`poll`; a line that is not JSON is
    counted and passed over, and following goes on. A file that was replaced or truncated (a
    new run in the same directory) is read again from its start.
    """

    # Per file and poll, so that one huge file cannot hold a poll for long; a line longer than
    # this is no metrics record and is skipped in pieces.
    MAX_READ = 64 * 2**20

    def __init__(self, run_dirs: list[str | os.PathLike], views: RunViews):
        self.run_dirs = [Path(d) for d in run_dirs]
        self.views = views
        self.offsets: dict[Path, int] = {}
        self.files: dict[Path, tuple[int, int]] = {}  # (device, inode) last read

    def poll(self) -> int:
        """Records added since the last poll."""
        added = 0
        for d in self.run_dirs:
            try:
                paths = sorted(d.rglob("metrics.jsonl"))
            except OSError as e:  # the directory went away; it may come back
                logger.debug("cannot list %s: %s", d, e)
                continue
            for path in paths:
                added += self._read(path)
        return added

    def _read(self, path: Path) -> int:
        start = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_size < start or self.files.get(path, (st.st_dev, st.st_ino)) != \
                        (st.st_dev, st.st_ino):
                    start = 0
                self.files[path] = (st.st_dev, st.st_ino)
                f.seek(start)
                chunk = f.read(self.MAX_READ)
        except OSError as e:  # removed between listing and opening, or unreadable
            logger.debug("cannot read %s: %s", path, e)
            return 0
        end = chunk.rfind(b"\n") + 1
        if end == 0 and len(chunk) == self.MAX_READ:
            self.views.skip("not JSON")
            end = len(chunk)
            chunk = b""
        n = 0
        for line in chunk[:end].splitlines():
            if line.strip():
                n += self._line(line)
        self.offsets[path] = start + end
        return n

    def _line(self, line: bytes) -> int:
        rec, torn = parse_line(line)
        if torn:
            self.views.skip("not JSON")
        return 0 if rec is None else int(self.views.add(rec))


def parse_line(line: bytes) -> tuple[Any, bool]:
    """``(value, torn)``: a line's JSON value (None if there is none), and whether some or all
    of it was not JSON.

    When a crash tore a line and a resumed run appended to it, the record after the tear is
    still found (every record starts with its ``kind``).
    """
    try:
        return json.loads(line), False
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested without end
        pass
    at = line.rfind(b'{"kind"', 1)
    if at < 0:
        return None, True
    try:
        return json.loads(line[at:]), True
    except (ValueError, RecursionError):
        return None, True
