"""Step hooks are called as Lightning calls them: ``batch_idx`` (and ``dataloader_idx``) only when the hook takes it,
in local training, evaluation, loss probes and batched groups."""

import functools
import warnings
from typing import Any

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import NUM_CLASSES, NUM_FEATURES, BoringClassifier, fast_trainer, make_datamodule
from torch import nn

from lightning_fed.aggregators import QFedAvg
from lightning_fed.callbacks import APFL, FedCurv
from lightning_fed.engine.training_step import bind_step, call_step


class BatchOnly(L.LightningModule):
    """Steps written as Lightning's GAN example and several of its guides write them: no ``batch_idx``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(NUM_FEATURES, 16), nn.ReLU(), nn.Linear(16, NUM_CLASSES))
        self.calls = {"training_step": 0, "validation_step": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any) -> torch.Tensor:
        self.calls["training_step"] += 1
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any) -> None:
        self.calls["validation_step"] += 1
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class WithDataloaderIdx(BoringClassifier):
    """A ``test_step`` written for several evaluation loaders, with the default Lightning's docs give it."""

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        assert isinstance(batch_idx, int) and dataloader_idx == 0
        self._eval(batch, "test")


class RequiresDataloaderIdx(BoringClassifier):
    """A ``test_step`` that requires ``dataloader_idx``: every pass reads one loader, so it gets 0."""

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        assert dataloader_idx == 0
        self._eval(batch, "test")


def _fit(tmp_path, module, **kwargs):
    trainer = fast_trainer(tmp_path, client_eval="all", **kwargs)
    trainer.fit(module, datamodule=make_datamodule(num_clients=4, num_samples=160))
    return trainer


@pytest.mark.parametrize("parallelism", [1, 2], ids=["sequential", "batched"])
def test_steps_without_batch_idx_train_and_evaluate(tmp_path, parallelism):
    module = BatchOnly()
    with warnings.catch_warnings():
        # The batched run must not fall back to one client at a time.
        warnings.filterwarnings("error", message="client_parallelism")
        trainer = _fit(tmp_path, module, client_parallelism=parallelism)
    assert trainer.federation_state.completed_rounds == 2
    assert module.calls["training_step"] > 0 and module.calls["validation_step"] > 0
    metrics = trainer.federation_state.history[-1]
    assert "global/val_acc" in metrics and "client/val_acc_mean" in metrics


def test_probes_call_steps_without_batch_idx(tmp_path):
    """q-FedAvg's loss probe, FedCurv's Fisher pass and APFL's step gradient all run the module's step."""
    for kwargs in (
        {"aggregator": QFedAvg(q=1.0)},
        {"callbacks": [FedCurv(lam=0.1)]},
        {"callbacks": [APFL(alpha=0.5)]},
    ):
        trainer = _fit(tmp_path, BatchOnly(), num_rounds=1, **kwargs)
        assert trainer.federation_state.completed_rounds == 1, kwargs


@pytest.mark.parametrize("module_class", [WithDataloaderIdx, RequiresDataloaderIdx])
def test_test_step_with_dataloader_idx(tmp_path, module_class):
    trainer = _fit(tmp_path, module_class(), num_rounds=1)
    assert "global/test_acc" in trainer.federation_state.history[-1]


def _logged(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    return wrapper


class Signatures:
    def batch_only(self, batch):
        return (batch,)

    def renamed(self, batch, idx):
        return (batch, idx)

    def variadic(self, *args):
        return args

    def optional_dataloader(self, batch, batch_idx, dataloader_idx=7):
        return (batch, batch_idx, dataloader_idx)

    def required_dataloader(self, batch, batch_idx, dataloader_idx):
        return (batch, batch_idx, dataloader_idx)

    @_logged
    def decorated(self, batch):
        return (batch,)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("batch_only", ("b",)),
        ("renamed", ("b", 3)),
        ("variadic", ("b", 3)),
        ("optional_dataloader", ("b", 3, 7)),
        ("required_dataloader", ("b", 3, 0)),
        ("decorated", ("b",)),
    ],
)
def test_call_step_passes_what_the_signature_takes(name, expected):
    assert call_step(getattr(Signatures(), name), "b", 3) == expected


class _Steps:
    """Step hooks of every signature Lightning's loops accept, as methods (call_step takes bound hooks)."""

    def batch_only(self, batch):
        return (batch,)

    def with_index(self, batch, batch_idx):
        return (batch, batch_idx)

    def other_name(self, batch, index):
        return (batch, index)

    def with_loader_index(self, batch, batch_idx, dataloader_idx):
        return (batch, batch_idx, dataloader_idx)

    def loader_index_default(self, batch, batch_idx, dataloader_idx=0):
        return (batch, batch_idx)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("batch_only", ("b",)),
        ("with_index", ("b", 3)),
        ("other_name", ("b", 3)),
        ("with_loader_index", ("b", 3, 0)),
        ("loader_index_default", ("b", 3)),
    ],
)
def test_a_step_bound_once_per_pass_gets_what_call_step_gives(name, expected):
    step = getattr(_Steps(), name)
    assert bind_step(step)("b", 3) == call_step(step, "b", 3) == expected
