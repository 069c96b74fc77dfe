"""The trackers' feed and redaction, without a cluster.

:class:`~dask_rl.tracking.Feed` is driven here with trackers that block or fail on purpose (the
real MLflow server that stops answering is in ``tests/integration/test_trackers.py``): records
are never waited for, the queue stays bounded and counts what it drops, and the end waits a
bounded time. Redaction is checked case by case on URIs, messages and ``env.kwargs``.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from dask_rl.config import from_dict
from dask_rl.tracking import (
    Feed,
    HttpLimits,
    Tracker,
    flat_params,
    redact,
    redact_secrets,
    redact_uri,
)

R = "<redacted>"


class Recording(Tracker):
    """Keeps what it is given; ``gate`` (when given) holds every write until it is set."""

    name = "recording"

    def __init__(self, gate: threading.Event | None = None, *, fail_on: int | None = None):
        self.gate, self.fail_on = gate, fail_on
        self.entered = threading.Event()
        self.values: list[float] = []
        self.closed: dict | None = None
        self.ticks = 0

    def write(self, values, step, ms, **kwargs):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        if self.fail_on is not None and step == self.fail_on:
            raise ConnectionError("http://bob:hunter2@mlflow.example.com/ went away")
        self.values.append(values["x"])

    def tick(self, **kwargs):
        self.ticks += 1

    def close(self, **kwargs):
        self.closed = kwargs


def record(i: int) -> tuple[dict[str, float], int, int]:
    return {"x": float(i)}, i, 0


@pytest.fixture
def gate():
    event = threading.Event()
    yield event
    event.set()   # let a thread a test left stuck end


def test_a_stuck_tracker_never_blocks_put_and_the_queue_drops_the_oldest(gate, caplog):
    tracker = Recording(gate)
    feed = Feed([tracker], maxsize=10)
    assert feed.wait_open(10)
    feed.put(record(0))
    assert tracker.entered.wait(10)   # the thread is stuck in record 0
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dask_rl.tracking"):
        for i in range(1, 1001):
            feed.put(record(i))
        took = time.monotonic() - t0
        assert len(feed.items) == 10
        gate.set()
        delivery = feed.finish(status="FINISHED", timeout_s=30)
    assert took < 5, took   # 1000 puts while the tracker is stuck: no waiting
    assert delivery.dropped == 990 and delivery.written == 11, delivery
    assert delivery.closed and delivery.undelivered == 0
    assert tracker.values == [0.0] + [float(i) for i in range(991, 1001)]   # newest kept
    assert tracker.closed == {"status": "FINISHED", "artifacts": ()}
    full = [r for r in caplog.records if "dropping the oldest" in r.getMessage()]
    assert len(full) == 1   # said once, not once a record
    assert any("990 records were dropped" in r.getMessage() for r in caplog.records)


def test_finish_gives_up_on_a_tracker_that_never_returns(gate, caplog):
    tracker = Recording(gate)
    feed = Feed([tracker], maxsize=100)
    for i in range(5):
        feed.put(record(i))
    assert tracker.entered.wait(10)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dask_rl.tracking"):
        delivery = feed.finish(timeout_s=0.5)
    took = time.monotonic() - t0
    assert took < 5, took
    assert not delivery.closed and delivery.undelivered == 4 and delivery.written == 0
    assert tracker.closed is None
    assert any("gave up" in r.getMessage() for r in caplog.records)
    feed.put(record(99))   # after the end: ignored, not queued
    assert len(feed.items) == 4


def test_finish_delivers_everything_queued_then_closes_with_status_and_artifacts():
    class Slow(Recording):
        def write(self, values, step, ms, **kwargs):
            time.sleep(0.002)
            super().write(values, step, ms)

    tracker = Slow()
    feed = Feed([tracker], maxsize=1000)
    for i in range(200):
        feed.put(record(i))
    delivery = feed.finish(status="KILLED", artifacts=[("policy.pt", "policy")], timeout_s=60)
    assert delivery.closed and delivery.written == 200 and delivery.dropped == 0
    assert tracker.values == [float(i) for i in range(200)]
    assert tracker.closed == {"status": "KILLED", "artifacts": (("policy.pt", "policy"),)}


def test_a_failing_tracker_is_turned_off_and_the_others_go_on(caplog):
    bad, good = Recording(fail_on=3), Recording()
    bad.name = "bad"
    feed = Feed([bad, good])
    with caplog.at_level(logging.WARNING, logger="dask_rl.tracking"):
        for i in range(10):
            feed.put(record(i))
        delivery = feed.finish(timeout_s=30)
    assert good.values == [float(i) for i in range(10)]
    assert bad.values == [0.0, 1.0, 2.0] and bad.closed is None
    assert delivery.closed and feed.failed == {"bad"}
    warned = [r.getMessage() for r in caplog.records if "bad tracking failed" in r.getMessage()]
    assert len(warned) == 1 and "hunter2" not in warned[0], warned


def test_an_idle_feed_still_ticks():
    tracker = Recording()
    feed = Feed([tracker], tick_s=0.05)
    deadline = time.monotonic() + 10
    while tracker.ticks < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    feed.finish(timeout_s=10)
    assert tracker.ticks >= 3


def test_an_open_that_hangs_is_not_waited_for(gate):
    class Hanging(Recording):
        def open(self, **kwargs):
            gate.wait()

    feed = Feed([Hanging()])
    t0 = time.monotonic()
    assert not feed.wait_open(0.2)
    feed.abandon()
    assert time.monotonic() - t0 < 5


def test_http_limits_bound_mlflow_only_while_in_use_and_keep_a_shorter_timeout(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    limits = HttpLimits(timeout_s=10)
    with limits:
        with limits:   # overlapping calls (a sweep's trials)
            assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "10"
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "120"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    with limits:
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3"


@pytest.mark.parametrize("uri, expected", [
    ("http://bob:hunter2@mlflow.example.com:5000", f"http://{R}@mlflow.example.com:5000"),
    ("https://ghp_abc123@mlflow.example.com/", f"https://{R}@mlflow.example.com/"),
    ("https://mlflow.example.com/?token=abc&team=rl",
     f"https://mlflow.example.com/?token={R}&team=rl"),
    ("https://h/?access_token=a%20b;api_key=k", f"https://h/?access_token={R};api_key={R}"),
    ("https://h/?password=p&secret=s&Key=k", f"https://h/?password={R}&secret={R}&Key={R}"),
    ("https://h/?X-Amz-Signature=a&X-Amz-Credential=c&X-Amz-Security-Token=t&X-Amz-Date=d",
     f"https://h/?X-Amz-Signature={R}&X-Amz-Credential={R}&X-Amz-Security-Token={R}"
     "&X-Amz-Date=d"),
    ("https://acct.blob.core.windows.net/c?sv=2020&sig=abc",
     f"https://acct.blob.core.windows.net/c?sv=2020&sig={R}"),
    ("https://h/cb#id_token=z&state=s", f"https://h/cb#id_token={R}&state=s"),
    ("postgresql://mlflow:pw@db:5432/mlflow", f"postgresql://{R}@db:5432/mlflow"),
    ("http://u:p@[::1/?token=t", f"http://{R}@[::1/?token={R}"),   # unparseable, still redacted
])
def test_redact_uri_hides_each_kind_of_credential(uri, expected):
    assert redact_uri(uri) == expected


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "file:///tmp/mlruns", "databricks",
                                 "https://h/api?experiment=1&design=2", "sqlite:///mlflow.db"])
def test_redact_uri_leaves_uris_without_credentials_as_they_are(uri):
    assert redact_uri(uri) == uri


def test_redact_finds_uris_inside_messages():
    message = ("API request to http://bob:hunter2@h:5000/?token=s3cret/api/2.0/mlflow/runs/"
               "log-batch failed with exception HTTPConnectionPool(host='h', port=5000)")
    out = redact(message)
    assert "hunter2" not in out and "s3cret" not in out
    assert out.endswith("failed with exception HTTPConnectionPool(host='h', port=5000)")


def test_redact_secrets_hides_values_of_secret_looking_keys_at_any_depth():
    kwargs = {"api_key": "k", "auth_token": "t", "Password": "p", "client_secret": "s",
              "credentials": {"user": "u"}, "render_mode": "rgb_array", "max_episode_steps": 5,
              "nested": {"apiKey": "k2", "url": "https://h/?token=t2", "frameskip": 4}}
    assert redact_secrets(kwargs) == {
        "api_key": R, "auth_token": R, "Password": R, "client_secret": R, "credentials": R,
        "render_mode": "rgb_array", "max_episode_steps": 5,
        "nested": {"apiKey": R, "url": f"https://h/?token={R}", "frameskip": 4}}


def test_mlflow_params_carry_no_credentials():
    cfg = from_dict({
        "env": {"id": "CartPole-v1", "kwargs": {"api_key": "k3y", "sutton_barto_reward": True,
                                                "server": {"password": "pw1"}}},
        "logging": {"mlflow": {"tracking_uri":
                               "https://bob:hunter2@mlflow.example.com/?token=s3cret&team=rl"}}})
    params = flat_params(cfg)
    text = repr(params)
    for secret in ("k3y", "pw1", "hunter2", "s3cret"):
        assert secret not in text, (secret, params)
    assert params["env.kwargs.api_key"] == R
    assert params["env.kwargs.sutton_barto_reward"] == "true"
    assert params["env.kwargs.server.password"] == R
    assert params["logging.mlflow.tracking_uri"] == \
        f"https://{R}@mlflow.example.com/?token={R}&team=rl"
