"""First-order optimizers on flat numpy vectors, with explicit state for checkpoints.

The parameter actor applies aggregated gradients with these; ES updates its mean with Adam
(Salimans et al. 2017). ``step(params, grad, lr)`` updates ``params`` in place and descends, i.e.
``params -= lr * direction(grad)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SGD", "Adam", "make_optimizer"]


class SGD:
    """Plain (optionally momentum) gradient descent."""

    name = "sgd"

    def __init__(self, size: int, *, momentum: float = 0.0):
        self.momentum = momentum
        self.velocity = np.zeros(size, np.float32) if momentum else None
        self.t = 0

    def step(self, params: np.ndarray, grad: np.ndarray, lr: float) -> None:
        self.t += 1
        if self.velocity is not None:
            self.velocity *= self.momentum
            self.velocity += grad
            grad = self.velocity
        params -= np.float32(lr) * grad

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {"t": np.asarray(self.t, np.int64)}
        if self.velocity is not None:
            state["velocity"] = self.velocity.copy()
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.t = int(state["t"])
        if self.velocity is not None:
            self.velocity[:] = state["velocity"]


class Adam:
    """Adam (Kingma & Ba 2015) with bias correction."""

    name = "adam"

    def __init__(self, size: int, *, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m = np.zeros(size, np.float32)
        self.v = np.zeros(size, np.float32)
        self.t = 0

    def step(self, params: np.ndarray, grad: np.ndarray, lr: float) -> None:
        self.t += 1
        self.m *= self.beta1
        self.m += (1 - self.beta1) * grad
        self.v *= self.beta2
        self.v += (1 - self.beta2) * grad * grad
        a = lr * np.sqrt(1 - self.beta2 ** self.t) / (1 - self.beta1 ** self.t)
        params -= (a * self.m / (np.sqrt(self.v) + self.eps)).astype(np.float32, copy=False)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"t": np.asarray(self.t, np.int64), "m": self.m.copy(), "v": self.v.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.t = int(state["t"])
        self.m[:] = state["m"]
        self.v[:] = state["v"]


def make_optimizer(name: str, size: int) -> SGD | Adam:
    if name == "sgd":
        return SGD(size)
    if name == "adam":
        return Adam(size)
    raise ValueError(f"unknown optimizer {name!r}")
