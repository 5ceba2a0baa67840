r"""Weight divergence between a federated model and its centralised SGD twin.

Zhao, Li, Lai, Suda, Civin, Chandra, "Federated Learning with Non-IID Data", arXiv:1806.00582, §3, Eq. (1):

.. math::
    \text{weight divergence} = \lVert \mathbf{w}^{\text{FedAvg}} - \mathbf{w}^{\text{SGD}} \rVert
    \,/\, \lVert \mathbf{w}^{\text{SGD}} \rVert

with the Euclidean (Frobenius) norm over all entries of a layer's weight tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor


def _pair(a: Mapping[str, Tensor], b: Mapping[str, Tensor], name: str) -> tuple[Tensor, Tensor]:
    if name not in a or name not in b:
        side = "`a`" if name not in a else "`b`"
        raise KeyError(f"Tensor {name!r} is missing from {side}: pass `names` that both state dicts hold.")
    x, y = a[name], b[name]
    if x.shape != y.shape:
        raise ValueError(f"Tensor {name!r} has shape {tuple(x.shape)} in `a` but {tuple(y.shape)} in `b`.")
    # float64 on the CPU: the differences of nearly equal models are tiny and must not round to zero.
    return x.detach().to("cpu", torch.float64), y.detach().to("cpu", torch.float64)


def _ratio(diff_sq: float, ref_sq: float) -> float:
    """``sqrt(diff_sq / ref_sq)``; a zero reference gives 0 for identical tensors and ``inf`` otherwise."""
    if ref_sq == 0.0:
        return 0.0 if diff_sq == 0.0 else math.inf
    return math.sqrt(diff_sq / ref_sq)


def weight_divergence(a: Mapping[str, Tensor], b: Mapping[str, Tensor], names: Iterable[str]) -> dict[str, float]:
    r"""Per-tensor weight divergence :math:`\lVert a_n - b_n \rVert_2 / \lVert b_n \rVert_2` (Zhao et al., Eq. (1)).

    Args:
        a: The federated model's state (:math:`\mathbf{w}^{\text{FedAvg}}`).
        b: The reference (centralised SGD) state (:math:`\mathbf{w}^{\text{SGD}}`); it is the denominator.
        names: The tensors to compare, e.g. the trainable parameter names.

    Returns:
        ``{name: divergence}``. A reference tensor of norm 0 gives 0 if ``a`` equals it, else ``inf``.

    Raises:
        KeyError: If a name is missing from either state.
        ValueError: If a tensor's shapes differ.

    Example:
        >>> weight_divergence({"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([0.0, 4.0])}, ["w"])
        {'w': 0.75}
    """
    result: dict[str, float] = {}
    for name in names:
        x, y = _pair(a, b, name)
        result[name] = _ratio(float((x - y).square().sum()), float(y.square().sum()))
    return result


def total_weight_divergence(a: Mapping[str, Tensor], b: Mapping[str, Tensor], names: Iterable[str]) -> float:
    r"""Eq. (1) with all ``names`` flattened into one vector: :math:`\sqrt{\sum_n \lVert a_n - b_n \rVert^2 /
    \sum_n \lVert b_n \rVert^2}`.

    Args:
        a, b, names: As in :func:`weight_divergence`.

    Returns:
        The whole-model divergence (0 or ``inf`` for a zero reference, as in :func:`weight_divergence`).
    """
    diff_sq = ref_sq = 0.0
    for name in names:
        x, y = _pair(a, b, name)
        diff_sq += float((x - y).square().sum())
        ref_sq += float(y.square().sum())
    return _ratio(diff_sq, ref_sq)


__all__ = ["total_weight_divergence", "weight_divergence"]
