r"""Server optimizer updates on the pseudo-gradient :math:`\Delta_t = \bar w_t - w_t`, one tensor at a time.

Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295, Algorithm 2, and Hsu, Qi, Brown,
"Measuring the Effects of Non-Identical Data Distribution for Federated Visual Classification", 2019,
arXiv:1909.06335 (server momentum). :math:`\Delta_t` points from the global model towards the clients' mean, so
every step here is *added* to the global model. All operations are elementwise; squares, roots and signs are
taken per coordinate. Nothing is updated in place: each function returns new tensors.
"""

from __future__ import annotations

from torch import Tensor


def heavy_ball(velocity: Tensor, delta: Tensor, momentum: float, nesterov: bool = False) -> tuple[Tensor, Tensor]:
    r"""FedAvgM's server momentum (Hsu et al. 2019): :math:`u_t = \beta u_{t-1} + \Delta_t`.

    Returns:
        ``(u_t, direction)`` with direction :math:`u_t`, or :math:`\Delta_t + \beta u_t` with ``nesterov`` (the
        look-ahead form of ``torch.optim.SGD``); the server adds :math:`\eta` times the direction.
    """
    velocity = momentum * velocity + delta
    return velocity, (delta + momentum * velocity) if nesterov else velocity


def first_moment(m: Tensor, delta: Tensor, beta1: float) -> Tensor:
    r""":math:`m_t = \beta_1 m_{t-1} + (1 - \beta_1) \Delta_t` (Algorithm 2, line 11)."""
    return beta1 * m + (1.0 - beta1) * delta


def adagrad_second_moment(v: Tensor, delta: Tensor) -> Tensor:
    r"""FedAdagrad: :math:`v_t = v_{t-1} + \Delta_t^2`."""
    return v + delta.square()


def adam_second_moment(v: Tensor, delta: Tensor, beta2: float) -> Tensor:
    r"""FedAdam: :math:`v_t = \beta_2 v_{t-1} + (1 - \beta_2) \Delta_t^2`."""
    return beta2 * v + (1.0 - beta2) * delta.square()


def yogi_second_moment(v: Tensor, delta: Tensor, beta2: float) -> Tensor:
    r"""FedYogi: :math:`v_t = v_{t-1} - (1 - \beta_2)\,\Delta_t^2 \operatorname{sign}(v_{t-1} - \Delta_t^2)`.

    ``sign(0) = 0``, as written. Unlike Adam's, the change of :math:`v` is :math:`(1-\beta_2)\Delta_t^2` whichever
    way it goes, whatever the size of :math:`v_{t-1}`. :math:`v` only decreases while :math:`v_{t-1} > \Delta_t^2`,
    and then to more than :math:`\beta_2 v_{t-1}`, so it stays positive from :math:`v_{-1} = \tau^2 > 0`.
    """
    squared = delta.square()
    return v - (1.0 - beta2) * squared * (v - squared).sign()


def adaptive_step(m: Tensor, v: Tensor, lr: float, tau: float) -> Tensor:
    r"""The step :math:`\eta\, m_t / (\sqrt{v_t} + \tau)` (Algorithm 2, line 15), added to the global model."""
    return lr * m / (v.sqrt() + tau)


__all__ = [
    "adagrad_second_moment",
    "adam_second_moment",
    "adaptive_step",
    "first_moment",
    "heavy_ball",
    "yogi_second_moment",
]
