"""Fault injection: the parameter actor's worker is SIGKILLed inside each kind of driver call.

Each case trains on a real LocalCluster (worker processes, restarted by their nannies) and,
through the run's hooks (:mod:`dask_rl.runtime.hooks`), kills the process holding the
parameter actor at one chosen moment: just before the n-th
driver call of a kind (checkpoint, round end, heartbeat, evaluation, the end-of-run metrics,
a lost learner's release, an ES generation's perturbations, update or noiseless evaluation,
a PBT exploit), with checkpoint cadences from 1 s to end-only. The runs are short and never
stop on a solve: what they assert is bookkeeping, not learning, so machine load changes only
how long they take. Every run must end on its budget with its summary, a counted recovery
(what it rolled back counted too) and the exactly-once invariant: every distinct push the
final actor holds arrived at its strategy once (``arrived == distinct - rejected``), and the
version is the number of updates the strategy made.

A learner's own worker killed right after its push is the other half of exactly-once: Dask
re-runs the learner, and the actor refuses the second push (with the actor's deduplication
switched off, this test and the invariant above fail: the push is applied twice).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from exactly_once import check_run

import dask_rl
from dask_rl.data.metrics import read_metrics
from dask_rl.runtime.hooks import RunHooks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PIPELINES = Path(__file__).parents[2] / "pipelines"
FAST = ["checkpoint.heartbeat_s=0.5", "checkpoint.actor_timeout_s=5",
        "checkpoint.max_recoveries=3"]


def _install_push_then_die(armed: str) -> None:
    """On a worker: while the file ``armed`` exists, the first learner push to a re-created
    actor (generation >= 1) from a worker other than the actor's writes its sequence number to
    the marker ``armed`` names, then SIGKILLs its own worker: Dask runs the learner again."""
    from dask_rl.runtime import handle

    original = handle.ActorHandle.call
    if getattr(original, "_fault", False):
        return

    def call(self, method, *args, **kwargs):
        out = original(self, method, *args, **kwargs)
        seq = kwargs.get("seq")
        if method != "push" or seq is None or not os.path.exists(armed):
            return out
        generation = int(self.key.split("-")[2])  # parameter-actor-<generation>-<run>
        if generation >= 1 and self._where()[1] is None:
            try:
                with open(armed) as f:
                    marker = json.load(f)["marker"]
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except (OSError, ValueError):  # disarmed meanwhile, or this one fired already
                return out
            os.write(fd, str(seq).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    call._fault = True
    handle.ActorHandle.call = call


@pytest.fixture(scope="module")
def armed(tmp_path_factory) -> Path:
    """Write ``{"marker": path}`` here to arm the workers' push-then-die fault."""
    return tmp_path_factory.mktemp("faults") / "armed"


@pytest.fixture(scope="module")
def client(armed):
    from distributed import Client, LocalCluster
    from distributed.diagnostics.plugin import WorkerPlugin

    class PushThenDie(WorkerPlugin):
        def setup(self, worker):
            _install_push_then_die(str(armed))

    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address=None, silence_logs=50) as cluster:
        with Client(cluster) as c:
            c.register_plugin(PushThenDie(), name="push-then-die-after-recovery")
            yield c


@pytest.fixture(autouse=True)
def _three_workers(client):
    """Each test starts on 3 live workers: a nanny that gave up restarting its killed worker
    (a slow start on a loaded machine) is replaced, so later tests do not run on fewer."""
    from distributed.core import Status

    cluster = client.cluster
    if len(client.scheduler_info(n_workers=-1)["workers"]) < 3:
        for name, nanny in list(cluster.workers.items()):
            if nanny.status in (Status.closing, Status.closed, Status.failed):
                del cluster.workers[name]
        cluster.sync(cluster._correct_state)
    client.wait_for_workers(3, timeout=120)
    yield


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


class KillAt(RunHooks):
    """Kill the actor's worker at the ``fault``'s moment ``where`` (through the run's hooks):
    ``call:<method>`` before a driver call of the actor, ``heartbeat`` when one is due,
    ``eval`` once a greedy evaluation is in flight, ``es`` before an ES gather."""

    def __init__(self, where: str, fault: Fault):
        self.kind, _, self.method = where.partition(":")
        if self.kind not in ("call", "heartbeat", "eval", "es"):
            raise ValueError(where)
        self.fault = fault

    def _at(self, kind: str, run) -> None:
        if kind == self.kind and self.fault.due():
            kill_actor_worker(run)

    def actor_call(self, run, method):
        if method == self.method:
            self._at("call", run)

    def heartbeat(self, run):
        self._at("heartbeat", run)

    def evaluation_submitted(self, run, future):
        self._at("eval", run)

    def gather(self, run):
        self._at("es", run)


# small budgets, never ended by a solve: each run lasts its whole budget, the fault lands in it
NO_SOLVE = ["stop.solve_on_target=false"]
ASYNC = ["aggregation.strategy=async", "stop.env_steps=30000", *NO_SOLVE]
STELLARIS = ["stop.env_steps=30000", *NO_SOLVE]
# ES: 48 episodes a generation, 3 gathers each (perturbations, update, noiseless
# evaluation): the 6th gather comes in the 2nd generation, ~3k env steps in
ES = ["stop.env_steps=30000", "algo.eval_every=1", *NO_SOLVE]
# a fault on a clock (the n-th heartbeat or timed checkpoint) lands in a run that lasts a fixed
# time, not a fixed number of steps: on an idle machine 30k steps can end before the 4th beat
TIMED = ["stop.env_steps=100000000", "stop.wall_s=12"]

# (id, pipeline, overrides, where, nth): 15 moments over three drivers
CASES = [
    ("async-checkpoint-1s", "ppo_cartpole.yaml", ASYNC + TIMED + ["checkpoint.every_s=1"],
     "call:state_dict", 3),
    ("async-checkpoint-first", "ppo_cartpole.yaml", ASYNC + TIMED + ["checkpoint.every_s=1"],
     "call:state_dict", 2),
    ("async-round-end", "ppo_cartpole.yaml", ASYNC + ["checkpoint.every_s=2"],
     "call:round_end", 5),
    ("async-heartbeat", "ppo_cartpole.yaml", ASYNC + TIMED + ["checkpoint.every_s=3"],
     "heartbeat", 4),
    ("async-evaluation", "ppo_cartpole.yaml",
     ASYNC + ["checkpoint.every_s=1", "stop.eval_every_updates=10"], "eval", 2),
    ("async-heartbeat-end-only-checkpoints", "ppo_cartpole.yaml",
     ASYNC + TIMED + ["checkpoint.every_s=0"], "heartbeat", 3),
    ("async-end-metrics", "ppo_cartpole.yaml", ASYNC + ["checkpoint.every_s=1"],
     "call:metrics", 1),
    ("stellaris-round-end", "ppo_cartpole_stellaris.yaml",
     STELLARIS + ["checkpoint.every_s=1"], "call:round_end", 3),
    ("stellaris-checkpoint", "ppo_cartpole_stellaris.yaml",
     STELLARIS + TIMED + ["checkpoint.every_s=2"], "call:state_dict", 3),
    ("stellaris-heartbeat", "ppo_cartpole_stellaris.yaml",
     STELLARIS + TIMED + ["checkpoint.every_s=1"], "heartbeat", 4),
    ("sync-expect-learners", "ppo_cartpole_sync.yaml",
     ["stop.env_steps=30000", "checkpoint.every_s=1", *NO_SOLVE], "call:expect_learners", 6),
    ("es-perturbations", "es_cartpole.yaml", ES + ["checkpoint.every_s=1"], "es", 4),
    ("es-update", "es_cartpole.yaml", ES + ["checkpoint.every_s=1"], "es", 5),
    ("es-noiseless-evaluation", "es_cartpole.yaml", ES + ["checkpoint.every_s=2"], "es", 6),
    ("es-checkpoint", "es_cartpole.yaml", ES + TIMED + ["checkpoint.every_s=1"],
     "call:state_dict", 3),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_actor_lost_at_any_moment(client, armed, tmp_path, case):
    """The actor's loss alone never brings a push twice (its tasks are cancelled and hold the
    lost actor's handle); the first learner of the re-created actor that pushes from another
    worker then loses that worker, so the new actor, restored from its checkpoint, must refuse
    the re-run's push too."""
    _, pipeline, overrides, where, nth = case
    fault = Fault(nth)
    run_dir = tmp_path / "run"
    marker = tmp_path / "pushed"
    cfg = dask_rl.api.resolve(PIPELINES / pipeline, FAST + overrides)
    armed.write_text(json.dumps({"marker": str(marker)}))
    try:
        result = dask_rl.train(cfg, client=client, run_dir=run_dir,
                               hooks=KillAt(where, fault))
    finally:
        armed.unlink()
    s = result.summary
    assert fault.fired, f"the run never reached call {nth} of {where}"
    assert s["recoveries"] >= 1, s
    records = check_run(run_dir, s, budget="wall_s" if TIMED[-1] in overrides else "env_steps")
    rec = next(r for r in records if r["kind"] == "recovery")
    elsewhere = [r for r in records if r["kind"] == "learner" and r["time"] > rec["time"]
                 and r["worker"] != rec["actor_worker"]]
    if elsewhere:  # not ES (its update runs beside the actor), nor a loss at the very end
        assert marker.exists(), "no learner of the new actor lost its worker after its push"
    if marker.exists():  # an ES update may run off the actor's worker too: it is refused alike
        seq = int(marker.read_text())
        again = [r for r in records if r["kind"] == "learner" and r["learner"] == f"L{seq}"]
        assert all(r["status"] == "refused" for r in again), again
        assert s["pushes_refused"] >= 1, s


def test_the_actor_lost_after_a_confirmed_solve_judges_the_policy_left(client, tmp_path):
    """Solved and confirmed, then the actor's worker dies before the final checkpoint: the
    rollback to the initial checkpoint (the only one) takes the confirmed policy with it, and
    the summary must judge the policy the run now holds, not claim the lost one."""
    lost = []

    class KillWhenSolved(RunHooks):
        def finishing(self, run):
            if run.stop_reason == "solved" and not lost:
                lost.append(run.gate.confirmation.version)
                kill_actor_worker(run)
    cfg = dask_rl.api.resolve(PIPELINES / "ppo_cartpole.yaml",
                              # it must solve (a low target) to reach its moment
                              FAST + ["aggregation.strategy=async", "stop.env_steps=60000",
                                      "checkpoint.every_s=0", "stop.target_return=100"])
    s = dask_rl.train(cfg, client=client, run_dir=tmp_path / "run",
                      hooks=KillWhenSolved()).summary
    assert lost and lost[0] > 0, "the run did not solve"
    assert s["recoveries"] >= 1 and s["updates_discarded"] >= lost[0], s
    assert s["updates"] == 0  # back to the initial checkpoint
    # whatever was confirmed is the policy the run ends with
    assert s["confirmation"] is None or s["confirmation"]["version"] == s["updates"], s
    assert not s["solved"] or s["confirmation"] is not None


def test_a_pbt_exploit_whose_member_actor_dies(client, tmp_path):
    """The exploit's copy fails with the loser's actor: skipped, the member recovers."""
    fired = []

    class KillTheLoser(RunHooks):
        def exploit(self, run, loser, winner):
            if not fired:
                fired.append(loser)
                kill_actor_worker(run.members[loser])
    cfg = dask_rl.api.resolve(PIPELINES / "pbt_cartpole.yaml",
                              FAST + ["stop.env_steps=16384", "checkpoint.every_s=1",
                                      # many ready events, half the members exploitable: an
                                      # exploit comes early in every run
                                      "population.ready_env_steps=4096",
                                      "population.fraction=0.5"])
    result = dask_rl.train(cfg, client=client, run_dir=tmp_path / "pbt", hooks=KillTheLoser())
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
    # Dask ran the learner again; the actor refused its second push (applied twice, the
    # actor would also have taken one push more than it has distinct sequence numbers)
    [again] = [r for r in read_metrics(run_dir / "metrics.jsonl")
               if r["kind"] == "learner" and r["learner"] == f"L{seq}"]
    assert again["status"] == "refused", again
    assert s["pushes_refused"] >= 1, s
    assert s["recoveries"] == 0, s  # the actor lived on
    check_run(run_dir, s)
