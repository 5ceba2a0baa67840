"""LeNet-5 (LeCun et al. 1998) as used for CIFAR-10 by FedGG (Wu, Liu, Xue 2022, arXiv:2204.03920): "two 5×5
convolution layers with 6 and 16 channels ... followed by a 2×2 maxpooling and two fully connected layers whose
dimensions are 120 and 84", with ReLU activations."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_int


class LeNet5(nn.Module):
    """LeNet-5 with ReLU and max pooling: conv 6@5×5 → ReLU → pool → conv 16@5×5 → ReLU → pool → FC 120 → ReLU →
    FC 84 → ReLU → FC ``num_classes``.

    Padding: by default the first convolution uses 'same' padding (2) on images smaller than LeNet's native 32×32
    and none otherwise: 28×28 MNIST gets the classic MNIST variant, 32×32 CIFAR-10 the original. Both then flatten
    16×5×5 = 400 features, so the network matches the textbook one (61,706 parameters for 1×28×28 input and 10
    classes). Pass ``first_conv_padding`` to override; the flatten size is computed from the resulting geometry.

    Feature layer: the 84-d post-ReLU output of ``fc2`` is the penultimate activation; hook ``features_act`` (also
    the class attribute ``feature_layer``), width ``feature_dim``.

    Args:
        in_channels: Input channels (1 for MNIST, 3 for CIFAR-10).
        num_classes: Output logits.
        image_size: Side of the square input image.
        first_conv_padding: Zero padding of the first convolution; ``None`` chooses as described above.
    """

    feature_layer: ClassVar[str] = "features_act"

    def __init__(
        self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28, first_conv_padding: int | None = None
    ) -> None:
        super().__init__()
        check_int("in_channels", in_channels, minimum=1)
        check_int("num_classes", num_classes, minimum=1)
        check_int("image_size", image_size, minimum=1)
        check_int("first_conv_padding", first_conv_padding, minimum=0, allow_none=True)
        padding = (2 if image_size < 32 else 0) if first_conv_padding is None else first_conv_padding
        side = ((image_size + 2 * padding - 4) // 2 - 4) // 2
        if side < 1:
            raise InvalidArgumentError(
                "image_size",
                image_size,
                f"large enough for two 5×5 convolutions and two 2×2 poolings with `first_conv_padding`={padding} "
                "(at least 12 with padding 2, 16 with none)",
            )
        self.feature_dim = 84
        self.conv1 = nn.Conv2d(in_channels, 6, kernel_size=5, padding=padding)
        self.conv_act1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.conv_act2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc_act1 = nn.ReLU()
        self.fc2 = nn.Linear(120, self.feature_dim)
        self.features_act = nn.ReLU()
        self.fc3 = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Returns the ``[B, 84]`` post-ReLU ``fc2`` activations."""
        x = self.pool1(self.conv_act1(self.conv1(x)))
        x = self.pool2(self.conv_act2(self.conv2(x)))
        x = self.fc_act1(self.fc1(self.flatten(x)))
        return self.features_act(self.fc2(x))

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Maps ``[B, in_channels, image_size, image_size]`` images to ``[B, num_classes]`` logits."""
        return self.fc3(self.features(x))
