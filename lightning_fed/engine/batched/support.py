"""What batched clients need besides the training loop: whether a fit can be vectorised at all, the ``"auto"`` group
size, the vmapped ``training_step`` and the per-client log sums."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor, nn

from lightning_fed.engine.batched.convolution import per_client_convolutions
from lightning_fed.engine.dispatch import STEP_HOOKS
from lightning_fed.engine.log_buffer import routed_logging
from lightning_fed.engine.training_step import (
    _BATCH_HOOKS,
    _TRANSFER_HOOKS,
    accumulation_of,
    call_step,
    isolated_pass,
    loss_of,
)
from lightning_fed.functional.federated_state import federated_state
from lightning_fed.functional.stacked_optim import unsupported_optimizer
from lightning_fed.hooks import FedCallback
from lightning_fed.utilities.seeding import derive_seed

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

# Stacked parameters of a group on a CPU: on a 2-core machine (2026-11-28, docs/scaling.md) 2NN groups of 21 (17 MB)
# gain 1.10-1.11x over sequential, groups of 8 gain nothing (the group's per-step overhead) and larger ones lose the
# cache (groups of 50: 1.21x at 100 clients, 1.08x at 1 000; of 100: slower than sequential).
CPU_GROUP_BYTES = 16 * 2**20
# On a GPU: the share of free memory a group may fill, and how many model-sized tensors a client costs there
# (parameters, gradients, two optimizer slots, the gathered copies of a ragged step) before activations.
GPU_MEMORY_SHARE = 0.25
GPU_COPIES_PER_CLIENT = 8
GPU_MAX_GROUP = 1024
_PER_CLIENT_HOOKS = ("on_client_start", "on_client_train_start", "client_loss", "on_client_end", *STEP_HOOKS)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


class TrainingStep(nn.Module):
    """Runs ``module.training_step`` under ``torch.func.functional_call``, with ``self.log`` routed to ``log``."""

    def __init__(self, module: LightningModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any, batch_idx: int) -> Any:
        return call_step(self.module.training_step, batch, batch_idx)

    def run(self, params: Mapping[str, Tensor], batch: Any, batch_idx: int, log: Callable[..., None]) -> Any:
        def log_dict(values: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
            for name, value in values.items():
                log(name, value, *args, **kwargs)

        with routed_logging(self.module, log, log_dict):
            # Only the stacked federated part is substituted; every other tensor (the frozen base) is the module's
            # own, unstacked, so that vmap broadcasts one copy of it to every client of the group.
            named = {f"module.{name}": tensor for name, tensor in params.items()}
            return torch.func.functional_call(self, named, (batch, batch_idx))


class GroupLogBuffer:
    """Each client's sums of what it logged, weighted by batch size, as
    :class:`~lightning_fed.engine.log_buffer.LogBuffer` keeps them for a client that trains alone (tensor values are
    summed in float32, in the same order)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        self.device = device
        self._sums: dict[str, Tensor] = {}
        self._weights: dict[str, list[float]] = {}
        self._means: list[dict[str, float]] | None = None

    def add(self, members: list[int], names: list[str], values: list[Tensor], weights: list[float]) -> None:
        """Adds one step's logged values; ``values[k]`` holds ``names[k]`` for every member."""
        for name, value, weight in zip(names, values, weights):
            self._add(members, name, value * weight, weight)

    def add_one(self, member: int, name: str, value: Any, weight: float) -> None:
        """Adds a value that one client logged (a penalty's, from a per-step hook)."""
        tensor = value.detach().float().mean() if isinstance(value, Tensor) else torch.tensor(float(value))
        self._add([member], name, (tensor * weight).reshape(1).to(self.device), weight)

    def _add(self, members: list[int], name: str, weighted: Tensor, weight: float) -> None:
        if name not in self._sums:
            self._sums[name] = torch.zeros(self.size, device=self.device)
            self._weights[name] = [0.0] * self.size
        if len(members) == self.size:
            self._sums[name].add_(weighted)
        else:
            self._sums[name].index_add_(0, torch.tensor(members, device=self.device), weighted)
        for member in members:
            self._weights[name][member] += weight

    def compute(self, member: int) -> dict[str, float]:
        """The means of what client ``member`` logged."""
        if self._means is None:
            totals = {name: sums.tolist() for name, sums in self._sums.items()}
            self._means = [
                {n: totals[n][i] / w[i] for n, w in self._weights.items() if w[i] > 0} for i in range(self.size)
            ]
        return self._means[member]


def stack_batches(batches: Sequence[Any]) -> Any:
    """Stacks the clients' batches (same nesting and shapes) along a new dimension 0."""
    first = batches[0]
    if isinstance(first, Tensor):
        return torch.stack(list(batches))
    if isinstance(first, Mapping):
        return {key: stack_batches([b[key] for b in batches]) for key in first}
    if isinstance(first, (list, tuple)):
        stacked = [stack_batches([b[i] for b in batches]) for i in range(len(first))]
        return type(first)(stacked) if isinstance(first, list) else tuple(stacked)
    return first


def auto_group_size(module: LightningModule, device: torch.device, federated: Sequence[str] | None = None) -> int:
    """The ``"auto"`` group size: on a CPU, as many clients as keep the stacked parameters cache-sized, and 1 for
    convolutional models; on a GPU, as many as fit in a share of the free memory, at most ``GPU_MAX_GROUP``. A client
    costs its federated part (``federated``: those ``state_dict`` keys; ``None``: the whole state): the frozen base
    is shared by the group, unstacked.

    Convolutional models stay sequential on a CPU because a group is slower there even with each client's
    convolutions run as its own (:mod:`~lightning_fed.engine.batched.convolution`): the convolutions dominate the
    step and gain nothing from the group. Even bare, with no framework, stacked clients' LeNet-5 steps are slower
    than the clients' own on a CPU in both layouts that could batch them (``benchmarks/batched_ceiling.py``,
    2026-11-28, quiet: the clients folded into the channels with a block-diagonal weight 0.89× at best, im2col with
    a batched product 0.52× at best)."""
    state = module.state_dict()
    names = list(state) if federated is None else federated
    per_client = sum(state[n].numel() * state[n].element_size() for n in names) or 1
    if device.type != "cuda":
        if any(isinstance(m, _CONVOLUTIONS) for m in module.modules()):
            return 1
        return max(1, CPU_GROUP_BYTES // per_client)
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(GPU_MAX_GROUP, int(GPU_MEMORY_SHARE * free) // (GPU_COPIES_PER_CLIENT * per_client)))


def unbatchable_reason(
    trainer: FederatedTrainerView, module: LightningModule, step_module: TrainingStep, client_id: int
) -> str | None:
    """Why this fit cannot train clients side by side, or ``None`` when it can.

    The settings, the optimizer, the module's layers and hooks and every callback are checked first; then one
    vmapped ``training_step`` and backward run on a batch of ``client_id`` (in an isolated pass: no RNG draw, log
    or metric state of the run changes), which catches ``.item()``, data-dependent control flow and other
    operations ``torch.func.vmap`` refuses.
    """
    reason = _settings_reason(trainer, module) or _callback_reason(trainer)
    return reason if reason is not None else _trial_reason(trainer, module, step_module, client_id)


def _settings_reason(trainer: FederatedTrainerView, module: LightningModule) -> str | None:
    if not module.automatic_optimization:
        return "the module uses manual optimization"
    if len(trainer.optimizers) != 1:
        return f"the module has {len(trainer.optimizers)} optimizers; batched clients step exactly one"
    optimizer_reason = unsupported_optimizer(trainer.optimizers[0])
    if optimizer_reason is not None:
        return optimizer_reason
    if any(config.interval == "step" for config in module.trainer.lr_scheduler_configs):
        return "an LR scheduler has interval='step' (each client follows its own per-step schedule)"
    if trainer.keep_optimizer_state:
        return "keep_optimizer_state=True (each client's kept optimizer state is not stacked)"
    if accumulation_of(trainer) > 1:
        return "accumulate_grad_batches > 1"
    if trainer.gradient_clip_val:
        return "gradient clipping (gradient_clip_val) is set"
    if getattr(trainer.strategy.precision_plugin, "scaler", None) is not None:
        return "fp16 loss scaling (precision='16-mixed')"
    for name, layer in module.named_modules():
        if isinstance(layer, _BATCH_NORMS) and layer.track_running_stats:
            return f"BatchNorm layer {name!r} updates running statistics in train mode, shared by every client"
    for hook in (*_BATCH_HOOKS, *_TRANSFER_HOOKS):
        if is_overridden(hook, module, LightningModule):
            return f"the module overrides `{hook}`, which expects one client's model"
    return None


def _callback_reason(trainer: FederatedTrainerView) -> str | None:
    for callback in trainer.callbacks:
        name = type(callback).__name__
        if isinstance(callback, FedCallback):
            hooks = [h for h in _PER_CLIENT_HOOKS if is_overridden(h, callback, FedCallback)]
            if hooks and not callback.supports_batched_clients:
                return f"callback {name} has no batched form (it overrides `{hooks[0]}`)"
            if "client_loss" in hooks:
                return f"callback {name} adds a `client_loss` term, which has no batched form"
        for hook in _BATCH_HOOKS:
            if is_overridden(hook, callback, Callback) and not _idle_checkpoint_hook(callback, hook):
                return f"callback {name} overrides `{hook}`, which expects one client's model"
    return None


def _idle_checkpoint_hook(callback: Callback, hook: str) -> bool:
    """Whether ``hook`` is a ModelCheckpoint's per-batch save that is switched off (saving per round only)."""
    return (
        isinstance(callback, ModelCheckpoint)
        and hook == "on_train_batch_end"
        and callback._every_n_train_steps < 1
        and callback._train_time_interval is None
    )


def _trial_reason(
    trainer: FederatedTrainerView, module: LightningModule, step_module: TrainingStep, client_id: int
) -> str | None:
    def discard(*args: Any, **kwargs: Any) -> None:
        return None

    def one_client(client_params: dict[str, Tensor], client_batch: Any) -> Tensor:
        loss = loss_of(step_module.run(client_params, client_batch, 0, discard))
        return loss if loss is not None else torch.zeros(())

    was_training = module.training
    module.train()
    try:
        # The trial leaves no trace: its loader draws, dropout masks, logs and metric updates are all undone.
        with isolated_pass(module), torch.enable_grad(), trainer.strategy.precision_plugin.train_step_context():
            seed = derive_seed(trainer.federation_state.seed, "batched-trial", client_id)
            batch = next(iter(trainer.datamodule.client_dataloader(client_id, seed=seed)), None)
            if batch is None:
                return None
            batch = stack_batches([batch, batch])
            if trainer.strategy.root_device.type != "cpu":
                batch = trainer.strategy.batch_to_device(batch)
            # As the group trains: the federated part stacked, the frozen base left in the module, unstacked.
            federated = federated_state(module, trainer.federated_keys)
            params = {n: torch.stack([t.detach(), t.detach()]) for n, t in federated.items()}
            leaves = [params[n].requires_grad_(True) for n, p in module.named_parameters() if p.requires_grad]
            with per_client_convolutions(trainer.strategy.root_device.type == "cpu"):
                loss = torch.func.vmap(one_client, randomness="different")(params, batch)
            if loss.requires_grad:
                torch.autograd.grad(loss.sum(), leaves, allow_unused=True)
    # Any failure to vectorise, whatever its type, means: train one client at a time.
    except Exception as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"training_step cannot be vectorised with torch.func.vmap ({type(error).__name__}: {first_line})"
    finally:
        module.train(was_training)
    return None


__all__ = ["GroupLogBuffer", "TrainingStep", "auto_group_size", "stack_batches", "unbatchable_reason"]
