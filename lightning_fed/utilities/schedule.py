"""When periodic work is due: "every n rounds, and the last one"."""

from __future__ import annotations


def is_due(round_number: int, every: int | None, num_rounds: int) -> bool:
    """Whether work done every ``every`` rounds is due after round ``round_number`` (1-based).

    It is due on every ``every``-th round and on the run's last round, so that a run always ends with a fresh
    result. ``every`` of ``0`` or ``None`` turns the work off entirely, the last round included.

    Args:
        round_number: Rounds completed, counting the one that just ended (1 after the first round).
        every: The period in rounds; ``0`` or ``None`` for never.
        num_rounds: The run's total number of rounds.
    """
    if not every:
        return False
    return round_number % every == 0 or round_number == num_rounds


__all__ = ["is_due"]
