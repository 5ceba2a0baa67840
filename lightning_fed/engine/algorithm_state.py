"""The algorithm objects of a fit whose state crosses between the round's halves, keyed alike on both sides.

An algorithm object is the aggregator or a callback that declares cross-process state
(:class:`~lightning_fed.parallel.reduction.CrossProcessState`). A client half that runs apart from the server half
(a deployment's site) builds the same objects from the same configuration, so both sides key them alike:
``"aggregator"``, then ``"callback-<i>-<Class>"`` in the order of the trainer's callbacks. The server sends each
object's broadcast state down in a :class:`~lightning_fed.messages.ClientTask`; the client half sends each object's
round state up in its :class:`~lightning_fed.messages.ClientReply`.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ProgressBar

from lightning_fed.hooks import FederatedTrainerView
from lightning_fed.parallel.reduction import CrossProcessState


def algorithm_objects(trainer: FederatedTrainerView) -> dict[str, CrossProcessState]:
    """The fit's aggregator and state-declaring callbacks, by their key in the messages."""
    objects: dict[str, CrossProcessState] = {"aggregator": trainer.aggregator}
    position = 0
    for callback in trainer.callbacks:
        # A progress bar shows the run and changes nothing in it (the experiment fingerprint leaves it out too): a
        # site, which shows nothing, need not build it.
        if isinstance(callback, CrossProcessState) and not isinstance(callback, ProgressBar):
            objects[f"callback-{position}-{type(callback).__name__}"] = callback
            position += 1
    return objects


def broadcast(trainer: FederatedTrainerView) -> dict[str, dict[str, Any]]:
    """Every algorithm object's broadcast state (what a client needs of the server's state this round)."""
    return {key: obj.broadcast_state() for key, obj in algorithm_objects(trainer).items()}


def load_broadcast(trainer: FederatedTrainerView, states: dict[str, dict[str, Any]]) -> None:
    """Loads the server's broadcast state into this side's algorithm objects (their other state stays as it is).

    Raises:
        ValueError: If this side's algorithms are not the server's (another configuration).
    """
    objects = algorithm_objects(trainer)
    if set(objects) != set(states):
        raise ValueError(
            f"The server runs the algorithms {sorted(states)} but this site built {sorted(objects)}: start the site"
            " from the same app config as the server."
        )
    for key, state in states.items():
        if not state:
            continue
        obj: Any = objects[key]
        full = dict(obj.state_dict())
        full.update(state)
        obj.load_state_dict(full)


def round_state(trainer: FederatedTrainerView) -> dict[str, dict[str, Any]]:
    """Every algorithm object's declared round state, unreduced (what a client half apart from the server sends)."""
    return {key: obj.round_state() for key, obj in algorithm_objects(trainer).items()}


__all__ = ["algorithm_objects", "broadcast", "load_broadcast", "round_state"]
