"""The round loop: Lightning's training-epoch loop with one federated round per epoch.

This is the only module that touches Lightning's private loop API (``_TrainingEpochLoop`` and its progress
trackers). Lightning 2.x removed the public loop-customisation API; replacing ``trainer.fit_loop.epoch_loop`` keeps
everything else of ``Trainer.fit``: epoch hooks, the validation loop, ModelCheckpoint and EarlyStopping, LR
schedulers stepped per epoch (= per round), loggers, and checkpoint save/restore. ``tests/test_lightning_canary.py``
fails loudly if these internals move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from lightning.pytorch.loops.fetchers import _DataFetcher
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from typing_extensions import override

from lightning_fed.engine.round import RoundRunner
from lightning_fed.engine.step_counter import StepCounter
from lightning_fed.hooks import FederatedTrainerView

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from lightning_fed.context import RoundResult


class RoundHost(FederatedTrainerView, Protocol):
    """What the round loop needs of its trainer, beyond what plug-ins read: the fit's start, a round's end, and the
    federated part of a checkpoint."""

    def start_federation(self) -> None:
        """Prepares the rounds of a fit (after any restore): seed, run directory, reporter."""
        ...

    def finish_round(self, result: RoundResult) -> None:
        """Completes a round after validation: history, ``on_round_end``, reporting."""
        ...

    def federated_checkpoint(self) -> dict[str, Any]:
        """Everything federated a checkpoint must hold."""
        ...

    def restore_federated_checkpoint(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`federated_checkpoint` saved."""
        ...


class _RoundLoop(_TrainingEpochLoop):
    """Runs one federated round where Lightning would run one training epoch.

    The loop owns the fit's :class:`~lightning_fed.engine.round.RoundRunner`: it builds it before its first round in
    this process (after any checkpoint is restored), with the step counter that advances ``global_step``.
    """

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer, min_steps=None, max_steps=-1)
        self.runner: RoundRunner | None = None

    @override
    def run(self, data_fetcher: _DataFetcher) -> None:
        trainer: RoundHost = self.trainer  # type: ignore[assignment]
        if self.runner is None:
            trainer.start_federation()
            self.runner = RoundRunner(trainer, trainer.lightning_module, StepCounter(self._count_step))
        round_idx = trainer.current_epoch
        # A checkpoint saved in `on_validation_end` is taken after the round finished but before Lightning counted
        # the epoch as processed: on resume Lightning re-enters this epoch, and the round must not run twice.
        already_done = trainer.federation_state.completed_rounds > round_idx
        result = None if already_done else self.runner.run(round_idx)
        if result is not None:
            trainer.federation_state.completed_rounds = round_idx + 1
        self._mark_epoch_finished()
        if result is not None:
            # As Lightning's epoch loop does after its last batch: non-plateau epoch schedulers step before
            # validation; the fit loop steps plateau schedulers after it, once the monitored metric exists.
            self.update_lr_schedulers("epoch", update_plateau_schedulers=False)
            self._validate()
            trainer.finish_round(result)

    def _count_step(self, steps: int) -> None:
        step = self.automatic_optimization.optim_progress.optimizer.step
        for _ in range(steps):
            step.increment_ready()
            step.increment_completed()
        self._batches_that_stepped += steps

    def _mark_epoch_finished(self) -> None:
        # One "batch" per round keeps Lightning's restart bookkeeping consistent, and `is_last_batch` lets the fit
        # loop step epoch-interval LR schedulers.
        progress = self.batch_progress
        progress.increment_ready()
        progress.increment_started()
        progress.increment_processed()
        progress.increment_completed()
        progress.is_last_batch = True

    def _validate(self) -> None:
        trainer = self.trainer
        if not self._should_check_val_epoch():
            return
        trainer.validating = True
        self.val_loop.run()
        trainer.training = True

    @override
    def on_save_checkpoint(self) -> dict[str, Any]:
        state_dict = super().on_save_checkpoint()
        trainer: RoundHost = self.trainer  # type: ignore[assignment]
        state_dict["federated"] = trainer.federated_checkpoint()
        return state_dict

    @override
    def on_load_checkpoint(self, state_dict: dict[str, Any]) -> None:
        super().on_load_checkpoint(state_dict)
        if "federated" in state_dict:
            trainer: RoundHost = self.trainer  # type: ignore[assignment]
            trainer.restore_federated_checkpoint(state_dict["federated"])


def install_round_loop(trainer: Trainer) -> None:
    """Replaces the trainer's training-epoch loop with the round loop."""
    trainer.fit_loop.epoch_loop = _RoundLoop(trainer)
