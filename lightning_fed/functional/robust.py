r"""Byzantine-robust aggregation rules on a stacked ``[n, d]`` tensor of flattened client updates.

Every rule here is unweighted and translation-equivariant (adding a vector to every row adds it to the result), so
the rows may be the clients' models :math:`w_k` or their changes :math:`w_k - w_g` alike. Results are float64
vectors of length ``d``; selections are row indices in ascending order of preference, ties broken by the lower row.

* Coordinate-wise median and trimmed mean: Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed
  Learning: Towards Optimal Statistical Rates", ICML 2018, arXiv:1803.01498.
* Krum and Multi-Krum: Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries: Byzantine
  Tolerant Gradient Descent", NeurIPS 2017, arXiv:1703.02757.
* Bulyan: El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed Learning in Byzantium", ICML 2018,
  arXiv:1802.07927.

Coordinate-wise rules work on column blocks of about ``BLOCK_ELEMENTS`` entries, so that their temporaries (sorted
copies, indices) stay small beside the ``[n, d]`` input however large the model is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

BLOCK_ELEMENTS = 1 << 22
"""Entries of the input processed at once by the coordinate-wise rules (4 Mi: 16 MiB of float32)."""


def _column_blocks(updates: Tensor) -> list[slice]:
    n, d = updates.shape
    width = max(1, BLOCK_ELEMENTS // max(n, 1))
    return [slice(start, min(start + width, d)) for start in range(0, d, width)]


def _blockwise(updates: Tensor, rows: Tensor | None, rule: Callable[[Tensor], Tensor]) -> Tensor:
    """``rule`` applied to column blocks of ``updates[rows]`` (all rows when ``None``), as one float64 vector.

    The blocks keep the input's dtype: sorting is exact in any dtype and faster in float32, and each rule casts to
    float64 where it adds values up.
    """
    _check_updates(updates)
    result = torch.empty(updates.shape[1], dtype=torch.float64, device=updates.device)
    for block in _column_blocks(updates):
        values = updates[:, block] if rows is None else updates[rows, block]
        result[block] = rule(values)
    return result


def _check_updates(updates: Tensor) -> None:
    if updates.dim() != 2 or updates.shape[0] == 0:
        raise ValueError(
            f"`updates` must be a non-empty [n, d] tensor of flattened updates; got {tuple(updates.shape)}."
        )
    if not updates.is_floating_point():
        raise TypeError(f"`updates` must be floating point; got {updates.dtype}.")


def _median_rows(values: Tensor) -> Tensor:
    # The mean of the two middle values for even n (NumPy's convention): torch.median returns the lower one, which
    # would bias the estimate towards -inf and make it depend on the sign convention of the updates.
    ordered = values.sort(dim=0).values
    n = ordered.shape[0]
    return 0.5 * (ordered[(n - 1) // 2].double() + ordered[n // 2].double())


def coordinate_median(updates: Tensor) -> Tensor:
    r"""Coordinate-wise median: :math:`g_j = \operatorname{med}\{x_{1j}, \dots, x_{nj}\}` (Yin et al. 2018).

    For even :math:`n` the median of a coordinate is the mean of its two middle values.

    Args:
        updates: ``[n, d]`` rows :math:`x_i`.

    Returns:
        The ``d`` medians, float64.
    """
    return _blockwise(updates, None, _median_rows)


def trimmed_mean(updates: Tensor, num_trimmed: int) -> Tensor:
    r"""Coordinate-wise trimmed mean (Yin et al. 2018).

    .. math::
        g_j = \frac{1}{n - 2k} \sum_{i = k + 1}^{n - k} x_{(i) j}

    with :math:`x_{(1) j} \le \dots \le x_{(n) j}` the sorted values of coordinate :math:`j`: the :math:`k` largest
    and :math:`k` smallest values of each coordinate are dropped and the rest averaged. The paper's
    :math:`\beta`-trimmed mean is :math:`k = \lfloor \beta n \rfloor`; ``k = 0`` is the plain mean.

    Args:
        updates: ``[n, d]`` rows :math:`x_i`.
        num_trimmed: :math:`k`, the values dropped at each end; ``2k < n``.

    Returns:
        The ``d`` trimmed means, float64.

    Raises:
        ValueError: If ``2 * num_trimmed >= n`` or ``num_trimmed < 0``.
    """
    _check_updates(updates)
    n = updates.shape[0]
    if num_trimmed < 0 or 2 * num_trimmed >= n:
        raise ValueError(f"A trimmed mean of {n} rows can drop k < n/2 at each end; got num_trimmed={num_trimmed}.")
    return _blockwise(
        updates, None, lambda values: values.sort(dim=0).values[num_trimmed : n - num_trimmed].double().mean(0)
    )


def mean_of_rows(updates: Tensor, rows: Tensor) -> Tensor:
    """The unweighted mean of ``updates[rows]``, float64 (accumulated without copying the selected rows at once)."""
    return _blockwise(updates, rows, lambda values: values.double().mean(0))


def pairwise_squared_distances(updates: Tensor, center: Tensor | None = None) -> Tensor:
    r""":math:`D_{ij} = \lVert x_i - x_j \rVert_2^2` for every pair of rows, float64 ``[n, n]``.

    Computed from the Gram matrix of the centred rows, block by block in float64 (``n * n * d`` multiply-adds, the
    cost of Krum and Bulyan). Centring on a point near the rows (the global model, when the rows are local models)
    keeps the rows' norms comparable to their distances, so the Gram identity loses no precision; the distances do
    not depend on the centre.

    Args:
        updates: ``[n, d]`` rows :math:`x_i`.
        center: A ``[d]`` vector subtracted from every row first (``None``: none).
    """
    _check_updates(updates)
    n = updates.shape[0]
    gram = torch.zeros(n, n, dtype=torch.float64, device=updates.device)
    for block in _column_blocks(updates):
        values = updates[:, block].double()
        if center is not None:
            values -= center[block].double()
        gram.addmm_(values, values.T)
    norms = gram.diagonal()
    distances = (norms[:, None] + norms[None, :] - 2.0 * gram).clamp_(min=0.0)
    distances.fill_diagonal_(0.0)
    return distances


def krum_scores(distances: Tensor, num_byzantine: int) -> Tensor:
    r"""Krum's score of each row (Blanchard et al. 2017): the sum of its squared distances to its closest neighbours.

    .. math::
        s(i) = \sum_{i \to j} \lVert x_i - x_j \rVert^2

    where :math:`i \to j` ranges over the :math:`n - f - 2` rows :math:`j \ne i` closest to :math:`x_i`
    (:math:`n` rows, :math:`f` of them possibly Byzantine; at least 0 neighbours).

    Args:
        distances: ``[n, n]`` squared distances (:func:`pairwise_squared_distances`).
        num_byzantine: :math:`f`.

    Returns:
        The ``n`` scores, float64.
    """
    n = distances.shape[0]
    neighbours = max(n - num_byzantine - 2, 0)
    # Each row's own zero distance sorts first (distances are >= 0): skip it, then sum the closest neighbours.
    masked = distances.double().clone()
    masked.fill_diagonal_(-1.0)
    ordered = masked.sort(dim=1).values[:, 1 : 1 + neighbours]
    return ordered.sum(dim=1)


def _lowest(scores: Tensor, count: int) -> Tensor:
    """Indices of the ``count`` lowest scores, lowest first; equal scores keep row order (a stable sort)."""
    return torch.sort(scores, stable=True).indices[:count]


def multi_krum_select(distances: Tensor, num_byzantine: int, num_selected: int) -> Tensor:
    r"""Multi-Krum's selection (Blanchard et al. 2017): the ``num_selected`` rows with the lowest Krum scores.

    ``num_selected = 1`` is Krum's single choice :math:`\arg\min_i s(i)`. Scores are computed once over all rows.

    Returns:
        Row indices, best score first (ties: the lower row).
    """
    n = distances.shape[0]
    if not 1 <= num_selected <= n:
        raise ValueError(f"Multi-Krum selects between 1 and n = {n} rows; got num_selected={num_selected}.")
    return _lowest(krum_scores(distances, num_byzantine), num_selected)


def bulyan_select(distances: Tensor, num_byzantine: int) -> Tensor:
    r"""Bulyan's first stage (El Mhamdi et al. 2018): :math:`\theta = n - 2f` rows chosen by Krum, one at a time.

    Starting from all rows, Krum picks the row with the lowest score among the rows still available, that row is
    moved to the selection, and Krum is applied again to the rest (its scores recomputed on the smaller set,
    still with :math:`f`), until :math:`\theta` rows are selected.

    Returns:
        Row indices in the order they were selected.
    """
    n = distances.shape[0]
    theta = n - 2 * num_byzantine
    if theta < 1:
        raise ValueError(f"Bulyan selects n - 2f rows: n = {n} rows allow f < {(n + 1) // 2}; got f={num_byzantine}.")
    remaining = torch.arange(n, device=distances.device)
    selected: list[Tensor] = []
    for _ in range(theta):
        scores = krum_scores(distances[remaining][:, remaining], num_byzantine)
        best = int(_lowest(scores, 1))
        selected.append(remaining[best])
        remaining = torch.cat([remaining[:best], remaining[best + 1 :]])
    return torch.stack(selected)


def _closest_to_median_mean(values: Tensor, count: int) -> Tensor:
    # Values are sorted first, so that among values equally far from the median the stable sort keeps the lower
    # one: the result is deterministic and does not depend on the order of the rows.
    ordered = values.sort(dim=0).values.double()
    distance = (ordered - _median_rows(ordered)).abs()
    nearest = torch.sort(distance, dim=0, stable=True).indices[:count]
    return ordered.gather(0, nearest).mean(0)


def bulyan(updates: Tensor, num_byzantine: int, distances: Tensor | None = None) -> Tensor:
    r"""Bulyan (El Mhamdi et al. 2018): Krum's recursive selection, then a coordinate-wise trimmed aggregate.

    With :math:`S` the :math:`\theta = n - 2f` rows of :func:`bulyan_select` and :math:`\beta = \theta - 2f`:

    .. math::
        g_j = \frac{1}{\beta} \sum_{x \in M_j} x_j

    where :math:`M_j` holds the :math:`\beta` rows of :math:`S` whose coordinate :math:`j` is closest to the median of
    coordinate :math:`j` over :math:`S` (ties: the lower value). The paper requires :math:`n \ge 4f + 3`.

    Args:
        updates: ``[n, d]`` rows.
        num_byzantine: :math:`f`.
        distances: The rows' squared distances, if already computed.

    Returns:
        The ``d`` aggregated coordinates, float64.

    Raises:
        ValueError: If ``n < 4f + 3``.
    """
    _check_updates(updates)
    n = updates.shape[0]
    if n < 4 * num_byzantine + 3:
        raise ValueError(f"Bulyan needs n >= 4f + 3 rows: f={num_byzantine} needs {4 * num_byzantine + 3}, got {n}.")
    if distances is None:
        distances = pairwise_squared_distances(updates)
    selected = bulyan_select(distances, num_byzantine)
    beta = selected.numel() - 2 * num_byzantine
    return _blockwise(updates, selected, lambda values: _closest_to_median_mean(values, beta))


__all__ = [
    "BLOCK_ELEMENTS",
    "bulyan",
    "bulyan_select",
    "coordinate_median",
    "krum_scores",
    "mean_of_rows",
    "multi_krum_select",
    "pairwise_squared_distances",
    "trimmed_mean",
]
