"""LEAF benchmark datasets (Caldas et al. 2018, arXiv:1812.01097) read from the JSON files that LEAF's preprocessing
scripts write.

Each ``<leaf_dir>/train/*.json`` and ``<leaf_dir>/test/*.json`` holds ``{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}``. Every LEAF user (a writer, a Twitter account) is one client.
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_instance, check_int
from lightning_fed.datamodules._splits import RaggedIndex
from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.datamodules.partitioners import NaturalIdPartitioner
from lightning_fed.datamodules.tensor_dataset import TensorClassificationDataset

_UserData = dict[str, tuple[np.ndarray, np.ndarray]]
_ConvertX = Callable[[list[Any]], np.ndarray]


def _int_labels(ys: list[Any]) -> np.ndarray:
    return np.asarray(ys, dtype=np.int64).reshape(-1)


def read_leaf_split(directory: Path, convert_x: _ConvertX, convert_y: _ConvertX = _int_labels) -> _UserData:
    """Reads every ``*.json`` file of a LEAF split into ``{user: (inputs, int64 labels)}``.

    ``convert_x`` turns one user's raw ``x`` list into an array as each file is read, so that the parsed JSON of only
    one file is alive at a time (FEMNIST's pixels as Python floats would take about 20 GB). ``convert_y`` does the
    same for the labels (default: integers as they are; Shakespeare's are characters).
    """
    chunks: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for path in sorted(Path(directory).glob("*.json")):
        with open(path, encoding="utf-8") as file:
            content = json.load(file)
        for user, data in content["user_data"].items():
            inputs, labels = convert_x(data["x"]), convert_y(data["y"])
            if len(inputs) != len(labels):
                raise ValueError(f"LEAF user {user!r} in {path} has {len(inputs)} inputs but {len(labels)} labels.")
            xs, ys = chunks.setdefault(str(user), ([], []))
            xs.append(inputs)
            ys.append(labels)
    return {user: (np.concatenate(xs), np.concatenate(ys)) for user, (xs, ys) in chunks.items()}


class _LeafFederated(FederatedDataModule):
    """Reads a LEAF dataset, one client per user.

    The training JSON is read in ``__init__`` (its users define ``num_clients``) and kept until ``setup``; when
    ``num_clients`` is given and ``leaf_dir`` holds no data yet, reading (and the error that says how to generate the
    data) waits for ``setup``, so that a preset can be parsed without the data. A client's test split is its user's
    LEAF test data when the test split holds data of the training users (LEAF's default ``-t sample`` split;
    ``client_test_fraction`` is then unused), and the global test set is all LEAF test data of the selected users.
    Without a test directory, or with LEAF's ``-t user`` split (disjoint test users), client test splits are held
    out as in :class:`FederatedDataModule` and the global test set is the LEAF test data if any, else the union of
    the client test splits.
    """

    _leaf_name: str

    def __init__(self, leaf_dir: str, num_clients: int | None = None, **kwargs: Any) -> None:
        check_instance("leaf_dir", leaf_dir, (str, Path), "a directory path")
        check_int("num_clients", num_clients, minimum=1, allow_none=True)
        self.leaf_dir = str(leaf_dir)
        self._users: list[str] = []
        self._train_json: _UserData | None = None
        self._train_users: Tensor | None = None
        self._test_users: Tensor | None = None
        if num_clients is None or any((Path(leaf_dir) / "train").glob("*.json")):
            # used here, before FederatedDataModule checks it
            self._read_train(num_clients, check_int("seed", kwargs.get("seed", 0)))
            num_clients = len(self._users)
        # Otherwise the count is known without the data, which is read (or reported missing) at `setup`: a preset
        # that names LEAF data can then be parsed and checked on a machine that does not hold it.
        super().__init__(NaturalIdPartitioner(num_clients), **kwargs)

    def _read_train(self, num_clients: int | None, seed: int) -> None:
        """Reads the training JSON and keeps ``num_clients`` users drawn with ``seed`` (all when ``None``)."""
        train_dir = Path(self.leaf_dir) / "train"
        if not any(train_dir.glob("*.json")):
            raise FileNotFoundError(
                f"`leaf_dir` must hold LEAF's train/*.json (and test/*.json), but {train_dir} has none. Generate "
                f"them with LEAF's scripts: in the LEAF repository's data/{self._leaf_name} run `./preprocess.sh "
                f"-s niid --sf 1.0 -k 0 -t sample` (see its README for the options), then pass "
                f"leaf_dir=<LEAF>/data/{self._leaf_name}/data."
            )
        train = read_leaf_split(train_dir, self._convert_x, self._convert_y)
        users = sorted(train)
        if num_clients is not None:
            if num_clients > len(users):
                raise InvalidArgumentError(
                    "num_clients", num_clients, f"at most the {len(users)} users in {train_dir}, or None for all"
                )
            # A seeded draw of users, kept in name order so that client k is the k-th selected user by name.
            chosen = torch.randperm(len(users), generator=torch.Generator().manual_seed(seed))
            users = sorted(users[i] for i in chosen[:num_clients].tolist())
        self._users = users
        self._train_json = {user: train[user] for user in users}

    def _convert_y(self, ys: list[Any]) -> np.ndarray:
        """Turns one user's raw LEAF ``y`` list into int64 labels."""
        return _int_labels(ys)

    @abstractmethod
    def _convert_x(self, xs: list[Any]) -> np.ndarray:
        """Turns one user's raw LEAF ``x`` list into an array (one row per sample)."""

    @abstractmethod
    def _encode(self, train: np.ndarray, test: np.ndarray) -> tuple[Tensor, Tensor]:
        """Turns the converted inputs of both splits into input tensors."""

    @override
    def _load_datasets(self) -> tuple[Dataset, Dataset | None]:
        if not self._users:
            self._read_train(self.num_clients, self.seed)
        train_json = self._train_json or read_leaf_split(
            Path(self.leaf_dir) / "train", self._convert_x, self._convert_y
        )
        test_json = read_leaf_split(Path(self.leaf_dir) / "test", self._convert_x, self._convert_y)
        # LEAF's sample split gives the training users test data; its user split gives other users.
        per_user = any(user in test_json for user in self._users)
        test_users = [user for user in self._users if user in test_json] if per_user else sorted(test_json)
        train_x, train_y, train_ids = _concatenate(train_json, self._users, self._users)
        test_x, test_y, test_ids = _concatenate(test_json, test_users, self._users)
        inputs, test_inputs = self._encode(train_x, test_x)
        self._train_json, self._train_users = None, train_ids
        self._test_users = test_ids if per_user else None
        test = TensorClassificationDataset(test_inputs, test_y) if test_y.numel() else None
        return TensorClassificationDataset(inputs, train_y), test

    @override
    def _natural_ids(self) -> Tensor | None:
        return self._train_users

    @override
    def _client_test_split(
        self, partitions: RaggedIndex, labels: Tensor, train: Dataset, test: Dataset | None
    ) -> tuple[RaggedIndex, RaggedIndex, Dataset]:
        if self._test_users is None or self._train_users is None or test is None:
            return super()._client_test_split(partitions, labels, train, test)
        # Map each user to the client holding its training data, then give that client the user's test data.
        client_of_user = torch.full((len(self._users),), -1, dtype=torch.int64)
        client_of_user[self._train_users[partitions.flat]] = partitions.group_ids()
        test_clients = client_of_user[self._test_users]
        order = torch.argsort(test_clients, stable=True)
        order = order[test_clients[order] >= 0]
        return partitions, RaggedIndex.from_groups(order, test_clients[order], len(partitions)), test


def _concatenate(data: _UserData, users: list[str], known: list[str]) -> tuple[np.ndarray, Tensor, Tensor]:
    """The inputs, int64 labels and int64 user ids (index in ``known``, -1 if absent) of ``users``, in that order."""
    index = {user: i for i, user in enumerate(known)}
    if not users:
        return np.zeros((0,)), torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    xs = np.concatenate([data[user][0] for user in users])
    ys = torch.as_tensor(np.concatenate([data[user][1] for user in users]), dtype=torch.int64)
    sizes = torch.tensor([len(data[user][1]) for user in users], dtype=torch.int64)
    ids = torch.tensor([index.get(user, -1) for user in users], dtype=torch.int64).repeat_interleave(sizes)
    return xs, ys, ids


class FEMNISTFederated(_LeafFederated):
    """LEAF FEMNIST: handwritten digits and letters of 3 500 writers (EMNIST by writer), one client per writer.

    Inputs ``[1, 28, 28]`` float, as LEAF stores them (values in [0, 1], not re-normalised); 62 classes
    (10 digits, 26 upper-case, 26 lower-case letters).

    Args:
        leaf_dir: LEAF's ``data/femnist/data`` directory, holding ``train/`` and ``test/``.
        num_clients: Use this many writers, drawn with ``seed``; ``None`` uses all.
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = 62
    _leaf_name = "femnist"

    @override
    def _convert_x(self, xs: list[Any]) -> np.ndarray:
        pixels = np.asarray(xs, dtype=np.float32)
        if pixels.size != len(xs) * 784:
            raise ValueError(f"FEMNIST inputs must be flattened 28x28 images (784 values), got shape {pixels.shape}.")
        return pixels.reshape(-1, 1, 28, 28)

    @override
    def _encode(self, train: np.ndarray, test: np.ndarray) -> tuple[Tensor, Tensor]:
        return torch.from_numpy(train.reshape(-1, 1, 28, 28)), torch.from_numpy(test.reshape(-1, 1, 28, 28))


_TOKEN = re.compile(r"[\w']+|[!?]")
PAD_TOKEN, UNKNOWN_TOKEN = 0, 1


def build_vocabulary(texts: list[str], vocab_size: int) -> dict[str, int]:
    """Maps the ``vocab_size - 2`` most frequent tokens (ties by spelling) to ids from 2 up; 0 pads, 1 is unknown."""
    counts = Counter(token for text in texts for token in _TOKEN.findall(text.lower()))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: vocab_size - 2]
    return {token: i + 2 for i, (token, _) in enumerate(ranked)}


def encode_texts(texts: list[str], vocabulary: dict[str, int], max_length: int) -> Tensor:
    """Encodes each text as ``max_length`` int64 token ids: truncated, then right-padded with 0."""
    rows = []
    for text in texts:
        ids = [vocabulary.get(token, UNKNOWN_TOKEN) for token in _TOKEN.findall(text.lower())[:max_length]]
        rows.append(ids + [PAD_TOKEN] * (max_length - len(ids)))
    return torch.tensor(rows, dtype=torch.int64).reshape(len(texts), max_length)


class Sent140Federated(_LeafFederated):
    """LEAF Sent140: tweets labelled by sentiment (Go et al., 2009), one client per Twitter account.

    Inputs ``[max_length]`` int64 token ids; 2 classes (0 negative, 1 positive). Tokens are lower-cased words
    (with apostrophes) and ``!``/``?``. The vocabulary holds the ``vocab_size - 2`` most frequent tokens of the
    selected users' training tweets; id 0 pads, id 1 stands for any other token, so an ``nn.Embedding(vocab_size,
    ...)`` covers every id.

    Args:
        leaf_dir: LEAF's ``data/sent140/data`` directory, holding ``train/`` and ``test/``.
        max_length: Tokens per tweet after truncation/padding.
        vocab_size: Number of token ids, padding and unknown included.
        num_clients: Use this many accounts, drawn with ``seed``; ``None`` uses all.
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = 2
    _leaf_name = "sent140"

    def __init__(
        self,
        leaf_dir: str,
        max_length: int = 25,
        vocab_size: int = 10000,
        num_clients: int | None = None,
        **kwargs: Any,
    ) -> None:
        check_int("max_length", max_length, minimum=1)
        # Ids 0 and 1 are padding and unknown, so a vocabulary needs a third id to hold any word.
        check_int("vocab_size", vocab_size, minimum=3)
        self.max_length = max_length
        self.vocab_size = vocab_size
        self.vocabulary: dict[str, int] = {}
        super().__init__(leaf_dir, num_clients, **kwargs)

    @override
    def _convert_x(self, xs: list[Any]) -> np.ndarray:
        return np.array([_tweet_text(sample) for sample in xs], dtype=object)

    @override
    def _encode(self, train: np.ndarray, test: np.ndarray) -> tuple[Tensor, Tensor]:
        self.vocabulary = build_vocabulary(train.tolist(), self.vocab_size)
        return (
            encode_texts(train.tolist(), self.vocabulary, self.max_length),
            encode_texts(test.tolist(), self.vocabulary, self.max_length),
        )


def _tweet_text(sample: Any) -> str:
    # LEAF stores a tweet as [id, date, query, user, text]; a bare string is accepted too.
    return sample if isinstance(sample, str) else str(sample[4])
