"""The sweep's space file: what is accepted, what is refused in one line (no cluster)."""

from __future__ import annotations

import pytest

from dask_rl.config import ConfigError, load_pipeline
from dask_rl.sweeps import load_space, suggest


@pytest.fixture
def cfg(pipelines):
    return load_pipeline(pipelines / "ppo_cartpole.yaml")


def _space(tmp_path, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_a_space_of_floats_ints_and_choices_is_read_and_sampled(tmp_path, cfg):
    import optuna

    space = load_space(_space(tmp_path, (
        "learner.lr: {low: 1.0e-4, high: 1.0e-3, log: true}\n"
        "learner.max_learners: {low: 1, high: 3, int: true}\n"
        "aggregation.strategy: {choices: [async, stellaris]}\n")), cfg)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        values = suggest(study.ask(), space)
        assert 1e-4 <= values["learner.lr"] <= 1e-3
        assert values["learner.max_learners"] in (1, 2, 3)
        assert values["aggregation.strategy"] in ("async", "stellaris")


@pytest.mark.parametrize("text, message", [
    ("learner.rate: {low: 1, high: 2}\n", "learner.rate: not a key of the pipeline"),
    ("learner.lr: [1, 2]\n", "expected {low, high[, log, int]} or {choices}"),
    ("learner.lr: {low: 1.0e-3, high: 1.0e-4}\n", "low must be < high"),
    ("learner.lr: {low: -1, high: 1.0e-3}\n", "learner.lr: must be > 0"),
    ("aggregation.strategy: {choices: []}\n", "choices must be a non-empty list"),
    ("- just a list\n", "expected a mapping"),
])
def test_a_bad_space_is_one_line(tmp_path, cfg, text, message):
    with pytest.raises(ConfigError, match=None) as e:
        load_space(_space(tmp_path, text), cfg)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_sweep_whose_trials_all_fail_stops_after_three_in_a_row(tmp_path, pipelines,
                                                                  monkeypatch):
    # the trials' runs are replaced by one that fails at once: the sweep's own bookkeeping
    # (asking, telling, counting, stopping) is what is under test, with a real Optuna journal
    import json

    import dask_rl.sweeps as sweeps

    calls = []

    def failing_train(cfg, **kwargs):
        calls.append(kwargs["run_dir"])
        raise RuntimeError("the environment could not be made on the workers")

    monkeypatch.setattr(sweeps, "train", failing_train)
    with pytest.raises(RuntimeError, match="3 trials failed in a row; the last: the env"):
        sweeps.sweep(pipelines / "ppo_cartpole.yaml",
                     {"learner.lr": {"low": 1e-4, "high": 1e-3}}, trials=10,
                     sweep_dir=tmp_path / "s", parallel=1, client=object())
    assert len(calls) == 3
    rows = json.loads((tmp_path / "s" / "results.json").read_text())["trials"]
    assert [r["state"] for r in rows] == ["FAIL"] * 3


def test_a_dict_space_is_checked_like_a_file(pipelines, tmp_path):
    import dask_rl.sweeps as sweeps

    with pytest.raises(ConfigError, match="space: learner.rate: not a key of the pipeline"):
        sweeps.sweep(pipelines / "ppo_cartpole.yaml", {"learner.rate": {"low": 1, "high": 2}},
                     trials=2, sweep_dir=tmp_path / "s", client=object())
    assert not (tmp_path / "s").exists()
