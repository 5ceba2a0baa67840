"""The streaming aggregator contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule
from torch import Tensor

from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.functional.state_dict import StateDict, is_float_entry
from lightning_fed.parallel.reduction import CrossProcessState

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer


class Aggregator(CrossProcessState, ABC):
    """Combines client updates into the next global model, one update at a time.

    The loop calls ``reset`` at the start of a round, ``probe_client`` and then ``update`` once per client (``update``
    only for accepted ones, right after the client trains, so memory stays O(model) whatever the number of
    clients), ``compute`` once at the end of the round, and ``round_metrics`` after it. The name is "aggregator",
    not "strategy", because ``Trainer(strategy=...)`` already means DDP/FSDP.

    Subclasses keep any cross-round server state (momentum, control variates) in ``state_dict`` so that a resumed
    run is bit-identical.

    Entries: float entries (parameters and BatchNorm running statistics) are averaged; integer buffers such as
    ``num_batches_tracked`` are copied from the round's last accepted client, wherever it trained. That policy is
    implemented once here: call :meth:`reset_integer_entries` in ``reset``, :meth:`copy_integer_entries` in
    ``update`` and read :meth:`integer_entries` in ``compute``; :meth:`float_entries` selects what to average.

    With several processes (``strategy="ddp"``) each rank sees ``probe_client`` and ``update`` only for the clients
    it trains, and ``reset``, ``compute`` and ``round_metrics`` run on every rank. A streaming aggregator declares
    what it accumulates over clients with :meth:`~lightning_fed.parallel.reduction.CrossProcessState.add_round_state` in
    ``reset`` (``reduce="sum"`` for sums of tensors, numbers or state dicts, ``"merge"`` for per-client dicts) and
    calls :meth:`~lightning_fed.parallel.reduction.CrossProcessState.reduce_round_state` first thing in ``compute``:
    from then on its accumulators cover every rank's clients (in one process this costs nothing), so every rank returns
    the same model. An aggregator that only post-processes another's ``compute`` (server momentum on top of FedAvg)
    needs nothing more: its input is already the same on every rank.
    """

    # The integer-buffer policy's bookkeeping, set by reset_integer_entries.
    _round_positions: dict[int, int]
    _last_integer_entries: tuple[int, StateDict]

    def setup(self, trainer: FederatedTrainer) -> None:
        """Called once per process when the rounds of a fit start, after any checkpoint is restored and the run seed
        is fixed (``trainer.federation_state.seed``): reads the settings the aggregator needs (the sampler, the
        number of clients, the module). Settings it cannot run with are refused earlier, in :meth:`check_setup`.
        The default does nothing."""

    def check_setup(self, trainer: FederatedTrainer, datamodule: Any) -> None:
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
        self, trainer: FederatedTrainer, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
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

    def reset_integer_entries(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        """Starts the round's integer-buffer policy; call it from ``reset``."""
        self._round_positions = {client_id: i for i, client_id in enumerate(round_ctx.client_ids)}
        self.add_round_state("_last_integer_entries", (-1, {}), reduce="last")

    def copy_integer_entries(self, update: ClientUpdate) -> None:
        """Keeps ``update``'s integer entries if it is the round's latest client so far; call it from ``update`` for
        each accepted client.

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

    def integer_entries(self, global_params: StateDict) -> StateDict:
        """The integer entries of the round's last accepted client over every rank, on ``global_params``' devices.

        Empty when no client was accepted. Read it in ``compute``, after ``reduce_round_state``.
        """
        _, entries = self._last_integer_entries
        return {name: t.to(global_params[name].device) for name, t in entries.items()}

    def state_dict(self) -> dict[str, Any]:
        """Server state that outlives the round (empty by default); saved in the checkpoint."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what ``state_dict`` returned."""


__all__ = ["Aggregator"]
