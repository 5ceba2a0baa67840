"""What happens to a client whose update is not finite: it is rejected (or the run stops), and a run that rejected
many says so at its end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_fed.context import FederationState, RoundContext

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


def finite_tree(value: Any) -> bool:
    """Whether every floating-point tensor in a nested structure (an optimizer's state) is finite."""
    flags: list[Tensor] = []
    apply_to_collection(
        value, Tensor, lambda t: flags.append(torch.isfinite(t).all()) if t.is_floating_point() else None
    )
    return bool(torch.stack(flags).all()) if flags else True


class ClientDivergedError(FloatingPointError):
    """Raised when a client's update is not finite and ``on_client_divergence="raise"``."""


# Above this share of rejected client updates, a finished run warns that its results rest on the clients left.
REJECTED_WARNING_FRACTION = 0.1


def rejection_warning(state: FederationState) -> str | None:
    """The end-of-run warning when more than 10 % of the client updates were rejected as non-finite, or (in a
    deployment) never arrived, else ``None``.

    With ``on_client_divergence="skip"`` each rejection is printed when it happens; a run where many were rejected
    still finishes and reports metrics, so its end says how much of the federation those metrics rest on.
    """
    total = state.updates_total
    # A deployment's clients whose site never replied count as rejected too; they are told apart by `clients/dropped`.
    dropped = sum(int(entry.get("clients/dropped", 0)) for entry in state.history)
    diverged = state.rejected_total - dropped
    if total == 0:
        return None
    messages = []
    if diverged > REJECTED_WARNING_FRACTION * total:
        messages.append(
            f"{diverged} of {total} client updates ({diverged / total:.0%}) were rejected (not finite, or beyond"
            " secure aggregation's range) and left out of the aggregate, so this run's results rest on the clients"
            " that remained. Lower the learning rate or clip gradients (`gradient_clip_val`); set"
            " `on_client_divergence='raise'` to stop at the first one."
        )
    if dropped > REJECTED_WARNING_FRACTION * total:
        messages.append(
            f"{dropped} of {total} client updates ({dropped / total:.0%}) never arrived from their sites (a site"
            " failed, or missed the run config's `round-timeout`) and were left out of the aggregate: see the"
            " SuperNodes' logs, or raise `round-timeout`."
        )
    return " ".join(messages) or None


def warn_if_many_rejected(trainer: FederatedTrainerView) -> None:
    """Emits :func:`rejection_warning` on rank 0 when it applies; called when a fit ends."""
    message = rejection_warning(trainer.federation_state)
    if message is not None:
        rank_zero_warn(message, category=UserWarning)


def reject_client(
    trainer: FederatedTrainerView, round_ctx: RoundContext, client_id: int, reason: str = "it holds NaN or Inf"
) -> None:
    """Leaves a diverged client out of the round, or stops the run when ``on_client_divergence="raise"``.

    Args:
        trainer: The fit's trainer.
        round_ctx: The round.
        client_id: The client.
        reason: Why the update is unusable (a deployed site says so in its reply).
    """
    round_ctx.rejected.append(client_id)
    message = f"Client {client_id}'s update of round {round_ctx.round_idx} was rejected: {reason}."
    if trainer.on_client_divergence == "raise":
        raise ClientDivergedError(
            f"{message} Lower the learning rate, clip gradients (`gradient_clip_val`), or set"
            " `on_client_divergence='skip'` to drop such clients from the aggregate."
        )
    trainer.print(f"[lightning_fed] {message} It was left out of the aggregate.")


__all__ = [
    "REJECTED_WARNING_FRACTION",
    "ClientDivergedError",
    "finite_tree",
    "reject_client",
    "rejection_warning",
    "warn_if_many_rejected",
]
