r"""FedCurv's tensor math: diagonal Fisher estimators, the (u, v, w) statistics, their sums and the penalty.

Shoham et al., "Overcoming Forgetting in Federated Learning on Non-IID Data", NeurIPS 2019 Workshop on Federated
Learning for Data Privacy and Confidentiality, arXiv:1910.07796.

Client s minimises :math:`L_s(\theta) + \lambda \sum_{j \ne s} (\theta - \hat\theta_j)^\top \mathrm{diag}(F_j)
(\theta - \hat\theta_j)`. Expanding the quadratic per coordinate with :math:`u_j = F_j`, :math:`v_j = F_j \odot
\hat\theta_j`, :math:`w_j = F_j \odot \hat\theta_j^2` and the server sums :math:`U = \sum_j u_j`, :math:`V = \sum_j
v_j`, :math:`W = \sum_j w_j` gives, exactly,

.. math::
    R_s(\theta) = \lambda \sum \big(\theta^2 (U - u_s) - 2\theta (V - v_s) + (W - w_s)\big), \qquad
    \nabla R_s = 2\lambda \big(\theta \odot (U - u_s) - (V - v_s)\big).

Statistics are ``{"u": {name: tensor}, "v": {...}, "w": {...}}`` dicts keyed by parameter name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from torch import Tensor

from lightning_fed.functional.state_dict import StateDict

Statistics = dict[str, StateDict]
STAT_KEYS = ("u", "v", "w")
# The curvature sums are non-negative; their differences are clamped at 0 so round-off never hands a client
# negative curvature. V - v_s has no sign and is never clamped.
_NON_NEGATIVE = ("u", "w")


def _zeros_like(params: Mapping[str, Tensor]) -> StateDict:
    # float32 accumulators: squared gradients of a bf16/fp16 model would underflow in its own dtype.
    return {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}


def empirical_fisher(
    params: Mapping[str, Tensor], batches: Iterable[tuple[object, int]], loss_fn: Callable[[object], Tensor]
) -> StateDict:
    r"""Per-batch empirical diagonal Fisher :math:`F = \sum_b \frac{n_b}{N} (\nabla_\theta \bar\ell_b)^2`.

    :math:`\bar\ell_b` is ``loss_fn(batch)`` (the module's mean batch loss), :math:`n_b` the batch size and
    :math:`N = \sum_b n_b`: the squared gradient of each batch's mean loss, averaged over batches weighted by their
    size (so a short last batch counts less). It is accumulated over **every** batch (``+=``, not OpenFL's ``=``
    that keeps only the last one). With batch size 1 it equals :func:`per_sample_fisher`; with batch size B it is
    about 1/B of it near a stationary point, which sets λ's scale.

    Args:
        params: The tensors to differentiate (``requires_grad``), keyed by name.
        batches: ``(batch, batch_size)`` pairs; the client's whole training data.
        loss_fn: Maps a batch to the scalar loss at ``params``.

    Returns:
        The diagonal Fisher per name, float32, zeros for parameters the loss does not reach.
    """
    fisher, total = _zeros_like(params), 0
    names, tensors = list(params), list(params.values())
    for batch, size in batches:
        grads = torch.autograd.grad(loss_fn(batch), tensors, allow_unused=True)
        for name, grad in zip(names, grads):
            if grad is not None:
                fisher[name] += size * grad.detach().float().square()
        total += size
    if total == 0:
        raise ValueError("The Fisher needs at least one batch: the client's training loader is empty.")
    return {name: value / total for name, value in fisher.items()}


def per_sample_fisher(
    params: Mapping[str, Tensor], batches: Iterable[object], loss_fn: Callable[[StateDict, object], Tensor]
) -> StateDict:
    r"""Per-sample empirical diagonal Fisher :math:`F = \frac{1}{N} \sum_i (\nabla_\theta \ell_i)^2`.

    Per-sample gradients come from ``torch.func.vmap(torch.func.grad(...))`` over each batch (dimension 0 of
    every tensor in it), so the cost is one vectorised pass per batch.

    Args:
        params: The parameter values, keyed by name (treated as constants; only their values are read).
        batches: The client's whole training data; each batch a pytree of tensors with the samples on dim 0.
        loss_fn: ``loss_fn(params, batch)`` gives the scalar loss of ``batch`` at ``params`` (functionally, e.g.
            through ``torch.func.functional_call``); it is called on batches of one sample.

    Returns:
        The diagonal Fisher per name, float32.
    """

    def sample_loss(p: StateDict, sample: object) -> Tensor:
        return loss_fn(p, apply_to_collection(sample, Tensor, lambda t: t.unsqueeze(0)))

    per_sample_grads = torch.func.vmap(torch.func.grad(sample_loss), in_dims=(None, 0))
    detached = {name: p.detach() for name, p in params.items()}
    fisher, total = _zeros_like(params), 0
    for batch in batches:
        grads = per_sample_grads(detached, batch)
        for name, grad in grads.items():
            fisher[name] += grad.float().square().sum(0)
        total += next(iter(grads.values())).shape[0] if grads else 0
    if total == 0:
        raise ValueError("The Fisher needs at least one batch: the client's training loader is empty.")
    return {name: value / total for name, value in fisher.items()}


def client_statistics(fisher: Mapping[str, Tensor], theta: Mapping[str, Tensor]) -> Statistics:
    """``u = F``, ``v = F ⊙ θ̂``, ``w = F ⊙ θ̂²`` of one client's local model θ̂ (float32)."""
    theta32 = {name: theta[name].detach().float() for name in fisher}
    return {
        "u": {name: f.clone() for name, f in fisher.items()},
        "v": {name: f * theta32[name] for name, f in fisher.items()},
        "w": {name: f * theta32[name].square() for name, f in fisher.items()},
    }


def updated_sums(sums: Statistics | None, new: Statistics, old: Statistics | None = None) -> Statistics:
    """Returns new server sums ``sums + new − old`` (a client's statistics replacing its previous ones).

    The sums are float64 (so replacing statistics round after round does not drift) and built out of place: the
    tensors of ``sums`` are left untouched. They are **sums**, never averages.
    """
    result: Statistics = {}
    for key in STAT_KEYS:
        totals: StateDict = {}
        for name, value in new[key].items():
            base = sums[key][name] if sums is not None else torch.zeros_like(value, dtype=torch.float64)
            total = base + value.double()
            if old is not None:
                total = total - old[key][name].double()
            totals[name] = total
        result[key] = totals
    return result


def excluding_client(sums: Statistics, own: Statistics | None, like: Mapping[str, Tensor]) -> Statistics:
    """``U − u_s``, ``V − v_s``, ``W − w_s`` for client s, out of place, cast to the dtype and device of ``like``.

    ``own`` is ``None`` for a client with no statistics in the sums yet (its first participation): the sums then
    hold only the others', and are used as they are. ``U − u_s`` and ``W − w_s`` are clamped at 0: exact arithmetic
    makes them non-negative, round-off may not.
    """
    result: Statistics = {}
    for key in STAT_KEYS:
        diffs: StateDict = {}
        for name, target in like.items():
            diff = sums[key][name] if own is None else sums[key][name] - own[key][name].double()
            if key in _NON_NEGATIVE:
                diff = diff.clamp_min(0.0)
            diffs[name] = diff.to(device=target.device, dtype=target.dtype)
        result[key] = diffs
    return result


def fedcurv_penalty(params: Mapping[str, Tensor], others: Statistics, lam: float) -> Tensor:
    """``λ Σ (θ²(U−u_s) − 2θ(V−v_s) + (W−w_s))``, differentiable in ``params``; the exact quadratic."""
    total = sum(
        (p.square() * others["u"][n] - 2.0 * p * others["v"][n] + others["w"][n]).sum() for n, p in params.items()
    )
    return lam * total if isinstance(total, Tensor) else torch.zeros(())


def fedcurv_gradient(params: Mapping[str, Tensor], others: Statistics, lam: float) -> StateDict:
    """``2λ(θ ⊙ (U − u_s) − (V − v_s))`` per parameter."""
    return {n: 2.0 * lam * (p.detach() * others["u"][n] - others["v"][n]) for n, p in params.items()}


def statistics_nbytes(stats: Statistics) -> int:
    """Bytes of every tensor of the statistics (what is sent beside the weights)."""
    return sum(t.numel() * t.element_size() for part in stats.values() for t in part.values())


__all__ = [
    "STAT_KEYS",
    "client_statistics",
    "empirical_fisher",
    "excluding_client",
    "fedcurv_gradient",
    "fedcurv_penalty",
    "per_sample_fisher",
    "statistics_nbytes",
    "updated_sums",
]
