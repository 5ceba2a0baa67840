"""Small modules, data and recorders shared by the tests."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric

from lightning_fed import FedCallback, FederatedTrainer
from lightning_fed.datamodules import DatasetFederated, IidPartitioner
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset

NUM_FEATURES = 8
NUM_CLASSES = 4


def make_tensors(num_samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(num_samples, NUM_FEATURES, generator=generator)
    labels = (inputs[:, 0] > 0).long() + 2 * (inputs[:, 1] > 0).long()
    return inputs, labels


def make_datamodule(
    num_clients: int = 4,
    num_samples: int = 400,
    partitioner: Partitioner | None = None,
    batch_size: int = 16,
    **kwargs: Any,
) -> DatasetFederated:
    train = TensorClassificationDataset(*make_tensors(num_samples, seed=0))
    test = TensorClassificationDataset(*make_tensors(200, seed=1))
    partitioner = partitioner or IidPartitioner(num_partitions=num_clients, seed=0)
    return DatasetFederated(train, test, NUM_CLASSES, partitioner, batch_size=batch_size, **kwargs)


class BoringClassifier(L.LightningModule):
    """An MLP classifier that logs like a typical user module; optional BatchNorm (float and int buffers)."""

    def __init__(self, lr: float = 0.1, batch_norm: bool = False, dropout: float = 0.0, momentum: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(NUM_FEATURES, 16)]
        if batch_norm:
            layers.append(nn.BatchNorm1d(16))
        layers += [nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, NUM_CLASSES)]
        self.net = nn.Sequential(*layers)
        self.lr = lr
        self.momentum = momentum
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if self.poison:
            loss = loss * float("nan")
        self.log("train_loss", loss)
        return loss

    def _eval(self, batch: Any, stage: str) -> None:
        x, y = batch
        logits = self(x)
        self.log(f"{stage}_loss", F.cross_entropy(logits, y))
        self.log(f"{stage}_acc", (logits.argmax(1) == y).float().mean())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._eval(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


class MetricModule(BoringClassifier):
    """Logs a torchmetrics metric from ``training_step``, which side passes (APFL's, the SGD twin's) must not update."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.train_mean = MeanMetric()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.train_mean.update(loss.detach())
        self.log("train_metric_mean", self.train_mean)
        return loss


class PoisonClient(FedCallback):
    """Makes one client's training diverge (NaN loss), so that simulation rejects its update: in every round, or in
    ``round_idx`` only."""

    def __init__(self, client_id: int, round_idx: int | None = None) -> None:
        self.client_id = client_id
        self.round_idx = round_idx

    def on_client_start(self, trainer: Any, pl_module: Any, client_ctx: Any) -> None:
        pl_module.poison = client_ctx.client_id == self.client_id and self.round_idx in (None, client_ctx.round_idx)

    def on_client_end(self, trainer: Any, pl_module: Any, client_ctx: Any, update: Any) -> None:
        pl_module.poison = False


class HookRecorder(FedCallback):
    """Records the federated and Lightning hooks it sees, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.calls.append(("on_train_epoch_start", trainer.current_epoch))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.calls.append(("on_train_epoch_end", trainer.current_epoch))

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.calls.append(("on_validation_end", trainer.current_epoch))

    def on_round_start(self, trainer: Any, pl_module: Any, round_ctx: Any) -> None:
        self.calls.append(("on_round_start", round_ctx.round_idx))

    def on_client_start(self, trainer: Any, pl_module: Any, client_ctx: Any) -> None:
        self.calls.append(("on_client_start", client_ctx.round_idx, client_ctx.client_id))

    def on_client_train_start(self, trainer: Any, pl_module: Any, client_ctx: Any, dataloader: Any) -> None:
        self.calls.append(("on_client_train_start", client_ctx.round_idx, client_ctx.client_id))

    def on_client_end(self, trainer: Any, pl_module: Any, client_ctx: Any, update: Any) -> None:
        self.calls.append(("on_client_end", client_ctx.round_idx, client_ctx.client_id))

    def on_aggregate(self, trainer: Any, pl_module: Any, round_ctx: Any, new_params: Any) -> None:
        self.calls.append(("on_aggregate", round_ctx.round_idx))

    def on_client_evaluate_start(self, trainer: Any, pl_module: Any, client_ctx: Any) -> None:
        self.calls.append(("on_client_evaluate_start", client_ctx.round_idx, client_ctx.client_id))

    def on_round_end(self, trainer: Any, pl_module: Any, round_ctx: Any, metrics: Any) -> None:
        self.calls.append(("on_round_end", round_ctx.round_idx))


class OneCycleClassifier(BoringClassifier):
    """:class:`BoringClassifier` under a step-interval OneCycleLR sized by the run's stepping batches, as Lightning's
    docs size it: the learning rate changes at every step of every client. The momentum stays fixed (no cycling), so
    ``momentum=0`` is plain SGD."""

    def __init__(self, momentum: float = 0.0, max_lr: float = 0.5) -> None:
        super().__init__(lr=0.1, momentum=momentum)
        self.max_lr = max_lr
        self.total_steps: int | None = None

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
        self.total_steps = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=self.max_lr, total_steps=self.total_steps, cycle_momentum=False
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def one_cycle_lrs(total_steps: int, max_lr: float = 0.5) -> list[float]:
    """The learning rate of each step of a plain (non-federated) OneCycleLR run of ``total_steps`` steps, as
    :class:`OneCycleClassifier` configures it."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=max_lr, total_steps=total_steps, cycle_momentum=False
    )
    lrs = []
    for _ in range(total_steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


class FrozenTrunkClassifier(BoringClassifier):
    """A :class:`BoringClassifier` whose first layer is a frozen base (as a pretrained trunk under adapters): only
    the later layers and the BatchNorm statistics are federated."""

    #: The frozen base's state_dict keys.
    FROZEN = ("net.0.weight", "net.0.bias")

    def __init__(self, lr: float = 0.1, batch_norm: bool = True, **kwargs: Any) -> None:
        super().__init__(lr=lr, batch_norm=batch_norm, **kwargs)
        self.net[0].requires_grad_(False)


class BigTrunk(nn.Module):
    """A large frozen trunk and a small trainable head."""

    def __init__(self, width: int = 512, depth: int = 6) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(NUM_FEATURES, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.trunk = nn.Sequential(*layers).requires_grad_(False)
        self.head = nn.Linear(width, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


class BigTrunkClassifier(FrozenTrunkClassifier):
    """A classifier on a big frozen trunk (about 5 MB) with a small trainable head (8 KB), as a foundation model
    under a small adapter."""

    FROZEN = tuple(f"net.trunk.{2 * layer}.{name}" for layer in range(6) for name in ("weight", "bias"))

    def __init__(self) -> None:
        super().__init__()
        self.net = BigTrunk()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)


def fast_trainer(tmp_path: Any, **kwargs: Any) -> FederatedTrainer:
    """A quiet CPU trainer writing under ``tmp_path``."""
    defaults: dict[str, Any] = dict(
        num_rounds=2,
        clients_per_round=2,
        default_root_dir=str(tmp_path),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    defaults.update(kwargs)
    return FederatedTrainer(**defaults)


def global_weights(module: L.LightningModule) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def plain_sgd_pass(model: L.LightningModule, loader: Any) -> dict[str, torch.Tensor]:
    """One pass of the model's own loss over ``loader`` with its own optimizer from fresh state (a reference loop
    with no federated machinery); returns the trained state."""
    from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging

    optimizer = model.configure_optimizers()
    model.train()
    with buffered_logging(model, LogBuffer()):
        for batch_idx, batch in enumerate(loader):
            model.training_step(batch, batch_idx).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model.state_dict()
