"""Arithmetic on model states (name -> tensor dicts of parameters and buffers)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

StateDict = dict[str, Tensor]


def clone_state(state: Mapping[str, Tensor]) -> StateDict:
    """Detached copies of every tensor, on their current device."""
    return {name: tensor.detach().clone() for name, tensor in state.items()}


@torch.no_grad()
def copy_state_(target: Mapping[str, Tensor], source: Mapping[str, Tensor]) -> None:
    """Copies ``source`` into the tensors of ``target`` in place (e.g. a module's live parameters).

    Raises:
        KeyError: If ``source`` lacks a key of ``target``; a partial load would silently mix two models.
    """
    missing = [name for name in target if name not in source]
    if missing:
        raise KeyError(f"The state to load lacks {len(missing)} entries of the model, e.g. {missing[:3]}.")
    for name, tensor in target.items():
        tensor.copy_(source[name])


def state_nbytes(state: Mapping[str, Tensor]) -> int:
    """Bytes needed to send every tensor of ``state``."""
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())


def all_finite(state: Mapping[str, Tensor]) -> bool:
    """Whether every floating-point tensor of ``state`` is free of NaN and Inf.

    As :func:`finite_rows`: a tensor whose sum is finite is finite (NaN and Inf propagate through a sum), and one sum
    reads the tensor once where ``torch.isfinite`` also writes a mask of its size; only when a sum is not finite
    (a diverged update, or finite values that overflow) are the tensors checked element by element. One host sync
    at the end keeps it cheap on GPUs.
    """
    tensors = [t.detach() for t in state.values() if t.is_floating_point() or t.is_complex()]
    if not tensors:
        return True
    if bool(torch.stack([t.sum().isfinite() for t in tensors]).all()):
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def finite_rows(tensors: Iterable[Tensor], rows: int) -> list[bool]:
    """Whether row ``i`` (index ``i`` along dimension 0) of every tensor is free of NaN and Inf, for each ``i``.

    For stacked states (one client per row). A row whose sum is finite is finite: NaN and Inf propagate through a
    sum, and overflow cannot make it finite again. One sum per row reads each tensor once, where ``torch.isfinite``
    writes a mask of its whole size; only rows whose sum is not finite (diverged, or finite values that overflow)
    are checked element by element.

    Args:
        tensors: Floating-point or complex tensors ``[rows, ...]``.
        rows: The number of rows (the answer's length when ``tensors`` is empty).
    """
    tensors = list(tensors)
    if not tensors:
        return [True] * rows
    flat = [t.detach().reshape(rows, -1) for t in tensors]
    finite = torch.stack([t.sum(1).isfinite() for t in flat]).all(0)
    suspects = (~finite).nonzero().flatten()
    if suspects.numel():
        exact = torch.stack([torch.isfinite(t.index_select(0, suspects)).all(1) for t in flat]).all(0)
        finite[suspects] = exact
    return finite.tolist()


def is_float_entry(tensor: Tensor) -> bool:
    """Float tensors are averaged; integer ones (``num_batches_tracked``) are copied, never averaged."""
    return tensor.is_floating_point() or tensor.is_complex()


def weighted_average(states: Iterable[Mapping[str, Tensor]], weights: Iterable[float]) -> StateDict:
    """Reference formula Σ_k p_k w_k / Σ_k p_k over float entries; integer entries come from the last state.

    This is the non-streaming definition that aggregators are tested against.
    """
    states, weights = list(states), [float(w) for w in weights]
    if not states or len(states) != len(weights):
        raise ValueError("`states` and `weights` must be non-empty and of the same length.")
    total = sum(weights)
    result: StateDict = {}
    for name, last in states[-1].items():
        if is_float_entry(last):
            acc = torch.stack([w * s[name].double() for s, w in zip(states, weights)]).sum(0)
            result[name] = (acc / total).to(last.dtype)
        else:
            result[name] = last.clone()
    return result
