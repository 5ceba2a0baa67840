"""A small 1-D CNN for MNIST-1D (Greydanus 2020, "Scaling down deep learning"), the project's fast CPU benchmark.

No paper of this project trains on MNIST-1D; the network plays the role the FedAvg CNN (McMahan et al. 2017,
arXiv:1602.05629) plays in rFedAvg (Wang et al., "Distribution-Regularized Federated Learning on Non-IID Data", ICDE
2023) and in Zhao et al. (2018, arXiv:1806.00582): a convolutional feature extractor followed by a fully connected
feature layer whose post-ReLU output is the penultimate activation that rFedAvg regularises.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import check_int


def _strided_length(length: int) -> int:
    """Output length of a kernel-5, padding-2, stride-2 convolution."""
    return (length - 1) // 2 + 1


class MNIST1DCNN(nn.Module):
    """Three 1-D convolutions (kernel 5, padding 2, ReLU; stride 1, 2, 2) → flatten → FC ``hidden_dim`` → ReLU →
    FC ``num_classes``.

    With the defaults (length 40, 32 channels, 64 hidden units) it has 31,690 parameters and reaches about 90 % test
    accuracy on MNIST-1D (4,000 samples, Adam lr 1e-2, batch 64) after ten centrally trained epochs of about 0.15 s
    each on two CPU threads (see ``tests/models``).

    Feature layer: the ``hidden_dim``-wide post-ReLU output of ``fc1``; hook ``features_act`` (also the class
    attribute ``feature_layer``), width ``feature_dim``.

    Args:
        input_length: Length of the input signal (40 for MNIST-1D).
        num_classes: Output logits.
        channels: Channels of every convolution.
        hidden_dim: Width of the fully connected feature layer.
    """

    feature_layer: ClassVar[str] = "features_act"

    def __init__(self, input_length: int = 40, num_classes: int = 10, channels: int = 32, hidden_dim: int = 64) -> None:
        super().__init__()
        check_int("input_length", input_length, minimum=1)
        check_int("num_classes", num_classes, minimum=1)
        check_int("channels", channels, minimum=1)
        check_int("hidden_dim", hidden_dim, minimum=1)
        self.feature_dim = hidden_dim
        self.conv1 = nn.Conv1d(1, channels, kernel_size=5, padding=2)
        self.conv_act1 = nn.ReLU()
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=5, stride=2, padding=2)
        self.conv_act2 = nn.ReLU()
        self.conv3 = nn.Conv1d(channels, channels, kernel_size=5, stride=2, padding=2)
        self.conv_act3 = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(channels * _strided_length(_strided_length(input_length)), hidden_dim)
        self.features_act = nn.ReLU()
        self.fc2 = nn.Linear(hidden_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Returns the ``[B, hidden_dim]`` post-ReLU ``fc1`` activations."""
        # mnist1d yields [B, L] arrays; accept them as single-channel signals.
        if x.dim() == 2:
            x = x.unsqueeze(1)
        x = self.conv_act1(self.conv1(x))
        x = self.conv_act2(self.conv2(x))
        x = self.conv_act3(self.conv3(x))
        return self.features_act(self.fc1(self.flatten(x)))

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Maps ``[B, 1, input_length]`` (or ``[B, input_length]``) signals to ``[B, num_classes]`` logits."""
        return self.fc2(self.features(x))
