"""Where a run lets outside code in: fault injection and instrumentation, at named moments.

A :class:`RunHooks` given to :func:`dask_rl.train` (``hooks=``) is called by the drivers at
each of its moments; every method does nothing by default. The fault tests kill the
parameter actor's worker from these, at the moment they name, instead of patching a driver's
private methods. A hook runs on the driver's thread: what it does happens at that moment.
"""

from __future__ import annotations

from typing import Any


class RunHooks:
    """The moments of a run (``run`` is the driver: a ``Trainer`` has ``client`` and
    ``supervisor``)."""

    def actor_call(self, run: Any, method: str) -> None:
        """Before the driver calls the parameter actor's ``method`` (``state_dict`` for a
        checkpoint, ``round_end``, ``metrics`` at the end, ...)."""

    def heartbeat(self, run: Any) -> None:
        """A heartbeat is due: before the driver pings the actor."""

    def evaluation_submitted(self, run: Any, future: Any) -> None:
        """A greedy evaluation (a screening or a confirmation) was submitted."""

    def gather(self, run: Any) -> None:
        """Before an ES driver waits for tasks of a generation (its perturbations, update or
        noiseless evaluation)."""

    def finishing(self, run: Any) -> None:
        """The run is about to end (its final checkpoint and evaluation come next)."""

    def exploit(self, run: Any, loser: int, winner: int) -> None:
        """Before population-based training copies member ``winner`` into ``loser``."""
