"""The /rl page on the Dask dashboard, its JSON, a real browser, the standalone server, plots."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import dask_rl

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read()


@pytest.fixture
def dashboard_cluster():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0",
                      scheduler_kwargs={"preload": ["dask_rl.runtime.dashboard"]},
                      silence_logs=50) as cluster, Client(cluster) as client:
        yield client


@pytest.fixture
def embedded_dashboard():
    """dask-rl's own embedded cluster: its scheduler starts without Bokeh, and the run attaches
    the dashboard once its first tasks are out."""
    from dask_rl.config import ClusterConfig
    from dask_rl.runtime.cluster import connect

    with connect(ClusterConfig(dashboard_address="127.0.0.1:0")) as client:
        yield client


def _train_in_background(client, run_dir, **overrides):
    result = {}

    def target():
        result["summary"] = dask_rl.train(
            {"stop": {"env_steps": 120_000, "solve_on_target": False, "eval_every_updates": 20},
             "checkpoint": {"every_s": 2}, **overrides},
            client=client, run_dir=run_dir).summary

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def _stop(thread: threading.Thread, run_dir) -> None:
    """The page was seen: the run's far budget is not needed, it stops with its summary."""
    dask_rl.api.interrupt_running(run_dir=run_dir)
    thread.join(timeout=120)
    assert not thread.is_alive(), "the interrupted run did not end"


def _records(base: str) -> int:
    return json.loads(_get(base + "/rl/metrics.json")[1])["records"]


@pytest.mark.parametrize("cluster", ["dashboard_cluster", "embedded_dashboard"])
def test_rl_page_and_json_advance_during_a_run(cluster, request, tmp_path):
    client = request.getfixturevalue(cluster)
    base = client.dashboard_link.rsplit("/", 1)[0]
    thread, result = _train_in_background(client, tmp_path / "run")
    deadline = time.time() + 120
    while _records(base) < 10:
        assert time.time() < deadline, "no records reached the scheduler"
        time.sleep(0.5)
    first = _records(base)
    time.sleep(3)
    status, body = _get(base + "/rl/metrics.json")
    snap = json.loads(body)
    assert status == 200 and snap["records"] > first
    [run] = snap["runs"].values()
    assert run["info"]["algorithm"] == "ppo" and run["series"]["train"]
    status, html = _get(base + "/rl")
    assert status == 200 and b"bokeh" in html.lower()
    status, status_page = _get(base + "/status")
    assert b'href="rl"' in status_page  # the page sits in Dask's navigation
    _stop(thread, tmp_path / "run")
    assert result["summary"]["stop_reason"] == "interrupted"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_a_browser_renders_the_plots(dashboard_cluster, tmp_path):
    from browser import Chromium

    base = dashboard_cluster.dashboard_link.rsplit("/", 1)[0]
    thread, _ = _train_in_background(dashboard_cluster, tmp_path / "run")
    deadline = time.time() + 120
    while _records(base) < 40:
        assert time.time() < deadline
        time.sleep(0.5)
    browser = Chromium()
    try:
        browser.goto(base + "/rl")
        check = """(() => {
            const d = (window.Bokeh && Bokeh.documents) ? Bokeh.documents[0] : null;
            if (!d) return null;
            const n = (name) => d.get_model_by_name(name);
            const len = (name, col) => n(name) ? n(name).data[col].length : -1;
            return {figures: ["return", "steps_per_s", "learners", "staleness_histogram",
                              "threshold", "gradients", "checkpoints"].filter(f => n(f)),
                    train: len("train", "wall_s"), returns: len("return_0", "return"),
                    histogram: len("histogram", "count"), header: n("header").text};
        })()"""
        state = None
        for _ in range(60):
            state = browser.evaluate(check)
            if state and state["train"] > 0 and state["returns"] > 0:
                break
            time.sleep(1)
        assert state is not None, "Bokeh never started in the page"
        assert len(state["figures"]) == 7, state
        assert state["train"] > 0 and state["returns"] > 0 and state["histogram"] > 0, state
        assert "ppo on CartPole-v1" in state["header"]
        time.sleep(2)  # let the canvas paint
        shot = tmp_path / "dashboard.png"
        browser.screenshot(shot)
        assert shot.stat().st_size > 30_000
        if os.environ.get("DASK_RL_UPDATE_DOCS"):
            shutil.copy(shot, ROOT / "docs" / "dashboard.png")
    finally:
        browser.close()
        _stop(thread, tmp_path / "run")


def _short_run(client, run_dir, seed):
    return dask_rl.train({"seed": seed, "stop": {"env_steps": 30_000, "eval_every_updates": 10,
                                                 "solve_on_target": False},
                          "checkpoint": {"every_s": 0}}, client=client, run_dir=run_dir)


def test_plot_and_standalone_dashboard_from_two_runs(local_client, tmp_path):
    a, b = tmp_path / "run-a", tmp_path / "run-b"
    _short_run(local_client, a, 1)
    _short_run(local_client, b, 2)
    out = tmp_path / "curves.png"
    proc = subprocess.run([sys.executable, "-m", "dask_rl.cli", "plot", str(a), str(b),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from PIL import Image

    with Image.open(out) as img:
        assert img.size == (1320, 495)
        colors = img.convert("RGB").getcolors(maxcolors=100_000)
    assert out.stat().st_size > 20_000 and len(colors) > 50  # two panels of curves, not blank
    bad = subprocess.run([sys.executable, "-m", "dask_rl.cli", "plot", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no metrics.jsonl" in bad.stderr

    from browser import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "dask_rl.cli", "dashboard", str(a), str(b),
                               "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/rl/metrics.json")
                break
            except OSError:
                assert time.time() < deadline
                time.sleep(0.3)
        snap = json.loads(body)
        assert status == 200 and len(snap["runs"]) == 2
        assert _get(f"http://127.0.0.1:{port}/rl")[0] == 200
    finally:
        server.terminate()
        server.wait()


MARKUP_RUN = '<img src=x onerror="window.__owned = 1">'
MARKUP_ALGO = '<script>window.__owned = 2</script><svg onload="window.__owned = 3">'


def _markup_record(kind: str, **fields) -> bytes:
    return (json.dumps({"kind": kind, "run": MARKUP_RUN, **fields}) + "\n").encode()


def _learner(i: int) -> bytes:
    return _markup_record("learner", time=2.0 + i, env_steps=512 * (i + 1), wall_s=1.0 + i,
                          updates=i + 1, steps_per_s=800.0, **{"charts/return_recent": 9.0 * i})


def _wait_json(url: str, ready, timeout: float = 60):
    deadline = time.time() + timeout
    while True:
        try:
            snap = json.loads(_get(url)[1])
            if ready(snap):
                return snap
        except OSError:
            pass
        assert time.time() < deadline, f"{url} did not get there in {timeout} s"
        time.sleep(0.3)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_names_with_markup_show_as_text_and_bad_lines_do_not_stop_the_page(tmp_path):
    """A run dir handed over by someone else: its names are text, its junk is skipped."""
    from browser import DEEP_ELEMENTS, Chromium, free_port

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(
        _markup_record("run", event="start", time=1.0,
                       config={"algo": {"name": MARKUP_ALGO},
                               "env": {"entry_point": "toy:<i>Grid</i>"}})
        + _learner(0)
        + b"not json at all\n"
        + _markup_record("a_kind_from_the_future", phase="evaluation")
        + _markup_record("lineage", member="first")
        + _learner(1))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "dask_rl.cli", "dashboard", str(run_dir),
                               "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    browser = None
    try:
        url = f"http://127.0.0.1:{port}/rl/metrics.json"
        snap = _wait_json(url, lambda s: s["records"] == 3)
        assert snap["skipped"] == {"not JSON": 1, "unknown kind": 1, "bad fields": 1}
        browser = Chromium()
        browser.goto(f"http://127.0.0.1:{port}/rl")
        page = f"""(() => {{
            const all = {DEEP_ELEMENTS};
            const d = (window.Bokeh && Bokeh.documents) ? Bokeh.documents[0] : null;
            const header = all.find(el => el.tagName === "B" && el.parentElement
                                    && el.parentElement.textContent.includes("steps/s"));
            return {{owned: window.__owned === undefined ? null : window.__owned,
                     injected: all.filter(el => el.tagName === "IMG"
                         || el.hasAttribute("onerror") || el.hasAttribute("onload")
                         || (el.tagName === "SCRIPT" && el.textContent.includes("__owned"))
                         || (el.tagName === "I" && el.textContent === "Grid"))
                         .map(el => el.tagName),
                     header: header ? header.parentElement.textContent : null,
                     options: all.filter(el => el.tagName === "OPTION")
                                 .map(el => el.textContent),
                     train: d && d.get_model_by_name("train")
                            ? d.get_model_by_name("train").data["wall_s"].length : -1}};
        }})()"""
        state = browser.wait_for(f"(() => {{ const s = {page}; "
                                 f"return s.header && s.train === 2 ? s : null; }})()")
        assert state, browser.evaluate(page)
        time.sleep(2)  # an injected <img> would have failed to load and run its onerror by now
        state = browser.evaluate(page)
        assert state["owned"] is None, state
        assert state["injected"] == [], state
        assert MARKUP_RUN in state["header"] and MARKUP_ALGO in state["header"], state
        assert "toy:<i>Grid</i>" in state["header"], state
        assert "3 records skipped" in state["header"], state
        assert state["options"] == [MARKUP_RUN], state

        # the run goes on writing, a torn line among its records: the page follows
        with open(metrics, "ab") as f:
            f.write(_learner(2) + b'{"kind": "learner", "ru' + _learner(3) + _learner(4))
        state = browser.wait_for(f"(() => {{ const s = {page}; "
                                 f"return s.train === 5 ? s : null; }})()")
        assert state, browser.evaluate(page)
        assert state["owned"] is None and state["injected"] == [], state
        snap = json.loads(_get(url)[1])
        assert snap["records"] == 6 and snap["skipped"]["not JSON"] == 2
    finally:
        if browser is not None:
            browser.close()
        server.terminate()
        server.wait()
