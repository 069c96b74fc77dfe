"""Checkpoint cost: Zarr write and read times for 1M- and 10M-parameter trainers.

A checkpoint holds the parameters, the learners' Adam moments (2x), the strategy state and
counters — what a running trainer writes. Writes and reads are timed (median of ``--repeats``)
on a local directory, and the write time is set against the default interval
(``checkpoint.every_s`` = 60 s): the share of wall time spent checkpointing (target < 2%).

    python benchmarks/checkpoint_cost.py

Writes ``benchmarks/results/checkpoint_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def state(n: int) -> dict:
    rng = np.random.default_rng(0)
    return {"actor": {"params": rng.normal(size=n).astype(np.float32), "version": 1000,
                      "learner_opt": {"m": rng.normal(size=n).astype(np.float32),
                                      "v": rng.random(n).astype(np.float32), "t": 4000},
                      "optimizer": {"t": 1000}, "moments": None, "target": None,
                      "strategy": {"name": "stellaris", "version": 1000, "round": 200,
                                   "stats": {"arrived": 1000}, "histogram":
                                   np.zeros(32, np.int64)}},
            "driver": {"env_steps": 10**7, "recent_returns": [1.0] * 20}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--interval-s", type=float, default=60.0)
    ap.add_argument("--out", default=str(HERE / "results" / "checkpoint_cost.json"))
    args = ap.parse_args()
    from dask_rl.checkpoint import CheckpointStore

    rows = []
    for n in (1_000_000, 10_000_000):
        s = state(n)
        with tempfile.TemporaryDirectory() as tmp:
            store = CheckpointStore(Path(tmp) / "ck", keep=2)
            writes, reads = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                store.save(s, meta={"algorithm": "ppo"})
                writes.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                loaded, _ = store.load()
                reads.append(time.perf_counter() - t0)
            assert np.array_equal(loaded["actor"]["params"], s["actor"]["params"])
            size = sum(p.stat().st_size for p in (Path(tmp) / "ck" / store.latest()).rglob("*")
                       if p.is_file())
        w, r = statistics.median(writes), statistics.median(reads)
        rows.append({"params": n, "bytes_raw": 3 * 4 * n, "bytes_on_disk": size,
                     "write_s": w, "read_s": r, "share_of_wall": w / (args.interval_s + w)})
        print(f"{n:>10,} params: write {w:.3f} s, read {r:.3f} s, {size / 2**20:.1f} MiB on disk,"
              f" {100 * rows[-1]['share_of_wall']:.2f}% of wall at every {args.interval_s:.0f} s"
              " (target < 2%)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"interval_s": args.interval_s, "rows": rows},
                                         indent=2))
    from stats import record_commit
    record_commit(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
