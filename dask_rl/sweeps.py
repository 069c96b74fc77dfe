"""Hyperparameter sweeps on the cluster: Optuna over ordinary dask-rl runs.

``dask-rl sweep PIPELINE --space sweep.yaml --trials N`` (or :func:`sweep`) asks Optuna for
trials — TPE by default — and trains ``--parallel`` of them at once on one Dask cluster, each
an ordinary run with its own run directory (``SWEEP_DIR/trial-007``: summary, metrics,
checkpoints, all the usual tools work on it). A trial's value is its run's final greedy return
(``summary.json``'s ``final_return``: the confirming evaluation when it solved); its
intermediate values are the run's screening evaluations, reported to Optuna at step k for the
k-th evaluation (a grid every trial shares, so that the median pruner compares like with like),
and Optuna's ``MedianPruner`` stops a trial whose evaluation falls below the median of the
trials before it at the same step (from its evaluation ``prune_warmup + 1`` on: the first
ones are noisy). A pruned trial is asked to stop like an interrupted run: it ends with a final
checkpoint and its ``summary.json`` (``stop_reason`` ``pruned``), then counts as pruned.

SIGINT or SIGTERM (Ctrl-C; ``kill``; a pod's termination) stops the sweep: no trial starts, the
running ones stop soon, each with a final checkpoint and its summary (``stop_reason``
``interrupted``), and the sweep records them as interrupted (:attr:`SweepResult.interrupted`):
like the trials a killed driver left running, they do not count, and ``--resume`` asks for their
parameters again. A second signal aborts at once. A trial interrupted from elsewhere in the
process (:func:`dask_rl.api.interrupt_running`) stops the sweep the same way.

The study lives in ``SWEEP_DIR/optuna.journal`` (Optuna's ``JournalFileBackend``), the
pipeline and space in ``SWEEP_DIR/sweep.json``: after the sweep's driver is killed, ``--resume``
(with the same pipeline and space, or it refuses) reloads it, keeps every finished trial
(complete, pruned or failed), marks the trials that were running as interrupted and asks for
their parameters again, and runs until ``N`` trials have had their turn. Three failed trials
in a row stop the sweep (one line naming the last reason). After every trial
``SWEEP_DIR/results.json`` and ``results.md`` hold the table and ``SWEEP_DIR/best.yaml`` the
best trial's full pipeline. The sampler is TPE (with the constant-liar heuristic, so that
trials running at once do not all sample one region) or, with ``--sampler random``, random.

The space file maps pipeline keys to distributions::

    learner.lr: {low: 1.0e-4, high: 3.0e-3, log: true}
    algo.ent_coef: {low: 0.0, high: 0.05}
    learner.max_learners: {low: 1, high: 4, int: true}
    aggregation.strategy: {choices: [async, stellaris]}
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from dask_rl.api import interrupt_running, resolve, train
from dask_rl.config import ConfigError, PipelineConfig, public_dict
from dask_rl.data import Progress

logger = logging.getLogger(__name__)

JOURNAL = "optuna.journal"
STUDY = "dask-rl"


@dataclass
class SweepResult:
    """The table of trials and the best one (also in ``results.json`` and ``best.yaml``)."""

    sweep_dir: Path
    trials: list[dict] = field(default_factory=list)
    best: dict | None = None
    interrupted: bool = False   # an interrupt ended the sweep before it had all its trials
    stopped: list[int] = field(default_factory=list)   # the trials that interrupt stopped


def load_space(space: str | Path | dict, cfg: PipelineConfig) -> dict[str, dict]:
    """The space (a YAML file or a mapping), checked: every key a pipeline key, every entry a
    distribution, every corner a valid pipeline."""
    name = "space"
    if not isinstance(space, dict):
        path = Path(space)
        name = path.name
        if not path.is_file():
            raise ConfigError(f"--space: no such file, got {str(path)!r}")
        try:
            space = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not YAML ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{name}: expected a mapping of pipeline keys to distributions")
    for key, spec in space.items():
        where = f"{name}: {key}"
        if not _has_key(cfg, str(key)):
            raise ConfigError(f"{where}: not a key of the pipeline")
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: expected {{low, high[, log, int]}} or {{choices}}, "
                              f"got {spec!r}")
        if "choices" in spec:
            if not isinstance(spec["choices"], list) or not spec["choices"]:
                raise ConfigError(f"{where}: choices must be a non-empty list")
        elif not {"low", "high"} <= set(spec) or not set(spec) <= {"low", "high", "log", "int"}:
            raise ConfigError(f"{where}: expected {{low, high[, log, int]}} or {{choices}}, "
                              f"got {spec!r}")
        elif not float(spec["low"]) < float(spec["high"]):
            raise ConfigError(f"{where}: low must be < high, got {spec!r}")
    # every corner of the space must make a valid pipeline: said now, not at trial 5
    for key, spec in space.items():
        for value in (spec["choices"] if "choices" in spec else (spec["low"], spec["high"])):
            resolve(cfg, [f"{key}={json.dumps(value)}"])
    return space


def _has_key(cfg: Any, key: str) -> bool:
    node = cfg
    for part in key.split("."):
        if not dataclasses.is_dataclass(node) or part not in {
                f.name for f in dataclasses.fields(node)}:
            return False
        node = getattr(node, part)
    return not dataclasses.is_dataclass(node)   # a value, not a section


def suggest(trial: Any, space: dict[str, dict]) -> dict[str, Any]:
    """One trial's values for the space."""
    out = {}
    for key, spec in space.items():
        if "choices" in spec:
            out[key] = trial.suggest_categorical(key, spec["choices"])
        elif spec.get("int"):
            out[key] = trial.suggest_int(key, int(spec["low"]), int(spec["high"]),
                                         log=bool(spec.get("log")))
        else:
            out[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]),
                                           log=bool(spec.get("log")))
    return out


def _overrides(params: dict[str, Any]) -> list[str]:
    return [f"{k}={json.dumps(v)}" for k, v in params.items()]


SAMPLERS = ("tpe", "random")


def _study(sweep_dir: Path, *, resume: bool, seed: int, prune_warmup: int, sampler: str):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / JOURNAL)))
    # a resumed sweep's sampler must not replay the killed one's random draws: its seed moves
    # on by the trials already asked for (still reproducible from the journal)
    asked = 0
    if resume:
        asked = len(optuna.load_study(study_name=STUDY, storage=storage).get_trials(
            deepcopy=False))
    draws = seed + asked
    chosen = (optuna.samplers.RandomSampler(seed=draws) if sampler == "random" else
              # constant liar: trials running at once do not all sample the same region
              optuna.samplers.TPESampler(seed=draws, constant_liar=True))
    return optuna.create_study(
        study_name=STUDY, storage=storage, load_if_exists=resume, direction="maximize",
        sampler=chosen,
        # the first evaluations are noisy (a few episodes, early in training): no pruning
        # before a trial's evaluation prune_warmup + 1
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=prune_warmup))


def _requeue_interrupted(study: Any, sweep_dir: Path) -> int:
    """Trials a killed driver left running: interrupted (:func:`_requeue`)."""
    from optuna.trial import TrialState

    stale = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
    _requeue(study, sweep_dir, stale)
    return len(stale)


def _requeue(study: Any, sweep_dir: Path, trials: list[Any]) -> None:
    """Trials that did not have their turn (their sweep was stopped or killed): failed, their
    parameters asked for again, and their numbers kept in ``interrupted.json`` (they do not
    count as finished trials)."""
    from optuna.trial import TrialState

    for t in trials:
        study.tell(t.number, state=TrialState.FAIL)
        study.enqueue_trial(t.params, skip_if_exists=False)
    _write_json(sweep_dir / "interrupted.json",
                sorted(set(_interrupted(sweep_dir)) | {t.number for t in trials}))


def _interrupted(sweep_dir: Path) -> list[int]:
    path = sweep_dir / "interrupted.json"
    return json.loads(path.read_text()) if path.exists() else []


def _write_json(path: Path, data: Any) -> None:
    """Written whole or not at all (readers never see half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


MAX_FAILURES_IN_A_ROW = 3


@contextlib.contextmanager
def _stop_on_signals(stop: Callable[[], None]):
    """The first SIGINT or SIGTERM calls ``stop``; a second raises KeyboardInterrupt (abort).
    The trials run in threads, where no signal arrives (so their runs' own handlers are not
    installed): the sweep's main thread catches it for them. Only where signals can be caught
    (the main thread); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = []

    def handler(signum, frame):
        presses.append(signum)
        if len(presses) > 1:
            raise KeyboardInterrupt
        stop()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def sweep(pipeline: Any, space: str | Path | dict, *, trials: int, sweep_dir: str | Path,
          parallel: int = 2, resume: bool = False, client: Any = None,
          address: str | None = None, workers: int | None = None, seed: int = 0,
          overrides: list[str] | None = None, prune_warmup: int = 3, sampler: str = "tpe",
          on_trial: Callable[[dict], None] | None = None) -> SweepResult:
    """Run (or, with ``resume``, finish) a sweep of ``trials`` trials, ``parallel`` at once on
    one cluster (``client``, ``address`` or the pipeline's own); see the module doc."""
    from optuna.trial import TrialState

    cfg = resolve(pipeline, overrides or [])
    spec = load_space(space, cfg)
    if trials < 1 or parallel < 1 or prune_warmup < 0:
        raise ConfigError(f"--trials and --parallel must be >= 1, --prune-warmup >= 0, got "
                          f"{trials}, {parallel}, {prune_warmup}")
    if sampler not in SAMPLERS:
        raise ConfigError(f"--sampler: must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    sweep_dir = Path(sweep_dir)
    journal = sweep_dir / JOURNAL
    what = {"pipeline": public_dict(cfg), "space": spec}
    if resume:
        if not journal.exists():
            raise ConfigError(f"--resume: no sweep in {sweep_dir} (no {JOURNAL})")
        before = json.loads((sweep_dir / "sweep.json").read_text())
        for key in ("pipeline", "space"):
            if json.dumps(before[key], sort_keys=True) != json.dumps(what[key], sort_keys=True):
                raise ConfigError(f"--resume: the {key} differs from the sweep's in "
                                  f"{sweep_dir}; resume with the one it started with")
    elif sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise ConfigError(f"{sweep_dir}: holds a sweep already; --resume continues it, or "
                          f"choose another --sweep-dir")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        _write_json(sweep_dir / "sweep.json", what)
    study = _study(sweep_dir, resume=resume, seed=seed, prune_warmup=prune_warmup,
                   sampler=sampler)
    if resume:
        again = _requeue_interrupted(study, sweep_dir)
        if again:
            logger.warning("resuming: %d trial(s) the killed sweep left running will run again",
                           again)
    interrupted = set(_interrupted(sweep_dir))
    lock = threading.Lock()
    result = SweepResult(sweep_dir)
    failures: list[str] = []   # reasons of the trials that failed in a row
    stopping = threading.Event()   # set by SIGINT/SIGTERM: no new trials, running ones stop
    running: dict[int, Path] = {}  # trial number -> run directory, of the trials training now

    def stop() -> None:
        # called in a signal handler: no lock the main thread could hold (it holds none)
        stopping.set()
        for run_dir in tuple(running.values()):
            interrupt_running("interrupted", run_dir=run_dir)

    def counted() -> int:
        """Trials that took their turn: complete, pruned, failed (not interrupted), or
        running."""
        return sum(t.state != TrialState.WAITING and not (
            t.state == TrialState.FAIL and t.number in interrupted)
            for t in study.get_trials(deepcopy=False))

    def one_trial(c: Any) -> bool:
        """Ask for a trial and run it; False when the sweep has all it needs."""
        with lock:
            if (stopping.is_set() or counted() >= trials
                    or len(failures) >= MAX_FAILURES_IN_A_ROW):
                return False
            trial = study.ask()
            params = suggest(trial, spec)
        run_dir = sweep_dir / f"trial-{trial.number:03d}"
        running[trial.number] = run_dir
        reported = [0]
        asked: list[str] = []   # the reason this trial was asked to stop, once asked

        def progress(p: Progress) -> None:
            if asked:
                return
            if stopping.is_set():
                # the signal came before this run could be reached (it was starting)
                asked.append("interrupted")
                interrupt_running("interrupted", run_dir=run_dir)
                return
            # the k-th screening evaluation is step k: a grid every trial shares
            while reported[0] < len(p.screenings):
                reported[0] += 1
                trial.report(float(p.screenings[reported[0] - 1]), step=reported[0])
                if trial.should_prune():
                    # the run stops like an interrupted one: a final checkpoint and a summary
                    logger.info("trial %d pruned at screening %d: %.1f", trial.number,
                                reported[0], p.screenings[reported[0] - 1])
                    asked.append("pruned")
                    interrupt_running("pruned", run_dir=run_dir)
                    return

        t0 = time.time()
        row: dict[str, Any] = {"trial": trial.number, "params": params, "run_dir": str(run_dir)}
        try:
            summary = train(cfg, client=c, run_dir=run_dir, overrides=_overrides(params),
                            progress=progress).summary
        except Exception as e:
            reason = " ".join(str(e).split())[:300] or type(e).__name__
            if stopping.is_set():
                # an error while the sweep stops (its cluster may be closing): the trial
                # did not have its turn
                logger.warning("trial %d ended with an error while the sweep stopped: %s",
                               trial.number, reason)
                with lock:
                    _requeue(study, sweep_dir, [trial])
                    interrupted.add(trial.number)
                    result.stopped.append(trial.number)
                row.update(state="INTERRUPTED", value=None, error=reason)
            else:
                logger.warning("trial %d failed: %s", trial.number, reason)
                with lock:
                    study.tell(trial, state=TrialState.FAIL)
                    failures.append(reason)
                row.update(state="FAIL", value=None, error=reason)
        else:
            row.update(solved=summary.get("solved"), env_steps=summary.get("env_steps"),
                       stop_reason=summary.get("stop_reason"))
            if asked == ["pruned"]:
                with lock:
                    study.tell(trial, state=TrialState.PRUNED)
                    failures.clear()
                row.update(state="PRUNED", value=None)
            elif summary.get("stop_reason") == "interrupted":
                # interrupted from outside the sweep (``interrupt_running()``) too: the sweep
                # stops with it; asked again at once, the trial would be interrupted again
                stopping.set()
                with lock:
                    _requeue(study, sweep_dir, [trial])
                    interrupted.add(trial.number)
                    result.stopped.append(trial.number)
                row.update(state="INTERRUPTED", value=None)
            else:   # it ended on its own, even if the sweep was stopping by then
                value = summary.get("final_return")
                with lock:
                    study.tell(trial, float(value) if value is not None else float("-inf"))
                    failures.clear()
                row.update(state="COMPLETE", value=value)
        finally:
            running.pop(trial.number, None)
        row["wall_s"] = time.time() - t0
        with lock:
            _write_results(study, sweep_dir, cfg, result)
        if on_trial is not None:
            on_trial(row)
        return True

    def run_all(c: Any) -> None:
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                while one_trial(c):
                    pass
            except BaseException as e:  # raised in the sweep's thread below
                errors.append(e)

        # daemon threads: a second Ctrl-C aborts without waiting for the trials
        threads = [threading.Thread(target=worker, name=f"dask-rl-sweep-{i}", daemon=True)
                   for i in range(parallel)]
        for t in threads:
            t.start()
        said = False
        for t in threads:
            while t.is_alive():
                # waits with a timeout: a signal's handler runs in this thread meanwhile
                if not said and stopping.wait(0.25):
                    said = True
                    logger.warning("interrupted: no new trials; the running ones stop "
                                   "after a final checkpoint and summary (a second Ctrl-C "
                                   "aborts)")
                t.join(0.25)
        if errors:
            raise errors[0]

    with _stop_on_signals(stop):
        if client is not None:
            run_all(client)
        else:
            from dask_rl.runtime.cluster import connect

            with connect(cfg.cluster, address=address, n_workers=workers) as c:
                run_all(c)
    result.interrupted = stopping.is_set()
    _write_results(study, sweep_dir, cfg, result)
    if len(failures) >= MAX_FAILURES_IN_A_ROW and not result.interrupted:
        raise RuntimeError(f"sweep stopped: {len(failures)} trials failed in a row; the last: "
                           f"{failures[-1]}")
    return result


def check_installed() -> None:
    """Optuna is there (extra ``sweep``), said in one line before any cluster starts."""
    if importlib.util.find_spec("optuna") is None:
        raise ConfigError("sweep: the optuna package is not installed: "
                          "pip install 'dask-rl[sweep]'")


def _write_results(study: Any, sweep_dir: Path, cfg: PipelineConfig,
                   result: SweepResult) -> None:
    """``results.json`` (every trial) and ``best.yaml`` (the best trial's pipeline)."""
    from optuna.trial import TrialState

    rows = []
    interrupted = set(_interrupted(sweep_dir))
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.WAITING:   # parameters queued to be asked for again
            continue
        run_dir = sweep_dir / f"trial-{t.number:03d}"
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError):   # not written (failed, killed) or being written
            summary = {}
        state = ("INTERRUPTED" if t.state == TrialState.FAIL and t.number in interrupted
                 else t.state.name)
        rows.append({"trial": t.number, "state": state, "value": t.value,
                     "params": t.params, "evaluations": list(t.intermediate_values.values()),
                     "solved": summary.get("solved"), "env_steps": summary.get("env_steps"),
                     "wall_s": summary.get("wall_s"),
                     "stop_reason": summary.get("stop_reason"), "run_dir": str(run_dir)})
    result.trials = rows
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    best = max(complete, key=lambda t: t.value) if complete else None
    result.best = None
    if best is not None:
        best_cfg = resolve(cfg, _overrides(best.params))
        result.best = {"trial": best.number, "value": best.value, "params": best.params,
                       "run_dir": str(sweep_dir / f"trial-{best.number:03d}")}
        tmp = sweep_dir / "best.yaml.tmp"
        tmp.write_text(yaml.safe_dump(public_dict(best_cfg), sort_keys=False))
        os.replace(tmp, sweep_dir / "best.yaml")
    _write_json(sweep_dir / "results.json",
                {"best": result.best, "trials": rows, "pipeline": public_dict(cfg)})
    (sweep_dir / "results.md").write_text(table(result) + "\n")


def table(result: SweepResult) -> str:
    """The trials as a markdown table, best first."""
    rows = sorted(result.trials, key=lambda r: (r["value"] is None, -(r["value"] or 0.0)))
    keys = sorted({k for r in rows for k in r["params"]})
    head = ["trial", "state", "value", "solved", "env steps", *keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        value = "-" if r["value"] is None else f"{r['value']:.1f}"
        cells = [str(r["trial"]), r["state"], value, str(r.get("solved") or "-"),
                 str(r.get("env_steps") or "-")]
        cells += [_fmt(r["params"].get(k)) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
