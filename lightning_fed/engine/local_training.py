"""Every pass that trains the shared LightningModule, keeping Lightning's semantics: a client's local training,
fine-tuning, the warm-up on shared data and the weight-divergence SGD twin all run through :class:`LocalTrainer`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from lightning.pytorch import LightningModule
from lightning.pytorch.core.optimizer import LightningOptimizer, do_nothing_closure
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from lightning_fed.checks import check_choice
from lightning_fed.context import ClientContext
from lightning_fed.engine.dispatch import HookDispatcher, check_step_hooks
from lightning_fed.engine.log_buffer import LogBuffer, buffered_logging
from lightning_fed.engine.schedulers import RoundSchedulers
from lightning_fed.engine.step_counter import StepCounter, record_step_sizes
from lightning_fed.engine.training_step import (
    _BATCH_HOOKS,
    _TRANSFER_HOOKS,
    _share_of_step,
    accumulation_of,
    bind_step,
    call_step,
    client_batches,
    clip_and_step,
    loss_of,
    step_context,
)
from lightning_fed.hooks import GroupStep
from lightning_fed.parallel.distributed import rank_local_metrics

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

TrainingMode = Literal["client", "plain", "central"]
TRAINING_MODES: tuple[TrainingMode, ...] = ("client", "plain", "central")


class LocalTrainer:
    """Trains the module that the trainer holds, in place: one client at a time, or centrally beside the federation.

    Per step it does what Lightning's automatic optimisation does (``training_step`` under the precision plugin's
    autocast context, the loss divided over ``accumulate_grad_batches``, backward through the AMP grad scaler when
    there is one, unscaling, optional gradient clipping, optimizer step, zero-grad) and calls Lightning's batch
    hooks, but only on callbacks and modules that override them (Lightning's ``is_overridden``), and with
    ``self.log`` buffered by :class:`~lightning_fed.engine.log_buffer.LogBuffer`. Federated hooks run in between:
    ``client_loss`` terms are added to the loss before backward, and ``on_client_before_optimizer_step`` sees
    unscaled gradients before clipping.

    The mode says what the pass is, once, when the trainer is built:

    * ``"client"``: a client's local training in a round. Every hook runs (Lightning's batch hooks, the federated
      ``client_loss`` and per-step hooks), the client's ``batch_transforms`` apply, and every optimizer step is
      counted (``global_step``, the round's steps).
    * ``"plain"``: plain local training of a client outside the round (fine-tuning, ``trainer.train_locally``).
      Lightning's batch hooks run; no federated hook, no batch transform, and the steps are not counted.
    * ``"central"``: training beside the federation on data that belongs to no client (the warm-up on shared data,
      the SGD twin). No hook runs at all, so no callback mistakes it for a client's steps.

    In every mode ``ctx.num_steps`` counts the optimizer steps of a pass that has a client. The per-step hooks see
    the client as a group of one (:meth:`GroupStep.for_client <lightning_fed.hooks.GroupStep.for_client>`), built
    only when some callback overrides one of them.

    Args:
        trainer: The federated trainer (its strategy gives device and precision; its ``accumulate_grad_batches``,
            ``gradient_clip_val`` and ``gradient_clip_algorithm`` apply to every step).
        module: The user's LightningModule.
        mode: ``"client"``, ``"plain"`` or ``"central"`` (above).
        steps: Counts the optimizer steps of ``"client"`` passes; ``None`` counts nothing.
        schedulers: Steps the step-interval LR schedulers after a client's optimizer steps (``"client"`` mode).

    Under manual optimisation (``automatic_optimization = False``) the module's ``training_step`` steps its own
    optimizers (``self.optimizers()``, ``manual_backward``, ``toggle_optimizer``), as in Lightning: no loss is taken
    from it, nothing is clipped or accumulated here, and every optimizer step it takes counts (``ctx.num_steps``,
    ``global_step``, as Lightning's ``global_step`` counts them). ``epochs``/``steps`` then count batches, and the
    module's optimizers other than the one passed to :meth:`fit` start with fresh state.

    Raises:
        TypeError: If a callback overrides a per-step hook with its old signature (:func:`check_step_hooks`).
    """

    def __init__(
        self,
        trainer: FederatedTrainerView,
        module: LightningModule,
        mode: TrainingMode = "client",
        steps: StepCounter | None = None,
        schedulers: RoundSchedulers | None = None,
    ) -> None:
        self.trainer = trainer
        self.module = module
        self.mode = check_choice("mode", mode, TRAINING_MODES)
        self._federated = mode == "client"
        self.steps = steps if self._federated else None
        self.schedulers = schedulers if self._federated else None
        self.hooks = HookDispatcher(
            trainer, module, callbacks=[] if mode == "central" else None, module_hooks=mode != "central"
        )
        device = trainer.strategy.root_device
        transfer_hooks = any(is_overridden(h, module, LightningModule) for h in _TRANSFER_HOOKS)
        self._needs_transfer = device.type != "cpu" or transfer_hooks
        self.buffer = LogBuffer()
        self._scaler: Any = None
        # Federated hooks go to callbacks only: the aggregator speaks through probe_client and round_metrics.
        self._loss_terms = self.hooks.overriding("client_loss") if self._federated else []
        self._grad_hooks = self.hooks.overriding("on_client_before_optimizer_step") if self._federated else []
        self._step_hooks = self.hooks.overriding("on_client_after_optimizer_step") if self._federated else []
        if self._federated:
            check_step_hooks(self.hooks.callbacks)
        # Lightning's batch hooks that some callback (or the module) overrides: the callbacks and the module are
        # fixed for this trainer's life, so a step calls no dispatcher for a hook nobody overrides.
        self._batch_hooks = frozenset(hook for hook in _BATCH_HOOKS if any(self.hooks.lightning_targets(hook)))
        # The client seen as a group of one, while it trains with per-step hooks to call (else None).
        self._client_step: GroupStep | None = None
        # Decided once per pass (fit), used at every step: the module's training_step called by its signature,
        # the precision context it runs in (None: none needed), and whether a step-interval schedule steps.
        self._training_step: Any = None
        self._step_context: Any = None
        self._schedules = False

    def fit(
        self,
        dataloader: DataLoader,
        optimizer: Optimizer,
        epochs: int | None = None,
        steps: int | None = None,
        ctx: ClientContext | None = None,
    ) -> dict[str, float]:
        """Trains the module in place for ``epochs`` passes over ``dataloader`` or ``steps`` optimizer steps,
        whichever ends first (one pass when neither is given).

        Args:
            dataloader: The batches.
            optimizer: The optimizer to step (its state as the caller prepared it).
            epochs: Passes over the data.
            steps: Optimizer steps.
            ctx: The client that trains (required in ``"client"`` mode; ``ctx.num_steps`` counts its steps).

        Returns:
            Means of the values the module (and penalties) logged, e.g. ``{"train_loss": 0.41}``.
        """
        if self._federated and ctx is None:
            raise ValueError("LocalTrainer(mode='client') trains a client: pass its ClientContext as `ctx`.")
        if epochs is None and steps is None:
            epochs = 1
        module = self.module
        module.train()
        optimizer.zero_grad(set_to_none=True)
        if not module.automatic_optimization:
            return self._fit_manual(dataloader, optimizer, epochs, steps, ctx)
        accumulate = accumulation_of(self.trainer)
        # Looked up once per pass: the strategy's precision plugin does not change within a fit.
        precision_plugin = self.trainer.strategy.precision_plugin
        self._scaler = getattr(precision_plugin, "scaler", None)
        self._step_context = step_context(precision_plugin)
        self._training_step = bind_step(module.training_step)
        self._schedules = self.schedulers is not None and self.schedulers.steps_within_clients
        # Built once per client and only for per-step hooks: FedAvg's steps pay nothing for the view.
        if ctx is not None and (self._grad_hooks or self._step_hooks):
            self._client_step = GroupStep.for_client(module, ctx, optimizer)
        try:
            with buffered_logging(module, self.buffer):
                for batch_idx, batch, boundary in client_batches(dataloader, epochs, steps, accumulate):
                    if self._step(ctx, batch, batch_idx, optimizer, accumulate, boundary) == -1:
                        break
        finally:
            self._client_step = None
        with rank_local_metrics(module):
            return self.buffer.compute()

    def _fit_manual(
        self,
        dataloader: DataLoader,
        optimizer: Optimizer,
        epochs: int | None,
        steps: int | None,
        ctx: ClientContext | None,
    ) -> dict[str, float]:
        """The module steps its own optimizers; each step it takes is counted through Lightning's optimizer wrapper
        (the hook Lightning's manual-optimisation loop uses)."""
        module = self.module
        if self.mode == "central":
            raise ValueError(
                f"{type(module).__name__} uses manual optimisation: a central pass with an optimizer of its own"
                " (the shared-data warm-up, the SGD twin) cannot make the module step it."
            )
        wrapped = module.optimizers()
        optimizers: list[LightningOptimizer] = wrapped if isinstance(wrapped, list) else [wrapped]
        for wrapper in optimizers:
            if wrapper.optimizer is not optimizer:
                wrapper.optimizer.state.clear()
            wrapper.optimizer.zero_grad(set_to_none=True)
            wrapper._on_after_step = lambda: self._count_step(ctx)
        try:
            with buffered_logging(module, self.buffer):
                for batch_idx, batch, _ in client_batches(dataloader, epochs, steps, 1):
                    if self._manual_step(ctx, batch, batch_idx) == -1:
                        break
        finally:
            for wrapper in optimizers:
                wrapper._on_after_step = do_nothing_closure
        with rank_local_metrics(module):
            return self.buffer.compute()

    def _manual_step(self, ctx: ClientContext | None, batch: Any, batch_idx: int) -> int | None:
        trainer, module = self.trainer, self.module
        batch = self._prepare(ctx, batch)
        if -1 in self._call("on_train_batch_start", batch, batch_idx):
            return -1
        with trainer.strategy.precision_plugin.train_step_context():
            # By its signature, as every other step: Lightning's GAN example takes no batch_idx.
            output = call_step(module.training_step, batch, batch_idx)
        self._call("on_train_batch_end", output, batch, batch_idx)
        return None

    def _prepare(self, ctx: ClientContext | None, batch: Any) -> Any:
        if self._needs_transfer:
            batch = self.trainer.strategy.batch_to_device(batch)
        if self._federated:
            assert ctx is not None
            for transform in ctx.batch_transforms:
                batch = transform(batch)
        # Its size weighs what the step logs without `batch_size=`: measured only if something is.
        self.buffer.start_batch(batch)
        return batch

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
        batch = self._prepare(ctx, batch)
        if -1 in self._call("on_train_batch_start", batch, batch_idx):
            return -1
        context = self._step_context
        if context is None:
            output = self._training_step(batch, batch_idx)
        else:
            with context():
                output = self._training_step(batch, batch_idx)
        loss = loss_of(output)
        if loss is None:
            # Lightning's contract: returning None skips the step.
            return None
        if self._federated:
            assert ctx is not None
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
        if ctx is not None:
            # The learning rates this step uses: a step-interval scheduler changes them after it.
            record_step_sizes(ctx, [group["lr"] for group in optimizer.param_groups])
        clip_and_step(trainer, module, optimizer, scaler)
        if step is not None:
            for callback in self._step_hooks:
                callback.on_client_after_optimizer_step(trainer, module, step)
        self._call("on_before_zero_grad", optimizer)
        optimizer.zero_grad(set_to_none=True)
        self._count_step(ctx)

    def _count_step(self, ctx: ClientContext | None) -> None:
        if ctx is not None:
            ctx.num_steps += 1
        if self._federated and self.steps is not None:
            self.steps.add()
        if self._schedules and ctx is not None:
            assert self.schedulers is not None
            self.schedulers.after_step(ctx.num_steps)

    def _call(self, hook: str, *args: Any) -> list[Any]:
        if hook not in self._batch_hooks:
            return []
        return self.hooks.call_lightning(hook, *args)


__all__ = ["TRAINING_MODES", "LocalTrainer", "RoundSchedulers", "TrainingMode"]
