"""Learning-rate schedulers in federated rounds: what a step-interval schedule means when every client of a round
trains from the same global model (see :class:`RoundSchedulers`)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningModule

from lightning_fed.engine.step_counter import client_step_counts, steps_per_round

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


def scheduler_snapshot(trainer: Any) -> list[Any] | None:
    """A deep copy of the LR schedulers' states and of the optimizers' hyperparameters they set (``lr``, OneCycle's
    momentum, ...): where every client of a round starts from. ``None`` when the fit has no scheduler."""
    configs = trainer.lr_scheduler_configs
    if not configs:
        return None
    hyperparameters = [
        [{k: v for k, v in g.items() if k != "params"} for g in o.param_groups] for o in trainer.optimizers
    ]
    return copy.deepcopy([[config.scheduler.state_dict() for config in configs], hyperparameters])


def restore_schedulers(trainer: Any, snapshot: list[Any]) -> None:
    """Puts the LR schedulers and the optimizers' hyperparameters back to a :func:`scheduler_snapshot` (which stays
    untouched, so it can be restored again)."""
    schedulers, groups = snapshot
    for config, state in zip(trainer.lr_scheduler_configs, schedulers):
        config.scheduler.load_state_dict(copy.deepcopy(state))
    for optimizer, saved in zip(trainer.optimizers, groups):
        for group, hyper in zip(optimizer.param_groups, saved):
            group.update(copy.deepcopy(hyper))


class RoundSchedulers:
    """The LR schedulers of a fit seen from a round: every client starts from the round's scheduler state, and a
    step-interval schedule advances by the local steps a client takes.

    * Each client of a round starts from the schedulers' state (and the optimizers' hyperparameters they set, such
      as ``lr`` and OneCycle's momentum) at the round's start; what one client's steps did never reaches another.
    * Under automatic optimisation a scheduler with ``interval="step"`` steps after the client's optimizer steps,
      on the schedule's own axis: round ``r`` starts at position ``r * A``, where ``A`` is the steps of a client of
      average length (:func:`~lightning_fed.engine.step_counter.steps_per_round`, a constant of the fit), and the
      scheduler steps after local step ``k`` when ``(r * A + k) % frequency == 0``.
    * After the round the state is the round's start advanced by ``A`` steps (the scheduler steps the number of
      multiples of ``frequency`` in ``(r * A, (r + 1) * A]``), so after ``R`` rounds the schedule is at ``R * A``,
      whichever clients were sampled: deterministic, and only the scheduler's own state is checkpointed.
    * Epoch-interval schedulers step once per round in the round loop, as before. Under manual optimisation the
      module steps its schedulers itself (Lightning's rule); a client's changes are undone after it, so only what
      the module does outside ``training_step`` (``on_train_epoch_end``) carries over rounds.

    Args:
        module: The user's LightningModule, attached to the federated trainer (its ``lr_scheduler_configs``).
        trainer: The federated trainer (settings and datamodule, for ``A``).
    """

    def __init__(self, trainer: FederatedTrainerView, module: LightningModule) -> None:
        self.trainer = trainer
        self.module = module
        self._snapshot: list[Any] | None = None
        self._position = 0
        self._per_round: int | None = None
        self._steppers: list[Any] = []

    def _configs(self) -> list[Any]:
        return list(self.module.trainer.lr_scheduler_configs)

    def _stepwise(self) -> list[Any]:
        if not self.module.automatic_optimization:
            return []
        return [config for config in self._configs() if config.interval == "step"]

    def open_round(self, round_idx: int) -> None:
        """Records the round's scheduler state; clients start from it."""
        self._steppers = self._stepwise()
        self._snapshot = scheduler_snapshot(self.module.trainer)
        if self._snapshot is not None and self._steppers:
            if self._per_round is None:
                self._per_round = steps_per_round(client_step_counts(self.trainer))
            self._position = round_idx * self._per_round

    def start_client(self) -> None:
        """Puts the schedulers (and the hyperparameters they set) back to the round's state."""
        if self._snapshot is not None:
            restore_schedulers(self.module.trainer, self._snapshot)

    @property
    def steps_within_clients(self) -> bool:
        """Whether a step-interval schedule steps within this round's clients (:meth:`after_step` has work to do)."""
        return bool(self._steppers)

    def after_step(self, local_step: int) -> None:
        """Steps the step-interval schedulers after a client's ``local_step``-th optimizer step (from 1)."""
        position = self._position + local_step
        for config in self._steppers:
            if position % config.frequency == 0:
                config.scheduler.step()

    def close_round(self, completed: bool) -> None:
        """Back to the round's state; a completed round then advances the step-interval schedules by ``A`` steps."""
        self.start_client()
        if not completed or self._snapshot is None or self._per_round is None:
            return
        start, end = self._position, self._position + self._per_round
        for config in self._steppers:
            for _ in range(end // config.frequency - start // config.frequency):
                config.scheduler.step()


__all__ = ["RoundSchedulers", "restore_schedulers", "scheduler_snapshot"]
