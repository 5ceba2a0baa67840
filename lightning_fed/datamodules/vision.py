"""Image classification datasets read once through torchvision and kept as normalised float tensors in memory.

Converting every image once (uint8 to ``(x / 255 - mean) / std`` floats, ``[N, C, H, W]``) replaces a PIL round
trip per example with one tensor gather per batch, which is what makes many small client loaders cheap.
"""

from __future__ import annotations

import gzip
import os
import shutil
from abc import abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision
from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import check_bool, check_choice, check_instance
from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
"""Where Debian's ``dataset-fashion-mnist`` package installs the gzipped IDX files."""

FASHION_MNIST_DIR_ENV = "LIGHTNING_FED_FASHION_MNIST_DIR"
"""Environment variable naming another directory holding the gzipped Fashion-MNIST IDX files."""

_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

_RawSplit = tuple[Tensor, Tensor]


class _TorchvisionFederated(FederatedDataModule):
    """Reads a torchvision dataset's train and test splits (downloading them if allowed) into float tensors.

    Subclasses set ``mean``/``std`` (per channel, of the [0, 1]-scaled training images) and implement
    :meth:`_read_split` and :meth:`_how_to_obtain`.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __init__(self, partitioner: Partitioner, data_dir: str = "data", download: bool = True, **kwargs: Any) -> None:
        super().__init__(partitioner, **kwargs)
        check_instance("data_dir", data_dir, (str, os.PathLike), "a directory path")
        self.data_dir = str(data_dir)
        self.download = check_bool("download", download)
        self._raw: list[_RawSplit] | None = None

    @override
    def prepare_data(self) -> None:
        """Downloads the files if missing; the splits read here are kept for ``setup`` in this process."""
        if self._layout is not None:
            return  # already set up: reading again would only hold a second raw copy that setup never takes
        self._raw = self._read(self.download)

    @override
    def _load_datasets(self) -> tuple[TensorClassificationDataset, TensorClassificationDataset]:
        raw, self._raw = self._raw or self._read(self.download), None
        mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.std).view(1, -1, 1, 1)
        # In place after the one float copy: EMNIST byclass is 2.2 GB as floats, so temporaries would double that.
        train, test = (TensorClassificationDataset(x.float().div_(255).sub_(mean).div_(std), y) for x, y in raw)
        return train, test

    def _read(self, download: bool) -> list[_RawSplit]:
        try:
            return [self._read_split(train, download) for train in (True, False)]
        except (RuntimeError, OSError) as error:
            reason = "downloading it failed" if download else "download=False"
            raise RuntimeError(
                f"{type(self).__name__}: the dataset is not under data_dir={self.data_dir!r} and {reason} "
                f"({error}). {self._how_to_obtain()}"
            ) from error

    @abstractmethod
    def _read_split(self, train: bool, download: bool) -> _RawSplit:
        """Returns uint8 images ``[N, C, H, W]`` and int64 labels ``[N]`` of one split."""

    @abstractmethod
    def _how_to_obtain(self) -> str:
        """Tells the user how to get the files without this code downloading them."""

    def _raw_dir(self, folder: str) -> Path:
        return Path(self.data_dir) / folder / "raw"


def _as_raw(images: np.ndarray, labels: np.ndarray | list[int]) -> _RawSplit:
    return torch.from_numpy(np.ascontiguousarray(images)), torch.as_tensor(np.asarray(labels), dtype=torch.int64)


class MNISTFederated(_TorchvisionFederated):
    """MNIST handwritten digits (LeCun et al., 1998): 60 000 train / 10 000 test images, inputs ``[1, 28, 28]``.

    Args:
        partitioner: Splits the training set among clients.
        data_dir: Root holding ``MNIST/raw``.
        download: Whether torchvision may download missing files.
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = 10
    mean = (0.1307,)
    std = (0.3081,)

    @override
    def _read_split(self, train: bool, download: bool) -> _RawSplit:
        data = torchvision.datasets.MNIST(self.data_dir, train=train, download=download)
        return data.data.unsqueeze(1), data.targets

    @override
    def _how_to_obtain(self) -> str:
        return (
            "Run once with network access and download=True, or put the four un-gzipped IDX files "
            f"({', '.join(_IDX_FILES)}) in {self._raw_dir('MNIST')}."
        )


class FashionMNISTFederated(_TorchvisionFederated):
    """Fashion-MNIST clothing images (Xiao et al., 2017): 60 000 train / 10 000 test, inputs ``[1, 28, 28]``.

    Looks for the files in ``<data_dir>/FashionMNIST/raw``, then in a system copy (Debian's
    ``dataset-fashion-mnist`` in :data:`DEBIAN_FASHION_MNIST_DIR`, or the directory in the environment variable
    ``LIGHTNING_FED_FASHION_MNIST_DIR``), which it gunzips into the raw folder, and only then downloads.

    Args:
        partitioner: Splits the training set among clients.
        data_dir: Root holding ``FashionMNIST/raw``.
        download: Whether torchvision may download missing files.
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = 10
    mean = (0.2860,)
    std = (0.3530,)

    @override
    def _read_split(self, train: bool, download: bool) -> _RawSplit:
        stage_fashion_mnist(self._raw_dir("FashionMNIST"))
        data = torchvision.datasets.FashionMNIST(self.data_dir, train=train, download=download)
        return data.data.unsqueeze(1), data.targets

    @override
    def _how_to_obtain(self) -> str:
        return (
            f"Install it offline with `apt-get install dataset-fashion-mnist` (read from {_system_fashion_dir()}; "
            f"set {FASHION_MNIST_DIR_ENV} to use another directory of the .gz files), or put the four IDX files "
            f"({', '.join(_IDX_FILES)}) in {self._raw_dir('FashionMNIST')}, or run once with network access and "
            "download=True."
        )


def _system_fashion_dir() -> Path:
    return Path(os.environ.get(FASHION_MNIST_DIR_ENV) or DEBIAN_FASHION_MNIST_DIR)


def stage_fashion_mnist(raw_dir: Path) -> bool:
    """Gunzips the system copy of Fashion-MNIST into ``raw_dir`` unless it already holds the four IDX files.

    Every file is first written to a temporary name in ``raw_dir`` and renamed only once all four are complete, so
    an interrupted copy leaves nothing that torchvision would mistake for the dataset.

    Returns:
        Whether ``raw_dir`` holds the files afterwards.
    """
    raw_dir = Path(raw_dir)
    if all((raw_dir / name).is_file() for name in _IDX_FILES):
        return True
    sources = [_system_fashion_dir() / f"{name}.gz" for name in _IDX_FILES]
    if not all(source.is_file() for source in sources):
        return False
    raw_dir.mkdir(parents=True, exist_ok=True)
    staged: list[Path] = []
    try:
        for name, source in zip(_IDX_FILES, sources):
            staged.append(raw_dir / f".{name}.{os.getpid()}.partial")
            with gzip.open(source, "rb") as compressed, open(staged[-1], "wb") as plain:
                shutil.copyfileobj(compressed, plain, length=1 << 20)
        for name, partial in zip(_IDX_FILES, staged):
            os.replace(partial, raw_dir / name)
    finally:
        for partial in staged:
            partial.unlink(missing_ok=True)
    return True


_EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


class EMNISTFederated(_TorchvisionFederated):
    """EMNIST handwritten characters (Cohen et al., 2017), inputs ``[1, 28, 28]``.

    Images are transposed on load so that characters stand upright (the EMNIST files store them transposed).
    Classes per split: byclass 62, bymerge 47, balanced 47, letters 26 (labels shifted from 1..26 to 0..25),
    digits 10, mnist 10; ``num_classes`` follows ``split``.

    Args:
        partitioner: Splits the training set among clients.
        split: One of ``byclass``, ``bymerge``, ``balanced``, ``letters``, ``digits``, ``mnist``.
        data_dir: Root holding ``EMNIST/raw``.
        download: Whether torchvision may download missing files (the whole 560 MB archive).
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = 47
    mean = (0.1751,)
    std = (0.3332,)

    def __init__(
        self,
        partitioner: Partitioner,
        split: str = "balanced",
        data_dir: str = "data",
        download: bool = True,
        **kwargs: Any,
    ) -> None:
        check_choice("split", split, _EMNIST_CLASSES)
        self.split = split
        self.num_classes = _EMNIST_CLASSES[split]
        super().__init__(partitioner, data_dir, download, **kwargs)

    @override
    def _read_split(self, train: bool, download: bool) -> _RawSplit:
        data = torchvision.datasets.EMNIST(self.data_dir, split=self.split, train=train, download=download)
        labels = data.targets - 1 if self.split == "letters" else data.targets
        return data.data.transpose(1, 2).unsqueeze(1).contiguous(), labels

    @override
    def _how_to_obtain(self) -> str:
        return (
            "Run once with network access and download=True, or unpack EMNIST's gzip.zip archive and put the "
            f"gunzipped emnist-{self.split}-train/test-images-idx3-ubyte and -labels-idx1-ubyte files in "
            f"{self._raw_dir('EMNIST')}."
        )


class CIFAR10Federated(_TorchvisionFederated):
    """CIFAR-10 natural images (Krizhevsky, 2009): 50 000 train / 10 000 test, inputs ``[3, 32, 32]``, 10 classes.

    Args:
        partitioner: Splits the training set among clients.
        data_dir: Root holding ``cifar-10-batches-py``.
        download: Whether torchvision may download missing files.
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = 10
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    _torchvision_class = torchvision.datasets.CIFAR10

    @override
    def _read_split(self, train: bool, download: bool) -> _RawSplit:
        data = self._torchvision_class(self.data_dir, train=train, download=download)
        return _as_raw(data.data.transpose(0, 3, 1, 2), data.targets)

    @override
    def _how_to_obtain(self) -> str:
        folder, archive = self._torchvision_class.base_folder, self._torchvision_class.filename
        return (
            f"Run once with network access and download=True, or extract {archive} into {self.data_dir} so that "
            f"{Path(self.data_dir) / folder} holds its python pickle batches."
        )


class CIFAR100Federated(CIFAR10Federated):
    """CIFAR-100 (Krizhevsky, 2009): 50 000 train / 10 000 test, inputs ``[3, 32, 32]``, 100 fine classes.

    Args:
        partitioner: Splits the training set among clients.
        data_dir: Root holding ``cifar-100-python``.
        download: Whether torchvision may download missing files.
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = 100
    mean = (0.5071, 0.4865, 0.4409)
    std = (0.2673, 0.2564, 0.2762)
    _torchvision_class = torchvision.datasets.CIFAR100


class SVHNFederated(_TorchvisionFederated):
    """SVHN cropped house-number digits (Netzer et al., 2011): 73 257 train / 26 032 test, inputs ``[3, 32, 32]``.

    The digit 0 (label 10 in the files) is class 0. The ``extra`` split is not used.

    Args:
        partitioner: Splits the training set among clients.
        data_dir: Root holding ``SVHN/train_32x32.mat`` and ``SVHN/test_32x32.mat``.
        download: Whether torchvision may download missing files.
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = 10
    mean = (0.4377, 0.4438, 0.4728)
    std = (0.1980, 0.2010, 0.1970)

    @override
    def _read_split(self, train: bool, download: bool) -> _RawSplit:
        root = Path(self.data_dir) / "SVHN"
        data = torchvision.datasets.SVHN(str(root), split="train" if train else "test", download=download)
        return _as_raw(data.data, data.labels)

    @override
    def _how_to_obtain(self) -> str:
        return (
            "Run once with network access and download=True, or put train_32x32.mat and test_32x32.mat (SVHN's "
            f"cropped-digits format) in {Path(self.data_dir) / 'SVHN'}."
        )
