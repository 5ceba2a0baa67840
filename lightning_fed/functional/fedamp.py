r"""FedAMP's and HeurFedAMP's collaboration weights :math:`\xi` and personalised cloud models :math:`u_i`.

Paper: Y. Huang, L. Chu, Z. Zhou, L. Wang, J. Liu, J. Pei, Y. Zhang, "Personalized Cross-Silo Federated Learning on
Non-IID Data", AAAI 2021, arXiv:2007.03797 (Eqs. 5, 7 and 8).

Every quantity here is computed in float64 on the CPU: a squared distance summed over a million float32 entries
loses digits, and :math:`e^{-d/\sigma}` underflows float32 at :math:`d/\sigma \approx 104` but float64 only at
about 745. Weights that are too small for the model's dtype are not silently dropped: see :func:`fedamp_weights`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

FLOAT64_RESOLUTION = torch.finfo(torch.float64).eps


class FedAMPWeightWarning(UserWarning):
    """The collaboration weights had to be clipped, or are too small to let clients collaborate."""


def _stacked(states: Sequence[Mapping[str, Tensor]], key: str) -> Tensor:
    """One row per model: the entry ``key`` flattened, in float64 on the CPU."""
    return torch.stack([state[key].detach().reshape(-1).to("cpu", torch.float64) for state in states])


def _check_states(states: Sequence[Mapping[str, Tensor]], keys: Sequence[str]) -> None:
    if len(states) == 0:
        raise ValueError("`states` must hold at least one model.")
    if len(keys) == 0:
        raise ValueError("`keys` must name at least one parameter to compare the models on.")
    missing = [(i, key) for i, state in enumerate(states) for key in keys if key not in state]
    if missing:
        raise KeyError(f"`states` lack entries named in `keys`, e.g. model {missing[0][0]} has no {missing[0][1]!r}.")


def pairwise_squared_distances(states: Sequence[Mapping[str, Tensor]], keys: Sequence[str]) -> Tensor:
    r"""The matrix :math:`D_{ij} = \lVert w_i - w_j \rVert_2^2` over the entries ``keys`` of every model.

    The differences are formed entry by entry in float64 (not as :math:`\lVert a\rVert^2 + \lVert b\rVert^2 -
    2a^\top b`, which cancels catastrophically for close models), one parameter tensor at a time so that memory
    stays at one stacked tensor.

    Args:
        states: The models :math:`w_1, \dots, w_m` (name to tensor).
        keys: The entries to compare on (FedAMP: the trainable parameters).

    Returns:
        A symmetric ``(m, m)`` float64 tensor with an exactly zero diagonal.
    """
    _check_states(states, keys)
    total = torch.zeros(len(states), len(states), dtype=torch.float64)
    for key in keys:
        rows = _stacked(states, key)
        total += torch.cdist(rows, rows, compute_mode="donot_use_mm_for_euclid_dist").square()
    return total


def pairwise_cosine_similarity(states: Sequence[Mapping[str, Tensor]], keys: Sequence[str]) -> Tensor:
    r"""The matrix :math:`C_{ij} = \cos(w_i, w_j) = w_i^\top w_j / (\lVert w_i\rVert \lVert w_j\rVert)` over ``keys``.

    A model that is exactly zero has no direction; its cosine with every model, itself included, is 0.

    Args:
        states: The models :math:`w_1, \dots, w_m`.
        keys: The entries that make up each flattened model.

    Returns:
        A symmetric ``(m, m)`` float64 tensor with values in [-1, 1].
    """
    _check_states(states, keys)
    gram = torch.zeros(len(states), len(states), dtype=torch.float64)
    for key in keys:
        rows = _stacked(states, key)
        gram += rows @ rows.T
    norms = gram.diagonal().clamp_min(0).sqrt()
    scale = torch.outer(norms, norms)
    cosine = torch.where(scale > 0, gram / scale.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(gram))
    return cosine.clamp(-1.0, 1.0)


def fedamp_log_weights(squared_distances: Tensor, alpha_k: float, sigma: float) -> Tensor:
    r""":math:`\log \xi_{ij} = \log \alpha_k - \log \sigma - D_{ij}/\sigma` for :math:`j \ne i` (Eq. 7 with
    :math:`A'(x) = e^{-x/\sigma}/\sigma`), and :math:`-\infty` on the diagonal.

    Exact for any distance: nothing underflows in log space, so a caller can always tell how small a weight is.
    """
    log_weights = math.log(alpha_k) - math.log(sigma) - squared_distances.to(torch.float64) / sigma
    return log_weights.fill_diagonal_(-math.inf)


def fedamp_weights(
    squared_distances: Tensor, alpha_k: float, sigma: float, resolution: float = FLOAT64_RESOLUTION
) -> Tensor:
    r"""FedAMP's message weights (Eq. 7): :math:`\xi_{ij} = \alpha_k A'(D_{ij})` for :math:`j \ne i` and
    :math:`\xi_{ii} = 1 - \sum_{j \ne i} \xi_{ij}`, with :math:`A(x) = 1 - e^{-x/\sigma}`.

    Two cases the paper leaves to "a small :math:`\alpha_k`":

    - :math:`\xi_{ii} < 0` (close models with :math:`\alpha_k (m-1)/\sigma > 1`): the row is no convex
      combination. :math:`\xi_{ii}` is clipped to 0, the other weights of the row are divided by their sum, and a
      :class:`FedAMPWeightWarning` says which of ``alpha_k`` / ``sigma`` to change.
    - Every :math:`\xi_{ij}, j \ne i`, of a row is below ``resolution`` (deep nets, where :math:`D_{ij}/\sigma`
      is in the hundreds): :math:`u_i` equals :math:`w_i` to within rounding and the client no longer
      collaborates. The weights are kept as the formula gives them (computed from log space, so a float64 weight
      is zero only below about :math:`10^{-308}`), and a :class:`FedAMPWeightWarning` reports the largest weight's
      exponent and the distance that caused it, so collaboration never vanishes silently.

    Args:
        squared_distances: ``(m, m)`` matrix :math:`D_{ij} = \lVert w_i - w_j \rVert^2`.
        alpha_k: The step size :math:`\alpha_k > 0` of the attention step.
        sigma: The scale :math:`\sigma > 0` of :math:`A`.
        resolution: Off-diagonal row sums below this count as "no collaboration"; pass the model dtype's machine
            epsilon (float32: 1.2e-7), below which :math:`u_i` rounds to :math:`w_i`.

    Returns:
        ``(m, m)`` float64 weights: non-negative, each row summing to 1.
    """
    _check_square(squared_distances, "squared_distances")
    log_weights = fedamp_log_weights(squared_distances, alpha_k, sigma)
    weights = log_weights.exp()
    others = weights.sum(dim=1)
    # At the documented safe bound alpha_k = sigma / (m - 1) with identical models (round 1), the row sum is 1 up
    # to the rounding of m - 1 terms; that is a zero self-weight, not a negative one.
    rounding = max(len(others), 1) * torch.finfo(torch.float64).eps
    negative = others > 1.0 + rounding
    if negative.any():
        rows = negative.nonzero().flatten().tolist()
        warnings.warn(
            f"FedAMP: the self-weight xi_ii = 1 - sum_j alpha_k A'(||w_i - w_j||^2) is negative for clients {rows}"
            f" (down to {float(1.0 - others.max()):.3g}); it was clipped to 0 and the row renormalised, so these"
            f" clients' cloud models leave out their own model. Lower `alpha_k` (alpha_k <= sigma / (m - 1) ="
            f" {sigma / max(len(others) - 1, 1):.3g} keeps xi_ii >= 0 for any distances) or raise `sigma`.",
            FedAMPWeightWarning,
            stacklevel=2,
        )
        weights[negative] = weights[negative] / others[negative].unsqueeze(1)
    weights += torch.diag(torch.where(negative, torch.zeros_like(others), (1.0 - others).clamp_min(0.0)))
    _warn_isolated(log_weights, squared_distances, sigma, resolution)
    return weights


def _warn_isolated(log_weights: Tensor, squared_distances: Tensor, sigma: float, resolution: float) -> None:
    """Warns when some rows' off-diagonal weights add up to less than ``resolution``."""
    if log_weights.shape[0] < 2:
        return
    row_log_sums = torch.logsumexp(log_weights, dim=1)
    isolated = row_log_sums < math.log(resolution)
    if not isolated.any():
        return
    rows = isolated.nonzero().flatten().tolist()
    exponent = float(row_log_sums[isolated].max()) / math.log(10)
    off_diagonal = squared_distances.to(torch.float64) + torch.diag(torch.full_like(row_log_sums, math.inf))
    nearest = float(off_diagonal[isolated].min())
    warnings.warn(
        f"FedAMP: clients {rows} do not collaborate: their weights xi_ij (j != i) add up to at most"
        f" 1e{exponent:.1f}, below the model's resolution {resolution:.2g}, so u_i = w_i. The nearest squared"
        f" distance ||w_i - w_j||^2 is {nearest:.4g} against sigma = {sigma:.4g}. Raise `sigma` to the scale of"
        f" the squared distances between client models, or use HeurFedAMP, whose cosine weights do not vanish"
        f" with the model size.",
        FedAMPWeightWarning,
        stacklevel=3,
    )


def heurfedamp_weights(cosine: Tensor, sigma: float, self_weight: float) -> Tensor:
    r"""HeurFedAMP's message weights (Eq. 8): :math:`\xi_{ii}` is the hyperparameter ``self_weight`` and
    :math:`\xi_{ij} = (1 - \xi_{ii})\, \mathrm{softmax}_{j \ne i}(\sigma \cos(w_i, w_j))`.

    With a single model there is nobody to attend to and :math:`\xi = [1]`.

    Args:
        cosine: ``(m, m)`` matrix of cosine similarities between the models.
        sigma: The scaling :math:`\sigma \ge 0` of the cosines (0 spreads the weight evenly).
        self_weight: :math:`\xi_{ii} \in [0, 1]`.

    Returns:
        ``(m, m)`` float64 weights: non-negative, each row summing to 1.
    """
    _check_square(cosine, "cosine")
    size = cosine.shape[0]
    if size == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    logits = (sigma * cosine.to(torch.float64)).fill_diagonal_(-math.inf)
    weights = (1.0 - self_weight) * torch.softmax(logits, dim=1)
    return weights + self_weight * torch.eye(size, dtype=torch.float64)


def personalized_cloud_models(
    xi: Tensor, states: Sequence[Mapping[str, Tensor]], rows: Sequence[int]
) -> list[dict[str, Tensor]]:
    r"""The personalised cloud models :math:`u_i = \sum_j \xi_{ij} w_j` (Eq. 5) for the clients ``rows``.

    Floating-point entries (parameters and, e.g., BatchNorm statistics) are combined in float64 and cast back to
    their dtype; integer entries (``num_batches_tracked``) cannot be averaged and are :math:`w_i`'s own.

    Args:
        xi: ``(m, m)`` weights, row ``i`` for client ``i``.
        states: The models :math:`w_1, \dots, w_m`, on the CPU, all with the same entries.
        rows: Indices into ``states`` of the clients to build :math:`u_i` for.

    Returns:
        One state dict per entry of ``rows``, in that order, on the CPU.
    """
    _check_square(xi, "xi")
    if xi.shape[0] != len(states):
        raise ValueError(f"`xi` is {tuple(xi.shape)} but {len(states)} models were given; it needs one row per model.")
    rows = list(rows)
    mixing = xi.to(torch.float64)[rows]
    clouds: list[dict[str, Tensor]] = [{} for _ in rows]
    for key, reference in states[0].items():
        if reference.is_floating_point():
            combined = mixing @ _stacked(states, key)
            for cloud, values in zip(clouds, combined):
                cloud[key] = values.reshape(reference.shape).to(reference.dtype)
        else:
            for cloud, row in zip(clouds, rows):
                cloud[key] = states[row][key].detach().to("cpu", copy=True)
    return clouds


def _check_square(matrix: Tensor, name: str) -> None:
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ValueError(f"`{name}` must be a non-empty square matrix, got shape {tuple(matrix.shape)}.")
    if not torch.isfinite(matrix).all():
        raise ValueError(f"`{name}` holds NaN or Inf; the client models it was computed from are not finite.")


__all__ = [
    "FedAMPWeightWarning",
    "fedamp_log_weights",
    "fedamp_weights",
    "heurfedamp_weights",
    "pairwise_cosine_similarity",
    "pairwise_squared_distances",
    "personalized_cloud_models",
]
