"""APFL: each client learns a personal model and how much of it to mix with the global model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from typing_extensions import override

from lightning_fed.callbacks.personalized import PersonalizedCallback
from lightning_fed.checks import check_bool, check_choice, check_real
from lightning_fed.context import ClientContext, ClientUpdate
from lightning_fed.engine import isolated_pass, step_gradient
from lightning_fed.functional.apfl import alpha_gradient, alpha_step, mix, personal_step_
from lightning_fed.functional.state_dict import StateDict, copy_state_
from lightning_fed.hooks import GroupStep
from lightning_fed.utilities.seeding import derive_seed, seed_torch

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

_EVALUATE_WITH = ("local", "global")


class APFL(PersonalizedCallback):
    r"""Adaptive Personalized Federated Learning: a personal model mixed with the global one in parameter space.

    Paper: Y. Deng, M. M. Kamani, M. Mahdavi, "Adaptive Personalized Federated Learning", arXiv:2003.13461, 2020
    (Algorithm 1, with the adaptive α of its Section 3).

    Client :math:`i` keeps a personal model :math:`v_i` and a mixing weight :math:`α_i`; its personalised model is

    .. math::
        \bar v_i = α_i v_i + (1 - α_i) w

    where :math:`w` is the client's copy of the global model. At every local step, on the step's batch, with
    :math:`g = \nabla f_i(\bar v_i)` and the values of :math:`w, v_i, α_i` from before the step (as in the paper's
    algorithm: both updates see the same, previous :math:`w`):

    .. math::
        w \leftarrow w - η \nabla f_i(w), \qquad
        v_i \leftarrow v_i - η\,α_i\,g, \qquad
        α_i \leftarrow \operatorname{clip}_{[0,1]}\bigl(α_i - η \langle g, v_i - w \rangle\bigr)

    How it plugs in:
        * :math:`w` trains exactly as in FedAvg: the normal client loop, optimizer and aggregator. The gradient at
          :math:`\bar v` is taken in ``on_client_before_optimizer_step``: the module's parameters are swapped for
          :math:`\bar v`, ``training_step`` runs on the batches of the step (seen in ``client_loss``, which adds
          nothing), and :math:`w` is restored exactly. That pass runs under an RNG of its own, derived from
          ``(seed, "apfl", round, client, step)``, and its ``self.log`` values and torchmetrics states are
          discarded, so the global model, its ``train/*`` metrics and its dropout masks are bit-identical to
          FedAvg's. The gradient is the local step's own (:func:`~lightning_fed.engine.training_step.step_gradient`:
          the precision context, and under gradient accumulation the step's batches averaged as the step averages
          them).
        * :math:`η` is the optimizer's current learning rate (its first parameter group, read at every step, so
          schedulers apply), as in the paper, which uses one step size for :math:`w`, :math:`v` and :math:`α`.
          :math:`v` and :math:`α` take plain SGD steps: no momentum, weight decay or gradient clipping (those
          belong to the user's optimizer of :math:`w`).
        * :math:`v_i` starts as the global model the client first trains from (the paper starts it at
          :math:`w^{(0)}`; the same thing when every client trains in the first round). :math:`v_i`, :math:`α_i`
          and, for ``evaluate_with="local"``, the client's last local :math:`w` live in the client store (CPU,
          checkpointed) under ``"apfl"``.

    Conventions:
        * Mixing covers the trainable parameters. Buffers (BatchNorm running statistics) of :math:`\bar v` are
          the personal model's own: they are tracked by the forward passes of :math:`\bar v`, so they describe the
          activations of the model that is evaluated.
        * Evaluation (``personal/*`` metrics) uses :math:`\bar v_i`. With ``evaluate_with="local"`` (default) the
          :math:`w` in it is the client's latest local model, the model the client holds at the end of its
          local training; the authors' FedTorch code evaluates the personal model this way, before
          synchronisation. ``"global"`` mixes with the current global model instead, the output
          :math:`α_i v_i + (1 - α_i) w^{(t)}` of the paper's Algorithm 1 after a synchronisation. A client that
          has not trained yet is evaluated with the global model.
        * The α update is the paper's every-step update (the FedTorch code updates α once per round).
        * Logged: ``train/apfl_personal_loss`` (the loss of :math:`\bar v`) and ``train/apfl_alpha`` (round means
          over steps and clients).
        * Cost: one more forward and backward pass per step, and two models per client in the store.
        * fp16 loss scaling is refused: a skipped step of :math:`w` would still move :math:`v` and :math:`α`.

    Args:
        alpha: The initial mixing weight :math:`α \in [0, 1]` (the paper's experiments use 0.25, 0.5, 0.75).
        learn_alpha: Learn :math:`α_i` per client by its gradient; ``False`` keeps it at ``alpha``.
        evaluate_with: Which :math:`w` the evaluated :math:`\bar v_i` mixes in: ``"local"`` or ``"global"``.
    """

    client_state_namespaces = ("apfl",)  # v_i and alpha_i stay at the client

    supports_loss_scaling = False

    def __init__(
        self, alpha: float = 0.25, learn_alpha: bool = True, evaluate_with: Literal["local", "global"] = "local"
    ) -> None:
        alpha = check_real("alpha", alpha, minimum=0.0, maximum=1.0)
        learn_alpha = check_bool("learn_alpha", learn_alpha)
        evaluate_with = check_choice("evaluate_with", evaluate_with, _EVALUATE_WITH)
        super().__init__("apfl")
        self.alpha: float = alpha
        self.learn_alpha = learn_alpha
        self.evaluate_with = evaluate_with
        # The training client's state, on the training device, between on_client_train_start and on_client_end.
        self._personal: StateDict = {}
        self._buffers: StateDict = {}
        self._alpha: Tensor | None = None
        self._batches: list[tuple[Any, int]] = []
        # The module's live parameter and buffer tensors keep their identity through a client's training, so
        # they are looked up once per client rather than at every step.
        self._live_params: dict[str, Tensor] = {}
        self._live_buffers: dict[str, Tensor] = {}

    @override
    def on_client_train_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
    ) -> None:
        params, buffers = self._live_params, self._live_buffers = _live_split(pl_module, client_ctx.global_params)
        entry = client_ctx.store.get(self.namespace, client_ctx.client_id)
        device = next(iter(params.values())).device
        if entry is None:
            self._personal = {name: p.detach().clone() for name, p in params.items()}
            self._buffers = {name: b.detach().clone() for name, b in buffers.items()}
            self._alpha = torch.tensor(self.alpha, dtype=torch.float64, device=device)
        else:
            self._personal = {name: t.to(device, copy=True) for name, t in entry["v"].items()}
            self._buffers = {name: t.to(device, copy=True) for name, t in entry["buffers"].items()}
            self._alpha = entry["alpha"].to(device, copy=True)
        self._batches = []

    @override
    def client_loss(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        client_ctx: ClientContext,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # The batch is needed at the optimizer step, where w and the step's batches are all known.
        self._batches.append((batch, batch_idx))
        return

    @override
    def on_client_before_optimizer_step(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, step: GroupStep
    ) -> None:
        (client_ctx,) = step.contexts  # one client at a time (supports_batched_clients is off)
        batches, self._batches = self._batches, []
        if not batches or self._alpha is None:
            return
        lr = float(step.optimizer.param_groups[0]["lr"])
        params, buffers = self._live_params, self._live_buffers
        global_params = {name: p.detach().clone() for name, p in params.items()}
        global_buffers = {name: b.detach().clone() for name, b in buffers.items()}
        copy_state_(params, mix(self._personal, global_params, self._alpha))
        copy_state_(buffers, self._buffers)
        try:
            grads, loss = self._gradient_at_mixture(trainer, pl_module, client_ctx, batches, params)
            self._buffers = {name: b.detach().clone() for name, b in buffers.items()}
        finally:
            copy_state_(params, global_params)
            copy_state_(buffers, global_buffers)
        alpha = self._alpha
        if self.learn_alpha:
            new_alpha = alpha_step(alpha, alpha_gradient(grads, self._personal, global_params), lr)
        else:
            new_alpha = alpha
        personal_step_(self._personal, grads, alpha, lr)
        self._alpha = new_alpha
        if loss is not None:
            step.log(0, "apfl_personal_loss", loss)
        step.log(0, "apfl_alpha", new_alpha.float())

    def _gradient_at_mixture(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        client_ctx: ClientContext,
        batches: list[tuple[Any, int]],
        params: dict[str, Tensor],
    ) -> tuple[dict[str, Tensor], Tensor | None]:
        """∇f at the parameters the module holds (v̄), over the step's batches, and the mean loss, leaving no trace."""
        state = trainer.federation_state
        seed = derive_seed(state.seed, "apfl", client_ctx.round_idx, client_ctx.client_id, client_ctx.num_steps)
        with isolated_pass(pl_module):
            seed_torch(seed)
            return step_gradient(trainer, pl_module, batches, params)

    @override
    def on_client_end(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        if self._alpha is None:
            return
        entry: dict[str, Any] = {"v": self._personal, "buffers": self._buffers, "alpha": self._alpha}
        if self.evaluate_with == "local":
            entry["w"] = {name: update.params[name] for name in self._personal}
        client_ctx.store.put(self.namespace, client_ctx.client_id, entry)
        self._personal, self._buffers, self._alpha, self._batches = {}, {}, None, []
        self._live_params, self._live_buffers = {}, {}

    @override
    def evaluation_params(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> StateDict | None:
        """:math:`\\bar v_i`, mixed with the client's last local or the current global model."""
        entry = client_ctx.store.get(self.namespace, client_ctx.client_id)
        if entry is None:
            return None
        reference = client_ctx.global_params
        device = next(iter(reference.values())).device
        base = entry["w"] if self.evaluate_with == "local" else reference
        personal = {name: t.to(device) for name, t in entry["v"].items()}
        mixed = mix(personal, {name: base[name].to(device) for name in personal}, entry["alpha"].to(device))
        return {**reference, **mixed, **{name: t.to(device) for name, t in entry["buffers"].items()}}

    def mixing_weight(self, trainer: FederatedTrainerView, client_id: int) -> float | None:
        """Client ``client_id``'s current :math:`α_i`, or ``None`` before it has trained."""
        entry = trainer.federation_state.store.get(self.namespace, client_id)
        return None if entry is None else float(entry["alpha"])


def _live_split(
    pl_module: LightningModule, federated: Mapping[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The module's trainable parameters and the buffers of its federated part (the keys of ``federated``, the
    round's global model), as live tensors: the frozen base is neither mixed nor stored per client."""
    live = pl_module.state_dict(keep_vars=True)
    trainable = {name for name, p in pl_module.named_parameters() if p.requires_grad}
    parameter_names = {name for name, _ in pl_module.named_parameters()}
    params = {name: t for name, t in live.items() if name in trainable}
    buffers = {name: t for name, t in live.items() if name not in parameter_names and name in federated}
    return params, buffers


__all__ = ["APFL"]
