"""A cheap stand-in for ``LightningModule.log`` during client training and evaluation."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from torchmetrics import Metric


def batch_size_of(batch: Any) -> int:
    """Size of the first tensor found in ``batch`` (1 if there is none)."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = batch_size_of(item)
            if size:
                return size
    return 1


_SIZED = object()
"""The buffer's batch when its size is known (no batch waits to be measured)."""


class LogBuffer:
    """Collects what the module logs with ``self.log``/``self.log_dict`` and reduces it to means.

    Lightning's logging machinery costs about 1 ms per step on a CPU, more than a small model's whole step. Client
    training only needs round-level means, so while a client trains the module's ``log`` is swapped for this
    buffer: values are accumulated weighted by batch size with no host sync, and ``torchmetrics`` metrics are
    computed and reset once at the end, as Lightning does at epoch end.

    A tensor computed by the step's autograd graph (the loss: it has a ``grad_fn``) is a new tensor at every step
    and nothing changes it afterwards, so it is kept as it is and reduced with the pass's other values in
    :meth:`compute` (float64 sums): logging it launches no kernel. Any other tensor (a buffer the module might
    update in place) is reduced when it is logged.

    The batch size that weighs a value logged without ``batch_size=`` is measured from the step's batch
    (:meth:`start_batch`) only when such a value is logged.
    """

    def __init__(self) -> None:
        self._sums: dict[str, Tensor | float] = {}
        self._weights: dict[str, float] = {}
        self._kept: dict[str, list[Tensor]] = {}
        self._kept_weights: dict[str, list[float]] = {}
        self._metrics: dict[str, Metric] = {}
        self._size = 1
        self._batch: Any = _SIZED

    @property
    def current_batch_size(self) -> int:
        """The size of the current step's batch (1 when there is no tensor in it)."""
        if self._batch is not _SIZED:
            self._size, self._batch = batch_size_of(self._batch), _SIZED
        return self._size

    @current_batch_size.setter
    def current_batch_size(self, size: int) -> None:
        self._size, self._batch = size, _SIZED

    def start_batch(self, batch: Any) -> None:
        """The step's batch, whose size weighs the values logged without ``batch_size=`` (measured when needed)."""
        self._batch = batch

    def log(self, name: str, value: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> None:
        if isinstance(value, Metric):
            self._metrics[name] = value
            return
        weight = float(batch_size if batch_size is not None else self.current_batch_size)
        self._weights[name] = self._weights.get(name, 0.0) + weight
        if isinstance(value, Tensor):
            if value.grad_fn is not None:
                if name not in self._kept:
                    self._kept[name], self._kept_weights[name] = [], []
                self._kept[name].append(value.detach())
                self._kept_weights[name].append(weight)
                return
            value = value.detach().float().mean() * weight
        else:
            value = float(value) * weight
        self._sums[name] = self._sums[name] + value if name in self._sums else value

    def log_dict(self, dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, *args, **kwargs)

    def compute(self) -> dict[str, float]:
        """Means of everything logged so far, then empties the buffer (metrics are reset)."""
        totals = {name: float(total) for name, total in self._sums.items()}
        for name, values in self._kept.items():
            # One stack for a pass's losses (0-dim, one dtype); other shapes are reduced one by one first.
            dtype = values[0].dtype
            if not all(v.dim() == 0 and v.dtype == dtype for v in values):
                values = [v.double().mean() for v in values]
            means = torch.stack(values).double()
            weights = torch.tensor(self._kept_weights[name], dtype=torch.float64, device=means.device)
            totals[name] = totals.get(name, 0.0) + float(means @ weights)
        result = {name: total / self._weights[name] for name, total in totals.items()}
        for name, metric in self._metrics.items():
            value = metric.compute()
            result[name] = float(value) if isinstance(value, Tensor) and value.numel() == 1 else float("nan")
            metric.reset()
        self._sums, self._weights, self._metrics = {}, {}, {}
        self._kept, self._kept_weights = {}, {}
        return result


def reset_metrics(module: LightningModule) -> None:
    """Resets every torchmetrics metric of the module, so a pass starts from empty state."""
    for child in module.modules():
        if isinstance(child, Metric):
            child.reset()


@contextmanager
def buffered_logging(module: LightningModule, buffer: LogBuffer) -> Iterator[LogBuffer]:
    """Routes ``module.log`` and ``module.log_dict`` into ``buffer`` for the duration of the block.

    Blocks nest: leaving one restores whatever routing was there before (e.g. a Fisher pass inside a client's
    training), and leaving the outermost restores Lightning's own ``log``.
    """
    with routed_logging(module, buffer.log, buffer.log_dict):
        yield buffer


@contextmanager
def routed_logging(module: LightningModule, log: Callable[..., None], log_dict: Callable[..., None]) -> Iterator[None]:
    """Replaces ``module.log`` and ``module.log_dict`` for the block (instance attributes, so Lightning's methods
    are untouched), and restores whatever was there before on the way out."""
    previous = {name: module.__dict__.get(name) for name in ("log", "log_dict")}
    module.__dict__["log"] = log
    module.__dict__["log_dict"] = log_dict
    try:
        yield
    finally:
        for name, method in previous.items():
            if method is None:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = method


__all__ = ["LogBuffer", "batch_size_of", "buffered_logging", "reset_metrics", "routed_logging"]
