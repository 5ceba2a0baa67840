"""Weight divergence of FedAvg from a centralised SGD twin (Zhao et al. 2018, §3, Eq. (1), Fig. 2)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_fed.checks import check_int
from lightning_fed.context import RoundContext
from lightning_fed.engine import LocalTrainer, isolated_pass
from lightning_fed.functional.divergence import total_weight_divergence, weight_divergence
from lightning_fed.functional.state_dict import StateDict, clone_state, copy_state_
from lightning_fed.hooks import FedCallback, federated_trainer
from lightning_fed.utilities.schedule import is_due
from lightning_fed.utilities.seeding import derive_seed, seed_torch

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

PREFIX = "divergence/"


class WeightDivergence(FedCallback):
    r"""Trains a centralised SGD twin beside the federated run and logs the weight divergence from it.

    Zhao, Li, Lai, Suda, Civin, Chandra, "Federated Learning with Non-IID Data", arXiv:1806.00582, §3, Eq. (1):
    :math:`\lVert \mathbf{w}^{\text{FedAvg}} - \mathbf{w}^{\text{SGD}} \rVert / \lVert \mathbf{w}^{\text{SGD}}
    \rVert`, per layer (their Fig. 2). §2: "FedAvg with IID data should be compared to SGD with shuffling data and a
    batch size K times larger, where K is the number of clients included at each synchronization", with "the
    learning rate and decay rate ... identical".

    The twin:
        * starts from the round-0 global model (``round_ctx.global_params`` of the first round, so a warm-up or
          any other initialisation applied before the first round is shared);
        * each round trains on all clients' training data pooled (the datamodule's ``train_dataloader`` data)
          with batch :math:`B \cdot K` (:math:`B` = ``datamodule.batch_size``, :math:`K` = clients sampled this
          round), plain SGD (no momentum, no weight decay, no ``client_loss`` terms) at the learning rate the clients
          use this round (``trainer.optimizers[0].param_groups[0]["lr"]`` at round start, so LR schedulers stepped
          per round give the same decay);
        * advances ``local_epochs`` passes over the pooled data per round; with ``local_steps`` = S it takes S
          steps of batch :math:`B \cdot K`, i.e. it sees as many examples as the K clients together;
        * takes a client's steps (:meth:`~lightning_fed.engine.local_training.LocalTrainer.fit`: the precision context
        and
          loss scaling, ``accumulate_grad_batches`` and gradient clipping as the trainer sets them), with no hooks;
        * shuffles with the first sampled client's data seed and seeds torch with that client's torch seed. The pass
          leaves no trace on the federated run: the RNG is forked, what the module logs is discarded, and its
          torchmetrics states and the AMP grad scaler's state are restored. With one client holding all the data
          this replays the client's batches and dropout masks exactly, so the divergence is 0 up to float rounding;
        * is trained in ``on_round_start`` (before the clients), so a checkpoint taken at validation end holds a
          twin that matches the federated model of the same round; resumed runs stay bit-identical.

    It runs on the live module (weights swapped in and restored), which keeps device, precision and logging as the
    clients have them without copying the trainer a deep copy would drag along.

    Logged after each ``every_n_rounds``-th round and the last: ``divergence/<name>`` for every trainable
    parameter tensor (``named_parameters`` names, e.g. ``net.0.weight``; buffers are left out) and
    ``divergence/total`` (all of them as one vector). At fit end ``weight_divergence.png`` (one curve per tensor) is
    written into the run directory.

    Args:
        every_n_rounds: Log the divergence every this many rounds (the twin still trains every round).
    """

    broadcast_keys = ()  # the SGD twin trains on the server

    # The twin trains on every client's training data pooled at the server.
    sends_client_data_to_server = True

    def __init__(self, every_n_rounds: int = 1) -> None:
        self.every_n_rounds: int = check_int("every_n_rounds", every_n_rounds, minimum=1)
        self._twin: StateDict = {}
        self._names: list[str] = []

    @property
    def twin_state(self) -> StateDict:
        """The SGD twin's state (parameters and buffers, CPU)."""
        return self._twin

    @override
    def on_round_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext
    ) -> None:
        self._names = [name for name, p in pl_module.named_parameters() if p.requires_grad]
        if not self._twin:
            if trainer.federation_state.completed_rounds > 0:
                raise ValueError(
                    "WeightDivergence found no SGD twin in a run resumed after round "
                    f"{trainer.federation_state.completed_rounds}: resume from a checkpoint saved with this callback, "
                    "or start a new run."
                )
            self._twin = {name: t.detach().to("cpu", copy=True) for name, t in round_ctx.global_params.items()}
        self._train_twin(trainer, pl_module, round_ctx)

    @override
    def on_round_end(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        round_ctx: RoundContext,
        metrics: dict[str, float],
    ) -> None:
        if not is_due(round_ctx.round_idx + 1, self.every_n_rounds, trainer.num_rounds):
            return
        current = pl_module.state_dict()
        per_tensor = weight_divergence(current, self._twin, self._names)
        metrics.update({f"{PREFIX}{name}": value for name, value in per_tensor.items()})
        metrics[f"{PREFIX}total"] = total_weight_divergence(current, self._twin, self._names)

    @override
    def on_train_end(self, pl_trainer: Trainer, pl_module: LightningModule) -> None:
        trainer = federated_trainer(pl_trainer, self)
        history = trainer.federation_state.history
        keys = sorted({key for entry in history for key in entry if key.startswith(PREFIX)})
        if not trainer.is_global_zero or not keys:
            return
        from lightning_fed.plots.divergence import plot_weight_divergence
        from lightning_fed.plots.io import save_figure

        save_figure(plot_weight_divergence(history, keys), _run_dir(trainer) / "weight_divergence.png")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"twin": dict(self._twin)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._twin = {name: tensor.to("cpu") for name, tensor in state_dict.get("twin", {}).items()}

    def _train_twin(self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext) -> None:
        """One round of centralised SGD on the twin, on the live module, which is restored afterwards."""
        # The twin is the federated part (the round's global model); the frozen base is the module's own.
        live = {name: t for name, t in pl_module.state_dict(keep_vars=True).items() if name in self._twin}
        saved, was_training = clone_state(live), pl_module.training
        lr = float(trainer.optimizers[0].param_groups[0]["lr"])
        seed, round_idx, first = trainer.federation_state.seed, round_ctx.round_idx, round_ctx.client_ids[0]
        loader = _pooled_loader(trainer, len(round_ctx.client_ids), derive_seed(seed, "data", round_idx, first))
        params = [p for p in pl_module.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=lr)
        # No hooks: no callback should mistake the twin's steps for a client's, and no client_loss term applies.
        central = LocalTrainer(trainer, pl_module, mode="central")
        try:
            copy_state_(live, self._twin)
            with isolated_pass(pl_module), _kept_scaler(trainer):
                seed_torch(derive_seed(seed, "torch", round_idx, first))
                central.fit(loader, optimizer, trainer.local_epochs, trainer.local_steps)
            self._twin = {name: t.detach().to("cpu", copy=True) for name, t in live.items()}
        finally:
            copy_state_(live, saved)
            pl_module.train(was_training)
            for p in params:
                p.grad = None


def _pooled_loader(trainer: FederatedTrainerView, num_clients: int, seed: int) -> Any:
    """The datamodule's pooled ``train_dataloader`` with batch ``B * K`` and order seeded by ``seed``.

    A shallow copy carries the datamodule's splits; only its batch size and loader seed are changed, so the
    federated datamodule is left untouched.
    """
    datamodule = copy.copy(trainer.datamodule)
    datamodule.batch_size = trainer.datamodule.batch_size * num_clients
    datamodule.seed = seed
    return datamodule.train_dataloader()


@contextmanager
def _kept_scaler(trainer: FederatedTrainerView) -> Iterator[None]:
    """Restores the AMP grad scaler's scale and growth tracker after the block, so the twin's steps (its own
    overflows included) do not shift the loss scale of the clients' steps."""
    scaler = getattr(trainer.strategy.precision_plugin, "scaler", None)
    if scaler is None or not scaler.is_enabled():
        yield
        return
    saved = scaler.state_dict()
    try:
        yield
    finally:
        scaler.load_state_dict(saved)


def _run_dir(trainer: FederatedTrainerView) -> Path:
    """The run directory the reporter writes summary.json into, else ``trainer.default_root_dir``."""
    run_dir = trainer.fed_run_dir
    return Path(run_dir) if run_dir is not None else Path(trainer.default_root_dir)


__all__ = ["WeightDivergence"]
