"""Eager checks of a federated setup, with errors that name the argument to change."""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch import nn

from lightning_fed.checks import InvalidArgumentError, check_bool, check_choice, check_int
from lightning_fed.hooks import FedCallback
from lightning_fed.parallel import distributed
from lightning_fed.run.module_checks import check_module_setup

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer

_FEDERATED_DATAMODULE_API = ("client_dataloader", "client_test_dataloader", "client_num_samples", "num_clients")

EPOCH_ARGS: dict[str, Any] = {
    "max_epochs": None,
    "min_epochs": None,
    "max_steps": -1,
    "min_steps": None,
    "max_time": None,
}
"""Trainer arguments that ``num_rounds`` replaces, with the defaults that LightningCLI passes along."""

# Lightning's `seed_everything` accepts what NumPy's legacy seeding does: an unsigned 32-bit integer.
_MAX_SEED = 2**32 - 1


def check_round_settings(
    num_rounds: int,
    local_epochs: int | None,
    local_steps: int | None,
    eval_every_n_rounds: int,
    client_eval: str,
    client_eval_every_n_rounds: int,
    client_table_every_n_rounds: int,
    on_client_divergence: str,
    keep_optimizer_state: bool = False,
    seed: int | None = None,
) -> None:
    """Validates ``FederatedTrainer``'s own arguments (``clients_per_round`` is checked by the sampler)."""
    check_int("num_rounds", num_rounds, minimum=1)
    if local_epochs is not None and local_steps is not None:
        raise InvalidArgumentError(
            "local_epochs",
            local_epochs,
            f"None when `local_steps` is set (local_steps={local_steps!r}): set either `local_epochs` or `local_steps`",
        )
    check_int("local_epochs", local_epochs, minimum=1, allow_none=True)
    check_int("local_steps", local_steps, minimum=1, allow_none=True)
    check_int("eval_every_n_rounds", eval_every_n_rounds, minimum=0)
    check_int("client_eval_every_n_rounds", client_eval_every_n_rounds, minimum=0)
    check_int("client_table_every_n_rounds", client_table_every_n_rounds, minimum=0)
    check_choice("client_eval", client_eval, ("all", "sampled", "none"))
    check_choice("on_client_divergence", on_client_divergence, ("skip", "raise"))
    check_bool("keep_optimizer_state", keep_optimizer_state)
    # Every draw derives its own 63-bit seed from the run seed by hashing, so any integer is a valid run seed.
    check_int("seed", seed, allow_none=True)


def check_epoch_args(settings: Mapping[str, Any], prefix: str = "") -> None:
    """Lightning's epoch and step limits have no meaning in a federated fit: ``num_rounds`` replaces them.

    Args:
        settings: The trainer's keyword arguments (or the CLI's ``trainer`` config).
        prefix: Put before each argument's name in the error (``"trainer."`` from the CLI).
    """
    for name, default in EPOCH_ARGS.items():
        value = settings.get(name, default)
        if value != default:
            raise InvalidArgumentError(
                f"{prefix}{name}",
                value,
                f"left unset ({default}): FederatedTrainer runs `num_rounds` rounds, one epoch each",
            )


def check_lightning_settings(check_val_every_n_epoch: Any, prefix: str = "") -> None:
    """Lightning Trainer arguments that Lightning itself accepts but that fail later (0 divides a round count)."""
    check_int(f"{prefix}check_val_every_n_epoch", check_val_every_n_epoch, minimum=1, allow_none=True)


def check_seed_everything(name: str, value: Any) -> None:
    """LightningCLI's ``seed_everything``: true (a random seed), false (none), or a seed NumPy accepts."""
    if isinstance(value, bool) or value is None:
        return
    check_int(name, value, minimum=0, maximum=_MAX_SEED)


def check_output_dir(name: str, path: str | os.PathLike[str] | None) -> None:
    """A directory a run creates or writes into: neither it nor any of its parents may be an existing file.

    Checked before anything is written, so that a run that cannot write its results fails before it trains.
    """
    if path is None or str(path) == "":
        return
    given = Path(path)
    for candidate in (given, *given.parents):
        if candidate.exists() and not candidate.is_dir():
            where = "" if candidate == given else f" ({candidate} is a file)"
            raise InvalidArgumentError(name, str(path), f"a directory, not an existing file{where}")
    problem = write_problem(given)
    if problem is not None:
        raise InvalidArgumentError(name, str(path), f"a directory this process can write to ({problem})")


def write_problem(path: str | os.PathLike[str]) -> str | None:
    """Why this process could not create files in or under ``path``, or ``None`` when it can (as far as ``access(2)``
    tells without writing anything: permissions, a read-only file system; root passes permission bits).

    The directory that decides is the nearest one that exists: ``path`` itself, or the parent it would be created
    in. Remote paths (``s3://...``) are left to their file system.
    """
    if "://" in str(path):
        return None
    given = Path(path).absolute()
    existing = next((candidate for candidate in (given, *given.parents) if candidate.exists()), None)
    if existing is None or not existing.is_dir():
        return None  # a file on the way is `check_output_dir`'s to report; mkdir will say what else is wrong
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return f"{existing} is on a read-only file system"
    return f"no permission to write in {existing}"


_UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


def check_checkpoint_path(name: str, value: Any) -> None:
    """A ``ckpt_path`` that names an existing file must be a checkpoint that torch loads with ``weights_only=True``;
    one that names a directory must hold a checkpoint in its ``checkpoints/`` (or be that folder).

    Checked when the command line is parsed, before Lightning reads the file: a text file would otherwise fail deep
    in torch's unpickler (``IndexError: pop from empty list``), and a pickle that would run code when loaded is
    refused by a page of torch's advice. Names that are no path (``last``, a run id) are left to the resume.
    """
    if value is None or not isinstance(value, (str, os.PathLike)):
        return
    path = Path(value)
    if path.is_dir():
        # Where the resume looks: a run directory's `checkpoints/`, or that folder itself.
        folder = path if path.name == "checkpoints" else path / "checkpoints"
        if not (folder.is_dir() and any(folder.glob("*.ckpt"))):
            allowed = f"a checkpoint file, or a run directory with a checkpoint (none in {folder})"
            raise InvalidArgumentError(name, str(value), allowed)
        return
    if not path.is_file():
        return
    try:
        # mmap: the tensors stay on disk, so checking a large checkpoint costs no memory.
        torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as error:
        unsafe = _UNSAFE_GLOBAL.search(str(error))
        if unsafe is None:
            raise InvalidArgumentError(name, str(value), "a checkpoint (torch cannot read this file as one)") from error
        allowed = (
            f"a safe checkpoint: unpickling this file would call `{unsafe.group(1)}`, which torch's safe loader"
            " (weights_only) refuses; it was not written by lightning-fed or Lightning, and loading it could run code"
        )
        raise InvalidArgumentError(name, str(value), allowed) from error
    except Exception as error:
        raise InvalidArgumentError(name, str(value), "a checkpoint (torch cannot read this file as one)") from error


def check_num_classes(model: Any, datamodule: Any, name: str = "num_classes") -> None:
    """A model that says how many classes it predicts (a ``num_classes`` attribute) must predict the data's."""
    model_classes = getattr(model, "num_classes", None)
    data_classes = getattr(datamodule, "num_classes", None)
    if isinstance(model_classes, int) and isinstance(data_classes, int) and model_classes != data_classes:
        raise InvalidArgumentError(
            name, model_classes, f"the datamodule's number of classes, {data_classes} ({type(datamodule).__name__})"
        )


def check_clients_per_round(clients_per_round: int | float, num_clients: int, name: str = "clients_per_round") -> None:
    """A count of clients per round can be at most the number of registered clients (a fraction always fits)."""
    if isinstance(clients_per_round, int) and clients_per_round > num_clients:
        raise InvalidArgumentError(
            name,
            clients_per_round,
            f"at most the {num_clients} registered clients (or raise the partitioner's `num_partitions`)",
        )


def check_fit_setup(datamodule: LightningDataModule | None, train_dataloaders: Any, val_dataloaders: Any) -> None:
    """Federated training needs per-client data: a ``FederatedDataModule``, not plain dataloaders."""
    if train_dataloaders is not None or val_dataloaders is not None:
        raise TypeError(
            "FederatedTrainer.fit takes `datamodule=` a FederatedDataModule, not dataloaders: wrap your datasets"
            " with `lightning_fed.datamodules.DatasetFederated(train, test, num_classes, partitioner)`."
        )
    missing = [name for name in _FEDERATED_DATAMODULE_API if not hasattr(datamodule, name)]
    if datamodule is None or missing:
        raise TypeError(
            f"FederatedTrainer.fit needs `datamodule` to be a FederatedDataModule (got {type(datamodule).__name__},"
            f" missing {missing}). Wrap your datasets with `lightning_fed.datamodules.DatasetFederated`."
        )


def check_no_sync_batchnorm(module: nn.Module, world_size: int) -> None:
    """With several processes a SyncBatchNorm would mix the batch statistics of clients on different ranks."""
    if world_size <= 1:
        return
    synced = [name for name, m in module.named_modules() if isinstance(m, nn.SyncBatchNorm)]
    if synced:
        raise ValueError(
            f"SyncBatchNorm layers {synced[:3]} would average batch statistics across ranks, i.e. across clients"
            " that train on different processes: drop `sync_batchnorm=True` (or convert them back to BatchNorm)."
        )


def check_process_group(trainer_world_size: int, group_world_size: int) -> None:
    """The rounds are split over torch.distributed's default process group, which must be the trainer's."""
    if group_world_size != trainer_world_size:
        raise ValueError(
            f"torch.distributed's default process group has {group_world_size} processes but the trainer runs on"
            f" {trainer_world_size}: FederatedTrainer splits each round over that group. Let Lightning's strategy"
            " create it (`strategy='ddp'` with `devices`/`num_nodes`), or destroy the foreign group before `fit`."
        )


def check_allowed_changes(value: Any) -> list[str]:
    """``resume_allow_changes``: fingerprint keys (or dotted prefixes, or ``"*"``) a resume may change."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(key, str) for key in value):
        raise InvalidArgumentError(
            "resume_allow_changes", value, 'a list of fingerprint keys such as ["model.lr"], or None'
        )
    return list(value)


def check_federation_setup(trainer: FederatedTrainer, module: LightningModule) -> None:
    """Everything checked when the rounds of a fit start (after any checkpoint is restored): the module, the
    clients per round, each federated callback's own requirements and the process layout."""
    check_module_setup(trainer, module)
    num_clients = trainer.datamodule.num_clients
    check_clients_per_round(trainer.sampler.clients_per_round, num_clients)
    trainer.aggregator.check_setup(trainer, trainer.datamodule)
    for callback in trainer.callbacks:
        if isinstance(callback, FedCallback):
            callback.check_setup(trainer, trainer.datamodule)
    distributed.check_world_size(trainer.world_size, trainer.sampler.num_sampled(num_clients))
    check_process_group(trainer.world_size, distributed.world_size())
    check_no_sync_batchnorm(module, trainer.world_size)


def check_federated_keys(value: Any) -> list[str] | None:
    """``federated_keys`` is ``None`` or a non-empty list of glob patterns (strings); returns it as a list."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise InvalidArgumentError("federated_keys", value, "a non-empty list of glob patterns on state_dict keys")
    if not all(isinstance(pattern, str) and pattern for pattern in value):
        raise InvalidArgumentError("federated_keys", value, "a non-empty list of glob patterns on state_dict keys")
    return list(value)


def check_client_parallelism(value: Any) -> int | str:
    """``client_parallelism`` is ``"auto"`` or a group size of at least 1; returns it."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise InvalidArgumentError("client_parallelism", value, "an integer >= 1 or 'auto'")
    return check_int("client_parallelism", value, minimum=1)
