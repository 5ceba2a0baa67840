"""One client's local training on the shared LightningModule: a lean step that keeps Lightning's semantics."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lightning.pytorch import Callback, LightningModule
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from lightning_fed.callbacks.base import overridden_hooks
from lightning_fed.client import ClientContext
from lightning_fed.distributed import rank_local_metrics
from lightning_fed.log_buffer import LogBuffer, batch_size_of, buffered_logging

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer

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


def loss_of(output: Any) -> Tensor | None:
    """The loss in what ``training_step`` returned: the tensor itself, the ``"loss"`` entry of a mapping, or ``None``
    (Lightning's way of skipping a step)."""
    return output["loss"] if isinstance(output, Mapping) else output


def training_loss(trainer: FederatedTrainer, module: LightningModule, batch: Any, batch_idx: int) -> tuple[Tensor | None, Any]:
    """Runs ``module.training_step`` under the precision plugin's autocast context, as Lightning does.

    Every pass that trains or measures the user's loss goes through here, so mixed precision behaves the same in
    local training, the warm-up, side passes and loss probes.

    Returns:
        The loss (``None`` when the step is skipped) and ``training_step``'s full output (for
        ``on_train_batch_end``).
    """
    with trainer.strategy.precision_plugin.train_step_context():
        output = module.training_step(batch, batch_idx)
    return loss_of(output), output


def clip_and_step(trainer: FederatedTrainer, module: LightningModule, optimizer: Optimizer, scaler: Any) -> None:
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


def _overrides(obj: object, base: type, hook: str) -> bool:
    return getattr(type(obj), hook, None) is not getattr(base, hook, None)


class LocalTrainer:
    """Runs local training for one client at a time on the module that the trainer holds.

    Per step it does what Lightning's automatic optimisation does (``training_step`` under the precision plugin's
    autocast context, backward, optional gradient clipping, optimizer step, zero-grad) and calls Lightning's batch
    hooks, but only on callbacks and modules that override them, and with ``self.log`` buffered by
    :class:`~lightning_fed.log_buffer.LogBuffer`. Federated hooks run in between: ``client_loss`` terms are added
    to the loss before backward, and ``on_client_before_optimizer_step`` sees unscaled gradients before clipping.

    Args:
        trainer: The federated trainer (its strategy gives device and precision).
        module: The user's LightningModule.
        count_step: Called once per optimizer step, to advance ``trainer.global_step`` (``count_step(n)`` advances
            it by n: the steps other ranks took).
    """

    def __init__(self, trainer: FederatedTrainer, module: LightningModule, count_step: Callable[..., None]) -> None:
        self.trainer = trainer
        self.module = module
        self.count_step = count_step
        callbacks: list[Callback] = list(trainer.callbacks)
        self._callback_hooks = {h: [cb for cb in callbacks if _overrides(cb, Callback, h)] for h in _BATCH_HOOKS}
        callbacks = [*callbacks, trainer.aggregator]
        self._module_hooks = {h: _overrides(module, LightningModule, h) for h in _BATCH_HOOKS}
        self._loss_terms = [cb for cb in callbacks if overridden_hooks(cb, "client_loss")]
        self._grad_hooks = [cb for cb in callbacks if overridden_hooks(cb, "on_client_before_optimizer_step")]
        device = trainer.strategy.root_device
        self._needs_transfer = device.type != "cpu" or any(_overrides(module, LightningModule, h) for h in _TRANSFER_HOOKS)
        self.buffer = LogBuffer()
        self._federated = True

    def fit_client(
        self,
        ctx: ClientContext,
        dataloader: DataLoader,
        optimizer: Optimizer,
        local_epochs: int | None,
        local_steps: int | None,
        federated: bool = True,
    ) -> dict[str, float]:
        """Trains the module in place for ``local_epochs`` passes or ``local_steps`` optimizer steps.

        ``federated=False`` is plain local training, as fine-tuning needs: no ``client_loss`` term and no
        ``on_client_before_optimizer_step`` hook runs, and the steps do not advance ``global_step`` (the rounds'
        logging axis). Lightning's batch hooks still run.

        Returns:
            Means of the values the module (and penalties) logged, e.g. ``{"train_loss": 0.41}``.
        """
        module = self.module
        module.train()
        optimizer.zero_grad(set_to_none=True)
        accumulate = max(1, int(self.trainer.accumulate_grad_batches))
        self._federated = federated
        try:
            with buffered_logging(module, self.buffer):
                for batch_idx, batch, boundary in self._batches(dataloader, local_epochs, local_steps, accumulate):
                    if self._step(ctx, batch, batch_idx, optimizer, accumulate, boundary) == -1:
                        break
        finally:
            self._federated = True
        with rank_local_metrics(module):
            return self.buffer.compute()

    def _batches(
        self, dataloader: DataLoader, local_epochs: int | None, local_steps: int | None, accumulate: int
    ) -> Iterator[tuple[int, Any, bool]]:
        """Yields (batch_idx, batch, is_optimizer_step) for E epochs or until K optimizer steps are taken."""
        num_batches = len(dataloader)
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

    def _step(
        self, ctx: ClientContext, batch: Any, batch_idx: int, optimizer: Optimizer, accumulate: int, boundary: bool
    ) -> int | None:
        trainer, module = self.trainer, self.module
        if self._needs_transfer:
            batch = trainer.strategy.batch_to_device(batch)
        self.buffer.current_batch_size = batch_size_of(batch)
        if -1 in self._call("on_train_batch_start", batch, batch_idx):
            return -1
        precision = trainer.strategy.precision_plugin
        with precision.train_step_context():
            output = module.training_step(batch, batch_idx)
        loss = output["loss"] if isinstance(output, Mapping) else output
        if loss is None:
            # Lightning's contract: returning None skips the step.
            return None
        for callback in self._loss_terms if self._federated else ():
            term = callback.client_loss(trainer, module, ctx, batch, batch_idx)
            if term is not None:
                loss = loss + term
        if accumulate > 1:
            loss = loss / accumulate
        self._backward(loss, precision)
        if boundary:
            self._optimizer_step(ctx, optimizer, precision)
        self._call("on_train_batch_end", output, batch, batch_idx)
        return None

    def _backward(self, loss: Tensor, precision: Any) -> None:
        self._call("on_before_backward", loss)
        scaler = getattr(precision, "scaler", None)
        self.module.backward(scaler.scale(loss) if scaler is not None else loss)
        self._call("on_after_backward")

    def _optimizer_step(self, ctx: ClientContext, optimizer: Optimizer, precision: Any) -> None:
        trainer, module = self.trainer, self.module
        scaler = getattr(precision, "scaler", None)
        if scaler is not None:
            scaler.unscale_(optimizer)
        for callback in self._grad_hooks if self._federated else ():
            callback.on_client_before_optimizer_step(trainer, module, ctx, optimizer)
        self._call("on_before_optimizer_step", optimizer)
        clip_and_step(trainer, module, optimizer, scaler)
        self._call("on_before_zero_grad", optimizer)
        optimizer.zero_grad(set_to_none=True)
        ctx.num_steps += 1
        if self._federated:
            self.count_step()

    def _call(self, hook: str, *args: Any) -> list[Any]:
        results: Iterable[Any] = [
            getattr(callback, hook)(self.trainer, self.module, *args) for callback in self._callback_hooks[hook]
        ]
        results = list(results)
        if self._module_hooks[hook]:
            results.append(getattr(self.module, hook)(*args))
        return results
