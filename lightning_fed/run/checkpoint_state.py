"""The federated part of a checkpoint: the run's federation state, the aggregator's and the sampler's, and the
experiment fingerprint a resume is checked against."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_fed.run.resume import check_restored_fingerprint
from lightning_fed.run.resumed_settings import changes_module_settings, configured_optimizers

if TYPE_CHECKING:
    from lightning_fed.trainer import FederatedTrainer


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
    # `fit` checked the file it was given already; this catches a checkpoint restored by other means.
    check_restored_fingerprint(state_dict.get("fingerprint"), trainer.fed_fingerprint, trainer.resume_allow_changes)
    # The loops are restored before the optimizers: these are still what `configure_optimizers` built, and a
    # resume that changed the module's settings puts them back once Lightning has restored the checkpoint's.
    if changes_module_settings(trainer.session.resume_changes):
        trainer.session.configured_optimizers = configured_optimizers(trainer)
    trainer.federation_state.load_state_dict(state_dict["state"])
    trainer.aggregator.load_state_dict(state_dict["aggregator"])
    trainer.sampler.load_state_dict(state_dict["sampler"])
    trainer.mark_restored()
