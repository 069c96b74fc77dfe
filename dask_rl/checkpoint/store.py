"""Zarr v3 checkpoints, published atomically, that load without executing code.

One checkpoint is one Zarr group ``ckpt-00000042``: every numpy array of the saved state is a
Zarr array at its key path (``actor/params``, ``actor/optimizer/m``, ...) and every scalar, string
and list lives in the group's attributes (``state``), with the resolved pipeline, counters and
``format_version`` beside it. Only numeric and boolean dtypes are written, so nothing is ever
unpickled.

Publication (FACTS.md, "Zarr v3"):

* a local directory: write ``ckpt-N.tmp/``, consolidate its metadata, ``rename`` it to
  ``ckpt-N/``, then replace the ``latest`` pointer file with ``os.replace``;
* an fsspec URL (``memory://``, ``s3://``): object stores cannot rename, so write ``ckpt-N/``
  under its final prefix, consolidate, and overwrite the small ``latest`` object last.

Readers only follow ``latest``; a crash at any point leaves it naming the previous complete
checkpoint. The last ``keep`` checkpoints are kept.

Bulk data that lives on workers (an off-policy replay buffer) is written by the workers
themselves between :meth:`CheckpointStore.begin` and :meth:`CheckpointStore.commit`, under
``replay/<i>`` of the pending group (:func:`write_trajectory`), and read back by workers
(:func:`read_trajectory`); it never passes through the driver.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import warnings
import zlib
from typing import Any

import numpy as np

from dask_rl.data import Trajectory

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{8})$")
_ALLOWED_KINDS = set("biuf")  # bool, int, unsigned, float: nothing that needs pickle


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged or does not fit this run; the message names it."""


def _zarr():
    import zarr

    warnings.filterwarnings("ignore", message="Consolidated metadata", module="zarr")
    return zarr


class CheckpointStore:
    """Checkpoints of one run under ``root`` (a directory or an fsspec URL).

    Examples
    --------
    >>> store = CheckpointStore("runs/cartpole/checkpoints", keep=3)
    >>> name = store.save({"actor": {"params": params, "version": 7}}, meta={"env_steps": 1024})
    >>> state, meta = store.load()            # follows ``latest``
    """

    def __init__(self, root: str | os.PathLike, *, keep: int = 3):
        root = os.fspath(root)
        self.root = root.rstrip("/")
        self.keep = keep
        self.is_local = "://" not in root or root.startswith("file://")
        if self.is_local:
            self.root = root.removeprefix("file://")
            self.fs = None
        else:
            import fsspec

            self.fs, self._base = fsspec.core.url_to_fs(self.root)

    # ---- listing ------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Published checkpoint names, oldest first."""
        if self.is_local:
            entries = os.listdir(self.root) if os.path.isdir(self.root) else []
        else:
            try:
                entries = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self._base,
                                                                                   detail=False)]
            except FileNotFoundError:
                entries = []
        return sorted(e for e in entries if _NAME.match(e))

    def latest(self) -> str | None:
        """The name ``latest`` points to, or None when nothing was published yet."""
        text = self._read_text("latest")
        if text is None:
            return None
        name = text.strip()
        if not _NAME.match(name):
            raise CheckpointError(f"{self._path('latest')}: not a checkpoint pointer: {name!r}")
        return name

    # ---- writing ------------------------------------------------------------------------------
    def save(self, state: dict[str, Any], *, meta: dict[str, Any] | None = None) -> str:
        """Write ``state`` (nested dicts of arrays and JSON scalars) as the next checkpoint."""
        return self.commit(self.begin(), state, meta=meta)

    def begin(self) -> "Pending":
        """Start the next checkpoint; workers may write replay data under ``pending.url``."""
        zarr = _zarr()
        if self.is_local:
            os.makedirs(self.root, exist_ok=True)
        existing = self.names()
        seq = int(_NAME.match(existing[-1]).group(1)) + 1 if existing else 0
        name = f"ckpt-{seq:08d}"
        url = self._path(name + ".tmp" if self.is_local else name)
        group = zarr.open_group(self._store(url), mode="w")
        group.require_group("replay")
        return Pending(name, url)

    def commit(self, pending: "Pending", state: dict[str, Any], *,
               meta: dict[str, Any] | None = None, replay: int = 0,
               replay_checksums: list[dict[str, int]] | None = None) -> str:
        """Write the driver's part, consolidate, publish; ``replay`` trajectories were written
        by workers under ``replay/0 .. replay/<replay - 1>``, with the checksums their
        :func:`write_trajectory` returned."""
        if replay and (replay_checksums is None or len(replay_checksums) != replay):
            raise CheckpointError(f"{pending.url}: {replay} replay trajectories written, "
                                  f"checksums for {len(replay_checksums or [])}")
        zarr = _zarr()
        arrays: dict[str, np.ndarray] = {}
        scalars = _split(state, "", arrays)
        attrs = {"format_version": FORMAT_VERSION, "state": scalars, "meta": meta or {},
                 "arrays": sorted(arrays), "replay": replay,
                 "replay_checksums": list(replay_checksums or []),
                 "checksums": {k: _checksum(v) for k, v in arrays.items()}}
        store = self._store(pending.url)
        group = zarr.open_group(store, mode="a")
        for key, value in arrays.items():
            chunks = (max(1, (1 << 20) // max(value.itemsize, 1)),) if value.ndim == 1 else None
            group.create_array(key, data=value, chunks=chunks or "auto")
        group.attrs.update(attrs)
        zarr.consolidate_metadata(store)
        if self.is_local:
            os.rename(pending.url, self._path(pending.name))
        self._write_pointer(pending.name)
        self._prune(pending.name)
        return pending.name

    def url(self, name: str) -> str:
        """Where checkpoint ``name`` lives (for workers reading its replay data)."""
        return self._path(name)

    def _write_pointer(self, name: str) -> None:
        if self.is_local:
            tmp = self._path("latest.tmp")
            with open(tmp, "w") as f:
                f.write(name + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path("latest"))
        else:
            with self.fs.open(f"{self._base}/latest", "w") as f:
                f.write(name + "\n")

    def _prune(self, newest: str) -> None:
        names = self.names()
        for old in names[:-self.keep]:
            if old != newest:
                self._remove(old)
        if self.is_local:  # leftovers of crashed writes
            for entry in os.listdir(self.root):
                if entry.endswith(".tmp") and entry.startswith("ckpt-"):
                    self._remove(entry)

    def _remove(self, name: str) -> None:
        if self.is_local:
            import shutil

            shutil.rmtree(self._path(name), ignore_errors=True)
        else:
            self.fs.rm(f"{self._base}/{name}", recursive=True)

    # ---- reading ------------------------------------------------------------------------------
    def load(self, name: str | None = None, *,
             expect: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(state, meta)`` of checkpoint ``name`` (default: ``latest``), validated.

        ``expect`` maps meta keys to required values (e.g. ``{"algorithm": "ppo"}``) and
        ``"num_params"`` to the parameter count of the model that will receive it.
        """
        zarr = _zarr()
        name = name or self.latest()
        if name is None:
            raise CheckpointError(f"{self.root}: no checkpoint to resume from")
        path = self._path(name)
        try:
            store = path if self.is_local else self._fsspec_store(name)
            group = zarr.open_consolidated(store, mode="r")
            attrs = dict(group.attrs)
        except Exception as e:  # zarr raises many kinds for damaged metadata
            raise CheckpointError(f"{path}: cannot open checkpoint: {e}") from None
        version = attrs.get("format_version")
        if not isinstance(version, int):
            raise CheckpointError(f"{path}: not a dask-rl checkpoint (no format_version)")
        if version > FORMAT_VERSION:
            raise CheckpointError(f"{path}: format version {version} is newer than this dask-rl "
                                  f"reads ({FORMAT_VERSION}); upgrade dask-rl")
        arrays: dict[str, np.ndarray] = {}
        checksums = attrs.get("checksums", {})
        for key in attrs.get("arrays", []):
            try:
                arr = group[key]
                if arr.dtype.kind not in _ALLOWED_KINDS:
                    raise CheckpointError(f"{path}: array {key} has dtype {arr.dtype}")
                arrays[key] = arr[...]
            except CheckpointError:
                raise
            except Exception as e:
                raise CheckpointError(f"{path}: array {key} is damaged or missing: {e}") from None
            # Missing chunk files read back as fill values: only a checksum tells.
            if checksums.get(key) != _checksum(arrays[key]):
                raise CheckpointError(f"{path}: array {key} is damaged or missing "
                                      f"(checksum mismatch)")
        state = _join(attrs["state"], arrays, "")
        meta = dict(attrs.get("meta", {}))
        meta["replay"] = int(attrs.get("replay", 0))
        if meta["replay"]:  # None: written before replay checksums were kept
            meta["replay_checksums"] = attrs.get("replay_checksums")
        _check_expectations(path, meta, state, expect or {})
        return state, meta

    def load_latest_good(self, *, expect: dict[str, Any] | None = None
                         ) -> tuple[dict[str, Any], dict[str, Any], str]:
        """The newest checkpoint that loads, falling back past damaged ones (logged).

        A checkpoint that loads but does not fit ``expect`` is an error, not a fallback: an
        older checkpoint of the same run would not fit either.
        """
        names = self.names()
        if not names:
            raise CheckpointError(f"{self.root}: no checkpoint to resume from")
        try:
            latest = self.latest()
        except CheckpointError as e:
            logger.warning("%s; trying the newest checkpoint directory instead", e)
            latest = None
        order = [latest] if latest in names else []
        order += [n for n in reversed(names) if n != latest]
        problems = []
        for name in order:
            try:
                state, meta = self.load(name)
            except CheckpointError as e:
                logger.warning("skipping a damaged checkpoint: %s", e)
                problems.append(str(e))
                continue
            _check_expectations(self._path(name), meta, state, expect or {})
            return state, meta, name
        raise CheckpointError(f"{self.root}: no checkpoint could be loaded: "
                              + "; ".join(problems))

    # ---- paths --------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _fsspec_store(self, name: str):
        return self._store(self._path(name))

    def _store(self, url: str):
        if self.is_local:
            return url
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(url)

    def _read_text(self, name: str) -> str | None:
        try:
            if self.is_local:
                with open(self._path(name)) as f:
                    return f.read()
            with self.fs.open(f"{self._base}/{name}", "r") as f:
                return f.read()
        except FileNotFoundError:
            return None


@dataclasses.dataclass(frozen=True)
class Pending:
    """A checkpoint being written: its final name and where its data goes meanwhile."""

    name: str
    url: str


def _open_store(url: str):
    if "://" in url and not url.startswith("file://"):
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(url)
    return url.removeprefix("file://")


def write_trajectory(url: str, index: int, traj: Trajectory) -> dict[str, int]:
    """Write one trajectory under ``replay/<index>`` of a pending checkpoint (on a worker).

    Returns the checksum of every array written (its path under ``replay/<index>``): the
    driver commits the checkpoint only with every worker's checksums in hand, and
    :func:`read_trajectory` checks them, as :meth:`CheckpointStore.load` does the parameters'.
    """
    zarr = _zarr()
    group = zarr.open_group(_open_store(url), mode="a").require_group(f"replay/{index}")
    scalars: dict[str, Any] = {}
    checksums: dict[str, int] = {}

    def put(key: str, value: np.ndarray) -> None:
        if value.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"replay/{index}/{key} has dtype {value.dtype}")
        group.create_array(key, data=value, overwrite=True)
        checksums[key] = _checksum(value)

    for f in dataclasses.fields(traj):
        value = getattr(traj, f.name)
        if isinstance(value, np.ndarray):
            put(f.name, value)
        elif isinstance(value, dict):
            for k, v in value.items():
                put(f"{f.name}/{k}", np.asarray(v))
            scalars[f.name] = sorted(value)
        else:
            scalars[f.name] = value
    group.attrs.update({"trajectory": scalars})
    return checksums


# what a trajectory's attributes may hold, field by field (anything else is refused)
_SCALAR_TYPES: dict[str, tuple[type, ...]] = {"policy_version": (int,), "slot": (int,),
                                              "collect_s": (int, float),
                                              "pull_s": (int, float),
                                              "slot_wait_s": (int, float)}


def read_trajectory(url: str, index: int, checksums: dict[str, int] | None = None
                    ) -> Trajectory:
    """Read back a trajectory written by :func:`write_trajectory` (on a worker): only numeric
    arrays and the scalar types a :class:`Trajectory` has, each array checked against
    ``checksums`` when the checkpoint recorded them."""
    zarr = _zarr()
    where = f"{url}: replay/{index}"

    def array(key: str) -> np.ndarray:
        arr = group[key]
        if arr.dtype.kind not in _ALLOWED_KINDS:
            raise CheckpointError(f"{where}/{key} has dtype {arr.dtype}")
        value = arr[...]
        if checksums is not None and checksums.get(key) != _checksum(value):
            raise CheckpointError(f"{where}/{key} is damaged or missing (checksum mismatch)")
        return value

    try:
        group = zarr.open_group(_open_store(url), mode="r")[f"replay/{index}"]
        scalars = dict(group.attrs["trajectory"])
        if "actor_id" in scalars:  # written before the rollout slot got its name (format 1)
            scalars["slot"] = scalars.pop("actor_id")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(Trajectory):
            value = scalars.get(f.name)
            if f.name in scalars and isinstance(value, list):  # a dict of arrays
                if not all(isinstance(k, str) and "/" not in k for k in value):
                    raise CheckpointError(f"{where}/{f.name}: bad keys {value!r}")
                kwargs[f.name] = {k: array(f"{f.name}/{k}") for k in value}
            elif f.name in scalars:
                allowed = _SCALAR_TYPES.get(f.name, (type(None),))
                if isinstance(value, bool) or not isinstance(value, allowed):
                    raise CheckpointError(f"{where}/{f.name}: unexpected value {value!r}")
                kwargs[f.name] = value
            elif f.name in _SCALAR_TYPES:   # a scalar newer than the checkpoint: its default
                kwargs[f.name] = f.default
            else:
                kwargs[f.name] = array(f.name)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{where} is damaged or missing: {e}") from None
    return Trajectory(**kwargs)


def _checksum(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1)) ^ a.size


def _split(state: Any, prefix: str, arrays: dict[str, np.ndarray]) -> Any:
    """Move arrays out of a nested structure into ``arrays``; return the JSON remainder."""
    if isinstance(state, dict):
        out = {}
        for key, value in state.items():
            if not isinstance(key, str) or "/" in key or key.startswith("__"):
                raise TypeError(f"checkpoint keys must be plain strings, got {key!r}")
            out[key] = _split(value, f"{prefix}{key}/", arrays)
        return out
    if isinstance(state, np.ndarray):
        if state.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"checkpoint array {prefix[:-1]} has dtype {state.dtype}")
        key = prefix[:-1]
        arrays[key] = state
        return {"__array__": key}
    if isinstance(state, (np.integer, np.floating, np.bool_)):
        return state.item()
    if isinstance(state, (list, tuple)):
        return [_split(v, f"{prefix}{i}/", arrays) for i, v in enumerate(state)]
    if state is None or isinstance(state, (bool, int, float, str)):
        return state
    raise TypeError(f"cannot checkpoint {type(state).__name__} at {prefix[:-1] or 'root'}")


def _join(node: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    if isinstance(node, dict):
        if set(node) == {"__array__"}:
            key = node["__array__"]
            if key not in arrays:
                raise CheckpointError(f"{where}: array {key} is listed but missing")
            return arrays[key]
        return {k: _join(v, arrays, where) for k, v in node.items()}
    if isinstance(node, list):
        return [_join(v, arrays, where) for v in node]
    return node


def _check_expectations(path: str, meta: dict, state: dict, expect: dict[str, Any]) -> None:
    for key, want in expect.items():
        if key == "num_params":
            params = state.get("actor", {}).get("params")
            have = None if params is None else int(np.asarray(params).size)
            if have != want:
                raise CheckpointError(f"{path}: holds {have} parameters, the model of this "
                                      f"pipeline has {want}")
            continue
        have = meta.get(key)
        if have != want:
            raise CheckpointError(f"{path}: was written for {key}={have!r}, this run has "
                                  f"{key}={want!r}")

