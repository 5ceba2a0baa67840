"""Norm bounding: clip each client's change to the global model before another rule aggregates it."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_fed.aggregation import Aggregator
from lightning_fed.checks import check_instance, check_real
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.functional.state_dict import StateDict

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

CLIPPED_KEY = "normbound/clipped_fraction"


class NormBound(Aggregator):
    r"""Clips every client's update to a norm bound, then hands it to another aggregator.

    Sun, Kairouz, Suresh, McMahan, "Can You Really Backdoor Federated Learning?", arXiv:1911.07963, Sec. 4
    ("norm thresholding of updates").

    .. math::
        w_k \leftarrow w_g + \frac{w_k - w_g}{\max\!\left(1, \lVert w_k - w_g \rVert_2 / M\right)}

    Conventions:
        * The norm covers every float entry the wrapped aggregator aggregates (parameters and BatchNorm running
          statistics: an attacker can move either), summed in float64 over the whole model; the clipped model is
          computed in each entry's own dtype (its norm is :math:`M` up to that dtype's rounding). Updates within the
          bound reach the wrapped aggregator untouched. Integer entries and entries the wrapped aggregator leaves out
          are not changed.
        * The wrapped aggregator does the rest (its own weights, server state, checks and metrics); ``NormBound``
          keeps no state of its own, and its ``state_dict`` is the wrapped aggregator's.
        * Logs ``normbound/clipped_fraction``: the fraction of the round's accepted updates that were clipped,
          over every rank's clients (a declared round state, summed under ddp).

    Args:
        aggregator: What aggregates the clipped updates (e.g. :class:`~lightning_fed.aggregators.FedAvg`).
        max_norm: :math:`M > 0`.
    """

    # The wrapped aggregator copies the integer entries, and keeps the global ones when it skips a round.
    copies_integer_entries = False
    # The state_dict is the wrapped aggregator's: broadcast_state sends what that aggregator declares.
    broadcast_keys = None
    # The server clips each update it receives (a defence clients cannot be trusted to apply), so it must see each
    # one, whatever the wrapped rule: no secure aggregation.
    round_state_is_sum = False

    def __init__(self, aggregator: Aggregator, max_norm: float) -> None:
        self.aggregator = check_instance("aggregator", aggregator, Aggregator, "an Aggregator (e.g. FedAvg())")
        self.max_norm = check_real("max_norm", max_norm, minimum=0.0, exclusive_minimum=True)
        self._global: StateDict = {}
        self._clipped = 0
        self._accepted = 0

    @override
    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        self.aggregator.check_setup(trainer, datamodule)

    @override
    def should_aggregate(self, name: str) -> bool:
        return self.aggregator.should_aggregate(name)

    @override
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        self._global = self.float_entries(global_params)
        self.add_round_state("_clipped", 0, reduce="sum")
        self.add_round_state("_accepted", 0, reduce="sum")
        self.aggregator.reset(global_params, round_ctx)

    @override
    def probe_client(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, dataloader: Any
    ) -> dict[str, Any]:
        return self.aggregator.probe_client(trainer, pl_module, client_ctx, dataloader)

    def clip(self, params: StateDict) -> tuple[StateDict, bool]:
        """``params`` with its distance to the round's global model bounded by ``max_norm``, and whether it was cut."""
        # The differences in the entries' own dtype are exact to half an ulp of the difference; the norm adds them
        # up in float64.
        changes = {name: params[name].detach() - old for name, old in self._global.items()}
        squares = [torch.linalg.vector_norm(change, dtype=torch.float64) ** 2 for change in changes.values()]
        norm = math.sqrt(float(torch.stack(squares).sum())) if squares else 0.0
        if norm <= self.max_norm:
            return params, False
        scale = self.max_norm / norm
        clipped = dict(params)
        for name, change in changes.items():
            clipped[name] = torch.add(self._global[name], change, alpha=scale)
        return clipped, True

    @override
    def update(self, update: ClientUpdate) -> None:
        params, was_clipped = self.clip(update.params)
        self._accepted += 1
        self._clipped += int(was_clipped)
        self.aggregator.update(dataclasses.replace(update, params=params) if was_clipped else update)

    @override
    def compute(self, global_params: StateDict) -> StateDict:
        return self.aggregator.compute(global_params)

    @override
    def round_metrics(self) -> dict[str, float]:
        metrics = dict(self.aggregator.round_metrics())
        if self._accepted:
            metrics[CLIPPED_KEY] = self._clipped / self._accepted
        return metrics

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.aggregator.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.aggregator.load_state_dict(state_dict)

    @override
    def broadcast_state(self) -> dict[str, Any]:
        return self.aggregator.broadcast_state()

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.aggregator!r}, max_norm={self.max_norm})"


__all__ = ["CLIPPED_KEY", "NormBound"]
