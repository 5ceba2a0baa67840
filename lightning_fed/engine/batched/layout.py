"""The memory layout of a group's stacked parameters: the layout their gradients come back in.

A vmapped linear layer's weight gradient comes back transposed (``[clients, in, out]`` in memory). An optimizer
update that reads it against a row-major parameter strides through memory and, for a group of 2NN clients, costs
several times the in-order update. So each stacked parameter is copied once into its gradient's layout, and the
groups after the first are stacked in that layout directly, into the previous group's tensor when the sizes match
(a fresh tensor of a group's size costs a page fault per page on its first write).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_fed.functional.state_dict import StateDict


class GradientLayouts:
    """Per stacked parameter: the order of its dimensions in memory (outermost first), once a gradient showed it."""

    def __init__(self) -> None:
        self._orders: dict[str, tuple[int, ...]] = {}
        self._spare: dict[str, Tensor] = {}

    def stack(self, name: str, sources: Sequence[Tensor]) -> Tensor:
        """``torch.stack(sources)``, laid out as ``name``'s gradient when that layout is known (not a leaf yet)."""
        order = self._orders.get(name)
        if order is None:
            return torch.stack([source.detach() for source in sources])
        shape = (len(sources), *sources[0].shape)
        out = self._spare.pop(name, None)
        if out is None or out.shape != shape or out.dtype != sources[0].dtype or out.device != sources[0].device:
            out = _empty_in_order(shape, order, sources[0])
        with torch.no_grad():
            if all(source is sources[0] for source in sources):
                out.copy_(sources[0].expand(shape))  # every client starts from the same model (FedAvg)
            else:
                out.copy_(torch.stack([source.detach() for source in sources]))
        return out.detach()

    def adopt(self, stacked: StateDict, grads: StateDict) -> None:
        """Copies each tensor of ``stacked`` whose gradient in ``grads`` is laid out otherwise into that layout
        (replacing the entry, as a new leaf that requires grad) and remembers the layout for the next groups."""
        for name, grad in grads.items():
            param = stacked[name]
            if grad.shape != param.shape or grad.stride() == param.stride() or not _dense(grad):
                continue
            order = _order_of(grad)
            if param.permute(order).is_contiguous():
                continue  # the same layout (strides of size-1 dimensions differ)
            self._orders[name] = order
            laid = _empty_in_order(tuple(param.shape), order, param)
            with torch.no_grad():
                laid.copy_(param)
            stacked[name] = laid.requires_grad_(param.requires_grad)

    def release(self, name: str, tensor: Tensor) -> None:
        """Keeps ``tensor`` (no longer read by anyone) to stack the next group of ``name`` into."""
        if name in self._orders:
            self._spare[name] = tensor.detach()


def _empty_in_order(shape: tuple[int, ...], order: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised tensor of ``shape`` whose dimensions lie in memory in ``order`` (outermost first)."""
    inverse = sorted(range(len(order)), key=lambda d: order[d])
    storage = torch.empty([shape[d] for d in order], dtype=like.dtype, device=like.device)
    return storage.permute(inverse)


def _order_of(tensor: Tensor) -> tuple[int, ...]:
    """``tensor``'s dimensions from the outermost in memory to the innermost (by decreasing stride)."""
    strides = tensor.stride()
    return tuple(sorted(range(tensor.dim()), key=lambda d: -strides[d]))


def _dense(tensor: Tensor) -> bool:
    """Whether ``tensor`` is a permutation of a contiguous tensor (no gaps, no overlaps)."""
    order = _order_of(tensor)
    return tensor.permute(order).is_contiguous()


__all__ = ["GradientLayouts"]
