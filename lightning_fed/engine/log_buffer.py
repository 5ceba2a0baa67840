"""A cheap stand-in for ``LightningModule.log`` during client training and evaluation."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

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


class LogBuffer:
    """Collects what the module logs with ``self.log``/``self.log_dict`` and reduces it to means.

    Lightning's logging machinery costs about 1 ms per step on a CPU, more than a small model's whole step. Client
    training only needs round-level means, so while a client trains the module's ``log`` is swapped for this
    buffer: tensors are accumulated (weighted by batch size, with no host sync) and ``torchmetrics`` metrics are
    computed and reset once at the end, as Lightning does at epoch end.
    """

    def __init__(self) -> None:
        self._sums: dict[str, Tensor | float] = {}
        self._weights: dict[str, float] = {}
        self._metrics: dict[str, Metric] = {}
        self.current_batch_size = 1

    def log(self, name: str, value: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> None:
        if isinstance(value, Metric):
            self._metrics[name] = value
            return
        weight = float(batch_size if batch_size is not None else self.current_batch_size)
        if isinstance(value, Tensor):
            value = value.detach().float().mean() * weight
        else:
            value = float(value) * weight
        self._sums[name] = self._sums[name] + value if name in self._sums else value
        self._weights[name] = self._weights.get(name, 0.0) + weight

    def log_dict(self, dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, *args, **kwargs)

    def compute(self) -> dict[str, float]:
        """Means of everything logged so far, then empties the buffer (metrics are reset)."""
        result = {name: float(total) / self._weights[name] for name, total in self._sums.items()}
        for name, metric in self._metrics.items():
            value = metric.compute()
            result[name] = float(value) if isinstance(value, Tensor) and value.numel() == 1 else float("nan")
            metric.reset()
        self._sums, self._weights, self._metrics = {}, {}, {}
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
