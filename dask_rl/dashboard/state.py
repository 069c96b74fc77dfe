"""The dashboard's view of runs, built from the records the runtime emits.

:class:`RunViews` consumes the same records that go to ``metrics.jsonl`` and to the Dask event
topic ``dask-rl`` — live on the scheduler (fed by a scheduler plugin) or offline from a file —
and keeps, per run, bounded time series and the latest state: returns, steps/s, learners in
flight, the staleness histogram, the threshold beta_k, gradient counters, checkpoints,
recoveries, TianJi's allocation decisions (adaptive clusters) and, for populations, a member
table. :meth:`RunViews.snapshot` is the JSON served at ``/rl/metrics.json``; the Bokeh page
draws from it.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

MAX_POINTS = 5000


class _Run:
    def __init__(self, name: str):
        self.name = name
        self.series: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=MAX_POINTS))
        self.latest: dict[str, Any] = {}
        self.histogram: list[int] = []
        self.members: dict[int, dict] = {}
        self.counts = collections.Counter()
        self.info: dict[str, Any] = {}

    def add(self, rec: dict) -> None:
        kind = rec.get("kind")
        self.counts[kind] += 1
        t = rec.get("time")
        if kind == "learner" or kind == "generation":
            point = {"time": t, "env_steps": rec.get("env_steps"), "wall_s": rec.get("wall_s"),
                     "return": rec.get("charts/return_recent"),
                     "steps_per_s": rec.get("steps_per_s"),
                     "learners": rec.get("learners/in_flight"),
                     "staleness": rec.get("staleness")}
            self.series["train"].append(point)
            self.latest.update({k: v for k, v in point.items() if v is not None})
            self.latest["updates"] = rec.get("updates")
        elif kind == "round":
            self.series["round"].append({
                "time": t, "env_steps": rec.get("env_steps"),
                "beta": rec.get("threshold/beta"), "staleness_mean": rec.get("staleness/mean"),
                "applied": rec.get("gradients/applied"), "buffered": rec.get("gradients/buffered"),
                "dropped": rec.get("gradients/dropped"), "active": rec.get("learners/active"),
                "lr_scale": rec.get("lr_scale")})
            self.histogram = list(rec.get("staleness/histogram") or self.histogram)
            for key in ("gradients/applied", "gradients/buffered", "gradients/dropped",
                        "gradients/rejected", "threshold/beta", "staleness/mean",
                        "staleness/max"):
                if key in rec:
                    self.latest[key] = rec[key]
        elif kind == "eval":
            self.series["eval"].append({"time": t, "env_steps": rec.get("env_steps"),
                                        "wall_s": rec.get("wall_s"),
                                        "return": rec.get("mean_return")})
            self.latest["eval_return"] = rec.get("mean_return")
        elif kind == "checkpoint":
            self.series["checkpoint"].append({"time": t, "env_steps": rec.get("env_steps"),
                                              "seconds": rec.get("seconds"),
                                              "name": rec.get("name")})
        elif kind == "allocation":
            point = {"time": t, "env_steps": rec.get("env_steps"), "wall_s": rec.get("wall_s"),
                     "actors": rec.get("actors"),
                     "learners": rec.get("learners"), "bound": rec.get("bound")}
            self.series["allocation"].append(point)
            self.latest["allocation"] = point
        elif kind == "recovery":
            self.series["recovery"].append({"time": t, "env_steps": rec.get("env_steps"),
                                            "reason": rec.get("reason")})
        elif kind == "lineage":
            m = int(rec["member"])
            row = self.members.setdefault(m, {"member": m, "parent": None, "score": None,
                                              "hparams": {}})
            if rec.get("hparams"):
                row["hparams"] = rec["hparams"]
            if rec.get("event") == "exploit":
                row["parent"] = rec.get("parent")
            if rec.get("score") is not None:
                row["score"] = rec["score"]
            row["env_steps"] = rec.get("env_steps")
        elif kind == "run":
            if rec.get("event") == "start":
                cfg = rec.get("config") or {}
                self.info = {"algorithm": (cfg.get("algo") or {}).get("name"),
                             "env_id": ((cfg.get("env") or {}).get("entry_point")
                                        or (cfg.get("env") or {}).get("id")),
                             "strategy": (cfg.get("aggregation") or {}).get("strategy"),
                             "started": t}
            else:
                self.info["finished"] = t
                self.latest["final_return"] = rec.get("final_return")

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

    def add(self, rec: dict) -> None:
        if not isinstance(rec, dict) or "kind" not in rec:
            return
        with self.lock:
            name = rec.get("run") or "run"
            run = self.runs.get(name)
            if run is None:
                run = self.runs[name] = _Run(name)
            run.add(rec)
            self.records += 1

    def snapshot(self) -> dict:
        with self.lock:
            return {"records": self.records,
                    "runs": {name: run.snapshot() for name, run in self.runs.items()}}
