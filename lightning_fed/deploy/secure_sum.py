"""Secure aggregation of a deployed round: the declared sums travel masked, everything else in clear.

Under SecAgg+ (Bell, Bonawitz, Gascón, Lepoint and Raykova, 2020, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020, IACR ePrint 2020/704) the server learns only the sum, over the round's
clients, of one vector per client. A round of lightning_fed crosses the wire as each algorithm's declared round state
(:class:`~lightning_fed.parallel.reduction.CrossProcessState`), and a sum is exactly what the server needs of a
``reduce="sum"`` entry (FedAvg's weighted sum and accepted weight, SCAFFOLD's :math:`\\sum_i \\Delta c_i`, DP-FedAvg's
clipped sums). So a site sends its sums as one flat list of float64 arrays (:func:`sum_leaves`) that Flower masks,
and the server rebuilds the round's total from the unmasked sum (:func:`rebuild_sums`) and folds it in once. What is
not a sum (the integer buffers a round copies from its last client, a ``"last"``) travels in clear, as do the clients'
metrics, their rejection and step counts.

Masking works on integers: each value :math:`x` is clipped to :math:`[-c, c]` and mapped to
:math:`\\lfloor (x + c) \\, 2^b / 2c \\rceil` with stochastic rounding (:math:`b = 22` by default), so the sum over
:math:`K` clients is exact up to :math:`K \\cdot 2c / 2^b` per coordinate (:func:`quantisation_bound`). Clipping would
change a sum silently: a site whose sums leave :math:`[-c, c]` rejects its own update instead
(:func:`out_of_range`), and the server counts it as rejected, as it would a non-finite update.

Only algorithms whose round state is all sums (``round_state_is_sum``) can run this way:
:func:`check_secure_aggregation` refuses the others (robust rules read every update, FedAMP and rFedAvg every
client's model, q-FedAvg every client's loss) before anything runs, and sums that the fixed point cannot hold
(``sums_fit_fixed_point``): FedCurv's Fisher statistics span about seven decades, and most of their entries fall below
one grid step (measured: 27 % of U's, 59 % of V's, 93 % of W's entries after 5 rounds of a small CNN).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lightning_fed.deploy.algorithms import algorithm_objects
from lightning_fed.hooks import FederatedTrainerView
from lightning_fed.parallel.reduction import CrossProcessState

RoundState = dict[str, dict[str, Any]]


def split_round_state(objects: Mapping[str, CrossProcessState]) -> tuple[RoundState, RoundState]:
    """Each algorithm object's declared round state as it stands, by algorithm key and name, split in two: the sums
    (what travels masked) and the rest (what travels in clear)."""
    sums: RoundState = {}
    clear: RoundState = {}
    for key, obj in objects.items():
        reductions, values = obj.round_state_reductions(), obj.round_state()
        sums[key] = {name: values[name] for name, reduce in reductions.items() if reduce == "sum"}
        clear[key] = {name: values[name] for name, reduce in reductions.items() if reduce != "sum"}
    return sums, clear


def sum_leaves(sums: RoundState) -> list[Tensor]:
    """The sums as one list of flat (1-d) float64 CPU tensors, a number as one element, in an order both sides agree
    on: algorithm keys and names as declared, the keys of a nested mapping (a state dict) sorted. Flat, because
    Flower's SecAgg+ arithmetic turns a 0-d array into a scalar and then loses the offset it adds to it."""
    leaves: list[Tensor] = []
    for per_object in sums.values():
        for value in per_object.values():
            _flatten(value, leaves)
    return leaves


def _flatten(value: Any, leaves: list[Tensor]) -> None:
    if isinstance(value, Tensor):
        leaves.append(value.detach().to(device="cpu", dtype=torch.float64).reshape(-1))
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            _flatten(value[key], leaves)
    else:
        leaves.append(torch.tensor([float(value)], dtype=torch.float64))


def rebuild_sums(template: RoundState, leaves: list[Tensor]) -> RoundState:
    """The sums of ``template``'s structure holding ``leaves`` (:func:`sum_leaves`'s order): tensors take the
    template's dtype and device, integer counts are rounded to the nearest integer (the quantisation error is far
    below one half), other numbers are floats.

    Raises:
        ValueError: If ``leaves`` does not fit the template (another model or algorithm at the sites).
    """
    position = iter(leaves)
    try:
        rebuilt = {key: {name: _unflatten(v, position) for name, v in sums.items()} for key, sums in template.items()}
    except (StopIteration, RuntimeError) as error:
        raise ValueError(
            f"The securely summed round state does not fit the server's declared sums ({error})."
        ) from None
    if next(position, None) is not None:
        raise ValueError("The securely summed round state holds more arrays than the server's declared sums.")
    return rebuilt


def _unflatten(template: Any, leaves: Any) -> Any:
    if isinstance(template, Tensor):
        leaf = next(leaves)
        if leaf.numel() != template.numel():
            raise RuntimeError(f"an array of {leaf.numel()} entries where {tuple(template.shape)} was declared")
        return leaf.reshape(template.shape).to(device=template.device, dtype=template.dtype)
    if isinstance(template, Mapping):
        return {key: _unflatten(template[key], leaves) for key in sorted(template, key=str)}
    total = float(next(leaves).item())
    return round(total) if isinstance(template, numbers.Integral) else total


def out_of_range(sums: RoundState, clipping_range: float) -> str | None:
    """The first sum with an entry outside ``[-clipping_range, clipping_range]`` (or not finite), described in
    words; ``None`` when every entry fits."""
    for key, per_object in sums.items():
        for name, value in per_object.items():
            leaves: list[Tensor] = []
            _flatten(value, leaves)
            largest = max((float(leaf.abs().max()) for leaf in leaves if leaf.numel()), default=0.0)
            if not largest <= clipping_range:  # also catches NaN
                return f"`{name}` of {key} reaches {largest:.4g}"
    return None


def quantisation_bound(num_clients: int, clipping_range: float, quantization_range: int) -> float:
    """The largest error of a securely summed coordinate over ``num_clients`` clients: each client's stochastic
    rounding moves its value by less than one step :math:`2c / 2^b`."""
    return num_clients * 2.0 * clipping_range / quantization_range


def check_secure_aggregation(trainer: FederatedTrainerView) -> None:
    """Refuses, in one line, an algorithm whose round state is not all sums (secure aggregation reveals sums only),
    and fewer than two clients per round (a sum of one client is that client's update).

    Raises:
        ValueError: Naming the algorithm and why.
    """
    for key, obj in algorithm_objects(trainer).items():
        if not obj.round_state_is_sum:
            raise ValueError(
                f"{type(obj).__name__} ({key}) cannot run under secure aggregation: its server reads each client's"
                " own contribution (a per-client update, loss or model), and SecAgg+ reveals only sums over the"
                " round's clients. Drop --secagg, or choose an algorithm whose round state is all sums (FedAvg and"
                " the server optimizers, FedProx, SCAFFOLD, FedGG, DP-FedAvg, the fine-tuning family)."
            )
        if not obj.sums_fit_fixed_point:
            raise ValueError(
                f"{type(obj).__name__} ({key}) cannot run under secure aggregation: its sums span more decades than"
                " SecAgg+'s fixed point holds (most entries would fall below one step of the grid and be rounding"
                " noise). Drop --secagg for it."
            )
    clients_per_round = trainer.sampler.clients_per_round
    if isinstance(clients_per_round, int) and clients_per_round < 2:
        raise ValueError(
            f"Secure aggregation needs at least 2 clients per round (a sum of one client is its update); got"
            f" `clients_per_round={clients_per_round}`: raise it, or drop --secagg."
        )


__all__ = [
    "check_secure_aggregation",
    "out_of_range",
    "quantisation_bound",
    "rebuild_sums",
    "split_round_state",
    "sum_leaves",
]
