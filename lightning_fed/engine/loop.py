"""The round loop: Lightning's training-epoch loop with one federated round per epoch; and the site loop, where a
client half apart from the server (a deployment's site) answers tasks inside one Lightning fit.

This is the only module that touches Lightning's private loop API (``_TrainingEpochLoop`` and its progress
trackers). Lightning 2.x removed the public loop-customisation API; replacing ``trainer.fit_loop.epoch_loop`` keeps
everything else of ``Trainer.fit``: epoch hooks, the validation loop, ModelCheckpoint and EarlyStopping, LR
schedulers stepped per epoch (= per round), loggers, and checkpoint save/restore.
``tests/engine/test_lightning_canary.py`` fails loudly if these internals move.

It also owns SIGTERM while the rounds run (:class:`SigtermWatch`): a signal stops the fit at the next client
boundary, where every rank agrees to stop, instead of wherever Lightning's own checks would see it.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import torch
from lightning.pytorch.loops.fetchers import _DataFetcher
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from typing_extensions import override

from lightning_fed.engine.client_half import Boundary, ClientHalf
from lightning_fed.engine.round import RoundRunner
from lightning_fed.engine.step_counter import StepCounter
from lightning_fed.hooks import FederatedTrainerView
from lightning_fed.parallel import distributed

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

    def build_round_runner(self, steps: StepCounter, boundary: Boundary) -> RoundRunner:
        """The runner of this fit's rounds, built once, after any restore, with the fit's step counter and the
        client-boundary check (SIGTERM)."""
        ...


class SiteHost(FederatedTrainerView, Protocol):
    """What the site loop needs of its trainer: the fit's start, its client half, and the tasks to answer."""

    def start_federation(self) -> None:
        """Prepares the site's fit (its setup checks, the aggregator's setup)."""
        ...

    def build_round_runner(self, steps: StepCounter, boundary: Boundary) -> RoundRunner:
        """The runner whose client half answers the site's tasks."""
        ...

    def serve(self, client: ClientHalf) -> None:
        """Answers tasks with ``client`` (``ClientHalf.run_task``) until there are none left."""
        ...


class SigtermWatch:
    """Records SIGTERM while the rounds run; the client half asks it at every client boundary whether to stop.

    Lightning's own handler is replaced for the rounds (Lightning's teardown restores the handlers it found when the
    fit ends): with several processes it broadcasts from inside the handler, which can pair with whatever
    collective the round is in, and its loops check the flag where the ranks do not agree (in the middle of
    validation). Here the handler only records the signal (and passes it on to the processes the strategy launched,
    as Lightning's does), and the ranks agree at a client boundary: one ``all_reduce`` of two numbers, whether any
    rank received the signal and whether any rank has clients left. Every rank passes the same number of
    boundaries, so a rank that has trained its share keeps answering until the others finish theirs.

    A signal that arrives after a round's last client lets that round finish (aggregate, validation, checkpoint,
    ``on_round_end``); the fit stops at the first boundary of the next round, or ends normally after the last round.
    """

    def __init__(self) -> None:
        self.received = False
        self._launcher: Any = None

    def install(self, trainer: Trainer) -> None:
        """Takes over SIGTERM for this fit's rounds, keeping a signal Lightning recorded before them."""
        if (
            signal.getsignal(signal.SIGTERM) == self._record
            or threading.current_thread() is not threading.main_thread()
        ):
            return
        self.received = bool(trainer.received_sigterm)
        self._launcher = trainer.strategy.launcher
        signal.signal(signal.SIGTERM, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if not self.received and self._launcher is not None:
            self._launcher.kill(signum)
        self.received = True

    def at_boundary(self, more: bool) -> tuple[bool, bool]:
        """At a client boundary: whether any rank received SIGTERM (stop), and whether any rank has clients left
        (``more``: this rank's). Every rank calls it the same number of times in a round."""
        if not distributed.is_distributed():
            return self.received, more  # nothing to agree on: no tensor per client
        flags = torch.tensor([float(self.received), float(more)])
        distributed.all_reduce_sum_([flags])
        return bool(flags[0] > 0), bool(flags[1] > 0)


class _FederatedEpochLoop(_TrainingEpochLoop):
    """What both loops keep of Lightning's epoch: ``global_step`` advanced by the clients' optimizer steps, and one
    "batch" per epoch for Lightning's restart bookkeeping."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer, min_steps=None, max_steps=-1)

    def _count_step(self, steps: int) -> None:
        # Lightning's `global_step` reads the manual loop's progress under manual optimisation.
        if self.trainer.lightning_module.automatic_optimization:
            step = self.automatic_optimization.optim_progress.optimizer.step
        else:
            step = self.manual_optimization.optim_step_progress
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


class _RoundLoop(_FederatedEpochLoop):
    """Runs one federated round where Lightning would run one training epoch.

    The loop owns the fit's :class:`~lightning_fed.engine.round.RoundRunner`: it builds it before its first round in
    this process (after any checkpoint is restored), with the step counter that advances ``global_step``.
    """

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer)
        self.runner: RoundRunner | None = None
        self.sigterm = SigtermWatch()

    @override
    def run(self, data_fetcher: _DataFetcher) -> None:
        trainer: RoundHost = self.trainer  # type: ignore[assignment]
        if self.runner is None:
            trainer.start_federation()
            steps = StepCounter(self._count_step)
            self.runner = trainer.build_round_runner(steps, self.sigterm.at_boundary)
        self.sigterm.install(self.trainer)
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


class _SiteLoop(_FederatedEpochLoop):
    """The one epoch of a site's fit: its client half answers the site's tasks (``SiteHost.serve``) until there are
    none left. No round result, no validation, no checkpoint: the server does those."""

    @override
    def run(self, data_fetcher: _DataFetcher) -> None:
        host: SiteHost = self.trainer  # type: ignore[assignment]
        host.start_federation()
        runner = host.build_round_runner(StepCounter(self._count_step), _never_stop)
        host.serve(runner.client)
        self._mark_epoch_finished()


def _never_stop(more: bool) -> tuple[bool, bool]:
    return False, more


def install_round_loop(trainer: Trainer) -> None:
    """Replaces the trainer's training-epoch loop with the round loop."""
    trainer.fit_loop.epoch_loop = _RoundLoop(trainer)


def install_site_loop(trainer: Trainer) -> None:
    """Replaces the trainer's training-epoch loop with the site loop (its trainer is a :class:`SiteHost`)."""
    trainer.fit_loop.epoch_loop = _SiteLoop(trainer)
