"""A module built on the ``pytorch_lightning`` package's base class, as Flower's Lightning examples are.

The check reads only where the base class comes from, so the tests stand in a class of that package's module name for
the package itself: importing ``pytorch_lightning`` would redirect Lightning's rank-zero messages for the whole test
process, and the project depends on ``lightning.pytorch`` only.
"""

from __future__ import annotations

from typing import Any

import torch

# `pytorch_lightning.LightningModule`, as far as the check can tell: a module class defined in that package.
ForeignLightningModule = type("LightningModule", (torch.nn.Module,), {"__module__": "pytorch_lightning.core.module"})


class PytorchLightningClassifier(ForeignLightningModule):  # type: ignore[misc, valid-type]
    """A linear classifier on the ``pytorch_lightning`` package."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.layer = torch.nn.LazyLinear(num_classes)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)
