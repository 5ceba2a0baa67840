"""Bulyan: Krum's selection, repeated, followed by a coordinate-wise trimmed aggregate."""

from __future__ import annotations

from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregators.robust import RobustAggregator
from lightning_fed.checks import check_int
from lightning_fed.functional.robust import bulyan, bulyan_select, pairwise_squared_distances


class Bulyan(RobustAggregator):
    r"""Bulyan over Krum.

    El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed Learning in Byzantium", ICML 2018,
    arXiv:1802.07927, Algorithm 1 with Krum as the selection rule.

    1. Selection: :math:`\theta = n - 2f` client models are chosen one at a time, each by Krum
       (:class:`~lightning_fed.aggregators.Krum`, with :math:`f`) among the models not chosen yet.
    2. Aggregation, coordinate by coordinate, with :math:`\beta = \theta - 2f`:

    .. math::
        (w_g)_j \leftarrow \frac{1}{\beta} \sum_{k \in M_j} (w_k)_j

    where :math:`M_j` holds the :math:`\beta` selected models whose coordinate :math:`j` is closest to the selected
    models' median of coordinate :math:`j`.

    Conventions:
        * Requires :math:`n \ge 4f + 3` accepted clients (the paper's condition); a round with fewer is skipped (see
          :class:`RobustAggregator`). With :math:`f = 0` every model is selected and the result is the mean.
        * Ties: Krum keeps the earlier client of the round (and, once no neighbour is left to score, the first
          remaining one); among values equally far from the median the lower one is kept; the median of an even
          count is the mean of the two middle values.
        * Distances cover every aggregated float entry, in float64. The selected clients are in
          ``selected_clients``, in the order Krum chose them.

    Holds the round's updates on the CPU (``n x model size``) and adds an ``n x n`` float64 distance matrix
    (``n^2 d`` multiply-adds); the selection reuses it. See :class:`RobustAggregator`.

    Args:
        num_byzantine: :math:`f`, the number of Byzantine clients a round may hold.
    """

    def __init__(self, num_byzantine: int = 1) -> None:
        super().__init__()
        self.num_byzantine = check_int("num_byzantine", num_byzantine, minimum=0)

    @override
    def minimum_clients(self, num_sampled: int) -> int:
        return 4 * self.num_byzantine + 3

    @override
    def requirement(self) -> str:
        return "n >= 4f + 3"

    @override
    def aggregate(self, rows: Tensor, center: Tensor) -> Tensor:
        distances = pairwise_squared_distances(rows, center)
        self._chosen_rows = bulyan_select(distances, self.num_byzantine)
        return bulyan(rows, self.num_byzantine, distances=distances)

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_byzantine={self.num_byzantine})"


__all__ = ["Bulyan"]
