"""Combining what each rank's replies of a round brought, so that every rank leaves the round in the same state.

With one process every function here returns its input unchanged and costs nothing.
"""

from __future__ import annotations

from lightning_fed.client_store import ClientStateStore
from lightning_fed.context import RoundContext
from lightning_fed.parallel import distributed


def combine_replies(
    round_ctx: RoundContext, bytes_before: tuple[int, int], train_metrics: dict[int, dict[str, float]], steps: int
) -> tuple[list[dict[str, float]], int]:
    """Merges what the ranks folded from their replies: metrics, rejections, bytes and optimizer steps.

    Bytes counted before training (by ``on_round_start``, alike on every rank) are counted once; every rank's
    bytes since are added to them. ``round_ctx.rejected`` and the ``bytes_*`` counters are updated in place.

    Args:
        round_ctx: The round, this rank's replies folded in; on return it holds every rank's rejections (in round
            order) and bytes.
        bytes_before: ``(bytes_up, bytes_down)`` of the round before any client trained.
        train_metrics: This rank's accepted clients' training metrics, by client.
        steps: The optimizer steps of this rank's replies.

    Returns:
        Every accepted client's training metrics in round order, and the optimizer steps the *other* ranks took
        (to advance ``global_step`` as one process would).
    """
    position = {cid: i for i, cid in enumerate(round_ctx.client_ids)}
    if not distributed.is_distributed():
        return [train_metrics[cid] for cid in sorted(train_metrics, key=position.__getitem__)], 0
    summary = {
        "metrics": train_metrics,
        "rejected": list(round_ctx.rejected),
        "bytes": (round_ctx.bytes_up - bytes_before[0], round_ctx.bytes_down - bytes_before[1]),
        "steps": steps,
    }
    shares = distributed.all_gather_object(summary)
    merged = {cid: m for other in shares for cid, m in other["metrics"].items()}
    rejected = {cid for other in shares for cid in other["rejected"]}
    round_ctx.rejected[:] = sorted(rejected, key=position.__getitem__)
    round_ctx.bytes_up = bytes_before[0] + sum(other["bytes"][0] for other in shares)
    round_ctx.bytes_down = bytes_before[1] + sum(other["bytes"][1] for other in shares)
    other_steps = sum(other["steps"] for other in shares) - steps
    return [merged[cid] for cid in sorted(merged, key=position.__getitem__)], other_steps


def sync_store(store: ClientStateStore) -> None:
    """Gives every rank the client-store entries that the others wrote since the last exchange."""
    changes = store.take_changes()
    if not distributed.is_distributed():
        return
    own = distributed.rank()
    for other_rank, other in enumerate(distributed.all_gather_object(changes)):
        if other_rank != own:
            store.apply_changes(other)


def gather_client_results(
    results: dict[int, dict[str, float]], any_personalised: bool, client_ids: list[int]
) -> tuple[dict[int, dict[str, float]], bool]:
    """Every rank's per-client evaluation results, in ``client_ids`` order, and whether any was personalised."""
    if not distributed.is_distributed():
        return results, any_personalised
    shares = distributed.all_gather_object((results, any_personalised))
    merged = {cid: metrics for share, _ in shares for cid, metrics in share.items()}
    return {cid: merged[cid] for cid in client_ids if cid in merged}, any(flag for _, flag in shares)


__all__ = ["combine_replies", "gather_client_results", "sync_store"]
