"""Krum and Multi-Krum: keep the updates closest to their neighbours, drop the ones far from the rest."""

from __future__ import annotations

from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregators.robust import RobustAggregator
from lightning_fed.checks import check_int
from lightning_fed.functional.robust import mean_of_rows, multi_krum_select, pairwise_squared_distances


class MultiKrum(RobustAggregator):
    r"""Multi-Krum: the mean of the :math:`m` client models with the lowest Krum scores.

    Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent", NeurIPS 2017, arXiv:1703.02757.

    .. math::
        s(k) = \sum_{k \to j} \lVert w_k - w_j \rVert_2^2, \qquad
        w_g \leftarrow \frac{1}{m} \sum_{k \in M} w_k

    where :math:`k \to j` ranges over the :math:`n - f - 2` clients closest to client :math:`k` among the round's
    :math:`n` accepted ones, and :math:`M` holds the :math:`m` clients with the lowest scores (ties: the earlier
    client of the round). The paper requires :math:`n > 2f + 2`.

    Conventions:
        * Distances cover every aggregated float entry (parameters and BatchNorm statistics), measured between the
          flattened models in float64. The scores are computed once over all :math:`n` clients.
        * ``num_selected=None`` takes :math:`m = n - f`, every client the rule can trust; :math:`m = 1` is Krum.
        * A round needs :math:`n \ge \max(2f + 3, m)` accepted clients; otherwise it is skipped (see
          :class:`RobustAggregator`). The chosen clients are in ``selected_clients``.

    Holds the round's updates on the CPU (``n x model size``) and adds an ``n x n`` float64 distance matrix costing
    ``n^2 d`` multiply-adds; see :class:`RobustAggregator`.

    Args:
        num_byzantine: :math:`f`, the number of Byzantine clients a round may hold.
        num_selected: :math:`m`; ``None`` uses :math:`n - f`.
    """

    def __init__(self, num_byzantine: int = 1, num_selected: int | None = None) -> None:
        super().__init__()
        self.num_byzantine = check_int("num_byzantine", num_byzantine, minimum=0)
        self.num_selected = check_int("num_selected", num_selected, minimum=1, allow_none=True)

    @override
    def minimum_clients(self, num_sampled: int) -> int:
        return max(2 * self.num_byzantine + 3, self.num_selected or 1)

    @override
    def requirement(self) -> str:
        if self.num_selected is not None and self.num_selected > 2 * self.num_byzantine + 3:
            return "n >= num_selected"
        return "n > 2f + 2"

    @override
    def setting_to_lower(self) -> str:
        return "`num_selected`" if self.requirement() == "n >= num_selected" else "`num_byzantine`"

    @override
    def aggregate(self, rows: Tensor, center: Tensor) -> Tensor:
        selected = self.num_selected if self.num_selected is not None else rows.shape[0] - self.num_byzantine
        distances = pairwise_squared_distances(rows, center)
        self._chosen_rows = multi_krum_select(distances, self.num_byzantine, selected)
        return mean_of_rows(rows, self._chosen_rows)

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_byzantine={self.num_byzantine}, num_selected={self.num_selected})"


class Krum(MultiKrum):
    r"""Krum: the client model with the lowest Krum score becomes the global model.

    Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent", NeurIPS 2017, arXiv:1703.02757.

    .. math::
        w_g \leftarrow w_{k^*}, \qquad k^* = \arg\min_k \sum_{k \to j} \lVert w_k - w_j \rVert_2^2

    with :math:`k \to j` over the :math:`n - f - 2` clients closest to client :math:`k` (ties: the earlier client of
    the round); the paper requires :math:`n > 2f + 2`. :class:`MultiKrum` with ``num_selected=1``: see it for the
    conventions and :class:`RobustAggregator` for the memory cost.

    Args:
        num_byzantine: :math:`f`, the number of Byzantine clients a round may hold.
    """

    def __init__(self, num_byzantine: int = 1) -> None:
        super().__init__(num_byzantine, num_selected=1)

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_byzantine={self.num_byzantine})"


__all__ = ["Krum", "MultiKrum"]
