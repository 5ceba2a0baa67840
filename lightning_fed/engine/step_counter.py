"""The one count of a fit's federated optimizer steps."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_fed.context import ClientContext
    from lightning_fed.hooks import FederatedTrainerView


class StepCounter:
    """Counts the optimizer steps that clients take, for ``trainer.global_step`` and for the round.

    Every federated optimizer step is counted once, where it is taken (one client's step in local training, or one
    step of each client of a batched group); the count advances Lightning's ``global_step``, the axis that
    ``self.log`` inside ``training_step`` uses. Steps taken beside the federation (fine-tuning, the warm-up, the SGD
    twin) are not federated steps and are never counted.

    With several processes each rank counts the steps of its own clients; once the round's shares are combined,
    :meth:`add_other_ranks` advances ``global_step`` by the steps the other ranks took, so every rank's
    ``global_step`` is what one process would show.

    Args:
        advance: Advances ``global_step`` by ``n`` steps (the round loop's); ``None`` counts without advancing it.
    """

    def __init__(self, advance: Callable[[int], None] | None = None) -> None:
        self._advance = advance
        self.round_steps = 0

    def start_round(self) -> None:
        """Starts this process's count for a new round."""
        self.round_steps = 0

    def add(self, steps: int = 1) -> None:
        """Counts ``steps`` optimizer steps taken by this process's clients."""
        self.round_steps += steps
        if self._advance is not None:
            self._advance(steps)

    def add_other_ranks(self, steps: int) -> None:
        """Advances ``global_step`` by the steps other ranks' clients took this round (not this process's count)."""
        if steps and self._advance is not None:
            self._advance(steps)


def record_step_sizes(ctx: ClientContext, lrs: Sequence[float]) -> None:
    """Adds the learning rates one optimizer step of the client used (one per param group, read before the step,
    as the optimizer reads them) to ``ctx.lr_sums``."""
    if not ctx.lr_sums:
        ctx.lr_sums = [float(lr) for lr in lrs]
    else:
        ctx.lr_sums = [total + float(lr) for total, lr in zip(ctx.lr_sums, lrs)]


def client_steps(num_batches: int, local_epochs: int | None, local_steps: int | None, accumulate: int) -> int:
    """The optimizer steps a client with ``num_batches`` training batches takes in one round (as
    :func:`~lightning_fed.engine.training_step.client_batches` yields them: an epoch's last batch ends a step)."""
    if num_batches <= 0:
        return 0
    if local_steps is not None:
        return local_steps
    return (local_epochs or 1) * math.ceil(num_batches / max(1, accumulate))


def client_step_counts(trainer: FederatedTrainerView) -> list[int]:
    """The optimizer steps each registered client takes in a round, from the datamodule's client loaders (set up),
    ``local_epochs``/``local_steps`` and ``accumulate_grad_batches``. Under manual optimisation a step is a batch."""
    datamodule = trainer.datamodule
    accumulate = max(1, int(trainer.accumulate_grad_batches))
    counts = []
    for client_id in range(datamodule.num_clients):
        # With `local_steps` every client that has data takes exactly that many: no loader is built.
        num_batches = 1 if trainer.local_steps is not None else len(datamodule.client_dataloader(client_id, seed=0))
        counts.append(client_steps(num_batches, trainer.local_epochs, trainer.local_steps, accumulate))
    return counts


def steps_per_round(counts: list[int]) -> int:
    """The steps of a client of average length (the mean, rounded half up): how far a step-interval schedule
    advances per round."""
    return (2 * sum(counts) + len(counts)) // (2 * len(counts)) if counts else 0


def run_steps(counts: list[int], num_rounds: int) -> int:
    """``trainer.estimated_stepping_batches`` of a run: ``num_rounds - 1`` rounds of a client of average length,
    then the longest client's steps, so that no client's schedule passes the end (``OneCycleLR`` would raise)."""
    if not counts:
        return 0
    return (num_rounds - 1) * steps_per_round(counts) + max(counts)


__all__ = [
    "StepCounter",
    "client_step_counts",
    "client_steps",
    "record_step_sizes",
    "run_steps",
    "steps_per_round",
]
