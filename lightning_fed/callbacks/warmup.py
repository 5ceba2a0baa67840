"""The warm-up model of Zhao et al.'s data sharing: central training on the shared set G before round 0."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_int, check_real
from lightning_fed.context import RoundContext
from lightning_fed.engine import LocalTrainer
from lightning_fed.hooks import FedCallback, federated_trainer
from lightning_fed.utilities.seeding import derive_seed, seed_torch

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class SharedDataWarmup(FedCallback):
    """Trains the global model centrally on the shared set G before the first round, and logs what was shared.

    Source: Zhao et al., "Federated Learning with Non-IID Data" (arXiv:1806.00582), §4.2: "At the initialization
    stage of FedAvg, the warm-up model trained on G and a random α portion of G are distributed to each client."

    At ``on_train_start`` (before round 0; the module holds the global model between rounds, so training it in
    place makes the warm-up model the initial global model) the module trains for ``epochs`` passes over
    ``trainer.datamodule.shared_dataloader`` with the trainer's optimizer (fresh state, restored afterwards to the
    trainer's learning rate), taking a client's steps (:meth:`~lightning_fed.engine.local_training.LocalTrainer.fit`:
    the precision context and loss scaling, ``accumulate_grad_batches`` and gradient clipping as the trainer sets them).
    No hooks run: federated ones such as FedProx's ``client_loss`` do not apply, as the warm-up is server-side
    training, and Lightning's batch hooks are kept for the clients' steps. Epoch e's order is
    seeded by ``derive_seed(run seed, "warmup", e)`` and its dropout masks by ``derive_seed(run seed, "warmup",
    "torch", e)``. A resumed run (``completed_rounds > 0``) already holds the warmed-up model and skips it; with
    β = 0 (G empty) there is nothing to train on and the warm-up is skipped too.

    The datamodule's :meth:`~lightning_fed.datamodules.FederatedDataModule.sharing_statistics` (|G|, mean share
    size, size-weighted mean EMD before and after sharing) are added to round 0's metrics.

    Data sharing is switched on by the datamodule's ``sharing``; this callback is listed explicitly in
    ``trainer.callbacks`` (the datamodule warns at setup when ``sharing.warmup_epochs > 0`` and it is missing).

    Args:
        epochs: Warm-up epochs; ``None`` uses the datamodule's ``sharing.warmup_epochs``.
        lr: Warm-up learning rate; ``None`` uses ``sharing.warmup_lr``, else the optimizer's own.
    """

    def __init__(self, epochs: int | None = None, lr: float | None = None) -> None:
        self.epochs: int | None = check_int("epochs", epochs, minimum=0, allow_none=True)
        self.lr: float | None = check_real("lr", lr, minimum=0.0, exclusive_minimum=True, allow_none=True)
        self.metrics: dict[str, float] = {}

    @override
    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        if getattr(datamodule, "sharing", None) is None:
            raise InvalidArgumentError(
                "data.init_args.sharing", None, "set (e.g. {beta: 0.05, alpha: 0.5}) for SharedDataWarmup"
            )

    @override
    def on_train_start(self, pl_trainer: Trainer, pl_module: LightningModule) -> None:
        trainer = federated_trainer(pl_trainer, self)
        datamodule = trainer.datamodule
        sharing = getattr(datamodule, "sharing", None)
        if sharing is None:
            raise ValueError(
                "SharedDataWarmup needs a datamodule with data sharing: set `data.init_args.sharing` (e.g. "
                "{beta: 0.05, alpha: 0.5}) or remove the callback."
            )
        if trainer.federation_state.completed_rounds > 0:
            return
        self.metrics = datamodule.sharing_statistics()
        epochs = sharing.warmup_epochs if self.epochs is None else self.epochs
        lr = self.lr if self.lr is not None else sharing.warmup_lr
        # beta = 0 leaves G empty: no sharing, and nothing to warm up on, so a beta sweep can include it.
        if epochs > 0 and self.metrics["sharing/global_set_size"] > 0:
            self.metrics.update(self._train(trainer, pl_module, epochs, lr))

    def _train(
        self, trainer: FederatedTrainerView, module: LightningModule, epochs: int, lr: float | None
    ) -> dict[str, float]:
        """Central SGD on G for ``epochs`` epochs, in place; returns the last epoch's logged means."""
        seed = trainer.resolve_seed()
        optimizer = trainer.optimizers[0]
        saved_lrs = [group["lr"] for group in optimizer.param_groups]
        # No hooks: the warm-up is server-side training, not a client's (no client_loss, no batch callbacks).
        central = LocalTrainer(trainer, module, mode="central")
        metrics: dict[str, float] = {}
        try:
            optimizer.state.clear()
            if lr is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr
            for epoch in range(epochs):
                loader = trainer.datamodule.shared_dataloader(seed=derive_seed(seed, "warmup", epoch))
                seed_torch(derive_seed(seed, "warmup", "torch", epoch))
                metrics = central.fit(loader, optimizer, epochs=1)
        finally:
            optimizer.state.clear()
            optimizer.zero_grad(set_to_none=True)
            for group, saved in zip(optimizer.param_groups, saved_lrs):
                group["lr"] = saved
        return {f"warmup/{key}": value for key, value in metrics.items()}

    @override
    def on_round_end(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        round_ctx: RoundContext,
        metrics: dict[str, float],
    ) -> None:
        if round_ctx.round_idx == 0:
            metrics.update(self.metrics)
