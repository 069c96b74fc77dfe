"""The dashboard's run views and page, fed with records as the runtime writes them."""

import html.parser
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


MARKUP_RUN = '<img src=x onerror="window.__owned=1">'
MARKUP_ALGO = "<script>window.__owned=2</script>"
MARKUP_ENV = 'toyenvs:<b onmouseover="x">Grid</b> & "co"'


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def _parse(markup: str) -> _Tags:
    parser = _Tags()
    parser.feed(markup)
    parser.close()
    return parser


def _markup_records():
    yield {"kind": "run", "event": "start", "run": MARKUP_RUN, "time": 1.0,
           "config": {"algo": {"name": MARKUP_ALGO}, "env": {"entry_point": MARKUP_ENV},
                      "aggregation": {"strategy": "<i>s</i>"}}}
    yield {"kind": "learner", "run": MARKUP_RUN, "time": 2.0, "env_steps": 512, "wall_s": 1.0,
           "charts/return_recent": 9.0, "steps_per_s": 500.0, "learners/in_flight": 1,
           "updates": 1}
    yield {"kind": "allocation", "run": MARKUP_RUN, "time": 3.0, "env_steps": 512,
           "wall_s": 1.5, "actors": 1, "learners": 1, "bound": "<u>rollout</u>"}
    yield {"kind": "lineage", "run": MARKUP_RUN, "time": 4.0, "event": "exploit", "member": 1,
           "parent": 0, "hparams": {"learner.lr": 1e-3, "algo.<q>": "<img src=y>"},
           "env_steps": 512}


def test_names_reach_the_page_as_text_not_markup():
    from bokeh.document import Document

    from dask_rl.dashboard.page import build

    views = RunViews()
    for rec in _markup_records():
        views.add(rec)
    doc = Document()
    build(doc, views.snapshot)
    assert doc.get_model_by_name("run_select").value == MARKUP_RUN
    header = _parse(doc.get_model_by_name("header").text)
    assert header.tags == ["b"], header.tags  # ours only: nothing the names brought
    shown = "".join(header.text)
    for name in (MARKUP_RUN, MARKUP_ALGO, MARKUP_ENV, "<i>s</i>", "<u>rollout</u>-bound"):
        assert name in shown, (name, shown)
    # the member table (Bokeh's cells escape what they show): a choice is shown as given
    assert doc.get_model_by_name("population").source.data["hparams"] == [
        "learner.lr=0.001, algo.<q>=<img src=y>"]


def test_bad_records_are_skipped_and_counted_not_raised():
    from bokeh.document import Document

    from dask_rl.dashboard.page import build

    views = RunViews()
    bad = [
        "not a record", ["a", "list"], {"no": "kind"}, {"kind": 7},
        {"kind": "from_a_newer_version", "run": "r1", "env_steps": 1},
        {"kind": "lineage", "run": "pbt"},  # no member
        {"kind": "lineage", "run": "pbt", "member": "two"},
        {"kind": "learner", "run": ["not", "a", "name"], "env_steps": 1},
    ]
    odd = [  # known kinds with fields of the wrong type: kept, the odd fields dropped
        {"kind": "run", "event": "start", "run": "r1", "time": "yesterday",
         "config": {"algo": "ppo", "env": ["CartPole-v1"], "aggregation": None}},
        {"kind": "learner", "run": "r1", "env_steps": "many", "wall_s": None,
         "charts/return_recent": float("nan"), "steps_per_s": True, "updates": {"n": 1}},
        {"kind": "learner", "run": "r1", "env_steps": 512, "wall_s": 1.0,
         "charts/return_recent": 10.0, "steps_per_s": 800.0, "learners/in_flight": "two"},
        {"kind": "learner", "run": "r1", "env_steps": 10**400, "wall_s": 2.0,
         "charts/return_recent": 10**400, "steps_per_s": -10**300},
        {"kind": "round", "run": "r1", "staleness/histogram": 5, "threshold/beta": "high"},
        {"kind": "round", "run": "r1", "staleness/histogram": [1, "x"]},
        {"kind": "allocation", "run": "r1", "actors": "all", "bound": {"x": 1}},
        {"kind": "lineage", "run": "pbt", "member": 0, "hparams": ["lr"], "score": "best"},
        {"kind": "eval", "run": 3, "mean_return": "high"},
    ]
    for rec in bad:
        assert views.add(rec) is False, rec
    for rec in odd:
        assert views.add(rec) is True, rec
    snap = views.snapshot()
    json.dumps(snap, allow_nan=False)  # the JSON a browser can parse
    assert snap["records"] == len(odd)
    assert snap["skipped"] == {"not a record": 4, "unknown kind": 1, "bad fields": 3}
    assert snap["unknown_kinds"] == {"from_a_newer_version": 1}
    assert set(snap["runs"]) == {"r1", "pbt", "3"}
    r1 = snap["runs"]["r1"]
    assert r1["info"] == {"algorithm": None, "env_id": None, "strategy": None, "started": None}
    assert [p["return"] for p in r1["series"]["train"]] == [None, 10.0, None]
    assert r1["series"]["train"][0]["env_steps"] is None
    assert r1["latest"]["updates"] is None and r1["latest"]["steps_per_s"] == 800.0
    assert r1["staleness_histogram"] == [] and r1["latest"]["threshold/beta"] is None
    assert snap["runs"]["pbt"]["population"] == [
        {"member": 0, "parent": None, "score": None, "hparams": {}, "env_steps": None}]
    doc = Document()  # and the page draws it, the skipped ones counted in its header
    build(doc, views.snapshot)
    assert "8 records skipped" in doc.get_model_by_name("header").text
    # the scheduler gets records as Dask events, through msgpack: arrays arrive as tuples
    assert views.add({"kind": "round", "run": "r1", "staleness/histogram": (4, 1)})
    assert views.snapshot()["runs"]["r1"]["staleness_histogram"] == [4, 1]


def _line(rec) -> bytes:
    return (json.dumps(rec) + "\n").encode()


def test_the_follower_survives_lines_it_cannot_use_and_keeps_following(tmp_path):
    from dask_rl.dashboard.state import FileFollower

    run_dir = tmp_path / "run"
    (run_dir / "members" / "m0").mkdir(parents=True)
    path = run_dir / "metrics.jsonl"
    good = list(_records())
    path.write_bytes(b"".join(_line(r) for r in good[:3])
                     + b"this is not json\n"
                     + b'{"kind": "learner", "run": "r1", "env_steps": \xff\xfe}\n'  # not UTF-8
                     + b"[" * 100_000 + b"\n"  # nests deeper than the parser goes
                     + b"\n"
                     + _line({"kind": "phase_started", "run": "r1", "phase": "evaluation"})
                     + _line({"kind": "lineage", "run": "pbt", "member": None})
                     + _line(good[3])
                     + b'{"kind": "learner", "run": "r1", "env_st')  # still being written
    (run_dir / "members" / "m0" / "metrics.jsonl").write_bytes(_line(good[-1]))
    views = RunViews()
    follower = FileFollower([run_dir], views)
    assert follower.poll() == 5
    snap = views.snapshot()
    assert snap["skipped"] == {"not JSON": 3, "unknown kind": 1, "bad fields": 1}
    assert len(snap["runs"]["r1"]["series"]["train"]) == 3
    assert snap["runs"]["pbt"]["population"][0]["member"] == 2

    # the writer finishes its line and goes on: following goes on with it
    with open(path, "ab") as f:
        f.write(b'eps": 5000, "wall_s": 9.0, "charts/return_recent": 77.0}\n')
        f.write(b"".join(_line(r) for r in good[4:6]))
    assert follower.poll() == 3
    train = views.snapshot()["runs"]["r1"]["series"]["train"]
    assert [p["return"] for p in train] == [0.0, 10.0, 20.0, 77.0, 30.0, 40.0]
    assert follower.poll() == 0  # nothing read twice

    # a crash tore a line; the resumed run appended to it: the record after the tear is kept
    with open(path, "ab") as f:
        f.write(b'{"kind": "learner", "run": "r1", "env_st')
        f.write(_line(good[6]))
    assert follower.poll() == 1
    assert views.snapshot()["skipped"]["not JSON"] == 4

    # the run directory is used again from scratch: the new file is read from its start
    path.unlink()
    path.write_bytes(_line({**good[0], "run": "r2"}))
    assert follower.poll() == 1 and "r2" in views.snapshot()["runs"]
    path.unlink()
    assert follower.poll() == 0  # a file that went away is no error either


def test_plot_takes_odd_run_names_and_bad_lines(tmp_path):
    from PIL import Image

    from dask_rl.dashboard.plot import curves, plot_runs

    run_dir = tmp_path / "seed-$\\foo$-<b>"  # matplotlib would parse $...$ as math
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_bytes(
        b"".join(_line(r) for r in list(_records())[:4])
        + b'{"kind": "learner", "env_steps": \xff}\n'  # not UTF-8
        + _line({"kind": "learner", "charts/return_recent": 5.0})  # no steps, no time
        + _line({"kind": "eval", "env_steps": 100})  # no return
        + _line({"no": "kind"}) + b"[1, 2]\n"
        + _line({"kind": "eval", "env_steps": 2560, "wall_s": 7.0, "mean_return": 55.0})
        + b'{"kind": "eval", "env_st')
    c = curves(run_dir)
    assert c["return"] == [0.0, 10.0, 20.0, 5.0] and c["steps"][:3] == [512, 1024, 1536]
    assert c["steps"][3] != c["steps"][3]  # NaN: a gap, not a crash
    assert c["eval_return"] == [55.0]
    out = plot_runs([run_dir], tmp_path / "curves.png")
    with Image.open(out) as img:
        assert img.size == (1320, 495)


def test_read_metrics_skips_what_is_not_a_record(tmp_path):
    from dask_rl.data.metrics import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"kind": "learner", "n": 1}\n\xff\xfe not utf-8\n[1, 2]\n'
                     + b"[" * 100_000 + b"\n" + b'{"kind": "eval"}\n{"kind": "tor')
    assert [r["kind"] for r in read_metrics(path)] == ["learner", "eval"]
