"""LEAF Shakespeare (Caldas et al. 2018, arXiv:1812.01097): next-character prediction on the lines of The Complete
Works of William Shakespeare, one client per speaking role in a play (McMahan et al., AISTATS 2017,
arXiv:1602.05629).

LEAF's preprocessing writes each sample as an 80-character window ``x`` and the character that follows it ``y``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from typing_extensions import override

from lightning_fed.checks import check_int
from lightning_fed.datamodules.leaf import _LeafFederated

#: LEAF's alphabet (``models/utils/language_utils.py``): character ``c`` has id ``LEAF_LETTERS.find(c)``.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
#: The id of every character outside LEAF's alphabet (LEAF's ``find`` gives -1, which no embedding row holds).
UNKNOWN_CHARACTER = len(LEAF_LETTERS)

_TABLE = np.full(max(map(ord, LEAF_LETTERS)) + 1, UNKNOWN_CHARACTER, dtype=np.uint8)
_TABLE[[ord(c) for c in LEAF_LETTERS]] = np.arange(len(LEAF_LETTERS), dtype=np.uint8)


def encode_characters(texts: list[str], length: int, field: str = "x") -> np.ndarray:
    """Encodes strings of exactly ``length`` characters as ``[len(texts), length]`` uint8 ids (see ``LEAF_LETTERS``).

    Raises:
        ValueError: Naming ``field`` when a string is not ``length`` characters long.
    """
    wrong = next((text for text in texts if not isinstance(text, str) or len(text) != length), None)
    if wrong is not None:
        raise ValueError(
            f"Shakespeare `{field}` values must be strings of {length} characters (`seq_length` for inputs, one "
            f"character for targets); got {wrong!r}."
        )
    # One vectorised lookup over the code points of the whole user's text: LEAF's data has about 4 million windows.
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
    ids = np.where(codes < len(_TABLE), _TABLE[np.minimum(codes, len(_TABLE) - 1)], UNKNOWN_CHARACTER)
    return ids.astype(np.uint8).reshape(len(texts), length)


class ShakespeareFederated(_LeafFederated):
    """LEAF Shakespeare: predict the character after a ``seq_length``-character window, one client per role.

    Inputs ``[seq_length]`` uint8 character ids (uint8 keeps LEAF's 4 million windows at 80 bytes each; models cast
    them, see :class:`~lightning_fed.models.CharLSTM`); targets the id of the next character. Ids 0–79 are LEAF's 80
    characters in LEAF's order (``LEAF_LETTERS``) and id 80 stands for any other character, so there are 81
    classes.

    Get the data with LEAF's scripts (github.com/TalwalkarLab/leaf): in ``data/shakespeare`` run
    ``./preprocess.sh -s niid --sf 0.2 -k 0 -t sample -tf 0.8`` (LEAF's example; ``--sf 1.0`` for all of it), then
    pass ``leaf_dir=<LEAF>/data/shakespeare/data``. Every LEAF user is one client; clients' test splits are their
    LEAF test data (see :class:`FEMNISTFederated` for the rules).

    Args:
        leaf_dir: LEAF's ``data/shakespeare/data`` directory, holding ``train/`` and ``test/``.
        seq_length: Characters per input window (80 in LEAF); every sample must have exactly this many.
        num_clients: Use this many roles, drawn with ``seed``; ``None`` uses all.
        **kwargs: :class:`FederatedDataModule` settings (batch sizes, holdouts, seed).
    """

    num_classes = UNKNOWN_CHARACTER + 1
    _leaf_name = "shakespeare"

    def __init__(self, leaf_dir: str, seq_length: int = 80, num_clients: int | None = None, **kwargs: Any) -> None:
        self.seq_length = check_int("seq_length", seq_length, minimum=1)
        super().__init__(leaf_dir, num_clients, **kwargs)

    @override
    def _convert_x(self, xs: list[Any]) -> np.ndarray:
        return encode_characters(xs, self.seq_length, "x")

    @override
    def _convert_y(self, ys: list[Any]) -> np.ndarray:
        return encode_characters(ys, 1, "y").reshape(-1).astype(np.int64)

    @override
    def _encode(self, train: np.ndarray, test: np.ndarray) -> tuple[Tensor, Tensor]:
        shape = (-1, self.seq_length)
        return torch.from_numpy(train.reshape(shape)), torch.from_numpy(test.reshape(shape).astype(np.uint8))
