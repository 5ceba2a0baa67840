"""Linear-kernel MMD and the δ (mean-feature) arithmetic of rFedAvg / rFedAvg+.

Source: Wang, Tong, Zhou, Zhang, Pan, Fan, Yang, "Distribution-Regularized Federated Learning on Non-IID Data",
ICDE 2023 (no arXiv id), Eq. (2), (5), Alg. 1, Alg. 2 and §VI-8. Conventions used throughout:

* δ_k = (1/L) Σ_i φ(x_{k,i}) is the mean feature of client k over L samples (all of them in the paper).
* The linear-kernel MMD between a batch and a target is the **squared** L2 distance ‖mean_i φ_i − t‖², no ½.
* δ̄_{−k} = (1/(n−1)) Σ_{j≠k} δ_j is the mean over the *other* clients (Alg. 2, line 18).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fed.checks import check_choice


def linear_mmd(features: Tensor, target: Tensor) -> Tensor:
    """‖mean_i φ_i − target‖², the squared linear-kernel MMD (Eq. 2 squared), differentiable in ``features``.

    Args:
        features: ``[B, ...]`` per-sample features; trailing dimensions are flattened.
        target: ``[d]`` mean feature of the other side (treated as a constant by the caller).
    """
    mean = features.flatten(1).mean(0)
    return (mean - target.to(mean)).pow(2).sum()


def leave_one_out_means(deltas: Tensor) -> Tensor:
    """Row k is δ̄_{−k} = (Σ_j δ_j − δ_k)/(n − 1), the mean of every other row (Alg. 2, line 18).

    Args:
        deltas: ``[n, d]`` with n ≥ 2, one δ per client.
    """
    if deltas.dim() != 2 or deltas.shape[0] < 2:
        raise ValueError(f"`deltas` must be [n, d] with n >= 2 clients, got shape {tuple(deltas.shape)}.")
    return (deltas.sum(0, keepdim=True) - deltas) / (deltas.shape[0] - 1)


def leave_one_out_spread(deltas: Tensor) -> Tensor:
    """Entry k is (1/(n−1)) Σ_{j≠k} ‖δ_j − δ̄_{−k}‖², the constant separating the two forms of r_k.

    For any φ̄: (1/(n−1)) Σ_{j≠k} ‖φ̄ − δ_j‖² = ‖φ̄ − δ̄_{−k}‖² + spread_k, so rFedAvg's r_k (Eq. 5) and the
    distance to the mean of the others have the same gradient; adding spread_k makes the logged value exact.
    """
    means = leave_one_out_means(deltas)
    n = deltas.shape[0]
    sq = (deltas.unsqueeze(0) - means.unsqueeze(1)).pow(2).sum(-1)  # [k, j] = ‖δ_j − δ̄_{−k}‖²
    return (sq.sum(1) - sq.diagonal()) / (n - 1)


def clip_rows(features: Tensor, max_norm: float) -> Tensor:
    """Scales each row (sample) to L2 norm ≤ ``max_norm``: φ_i · min(1, C/‖φ_i‖) (per-sample clipping, DP-SGD)."""
    flat = features.flatten(1)
    norms = flat.norm(dim=1, keepdim=True)
    return flat * (max_norm / norms.clamp_min(max_norm))


def gaussian_noise(dim: int, std: float, clip: float, count: int, generator: torch.Generator) -> Tensor:
    """Noise N(0, σ²C²I)/L added to a δ averaged over L = ``count`` samples (paper §VI-8, after Abadi et al.).

    Args:
        dim: Length d of δ.
        std: Noise multiplier σ (``dp_std``).
        clip: Per-sample clipping norm C (``dp_clip``).
        count: Number of samples L averaged into δ.
        generator: Seeded CPU generator, so the noise is reproducible.
    """
    return torch.randn(dim, generator=generator, dtype=torch.float32) * (std * clip / count)


def delta_bytes(variant: str, num_clients: int, dim: int, element_size: int = 4) -> tuple[int, int]:
    """Per-client (down, up) bytes for δ in one round, as rFedAvg's Table III counts them.

    rFedAvg (Alg. 1, line 3) broadcasts the whole vector (δ^1, ..., δ^n) of the n participating clients to every
    client, so each downloads n·d values; rFedAvg+ sends each client the one vector δ̄_{−k}. Both upload one δ.
    Table III (CNN, d = 512): 56160 B vs 2808 B with n = 20 (cross-silo) and 280800 B vs 2808 B with n = 100
    sampled clients (cross-device), i.e. a ratio of n; its 2808 B are 512·4 B plus 760 B of serialisation overhead,
    which is not counted here.

    Args:
        variant: ``"v1"`` or ``"plus"``.
        num_clients: n, the clients whose δ take part in the round.
        dim: d, the feature width.
        element_size: Bytes per value (4 for float32).
    """
    check_choice("variant", variant, ("v1", "plus"))
    per_delta = dim * element_size
    if variant == "v1":
        return num_clients * per_delta, per_delta
    return per_delta, per_delta


__all__ = ["clip_rows", "delta_bytes", "gaussian_noise", "leave_one_out_means", "leave_one_out_spread", "linear_mmd"]
