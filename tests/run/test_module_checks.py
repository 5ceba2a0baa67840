"""Module checks run before a fit writes anything, each with one line; building the optimizers early leaves no
trace on the run. (The CLI's cases are in ``tests/cli/test_invalid_inputs.py``.)"""

import random
from typing import Any

import numpy as np
import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule
from helpers.pl_module import PytorchLightningClassifier

from lightning_fed.callbacks import FedProx
from lightning_fed.run.module_checks import check_lightning_package, check_optimization_setup


class Manual(BoringClassifier):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class TwoOptimizers(BoringClassifier):
    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]


class Scheduled(BoringClassifier):
    def __init__(self, **config: Any) -> None:
        super().__init__()
        self.config = config
        self.calls = 0

    def configure_optimizers(self) -> Any:
        self.calls += 1
        torch.rand(1), random.random(), np.random.rand()  # draws that must not shift the run's
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = "monitor" in self.config
        scheduler: Any = (
            torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            if plateau
            else torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **self.config}}


class SizedByTheFit(BoringClassifier):
    """Sizes its schedule by ``trainer.estimated_stepping_batches``, which only the fit can answer."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=int(total))
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


@pytest.mark.parametrize(
    ("module", "message", "callbacks"),
    [
        # Manual optimisation itself trains (tests/test_existing_modules.py); an algorithm acting inside the step can't.
        (Manual(), "manual optimisation", [FedProx(mu=0.1)]),
        (TwoOptimizers(), "returned 2 optimizers", []),
        (Scheduled(interval="step", monitor="train_loss"), "interval='step'", []),
        (Scheduled(frequency=0), "frequency=0", []),
        (Scheduled(monitor="val_loss"), "monitors 'val_loss'", []),
        (PytorchLightningClassifier(), "import lightning.pytorch as pl", []),
    ],
    ids=[
        "manual",
        "two_optimizers",
        "plateau_every_step",
        "frequency_0",
        "plateau_without_validation",
        "pytorch_lightning",
    ],
)
def test_fit_refuses_in_one_line_before_writing(tmp_path, module, message, callbacks):
    root = tmp_path / "root"
    trainer = fast_trainer(root, callbacks=callbacks)
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(")) as error:
        trainer.fit(module, datamodule=make_datamodule(num_clients=4, num_samples=160))
    assert "\n" not in str(error.value)
    assert not root.exists() or list(root.iterdir()) == []


def test_a_plateau_on_validation_trains_when_validation_runs(tmp_path):
    module = Scheduled(monitor="val_loss")
    trainer = fast_trainer(tmp_path, num_rounds=1)
    trainer.fit(module, datamodule=make_datamodule(num_clients=4, num_samples=160, val_fraction=0.2))
    assert trainer.federation_state.completed_rounds == 1


def test_a_plateau_on_a_training_metric_is_not_refused(tmp_path):
    trainer = fast_trainer(tmp_path)
    check_optimization_setup(trainer, Scheduled(monitor="train/loss"), make_datamodule(num_clients=4))


def test_the_early_check_leaves_no_trace(tmp_path):
    module, trainer = Scheduled(), fast_trainer(tmp_path)
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    expected = torch.rand(1), random.random(), np.random.rand()
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    check_optimization_setup(trainer, module, make_datamodule(num_clients=4))
    assert (torch.rand(1), random.random(), np.random.rand()) == expected
    assert module.calls == 1 and module._trainer is None


def test_a_module_that_needs_the_fit_is_checked_when_the_rounds_start(tmp_path):
    trainer = fast_trainer(tmp_path, num_rounds=1)
    check_optimization_setup(trainer, SizedByTheFit(), make_datamodule(num_clients=4))  # skipped, no error
    trainer.fit(SizedByTheFit(), datamodule=make_datamodule(num_clients=4, num_samples=160))
    assert trainer.federation_state.completed_rounds == 1


def test_pytorch_lightning_class_and_instance():
    with pytest.raises(TypeError, match="`pytorch_lightning` package"):
        check_lightning_package(PytorchLightningClassifier)
    check_lightning_package(BoringClassifier())
    check_lightning_package(None)
