"""A plain cross-entropy classifier LightningModule, the local model every federated client trains.

The papers' local objective is the empirical cross-entropy minimised by SGD (McMahan et al. 2017, arXiv:1602.05629;
Zhao et al. 2018, arXiv:1806.00582; Wang et al., "Distribution-Regularized Federated Learning on Non-IID Data",
ICDE 2023). Federated regularisers (FedProx, rFedAvg, FedCurv, ...) are added by
callbacks, so this module stays algorithm-agnostic.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_choice, check_instance, check_int, check_real

_OPTIMIZERS = ("sgd", "adam", "adamw")


def _validate(num_classes: int, optimizer: str, lr: float, momentum: float, weight_decay: float) -> None:
    """Raises :class:`~lightning_fed.checks.InvalidArgumentError` naming the first bad argument."""
    check_int("num_classes", num_classes, minimum=2)
    check_choice("optimizer", optimizer, _OPTIMIZERS)
    check_real("lr", lr, minimum=0.0, exclusive_minimum=True)
    check_real("momentum", momentum, minimum=0.0, maximum=1.0, exclusive_maximum=True)
    if momentum != 0.0 and optimizer != "sgd":
        # Adam's betas play momentum's role; silently dropping a momentum setting would hide a config mistake.
        raise InvalidArgumentError("momentum", momentum, f"0 with optimizer={optimizer!r} (only 'sgd' uses momentum)")
    check_real("weight_decay", weight_decay, minimum=0.0)


class ClassifierModule(L.LightningModule):
    """Wraps a backbone that maps inputs to ``[B, num_classes]`` logits and trains it with cross-entropy.

    Batches are ``(x, y)`` pairs with integer class labels ``y``. Logged values:

    * training: ``train_loss`` only. The training step is kept lean (no metric update) because federated benchmarks
      time it.
    * validation: ``val_loss`` and ``val_acc``; test: ``test_loss`` and ``test_acc``. Accuracy is micro-averaged
      (the fraction of correct predictions), accumulated by one ``MulticlassAccuracy`` per stage. Metric states are
      not persistent, so they never enter ``state_dict()`` and aggregators see only the backbone's tensors.

    Every step checks that the logits have shape ``[B, num_classes]`` (a shape comparison, negligible next to the
    forward pass) and raises a ``ValueError`` naming ``num_classes`` otherwise, instead of letting cross-entropy fail
    with an index error or, worse, silently train with extra classes.

    Hyperparameters are saved without the backbone, so ``hparams`` holds only plain Python values and checkpoints
    load with ``torch.load(weights_only=True)``.

    Args:
        backbone: The network, e.g. :class:`~lightning_fed.models.FedAvgCNN`.
        num_classes: Number of classes the backbone outputs.
        optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"``.
        lr: Learning rate (η in ALGORITHMS.md).
        momentum: SGD momentum; must be 0 for the Adam variants.
        weight_decay: L2 penalty (decoupled for AdamW).
    """

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        optimizer: str = "sgd",
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        check_instance("backbone", backbone, nn.Module, "a torch.nn.Module")
        _validate(num_classes, optimizer, lr, momentum, weight_decay)
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = backbone
        self.num_classes = num_classes
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Returns the backbone's logits for ``x``."""
        return self.backbone(x)

    def _logits_and_loss(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        x, y = batch
        logits = self(x)
        if logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"The backbone returned logits of shape {tuple(logits.shape)}, expected [batch, {self.num_classes}]: "
                "check `num_classes` against the backbone's output layer."
            )
        return logits, y, F.cross_entropy(logits, y)

    @override
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the mean cross-entropy of the batch and logs it as ``train_loss``."""
        _, y, loss = self._logits_and_loss(batch)
        # An explicit batch size spares Lightning from searching the batch for one on every step.
        self.log("train_loss", loss, batch_size=y.shape[0])
        return loss

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Logs ``val_loss`` and accumulates ``val_acc``."""
        logits, y, loss = self._logits_and_loss(batch)
        self.val_acc.update(logits, y)
        self.log("val_loss", loss, batch_size=y.shape[0])
        self.log("val_acc", self.val_acc)

    @override
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Logs ``test_loss`` and accumulates ``test_acc``."""
        logits, y, loss = self._logits_and_loss(batch)
        self.test_acc.update(logits, y)
        self.log("test_loss", loss, batch_size=y.shape[0])
        self.log("test_acc", self.test_acc)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Returns the optimizer named by ``optimizer`` over all parameters."""
        hp = self.hparams
        lr, weight_decay = hp["lr"], hp["weight_decay"]
        if hp["optimizer"] == "sgd":
            return torch.optim.SGD(self.parameters(), lr=lr, momentum=hp["momentum"], weight_decay=weight_decay)
        optimizer_cls = torch.optim.Adam if hp["optimizer"] == "adam" else torch.optim.AdamW
        return optimizer_cls(self.parameters(), lr=lr, weight_decay=weight_decay)
