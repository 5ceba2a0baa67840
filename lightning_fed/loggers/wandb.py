"""Weights & Biases logging that works with or without an account."""

from __future__ import annotations

import contextlib
import logging
import netrc
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment

_OFFLINE_MODES = ("offline", "disabled", "dryrun")


def has_wandb_credentials() -> bool:
    """Whether W&B could log online: an API key in the environment or in the user's netrc file.

    ``WANDB_MODE=offline`` (or ``disabled``) wins over credentials, as it does in wandb itself.
    """
    if os.environ.get("WANDB_MODE", "").lower() in _OFFLINE_MODES:
        return False
    if os.environ.get("WANDB_API_KEY"):
        return True
    custom_host = urlparse(os.environ.get("WANDB_BASE_URL", "")).hostname
    try:
        hosts = netrc.netrc(os.environ.get("NETRC")).hosts
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return any("wandb" in host or host == custom_host for host in hosts)


class WandbLogger(_LightningWandbLogger):
    """Lightning's ``WandbLogger`` that falls back to an offline run when the user has no W&B credentials.

    Offline runs keep everything in the local run directory; ``wandb sync <dir>`` uploads them later. Pass
    ``offline=True/False`` to decide explicitly. Under :class:`~lightning_fed.FederatedTrainer` the W&B directory
    is the fit's run directory (``<run dir>/wandb``) whatever ``save_dir`` says, and a run given no ``id`` takes the
    run's id, so the W&B run and the run directory share one name.

    Args:
        offline: ``None`` (default) logs online when credentials are found, offline otherwise.
        args: Forwarded to :class:`lightning.pytorch.loggers.WandbLogger`.
        kwargs: Forwarded to :class:`lightning.pytorch.loggers.WandbLogger`.
    """

    def __init__(self, *args: Any, offline: bool | None = None, **kwargs: Any) -> None:
        if offline is None:
            offline = not has_wandb_credentials()
        # Lightning's `offline` is keyword-only in practice: nobody passes six positional arguments to a logger.
        super().__init__(*args, offline=offline, **kwargs)  # type: ignore[misc]
        drop_unset_anonymous(self)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """Lightning's W&B run, started in a directory that exists.

        W&B looks for the git repository from its directory (``dir``, where the run's files go) before it creates
        that directory, and warns ``git root <dir> does not exist`` when it is not there yet (a fresh clone's
        ``runs/quickstart`` on a first ``validate``). Creating it first is what W&B does a moment later anyway.
        """
        if self._experiment is None and self._save_dir is not None:
            with contextlib.suppress(OSError):  # W&B then reports the directory it cannot write, as before
                Path(self._save_dir).mkdir(parents=True, exist_ok=True)
        return super().experiment


def drop_unset_anonymous(logger: _LightningWandbLogger) -> None:
    """Stops ``logger`` from handing ``anonymous=None`` to ``wandb.init``.

    Lightning passes ``anonymous`` to W&B always, ``None`` when the user gave none. Recent W&B versions warn "The
    anonymous setting has no effect" for any value given, ``None`` included, so a logger the user did not ask for
    anonymous logging leaves the argument out (older W&B versions take a missing one as ``None``). One given
    explicitly is passed on, and W&B says what it says.
    """
    if logger._wandb_init.get("anonymous", False) is None:
        del logger._wandb_init["anonymous"]


def wandb_loggers(loggers: list[Any]) -> list[_LightningWandbLogger]:
    """The W&B loggers among ``loggers``."""
    return [logger for logger in loggers if isinstance(logger, _LightningWandbLogger)]


def place_wandb_run(logger: _LightningWandbLogger, run_dir: Path, run_id: str | None) -> None:
    """Puts ``logger``'s W&B directory under ``run_dir`` and, when it has no id, gives it ``run_id``.

    W&B keeps its files in ``<dir>/wandb``; without this they would go to the logger's ``save_dir`` (the working
    directory by default), shared by every run, whatever ``default_root_dir`` says. With the run's id, W&B's run and
    the run directory have one name, and a resumed run continues its W&B run (Lightning asks W&B to resume when
    allowed). A logger whose W&B run has started already keeps its place.
    """
    if logger._experiment is not None:
        return
    drop_unset_anonymous(logger)
    logger._wandb_init["dir"] = logger._save_dir = str(run_dir)
    # In a sweep, W&B ignores any id given to it (with a warning) for the agent's, which named the run already.
    if logger._id is None and run_id is not None and not os.environ.get("WANDB_SWEEP_ID"):
        logger._wandb_init["id"] = logger._id = run_id


def wandb_run_id(logger: _LightningWandbLogger) -> str | None:
    """The id ``logger``'s W&B run has or will have: its own, else the one a sweep agent set, else ``None``."""
    return logger.version or os.environ.get("WANDB_RUN_ID") or None


def define_round_axis(logger: _LightningWandbLogger, names: list[str]) -> None:
    """Plots each of ``names`` against ``round`` instead of the global step.

    A name is a metric (``"val_loss"``) or a group glob (``"scaffold/*"``).
    """
    experiment = logger.experiment
    experiment.define_metric("round")
    for name in names:
        experiment.define_metric(name, step_metric="round")


def end_run_quietly(exit_code: int = 1) -> None:
    """Ends this process's W&B run, if one is open, without writing to the terminal or to W&B's own log files.

    For a run that stops because the environment refused a write (a full disk, a spent quota): W&B's service has
    usually died of the same cause by then, and a run left open is torn down when the process exits, where every
    record W&B's threads log to ``debug.log`` on the full disk fails and Python's logging prints a
    ``--- Logging error ---`` traceback for each (hundreds of lines after the one line that says what happened).
    Here W&B's file handlers are closed and removed first, its terminal output is silenced (``wandb.termsetup``
    with a ``silent`` setting, as ``WANDB_SILENT`` would have set it), and the run is finished with ``exit_code``
    (W&B marks it failed); a failure to finish is ignored, the process being on its way out. The terminal settings
    are the run's again afterwards. W&B is not imported when nothing has imported it.
    """
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None)
    if wandb is None or run is None:
        return
    wandb_log = logging.getLogger("wandb")
    for handler in list(wandb_log.handlers):
        if isinstance(handler, logging.FileHandler):
            wandb_log.removeHandler(handler)
            with contextlib.suppress(OSError):
                handler.close()
    settings = run.settings
    wandb.termsetup(wandb.Settings(silent=True), None)
    try:
        with contextlib.suppress(Exception):
            run.finish(exit_code=exit_code)
    finally:
        # W&B reads its terminal settings once per process: a later run in this process prints as it would have.
        wandb.termsetup(settings, None)


def log_image(logger: _LightningWandbLogger, key: str, path: str, caption: str | None = None) -> None:
    import wandb

    logger.experiment.log({key: wandb.Image(path, caption=caption)})


def log_table(
    logger: _LightningWandbLogger, key: str, columns: list[str | int], rows: list[list[Any]], round_idx: int
) -> None:
    import wandb

    logger.experiment.log({key: wandb.Table(columns=columns, data=rows), "round": round_idx})
