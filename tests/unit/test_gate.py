"""The evaluation gate's verdict at the end of a run, against scripted evaluations (no Dask)."""

import types

import pytest

from dask_rl.api import resolve
from dask_rl.data import Evaluation
from dask_rl.runtime.gate import EvaluationGate


class _Metrics:
    def __init__(self):
        self.records = []

    def write(self, kind, record):
        self.records.append((kind, record))
        return record


def _run(pipelines, stop_reason="env_steps"):
    cfg = resolve(pipelines / "ppo_cartpole.yaml", ["stop.solve_on_target=false"])
    return types.SimpleNamespace(cfg=cfg, metrics=_Metrics(), env_steps=1000, updates=10,
                                 elapsed=lambda: 1.0, stop_reason=stop_reason,
                                 interrupted=False)


def _evaluation(mean, episodes, std=0.0):
    return Evaluation(mean_return=mean, std_return=std, min_return=mean - std,
                      max_return=mean + std, mean_length=mean, episodes=episodes, version=7)


@pytest.mark.parametrize("confirmed_mean", [500.0, 470.0], ids=["confirmed", "not-confirmed"])
def test_a_final_screening_at_the_target_reports_its_confirmation(pipelines, confirmed_mean):
    """CartPole's target is 475: a final 10-episode screening of 480 asks for a confirmation of
    300 episodes, and what the summary reports (``final_return``; PBT's pick of its best
    member) is that confirmation, whatever it says, not the screening's 10 episodes."""
    gate = EvaluationGate(_run(pipelines))
    asked = []

    def evaluate(episodes, seed):
        asked.append((episodes, seed))
        return _evaluation(480.0, 10) if len(asked) == 1 else _evaluation(confirmed_mean, 300)

    final = gate.final(evaluate)
    assert [e for e, _ in asked] == [10, 300]
    assert final.episodes == 300 and final.mean_return == confirmed_mean
    assert gate.solved() == (confirmed_mean == 500.0)
    purposes = [r["purpose"] for kind, r in gate.run.metrics.records if kind == "eval"]
    assert purposes == ["screening", "confirmation"]


def test_a_final_screening_below_the_target_is_what_the_summary_reports(pipelines):
    gate = EvaluationGate(_run(pipelines))
    asked = []

    def evaluate(episodes, seed):
        asked.append(episodes)
        return _evaluation(300.0, episodes, std=20.0)

    final = gate.final(evaluate)
    assert asked == [10] and final.episodes == 10 and final.mean_return == 300.0
    assert not gate.solved()
