"""Checks of the user's module against what the client loop and the fit's algorithms support: how it is defined,
which package it is built on, its optimizers and LR schedulers, manual optimisation and loss scaling; errors that
name the setting to change. Run before a fit writes anything and again when its rounds start."""

from __future__ import annotations

import random
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.core.optimizer import (
    _configure_optimizers,
    _configure_schedulers_automatic_opt,
    _configure_schedulers_manual_opt,
    _MockOptimizer,
)
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch.optim import Optimizer

from lightning_fed.aggregation import Aggregator
from lightning_fed.callbacks.warmup import SharedDataWarmup
from lightning_fed.callbacks.weight_divergence import WeightDivergence
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.functional.federated_state import federated_keys
from lightning_fed.hooks import FedCallback

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer


def check_loss_scaling(trainer: FederatedTrainer, name: str = "precision") -> None:
    """fp16 loss scaling skips optimizer steps, which the callbacks that set ``supports_loss_scaling = False``
    cannot tolerate."""
    precision = trainer.strategy.precision_plugin
    if getattr(precision, "scaler", None) is not None:
        refusing = [
            type(cb).__name__ for cb in trainer.callbacks if getattr(cb, "supports_loss_scaling", True) is False
        ]
        if refusing:
            raise InvalidArgumentError(
                name,
                getattr(precision, "precision", "16-mixed"),
                f"'bf16-mixed' or '32-true': fp16 loss scaling can skip optimizer steps, which breaks {refusing}",
            )


def check_module_definition(module: LightningModule, name: str = "model") -> None:
    """The module defines ``configure_optimizers``: every client's training steps the optimizer it returns."""
    if isinstance(module, LightningModule) and not is_overridden("configure_optimizers", module, LightningModule):
        raise InvalidArgumentError(
            name,
            type(module).__name__,
            "a LightningModule that defines `configure_optimizers` (every client trains with the optimizer it returns)",
        )


def check_lightning_package(model: Any, name: str = "model") -> None:
    """A module (or module class) built on the ``pytorch_lightning`` package rather than ``lightning.pytorch``.

    Both packages ship the same classes, but they are distinct types: Lightning's trainer refuses the other
    package's module with "model must be a LightningModule", which does not say why.
    """
    cls = model if isinstance(model, type) else type(model)
    if model is None or issubclass(cls, LightningModule):
        return
    if any(base.__module__.partition(".")[0] == "pytorch_lightning" for base in cls.__mro__):
        raise TypeError(
            f"`{name}` {cls.__name__} (in {cls.__module__}) is a LightningModule of the `pytorch_lightning` package;"
            " lightning_fed is built on `lightning.pytorch`: change its import to `import lightning.pytorch as pl`"
            " (or `from lightning.pytorch import LightningModule`)."
        )


def check_federated_part(trainer: FederatedTrainer, module: LightningModule) -> None:
    """The module's federated part is well declared (:func:`~lightning_fed.functional.federated_state.federated_keys`:
    every pattern matches, every trainable parameter is federated, the part is not empty); refused in one line
    before the run writes anything."""
    federated_keys(module, trainer.federated_keys)


def check_optimization_setup(
    trainer: FederatedTrainer, module: LightningModule, datamodule: LightningDataModule | None = None
) -> None:
    """What the client loop supports of the module's optimisation: automatic optimisation of one optimizer, or
    manual optimisation where the fit's algorithms allow it (:func:`manual_optimization_refusal`); LR schedulers
    with an integer ``frequency`` >= 1, stepped per round (``interval='epoch'``) or per client step
    (``interval='step'``, but not a plateau scheduler, which needs a metric after every step); and a plateau
    scheduler that monitors a metric the run can log (not a validation metric when no validation runs).

    The CLI runs it before anything is written, and the round loop when the rounds start. Before the fit,
    ``configure_optimizers`` is called here on the module with the run's random state, warnings and the module's
    trainer restored afterwards (Lightning calls it again at fit); a ``configure_optimizers`` that needs the fit
    itself (``self.trainer.estimated_stepping_batches``) is then left to the check when the rounds start.

    Args:
        trainer: The federated trainer.
        module: The module, set up by the fit (the trainer's optimizers are read) or not yet (they are built).
        datamodule: The data, when it is not yet attached to ``trainer`` (before the fit).
    """
    if not isinstance(module, LightningModule):
        return  # Lightning's fit refuses it, and `check_lightning_package` says why for a `pytorch_lightning` one
    optimization = _optimization_of(trainer, module)
    num_optimizers = None if optimization is None else len(optimization[0])
    refusal = manual_optimization_refusal(trainer, module, num_optimizers)
    if refusal is not None:
        raise ValueError(refusal)
    if optimization is None:
        return
    optimizers, configs = optimization
    if module.automatic_optimization and len(optimizers) != 1:
        raise ValueError(
            f"`configure_optimizers` returned {len(optimizers)} optimizers; automatic optimisation steps"
            " exactly one (step several in `training_step` with `automatic_optimization = False`)."
        )
    for config in configs:
        scheduler = type(config.scheduler).__name__
        if module.automatic_optimization and config.interval == "step" and config.reduce_on_plateau:
            raise ValueError(
                f"LR scheduler {scheduler} with `interval='step'` needs a monitored metric after every client step:"
                " return it with `interval='epoch'` (stepped once per round, after validation)."
            )
        frequency = config.frequency
        if not isinstance(frequency, int) or isinstance(frequency, bool) or frequency < 1:
            raise ValueError(
                f"LR scheduler {scheduler} has `frequency={frequency!r}`; it steps every `frequency` rounds (or"
                " steps): return it with an integer `frequency` >= 1."
            )
        if config.reduce_on_plateau and config.strict and config.monitor is not None:
            reason = _no_validation_reason(trainer, module, datamodule or trainer.datamodule)
            if config.monitor.lower().startswith("val") and reason is not None:
                raise ValueError(
                    f"LR scheduler {scheduler} monitors {config.monitor!r}, a validation metric, but no validation"
                    f" runs: {reason}. Monitor a metric a round logs (e.g. 'train/loss'), or give the run validation."
                )


def _optimization_of(
    trainer: FederatedTrainer, module: LightningModule
) -> tuple[list[Optimizer], list[LRSchedulerConfig]] | None:
    """The module's optimizers and LR scheduler configs: the trainer's once the fit has set them up, else from a
    call of ``configure_optimizers`` that leaves no trace (``None`` when it needs the fit to run)."""
    if trainer.lightning_module is module:
        return trainer.optimizers, trainer.lr_scheduler_configs
    attached = module._trainer
    rng = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module.trainer = trainer
            output: Any = module.configure_optimizers()
    # Whatever it raises is raised again by Lightning's own call at fit, with its traceback; until then the module
    # cannot be checked.
    except Exception:
        return None
    finally:
        module.trainer = attached
        random.setstate(rng[0])
        np.random.set_state(rng[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimizers, schedulers, monitor = _configure_optimizers(_MockOptimizer() if output is None else output)
        if not module.automatic_optimization:
            return optimizers, _configure_schedulers_manual_opt(schedulers)
        return optimizers, _configure_schedulers_automatic_opt(schedulers, monitor)


def _no_validation_reason(
    trainer: FederatedTrainer, module: LightningModule, datamodule: LightningDataModule | None
) -> str | None:
    """Why Lightning's validation never runs in this fit, or ``None`` when it runs (or that cannot be told)."""
    if not is_overridden("validation_step", module, LightningModule):
        return f"{type(module).__name__} defines no `validation_step`"
    if trainer.limit_val_batches == 0:
        return "`limit_val_batches` is 0"
    if datamodule is None:
        return None
    if not is_overridden("val_dataloader", datamodule, LightningDataModule):
        return f"{type(datamodule).__name__} has no `val_dataloader`"
    try:
        loaders = datamodule.val_dataloader()
    # A datamodule that is not set up yet (a process launched by a cluster): validation is assumed to run.
    except Exception:
        return None
    if loaders is None or isinstance(loaders, (list, tuple)) and not loaders:
        hint = " (set `val_fraction` > 0)" if hasattr(datamodule, "val_fraction") else ""
        return f"the datamodule has no validation data{hint}"
    return None


def check_module_setup(trainer: FederatedTrainer, module: LightningModule) -> None:
    """Checks what the lean client loop and the attached algorithms support, once the module is set up."""
    check_module_definition(module)
    check_optimization_setup(trainer, module)
    check_loss_scaling(trainer)
    num_clients = trainer.datamodule.num_clients
    if num_clients < 1:
        raise ValueError("The datamodule has no clients: check the partitioner's `num_partitions`.")


# What a FedCallback overrides to act inside a client's optimizer step or loss, which manual optimisation leaves to
# the module's own `training_step`.
_IN_STEP_HOOKS = ("client_loss", "on_client_before_optimizer_step", "on_client_after_optimizer_step")


def manual_optimization_refusal(
    trainer: FederatedTrainer, module: LightningModule, num_optimizers: int | None = None
) -> str | None:
    """Why this fit cannot train ``module`` with manual optimisation (``automatic_optimization = False``), in one
    line, or ``None`` when it can (or the module optimises automatically).

    Under manual optimisation the module's ``training_step`` takes its own optimizer steps, so an algorithm that
    acts inside a client's step cannot: a ``client_loss`` term (FedProx, FedCurv, the penalties, rFedAvg) or a
    per-step hook (SCAFFOLD, APFL). Neither can a pass that differentiates or probes ``training_step`` (q-FedAvg's
    loss probe), a central pass with its own optimizer (the shared-data warm-up, the SGD twin), batched clients
    (``client_parallelism`` above 1), fp16 loss scaling, or kept optimizer state for several optimizers. Algorithms
    that act on the updates (FedAvg, the server optimizers, robust rules, DP-FedAvg, ...) need none of these.
    """
    if module.automatic_optimization:
        return None
    prefix = f"{type(module).__name__} uses manual optimisation (`automatic_optimization = False`), which"
    fix = "use automatic optimisation (one optimizer, a loss returned from `training_step`) or drop"
    for callback in trainer.callbacks:
        name = type(callback).__name__
        if isinstance(callback, (SharedDataWarmup, WeightDivergence)):
            return f"{prefix} {name} cannot follow: it trains centrally with an optimizer of its own; {fix} {name}."
        if isinstance(callback, FedCallback):
            hooks = [hook for hook in _IN_STEP_HOOKS if is_overridden(hook, callback, FedCallback)]
            if hooks:
                reason = f"it acts on each training step's loss or optimizer step (`{hooks[0]}`)"
                return f"{prefix} {name} cannot follow: {reason}; {fix} {name}."
    aggregator: Any = trainer.aggregator
    # A wrapper (NormBound) forwards its probe to the rule it wraps: the innermost rule decides.
    while isinstance(getattr(aggregator, "aggregator", None), Aggregator):
        aggregator = aggregator.aggregator
    if is_overridden("probe_client", aggregator, Aggregator):
        name = type(aggregator).__name__
        return f"{prefix} {name} cannot follow: its client probe evaluates `training_step`; {fix} {name}."
    if isinstance(trainer.client_parallelism, int) and trainer.client_parallelism > 1:
        return f"{prefix} batched clients cannot follow: set `client_parallelism: 1`."
    if getattr(trainer.strategy.precision_plugin, "scaler", None) is not None:
        return f"{prefix} fp16 loss scaling does not cover: use precision 'bf16-mixed' or '32-true'."
    if num_optimizers is None:
        num_optimizers = len(trainer.optimizers)
    if trainer.keep_optimizer_state and num_optimizers > 1:
        return f"{prefix} keep_optimizer_state keeps for one optimizer only: set `keep_optimizer_state: false`."
    return None


__all__ = [
    "check_lightning_package",
    "check_loss_scaling",
    "check_module_definition",
    "check_module_setup",
    "check_optimization_setup",
    "manual_optimization_refusal",
]
