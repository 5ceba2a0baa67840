"""The Shakespeare next-character LSTM of LEAF (Caldas et al. 2018, arXiv:1812.01097, ``models/shakespeare/
stacked_lstm.py``), after McMahan et al. (AISTATS 2017, arXiv:1602.05629) and used by FedProx (Li et al., MLSys 2020,
arXiv:1812.06127): an 8-d character embedding, two LSTM layers of 256 units and a linear layer that predicts the
character following an 80-character window.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import check_int


class CharLSTM(nn.Module):
    """Character ids ``[B, T]`` → embedding ``embedding_dim`` → ``num_layers``-layer LSTM ``hidden_dim`` → the
    output at the last position → FC ``num_classes``: logits of the next character.

    As in LEAF, one prediction per window (not one per position), so :class:`~lightning_fed.models.ClassifierModule`
    trains it with plain cross-entropy on ``[B, num_classes]`` logits. The defaults match
    :class:`~lightning_fed.datamodules.ShakespeareFederated`: LEAF's 80 characters plus one id for any other
    character, as both inputs and classes (LEAF's model has 80; the extra class lets a character outside LEAF's
    alphabet be a target). PyTorch's LSTM has two bias vectors per gate where TensorFlow's has one, so the count is
    2 × 4 × 256 per layer higher than LEAF's; with the defaults it has 820,185 parameters.

    Inputs may be any integer dtype (the datamodule stores ``uint8`` ids to keep LEAF's 4 million windows small);
    they are cast to ``int64`` for the embedding.

    Feature layer: the ``hidden_dim``-wide LSTM output at the last position (tanh-bounded) is the penultimate
    activation rFedAvg compares; hook ``features_act`` (an identity module, also the class attribute
    ``feature_layer``), width ``feature_dim``.

    Args:
        vocab_size: Character ids the embedding covers.
        num_classes: Output logits (the characters that can be predicted).
        embedding_dim: Width of the character embedding (8 in LEAF).
        hidden_dim: Units of every LSTM layer (256 in LEAF).
        num_layers: Stacked LSTM layers (2 in LEAF).
    """

    feature_layer: ClassVar[str] = "features_act"

    def __init__(
        self,
        vocab_size: int = 81,
        num_classes: int = 81,
        embedding_dim: int = 8,
        hidden_dim: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size, minimum=1)
        check_int("num_classes", num_classes, minimum=1)
        check_int("embedding_dim", embedding_dim, minimum=1)
        check_int("hidden_dim", hidden_dim, minimum=1)
        check_int("num_layers", num_layers, minimum=1)
        self.feature_dim = hidden_dim
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, num_layers=num_layers, batch_first=True)
        self.features_act = nn.Identity()
        self.head = nn.Linear(hidden_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Returns the ``[B, hidden_dim]`` LSTM output at the last position."""
        outputs, _ = self.lstm(self.embedding(x.long()))
        return self.features_act(outputs[:, -1])

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Maps ``[B, T]`` integer character ids to ``[B, num_classes]`` next-character logits."""
        return self.head(self.features(x))
