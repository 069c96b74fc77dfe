"""Pipeline configuration: YAML files validated into frozen dataclasses.

A pipeline is a YAML mapping with one section per concern (``algo``, ``env``, ``model``,
``rollout``, ``learner``, ``aggregation``, ``stop``, ``checkpoint``, ``cluster``). Every field is
declared once below, with its default, its bounds and a one-line description; the loader rejects
unknown keys, wrong types and out-of-range values with a :class:`ConfigError` whose message names
the key path and the offending value, e.g. ``learner.lr: must be > 0, got -0.1``.

Two sections are *tagged unions*: ``algo`` is chosen by ``algo.name`` (``ppo``, ``impact``, ...)
and ``aggregation`` by ``aggregation.strategy`` (``sync``, ``async``, ...); each variant accepts
only its own keys.

Examples
--------
>>> cfg = load_pipeline("pipelines/ppo_cartpole.yaml", overrides=["learner.lr=1e-3"])
>>> cfg.learner.lr
0.001
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Union

import yaml

__all__ = [
    "ConfigError",
    "PipelineConfig",
    "load_pipeline",
    "from_dict",
    "apply_overrides",
    "to_dict",
]


class ConfigError(ValueError):
    """A pipeline is invalid. The message is one line naming the key path and the value."""


def option(default: Any = dataclasses.MISSING, doc: str = "", *, default_factory: Any = None,
           ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None, choices: tuple | None = None) -> Any:
    """A dataclass field carrying its documentation and bounds for the loader."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    id: str = option("CartPole-v1", "Gymnasium id, e.g. CartPole-v1, ALE/Pong-v5, Hopper-v5")
    num_envs: int = option(4, "environments stepped together by one rollout task", ge=1)
    kwargs: dict = option(doc="extra keyword arguments for gymnasium.make", default_factory=dict)
    frame_stack: int = option(4, "Atari only: frames stacked per observation", ge=1)
    noop_max: int = option(30, "Atari only: random no-ops at reset", ge=0)
    episodic_life: bool = option(True, "Atari only: a lost life ends the training episode")
    clip_rewards: bool = option(True, "Atari only: the loss sees sign(reward)")
    normalize_obs: bool = option(False, "normalise observations by their running mean/std")
    normalize_reward: bool = option(False, "scale rewards by the running std of discounted "
                                           "returns, clipped to +-10 (MuJoCo)")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    hidden: tuple[int, ...] = option((64, 64), "hidden layer sizes of the MLP torso")
    activation: str = option("tanh", "MLP activation", choices=("tanh", "relu"))
    separate_critic: bool = option(True, "MLP only: actor and critic have separate torsos")
    log_std_init: float = option(0.0, "continuous actions: initial log standard deviation")


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    steps: int = option(128, "env steps per environment in one rollout task", ge=1)
    num_actors: int | None = option(None, "rollout tasks kept in flight (None: one per worker "
                                          "thread)", ge=1)
    max_ready: int | None = option(None, "completed trajectories waiting for a learner before "
                                         "rollouts pause (None: learner.max_learners)", ge=1)


@dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    max_learners: int = option(2, "learner tasks in flight at once", ge=1)
    gpus: float = option(0.0, "Dask resource GPU requested per learner task", ge=0)
    device: str = option("auto", "where a learner runs its math", choices=("auto", "cpu", "cuda"))
    lr: float = option(2.5e-4, "learning rate of the learner's local optimizer", gt=0)
    anneal_lr: bool = option(True, "decay lr linearly to 0 over stop.env_steps")
    epochs: int = option(4, "passes over each batch", ge=1)
    minibatches: int = option(4, "minibatches per pass", ge=1)
    max_grad_norm: float = option(0.5, "clip the global gradient norm (0: off)", ge=0)
    adam_eps: float = option(1e-5, "Adam epsilon", gt=0)
    is_truncation: bool = option(False, "global importance-sampling truncation across the "
                                        "learners active at the same time (Stellaris)")
    is_rho: float = option(1.0, "cap rho of the truncated ratio", gt=0)


@dataclass(frozen=True, kw_only=True)
class PPOConfig:
    name: Literal["ppo"] = option("ppo", "algorithm")
    gamma: float = option(0.99, "discount", ge=0, le=1)
    gae_lambda: float = option(0.95, "GAE lambda", ge=0, le=1)
    clip_coef: float = option(0.2, "surrogate clipping epsilon", gt=0)
    clip_vloss: bool = option(True, "clip the value loss around the behaviour values")
    vf_coef: float = option(0.5, "value loss coefficient", ge=0)
    ent_coef: float = option(0.01, "entropy bonus coefficient", ge=0)
    norm_adv: bool = option(True, "normalise advantages per minibatch")
    target_kl: float | None = option(None, "stop a learner's epochs early above this KL", gt=0)


@dataclass(frozen=True, kw_only=True)
class IMPACTConfig:
    name: Literal["impact"] = option("impact", "algorithm")
    gamma: float = option(0.99, "discount", ge=0, le=1)
    clip_coef: float = option(0.4, "surrogate clipping epsilon on pi/pi_target", gt=0)
    vf_coef: float = option(0.5, "value loss coefficient", ge=0)
    ent_coef: float = option(0.01, "entropy bonus coefficient", ge=0)
    rho_bar: float = option(1.0, "V-trace rho-bar truncation", gt=0)
    c_bar: float = option(1.0, "V-trace c-bar truncation", gt=0)
    target_is_clip: float = option(2.0, "truncation of the behaviour->target IS ratio", gt=0)
    target_update_every: int = option(2, "refresh the target network every N updates", ge=1)
    replay: int = option(2, "times each batch is replayed from the circular buffer (K)", ge=1)
    buffer_size: int = option(8, "trajectories kept in the circular buffer", ge=1)
    norm_adv: bool = option(True, "normalise advantages per minibatch")


@dataclass(frozen=True, kw_only=True)
class ESConfig:
    name: Literal["es"] = option("es", "algorithm")
    sigma: float = option(0.02, "standard deviation of the parameter perturbations", gt=0)
    lr: float = option(0.01, "Adam step size on the mean parameters", gt=0)
    l2: float = option(0.005, "weight decay coefficient", ge=0)
    pairs: int = option(32, "antithetic pairs per generation (population 2N)", ge=1)
    pairs_per_task: int = option(4, "pairs one task evaluates (make tasks last >= ~0.2 s)",
                                 ge=1)
    episodes: int = option(1, "episodes per perturbation", ge=1)
    noise_table_size: int = option(10_000_000, "float32 entries of the shared noise table "
                                               "(built on every worker)", ge=1)
    noise_seed: int = option(123, "seed of the noise table", ge=0)
    max_episode_steps: int | None = option(None, "cut evaluation episodes at this length", ge=1)
    eval_every: int = option(5, "noiseless evaluation every N generations", ge=1)


AlgoConfig = Union[PPOConfig, IMPACTConfig, ESConfig]


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    strategy: Literal["sync"] = option("sync", "barrier over the active learners, average, "
                                               "one step")
    lr: float = option(1.0, "server step size alpha0 applied to each aggregate", gt=0)


@dataclass(frozen=True, kw_only=True)
class AsyncConfig:
    strategy: Literal["async"] = option("async", "apply every gradient on arrival")
    lr: float = option(1.0, "server step size alpha0", gt=0)


@dataclass(frozen=True, kw_only=True)
class SSPConfig:
    strategy: Literal["ssp"] = option("ssp", "stale-synchronous parallel: updates wait so that "
                                             "no learner falls more than `bound` versions "
                                             "behind")
    lr: float = option(1.0, "server step size alpha0", gt=0)
    bound: int = option(3, "staleness bound s", ge=0)


@dataclass(frozen=True, kw_only=True)
class SoftsyncConfig:
    strategy: Literal["softsync"] = option("softsync", "n-softsync: update every "
                                                       "floor(learners / n) gradients, step "
                                                       "alpha0 / mean staleness")
    lr: float = option(1.0, "server step size alpha0", gt=0)
    n: int = option(2, "the n of n-softsync", ge=1)


@dataclass(frozen=True, kw_only=True)
class StellarisConfig:
    strategy: Literal["stellaris"] = option("stellaris", "Stellaris: dynamic staleness "
                                                         "threshold, staleness-scaled steps")
    lr: float = option(1.0, "server step size alpha0", gt=0)
    decay: float | Literal["auto"] = option(0.96, "threshold decay d per round "
                                                  "(beta_k = delta_max d^k), or auto",
                                            gt=0, le=1)
    smoothness: float = option(3.0, "v in the step alpha0 / delta^(1/v)", gt=0)


AggregationConfig = Union[SyncConfig, AsyncConfig, SSPConfig, SoftsyncConfig, StellarisConfig]


@dataclass(frozen=True, kw_only=True)
class StopConfig:
    env_steps: int = option(300_000, "stop after this many environment steps", ge=1)
    wall_s: float | None = option(None, "stop after this many seconds", gt=0)
    target_return: float | None = option(None, "stop once a greedy evaluation reaches this mean "
                                               "return (None: the env's reward_threshold)")
    eval_episodes: int = option(10, "episodes of each greedy evaluation", ge=1)
    eval_every_updates: int = option(50, "evaluate greedily every N updates (0: only when the "
                                         "training return reaches the target)", ge=0)
    solve_on_target: bool = option(True, "stop as soon as a greedy evaluation reaches the "
                                         "target")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    every_s: float = option(60.0, "seconds between checkpoints (0: only at the end)", ge=0)
    keep: int = option(3, "checkpoints kept", ge=1)
    path: str | None = option(None, "where checkpoints go (default RUN_DIR/checkpoints); a local "
                                    "path or an fsspec URL")
    replay_buffer: bool = option(True, "off-policy runs: write the replay buffer's trajectories "
                                       "too (workers write them; they must reach the path)")
    heartbeat_s: float = option(2.0, "seconds between pings of the parameter actor", gt=0)
    actor_timeout_s: float = option(30.0, "a parameter actor silent this long is re-created "
                                          "from the latest checkpoint", gt=0)


@dataclass(frozen=True, kw_only=True)
class AdaptConfig:
    minimum: int = option(1, "fewest workers (in the default, rollout group)", ge=0)
    maximum: int = option(4, "most workers", ge=1)
    interval_s: float = option(1.0, "local: seconds between scaling decisions", gt=0)
    wait_count: int = option(3, "local: decisions in a row before a worker is retired", ge=1)

    def __post_init__(self) -> None:
        if self.maximum < self.minimum:
            raise ConfigError(f"maximum: must be >= minimum ({self.minimum}), "
                              f"got {self.maximum}")


@dataclass(frozen=True, kw_only=True)
class SecurityConfig:
    tls_ca_file: str | None = option(None, "address: CA certificate (PEM) for tls://")
    tls_client_cert: str | None = option(None, "address: client certificate (PEM)")
    tls_client_key: str | None = option(None, "address: client private key (PEM)")
    require_encryption: bool = option(True, "refuse unencrypted connections")


@dataclass(frozen=True, kw_only=True)
class KubernetesConfig:
    name: str = option("dask-rl", "DaskCluster name")
    namespace: str = option("default", "Kubernetes namespace")
    image: str = option("ghcr.io/dask-rl/dask-rl:0.1.0", "container image (k8s/Dockerfile)")
    rollout_workers: int = option(2, "workers of the default (rollout) group", ge=0)
    rollout_cpu: str = option("1", "CPU per rollout worker")
    rollout_memory: str = option("4Gi", "memory per rollout worker")
    learner_workers: int = option(0, "workers of the GPU learner group", ge=0)
    learner_gpus: int = option(1, "GPUs per learner worker", ge=0)
    learner_memory: str = option("16Gi", "memory per learner worker")
    parameter_workers: int = option(1, "workers of the fixed parameter group (never scaled)",
                                    ge=1)
    parameter_memory: str = option("4Gi", "memory per parameter worker")
    scheduler_memory: str = option("2Gi", "memory of the scheduler")
    env: dict = option(doc="environment variables for every pod", default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    kind: str = option("local", "local: embedded LocalCluster; address: an existing scheduler; "
                                "kubernetes: a DaskCluster by the dask-kubernetes operator",
                       choices=("local", "address", "kubernetes"))
    n_workers: int = option(2, "local: worker processes", ge=1)
    threads_per_worker: int = option(1, "local: threads per worker", ge=1)
    processes: bool = option(True, "local: worker processes (False: threads in this process)")
    memory_limit: str = option("auto", "local: memory limit per worker")
    address: str | None = option(None, "address: the scheduler, tcp://host:8786 or tls://...")
    dashboard: bool = option(True, "local: serve the Dask dashboard (and the /rl page)")
    profile: bool = option(False, "Dask's statistical profiler on workers of local and rendered "
                                  "Kubernetes clusters (it samples every thread every 10 ms, "
                                  "slows rollouts ~15% and keeps ~110 MB of history per worker)")
    adapt: AdaptConfig | None = option(None, "scale workers to the RL workload (None: fixed)")
    security: SecurityConfig | None = option(None, "TLS for kind address (tls:// schedulers)")
    kubernetes: KubernetesConfig = option(doc="kind kubernetes: the cluster to create",
                                          default_factory=KubernetesConfig)


@dataclass(frozen=True, kw_only=True)
class PopulationConfig:
    members: int = option(4, "population-based training: trainers run at once", ge=2)
    ready_env_steps: int = option(20_000, "a member is ready for exploit/explore every this "
                                          "many of its env steps", ge=1)
    fraction: float = option(0.25, "bottom fraction replaced by copies of the top fraction",
                             gt=0, le=0.5)
    resample_probability: float = option(0.25, "explore: resample instead of perturbing",
                                         ge=0, le=1)
    perturb_factors: tuple[float, ...] = option((0.8, 1.2), "explore: multiply by one of these")
    hyperparameters: dict = option(
        doc="key path -> [low, high] searched (log-uniform when low > 0), e.g. learner.lr",
        default_factory=lambda: {"learner.lr": [1e-4, 1e-3], "algo.ent_coef": [0.0, 0.03]})
    eval_episodes: int = option(5, "greedy episodes scoring a member at each ready point", ge=1)


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    algo: AlgoConfig = option(doc="algorithm and its hyperparameters", default_factory=PPOConfig)
    seed: int = option(0, "seeds environments, model init and learners", ge=0)
    env: EnvConfig = option(doc="environment", default_factory=EnvConfig)
    model: ModelConfig = option(doc="policy / value network", default_factory=ModelConfig)
    rollout: RolloutConfig = option(doc="rollout tasks", default_factory=RolloutConfig)
    learner: LearnerConfig = option(doc="learner tasks", default_factory=LearnerConfig)
    aggregation: AggregationConfig = option(doc="how the parameter actor applies gradients",
                                            default_factory=AsyncConfig)
    stop: StopConfig = option(doc="when a run ends", default_factory=StopConfig)
    checkpoint: CheckpointConfig = option(doc="Zarr checkpoints",
                                          default_factory=CheckpointConfig)
    cluster: ClusterConfig = option(doc="where it runs", default_factory=ClusterConfig)
    population: PopulationConfig | None = option(None, "population-based training over the "
                                                       "members (None: one trainer)")

    def __post_init__(self) -> None:
        batch = self.env.num_envs * self.rollout.steps
        if self.learner.minibatches > batch:
            raise ConfigError(f"learner.minibatches: must be <= env.num_envs * rollout.steps "
                              f"= {batch}, got {self.learner.minibatches}")
        if self.cluster.kind == "address" and not self.cluster.address:
            raise ConfigError("cluster.address: required when cluster.kind is 'address', got None")
        if self.population is not None:
            if self.algo.name == "es":
                raise ConfigError("population: population-based training trains ppo or impact "
                                  "members, got algo.name 'es'")
            for key, bounds in self.population.hyperparameters.items():
                where = f"population.hyperparameters.{key}"
                if key != "learner.lr" and not key.startswith("algo."):
                    raise ConfigError(f"{where}: only learner.lr and algo.* hyperparameters "
                                      f"can change during training, got {key!r}")
                if not isinstance(self.lookup(key), (int, float)) or isinstance(
                        self.lookup(key), bool):
                    raise ConfigError(f"{where}: not a numeric pipeline key, got {key!r}")
                if (not isinstance(bounds, (list, tuple)) or len(bounds) != 2
                        or not all(isinstance(b, (int, float)) for b in bounds)
                        or bounds[0] > bounds[1]):
                    raise ConfigError(f"{where}: expected [low, high] with low <= high, "
                                      f"got {bounds!r}")

    def lookup(self, key: str) -> Any:
        """The value at a key path such as ``learner.lr`` (None if there is no such key)."""
        node: Any = self
        for part in key.split("."):
            if not dataclasses.is_dataclass(node) or not hasattr(node, part):
                return None
            node = getattr(node, part)
        return node

    @property
    def batch_size(self) -> int:
        """Samples in one trajectory (one learner task's batch)."""
        return self.env.num_envs * self.rollout.steps


# Tagged unions: the key that selects the variant, and the variant used when it is absent.
_TAGS: dict[Any, tuple[str, str]] = {AlgoConfig: ("name", "ppo"),
                                     AggregationConfig: ("strategy", "async")}


# --------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------

def load_pipeline(path: str | os.PathLike, overrides: list[str] | None = None) -> PipelineConfig:
    """Read a pipeline YAML file, apply ``key.path=value`` overrides and validate it.

    Raises :class:`ConfigError` for a missing or unreadable file, bad YAML, or a bad value.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ConfigError(f"pipeline file not found: {path}")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    data = apply_overrides(dict(data), overrides or [])
    return from_dict(data)


def from_dict(data: Mapping[str, Any], *, check_env: bool = True) -> PipelineConfig:
    """Validate a plain mapping (as read from YAML) into a :class:`PipelineConfig`."""
    cfg = _build(PipelineConfig, data, "")
    if check_env:
        from dask_rl.envs import check_env_id

        problem = check_env_id(cfg.env.id)
        if problem:
            raise ConfigError(f"env.id: {problem}, got {cfg.env.id!r}")
    return cfg


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``key.path=value`` strings (values parsed as YAML) to a nested mapping, copying."""
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
    field_ = next((f for f in dataclasses.fields(PipelineConfig) if f.name == name), None)
    if field_ is None:
        return
    tp = typing.get_type_hints(PipelineConfig)[name]
    if tp not in _TAGS or _TAGS[tp][0] != key:
        return
    for variant in typing.get_args(tp):
        if typing.get_args(typing.get_type_hints(variant)[key])[0] == section[key]:
            allowed = {f.name for f in dataclasses.fields(variant)}
            for k in [k for k in section if k not in allowed]:
                del section[k]


def to_dict(cfg: Any) -> dict:
    """A JSON-ready dict of a config (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


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


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp in _TAGS:
        return _build_union(tp, value, path)
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
    if dataclasses.is_dataclass(tp):
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
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {_show(value)}")
        item = args[0]
        return tuple(_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    raise TypeError(f"unsupported field type {tp}")


def _describe_type(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
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


def _build_union(tp: Any, value: Any, path: str) -> Any:
    tag, default = _TAGS[tp]
    variants = {typing.get_args(typing.get_type_hints(v)[tag])[0]: v for v in typing.get_args(tp)}
    if isinstance(value, tuple(variants.values())):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: expected a mapping, got {_show(value)}")
    name = value.get(tag, default)
    if name not in variants:
        raise ConfigError(f"{_join(path, tag)}: must be one of {', '.join(variants)}, "
                          f"got {_show(name)}")
    return _build(variants[name], value, path)


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


def describe(cls: type = PipelineConfig, prefix: str = "",
             variant: str = "") -> list[tuple[str, Any, str]]:
    """(key path, default, doc) for every field; union variants' docs start with their name."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        tp = hints[f.name]
        if tp in _TAGS:
            tag = _TAGS[tp][0]
            for cls_ in typing.get_args(tp):
                name = typing.get_args(typing.get_type_hints(cls_)[tag])[0]
                rows += describe(cls_, key, variant=name)
        elif dataclasses.is_dataclass(tp):
            rows += describe(tp, key)
        elif any(dataclasses.is_dataclass(a) for a in typing.get_args(tp)):  # optional section
            rows.append((key, None, f.metadata.get("doc", "")))
            rows += describe(next(a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)),
                             key)
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            doc = f.metadata.get("doc", "")
            rows.append((key, default, f"*{variant}:* {doc}" if variant else doc))
    return rows


def reference_markdown() -> str:
    """The field reference of ``docs/config.md`` (a test keeps that file current)."""
    lines = ["# Pipeline reference", "",
             "Every key a pipeline accepts, its default and its meaning. `algo` keys depend on "
             "`algo.name` and `aggregation` keys on `aggregation.strategy` (shown in italics). "
             "Generated from `dask_rl/config.py` by `python -m dask_rl.config > docs/config.md`.",
             "",
             "| key | default | meaning |", "|---|---|---|"]
    for key, default, doc in describe():
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        lines.append(f"| `{key}` | `{shown}` | {doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m dask_rl.config > docs/config.md
    import sys

    sys.stdout.write(reference_markdown())
