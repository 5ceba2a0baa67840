"""What a federated run must carry across a crash, besides the model and the callbacks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_fed.client_store import ClientStateStore

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer


@dataclass
class FederationState:
    """The run's federated state, saved in every checkpoint (under the round loop's state).

    Attributes:
        seed: Run seed; every random draw of the run derives from it.
        completed_rounds: Rounds fully trained and aggregated.
        bytes_up: Cumulative client-to-server bytes.
        bytes_down: Cumulative server-to-client bytes.
        rejected_total: Client updates rejected as non-finite.
        wall_time_s: Training wall time summed over rounds, across resumes.
        history: One metrics dict per completed round.
        store: Per-client state of every callback.
    """

    seed: int = 0
    completed_rounds: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    rejected_total: int = 0
    wall_time_s: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)
    store: ClientStateStore = field(default_factory=ClientStateStore)

    @property
    def updates_total(self) -> int:
        """Client updates trained so far, accepted or rejected (the sampled clients of every completed round)."""
        return sum(int(entry.get("clients/sampled", 0)) for entry in self.history)

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "completed_rounds": self.completed_rounds,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "rejected_total": self.rejected_total,
            "wall_time_s": self.wall_time_s,
            "history": [dict(entry) for entry in self.history],
            "store": self.store.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("seed", "completed_rounds", "bytes_up", "bytes_down", "rejected_total", "wall_time_s"):
            setattr(self, key, state_dict[key])
        self.history = [dict(entry) for entry in state_dict["history"]]
        self.store.load_state_dict(state_dict["store"])


def federated_checkpoint(trainer: FederatedTrainer) -> dict[str, Any]:
    """Everything federated that a checkpoint must hold (saved inside the round loop's state), with the experiment
    fingerprint that a resume is checked against."""
    fingerprint = trainer.fed_fingerprint
    return {
        "state": trainer.federation_state.state_dict(),
        "aggregator": trainer.aggregator.state_dict(),
        "sampler": trainer.sampler.state_dict(),
        "fingerprint": dict(fingerprint) if fingerprint is not None else None,
    }


def restore_federated_checkpoint(trainer: FederatedTrainer, state_dict: dict[str, Any]) -> None:
    """Restores what :func:`federated_checkpoint` saved; a checkpoint of another configuration is refused."""
    from lightning_fed.resume import check_restored_fingerprint

    # `fit` checked the file it was given already; this catches a checkpoint restored by other means.
    check_restored_fingerprint(state_dict.get("fingerprint"), trainer.fed_fingerprint, trainer.resume_allow_changes)
    trainer.federation_state.load_state_dict(state_dict["state"])
    trainer.aggregator.load_state_dict(state_dict["aggregator"])
    trainer.sampler.load_state_dict(state_dict["sampler"])
    trainer.mark_restored()
