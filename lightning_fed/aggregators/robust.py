"""The base of the Byzantine-robust rules: the round's accepted updates held as rows of one matrix."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_fed.aggregation import Aggregator
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.context import ClientUpdate, RoundContext
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.parallel import distributed

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView

SKIPPED_KEY = "robust/skipped"


class RobustAggregator(Aggregator):
    r"""Base of the robust rules: keeps every accepted update of the round, then applies a rule to all of them.

    A robust rule (median, Krum, ...) needs all the round's updates at once, so unlike FedAvg it cannot stream:
    each accepted client's float entries (those :meth:`float_entries` selects) are flattened into one row of an
    ``[n, d]`` matrix **on the CPU**, in their common dtype (at least float32). That costs ``n x model size`` of
    host memory per round (100 clients of a 1.66 M-parameter CNN in float32: 665 MB), on top of the rule's own work
    (Krum and Bulyan add an ``n x n`` float64 distance matrix and ``n^2 d`` multiply-adds); the matrix is freed when
    the round ends.
    Coordinate-wise rules work on column blocks, so their temporaries stay small.

    Conventions:
        * Unweighted: every accepted client counts once. A client's sample count is self-reported, so weighting by
          it would let one Byzantine client claim a huge dataset and outvote the rest; the robustness guarantees of
          these rules assume one vote per client.
        * The rule acts on the clients' models :math:`w_k` (every float entry, BatchNorm statistics included) and
          its result is the new global model, with no server learning rate or extrapolation; the distances Krum
          and Bulyan use are measured from the global model, where they are precise.
        * Integer buffers follow :class:`~lightning_fed.aggregators.Aggregator`'s policy (copied from the round's
          last accepted client); entries that ``should_aggregate`` leaves out keep their global value.
        * Too few updates: each rule needs a minimum number of clients (Krum :math:`n > 2f + 2`, Bulyan
          :math:`n \ge 4f + 3`, ...). ``clients_per_round`` below it is an error when the fit is set up; when
          rejected (non-finite) clients leave fewer accepted updates than that in a round, the round keeps the global
          model unchanged, warns once and logs ``robust/skipped = 1`` (``0`` in the other rounds).
        * Several processes (``strategy="ddp"``): the updates live on the ranks that trained them. ``compute``
          gathers every rank's rows to every rank (:func:`~lightning_fed.parallel.distributed.all_gather_rows`) and
          sorts them by the clients' positions in the round, so every rank applies the rule to the matrix one process
          would hold and computes the same model. Each rank then holds all ``n`` rows, as one process does; summing
          instead is impossible (a median is not a sum), and gathering to one rank and broadcasting the result would
          cost the same traffic plus a broadcast.
        * No state outlives a round, so a resumed run is bit-identical without any checkpointed state.

    Subclasses implement :meth:`aggregate` (and :meth:`minimum_clients` if the rule needs more than one update);
    a rule that keeps some rows and drops the others sets ``_chosen_rows`` there.

    Attributes:
        selected_clients: The clients whose updates the last round's rule kept, in the rule's order (Krum's choice,
            Bulyan's selection; every accepted client for the coordinate-wise rules); empty in a skipped round.
    """

    broadcast_keys = ()
    # The rules need every accepted update (gathered to every rank), not their sum: no secure aggregation.
    round_state_is_sum = False

    def __init__(self) -> None:
        self.selected_clients: list[int] = []
        self._chosen_rows: Tensor | None = None
        self._layout: list[tuple[str, torch.Size, torch.dtype]] = []
        self._global_row = torch.empty(0)
        self._rows = torch.empty(0, 0)
        self._positions: list[int] = []
        self._client_ids: list[int] = []
        self._num_sampled = 0
        self._skipped = False
        self._warned = False

    def minimum_clients(self, num_sampled: int) -> int:
        """The fewest accepted updates the rule works with, when ``num_sampled`` clients are sampled per round."""
        return 1

    def requirement(self) -> str:
        """The rule's condition on the number of clients ``n``, in words for error messages."""
        return "n >= 1"

    def setting_to_lower(self) -> str:
        """The aggregator's argument that lowers :meth:`minimum_clients`, for error messages."""
        return "`num_byzantine`"

    @abstractmethod
    def aggregate(self, rows: Tensor, center: Tensor) -> Tensor:
        """The new global model's float entries as one float64 vector; a selecting rule sets ``_chosen_rows``.

        Args:
            rows: ``[n, d]``, one accepted client's flattened float entries per row, in round order.
            center: ``[d]``, the global model's flattened float entries (to measure distances from).
        """

    @override
    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        clients_per_round = trainer.sampler.clients_per_round
        num_sampled = trainer.sampler.num_sampled(datamodule.num_clients)
        minimum = self.minimum_clients(num_sampled)
        if num_sampled < minimum:
            sampled = (
                f" ({num_sampled} of {datamodule.num_clients} clients)" if num_sampled != clients_per_round else ""
            )
            raise InvalidArgumentError(
                "clients_per_round",
                clients_per_round,
                f"at least {minimum} for {self!r}, which needs {self.requirement()} clients per round{sampled};"
                f" or lower the aggregator's {self.setting_to_lower()}",
            )

    @override
    def reset(self, global_params: StateDict, round_ctx: RoundContext) -> None:
        floats = self.float_entries(global_params)
        if any(t.is_complex() for t in floats.values()):
            raise TypeError(f"{type(self).__name__} orders values, so it cannot aggregate complex entries.")
        self._layout = [(name, t.shape, t.dtype) for name, t in floats.items()]
        dtype = torch.float32
        for tensor in floats.values():
            dtype = torch.promote_types(dtype, tensor.dtype)
        self._global_row = self._flatten(floats, torch.empty(self._width(), dtype=dtype))
        # Only this rank's share of the round trains here; the buffer grows if a rank ever receives more.
        share = distributed.shard_clients(round_ctx.client_ids, round_ctx.num_samples, distributed.world_size())
        self._rows = torch.empty(len(share[distributed.rank()]), self._width(), dtype=dtype)
        self._positions = []
        self._client_ids = list(round_ctx.client_ids)
        self._num_sampled = len(round_ctx.client_ids)
        self.selected_clients = []
        self._skipped = False

    def _width(self) -> int:
        return sum(shape.numel() for _, shape, _ in self._layout)

    def _flatten(self, params: StateDict, row: Tensor) -> Tensor:
        offset = 0
        for name, shape, _ in self._layout:
            size = shape.numel()
            row[offset : offset + size].copy_(params[name].detach().reshape(-1))
            offset += size
        return row

    @override
    def update(self, update: ClientUpdate) -> None:
        count = len(self._positions)
        if count == self._rows.shape[0]:
            self._rows = torch.cat([self._rows, torch.empty_like(self._rows[: max(count, 1)])])
        self._flatten(update.params, self._rows[count])
        self._positions.append(self._round_positions[update.client_id])

    def _gathered_rows(self) -> tuple[Tensor, list[int]]:
        """Every rank's accepted rows in round order, and their positions in the round."""
        count = len(self._positions)
        rows, positions = distributed.all_gather_rows(
            [self._rows[:count], torch.tensor(self._positions, dtype=torch.int64)]
        )
        order = positions.argsort()
        if not torch.equal(order, torch.arange(len(order))):
            rows = rows[order]
        return rows, positions[order].tolist()

    @override
    def compute(self, global_params: StateDict) -> StateDict:
        rows, positions = self._gathered_rows()
        self._rows = torch.empty(0, 0)  # the rows are freed once the rule has run
        new_params = {name: tensor.clone() for name, tensor in global_params.items()}
        if rows.shape[0] < self.minimum_clients(self._num_sampled):
            self._skip(rows.shape[0])
            self.keep_global_integer_entries()  # the round keeps the global model, counters included
            return new_params
        self._chosen_rows = None
        flat = self.aggregate(rows, self._global_row)
        offset = 0
        for name, shape, dtype in self._layout:
            size = shape.numel()
            device = global_params[name].device
            new_params[name] = flat[offset : offset + size].view(shape).to(device=device, dtype=dtype)
            offset += size
        chosen = range(len(positions)) if self._chosen_rows is None else self._chosen_rows.tolist()
        self.selected_clients = [self._client_ids[positions[row]] for row in chosen]
        return new_params

    def _skip(self, num_accepted: int) -> None:
        self._skipped = True
        if not self._warned:
            self._warned = True
            rank_zero_warn(
                f"{self!r} needs {self.requirement()} accepted updates but only {num_accepted} of the round's clients"
                " were accepted (the others were rejected as non-finite): the round keeps the global model. Every such"
                f" round logs `{SKIPPED_KEY} = 1`; this warning is given once.",
                category=UserWarning,
            )

    @override
    def round_metrics(self) -> dict[str, float]:
        return {SKIPPED_KEY: float(self._skipped)}


__all__ = ["SKIPPED_KEY", "RobustAggregator"]
