"""V-trace off-policy targets (Espeholt et al., IMPALA, ICML 2018), time-major ``[T, N]``.

The n-step V-trace target of Sec. 4.1, Eq. (1), in its recursive form (Remark 1), and the
policy-gradient advantage of Sec. 4.2, with importance ratios ``rho_t = min(rho_bar, pi/mu)``
and ``c_t = min(c_bar, pi/mu)``:

    delta_t   = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))
    v_s       = V(x_s) + delta_s + gamma c_s (v_{s+1} - V(x_{s+1}))
    A^pg_s    = rho_s (r_s + gamma v_{s+1} - V(x_s))

Episode ends cut the recursion; ``next_values`` carries the bootstrap (0 after termination,
V(final obs) after truncation, V(last obs) at the end of the trajectory), as in
:func:`dask_rl.algos.ppo.next_values`. On-policy (all ratios 1) ``v_s`` is the n-step return
to the end of the trajectory or episode, and with ``lam`` (Remark 2,
``c_i = lambda min(c_bar, pi/mu)``) the TD(lambda) return, i.e. ``V + GAE(lambda)``.
"""

from __future__ import annotations

import numpy as np


def vtrace(log_rhos: np.ndarray, rewards: np.ndarray, values: np.ndarray,
           next_values: np.ndarray, episode_end: np.ndarray, gamma: float, *,
           rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``(vs, pg_advantages)`` for log importance ratios ``log(pi / mu)``.

    ``lam`` is Remark 2's ``lambda``: ``c_i = lambda * min(c_bar, pi/mu)`` (V-trace(lambda),
    TD(lambda) on-policy; IMPACT's V-GAE).
    """
    ratios = np.exp(log_rhos)
    rhos = np.minimum(rho_bar, ratios)
    cs = lam * np.minimum(c_bar, ratios)
    not_end = 1.0 - episode_end.astype(values.dtype)
    deltas = rhos * (rewards + gamma * next_values - values)
    vs_minus_v = np.zeros_like(values)
    acc = np.zeros_like(values[0])
    for t in reversed(range(len(rewards))):
        acc = deltas[t] + gamma * cs[t] * not_end[t] * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v
    # v_{s+1}: the next step's target inside an episode, the bootstrap value at its end
    vs_next = np.empty_like(vs)
    vs_next[:-1] = vs[1:]
    vs_next[-1] = next_values[-1]
    vs_next = np.where(not_end > 0, vs_next, next_values)
    pg_advantages = rhos * (rewards + gamma * vs_next - values)
    return vs, pg_advantages
