"""A checkpoint is data: `evaluate`, `export` and `load_policy` run nothing it names.

A checkpoint's config is written by whoever wrote the checkpoint. Here it names code two ways —
an ``env.entry_point`` of ``subprocess:run`` whose ``env.kwargs`` would run a shell command, and
an ``env.id`` of the form ``module:id`` whose module writes a file when imported — and every
way of reading it must leave both untouched unless the user vouches for it.
"""

import json
import sys

import pytest

from dask_rl.checkpoint import CheckpointStore
from dask_rl.cli import main
from dask_rl.config import ConfigError, from_dict, to_dict
from dask_rl.envs import env_spaces, space_to_dict
from dask_rl.models import get_flat, make_model
from dask_rl.policy import load_policy

CARTPOLE = from_dict({})


def _crafted(tmp_path, env: dict, *, spaces: bool) -> tuple:
    """A run directory whose checkpoint's config names ``env``; the files code would touch."""
    marker = tmp_path / "ran"
    params = get_flat(make_model(*env_spaces(CARTPOLE.env), CARTPOLE.model, seed=0))
    config = to_dict(CARTPOLE)
    config["env"] = {**config["env"], **env}
    meta = {"config": config, "algorithm": "ppo", "env_id": "CartPole-v1", "env_steps": 10}
    if spaces:
        obs, act = env_spaces(CARTPOLE.env)
        meta["spaces"] = {"observation": space_to_dict(obs), "action": space_to_dict(act)}
    run = tmp_path / "run"
    CheckpointStore(run / "checkpoints").save(
        {"actor": {"params": params, "version": 3, "moments": None}}, meta=meta)
    return run, marker


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    """An importable module that leaves a file behind when it is imported."""
    name = "dask_rl_test_evil_env"
    (tmp_path / f"{name}.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _cases(tmp_path, module: str) -> dict:
    return {"subprocess": {"id": None, "entry_point": "subprocess:run",
                           "kwargs": {"args": ["touch", str(tmp_path / "ran")]}},
            "module:id": {"id": f"{module}:CartPole-v1"}}


@pytest.mark.parametrize("case", ["subprocess", "module:id"])
@pytest.mark.parametrize("spaces", [True, False])
def test_evaluate_refuses_with_one_line_and_runs_nothing(tmp_path, capsys, evil_module, case,
                                                         spaces):
    run, marker = _crafted(tmp_path, _cases(tmp_path, evil_module)[case], spaces=spaces)
    assert main(["evaluate", str(run), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a checkpoint is data" in err[0] and "--pipeline" in err[0], err
    assert not marker.exists()


@pytest.mark.parametrize("case", ["subprocess", "module:id"])
def test_export_and_load_policy_use_the_recorded_spaces_and_run_nothing(tmp_path, capsys,
                                                                       evil_module, case):
    run, marker = _crafted(tmp_path, _cases(tmp_path, evil_module)[case], spaces=True)
    assert main(["export", str(run), "-o", str(tmp_path / "policy.pt")]) == 0
    assert (tmp_path / "policy.pt").exists()
    policy = load_policy(run)
    assert policy.act([0.0, 0.0, 0.0, 0.0]) in (0, 1)
    with pytest.raises(ConfigError, match="a checkpoint is data"):
        policy.make_env()
    assert not marker.exists()


@pytest.mark.parametrize("case", ["subprocess", "module:id"])
def test_without_recorded_spaces_export_and_load_policy_refuse(tmp_path, capsys, evil_module,
                                                               case):
    run, marker = _crafted(tmp_path, _cases(tmp_path, evil_module)[case], spaces=False)
    assert main(["export", str(run), "-o", str(tmp_path / "policy.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "records no spaces" in err[0], err
    with pytest.raises(ConfigError, match="a checkpoint is data"):
        load_policy(run)
    assert not marker.exists()


def test_the_users_pipeline_or_trust_makes_the_environment(tmp_path, capsys, evil_module):
    # the user's own pipeline: its environment (CartPole) is made, the checkpoint's is not
    run, marker = _crafted(tmp_path, _cases(tmp_path, evil_module)["module:id"], spaces=False)
    pipeline = tmp_path / "mine.yaml"
    pipeline.write_text("env: {id: CartPole-v1}\n")
    assert main(["evaluate", str(run), "--episodes", "2", "--pipeline", str(pipeline)]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    assert load_policy(run, pipeline=pipeline).make_env() is not None
    assert not marker.exists()
    # a pipeline of another algorithm is refused, not silently used
    other = tmp_path / "other.yaml"
    other.write_text("algo: {name: impact}\n")
    assert main(["evaluate", str(run), "--pipeline", str(other)]) == 2
    assert "the checkpoint's is 'ppo'" in capsys.readouterr().err
    # --trust-checkpoint: the checkpoint's own config, code included (here: the import)
    main(["evaluate", str(run), "--episodes", "1", "--trust-checkpoint"])
    assert marker.exists()


def test_a_plain_gymnasium_id_needs_no_trust(tmp_path, capsys):
    run, _ = _crafted(tmp_path, {"id": "CartPole-v1"}, spaces=False)
    assert main(["evaluate", str(run), "--episodes", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    assert load_policy(run).make_env() is not None
