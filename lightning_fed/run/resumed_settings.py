"""A resumed run trains with the module settings it was allowed to change, not with the checkpoint's.

Lightning restores each optimizer's ``state_dict`` from the checkpoint, ``param_groups`` included, over what
``configure_optimizers`` has just built: a resume that changed ``model.lr`` (named in ``resume_allow_changes``)
would be reported with the new value and still step with the old one. Here the hyperparameters
``configure_optimizers`` gave (:func:`configured_optimizers`, read before Lightning restores anything) are put back
once the restore is done (:func:`reapply_configured_optimizers`); the optimizers' state (momentum buffers, Adam's
moments) stays the checkpoint's.

Schedulers are minded: a schedule continues from its restored position under the new settings, as if the run had
been configured so from its start. An ``LRScheduler`` (``StepLR``, ``OneCycleLR``, a warm-up with cosine, ...) is
put back to its configured state and stepped as many times as the restored one had been, so ``StepLR`` after two
decays gives the new lr halved twice. ``ReduceLROnPlateau`` keeps its restored counters, but its reductions so far
cannot be replayed (they followed the metric): it continues from the configured lr.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch.optim.lr_scheduler import ReduceLROnPlateau

# The fingerprint's group of the module's own settings, which `configure_optimizers` reads.
_MODULE_GROUP = "model."


@dataclass
class ConfiguredOptimizers:
    """What ``configure_optimizers`` built, before a restore overwrote it.

    Attributes:
        hyperparameters: Per optimizer, per param group, every entry but ``params``.
        schedulers: Each LR scheduler's ``state_dict``, in ``trainer.lr_scheduler_configs`` order.
    """

    hyperparameters: list[list[dict[str, Any]]]
    schedulers: list[dict[str, Any]]


def configured_optimizers(trainer: Any) -> ConfiguredOptimizers:
    """A copy of the optimizers' hyperparameters and the LR schedulers' states as ``configure_optimizers`` built
    them."""
    hyperparameters = [
        [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
        for optimizer in trainer.optimizers
    ]
    schedulers = [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs]
    return copy.deepcopy(ConfiguredOptimizers(hyperparameters, schedulers))


def changes_module_settings(changes: Iterable[str]) -> bool:
    """Whether the allowed changes of a resume include a setting of the module (``model.*``), which
    ``configure_optimizers`` may read."""
    return any(key.startswith(_MODULE_GROUP) for key in changes)


def reapply_configured_optimizers(trainer: Any, configured: ConfiguredOptimizers) -> None:
    """Puts ``configured``'s hyperparameters back into the restored optimizers, then brings each LR scheduler to its
    restored position under them (see the module's docstring)."""
    configs = list(trainer.lr_scheduler_configs)
    positions = [config.scheduler.last_epoch for config in configs if not _is_plateau(config.scheduler)]
    for optimizer, groups in zip(trainer.optimizers, configured.hyperparameters):
        for group, hyper in zip(optimizer.param_groups, groups):
            group.update(copy.deepcopy(hyper))
    replayed = iter(positions)
    for config, state in zip(configs, configured.schedulers):
        scheduler = config.scheduler
        if _is_plateau(scheduler):
            continue
        position = next(replayed)
        scheduler.load_state_dict(copy.deepcopy(state))
        with warnings.catch_warnings():
            # "lr_scheduler.step() before optimizer.step()": the steps replay a schedule the optimizer already took.
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(position - scheduler.last_epoch):
                scheduler.step()


def _is_plateau(scheduler: Any) -> bool:
    return isinstance(scheduler, ReduceLROnPlateau)


__all__ = [
    "ConfiguredOptimizers",
    "changes_module_settings",
    "configured_optimizers",
    "reapply_configured_optimizers",
]
