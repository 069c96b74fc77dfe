"""The interface between an algorithm and the runtime.

An algorithm declares what it needs of the runtime in :class:`Needs` and otherwise only turns
data into losses; the runtime asks it nothing else. Three families exist:

* :class:`LearnerAlgorithm` — gradient learners trained by asynchronous learner tasks on
  trajectories (PPO, IMPACT): the learner building block calls :meth:`~LearnerAlgorithm.prepare`
  once per trajectory, then :meth:`~LearnerAlgorithm.loss` on minibatches for
  ``learner.epochs`` x ``learner.minibatches`` Adam steps, and asks
  :meth:`~LearnerAlgorithm.stop_epochs` after each epoch;
* :class:`~dask_rl.algos.replay.ReplayAlgorithm` — learners on transitions sampled from a
  replay buffer that stays on the workers (TianJi's replay path; DQN, or SAC/TD3 registered
  from outside): see :mod:`dask_rl.algos.replay`;
* ``evolution`` algorithms (ES) — generations of perturbations; their driver uses the pure
  functions of their module.

Notes
-----
A new algorithm is one module in ``algos/`` with a config class (a frozen, keyword-only
subclass of :class:`~dask_rl.config.schema.AlgoConfig` whose ``name`` field is a ``Literal``)
and an :class:`Algorithm` subclass naming it in ``config_class``, plus one registration:
a line in :data:`dask_rl.algos.registry.BUILTIN`, or :func:`dask_rl.algos.registry.register`
for code outside the package. See ``docs/architecture.md``.

Examples
--------
>>> algo = get("ppo")(cfg.algo)
>>> batch = algo.prepare(traj, model, device=device, rewards=traj.rewards)
>>> loss, stats = algo.loss(model, batch.take(idx))
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np
import torch

from dask_rl.config.schema import AlgoConfig, ModelConfig

if TYPE_CHECKING:
    from dask_rl.data import Trajectory


@dataclass(frozen=True)
class Needs:
    """What an algorithm asks of the runtime. The defaults ask for nothing."""

    #: The parameter actor keeps a *target* copy of the parameters, refreshed every this many
    #: updates; gradient learners get ``log pi_target(a|s)`` of their batch, replay learners
    #: the target parameters themselves (None: no target network).
    target_network_every: int | None = None
    #: Times each trajectory is learned from in all (> 1: the driver replays recent
    #: trajectories from a circular buffer when learners would otherwise idle).
    replay: int = 1
    #: Trajectories that circular buffer keeps.
    replay_capacity: int = 1
    #: The discount of the running return by whose standard deviation ``env.normalize_reward``
    #: scales rewards (None: the algorithm has no discount; reward scaling is refused).
    discount: float | None = None


#: A strategy's per-sample weight inside a loss: ``(ratio, minibatch) -> weight`` (or None:
#: weight 1), called with the algorithm's importance ratio ``r = pi_theta / D``.
SampleWeights = Callable[[torch.Tensor, "Batch"], "torch.Tensor | None"]


@dataclass
class Batch:
    """One trajectory flattened over ``[T, N]`` into tensors, ready for minibatches.

    ``target_logp`` is set when the algorithm keeps a target network. ``ratio_logp`` is the log
    of the denominator of the algorithm's importance ratio ``r = pi_theta / D`` when it is not
    the behaviour policy ``mu`` (IMPACT's); the learner measures other learners' policies
    against the same ``D`` for Stellaris' truncation and sets ``cross_ratio_min``, which only
    the truncation's weight function reads.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor          # log mu(a|s) of the behaviour policy
    advantages: torch.Tensor
    returns: torch.Tensor       # value targets
    values: torch.Tensor        # V(s) when the batch was prepared
    target_logp: torch.Tensor | None = None
    ratio_logp: torch.Tensor | None = None
    cross_ratio_min: torch.Tensor | None = None

    @property
    def denominator_logp(self) -> torch.Tensor:
        """``log D`` of the algorithm's ratio ``pi_theta / D`` (``log mu`` unless set)."""
        return self.logp if self.ratio_logp is None else self.ratio_logp

    def __len__(self) -> int:
        return int(self.advantages.shape[0])

    def take(self, idx: torch.Tensor) -> "Batch":
        """The minibatch at ``idx`` (every tensor indexed alike)."""
        return dataclasses.replace(self, **{
            f.name: getattr(self, f.name)[idx] for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None})


class Algorithm(abc.ABC):
    """Base of every algorithm: a name, a config class, its declared needs and the network it
    trains. Its family is the base class below it derives from
    (:mod:`dask_rl.runtime.families` picks the driver by it)."""

    name: ClassVar[str]
    config_class: ClassVar[type[AlgoConfig]]
    #: Trains on Discrete action spaces only (checked before anything runs).
    discrete_actions: ClassVar[bool] = False
    #: Its trained policy is a distribution worth sampling (not greedy-only, as DQN's action
    #: values or an evolved deterministic net are).
    stochastic_policy: ClassVar[bool] = True

    def __init__(self, cfg: AlgoConfig):
        if not isinstance(cfg, self.config_class):
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, "
                            f"got {type(cfg).__name__}")
        self.cfg = cfg

    @property
    def needs(self) -> Needs:
        return Needs()

    def make_model(self, obs_space: Any, action_space: Any, model_cfg: ModelConfig, *,
                   normalize_obs: bool = False, seed: int | None = None) -> torch.nn.Module:
        """The network this algorithm trains, for these (Gymnasium) spaces: the actor-critic
        of :func:`dask_rl.models.make_model` unless the algorithm brings its own. It must
        offer ``act(obs, generator=None, greedy=False) -> (actions, logp)`` and
        ``policy(obs)`` (a distribution with ``mode``), which rollouts, evaluations and
        exported policies use."""
        from dask_rl.models import make_model

        return make_model(obs_space, action_space, model_cfg, normalize_obs=normalize_obs,
                          seed=seed)


class LearnerAlgorithm(Algorithm):
    """A gradient learner trained on trajectories by asynchronous learner tasks."""

    @abc.abstractmethod
    def prepare(self, traj: "Trajectory", model: torch.nn.Module, *, device: torch.device,
                rewards: np.ndarray, target_logp: np.ndarray | None = None) -> Batch:
        """A trajectory as a training batch (targets computed under ``model`` as loaded).

        ``rewards`` are the rewards the loss should see (clipped or scaled by the learner);
        ``target_logp`` is ``log pi_target(a|s)`` of the actions, flat, when
        :attr:`Needs.target_network_every` is set.
        """

    @abc.abstractmethod
    def loss(self, model: torch.nn.Module, mb: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, stats)`` on a minibatch; stats use CleanRL's ``losses/...`` keys.

        An algorithm that can weight its samples also takes ``sample_weight``
        (:data:`SampleWeights`), which it calls with its importance ratio inside the loss
        (Stellaris' truncation: :mod:`dask_rl.staleness.truncation`); one that does not take
        it cannot run with ``learner.is_truncation``.
        """

    def stop_epochs(self, epoch_stats: list[dict[str, float]]) -> bool:
        """After an epoch: stop this learner's epochs early (PPO's ``target_kl``)?"""
        return False


class EvolutionAlgorithm(Algorithm):
    """An algorithm trained in generations of perturbations (ES): its driver uses the pure
    functions of its module. Its policy is the evolved deterministic net."""

    stochastic_policy = False
