"""Fiber's framework-overhead test: dask-rl's Pool vs multiprocessing.Pool, same rounds.

Each round is ~1 s of busy work split into tasks of 1 ms, 10 ms or 100 ms, mapped over 2
worker processes (ideal round: 0.5 s). Both pools use their default chunking (about four chunks
per worker). Rounds alternate between the two pools so machine noise hits both.

    python benchmarks/framework_overhead.py --rounds 5

Prints the ratio dask-rl / multiprocessing per task size (target <= 1.1 at 10 ms and above)
and writes ``benchmarks/results/framework_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def busy(seconds: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass
    return seconds


def one_round(pool, task_s: float, work_s: float) -> float:
    n = int(round(work_s / task_s))
    t0 = time.perf_counter()
    out = pool.map(busy, [task_s] * n)
    assert len(out) == n
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work-s", type=float, default=1.0, help="busy seconds per round")
    ap.add_argument("--out", default=str(HERE / "results" / "framework_overhead.json"))
    args = ap.parse_args()
    from dask_rl.pool import Pool

    rows = []
    with multiprocessing.Pool(args.workers) as mp, Pool(args.workers) as dp:
        for pool in (mp, dp):  # warm both up
            pool.map(busy, [0.001] * 8)
        for task_s in (0.001, 0.01, 0.1):
            mp_t, dp_t = [], []
            for _ in range(args.rounds):
                mp_t.append(one_round(mp, task_s, args.work_s))
                dp_t.append(one_round(dp, task_s, args.work_s))
            ideal = args.work_s / args.workers
            row = {"task_ms": task_s * 1000, "tasks_per_round": int(round(args.work_s / task_s)),
                   "ideal_s": ideal, "multiprocessing_s": statistics.median(mp_t),
                   "dask_rl_s": statistics.median(dp_t)}
            row["ratio"] = row["dask_rl_s"] / row["multiprocessing_s"]
            row["dask_rl_vs_ideal"] = row["dask_rl_s"] / ideal
            row["multiprocessing_vs_ideal"] = row["multiprocessing_s"] / ideal
            rows.append(row)
            print(f"{task_s * 1000:5.0f} ms tasks: "
                  f"multiprocessing {row['multiprocessing_s']:.3f} s, "
                  f"dask-rl {row['dask_rl_s']:.3f} s, ratio {row['ratio']:.2f} "
                  f"(ideal {ideal:.2f} s)", flush=True)
    print("\n| task | tasks/round | multiprocessing.Pool | dask-rl Pool | ratio "
          "| dask-rl vs ideal |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task_ms']:.0f} ms | {r['tasks_per_round']} | {r['multiprocessing_s']:.3f} s "
              f"| {r['dask_rl_s']:.3f} s | {r['ratio']:.2f} | {r['dask_rl_vs_ideal']:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"workers": args.workers, "rows": rows}, indent=2))
    from stats import record_commit
    record_commit(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
