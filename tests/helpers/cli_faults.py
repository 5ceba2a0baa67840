"""Components a test config names by class path to make a run meet a fault: bad test labels, a module without
``configure_optimizers``, a ``training_step`` that raises on one client in one round, modules whose
optimisation the client loop refuses and a disk that fills mid-run."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from lightning_fed.datamodules import MNIST1DFederated
from lightning_fed.hooks import FedCallback
from lightning_fed.models import ClassifierModule


class MNIST1DWithBadTestLabels(MNIST1DFederated):
    """MNIST-1D whose global test set holds one label of -1."""

    def _load_datasets(self) -> Any:
        train, test = super()._load_datasets()
        test.targets[0] = -1
        return train, test


class NoOptimizerClassifier(ClassifierModule):
    """A classifier that leaves ``configure_optimizers`` to LightningModule's default (none)."""

    configure_optimizers = LightningModule.configure_optimizers  # type: ignore[assignment]


class FailingClassifier(ClassifierModule):
    """A classifier whose ``training_step`` raises on client ``fail_client`` in round ``fail_round``."""

    def __init__(self, *args: Any, fail_client: int = 1, fail_round: int = 2, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail_client, self.fail_round = fail_client, fail_round
        self.current: tuple[int, int] | None = None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.current == (self.fail_round, self.fail_client):
            raise RuntimeError("the user's training_step failed")
        return super().training_step(batch, batch_idx)


class TellClient(FedCallback):
    """Tells a :class:`FailingClassifier` which client and round it trains."""

    def on_client_start(self, trainer: Any, pl_module: LightningModule, client_ctx: Any) -> None:
        pl_module.current = (client_ctx.round_idx, client_ctx.client_id)  # type: ignore[assignment]


class ManualOptimizationClassifier(ClassifierModule):
    """A classifier that steps its own optimizer (`automatic_optimization = False`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False


class TwoOptimizerClassifier(ClassifierModule):
    """A classifier whose `configure_optimizers` returns two optimizers."""

    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.01)]


class SchedulerClassifier(ClassifierModule):
    """A classifier with an LR scheduler configured by `interval`, `frequency` and, for a plateau, `monitor`."""

    def __init__(
        self, *args: Any, interval: str = "epoch", frequency: int = 1, monitor: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.interval, self.frequency, self.monitor = interval, frequency, monitor

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if self.monitor is None:
            scheduler: Any = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        else:
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        config = {"scheduler": scheduler, "interval": self.interval, "frequency": self.frequency}
        if self.monitor is not None:
            config["monitor"] = self.monitor
        return {"optimizer": optimizer, "lr_scheduler": config}


class FillDiskOnce(FedCallback):
    """Fills the file system of ``trainer.default_root_dir`` when the first client of round ``fill_round`` ends (a
    disk that fills mid-run), once: ``marker`` (outside that file system) records that it did, so that the resumed
    run and a reference run, configured alike, train undisturbed."""

    def __init__(self, marker: str, fill_round: int = 2) -> None:
        self.marker, self.fill_round = Path(marker), fill_round

    def on_client_end(self, trainer: Any, pl_module: LightningModule, client_ctx: Any, update: Any) -> None:
        if client_ctx.round_idx != self.fill_round or self.marker.exists():
            return
        self.marker.write_text("filled")
        try:
            with (Path(trainer.default_root_dir) / "filler").open("ab") as filler:
                while True:
                    filler.write(bytes(1 << 16))
                    filler.flush()
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
