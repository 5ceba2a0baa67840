"""q-FedAvg: fair aggregation that up-weights the clients the global model serves worst."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregation import Aggregator
from lightning_fed.checks import check_real
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.engine import LogBuffer, batch_size_of, buffered_logging, training_loss
from lightning_fed.functional.qfedavg import EPSILON, apply_step, client_terms
from lightning_fed.functional.state_dict import StateDict

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

LOSS_KEY = "qfedavg/loss_at_global"
LIPSCHITZ_KEY = "qfedavg/lipschitz"


class QFedAvg(Aggregator):
    r"""q-FedAvg (q-FFL solved with FedAvg-style local updates).

    Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning", ICLR 2020, arXiv:1905.10497,
    Algorithm 2.

    .. math::
        \Delta w_k = L\,(w_g - w_k), \quad \Delta_k = F_k^q\,\Delta w_k, \quad
        h_k = q\,F_k^{q-1} \lVert \Delta w_k \rVert^2 + L\,F_k^q, \quad
        w_g \leftarrow w_g - \frac{\sum_{k} \Delta_k}{\sum_{k} h_k}

    with :math:`F_k` replaced by :math:`F_k + 10^{-10}` (as in the authors' code) and the sums over the round's
    accepted clients. :math:`F_k^q` multiplies :math:`\Delta w_k` outside the norm.

    Conventions:
        * :math:`F_k` is the client's training objective at :math:`w_g`, measured in :meth:`probe_client` (before
          local training, on the rank that trains the client) over the client's whole training loader: the
          sample-weighted mean of ``training_step``'s loss (assumed to be a batch mean), under ``no_grad``, in
          **eval mode** (no dropout; BatchNorm uses and does not update its running statistics, so :math:`w_g`'s
          buffers stay untouched). The authors' code evaluates the loss on the training data at :math:`w_g` with
          models that have neither dropout nor BatchNorm, so the two agree there. What the module logs during this
          pass is discarded. The loop hands the probe a loader of its own and seeds the client's RNG after it, so
          local training sees the same batches and dropout masks as without it. It costs one forward pass over the
          client's data per round. The loss must be non-negative.
        * :math:`L = 1/\eta` (the reference code), unless ``lipschitz`` is given, with :math:`\eta` the mean
          learning rate of the client's :math:`K` optimizer steps, :math:`L = K / \sum_{k=1}^{K} \eta_k`
          (``update.lr_sums``). At a constant rate that is the reference's :math:`1/\eta`; under a step-interval LR
          scheduler (OneCycleLR) the rate changes within local training, and :math:`L\,(w_g - w_k)` stays the sum of
          the client's :math:`K` gradients scaled as at a constant rate. A client that took no step (or one under
          manual optimisation, whose steps are not recorded) uses the learning rate at its start. The optimizer's
          param groups must share one learning rate.
        * :math:`\Delta_k` and the server step cover every floating-point entry (parameters and BatchNorm running
          statistics, as the reference applies it to all weights), so buffers move by the same convex combination
          as the parameters. :math:`\lVert \Delta w_k \rVert^2` sums over the trainable parameters only: buffer
          changes are not gradient estimates. Integer buffers are copied from the last accepted client.
        * ``q = 0`` gives the unweighted mean of the :math:`w_k` (uniform FedAvg). The paper tunes q per data set
          and has no single default; ``q = 1`` is used here as a moderate one.
        * Rejected (non-finite) clients are left out of both sums.
        * With several processes each rank sums its own clients' :math:`\Delta_k` and :math:`h_k`; these sums and
          the accepted clients' :math:`F_k` are declared round state, which ``compute`` reduces over ranks (one
          float64 all-reduce, one gather).
        * Communication: FedAvg's, plus one float32 (:math:`F_k`) per client upload.
        * Logs ``qfedavg/loss_at_global``, the mean of :math:`F_k` over the round's accepted clients.

    Args:
        q: Fairness parameter, >= 0.
        lipschitz: :math:`L`; ``None`` uses :math:`1/\eta`.
    """

    broadcast_keys = ()
    # Each client's loss F_k is merged per client (the logged mean), not only summed into the step.
    round_state_is_sum = False

    def __init__(self, q: float = 1.0, lipschitz: float | None = None) -> None:
        self.q = check_real("q", q, minimum=0.0)
        self.lipschitz = check_real("lipschitz", lipschitz, minimum=0.0, exclusive_minimum=True, allow_none=True)
        self._norm_names: set[str] | None = None
        self._global: StateDict = {}
        # Round state (declared in reset): sum of the Delta_k, sum of the h_k, accepted clients, and their F_k.
        self._delta_sum: StateDict = {}
        self._h_sum = 0.0
        self._num_accepted = 0
        self.client_losses: dict[int, float] = {}

    @override
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        self._global = global_params
        self.add_round_state("_delta_sum", self.float64_zeros(global_params), reduce="sum")
        self.add_round_state("_h_sum", 0.0, reduce="sum")
        self.add_round_state("_num_accepted", 0, reduce="sum")
        self.add_round_state("client_losses", {}, reduce="merge")
        # Each client also uploads F_k, one float32 beside its model.
        round_ctx.bytes_up += 4 * len(round_ctx.client_ids)

    @override
    def probe_client(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
    ) -> dict[str, Any]:
        r"""Measures :math:`F_k` at the client's start point and reads :math:`L = 1/\eta` from the optimizer (used
        when the client takes no step)."""
        self._norm_names = {name for name, p in pl_module.named_parameters() if p.requires_grad}
        extras: dict[str, Any] = {LOSS_KEY: mean_training_loss(trainer, pl_module, dataloader)}
        if self.lipschitz is None:
            lrs = {float(group["lr"]) for group in trainer.optimizers[0].param_groups}
            if len(lrs) != 1 or not min(lrs) > 0:
                raise ValueError(
                    f"q-FedAvg takes L = 1/lr from the optimizer, whose param groups have learning rates {sorted(lrs)}:"
                    " use one positive lr, or pass `lipschitz` to QFedAvg."
                )
            extras[LIPSCHITZ_KEY] = 1.0 / lrs.pop()
        return extras

    @override
    def update(self, update: ClientUpdate) -> None:
        if LOSS_KEY not in update.extras:
            raise ValueError(
                f"Client {update.client_id}'s update lacks its loss at the global model (`extras[{LOSS_KEY!r}]`),"
                " which `QFedAvg.probe_client` measures before local training: QFedAvg must be the trainer's"
                " `aggregator`."
            )
        lipschitz = self._lipschitz_of(update)
        loss = update.extras[LOSS_KEY]
        norm_names = self._norm_names if self._norm_names is not None else update.params.keys()
        floats = self.float_entries(update.params)
        deltas, h = client_terms(self._global, floats, loss, self.q, lipschitz, norm_names, EPSILON)
        self._h_sum += h
        self._num_accepted += 1
        for name, delta in deltas.items():
            self._delta_sum[name].add_(delta)
        self.client_losses[update.client_id] = loss

    def _lipschitz_of(self, update: ClientUpdate) -> float:
        r""":math:`L`: the one given, else :math:`K / \sum_k \eta_k` over the client's steps, else :math:`1/\eta` at
        its start (measured by :meth:`probe_client`)."""
        if self.lipschitz is not None:
            return self.lipschitz
        sums = update.lr_sums
        if update.num_steps > 0 and sums:
            if max(sums) - min(sums) > 1e-12 * max(sums):
                raise ValueError(
                    f"q-FedAvg takes L = 1/lr from the optimizer, whose param groups stepped with different learning"
                    f" rates (summed over client {update.client_id}'s steps: {sums}): use one lr for every group, or"
                    " pass `lipschitz` to QFedAvg."
                )
            return update.num_steps / sums[0]
        lipschitz = update.extras.get(LIPSCHITZ_KEY)
        if lipschitz is None:
            raise ValueError("QFedAvg has no Lipschitz constant: pass `lipschitz` or let it read the optimizer's lr.")
        return float(lipschitz)

    @override
    def compute(self, global_params: StateDict) -> StateDict:
        # The ranks' losses arrive in rank order: put them in round order, as one process holds them.
        in_round_order = sorted(self.client_losses, key=self._round_positions.__getitem__)
        self.client_losses = {cid: self.client_losses[cid] for cid in in_round_order}
        new_params = {name: tensor.clone() for name, tensor in global_params.items()}
        if self._num_accepted:
            new_params.update(apply_step(global_params, self._delta_sum, self._h_sum))
        return new_params

    @override
    def round_metrics(self) -> dict[str, float]:
        losses = list(self.client_losses.values())
        return {LOSS_KEY: sum(losses) / len(losses)} if losses else {}

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(q={self.q}, lipschitz={self.lipschitz})"


def mean_training_loss(trainer: FederatedTrainerView, module: LightningModule, dataloader: Any) -> float:
    """Sample-weighted mean of ``training_step``'s loss over ``dataloader``, in eval mode, with logs discarded."""

    was_training = module.training
    module.eval()
    total: Tensor | float = 0.0
    count = 0
    try:
        with torch.no_grad(), buffered_logging(module, LogBuffer()):
            for batch_idx, batch in enumerate(dataloader):
                batch = trainer.strategy.batch_to_device(batch)
                loss, _ = training_loss(trainer, module, batch, batch_idx)
                if loss is None:
                    continue
                size = batch_size_of(batch)
                total = total + loss.detach().double() * size  # stays on the device: one sync at the end
                count += size
    finally:
        module.train(was_training)
    return float(total) / count if count else 0.0


__all__ = ["QFedAvg", "mean_training_loss"]
