r"""q-FedAvg's server arithmetic on name -> tensor dicts.

Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning", ICLR 2020, arXiv:1905.10497,
Algorithm 2 (q-FedAvg), as in the authors' ``qffedavg.py``.

Per accepted client :math:`k` with loss :math:`F_k` at :math:`w_g` and local model :math:`w_k`:

.. math::
    \Delta w_k = L\,(w_g - w_k), \qquad
    \Delta_k = (F_k + \epsilon)^q\, \Delta w_k, \qquad
    h_k = q\,(F_k + \epsilon)^{q-1} \lVert \Delta w_k \rVert_2^2 + L\,(F_k + \epsilon)^q

and the server takes :math:`w_g \leftarrow w_g - \sum_k \Delta_k / \sum_k h_k`. :math:`(F_k+\epsilon)^q` multiplies
the update *outside* the norm (two public implementations put it inside).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import Tensor

from lightning_fed.functional.state_dict import StateDict

EPSILON = 1e-10


def client_terms(
    global_params: Mapping[str, Tensor],
    local_params: Mapping[str, Tensor],
    loss: float,
    q: float,
    lipschitz: float,
    norm_names: Iterable[str],
    eps: float = EPSILON,
) -> tuple[StateDict, float]:
    r"""One client's :math:`\Delta_k` (per entry, float64) and :math:`h_k`.

    Args:
        global_params: :math:`w_g`.
        local_params: :math:`w_k`; :math:`\Delta_k` covers every floating-point entry of it.
        loss: :math:`F_k`, the client's training loss at :math:`w_g`.
        q: The fairness parameter; ``q = 0`` gives the unweighted mean of the :math:`w_k`.
        lipschitz: :math:`L` (the reference uses :math:`1/\eta`).
        norm_names: Entries that enter :math:`\lVert \Delta w_k \rVert^2` (the trainable parameters).
        eps: :math:`\epsilon` added to :math:`F_k`.
    """
    if loss < 0:
        raise ValueError(f"q-FedAvg needs a non-negative loss F_k, got {loss}; use a loss bounded below by 0.")
    weight = (float(loss) + eps) ** q
    deltas: StateDict = {}
    for name, local in local_params.items():
        if local.is_floating_point():
            deltas[name] = (global_params[name].double() - local.double()) * lipschitz
    squared_norm = sum(float(deltas[name].pow(2).sum()) for name in norm_names if name in deltas)
    h = q * (float(loss) + eps) ** (q - 1) * squared_norm + lipschitz * weight
    return {name: delta.mul_(weight) for name, delta in deltas.items()}, h


def apply_step(global_params: Mapping[str, Tensor], delta_sum: Mapping[str, Tensor], h_sum: float) -> StateDict:
    r""":math:`w_g - \sum_k \Delta_k / \sum_k h_k` for the entries of ``delta_sum``; others are left out."""
    if not h_sum > 0:
        raise ValueError(f"The sum of h_k must be positive, got {h_sum}; check `q`, the losses and `lipschitz`.")
    return {
        name: (global_params[name].double() - delta / h_sum).to(global_params[name].dtype)
        for name, delta in delta_sum.items()
    }


__all__ = ["EPSILON", "apply_step", "client_terms"]
