"""VGG-16 (Simonyan and Zisserman 2014, "Very Deep Convolutional Networks for Large-Scale Image Recognition",
arXiv:1409.1556, configuration D) in the variant usually trained on 32×32 CIFAR-10 images: the thirteen 3×3
convolutions and five poolings of the paper, which leave a 1×1×512 map, and a classifier whose two hidden layers are
512 wide instead of 4096.
"""

from __future__ import annotations

import math
from typing import ClassVar

from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_choice, check_int, check_real

#: Configuration D: the output channels of each block's 3×3 convolutions; a 2×2 max pooling ends every block.
VGG16_BLOCKS: tuple[tuple[int, ...], ...] = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
_NORMS = ("none", "group", "batch")


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        # Wu and He (2018, arXiv:1803.08494) use 32 groups; gcd keeps the count a divisor of narrow layers' widths.
        return nn.GroupNorm(math.gcd(32, channels), channels)
    return nn.Identity()


class VGG16(nn.Module):
    """VGG-16 for 32×32 images: 13 × [conv 3×3 (padding 1) → norm → ReLU] with 2×2 max pooling after the 2nd, 4th,
    7th, 10th and 13th convolution, then flatten → [dropout → FC 512 → ReLU] × 2 → FC ``num_classes``.

    Normalisation (``norm``): ``"none"`` is the network as published; ``"batch"`` adds BatchNorm after every
    convolution and ``"group"`` GroupNorm (32 groups, fewer on layers narrower than 32·k). The choice matters in
    federated training: BatchNorm's running mean and variance are buffers that FedAvg averages like weights, so the
    global model evaluates with an average of the clients' statistics, which under label skew describes no client's
    data, while each client normalises its local batches with its own statistics. Hsieh et al. (ICML 2020,
    arXiv:1910.00189) show BatchNorm failing under non-IID data and GroupNorm recovering most of the loss; GroupNorm
    keeps no running statistics, so training and evaluation agree.

    Initialisation: convolutions use Kaiming-normal weights (fan-out, ReLU gain) and zero biases, which lets the
    16-layer network train without normalisation; linear layers keep PyTorch's default.

    Feature layer: the post-ReLU output of the second 512-wide FC layer is the penultimate activation; hook
    ``features_act`` (also the class attribute ``feature_layer``), width ``feature_dim``.

    With the defaults (3 input channels, 10 classes, no normalisation) it has 15,245,130 parameters.

    Args:
        in_channels: Input channels (3 for CIFAR-10).
        num_classes: Output logits.
        image_size: Side of the square input image; a multiple of 32 (the five poolings halve it five times).
        norm: ``"none"``, ``"group"`` or ``"batch"`` (see above).
        width_multiplier: Scales every convolution's and hidden layer's width (rounded, at least 1): 1.0 is VGG-16,
            0.25 a sixteenth of the parameters for quick experiments and tests.
        dropout: Dropout before each hidden FC layer (0.5 in Simonyan and Zisserman); 0 disables it.
    """

    feature_layer: ClassVar[str] = "features_act"

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        image_size: int = 32,
        norm: str = "none",
        width_multiplier: float = 1.0,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        check_int("in_channels", in_channels, minimum=1)
        check_int("num_classes", num_classes, minimum=1)
        check_int("image_size", image_size, minimum=32)
        if image_size % 32:
            raise InvalidArgumentError("image_size", image_size, "a multiple of 32 (five 2×2 poolings)")
        check_choice("norm", norm, _NORMS)
        check_real("width_multiplier", width_multiplier, minimum=0.0, exclusive_minimum=True)
        check_real("dropout", dropout, minimum=0.0, maximum=1.0, exclusive_maximum=True)
        self.norm = norm

        def width(channels: int) -> int:
            return max(1, round(channels * width_multiplier))

        layers: list[nn.Module] = []
        channels = in_channels
        for block in VGG16_BLOCKS:
            for spec in block:
                out = width(spec)
                layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), _norm(norm, out), nn.ReLU()]
                channels = out
            layers.append(nn.MaxPool2d(2))
        self.conv = nn.Sequential(*layers)
        self.flatten = nn.Flatten()
        side = image_size // 32
        self.feature_dim = width(512)
        self.fc1 = nn.Sequential(nn.Dropout(dropout), nn.Linear(channels * side * side, self.feature_dim), nn.ReLU())
        self.fc2 = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.feature_dim, self.feature_dim))
        self.features_act = nn.ReLU()
        self.head = nn.Linear(self.feature_dim, num_classes)
        for module in self.conv.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def features(self, x: Tensor) -> Tensor:
        """Returns the ``[B, feature_dim]`` post-ReLU activations of the second hidden FC layer."""
        return self.features_act(self.fc2(self.fc1(self.flatten(self.conv(x)))))

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Maps ``[B, in_channels, image_size, image_size]`` images to ``[B, num_classes]`` logits."""
        return self.head(self.features(x))
