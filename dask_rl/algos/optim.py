"""First-order optimizers on flat vectors, with explicit state for checkpoints.

The same code runs on numpy arrays (the parameter actor applying aggregated gradients, ES
updating its mean, Salimans et al. 2017) and on torch tensors (a learner's local steps on its
flat parameter buffer, on CPU or GPU): only in-place arithmetic is used. ``step(params, grad,
lr)`` updates ``params`` in place and descends, ``params -= lr * direction(grad)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SGD", "Adam", "make_optimizer", "mean_adam_state"]


class SGD:
    """Plain (optionally momentum) gradient descent."""

    name = "sgd"

    def __init__(self, like: Any, *, momentum: float = 0.0):
        self.momentum = momentum
        self.velocity = like * 0 if momentum else None
        self.t = 0

    def step(self, params: Any, grad: Any, lr: float) -> None:
        self.t += 1
        if self.velocity is not None:
            self.velocity *= self.momentum
            self.velocity += grad
            grad = self.velocity
        params -= lr * grad

    def stepped(self, params: Any, grad: Any, lr: float) -> Any:
        """``params`` after one :meth:`step`, as a new array (``params`` is left as it was):
        without momentum one pass fewer than a copy stepped in place, the same numbers."""
        if self.velocity is not None:
            return _stepped_copy(self, params, grad, lr)
        self.t += 1
        return params - lr * grad

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"t": self.t}
        if self.velocity is not None:
            state["velocity"] = self.velocity.copy()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        if self.velocity is not None:
            self.velocity[:] = state["velocity"]


class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1), bias-corrected exactly as ``torch.optim.Adam``:
    on tensors in torch's own fused in-place order, on numpy arrays in plain arithmetic."""

    name = "adam"

    def __init__(self, like: Any, *, beta1: float = 0.9, beta2: float = 0.999,
                 eps: float = 1e-8):
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m = like * 0
        self.v = like * 0
        self.t = 0

    def step(self, params: Any, grad: Any, lr: float) -> None:
        self.t += 1
        bias1 = 1 - self.beta1 ** self.t
        bias2 = 1 - self.beta2 ** self.t
        if hasattr(params, "addcdiv_"):  # a torch tensor: fused in-place ops, torch's order
            self.m.mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
            self.v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denom = (self.v.sqrt() / bias2 ** 0.5).add_(self.eps)
            params.addcdiv_(self.m, denom, value=-lr / bias1)
            return
        self.m *= self.beta1
        self.m += (1 - self.beta1) * grad
        self.v *= self.beta2
        self.v += (1 - self.beta2) * grad * grad
        denom = self.v ** 0.5 / bias2 ** 0.5 + self.eps
        params -= (lr / bias1) * self.m / denom

    def stepped(self, params: Any, grad: Any, lr: float) -> Any:
        """``params`` after one :meth:`step`, as a new array (``params`` is left as it was)."""
        return _stepped_copy(self, params, grad, lr)

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "m": self.m, "v": self.v}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        self.m[:] = state["m"]
        self.v[:] = state["v"]


def _stepped_copy(optimizer: SGD | Adam, params: Any, grad: Any, lr: float) -> Any:
    out = params.copy()
    optimizer.step(out, grad, lr)
    return out


def make_optimizer(name: str, like: Any, **kwargs: Any) -> SGD | Adam:
    """``sgd`` or ``adam`` for vectors shaped (and typed, and placed) like ``like``."""
    if name == "sgd":
        return SGD(like, **kwargs)
    if name == "adam":
        return Adam(like, **kwargs)
    raise ValueError(f"unknown optimizer {name!r}")


def mean_adam_state(states: list[dict]) -> dict:
    """The mean of several learners' Adam states (``m``, ``v`` and the step count ``t``): the
    moments an update made of their gradients carries on with."""
    if len(states) == 1:
        return states[0]
    return {"m": np.mean([s["m"] for s in states], axis=0).astype(np.float32),
            "v": np.mean([s["v"] for s in states], axis=0).astype(np.float32),
            "t": int(round(np.mean([s["t"] for s in states])))}
