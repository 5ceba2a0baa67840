"""FedAdam: Adam on the server, on FedAvg's pseudo-gradient."""

from __future__ import annotations

from typing import Literal

from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregators.server_optimizer import AdaptiveServerOptimizer
from lightning_fed.checks import check_real
from lightning_fed.functional.server_optim import adam_second_moment


class FedAdam(AdaptiveServerOptimizer):
    r"""Adam as the server optimizer: steps normalised by a running mean of the squared updates.

    Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive Federated Optimization", ICLR 2021,
    arXiv:2003.00295, Algorithm 2 (FedAdam).

    .. math::
        \Delta_t = \sum_{k \in S} p_k w_k - w_t, \qquad m_t = \beta_1 m_{t-1} + (1 - \beta_1) \Delta_t, \qquad
        v_t = \beta_2 v_{t-1} + (1 - \beta_2) \Delta_t^2,
        \qquad w_{t+1} = w_t + \eta \frac{m_t}{\sqrt{v_t} + \tau}

    elementwise over the trainable parameters, from :math:`m_{-1} = 0` and :math:`v_{-1} = \tau^2`.

    Conventions:
        * Algorithm 2 asks :math:`v_{-1} \ge \tau^2`; we start at the bound. No bias correction (the paper has
          none).
        * Algorithm 2 writes the plain mean over the sampled clients, which is ``weighting="uniform"``; the default
          ``"num_samples"`` keeps FedAvg's weights :math:`p_k \propto n_k`.
        * Buffers (BatchNorm statistics) and frozen parameters take the plain weighted mean, never the adaptive
          step; integer buffers, rejected clients and ddp are handled as in
          :class:`~lightning_fed.aggregators.FedAvg`. :math:`m`, :math:`v` (float64) and the step count are
          checkpointed; a round whose clients were all rejected changes neither the model nor them.
        * Defaults: :math:`\beta_1 = 0.9`, :math:`\beta_2 = 0.99` and :math:`\tau = 10^{-3}` follow the paper's
          experiments (Section 5, which also studies the sensitivity to :math:`\tau`). The paper tunes
          :math:`\eta` per task over powers of ten and has no default; :math:`\eta = 10^{-2}` is ours. Tune it
          (docs/algorithms/server-optimizers.md).

    Args:
        server_lr: :math:`\eta` > 0.
        beta1: :math:`\beta_1` in [0, 1).
        beta2: :math:`\beta_2` in [0, 1).
        tau: :math:`\tau` > 0.
        weighting: FedAvg's ``"num_samples"`` or ``"uniform"`` weights :math:`p_k`.
    """

    repr_arguments = ("server_lr", "beta1", "beta2", "tau", "weighting")

    def __init__(
        self,
        server_lr: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        weighting: Literal["num_samples", "uniform"] = "num_samples",
    ) -> None:
        super().__init__(server_lr=server_lr, beta1=beta1, tau=tau, weighting=weighting)
        self.beta2 = check_real("beta2", beta2, minimum=0.0, maximum=1.0, exclusive_maximum=True)

    @override
    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        return adam_second_moment(v, delta, self.beta2)


__all__ = ["FedAdam"]
