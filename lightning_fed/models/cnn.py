"""The two-convolution CNN of FedAvg (McMahan et al., AISTATS 2017, arXiv:1602.05629), reused by rFedAvg (Wang et al.,
"Distribution-Regularized Federated Learning on Non-IID Data", ICDE 2023).

Zhao et al. (2018, "Federated Learning with Non-IID Data", arXiv:1806.00582) and Wang et al. both say they use "the
same CNN structure as [McMahan et al.]"; Wang et al. add that "the dimension of the last FC layer is 512" and take
that layer's output as the feature φ of their MMD regulariser.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import check_int


class FedAvgCNN(nn.Module):
    """McMahan et al. (2017) CNN: two 5×5 convolutions (32, 64 channels), each followed by ReLU and 2×2 max pooling,
    a 512-unit fully connected layer with ReLU, and a linear output layer.

    Padding: neither McMahan et al. nor rFedAvg (Wang et al., ICDE 2023) state it, so the convolutions use 'same'
    padding (padding=2). That is the only choice that reproduces McMahan et al.'s reported total of 1,663,370
    parameters for MNIST (1×28×28 input, 10 classes); with no padding the count would be 582,026.

    Feature layer: the 512-d output of ``fc1`` after its ReLU is the penultimate activation that rFedAvg's MMD
    compares (ALGORITHMS.md). The ReLU is its own module, ``features_act`` (also in the class attribute
    ``feature_layer``), so a forward hook registered on ``model.features_act`` receives a ``[B, 512]`` non-negative
    tensor. ``feature_dim`` gives its width.

    Args:
        in_channels: Input channels (1 for MNIST, 3 for CIFAR-10).
        num_classes: Output logits.
        image_size: Side of the square input image (28 for MNIST, 32 for CIFAR-10).
    """

    feature_layer: ClassVar[str] = "features_act"

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        check_int("in_channels", in_channels, minimum=1)
        check_int("num_classes", num_classes, minimum=1)
        # 'same' padding keeps the side until each pool, which floors it to half: two 2×2 poolings need 4 pixels.
        check_int("image_size", image_size, minimum=4)
        side = image_size // 2 // 2
        self.feature_dim = 512
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=5, padding=2)
        self.conv_act1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        self.conv_act2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(64 * side * side, self.feature_dim)
        self.features_act = nn.ReLU()
        self.fc2 = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Returns the ``[B, 512]`` post-ReLU ``fc1`` activations (the rFedAvg feature φ)."""
        x = self.pool1(self.conv_act1(self.conv1(x)))
        x = self.pool2(self.conv_act2(self.conv2(x)))
        return self.features_act(self.fc1(self.flatten(x)))

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Maps ``[B, in_channels, image_size, image_size]`` images to ``[B, num_classes]`` logits."""
        return self.fc2(self.features(x))
