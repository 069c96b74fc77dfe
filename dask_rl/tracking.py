"""The experiment trackers a researcher already uses: TensorBoard and MLflow.

They are fed the records ``metrics.jsonl`` gets (:class:`~dask_rl.data.metrics.MetricsLog`
hands each to the run's sink), with the run's env steps as the step, so curves line up with
CleanRL's (``global_step``). Tag names are CleanRL's where a quantity is CleanRL's —
``charts/episodic_return``, ``charts/episodic_length``, ``charts/learning_rate``,
``charts/SPS``, ``losses/value_loss``, ``losses/policy_loss``, ``losses/entropy``,
``losses/approx_kl``, ``losses/clipfrac``, ``losses/td_loss`` — and ours otherwise:
``staleness/gradient`` (versions a gradient was stale), ``staleness/mean``,
``threshold/beta`` (Stellaris' beta_k), ``gradients/applied``, ``gradients/buffered``,
``gradients/dropped``, ``charts/eval_return`` (greedy evaluations), ``summary/...`` (the
summary's numbers, at the last step), and every other numeric field of a record whose name
already has a section (``learner/...``, ``actor/...``).

* **TensorBoard** (``logging.tensorboard``): event files in ``RUN_DIR/tensorboard``, written
  by ``torch.utils.tensorboard`` (needs the ``tensorboard`` package: extra ``tensorboard``).
* **MLflow** (``logging.mlflow``): one MLflow run per dask-rl run, its id kept in
  ``RUN_DIR/mlflow.json`` so that ``--resume`` continues it; the pipeline as params
  (``section.key``), metrics batched every few seconds, and at the end the exported
  TorchScript policy (and its JSON sidecar) as artifacts, the summary's numbers as
  ``summary/...`` metrics (extra ``mlflow``).

Trackers cannot stall training. The driver's loop only puts a record's numbers on a bounded
queue (:class:`Feed`); one background thread hands them to the trackers. When the queue is
full the oldest record is dropped (the newest, the run's summary above all, matter most):
the drops are counted, warned about once, and reported by :meth:`Trackers.finish`, which
waits at most :data:`FINISH_TIMEOUT_S` for the queue to drain and then gives up with a
warning. Every MLflow HTTP call runs with at most :data:`REQUEST_TIMEOUT_S` seconds per
request and no retries (MLflow's ``MLFLOW_HTTP_REQUEST_TIMEOUT`` and
``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, read by MLflow at each request: they are set only
while one of our calls is in flight, and a user's shorter timeout is kept), so a server that
accepts connections and never answers holds the thread for seconds, not for MLflow's
default of 7 retries of 120 s each.

A pipeline whose tracking URI does not answer stops before any cluster starts
(:func:`check`), and so does one whose MLflow run cannot be opened within
:data:`OPEN_TIMEOUT_S` (a :class:`~dask_rl.config.schema.ConfigError`, one line): a user who
asked for MLflow gets it or is told at once, never hours of training it did not record.

Credentials never leave the driver through a tracker: the user part of a URI
(``user:password@``) and the values of its query or fragment fields whose names look like
secrets (``?token=``, ``access_token``, ``password``, ``key``, ``secret``, ``sig`` ...) are
replaced by ``<redacted>`` (:func:`redact_uri`) wherever a tracking URI is logged, written
to ``mlflow.json`` or sent as a param, and so are the values of ``env.kwargs`` whose keys
look like secrets (``api_key``, ``auth_token``, ``password`` ...) in the params.

Trackers are best effort, like the dashboard: a tracker that fails logs one warning and is
off for the rest of the run; ``metrics.jsonl`` stays the record.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dask_rl.config.loader import public_dict
from dask_rl.config.redact import redact, redact_secrets, redact_uri
from dask_rl.config.schema import ConfigError, PipelineConfig

logger = logging.getLogger(__name__)

KINDS = ("learner", "rollout", "round", "eval", "generation", "replay", "allocation", "run")
RENAMED = {"steps_per_s": "charts/SPS", "staleness": "staleness/gradient",
           "policy_lag": "staleness/policy_lag"}
SKIP = {"time", "env_steps", "env_steps_collected", "wall_s", "updates", "version",
        "version_after", "version_pulled", "episodes"}
MLFLOW_FILE = "mlflow.json"
FLUSH_S = 5.0             # MLflow gets a batch of metrics this often
MAX_BATCH = 900           # MLflow takes at most 1000 metrics a batch
QUEUE_SIZE = 10_000       # records waiting for the trackers (half an hour of a busy run)
REQUEST_TIMEOUT_S = 10    # one MLflow HTTP request, connect or read
OPEN_TIMEOUT_S = 20.0     # experiment, run and params: a few requests
FINISH_TIMEOUT_S = 10.0   # draining the queue, artifacts and the final status at the end

class HttpLimits:
    """MLflow's HTTP timeout and retries, bounded while one of our MLflow calls is in flight.

    MLflow reads ``MLFLOW_HTTP_REQUEST_TIMEOUT`` and ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` from
    the environment at every request and takes no per-call setting through its client, so the
    bound is the environment's, for the process. Calls from several runs (a sweep's trials run
    in threads) overlap: the first sets the values and the last puts the user's back.
    """

    TIMEOUT = "MLFLOW_HTTP_REQUEST_TIMEOUT"
    RETRIES = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"

    def __init__(self, timeout_s: int = REQUEST_TIMEOUT_S):
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        self.users = 0
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> HttpLimits:
        with self.lock:
            if self.users == 0:
                self.saved = {k: os.environ.get(k) for k in (self.TIMEOUT, self.RETRIES)}
                timeout = self.timeout_s
                try:   # a user's shorter timeout is kept
                    timeout = min(timeout, int(self.saved[self.TIMEOUT] or timeout))
                except ValueError:
                    pass
                os.environ[self.TIMEOUT] = str(max(timeout, 1))
                os.environ[self.RETRIES] = "0"
            self.users += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                for k, v in self.saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v


HTTP_LIMITS = HttpLimits()


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A record's numeric values under their tracker tags (see the module doc)."""
    kind = record.get("kind")
    if kind not in KINDS or (kind == "run" and record.get("event") != "end"):
        return {}
    out: dict[str, float] = {}
    if kind == "run":   # the summary: its numbers, once, at the last step
        return {f"summary/{k}": float(v) for k, v in record.items()
                if k not in ("time",) and not isinstance(v, bool)
                and isinstance(v, (int, float))}
    for key, value in record.items():
        if key in SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if kind == "eval" and key == "mean_return":
            out["charts/eval_return"] = float(value)
        elif key in RENAMED:
            out[RENAMED[key]] = float(value)
        elif "/" in key:
            out[key] = float(value)
    return out


def flat_params(cfg: PipelineConfig) -> dict[str, str]:
    """The pipeline as ``section.key`` strings (what leaves the driver: secrets redacted,
    URIs without credentials, ``env.kwargs`` values whose keys look like secrets hidden)."""
    data = public_dict(cfg)
    env = data.get("env")
    if isinstance(env, dict) and isinstance(env.get("kwargs"), dict):
        env["kwargs"] = redact_secrets(env["kwargs"])
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            text = redact(value if isinstance(value, str) else json.dumps(value))
            out[prefix] = text[:500]   # MLflow caps a param's value

    walk("", data)
    return out


def _shown_uri(cfg: PipelineConfig) -> str:
    uri = cfg.logging.mlflow.tracking_uri if cfg.logging.mlflow is not None else None
    return repr(redact_uri(uri)) if uri is not None else "MLflow's default (MLFLOW_TRACKING_URI)"


def _one_line(e: BaseException, n: int = 200) -> str:
    return redact(" ".join(str(e).split()))[:n]


def check(cfg: PipelineConfig) -> None:
    """Before any cluster starts: the trackers the pipeline asks for are installed, and an
    MLflow tracking URI answers (one try, no retries, :data:`REQUEST_TIMEOUT_S`). A
    :class:`ConfigError` otherwise."""
    import importlib.util

    for key, wanted, package in (("tensorboard", cfg.logging.tensorboard, "tensorboard"),
                                 ("mlflow", cfg.logging.mlflow is not None, "mlflow")):
        if wanted and importlib.util.find_spec(package) is None:
            raise ConfigError(f"logging.{key}: the {package} package is not installed: "
                              f"pip install 'dask-rl[{key}]'")
    if cfg.logging.mlflow is None:
        return
    from mlflow.tracking import MlflowClient

    try:
        with HTTP_LIMITS:
            MlflowClient(tracking_uri=cfg.logging.mlflow.tracking_uri).search_experiments(
                max_results=1)
    except Exception as e:
        raise ConfigError(f"logging.mlflow.tracking_uri: cannot reach MLflow there "
                          f"({_one_line(e)}), got {_shown_uri(cfg)}") from None


class Tracker:
    """One tracker, driven by a :class:`Feed`'s thread (never by the driver's loop).

    Notes
    -----
    Subclasses override what they need; every hook does nothing by default. :meth:`open` is
    called first; :meth:`write` for each record; :meth:`tick` after each record and every
    :data:`FLUSH_S` when idle (time to send a batch); :meth:`close` once at the end, unless
    the tracker failed. An exception from any hook turns the tracker off for the run.
    """

    name = "tracker"

    def open(self, **kwargs: Any) -> None:
        """Connect, create what the run needs."""

    def write(self, values: dict[str, float], step: int, ms: int, **kwargs: Any) -> None:
        """One record's numbers, at env step ``step``, time ``ms`` (ms since the epoch)."""

    def tick(self, **kwargs: Any) -> None:
        """Send what is due."""

    def close(self, *, status: str = "FINISHED", artifacts: Sequence[tuple[Path, str]] = (),
              **kwargs: Any) -> None:
        """Send the rest, then the artifacts and the final status."""


class TensorBoard(Tracker):
    """Event files in ``run_dir/tensorboard``."""

    name = "tensorboard"

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.writer: Any = None

    def open(self, **kwargs: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def write(self, values: dict[str, float], step: int, ms: int, **kwargs: Any) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step, walltime=ms / 1000)

    def close(self, **kwargs: Any) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MLflow(Tracker):
    """One MLflow run for one run directory (continued on ``--resume``); every call under
    :data:`HTTP_LIMITS`."""

    name = "mlflow"

    def __init__(self, cfg: PipelineConfig, run_dir: Path, *, resume: bool = False):
        assert cfg.logging.mlflow is not None
        self.cfg, self.run_dir, self.resume = cfg, Path(run_dir), resume
        self.client: Any = None
        self.run_id: str | None = None
        self.pending: list[Any] = []
        self.last_flush = time.monotonic()

    def open(self, **kwargs: Any) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        m = self.cfg.logging.mlflow
        assert m is not None
        with HTTP_LIMITS:
            self.client = MlflowClient(tracking_uri=m.tracking_uri)
            saved = self.run_dir / MLFLOW_FILE
            if self.resume and saved.exists():
                self.run_id = json.loads(saved.read_text())["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                return
            experiment = self.client.get_experiment_by_name(m.experiment)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self.client.create_experiment(m.experiment))
            run = self.client.create_run(
                experiment_id, run_name=m.run_name or self.run_dir.name,
                tags={"dask_rl.run_dir": str(self.run_dir.resolve()),
                      "dask_rl.algorithm": self.cfg.algo.name,
                      "dask_rl.env": self.cfg.env.name})
            self.run_id = run.info.run_id
            params = [Param(k, v) for k, v in flat_params(self.cfg).items()]
            for i in range(0, len(params), 100):   # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        saved.write_text(json.dumps({"run_id": self.run_id,
                                     "tracking_uri": redact_uri(self.client.tracking_uri)}))
        self.last_flush = time.monotonic()

    def write(self, values: dict[str, float], step: int, ms: int, **kwargs: Any) -> None:
        from mlflow.entities import Metric

        self.pending += [Metric(k, v, ms, step) for k, v in values.items()]
        if len(self.pending) >= MAX_BATCH:
            self.flush()

    def tick(self, **kwargs: Any) -> None:
        if self.pending and time.monotonic() - self.last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        self.last_flush = time.monotonic()
        batch, self.pending = self.pending, []
        with HTTP_LIMITS:
            for i in range(0, len(batch), MAX_BATCH):
                self.client.log_batch(self.run_id, metrics=batch[i:i + MAX_BATCH])

    def close(self, *, status: str = "FINISHED", artifacts: Sequence[tuple[Path, str]] = (),
              **kwargs: Any) -> None:
        if self.run_id is None:
            return
        self.flush()
        with HTTP_LIMITS:
            for path, where in artifacts:
                try:
                    self.client.log_artifact(self.run_id, str(path), where)
                except Exception as e:  # a missing artifact is no reason to leave it RUNNING
                    logger.warning("MLflow: could not log the artifact %s (%s)", path,
                                   _one_line(e))
            self.client.set_terminated(self.run_id, status)


@dataclass(frozen=True)
class Delivery:
    """What a :class:`Feed` did with the records it was given."""

    written: int       #: records every live tracker got
    dropped: int       #: records dropped because the queue was full
    undelivered: int   #: records still queued when :meth:`Feed.finish` gave up
    closed: bool       #: the trackers were closed (artifacts, final status) in time


class Feed:
    """A bounded queue of records and one background thread that hands them to trackers.

    >>> feed = Feed([TensorBoard(run_dir)])          # doctest: +SKIP
    >>> feed.wait_open(20.0); feed.put(({"charts/SPS": 1.0}, 512, 0))   # doctest: +SKIP
    >>> feed.finish(timeout_s=10.0)                  # doctest: +SKIP
    Delivery(written=1, dropped=0, undelivered=0, closed=True)

    :meth:`put` never blocks: when ``maxsize`` records are waiting the oldest one is dropped.
    """

    def __init__(self, trackers: Iterable[Tracker], *, maxsize: int = QUEUE_SIZE,
                 tick_s: float = FLUSH_S, name: str = "dask-rl-trackers"):
        if maxsize < 1:
            raise ValueError(f"maxsize: expected at least 1, got {maxsize!r}")
        self.trackers = list(trackers)
        self.maxsize, self.tick_s = maxsize, tick_s
        self.items: collections.deque[Any] = collections.deque()
        self.cond = threading.Condition()
        self.written = self.dropped = 0
        self.closing = False
        self.final: dict[str, Any] = {"status": "FAILED", "artifacts": ()}
        self.failed: set[str] = set()
        self.opened = threading.Event()
        self.open_error: Exception | None = None
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def wait_open(self, timeout_s: float) -> bool:
        """Whether every tracker's :meth:`Tracker.open` returned within ``timeout_s``
        (:attr:`open_error` says whether it raised)."""
        return self.opened.wait(timeout_s)

    def put(self, item: Any) -> None:
        """Queue ``item`` for the thread; drop the oldest waiting one if the queue is full."""
        with self.cond:
            if self.closing:
                return
            full = len(self.items) >= self.maxsize
            if full:
                self.items.popleft()
                self.dropped += 1
            self.items.append(item)
            self.cond.notify()
        if full and self.dropped == 1:
            logger.warning("trackers: %d records are waiting for a slow tracker; dropping the "
                           "oldest from now on (metrics.jsonl keeps every record)",
                           self.maxsize)

    def finish(self, *, status: str = "FINISHED", artifacts: Sequence[tuple[Path, str]] = (),
               timeout_s: float = FINISH_TIMEOUT_S) -> Delivery:
        """Let the thread deliver what is queued and close the trackers; wait at most
        ``timeout_s`` for it, then give up with a warning (the thread is a daemon)."""
        with self.cond:
            self.closing = True
            self.final = {"status": status, "artifacts": tuple(artifacts)}
            self.cond.notify()
        self.thread.join(timeout_s)
        closed = not self.thread.is_alive()
        with self.cond:
            undelivered = len(self.items)
        if not closed:
            logger.warning("trackers: gave up after %.0f s waiting for a tracker (a tracking "
                           "server that does not answer?) with %d records undelivered; "
                           "metrics.jsonl keeps every record", timeout_s, undelivered)
        if self.dropped:
            logger.warning("trackers: %d records were dropped because the queue was full "
                           "(metrics.jsonl keeps every record)", self.dropped)
        return Delivery(written=self.written, dropped=self.dropped, undelivered=undelivered,
                        closed=closed)

    def abandon(self) -> None:
        """Stop taking records; the thread closes the trackers (status ``FAILED``) whenever
        the call it is stuck in returns. Nothing is waited for."""
        with self.cond:
            self.closing = True
            self.cond.notify()

    def _live(self) -> list[Tracker]:
        return [t for t in self.trackers if t.name not in self.failed]

    def _guard(self, tracker: Tracker, hook: str, *args: Any, **kwargs: Any) -> None:
        try:
            getattr(tracker, hook)(*args, **kwargs)
        except Exception as e:  # best effort, like the dashboard: the run goes on
            logger.warning("%s tracking failed (%s); it is off for the rest of the run, and "
                           "metrics.jsonl keeps every record", tracker.name, _one_line(e, 300))
            self.failed.add(tracker.name)

    def _serve(self) -> None:
        opened: list[Tracker] = []
        try:
            for tracker in self.trackers:
                tracker.open()
                opened.append(tracker)
        except Exception as e:
            self.open_error = e
        self.opened.set()
        if self.open_error is not None:
            for tracker in opened:
                self._guard(tracker, "close", status="FAILED")
            return
        while True:
            with self.cond:
                if not self.items and not self.closing:
                    self.cond.wait(self.tick_s)
                item = self.items.popleft() if self.items else None
                done = item is None and self.closing
            if done:
                break
            if item is not None:
                for tracker in self._live():
                    self._guard(tracker, "write", *item)
                self.written += 1
            for tracker in self._live():
                self._guard(tracker, "tick")
        for tracker in self._live():
            self._guard(tracker, "close", **self.final)


class Trackers:
    """The trackers a pipeline asks for, for one run directory, fed off the driver's loop.

    Opening them (MLflow's experiment, run and params) is bounded by ``open_timeout_s``; a
    tracker that fails to open, or a server that does not answer in time, is a
    :class:`ConfigError`.
    """

    def __init__(self, cfg: PipelineConfig, run_dir: Path, *, resume: bool = False,
                 open_timeout_s: float = OPEN_TIMEOUT_S, queue_size: int = QUEUE_SIZE):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        trackers: list[Tracker] = []
        if cfg.logging.tensorboard:
            trackers.append(TensorBoard(self.run_dir))
        self.mlflow: MLflow | None = None
        if cfg.logging.mlflow is not None:
            self.mlflow = MLflow(cfg, self.run_dir, resume=resume)
            trackers.append(self.mlflow)
        self.feed = Feed(trackers, maxsize=queue_size)
        if not self.feed.wait_open(open_timeout_s):
            self.feed.abandon()
            raise ConfigError(f"logging.mlflow.tracking_uri: MLflow did not open the run "
                              f"within {open_timeout_s:g} s (a server that does not answer?), "
                              f"got {_shown_uri(cfg)}")
        if self.feed.open_error is not None:
            raise ConfigError(f"logging: cannot open the trackers "
                              f"({_one_line(self.feed.open_error, 300)})")

    @property
    def enabled(self) -> bool:
        return bool(self.feed.trackers)

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id (None without MLflow)."""
        return self.mlflow.run_id if self.mlflow is not None else None

    def write(self, record: dict[str, Any]) -> None:
        """One record, as ``metrics.jsonl`` got it: queued, never waited for."""
        step = record.get("env_steps")
        values = scalars(record)
        if values and step is not None:
            self.feed.put((values, int(step), int(1000 * record.get("time", time.time()))))

    def finish(self, *, status: str = "FINISHED", artifacts: Sequence[tuple[Path, str]] = (),
               timeout_s: float = FINISH_TIMEOUT_S) -> Delivery:
        """Deliver what is queued and close, within ``timeout_s``; MLflow gets ``artifacts``
        ``(file, artifact directory)`` and the run's final status (``FINISHED``, ``FAILED`` or
        ``KILLED``). The :class:`Delivery` counts what was written, dropped and given up."""
        return self.feed.finish(status=status, artifacts=artifacts, timeout_s=timeout_s)
