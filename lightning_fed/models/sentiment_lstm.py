"""The Sent140 sentiment LSTM of LEAF (Caldas et al. 2018, arXiv:1812.01097), the text model of FedProx (Li et al.,
MLSys 2020, arXiv:1812.06127) and rFedAvg (Wang et al., "Distribution-Regularized Federated Learning on Non-IID
Data", ICDE 2023): word embeddings, a two-layer LSTM and a linear classifier on its last hidden state.

LEAF embeds tweets with frozen pretrained 300-d GloVe vectors (Pennington et al., EMNLP 2014). Nothing is downloaded
here: the embedding is trained from a random start by default, and :func:`glove_embedding_matrix` turns a local GloVe
text file into the initial matrix for the vocabulary of :class:`~lightning_fed.datamodules.Sent140Federated`.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import check_bool, check_instance, check_int


def glove_embedding_matrix(
    glove_path: str | Path, vocabulary: dict[str, int], vocab_size: int, embedding_dim: int = 300
) -> Tensor:
    """The ``[vocab_size, embedding_dim]`` float32 matrix whose row ``vocabulary[word]`` is ``word``'s GloVe vector.

    Rows of words that the file lacks, and the padding and unknown rows (ids 0 and 1 of
    :class:`~lightning_fed.datamodules.Sent140Federated`), are zero. Save the result with ``torch.save`` and pass
    the file as :class:`SentimentLSTM`'s ``embedding_path``::

        dm = Sent140Federated("leaf/data/sent140/data", vocab_size=10000)
        dm.setup()
        torch.save(glove_embedding_matrix("glove.6B.300d.txt", dm.vocabulary, 10000), "sent140_glove.pt")

    Args:
        glove_path: A GloVe text file: one word per line followed by ``embedding_dim`` numbers, space-separated.
        vocabulary: Word to token id, e.g. ``Sent140Federated.vocabulary`` after ``setup``.
        vocab_size: Rows of the matrix (the datamodule's ``vocab_size``).
        embedding_dim: Numbers per GloVe line.
    """
    check_int("vocab_size", vocab_size, minimum=1)
    check_int("embedding_dim", embedding_dim, minimum=1)
    matrix = np.zeros((vocab_size, embedding_dim), dtype=np.float32)
    with open(glove_path, encoding="utf-8") as file:
        for line in file:
            word, _, rest = line.rstrip("\n").partition(" ")
            index = vocabulary.get(word)
            if index is None or index >= vocab_size:
                continue
            values = np.array(rest.split(" "), dtype=np.float32)
            if values.size != embedding_dim:
                raise ValueError(f"{glove_path}: {word!r} has {values.size} numbers, expected `embedding_dim`.")
            matrix[index] = values
    return torch.from_numpy(matrix)


def load_embedding_matrix(path: str | Path) -> Tensor:
    """Reads a float matrix saved by ``torch.save`` (one tensor; loaded with ``weights_only=True``) or ``np.save``."""
    if Path(path).suffix == ".npy":
        return torch.from_numpy(np.load(path, allow_pickle=False)).float()
    matrix = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(matrix, Tensor):
        raise ValueError(f"`embedding_path` must hold one tensor saved with torch.save; {path} holds {type(matrix)}.")
    return matrix.float()


class SentimentLSTM(nn.Module):
    """Token ids ``[B, T]`` → embedding ``embedding_dim`` → ``num_layers``-layer LSTM ``hidden_dim`` → the hidden
    state at each tweet's last token → FC ``num_classes``.

    Sizes: LEAF's reference model (``models/sent140/stacked_lstm.py``) uses 25 tokens, 300-d GloVe embeddings, two
    LSTM layers of 100 units, the defaults here. FedProx (§5.1) and rFedAvg's code use 256 units: pass
    ``hidden_dim=256``. LEAF then applies a 128-unit dense layer without activation and a single sigmoid output;
    two linear maps in a row are one linear map, so here one linear layer gives ``num_classes`` logits for
    cross-entropy (with 2 classes, softmax is the sigmoid of the logit difference).

    Last token: :class:`~lightning_fed.datamodules.Sent140Federated` right-pads tweets with id 0, so the classifier
    reads the LSTM output at each tweet's last non-padding position (as rFedAvg's code does with packed sequences;
    LEAF reads the last position, padding included). ``pad_id=None`` reads the last position. A tweet of padding
    only reads position 0.

    Embedding: trainable and randomly initialised by default. ``embedding_path`` names a local file holding the
    initial ``[vocab_size, embedding_dim]`` matrix (see :func:`glove_embedding_matrix`); ``freeze_embedding=True``
    then keeps it fixed as LEAF does (a frozen embedding is excluded from every algorithm's penalties and control
    variates, which cover ``requires_grad`` parameters only). The matrix is only the starting point: it is part of
    the model's ``state_dict`` and checkpoints like any weight.

    Feature layer: the ``hidden_dim``-wide last-token LSTM output (tanh-bounded, not non-negative) is the
    penultimate activation rFedAvg compares; hook ``features_act`` (an identity module, also the class attribute
    ``feature_layer``), width ``feature_dim``.

    Args:
        vocab_size: Token ids (``Sent140Federated``'s ``vocab_size``, padding and unknown included).
        num_classes: Output logits (2 for Sent140).
        embedding_dim: Width of the word embedding.
        hidden_dim: Units of every LSTM layer.
        num_layers: Stacked LSTM layers.
        pad_id: Padding token id, or ``None`` to read the last position whatever it holds.
        embedding_path: Optional local ``.pt`` (``torch.save``) or ``.npy`` file with the initial embedding matrix.
        freeze_embedding: Keep the embedding fixed during training.
    """

    feature_layer: ClassVar[str] = "features_act"

    def __init__(
        self,
        vocab_size: int = 10000,
        num_classes: int = 2,
        embedding_dim: int = 300,
        hidden_dim: int = 100,
        num_layers: int = 2,
        pad_id: int | None = 0,
        embedding_path: str | None = None,
        freeze_embedding: bool = False,
    ) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        check_int("num_classes", num_classes, minimum=1)
        check_int("embedding_dim", embedding_dim, minimum=1)
        check_int("hidden_dim", hidden_dim, minimum=1)
        check_int("num_layers", num_layers, minimum=1)
        check_int("pad_id", pad_id, minimum=0, maximum=vocab_size - 1, allow_none=True)
        check_instance("embedding_path", embedding_path, (str, Path, type(None)), "a file path or None")
        check_bool("freeze_embedding", freeze_embedding)
        self.pad_id = pad_id
        self.feature_dim = hidden_dim
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_id)
        if embedding_path is not None:
            matrix = load_embedding_matrix(embedding_path)
            if tuple(matrix.shape) != (vocab_size, embedding_dim):
                raise ValueError(
                    f"`embedding_path` {embedding_path} holds a {tuple(matrix.shape)} matrix; the model needs "
                    f"[vocab_size, embedding_dim] = [{vocab_size}, {embedding_dim}]."
                )
            with torch.no_grad():
                self.embedding.weight.copy_(matrix)
        self.embedding.weight.requires_grad_(not freeze_embedding)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, num_layers=num_layers, batch_first=True)
        self.features_act = nn.Identity()
        self.head = nn.Linear(hidden_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Returns the ``[B, hidden_dim]`` LSTM output at each sequence's last token."""
        tokens = x.long()
        outputs, _ = self.lstm(self.embedding(tokens))
        if self.pad_id is None:
            last = outputs[:, -1]
        else:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
            index = torch.where(tokens != self.pad_id, positions, 0).amax(dim=1)
            last = outputs[torch.arange(tokens.shape[0], device=tokens.device), index]
        return self.features_act(last)

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Maps ``[B, T]`` integer token ids to ``[B, num_classes]`` logits."""
        return self.head(self.features(x))
