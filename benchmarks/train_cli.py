"""The ``dask-rl train`` command line the benchmarks run in a fresh process."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable


def train_command(pipeline: Path, run_dir: Path, settings: Iterable[str]) -> list[str]:
    """``python -m dask_rl.cli train PIPELINE --run-dir RUN --no-progress --set S ...``."""
    cmd = [sys.executable, "-m", "dask_rl.cli", "train", str(pipeline), "--run-dir", str(run_dir),
           "--no-progress"]
    for setting in settings:
        cmd += ["--set", setting]
    return cmd
