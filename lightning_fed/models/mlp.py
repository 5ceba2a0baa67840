"""The "three-layer MLP" of FedGG (Wu, Liu, Xue 2022, arXiv:2204.03920), used there for SVHN: "the dimensions of the
input layer, hidden layer and output layer are 3×32×32, 512, and 10", with ReLU activation."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import check_int


class MLP(nn.Module):
    """Fully connected classifier: flatten → [Linear ``hidden_dim`` → ReLU] × ``num_hidden_layers`` → Linear
    ``num_classes``.

    Depth: FedGG's "three-layer MLP" counts the input, hidden and output layers of the network, i.e. ONE hidden
    layer of 512 units (input → 512 → classes), so ``num_hidden_layers`` defaults to 1. Zhao et al. (2018,
    arXiv:1806.00582) and rFedAvg (Wang et al., ICDE 2023) use no MLP. Pass ``num_hidden_layers=2`` for McMahan et
    al.'s "2NN" (784 → 200 → 200 → 10 with ``hidden_dim=200``).

    Feature layer: the last hidden layer's post-ReLU output; hook ``features_act`` (also the class attribute
    ``feature_layer``), width ``feature_dim``.

    Args:
        input_dim: Number of input features after flattening (784 for MNIST, 3072 for 3×32×32 images).
        hidden_dim: Width of every hidden layer.
        num_classes: Output logits.
        num_hidden_layers: Number of hidden layers (at least 1).
    """

    feature_layer: ClassVar[str] = "features_act"

    def __init__(
        self, input_dim: int = 784, hidden_dim: int = 512, num_classes: int = 10, num_hidden_layers: int = 1
    ) -> None:
        super().__init__()
        check_int("input_dim", input_dim, minimum=1)
        check_int("hidden_dim", hidden_dim, minimum=1)
        check_int("num_classes", num_classes, minimum=1)
        check_int("num_hidden_layers", num_hidden_layers, minimum=1)
        self.feature_dim = hidden_dim
        layers: list[nn.Module] = [nn.Flatten()]
        for index in range(num_hidden_layers):
            layers.append(nn.Linear(input_dim if index == 0 else hidden_dim, hidden_dim))
            # The last ReLU lives outside `hidden` so that it has a stable, hookable name at any depth.
            if index < num_hidden_layers - 1:
                layers.append(nn.ReLU())
        self.hidden = nn.Sequential(*layers)
        self.features_act = nn.ReLU()
        self.head = nn.Linear(hidden_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Returns the ``[B, hidden_dim]`` post-ReLU activations of the last hidden layer."""
        return self.features_act(self.hidden(x))

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Maps inputs of any shape ``[B, ...]`` with ``input_dim`` elements per example to ``[B, num_classes]``."""
        return self.head(self.features(x))
