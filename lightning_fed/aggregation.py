"""The streaming aggregator contract."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from lightning.pytorch import LightningModule
from torch import Tensor

from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.functional.state_dict import StateDict, is_float_entry
from lightning_fed.parallel.reduction import CrossProcessState

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class Aggregator(CrossProcessState, ABC):
    """Combines client updates into the next global model, one update at a time.

    The loop calls ``reset`` at the start of a round, ``probe_client`` and then ``update`` once per client (``update``
    only for accepted ones, right after the client trains, so memory stays O(model) whatever the number of
    clients), ``compute`` once at the end of the round, and ``round_metrics`` after it. The name is "aggregator",
    not "strategy", because ``Trainer(strategy=...)`` already means DDP/FSDP.

    Subclasses keep any cross-round server state (momentum, control variates) in ``state_dict`` so that a resumed
    run is bit-identical.

    Entries: float entries (parameters and BatchNorm running statistics) are averaged (:meth:`float_entries` selects
    them); integer buffers such as ``num_batches_tracked`` are copied from the round's last accepted client, wherever
    it trained.

    With several processes (``strategy="ddp"``) each rank sees ``probe_client`` and ``update`` only for the clients
    it trains, and ``reset``, ``compute`` and ``round_metrics`` run on every rank. A streaming aggregator declares
    what it accumulates over clients with :meth:`~lightning_fed.parallel.reduction.CrossProcessState.add_round_state` in
    ``reset`` (``reduce="sum"`` for sums of tensors, numbers or state dicts, ``"merge"`` for per-client dicts); by the
    time ``compute``'s body runs, its accumulators cover every rank's clients (in one process this costs nothing), so
    every rank returns the same model.

    A subclass writes only the arithmetic of ``reset``, ``update`` and ``compute``; the base wraps each of them (where
    the subclass defines it, see ``__init_subclass__``) and carries the duties around it, as torchmetrics' ``Metric``
    does around ``update`` and ``compute``:

    * before ``reset``: starts the integer-buffer policy (the round's client positions, and the last integer entries
      as round state that keeps the latest client over ranks);
    * after ``update`` (and after ``update_group``, for each of its updates): keeps the update's integer entries if
      it is the round's latest client so far;
    * before ``compute``: reduces the declared round state over ranks
      (:meth:`~lightning_fed.parallel.reduction.CrossProcessState.reduce_round_state`); after it: lays the round's
      integer entries (those ``should_aggregate`` keeps) over the returned model, nothing when no client was accepted.
      A rule that keeps the global model in a round (a robust rule with too few clients) calls
      :meth:`keep_global_integer_entries` in its ``compute``.

    Each duty runs once per call on an object: a subclass calling ``super().compute()`` (FedAvgM on FedAvg) does not
    reduce twice, which under ddp would double-count. An aggregator that forwards to another (NormBound) calls the
    inner one's methods, and the inner object carries its own duties; such a wrapper sets
    :attr:`copies_integer_entries` to ``False``, since the inner one copies them.

    Attributes:
        copies_integer_entries: Whether the base applies the integer-buffer policy to this aggregator; ``False`` for
            a wrapper whose inner aggregator applies it (and may keep the global model's entries in a round).
    """

    copies_integer_entries: ClassVar[bool] = True

    # The integer-buffer policy's bookkeeping, set before each reset: every sampled client's position in the round,
    # and the (position, integer entries) of the round's latest accepted client so far.
    _round_positions: dict[int, int]
    _last_integer_entries: tuple[int, StateDict]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wraps the ``reset``, ``update`` and ``compute`` that ``cls`` itself defines with the base's duties."""
        super().__init_subclass__(**kwargs)
        for name, wrap in (
            ("reset", _with_reset_duties),
            ("update", _with_update_duties),
            ("update_group", _with_update_group_duties),
            ("compute", _with_compute_duties),
        ):
            method = cls.__dict__.get(name)
            # Abstract declarations stay abstract; a method already wrapped (assigned from another class) is kept.
            abstract = getattr(method, "__isabstractmethod__", False)
            if callable(method) and not abstract and not getattr(method, _WRAPPED, False):
                setattr(cls, name, wrap(method))

    def setup(self, trainer: FederatedTrainerView) -> None:
        """Called once per process when the rounds of a fit start, after any checkpoint is restored and the run seed
        is fixed (``trainer.federation_state.seed``): reads the settings the aggregator needs (the sampler, the
        number of clients, the module). Settings it cannot run with are refused earlier, in :meth:`check_setup`.
        The default does nothing."""

    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        """Raises when the trainer's settings (``clients_per_round``, ...) or the datamodule (set up) cannot run this
        rule. Called when a fit's rounds start, and by ``lightning-fed`` before the run writes anything; the default
        accepts all.

        Raises:
            InvalidArgumentError: Naming the setting to change.
        """

    @abstractmethod
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        """Starts a round. ``round_ctx.num_samples`` gives every sampled client's training-set size."""

    def probe_client(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
    ) -> dict[str, Any]:
        """Measures what the aggregator needs from a client besides its model (e.g. q-FedAvg's loss at w_g).

        Called for each client on the rank that trains it, once the module holds the client's start point and
        before local training, with a loader of its own (iterating it cannot shift the client's data order or RNG);
        what it returns is put into that client's ``ClientUpdate.extras``. Any pass over the data should leave the
        module as it found it (e.g. run in eval mode, under ``no_grad``). The default measures nothing.
        """
        return {}

    @abstractmethod
    def update(self, update: ClientUpdate) -> None:
        """Folds one accepted client update into the running aggregate."""

    def update_group(self, updates: Sequence[ClientUpdate]) -> None:
        """Folds several accepted updates, in the order given, with the result of ``update`` on each in turn.

        The loop calls it with the accepted updates of a group of clients trained side by side
        (``client_parallelism``), after the group's ``on_client_end`` hooks. The default calls ``update`` for each;
        a rule may fold them with fewer operations, but must give the same aggregate.
        """
        for update in updates:
            self.update(update)

    @abstractmethod
    def compute(self, global_params: StateDict) -> StateDict:
        """Returns the new global model. With no accepted update it must return ``global_params`` unchanged."""

    def round_metrics(self) -> dict[str, float]:
        """Metrics of the round just computed, added to the round's metrics (e.g. ``qfedavg/loss_at_global``).

        Called on every rank after ``compute``; it must return the same everywhere (read reduced round state).
        """
        return {}

    def should_aggregate(self, name: str) -> bool:
        """Whether entry ``name`` is aggregated; entries left out keep their global value (FedBN-style)."""
        return True

    def float_entries(self, params: Mapping[str, Tensor]) -> StateDict:
        """The entries of ``params`` that are averaged: floating-point ones that ``should_aggregate`` keeps."""
        return {name: t for name, t in params.items() if self.should_aggregate(name) and is_float_entry(t)}

    def float64_zeros(self, global_params: Mapping[str, Tensor]) -> StateDict:
        """Float64 zeros for each averaged entry: the start of a declared sum over clients (see :meth:`reset`)."""
        return {name: torch.zeros_like(t, dtype=torch.float64) for name, t in self.float_entries(global_params).items()}

    def integer_entries(self, global_params: StateDict) -> StateDict:
        """The integer entries of the round's last accepted client over every rank, on ``global_params``' devices.

        Empty when no client was accepted, or after :meth:`keep_global_integer_entries`. The base lays them over what
        ``compute`` returns; a subclass need not read them.
        """
        _, entries = self._last_integer_entries
        return {name: t.to(global_params[name].device) for name, t in entries.items()}

    def keep_global_integer_entries(self) -> None:
        """Makes this round's ``compute`` keep the global model's integer entries: call it from ``compute`` when the
        rule leaves the round's model unchanged (a skipped round), so that no client's counters are copied over it."""
        self._last_integer_entries = (-1, {})

    def _start_integer_entries(self, round_ctx: RoundContext) -> None:
        """Starts the round's integer-buffer policy (before ``reset``)."""
        # Positions are kept for every aggregator: rules read them to order their clients (q-FedAvg, robust rules).
        self._round_positions = {client_id: i for i, client_id in enumerate(round_ctx.client_ids)}
        if self.copies_integer_entries:
            self.add_round_state("_last_integer_entries", (-1, {}), reduce="last")

    def _copy_integer_entries(self, update: ClientUpdate) -> None:
        """Keeps ``update``'s integer entries if it is the round's latest client so far (after ``update``).

        "Latest" is by position in the round, not by arrival: updates held back by a hook (attack simulation) reach
        the aggregator after the rank's other clients. Across ranks the one with the highest position in the round
        wins when the round state is reduced.
        """
        position = self._round_positions.get(update.client_id, -1)
        if position < self._last_integer_entries[0]:
            return
        entries = {
            name: t.detach().clone()
            for name, t in update.params.items()
            if self.should_aggregate(name) and not is_float_entry(t)
        }
        if entries:
            self._last_integer_entries = (position, entries)

    def _with_integer_entries(self, new_params: StateDict, global_params: StateDict) -> StateDict:
        """``new_params`` with the round's integer entries laid over it (after ``compute``)."""
        copied = self.integer_entries(global_params)
        # A new dict: the body may have returned global_params itself.
        return {**new_params, **copied} if copied else new_params

    @contextmanager
    def _duty(self, name: str) -> Iterator[bool]:
        """Yields whether this is the outermost call of ``name`` on this object, which alone carries the duties."""
        # Kept in __dict__ and created on first use: subclasses need not call a base __init__.
        active: set[str] = self.__dict__.setdefault("_active_duties", set())
        if name in active:
            yield False
            return
        active.add(name)
        try:
            yield True
        finally:
            active.discard(name)

    def state_dict(self) -> dict[str, Any]:
        """Server state that outlives the round (empty by default); saved in the checkpoint."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what ``state_dict`` returned."""


_WRAPPED = "_aggregator_duties"

_Reset = Callable[[Aggregator, StateDict, RoundContext], None]
_Update = Callable[[Aggregator, ClientUpdate], None]
_UpdateGroup = Callable[[Aggregator, Sequence[ClientUpdate]], None]
_Compute = Callable[[Aggregator, StateDict], StateDict]


def _with_reset_duties(reset: _Reset) -> _Reset:
    @functools.wraps(reset)
    def wrapper(self: Aggregator, global_params: StateDict, round_ctx: RoundContext) -> None:
        with self._duty("reset") as outermost:
            if outermost:
                self._start_integer_entries(round_ctx)
            reset(self, global_params, round_ctx)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _with_update_duties(update: _Update) -> _Update:
    @functools.wraps(update)
    def wrapper(self: Aggregator, client_update: ClientUpdate) -> None:
        with self._duty("update") as outermost:
            update(self, client_update)
            if outermost and self.copies_integer_entries:
                self._copy_integer_entries(client_update)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _with_update_group_duties(update_group: _UpdateGroup) -> _UpdateGroup:
    @functools.wraps(update_group)
    def wrapper(self: Aggregator, updates: Sequence[ClientUpdate]) -> None:
        # The duty of `update`: a body that calls `update` does not copy the integer entries a second time.
        with self._duty("update") as outermost:
            update_group(self, updates)
            if outermost and self.copies_integer_entries:
                for client_update in updates:
                    self._copy_integer_entries(client_update)

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _with_compute_duties(compute: _Compute) -> _Compute:
    @functools.wraps(compute)
    def wrapper(self: Aggregator, global_params: StateDict) -> StateDict:
        with self._duty("compute") as outermost:
            if not outermost:
                return compute(self, global_params)
            self.reduce_round_state()
            new_params = compute(self, global_params)
            if self.copies_integer_entries:
                new_params = self._with_integer_entries(new_params, global_params)
            return new_params

    setattr(wrapper, _WRAPPED, True)
    return wrapper


__all__ = ["Aggregator"]
