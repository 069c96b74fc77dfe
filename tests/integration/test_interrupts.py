"""Interrupts at any moment (issue 33): SIGTERM or SIGINT to ``dask-rl train``'s process group
ends the run within 30 s with a summary and a loadable newest checkpoint, whatever is in
flight when the signal lands.

Each case starts the CLI in its own process group (as a terminal, ``timeout`` or a pod's
termination sees it: the embedded cluster's workers get the signal too; they ignore SIGINT,
SIGTERM ends them), watches ``RUN_DIR/metrics.jsonl`` until its phase has started and not
finished, and signals the group. Afterwards ``metrics.jsonl`` shows that the phase had not
finished when the signal landed (the phases are made long: many evaluation episodes, big
models, slow learners), so each case tests the moment it names. The driver marks what has no
record of its own with ``phase`` records (an evaluation, a confirmation, a checkpoint or a
learner submitted; the drain and the end of a run begun).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from dask_rl.checkpoint import CheckpointStore, StoreLocation

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"
END_WITHIN_S = 30.0      # the bound, from the signal to the process's exit
PHASE_TIMEOUT_S = 300.0  # a loaded machine starts a cluster slowly: generous, not a bound
# every case: no dashboard port to fight over, no evaluation or periodic checkpoint unless
# the case asks for one, a budget far away
QUIET = ["cluster.dashboard=false", "stop.eval_every_updates=1000000",
         "checkpoint.every_s=0", "stop.env_steps=10000000"]

Records = list[dict]
# a phase's watch: records -> the time the phase began (it is in flight), else None
Ready = Callable[[Records], "float | None"]
# records, the phase's start -> the time of the record that ends it, or None (never ended)
Ended = Callable[[Records, float], "float | None"]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    pipeline: str
    overrides: list[str]
    sig: signal.Signals
    ready: Ready
    ended: Ended


def _first(records: Records, after: float, pred: Callable[[dict], bool]) -> float | None:
    return next((r["time"] for r in records if r["time"] >= after and pred(r)), None)


def _phase(name: str) -> Callable[[dict], bool]:
    return lambda r: r["kind"] == "phase" and r.get("phase") == name


def _started(records: Records) -> float | None:
    return _first(records, 0, lambda r: r["kind"] == "run" and r.get("event") == "start")


def _open_phase(name: str, ends: Callable[[dict], bool], *, after_start: bool = False,
                also: Callable[[Records], bool] = lambda _: True) -> tuple[Ready, Ended]:
    """A phase that begins with a ``phase`` record ``name`` and ends with the first record
    ``ends`` after it."""
    def ready(records: Records) -> float | None:
        since = _started(records) if after_start else 0.0
        if since is None or not also(records):
            return None
        begun = [r["time"] for r in records if r["time"] >= since and _phase(name)(r)]
        if begun and _first(records, begun[-1], ends) is None:
            return begun[-1]
        return None

    def ended(records: Records, start: float) -> float | None:
        return _first(records, start, ends)

    return ready, ended


def _checkpointed(r: dict) -> bool:
    return r["kind"] in ("checkpoint", "checkpoint_failed")


def _evaluated(purpose: str) -> Callable[[dict], bool]:
    return lambda r: r["kind"] == "eval" and r.get("purpose") == purpose


def _before_first_checkpoint() -> tuple[Ready, Ended]:
    # the run has opened its metrics (the actor is being created, or the first checkpoint
    # written) and written no checkpoint yet
    def ready(records: Records) -> float | None:
        return 0.0 if not any(_checkpointed(r) for r in records) else None

    return ready, lambda records, start: _first(records, start, _checkpointed)


def _rollouts_at_startup() -> tuple[Ready, Ended]:
    # the loop has begun (rollouts submitted) and no trajectory has come back yet: a separate
    # learner is submitted when one does; a fused task (learner.fused, the default) reports
    # its learner when its trajectory has been learned
    def back(r: dict) -> bool:
        return r["kind"] == "learner" or (_phase("learner")(r) and "slot" not in r)

    def ready(records: Records) -> float | None:
        start = _started(records)
        if start is None or _first(records, start, back) is not None:
            return None
        return start

    return ready, lambda records, start: _first(records, start, back)


def _learner_in_flight() -> tuple[Ready, Ended]:
    # a learner submitted after at least one has finished (so its gradient's push is one of
    # the run's, not the first ever) whose report has not come back
    def done(records: Records, lid: str, after: float) -> float | None:
        return _first(records, after, lambda r: r["kind"] == "learner" and r["learner"] == lid)

    def ready(records: Records) -> float | None:
        if not any(r["kind"] == "learner" for r in records):
            return None
        for r in reversed(records):
            if _phase("learner")(r) and done(records, r["learner"], r["time"]) is None:
                return r["time"]
        return None

    def ended(records: Records, start: float) -> float | None:
        lid = next(r["learner"] for r in records if _phase("learner")(r) and r["time"] == start)
        return done(records, lid, start)

    return ready, ended


def _case(name, pipeline, overrides, sig, watch) -> Case:
    ready, ended = watch
    return Case(name, pipeline, [*QUIET, *overrides], sig, ready, ended)


PPO = "ppo_cartpole.yaml"
CASES = [
    # SIGINT: the workers live on; the first checkpoint, once the actor exists, is written
    _case("before-first-checkpoint", PPO, [], signal.SIGINT, _before_first_checkpoint()),
    _case("rollouts-at-startup", PPO, ["rollout.steps=1024"], signal.SIGTERM,
          _rollouts_at_startup()),
    _case("learner-push", PPO, ["learner.epochs=60"], signal.SIGTERM, _learner_in_flight()),
    # a long screening (many episodes) while the run trains
    _case("evaluation", PPO, ["stop.eval_every_updates=1", "stop.eval_episodes=3000"],
          signal.SIGINT, _open_phase("eval", _evaluated("screening"))),
    # a low target: the first screening reaches it, the confirmation is long
    _case("confirmation", PPO, ["stop.eval_every_updates=1", "stop.eval_episodes=2",
                                "stop.target_return=1", "stop.confirm_episodes=3000"],
          signal.SIGTERM, _open_phase("confirm", _evaluated("confirmation"))),
    # a big model: the actor's state and the store's write take seconds
    _case("checkpoint-write", PPO, ["model.hidden=[2048,2048]", "checkpoint.every_s=1"],
          signal.SIGTERM, _open_phase("checkpoint", _checkpointed, after_start=True)),
    # a replay buffer of many trajectories, written by the workers holding it
    _case("dqn-replay-checkpoint", "dqn_cartpole.yaml",
          ["checkpoint.every_s=4", "checkpoint.replay_buffer=true", "rollout.steps=256"],
          signal.SIGTERM, _open_phase(
              "checkpoint", _checkpointed, after_start=True,
              also=lambda rs: sum(r["kind"] == "rollout" for r in rs) >= 4)),
    # a budget reached: the learners of what was collected (slow ones) drain before the end
    _case("env-steps-drain", PPO, ["stop.env_steps=6000", "learner.epochs=60"],
          signal.SIGINT, _open_phase("drain", _phase("end"))),
    # the hang: the final evaluation of a budget's end, on a cluster that is going
    _case("final-evaluation", PPO, ["stop.env_steps=3000", "stop.eval_episodes=3000"],
          signal.SIGTERM, _open_phase("final", _evaluated("screening"))),
]


def _records(path: Path) -> Records:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:   # the line being written
            break
    return out


def _run_and_interrupt(case: Case, tmp_path: Path) -> dict:
    run_dir = tmp_path / "run"
    metrics = run_dir / "metrics.jsonl"
    log = open(tmp_path / "cli.log", "w")
    cmd = [sys.executable, "-m", "dask_rl.cli", "train", str(PIPELINES / case.pipeline),
           "--run-dir", str(run_dir), "--no-progress"]
    for o in case.overrides:
        cmd += ["--set", o]
    launched = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        began = None
        while began is None:
            assert proc.poll() is None, (
                f"the run ended (rc {proc.returncode}) before its phase: "
                f"{(tmp_path / 'cli.log').read_text()[-2000:]}")
            assert time.monotonic() < deadline, f"phase {case.name} never came"
            if metrics.exists():
                began = case.ready(_records(metrics))
            if began is None:
                time.sleep(0.05)
        signalled = time.time()
        os.killpg(proc.pid, case.sig)
        try:
            rc = proc.wait(timeout=END_WITHIN_S)
            took = time.time() - signalled
        except subprocess.TimeoutExpired:
            rc, took = None, None
        return {"rc": rc, "took": took, "signalled": signalled, "began": began,
                "waited": signalled - launched,
                "run_dir": run_dir, "log": (tmp_path / "cli.log").read_text()}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:  # the cluster's workers, should any outlive the driver
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_interrupt_ends_the_run_in_time_with_a_summary(case, tmp_path):
    got = _run_and_interrupt(case, tmp_path)
    run_dir = got["run_dir"]
    print(f"{case.name}: {case.sig.name} {got['waited']:.0f} s after the start; exit "
          f"{got['rc']} {got['took'] or float('nan'):.1f} s after it")
    records = _records(run_dir / "metrics.jsonl")
    # the moment: the phase had begun, and had not ended, when the signal landed
    assert got["began"] <= got["signalled"]
    ended = case.ended(records, got["began"])
    assert ended is None or ended > got["signalled"], (
        f"{case.name} ended at {ended:.3f}, before the signal at {got['signalled']:.3f}")

    assert got["rc"] is not None, (
        f"still running {END_WITHIN_S:g} s after {case.sig.name}: {got['log'][-3000:]}")
    # the CLI's interrupted exit and its one line, not a failure or a traceback of the driver
    # (a worker going with the group may log its closed comms: that is not the run's end)
    assert got["rc"] == 130, got["log"][-3000:]
    assert "dask-rl: interrupted after" in got["log"], got["log"][-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted"
    # no parameter actor is re-created on a cluster that is going
    assert not [r for r in records if r["kind"] == "recovery" and r["time"] > got["signalled"]]
    # no evaluation is started once interrupted: the final return is the last screening's
    last = [r for r in records if r["kind"] == "eval" and r["time"] < got["signalled"]]
    assert summary["final_return"] == (last[-1]["mean_return"] if last else None)

    # the newest checkpoint loads; the summary says whether the final one was written
    # (the actor existed when its first checkpoint began)
    had_actor = any(_phase("checkpoint")(r) and r["time"] < got["signalled"] for r in records)
    store = CheckpointStore(StoreLocation.find(run_dir).path)
    latest = store.latest()
    assert summary["latest_checkpoint"] == latest
    saved = any(r["kind"] == "checkpoint" and r["time"] < got["signalled"] for r in records)
    if saved or (case.sig == signal.SIGINT and had_actor):
        assert latest is not None
    if latest is not None:
        state, meta = store.load(latest)
        assert state["actor"]["params"].size > 0
    written = [r["name"] for r in records if r["kind"] == "checkpoint"
               and r["time"] > got["signalled"]]
    if summary["final_checkpoint"]:
        assert written and written[-1] == latest
    if case.sig == signal.SIGINT and had_actor:
        # the workers ignore SIGINT: the actor answers, and the final policy is saved
        assert summary["final_checkpoint"]
