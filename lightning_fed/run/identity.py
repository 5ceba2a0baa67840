"""A fit's identity: its run id and its run directory, ``<default_root_dir>/runs/<run id>/``.

Everything a run writes goes under its run directory: ``config.yaml``, ``summary.json``, plots, ``checkpoints/`` and
the W&B directory. Sweeps start many fits of one config into one root, often in the same second and without a
logger, so a run id is the logger's id when it has one, else a timestamp with a random suffix; a fresh fit never
reuses a directory that already exists.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.loggers.wandb import place_wandb_run, wandb_loggers, wandb_run_id
from lightning_fed.run.setup_checks import write_problem

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer

RUNS_DIR = "runs"
CHECKPOINTS_DIR = "checkpoints"


def new_run_id() -> str:
    """``<YYYYmmdd-HHMMSS>-<6 hex digits>``: sorts by start time, and 16.7 million ids per second tell fits apart.

    It is also a valid W&B run id, so a W&B run started without one is given it.
    """
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def logger_run_id(trainer: FederatedTrainer) -> str | None:
    """The first logger's id (``str`` versions, e.g. W&B's, or a sweep agent's) or ``version_<n>``; ``None`` when it
    has none yet."""
    if not trainer.loggers:
        return None
    logger = trainer.loggers[0]
    version = wandb_run_id(logger) if isinstance(logger, _LightningWandbLogger) else logger.version
    if version is None:
        return None
    return version if isinstance(version, str) else f"version_{version}"


# W&B refuses these in a run id; a path separator would also nest the run directory.
_NOT_IN_WANDB_IDS = "/\\#?%:"
_NOT_IN_RUN_IDS = "/\\\0"


def check_run_ids(trainer: FederatedTrainer, name: str = "trainer.logger") -> None:
    """The loggers' ids that name the run directory (the first logger's) or a W&B run must be valid names for both.

    Raises:
        InvalidArgumentError: naming the logger's ``id`` (``version`` for other loggers, ``WANDB_RUN_ID`` when the
            id came from there).
    """
    loggers = trainer.loggers
    for index, logger in enumerate(loggers):
        is_wandb = isinstance(logger, _LightningWandbLogger)
        if not is_wandb and index > 0:
            continue
        run_id = wandb_run_id(logger) if isinstance(logger, _LightningWandbLogger) else logger_run_id(trainer)
        if run_id is None:
            continue
        refused = _NOT_IN_WANDB_IDS if is_wandb else _NOT_IN_RUN_IDS
        bad = "".join(sorted({char for char in run_id if char in refused}))
        if not bad and run_id not in (".", ".."):
            continue
        where = f"{name}[{index}]" if len(loggers) > 1 else name
        if is_wandb and logger.version is None:
            argument = "WANDB_RUN_ID (environment)"
        else:
            argument = f"{where}.init_args.{'id' if is_wandb else 'version'}"
        refused_text = " ".join(repr(char) for char in refused)
        what = "the run directory and the W&B run" if is_wandb else "the run directory"
        raise InvalidArgumentError(
            argument, run_id, f"a valid directory name, it names {what} (none of {refused_text})"
        )


def runs_root(trainer: FederatedTrainer) -> Path:
    """``<default_root_dir>/runs``: where every run of this root has its directory."""
    return Path(trainer.default_root_dir) / RUNS_DIR


def new_run_dir(trainer: FederatedTrainer) -> Path:
    """``run_dir`` when given, else a directory of its own under :func:`runs_root`.

    The id is the logger's when it has one, else :func:`new_run_id`; an id whose directory exists already (a
    logger's version counted by two fits at once, a W&B id given twice) gets a random suffix, so a fresh fit never
    writes beside another run's files.
    """
    if trainer.run_dir:
        return Path(trainer.run_dir)
    check_run_ids(trainer)
    root = runs_root(trainer)
    run_id = logger_run_id(trainer) or new_run_id()
    while (root / run_id).exists():
        run_id = f"{run_id}-{secrets.token_hex(2)}"
    return root / run_id


def checkpoint_dir(run_dir: Path) -> Path:
    """``<run dir>/checkpoints``."""
    return run_dir / CHECKPOINTS_DIR


def open_run(trainer: FederatedTrainer, run_dir: Path, checkpoint_callbacks: list[ModelCheckpoint]) -> None:
    """Points what a fit writes at ``run_dir``: the checkpoint callbacks that were given no ``dirpath`` and the W&B
    loggers that have not started their run yet (their directory, and their id when they have none).

    Nothing is created on disk here: the run directory appears with the first file written into it. A run directory
    that could not be written is refused here, before the first round (and before W&B, which would fall back to a
    temporary directory outside the run, starts).

    Raises:
        PermissionError: ``run_dir`` cannot be created or written (permissions, a read-only file system).
    """
    problem = write_problem(run_dir)
    if problem is not None:
        code = errno.EROFS if "read-only" in problem else errno.EACCES
        raise PermissionError(
            code,
            f"cannot write the run directory {run_dir}: {problem}; choose a writable `default_root_dir` (or `run_dir`)",
            str(run_dir),
        )
    trainer.session.run_dir = run_dir
    for callback in checkpoint_callbacks:
        # As ModelCheckpoint stores a dirpath given to it, so that a resumed run's saved dirpath compares equal.
        callback.dirpath = os.path.realpath(checkpoint_dir(run_dir))
    # A directory named by the user is no id: two runs given `run_dir="out"` are two W&B runs.
    run_id = None if trainer.run_dir else run_dir.name
    for logger in wandb_loggers(trainer.loggers):
        place_wandb_run(logger, run_dir, run_id)


def continue_last_checkpoints(checkpoint_callbacks: list[ModelCheckpoint]) -> None:
    """After a restore, points each of the run's checkpoint callbacks at the run's existing ``last`` file, so that
    the next ``last`` replaces (or relinks) it.

    A checkpoint carries the callback's state as it was when the checkpoint was written, and a round's file is
    written before ``last`` is: round 0's names no ``last`` file at all. Resumed from it, Lightning takes the run's
    ``last.ckpt`` for someone else's file and writes ``last-v1.ckpt`` beside it (its version counter) instead.
    Callbacks that do not save ``last``, or whose ``last`` file does not exist yet, are left as they are.
    """
    for callback in checkpoint_callbacks:
        if not callback.save_last or callback.dirpath is None:
            continue
        last = callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)
        if os.path.lexists(last):
            callback.last_model_path = last


__all__ = [
    "CHECKPOINTS_DIR",
    "RUNS_DIR",
    "check_run_ids",
    "checkpoint_dir",
    "continue_last_checkpoints",
    "logger_run_id",
    "new_run_dir",
    "new_run_id",
    "open_run",
    "runs_root",
]
