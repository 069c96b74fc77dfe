"""A continuous-action replay algorithm added from outside the package trains through the
normal runtime.

``sac_toy.py`` (beside this file) is Soft Actor-Critic in one module and a ``register`` call;
no file of dask-rl knows it. Its rollouts act through its own ``act``, its transitions are cut
on the workers that hold them by the replay interface DQN uses, its learners take many
gradient steps per task, and Pendulum's greedy return rises from about -1,200 to above -250.
"""

import importlib
import json

import numpy as np
import pytest
import torch

import dask_rl
from dask_rl.algos import registry

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def sac():
    """The toy's registration (its module registers itself on import), undone afterwards."""
    module = importlib.import_module("sac_toy")
    registry.register(module.SAC)
    yield module
    registry.unregister("sac")


def test_the_squashed_gaussian_density_is_the_change_of_variables(sac):
    """Eq. 21 of Haarnoja et al. (2018): log pi(a) = log N(u) - sum log |da/du|, checked per
    sample against a numerical derivative of a = scale tanh(u) and the normal density."""
    mean, log_std = np.array([0.3, -1.2]), np.array([-0.5, 0.1])
    scale = np.array([2.0, 3.0])
    dist = sac.SquashedGaussian(torch.tensor(mean[None]), torch.tensor(log_std[None]),
                                torch.tensor(scale))
    for seed in range(5):
        action, logp = dist.rsample(torch.Generator().manual_seed(seed))
        noise = torch.randn((1, 2), generator=torch.Generator().manual_seed(seed)).numpy()[0]
        expected = 0.0
        for i in range(2):
            sd = np.exp(log_std[i])
            u = mean[i] + sd * noise[i]
            density = np.exp(-0.5 * ((u - mean[i]) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
            h = 1e-6
            slope = scale[i] * (np.tanh(u + h) - np.tanh(u - h)) / (2 * h)
            expected += np.log(density) - np.log(slope)
            assert action[0, i].item() == pytest.approx(scale[i] * np.tanh(u), rel=1e-5)
        assert logp.item() == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_the_soft_q_target_per_sample(sac):
    """y = r + gamma (1 - d) (min_j Q_target_j(s', a') - alpha log pi(a'|s')), Eq. 3 and 5,
    recomputed per sample with the same a' (one fixed seed) in plain loops."""
    torch.manual_seed(1)
    model = sac.SACModel(3, 1, 8, np.array([2.0], np.float32), init_alpha=0.5)
    target = sac.SACModel(3, 1, 8, np.array([2.0], np.float32), init_alpha=3.0)  # alpha unused
    batch = {"obs": torch.randn(4, 3), "actions": torch.rand(4, 1) * 4 - 2,
             "returns": torch.tensor([1.0, -2.0, 0.5, 0.0]),
             "discounts": torch.tensor([0.99, 0.0, 0.99, 0.99]), "next_obs": torch.randn(4, 3)}
    algo = sac.SAC(sac.SACConfig())
    torch.manual_seed(7)
    loss, stats = algo.loss(model, target, batch)
    torch.manual_seed(7)
    with torch.no_grad():
        next_a, next_logp = model.policy(batch["next_obs"]).rsample()
        q_loss = 0.0
        for j in range(4):
            x = torch.cat([batch["next_obs"][j], next_a[j]])
            q_next = min(target.q1(x).item(), target.q2(x).item())
            y = batch["returns"][j].item() + batch["discounts"][j].item() * (
                q_next - 0.5 * next_logp[j].item())
            xa = torch.cat([batch["obs"][j], batch["actions"][j]])
            q_loss += (0.5 * (model.q1(xa).item() - y) ** 2
                       + 0.5 * (model.q2(xa).item() - y) ** 2) / 4
    assert stats["losses/q_loss"] == pytest.approx(q_loss, rel=1e-5)


def test_each_loss_reaches_only_its_own_parameters(sac):
    """The summed loss's gradient on the Q-functions is J_Q's alone (the policy loss sees them
    detached), on the policy it is J_pi's (Eq. 7, reparameterised: Eq. 8-9), and on log alpha
    it is -(log pi(a|s) + H_bar) averaged: Eq. 18 taken in log alpha. Each recomputed per
    sample from the same noise."""
    torch.manual_seed(2)
    model = sac.SACModel(3, 1, 8, np.array([2.0], np.float32), init_alpha=0.5)
    batch = {"obs": torch.randn(16, 3), "actions": torch.rand(16, 1) * 4 - 2,
             "returns": torch.randn(16), "discounts": torch.full((16,), 0.99),
             "next_obs": torch.randn(16, 3)}
    q_params = list(model.q1.parameters()) + list(model.q2.parameters())
    pi_params = list(model.actor.parameters())
    torch.manual_seed(7)
    loss, _ = sac.SAC(sac.SACConfig()).loss(model, model, batch)
    got = torch.autograd.grad(loss, q_params + pi_params + [model.log_alpha])
    got_q, got_pi = got[:len(q_params)], got[len(q_params):-1]
    torch.manual_seed(7)   # the same noise as the loss drew: for a' first, then for a
    with torch.no_grad():
        next_noise = torch.randn(16, 1)
    noise = torch.randn(16, 1)
    alpha, scale = 0.5, 2.0
    j_q, j_pi, logps = 0.0, 0.0, []
    for j in range(16):
        with torch.no_grad():   # a' = scale tanh(mu + sigma eps) and its log-density
            mean, log_std = model.actor(batch["next_obs"][j]).chunk(2)
            u = mean + log_std.clamp(-5, 2).exp() * next_noise[j]
            a_next = scale * torch.tanh(u)
            logp_next = (-0.5 * next_noise[j] ** 2 - log_std.clamp(-5, 2)
                         - 0.5 * np.log(2 * np.pi) - torch.log(scale * (1 - torch.tanh(u) ** 2))
                         ).sum()
            nx = torch.cat([batch["next_obs"][j], a_next])
            y = batch["returns"][j] + batch["discounts"][j] * (
                torch.min(model.q1(nx), model.q2(nx)) - alpha * logp_next)
        x = torch.cat([batch["obs"][j], batch["actions"][j]])
        j_q = j_q + 0.5 * ((model.q1(x) - y) ** 2 + (model.q2(x) - y) ** 2) / 16
        mean, log_std = model.actor(batch["obs"][j]).chunk(2)
        u = mean + log_std.clamp(-5, 2).exp() * noise[j]
        a = scale * torch.tanh(u)
        logp = (-0.5 * noise[j] ** 2 - log_std.clamp(-5, 2) - 0.5 * np.log(2 * np.pi)
                - torch.log(scale * (1 - torch.tanh(u) ** 2))).sum()
        xa = torch.cat([batch["obs"][j], a])
        q1 = torch.func.functional_call(model.q1, {k: v.detach() for k, v in
                                                  model.q1.named_parameters()}, (xa,))
        q2 = torch.func.functional_call(model.q2, {k: v.detach() for k, v in
                                                  model.q2.named_parameters()}, (xa,))
        j_pi = j_pi + (alpha * logp - torch.min(q1, q2)) / 16
        logps.append(logp.item())
    for g, w in zip(got_q, torch.autograd.grad(j_q.sum(), q_params)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    for g, w in zip(got_pi, torch.autograd.grad(j_pi.sum(), pi_params)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert got[-1].item() == pytest.approx(-float(np.mean(logps) - 1.0), rel=1e-4)  # H_bar=-1


@pytest.mark.slow
def test_sac_trains_pendulum_on_worker_processes(sac, local_client, tmp_path):
    """One gradient step per env step (as in the paper), 100 per learner task; a greedy
    screening of 20 episodes every 10 tasks, and the run stops once 20 fresh greedy episodes
    confirm a mean of -250 or more (an untrained policy scores about -1,200). Tuned on seeds
    1-4, 6, 7: at 8,000 env steps the final greedy return was -128 to -191, but one run in
    the suite ended at -525, so the test asks for the target within 16,000 steps and stops
    when it is reached; the test runs seed 5."""
    run_dir = tmp_path / "sac"
    result = dask_rl.train(
        {"algo": {"name": "sac", "gamma": 0.99, "target_every": 2, "hidden": 64,
                  "batch_size": 128, "min_batch_size": 128, "updates_per_task": 100,
                  "replay_ratio": 128, "buffer_size": 20_000, "max_buffer_size": 20_000,
                  "learning_starts": 1000, "staleness_lambda": 0.0, "random_steps": 1000},
         "env": {"id": "Pendulum-v1", "num_envs": 1}, "seed": 5,
         "rollout": {"steps": 200, "slots": 1},
         "learner": {"max_learners": 1, "lr": 1e-3, "anneal_lr": False, "max_grad_norm": 0},
         "stop": {"env_steps": 16_000, "eval_every_updates": 10, "eval_episodes": 20,
                  "target_return": -250.0, "confirm_episodes": 20, "confirm_margin": 0.0},
         "checkpoint": {"every_s": 0}},
        client=local_client, run_dir=run_dir)
    s = result.summary
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    learners = [r for r in records if r["kind"] == "learner"]
    assert s["algorithm"] == "sac" and s["env_id"] == "Pendulum-v1"
    assert learners and all(r["learner/finite"] for r in learners)
    # each learner task took its 100 gradient steps on sampled transitions
    assert {r["learner/epochs"] for r in learners} == {100}
    # solved: 20 fresh greedy episodes of the policy it keeps averaged -250 or more
    assert s["solved"] and s["confirmation"]["episodes"] == 20, s
    assert s["confirmation"]["mean_return"] >= -250, s
