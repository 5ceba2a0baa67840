"""FedCurv: an EWC-style penalty that keeps each client near the others' locally trained models, per coordinate
weighted by their diagonal Fisher."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.callbacks.penalty import ParameterPenalty
from lightning_fed.checks import check_choice, check_real
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.engine import LogBuffer, batch_size_of, buffered_logging, call_step, loss_of
from lightning_fed.functional.fedcurv import (
    STAT_KEYS,
    Statistics,
    client_statistics,
    empirical_fisher,
    excluding_client,
    fedcurv_gradient,
    fedcurv_penalty,
    per_sample_fisher,
    statistics_nbytes,
    updated_sums,
)
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.parallel.reduction import CrossProcessState

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

_FISHERS = ("empirical", "per_sample")


class _DiscardingBuffer(LogBuffer):
    """Swallows what ``training_step`` logs during the Fisher pass (it is not training, and under ``vmap`` the
    logged values are batched tensors that must not escape)."""

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        return None


class _TrainingStepLoss(nn.Module):
    """Exposes ``module.training_step``'s loss as ``forward`` so ``torch.func.functional_call`` can run it."""

    def __init__(self, module: LightningModule) -> None:
        super().__init__()
        self.module = module

    @override
    def forward(self, batch: Any) -> Tensor:
        loss = loss_of(call_step(self.module.training_step, batch, 0))
        if loss is None:
            raise ValueError(
                "FedCurv's Fisher needs a loss from `training_step` on every batch of the client's data, but it"
                " returned None (a skipped step)."
            )
        return loss


class FedCurv(ParameterPenalty, CrossProcessState):
    r"""FedCurv (Shoham et al., "Overcoming Forgetting in Federated Learning on Non-IID Data", NeurIPS 2019
    Workshop on Federated Learning for Data Privacy and Confidentiality, arXiv:1910.07796).

    Client s minimises

    .. math::
        L_s(\theta) + \lambda \sum_{j \ne s} (\theta - \hat\theta_j)^\top \mathrm{diag}(F_j) (\theta - \hat\theta_j)

    (eq. 3; no ½, sum over the other clients), where :math:`\hat\theta_j` is client j's latest locally trained
    model and :math:`F_j` its diagonal Fisher evaluated there. In the paper's communication form (§3.1) each client
    uploads :math:`u_j = F_j` and :math:`v_j = F_j \odot \hat\theta_j`, plus here :math:`w_j = F_j \odot
    \hat\theta_j^2`; the server keeps the **sums** :math:`U, V, W` over every client's latest statistics (float64,
    in this callback's ``state_dict``; the per-client statistics live in the client store under ``"fedcurv"``).
    Client s receives them and uses :math:`U - u_s`, :math:`V - v_s`, :math:`W - w_s`, computed out of place and
    clamped at 0 where they must be non-negative. Injected gradient: :math:`2\lambda(\theta \odot (U - u_s) - (V -
    v_s))`; logged value (``train/fedcurv``): :math:`\lambda \sum (\theta^2 (U - u_s) - 2\theta (V - v_s) + (W -
    w_s))`, which equals the quadratic above exactly (``W`` only serves this value; it does not move the gradient).

    Conventions:

    * Parameters: the module's trainable parameters (``requires_grad``); buffers are neither penalised nor in F.
    * Fisher: diagonal, at the client's final local model, after local training, in **eval** mode (no dropout,
      BatchNorm running statistics), with the module's own ``training_step`` loss, over the client's whole
      training loader. ``fisher="empirical"`` (default): :math:`\sum_b \frac{n_b}{N}(\nabla \bar\ell_b)^2`, the
      squared gradient of each batch's mean loss averaged over batches; ``"per_sample"``: :math:`\frac1N \sum_i
      (\nabla \ell_i)^2` via ``torch.func`` (vmap of grad of a ``functional_call``). The empirical estimator is
      about 1/B of the per-sample one (B the batch size), so λ must be chosen for the estimator.
    * Timing: statistics measured in round t enter the sums at aggregation, so every client of round t+1 (and none
      of round t) sees them, as in the paper; non-participants keep their latest statistics in the sums.
    * A client's first participation is penalised with everybody else's statistics (Eq. 3 sums over the other
      clients, whose U, V, W hold no statistics of this client yet); in round 0 nobody has any, so no penalty.
      A client whose Fisher is not finite keeps its previous statistics (with a warning).
    * Communication per participating client: up u, v, w; down U, V, W (float32, 3 model-sized tensors each way;
      the paper's form needs only u, v and U, V: W is the price of logging the exact value).

    Each round the changes (new − old statistics) of the round's clients are summed (float64) in declared round
    state; with several processes each rank sums its own clients' and ``on_aggregate`` reduces the sum over ranks,
    so U, V, W are the same on every rank; the per-client statistics reach every rank through the client store.

    Defaults: the paper tuned λ per setting (λ = 1.0 on MNIST, B = 256, lr 0.01); no default is given here.
    Deviations: the paper assumes full participation; with sampling the sums hold each client's latest
    statistics, however old.

    Args:
        lam: λ ≥ 0. ``lam=0`` trains exactly as FedAvg.
        fisher: ``"empirical"`` or ``"per_sample"``.
        log_every_n_steps: Log the penalty value every n local steps.
    """

    client_state_namespaces = ("fedcurv",)  # u_i, v_i, w_i: the client's own last statistics
    # Each client penalises with the sums U, V, W less its own statistics.
    broadcast_keys = ("sums",)

    # Each client's Fisher statistics u, v, w are summed at the server without noise.
    sends_client_data_to_server = True
    # Measured under SecAgg+'s 22-bit fixed point on ±8 (MNIST-1D CNN, 3 clients, 5 rounds): 27 % of U's entries,
    # 59 % of V's and 93 % of W's lie below one grid step, and the masked sums miss the plain ones by 2-3 % in norm.
    sums_fit_fixed_point = False

    namespace = "fedcurv"

    def __init__(self, lam: float, fisher: str = "empirical", log_every_n_steps: int = 1) -> None:
        super().__init__("fedcurv", log_every_n_steps)
        self.lam = check_real("lam", lam, minimum=0.0)
        self.fisher = check_choice("fisher", fisher, _FISHERS)
        self.sums: Statistics | None = None
        # Round state (declared in on_round_start): the sum of the round's changes to U, V, W, and their number.
        self._change: Statistics = {}
        self._num_changes = 0
        self._round_ctx: RoundContext | None = None
        # Each training client's loader, for its Fisher at on_client_end (several train at once when batched).
        self._loaders: dict[int, Any] = {}

    @override
    def on_round_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext
    ) -> None:
        self._round_ctx = round_ctx
        self._loaders = {}
        trainable = [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad]
        zeros = {key: {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in trainable} for key in STAT_KEYS}
        self.add_round_state("_change", zeros)
        self.add_round_state("_num_changes", 0)

    @override
    def on_client_train_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
    ) -> None:
        self._loaders[client_ctx.client_id] = dataloader
        if self.sums is None:
            return  # nobody has statistics yet (round 0): Eq. 3's sum over the others is empty
        # A first-time client has no statistics of its own in the sums: all of them are the others' (Eq. 3).
        own = client_ctx.store.get(self.namespace, client_ctx.client_id)
        params = {n: p for n, p in pl_module.named_parameters() if p.requires_grad}
        client_ctx.extras[self.namespace] = excluding_client(self.sums, own, params)
        if self._round_ctx is not None:
            self._round_ctx.bytes_down += statistics_nbytes(client_ctx.extras[self.namespace])

    @override
    def is_active(self, client_ctx: ClientContext) -> bool:
        return self.namespace in client_ctx.extras

    @override
    def penalty(self, params: dict[str, Tensor], client_ctx: ClientContext) -> Tensor:
        return fedcurv_penalty(params, client_ctx.extras[self.namespace], self.lam)

    @override
    def penalty_gradient(self, params: dict[str, Tensor], client_ctx: ClientContext) -> dict[str, Tensor]:
        return fedcurv_gradient(params, client_ctx.extras[self.namespace], self.lam)

    @override
    def on_client_end(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        loader = self._loaders.pop(client_ctx.client_id, None)
        if loader is None:
            raise RuntimeError("FedCurv needs the client's training loader: `on_client_train_start` was not called.")
        fisher = self.compute_fisher(trainer, pl_module, loader)
        if not all(torch.isfinite(f).all() for f in fisher.values()):
            warnings.warn(
                f"FedCurv: client {client_ctx.client_id}'s Fisher is not finite in round {client_ctx.round_idx}; "
                "its previous statistics are kept. Lower the learning rate or clip gradients.",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        stats = client_statistics(fisher, {n: update.params[n] for n in fisher})
        old = client_ctx.store.get(self.namespace, client_ctx.client_id)
        client_ctx.store.put(self.namespace, client_ctx.client_id, stats)
        # What enters the sums is the stored (CPU, float32) copy, the same whichever rank reads the store.
        self._change = updated_sums(self._change, client_ctx.store.get(self.namespace, client_ctx.client_id), old)
        self._num_changes += 1
        if self._round_ctx is not None:
            self._round_ctx.bytes_up += statistics_nbytes(stats)

    @override
    def on_aggregate(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext, new_params: StateDict
    ) -> None:
        # The round's clients all trained against the sums of the round start; only now do their statistics enter
        # (the engine has reduced the declared round state over ranks before this hook).
        if self._num_changes:
            self.sums = updated_sums(self.sums, self._change)

    def compute_fisher(
        self, trainer: FederatedTrainerView | None, pl_module: LightningModule, loader: Any
    ) -> StateDict:
        """The diagonal Fisher of the module's current weights over ``loader``, in eval mode (see class docs)."""
        params = {n: p for n, p in pl_module.named_parameters() if p.requires_grad}
        was_training = pl_module.training
        # buffered_logging pops `log` on exit; whatever logger was installed before (if any) is put back after.
        outer: dict[str, Any] = {k: pl_module.__dict__[k] for k in ("log", "log_dict") if k in pl_module.__dict__}
        pl_module.eval()
        try:
            with buffered_logging(pl_module, _DiscardingBuffer()), torch.enable_grad():
                wrapper = _TrainingStepLoss(pl_module)
                if self.fisher == "empirical":
                    sized = ((b, batch_size_of(b)) for b in self._batches(trainer, loader))
                    return empirical_fisher(params, sized, wrapper)

                def loss_fn(p: StateDict, batch: Any) -> Tensor:
                    named = {f"module.{n}": t for n, t in p.items()}
                    return torch.func.functional_call(wrapper, named, (batch,))

                return per_sample_fisher(params, self._batches(trainer, loader), loss_fn)
        finally:
            pl_module.train(was_training)
            pl_module.__dict__.update(outer)

    @staticmethod
    def _batches(trainer: FederatedTrainerView | None, loader: Any) -> Iterator[Any]:
        if trainer is None or trainer.strategy.root_device.type == "cpu":
            yield from loader
            return
        for batch in loader:
            yield trainer.strategy.batch_to_device(batch)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {} if self.sums is None else {"sums": {k: dict(self.sums[k]) for k in STAT_KEYS}}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sums = state_dict.get("sums")
        self.sums = None if sums is None else {k: {n: t.double() for n, t in sums[k].items()} for k in STAT_KEYS}
