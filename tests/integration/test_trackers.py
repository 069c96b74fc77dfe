"""TensorBoard and MLflow, read back with their own readers after a real run.

A short Stellaris run on 2 worker processes logs to both; TensorBoard's event reader and
MLflow's client (on a local file store) then see the tags, every value ``metrics.jsonl``
holds, the pipeline as params, and the exported policy as an artifact that loads and acts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import dask_rl
from dask_rl.data.metrics import read_metrics

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

CLEANRL_TAGS = {"charts/episodic_return", "charts/episodic_length", "charts/learning_rate",
                "charts/SPS", "losses/value_loss", "losses/policy_loss", "losses/entropy",
                "losses/approx_kl", "losses/clipfrac"}
OUR_TAGS = {"staleness/gradient", "staleness/mean", "threshold/beta", "gradients/applied",
            "gradients/buffered", "gradients/dropped"}


def test_tensorboard_and_mlflow_read_back_what_the_run_logged(local_client, pipelines,
                                                              tmp_path, monkeypatch):
    import torch
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # MLflow 3 keeps its local file store only on request (a database store needs the full
    # mlflow package); a user of a tracking server needs neither
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    uri = (tmp_path / "mlruns").as_uri()
    dask_rl.train(pipelines / "ppo_cartpole_stellaris.yaml", client=local_client, run_dir=run,
                  overrides=["stop.env_steps=12000", "stop.solve_on_target=false",
                             "logging.tensorboard=true", f"logging.mlflow.tracking_uri={uri}",
                             "logging.mlflow.experiment=trackers-test"])
    records = read_metrics(run / "metrics.jsonl")
    returns = [(r["env_steps"], r["charts/episodic_return"]) for r in records
               if r["kind"] == "learner" and r.get("charts/episodic_return") is not None]
    assert returns

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert CLEANRL_TAGS | OUR_TAGS <= tags, (CLEANRL_TAGS | OUR_TAGS) - tags
    logged = [(e.step, e.value) for e in events.Scalars("charts/episodic_return")]
    assert [s for s, _ in logged] == [s for s, _ in returns]
    np.testing.assert_allclose([v for _, v in logged], [v for _, v in returns], rtol=1e-6)

    client = MlflowClient(tracking_uri=uri)
    run_id = json.loads((run / "mlflow.json").read_text())["run_id"]
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED"
    assert got.data.params["aggregation.strategy"] == "stellaris"
    assert float(got.data.params["learner.lr"]) == pytest.approx(2.5e-4)
    assert CLEANRL_TAGS | OUR_TAGS <= set(got.data.metrics)
    history = client.get_metric_history(run_id, "charts/episodic_return")
    assert sorted(m.step for m in history) == sorted(s for s, _ in returns)
    assert got.data.metrics["summary/env_steps"] >= 12000
    names = {a.path for a in client.list_artifacts(run_id, "policy")}
    assert "policy/policy.pt" in names, names
    local = client.download_artifacts(run_id, "policy/policy.pt", str(tmp_path))
    policy = torch.jit.load(local)
    obs = torch.zeros(3, 4)
    assert policy(obs).shape == (3,)
