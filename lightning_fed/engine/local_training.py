"""Every pass that trains the shared LightningModule: one step and one batch loop, keeping Lightning's semantics.

A client's local training, fine-tuning, the warm-up on shared data and the weight-divergence SGD twin all run
through :class:`LocalTrainer`; side passes that only need a step's gradient (APFL's gradient at the personalised
model) use :func:`step_gradient`. So precision (autocast and the AMP grad scaler), gradient accumulation and
gradient clipping behave the same everywhere.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from torchmetrics import Metric

from lightning_fed.context import ClientContext
from lightning_fed.engine.log_buffer import LogBuffer, batch_size_of, buffered_logging
from lightning_fed.hooks import FedCallback, GroupStep
from lightning_fed.parallel.distributed import rank_local_metrics

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
# The per-step hooks take one GroupStep, for a client alone as for a batched group.
STEP_HOOKS = ("on_client_before_optimizer_step", "on_client_after_optimizer_step")
# Hook names that no longer exist, with the hook that replaced them: an override would silently never run.
_REMOVED_STEP_HOOKS = {
    "on_group_before_optimizer_step": "on_client_before_optimizer_step",
    "on_group_after_optimizer_step": "on_client_after_optimizer_step",
}


def loss_of(output: Any) -> Tensor | None:
    """The loss in what ``training_step`` returned: the tensor itself, the ``"loss"`` entry of a mapping, or ``None``
    (Lightning's way of skipping a step)."""
    return output["loss"] if isinstance(output, Mapping) else output


def training_loss(
    trainer: FederatedTrainer, module: LightningModule, batch: Any, batch_idx: int
) -> tuple[Tensor | None, Any]:
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


def accumulation_of(trainer: FederatedTrainer) -> int:
    """How many batches one optimizer step averages over (the trainer's ``accumulate_grad_batches``, at least 1)."""
    return max(1, int(trainer.accumulate_grad_batches))


def _share_of_step(loss: Tensor, accumulate: int) -> Tensor:
    """A batch's loss as its share of an accumulated step's mean, as Lightning's automatic optimisation scales it.

    Dividing by 1 would leave the bits unchanged, but skipping it saves a kernel on every unaccumulated step.
    """
    return loss / accumulate if accumulate > 1 else loss


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


def step_gradient(
    trainer: FederatedTrainer, module: LightningModule, batches: Sequence[tuple[Any, int]], params: Mapping[str, Tensor]
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


def check_step_hooks(callbacks: Iterable[Any]) -> None:
    """Refuses callbacks written against the per-step hooks before they took one :class:`GroupStep`.

    Such a callback would otherwise train without its hook (an ``on_group_*`` override is never called) or fail
    at its first step with a bare missing-argument error.

    Raises:
        TypeError: Naming the callback, the hook and the signature to write instead.
    """
    for callback in callbacks:
        name = type(callback).__name__
        for removed, hook in _REMOVED_STEP_HOOKS.items():
            if callable(getattr(callback, removed, None)):
                raise TypeError(
                    f"{name} overrides `{removed}`, which no longer exists: write the step once as"
                    f" `{hook}(self, trainer, pl_module, step: GroupStep)`, where `step.params` / `step.grads` are"
                    " stacked over the clients taking the step (a client training alone is a group of one)."
                )
        if not isinstance(callback, FedCallback):
            continue
        for hook in STEP_HOOKS:
            if is_overridden(hook, callback, FedCallback) and _required_positional(getattr(callback, hook)) > 3:
                raise TypeError(
                    f"{name}.{hook} takes (trainer, pl_module, client_ctx, optimizer), the signature it had before"
                    f" the per-step hooks were unified: write it as `{hook}(self, trainer, pl_module, step:"
                    " GroupStep)`; the context is `step.contexts[i]`, the optimizer `step.optimizer`."
                )


def _required_positional(method: Callable[..., Any]) -> int:
    """How many positional arguments a bound method needs (a ``*args`` catch-all accepts any number: 0)."""
    parameters = inspect.signature(method).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional and p.default is inspect.Parameter.empty)


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


class LocalTrainer:
    """Trains the module that the trainer holds, in place: one client at a time, or centrally beside the federation.

    Per step it does what Lightning's automatic optimisation does (``training_step`` under the precision plugin's
    autocast context, the loss divided over ``accumulate_grad_batches``, backward through the AMP grad scaler when
    there is one, unscaling, optional gradient clipping, optimizer step, zero-grad) and calls Lightning's batch
    hooks, but only on callbacks and modules that override them (Lightning's ``is_overridden``), and with
    ``self.log`` buffered by :class:`~lightning_fed.engine.log_buffer.LogBuffer`. Federated hooks run in between:
    ``client_loss`` terms are added to the loss before backward, and ``on_client_before_optimizer_step`` sees
    unscaled gradients before clipping. The per-step hooks see the client as a group of one
    (:meth:`GroupStep.for_client <lightning_fed.hooks.GroupStep.for_client>`), built only when some callback
    overrides one of them.

    Args:
        trainer: The federated trainer (its strategy gives device and precision; its ``accumulate_grad_batches``,
            ``gradient_clip_val`` and ``gradient_clip_algorithm`` apply to every step).
        module: The user's LightningModule.
        count_step: Called once per federated optimizer step, to advance ``trainer.global_step``
            (``count_step(n)`` advances it by n: the steps other ranks took). ``None`` counts nothing.
        hooks: Whether callbacks' and the module's hooks run (Lightning's batch hooks, and in
            :meth:`fit_client` the federated ones). ``False`` for training beside the federation, such as the
            warm-up on shared data or the SGD twin, which no callback should mistake for a client's steps.

    Raises:
        TypeError: If a callback overrides a per-step hook with its old signature (:func:`check_step_hooks`).
    """

    def __init__(
        self,
        trainer: FederatedTrainer,
        module: LightningModule,
        count_step: Callable[..., None] | None = None,
        hooks: bool = True,
    ) -> None:
        self.trainer = trainer
        self.module = module
        self.count_step = count_step
        callbacks: list[Callback] = list(trainer.callbacks) if hooks else []
        check_step_hooks(callbacks)
        self._callback_hooks = {h: [cb for cb in callbacks if is_overridden(h, cb, Callback)] for h in _BATCH_HOOKS}
        self._module_hooks = {h: hooks and is_overridden(h, module, LightningModule) for h in _BATCH_HOOKS}
        # Federated hooks go to callbacks only: the aggregator speaks through probe_client and round_metrics.
        federated: list[Any] = callbacks
        self._loss_terms = [cb for cb in federated if is_overridden("client_loss", cb, FedCallback)]
        self._grad_hooks = [cb for cb in federated if is_overridden("on_client_before_optimizer_step", cb, FedCallback)]
        self._step_hooks = [cb for cb in federated if is_overridden("on_client_after_optimizer_step", cb, FedCallback)]
        device = trainer.strategy.root_device
        transfer_hooks = any(is_overridden(h, module, LightningModule) for h in _TRANSFER_HOOKS)
        self._needs_transfer = device.type != "cpu" or transfer_hooks
        self.buffer = LogBuffer()
        self._scaler: Any = None
        self._federated = True
        # The client seen as a group of one, while it trains with per-step hooks to call (else None).
        self._client_step: GroupStep | None = None

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
        logging axis). Lightning's batch hooks still run. Either way ``ctx.num_steps`` counts the optimizer steps.

        Returns:
            Means of the values the module (and penalties) logged, e.g. ``{"train_loss": 0.41}``.
        """
        return self._fit(ctx, dataloader, optimizer, local_epochs, local_steps, federated)

    def fit(
        self, dataloader: DataLoader, optimizer: Optimizer, epochs: int | None = None, steps: int | None = None
    ) -> dict[str, float]:
        """Trains the module in place centrally: no client, so no federated hook, and ``global_step`` stays.

        The steps are a client's steps (precision, accumulation, clipping), for ``epochs`` passes over
        ``dataloader`` or ``steps`` optimizer steps, whichever ends first (one pass when neither is given).

        Returns:
            Means of the values the module logged.
        """
        if epochs is None and steps is None:
            epochs = 1
        return self._fit(None, dataloader, optimizer, epochs, steps, federated=False)

    def _fit(
        self,
        ctx: ClientContext | None,
        dataloader: DataLoader,
        optimizer: Optimizer,
        epochs: int | None,
        steps: int | None,
        federated: bool,
    ) -> dict[str, float]:
        module = self.module
        module.train()
        optimizer.zero_grad(set_to_none=True)
        accumulate = accumulation_of(self.trainer)
        self._federated = federated
        # Looked up once per client: the strategy's precision plugin does not change within a fit.
        self._scaler = getattr(self.trainer.strategy.precision_plugin, "scaler", None)
        # Built once per client and only for per-step hooks: FedAvg's steps pay nothing for the view.
        if federated and ctx is not None and (self._grad_hooks or self._step_hooks):
            self._client_step = GroupStep.for_client(module, ctx, optimizer)
        try:
            with buffered_logging(module, self.buffer):
                for batch_idx, batch, boundary in client_batches(dataloader, epochs, steps, accumulate):
                    if self._step(ctx, batch, batch_idx, optimizer, accumulate, boundary) == -1:
                        break
        finally:
            self._federated = True
            self._client_step = None
        with rank_local_metrics(module):
            return self.buffer.compute()

    def _step(
        self,
        ctx: ClientContext | None,
        batch: Any,
        batch_idx: int,
        optimizer: Optimizer,
        accumulate: int,
        boundary: bool,
    ) -> int | None:
        trainer, module = self.trainer, self.module
        if self._needs_transfer:
            batch = trainer.strategy.batch_to_device(batch)
        if ctx is not None and self._federated:
            for transform in ctx.batch_transforms:
                batch = transform(batch)
        self.buffer.current_batch_size = batch_size_of(batch)
        if -1 in self._call("on_train_batch_start", batch, batch_idx):
            return -1
        loss, output = training_loss(trainer, module, batch, batch_idx)
        if loss is None:
            # Lightning's contract: returning None skips the step.
            return None
        if self._federated and ctx is not None:
            for callback in self._loss_terms:
                term = callback.client_loss(trainer, module, ctx, batch, batch_idx)
                if term is not None:
                    loss = loss + term
        self._backward(_share_of_step(loss, accumulate))
        if boundary:
            self._optimizer_step(ctx, optimizer)
        self._call("on_train_batch_end", output, batch, batch_idx)
        return None

    def _backward(self, loss: Tensor) -> None:
        self._call("on_before_backward", loss)
        scaler = self._scaler
        self.module.backward(scaler.scale(loss) if scaler is not None else loss)
        self._call("on_after_backward")

    def _optimizer_step(self, ctx: ClientContext | None, optimizer: Optimizer) -> None:
        trainer, module, scaler = self.trainer, self.module, self._scaler
        if scaler is not None:
            scaler.unscale_(optimizer)
        step = self._client_step
        if step is not None:
            for callback in self._grad_hooks:
                callback.on_client_before_optimizer_step(trainer, module, step)
        self._call("on_before_optimizer_step", optimizer)
        clip_and_step(trainer, module, optimizer, scaler)
        if step is not None:
            for callback in self._step_hooks:
                callback.on_client_after_optimizer_step(trainer, module, step)
        self._call("on_before_zero_grad", optimizer)
        optimizer.zero_grad(set_to_none=True)
        if ctx is not None:
            ctx.num_steps += 1
        if self._federated and self.count_step is not None:
            self.count_step()

    def _call(self, hook: str, *args: Any) -> list[Any]:
        results: Iterable[Any] = [
            getattr(callback, hook)(self.trainer, self.module, *args) for callback in self._callback_hooks[hook]
        ]
        results = list(results)
        if self._module_hooks[hook]:
            results.append(getattr(self.module, hook)(*args))
        return results


__all__ = [
    "STEP_HOOKS",
    "LocalTrainer",
    "accumulation_of",
    "check_step_hooks",
    "client_batches",
    "clip_and_step",
    "isolated_pass",
    "loss_of",
    "step_gradient",
    "training_loss",
]
