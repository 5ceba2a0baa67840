"""The experiment fingerprint: what defines a run, as flat ``key: value`` pairs, saved in every checkpoint.

A resume compares the checkpoint's fingerprint with the one of the objects it is given, so a changed learning rate,
seed, algorithm or partition is reported (``model.lr: 0.05 -> 0.2``) instead of silently continuing another
experiment. (The datamodule's *partition* fingerprint, ``datamodules/fingerprint.py``, is a digest of the splits
themselves; this one names the settings.)

The fingerprint is read from the objects, not from a YAML config, so that runs started from Python and from the CLI
are covered alike, and the CLI's config and the objects can never disagree. For every argument of an object's
``__init__`` (over its classes), the value is taken from Lightning's ``hparams`` (``save_hyperparameters``) when
there, else from the attribute of the same name (or with a leading underscore); arguments the object keeps nowhere
cannot be told and are left out. Objects among the values (a backbone, a partitioner) are described the same way,
under the argument's name.

Keys:
    ``model``, ``model.<arg>``: the ``LightningModule`` and its arguments.
    ``data``, ``data.<arg>``, ``data.partitioner.<arg>``: the datamodule, its arguments and its partitioner's.
    ``aggregator``, ``aggregator.<arg>``.
    ``callbacks.<Class>``, ``callbacks.<Class>.<arg>``: every :class:`~lightning_fed.FedCallback` but progress bars
    (``<Class>[1]`` for a second one of a class).
    ``trainer.<setting>``: the run seed, clients per round, local work and the settings that change local training.

``num_rounds`` is not part of it: a run may always be extended.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from lightning.pytorch import LightningDataModule, LightningModule

    from lightning_fed.trainer import FederatedTrainer

Fingerprint = dict[str, Any]

# A value in the fingerprint: JSON-like, so that it survives `torch.load(weights_only=True)` and prints plainly.
_PLAIN = (bool, int, float, str, type(None))
# Objects nested deeper than this are named by their class only.
_MAX_DEPTH = 4
# Tensors up to this many elements are recorded by value, larger ones by shape and dtype (a dataset's content is the
# partition fingerprint's business, and hashing it at every fit start would cost time).
_MAX_TENSOR_VALUES = 16
# Arguments that say where data lives, how fast it loads or what gets logged: they never change what a run computes,
# and a run moved to another machine must still resume.
_NOT_DEFINING = frozenset(
    {"root", "data_dir", "download", "num_workers", "pin_memory", "persistent_workers", "eval_batch_size", "log_name"}
)


def _defines_the_run(name: str) -> bool:
    return name not in _NOT_DEFINING and not name.endswith(("every_n_steps", "every_n_rounds"))


def class_path(obj: object) -> str:
    """``package.module.Class`` of ``obj``'s class."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def init_argument_names(cls: type) -> list[str]:
    """Named arguments of ``cls.__init__`` and of the ``__init__`` of every base class, first seen first."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        for parameter in list(parameters)[1:]:
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or parameter.name in names:
                continue
            names.append(parameter.name)
    return names


_MISSING = object()


def _argument_value(obj: object, name: str) -> Any:
    hparams = getattr(obj, "_hparams", None)
    if isinstance(hparams, Mapping) and name in hparams:
        return hparams[name]
    for attribute in (name, f"_{name}"):
        # A deprecated alias kept as a property warns when read; reading it here is not the user's doing.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return getattr(obj, attribute)
            except Exception:
                continue
    return _MISSING


def _parameter_shapes(module: torch.nn.Module) -> str:
    """The module's architecture as its parameters' names and shapes: count, size and a short digest."""
    digest = hashlib.blake2b(digest_size=4)
    count = size = 0
    for name, tensor in module.state_dict().items():
        digest.update(f"{name}{tuple(tensor.shape)};".encode())
        count, size = count + 1, size + tensor.numel()
    return f"{count} tensors, {size} values, {digest.hexdigest()}"


def describe(obj: object, prefix: str, depth: int = 0) -> Fingerprint:
    """``{prefix: class path, prefix.arg: value, ...}`` for ``obj`` and, recursively, the objects among its values."""
    out: Fingerprint = {prefix: class_path(obj)}
    if depth >= _MAX_DEPTH:
        return out
    for name in filter(_defines_the_run, init_argument_names(type(obj))):
        value = _argument_value(obj, name)
        if value is not _MISSING:
            out.update(_flatten(value, f"{prefix}.{name}", depth + 1))
    if isinstance(obj, torch.nn.Module):
        # Arguments such as a width are often used and not kept; the shapes they gave the parameters are.
        out[f"{prefix}.state_shapes"] = _parameter_shapes(obj)
    return out


def _flatten(value: Any, key: str, depth: int) -> Fingerprint:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, float) and math.isnan(value):
        return {key: "nan"}  # NaN != NaN would report a change that is none
    if isinstance(value, _PLAIN):
        return {key: value}
    if isinstance(value, (PurePath, torch.dtype, torch.device)):
        return {key: str(value)}
    if isinstance(value, torch.Tensor):
        if value.numel() <= _MAX_TENSOR_VALUES:
            return {key: value.detach().cpu().tolist()}
        return {key: f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype})"}
    if isinstance(value, Mapping):
        out: Fingerprint = {}
        for name, item in value.items():
            out.update(_flatten(item, f"{key}.{name}", depth))
        return out or {key: {}}
    if isinstance(value, (list, tuple)):
        if all(isinstance(item, _PLAIN) for item in value):
            return {key: list(value)}
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{key}.{index}", depth))
        return out
    if isinstance(value, type) or inspect.isroutine(value):
        return {key: f"{value.__module__}.{value.__qualname__}"}
    if depth > _MAX_DEPTH:
        return {key: class_path(value)}
    return describe(value, key, depth)


def experiment_fingerprint(
    trainer: FederatedTrainer, model: LightningModule | None, datamodule: LightningDataModule | None
) -> Fingerprint:
    """The fingerprint of a fit of ``model`` on ``datamodule`` with ``trainer``'s settings and algorithm."""
    from lightning.pytorch.callbacks import ProgressBar

    from lightning_fed.hooks import FedCallback

    out: Fingerprint = {}
    if model is not None:
        out.update(describe(model, "model"))
    if datamodule is not None:
        out.update(describe(datamodule, "data"))
    out.update(describe(trainer.aggregator, "aggregator"))
    seen: dict[str, int] = {}
    for callback in trainer.callbacks:
        # A progress bar shows the run and changes nothing in it (whether it is on must not block a resume).
        if isinstance(callback, FedCallback) and not isinstance(callback, ProgressBar):
            name = type(callback).__qualname__
            count = seen.get(name, 0)
            seen[name] = count + 1
            out.update(describe(callback, f"callbacks.{name}" + (f"[{count}]" if count else "")))
    seed = trainer.seed if trainer.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))
    settings: dict[str, Any] = {
        "seed": seed,
        "clients_per_round": trainer.sampler.clients_per_round,
        "local_epochs": trainer.local_epochs,
        "local_steps": trainer.local_steps,
        "keep_optimizer_state": trainer.keep_optimizer_state,
        "gradient_clip_val": trainer.gradient_clip_val,
        "gradient_clip_algorithm": trainer.gradient_clip_algorithm,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "precision": str(trainer.precision),
    }
    if trainer.federated_keys is not None:
        # Only when set: runs saved before the setting existed resume unchanged.
        settings["federated_keys"] = list(trainer.federated_keys)
    for name, value in settings.items():
        out.update(_flatten(value, f"trainer.{name}", 1))
    return out


_ABSENT = "(absent)"


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (old value, new value)}`` for every key whose value differs or that only one side has."""
    keys = sorted(set(old) | set(new))
    return {
        key: (old.get(key, _ABSENT), new.get(key, _ABSENT))
        for key in keys
        if old.get(key, _ABSENT) != new.get(key, _ABSENT)
    }


def is_allowed(key: str, allowed: Iterable[str]) -> bool:
    """Whether ``key`` is named by ``allowed``: exactly, as a dotted prefix (``callbacks.FedProx``) or by ``"*"``."""
    return any(entry == "*" or key == entry or key.startswith(entry + ".") for entry in allowed)


def format_differences(diff: Mapping[str, tuple[Any, Any]]) -> str:
    """One ``key: old -> new`` line per difference, indented."""
    return "\n".join(f"  {key}: {_show(old)} -> {_show(new)}" for key, (old, new) in diff.items())


def _show(value: Any) -> str:
    return value if value == _ABSENT else repr(value) if isinstance(value, str) else str(value)


__all__ = [
    "Fingerprint",
    "class_path",
    "describe",
    "differences",
    "experiment_fingerprint",
    "format_differences",
    "init_argument_names",
    "is_allowed",
]
