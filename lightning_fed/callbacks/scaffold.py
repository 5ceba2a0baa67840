"""SCAFFOLD (option II): drift correction with client and server control variates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.optim import Optimizer
from typing_extensions import override

from lightning_fed.aggregators.fedavg import FedAvg
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.functional.scaffold import (
    client_control_update,
    gradient_correction,
    server_control_update,
    zeros_like_state,
)
from lightning_fed.functional.state_dict import StateDict, state_nbytes
from lightning_fed.hooks import FedCallback, GroupStep, federated_trainer
from lightning_fed.parallel.reduction import CrossProcessState

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class Scaffold(FedCallback, CrossProcessState):
    r"""SCAFFOLD with option II control variates.

    Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled Averaging for Federated
    Learning", ICML 2020, arXiv:1910.06378 (Algorithm 1, option II).

    .. math::
        y &\leftarrow y - \eta\,(g_i(y) - c_i + c) \quad \text{(each of the K local steps)} \\
        c_i^+ &= c_i - c + \frac{x - y}{K\eta}, \qquad \Delta y_i = y - x, \qquad \Delta c_i = c_i^+ - c_i \\
        x &\leftarrow x + \eta_g\,\frac{1}{|S|}\sum_{i \in S} \Delta y_i, \qquad
        c \leftarrow c + \frac{1}{N}\sum_{i \in S} \Delta c_i

    How it plugs in:
        * The correction :math:`c - c_i` must act on the weights, never on an optimizer's state. With plain SGD
          (no momentum) it is added to ``param.grad`` in ``on_client_before_optimizer_step`` (after backward and AMP
          unscaling, before clipping), so SGD takes exactly the paper's step in one update. With any other optimizer
          (SGD with momentum, Adam, ...) it is applied to the weights right after the optimizer step,
          :math:`y \leftarrow y - \eta_k\,(c - c_i)` with :math:`\eta_k` the learning rate the parameter's group
          took the step with, as NIID-Bench (Li et al. 2022, arXiv:2102.02079) and NVFlare do. Through ``.grad``
          the correction would pass through the momentum buffer and be amplified by about :math:`1/(1-\beta)`; the
          control error then obeys :math:`e^+ = A(g_i - \bar g) - (A - 1)e` with :math:`A \approx 1/(1-\beta)`,
          which diverges for :math:`\beta \gtrsim 0.5` at every learning rate. The two forms are the same step for
          plain SGD.
        * The server model update is FedAvg with uniform weights and server learning rate :math:`\eta_g`: configure
          it as ``trainer.aggregator: {class_path: lightning_fed.aggregators.FedAvg, init_args: {weighting:
          uniform, server_lr: <eta_g>}}``. The callback checks this at fit start and raises otherwise, so
          :math:`\eta_g` has one source of truth (the paper's default is :math:`\eta_g = 1`).
        * :math:`K\eta` is :math:`\sum_{k=1}^{K} \eta_k` (``ctx.lr_sums``): the learning rate of each parameter's
          optimizer group at each of the optimizer steps actually taken, summed (gradient accumulation counts one
          step per accumulated batch group). At a constant rate it is the paper's :math:`K\eta`; under a
          step-interval LR scheduler (OneCycleLR) the rate changes within local training, and the sum of the step
          sizes the client took keeps :math:`c_i^+` the step-size weighted mean of its gradients. The after-step
          correction uses each step's own rate. fp16 loss scaling can skip steps silently, so it is refused.
        * :math:`x` is the client's start point ``ctx.initial_params`` (the round's global model unless another
          callback personalises it). :math:`N` is ``trainer.datamodule.num_clients``. Rejected (non-finite) clients
          keep their :math:`c_i` and add nothing to :math:`c`. A client that took no step keeps its :math:`c_i` too.
        * With several processes each rank sums the :math:`\Delta c_i` of its own clients; the sum is declared
          round state, which ``on_aggregate`` reduces over ranks (float64) before updating :math:`c`; the
          :math:`c_i` reach every rank through the client store.

    Conventions:
        * Controls cover the trainable parameters (``requires_grad``) only; buffers (BatchNorm statistics) are
          averaged by FedAvg as usual. :math:`c` and :math:`c_i` start at zero, so the first round is FedAvg.
        * :math:`c_i` lives in the client store (CPU, checkpointed) under ``"scaffold"``; :math:`c` in this
          callback's ``state_dict``.
        * Communication: each sampled client receives :math:`c` and sends :math:`\Delta c`, both the size of the
          trainable parameters, which is added to ``comm/bytes_down`` and ``comm/bytes_up`` (2x FedAvg for a
          model without buffers).
        * The paper uses plain SGD, where :math:`(x - y)/(K\eta)` is the client's mean (corrected) gradient. With
          another optimizer :math:`c_i^+` (option II, unchanged) estimates the optimizer's mean update direction per
          unit learning rate instead; the controls stay consistent because the correction is measured in the same
          units. Weight decay is part of :math:`g_i`.
        * Logs ``scaffold/server_control_norm`` (:math:`\lVert c \rVert_2`) each round.
        * A client's :math:`c_i` and correction live in its ``client_ctx.extras["scaffold"]`` while it trains, so
          clients trained side by side (``client_parallelism``) each apply their own, stacked.
    """

    client_state_namespaces = ("scaffold",)  # c_i
    broadcast_keys = ("server_control",)  # c

    supports_loss_scaling = False
    supports_batched_clients = True
    # Each client's control change c_i+ - c_i is summed at the server without noise.
    sends_client_data_to_server = True
    namespace = "scaffold"

    def __init__(self) -> None:
        self._server_control: StateDict = {}
        self._device_control: StateDict = {}
        # Whether the correction goes through .grad (plain SGD) or onto the weights after each step (the rest).
        self._through_grad = True
        # Round state (declared in on_round_start): the sum of the clients' control changes, and their number.
        self._delta_sum: StateDict = {}
        self._num_deltas = 0

    @override
    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        _check_aggregator(trainer.aggregator)

    @override
    def on_fit_start(self, pl_trainer: Trainer, pl_module: LightningModule) -> None:
        trainer = federated_trainer(pl_trainer, self)
        _check_aggregator(trainer.aggregator)
        self._through_grad = is_plain_sgd(trainer.optimizers[0])
        trainable = {name: p for name, p in pl_module.named_parameters() if p.requires_grad}
        if not self._server_control:
            self._server_control = zeros_like_state(trainable)
        elif self._server_control.keys() != trainable.keys():
            raise ValueError(
                "The restored SCAFFOLD server control does not match the module's trainable parameters; resume"
                " with the same model and the same frozen parameters."
            )

    @override
    def on_round_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext
    ) -> None:
        device = next(pl_module.parameters()).device
        self._device_control = {name: c.to(device) for name, c in self._server_control.items()}
        self.add_round_state("_delta_sum", {n: torch.zeros_like(c) for n, c in self._device_control.items()})
        self.add_round_state("_num_deltas", 0)
        extra = len(round_ctx.client_ids) * state_nbytes(self._server_control)
        round_ctx.bytes_down += extra
        round_ctx.bytes_up += extra

    @override
    def on_client_train_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
    ) -> None:
        stored = client_ctx.store.get(self.namespace, client_ctx.client_id)
        server = self._device_control
        if stored is None:
            control = {name: torch.zeros_like(c) for name, c in server.items()}
        else:
            control = {name: stored[name].to(server[name].device) for name in server}
        client_ctx.extras[self.namespace] = _ClientControl(control, gradient_correction(server, control))

    @override
    def on_client_before_optimizer_step(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, step: GroupStep
    ) -> None:
        if not self._through_grad:
            return
        corrections = self._corrections(step)
        for name, grad in step.grads.items():
            grad.add_(step.select(corrections[name]).to(grad.dtype))

    @override
    def on_client_after_optimizer_step(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, step: GroupStep
    ) -> None:
        if self._through_grad:
            return
        corrections = self._corrections(step)
        # Which optimizer group each parameter is in, found once per group; the learning rate is read at every step,
        # the one this step took (a step-interval scheduler moves it after the step).
        groups = step.group.cache.get(_GROUPS_KEY)
        if groups is None:
            groups = step.group.cache[_GROUPS_KEY] = _parameter_groups(pl_module, step.optimizer, corrections)
        lrs = [float(group["lr"]) for group in step.optimizer.param_groups]
        with torch.no_grad():
            for name, param in step.params.items():
                param.sub_(step.select(corrections[name]).to(param.dtype), alpha=lrs[groups[name]])

    def _corrections(self, step: GroupStep) -> StateDict:
        """The group's corrections c - c_i, stacked ``[clients, *shape]`` once per group."""
        return step.group.stacked(self.namespace, lambda ctx: ctx.extras[self.namespace].correction)

    @override
    def on_client_end(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        if client_ctx.num_steps < 1:
            return
        groups = _parameter_groups(pl_module, trainer.optimizers[0], self._device_control)
        step_size_sums = {name: client_ctx.lr_sums[index] for name, index in groups.items()}
        new_control, delta = client_control_update(
            client_ctx.extras[self.namespace].control,
            self._device_control,
            client_ctx.initial_params,
            update.params,
            step_size_sums,
        )
        client_ctx.store.put(self.namespace, client_ctx.client_id, new_control)
        for name, value in delta.items():
            self._delta_sum[name].add_(value)
        self._num_deltas += 1

    @override
    def on_aggregate(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext, new_params: StateDict
    ) -> None:
        if not self._num_deltas:
            return
        delta_sum = {name: value.cpu() for name, value in self._delta_sum.items()}
        self._server_control = server_control_update(self._server_control, delta_sum, trainer.datamodule.num_clients)

    @override
    def on_round_end(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        round_ctx: RoundContext,
        metrics: dict[str, float],
    ) -> None:
        squares = sum(float(c.double().pow(2).sum()) for c in self._server_control.values())
        metrics["scaffold/server_control_norm"] = squares**0.5

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"server_control": dict(self._server_control)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._server_control = {name: c.detach().cpu().clone() for name, c in state_dict["server_control"].items()}

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@dataclass
class _ClientControl:
    """A training client's control variate c_i and its correction c - c_i."""

    control: StateDict
    correction: StateDict


# Where a group's parameter -> optimizer group index is kept (in its cache) for the after-step correction.
_GROUPS_KEY = "scaffold/param_groups"


def _check_aggregator(aggregator: Any) -> None:
    """SCAFFOLD's server step x + eta_g * mean(y_i - x) is FedAvg with uniform weights; eta_g is its server_lr."""
    if not isinstance(aggregator, FedAvg) or aggregator.weighting != "uniform":
        raise InvalidArgumentError(
            "trainer.aggregator",
            aggregator,
            "`lightning_fed.aggregators.FedAvg` with `weighting: uniform` and `server_lr: <eta_g>` (1.0 in the paper)"
            " for SCAFFOLD, whose server step is x + eta_g * mean(y_i - x)",
        )


def is_plain_sgd(optimizer: Optimizer) -> bool:
    """Whether ``optimizer`` is SGD without momentum, whose step carries a ``.grad`` term straight onto the weights."""
    return type(optimizer) is torch.optim.SGD and all(
        not group.get("momentum", 0.0) and not group.get("nesterov", False) for group in optimizer.param_groups
    )


def _parameter_groups(module: LightningModule, optimizer: Optimizer, names: StateDict) -> dict[str, int]:
    """The index of each named parameter's group in ``optimizer.param_groups``; every group must have a positive
    learning rate."""
    group_of = {id(p): index for index, group in enumerate(optimizer.param_groups) for p in group["params"]}
    groups: dict[str, int] = {}
    for name, param in module.named_parameters():
        if name in names:
            index = group_of.get(id(param))
            if index is None or not float(optimizer.param_groups[index]["lr"]) > 0:
                raise ValueError(
                    f"SCAFFOLD needs a positive learning rate for parameter {name!r}: add it to the optimizer with"
                    " `lr > 0`, or freeze it (`requires_grad=False`) before fit."
                )
            groups[name] = index
    return groups


__all__ = ["Scaffold", "is_plain_sgd"]
