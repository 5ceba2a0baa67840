r"""FedGG's model-cosine loss, its closed-form gradient and the adaptive weight, on flattened parameter vectors.

A model is one vector here: :func:`flatten` concatenates its trainable tensors (in a fixed name order), so cosines
and norms are over *all* parameters at once, never per layer; :func:`unflatten` maps a vector back to named views.
Working on one flat vector costs a handful of kernels per local step instead of a few per parameter tensor.

The cosine is made total: ``cos(g, d) := 0`` when ``‖g‖ = 0`` or ``‖d‖ = 0``, and the gradient of
``λ (1 − cos(g, d))`` is then 0. Nothing here branches on a tensor value in Python, so no host-device sync occurs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor


def flatten(tensors: Iterable[Tensor]) -> Tensor:
    """The concatenation of ``tensors``, each flattened (differentiable)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(vector: Tensor, like: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Views of ``vector`` shaped as the tensors of ``like``, in its order (the inverse of :func:`flatten`)."""
    chunks = torch.split(vector, [t.numel() for t in like.values()])
    return {name: chunk.view_as(t) for (name, t), chunk in zip(like.items(), chunks)}


def _safe(norm: Tensor) -> Tensor:
    return torch.where(norm > 0, norm, torch.ones_like(norm))


def safe_cosine(g: Tensor, d: Tensor) -> Tensor:
    r"""cos(g, d) = ⟨g, d⟩ / (‖g‖ ‖d‖) for 1-D tensors, defined as 0 when either is zero.

    Differentiable in ``d`` wherever ``d ≠ 0``.
    """
    g_norm, d_norm = torch.linalg.vector_norm(g), torch.linalg.vector_norm(d)
    cosine = torch.dot(g, d) / (_safe(g_norm) * _safe(d_norm))
    return torch.where((g_norm > 0) & (d_norm > 0), cosine, torch.zeros_like(cosine))


def cosine_loss(g: Tensor, d: Tensor, lam: Tensor | float) -> Tensor:
    r"""The model-cosine loss :math:`λ (1 − \cos(g, d))` (FedGG, Eq. 8-9), λ taken as a constant."""
    return lam * (1 - safe_cosine(g, d))


def cosine_loss_gradient(g: Tensor, d: Tensor, lam: Tensor | float) -> Tensor:
    r"""The gradient of :math:`λ (1 − \cos(g, d))` with respect to d (and so to w, as d = w − w^r), λ constant:

    .. math::
        -λ \Big( \frac{g}{‖g‖\,‖d‖} - \cos(g, d) \frac{d}{‖d‖^2} \Big)
        = -\frac{λ}{‖d‖} \Big( \hat g - \cos(g, d)\, \hat d \Big)

    It is orthogonal to d and its norm is λ sin θ / ‖d‖. It is 0 when ``‖g‖ = 0`` or ``‖d‖ = 0``.

    Note:
        The paper's Eq. (11) and (13) print ``+ cos · d̂`` inside the bracket; differentiating its Eq. (8) gives
        ``− cos · d̂`` (the sign used here and checked against autograd in the tests).
    """
    g_norm, d_norm = torch.linalg.vector_norm(g), torch.linalg.vector_norm(d)
    valid = (g_norm > 0) & (d_norm > 0)
    g_safe, d_safe = _safe(g_norm), _safe(d_norm)
    cosine = torch.dot(g, d) / (g_safe * d_safe)
    scale = torch.where(valid, lam / d_safe, torch.zeros_like(d_norm))
    return (scale * cosine / d_safe) * d - (scale / g_safe) * g


def adaptive_weight(mu: float, w_prev: Tensor, w_global: Tensor, w_prev2: Tensor) -> Tensor:
    r"""FedGG's adaptive weight (Eq. 12), detached: :math:`λ_m = μ\,‖w(m−1) − w^r‖\,‖w(m−1) − w(m−2)‖`.

    Args:
        mu: The coefficient μ.
        w_prev: The local model before step m, w(m−1) (the current parameters), flattened.
        w_global: The round's global model w^r, flattened.
        w_prev2: The local model before step m−1, w(m−2), flattened.
    """
    with torch.no_grad():
        return mu * torch.linalg.vector_norm(w_prev - w_global) * torch.linalg.vector_norm(w_prev - w_prev2)
