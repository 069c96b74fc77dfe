"""Every shipped pipeline runs from the CLI.

Each file in ``pipelines/`` (one added later is picked up here by itself) is trained through
``dask-rl train`` for a few thousand env steps, as shipped but for its budget (env steps, and
one epoch or a few gradient steps per learner task: a learner's compute, not what it
computes, is what a smoke run can spare): the run must end
with exit 0 and a ``summary.json`` that counts env steps and updates. This is what catches an
environment family whose dependencies a fresh install lacks (the workers, separate processes,
import and make every environment). The runs share one cluster of 2 worker processes
(``--address``), the shape of the pipelines' own ``cluster`` sections: starting a Python and an
embedded cluster for each would cost ~7 s a pipeline, and the embedded cluster's own start is
what ``test_train_cartpole.py`` and ``test_cluster_modes.py`` run.
"""

import json
import time
from pathlib import Path

import pytest

from dask_rl.cli import main
from dask_rl.config import load_pipeline

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = sorted((ROOT / "pipelines").glob("*.yaml"))
STEPS = 2048  # env steps per run (per member for population-based training)

pytestmark = pytest.mark.smoke


def budget(path: Path) -> list[str]:
    """``--set`` overrides that shrink a pipeline's budget (env steps, a learner task's epochs
    or gradient steps, a replay learner's warm-up) and nothing else."""
    cfg = load_pipeline(path)
    sets = []
    # a replay learner starts after learning_starts transitions: half the budget here
    starts = getattr(cfg.algo, "learning_starts", 0)
    if starts > STEPS // 2:
        starts = STEPS // 2
        sets.append(f"algo.learning_starts={starts}")
    steps = STEPS if cfg.algo.name == "es" else max(STEPS, 2 * cfg.batch_size, 2 * starts)
    sets += [f"stop.env_steps={steps}", "stop.eval_episodes=1", "checkpoint.every_s=0",
             "learner.epochs=1"]
    if getattr(cfg.algo, "updates_per_task", 0) > 4:
        sets.append("algo.updates_per_task=4")
    if cfg.population is not None:
        sets += [f"population.ready_env_steps={steps // 2}", "population.eval_episodes=1"]
    return [arg for s in sets for arg in ("--set", s)]


def test_every_pipeline_is_smoke_tested():
    assert len(PIPELINES) >= 13


@pytest.mark.slow
@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.stem)
def test_pipeline_trains_from_the_cli(tmp_path, path, local_client, capsys):
    run_dir = tmp_path / "run"
    t0 = time.time()
    code = main(["train", str(path), "--run-dir", str(run_dir), "--no-progress",
                 "--address", local_client.scheduler.address, *budget(path)])
    assert code == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"{path.name}: {summary['env_steps']} env steps, {summary['updates']} updates, "
          f"{time.time() - t0:.1f} s")
    assert summary["env_steps"] > 0
    assert summary["updates"] > 0
    assert summary["final_return"] is not None
