"""The CLI's input checking: one clear line and exit code 2, before any cluster starts."""

import json

import pytest

from dask_rl.cli import main


def _write(tmp_path, text):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return str(p)


def test_validate_ok(pipelines, capsys):
    assert main(["validate", str(pipelines / "ppo_cartpole.yaml")]) == 0
    assert "ok: ppo on CartPole-v1" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["train", "validate"])
@pytest.mark.parametrize("text, args, message", [
    ("learner:\n  lrr: 1\n", [], "learner.lrr: unknown key"),
    ("learner:\n  lr: -1\n", [], "learner.lr: must be > 0, got -1.0"),
    ("env:\n  id: Nope-v0\n", [], "env.id: unknown Gymnasium environment id, got 'Nope-v0'"),
    ("env:\n  num_envs: many\n", [], "env.num_envs: expected an integer, got 'many'"),
    ("{}\n", ["--set", "stop.env_steps=-5"], "stop.env_steps: must be >= 1, got -5"),
    ("{}\n", ["--set", "learner"], "--set: expected key.path=value, got 'learner'"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, command, text, args, message):
    code = main([command, _write(tmp_path, text), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.count("\n") == 1


def test_missing_pipeline_file(tmp_path, capsys):
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "pipeline file not found" in capsys.readouterr().err


def test_resume_needs_a_run_dir(pipelines, capsys):
    assert main(["train", str(pipelines / "ppo_cartpole.yaml"), "--resume"]) == 2
    assert "--resume: needs --run-dir" in capsys.readouterr().err


def test_evaluate_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path)]) == 2
    assert "no checkpoints here" in capsys.readouterr().err


def test_evaluate_a_checkpoint(tmp_path, capsys):
    from dask_rl.checkpoint import CheckpointStore
    from dask_rl.config import from_dict, to_dict
    from dask_rl.envs import env_spaces
    from dask_rl.models import get_flat, make_model

    cfg = from_dict({})
    params = get_flat(make_model(*env_spaces(cfg.env), cfg.model, seed=0))
    CheckpointStore(tmp_path / "checkpoints").save(
        {"actor": {"params": params, "version": 3, "moments": None}},
        meta={"config": to_dict(cfg), "algorithm": "ppo", "env_steps": 10})
    assert main(["evaluate", str(tmp_path), "--episodes", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["episodes"] == 3 and out["version"] == 3 and out["checkpoint"] == "ckpt-00000000"


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    import time

    from dask_rl.api import default_run_dir
    from dask_rl.config import from_dict

    monkeypatch.setattr(time, "strftime", lambda fmt: "20261202-150000")   # one second
    cfg = from_dict({})
    dirs = [default_run_dir(cfg, tmp_path) for _ in range(3)]
    assert len(set(dirs)) == 3 and all(d.is_dir() for d in dirs)
    assert dirs[1].name == dirs[0].name + "-2"
