"""What a client's failure tells the user: which client, which round, where to resume, and the setting that avoids a
known failure (a BatchNorm layer meeting a training batch of one example)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_fed.checks import InvalidArgumentError

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


def failure_note(trainer: FederatedTrainerView, round_idx: int, group: list[int]) -> str:
    """The line that ends the traceback of an error raised while ``group`` trained: which client, which round,
    and the checkpoint to resume from (the user's code keeps its traceback; this says where the run stands)."""
    who = f"client {group[0]}" if len(group) == 1 else f"clients {group} (trained together)"
    # Lightning's checkpoint callbacks know the last file they wrote; the engine reads it without the run layer.
    saved = [
        path
        for callback in getattr(trainer, "checkpoint_callbacks", [])
        if (path := getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", ""))
    ]
    where = f"last checkpoint: {saved[0]} (--ckpt_path last resumes from it)" if saved else "no checkpoint yet"
    return f"lightning-fed: raised while {who} trained in round {round_idx}; {where}."


#: The start of torch's error for a BatchNorm layer in training mode that meets a batch of one example.
_BATCHNORM_ONE_VALUE = "Expected more than 1 value per channel when training"


def raise_if_batch_of_one(error: Exception, datamodule: Any, round_idx: int, group: list[int]) -> None:
    """Turns BatchNorm's error for a training batch of one example into one line naming the client, the round and
    the datamodule option that avoids it (``drop_last: true``), when the datamodule does not set it yet."""
    if not (isinstance(error, ValueError) and str(error).startswith(_BATCHNORM_ONE_VALUE)):
        return
    if getattr(datamodule, "drop_last", True) is not False:
        return
    batch_size = getattr(datamodule, "batch_size", None)
    sizes = {client: datamodule.client_num_samples(client) for client in group}
    short = [client for client, size in sizes.items() if batch_size and size % batch_size == 1] or group
    who = ", ".join(f"client {client} ({sizes[client]} examples)" for client in short)
    raise InvalidArgumentError(
        "drop_last",
        False,
        f"true on the datamodule (`data.init_args.drop_last: true`, or a `batch_size` that leaves no last batch of"
        f" one): in round {round_idx}, {who} ended with a training batch of one example at batch_size={batch_size},"
        " which the module's BatchNorm layers cannot normalise in training",
    ) from error


__all__ = ["failure_note", "raise_if_batch_of_one"]
