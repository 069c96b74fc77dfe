"""The dashboard's run views and page, fed with records as the runtime writes them."""

import json

from dask_rl.dashboard.state import RunViews


def _records():
    yield {"kind": "run", "event": "start", "run": "r1", "time": 1.0,
           "config": {"algo": {"name": "ppo"}, "env": {"id": "CartPole-v1"},
                      "aggregation": {"strategy": "stellaris"}}}
    for i in range(5):
        yield {"kind": "learner", "run": "r1", "time": 2.0 + i, "env_steps": 512 * (i + 1),
               "wall_s": 1.0 + i, "charts/return_recent": 10.0 * i, "steps_per_s": 900.0,
               "learners/in_flight": 2, "staleness": i % 2, "updates": i + 1}
    yield {"kind": "round", "run": "r1", "time": 8.0, "env_steps": 2560,
           "threshold/beta": 1.5, "staleness/mean": 0.4, "staleness/histogram": [3, 2, 0],
           "gradients/applied": 5, "gradients/buffered": 0, "gradients/dropped": 0,
           "learners/active": 1, "lr_scale": 1.0}
    yield {"kind": "eval", "run": "r1", "time": 9.0, "env_steps": 2560, "wall_s": 7.0,
           "mean_return": 55.0}
    yield {"kind": "checkpoint", "run": "r1", "time": 9.5, "env_steps": 2560, "seconds": 0.2,
           "name": "ckpt-00000001"}
    yield {"kind": "recovery", "run": "r1", "time": 9.7, "env_steps": 2560, "reason": "lost"}
    yield {"kind": "allocation", "run": "r1", "time": 9.8, "env_steps": 2560, "wall_s": 8.8,
           "actors": 1, "learners": 2, "bound": "staleness"}
    yield {"kind": "lineage", "run": "pbt", "time": 10.0, "event": "exploit", "member": 2,
           "parent": 0, "hparams": {"learner.lr": 2e-4}, "env_steps": 1000}


def test_views_collect_series_and_latest_state():
    views = RunViews()
    for rec in _records():
        views.add(rec)
    views.add("not a record")
    snap = json.loads(json.dumps(views.snapshot()))  # JSON-ready
    assert snap["records"] == 12
    r1 = snap["runs"]["r1"]
    assert r1["info"] == {"algorithm": "ppo", "env_id": "CartPole-v1", "strategy": "stellaris",
                          "started": 1.0}
    assert [p["return"] for p in r1["series"]["train"]] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert r1["staleness_histogram"] == [3, 2, 0]
    assert r1["latest"]["threshold/beta"] == 1.5 and r1["latest"]["eval_return"] == 55.0
    assert len(r1["series"]["recovery"]) == 1 and len(r1["series"]["checkpoint"]) == 1
    assert r1["latest"]["allocation"]["actors"] == 1
    assert snap["runs"]["pbt"]["population"] == [
        {"member": 2, "parent": 0, "score": None, "hparams": {"learner.lr": 2e-4},
         "env_steps": 1000}]


def test_the_page_builds_every_figure_and_fills_its_sources():
    from bokeh.document import Document

    from dask_rl.dashboard.page import FIGURES, build

    views = RunViews()
    for rec in _records():
        views.add(rec)
    doc = Document()
    build(doc, views.snapshot)
    for name in FIGURES:
        assert doc.get_model_by_name(name) is not None, name
    assert doc.get_model_by_name("run_select").value == "r1"
    assert len(doc.get_model_by_name("train").data["wall_s"]) == 5
    assert doc.get_model_by_name("histogram").data["count"] == [3, 2, 0]
    assert doc.get_model_by_name("population").source.data["member"] == [2]
    assert "ppo on CartPole-v1" in doc.get_model_by_name("header").text
    assert "TianJi allocation: rollout slots 1, learners 2 (staleness-bound)" in \
        doc.get_model_by_name("header").text
    assert doc.get_model_by_name("allocation").data["learners"] == [2]
