"""Coordinate-wise robust rules: the median and the trimmed mean of every entry over the round's clients."""

from __future__ import annotations

import math

from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregators.robust import RobustAggregator
from lightning_fed.checks import check_real
from lightning_fed.functional.robust import coordinate_median, trimmed_mean


class FedMedian(RobustAggregator):
    r"""Coordinate-wise median of the clients' models.

    Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates",
    ICML 2018, arXiv:1803.01498.

    .. math::
        (w_g)_j \leftarrow \operatorname{med}\{(w_k)_j : k \in S\} \quad \text{for every coordinate } j

    over the round's accepted clients :math:`S`, unweighted; for an even :math:`|S|` the median of a coordinate is the
    mean of its two middle values. Tolerates any minority of Byzantine clients in each coordinate (breakdown point
    1/2), at the price of a higher variance than the mean when every client is honest.

    Holds the round's updates on the CPU (``n x model size``); see :class:`RobustAggregator` for that, the
    conventions shared by every robust rule and how they run under ddp.
    """

    @override
    def aggregate(self, rows: Tensor, center: Tensor) -> Tensor:
        return coordinate_median(rows)

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class TrimmedMean(RobustAggregator):
    r"""Coordinate-wise :math:`\beta`-trimmed mean of the clients' models.

    Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates",
    ICML 2018, arXiv:1803.01498.

    .. math::
        (w_g)_j \leftarrow \frac{1}{|S| - 2k} \sum_{i = k + 1}^{|S| - k} (w_{(i)})_j,
        \qquad k = \lfloor \beta m \rfloor

    where :math:`(w_{(1)})_j \le \dots \le (w_{(|S|)})_j` are coordinate :math:`j`'s values over the round's
    accepted clients :math:`S`: the :math:`k` largest and :math:`k` smallest are dropped and the rest averaged.

    Conventions:
        * :math:`m` is the number of clients *sampled* in the round, so :math:`k` is the number of Byzantine clients
          the round is assumed to hold, :math:`\beta` being their fraction. It does not shrink when clients are
          rejected (a rejected client may be an honest one); a round with :math:`|S| \le 2k` is skipped (see
          :class:`RobustAggregator`).
        * :math:`\beta < 1/2`, so that :math:`2k < m`; :math:`\beta = 0` is the unweighted mean.

    Holds the round's updates on the CPU (``n x model size``); see :class:`RobustAggregator`.

    Args:
        beta: Fraction of the sampled clients trimmed at each end, in ``[0, 0.5)``.
    """

    def __init__(self, beta: float = 0.1) -> None:
        super().__init__()
        self.beta = check_real("beta", beta, minimum=0.0, maximum=0.5, exclusive_maximum=True)

    def num_trimmed(self, num_sampled: int) -> int:
        r""":math:`k = \lfloor \beta m \rfloor` for :math:`m` sampled clients."""
        # The epsilon keeps e.g. 0.3 * 10 = 2.9999999999999996 from flooring to 2.
        return math.floor(self.beta * num_sampled + 1e-9)

    @override
    def minimum_clients(self, num_sampled: int) -> int:
        return 2 * self.num_trimmed(num_sampled) + 1

    @override
    def requirement(self) -> str:
        return "n > 2 floor(beta m)"

    @override
    def setting_to_lower(self) -> str:
        return "`beta`"

    @override
    def aggregate(self, rows: Tensor, center: Tensor) -> Tensor:
        return trimmed_mean(rows, self.num_trimmed(self._num_sampled))

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(beta={self.beta})"


__all__ = ["FedMedian", "TrimmedMean"]
