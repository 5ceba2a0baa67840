"""HeurFedAMP: FedAMP with cosine-similarity attention, for deep networks."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor
from typing_extensions import override

from lightning_fed.callbacks.fedamp import FedAMP
from lightning_fed.checks import check_real
from lightning_fed.functional.fedamp import heurfedamp_weights, pairwise_cosine_similarity
from lightning_fed.functional.state_dict import StateDict


class HeurFedAMP(FedAMP):
    r"""HeurFedAMP: FedAMP whose message weights come from the cosine similarity of the client models.

    Paper: Y. Huang, L. Chu, Z. Zhou, L. Wang, J. Liu, J. Pei, Y. Zhang, "Personalized Cross-Silo Federated Learning
    on Non-IID Data", AAAI 2021, arXiv:2007.03797 (Section 6, Eq. 8).

    Everything is FedAMP's (see :class:`~lightning_fed.callbacks.FedAMP`: the proximal local objective
    :math:`F_i(w) + \frac{λ}{2\alpha_k}\lVert w - u_i \rVert^2`, :math:`u_i = \sum_j \xi_{ij} w_j`, evaluation,
    heatmaps, resume) except the weights, where the self-weight is a hyperparameter:

    .. math::
        \xi_{ii} = \texttt{self\_weight}, \qquad
        \xi_{ij} = (1 - \xi_{ii}) \frac{e^{\sigma \cos(w_i, w_j)}}{\sum_{h \ne i} e^{\sigma \cos(w_i, w_h)}}
        \quad (j \ne i).

    The cosines are taken over the flattened trainable parameters in float64; the softmax is the stable
    (max-shifted) one, so no weight underflows however large the model. The paper gives no values for
    ``self_weight`` and :math:`\sigma`; note that :math:`\sigma` multiplies cosines that differ by hundredths
    between models trained from one initialisation, so a :math:`\sigma` of order 1 spreads the weight almost
    evenly over the other clients. No public library ships HeurFedAMP (PFLlib's old version never wrote
    :math:`u_i`), so there is no reference default. The mean self-weight is logged as ``heurfedamp/xi_self_mean``
    and the heatmap as ``heurfedamp/xi``.

    Args:
        alpha_k: :math:`\alpha_k > 0`; here it only sets the proximal coefficient :math:`λ/\alpha_k`.
        lam: :math:`λ > 0`.
        sigma: The cosine scaling :math:`\sigma \ge 0` (0: uniform weights over the other clients).
        self_weight: :math:`\xi_{ii} \in [0, 1]`.
        start_from: ``"cloud"`` or ``"local"``, as in FedAMP.
        evaluate: ``"local"`` or ``"cloud"``, as in FedAMP.
        heatmap_every_n_rounds: Plot :math:`\xi` every n rounds (0: never).
        log_every_n_steps: Log the proximal value every n local steps.
    """

    client_state_namespaces = ("heurfedamp",)

    namespace_name = "heurfedamp"
    sigma_may_be_zero: ClassVar[bool] = True

    def __init__(
        self,
        alpha_k: float = 0.1,
        lam: float = 1.0,
        sigma: float = 1.0,
        self_weight: float = 0.5,
        start_from: str = "cloud",
        evaluate: str = "local",
        heatmap_every_n_rounds: int = 10,
        log_every_n_steps: int = 1,
    ) -> None:
        self.self_weight = check_real("self_weight", self_weight, minimum=0.0, maximum=1.0)
        super().__init__(alpha_k, lam, sigma, start_from, evaluate, heatmap_every_n_rounds, log_every_n_steps)

    @override
    def collaboration_weights(self, states: list[StateDict], keys: list[str], resolution: float) -> Tensor:
        return heurfedamp_weights(pairwise_cosine_similarity(states, keys), self.sigma, self.self_weight)


__all__ = ["HeurFedAMP"]
