"""What every side of ``benchmarks/peers.py`` writes, in whichever virtual environment it runs
(torch and the standard library only: each peer has its own numpy and gymnasium).

A side trains, and on its way:

* notes its progress (``progress.jsonl``: wall seconds since the harness spawned it, env steps,
  the training return its own logs show) at each of its natural reporting points;
* takes a snapshot of its policy each time its env steps cross the grid (every ``grid`` steps),
  as a TorchScript module ``obs [batch, obs_dim] float32 -> greedy action`` with any observation
  normalisation of the side frozen into it, so that one judge (``peers.py``, in dask-rl's venv,
  one Gymnasium) evaluates every side's policies the same way. The time a side spends taking
  snapshots is recorded (``snapshot_s``): it is in its wall time, and every side pays it at the
  same cadence in env steps.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable
from pathlib import Path

import torch


def side_args() -> argparse.Namespace:
    """The command line ``peers.py`` gives every side; ``--export`` is the step after the
    timed run for the sides that turn their own checkpoints into snapshots."""
    ap = argparse.ArgumentParser()
    for a in ("--env", "--out"):
        ap.add_argument(a, required=True)
    for a in ("--seed", "--budget", "--grid"):
        ap.add_argument(a, type=int, default=0)
    ap.add_argument("--cap-s", type=float, default=0)
    ap.add_argument("--spawn", type=float, default=time.time())
    ap.add_argument("--export", action="store_true")
    return ap.parse_args()


def trace(greedy: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
    with torch.no_grad():
        torch.jit.trace(greedy.eval(), example, check_trace=False).save(str(path))


def write_snapshots(out: str | Path,
                    taken: Iterable[tuple[int, float, torch.nn.Module, torch.Tensor]]) -> None:
    """Snapshots made after the run from ``(env_steps, wall_s, greedy, example)``, each
    traced as ``Record.snapshot`` would have, with ``snapshots.jsonl`` rewritten to list them."""
    out = Path(out)
    lines = []
    for env_steps, wall_s, greedy, example in taken:
        path = out / f"snapshot_{env_steps:010d}.pt"
        trace(greedy, example, path)
        lines.append({"env_steps": int(env_steps), "wall_s": wall_s, "file": path.name})
    with open(out / "snapshots.jsonl", "w") as fh:
        fh.writelines(json.dumps(x) + "\n" for x in lines)


class Record:
    """A side's progress and snapshots under ``out``; times are since ``spawn`` (epoch s)."""

    def __init__(self, out: str | Path, spawn: float, grid: int):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.spawn, self.grid = spawn, grid
        self.next_snapshot = grid
        self.snapshot_s = 0.0
        self._progress = open(self.out / "progress.jsonl", "a")
        self._snaps = open(self.out / "snapshots.jsonl", "a")

    def now(self) -> float:
        return time.time() - self.spawn

    def progress(self, env_steps: int, train_return: float | None = None) -> None:
        self._progress.write(json.dumps({"wall_s": self.now(), "env_steps": int(env_steps),
                                         "train_return": train_return}) + "\n")
        self._progress.flush()

    def due(self, env_steps: int) -> bool:
        return env_steps >= self.next_snapshot

    def snapshot(self, env_steps: int, greedy: torch.nn.Module, example: torch.Tensor,
                 wall_s: float | None = None) -> None:
        """Trace ``greedy`` and save it as the snapshot at ``env_steps`` (taken at ``wall_s``,
        now by default); the grid moves past ``env_steps``."""
        t0 = time.perf_counter()
        wall = self.now() if wall_s is None else wall_s
        path = self.out / f"snapshot_{env_steps:010d}.pt"
        trace(greedy, example, path)
        self._snaps.write(json.dumps({"env_steps": int(env_steps), "wall_s": wall,
                                      "file": path.name}) + "\n")
        self._snaps.flush()
        while self.next_snapshot <= env_steps:
            self.next_snapshot += self.grid
        self.snapshot_s += time.perf_counter() - t0

    def close(self, **side: object) -> None:
        (self.out / "side.json").write_text(json.dumps(
            {"snapshot_s": self.snapshot_s, "end_s": self.now(), **side}, default=str))
        self._progress.close()
        self._snaps.close()


class Normalized(torch.nn.Module):
    """``net`` behind frozen observation normalisation ``clip((obs - mean) / sqrt(var + eps))``
    (Gymnasium's ``NormalizeObservation`` and most peers' running mean/std), and a greedy head:
    ``argmax`` of logits, or a Gaussian mean clipped to ``[low, high]``."""

    def __init__(self, net: torch.nn.Module, *, mean=None, var=None, eps: float = 1e-8,
                 clip_obs: float | None = None, low=None, high=None):
        super().__init__()
        self.net = net
        self.norm = mean is not None
        if self.norm:
            self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
            self.register_buffer("std", torch.sqrt(torch.as_tensor(var, dtype=torch.float32)
                                                   + eps))
        self.clip_obs = clip_obs
        self.discrete = low is None
        if not self.discrete:
            self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.norm:
            x = (x - self.mean) / self.std
        if self.clip_obs is not None:
            x = torch.clamp(x, -self.clip_obs, self.clip_obs)
        out = self.net(x)
        if self.discrete:
            return torch.argmax(out, dim=-1)
        return torch.max(torch.min(out, self.high), self.low)
