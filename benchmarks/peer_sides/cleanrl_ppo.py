"""A CleanRL-style single-file PPO (one process, no framework): the plain script a user writes.

Settings are CleanRL's documented defaults (docs.cleanrl.dev/rl-algorithms/ppo/):

* ``ppo.py`` for discrete actions (CartPole-v1): 4 envs x 128 steps, 4 epochs x 4 minibatches,
  lr 2.5e-4 annealed, gamma 0.99, GAE 0.95, clip 0.2 (value clipped too), entropy 0.01, value
  0.5, grad norm 0.5, advantages normalised; 64-64 tanh actor and critic, orthogonal init;
* ``ppo_continuous_action.py`` for MuJoCo (Hopper): 1 env x 2048 steps, 10 epochs x 32
  minibatches, lr 3e-4 annealed, entropy 0, state-independent log std; observations normalised
  and clipped to +-10, rewards scaled by a running return std and clipped to +-10 (Gymnasium's
  wrappers, as CleanRL uses them).

Written for this benchmark (not CleanRL's file): it follows the recipe, and it records progress
and snapshots as every side of ``peers.py`` does (``common.Record``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Normalized, Record, side_args  # noqa: E402

DISCRETE = dict(num_envs=4, num_steps=128, epochs=4, minibatches=4, lr=2.5e-4, ent_coef=0.01)
CONTINUOUS = dict(num_envs=1, num_steps=2048, epochs=10, minibatches=32, lr=3e-4, ent_coef=0.0)


def layer(i: int, o: int, std: float = np.sqrt(2)) -> nn.Linear:
    lin = nn.Linear(i, o)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


def mlp(i: int, o: int, std: float) -> nn.Sequential:
    return nn.Sequential(layer(i, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, o, std))


class Agent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, discrete: bool):
        super().__init__()
        self.discrete = discrete
        self.critic = mlp(obs_dim, 1, 1.0)
        self.actor = mlp(obs_dim, act_dim, 0.01)
        if not discrete:
            self.logstd = nn.Parameter(torch.zeros(1, act_dim))

    def dist(self, x):
        out = self.actor(x)
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.logstd.expand_as(out).exp())

    def logp(self, d, a):
        return d.log_prob(a) if self.discrete else d.log_prob(a).sum(-1)

    def entropy(self, d):
        return d.entropy() if self.discrete else d.entropy().sum(-1)


def make_env(env_id: str, discrete: bool, gamma: float):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        if not discrete:
            env = gym.wrappers.ClipAction(env)
            env = gym.wrappers.NormalizeObservation(env)
            env = gym.wrappers.TransformObservation(env, lambda o: np.clip(o, -10, 10),
                                                    env.observation_space)
            env = gym.wrappers.NormalizeReward(env, gamma=gamma)
            env = gym.wrappers.TransformReward(env, lambda r: float(np.clip(r, -10, 10)))
        return env
    return thunk


def obs_moments(envs):
    """The running observation mean/var of the (single) env's NormalizeObservation."""
    env = envs.envs[0]
    while not isinstance(env, gym.wrappers.NormalizeObservation):
        env = env.env
    return env.obs_rms.mean.copy(), env.obs_rms.var.copy()


def main() -> int:
    args = side_args()
    rec = Record(args.out, args.spawn, args.grid)
    probe = gym.make(args.env)
    discrete = isinstance(probe.action_space, gym.spaces.Discrete)
    hp = DISCRETE if discrete else CONTINUOUS
    gamma, lam, clip, vf_coef, max_grad = 0.99, 0.95, 0.2, 0.5, 0.5
    n, T = hp["num_envs"], hp["num_steps"]
    batch = n * T
    mb = batch // hp["minibatches"]
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    envs = gym.vector.SyncVectorEnv([make_env(args.env, discrete, gamma) for _ in range(n)])
    obs_dim = int(np.prod(probe.observation_space.shape))
    act_dim = probe.action_space.n if discrete else int(np.prod(probe.action_space.shape))
    agent = Agent(obs_dim, act_dim, discrete)
    opt = torch.optim.Adam(agent.parameters(), lr=hp["lr"], eps=1e-5)
    a_shape = () if discrete else (act_dim,)
    obs_buf = torch.zeros((T, n, obs_dim))
    act_buf = torch.zeros((T, n, *a_shape))
    logp_buf, rew_buf, done_buf, val_buf = (torch.zeros((T, n)) for _ in range(4))
    obs, _ = envs.reset(seed=args.seed)
    obs = torch.as_tensor(obs, dtype=torch.float32)
    done = torch.zeros(n)
    steps, returns = 0, []
    updates = max(1, args.budget // batch)
    example = torch.zeros((2, obs_dim))
    for update in range(updates):
        if rec.now() > args.cap_s:
            break
        opt.param_groups[0]["lr"] = (1.0 - update / updates) * hp["lr"]
        for t in range(T):
            obs_buf[t], done_buf[t] = obs, done
            with torch.no_grad():
                d = agent.dist(obs)
                a = d.sample()
                logp_buf[t], val_buf[t] = agent.logp(d, a), agent.critic(obs).flatten()
            act_buf[t] = a
            nxt, r, term, trunc, info = envs.step(a.numpy())
            rew_buf[t] = torch.as_tensor(r, dtype=torch.float32)
            obs = torch.as_tensor(nxt, dtype=torch.float32)
            done = torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32)
            if "episode" in info:
                returns.extend(info["episode"]["r"][info["_episode"]].tolist())
        steps += batch
        with torch.no_grad():   # GAE(lambda), as CleanRL computes it
            nxt_val = agent.critic(obs).flatten()
            adv = torch.zeros((T, n))
            last = torch.zeros(n)
            for t in reversed(range(T)):
                nonterm = 1.0 - (done if t == T - 1 else done_buf[t + 1])
                v_next = nxt_val if t == T - 1 else val_buf[t + 1]
                delta = rew_buf[t] + gamma * v_next * nonterm - val_buf[t]
                last = delta + gamma * lam * nonterm * last
                adv[t] = last
            ret = adv + val_buf
        b_obs, b_act = obs_buf.reshape(batch, obs_dim), act_buf.reshape(batch, *a_shape)
        b_logp, b_adv = logp_buf.reshape(-1), adv.reshape(-1)
        b_ret, b_val = ret.reshape(-1), val_buf.reshape(-1)
        for _ in range(hp["epochs"]):
            for idx in torch.randperm(batch).split(mb):
                d = agent.dist(b_obs[idx])
                ratio = (agent.logp(d, b_act[idx]) - b_logp[idx]).exp()
                a_mb = b_adv[idx]
                a_mb = (a_mb - a_mb.mean()) / (a_mb.std() + 1e-8)
                pg = torch.max(-a_mb * ratio, -a_mb * ratio.clamp(1 - clip, 1 + clip)).mean()
                v = agent.critic(b_obs[idx]).flatten()
                v_clipped = b_val[idx] + (v - b_val[idx]).clamp(-clip, clip)
                v_loss = 0.5 * torch.max((v - b_ret[idx]) ** 2,
                                         (v_clipped - b_ret[idx]) ** 2).mean()
                loss = pg - hp["ent_coef"] * agent.entropy(d).mean() + vf_coef * v_loss
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), max_grad)
                opt.step()
        recent = float(np.mean(returns[-20:])) if returns else None
        rec.progress(steps, recent)
        if rec.due(steps):
            if discrete:
                greedy = Normalized(_copy(agent.actor))
            else:
                mean, var = obs_moments(envs)
                greedy = Normalized(_copy(agent.actor), mean=mean, var=var, clip_obs=10.0,
                                    low=probe.action_space.low, high=probe.action_space.high)
            rec.snapshot(steps, greedy, example)
    rec.close(env_steps=steps, settings={**hp, "gamma": gamma, "gae_lambda": lam,
                                        "clip": clip, "vf_coef": vf_coef},
              settings_source="CleanRL docs: ppo.py / ppo_continuous_action.py defaults",
              torch_threads=torch.get_num_threads(), started=time.time())
    return 0


def _copy(net: nn.Module) -> nn.Module:
    import copy
    return copy.deepcopy(net)


if __name__ == "__main__":
    sys.exit(main())
