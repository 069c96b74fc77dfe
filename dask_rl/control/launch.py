"""What an asynchronous trainer submits next: the launch policy, without Dask.

The driver of :mod:`dask_rl.runtime.driver` tells the policy what happened — a rollout
finished (with a handle on its trajectory) or failed, a learner finished or failed, the
cluster's size changed, the run is stopping, a recovery threw everything away — and asks
:meth:`LaunchPolicy.decide` what to submit: rollouts on which slots, learners on which
trajectories. The rules (Stellaris' on-demand learners, TianJi's relaxed dependencies):

* **Learners on demand.** A learner is launched on each trajectory as it becomes ready, at
  most ``max_learners`` at once; when no fresh trajectory waits, an off-policy algorithm replays
  one from its :class:`~dask_rl.control.replay.TrajectoryReplay` (never while the run is
  stopping, except in a synchronous round's drain: the round's replays belong to it).
* **Rollouts never wait for learners**, except in two cases. *Backpressure*: while
  ``max_ready`` trajectories already wait for a learner, finished slots stay idle instead of
  growing an unbounded queue. *Synchronous rounds* (``synchronous``, the sync baseline): idle
  slots are resubmitted together only once everything the round collected has been learned,
  replays included, so the next round acts with the version the previous round's update
  produced.
* **Slots follow the cluster.** :meth:`resize` adds idle slots or retires the highest ones
  (their running tasks finish; they are not resubmitted).
* **Sampled learners** (``sampled``, value-based algorithms on a replay buffer: TianJi's
  replay path): finished trajectories go to the caller's buffer, not to learners; once
  :meth:`replay_changed` says the buffer holds enough, ``max_learners`` learners run at all
  times, each on a sample the caller draws (``LearnerLaunch.trajectory`` is None). Rollouts
  wait only while it says the learners are behind (the caller's replay ratio).
* **Pausing** (:meth:`pause`, :meth:`resume`) holds the policy still: nothing new starts, what
  runs finishes, ready trajectories wait. The driver pauses to confirm a target on the policy
  it would keep.
* **A round** is one trajectory learned per slot for the first time (a replay learns an old
  one again: it is no collection round's); :meth:`learner_done` says when one ended, so the
  strategy can adapt (Stellaris' threshold decays once per round, whatever the replays).
* **Learners fed where the data is** (``fused``, an on-policy algorithm without replay): a
  slot's launch is one task that collects its trajectory and learns from it on the same
  worker (Stellaris' learner launched on the batch the moment it is ready, with no trip to
  the driver in between). At most ``max_learners`` slots run one at once, so no more learners
  are active than that; each of them may also have ``lookahead`` launch queued behind it (it
  waits on the slot's worker for the running one), so that its worker never waits for the
  driver between two tasks. Under a synchronous strategy nothing is queued: a round's tasks
  all end before the next round starts. Fused needs no more slots than ``max_learners`` (a
  fused slot stays busy, so more would never start): with more, the policy runs them apart.

Handles are opaque (Dask futures in the driver, strings in the tests), so every decision is
tested with scripted events, as ``AdaptiveCore`` is in distributed.

Examples
--------
>>> policy = LaunchPolicy(slots=2, max_learners=1, max_ready=1)
>>> policy.decide().rollouts
[0, 1]
>>> policy.rollout_done(0, "traj-a")
>>> [launch.trajectory for launch in policy.decide().learners]
['traj-a']
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from dask_rl.control.replay import TrajectoryReplay

T = TypeVar("T")


@dataclass(frozen=True)
class LearnerLaunch(Generic[T]):
    """Launch a learner on ``trajectory``."""

    trajectory: T | None  # None: a sampled learner (the caller draws its batch)
    first_use: bool   # False: a replay of a trajectory already learned from, or a sample
    concurrent: int   # learners in flight once this one runs, itself included


@dataclass(frozen=True)
class FusedLaunch:
    """Launch a task that collects on ``slot`` and learns from what it collected; ``queued``:
    behind the slot's running task, which it must wait for."""

    slot: int
    queued: bool
    concurrent: int   # slots running or queued once this one is submitted, itself included


@dataclass
class Launches(Generic[T]):
    """What to submit now: rollouts on these slots, learners on these trajectories, or
    (``fused``) collect-and-learn tasks."""

    rollouts: list[int] = field(default_factory=list)
    learners: list[LearnerLaunch[T]] = field(default_factory=list)
    fused: list[FusedLaunch] = field(default_factory=list)


@dataclass(frozen=True)
class Discarded:
    """What a stop or a recovery threw away: counted, never silently lost."""

    trajectories: int   # ready (never learned) or taken by a learner that was cancelled
    rollouts: int       # rollouts cancelled before they finished
    replay: int = 0     # replay-buffer trajectories thrown away


class LaunchPolicy(Generic[T]):
    """Slots, ready trajectories and in-flight counts of one asynchronous trainer.

    Parameters
    ----------
    slots
        Rollout slots (one rollout task in flight each); 0 until the cluster has workers.
    max_learners
        Learner tasks allowed in flight at once.
    max_ready
        Trajectories allowed to wait for a learner before finished slots pause.
    synchronous
        Run rollouts in rounds gated on learning (the sync baseline's strategy).
    replay
        An off-policy algorithm's replay buffer, or None.
    fused
        Each launch collects and learns in one task (see the module's notes); needs an
        on-policy algorithm without replay.
    lookahead
        With ``fused``: launches queued behind each running slot (0 or more).
    """

    def __init__(self, *, slots: int, max_learners: int, max_ready: int,
                 synchronous: bool = False, replay: TrajectoryReplay[T] | None = None,
                 sampled: bool = False, fused: bool = False, lookahead: int = 1):
        if slots < 0 or max_learners < 1 or max_ready < 1 or lookahead < 0:
            raise ValueError(f"slots must be >= 0, max_learners and max_ready >= 1, lookahead "
                             f">= 0, got {slots}, {max_learners}, {max_ready}, {lookahead}")
        if fused and (replay is not None or sampled):
            raise ValueError("fused launches learn each trajectory once, where it was "
                             "collected: not with replay or sampled learners")
        self.slots = slots
        self.max_learners = max_learners
        self.max_ready = max_ready
        self.synchronous = synchronous
        self.replay = replay
        self.idle: list[int] = list(range(slots))
        self.running_slots: collections.Counter[int] = collections.Counter()
        self.ready: collections.deque[T] = collections.deque()
        self.learners: list[bool] = []  # first_use of each learner in flight
        self.learned = 0
        self.stopping = False
        self.draining = False
        self._paused = False   # nothing new starts (the policy is held still for a confirmation)
        self.sampled = sampled
        self.fused = fused
        self.lookahead = 0 if synchronous else lookahead
        self._sample_ready = False  # sampled learners: the caller's buffer holds enough
        self._rollouts_held = False  # sampled learners: the caller's replay ratio holds rollouts

    # ---- events ----------------------------------------------------------------------------
    def rollout_done(self, slot: int, trajectory: T) -> None:
        """A rollout on ``slot`` finished; its trajectory waits for a learner (with sampled
        learners the caller keeps it in its buffer instead)."""
        self._rollout_ended(slot)
        if not self.sampled:
            self.ready.append(trajectory)

    def rollout_failed(self, slot: int) -> None:
        """A rollout on ``slot`` failed; the slot is free again."""
        self._rollout_ended(slot)

    def learner_done(self, first_use: bool) -> bool:
        """A learner finished; True when that completed a round (one trajectory per slot
        learned for the first time: replays do not count; with sampled learners, which
        learn no trajectory of their own, one learner per slot)."""
        self._learner_ended(first_use)
        if not first_use and not self.sampled:  # a sampled learner is never a first use
            return False
        self.learned += 1
        return self.slots > 0 and self.learned % self.slots == 0

    def learner_failed(self, first_use: bool) -> None:
        """A learner failed; its trajectory is not learned from (the caller counts it)."""
        self._learner_ended(first_use)

    def fused_done(self, slot: int) -> bool:
        """A fused task on ``slot`` ended with its learner's push; True when that completed a
        round."""
        self._rollout_ended(slot)
        self.learned += 1
        return self.slots > 0 and self.learned % self.slots == 0

    def fused_failed(self, slot: int) -> None:
        """A fused task on ``slot`` failed: nothing of it is learned (the caller counts it)."""
        self._rollout_ended(slot)

    def pause(self) -> None:
        """Hold the policy still: nothing new starts until :meth:`resume` (or a stop)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def replay_changed(self, *, ready: bool, behind: bool) -> None:
        """Sampled learners: whether the caller's buffer holds enough to learn from, and
        whether the learners are behind its replay ratio (rollouts then wait)."""
        self._sample_ready = ready
        self._rollouts_held = behind

    @property
    def paused(self) -> bool:
        return self._paused

    def resize(self, slots: int) -> None:
        """The cluster changed: ``slots`` rollout slots from now on."""
        if slots < 0:
            raise ValueError(f"slots must be >= 0, got {slots}")
        if slots > self.slots:   # a slot whose old task still runs is idle once it ends
            self.idle.extend(s for s in range(self.slots, slots) if s not in self.running_slots)
        if self.fused and slots > self.max_learners and not self.running_slots:
            # a fused slot stays busy (its next task is queued), so slots beyond max_learners
            # would never start, and a synchronous round would hold fewer than all slots:
            # with more slots than learners, rollouts and learners are tasks apart
            self.fused = False
        self.slots = slots
        self.idle = [s for s in self.idle if s < slots]

    def stop(self, *, drain: bool) -> None:
        """Submit no more rollouts; with ``drain``, learn from everything collected first."""
        self.stopping = True
        self.draining = drain
        self._paused = False

    def discard_all(self) -> Discarded:
        """Everything in flight and waiting is gone (a recovery or the end of the run).

        Slots whose rollouts were in flight are idle again; ready trajectories, trajectories
        whose first learner was in flight, and the replay buffer are dropped.
        """
        running = sum(self.running_slots.values())
        gone = Discarded(trajectories=len(self.ready) + sum(self.learners),
                         rollouts=running,
                         replay=len(self.replay) if self.replay is not None else 0)
        self.idle = sorted({*self.idle, *(s for s in self.running_slots if s < self.slots)})
        self.running_slots.clear()
        self.ready.clear()
        self.learners.clear()
        if self.replay is not None:
            self.replay.clear()
        return gone

    # ---- decisions -------------------------------------------------------------------------
    def decide(self) -> Launches[T]:
        """What to submit now (nothing while paused, nor once stopping without draining);
        the policy counts it as in flight."""
        if self._paused or (self.stopping and not self.draining):
            return Launches()
        if self.fused:
            return Launches(fused=self._fused())
        launches: Launches[T] = Launches(learners=self._learners())
        if not self.stopping and self._rollouts_may_run():
            launches.rollouts, self.idle = self.idle, []
            self.running_slots.update(launches.rollouts)
        return launches

    @property
    def finished(self) -> bool:
        """Stopping, and (when draining) nothing left to learn from."""
        if not self.stopping:
            return False
        if self.draining:
            owed = self.synchronous and self.replay is not None and len(self.replay) > 0
            return not (self.running_slots or self.learners or self.ready or owed)
        return True

    @property
    def rollouts_in_flight(self) -> int:
        return sum(self.running_slots.values())

    @property
    def learners_in_flight(self) -> int:
        return self.rollouts_in_flight if self.fused else len(self.learners)

    # ---- rules -----------------------------------------------------------------------------
    def _rollouts_may_run(self) -> bool:
        if self._rollouts_held:
            return False
        if self.synchronous:  # a round ends when everything it collected has been learned
            return not (self.running_slots or self.learners or self.ready)
        return len(self.ready) < self.max_ready

    def _learners(self) -> list[LearnerLaunch[T]]:
        out: list[LearnerLaunch[T]] = []
        if self.sampled:
            while (len(self.learners) < self.max_learners and self._sample_ready
                   and not self.stopping):
                self.learners.append(False)
                out.append(LearnerLaunch(None, False, len(self.learners)))
            return out
        while len(self.learners) < self.max_learners:
            if self.ready:
                trajectory, first_use = self.ready.popleft(), True
                if self.replay is not None:
                    self.replay.add(trajectory)
            elif self.replay is not None and (not self.stopping or self.synchronous):
                replayed = self.replay.next()
                if replayed is None:
                    break
                trajectory, first_use = replayed, False
            else:
                break
            self.learners.append(first_use)
            out.append(LearnerLaunch(trajectory, first_use, len(self.learners)))
        return out

    def _fused(self) -> list[FusedLaunch]:
        """Idle slots start while fewer than ``max_learners`` run; each running slot of this
        size gets up to ``lookahead`` launches queued behind it."""
        if self.stopping or (self.synchronous and self.running_slots):
            return []
        out: list[FusedLaunch] = []

        def launch(slot: int, queued: bool) -> None:
            self.running_slots[slot] += 1
            out.append(FusedLaunch(slot, queued, self.rollouts_in_flight))

        for slot in sorted(s for s in self.running_slots if s < self.slots):
            for _ in range(self.running_slots[slot], 1 + self.lookahead):
                launch(slot, True)
        while self.idle and len(self.running_slots) < self.max_learners:
            slot = self.idle.pop(0)
            launch(slot, False)
            for _ in range(self.lookahead):
                launch(slot, True)
        return out

    def _rollout_ended(self, slot: int) -> None:
        self.running_slots[slot] -= 1
        if self.running_slots[slot] <= 0:
            del self.running_slots[slot]
            if slot < self.slots:
                self.idle.append(slot)

    def _learner_ended(self, first_use: bool) -> None:
        self.learners.remove(first_use)
