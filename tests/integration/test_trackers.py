"""TensorBoard and MLflow, read back with their own readers after a real run; and an MLflow
server that stops answering, which must cost the run nothing.

A short Stellaris run on 2 worker processes logs to both; TensorBoard's event reader and
MLflow's client (on a local file store) then see the tags, every value ``metrics.jsonl``
holds, the pipeline as params, and the exported policy as an artifact that loads and acts.

:class:`SilentMlflow` is a real HTTP server on 127.0.0.1 that speaks enough of MLflow's REST
API to open a run, and from a chosen request on accepts and never answers (what a hung proxy
or an overloaded tracking server does). The MLflow client's own timeout is set long in these
tests (MLflow's default is 120 s, retried 7 times): only the trackers' bounds may save the
run.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import dask_rl
from dask_rl.config import ConfigError, load_pipeline
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


class SilentMlflow:
    """An MLflow tracking server on 127.0.0.1 that goes silent: once a request matching
    ``silent_from`` arrives, that request and every later one are accepted and never answered
    (until :meth:`close`). ``silent_from`` takes the path and the JSON body."""

    def __init__(self, silent_from):
        self.silent_from = silent_from
        self.silent = threading.Event()
        self.silent_at: float | None = None   # time.time() of the first unanswered request
        self.released = threading.Event()
        self.paths: list[str] = []
        self.bodies: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer()

            def do_POST(self):
                self._answer()

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                path = self.path   # with the query: a tracking URI may carry one
                owner.paths.append(path)
                owner.bodies.append(body)
                if owner.silent.is_set() or owner.silent_from(path, body):
                    if not owner.silent.is_set():
                        owner.silent_at = time.time()
                        owner.silent.set()
                    owner.released.wait()   # accepted, read, never answered
                    return
                data = json.dumps(owner.reply(path, body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def reply(path: str, body: dict) -> dict:
        experiment = {"experiment_id": "1", "name": "silent", "lifecycle_stage": "active",
                      "artifact_location": "mlflow-artifacts:/1"}
        info = {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "RUNNING",
                "start_time": int(time.time() * 1000), "lifecycle_stage": "active",
                "artifact_uri": "mlflow-artifacts:/1/r1/artifacts", "run_name": "silent"}
        if "/experiments/search" in path:
            return {"experiments": [experiment]}
        if "/experiments/get-by-name" in path:
            return {"experiment": experiment}
        if "/runs/create" in path:
            return {"run": {"info": info, "data": {}}}
        if "/runs/update" in path:
            return {"run_info": info}
        return {}

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def _long_mlflow_client_timeouts(monkeypatch):
    # what a user may have (MLflow's own default is longer still): a stall the trackers'
    # bounds must cut short, and one the code before them waited out on the driver
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "90")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


def test_a_tracking_server_that_stops_answering_costs_no_checkpoint(local_client, pipelines,
                                                                    tmp_path, monkeypatch):
    """The server answers until the run has written 2 checkpoints, then takes the next batch
    of metrics and never answers; checkpoints go on every ``every_s`` all the same."""
    _long_mlflow_client_timeouts(monkeypatch)
    run = tmp_path / "run"

    def checkpoints() -> list[float]:
        try:   # read while the driver writes it
            return [r["time"] for r in read_metrics(run / "metrics.jsonl")
                    if r["kind"] == "checkpoint"]
        except (OSError, ValueError):
            return []

    server = SilentMlflow(lambda path, body: "/runs/log-batch" in path
                          and bool(body.get("metrics")) and len(checkpoints()) >= 2)
    every_s, wall_s = 2.0, 25
    try:
        t0 = time.monotonic()
        result = dask_rl.train(
            pipelines / "ppo_cartpole.yaml", client=local_client, run_dir=run,
            overrides=["stop.env_steps=10000000", f"stop.wall_s={wall_s}",
                       "stop.eval_every_updates=0", "stop.solve_on_target=false",
                       f"checkpoint.every_s={every_s}",
                       f"logging.mlflow.tracking_uri={server.uri}",
                       "logging.mlflow.experiment=silent"])
        took = time.monotonic() - t0
    finally:
        server.close()
    assert server.silent_at is not None, f"the server never went silent: {server.paths}"
    times = checkpoints()
    after = [t for t in times if t > server.silent_at]
    gaps = np.diff([server.silent_at] + after)
    print(f"{len(times)} checkpoints, {len(after)} after the server went silent; gaps since "
          f"then max {gaps.max():.1f} s, mean {gaps.mean():.1f} s; train() took {took:.0f} s")
    assert len(after) >= 3, (server.silent_at, times)
    # a driver waiting on the server would leave a hole of the client's 90 s timeout
    assert gaps.max() < every_s + 25, gaps
    assert result.summary["stop_reason"] == "wall_s", result.summary
    assert (run / "summary.json").exists()
    assert any(r["kind"] == "run" and r.get("event") == "end"
               for r in read_metrics(run / "metrics.jsonl"))
    # the end waits for the trackers a bounded time, not for the server
    assert took < wall_s + 120, took
    assert json.loads((run / "mlflow.json").read_text())["run_id"] == "r1"


def _cfg(pipelines, uri):
    return load_pipeline(pipelines / "ppo_cartpole.yaml",
                         overrides=[f"logging.mlflow.tracking_uri={uri}"])


def test_opening_the_mlflow_run_on_a_silent_server_is_bounded(pipelines, tmp_path,
                                                              monkeypatch):
    """It answers the preflight check, then never again: one line, in seconds."""
    from dask_rl import tracking

    _long_mlflow_client_timeouts(monkeypatch)
    server = SilentMlflow(lambda path, body: "/experiments/search" not in path)
    try:
        cfg = _cfg(pipelines, server.uri)
        tracking.check(cfg)
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="logging"):
            tracking.Trackers(cfg, tmp_path)
        took = time.monotonic() - t0
    finally:
        server.close()
    assert server.silent.is_set()
    assert took < tracking.OPEN_TIMEOUT_S + 10, took


def test_a_server_that_never_answers_stops_the_run_in_one_line_without_its_secrets(
        pipelines, tmp_path, monkeypatch):
    from dask_rl import tracking

    _long_mlflow_client_timeouts(monkeypatch)
    server = SilentMlflow(lambda path, body: True)
    uri = server.uri.replace("//", "//bob:hunter2@") + "/?token=s3cret&team=rl"
    try:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="logging.mlflow.tracking_uri: cannot reach") as e:
            tracking.check(_cfg(pipelines, uri))
        took = time.monotonic() - t0
    finally:
        server.close()
    message = str(e.value)
    assert "\n" not in message
    assert "hunter2" not in message and "s3cret" not in message, message
    assert "team=rl" in message, message
    assert took < tracking.REQUEST_TIMEOUT_S + 10, took


def test_mlflow_json_and_params_keep_no_credentials(pipelines, tmp_path):
    from dask_rl import tracking

    server = SilentMlflow(lambda path, body: False)
    uri = server.uri.replace("//", "//bob:hunter2@") + "/?token=s3cret&team=rl"
    try:
        cfg = load_pipeline(pipelines / "ppo_cartpole.yaml", overrides=[
            f"logging.mlflow.tracking_uri={uri}",
            "env.kwargs={sutton_barto_reward: true, api_key: k3y}"])
        trackers = tracking.Trackers(cfg, tmp_path)
        trackers.write({"kind": "learner", "env_steps": 512, "steps_per_s": 100.0,
                        "time": time.time()})
        delivery = trackers.finish()
    finally:
        server.close()
    saved = (tmp_path / "mlflow.json").read_text()
    params = [p for body in server.bodies for p in body.get("params", [])]
    assert {p["key"]: p["value"] for p in params}["env.kwargs.api_key"] == "<redacted>"
    for secret in ("hunter2", "s3cret", "k3y"):
        assert secret not in saved, saved
        assert secret not in json.dumps(params), params
    assert "team=rl" in json.loads(saved)["tracking_uri"]
    assert delivery.closed and delivery.written == 1, delivery
    assert any(m["key"] == "charts/SPS" for body in server.bodies
               for m in body.get("metrics", []))
