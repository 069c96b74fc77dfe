"""Every shipped pipeline runs from the CLI on the embedded cluster.

Each file in ``pipelines/`` (one added later is picked up here by itself) is trained through
``dask-rl train`` for a few thousand env steps, as shipped but for its budget: the run must end
with exit 0 and a ``summary.json`` that counts env steps and updates. This is what catches an
environment family whose dependencies a fresh install lacks.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dask_rl.config import load_pipeline

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = sorted((ROOT / "pipelines").glob("*.yaml"))
STEPS = 2048  # env steps per run (per member for population-based training)

pytestmark = pytest.mark.smoke


def budget(path: Path) -> list[str]:
    """``--set`` overrides that shrink a pipeline's budget (and a replay learner's warm-up)
    and nothing else."""
    cfg = load_pipeline(path)
    sets = []
    # a replay learner starts after learning_starts transitions: half the budget here
    starts = getattr(cfg.algo, "learning_starts", 0)
    if starts > STEPS // 2:
        starts = STEPS // 2
        sets.append(f"algo.learning_starts={starts}")
    steps = STEPS if cfg.algo.name == "es" else max(STEPS, 2 * cfg.batch_size, 2 * starts)
    sets += [f"stop.env_steps={steps}", "stop.eval_episodes=1", "checkpoint.every_s=0"]
    if cfg.population is not None:
        sets += [f"population.ready_env_steps={steps // 2}", "population.eval_episodes=1"]
    return [arg for s in sets for arg in ("--set", s)]


def test_every_pipeline_is_smoke_tested():
    assert len(PIPELINES) >= 13


@pytest.mark.slow
@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.stem)
def test_pipeline_trains_from_the_cli(tmp_path, path):
    run_dir = tmp_path / "run"
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "dask_rl.cli", "train", str(path), "--run-dir", str(run_dir),
         "--workers", "2", "--no-progress", *budget(path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"{path.name}: {summary['env_steps']} env steps, {summary['updates']} updates, "
          f"{time.time() - t0:.1f} s")
    assert summary["env_steps"] > 0
    assert summary["updates"] > 0
    assert summary["final_return"] is not None
