"""Population-based training (Jaderberg et al., 2017) over asynchronous trainers.

``population.members`` trainers (PPO or IMPACT :class:`~dask_rl.runtime.driver.Driver` s, each
with its own parameter actor and run directory ``members/m<i>``) train at once on the same
cluster, each from hyperparameters sampled from ``population.hyperparameters``. Whenever a
member has taken another ``ready_env_steps`` steps it is *ready*: it is scored by a greedy
evaluation and, if it ranks in the bottom ``fraction`` of the latest scores, it exploits a
random member of the top fraction — its parameter actor adopts the winner's weights, learner
optimizer state and statistics in a task that moves them worker to worker, never through the
client — and explores: the copied hyperparameters are perturbed by 0.8 / 1.2 or resampled.
Every decision is a lineage record, in ``metrics.jsonl``, the checkpoints and ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid

import numpy as np

from dask_rl.algos import pbt
from dask_rl.config import PipelineConfig, public_dict
from dask_rl.data.summary import LearnerSummary, MemberSummary, PBTSummary
from dask_rl.runtime.driver import Driver
from dask_rl.runtime.run import Run
from dask_rl.runtime.tasks import copy_parameters_task, evaluate_task

logger = logging.getLogger(__name__)


class PBTDriver(Run):
    """Runs a population of trainers with exploit / explore; :meth:`run` returns a
    :class:`~dask_rl.data.summary.PBTSummary`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("name", f"pbt-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
        super().__init__(*args, **kwargs)
        self.pop = self.cfg.population
        self.space = {k: (float(lo), float(hi)) for k, (lo, hi) in
                      self.pop.hyperparameters.items()}
        self.rng = np.random.default_rng(self.cfg.seed)
        self.lineage: list[dict] = []
        self.scores: dict[int, float] = {}
        self.first_scores: dict[int, float] = {}
        self.next_ready: list[int] = [self.pop.ready_env_steps] * self.pop.members
        self.members: list[Driver] = []
        self.results: dict[int, LearnerSummary] = {}
        self.errors: dict[int, BaseException] = {}

    def _member_config(self, i: int) -> PipelineConfig:
        # Each member is an ordinary trainer with its own seed and no population of its own;
        # as a run of its own it has its own checkpoint store.
        return dataclasses.replace(self.cfg, seed=self.cfg.seed * 1000 + i, population=None)

    def run(self) -> PBTSummary:
        self.open_run()
        try:
            state = self._restore() if self.resume else None
            for i in range(self.pop.members):
                member = Driver(self.client, self._member_config(i),
                                self.run_dir / "members" / f"m{i}", resume=self.resume,
                                name=f"{self.run_name}-m{i}", hooks=self.hooks)
                if state is None:
                    member.hparams = pbt.sample(self.space, self.rng)
                    self._log({"event": "start", "member": i, "parent": None,
                               "hparams": member.hparams, "env_steps": 0})
                else:
                    member.hparams = state["hparams"][i]
                self.members.append(member)
            threads = [threading.Thread(target=self._train, args=(i,), daemon=True,
                                        name=f"pbt-member-{i}")
                       for i in range(self.pop.members)]
            for t in threads:
                t.start()
            last_checkpoint = time.monotonic()
            while any(t.is_alive() for t in threads):
                time.sleep(0.5)
                for i, member in enumerate(self.members):
                    if i not in self.results and member.env_steps >= self.next_ready[i]:
                        self._ready(i)
                if time.monotonic() - last_checkpoint >= max(self.cfg.checkpoint.every_s, 1.0):
                    self.checkpoint()
                    last_checkpoint = time.monotonic()
                self._report_progress()
            if self.errors:
                i, err = next(iter(self.errors.items()))
                raise RuntimeError(f"population member {i} failed: {err!r}") from err
            self.checkpoint()
            return self._summary(time.monotonic() - self.t0)
        finally:
            self.close()

    def interrupt(self, reason: str = "interrupted") -> None:
        super().interrupt(reason)
        for member in self.members:
            member.interrupt(reason)

    def _train(self, i: int) -> None:
        try:
            self.results[i] = self.members[i].run()
        except BaseException as e:  # reported by the controller
            logger.exception("population member %d failed", i)
            self.errors[i] = e

    # ---- exploit and explore -------------------------------------------------------------------
    def _ready(self, i: int) -> None:
        member = self.members[i]
        self.next_ready[i] = member.env_steps + self.pop.ready_env_steps
        try:
            score = self.client.submit(evaluate_task, member.run_name, member.actor,
                                       self.pop.eval_episodes, 50_000 + len(self.lineage),
                                       pure=False).result().mean_return
        except Exception as e:  # the member is finishing or recovering: score it next time
            logger.info("could not score member %d: %r", i, e)
            return
        self.scores[i] = score
        self.first_scores.setdefault(i, score)
        self._log({"event": "ready", "member": i, "score": score, "env_steps": member.env_steps,
                   "hparams": dict(member.hparams)})
        candidates = {m: s for m, s in self.scores.items() if m not in self.results}
        if len(candidates) < 2:
            return
        for e in pbt.truncation_selection(candidates, self.pop.fraction, self.rng):
            if e.loser == i:
                self._exploit(i, e.winner)

    def _exploit(self, loser: int, winner: int) -> None:
        self.hooks.exploit(self, loser, winner)
        dst, src = self.members[loser], self.members[winner]
        try:
            version = self.client.submit(copy_parameters_task, src.actor, dst.actor,
                                         pure=False).result()
        except Exception as e:  # a member's actor was lost: it recovers on its own
            self._log({"event": "exploit_failed", "member": loser, "parent": winner,
                       "env_steps": dst.env_steps, "error": repr(e)})
            logger.warning("member %d could not copy member %d: %r", loser, winner, e)
            return
        old = dict(dst.hparams)
        dst.hparams = pbt.explore(src.hparams, self.space, self.rng,
                                  resample_probability=self.pop.resample_probability,
                                  factors=self.pop.perturb_factors)
        self.scores[loser] = self.scores[winner]
        self._log({"event": "exploit", "member": loser, "parent": winner,
                   "env_steps": dst.env_steps, "version": version, "old_hparams": old,
                   "hparams": dict(dst.hparams), "parent_hparams": dict(src.hparams),
                   "parent_score": self.scores[winner]})
        logger.info("member %d copies member %d; hyperparameters %s -> %s", loser, winner, old,
                    dst.hparams)

    def _log(self, record: dict) -> None:
        record = self.metrics.write("lineage", record)
        self.lineage.append(record)

    # ---- checkpoints ---------------------------------------------------------------------------
    def checkpoint(self) -> str | None:
        """The controller's state; each member checkpoints itself in its own directory. A
        write that fails (any error of the store) keeps the previous checkpoint and is
        logged (``checkpoint_failed``)."""
        try:
            return self._write_checkpoint()
        except Exception as e:
            logger.warning("could not write the population's checkpoint (%s); the previous "
                           "one is kept", " ".join(f"{type(e).__name__}: {e}".split())[:300])
            self.metrics.write("checkpoint_failed", {"error": repr(e)[:1000]})
            return None

    def _write_checkpoint(self) -> str:
        state = {"hparams": [dict(m.hparams) for m in self.members],
                 "next_ready": list(self.next_ready), "rng": self.rng.bit_generator.state,
                 "scores": {str(k): v for k, v in self.scores.items()},
                 "first_scores": {str(k): v for k, v in self.first_scores.items()},
                 "lineage": self.lineage}
        return self.store.save({"pbt": state},
                               meta={"algorithm": f"pbt-{self.cfg.algo.name}",
                                     "env_id": self.cfg.env.name, "config": public_dict(self.cfg),
                                     "run_id": self.store_location.run_id})

    def _restore(self) -> dict:
        expect = {"algorithm": f"pbt-{self.cfg.algo.name}", "env_id": self.cfg.env.name}
        if self.store_location.run_id is not None:  # never another run's checkpoint
            expect["run_id"] = self.store_location.run_id
        state, _, name = self.store.load_latest_good(expect=expect)
        s = state["pbt"]
        self.next_ready = [int(x) for x in s["next_ready"]]
        self.rng.bit_generator.state = s["rng"]
        self.scores = {int(k): v for k, v in s["scores"].items()}
        self.first_scores = {int(k): v for k, v in s["first_scores"].items()}
        self.lineage = list(s["lineage"])
        logger.info("population resumed from %s", name)
        return s

    # ---- the end -------------------------------------------------------------------------------
    def _report_progress(self) -> None:
        steps = sum(m.env_steps for m in self.members)
        returns = [m.recent_return() for m in self.members if m.recent_return() is not None]
        self.report_progress(
            env_steps=steps, total=self.cfg.stop.env_steps * self.pop.members,
            recent_return=max(returns) if returns else None,
            updates=sum(m.updates for m in self.members),
            steps_per_s=steps / max(time.monotonic() - self.members[0].t0, 1e-9),
            eval_return=max(self.scores.values()) if self.scores else None)

    def _summary(self, wall: float) -> PBTSummary:
        members = []
        for i, m in enumerate(self.members):
            s = self.results[i]
            members.append(MemberSummary(
                member=i, final_return=s.final_return, best_return=s.best_return,
                env_steps=s.env_steps, hparams=dict(m.hparams),
                first_score=self.first_scores.get(i),
                exploits=sum(r["event"] == "exploit" and r["member"] == i
                             for r in self.lineage),
                run_dir=str(m.run_dir)))
        # an interrupted member may end with no evaluation and no actor metrics (None)
        best = max(members, key=lambda m: -np.inf if m.final_return is None else m.final_return)
        firsts = [m.first_score for m in members if m.first_score is not None]
        target = self.members[0].gate.target
        results = list(self.results.values())
        summary = PBTSummary(
            algorithm=f"pbt-{self.cfg.algo.name}", env_id=self.cfg.env.name,
            env_steps=sum(m.env_steps for m in members),
            updates=sum(r.updates for r in results), wall_s=wall,
            final_return=best.final_return,
            best_return=max(m.best_return or -np.inf for m in members),
            target_return=target,
            solved=self.results[best.member].solved,
            confirmation=self.results[best.member].confirmation,
            stop_reason=self.stop_reason or "members_done",
            staleness_mean=_mean_known([r.staleness_mean for r in results]),
            staleness_max=max((r.staleness_max for r in results
                               if r.staleness_max is not None), default=None),
            recoveries=sum(r.recoveries for r in results),
            best_member=best.member, initial_worst_return=min(firsts) if firsts else None,
            exploits=sum(r["event"] == "exploit" for r in self.lineage),
            members=members, lineage=self.lineage)
        return self.end(summary, omit=("lineage", "members"))


def _mean_known(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None
