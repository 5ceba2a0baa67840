"""Convolutions of a batched group on a CPU: each client's with the ordinary convolution kernel, inside the vmap.

Under ``torch.func.vmap`` a convolution whose input and weight are both stacked over the group runs as one grouped
convolution (``groups = G``, the clients folded into the channels). On a GPU that is what makes a group fast; on a
CPU the grouped kernel is no faster than G ordinary convolutions and often slower (oneDNN's grouped path for
small channel counts), while the rest of the step (the linear layers as batched matrix products, the optimizer
update, the per-step overhead) does gain from the group. So on a CPU the convolutions of a group's step go through
:func:`client_convolution`, an operator whose vmap rule runs the ordinary convolution once per client on that
client's slice and stacks the results: the same kernel, the same arithmetic as the client training alone (its
outputs are bit-identical to the sequential ones), recorded by autograd like any other operation of the step, so
its gradient is the ordinary convolution's backward per client.

:func:`per_client_convolutions` routes ``torch.nn.functional.conv1d/2d/3d`` (what ``nn.Conv1d/2d/3d`` call) to it
for the duration of a block; a convolution it cannot express (``padding="same"``) keeps vmap's grouped form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

_CONVOLUTIONS: dict[int, Callable[..., Tensor]] = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


def _ordinary_convolution(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Tensor:
    """``F.conv1d/2d/3d`` (by the weight's dimensions); under vmap, one ordinary convolution per client."""
    return _CONVOLUTIONS[weight.dim()](input, weight, bias, stride, padding, dilation, groups)


client_convolution = torch.library.custom_op("lightning_fed::client_convolution", mutates_args=())(
    _ordinary_convolution
)
# Its shapes (for tracing) are the ordinary convolution's: the same function serves as the fake kernel.
client_convolution.register_fake(_ordinary_convolution)


def _per_client(
    info: Any,
    in_dims: tuple[int | None, ...],
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> tuple[Tensor, int]:
    """The vmap rule: client ``g``'s convolution on its slices (a tensor without a batch dimension is shared)."""
    convolution = _CONVOLUTIONS[weight.dim() - (in_dims[1] is not None)]
    if in_dims[1] is None and in_dims[2] is None:
        # A shared weight (a frozen base): the clients' batches are one batch of the one convolution.
        assert in_dims[0] is not None
        stacked = input.movedim(in_dims[0], 0)
        output = convolution(stacked.flatten(0, 1), weight, bias, stride, padding, dilation, groups)
        return output.unflatten(0, stacked.shape[:2]), 0

    def client(tensor: Tensor | None, dim: int | None, g: int) -> Tensor | None:
        return tensor if tensor is None or dim is None else tensor.select(dim, g)

    outputs = [
        convolution(
            client(input, in_dims[0], g),
            client(weight, in_dims[1], g),
            client(bias, in_dims[2], g),
            stride,
            padding,
            dilation,
            groups,
        )
        for g in range(info.batch_size)
    ]
    return torch.stack(outputs), 0


torch.library.register_vmap(client_convolution, _per_client)


class _PerClientConvolutions(TorchFunctionMode):
    """Sends ``F.conv1d/2d/3d`` to :func:`client_convolution` (positional or keyword arguments, as the functional
    convolutions take them)."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _FUNCTIONS:
            routed = _routed(func, args, kwargs)
            if routed is not None:
                return client_convolution(*routed)
        return func(*args, **kwargs)


_FUNCTIONS = frozenset({F.conv1d, F.conv2d, F.conv3d, torch.conv1d, torch.conv2d, torch.conv3d})
_DEFAULTS: tuple[Any, ...] = (None, 1, 0, 1, 1)  # bias, stride, padding, dilation, groups


def _routed(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The convolution's arguments as :func:`client_convolution` takes them, or ``None`` where it cannot take
    them (``padding`` given as a string)."""
    names = ("bias", "stride", "padding", "dilation", "groups")
    input, weight = args[0] if args else kwargs["input"], args[1] if len(args) > 1 else kwargs["weight"]
    values = [args[2 + i] if len(args) > 2 + i else kwargs.get(name, _DEFAULTS[i]) for i, name in enumerate(names)]
    bias, stride, padding, dilation, groups = values
    if isinstance(padding, str):
        return None
    spatial = weight.dim() - 2

    def expanded(value: int | Sequence[int]) -> list[int]:
        return [int(value)] * spatial if isinstance(value, int) else [int(v) for v in value]

    return input, weight, bias, expanded(stride), expanded(padding), expanded(dilation), int(groups)


@contextmanager
def per_client_convolutions(enabled: bool = True) -> Iterator[None]:
    """Runs the block's ``F.conv1d/2d/3d`` as one ordinary convolution per client under vmap (nothing changes
    outside a vmap); ``enabled=False`` leaves them as they are."""
    if not enabled:
        yield
        return
    with _PerClientConvolutions():
        yield


__all__ = ["client_convolution", "per_client_convolutions"]
