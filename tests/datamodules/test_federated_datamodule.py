"""FederatedDataModule: splits, loaders, errors and checkpoint fingerprints, on small in-memory data."""

from __future__ import annotations

from types import SimpleNamespace

import lightning.pytorch as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_fed.datamodules import (
    DatasetFederated,
    DirichletPartitioner,
    FederatedDataModule,
    IidPartitioner,
    TensorClassificationDataset,
)
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.vision import _TorchvisionFederated

NUM_CLASSES = 5


def _labels(num_samples: int, seed: int = 0) -> torch.Tensor:
    # Unequal class frequencies, so stratification is observable.
    probabilities = torch.tensor([0.4, 0.25, 0.15, 0.12, 0.08])
    return torch.multinomial(
        probabilities, num_samples, replacement=True, generator=torch.Generator().manual_seed(seed)
    )


def _indexed(num_samples: int, seed: int = 0) -> TensorClassificationDataset:
    """A dataset whose input is its own index, so loaders reveal exactly which examples they serve."""
    return TensorClassificationDataset(
        torch.arange(num_samples, dtype=torch.float32).unsqueeze(1), _labels(num_samples, seed)
    )


def _datamodule(num_samples: int = 1000, partitioner: Partitioner | None = None, **kwargs) -> DatasetFederated:
    test = _indexed(100, seed=1)
    partitioner = partitioner or IidPartitioner(num_partitions=8, seed=0)
    return DatasetFederated(_indexed(num_samples), test, NUM_CLASSES, partitioner, **kwargs)


def _served(loader: DataLoader | None) -> torch.Tensor:
    if loader is None:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([x.reshape(-1) for x, _ in loader]).long()


class _FixedPartitioner(Partitioner):
    """Returns the given parts, whatever the labels (for error paths)."""

    def __init__(self, parts: list[list[int]]) -> None:
        super().__init__(len(parts))
        self.parts = parts

    def partition(self, labels, natural_ids=None):
        return [torch.tensor(part, dtype=torch.int64) for part in self.parts]


def test_client_splits_are_disjoint_and_cover_the_training_data():
    dm = _datamodule(val_fraction=0.1, client_test_fraction=0.25)
    dm.setup("fit")
    pieces = [_served(dm.val_dataloader())]
    for client in dm.client_ids():
        train, test = _served(dm.client_dataloader(client, seed=0)), _served(dm.client_test_dataloader(client))
        assert train.numel() == dm.client_num_samples(client) > 0
        pieces += [train, test]
    everything = torch.cat(pieces)
    assert everything.numel() == 1000
    assert torch.equal(everything.sort().values, torch.arange(1000))


def test_client_test_split_has_the_clients_label_distribution():
    dm = _datamodule(partitioner=DirichletPartitioner(6, alpha=0.5, min_partition_size=20, seed=3))
    dm.setup()
    labels = dm._split.labels
    for client in dm.client_ids():
        train, test = _served(dm.client_dataloader(client, seed=1)), _served(dm.client_test_dataloader(client))
        whole = torch.bincount(labels[torch.cat([train, test])], minlength=NUM_CLASSES)
        held = torch.bincount(labels[test], minlength=NUM_CLASSES)
        assert test.numel() == int(whole.sum() * 0.2 + 0.5)
        assert ((held - whole * test.numel() / whole.sum()).abs() < 1).all()


def test_client_test_size_holds_out_a_fixed_number():
    dm = _datamodule(client_test_fraction=0, client_test_size=30)
    dm.setup()
    assert all(_served(dm.client_test_dataloader(c)).numel() == 30 for c in dm.client_ids())
    assert sum(dm.client_num_samples(c) for c in dm.client_ids()) == 1000 - 8 * 30


def test_validation_is_stratified_and_disjoint_from_clients_and_absent_when_disabled():
    dm = _datamodule(val_fraction=0.2)
    dm.setup()
    val = _served(dm.val_dataloader())
    assert val.numel() == 200
    clients = torch.cat(
        [
            torch.cat([_served(dm.client_dataloader(c, 0)), _served(dm.client_test_dataloader(c))])
            for c in dm.client_ids()
        ]
    )
    assert not torch.isin(val, clients).any()
    labels = dm._split.labels
    expected = torch.bincount(labels, minlength=NUM_CLASSES) * 0.2
    assert ((torch.bincount(labels[val], minlength=NUM_CLASSES) - expected).abs() < 1).all()
    assert _served(dm.test_dataloader()).numel() == 100  # the given test set, untouched
    no_val = _datamodule()
    no_val.setup()
    assert no_val.val_dataloader() == []


def test_client_order_is_deterministic_per_seed_and_differs_across_seeds():
    dm = _datamodule(batch_size=10)
    dm.setup()
    first = [torch.cat([x for x, _ in dm.client_dataloader(2, seed=s)]) for s in (7, 7, 8)]
    assert torch.equal(first[0], first[1])
    assert not torch.equal(first[0], first[2])
    assert torch.equal(first[0].sort(0).values, first[2].sort(0).values)
    batches = [x.shape[0] for x, _ in dm.client_dataloader(2, seed=7)]
    assert batches[:-1] == [10] * (len(batches) - 1) and sum(batches) == dm.client_num_samples(2)
    assert len(dm.client_dataloader(2, seed=7)) == len(batches)


def test_pooled_train_dataloader_serves_every_client_train_example_once():
    dm = _datamodule(val_fraction=0.1)
    dm.setup()
    pooled = _served(dm.train_dataloader())
    clients = torch.cat([_served(dm.client_dataloader(c, 0)) for c in dm.client_ids()])
    assert torch.equal(pooled.sort().values, clients.sort().values)
    assert torch.equal(pooled, _served(dm.train_dataloader()))  # seeded by `seed`
    reseeded = _datamodule(val_fraction=0.1, seed=1)
    reseeded.setup()
    assert not torch.equal(pooled, _served(reseeded.train_dataloader()))


def test_setup_is_idempotent_and_settings_are_known_before_setup():
    dm = _datamodule()
    assert dm.num_clients == 8 and dm.num_classes == NUM_CLASSES and dm.client_ids() == list(range(8))
    with pytest.raises(RuntimeError, match="setup"):
        dm.client_num_samples(0)
    dm.setup("fit")
    layout = dm._split
    dm.setup("test")
    assert dm._split is layout
    with pytest.raises(IndexError, match="client_id"):
        dm.client_dataloader(8, seed=0)


def test_label_histogram_and_emd():
    dm = _datamodule(partitioner=DirichletPartitioner(4, alpha=0.1, min_partition_size=5, seed=0))
    dm.setup()
    histogram = dm.label_histogram()
    assert histogram.shape == (4, NUM_CLASSES) and histogram.dtype == torch.int64
    assert histogram.sum(1).tolist() == [dm.client_num_samples(c) for c in range(4)]
    assert dm.client_emd().shape == (4,) and (dm.client_emd() > 0.3).any()  # alpha 0.1 is strongly skewed


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"client_test_fraction": 1.0}, "client_test_fraction"),
        ({"client_test_fraction": -0.1}, "client_test_fraction"),
        ({"val_fraction": 1}, "val_fraction"),
        ({"batch_size": 0}, "batch_size"),
        ({"eval_batch_size": 2.5}, "eval_batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"client_test_size": 10}, "client_test_fraction=0"),
        ({"client_test_fraction": 0, "client_test_size": 0}, "client_test_size"),
        ({"num_workers": True}, "num_workers"),
        ({"seed": 1.5}, "seed"),
        ({"sharing": {"beta": 0.1}}, "sharing"),
    ],
)
def test_bad_settings_fail_eagerly_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _datamodule(**kwargs)


def test_bad_partitioner_and_num_classes_fail_eagerly():
    with pytest.raises(TypeError, match="partitioner"):
        DatasetFederated(_indexed(10), None, NUM_CLASSES, partitioner="iid")
    with pytest.raises(ValueError, match="num_classes"):
        DatasetFederated(_indexed(10), None, 0, IidPartitioner(2))


def test_more_clients_than_examples_is_a_clear_error():
    dm = DatasetFederated(_indexed(20), None, NUM_CLASSES, IidPartitioner(19), val_fraction=0.1)
    with pytest.raises(ValueError, match="val_fraction.*num_partitions"):
        dm.setup()
    with pytest.raises(RuntimeError, match="setup"):  # the failed setup left nothing behind
        dm.client_num_samples(0)


def test_partition_errors_name_what_to_change():
    empty_client = DatasetFederated(_indexed(10), None, NUM_CLASSES, _FixedPartitioner([[0, 1, 2], [], [3]]))
    with pytest.raises(ValueError, match="no training examples.*num_partitions"):
        empty_client.setup()
    overlapping = DatasetFederated(_indexed(10), None, NUM_CLASSES, _FixedPartitioner([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match="more than one client"):
        overlapping.setup()
    out_of_range = TensorClassificationDataset(torch.zeros(4, 1), torch.tensor([0, 1, 2, 9]))
    with pytest.raises(ValueError, match="num_classes"):
        DatasetFederated(out_of_range, None, NUM_CLASSES, IidPartitioner(2)).setup()
    no_test = DatasetFederated(_indexed(50), None, NUM_CLASSES, IidPartitioner(2), client_test_fraction=0)
    with pytest.raises(ValueError, match="client_test_fraction"):
        no_test.setup()


def test_small_clients_keep_a_training_example():
    dm = DatasetFederated(
        _indexed(6), None, NUM_CLASSES, _FixedPartitioner([[0], [1, 2], [3, 4, 5]]), client_test_fraction=0.6
    )
    dm.setup()
    assert [dm.client_num_samples(c) for c in range(3)] == [1, 1, 1]
    assert dm.client_test_dataloader(0) is None
    # No test set was given, so the global test set is the union of the client test splits.
    test = _served(dm.test_dataloader())
    assert test.numel() == 3 and torch.isin(test, torch.tensor([1, 2])).sum() == 1


def test_fingerprint_matches_identical_settings_and_rejects_others():
    dm = _datamodule(val_fraction=0.1)
    assert dm.state_dict() == {}
    dm.setup()
    state = dm.state_dict()
    assert isinstance(state["partition_fingerprint"], str)
    same = _datamodule(val_fraction=0.1)
    same.setup()
    same.load_state_dict(state)
    other = _datamodule(val_fraction=0.1, partitioner=IidPartitioner(8, seed=1))
    other.setup()
    with pytest.raises(ValueError, match="different data split"):
        other.load_state_dict(state)
    pending = _datamodule(val_fraction=0.2)
    pending.load_state_dict(state)  # before setup: checked once the split exists
    with pytest.raises(ValueError, match="different data split"):
        pending.setup()


def test_ten_thousand_clients_are_cheap():
    dm = DatasetFederated(_indexed(30_000), None, NUM_CLASSES, IidPartitioner(10_000), client_test_fraction=0.4)
    dm.setup()
    layout = dm._split
    # Per-client state is two flat tensors (plus offsets), not an object per client.
    assert layout.clients.flat.numel() + layout.client_tests.flat.numel() == 30_000
    assert dm.client_num_samples(9_999) == 2 and _served(dm.client_dataloader(9_999, seed=3)).numel() == 2


class _PlainDataset(Dataset):
    """No ``targets`` attribute and no tensor fast path: labels are found by iterating."""

    def __init__(self, num_samples: int) -> None:
        self.labels_ = _labels(num_samples)

    def __len__(self) -> int:
        return self.labels_.numel()

    def __getitem__(self, index: int):
        return torch.tensor([float(index)]), int(self.labels_[index])


def test_generic_datasets_are_wrapped():
    dm = DatasetFederated(_PlainDataset(200), _PlainDataset(30), NUM_CLASSES, IidPartitioner(4), batch_size=8)
    dm.setup()
    assert _served(dm.train_dataloader()).numel() == sum(dm.client_num_samples(c) for c in range(4))
    assert torch.equal(_served(dm.client_dataloader(1, 5)), _served(dm.client_dataloader(1, 5)))
    subset = DatasetFederated(Subset(_indexed(100), list(range(0, 100, 2))), None, NUM_CLASSES, IidPartitioner(2))
    subset.setup()
    assert _served(subset.train_dataloader()).remainder(2).eq(0).all()


def test_tensor_dataset_serves_items_and_batches():
    dataset = _indexed(50)
    assert dataset[3][0].item() == 3 and dataset[3][1].dtype == torch.int64
    x, y = dataset[torch.tensor([4, 1])]
    assert x.reshape(-1).tolist() == [4.0, 1.0] and torch.equal(y, dataset.targets[[4, 1]])
    # A DataLoader over a Subset uses __getitems__ and the default collate.
    batch_x, batch_y = next(iter(DataLoader(Subset(dataset, [5, 6, 7]), batch_size=3)))
    assert batch_x.reshape(-1).tolist() == [5.0, 6.0, 7.0] and batch_y.shape == (3,)
    with pytest.raises(ValueError, match="targets"):
        TensorClassificationDataset(torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(ValueError, match="one row per target"):
        TensorClassificationDataset(torch.zeros(3, 2), torch.zeros(4, dtype=torch.int64))


def test_multi_process_training_gets_per_example_loaders():
    dm = _datamodule(batch_size=16)
    dm.setup()
    dm.trainer = SimpleNamespace(world_size=2)  # Lightning swaps in a DistributedSampler for these
    loader = dm.train_dataloader()
    assert loader.batch_size == 16 and isinstance(loader.dataset, Subset)
    clients = torch.cat([_served(dm.client_dataloader(c, 0)) for c in dm.client_ids()])
    assert torch.equal(_served(loader).sort().values, clients.sort().values)


class _Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, NUM_CLASSES)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.layer(x / 1000), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.layer(x / 1000), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("val_fraction", [0.0, 0.1])
def test_plain_trainer_trains_a_centralised_baseline_and_checkpoints_the_fingerprint(tmp_path, val_fraction):
    dm = _datamodule(batch_size=50, val_fraction=val_fraction)
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(_Linear(), datamodule=dm)
    assert trainer.num_training_batches == len(dm.train_dataloader())
    assert sum(trainer.num_val_batches) == (0 if val_fraction == 0 else 1)  # [] skips validation
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["DatasetFederated"] == dm.state_dict()


def test_subclasses_must_define_num_classes():
    class NoClasses(FederatedDataModule):
        def _load_datasets(self):
            return _indexed(10), None

    with pytest.raises(ValueError, match="num_classes"):
        NoClasses(IidPartitioner(2))


def test_datasets_must_be_map_style_datasets():
    with pytest.raises(ValueError, match="train_dataset"):
        DatasetFederated([(0.0, 1)], None, NUM_CLASSES, IidPartitioner(1))
    with pytest.raises(ValueError, match="test_dataset"):
        DatasetFederated(_indexed(10), "test.pt", NUM_CLASSES, IidPartitioner(1))


def test_incomplete_subclasses_cannot_be_instantiated():
    class NoDatasets(FederatedDataModule):
        num_classes = NUM_CLASSES

    class NoPartition(Partitioner):
        pass

    with pytest.raises(TypeError, match="abstract.*_load_datasets"):
        NoDatasets(IidPartitioner(2))
    with pytest.raises(TypeError, match="abstract.*partition"):
        NoPartition(2)

    class NoReader(_TorchvisionFederated):
        num_classes = NUM_CLASSES

    with pytest.raises(TypeError, match="abstract.*_how_to_obtain.*_read_split"):
        NoReader(IidPartitioner(2))


def test_validation_mode_evaluates_held_out_training_data_and_never_the_test_data():
    as_test = _datamodule(val_fraction=0.1, client_test_fraction=0.25)
    tuning = _datamodule(val_fraction=0.1, client_test_fraction=0.25, evaluation_split="validation")
    as_test.setup()
    tuning.setup()
    # The global "test" set is the validation carve of the training data, not the test dataset.
    assert torch.equal(_served(tuning.test_dataloader()), _served(as_test.val_dataloader()))
    real_client_tests = torch.cat([_served(as_test.client_test_dataloader(c)) for c in as_test.client_ids()])
    for client in tuning.client_ids():
        train = _served(tuning.client_dataloader(client, seed=0))
        validation = _served(tuning.client_test_dataloader(client))
        # The client's validation split comes out of what it trained on in test mode, with the same fraction ...
        original_train = _served(as_test.client_dataloader(client, seed=0))
        assert set(validation.tolist()) | set(train.tolist()) == set(original_train.tolist())
        assert not set(validation.tolist()) & set(train.tolist())
        assert validation.numel() == round(original_train.numel() * 0.25)
        # ... and no client's real test example is evaluated or trained on.
        assert not set(validation.tolist()) & set(real_client_tests.tolist())
        assert not set(train.tolist()) & set(real_client_tests.tolist())


def test_validation_mode_needs_a_validation_set():
    with pytest.raises(ValueError, match="val_fraction.*evaluation_split='validation'"):
        _datamodule(evaluation_split="validation")
    with pytest.raises(ValueError, match="evaluation_split"):
        _datamodule(val_fraction=0.1, evaluation_split="val")


def test_validation_mode_evaluates_no_more_examples_than_the_test_set():
    # 100 test examples; a 50 % validation holdout of 1000 is subsampled to 100, without repeats.
    tuning = _datamodule(val_fraction=0.5, evaluation_split="validation")
    tuning.setup()
    served = _served(tuning.test_dataloader())
    assert served.numel() == 100 == served.unique().numel()
    assert set(served.tolist()) <= set(_served(tuning.val_dataloader()).tolist())
