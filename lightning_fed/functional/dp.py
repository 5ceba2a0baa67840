r"""Client-level differential privacy: clipping, Gaussian noise and adaptive clipping, as pure functions.

DP-FedAvg: McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018,
arXiv:1710.06963. Each client's update :math:`\Delta_k = w_k - w_g` is clipped to norm :math:`S`, the clipped
updates are summed, Gaussian noise :math:`\mathcal{N}(0, \sigma^2 I)` with :math:`\sigma = zS` is added to the sum,
and the result is divided by the expected number of clients :math:`m`:

.. math::
    \tilde\Delta = \frac{1}{m}\Big(\sum_{k} \Delta_k \min\big(1, S / \lVert \Delta_k \rVert_2\big)
    + \mathcal{N}(0, z^2 S^2 I)\Big)

Adaptive clipping: Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021, arXiv:1905.03871, Algorithm 1 (geometric update). With :math:`b_k = 1[\lVert \Delta_k \rVert \le S]`,

.. math::
    \tilde b = \frac{1}{m}\Big(\sum_k b_k + \mathcal{N}(0, \sigma_b^2)\Big), \qquad
    S \leftarrow S \exp\big(-\eta_S (\tilde b - \gamma)\big),

and the update is noised with :math:`\sigma_\Delta S` where :math:`\sigma_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}`,
so that releasing both costs as much privacy as one Gaussian release with noise multiplier :math:`z` (the paper's
Theorem 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from lightning_fed.functional.state_dict import StateDict


def l2_norm(tensors: Iterable[Tensor]) -> float:
    """The L2 norm of all ``tensors`` taken as one flat vector, computed in float64."""
    squares = [tensor.detach().double().pow(2).sum() for tensor in tensors]
    return math.sqrt(float(torch.stack(squares).sum())) if squares else 0.0


def clip_update(delta: Mapping[str, Tensor], clip_norm: float) -> tuple[StateDict, float]:
    r"""Scales ``delta`` (all entries as one vector) by :math:`\min(1, S / \lVert \Delta \rVert_2)`.

    An update already within the ball is returned unchanged (scale exactly 1), so clipping never perturbs it.

    Args:
        delta: The client's update :math:`\Delta_k`, name -> tensor.
        clip_norm: :math:`S > 0`.

    Returns:
        The clipped update (float64) and the norm of ``delta`` before clipping.
    """
    norm = l2_norm(delta.values())
    scale = clip_norm / norm if norm > clip_norm else 1.0
    return {name: tensor.detach().double() * scale for name, tensor in delta.items()}, norm


def gaussian_noise(like: Mapping[str, Tensor], std: float, generator: torch.Generator) -> StateDict:
    """Independent :math:`\\mathcal{N}(0, \\text{std}^2)` draws shaped like each entry of ``like``, in float64.

    Drawn on the CPU from ``generator`` in the order of ``like``'s keys, then moved to each entry's device: the
    same generator state gives the same noise on every device and every process.
    """
    noise: StateDict = {}
    for name, tensor in like.items():
        draw = torch.randn(tensor.shape, generator=generator, dtype=torch.float64) * std
        noise[name] = draw.to(tensor.device)
    return noise


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    r""":math:`\sigma_\Delta = (z^{-2} - (2\sigma_b)^{-2})^{-1/2}`: the update's share of the noise budget :math:`z`
    when the clipped count is released with noise :math:`\sigma_b` (Andrew et al. 2021, Theorem 1).

    ``noise_multiplier = 0`` (no privacy) gives 0.

    Raises:
        ValueError: If :math:`2\sigma_b \le z > 0`, when no noise is left for the update.
    """
    if noise_multiplier == 0.0:
        return 0.0
    if 2.0 * count_stddev <= noise_multiplier:
        raise ValueError(
            f"The clipped count's noise ({count_stddev}) must exceed half the noise multiplier ({noise_multiplier})"
            " for any noise budget to be left for the update."
        )
    return (noise_multiplier**-2 - (2.0 * count_stddev) ** -2) ** -0.5


def effective_noise_multiplier(update_multiplier: float, count_stddev: float) -> float:
    r""":math:`z = (\sigma_\Delta^{-2} + (2\sigma_b)^{-2})^{-1/2}`, the inverse of :func:`update_noise_multiplier`;
    with no count noise (:math:`\sigma_b = \infty`, passed as ``math.inf``) it is :math:`\sigma_\Delta`."""
    if update_multiplier == 0.0 or count_stddev == 0.0:
        return 0.0
    return (update_multiplier**-2 + (2.0 * count_stddev) ** -2) ** -0.5


def next_clip_norm(clip_norm: float, unclipped_fraction: float, target_quantile: float, clip_lr: float) -> float:
    r"""Andrew et al.'s geometric step :math:`S \exp(-\eta_S (\tilde b - \gamma))`.

    Args:
        clip_norm: The round's :math:`S`.
        unclipped_fraction: :math:`\tilde b`, the noised fraction of clients whose update was not clipped.
        target_quantile: :math:`\gamma`, the fraction of updates that should fall within :math:`S`.
        clip_lr: :math:`\eta_S`.
    """
    return clip_norm * math.exp(-clip_lr * (unclipped_fraction - target_quantile))


__all__ = [
    "clip_update",
    "effective_noise_multiplier",
    "gaussian_noise",
    "l2_norm",
    "next_clip_norm",
    "update_noise_multiplier",
]
