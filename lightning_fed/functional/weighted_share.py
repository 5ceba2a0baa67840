r"""One client's share of a float64 weighted sum, sent as float32 entries and their weight, rebuilt to the bit.

A weighted sum over clients (FedAvg's :math:`\sum_k p_k w_k`) is accumulated in float64 so that the order of the
additions barely matters. A deployment's site holds one client's share of it, :math:`0 + p_k w_k`: a float64 tensor
twice the size of the client's float32 entries, though it carries no more information than :math:`w_k` and
:math:`p_k`. :func:`share_as_float32` recovers the float32 entries from the share (and checks that
:func:`share_from_float32` rebuilds every bit of it); the server rebuilds the share with the very operation the site's
sum performed, so what it folds is what the site held.

Why the division recovers :math:`w_k` exactly: the share is :math:`p w (1 + \delta_1)` with
:math:`|\delta_1| \le 2^{-53}`, and dividing by :math:`p` adds another such factor, so the quotient is within
:math:`2^{-51}` (relative) of the float32 value :math:`w`, far inside the half-ulp :math:`2^{-24}` that float32
rounding forgives. The check makes it an invariant rather than an argument (subnormals, overflow, a share that is
not one client's).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lightning_fed.functional.state_dict import StateDict


def share_from_float32(entries: Mapping[str, Tensor], weight: float) -> StateDict:
    r"""The float64 share :math:`0 + p\,w` of each entry :math:`w` (float32) at weight :math:`p`, computed as a sum
    accumulates it (``zeros.add_(w, alpha=p)``), so it equals the share a site's sum held bit for bit."""
    return {
        name: torch.zeros_like(tensor, dtype=torch.float64).add_(tensor, alpha=weight)
        for name, tensor in entries.items()
    }


def share_as_float32(share: Mapping[str, Tensor], weight: float) -> StateDict | None:
    r"""The float32 entries :math:`w` whose weighted share :math:`p\,w` is ``share``, or ``None`` where none is.

    Args:
        share: Float64 tensors, by name: one client's share of a weighted sum.
        weight: :math:`p`, the client's weight in the sum.

    Returns:
        ``{name: w}`` in float32 such that :func:`share_from_float32` ``(w, weight)`` equals ``share`` exactly, or
        ``None`` when that does not hold for every entry (a zero or non-finite weight, a share of several clients, a
        value beyond float32's range): the share then travels as it is.
    """
    if weight == 0.0 or not torch.isfinite(torch.tensor(weight)):
        return None
    entries: StateDict = {}
    for name, tensor in share.items():
        if tensor.dtype != torch.float64:
            return None
        entry = (tensor / weight).to(torch.float32)
        if not torch.equal(torch.zeros_like(tensor).add_(entry, alpha=weight), tensor):
            return None
        entries[name] = entry
    return entries


__all__ = ["share_as_float32", "share_from_float32"]
