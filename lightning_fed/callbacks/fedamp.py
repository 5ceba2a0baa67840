"""FedAMP: attentive message passing between personalised client models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from typing_extensions import override

from lightning_fed.callbacks.penalty import ParameterPenalty
from lightning_fed.callbacks.personalized import PersonalizedCallback
from lightning_fed.checks import check_choice, check_int, check_real
from lightning_fed.client_store import ClientStateStore
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.functional.fedamp import fedamp_weights, pairwise_squared_distances, personalized_cloud_models
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.utilities.schedule import is_due

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

_START_FROM = ("cloud", "local")
_EVALUATE = ("local", "cloud")
_CLOUD_KEY = "fedamp_cloud"


class FedAMP(ParameterPenalty, PersonalizedCallback):
    r"""FedAMP: every client keeps a personalised model, and the server sends each one a personalised cloud model
    that mixes the clients' models by their similarity.

    Paper: Y. Huang, L. Chu, Z. Zhou, L. Wang, J. Liu, J. Pei, Y. Zhang, "Personalized Cross-Silo Federated Learning
    on Non-IID Data", AAAI 2021, arXiv:2007.03797 (Algorithm 1, Eqs. 5-7).

    Round :math:`k`, with :math:`w_1, \dots, w_m` the latest personalised models of **all** registered clients
    (cross-silo, as in the paper) and :math:`A(x) = 1 - e^{-x/\sigma}`:

    .. math::
        \xi_{ij} = \alpha_k A'(\lVert w_i - w_j \rVert^2)
        = \frac{\alpha_k}{\sigma} e^{-\lVert w_i - w_j \rVert^2/\sigma} \ (j \ne i),
        \qquad \xi_{ii} = 1 - \sum_{j \ne i} \xi_{ij}, \qquad u_i = \sum_j \xi_{ij} w_j

    and each sampled client :math:`i` solves (Eq. 6), by the trainer's local epochs/steps of its optimizer,

    .. math::
        w_i \leftarrow \arg\min_w F_i(w) + \frac{λ}{2\alpha_k} \lVert w - u_i \rVert_2^2,
        \qquad \nabla_w \frac{λ}{2\alpha_k} \lVert w - u_i \rVert^2 = \frac{λ}{\alpha_k} (w - u_i).

    Conventions:

    - :math:`\xi` is computed in float64 on the CPU over the trainable parameters (buffers are mixed into
      :math:`u_i` with the same weights, integer buffers are the client's own). A negative :math:`\xi_{ii}` is
      clipped to 0 and its row renormalised, with a warning; rows whose collaboration weights fall below the
      model dtype's resolution (deep nets: :math:`e^{-d/\sigma}` is tiny) raise a warning instead of silently
      giving :math:`u_i = w_i`. See :func:`~lightning_fed.functional.fedamp.fedamp_weights`.
    - The norm is **squared**, carries the **½**, sums over every trainable entry, and :math:`u_i` is a constant
      (detached): its exact gradient is injected into ``.grad`` (see
      :class:`~lightning_fed.callbacks.ParameterPenalty`). PFLlib builds this term from ``.data`` (zero gradient)
      with an unsquared norm, which makes its FedAMP plain local training. The value is logged as
      ``train/fedamp_proximal``.
    - ``start_from="cloud"`` (default) starts local training at :math:`u_i`, the proximal-point reading of Eq. 6;
      ``"local"`` starts at :math:`w_i` (PFLlib's and fluke's choice). A client that has not trained yet has
      :math:`w_i = w_0`, the initial model every client starts from.
    - ``evaluate="local"`` (default) evaluates each client's personalised model :math:`w_i`, the model the client
      owns and the one the paper's BMTA is reported on; ``"cloud"`` evaluates :math:`u_i` built from the current
      models (the cloud model the client would receive next). Every client is evaluated, under ``personal/*``.
    - The trainer's aggregator still averages the returned :math:`w_i` into the "global" model; FedAMP never uses
      it. ``global/*`` metrics are therefore those of the (FedAvg) average of the personalised models.
    - Communication: :math:`u_i` down and :math:`w_i` up, one model each way (with ``start_from="local"`` the
      client keeps :math:`w_i` and receives :math:`u_i`, which has the same size).
    - :math:`\alpha_k` is held constant over rounds (the paper's Theorem 2 takes :math:`\alpha_k = λ/\sqrt{K}`).

    The latest :math:`\xi` is logged as a heatmap (``xi/round_NNNN.png`` in the run directory and ``fedamp/xi`` in
    W&B) every ``heatmap_every_n_rounds`` rounds and at the last round, and its mean self-weight as
    ``fedamp/xi_self_mean``.

    Args:
        alpha_k: The attention step size :math:`\alpha_k > 0`.
        lam: The regularisation weight :math:`λ > 0`; the proximal coefficient is :math:`λ/\alpha_k`.
        sigma: The scale :math:`\sigma > 0` of :math:`A`, in units of squared parameter distance.
        start_from: ``"cloud"`` or ``"local"``: where each client's local training starts.
        evaluate: ``"local"`` or ``"cloud"``: which personalised model each client is evaluated with.
        heatmap_every_n_rounds: Plot :math:`\xi` every n rounds (0: never).
        log_every_n_steps: Log the proximal value every n local steps.
    """

    client_state_namespaces = ("fedamp",)  # w_i, which the server also reads for every u_i
    # Every client's w_i reaches the server (merged): no secure aggregation.
    round_state_is_sum = False
    broadcast_keys = ()
    server_reads_client_store = True  # on_round_start reads every client's stored state

    namespace_name = "fedamp"
    sigma_may_be_zero: ClassVar[bool] = False
    # The server holds every client's personal model w_i to build the cloud models u_i.
    sends_client_data_to_server = True

    def __init__(
        self,
        alpha_k: float = 0.1,
        lam: float = 1.0,
        sigma: float = 1.0,
        start_from: str = "cloud",
        evaluate: str = "local",
        heatmap_every_n_rounds: int = 10,
        log_every_n_steps: int = 1,
    ) -> None:
        ParameterPenalty.__init__(self, f"{self.namespace_name}_proximal", log_every_n_steps)
        PersonalizedCallback.__init__(self, self.namespace_name)
        self.alpha_k = check_real("alpha_k", alpha_k, minimum=0.0, exclusive_minimum=True)
        self.lam = check_real("lam", lam, minimum=0.0, exclusive_minimum=True)
        # FedAMP's σ divides the distances; HeurFedAMP's multiplies cosines, where 0 means uniform weights.
        self.sigma = check_real("sigma", sigma, minimum=0.0, exclusive_minimum=not self.sigma_may_be_zero)
        self.start_from = check_choice("start_from", start_from, _START_FROM)
        self.evaluate = check_choice("evaluate", evaluate, _EVALUATE)
        self.heatmap_every_n_rounds = check_int("heatmap_every_n_rounds", heatmap_every_n_rounds, minimum=0)
        self.initial_params: StateDict | None = None
        self.xi: Tensor | None = None
        self._clouds: dict[int, StateDict] = {}
        self._evaluation_clouds: tuple[int, list[StateDict]] | None = None

    def collaboration_weights(self, states: list[StateDict], keys: list[str], resolution: float) -> Tensor:
        """The ``(m, m)`` matrix ξ over ``states``; HeurFedAMP overrides this (and allows σ = 0), nothing else."""
        distances = pairwise_squared_distances(states, keys)
        return fedamp_weights(distances, self.alpha_k, self.sigma, resolution)

    def client_model(self, store: ClientStateStore, client_id: int) -> StateDict:
        """The client's latest personalised model :math:`w_i`; :math:`w_0` before its first training."""
        params = self.personal_params(store, client_id)
        if params is not None:
            return params
        if self.initial_params is None:
            raise RuntimeError(
                f"{type(self).__name__} has no initial model: it sees the initial model at round 0, or restores it"
                " from a checkpoint written with this callback. Resume from such a checkpoint, or start a new fit."
            )
        return self.initial_params

    def _cloud_models(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, store: ClientStateStore, rows: list[int]
    ) -> tuple[Tensor, list[StateDict]]:
        """ξ over every registered client's model, and :math:`u_i` for the clients ``rows``."""
        states = [self.client_model(store, cid) for cid in range(trainer.datamodule.num_clients)]
        trainable = [(name, p) for name, p in pl_module.named_parameters() if p.requires_grad]
        resolution = torch.finfo(trainable[0][1].dtype).eps
        xi = self.collaboration_weights(states, [name for name, _ in trainable], resolution)
        return xi, personalized_cloud_models(xi, states, rows)

    @override
    def on_round_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext
    ) -> None:
        if round_ctx.round_idx == 0:
            # Every client's w_0 is the initial global model; it is kept because the aggregate moves on.
            self.initial_params = {name: t.detach().to("cpu", copy=True) for name, t in round_ctx.global_params.items()}
        self.xi, clouds = self._cloud_models(trainer, pl_module, round_ctx.store, round_ctx.client_ids)
        self._clouds = dict(zip(round_ctx.client_ids, clouds))

    @override
    def on_client_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> None:
        cloud = self._clouds[client_ctx.client_id]
        start = cloud if self.start_from == "cloud" else self.client_model(client_ctx.store, client_ctx.client_id)
        client_ctx.initial_params = start
        client_ctx.extras[_CLOUD_KEY] = {
            name: cloud[name].to(device=p.device, dtype=p.dtype)
            for name, p in pl_module.named_parameters()
            if p.requires_grad
        }

    @override
    def penalty(self, params: dict[str, Tensor], client_ctx: ClientContext) -> Tensor:
        """(λ / (2 α_k)) Σ ‖w − u_i‖² over the trainable parameters."""
        cloud = client_ctx.extras[_CLOUD_KEY]
        total = sum(((p - cloud[name].detach()) ** 2).sum() for name, p in params.items())
        return 0.5 * self.lam / self.alpha_k * total

    @override
    def penalty_gradient(self, params: dict[str, Tensor], client_ctx: ClientContext) -> dict[str, Tensor]:
        """(λ / α_k)(w − u_i) per trainable parameter."""
        cloud = client_ctx.extras[_CLOUD_KEY]
        coefficient = self.lam / self.alpha_k
        return {name: coefficient * (p.detach() - cloud[name]) for name, p in params.items()}

    @override
    def on_client_end(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        self.save_personal(client_ctx.store, client_ctx.client_id, update.params)
        self._clouds.pop(client_ctx.client_id, None)

    @override
    def evaluation_params(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> StateDict | None:
        if self.initial_params is None:
            return None
        if self.evaluate == "local":
            return self.client_model(client_ctx.store, client_ctx.client_id)
        if self._evaluation_clouds is None or self._evaluation_clouds[0] != client_ctx.round_idx:
            everyone = list(range(trainer.datamodule.num_clients))
            clouds = self._cloud_models(trainer, pl_module, client_ctx.store, everyone)[1]
            self._evaluation_clouds = (client_ctx.round_idx, clouds)
        return self._evaluation_clouds[1][client_ctx.client_id]

    @override
    def on_round_end(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        round_ctx: RoundContext,
        metrics: dict[str, float],
    ) -> None:
        self._clouds, self._evaluation_clouds = {}, None
        if self.xi is None:
            return
        metrics[f"{self.namespace_name}/xi_self_mean"] = float(self.xi.diagonal().mean())
        round_number = round_ctx.round_idx + 1
        if is_due(round_number, self.heatmap_every_n_rounds, trainer.num_rounds):
            self._log_heatmap(trainer, round_number)

    def _log_heatmap(self, trainer: FederatedTrainerView, round_number: int) -> None:
        if not trainer.is_global_zero or trainer.fed_run_dir is None or self.xi is None:
            return
        from lightning_fed.plots import plot_xi_heatmap

        title = f"{type(self).__name__} collaboration weights, round {round_number}"
        trainer.publish_figure(
            plot_xi_heatmap(self.xi, title=title),
            f"xi/round_{round_number:04d}.png",
            f"{self.namespace_name}/xi",
            f"round {round_number}",
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"initial_params": self.initial_params, "xi": self.xi}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.initial_params = state_dict["initial_params"]
        self.xi = state_dict["xi"]


__all__ = ["FedAMP"]
