"""Batched clients' convolutions on a CPU: one ordinary convolution per client inside the vmap, so a group of a
convolutional model computes what its clients compute alone."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers.boring import NUM_CLASSES, BoringClassifier
from test_batched_clients import _assert_same, _fit
from torch import nn

from lightning_fed.engine.batched.convolution import per_client_convolutions


def _grads(output: torch.Tensor, leaves: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad((output * torch.linspace(-1, 1, output.numel()).view_as(output)).sum(), leaves)


@pytest.mark.parametrize(
    ("conv", "shape", "weight", "settings"),
    [
        (F.conv2d, (5, 3, 9, 9), (4, 3, 3, 3), {"padding": 1}),
        (F.conv2d, (5, 4, 9, 9), (6, 2, 3, 3), {"stride": 2, "dilation": 2, "groups": 2}),
        (F.conv1d, (5, 3, 11), (4, 3, 5), {"padding": (2,)}),
        (torch.conv2d, (5, 3, 8, 8), (4, 3, 5, 5), {}),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_each_clients_convolution_is_its_own_bit_for_bit_with_its_gradient(conv, shape, weight, settings, bias):
    generator = torch.Generator().manual_seed(0)
    clients = 3
    x = torch.randn(clients, *shape, generator=generator)
    w = torch.randn(clients, *weight, generator=generator).requires_grad_()
    b = torch.randn(clients, weight[0], generator=generator).requires_grad_() if bias else None

    def one(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return conv(x, w, b, **settings)

    with per_client_convolutions():
        batched = torch.func.vmap(one, in_dims=(0, 0, 0 if bias else None))(x, w, b)
    alone = torch.stack([one(x[g], w[g], None if b is None else b[g]) for g in range(clients)])
    assert torch.equal(batched, alone)
    leaves = [w] if b is None else [w, b]
    for got, expected in zip(_grads(batched, leaves), _grads(alone, leaves)):
        assert torch.equal(got, expected)


def test_a_shared_weight_and_string_padding_keep_their_meaning():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 3, 7, 7, generator=generator)
    shared = torch.randn(4, 3, 3, 3, generator=generator)  # a frozen base: one weight for every client
    with per_client_convolutions():
        folded = torch.func.vmap(lambda x: F.conv2d(x, shared, None, 1, 1))(x)
        same = torch.func.vmap(lambda x: F.conv2d(x, shared, padding="same"))(x)  # vmap's own form
    expected = torch.stack([F.conv2d(x[g], shared, None, 1, 1) for g in range(3)])
    torch.testing.assert_close(folded, expected)
    torch.testing.assert_close(same, expected)


class ConvClassifier(BoringClassifier):
    """The boring classifier's features as a 1-channel 2 x 4 image through a small convolution."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conv = nn.Conv2d(1, 3, kernel_size=2, padding=1)
        self.net = nn.Sequential(nn.ReLU(), nn.Flatten(), nn.Linear(3 * 3 * 5, NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.conv(x.view(-1, 1, 2, 4)))


def test_a_convolutional_model_grouped_on_the_cpu_trains_as_sequentially_and_auto_keeps_it_sequential(tmp_path):
    sequential, seq_metrics, _ = _fit(1, ConvClassifier, default_root_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="client_parallelism")
        batched, metrics, trainer = _fit(3, ConvClassifier, default_root_dir=str(tmp_path))
    assert trainer.fed_runner.batched.size == 3
    _assert_same(batched, sequential)
    for key, value in seq_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    # A group is slower than one client at a time for a convolutional model on a CPU (auto_group_size): auto keeps
    # it sequential.
    _, _, trainer = _fit("auto", ConvClassifier, default_root_dir=str(tmp_path))
    assert trainer.fed_runner.batched.size == 1
