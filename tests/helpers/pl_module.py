"""A module written against the ``pytorch_lightning`` package, as Flower's Lightning examples are.

Importing ``pytorch_lightning`` points Lightning's rank-zero messages ("GPU available: ...") at its own logger for the
whole process; the import here puts them back on ``lightning.pytorch``'s, so the tests that run after it read them
where they expect.
"""

from __future__ import annotations

from typing import Any

import lightning_utilities.core.rank_zero as rank_zero
import torch

_log = rank_zero.log
import pytorch_lightning as pl  # noqa: E402

rank_zero.log = _log


class PytorchLightningClassifier(pl.LightningModule):
    """A linear classifier on the ``pytorch_lightning`` package."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.layer = torch.nn.LazyLinear(num_classes)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)
