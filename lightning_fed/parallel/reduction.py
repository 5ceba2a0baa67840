"""Declared cross-process state: what an algorithm accumulates over a round's clients, and how it combines over ranks.

With several processes (``strategy="ddp"``) every rank runs the round but trains only its share of the clients, so
a server-side accumulator (FedAvg's weighted sum, SCAFFOLD's sum of control changes, q-FedAvg's losses) holds only
this rank's clients until it is combined over ranks. Rather than writing that reduction by hand, an aggregator or a
callback declares each accumulator once per round with how it combines, in the spirit of torchmetrics'
``add_state(name, default, dist_reduce_fx=...)``, and calls :meth:`CrossProcessState.reduce_round_state` once every
rank has trained its clients::

    class MySums(FedCallback, CrossProcessState):
        def on_round_start(self, trainer, pl_module, round_ctx):
            params = {n: p for n, p in pl_module.named_parameters() if p.requires_grad}
            self.add_round_state("delta_sum", {n: torch.zeros_like(p) for n, p in params.items()}, reduce="sum")
            self.add_round_state("num_clients", 0, reduce="sum")
            self.add_round_state("losses", {}, reduce="merge")

        def on_client_end(self, trainer, pl_module, client_ctx, update):
            for name, total in self.delta_sum.items():
                total.add_(update.params[name] - client_ctx.initial_params[name])
            self.num_clients += 1
            self.losses[client_ctx.client_id] = update.metrics["train_loss"]

        def on_aggregate(self, trainer, pl_module, round_ctx, new_params):
            self.reduce_round_state()  # from here on, the sums and losses cover every rank's clients
            ...

:func:`reduce_across_ranks` is the one helper that does the collectives; in one process it is the identity.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from torch import Tensor

from lightning_fed.checks import InvalidArgumentError, check_choice, check_instance
from lightning_fed.parallel import distributed

Reduction = Literal["sum", "merge", "last"]
REDUCTIONS: tuple[Reduction, ...] = ("sum", "merge", "last")


def reduce_across_ranks(values: Mapping[str, Any], reductions: Mapping[str, Reduction]) -> dict[str, Any]:
    """Combines each value of ``values`` over every rank, as ``reductions[name]`` says; the identity in one process.

    Reductions:
        * ``"sum"``: a tensor, a Python number, or a (nested) mapping of them, e.g. a state dict. Every rank must
          hold the same structure (same keys in the same order, same shapes). All the sums of one call travel in
          **one** float64 all-reduce: float entries are summed in float64 (and cast back to their dtype), integers
          exactly below 2**53. Tensors are updated in place; numbers come back with their type.
        * ``"merge"``: a mapping whose keys belong to one rank each (typically client id -> value); the result is
          their union, in rank order.
        * ``"last"``: a ``(position, value)`` pair; the result is the pair with the highest position over ranks
          (ties: the lowest rank). With ``position`` the client's index in the round and ``-1`` for "none", this
          picks the round's last client wherever it trained (integer buffers are copied this way).

    Every ``"merge"`` and ``"last"`` value travels in **one** ``all_gather_object``; tensors inside them come back
    on the CPU with several processes. So one call costs at most two collectives, and every rank must make it, in
    the same order, with the same names.

    Raises:
        ValueError: If a value has no known reduction, or a ``"merge"`` key comes from two ranks.
        TypeError: If a ``"sum"`` holds something other than tensors, numbers and mappings of them.
    """
    for name in values:
        check_choice(f"reductions[{name!r}]", reductions.get(name), REDUCTIONS)
    result = dict(values)
    if not distributed.is_distributed():
        return result
    sums = [name for name in values if reductions[name] == "sum"]
    leaves: list[Tensor] = []
    for name in sums:
        _flatten(values[name], name, leaves)
    distributed.all_reduce_sum_(leaves)
    position = iter(leaves)
    for name in sums:
        result[name] = _unflatten(values[name], position)
    gathered = [name for name in values if reductions[name] != "sum"]
    if gathered:
        local = {name: apply_to_collection(values[name], Tensor, _to_cpu) for name in gathered}
        shares = distributed.all_gather_object(local)
        for name in gathered:
            parts = [share[name] for share in shares]
            result[name] = _merge(parts, name) if reductions[name] == "merge" else _last(parts)
    return result


def _to_cpu(tensor: Tensor) -> Tensor:
    return tensor.detach().cpu()


def _flatten(value: Any, where: str, leaves: list[Tensor]) -> None:
    """Appends the tensors to all-reduce for ``value``; numbers become float64 scalars."""
    if isinstance(value, Tensor):
        leaves.append(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        leaves.append(torch.tensor(float(value), dtype=torch.float64))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{where}/{key}", leaves)
    else:
        raise TypeError(
            f"The summed round state `{where}` holds {type(value).__name__}: a sum holds tensors, numbers or"
            " mappings of them."
        )


def _unflatten(value: Any, leaves: Any) -> Any:
    if isinstance(value, Tensor):
        return next(leaves)  # summed in place
    if isinstance(value, Mapping):
        return {key: _unflatten(item, leaves) for key, item in value.items()}
    total = next(leaves).item()
    return round(total) if isinstance(value, numbers.Integral) else float(total)


def _add(total: Any, value: Any) -> Any:
    """``total + value`` entry by entry; tensors of ``total`` are updated in place."""
    if isinstance(total, Tensor):
        with torch.no_grad():
            return total.add_(value.to(device=total.device, dtype=total.dtype))
    if isinstance(total, Mapping):
        return {key: _add(item, value[key]) for key, item in total.items()}
    return total + value


def _merge(parts: list[Mapping[Any, Any]], name: str) -> dict[Any, Any]:
    merged: dict[Any, Any] = {}
    for part in parts:
        twice = merged.keys() & part.keys()
        if twice:
            raise ValueError(
                f"The merged round state `{name}` has keys {sorted(twice, key=str)} on two ranks: a merge is for"
                " entries that belong to one rank each (per-client values); use reduce='sum' to add them up."
            )
        merged.update(part)
    return merged


def _last(parts: list[tuple[int, Any]]) -> tuple[int, Any]:
    # max keeps the first of equal positions: the lowest rank wins a tie.
    return max(parts, key=lambda part: part[0])


@dataclass(frozen=True)
class _Declared:
    reduce: Reduction
    structure: Any  # a sum's keys and shapes, checked before reducing; None otherwise


def _structure(value: Any, where: str) -> Any:
    """What every rank's sum must share: keys and shapes (and which leaves are numbers)."""
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape))
    if isinstance(value, Mapping):
        return {key: _structure(item, f"{where}/{key}") for key, item in value.items()}
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return "number"
    raise TypeError(
        f"The summed round state `{where}` holds {type(value).__name__}: a sum holds tensors, numbers or mappings"
        " of them."
    )


def _in_order(value: Any, structure: Any) -> Any:
    """``value`` with its mappings in the declared key order, so that every rank packs its sums alike."""
    if isinstance(structure, dict):
        return {key: _in_order(value[key], item) for key, item in structure.items()}
    return value


class CrossProcessState:
    """Mixin for aggregators and callbacks: round accumulators declared with how they combine over ranks.

    Declare each accumulator at the start of every round (``Aggregator.reset``, ``FedCallback.on_round_start``),
    when its shapes are known, with :meth:`add_round_state`; it becomes an attribute that the per-client hooks update
    on the rank that trains each client. Then call :meth:`reduce_round_state` on every rank once all clients have
    trained (``Aggregator.compute``, ``FedCallback.on_aggregate``): afterwards each attribute holds the value over
    every rank's clients, exactly what one process would hold, up to the order of float additions. In one process
    the reduction costs nothing.

    Round state is not checkpointed (a round is never split by a checkpoint): server state that outlives the round
    belongs in ``state_dict``, per-client state in the client store. See :func:`reduce_across_ranks` for what each
    reduction accepts and the module docstring for an example.

    Where every piece of an algorithm's state lives is declared on its class, so that the two halves of a round (a
    client site and the server) know what must cross between them; ``tests/test_state_declarations.py`` checks each
    shipped algorithm's declarations against what its runs actually write, reduce and read.

    Attributes:
        client_state_namespaces: The client-store namespaces the algorithm keeps per client (state that stays at a
            client site between its participations: SCAFFOLD's ``c_i``, FedAMP's ``w_i``); empty by default.
        broadcast_keys: The entries of ``state_dict()`` that a client needs each round (server state sent down with
            the global model: SCAFFOLD's ``c``); ``None`` (the default) means the whole ``state_dict()``, ``()``
            nothing. See :meth:`broadcast_state`.
        round_state_is_sum: Whether every round state the algorithm declares is a ``reduce="sum"``, so that its
            round can run under secure aggregation, which reveals sums only. The aggregators' integer-buffer policy
            (``num_batches_tracked`` from the round's last client, sent in clear) is not counted.
        server_reads_client_store: Whether the algorithm's server side reads clients' entries of the client store
            (FedAMP's every ``w_i``, rFedAvg's every ``δ_i``): such state cannot stay at the client sites of a
            deployment, which refuses the algorithm.
        sums_fit_fixed_point: Whether the sums keep their meaning in secure aggregation's fixed point (each entry
            within ±8, rounded to a grid of step 16/2**22 ≈ 3.8e-6). False for sums whose entries span more decades
            than the grid holds (FedCurv's Fisher statistics): a deployment refuses them under secure aggregation.
    """

    client_state_namespaces: ClassVar[tuple[str, ...]] = ()
    broadcast_keys: ClassVar[tuple[str, ...] | None] = None
    round_state_is_sum: ClassVar[bool] = True
    server_reads_client_store: ClassVar[bool] = False
    sums_fit_fixed_point: ClassVar[bool] = True

    def broadcast_state(self) -> dict[str, Any]:
        """What a client needs of this algorithm's server state each round: ``state_dict()`` limited to
        :attr:`broadcast_keys` (all of it when ``None``); empty for an object without a ``state_dict``."""
        state_dict = getattr(self, "state_dict", None)
        state = dict(state_dict()) if callable(state_dict) else {}
        if self.broadcast_keys is None:
            return state
        return {key: state[key] for key in self.broadcast_keys if key in state}

    def add_round_state(self, name: str, default: Any, reduce: Reduction = "sum") -> None:
        """Declares (or re-declares, each round) the attribute ``name``, starting at ``default``, and its reduction.

        ``default`` itself becomes the value (it is not copied): build it afresh each round. A ``"sum"`` must be
        updated in place or rebound with the same structure (same keys, shapes), since every rank's sum must hold
        the same tensors: start it at zeros of the final shape, never as an empty dict filled by the clients. A
        ``"merge"`` starts as an empty mapping, a ``"last"`` as ``(-1, <nothing>)``.

        Raises:
            ValueError: If ``reduce`` is not ``"sum"``, ``"merge"`` or ``"last"``, or ``default`` does not suit it.
            TypeError: If a ``"sum"`` default holds something other than tensors, numbers and mappings of them.
        """
        check_choice("reduce", reduce, REDUCTIONS)
        if reduce == "merge":
            check_instance("default", default, Mapping, "a mapping (e.g. client id -> value) for reduce='merge'")
        if reduce == "last" and not (isinstance(default, tuple) and len(default) == 2):
            raise InvalidArgumentError("default", default, "a (position, value) pair for reduce='last'")
        structure = _structure(default, name) if reduce == "sum" else None
        self._declared_round_state()[name] = _Declared(reduce, structure)
        self.__dict__["_round_state_reduced"] = False
        setattr(self, name, default)

    def reduce_round_state(self) -> None:
        """Combines every declared round state over ranks, in place; call it on every rank (identity in one process).

        The engine calls it for every callback before ``on_aggregate``, and ``Aggregator`` around ``compute``. Once a
        round's state is reduced, further calls do nothing until state is declared again (next round): a sum
        reduced twice would count every other rank's clients twice, so an older callback that still reduces in its
        own ``on_aggregate`` stays correct.

        Raises:
            ValueError: If a sum no longer has the structure it was declared with.
        """
        if self.__dict__.get("_round_state_reduced", False):
            return
        declared = self._declared_round_state()
        values = {name: getattr(self, name) for name in declared}
        for name, spec in declared.items():
            if spec.reduce != "sum":
                continue
            if _structure(values[name], name) != spec.structure:
                raise ValueError(
                    f"{type(self).__name__}'s summed round state `{name}` changed structure (keys or shapes) since it"
                    " was declared, so the ranks could not add it up entry by entry: declare it at zeros of its final"
                    " shape and update it in place."
                )
            values[name] = _in_order(values[name], spec.structure)
        reduced = reduce_across_ranks(values, {name: spec.reduce for name, spec in declared.items()})
        for name, value in reduced.items():
            setattr(self, name, value)
        self.__dict__["_round_state_reduced"] = True

    def round_state(self) -> dict[str, Any]:
        """This process's declared round state as it stands, unreduced: what a client site of a deployment sends to
        the server (see :meth:`absorb_round_state`)."""
        return {name: getattr(self, name) for name in self._declared_round_state()}

    def pack_round_state(self) -> dict[str, Any]:
        """:meth:`round_state` as a deployment's client site sends it: the default sends it as it is; an algorithm
        may send a smaller form that :meth:`unpack_round_state` turns back into the same values, bit for bit (FedAvg
        sends one client's float64 share of its sum as the client's float32 entries and their weight)."""
        return self.round_state()

    def unpack_round_state(self, packed: Mapping[str, Any]) -> dict[str, Any]:
        """The round state that :meth:`pack_round_state` sent, as :meth:`round_state` held it at the site (the
        default: ``packed`` itself); the server folds it with :meth:`absorb_round_state`."""
        return dict(packed)

    def round_state_reductions(self) -> dict[str, Reduction]:
        """How each round state declared this round combines (``"sum"``, ``"merge"``, ``"last"``), in declaration
        order: what a deployment under secure aggregation masks (the sums) and sends in clear (the rest)."""
        return {name: spec.reduce for name, spec in self._declared_round_state().items()}

    def absorb_round_state(self, values: Mapping[str, Any], partial: bool = False) -> None:
        """Folds another share's unreduced round state (its :meth:`round_state`) into this object's.

        A deployment's server folds each client site's round state in, in round order, into the state its own
        round opened at zero: a sum adds entry by entry (each share's value is ``0 + x``, exactly ``x``, so the
        server adds the clients' contributions in the order one process would, to the bit), a merge takes the
        union, a last keeps the higher position. Afterwards :meth:`reduce_round_state` in one process changes
        nothing.

        Args:
            values: The share's round state, by name.
            partial: Whether ``values`` may name only part of the declared round state: under secure aggregation
                the server folds the masked sums of every client at once and each client's clear state apart.

        Raises:
            ValueError: If ``values`` names other round state than this round declared (or, unless ``partial``,
                less), a sum's structure differs, or a merge key is in both.
        """
        declared = self._declared_round_state()
        if not set(values) <= set(declared) or (not partial and set(values) != set(declared)):
            raise ValueError(
                f"{type(self).__name__} received round state {sorted(values)} but declared {sorted(declared)} this"
                " round: the client site and the server must run the same algorithm configuration."
            )
        for name, spec in declared.items():
            if name not in values:
                continue
            mine, theirs = getattr(self, name), values[name]
            if spec.reduce == "sum":
                if _structure(theirs, name) != spec.structure:
                    raise ValueError(
                        f"{type(self).__name__}'s summed round state `{name}` arrived with another structure (keys"
                        " or shapes) than the server declared: the client site must run the same model."
                    )
                setattr(self, name, _add(mine, _in_order(theirs, spec.structure)))
            elif spec.reduce == "merge":
                setattr(self, name, _merge([mine, theirs], name))
            else:
                setattr(self, name, _last([mine, theirs]))

    def _declared_round_state(self) -> dict[str, _Declared]:
        # Created on first use: subclasses (Lightning callbacks among them) need not call this mixin's __init__.
        declared = self.__dict__.get("_round_state_declarations")
        if declared is None:
            declared = self.__dict__["_round_state_declarations"] = {}
        return declared


__all__ = ["REDUCTIONS", "CrossProcessState", "Reduction", "reduce_across_ranks"]
