"""The concrete datamodules, each read from small files written here in the format its loader expects.

Nothing here reaches the network: sockets are blocked and torchvision's download functions are replaced.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import socket
import struct
from pathlib import Path
from urllib.error import URLError

import lightning.pytorch as L
import numpy as np
import pytest
import scipy.io
import torch
import torchvision
from helpers.boring import fast_trainer

from lightning_fed.datamodules import (
    DEBIAN_FASHION_MNIST_DIR,
    CIFAR10Federated,
    CIFAR100Federated,
    EMNISTFederated,
    FashionMNISTFederated,
    FEMNISTFederated,
    IidPartitioner,
    MNIST1DFederated,
    MNISTFederated,
    Sent140Federated,
    SVHNFederated,
    SyntheticFederated,
    synthetic_fedprox,
)
from lightning_fed.datamodules.vision import FASHION_MNIST_DIR_ENV

IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No connection can be opened, and torchvision's downloads fail the way they do offline."""

    def refuse(*args, **kwargs):
        raise URLError("network is unreachable (test)")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(torchvision.datasets.mnist, "download_and_extract_archive", refuse)
    monkeypatch.setattr(torchvision.datasets.cifar, "download_and_extract_archive", refuse)
    monkeypatch.setattr(torchvision.datasets.svhn, "download_url", refuse)
    monkeypatch.setenv(FASHION_MNIST_DIR_ENV, "/nonexistent/fashion-mnist")


@pytest.fixture
def unchecked_md5(monkeypatch):
    """CIFAR and SVHN verify the real files' MD5 sums, which small test files cannot match; keep the existence check."""
    exists = lambda fpath, md5=None: os.path.isfile(fpath)  # noqa: E731
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", exists)
    monkeypatch.setattr(torchvision.datasets.svhn, "check_integrity", exists)


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    """Writes uint8 ``array`` in the IDX format: 0, 0, type 0x08, ndim, big-endian uint32 sizes, then the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", size) for size in array.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open if compress else open)(path, "wb") as file:
        file.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def mnist_like(num_train: int = 30, num_test: int = 12, num_classes: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "train-images": rng.integers(0, 256, (num_train, 28, 28), dtype=np.uint8),
        "train-labels": (np.arange(num_train) % num_classes).astype(np.uint8),
        "test-images": rng.integers(0, 256, (num_test, 28, 28), dtype=np.uint8),
        "test-labels": (np.arange(num_test) % num_classes).astype(np.uint8),
    }


def write_mnist_like(directory: Path, arrays: dict[str, np.ndarray], names=IDX_NAMES, compress=False) -> None:
    suffix = ".gz" if compress else ""
    for name, key in zip(names, ("train-images", "train-labels", "test-images", "test-labels")):
        write_idx(directory / f"{name}{suffix}", arrays[key], compress)


def served(loader) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels = zip(*loader)
    return torch.cat(inputs), torch.cat(labels)


def train_size(dm) -> int:
    return sum(dm.client_num_samples(c) for c in dm.client_ids())


def test_mnist_reads_idx_files_into_normalised_tensors(tmp_path):
    arrays = mnist_like()
    write_mnist_like(tmp_path / "MNIST" / "raw", arrays)
    dm = MNISTFederated(IidPartitioner(3), data_dir=str(tmp_path), download=False, client_test_fraction=0)
    dm.setup()
    assert train_size(dm) == 30 and dm.num_classes == 10
    x, y = served(dm.test_dataloader())
    assert x.shape == (12, 1, 28, 28) and x.dtype == torch.float32
    expected = (torch.from_numpy(arrays["test-images"]).float() / 255 - 0.1307) / 0.3081
    assert torch.allclose(x[:, 0], expected) and torch.equal(y, torch.arange(12) % 10)


def test_fashion_mnist_stages_the_system_copy_atomically(tmp_path, monkeypatch):
    arrays = mnist_like(seed=1)
    write_mnist_like(tmp_path / "system", arrays, compress=True)
    monkeypatch.setenv(FASHION_MNIST_DIR_ENV, str(tmp_path / "system"))
    dm = FashionMNISTFederated(IidPartitioner(2), data_dir=str(tmp_path / "data"), download=False)
    dm.prepare_data()
    dm.setup()
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    assert sorted(path.name for path in raw.iterdir()) == sorted(IDX_NAMES)  # gunzipped, no leftovers
    x, _ = served(dm.test_dataloader())
    assert torch.allclose(x[:, 0], (torch.from_numpy(arrays["test-images"]).float() / 255 - 0.2860) / 0.3530)


def test_fashion_mnist_corrupt_system_copy_leaves_nothing_behind(tmp_path, monkeypatch):
    write_mnist_like(tmp_path / "system", mnist_like(), compress=True)
    (tmp_path / "system" / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    monkeypatch.setenv(FASHION_MNIST_DIR_ENV, str(tmp_path / "system"))
    dm = FashionMNISTFederated(IidPartitioner(2), data_dir=str(tmp_path / "data"), download=False)
    with pytest.raises(RuntimeError, match="FashionMNIST"):
        dm.setup()
    assert list((tmp_path / "data" / "FashionMNIST" / "raw").iterdir()) == []


def test_fashion_mnist_missing_offline_says_how_to_get_it(tmp_path):
    dm = FashionMNISTFederated(IidPartitioner(2), data_dir=str(tmp_path), download=True)
    with pytest.raises(RuntimeError, match="apt-get install dataset-fashion-mnist") as error:
        dm.setup()
    message = str(error.value)
    assert "downloading it failed" in message and str(tmp_path / "FashionMNIST" / "raw") in message
    assert FASHION_MNIST_DIR_ENV in message and error.value.__cause__ is not None
    assert DEBIAN_FASHION_MNIST_DIR == "/usr/share/datasets/fashion-mnist"


@pytest.mark.parametrize(
    ("cls", "hint"),
    [
        (MNISTFederated, "MNIST/raw"),
        (EMNISTFederated, "emnist-balanced"),
        (CIFAR10Federated, "cifar-10-python.tar.gz"),
        (CIFAR100Federated, "cifar-100-python.tar.gz"),
        (SVHNFederated, "train_32x32.mat"),
    ],
)
@pytest.mark.parametrize("download", [False, True])
def test_missing_dataset_errors_say_how_to_obtain_it(tmp_path, cls, hint, download):
    dm = cls(IidPartitioner(2), data_dir=str(tmp_path), download=download)
    reason = "downloading it failed" if download else "download=False"
    with pytest.raises(RuntimeError, match=reason) as error:
        dm.setup()
    assert hint in str(error.value) and "network access" in str(error.value)
    assert error.value.__cause__ is not None


def test_emnist_is_upright_and_letters_start_at_zero(tmp_path):
    arrays = mnist_like(num_classes=26)
    arrays["train-labels"] = arrays["train-labels"] + 1  # EMNIST letters are labelled 1..26
    arrays["test-labels"] = arrays["test-labels"] + 1
    names = [
        f"emnist-letters-{split}-{kind}"
        for split in ("train", "test")
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
    ]
    write_mnist_like(tmp_path / "EMNIST" / "raw", arrays, names=names)
    dm = EMNISTFederated(IidPartitioner(2), split="letters", data_dir=str(tmp_path), download=False)
    assert dm.num_classes == 26 and EMNISTFederated.num_classes == 47
    dm.setup()
    x, y = served(dm.test_dataloader())
    expected = (torch.from_numpy(arrays["test-images"]).transpose(1, 2).float() / 255 - 0.1751) / 0.3332
    assert torch.allclose(x[:, 0], expected) and torch.equal(y, torch.arange(12) % 26)
    with pytest.raises(ValueError, match="split"):
        EMNISTFederated(IidPartitioner(2), split="kanji")


def _write_cifar(
    directory: Path, files: dict[str, int], label_key: str, meta: tuple[str, str], num_classes: int
) -> None:
    directory.mkdir(parents=True)
    for name, count in files.items():
        # Rows are 1024 red, then 1024 green, then 1024 blue bytes; red = 255, green = 0, blue = 51.
        data = np.concatenate([np.full((count, 1024), v, np.uint8) for v in (255, 0, 51)], axis=1)
        with open(directory / name, "wb") as file:
            pickle.dump({"data": data, label_key: [i % num_classes for i in range(count)]}, file)
    with open(directory / meta[0], "wb") as file:
        pickle.dump({meta[1]: [f"class{i}" for i in range(num_classes)]}, file)


@pytest.mark.usefixtures("unchecked_md5")
def test_cifar10_reads_pickled_batches_channel_first(tmp_path):
    files = {f"data_batch_{i}": 4 for i in range(1, 6)} | {"test_batch": 6}
    _write_cifar(tmp_path / "cifar-10-batches-py", files, "labels", ("batches.meta", "label_names"), 10)
    dm = CIFAR10Federated(IidPartitioner(2), data_dir=str(tmp_path), download=False, client_test_fraction=0)
    dm.setup()
    assert train_size(dm) == 20
    x, y = served(dm.test_dataloader())
    assert x.shape == (6, 3, 32, 32) and torch.equal(y, torch.arange(6))
    means, stds = torch.tensor(CIFAR10Federated.mean), torch.tensor(CIFAR10Federated.std)
    expected = (torch.tensor([1.0, 0.0, 0.2]) - means) / stds
    assert torch.allclose(x[0, :, 5, 7], expected, atol=1e-5)


@pytest.mark.usefixtures("unchecked_md5")
def test_cifar100_reads_fine_labels(tmp_path):
    _write_cifar(
        tmp_path / "cifar-100-python", {"train": 10, "test": 5}, "fine_labels", ("meta", "fine_label_names"), 100
    )
    dm = CIFAR100Federated(IidPartitioner(2), data_dir=str(tmp_path), download=False)
    dm.setup()
    assert dm.num_classes == 100 and served(dm.test_dataloader())[0].shape == (5, 3, 32, 32)


@pytest.mark.usefixtures("unchecked_md5")
def test_svhn_reads_mat_files_and_maps_ten_to_zero(tmp_path):
    rng = np.random.default_rng(0)
    for split, count in (("train", 20), ("test", 10)):
        images = rng.integers(0, 256, (32, 32, 3, count), dtype=np.uint8)
        labels = (np.arange(count) % 10 + 1).astype(np.uint8).reshape(-1, 1)  # digits 1..9 and 10 for zero
        (tmp_path / "SVHN").mkdir(exist_ok=True)
        scipy.io.savemat(tmp_path / "SVHN" / f"{split}_32x32.mat", {"X": images, "y": labels})
    dm = SVHNFederated(IidPartitioner(2), data_dir=str(tmp_path), download=False)
    dm.setup()
    x, y = served(dm.test_dataloader())
    assert x.shape == (10, 3, 32, 32) and torch.equal(y, (torch.arange(10) + 1) % 10)
    expected = (torch.from_numpy(images[4, 9, :, 0]).float() / 255 - torch.tensor(SVHNFederated.mean)) / torch.tensor(
        SVHNFederated.std
    )
    assert torch.allclose(x[0, :, 4, 9], expected, atol=1e-5)


def test_mnist1d_generates_offline_and_deterministically():
    state = np.random.get_state()
    dm = MNIST1DFederated(IidPartitioner(4), num_samples=200, client_test_fraction=0, seed=1)
    dm.setup()
    assert np.array_equal(np.random.get_state()[1], state[1])  # mnist1d's global seeding was undone
    assert train_size(dm) == 160 and dm.num_classes == 10
    x, y = served(dm.test_dataloader())
    assert x.shape == (40, 1, 40) and x.dtype == torch.float32 and 0 <= int(y.min()) <= int(y.max()) <= 9
    again = MNIST1DFederated(IidPartitioner(4), num_samples=200, client_test_fraction=0, seed=1)
    again.setup()
    other = MNIST1DFederated(IidPartitioner(4), num_samples=200, client_test_fraction=0, seed=2)
    other.setup()
    assert torch.equal(x, served(again.test_dataloader())[0])
    assert not torch.equal(x, served(other.test_dataloader())[0])


def test_synthetic_clients_follow_the_generator():
    _, labels, clients = synthetic_fedprox(0.5, 0.5, 6, 60, 10, iid=False, seed=4)
    sizes = torch.bincount(clients)
    assert (sizes >= 50).all() and int(labels.min()) >= 0 and int(labels.max()) < 10
    dm = SyntheticFederated(alpha=0.5, beta=0.5, num_clients=6, seed=4)
    assert dm.num_clients == 6 and dm.num_classes == 10
    dm.setup()
    tests = [served(dm.client_test_dataloader(c))[0].shape[0] for c in range(6)]
    assert [dm.client_num_samples(c) + tests[c] for c in range(6)] == sizes.tolist()
    assert tests == [int(n * 0.2 + 0.5) for n in sizes.tolist()]
    x, _ = served(dm.test_dataloader())  # the union of the client test splits
    assert x.shape == (sum(tests), 60)
    again = SyntheticFederated(alpha=0.5, beta=0.5, num_clients=6, seed=4)
    again.setup()
    assert torch.equal(x, served(again.test_dataloader())[0])
    assert not torch.equal(
        synthetic_fedprox(0.5, 0.5, 6, 60, 10, False, seed=5)[0][:50],
        synthetic_fedprox(0.5, 0.5, 6, 60, 10, False, seed=4)[0][:50],
    )


def test_synthetic_beta_spreads_client_inputs_and_iid_does_not():
    def client_means(iid: bool) -> torch.Tensor:
        inputs, _, clients = synthetic_fedprox(0.0, 5.0, 20, 60, 10, iid=iid, seed=0)
        return torch.stack([inputs[clients == k, 0].mean() for k in range(20)])

    assert client_means(iid=False).std() > 2
    assert client_means(iid=True).abs().max() < 0.75
    with pytest.raises(ValueError, match="client_test_fraction"):
        SyntheticFederated(client_test_fraction=0)
    with pytest.raises(ValueError, match="alpha"):
        SyntheticFederated(alpha=-1)


def _write_leaf(directory: Path, users: dict[str, tuple[list, list]], files: int = 1) -> None:
    directory.mkdir(parents=True)
    names = sorted(users)
    for part in range(files):
        chosen = names[part::files]
        content = {
            "users": chosen,
            "num_samples": [len(users[u][1]) for u in chosen],
            "user_data": {u: {"x": users[u][0], "y": users[u][1]} for u in chosen},
        }
        (directory / f"part_{part}.json").write_text(json.dumps(content))


def _femnist_users(counts: dict[str, int], seed: int) -> dict[str, tuple[list, list]]:
    rng = np.random.default_rng(seed)
    return {u: (rng.random((n, 784)).round(3).tolist(), rng.integers(0, 62, n).tolist()) for u, n in counts.items()}


def test_femnist_uses_each_writers_leaf_test_data(tmp_path):
    train = _femnist_users({"f_b": 7, "f_a": 5, "f_c": 9}, seed=0)
    test = _femnist_users({"f_a": 2, "f_b": 3, "f_c": 1}, seed=1)
    _write_leaf(tmp_path / "train", train, files=2)
    _write_leaf(tmp_path / "test", test)
    dm = FEMNISTFederated(str(tmp_path), batch_size=4)
    assert dm.num_clients == 3 and dm.num_classes == 62  # known before setup
    dm.setup()
    for client, user in enumerate(["f_a", "f_b", "f_c"]):  # clients in user-name order
        assert dm.client_num_samples(client) == len(train[user][1])
        x, y = served(dm.client_test_dataloader(client))
        assert x.shape[1:] == (1, 28, 28) and y.tolist() == test[user][1]
        assert torch.allclose(x.reshape(len(y), -1), torch.tensor(test[user][0], dtype=torch.float32))
    assert served(dm.test_dataloader())[0].shape[0] == 6


def test_femnist_selects_users_and_holds_out_without_test_data(tmp_path):
    _write_leaf(tmp_path / "train", _femnist_users({f"w{i}": 10 for i in range(5)}, seed=0))
    dm = FEMNISTFederated(str(tmp_path), num_clients=3, client_test_fraction=0.3)
    assert dm.num_clients == 3
    dm.setup()
    assert [dm.client_num_samples(c) for c in range(3)] == [7, 7, 7]
    assert served(dm.test_dataloader())[0].shape[0] == 9  # the union of the held-out client data
    with pytest.raises(ValueError, match="num_clients"):
        FEMNISTFederated(str(tmp_path), num_clients=6)


def test_leaf_errors_say_how_to_generate_the_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="preprocess.sh"):
        FEMNISTFederated(str(tmp_path / "missing"))
    _write_leaf(tmp_path / "bad" / "train", {"u": ([[0.0] * 10], [1])})
    with pytest.raises(ValueError, match="784"):
        FEMNISTFederated(str(tmp_path / "bad"))


def _tweet(text: str) -> list[str]:
    return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", text]


def test_sent140_builds_a_train_vocabulary_and_encodes_fixed_length(tmp_path):
    train = {
        "alice": ([_tweet("Good day good day!"), _tweet("bad DAY")], [1, 0]),
        "bob": ([_tweet("good morning"), _tweet("so bad"), _tweet("good good good good good good")], [1, 0, 1]),
    }
    _write_leaf(tmp_path / "train", train)
    _write_leaf(tmp_path / "test", {"alice": ([_tweet("unseen good words")], [1]), "bob": ([_tweet("day")], [0])})
    dm = Sent140Federated(str(tmp_path), max_length=4, vocab_size=5, batch_size=8)
    dm.setup()
    # Frequencies: good 9, day 3, bad 2, then `!`, morning, so (1 each): ids 2, 3, 4; 0 pads, 1 is unknown.
    assert dm.vocabulary == {"good": 2, "day": 3, "bad": 4}
    x, y = served(dm.client_test_dataloader(0))
    assert x.tolist() == [[1, 2, 1, 0]] and y.tolist() == [1]
    x, _ = served(dm.client_dataloader(1, seed=0))
    assert x.shape == (3, 4) and x.dtype == torch.int64 and [2, 2, 2, 2] in x.tolist()
    assert dm.num_classes == 2 and served(dm.test_dataloader())[0].tolist() == [[1, 2, 1, 0], [3, 0, 0, 0]]


@pytest.mark.skipif(not Path(DEBIAN_FASHION_MNIST_DIR).is_dir(), reason="dataset-fashion-mnist is not installed")
def test_real_fashion_mnist_loads_offline_from_the_debian_copy(tmp_path, monkeypatch):
    monkeypatch.delenv(FASHION_MNIST_DIR_ENV)
    dm = FashionMNISTFederated(IidPartitioner(10), data_dir=str(tmp_path), download=False, client_test_fraction=0)
    dm.setup()
    assert train_size(dm) == 60_000
    _, y = served(dm.test_dataloader())
    assert torch.equal(torch.bincount(y), torch.full((10,), 1000))


class _QuickstartModule(L.LightningModule):
    """Shaped like Flower's Lightning quickstart module: it reads ``batch["image"]`` and ``batch["label"]``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(28 * 28, 10)

    def training_step(self, batch, batch_idx):
        x = batch["image"].view(batch["image"].size(0), -1)
        loss = torch.nn.functional.cross_entropy(self.net(x), batch["label"])
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch, batch_idx):
        x = batch["image"].view(batch["image"].size(0), -1)
        self.log("test_acc", (self.net(x).argmax(1) == batch["label"]).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_fashion_mnist_yields_dict_batches_for_a_quickstart_module(tmp_path):
    write_mnist_like(tmp_path / "FashionMNIST" / "raw", mnist_like(num_train=40))
    dm = FashionMNISTFederated(
        IidPartitioner(4), data_dir=str(tmp_path), download=False, batch_size=4, batch_format="dict"
    )
    trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2)
    trainer.fit(_QuickstartModule(), datamodule=dm)
    assert len(trainer.federation_state.history) == 2
    batch = next(iter(dm.client_dataloader(0, seed=0)))
    assert set(batch) == {"image", "label"} and batch["image"].shape[1:] == (1, 28, 28)
