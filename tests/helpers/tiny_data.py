"""Tiny LEAF-format JSON directories and a tiny CIFAR-10 directory, written by the tests themselves (no download).

Each dataset carries a learnable signal, so a few optimiser steps visibly lower the loss.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np


def write_leaf(directory: Path, users: dict[str, tuple[list, list]], files: int = 1) -> None:
    """Writes ``{user: (x, y)}`` as LEAF JSON (``users``, ``num_samples``, ``user_data``) over ``files`` files."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(users)
    for part in range(files):
        chosen = names[part::files]
        content = {
            "users": chosen,
            "num_samples": [len(users[u][1]) for u in chosen],
            "user_data": {u: {"x": users[u][0], "y": users[u][1]} for u in chosen},
        }
        (directory / f"part_{part}.json").write_text(json.dumps(content))


def tweet(text: str) -> list[str]:
    """A tweet as LEAF stores it: ``[id, date, query, user, text]``."""
    return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", text]


POSITIVE, NEGATIVE = ("good", "great", "love", "happy"), ("bad", "awful", "hate", "sad")
FILLER = ("the", "day", "was", "a", "so", "it", "and", "today")


def sent140_users(num_users: int, per_user: int, seed: int) -> dict[str, tuple[list, list]]:
    """Tweets of filler words plus one sentiment word that decides the label."""
    rng = np.random.default_rng(seed)
    users = {}
    for u in range(num_users):
        xs, ys = [], []
        for _ in range(per_user):
            label = int(rng.integers(0, 2))
            words = list(rng.choice(FILLER, size=int(rng.integers(2, 6))))
            words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(POSITIVE if label else NEGATIVE)))
            xs.append(tweet(" ".join(words)))
            ys.append(label)
        users[f"account_{u}"] = (xs, ys)
    return users


def shakespeare_users(num_users: int, per_user: int, seq_length: int, seed: int) -> dict[str, tuple[list, list]]:
    """Windows over a role's cyclic line, so the next character follows from the last ones."""
    rng = np.random.default_rng(seed)
    users = {}
    for u in range(num_users):
        line = "To be, or not to be: that is the question.\n" if u % 2 == 0 else "ROMEO. What light through yonder"
        xs, ys = [], []
        for _ in range(per_user):
            start = int(rng.integers(0, len(line)))
            text = (line * (seq_length // len(line) + 3))[start : start + seq_length + 1]
            xs.append(text[:-1])
            ys.append(text[-1])
        users[f"ROLE_{u}"] = (xs, ys)
    return users


def write_leaf_dataset(root: Path, users_train: dict, users_test: dict) -> Path:
    """``root/train/*.json`` and ``root/test/*.json``; returns ``root``."""
    write_leaf(root / "train", users_train, files=2)
    write_leaf(root / "test", users_test)
    return root


def write_sent140(root: Path, num_users: int = 3, per_user: int = 12) -> Path:
    return write_leaf_dataset(root, sent140_users(num_users, per_user, 0), sent140_users(num_users, 3, 1))


def write_shakespeare(root: Path, seq_length: int, num_users: int = 3, per_user: int = 12) -> Path:
    train = shakespeare_users(num_users, per_user, seq_length, 0)
    return write_leaf_dataset(root, train, shakespeare_users(num_users, 3, seq_length, 1))


def write_femnist(root: Path, num_users: int = 3, per_user: int = 8) -> Path:
    def users(seed: int, count: int) -> dict[str, tuple[list, list]]:
        rng = np.random.default_rng(seed)
        return {
            f"writer_{u}": (rng.random((count, 784)).round(2).tolist(), rng.integers(0, 62, count).tolist())
            for u in range(num_users)
        }

    return write_leaf_dataset(root, users(0, per_user), users(1, 2))


def write_cifar10(root: Path, per_batch: int = 12, num_test: int = 10) -> Path:
    """``root/cifar-10-batches-py`` with five training batches and a test batch; the class sets the red level.

    torchvision checks the real files' MD5 sums: tests patch ``torchvision.datasets.cifar.check_integrity``.
    """
    directory = root / "cifar-10-batches-py"
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        count = num_test if name == "test_batch" else per_batch
        labels = [i % 10 for i in range(count)]
        data = rng.integers(0, 128, (count, 3 * 1024), dtype=np.uint8)
        data[:, :1024] = (np.array(labels, dtype=np.uint8) * 25)[:, None]
        with open(directory / name, "wb") as file:
            pickle.dump({"data": data, "labels": labels}, file)
    with open(directory / "batches.meta", "wb") as file:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, file)
    return root


__all__ = ["write_cifar10", "write_femnist", "write_leaf", "write_sent140", "write_shakespeare"]
