"""Data without labels, dict batches and the loader options, on the library's datamodules and in a federated fit."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from helpers.boring import NUM_FEATURES, BoringClassifier, fast_trainer, make_datamodule, make_tensors
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.datamodules import (
    DatasetFederated,
    DataSharing,
    DirichletPartitioner,
    IidPartitioner,
    TensorClassificationDataset,
)


class RandomDataset(Dataset):
    """Lightning's bug-report dataset: every item a bare feature tensor, no label."""

    def __init__(self, size: int, length: int, non_negative: bool = False) -> None:
        data = torch.randn(length, size, generator=torch.Generator().manual_seed(0))
        self.data = data.abs() * 3 if non_negative else data

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return len(self.data)


class BugReportModel(L.LightningModule):
    """Lightning's BoringModel: its steps take ``batch`` as a tensor and compute a loss from the output alone."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(NUM_FEATURES, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self(batch).sum()
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("test_loss", self(batch).sum())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class DictBatchClassifier(BoringClassifier):
    """Reads batches the way Flower's quickstart module does: ``batch["image"]`` and ``batch["label"]``."""

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch["image"]), batch["label"])
        self.log("train_loss", loss)
        return loss

    def _eval(self, batch: Any, stage: str) -> None:
        logits = self(batch["image"])
        self.log(f"{stage}_acc", (logits.argmax(1) == batch["label"]).float().mean())


# ---------------------------------------------------------------------------------------------------------------
# Data without labels


@pytest.mark.parametrize("non_negative", [False, True])
def test_bare_tensors_have_no_labels_and_a_feature_is_never_read_as_one(non_negative):
    dm = DatasetFederated(RandomDataset(NUM_FEATURES, 40, non_negative), None, None, IidPartitioner(4))
    dm.setup()
    assert not dm.has_labels
    assert dm.label_histogram().tolist() == [[dm.client_num_samples(c)] for c in dm.client_ids()]
    assert float(dm.client_emd().abs().max()) == 0.0


def test_only_integer_scalars_paired_with_an_input_are_labels():
    inputs, labels = make_tensors(40)
    regression = DatasetFederated(TensorDataset(inputs, inputs[:, 0]), None, None, IidPartitioner(2))
    regression.setup()
    assert not regression.has_labels  # a float target is not a class id
    pairs = DatasetFederated(TensorDataset(inputs, labels), None, None, IidPartitioner(2))
    pairs.setup()
    assert pairs.has_labels and pairs.num_classes == int(labels.max()) + 1
    assert int(pairs.label_histogram().sum()) == sum(pairs.client_num_samples(c) for c in pairs.client_ids())


def test_label_fn_gives_labels_to_any_item():
    inputs, labels = make_tensors(40)

    class Records(Dataset):
        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"x": inputs[index], "y": int(labels[index])}

        def __len__(self) -> int:
            return 40

    dm = DatasetFederated(Records(), None, 4, DirichletPartitioner(2, alpha=1.0), label_fn=lambda item: item["y"])
    dm.setup()
    assert dm.has_labels and torch.equal(dm._split.labels, labels)
    bad = DatasetFederated(Records(), None, None, IidPartitioner(2), label_fn=lambda item: float(item["y"]))
    with pytest.raises(ValueError, match="label_fn"):
        bad.setup()


@pytest.mark.parametrize(
    ("setting", "kwargs"),
    [
        ("partitioner", {"partitioner": DirichletPartitioner(4, alpha=0.5)}),
        ("num_classes", {"num_classes": 1}),
        ("sharing", {"sharing": DataSharing(alpha=0.1, beta=0.1)}),
    ],
)
def test_settings_that_need_labels_are_refused_in_one_line(setting, kwargs):
    args: dict[str, Any] = {"num_classes": None, "partitioner": IidPartitioner(4)} | kwargs
    dm = DatasetFederated(RandomDataset(NUM_FEATURES, 40), None, **args)
    with pytest.raises(InvalidArgumentError, match="the training data has no labels") as caught:
        dm.setup()
    assert caught.value.argument == setting
    assert "\n" not in str(caught.value) and "targets" in str(caught.value) and "label_fn" in str(caught.value)


def test_unlabeled_bare_tensors_train_two_rounds_under_an_iid_split(tmp_path):
    L.seed_everything(0)
    dm = DatasetFederated(RandomDataset(NUM_FEATURES, 64), None, None, IidPartitioner(4), batch_size=4)
    module = BugReportModel()
    before = module.layer.weight.detach().clone()
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2)
    trainer.fit(module, datamodule=dm)
    assert len(trainer.federation_state.history) == 2
    assert not torch.equal(module.layer.weight, before)


# ---------------------------------------------------------------------------------------------------------------
# Dict batches


@pytest.mark.parametrize("dataset_kind", ["tensor", "generic"])
def test_dict_batches_on_both_loader_paths(dataset_kind):
    inputs, labels = make_tensors(40)
    train: Dataset = TensorClassificationDataset(inputs, labels)
    if dataset_kind == "generic":
        train = TensorDataset(inputs, labels)
    dm = DatasetFederated(train, None, 4, IidPartitioner(2), batch_size=8, batch_format="dict")
    dm.setup()
    loaders = [dm.client_dataloader(0, seed=0), dm.client_test_dataloader(0), dm.test_dataloader()]
    for loader in loaders:
        batch = next(iter(loader))
        assert set(batch) == {"image", "label"} and batch["image"].shape[1:] == (NUM_FEATURES,)
    keyed = DatasetFederated(train, None, 4, IidPartitioner(2), batch_format="dict", batch_keys=["x", "y"])
    keyed.setup()
    assert set(next(iter(keyed.train_dataloader()))) == {"x", "y"}


def test_batch_keys_are_checked():
    with pytest.raises(InvalidArgumentError, match="batch_keys"):
        make_datamodule(batch_keys=["image", "image"])
    with pytest.raises(InvalidArgumentError, match="batch_format"):
        make_datamodule(batch_format="list")


@pytest.mark.parametrize("client_parallelism", [1, 2])
def test_a_dict_batch_module_trains_and_evaluates(tmp_path, client_parallelism):
    L.seed_everything(0)
    module = DictBatchClassifier()
    trainer = fast_trainer(tmp_path, num_rounds=2, client_parallelism=client_parallelism)
    trainer.fit(module, datamodule=make_datamodule(val_fraction=0.1, batch_format="dict"))
    assert len(trainer.federation_state.history) == 2
    assert "global/test_acc" in trainer.federation_state.history[-1]


# ---------------------------------------------------------------------------------------------------------------
# Loader options


@pytest.mark.parametrize("dataset_kind", ["tensor", "generic"])
def test_drop_last_drops_only_the_short_training_batch(dataset_kind):
    inputs, labels = make_tensors(46)
    train: Dataset = TensorClassificationDataset(inputs, labels)
    if dataset_kind == "generic":
        train = TensorDataset(inputs, labels)
    dm = DatasetFederated(train, None, 4, IidPartitioner(2), batch_size=5, client_test_fraction=0.2, drop_last=True)
    dm.setup()
    size = dm.client_num_samples(0)
    sizes = [len(batch[0]) for batch in dm.client_dataloader(0, seed=0)]
    assert sizes == [5] * (size // 5) and len(dm.client_dataloader(0, seed=0)) == size // 5
    assert sum(len(batch[0]) for batch in dm.client_test_dataloader(0)) == dm._split.client_tests[0].numel()


def test_loader_options_reach_every_loader_and_only_drop_last_enters_the_fingerprint():
    plain = make_datamodule(num_workers=1)
    plain.setup()
    tuned = make_datamodule(num_workers=1, pin_memory=True, persistent_workers=True)
    tuned.setup()
    loaders = [tuned.client_dataloader(0, seed=0), tuned.client_test_dataloader(0), tuned.test_dataloader()]
    assert all(loader.pin_memory and loader.persistent_workers and loader.num_workers == 1 for loader in loaders)
    assert tuned.state_dict() == plain.state_dict()
    dropping = make_datamodule(num_workers=1, drop_last=True)
    dropping.setup()
    assert dropping.state_dict() != plain.state_dict()
    with pytest.raises(InvalidArgumentError, match="persistent_workers"):
        make_datamodule(persistent_workers=True)


def test_drop_last_refuses_clients_without_a_full_batch():
    dm = make_datamodule(num_samples=100, batch_size=32, drop_last=True)
    with pytest.raises(InvalidArgumentError, match="drop_last") as caught:
        dm.setup()
    assert "clients" in str(caught.value) and "\n" not in str(caught.value)


def _dirichlet_batchnorm_fit(tmp_path, drop_last: bool) -> Any:
    L.seed_everything(0)
    dm = make_datamodule(
        num_samples=200,
        partitioner=DirichletPartitioner(4, alpha=0.5, seed=1),
        batch_size=8,
        client_test_fraction=0,
        drop_last=drop_last,
    )
    dm.setup()
    assert dm.client_num_samples(2) % 8 == 1  # client 2's last batch holds one example
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=4)
    trainer.fit(BoringClassifier(batch_norm=True), datamodule=dm)
    return trainer


def test_batchnorm_on_a_dirichlet_split_trains_with_drop_last(tmp_path):
    trainer = _dirichlet_batchnorm_fit(tmp_path, drop_last=True)
    assert len(trainer.federation_state.history) == 2


def test_batchnorm_meeting_a_batch_of_one_says_so_in_one_line(tmp_path):
    with pytest.raises(InvalidArgumentError) as caught:
        _dirichlet_batchnorm_fit(tmp_path, drop_last=False)
    message = str(caught.value)
    assert "\n" not in message and caught.value.argument == "drop_last"
    assert "client 2 (49 examples)" in message and "round 0" in message and "drop_last: true" in message
