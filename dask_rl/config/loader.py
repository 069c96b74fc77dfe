"""Reading pipelines: YAML and ``key.path=value`` overrides validated into the schema.

The loader rejects unknown keys, wrong types and out-of-range values with a
:class:`~dask_rl.config.schema.ConfigError` whose message is one line naming the key path and
the offending value, e.g. ``learner.lr: must be > 0, got -0.1``. It resolves the open
variants against what is registered — ``algo.name`` in :mod:`dask_rl.algos.registry`,
``aggregation.strategy`` in :mod:`dask_rl.staleness` — and checks that the environment can be
made here (:func:`dask_rl.envs.check_env`), all before any cluster starts. Keys a section has
renamed (its ``renamed`` class attribute) are still read, with a warning.

Examples
--------
>>> cfg = load_pipeline("pipelines/ppo_cartpole.yaml", overrides=["learner.lr=1e-3"])
>>> cfg.learner.lr
0.001
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import logging
import math
import os
import types
import typing
from typing import Any, Literal, Mapping, Union

import yaml

from dask_rl.config.redact import REDACTED, redact_secrets, redact_uri
from dask_rl.config.schema import (
    AggregationConfig,
    AlgoConfig,
    ConfigError,
    EnvConfig,
    PipelineConfig,
    entry_point_text,
)

DEFAULT_ENV_ID = EnvConfig().id

__all__ = ["load_pipeline", "from_dict", "apply_overrides", "to_dict", "variant_classes"]

logger = logging.getLogger(__name__)

#: Open variants: base class -> (the key that selects one, the default choice).
VARIANTS: dict[type, tuple[str, str]] = {AlgoConfig: ("name", "ppo"),
                                         AggregationConfig: ("strategy", "async")}


def variant_classes(base: type) -> dict[str, type]:
    """Every registered variant of an open section, by the value that selects it."""
    if base is AlgoConfig:
        from dask_rl.algos import registry

        return {name: registry.config_class(name) for name in registry.names()}
    from dask_rl import staleness

    return {name: staleness.config_class(name) for name in staleness.names()}


def _variant(base: type, name: Any, path: str) -> type:
    tag = VARIANTS[base][0]
    if base is AlgoConfig:
        from dask_rl.algos import registry as lookup
    else:
        from dask_rl import staleness as lookup  # type: ignore[no-redef]
    if not isinstance(name, str) or name not in lookup.names():
        raise ConfigError(f"{_join(path, tag)}: must be one of {', '.join(lookup.names())}, "
                          f"got {_show(name)}")
    return lookup.config_class(name)


MAX_FILE_BYTES = 1 << 20  # a pipeline file larger than this is not a pipeline
MAX_NODES = 100_000       # values a pipeline may expand to (aliases included)
MAX_DEPTH = 32


def load_pipeline(path: str | os.PathLike, overrides: list[str] | None = None) -> PipelineConfig:
    """Read a pipeline YAML file, apply ``key.path=value`` overrides and validate it.

    Raises :class:`ConfigError` for a missing or unreadable file, bad YAML, or a bad value.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ConfigError(f"pipeline file not found: {path}")
    if os.path.isdir(path):
        raise ConfigError(f"{path}: a directory, not a pipeline file")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB; a pipeline is a "
                          f"short YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); a pipeline is a YAML "
                          f"file") from None
    if not text.strip() or all(not line.strip() or line.lstrip().startswith("#")
                               for line in text.splitlines()):
        raise ConfigError(f"{path}: empty; a pipeline names at least its algorithm and "
                          f"environment (see pipelines/)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    check_size(data, f"{path}")
    data = apply_overrides(dict(data), overrides or [])
    return from_dict(data)


def check_size(data: Any, where: str = "pipeline") -> None:
    """Refuse a document that expands past :data:`MAX_NODES` values or :data:`MAX_DEPTH`
    levels (YAML aliases can make a few lines expand exponentially: a "billion laughs").

    The walk counts every reference, stops at the limit, and so does bounded work before
    anything is copied.
    """
    seen = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise ConfigError(f"{where}: expands to more than {MAX_NODES} values (YAML aliases "
                              f"referring to aliases?); a pipeline is small")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, Mapping):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)


def from_dict(data: Mapping[str, Any], *, check_env: bool = True) -> PipelineConfig:
    """Validate a plain mapping (as read from YAML) into a :class:`PipelineConfig`."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"pipeline: expected a mapping, got {_show(data)}")
    check_size(data)
    _check_population(data)
    env = data.get("env")
    if isinstance(env, Mapping) and env.get("entry_point") is not None:
        # an entry point names the environment: an id beside it would be a second name (the
        # default, or None as saved configs have it, is no name)
        if env.get("id") not in (None, DEFAULT_ENV_ID):
            raise ConfigError(f"env: give id or entry_point, not both, got id "
                              f"{_show(env['id'])} and entry_point {_show(env['entry_point'])}")
        data = {**data, "env": {**env, "id": None}}
    cfg = _build(PipelineConfig, {"algo": {}, "aggregation": {}, **data}, "")
    _check_replay(cfg)
    _check_truncation(cfg)
    if check_env:
        check_environment(cfg)
    return cfg


def check_environment(cfg: PipelineConfig) -> None:
    """The pipeline's environment can be made and trained here (:func:`dask_rl.envs.check_env`),
    else :class:`ConfigError` naming ``env.id`` or ``env.entry_point``."""
    from dask_rl.algos import registry
    from dask_rl.envs import check_env

    problem = check_env(cfg.env, discrete_actions=registry.get(cfg.algo.name).discrete_actions)
    if problem:
        key = "env.id" if cfg.env.entry_point is None else "env.entry_point"
        raise ConfigError(f"{key}: {problem}, got {cfg.env.name!r}")


def _check_replay(cfg: PipelineConfig) -> None:
    """What a replay algorithm cannot do (yet), said before anything runs."""
    from dask_rl.algos import registry
    from dask_rl.algos.replay import ReplayAlgorithm

    algorithm = registry.build(cfg.algo)
    if not isinstance(algorithm, ReplayAlgorithm):
        return
    if cfg.aggregation.strategy != "async":
        raise ConfigError(f"aggregation.strategy: only 'async' with algo.name "
                          f"{cfg.algo.name!r} (its sampled learners run continuously and take "
                          f"TianJi's alpha / (1 + lambda P) themselves: a barrier would never "
                          f"close, a staleness weight would stack on it), "
                          f"got {cfg.aggregation.strategy!r}")
    problem = algorithm.validate(cfg.env)
    if problem:
        raise ConfigError(problem)


def _check_truncation(cfg: PipelineConfig) -> None:
    """Stellaris' truncation weights samples inside the loss: the algorithm must take the
    weight (:data:`~dask_rl.algos.base.SampleWeights`)."""
    if not cfg.learner.is_truncation:
        return
    import inspect

    from dask_rl.algos import registry
    from dask_rl.algos.base import LearnerAlgorithm

    algorithm = registry.get(cfg.algo.name)
    if not (issubclass(algorithm, LearnerAlgorithm)
            and "sample_weight" in inspect.signature(algorithm.loss).parameters):
        raise ConfigError(f"learner.is_truncation: algorithm {cfg.algo.name!r} takes no "
                          f"per-sample weight in its loss (sample_weight)")


def _check_population(data: Mapping[str, Any]) -> None:
    """Population-based training trains gradient learners: say so before anything else."""
    if data.get("population") is None:
        return
    from dask_rl.algos import registry
    from dask_rl.algos.base import LearnerAlgorithm

    algo = data.get("algo")
    name = algo.get("name", VARIANTS[AlgoConfig][1]) if isinstance(algo, Mapping) else None
    if name in registry.names() and not issubclass(registry.get(name), LearnerAlgorithm):
        raise ConfigError(f"population: population-based training trains gradient learners "
                          f"(ppo, impact, ...), got algo.name {name!r}")


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``key.path=value`` strings (values parsed as YAML) to a nested mapping, copying."""
    check_size(data)
    data = _deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set: expected key.path=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {'.'.join(parts[:i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
        if len(parts) == 2:
            _retag(node, parts[0], parts[1])
    return data


def _retag(section: dict, name: str, key: str) -> None:
    """After ``--set aggregation.strategy=X`` (or ``algo.name``), drop the keys that only the
    previous variant had, so a pipeline's variant can be switched from the command line."""
    base = typing.get_type_hints(PipelineConfig).get(name)
    if base not in VARIANTS or VARIANTS[base][0] != key:
        return
    try:
        variant = _variant(base, section[key], name)
    except ConfigError:
        return  # reported when the section is built
    allowed = {f.name for f in dataclasses.fields(variant)} | set(variant.renamed)
    for k in [k for k in section if k not in allowed]:
        del section[k]


def to_dict(cfg: Any) -> dict:
    """A JSON-ready dict of a config (tuples become lists; a callable ``env.entry_point``, given
    from Python, becomes its ``module:name``)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=_jsonable))


def _jsonable(value: Any) -> str:
    if callable(value):
        return entry_point_text(value)
    raise TypeError(f"not JSON serializable: {value!r}")




def public_dict(cfg: Any) -> dict:
    """:func:`to_dict` for what leaves the driver (metrics, events, checkpoints, the job's
    ConfigMap, MLflow params), without credentials (:mod:`dask_rl.config.redact`): literal
    ``cluster.kubernetes.env`` values become :data:`REDACTED` (``secretKeyRef`` references
    are kept), and so do the credentials in the MLflow tracking URI and in
    ``checkpoint.path``, and the values of ``env.kwargs`` keys that look like secrets."""
    data = to_dict(cfg)
    env = (data.get("cluster") or {}).get("kubernetes", {}).get("env") or {}
    for name, value in env.items():
        if not isinstance(value, dict):
            env[name] = REDACTED
    mlflow = (data.get("logging") or {}).get("mlflow") or {}
    if isinstance(mlflow.get("tracking_uri"), str):
        mlflow["tracking_uri"] = redact_uri(mlflow["tracking_uri"])
    checkpoint = data.get("checkpoint") or {}
    if isinstance(checkpoint.get("path"), str):
        checkpoint["path"] = redact_uri(checkpoint["path"])
    if isinstance((data.get("env") or {}).get("kwargs"), dict):
        data["env"]["kwargs"] = redact_secrets(data["env"]["kwargs"])
    return data


def _deepcopy(d: Any) -> Any:
    if isinstance(d, Mapping):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _build(cls: type, data: Any, path: str) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'pipeline'}: expected a mapping, got {_show(data)}")
    data = _renamed(cls, data, path)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            allowed = ", ".join(sorted(fields))
            raise ConfigError(f"{_join(path, str(key))}: unknown key (allowed: {allowed}), "
                              f"got {_show(data[key])}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        p = _join(path, name)
        value = _coerce(hints[name], data[name], p)
        _check_bounds(f.metadata, value, p)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if path and not str(e).startswith(path):
            raise ConfigError(f"{path}.{e}") from None
        raise


def _renamed(cls: type, data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """Read keys the section has renamed under their new names (with a warning)."""
    renamed = getattr(cls, "renamed", {})
    old = [k for k in data if k in renamed]
    if not old:
        return data
    data = dict(data)
    for key in old:
        new = renamed[key]
        if new in data:
            raise ConfigError(f"{_join(path, key)}: renamed to {_join(path, new)}, which is "
                              f"also set; keep one, got {_show(data[key])}")
        logger.warning("%s is now called %s; please rename it", _join(path, key),
                       _join(path, new))
        data[new] = data.pop(key)
    return data


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp in VARIANTS:
        return _build_variant(tp, value, path)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _coerce(rest[0], value, path)
        for option_type in rest:  # the first type that accepts the value
            try:
                return _coerce(option_type, value, path)
            except ConfigError:
                continue
        wanted = " or ".join(_describe_type(a) for a in rest)
        raise ConfigError(f"{path}: expected {wanted}, got {_show(value)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: must be one of {', '.join(map(str, args))}, "
                              f"got {_show(value)}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {_show(value)}")
        return value
    if tp is int:
        number = _number(value)
        if isinstance(value, bool) or number is None or not float(number).is_integer():
            raise ConfigError(f"{path}: expected an integer, got {_show(value)}")
        return int(number)
    if tp is float:
        number = _number(value)
        if isinstance(value, bool) or number is None:
            raise ConfigError(f"{path}: expected a number, got {_show(value)}")
        if not math.isfinite(number):
            raise ConfigError(f"{path}: must be finite, got {_show(value)}")
        return float(number)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {_show(value)}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {_show(value)}")
        return dict(value)
    if origin is collections.abc.Callable:
        if not callable(value):
            raise ConfigError(f"{path}: expected a callable, got {_show(value)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {_show(value)}")
        item = args[0]
        return tuple(_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    raise TypeError(f"unsupported field type {tp}")


def _describe_type(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is collections.abc.Callable:
        return "a callable"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _number(value: Any) -> float | int | None:
    """A YAML scalar as a number, or None. YAML 1.1 reads ``1e-3`` as a string, so parse those."""
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _build_variant(base: type, value: Any, path: str) -> Any:
    if isinstance(value, base):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: expected a mapping, got {_show(value)}")
    tag, default = VARIANTS[base]
    return _build(_variant(base, value.get(tag, default), path), value, path)


def _check_bounds(meta: Mapping[str, Any], value: Any, path: str) -> None:
    if (value is None or isinstance(value, (bool, str, dict, tuple))
            or dataclasses.is_dataclass(value)):
        if meta.get("choices") and isinstance(value, str) and value not in meta["choices"]:
            raise ConfigError(f"{path}: must be one of {', '.join(meta['choices'])}, "
                              f"got {_show(value)}")
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                _check_bounds({**meta, "choices": None}, v, f"{path}[{i}]")
        return
    for key, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                          ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        bound = meta.get(key)
        if bound is not None and not ok(value, bound):
            raise ConfigError(f"{path}: must be {word} {bound:g}, got {value!r}")
