"""The CNN of pfl-research's CIFAR-10 benchmark (Granqvist et al., "pfl-research: simulation framework for
accelerating research in Private Federated Learning", NeurIPS 2024 Datasets and Benchmarks, arXiv:2404.06430).

The benchmark describes it as a simple CNN with two convolutional layers and one dense hidden layer: two unpadded
3×3 convolutions (32 then 64 channels, each followed by ReLU), one 2×2 max pooling, dropout 0.25, a 128-unit fully
connected layer with ReLU, dropout 0.5, and the linear output layer, with Glorot (Xavier) uniform initial weights as
its TensorFlow twin has. For CIFAR-10 (3×32×32, 10 classes) that is 1,626,442 parameters, the paper's 1.63 M. It
takes channels-first images, as every image model here does (pfl's own version takes channels-last ones and
transposes them first).

The same layers are the EMNIST CNN of Reddi et al. ("Adaptive Federated Optimization", ICLR 2021,
arXiv:2003.00295), which FedML and FLUTE time as CNN_FEMNIST: ``PflCifarCNN(in_channels=1, num_classes=62,
image_size=28)`` has its 1,206,590 parameters (``benchmarks/vs_flute.py``); the initial weights there are PyTorch's
defaults rather than Glorot's.
"""

from __future__ import annotations

from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import check_int


class PflCifarCNN(nn.Module):
    """pfl-research's CIFAR-10 benchmark CNN (Granqvist et al. 2024): conv 3×3 (32) → ReLU → conv 3×3 (64) → ReLU →
    2×2 max pool → dropout 0.25 → linear (128) → ReLU → dropout 0.5 → linear (``num_classes``).

    The convolutions are unpadded, so a side of ``s`` pixels is ``s - 4`` after them and ``(s - 4) // 2`` after
    the pooling: 14 for CIFAR-10's 32, and the hidden layer reads ``64 × 14 × 14 = 12 544`` features.

    Args:
        in_channels: Input channels (3 for CIFAR-10).
        num_classes: Output logits.
        image_size: Side of the square input image (32 for CIFAR-10).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32) -> None:
        super().__init__()
        check_int("in_channels", in_channels, minimum=1)
        check_int("num_classes", num_classes, minimum=1)
        # Two unpadded 3×3 convolutions take 4 pixels and the pooling halves what is left: at least one must remain.
        check_int("image_size", image_size, minimum=6)
        side = (image_size - 4) // 2
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=3)
        self.conv_act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.conv_act2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv_dropout = nn.Dropout(0.25)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(64 * side * side, 128)
        self.fc_act = nn.ReLU()
        self.fc_dropout = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, num_classes)
        for layer in (self.conv1, self.conv2, self.fc1, self.fc2):
            nn.init.xavier_uniform_(layer.weight)

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Maps ``[B, in_channels, image_size, image_size]`` images to ``[B, num_classes]`` logits."""
        x = self.conv_act2(self.conv2(self.conv_act1(self.conv1(x))))
        x = self.flatten(self.conv_dropout(self.pool(x)))
        return self.fc2(self.fc_dropout(self.fc_act(self.fc1(x))))


__all__ = ["PflCifarCNN"]
