"""Uncertainty for the benchmarks: bootstrap and t confidence intervals, Welch's t-test.

Plain numpy (and scipy's t distribution), so that every results JSON states how sure its
figures are. Resampling uses a fixed generator: a rerun on the same rows gives the same
interval.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

RESAMPLES = 10_000


def bootstrap_ci(values: Sequence[float], stat: Callable[[np.ndarray], float] = np.mean, *,
                 level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over ``values`` (resampled with replacement)."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    draws = np.array([stat(x[rng.integers(0, x.size, x.size)]) for _ in range(RESAMPLES)])
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def bootstrap_ratio_ci(a: Sequence[float], b: Sequence[float],
                       stat: Callable[[np.ndarray], float] = np.median, *,
                       level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """``stat(a) / stat(b)`` and its percentile bootstrap interval, each side resampled on its
    own (the seeds of the two sides are independent runs)."""
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    rng = np.random.default_rng(seed)
    draws = np.array([stat(x[rng.integers(0, x.size, x.size)])
                      / stat(y[rng.integers(0, y.size, y.size)]) for _ in range(RESAMPLES)])
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(stat(x) / stat(y)), float(lo), float(hi)


def welch(a: Sequence[float], b: Sequence[float], *, level: float = 0.95) -> dict[str, float]:
    """Welch's unequal-variance t-test of ``mean(a) - mean(b)``: the difference, its
    Welch-Satterthwaite t interval, t, degrees of freedom and the two-sided p."""
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    diff, se = float(x.mean() - y.mean()), float(np.sqrt(va + vb))
    if se == 0.0:  # no spread on either side (e.g. every run scored the cap of 500)
        return {"diff": diff, "ci95": [diff, diff], "t": 0.0 if diff == 0 else math.copysign(
            math.inf, diff), "df": float(x.size + y.size - 2), "p": 1.0 if diff == 0 else 0.0}
    t = diff / se
    df = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    p = 2 * scipy_stats.t.sf(abs(t), df)
    half = scipy_stats.t.ppf((1 + level) / 2, df) * se
    return {"diff": diff, "ci95": [float(diff - half), float(diff + half)], "t": float(t),
            "df": float(df),
            "p": float(p)}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (same order as given): each
    adjusted p can be compared with the family's level directly."""
    p = np.asarray(pvalues, np.float64)
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (p.size - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def bootstrap_diff_of_diffs(a1: Sequence[float], a2: Sequence[float], b1: Sequence[float],
                            b2: Sequence[float], *, level: float = 0.95,
                            seed: int = 0) -> tuple[float, float, float]:
    """``(mean(a1) - mean(a2)) - (mean(b1) - mean(b2))`` and its percentile bootstrap
    interval, each of the four independent groups resampled on its own: how much more one
    side's mean drops between two conditions than the other's."""
    groups = [np.asarray(g, np.float64) for g in (a1, a2, b1, b2)]
    rng = np.random.default_rng(seed)

    def stat(gs):
        return (gs[0].mean() - gs[1].mean()) - (gs[2].mean() - gs[3].mean())

    draws = np.array([stat([g[rng.integers(0, g.size, g.size)] for g in groups])
                      for _ in range(RESAMPLES)])
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(stat(groups)), float(lo), float(hi)


def mean_ci(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float, float]:
    """The mean and its Student-t interval (for a few repeats of one measurement, where a
    bootstrap over 3 values would be too narrow); the interval is nan with one value."""
    x = np.asarray(values, np.float64)
    m = float(x.mean())
    if x.size < 2:
        return m, float("nan"), float("nan")
    half = scipy_stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return m, float(m - half), float(m + half)


def json_safe(x):
    """Infinite or undefined figures (an unsolved run's time) as null: strict JSON."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def record_commit(path) -> None:
    """Write the commit this code is at (and whether the tree had changes) into a results JSON
    just written: every results file says what it ran on."""
    import json
    import subprocess
    from pathlib import Path

    path = Path(path)
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True,
                              text=True).stdout.strip()

    data = json.loads(path.read_text())
    if isinstance(data, dict):
        data = {"commit": git("rev-parse", "HEAD"),
                # the results a benchmark writes are not the code it ran
                "tree_changed": bool(git("status", "--porcelain", "--untracked-files=no",
                                         "--", ".", ":!benchmarks/results")),
                **{k: v for k, v in data.items() if k != "commit"}}
        path.write_text(json.dumps(data, indent=1, default=str))
