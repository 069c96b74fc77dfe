"""The ``/rl`` page: live Bokeh plots of training runs.

:func:`build` fills a Bokeh document from a snapshot function (the JSON of
:class:`~dask_rl.dashboard.state.RunViews`) and refreshes it every second: episode return per run
(training and greedy evaluations), env steps/s, learner tasks in flight, the staleness
histogram, the threshold beta_k, applied / buffered / dropped gradients, checkpoint durations
and recoveries, and for population runs a member table (hyperparameters, score, parent). The
same page serves the Dask dashboard (with Dask's template and theme, passed in by the scheduler
preload) and ``dask-rl dashboard RUN_DIR``.
"""

from __future__ import annotations

import html
from typing import Any, Callable

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, DataTable, Div, Select, TableColumn
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

FIGURES = ("return", "steps_per_s", "learners", "staleness_histogram", "threshold",
           "gradients", "checkpoints")
MAX_RUN_LINES = 10


def _fig(name: str, title: str, x: str, y: str, **kwargs: Any):
    f = figure(title=title, height=260, sizing_mode="stretch_width", x_axis_label=x,
               y_axis_label=y, tools="pan,wheel_zoom,box_zoom,reset,save", name=name, **kwargs)
    f.toolbar.logo = None
    return f


def _empty(*cols: str) -> dict:
    return {c: [] for c in cols}


def build(doc: Any, snapshot: Callable[[], dict], *, title: str = "dask-rl",
          template: Any = None, template_variables: dict | None = None, theme: Any = None,
          period_ms: int = 1000) -> None:
    """Populate ``doc`` and keep it current from ``snapshot()``."""
    run_select = Select(title="run", options=[], value="", width=420, name="run_select")
    header = Div(text="<b>waiting for a dask-rl run ...</b>", name="header",
                 sizing_mode="stretch_width")

    returns = _fig("return", "episode return", "env steps", "return")
    run_sources = [ColumnDataSource(_empty("env_steps", "return"), name=f"return_{i}")
                   for i in range(MAX_RUN_LINES)]
    for i, src in enumerate(run_sources):
        returns.line("env_steps", "return", source=src, color=Category10_10[i], line_width=2)
    eval_src = ColumnDataSource(_empty("env_steps", "return"), name="eval")
    returns.scatter("env_steps", "return", source=eval_src, size=8, color="black",
                    legend_label="greedy evaluation (selected run)")
    returns.legend.location = "bottom_right"

    train_src = ColumnDataSource(_empty("wall_s", "env_steps", "steps_per_s", "learners"),
                                 name="train")
    speed = _fig("steps_per_s", "env steps / s", "wall time (s)", "steps/s")
    speed.line("wall_s", "steps_per_s", source=train_src, line_width=2)
    learners = _fig("learners", "learner tasks in flight", "wall time (s)", "learners")
    learners.step("wall_s", "learners", source=train_src, line_width=2, mode="after",
                  legend_label="in flight")
    # TianJi's allocation (adaptive clusters): what the LP gives learners and rollout slots
    alloc_src = ColumnDataSource(_empty("env_steps", "wall_s", "actors", "learners"),
                                 name="allocation")
    learners.step("wall_s", "learners", source=alloc_src, line_width=2, mode="after",
                  color="green", line_dash="dashed", legend_label="allocated learners")
    learners.step("wall_s", "actors", source=alloc_src, line_width=2, mode="after",
                  color="orange", line_dash="dashed", legend_label="allocated rollout slots")
    learners.legend.location = "top_left"

    hist_src = ColumnDataSource(_empty("staleness", "count"), name="histogram")
    hist = _fig("staleness_histogram", "gradient staleness (applied)", "staleness (versions)",
                "gradients")
    hist.vbar(x="staleness", top="count", width=0.8, source=hist_src)

    round_src = ColumnDataSource(_empty("env_steps", "beta", "staleness_mean", "applied",
                                        "buffered", "dropped"), name="rounds")
    threshold = _fig("threshold", "threshold beta_k and mean staleness", "env steps",
                     "versions")
    threshold.line("env_steps", "beta", source=round_src, line_width=2,
                   legend_label="beta_k")
    threshold.line("env_steps", "staleness_mean", source=round_src, line_width=2,
                   color="orange", legend_label="mean staleness")
    gradients = _fig("gradients", "gradients", "env steps", "count")
    for key, color in (("applied", "green"), ("buffered", "orange"), ("dropped", "red")):
        gradients.line("env_steps", key, source=round_src, color=color, line_width=2,
                       legend_label=key)
    gradients.legend.location = "top_left"

    ckpt_src = ColumnDataSource(_empty("env_steps", "seconds"), name="checkpoint_data")
    rec_src = ColumnDataSource(_empty("env_steps", "y"), name="recoveries")
    checkpoints = _fig("checkpoints", "checkpoints (s to write) and recoveries (red)",
                       "env steps", "seconds")
    checkpoints.scatter("env_steps", "seconds", source=ckpt_src, size=7)
    checkpoints.scatter("env_steps", "y", source=rec_src, size=12, color="red", marker="x")

    pop_src = ColumnDataSource(_empty("member", "hparams", "score", "parent", "env_steps"),
                               name="population_data")
    table = DataTable(source=pop_src, height=160, sizing_mode="stretch_width", name="population",
                      columns=[TableColumn(field="member", title="member"),
                               TableColumn(field="hparams", title="hyperparameters"),
                               TableColumn(field="score", title="score"),
                               TableColumn(field="parent", title="parent"),
                               TableColumn(field="env_steps", title="env steps")])

    def update() -> None:
        snap = snapshot()
        runs = snap.get("runs", {})
        names = sorted(runs, key=lambda n: runs[n]["info"].get("started") or 0)
        if names != run_select.options:
            run_select.options = names
        if names and run_select.value not in names:
            run_select.value = names[-1]
        for i, src in enumerate(run_sources):
            if i < len(names):
                pts = [p for p in runs[names[i]]["series"].get("train", [])
                       if p.get("return") is not None]
                src.data = {"env_steps": [p["env_steps"] for p in pts],
                            "return": [p["return"] for p in pts]}
            elif src.data["env_steps"]:
                src.data = _empty("env_steps", "return")
        run = runs.get(run_select.value)
        if run is None:
            return
        header.text = header_html(run, skipped=sum(snap.get("skipped", {}).values()))
        s = run["series"]
        train = s.get("train", [])
        train_src.data = {"wall_s": [p["wall_s"] for p in train],
                          "env_steps": [p["env_steps"] for p in train],
                          "steps_per_s": [p["steps_per_s"] for p in train],
                          "learners": [p["learners"] or 0 for p in train]}
        alloc = s.get("allocation", [])
        alloc_src.data = {"env_steps": [p["env_steps"] for p in alloc],
                          "wall_s": [p["wall_s"] for p in alloc],
                          "actors": [p["actors"] for p in alloc],
                          "learners": [p["learners"] for p in alloc]}
        eval_src.data = {"env_steps": [p["env_steps"] for p in s.get("eval", [])],
                         "return": [p["return"] for p in s.get("eval", [])]}
        h = run["staleness_histogram"]
        hist_src.data = {"staleness": list(range(len(h))), "count": list(h)}
        rounds = s.get("round", [])
        round_src.data = {k: [p.get(k) if k != "beta" else
                              (p.get("beta") if p.get("beta") is not None else float("nan"))
                              for p in rounds]
                          for k in ("env_steps", "beta", "staleness_mean", "applied",
                                    "buffered", "dropped")}
        ckpts = s.get("checkpoint", [])
        ckpt_src.data = {"env_steps": [p["env_steps"] for p in ckpts],
                         "seconds": [p["seconds"] for p in ckpts]}
        recs = s.get("recovery", [])
        rec_src.data = {"env_steps": [p["env_steps"] for p in recs], "y": [0.0] * len(recs)}
        pop = [r for n in names for r in runs[n]["population"]]
        pop_src.data = {"member": [r["member"] for r in pop],
                        "hparams": [_hparams_text(r["hparams"]) for r in pop],
                        "score": [r["score"] for r in pop],
                        "parent": ["-" if r["parent"] is None else r["parent"] for r in pop],
                        "env_steps": [r.get("env_steps") for r in pop]}

    run_select.on_change("value", lambda attr, old, new: update())
    update()
    doc.add_periodic_callback(update, period_ms)
    doc.title = title
    doc.add_root(column(row(run_select, header, sizing_mode="stretch_width"),
                        row(returns, speed, sizing_mode="stretch_width"),
                        row(learners, hist, sizing_mode="stretch_width"),
                        row(threshold, gradients, sizing_mode="stretch_width"),
                        row(checkpoints, table, sizing_mode="stretch_width"),
                        sizing_mode="stretch_width", name="rl_page"))
    if template is not None:
        doc.template = template
        doc.template_variables.update(template_variables or {})
    if theme is not None:
        doc.theme = theme


def header_html(run: dict, *, skipped: int = 0) -> str:
    """The header of the selected run (a :meth:`RunViews.snapshot` entry), as HTML.

    Every value in it is escaped: run, algorithm and environment names are the user's (a
    registered algorithm, an entry point) or come from a file anyone can hand over, and the
    ``Div`` renders its text as markup.
    """
    info, latest = run.get("info") or {}, run.get("latest") or {}
    text = (f"<b>{_esc(run.get('run'))}</b>: {_esc(info.get('algorithm'))} on "
            f"{_esc(info.get('env_id'))} ({_esc(info.get('strategy'))}) &middot; env steps "
            f"{_esc(latest.get('env_steps', 0))} &middot; updates "
            f"{_esc(latest.get('updates'))} &middot; return {_esc(_fmt(latest.get('return')))}"
            f" &middot; greedy {_esc(_fmt(latest.get('eval_return')))} &middot; "
            f"{_esc(_fmt(latest.get('steps_per_s'), 0))} steps/s"
            + _allocation_text(latest.get("allocation")))
    if skipped:
        text += f" &middot; {int(skipped)} records skipped (not understood)"
    return text


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _allocation_text(a: dict | None) -> str:
    if not a:
        return ""
    return (f" &middot; TianJi allocation: rollout slots {_esc(a.get('actors'))}, "
            f"learners {_esc(a.get('learners'))} ({_esc(a.get('bound'))}-bound)")


def _hparams_text(hparams: dict) -> str:
    """``lr=0.0002, clip=0.2``; a value that is not a number (a choice) as it is."""
    return ", ".join(f"{k}={_fmt(v, 3, 'g')}" for k, v in hparams.items())


def _fmt(value: Any, digits: int = 1, style: str = "f") -> str:
    """A number to ``digits``; anything else as its text (not escaped)."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{float(value):.{digits}{style}}"
    return str(value)

