"""The pipeline schema: every section and field, as frozen, keyword-only dataclasses.

A pipeline is a YAML mapping with one section per concern (``algo``, ``env``, ``model``,
``rollout``, ``learner``, ``aggregation``, ``stop``, ``checkpoint``, ``cluster``,
``logging``, ``population``). Every field is declared once, here or in the module of the
algorithm or strategy it belongs to, with its default, bounds and a one-line description
(:func:`option`); :mod:`dask_rl.config.loader` validates YAML against it.

Two sections are *open variants*: ``algo`` is an :class:`AlgoConfig` subclass chosen by
``algo.name`` (each algorithm's module declares its own, :mod:`dask_rl.algos.registry` finds
it) and ``aggregation`` an :class:`AggregationConfig` subclass chosen by
``aggregation.strategy`` (:mod:`dask_rl.staleness`). This module imports nothing of dask-rl,
so every layer can read it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

__all__ = ["ConfigError", "option", "AlgoConfig", "AggregationConfig", "EnvConfig",
           "ModelConfig", "RolloutConfig", "LearnerConfig", "StopConfig", "CheckpointConfig",
           "AdaptConfig", "SecurityConfig", "KubernetesConfig", "JobQueueConfig",
           "ClusterConfig",
           "LoggingConfig", "MlflowConfig",
           "PopulationConfig", "PipelineConfig"]


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


@dataclass(frozen=True, kw_only=True)
class AlgoConfig:
    """Base of every algorithm's ``algo`` section; ``name`` selects the algorithm.

    Subclasses declare ``name: Literal["<name>"] = option("<name>", "algorithm")`` and their
    hyperparameters. ``renamed`` maps keys a section used to have to their new names (they
    are still read, with a warning).
    """

    name: str
    renamed: ClassVar[dict[str, str]] = {}


@dataclass(frozen=True, kw_only=True)
class AggregationConfig:
    """Base of every strategy's ``aggregation`` section; ``strategy`` selects it."""

    strategy: str
    alpha0: float = option(1.0, "server step size alpha0: theta -= alpha0 * sum_j w_j g_j",
                           gt=0)
    renamed: ClassVar[dict[str, str]] = {"lr": "alpha0"}


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    id: str | None = option("CartPole-v1", "Gymnasium id, e.g. CartPole-v1, ALE/Pong-v5, "
                                           "Hopper-v5, or module:id for an environment that "
                                           "module registers when imported (Gymnasium's own "
                                           "form, e.g. my_pkg.envs:MyEnv-v0); None with "
                                           "entry_point")
    entry_point: str | Callable[..., Any] | None = option(
        None, "instead of an id: module:name of a function or gymnasium.Env class that makes "
              "one environment, called with env.kwargs (from Python, the callable itself)")
    num_envs: int = option(4, "environments stepped together by one rollout task", ge=1)
    kwargs: dict = option(doc="extra keyword arguments for gymnasium.make or env.entry_point",
                          default_factory=dict)
    frame_stack: int = option(4, "Atari only: frames stacked per observation", ge=1)
    noop_max: int = option(30, "Atari only: random no-ops at reset", ge=0)
    episodic_life: bool = option(True, "Atari only: a lost life ends the training episode")
    clip_rewards: bool = option(True, "Atari only: the loss sees sign(reward)")
    normalize_obs: bool = option(False, "normalise observations by their running mean/std")
    normalize_reward: bool = option(False, "scale rewards by the running std of discounted "
                                           "returns, clipped to +-10 (MuJoCo)")

    def __post_init__(self) -> None:
        if self.id is None and self.entry_point is None:
            raise ConfigError("id: give a Gymnasium id, or env.entry_point, got None")

    @property
    def name(self) -> str:
        """What the run calls its environment: the id, or the entry point as module:name."""
        if self.entry_point is None:
            return str(self.id)
        return entry_point_text(self.entry_point)


def entry_point_text(entry_point: Any) -> str:
    """``module:name`` of an entry point given as text or as the callable itself; stable (no
    memory addresses), so that a resumed run recognises its environment."""
    if isinstance(entry_point, str):
        return entry_point
    if isinstance(entry_point, functools.partial):
        inner = entry_point_text(entry_point.func)
        keys = ", ".join(f"{k}={v!r}" for k, v in sorted(entry_point.keywords.items()))
        return f"{inner}({keys})" if keys else inner
    target = entry_point if hasattr(entry_point, "__qualname__") else type(entry_point)
    suffix = "" if target is entry_point else "()"   # a callable object: its class
    module = getattr(target, "__module__", None) or "?"
    return f"{module}:{target.__qualname__}{suffix}"


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    hidden: tuple[int, ...] = option((64, 64), "hidden layer sizes of the MLP torso")
    activation: str = option("tanh", "MLP activation", choices=("tanh", "relu"))
    separate_critic: bool = option(True, "MLP only: actor and critic have separate torsos")
    log_std_init: float = option(0.0, "continuous actions: initial log standard deviation")


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    renamed: ClassVar[dict[str, str]] = {"num_actors": "slots"}

    steps: int = option(128, "env steps per environment in one rollout task", ge=1)
    slots: int | None = option(None, "rollout slots: rollout tasks kept in flight, each on its "
                                     "own persistent environments (None: one per worker "
                                     "thread)", ge=1)
    max_ready: int | None = option(None, "completed trajectories waiting for a learner before "
                                         "rollouts pause (None: learner.max_learners)", ge=1)
    pull_every: int = option(1, "TianJi's event-triggered pull: a rollout slot asks for the "
                                "policy only every this many rollouts", ge=1)
    pull_min_versions: int = option(1, "... and takes it only when the parameter actor's "
                                       "version moved by at least this much", ge=1)


@dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    max_learners: int = option(2, "learner tasks in flight at once", ge=1)
    fused: bool = option(True, "learn each trajectory in the task that collected it, on its "
                               "worker (no trajectory moves, no trip to the driver between "
                               "collecting and learning); applies to on-policy algorithms "
                               "without replay, on CPU learners and a cluster without "
                               "cluster.adapt; elsewhere learners are tasks of their own")
    gpus: float = option(0.0, "Dask resource GPU requested per learner task", ge=0)
    device: str = option("auto", "where a learner runs its math", choices=("auto", "cpu", "cuda"))
    lr: float = option(2.5e-4, "learning rate of the learner's local optimizer", gt=0)
    anneal_lr: bool = option(True, "decay lr linearly to 0 over stop.env_steps")
    epochs: int = option(4, "passes over each batch", ge=1)
    minibatches: int = option(4, "minibatches per pass", ge=1)
    max_grad_norm: float = option(0.5, "clip the global gradient norm (0: off)", ge=0)
    adam_eps: float = option(1e-5, "Adam epsilon", gt=0)
    optimizer_state: str = option(
        "shared", "where the learners' Adam moments live: 'shared' (kept by the parameter "
        "actor, averaged over each update's gradients; every learner pull and push carries "
        "them, 3x the parameters' bytes) or 'local' (each learner thread keeps its own across "
        "its tasks; pulls and pushes carry the parameters only)", choices=("shared", "local"))
    is_truncation: bool = option(False, "global importance-sampling truncation across the "
                                        "learners active at the same time (Stellaris)")
    is_rho: float = option(1.0, "cap rho of the truncated ratio", gt=0)


@dataclass(frozen=True, kw_only=True)
class StopConfig:
    env_steps: int = option(300_000, "stop after this many environment steps", ge=1)
    wall_s: float | None = option(None, "stop after this many seconds", gt=0)
    target_return: float | None = option(None, "stop once a greedy evaluation reaches this mean "
                                               "return (None: the env's reward_threshold)")
    eval_episodes: int = option(10, "episodes of each greedy evaluation", ge=1)
    eval_every_updates: int = option(50, "evaluate greedily every N updates (0: only when the "
                                         "training return reaches the target)", ge=0)
    solve_on_target: bool = option(True, "stop once a greedy evaluation reaches the target "
                                         "and a confirming evaluation agrees")
    confirm_episodes: int | None = option(None, "episodes of the evaluation, on fresh seeds, "
                                                "that confirms a target before a run is called "
                                                "solved (None: three times the env's standard "
                                                "of 100 episodes for classic control and Box2D, "
                                                "else of 20)", ge=1)
    confirm_margin: float = option(3.5, "standard errors of the gap between the confirming "
                                        "evaluation's mean and a fresh evaluation's of the "
                                        "env's standard length by which the former must "
                                        "clear the target (0: the bare standard, which a "
                                        "policy just at the target passes half the time)", ge=0)


@dataclass(frozen=True, kw_only=True)
class MlflowConfig:
    tracking_uri: str | None = option(None, "an MLflow tracking URI: a server (http://...), "
                                            "a local store (file:///path/mlruns), ... (None: "
                                            "MLflow's default, MLFLOW_TRACKING_URI)")
    experiment: str = option("dask-rl", "the MLflow experiment the run is logged under")
    run_name: str | None = option(None, "the MLflow run's name (None: the run directory's)")


@dataclass(frozen=True, kw_only=True)
class LoggingConfig:
    tensorboard: bool = option(False, "write TensorBoard event files to RUN_DIR/tensorboard "
                                      "(CleanRL's tag names; extra tensorboard)")
    mlflow: MlflowConfig | None = option(None, "log params, metrics and the exported policy "
                                               "to MLflow (extra mlflow; None: off)")


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
    stall_s: float = option(300.0, "no task finished this long while tasks are in flight: "
                                   "warn, naming paused workers; end the run (exit 1) when "
                                   "every worker is paused for memory", gt=0)
    max_recoveries: int = option(5, "a run whose parameter actor is lost more often than "
                                    "this within recovery_window_s gives up (exit 1)", ge=0)
    recovery_window_s: float = option(600.0, "the window max_recoveries counts in", gt=0)


@dataclass(frozen=True, kw_only=True)
class AdaptConfig:
    minimum: int = option(1, "fewest workers (in the default, rollout group)", ge=0)
    maximum: int = option(4, "most workers (TianJi's allocation divides their threads between "
                             "learners and rollout slots)", ge=1)
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
    env: dict = option(doc="environment variables for every pod: NAME: value, or NAME: "
                           "{secretKeyRef: {name: ..., key: ...}} to read a Kubernetes Secret; "
                           "credentials only as secretKeyRef (a literal that looks like one "
                           "is refused)",
                       default_factory=dict)
    tls_secret: str | None = option(None, "a Kubernetes Secret with ca.crt, tls.crt and tls.key: "
                                          "scheduler, workers and the job then talk TLS only, "
                                          "with mutual authentication")


WALLTIME = re.compile(r"^(\d+-)?\d{1,3}:[0-5]\d:[0-5]\d$")
SIZE = re.compile(r"^\d+(\.\d+)?\s*([kmgtp]i?b?|b)$", re.IGNORECASE)   # what dask reads: 4GB, 2GiB


@dataclass(frozen=True, kw_only=True)
class JobQueueConfig:
    """``cluster.kind`` slurm, pbs, sge or lsf: workers as batch jobs (dask-jobqueue)."""

    queue: str | None = option(None, "partition (SLURM) or queue the worker jobs go to "
                                     "(None: the scheduler's default)")
    account: str | None = option(None, "account (project) the jobs are charged to")
    walltime: str = option("01:00:00", "each worker job's time limit, [D-]HH:MM:SS (written "
                                        "in each system's own form)")
    cores: int = option(1, "cores per job, shared by its worker processes", ge=1)
    memory: str = option("4GB", "memory per job, shared by its worker processes")
    processes: int = option(1, "Dask worker processes per job (1: cancelling a job takes "
                               "one worker; cluster.n_workers and adapt count workers, so "
                               "jobs = workers / processes)", ge=1)
    job_extra_directives: tuple[str, ...] = option((), "more #SBATCH/#PBS/#$/#BSUB lines for "
                                                       "the rollout jobs, e.g. "
                                                       "--constraint=haswell")
    job_script_prologue: tuple[str, ...] = option((), "shell lines run before the worker, "
                                                      "e.g. module load, source venv")
    python: str | None = option(None, "the Python on the compute nodes (None: this one, "
                                      "sys.executable)")
    interface: str | None = option(None, "network interface workers and scheduler talk on, "
                                         "e.g. ib0 (None: the default route)")
    scheduler_host: str | None = option(None, "address the scheduler listens on (None: this "
                                              "host's; 127.0.0.1 for a one-node cluster)")
    log_directory: str | None = option(None, "where the jobs' stdout/stderr go (None: the "
                                             "batch system's default)")
    learner_workers: int = option(0, "jobs of the GPU learner group (one worker each, never "
                                     "scaled; learner.gpus > 0 sends learners there)", ge=0)
    learner_gpus: int = option(1, "GPUs per learner job: --gres=gpu:N (SLURM) and the "
                                  "worker's GPU resource", ge=1)
    learner_memory: str = option("16GB", "memory per learner job")
    learner_extra_directives: tuple[str, ...] = option((), "more directives for the learner "
                                                           "jobs (their GPUs off SLURM, e.g. "
                                                           "-l ngpus=1 on PBS)")

    def __post_init__(self) -> None:
        if not WALLTIME.match(self.walltime):
            raise ConfigError(f"walltime: [D-]HH:MM:SS, got {self.walltime!r}")
        for key in ("memory", "learner_memory"):
            value = getattr(self, key)
            if not SIZE.match(value):
                raise ConfigError(f"{key}: a size such as 4GB, got {value!r}")
        if self.processes > self.cores:
            raise ConfigError(f"processes: at most cores ({self.cores}) worker processes per "
                              f"job, got {self.processes}")


JOBQUEUE_KINDS = ("slurm", "pbs", "sge", "lsf")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    kind: str = option("local", "local: embedded LocalCluster; address: an existing scheduler; "
                                "kubernetes: a DaskCluster by the dask-kubernetes operator; "
                                "slurm, pbs, sge, lsf: worker jobs on an HPC batch system "
                                "(dask-jobqueue, extra hpc; see cluster.jobqueue)",
                       choices=("local", "address", "kubernetes", *JOBQUEUE_KINDS))
    n_workers: int = option(2, "local: worker processes; slurm/pbs/sge/lsf: workers of the "
                               "default (rollout) group, started as jobs", ge=1)
    threads_per_worker: int = option(1, "local: threads per worker (more threads in all than "
                                        "cores share them, slower; the run warns)", ge=1)
    processes: bool = option(True, "local: worker processes (False: threads in this process)")
    memory_limit: str = option("auto", "local: memory limit per worker")
    address: str | None = option(None, "address: the scheduler, tcp://host:8786 or tls://...")
    dashboard: bool = option(True, "local: serve the Dask dashboard (and the /rl page)")
    dashboard_address: str = option("127.0.0.1:8787", "local: where the dashboard listens "
                                                      "(this machine only unless changed, "
                                                      "e.g. :8787 for every interface)")
    profile: bool = option(False, "Dask's statistical profiler on workers of local and rendered "
                                  "Kubernetes clusters (it samples every thread every 10 ms, "
                                  "slows rollouts ~15% and keeps ~110 MB of history per worker)")
    actor_transport: str = option(
        "direct", "how tasks on other workers reach the parameter actor: 'direct' (their "
        "combined calls over a TCP connection of their own to the actor's worker, "
        "HMAC-checked, unencrypted: tcp:// clusters only; where it cannot be opened or "
        "reached, Dask) or 'dask' (Dask actor calls)", choices=("direct", "dask"))
    adapt: AdaptConfig | None = option(None, "scale workers to the RL workload (None: fixed)")
    upload: tuple[str, ...] = option((), "your code for the workers, sent before the run (and to "
                                         "workers that join later) with Dask's "
                                         "Client.upload_file: .py, .zip or .egg files, or "
                                         "directories (zipped: a package directory is sent as "
                                         "that package, any other directory as its contents)")
    security: SecurityConfig | None = option(None, "TLS for kind address (tls:// schedulers)")
    kubernetes: KubernetesConfig = option(doc="kind kubernetes: the cluster to create",
                                          default_factory=KubernetesConfig)
    jobqueue: JobQueueConfig = option(doc="kind slurm, pbs, sge, lsf: the worker jobs",
                                      default_factory=JobQueueConfig)


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
    algo: AlgoConfig = option(doc="algorithm and its hyperparameters (by algo.name; default "
                                  "ppo)")
    seed: int = option(0, "seeds environments, model init and learners", ge=0)
    env: EnvConfig = option(doc="environment", default_factory=EnvConfig)
    model: ModelConfig = option(doc="policy / value network", default_factory=ModelConfig)
    rollout: RolloutConfig = option(doc="rollout tasks", default_factory=RolloutConfig)
    learner: LearnerConfig = option(doc="learner tasks", default_factory=LearnerConfig)
    aggregation: AggregationConfig = option(doc="how the parameter actor applies gradients "
                                                "(by aggregation.strategy; default async)")
    stop: StopConfig = option(doc="when a run ends", default_factory=StopConfig)
    checkpoint: CheckpointConfig = option(doc="Zarr checkpoints",
                                          default_factory=CheckpointConfig)
    cluster: ClusterConfig = option(doc="where it runs", default_factory=ClusterConfig)
    logging: LoggingConfig = option(doc="experiment trackers (TensorBoard, MLflow), beside "
                                        "metrics.jsonl", default_factory=LoggingConfig)
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


