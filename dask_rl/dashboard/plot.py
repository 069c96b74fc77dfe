"""``dask-rl plot``: learning curves of one or several runs, for papers and issues.

Two panels: return against environment steps and against wall time; per run the recent
training return (a line) and its greedy evaluations (dots). Reads ``metrics.jsonl`` only.
"""

from __future__ import annotations

from pathlib import Path

from dask_rl.data.metrics import read_metrics


def curves(run_dir: Path) -> dict:
    """A run's training and evaluation curves, as lists."""
    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    train = [r for r in records if r["kind"] in ("learner", "generation")
             and r.get("charts/return_recent") is not None]
    evals = [r for r in records if r["kind"] == "eval"]
    return {"steps": [r["env_steps"] for r in train], "wall": [r["wall_s"] for r in train],
            "return": [r["charts/return_recent"] for r in train],
            "eval_steps": [r["env_steps"] for r in evals],
            "eval_wall": [r["wall_s"] for r in evals],
            "eval_return": [r["mean_return"] for r in evals]}


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
        label = d.name
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
