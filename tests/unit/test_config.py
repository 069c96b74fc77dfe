"""Pipelines load into frozen dataclasses; bad input gets one clear line naming key and value."""

import dataclasses
import json

import numpy as np
import pytest

from dask_rl.algos.ppo import PPOConfig
from dask_rl.config import (
    ConfigError,
    PipelineConfig,
    apply_overrides,
    from_dict,
    load_pipeline,
)
from dask_rl.config.reference import describe, reference_markdown
from dask_rl.staleness import SyncConfig


def test_every_shipped_pipeline_validates(pipelines):
    files = sorted(pipelines.glob("*.yaml"))
    assert files, "no pipelines shipped"
    for path in files:
        cfg = load_pipeline(path)
        assert isinstance(cfg, PipelineConfig)


def test_defaults_and_frozen():
    cfg = from_dict({})
    assert isinstance(cfg.algo, PPOConfig)
    assert cfg.env.id == "CartPole-v1"
    assert cfg.batch_size == cfg.env.num_envs * cfg.rollout.steps
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]


def test_overrides_parse_yaml_values(pipelines):
    cfg = load_pipeline(pipelines / "ppo_cartpole.yaml",
                        ["learner.lr=1e-3", "aggregation.strategy=sync", "model.hidden=[32, 32]",
                         "stop.wall_s=null", "seed=7"])
    assert cfg.learner.lr == 1e-3
    assert isinstance(cfg.aggregation, SyncConfig)
    assert cfg.model.hidden == (32, 32)
    assert cfg.stop.wall_s is None
    assert cfg.seed == 7


def test_override_creates_missing_sections():
    data = apply_overrides({}, ["learner.epochs=2"])
    assert data == {"learner": {"epochs": 2}}
    assert from_dict(data).learner.epochs == 2


def test_yaml_exponent_strings_are_numbers():
    # YAML 1.1 reads 1e-3 (no dot) as a string.
    assert from_dict({"learner": {"lr": "1e-3"}}).learner.lr == 1e-3
    assert from_dict({"stop": {"env_steps": "3e5"}}).stop.env_steps == 300000


@pytest.mark.parametrize("data, message", [
    ({"learner": {"lrr": 0.1}}, "learner.lrr: unknown key"),
    ({"bogus": 1}, "bogus: unknown key"),
    ({"learner": {"lr": -0.1}}, "learner.lr: must be > 0, got -0.1"),
    ({"learner": {"lr": "fast"}}, "learner.lr: expected a number, got 'fast'"),
    ({"learner": {"epochs": 2.5}}, "learner.epochs: expected an integer, got 2.5"),
    ({"learner": {"epochs": True}}, "learner.epochs: expected an integer, got True"),
    ({"learner": {"anneal_lr": "yes"}}, "learner.anneal_lr: expected true or false, got 'yes'"),
    ({"learner": {"device": "tpu"}}, "learner.device: must be one of auto, cpu, cuda, got 'tpu'"),
    ({"env": {"num_envs": 0}}, "env.num_envs: must be >= 1, got 0"),
    ({"env": {"id": "NoSuchEnv-v9"}}, "env.id: unknown Gymnasium environment id, "
                                      "got 'NoSuchEnv-v9'"),
    ({"env": "CartPole-v1"}, "env: expected a mapping, got 'CartPole-v1'"),
    ({"algo": {"name": "sac"}}, "algo.name: must be one of ppo, impact, es, dqn, got 'sac'"),
    ({"algo": {"name": "ppo", "rho_bar": 1.0}}, "algo.rho_bar: unknown key"),
    ({"aggregation": {"strategy": "fedavg"}}, "aggregation.strategy: must be one of"),
    ({"algo": {"gamma": 1.5}}, "algo.gamma: must be <= 1, got 1.5"),
    ({"model": {"hidden": [64, "x"]}}, "model.hidden[1]: expected an integer, got 'x'"),
    ({"model": {"hidden": 64}}, "model.hidden: expected a list, got 64"),
    ({"stop": {"wall_s": float("nan")}}, "stop.wall_s: must be finite"),
    ({"cluster": {"kind": "address"}}, "cluster.address: required"),
    ({"learner": {"minibatches": 10_000}}, "learner.minibatches: must be <= env.num_envs"),
])
def test_bad_values_name_key_and_value(data, message):
    with pytest.raises(ConfigError) as e:
        from_dict(data)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="pipeline file not found: .*nope.yaml"):
        load_pipeline(tmp_path / "nope.yaml")


def test_bad_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("env:\n  id: [CartPole\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline(p)


def test_top_level_must_be_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping of sections, got list"):
        load_pipeline(p)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="expected key.path=value"):
        apply_overrides({}, ["learner.lr"])
    with pytest.raises(ConfigError, match="env.id is not a section"):
        apply_overrides({"env": {"id": "CartPole-v1"}}, ["env.id.x=1"])


def test_describe_documents_every_field():
    rows = describe()
    keys = {k for k, _, _ in rows}
    assert "learner.lr" in keys and "algo.clip_coef" in keys and "aggregation.strategy" in keys
    assert all(doc for _, _, doc in rows), [k for k, _, d in rows if not d]


def test_docs_config_reference_is_current():
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "config.md"
    assert doc.read_text() == reference_markdown(), \
        "docs/config.md is stale: run python -m dask_rl.config.reference > docs/config.md"


def test_switching_a_variant_from_the_command_line_drops_the_old_variants_keys(pipelines):
    cfg = load_pipeline(pipelines / "ppo_cartpole_stellaris.yaml",
                        ["aggregation.strategy=ssp", "aggregation.bound=2"])
    assert cfg.aggregation.strategy == "ssp" and cfg.aggregation.bound == 2
    with pytest.raises(ConfigError, match="aggregation.bound: unknown key"):
        from_dict({"aggregation": {"strategy": "stellaris", "bound": 2}})


@pytest.mark.parametrize("section, old, new, value, read", [
    ("aggregation", "lr", "alpha0", 2.0, lambda c: c.aggregation.alpha0),
    ("rollout", "num_actors", "slots", 3, lambda c: c.rollout.slots),
])
def test_renamed_keys_are_still_read_under_their_new_names(section, old, new, value, read,
                                                           caplog):
    cfg = from_dict({section: {old: value}})
    assert read(cfg) == value
    assert f"{section}.{old} is now called {section}.{new}" in caplog.text
    with pytest.raises(ConfigError, match=f"{section}.{old}: renamed to {section}.{new}"):
        from_dict({section: {old: value, new: value}})


def test_es_step_size_was_called_lr():
    assert from_dict({"algo": {"name": "es", "lr": 0.05}}).algo.step_size == 0.05


def test_population_based_training_needs_gradient_learners():
    with pytest.raises(ConfigError, match="population: population-based training trains "
                                          "gradient learners"):
        from_dict({"algo": {"name": "es"}, "population": {}})


def test_a_pipeline_that_is_not_a_mapping():
    with pytest.raises(ConfigError, match="pipeline: expected a mapping, got \\[1\\]"):
        from_dict([1])


def test_what_leaves_the_driver_carries_no_credentials_and_a_resume_still_matches(tmp_path):
    from dask_rl.api import check_run_dir
    from dask_rl.checkpoint import CheckpointStore
    from dask_rl.config import public_dict

    cfg = from_dict({"env": {"id": "CartPole-v1",
                             "kwargs": {"api_key": "k3y", "sutton_barto_reward": False}},
                     "checkpoint": {"path": f"file://{tmp_path}/x?token=t0k"},
                     "logging": {"mlflow": {"tracking_uri": "https://bob:hunter2@h/?token=s3"}}},
                    check_env=False)
    text = json.dumps(public_dict(cfg))
    for secret in ("k3y", "t0k", "hunter2", "s3\""):
        assert secret not in text, secret
    assert public_dict(cfg)["env"]["kwargs"]["sutton_barto_reward"] is False
    # a checkpoint keeps the redacted config; resuming with the real one is the same pipeline
    CheckpointStore(tmp_path / "run" / "checkpoints").save(
        {"actor": {"params": np.zeros(3, np.float32), "version": 1}},
        meta={"config": public_dict(cfg)})
    check_run_dir(cfg, tmp_path / "run", resume=True)
