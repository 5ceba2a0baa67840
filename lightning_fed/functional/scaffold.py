r"""SCAFFOLD's control-variate arithmetic (option II), on name -> tensor dicts of trainable parameters.

Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
arXiv:1910.06378, Algorithm 1.

Notation: :math:`x` the round's global model, :math:`y` the client's model after :math:`K` local steps of sizes
:math:`\eta_1, \dots, \eta_K` (each :math:`\eta` in the paper), :math:`c` the server control, :math:`c_i` client
:math:`i`'s control, :math:`N` the number of registered clients.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lightning_fed.functional.state_dict import StateDict


def gradient_correction(server_control: Mapping[str, Tensor], client_control: Mapping[str, Tensor]) -> StateDict:
    r"""The term added to the gradient at every local step: :math:`c - c_i`, so the step is
    :math:`y \leftarrow y - \eta\,(g(y) - c_i + c)`."""
    return {name: server_control[name] - client_control[name] for name in server_control}


def client_control_update(
    client_control: Mapping[str, Tensor],
    server_control: Mapping[str, Tensor],
    global_params: Mapping[str, Tensor],
    local_params: Mapping[str, Tensor],
    step_size_sums: Mapping[str, float],
) -> tuple[StateDict, StateDict]:
    r"""Option II: :math:`c_i^+ = c_i - c + \frac{x - y}{\sum_{k=1}^{K} \eta_k}`, and :math:`\Delta c = c_i^+ - c_i`.

    The paper's :math:`K\eta` is the sum of the :math:`K` step sizes at a constant learning rate. When the rate
    changes within local training (a step-interval LR scheduler), :math:`x - y` is the sum of the steps
    :math:`\eta_k\,(g_k - c_i + c)`, so dividing by :math:`\sum_k \eta_k` keeps :math:`c_i^+` the step-size
    weighted mean of the client's gradients, as :math:`K\eta` does at a constant rate.

    Args:
        client_control: :math:`c_i` (the value the client trained with).
        server_control: :math:`c` (the value the client trained with).
        global_params: :math:`x`, the start point of local training.
        local_params: :math:`y`, the model after local training.
        step_size_sums: :math:`\sum_k \eta_k` per parameter name: the learning rates of the parameter's optimizer
            group at each step actually taken, summed (``K * lr`` at a constant rate); each must be > 0.

    Returns:
        ``(c_i_plus, delta_c)`` keyed like ``server_control``.
    """
    new_control: StateDict = {}
    delta: StateDict = {}
    for name, c in server_control.items():
        total = step_size_sums[name]
        if not total > 0:
            raise ValueError(
                f"The step sizes of {name!r} must sum to > 0 to update a control variate (at least one step with a"
                f" positive learning rate), got {total}."
            )
        drift = (global_params[name] - local_params[name]) / total
        delta[name] = drift - c
        new_control[name] = client_control[name] + delta[name]
    return new_control, delta


def server_control_update(
    server_control: Mapping[str, Tensor], delta_sum: Mapping[str, Tensor], num_clients: int
) -> StateDict:
    r""":math:`c \leftarrow c + \frac{1}{N} \sum_{i \in S} \Delta c_i = c + \frac{|S|}{N}\,\mathrm{mean}_S \Delta c_i`.

    Args:
        server_control: :math:`c`.
        delta_sum: :math:`\sum_{i \in S} \Delta c_i` over the round's accepted clients.
        num_clients: :math:`N`, every registered client (not only the sampled ones).
    """
    if num_clients < 1:
        raise ValueError(f"`num_clients` must be >= 1, got {num_clients}.")
    return {name: c + delta_sum[name].to(c.dtype) / num_clients for name, c in server_control.items()}


def zeros_like_state(state: Mapping[str, Tensor]) -> StateDict:
    """Zero controls with the shape and dtype of ``state``, on the CPU."""
    return {name: torch.zeros_like(tensor, device="cpu") for name, tensor in state.items()}


__all__ = ["client_control_update", "gradient_correction", "server_control_update", "zeros_like_state"]
