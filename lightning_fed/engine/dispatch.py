"""The one way the engine calls hooks: federated hooks on the callbacks, Lightning's batch hooks on callbacks and
module, each only where it is overridden (as Lightning's ``_call_callback_hooks`` calls its callbacks)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_fed.hooks import FedCallback

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class HookDispatcher:
    """Calls a hook on every callback (and, for Lightning's hooks, the module) that overrides it, in callback order.

    Which objects override a hook is looked up once per hook and kept: dispatching every hook to every callback
    costs more than a small model's training step, and the per-step hooks run at every step.

    Args:
        trainer: The federated trainer, passed to every hook.
        module: The user's module, passed to every hook; it receives Lightning's batch hooks itself too.
        callbacks: Who receives hooks; default ``trainer.callbacks``. The aggregator receives none: it speaks through
            ``Aggregator.probe_client`` and ``Aggregator.round_metrics``.
        module_hooks: Whether the module receives Lightning's hooks it overrides.
    """

    def __init__(
        self,
        trainer: FederatedTrainerView,
        module: LightningModule,
        callbacks: Sequence[Callback] | None = None,
        module_hooks: bool = True,
    ) -> None:
        self.trainer = trainer
        self.module = module
        self.callbacks = list(trainer.callbacks if callbacks is None else callbacks)
        self.module_hooks = module_hooks
        self._federated: dict[str, list[Any]] = {}
        self._lightning: dict[str, tuple[list[Callback], bool]] = {}

    def overriding(self, hook: str) -> list[Any]:
        """The callbacks that define federated hook ``hook``, in callback order."""
        found = self._federated.get(hook)
        if found is None:
            found = self._federated[hook] = [cb for cb in self.callbacks if _defines(cb, hook)]
        return found

    def call(self, hook: str, *args: Any) -> list[Any]:
        """Calls federated hook ``hook(trainer, module, *args)`` on every callback that overrides it; returns their
        results in callback order."""
        trainer, module = self.trainer, self.module
        return [getattr(callback, hook)(trainer, module, *args) for callback in self.overriding(hook)]

    def lightning_targets(self, hook: str) -> tuple[list[Callback], bool]:
        """The callbacks that override Lightning hook ``hook``, and whether the module receives it."""
        targets = self._lightning.get(hook)
        if targets is None:
            callbacks = [cb for cb in self.callbacks if is_overridden(hook, cb, Callback)]
            module_overrides = self.module_hooks and is_overridden(hook, self.module, LightningModule)
            targets = self._lightning[hook] = (callbacks, module_overrides)
        return targets

    def call_lightning(self, hook: str, *args: Any) -> list[Any]:
        """Calls Lightning hook ``hook``: ``callback.hook(trainer, module, *args)`` on the callbacks that override
        it, then ``module.hook(*args)`` if the module does; returns their results in that order."""
        callbacks, module_overrides = self.lightning_targets(hook)
        trainer, module = self.trainer, self.module
        results = [getattr(callback, hook)(trainer, module, *args) for callback in callbacks]
        if module_overrides:
            results.append(getattr(module, hook)(*args))
        return results


# The per-step hooks take one GroupStep, for a client alone as for a batched group.
STEP_HOOKS = ("on_client_before_optimizer_step", "on_client_after_optimizer_step")
# Hook names that no longer exist, with the hook that replaced them: an override would silently never run.
_REMOVED_STEP_HOOKS = {
    "on_group_before_optimizer_step": "on_client_before_optimizer_step",
    "on_group_after_optimizer_step": "on_client_after_optimizer_step",
}


def check_step_hooks(callbacks: Iterable[Any]) -> None:
    """Refuses callbacks written against the per-step hooks before they took one
    :class:`~lightning_fed.hooks.GroupStep`.

    Such a callback would otherwise train without its hook (an ``on_group_*`` override is never called) or fail
    at its first step with a bare missing-argument error.

    Raises:
        TypeError: Naming the callback, the hook and the signature to write instead.
    """
    for callback in callbacks:
        name = type(callback).__name__
        for removed, hook in _REMOVED_STEP_HOOKS.items():
            if callable(getattr(callback, removed, None)):
                raise TypeError(
                    f"{name} overrides `{removed}`, which no longer exists: write the step once as"
                    f" `{hook}(self, trainer, pl_module, step: GroupStep)`, where `step.params` / `step.grads` are"
                    " stacked over the clients taking the step (a client training alone is a group of one)."
                )
        if not isinstance(callback, FedCallback):
            continue
        for hook in STEP_HOOKS:
            if is_overridden(hook, callback, FedCallback) and _required_positional(getattr(callback, hook)) > 3:
                raise TypeError(
                    f"{name}.{hook} takes (trainer, pl_module, client_ctx, optimizer), the signature it had before"
                    f" the per-step hooks were unified: write it as `{hook}(self, trainer, pl_module, step:"
                    " GroupStep)`; the context is `step.contexts[i]`, the optimizer `step.optimizer`."
                )


def _required_positional(method: Callable[..., Any]) -> int:
    """How many positional arguments a bound method needs (a ``*args`` catch-all accepts any number: 0)."""
    parameters = inspect.signature(method).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in positional and p.default is inspect.Parameter.empty)


def _defines(callback: Callback, hook: str) -> bool:
    """Whether ``callback`` defines federated hook ``hook``: a :class:`FedCallback` that overrides it, or any other
    callback with a method of that name (plain Lightning callbacks may implement a federated hook without the base)."""
    if isinstance(callback, FedCallback):
        return is_overridden(hook, callback, FedCallback)
    return callable(getattr(callback, hook, None))


__all__ = ["STEP_HOOKS", "HookDispatcher", "check_step_hooks"]
