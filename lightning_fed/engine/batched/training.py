"""Training several clients side by side in one vectorised step (``FederatedTrainer(client_parallelism=...)``).

The clients of a group hold their federated part (:mod:`~lightning_fed.functional.federated_state`: the trainable
parameters and the buffers) stacked along a new dimension 0; the frozen base stays in the module, one copy for the
whole group, so that a group of G clients costs base + G × federated part (many clients' adapters on one foundation
model). Each step runs the user's unchanged ``training_step`` once for the whole group: ``torch.func.vmap`` over
``torch.func.functional_call`` with the stacked federated part, the frozen base unstacked, and the stacked batches,
so a linear layer becomes one batched matrix product instead of one small product per client. The per-client losses
are independent, so the gradient of their sum is every client's own gradient; the optimizer's update is
``torch.optim``'s own arithmetic on the stacked tensors (:mod:`lightning_fed.functional.stacked_optim`).

Clients step in lockstep. A client whose data has run out leaves the group's steps, and clients whose batch has a
different shape (a last, smaller batch), index or step count step separately, so ragged clients train exactly as
they do alone. What cannot be vectorised is found before the first round (:mod:`lightning_fed.engine.batched.support`)
and trains one client at a time instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.pytorch import LightningModule
from torch import Tensor

from lightning_fed.context import ClientContext
from lightning_fed.engine.batched.convolution import per_client_convolutions
from lightning_fed.engine.batched.layout import GradientLayouts
from lightning_fed.engine.batched.support import (
    GroupLogBuffer,
    TrainingStep,
    auto_group_size,
    stack_batches,
    unbatchable_reason,
)
from lightning_fed.engine.dispatch import HookDispatcher
from lightning_fed.engine.log_buffer import batch_size_of
from lightning_fed.engine.step_counter import StepCounter, record_step_sizes
from lightning_fed.engine.training_step import client_batches, loss_of
from lightning_fed.functional.federated_state import federated_keys
from lightning_fed.functional.stacked_optim import StackedHyperparameters, hyperparameters, stacked_step_
from lightning_fed.functional.state_dict import StateDict, finite_rows
from lightning_fed.hooks import ClientGroup, GroupStep

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class ClientGroups:
    """Splits a round's clients into groups and trains a group in one vectorised pass.

    The group size is decided once per fit, at the first round: ``client_parallelism`` (or the ``"auto"`` choice),
    or 1 with one warning saying why when the module, the optimizer, the settings or a callback cannot be
    vectorised (:func:`~lightning_fed.engine.batched.support.unbatchable_reason`).

    Args:
        trainer: The federated trainer.
        module: The user's LightningModule.
        steps: Counts every client's optimizer steps (``trainer.global_step`` and the round's count).
        hooks: Calls the callbacks' hooks (default: a dispatcher of its own over ``trainer.callbacks``).
    """

    def __init__(
        self,
        trainer: FederatedTrainerView,
        module: LightningModule,
        steps: StepCounter,
        hooks: HookDispatcher | None = None,
    ) -> None:
        self.trainer = trainer
        self.module = module
        self.steps = steps
        self.size: int | None = None
        hooks = hooks if hooks is not None else HookDispatcher(trainer, module)
        self.needs_live_model = bool(hooks.overriding("on_client_end"))
        self._before = hooks.overriding("on_client_before_optimizer_step")
        self._after = hooks.overriding("on_client_after_optimizer_step")
        self._step_module = TrainingStep(module)
        self.layouts = GradientLayouts()

    def groups(self, client_ids: Sequence[int]) -> list[list[int]]:
        """``client_ids`` in round order, cut into consecutive groups (single clients train alone)."""
        if not client_ids:
            return []  # decided at the first round this rank trains clients in
        if self.size is None:
            self.size = self._decide_size(client_ids)
        size = max(1, self.size)
        return [list(client_ids[i : i + size]) for i in range(0, len(client_ids), size)]

    def _decide_size(self, client_ids: Sequence[int]) -> int:
        setting = self.trainer.client_parallelism
        if setting == 1:
            return 1
        reason = unbatchable_reason(self.trainer, self.module, self._step_module, client_ids[0])
        if reason is not None:
            warnings.warn(
                f"client_parallelism={setting!r} falls back to training one client at a time: {reason}.",
                UserWarning,
                stacklevel=2,
            )
            return 1
        if setting == "auto":
            federated = federated_keys(self.module, self.trainer.federated_keys)
            return auto_group_size(self.module, self.trainer.strategy.root_device, federated)
        return int(setting)

    def fit_group(
        self, contexts: list[ClientContext], loaders: list[Any]
    ) -> list[tuple[StateDict, dict[str, float], bool]]:
        """Trains the clients of ``contexts`` (each from its ``initial_params``, on its loader) side by side.

        Advances each ``ctx.num_steps`` and ``global_step`` as their sequential training would.

        Returns:
            Per client, in order: its final state (views into the stacked tensors, detached), the means of what
            its ``training_step`` (and the penalties) logged, and whether its state is finite.
        """
        trainer, module = self.trainer, self.module
        module.train()
        run = _GroupRun(self, ClientGroup(contexts))
        streams = [client_batches(loader, trainer.local_epochs, trainer.local_steps, 1) for loader in loaders]
        active = list(range(len(contexts)))
        while active:
            fetched = {i: next(streams[i], None) for i in active}
            active = [i for i in active if fetched[i] is not None]
            steps: dict[Any, list[int]] = {}
            for i in active:
                batch_idx, batch, _ = fetched[i]  # type: ignore[misc]
                key = (contexts[i].num_steps, batch_idx, _signature(batch))
                steps.setdefault(key, []).append(i)
            for (_, batch_idx, _), members in steps.items():
                run.step(members, batch_idx, [fetched[i][1] for i in members])  # type: ignore[index]
        # Per-client states are handed on contiguous, however the training laid the stacked tensors out.
        stacked = {name: t.detach().contiguous() for name, t in run.stacked.items()}
        for name, t in run.stacked.items():
            if stacked[name].data_ptr() != t.data_ptr():
                self.layouts.release(name, t)  # the clients' states are copies: the next group may reuse it
        floats = [t for t in stacked.values() if t.is_floating_point() or t.is_complex()]
        finite = finite_rows(floats, len(contexts))
        return [
            ({name: t[i] for name, t in stacked.items()}, run.logs.compute(i), finite[i]) for i in range(len(contexts))
        ]


class _GroupRun:
    """One group's stacked parameters, optimizer state and logs while it trains."""

    def __init__(self, owner: ClientGroups, group: ClientGroup) -> None:
        self.owner = owner
        self.group = group
        trainer, module = owner.trainer, owner.module
        self.device = trainer.strategy.root_device
        contexts = group.contexts
        names = list(contexts[0].initial_params)
        self.stacked: StateDict = {
            n: owner.layouts.stack(n, [ctx.initial_params[n] for ctx in contexts]) for n in names
        }
        self.optimizer = optimizer = trainer.optimizers[0]
        param_names = {id(p): n for n, p in module.named_parameters() if p.requires_grad}
        self.trainable = [n for n, p in module.named_parameters() if p.requires_grad]
        for name in self.trainable:
            self.stacked[name].requires_grad_(True)
        # Per optimizer group: its settings and the names of its trainable parameters.
        self.param_groups: list[tuple[StackedHyperparameters, list[str]]] = [
            (hyperparameters(g, optimizer), [param_names[id(p)] for p in g["params"] if id(p) in param_names])
            for g in optimizer.param_groups
        ]
        self.optimizer_state: dict[str, dict[str, Tensor]] = {name: {} for name in self.trainable}
        self.logs = GroupLogBuffer(len(contexts), self.device)
        self._precision = trainer.strategy.precision_plugin

    def step(self, members: list[int], batch_idx: int, batches: list[Any]) -> None:
        everyone = len(members) == len(self.group.contexts)
        index = None if everyone else torch.tensor(members, device=self.device)
        params = self.stacked if index is None else self._gather(index)
        batch = stack_batches(batches)
        if self.device.type != "cpu":
            batch = self.owner.trainer.strategy.batch_to_device(batch)
        client_size = batch_size_of(batches[0])
        with torch.enable_grad(), self._precision.train_step_context():
            loss, logged, names, weights = self._forward(params, batch, batch_idx, client_size)
        self.logs.add(members, names, logged, weights)
        if loss is None:
            return  # Lightning's contract: a training_step that returns None skips the step.
        leaves = [params[n] for n in self.trainable]
        found = torch.autograd.grad(loss.sum(), leaves, allow_unused=True)
        grads = {n: g if g is not None else torch.zeros_like(p) for n, p, g in zip(self.trainable, leaves, found)}
        if index is None:
            self.owner.layouts.adopt(self.stacked, grads)
            params = self.stacked
        trainable = {n: params[n] for n in self.trainable}

        def log(position: int, name: str, value: Any) -> None:
            self.logs.add_one(members[position], name, value, client_size)

        step = GroupStep(self.group, members, trainable, grads, log, self.optimizer)
        trainer, module = self.owner.trainer, self.owner.module
        for callback in self.owner._before:
            callback.on_client_before_optimizer_step(trainer, module, step)
        num_steps = self.group.contexts[members[0]].num_steps
        with torch.no_grad():
            for hp, group_names in self.param_groups:
                states = [self._state(n, index) for n in group_names]
                stacked_step_(
                    [trainable[n] for n in group_names], [grads[n] for n in group_names], states, num_steps, hp
                )
                if index is not None:
                    self._scatter_state(group_names, states, index)
            for callback in self.owner._after:
                callback.on_client_after_optimizer_step(trainer, module, step)
            if index is not None:
                for name, value in params.items():
                    self.stacked[name].index_copy_(0, index, value.detach())
        lrs = [hp.lr for hp, _ in self.param_groups]
        for i in members:
            self.group.contexts[i].num_steps += 1
            record_step_sizes(self.group.contexts[i], lrs)
        self.owner.steps.add(len(members))

    def _forward(
        self, params: StateDict, batch: Any, batch_idx: int, default_size: int
    ) -> tuple[Tensor | None, list[Tensor], list[str], list[float]]:
        """Every client's loss and logged values, by one vmap of ``training_step`` over the stacked parameters."""
        names: list[str] = []
        weights: list[float] = []
        skipped = False

        def one_client(client_params: StateDict, client_batch: Any) -> tuple[Tensor, list[Tensor]]:
            nonlocal skipped
            values: list[Tensor] = []
            names.clear()
            weights.clear()

            def log(name: str, value: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> None:
                if not isinstance(value, (Tensor, int, float)):
                    raise TypeError(f"batched clients log tensors and numbers only, not {type(value).__name__}")
                names.append(name)
                weights.append(float(batch_size if batch_size is not None else default_size))
                tensor = value if isinstance(value, Tensor) else torch.tensor(float(value), device=self.device)
                values.append(tensor.detach().float().mean())

            output = self.owner._step_module.run(client_params, client_batch, batch_idx, log)
            loss = loss_of(output)
            if loss is None:
                skipped = True
                loss = torch.zeros((), device=self.device)
            return loss, values

        # On a CPU each client's convolutions run as its own (convolution.py): grouped ones gain nothing there.
        with per_client_convolutions(self.device.type == "cpu"):
            loss, logged = torch.func.vmap(one_client, randomness="different")(params, batch)
        return (None if skipped else loss), logged, list(names), list(weights)

    def _gather(self, index: Tensor) -> StateDict:
        with torch.no_grad():
            params = {n: t.index_select(0, index) for n, t in self.stacked.items()}
        for name in self.trainable:
            params[name].requires_grad_(True)
        return params

    def _state(self, name: str, index: Tensor | None) -> dict[str, Tensor]:
        state = self.optimizer_state[name]
        return state if index is None else {k: v.index_select(0, index) for k, v in state.items()}

    def _scatter_state(self, names: list[str], states: list[dict[str, Tensor]], index: Tensor) -> None:
        for name, sub in zip(names, states):
            full = self.optimizer_state[name]
            for key, value in sub.items():
                if key not in full:
                    full[key] = torch.zeros((len(self.group.contexts), *value.shape[1:]), dtype=value.dtype,
                                            device=value.device)  # fmt: skip
                full[key].index_copy_(0, index, value)


def _signature(batch: Any) -> tuple[Any, ...]:
    """What must match for batches to stack: the nesting and every tensor's shape and dtype."""
    parts: list[Any] = []
    apply_to_collection(batch, Tensor, lambda t: parts.append((tuple(t.shape), t.dtype)))
    return (type(batch).__name__, *parts)


__all__ = ["ClientGroups"]
