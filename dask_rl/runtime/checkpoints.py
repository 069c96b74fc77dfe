"""A trainer's checkpoints: the parameter actor's state and the driver's counters as one atomic
commit to the run's own store, on ``checkpoint.every_s``, at the end, and at an interrupt; and
the way back (``--resume``, and each recovery of a lost actor).

A checkpoint that cannot be written (a full disk, a store that went away, any error of the
store) is logged and skipped: the previous one stays ``latest`` and the run goes on. Loading
takes only this run's checkpoints (its run id), never another's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dask_rl.checkpoint import CheckpointError
from dask_rl.config import public_dict
from dask_rl.runtime.run import INTERRUPT_DEADLINE_S, Abandoned, RunFailed

logger = logging.getLogger(__name__)

# An interrupted run's final checkpoint (the actor's state, the workers' replay writes) is given
# up this many seconds after the signal (Run.abandon_after)
FINAL_CHECKPOINT_BY_S = INTERRUPT_DEADLINE_S - 5.0


class Checkpoints:
    """Writes and loads the checkpoints of ``trainer`` (a :class:`~dask_rl.runtime.trainer.Trainer`:
    its store, actor, counters and its ``driver_state``/``write_extra`` seams)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.last = time.monotonic()   # when one was last written (or failed)
        self.failures = 0

    def maybe(self) -> None:
        """A checkpoint when ``checkpoint.every_s`` has passed since the last."""
        every = self.trainer.cfg.checkpoint.every_s
        if every > 0 and time.monotonic() - self.last >= every:
            self.write()

    def write(self) -> str | None:
        """Write the actor's and the driver's state as one checkpoint now; its name, or None
        when it could not be written (the previous one is kept; the next attempt comes after
        ``checkpoint.every_s``)."""
        t = self.trainer
        t0 = time.perf_counter()
        t.metrics.write("phase", {"phase": "checkpoint", "event": "start",
                                  "env_steps": t.env_steps})
        actor_state = t.actor_call("state_dict")
        try:
            return self._commit(actor_state, t0)
        except (RunFailed, Abandoned):
            raise
        except Exception as e:  # OSError, Zarr's own errors, a replay write that failed...
            # the actor's state is already here and nothing was published: keep the previous
            self.last = time.monotonic()
            self.failures += 1
            logger.warning("could not write a checkpoint (%s); the previous one is kept",
                           " ".join(f"{type(e).__name__}: {e}".split())[:300])
            t.metrics.write("checkpoint_failed", {"error": repr(e)[:1000],
                                                  "env_steps": t.env_steps})
            return None

    def _commit(self, actor_state: dict, t0: float) -> str:
        t = self.trainer
        pending = t.store.begin()
        written, extra_meta = t.write_extra(pending)
        driver = {"env_steps": t.env_steps, **t.gate.state(), "wall_s": t.elapsed(),
                  "recoveries": t.recoveries,
                  "episodes": t.episodes, "recent_returns": list(t.returns),
                  "env_steps_discarded": t.env_steps_discarded,
                  "updates_discarded": t.updates_discarded, "replay_lost": t.replay_lost,
                  **t.driver_state()}
        meta = {"algorithm": t.cfg.algo.name, "env_id": t.cfg.env.name,
                "run_id": t.store_location.run_id,
                "config": public_dict(t.cfg), "spaces": t.spaces(),
                "env_steps": t.env_steps,
                "updates": actor_state["version"], "time": time.time(), **extra_meta}
        name = t.store.commit(pending, {"actor": actor_state, "driver": driver}, meta=meta,
                              replay=len(written), replay_checksums=written)
        self.last = time.monotonic()
        t.metrics.write("checkpoint", {"name": name, "seconds": time.perf_counter() - t0,
                                       "env_steps": t.env_steps,
                                       "updates": actor_state["version"]})
        return name

    def load(self) -> tuple[dict, dict, str]:
        """The newest good checkpoint of this run, loaded into the parameter actor."""
        t = self.trainer
        expect = {"algorithm": t.cfg.algo.name, "env_id": t.cfg.env.name,
                  "num_params": t.num_params}
        if t.store_location.run_id is not None:  # never another run's checkpoint
            expect["run_id"] = t.store_location.run_id
        state, meta, name = t.store.load_latest_good(expect=expect)
        t.actor.call("load_state_dict", state["actor"])
        t.updates = int(state["actor"]["version"])
        t.restore_extra(name, meta)
        return state, meta, name

    def resume(self) -> None:
        """``--resume``: the actor and the driver's counters from this run's newest checkpoint."""
        t = self.trainer
        # guarded like every other actor call: the actor's worker may die while it loads
        for attempt in range(t.cfg.checkpoint.max_recoveries + 1):
            try:
                state, _, name = self.load()
                break
            except CheckpointError:
                raise
            except Exception as e:
                if attempt == t.cfg.checkpoint.max_recoveries or t.supervisor.alive(
                        timeout=min(5.0, t.cfg.checkpoint.actor_timeout_s)):
                    raise
                logger.warning("the parameter actor was lost while resuming (%s); again on "
                               "a new one", type(e).__name__)
                t.supervisor.replace()
        d = state["driver"]
        t.env_steps = t.env_steps_offset = int(d["env_steps"])
        t.gate.load_state(d)
        t.wall_offset = float(d["wall_s"])
        t.recoveries = int(d.get("recoveries", 0))
        t.episodes = int(d.get("episodes", 0))
        t.env_steps_discarded = int(d.get("env_steps_discarded", 0))
        t.updates_discarded = int(d.get("updates_discarded", 0))
        t.replay_lost = int(d.get("replay_lost", 0))
        t.returns.extend(d.get("recent_returns", []))
        t.load_driver_state(d)
        logger.info("resumed from %s at %d env steps, version %d", name, t.env_steps,
                    t.updates)
        t.metrics.write("resume", {"checkpoint": name, "env_steps": t.env_steps,
                                   "updates": t.updates})

    def final(self) -> str | None:
        """An interrupted run's last checkpoint, if the actor answers by
        ``FINAL_CHECKPOINT_BY_S`` after the signal (with the workers' replay writes); else None,
        and the previous checkpoint stands."""
        t = self.trainer
        if not hasattr(t, "supervisor"):  # interrupted before the actor existed
            return None
        if t.actor_worker_gone():
            logger.warning("no final checkpoint: the parameter actor's worker is gone; the "
                           "previous one stands")
            return None
        t.abandon_after = FINAL_CHECKPOINT_BY_S
        try:
            return self.write()
        except Exception as e:  # Abandoned, a comm closed by a worker going...
            logger.warning("no final checkpoint (%s); the previous one stands",
                           " ".join(f"{type(e).__name__}: {e}".split())[:200])
            return None
