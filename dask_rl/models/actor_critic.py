"""Actor-critic networks: an MLP for vector observations, the Nature CNN for Atari frames."""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from dask_rl.config.schema import ModelConfig
from dask_rl.models.normalizer import ObsNormalizer


def _layer(n_in: int, n_out: int, gain: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(n_in: int, hidden: tuple[int, ...], act: type[nn.Module]) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_layer(n_in, h), act()]
        n_in = h
    return nn.Sequential(*layers), n_in


class CategoricalDist:
    """A categorical distribution over logits; lean (no argument validation) for hot loops."""

    def __init__(self, logits: torch.Tensor):
        self.logp_all = torch.log_softmax(logits, -1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.logp_all.exp() * self.logp_all).sum(-1)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.multinomial(self.logp_all.exp(), 1, generator=generator).squeeze(-1)

    def mode(self) -> torch.Tensor:
        return self.logp_all.argmax(-1)


class DiagGaussianDist:
    """A diagonal Gaussian; log-probabilities and entropies are summed over action dims."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean = mean
        self.log_std = log_std.expand_as(mean)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn(self.mean.shape, generator=generator, device=self.mean.device)
        return self.mean + self.log_std.exp() * noise

    def mode(self) -> torch.Tensor:
        return self.mean


class MultiCategoricalDist:
    """Independent categoricals, one per component of a MultiDiscrete action (logits split by
    its ``nvec``): log-probabilities and entropies are summed over the components."""

    def __init__(self, logits: torch.Tensor, nvec: list[int]):
        self.parts = [CategoricalDist(x) for x in torch.split(logits, nvec, -1)]

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return torch.stack([d.log_prob(actions[..., i]) for i, d in enumerate(self.parts)],
                           -1).sum(-1)

    def entropy(self) -> torch.Tensor:
        return torch.stack([d.entropy() for d in self.parts], -1).sum(-1)

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.stack([d.sample(generator) for d in self.parts], -1)

    def mode(self) -> torch.Tensor:
        return torch.stack([d.mode() for d in self.parts], -1)


ActionDist = CategoricalDist | MultiCategoricalDist | DiagGaussianDist


def _head_width(action_space: spaces.Space) -> int:
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete):
        return int(action_space.nvec.sum())
    return int(np.prod(action_space.shape))


class _Policy(nn.Module):
    """Shared head logic: an action distribution from features."""

    discrete: bool

    def _init_head(self, n_features: int, action_space: spaces.Space, log_std_init: float) -> None:
        self.discrete = isinstance(action_space, spaces.Discrete)
        self.nvec = ([int(n) for n in action_space.nvec]
                     if isinstance(action_space, spaces.MultiDiscrete) else None)
        dim = _head_width(action_space)
        self.pi_head = _layer(n_features, dim, gain=0.01)
        if not self.discrete and self.nvec is None:
            self.log_std = nn.Parameter(torch.full((dim,), float(log_std_init)))

    def _dist(self, features: torch.Tensor) -> ActionDist:
        out = self.pi_head(features)
        if self.discrete:
            return CategoricalDist(out)
        if self.nvec is not None:
            return MultiCategoricalDist(out, self.nvec)
        return DiagGaussianDist(out, self.log_std)

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """The discrete head's raw outputs, read as action values ``Q(s, .)`` by value-based
        algorithms (DQN): the greedy action (the mode of the policy) is their argmax."""
        if not self.discrete:
            raise TypeError("action values need a discrete action space")
        return self.pi_head(self.policy_features(obs))

    def policy_features(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def act(self, obs: torch.Tensor, *, greedy: bool = False,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample (or pick greedily) actions: ``(actions, log_probs)``; no value computed."""
        dist = self.policy(obs)
        action = dist.mode() if greedy else dist.sample(generator)
        return action, dist.log_prob(action)


def _input(obs_space: spaces.Box, cfg: ModelConfig,
           normalize_obs: bool) -> tuple[int, ObsNormalizer | None, type[nn.Module]]:
    """Input width, observation normaliser (or None) and activation of an MLP."""
    n_in = int(np.prod(obs_space.shape))
    return n_in, ObsNormalizer(n_in) if normalize_obs else None, (
        nn.Tanh if cfg.activation == "tanh" else nn.ReLU)


def _flat_obs(obs: torch.Tensor, norm: ObsNormalizer | None) -> torch.Tensor:
    x = obs.reshape(obs.shape[0], -1).float()
    return norm(x) if norm is not None else x


class ActorCritic(_Policy):
    """MLP actor-critic (CleanRL's recipe: orthogonal init, small policy-head gain)."""

    def __init__(self, obs_space: spaces.Box, action_space: spaces.Space, cfg: ModelConfig,
                 *, normalize_obs: bool = False):
        super().__init__()
        n_in, self.obs_norm, act = _input(obs_space, cfg, normalize_obs)
        self.pi_body, n_feat = _mlp(n_in, cfg.hidden, act)
        if cfg.separate_critic:
            self.v_body, n_v = _mlp(n_in, cfg.hidden, act)
        else:
            self.v_body, n_v = None, n_feat
        self.v_head = _layer(n_v, 1, gain=1.0)
        self._init_head(n_feat, action_space, cfg.log_std_init)

    def _input(self, obs: torch.Tensor) -> torch.Tensor:
        return _flat_obs(obs, self.obs_norm)

    def forward(self, obs: torch.Tensor):
        x = self._input(obs)
        feat = self.pi_body(x)
        v_feat = self.v_body(x) if self.v_body is not None else feat
        return self._dist(feat), self.v_head(v_feat).squeeze(-1)

    def policy_features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.pi_body(self._input(obs))

    def policy(self, obs: torch.Tensor) -> ActionDist:
        return self._dist(self.policy_features(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        x = self._input(obs)
        v_feat = self.v_body(x) if self.v_body is not None else self.pi_body(x)
        return self.v_head(v_feat).squeeze(-1)


class NatureCNNActorCritic(_Policy):
    """The Nature DQN torso (3 convs + 512 units) shared by policy and value heads."""

    def __init__(self, obs_space: spaces.Box, action_space: spaces.Space):
        super().__init__()
        c = obs_space.shape[0]
        self.torso = nn.Sequential(
            _conv(c, 32, 8, 4), nn.ReLU(), _conv(32, 64, 4, 2), nn.ReLU(),
            _conv(64, 64, 3, 1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n = self.torso(torch.zeros(1, *obs_space.shape)).shape[1]
        self.fc = nn.Sequential(_layer(n, 512), nn.ReLU())
        self.v_head = _layer(512, 1, gain=1.0)
        self._init_head(512, action_space, 0.0)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.torso(obs.float() / 255.0))

    def forward(self, obs: torch.Tensor):
        feat = self._features(obs)
        return self._dist(feat), self.v_head(feat).squeeze(-1)

    def policy_features(self, obs: torch.Tensor) -> torch.Tensor:
        return self._features(obs)

    def policy(self, obs: torch.Tensor) -> ActionDist:
        return self._dist(self._features(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.v_head(self._features(obs)).squeeze(-1)


class DeterministicPolicy(nn.Module):
    """An MLP from observations to actions, for evolution strategies: argmax over logits for
    discrete actions (per component for MultiDiscrete), the output clipped to the bounds for
    continuous ones."""

    def __init__(self, obs_space: spaces.Box, action_space: spaces.Space, cfg: ModelConfig,
                 *, normalize_obs: bool = False):
        super().__init__()
        n_in, self.obs_norm, act = _input(obs_space, cfg, normalize_obs)
        self.body, n_feat = _mlp(n_in, cfg.hidden, act)
        self.discrete = isinstance(action_space, spaces.Discrete)
        self.nvec = ([int(n) for n in action_space.nvec]
                     if isinstance(action_space, spaces.MultiDiscrete) else None)
        self.head = _layer(n_feat, _head_width(action_space), gain=0.01)
        if not self.discrete and self.nvec is None:
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))

    @torch.inference_mode()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.head(self.body(_flat_obs(obs, self.obs_norm)))
        if self.discrete:
            return out.argmax(-1)
        if self.nvec is not None:
            return torch.stack([x.argmax(-1) for x in torch.split(out, self.nvec, -1)], -1)
        return torch.max(torch.min(out, self.high), self.low)

    def act(self, obs: torch.Tensor, *, greedy: bool = True,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, None]:
        """``(actions, None)``, as :meth:`_Policy.act` returns them (the policy is deterministic:
        ``greedy`` and ``generator`` change nothing), so that a greedy evaluation plays it."""
        return self(obs), None


def _conv(c_in: int, c_out: int, k: int, s: int) -> nn.Conv2d:
    conv = nn.Conv2d(c_in, c_out, k, s)
    nn.init.orthogonal_(conv.weight, math.sqrt(2))
    nn.init.zeros_(conv.bias)
    return conv
