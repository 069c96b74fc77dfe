"""Fault injection: the parameter actor's worker is SIGKILLed inside each kind of driver call.

Each case trains on a real LocalCluster (worker processes, restarted by their nannies) and
kills the process holding the parameter actor at one chosen moment: just before the n-th
driver call of a kind (checkpoint, round end, heartbeat, evaluation, the end-of-run metrics,
a lost learner's release, an ES generation's perturbations, update or noiseless evaluation,
a PBT exploit), with checkpoint cadences from 1 s to end-only. Every run must finish with a
trained policy, a counted recovery, and the exactly-once invariant: every distinct push the
final actor holds arrived at its strategy once (``arrived == distinct - rejected``).

A learner's own worker killed right after its push is the other half of exactly-once: Dask
re-runs the learner, and the actor refuses the second push.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

import dask_rl
from dask_rl.checkpoint import CheckpointStore
from dask_rl.data.metrics import read_metrics
from dask_rl.runtime import driver as driver_module
from dask_rl.runtime import es as es_module
from dask_rl.runtime.pbt import PBTDriver
from dask_rl.runtime.supervisor import ActorSupervisor
from dask_rl.runtime.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PIPELINES = Path(__file__).parents[2] / "pipelines"
FAST = ["checkpoint.heartbeat_s=0.5", "checkpoint.actor_timeout_s=5",
        "checkpoint.max_recoveries=3"]


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster:
        with Client(cluster) as c:
            yield c


def kill_actor_worker(trainer) -> None:
    """SIGKILL the worker process that holds ``trainer``'s parameter actor."""
    addr = trainer.supervisor.address
    pid = trainer.client.run(os.getpid, workers=[addr])[addr]
    os.kill(pid, signal.SIGKILL)


class Fault:
    """Kill the actor's worker just before the ``nth`` matching call of a patched method."""

    def __init__(self, nth: int):
        self.nth = nth
        self.seen = 0
        self.fired = False

    def due(self) -> bool:
        self.seen += 1
        if not self.fired and self.seen == self.nth:
            self.fired = True
            return True
        return False


def _patch(monkeypatch, where: str, fault: Fault) -> None:
    kind, _, name = where.partition(":")
    if kind == "call":  # a driver-side actor call by method name
        original = Trainer.actor_call

        def actor_call(self, method, *args, **kwargs):
            if method == name and fault.due():
                kill_actor_worker(self)
            return original(self, method, *args, **kwargs)
        monkeypatch.setattr(Trainer, "actor_call", actor_call)
    elif kind == "heartbeat":
        original_due = ActorSupervisor.heartbeat_due

        def heartbeat_due(self):
            due = original_due(self)
            if due and fault.due():
                addr = self.address
                os.kill(self.client.run(os.getpid, workers=[addr])[addr], signal.SIGKILL)
            return due
        monkeypatch.setattr(ActorSupervisor, "heartbeat_due", heartbeat_due)
    elif kind == "eval":  # a greedy evaluation task in flight
        original_eval = driver_module.Driver._submit_eval

        def submit_eval(self, *args):
            fut = original_eval(self, *args)
            if fault.due():
                kill_actor_worker(self)
            return fut
        monkeypatch.setattr(driver_module.Driver, "_submit_eval", submit_eval)
    elif kind == "es":  # ES gathers: perturbations, update, (noiseless evaluation), ...
        original_gather = es_module.ESDriver._gather

        def gather(self, futures, also=(), timeout=None):
            if fault.due():
                kill_actor_worker(self)
            return original_gather(self, futures, also, timeout)
        monkeypatch.setattr(es_module.ESDriver, "_gather", gather)
    else:
        raise ValueError(where)


def _check_exactly_once(run_dir: Path, summary: dict) -> None:
    state, _ = CheckpointStore(run_dir / "checkpoints").load()
    actor = state["actor"]
    stats = actor["strategy"]["stats"]
    distinct = len(np.asarray(actor["seen"]))
    assert distinct > 0
    # every push the actor took reached its strategy once: nothing applied twice
    assert stats["arrived"] == distinct - int(actor["rejected"]), (stats, distinct)
    assert stats["applied"] + stats["dropped"] <= stats["arrived"]
    assert summary["gradients_applied"] == stats["applied"]


ASYNC = ["aggregation.strategy=async", "stop.env_steps=60000"]
STELLARIS = ["stop.env_steps=60000"]
ES = ["stop.env_steps=120000", "algo.eval_every=1"]

# (id, pipeline, overrides, where, nth): 14 moments over three drivers
CASES = [
    ("async-checkpoint-1s", "ppo_cartpole.yaml", ASYNC + ["checkpoint.every_s=1"],
     "call:state_dict", 3),
    ("async-checkpoint-first", "ppo_cartpole.yaml", ASYNC + ["checkpoint.every_s=1"],
     "call:state_dict", 2),
    ("async-round-end", "ppo_cartpole.yaml", ASYNC + ["checkpoint.every_s=2"],
     "call:round_end", 5),
    # the heartbeat cases train their whole budget: a solve can end a run within its first
    # few heartbeats (0.5 s apart), and the fault would land after the run's stop instead
    ("async-heartbeat", "ppo_cartpole.yaml",
     ASYNC + ["checkpoint.every_s=3", "stop.solve_on_target=false"], "heartbeat", 4),
    ("async-evaluation", "ppo_cartpole.yaml",
     ASYNC + ["checkpoint.every_s=1", "stop.eval_every_updates=10"], "eval", 2),
    ("async-heartbeat-end-only-checkpoints", "ppo_cartpole.yaml",
     ASYNC + ["checkpoint.every_s=0", "stop.solve_on_target=false"], "heartbeat", 3),
    ("async-end-metrics", "ppo_cartpole.yaml",
     ASYNC + ["checkpoint.every_s=1", "stop.env_steps=30000", "stop.solve_on_target=false"],
     "call:metrics", 1),
    ("stellaris-round-end", "ppo_cartpole_stellaris.yaml",
     STELLARIS + ["checkpoint.every_s=1"], "call:round_end", 3),
    ("stellaris-checkpoint", "ppo_cartpole_stellaris.yaml",
     STELLARIS + ["checkpoint.every_s=2"], "call:state_dict", 3),
    ("stellaris-heartbeat", "ppo_cartpole_stellaris.yaml",
     STELLARIS + ["checkpoint.every_s=1", "stop.solve_on_target=false"], "heartbeat", 6),
    ("sync-expect-learners", "ppo_cartpole_sync.yaml",
     ["stop.env_steps=60000", "checkpoint.every_s=1"], "call:expect_learners", 6),
    ("es-perturbations", "es_cartpole.yaml", ES + ["checkpoint.every_s=1"], "es", 4),
    ("es-update", "es_cartpole.yaml", ES + ["checkpoint.every_s=1"], "es", 5),
    ("es-noiseless-evaluation", "es_cartpole.yaml", ES + ["checkpoint.every_s=2"], "es", 6),
    ("es-checkpoint", "es_cartpole.yaml", ES + ["checkpoint.every_s=1"],
     "call:state_dict", 3),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_actor_lost_at_any_moment(client, tmp_path, monkeypatch, case):
    _, pipeline, overrides, where, nth = case
    fault = Fault(nth)
    _patch(monkeypatch, where, fault)
    run_dir = tmp_path / "run"
    cfg = dask_rl.api.resolve(PIPELINES / pipeline, FAST + overrides)
    result = dask_rl.train(cfg, client=client, run_dir=run_dir)
    s = result.summary
    assert fault.fired, f"the run never reached call {nth} of {where}"
    assert s["recoveries"] >= 1, s
    records = read_metrics(run_dir / "metrics.jsonl")
    assert sum(r["kind"] == "recovery" for r in records) == s["recoveries"]
    assert s["updates_discarded"] >= 0 and s["env_steps_discarded"] >= 0
    assert s["final_return"] >= 100, s  # a trained policy (an untrained one: ~10-40)
    _check_exactly_once(run_dir, s)


def test_the_actor_lost_after_a_confirmed_solve_judges_the_policy_left(client, tmp_path,
                                                                         monkeypatch):
    """Solved and confirmed, then the actor's worker dies before the final checkpoint: the
    rollback to the initial checkpoint (the only one) takes the confirmed policy with it, and
    the summary must judge the policy the run now holds, not claim the lost one."""
    original = driver_module.Driver._finish
    lost = []

    def finish(self):
        if self.stop_reason == "solved" and not lost:
            lost.append(self.confirmation.version)
            kill_actor_worker(self)
        return original(self)
    monkeypatch.setattr(driver_module.Driver, "_finish", finish)
    cfg = dask_rl.api.resolve(PIPELINES / "ppo_cartpole.yaml",
                              FAST + ASYNC + ["checkpoint.every_s=0", "stop.target_return=100"])
    s = dask_rl.train(cfg, client=client, run_dir=tmp_path / "run").summary
    assert lost and lost[0] > 0, "the run did not solve"
    assert s["recoveries"] >= 1 and s["updates_discarded"] >= lost[0], s
    assert s["updates"] == 0  # back to the initial checkpoint
    # whatever was confirmed is the policy the run ends with
    assert s["confirmation"] is None or s["confirmation"]["version"] == s["updates"], s
    assert not s["solved"] or s["confirmation"] is not None


def test_a_pbt_exploit_whose_member_actor_dies(client, tmp_path, monkeypatch):
    """The exploit's copy fails with the loser's actor: skipped, the member recovers."""
    original = PBTDriver._exploit
    fired = []

    def exploit(self, loser, winner):
        if not fired:
            fired.append(loser)
            kill_actor_worker(self.members[loser])
        return original(self, loser, winner)
    monkeypatch.setattr(PBTDriver, "_exploit", exploit)
    cfg = dask_rl.api.resolve(PIPELINES / "pbt_cartpole.yaml",
                              FAST + ["stop.env_steps=30000", "checkpoint.every_s=1",
                                      # many ready events, half the members exploitable: an
                                      # exploit comes early in every run
                                      "population.ready_env_steps=4096",
                                      "population.fraction=0.5"])
    result = dask_rl.train(cfg, client=client, run_dir=tmp_path / "pbt")
    s = result.summary
    assert fired, "no exploit happened"
    assert s["recoveries"] >= 1, s
    lineage = [r for r in read_metrics(tmp_path / "pbt" / "metrics.jsonl")
               if r["kind"] == "lineage"]
    assert any(r["event"] == "exploit_failed" for r in lineage), lineage


def test_a_learner_killed_right_after_its_push_is_not_applied_twice(client, tmp_path):
    """The learner's worker dies between its push and its result: Dask runs the learner again
    and the actor refuses the second push of the same sequence number."""
    marker = tmp_path / "killed"

    def install(dask_worker):
        from dask_rl.runtime import handle

        original = handle.ActorHandle.call
        if getattr(original, "_fault", False):
            return

        def call(self, method, *args, **kwargs):
            out = original(self, method, *args, **kwargs)
            # a learner on another worker than the actor's: the actor lives on
            if method == "push" and (kwargs.get("seq") or 0) >= 10 and self._where()[1] is None:
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    return out
                os.write(fd, str(kwargs["seq"]).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        call._fault = True
        handle.ActorHandle.call = call

    from distributed import Client, LocalCluster
    from distributed.diagnostics.plugin import WorkerPlugin

    class Fault(WorkerPlugin):
        def setup(self, worker):
            install(worker)

    run_dir = tmp_path / "run"
    # its own cluster: the actor on a worker of its own, learners on the others
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster, \
            Client(cluster) as c:
        c.register_plugin(Fault(), name="push-then-die")
        cfg = dask_rl.api.resolve(PIPELINES / "ppo_cartpole.yaml",
                                  FAST + ASYNC + ["checkpoint.every_s=1"])
        result = dask_rl.train(cfg, client=c, run_dir=run_dir)
    s = result.summary
    assert marker.exists(), "no learner was killed"
    seq = int(marker.read_text())
    learners = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "learner"]
    assert s["final_return"] >= 100, s
    assert s["recoveries"] == 0, s  # the actor lived on
    # Dask ran the learner again; the actor refused its second push
    assert s["pushes_refused"] >= 1, s
    assert any(r["status"] == "refused" for r in learners), seq
    _check_exactly_once(run_dir, s)
