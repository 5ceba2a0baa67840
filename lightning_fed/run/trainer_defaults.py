"""What a ``FederatedTrainer`` adds to Lightning's defaults: the round progress bar, a checkpoint every round (the
last two kept), and atomic checkpoint writes."""

from __future__ import annotations

from typing import Any

from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar

from lightning_fed.callbacks.progress import RoundProgressBar
from lightning_fed.run.checkpoint_io import AtomicCheckpointIO

# Rounds whose checkpoints the default ModelCheckpoint keeps in a run's `checkpoints/`.
KEPT_ROUNDS = 2


def default_callbacks(kwargs: dict[str, Any]) -> list[Callback]:
    """The user's callbacks plus the round progress bar and the per-round checkpoint, unless switched off."""
    callbacks = kwargs.get("callbacks") or []
    callbacks = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
    # LightningCLI passes None for "Lightning's default", which is on.
    if kwargs.get("enable_progress_bar") is not False and not any(isinstance(cb, ProgressBar) for cb in callbacks):
        callbacks.append(RoundProgressBar())
    if kwargs.get("enable_checkpointing") is not False and not any(isinstance(cb, ModelCheckpoint) for cb in callbacks):
        # Lightning 2.6 writes `last` only alongside a top-k save; keeping the two newest rounds (the highest
        # `epoch`) and linking `last` to the newest costs one checkpoint write per round and two on disk, and a
        # corrupt newest one leaves the round before it to resume from. Its directory is the run directory's
        # `checkpoints/`, set when a fit starts.
        callbacks.append(
            ModelCheckpoint(
                filename="round{epoch:04d}",
                auto_insert_metric_name=False,
                monitor="epoch",
                mode="max",
                save_top_k=KEPT_ROUNDS,
                # A round trained again after a resume replaces its file (and `last.ckpt` its link) rather than
                # writing `-v1` copies beside them.
                enable_version_counter=False,
                save_last="link",
                save_on_train_epoch_end=True,
            )
        )
    return callbacks


def checkpoints_without_dir(callbacks: list[Callback]) -> list[ModelCheckpoint]:
    """The checkpoint callbacks given no directory: each fit points them at its own run directory."""
    return [cb for cb in callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath is None]


def with_atomic_checkpoints(plugins: Any) -> list[Any]:
    """The user's plugins, plus :class:`AtomicCheckpointIO` unless they bring a ``CheckpointIO`` of their own: a
    checkpoint is written beside its final name and moved into place, so a crash or a full disk never leaves a
    partial one where ``--ckpt_path last`` would find it."""
    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
        plugins.append(AtomicCheckpointIO())
    return plugins


__all__ = ["KEPT_ROUNDS", "checkpoints_without_dir", "default_callbacks", "with_atomic_checkpoints"]
