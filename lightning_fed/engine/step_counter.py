"""The one count of a fit's federated optimizer steps."""

from __future__ import annotations

from collections.abc import Callable


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


__all__ = ["StepCounter"]
