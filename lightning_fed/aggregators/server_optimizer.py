"""The shared machinery of server optimizers: FedAvg's weighted mean, then a stateful step on the parameters."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregators.fedavg import FedAvg
from lightning_fed.checks import check_real
from lightning_fed.functional.server_optim import adaptive_step, first_moment
from lightning_fed.functional.state_dict import StateDict


class ServerOptimizer(FedAvg):
    r"""FedAvg whose server step on the trainable parameters is an optimizer with state that outlives the round.

    Reddi et al., "Adaptive Federated Optimization", ICLR 2021, arXiv:2003.00295 (FedOpt, Algorithm 1): the
    server treats the pseudo-gradient :math:`\Delta_t = \sum_k p_k w_k - w_t` as a (negated) gradient and steps
    :math:`w_{t+1} = w_t + \text{step}(\Delta_t)`. Everything before the step is FedAvg's: the weights
    :math:`p_k` (``weighting``), rejected clients left out, the reduction over ranks, integer buffers copied, and
    float buffers (BatchNorm statistics) and frozen parameters set to the plain weighted mean, never stepped.

    Subclasses name their per-parameter buffers in :attr:`buffer_names`, give their starting value in
    :meth:`initial_buffer` and implement :meth:`step_parameter`. The buffers and the count of server steps are
    kept in float64 in ``state_dict``, so a resumed run is bit-identical. A round with no accepted client leaves
    the model and the state as they were.
    """

    # The optimizer's buffers and step count stay at the server: clients train from the global model alone.
    broadcast_keys = ()

    buffer_names: tuple[str, ...] = ()
    #: The constructor arguments ``repr`` shows, in order; each is an attribute of the same name.
    repr_arguments: tuple[str, ...] = ("server_lr", "weighting")

    def __init__(self, weighting: Literal["num_samples", "uniform"], server_lr: float) -> None:
        super().__init__(weighting=weighting, server_lr=server_lr)
        self.buffers: dict[str, StateDict] = {kind: {} for kind in self.buffer_names}
        self.num_steps = 0

    @override
    def __repr__(self) -> str:
        arguments = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.repr_arguments)
        return f"{type(self).__name__}({arguments})"

    @property
    @override
    def steps_parameters(self) -> bool:
        return True

    def initial_buffer(self, kind: str, like: Tensor) -> Tensor:
        """The value of buffer ``kind`` before the first step (zeros unless a subclass says otherwise)."""
        return torch.zeros_like(like)

    @abstractmethod
    def step_parameter(self, buffers: dict[str, Tensor], delta: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """One parameter's step: ``(new buffers, what is added to the parameter)`` from its buffers and its Δ."""

    @override
    def server_step(self, pseudo_gradient: StateDict) -> StateDict:
        steps: StateDict = {}
        for name, delta in pseudo_gradient.items():
            old = {kind: self._buffer(kind, name, delta) for kind in self.buffer_names}
            new, steps[name] = self.step_parameter(old, delta)
            for kind, value in new.items():
                self.buffers[kind][name] = value
        self.num_steps += 1
        return steps

    def _buffer(self, kind: str, name: str, delta: Tensor) -> Tensor:
        buffer = self.buffers[kind].get(name)
        if buffer is None:
            return self.initial_buffer(kind, delta)
        return buffer.to(delta.device)

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"num_steps": self.num_steps}
        for kind, values in self.buffers.items():
            state[kind] = {name: tensor.detach().clone() for name, tensor in values.items()}
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.num_steps = int(state_dict["num_steps"])
        self.buffers = {kind: {n: t.clone() for n, t in state_dict[kind].items()} for kind in self.buffer_names}


class AdaptiveServerOptimizer(ServerOptimizer):
    r"""Algorithm 2 of Reddi et al. (ICLR 2021, arXiv:2003.00295): FedAdagrad, FedAdam and FedYogi.

    .. math::
        m_t = \beta_1 m_{t-1} + (1 - \beta_1) \Delta_t, \qquad v_t = \text{rule}(v_{t-1}, \Delta_t), \qquad
        w_{t+1} = w_t + \eta \frac{m_t}{\sqrt{v_t} + \tau}

    elementwise, from :math:`m_{-1} = 0` and :math:`v_{-1} = \tau^2` (the paper asks :math:`v_{-1} \ge \tau^2`
    and uses the bound; no bias correction, as in the paper). Subclasses give the rule in :meth:`second_moment`.

    Args:
        server_lr: :math:`\eta` > 0.
        beta1: :math:`\beta_1` in [0, 1).
        tau: :math:`\tau` > 0, the adaptivity: how small :math:`\sqrt{v_t}` may get relative to the step.
        weighting: FedAvg's weights :math:`p_k` of the pseudo-gradient.
    """

    buffer_names = ("m", "v")

    def __init__(
        self, server_lr: float, beta1: float, tau: float, weighting: Literal["num_samples", "uniform"]
    ) -> None:
        super().__init__(weighting=weighting, server_lr=server_lr)
        self.beta1 = check_real("beta1", beta1, minimum=0.0, maximum=1.0, exclusive_maximum=True)
        self.tau = check_real("tau", tau, minimum=0.0, exclusive_minimum=True)

    @override
    def initial_buffer(self, kind: str, like: Tensor) -> Tensor:
        return torch.full_like(like, self.tau**2) if kind == "v" else torch.zeros_like(like)

    @abstractmethod
    def second_moment(self, v: Tensor, delta: Tensor) -> Tensor:
        """:math:`v_t` from :math:`v_{t-1}` and :math:`\\Delta_t`."""

    @override
    def step_parameter(self, buffers: dict[str, Tensor], delta: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        m = first_moment(buffers["m"], delta, self.beta1)
        v = self.second_moment(buffers["v"], delta)
        return {"m": m, "v": v}, adaptive_step(m, v, self.server_lr, self.tau)


__all__ = ["AdaptiveServerOptimizer", "ServerOptimizer"]
