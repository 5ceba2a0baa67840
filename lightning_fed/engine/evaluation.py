"""Evaluation passes of the global or a personalised model, and the per-client statistics of a round."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from lightning_fed.engine.log_buffer import LogBuffer, batch_size_of, buffered_logging, reset_metrics
from lightning_fed.engine.training_step import call_step
from lightning_fed.parallel.distributed import rank_local_metrics

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


def eval_step_name(module: LightningModule) -> str | None:
    """``"test_step"`` when the module defines it, else ``"validation_step"``, else ``None``."""
    for name in ("test_step", "validation_step"):
        if is_overridden(name, module, LightningModule):
            return name
    return None


@torch.no_grad()
def evaluate(
    trainer: FederatedTrainerView, module: LightningModule, dataloader: DataLoader, buffer: LogBuffer
) -> dict[str, float]:
    """Runs the module's ``test_step`` (or ``validation_step``) over ``dataloader`` and returns the logged means.

    Losses logged per batch are averaged weighted by batch size, so they are exact dataset means; torchmetrics
    metrics logged as objects are computed over the whole pass, from this process's state only (each rank of a
    multi-process run evaluates its own clients).
    """
    step_name = eval_step_name(module)
    if step_name is None:
        return {}
    step = getattr(module, step_name)
    was_training = module.training
    module.eval()
    reset_metrics(module)
    precision = trainer.strategy.precision_plugin
    context = precision.test_step_context() if step_name == "test_step" else precision.val_step_context()
    needs_transfer = trainer.strategy.root_device.type != "cpu"
    with buffered_logging(module, buffer), context:
        for batch_idx, batch in enumerate(dataloader):
            if needs_transfer:
                batch = trainer.strategy.batch_to_device(batch)
            buffer.current_batch_size = batch_size_of(batch)
            call_step(step, batch, batch_idx)
    module.train(was_training)
    # Ranks evaluate different clients: a metric must not gather the others' state.
    with rank_local_metrics(module):
        return buffer.compute()


def client_statistics(per_client: dict[int, dict[str, float]], prefix: str = "client/") -> dict[str, float]:
    """Summaries over clients of every metric they report.

    For each key: ``mean``, ``std`` (population) and, for losses, ``max``; for other metrics (accuracies), ``min``
    and ``worst10``, the mean of the worst ceil(10 %) of clients, the fairness view the personalisation papers use.
    """
    keys = sorted({key for metrics in per_client.values() for key in metrics})
    summary: dict[str, float] = {}
    for key in keys:
        values = torch.tensor(
            [m[key] for m in per_client.values() if key in m and math.isfinite(m[key])], dtype=torch.float64
        )
        if values.numel() == 0:
            continue
        summary[f"{prefix}{key}_mean"] = float(values.mean())
        summary[f"{prefix}{key}_std"] = float(values.std(unbiased=False))
        if "loss" in key:
            summary[f"{prefix}{key}_max"] = float(values.max())
        else:
            worst = max(1, math.ceil(0.1 * values.numel()))
            summary[f"{prefix}{key}_min"] = float(values.min())
            summary[f"{prefix}{key}_worst10"] = float(values.sort().values[:worst].mean())
    return summary


def accuracy_key(metrics: dict[str, Any]) -> str | None:
    """The first metric whose name mentions accuracy, used for progress display and the final printout."""
    return next((key for key in metrics if "acc" in key.lower()), None)


def best_mean_accuracy(history: list[dict[str, float]], current: dict[str, float], prefix: str) -> float | None:
    """BMTA (Huang et al., FedAMP, AAAI 2021): the best, over rounds so far, of the mean over clients of each
    client's accuracy on its own test split.

    Args:
        history: Metrics of the earlier rounds.
        current: This round's metrics; ``None`` is returned when it holds no ``<prefix>..._mean`` accuracy.
        prefix: ``"client/"`` (the global model on each client's split) or ``"personal/"`` (each client's
            personalised model), so that the two are never mixed.
    """
    key = accuracy_key({k: v for k, v in current.items() if k.startswith(prefix) and k.endswith("_mean")})
    if key is None:
        return None
    values = [entry[key] for entry in [*history, current] if key in entry and math.isfinite(entry[key])]
    return max(values) if values else None


def add_validation_and_bmta(
    metrics: dict[str, float], callback_metrics: Mapping[str, Any], history: list[dict[str, float]]
) -> None:
    """Adds to a round's ``metrics`` the scalar validation metrics Lightning's loop logged and the BMTA so far, for
    the global model on each client (``client/bmta``) and for personalised models (``personal/bmta``)."""
    for key, value in callback_metrics.items():
        if "val" in key and isinstance(value, torch.Tensor) and value.numel() == 1:
            metrics[key] = float(value)
    for prefix in ("client/", "personal/"):
        bmta = best_mean_accuracy(history, metrics, prefix)
        if bmta is not None:
            metrics[f"{prefix}bmta"] = bmta
