"""A plain cross-entropy classifier LightningModule, the local model every federated client trains.

The papers' local objective is the empirical cross-entropy minimised by SGD (McMahan et al. 2017; Zhao et al. 2018,
paper 003; Wang et al. 2023, paper 000). Federated regularisers (FedProx, rFedAvg, FedCurv, ...) are added by
callbacks, so this module stays algorithm-agnostic.
"""

from __future__ import annotations

import math

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

_OPTIMIZERS = ("sgd", "adam", "adamw")


def _is_real(value: object) -> bool:
    # bool is an int subclass, but `lr=True` is a config mistake, not a learning rate of 1.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate(num_classes: int, optimizer: str, lr: float, momentum: float, weight_decay: float) -> None:
    """Raises ``ValueError`` naming the first bad argument."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"`num_classes` must be an integer >= 2, got {num_classes!r}.")
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"`optimizer` must be one of {_OPTIMIZERS}, got {optimizer!r}.")
    if not _is_real(lr) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"`lr` must be a finite positive number, got {lr!r}.")
    if not _is_real(momentum) or not 0.0 <= momentum < 1.0:
        raise ValueError(f"`momentum` must lie in [0, 1), got {momentum!r}.")
    if momentum != 0.0 and optimizer != "sgd":
        # Adam's betas play momentum's role; silently dropping a momentum setting would hide a config mistake.
        raise ValueError(f"`momentum` is only used with optimizer='sgd'; got momentum={momentum} with {optimizer!r}.")
    if not _is_real(weight_decay) or not math.isfinite(weight_decay) or weight_decay < 0:
        raise ValueError(f"`weight_decay` must be a finite non-negative number, got {weight_decay!r}.")


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
        if not isinstance(backbone, nn.Module):
            raise TypeError(f"`backbone` must be a torch.nn.Module, got {type(backbone).__name__}.")
        _validate(num_classes, optimizer, lr, momentum, weight_decay)
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = backbone
        self.num_classes = num_classes
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

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

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Returns the mean cross-entropy of the batch and logs it as ``train_loss``."""
        _, y, loss = self._logits_and_loss(batch)
        # An explicit batch size spares Lightning from searching the batch for one on every step.
        self.log("train_loss", loss, batch_size=y.shape[0])
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Logs ``val_loss`` and accumulates ``val_acc``."""
        logits, y, loss = self._logits_and_loss(batch)
        self.val_acc.update(logits, y)
        self.log("val_loss", loss, batch_size=y.shape[0])
        self.log("val_acc", self.val_acc)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        """Logs ``test_loss`` and accumulates ``test_acc``."""
        logits, y, loss = self._logits_and_loss(batch)
        self.test_acc.update(logits, y)
        self.log("test_loss", loss, batch_size=y.shape[0])
        self.log("test_acc", self.test_acc)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Returns the optimizer named by ``optimizer`` over all parameters."""
        hp = self.hparams
        if hp.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
        optimizer_cls = torch.optim.Adam if hp.optimizer == "adam" else torch.optim.AdamW
        return optimizer_cls(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
