"""``dask-rl plot``: learning curves of one or several runs, for papers and issues.

Two panels: return against environment steps and against wall time; per run the recent
training return (a line) and its greedy evaluations (dots). Reads ``metrics.jsonl`` only, and
passes over what it cannot use there, as the dashboard does; run directory names are shown as
they are (matplotlib would read ``$...$`` in them as math, and fail on what is not).
"""

from __future__ import annotations

from pathlib import Path

from dask_rl.dashboard.state import number, parse_line


def _records(path: Path) -> list[dict]:
    with open(path, "rb") as f:
        return [rec for rec, _ in map(parse_line, f) if isinstance(rec, dict)]


def _values(records: list[dict], key: str) -> list[float]:
    """One field of each record; NaN (a gap in the line) where it is not a number."""
    return [float("nan") if number(r.get(key)) is None else float(r[key]) for r in records]


def curves(run_dir: Path) -> dict:
    """A run's training and evaluation curves, as lists."""
    records = _records(Path(run_dir) / "metrics.jsonl")
    train = [r for r in records if r.get("kind") in ("learner", "generation")
             and number(r.get("charts/return_recent")) is not None]
    evals = [r for r in records if r.get("kind") == "eval"
             and number(r.get("mean_return")) is not None]
    return {"steps": _values(train, "env_steps"), "wall": _values(train, "wall_s"),
            "return": _values(train, "charts/return_recent"),
            "eval_steps": _values(evals, "env_steps"), "eval_wall": _values(evals, "wall_s"),
            "eval_return": _values(evals, "mean_return")}


def _label(name: str) -> str:
    return name.replace("$", r"\$")


def plot_runs(run_dirs: list[str | Path], out: str | Path, *, title: str | None = None) -> Path:
    """Draw the runs' learning curves into ``out`` (PNG, or any format matplotlib knows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, d in enumerate(run_dirs):
        d = Path(d)
        if not (d / "metrics.jsonl").exists():
            raise FileNotFoundError(f"{d}: no metrics.jsonl (is it a run directory?)")
        c = curves(d)
        color = f"C{i}"
        label = _label(d.name)
        by_steps.plot(c["steps"], c["return"], color=color, label=label)
        by_steps.scatter(c["eval_steps"], c["eval_return"], color=color, s=16, marker="o")
        by_time.plot(c["wall"], c["return"], color=color, label=label)
        by_time.scatter(c["eval_wall"], c["eval_return"], color=color, s=16, marker="o")
    by_steps.set_xlabel("environment steps")
    by_time.set_xlabel("wall time (s)")
    for ax in (by_steps, by_time):
        ax.set_ylabel("episode return (line: training, dots: greedy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
