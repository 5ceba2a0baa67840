"""One training step of the user's module, as Lightning's automatic optimisation takes it, in pieces.

:class:`~lightning_fed.engine.local_training.LocalTrainer` assembles these into every pass that trains the module;
side passes that only need a step's gradient (APFL's gradient at the personalised model) use :func:`step_gradient`,
and loss probes use :func:`training_loss`. So precision (autocast and the AMP grad scaler), gradient accumulation
and gradient clipping behave the same everywhere.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.precision import Precision as FabricPrecision
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torch import Tensor
from torch.optim import Optimizer
from torchmetrics import Metric

from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

# Lightning's per-batch hooks, called only for the objects that override them: dispatching every hook to every
# callback costs more than a small model's step.
_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
)
_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


# How many of (batch, batch_idx, dataloader_idx) each step hook takes, by its function: read once per hook, then one
# dict lookup a step (a plain dict: an lru_cache or a weak mapping costs more per call than the signature saves).
_STEP_ARITY: dict[Callable[..., Any], int] = {}


def _step_arity(function: Callable[..., Any]) -> int:
    """How many of ``(batch, batch_idx, dataloader_idx)`` a step hook takes, decided as Lightning's loops decide.

    ``batch_idx`` is passed when the hook names it, takes ``*args`` or has a second parameter under another name
    (``is_param_in_hook_signature(..., min_args=2)``). ``dataloader_idx`` is passed (as 0: every pass here reads one
    loader) only when the hook requires it; a default is left to apply, as Lightning does with one loader.
    """
    if not is_param_in_hook_signature(function, "batch_idx", min_args=2):
        return 1
    required = inspect.signature(function).parameters.get("dataloader_idx")
    return 3 if required is not None and required.default is inspect.Parameter.empty else 2


def call_step(step: Callable[..., Any], batch: Any, batch_idx: int) -> Any:
    """Calls a bound step hook (``training_step``, ``validation_step``, ``test_step``) with the arguments its
    signature takes, as Lightning does: ``def training_step(self, batch)`` gets no ``batch_idx``.

    Every step of the user's module goes through here: local training, evaluation, loss probes, batched groups.
    """
    function = getattr(step, "__func__", step)
    arity = _STEP_ARITY.get(function)
    if arity is None:
        arity = _STEP_ARITY[function] = _step_arity(function)
    if arity == 2:
        return step(batch, batch_idx)
    if arity == 1:
        return step(batch)
    return step(batch, batch_idx, 0)


def bind_step(step: Callable[..., Any]) -> Callable[[Any, int], Any]:
    """A bound step hook as a callable of ``(batch, batch_idx)`` that passes what its signature takes: the decision
    :func:`call_step` makes, made once (a client's pass calls the result at every step).

    The module's step is read when this is called: bind again when a new pass starts, as a callback may replace it.
    """
    function = getattr(step, "__func__", step)
    arity = _STEP_ARITY.get(function)
    if arity is None:
        arity = _STEP_ARITY[function] = _step_arity(function)
    if arity == 2:
        return step
    if arity == 1:
        return lambda batch, batch_idx: step(batch)
    return lambda batch, batch_idx: step(batch, batch_idx, 0)


def step_context(precision_plugin: Any) -> Callable[[], AbstractContextManager[Any]] | None:
    """The precision plugin's ``train_step_context``, or ``None`` where it is Lightning's base one around a
    ``forward_context`` that does nothing (32-bit precision): the context a training step runs in, decided once per
    pass instead of entered at every step."""
    plugin_type = type(precision_plugin)
    if (
        plugin_type.train_step_context is Precision.train_step_context
        and plugin_type.forward_context is FabricPrecision.forward_context
    ):
        return None
    return precision_plugin.train_step_context


def loss_of(output: Any) -> Tensor | None:
    """The loss in what ``training_step`` returned: the tensor itself, the ``"loss"`` entry of a mapping, or ``None``
    (Lightning's way of skipping a step)."""
    return output["loss"] if isinstance(output, Mapping) else output


def training_loss(
    trainer: FederatedTrainerView, module: LightningModule, batch: Any, batch_idx: int
) -> tuple[Tensor | None, Any]:
    """Runs ``module.training_step`` under the precision plugin's autocast context, as Lightning does.

    Every pass that trains or measures the user's loss goes through here, so mixed precision behaves the same in
    local training, the warm-up, side passes and loss probes.

    Returns:
        The loss (``None`` when the step is skipped) and ``training_step``'s full output (for
        ``on_train_batch_end``).
    """
    with trainer.strategy.precision_plugin.train_step_context():
        output = call_step(module.training_step, batch, batch_idx)
    return loss_of(output), output


def accumulation_of(trainer: FederatedTrainerView) -> int:
    """How many batches one optimizer step averages over (the trainer's ``accumulate_grad_batches``, at least 1)."""
    return max(1, int(trainer.accumulate_grad_batches))


def _share_of_step(loss: Tensor, accumulate: int) -> Tensor:
    """A batch's loss as its share of an accumulated step's mean, as Lightning's automatic optimisation scales it.

    Dividing by 1 would leave the bits unchanged, but skipping it saves a kernel on every unaccumulated step.
    """
    return loss / accumulate if accumulate > 1 else loss


def clip_and_step(trainer: FederatedTrainerView, module: LightningModule, optimizer: Optimizer, scaler: Any) -> None:
    """Clips gradients as the trainer is configured to (the module's hook decides how), then steps the optimizer,
    through the AMP grad scaler when there is one (gradients must already be unscaled)."""
    if trainer.gradient_clip_val:
        module.configure_gradient_clipping(
            optimizer,
            gradient_clip_val=trainer.gradient_clip_val,
            gradient_clip_algorithm=trainer.gradient_clip_algorithm or "norm",
        )
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


def step_gradient(
    trainer: FederatedTrainerView,
    module: LightningModule,
    batches: Sequence[tuple[Any, int]],
    params: Mapping[str, Tensor],
) -> tuple[dict[str, Tensor], Tensor | None]:
    """The gradient that one optimizer step of local training takes, at the parameters the module holds now.

    Each of the step's ``(batch, batch_idx)`` runs through :func:`training_loss` (the precision context) and counts
    as its share of the step, as :class:`LocalTrainer` scales it under gradient accumulation. The gradient is taken
    with ``torch.autograd.grad``, so the parameters' ``.grad`` (the local model's own gradient, mid-step) is left
    untouched, and no optimizer steps. Clipping is not applied: it belongs to the optimizer step, not the gradient.
    The batches must already be on the module's device (as a training step's batches are).

    Args:
        trainer: The federated trainer (precision plugin and ``accumulate_grad_batches``).
        module: The module, holding the parameters to differentiate at.
        batches: The step's batches with their indices; a batch whose ``training_step`` returns ``None`` is skipped.
        params: The leaves to differentiate, by name (live parameters of ``module``).

    Returns:
        The gradient by name (zeros where a parameter is unused) and the mean loss over the batches (``None`` when
        every batch was skipped).
    """
    accumulate = accumulation_of(trainer)
    names, leaves = list(params), list(params.values())
    grads = {name: torch.zeros_like(p) for name, p in params.items()}
    losses = []
    with torch.enable_grad():
        for batch, batch_idx in batches:
            loss, _ = training_loss(trainer, module, batch, batch_idx)
            if loss is None:
                continue
            step_grads = torch.autograd.grad(_share_of_step(loss, accumulate), leaves, allow_unused=True)
            for name, grad in zip(names, step_grads):
                if grad is not None:
                    grads[name].add_(grad.to(grads[name].dtype))
            losses.append(loss.detach().float())
    return grads, torch.stack(losses).mean() if losses else None


@contextmanager
def isolated_pass(module: LightningModule) -> Iterator[None]:
    """Runs a side pass that leaves no trace on the run: the RNG, ``self.log`` and torchmetrics states are restored.

    Inside the block the torch generators are forked (the CPU one, and the module's CUDA device's), whatever the
    module logs is discarded, and every torchmetrics metric of the module gets its state back afterwards, so the
    pass changes neither the run's random draws nor its ``train/*`` metrics.
    """
    metrics = [m for m in module.modules() if isinstance(m, Metric)]
    saved = [_metric_snapshot(m) for m in metrics]
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), buffered_logging(module, LogBuffer()):
            yield
    finally:
        for metric, snapshot in zip(metrics, saved):
            for name, value in snapshot.items():
                setattr(metric, name, value)


def _metric_snapshot(metric: Metric) -> dict[str, Any]:
    state = {name: (v.clone() if isinstance(v, Tensor) else list(v)) for name, v in metric.metric_state.items()}
    # The update count and the cached result decide what compute() returns next; they belong to the snapshot.
    for name in ("_update_count", "_computed"):
        if hasattr(metric, name):
            state[name] = getattr(metric, name)
    return state


def client_batches(
    dataloader: Iterable[Any], local_epochs: int | None, local_steps: int | None, accumulate: int
) -> Iterator[tuple[int, Any, bool]]:
    """Yields (batch_idx, batch, is_optimizer_step) for E epochs or until K optimizer steps are taken.

    An epoch's last batch always ends a step, as in Lightning, so a partial accumulation is not carried over.
    """
    num_batches = len(dataloader)  # type: ignore[arg-type]
    if num_batches == 0:
        return
    steps = 0
    epoch = 0
    while True:
        for batch_idx, batch in enumerate(dataloader):
            boundary = (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == num_batches
            yield batch_idx, batch, boundary
            steps += boundary
            if local_steps is not None and steps >= local_steps:
                return
        epoch += 1
        if local_epochs is not None and epoch >= local_epochs:
            return


__all__ = [
    "accumulation_of",
    "bind_step",
    "call_step",
    "client_batches",
    "clip_and_step",
    "isolated_pass",
    "loss_of",
    "step_context",
    "step_gradient",
    "training_loss",
]
