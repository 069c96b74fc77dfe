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
  (``section.key``, secrets redacted as everywhere), metrics batched every few seconds, and at
  the end the exported TorchScript policy (and its JSON sidecar) as artifacts, the summary's
  numbers as ``summary/...`` metrics (extra ``mlflow``). A pipeline whose tracking URI does
  not answer stops before any cluster starts.

Trackers are best effort, like the dashboard: a tracker that fails logs one warning and the run
goes on; ``metrics.jsonl`` stays the record.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from dask_rl.config.loader import public_dict
from dask_rl.config.schema import ConfigError, PipelineConfig

logger = logging.getLogger(__name__)

KINDS = ("learner", "rollout", "round", "eval", "generation", "replay", "allocation", "run")
RENAMED = {"steps_per_s": "charts/SPS", "staleness": "staleness/gradient",
           "policy_lag": "staleness/policy_lag"}
SKIP = {"time", "env_steps", "env_steps_collected", "wall_s", "updates", "version",
        "version_after", "version_pulled", "episodes"}
MLFLOW_FILE = "mlflow.json"
FLUSH_S = 5.0


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
    """The pipeline as ``section.key`` strings (what leaves the driver: secrets redacted)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[prefix] = text[:500]   # MLflow caps a param's value

    walk("", public_dict(cfg))
    return out


def check(cfg: PipelineConfig) -> None:
    """Before any cluster starts: the trackers the pipeline asks for are installed, and an
    MLflow tracking URI answers (one try, no retries). A :class:`ConfigError` otherwise."""
    import importlib.util
    import os

    for key, wanted, package in (("tensorboard", cfg.logging.tensorboard, "tensorboard"),
                                 ("mlflow", cfg.logging.mlflow is not None, "mlflow")):
        if wanted and importlib.util.find_spec(package) is None:
            raise ConfigError(f"logging.{key}: the {package} package is not installed: "
                              f"pip install 'dask-rl[{key}]'")
    if cfg.logging.mlflow is None:
        return
    from mlflow.tracking import MlflowClient

    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES",
                                            "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="10")
    try:
        MlflowClient(tracking_uri=cfg.logging.mlflow.tracking_uri).search_experiments(
            max_results=1)
    except Exception as e:
        raise ConfigError(f"logging.mlflow.tracking_uri: cannot reach MLflow there "
                          f"({' '.join(str(e).split())[:200]}), got "
                          f"{cfg.logging.mlflow.tracking_uri!r}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Trackers:
    """The trackers a pipeline asks for, for one run directory."""

    def __init__(self, cfg: PipelineConfig, run_dir: Path, *, resume: bool = False):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.writer: Any = None
        self.mlflow: Any = None
        self.run_id: str | None = None
        self.pending: list[Any] = []
        self.last_flush = time.time()
        self.failed: set[str] = set()
        if cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if cfg.logging.mlflow is not None:
            self._open_mlflow(resume)

    @property
    def enabled(self) -> bool:
        return self.writer is not None or self.mlflow is not None

    def _open_mlflow(self, resume: bool) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        m = self.cfg.logging.mlflow
        assert m is not None
        self.mlflow = MlflowClient(tracking_uri=m.tracking_uri)
        saved = self.run_dir / MLFLOW_FILE
        if resume and saved.exists():
            self.run_id = json.loads(saved.read_text())["run_id"]
            self.mlflow.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.mlflow.get_experiment_by_name(m.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.mlflow.create_experiment(m.experiment))
        run = self.mlflow.create_run(experiment_id, run_name=m.run_name or self.run_dir.name,
                                     tags={"dask_rl.run_dir": str(self.run_dir.resolve()),
                                           "dask_rl.algorithm": self.cfg.algo.name,
                                           "dask_rl.env": self.cfg.env.name})
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in flat_params(self.cfg).items()]
        for i in range(0, len(params), 100):   # MLflow takes at most 100 params a batch
            self.mlflow.log_batch(self.run_id, params=params[i:i + 100])
        saved.write_text(json.dumps({"run_id": self.run_id,
                                     "tracking_uri": self.mlflow.tracking_uri}))

    def write(self, record: dict[str, Any]) -> None:
        """One record, as ``metrics.jsonl`` got it (a tracker that failed is off for good:
        retrying a server that went away would stall the run on every record)."""
        step = record.get("env_steps")
        values = scalars(record)
        if not values or step is None:
            return
        if self.writer is not None and "tensorboard" not in self.failed:
            self._guard("tensorboard", self._tensorboard, values, int(step))
        if self.mlflow is not None and "mlflow" not in self.failed:
            from mlflow.entities import Metric

            ms = int(1000 * record.get("time", time.time()))
            self.pending += [Metric(k, v, ms, int(step)) for k, v in values.items()]
            if time.time() - self.last_flush > FLUSH_S or len(self.pending) >= 900:
                self._guard("mlflow", self._flush)

    def _tensorboard(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def _flush(self) -> None:
        self.last_flush = time.time()
        batch, self.pending = self.pending, []
        for i in range(0, len(batch), 900):    # MLflow takes at most 1000 metrics a batch
            self.mlflow.log_batch(self.run_id, metrics=batch[i:i + 900])

    def _guard(self, name: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # best effort, like the dashboard: the run goes on
            logger.warning("%s tracking failed (%s); it is off for the rest of the run, and "
                           "metrics.jsonl keeps every record", name, e)
            self.failed.add(name)

    def finish(self, *, status: str = "FINISHED", artifacts: list[tuple[Path, str]] = ()
               ) -> None:
        """Flush and close; MLflow gets ``artifacts`` ``(file, artifact directory)`` and the
        run's final status (``FINISHED``, ``FAILED`` or ``KILLED``)."""
        if self.writer is not None:
            self._guard("tensorboard", self.writer.close)
            self.writer = None
        if self.mlflow is not None and "mlflow" not in self.failed:
            self._guard("mlflow", self._flush)
            for path, where in artifacts:
                self._guard("mlflow", self.mlflow.log_artifact, self.run_id, str(path), where)
            self._guard("mlflow", self.mlflow.set_terminated, self.run_id, status)
            self.mlflow = None
