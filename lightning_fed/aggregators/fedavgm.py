"""FedAvgM: federated averaging with server momentum."""

from __future__ import annotations

from typing import Literal

from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregators.server_optimizer import ServerOptimizer
from lightning_fed.checks import check_bool, check_real
from lightning_fed.functional.server_optim import heavy_ball


class FedAvgM(ServerOptimizer):
    r"""FedAvg with heavy-ball momentum on the server.

    Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
    Classification", 2019, arXiv:1909.06335; the SGD-with-momentum server optimizer of Reddi et al., "Adaptive
    Federated Optimization", ICLR 2021, arXiv:2003.00295.

    .. math::
        \Delta_t = \sum_{k \in S} p_k w_k - w_t, \qquad u_t = \beta u_{t-1} + \Delta_t, \qquad
        w_{t+1} = w_t + \eta\, u_t \quad (\text{Nesterov: } w_{t+1} = w_t + \eta (\Delta_t + \beta u_t))

    from :math:`u_{-1} = 0`, for the trainable parameters.

    Conventions:
        * Hsu et al. write :math:`v \leftarrow \beta v + \Delta w`, :math:`w \leftarrow w - v` with
          :math:`\Delta w = w - \bar w`: the same step with :math:`\Delta_t = -\Delta w` and :math:`\eta = 1`. The
          momentum is not damped, so the effective server rate is :math:`\eta / (1 - \beta)`; Hsu et al. tune
          :math:`\eta` and :math:`\beta` together along that ratio.
        * ``momentum=0`` and ``server_lr=1`` is FedAvg, up to one float64 rounding of :math:`w_t + \Delta_t`.
        * Buffers, rejected clients, weights and ddp: as :class:`~lightning_fed.aggregators.FedAvg` (see
          :class:`~lightning_fed.aggregators.server_optimizer.ServerOptimizer`). :math:`u` is checkpointed.
        * Defaults: :math:`\eta = 1`, :math:`\beta = 0.9`, the server momentum Reddi et al. use for FedAvgM.

    Args:
        server_lr: :math:`\eta` > 0.
        momentum: :math:`\beta` in [0, 1).
        nesterov: Use the look-ahead direction :math:`\Delta_t + \beta u_t`.
        weighting: FedAvg's ``"num_samples"`` or ``"uniform"`` weights :math:`p_k`.
    """

    buffer_names = ("momentum",)

    repr_arguments = ("server_lr", "momentum", "nesterov", "weighting")

    def __init__(
        self,
        server_lr: float = 1.0,
        momentum: float = 0.9,
        nesterov: bool = False,
        weighting: Literal["num_samples", "uniform"] = "num_samples",
    ) -> None:
        super().__init__(weighting=weighting, server_lr=server_lr)
        self.momentum = check_real("momentum", momentum, minimum=0.0, maximum=1.0, exclusive_maximum=True)
        self.nesterov = check_bool("nesterov", nesterov)

    @override
    def step_parameter(self, buffers: dict[str, Tensor], delta: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        velocity, direction = heavy_ball(buffers["momentum"], delta, self.momentum, self.nesterov)
        return {"momentum": velocity}, self.server_lr * direction


__all__ = ["FedAvgM"]
