"""Where a run's checkpoints live: one store per run, recorded in its run directory.

A run owns its checkpoint store. By default the store is ``RUN_DIR/checkpoints``; with
``checkpoint.path`` set (a shared disk, ``s3://bucket/ckpts``) it is
``<checkpoint.path>/<run-id>/``, a place no other run writes: its own ``latest`` pointer, its
own pruning. (Stores shared between runs destroyed each other: one run's pruning deleted the
other's checkpoints, ``--resume`` silently continued another run, and two runs writing at once
left every checkpoint unloadable.) The run directory records the place and the run's id in
``RUN_DIR/store.json``, written when the run starts; ``--resume``, ``dask-rl evaluate``,
``export`` and ``dashboard`` follow it. Every checkpoint's metadata carries the ``run_id`` as
well, and a resume refuses a checkpoint of another run.

Run directories written before ``store.json`` existed still resolve: to ``RUN_DIR/checkpoints``
when it exists, else to ``checkpoint.path`` itself (the old, shared layout).

Examples
--------
>>> where = StoreLocation.create("runs/a", checkpoint_path="/shared/ckpts")
>>> where.path                                  # /shared/ckpts/a-3f9c1e2b
>>> StoreLocation.find("runs/a") == where
True
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path

STORE_FILE = "store.json"
DEFAULT_DIR = "checkpoints"


class StoreLocationError(ValueError):
    """``store.json`` is missing where it is needed, or is not one of ours."""


@dataclasses.dataclass(frozen=True)
class StoreLocation:
    """A run's checkpoint store: ``path`` (a directory or URL) and the ``run_id`` that owns it
    (None for run directories older than ``store.json``)."""

    path: str
    run_id: str | None

    @staticmethod
    def new_run_id(run_dir: str | os.PathLike) -> str:
        """The run directory's name and 8 random hex digits: unique, and readable in a listing
        of ``checkpoint.path``."""
        name = Path(os.path.abspath(run_dir)).name or "run"
        return f"{name}-{uuid.uuid4().hex[:8]}"

    @classmethod
    def create(cls, run_dir: str | os.PathLike, *,
               checkpoint_path: str | None = None) -> "StoreLocation":
        """A new run's store, recorded in ``RUN_DIR/store.json`` (written atomically)."""
        run_dir = Path(run_dir)
        run_id = cls.new_run_id(run_dir)
        if checkpoint_path is None:
            where = cls(str(run_dir / DEFAULT_DIR), run_id)
            recorded = DEFAULT_DIR  # relative: the run directory can be moved
        else:
            base = checkpoint_path.rstrip("/")
            if "://" not in base:
                base = os.path.abspath(base)
            where = cls(f"{base}/{run_id}", run_id)
            recorded = where.path
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / (STORE_FILE + ".tmp")
        tmp.write_text(json.dumps({"path": recorded, "run_id": run_id}, indent=2) + "\n")
        os.replace(tmp, run_dir / STORE_FILE)
        return where

    @classmethod
    def find(cls, run_dir: str | os.PathLike, *,
             checkpoint_path: str | None = None) -> "StoreLocation | None":
        """The store ``RUN_DIR/store.json`` names; for older run directories
        ``RUN_DIR/checkpoints`` if it exists, else ``checkpoint_path`` (the shared layout they
        used); None when there is none of these."""
        run_dir = Path(run_dir)
        record = run_dir / STORE_FILE
        if record.exists():
            try:
                data = json.loads(record.read_text())
                path, run_id = data["path"], data["run_id"]
                if not (isinstance(path, str) and isinstance(run_id, str) and path and run_id):
                    raise TypeError("path and run_id must be strings")
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise StoreLocationError(f"{record}: not a dask-rl store record ({e})") from None
            if "://" not in path and not os.path.isabs(path):
                path = str(run_dir / path)
            return cls(path, run_id)
        if (run_dir / DEFAULT_DIR).is_dir():
            return cls(str(run_dir / DEFAULT_DIR), None)
        if checkpoint_path is not None:
            return cls(checkpoint_path.rstrip("/"), None)
        return None
