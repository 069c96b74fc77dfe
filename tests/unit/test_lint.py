"""The lint and type checks configured in pyproject.toml hold (ruff everywhere; mypy on the
pure layers: algos/, staleness/, control/, config/schema.py, data/)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_ruff_is_clean():
    proc = _run("ruff", "check", "--no-cache", "dask_rl", "tests", "benchmarks")
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_the_pure_layers_type_check():
    proc = _run("mypy", "--no-incremental", "--cache-dir", "/dev/null")
    assert proc.returncode == 0, proc.stdout[-3000:]
