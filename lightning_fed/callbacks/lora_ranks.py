"""Clients of different LoRA ranks inside one module: each trains only its leading components."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningModule
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.context import ClientContext
from lightning_fed.functional.lora import DEFAULT_LORA_PAIRS, find_lora_pairs, truncate_rank
from lightning_fed.hooks import FedCallback

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


class LoRARanks(FedCallback):
    r"""Gives client :math:`k` a LoRA rank :math:`r_k` no larger than the module's :math:`r` (heterogeneous ranks).

    HetLoRA (Cho, Manoel, Joshi, Sim, Dimitriadis, 2024, "Heterogeneous LoRA for Federated Fine-tuning of On-Device
    Foundation Models", EMNLP 2024, arXiv:2401.06432) lets each client train an adapter of its own rank; a client of
    rank :math:`r_k` starts from the global adapter's leading :math:`r_k` components. Here every client keeps the
    module's shapes: before client :math:`k` trains, its start point's components :math:`j \ge r_k` are set to zero
    in both factors,

    .. math:: B_{:,j} \leftarrow 0,\quad A_{j,:} \leftarrow 0 \qquad (j \ge r_k),

    and a component with both factors zero has zero gradients, so it stays exactly zero through local training
    (:func:`~lightning_fed.functional.lora.truncate_rank`): the client trains a rank-:math:`r_k` adapter, and what it
    sends is that adapter zero-padded to :math:`r`. Aggregated by
    :class:`~lightning_fed.aggregators.LoRAFedAvg`:

    * ``mode="fedit"``: the zero-padding average, :math:`B_{:,j} \leftarrow \sum_k p_k [j < r_k] B_{k,:,j}`,
      :math:`A_{j,:} \leftarrow \sum_k p_k [j < r_k] A_{k,j,:}` (components few clients train shrink towards zero);
    * ``mode="exact"``: the average product :math:`\sum_k p_k B_{k,:,:r_k} A_{k,:r_k,:}` re-factorised at :math:`r`
      by a truncated SVD, components in descending singular value, so a client's leading :math:`r_k` components are
      the best rank-:math:`r_k` approximation of the global adapter (FlexLoRA; Bai et al., 2024, arXiv:2402.11505).

    FFA-LoRA (``mode="ffa"``) keeps :math:`A` frozen, so it cannot zero :math:`A`'s rows: use the other modes.
    Evaluation uses the global model (all :math:`r` components).

    Args:
        ranks: Each client's rank: a mapping from client id to rank (clients not in it train at the module's full
            rank), or a list of ranks, client :math:`k` taking ``ranks[k % len(ranks)]`` (device tiers).
        lora_pairs: (A-name, B-name) key components that mark the factors, as in ``LoRAFedAvg``.
    """

    # Nothing crosses the seam: the ranks are configuration, and each client's start point is set where it trains.
    broadcast_keys = ()
    # The only per-client hook edits that client's own start point (its context): clients may train side by side.
    supports_batched_clients = True

    def __init__(
        self,
        ranks: Mapping[int, int] | Sequence[int],
        lora_pairs: Sequence[tuple[str, str]] = DEFAULT_LORA_PAIRS,
    ) -> None:
        self.ranks = _checked_ranks(ranks)
        self.lora_pairs = tuple((str(a), str(b)) for a, b in lora_pairs)

    @override
    def check_setup(self, trainer: FederatedTrainerView, datamodule: Any) -> None:
        if getattr(trainer.aggregator, "mode", None) == "ffa":
            raise InvalidArgumentError(
                "trainer.aggregator.init_args.mode",
                "ffa",
                "'fedit' or 'exact' with LoRARanks, which zeroes rows of A that FFA-LoRA keeps frozen",
            )

    def rank_of(self, client_id: int) -> int | None:
        """Client ``client_id``'s rank; ``None`` for the module's full rank."""
        if isinstance(self.ranks, dict):
            return self.ranks.get(client_id)
        return self.ranks[client_id % len(self.ranks)]

    @override
    def on_client_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> None:
        rank = self.rank_of(client_ctx.client_id)
        if rank is None:
            return
        start = dict(client_ctx.initial_params)
        for pair in find_lora_pairs(start, self.lora_pairs):
            if pair.a_key is None or pair.b_key is None:
                raise ValueError(
                    f"LoRARanks zeroes both factors of `{pair.name}`, but only one is in the federated state: train"
                    " both lora_A and lora_B, or drop LoRARanks."
                )
            full_rank = start[pair.a_key].shape[0]
            if rank > full_rank:
                raise InvalidArgumentError(
                    "ranks", rank, f"at most the module's LoRA rank {full_rank} (client {client_ctx.client_id})"
                )
            start[pair.b_key], start[pair.a_key] = truncate_rank(start[pair.b_key], start[pair.a_key], rank)
        client_ctx.initial_params = start

    @override
    def __repr__(self) -> str:
        return f"{type(self).__name__}(ranks={self.ranks!r}, lora_pairs={self.lora_pairs!r})"


def _checked_ranks(ranks: Any) -> dict[int, int] | tuple[int, ...]:
    allowed = "a mapping from client id to rank, or a non-empty list of ranks, each an integer >= 1"
    if isinstance(ranks, Mapping):
        items = list(ranks.items())
        if all(_positive_int(k, 0) and _positive_int(v, 1) for k, v in items):
            return {int(k): int(v) for k, v in items}
    elif (
        isinstance(ranks, Sequence) and not isinstance(ranks, str) and ranks and all(_positive_int(v, 1) for v in ranks)
    ):
        return tuple(int(v) for v in ranks)
    raise InvalidArgumentError("ranks", ranks, allowed)


def _positive_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


__all__ = ["LoRARanks"]
