"""The federated part of a checkpoint: the run's federation state, the aggregator's and the sampler's, the
experiment fingerprint a resume is checked against, and the fingerprint of the module's frozen base.

The frozen base itself is in the checkpoint once, in the module's ``state_dict`` (or nowhere, for a module that
leaves its pretrained base out of its checkpoints and loads it itself): every client state in here is the federated
part only. A resume whose base differs from the one the run trained on is refused, naming the first tensor that
differs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_fed.functional.federated_state import (
    BaseFingerprint,
    base_fingerprint,
    federated_keys,
    first_base_difference,
)
from lightning_fed.run.resume import ResumeError, check_restored_fingerprint
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
        "base": module_base(trainer).to_dict(),
    }


def module_base(trainer: FederatedTrainer) -> BaseFingerprint:
    """The fingerprint of the fit's frozen base (the module's state outside its federated part), computed once per
    fit: the base never changes, and hashing it reads every frozen byte."""
    session, module = trainer.session, trainer.lightning_module
    if session.base is None or session.base[0] != id(module):
        session.base = (id(module), base_fingerprint(module, federated_keys(module, trainer.federated_keys)))
    return session.base[1]


def check_same_base(
    saved: BaseFingerprint, current: BaseFingerprint, what: str, fix: str, error: type[Exception] = ResumeError
) -> None:
    """Refuses, in one line, a base that differs from ``saved``, naming the first tensor that differs.

    Args:
        saved: The base the run trained on (a checkpoint's, the server's).
        current: This side's base.
        what: Whose base ``current`` is, for the message.
        fix: What to do instead, for the message.
        error: The exception to raise.

    Raises:
        ResumeError: If the bases differ (or ``error``).
    """
    difference = first_base_difference(saved, current)
    if difference is not None:
        raise error(f"{what} differs from the frozen base the run trained on: {difference}; {fix}.")


def restore_federated_checkpoint(trainer: FederatedTrainer, state_dict: dict[str, Any]) -> None:
    """Restores what :func:`federated_checkpoint` saved; a checkpoint of another configuration is refused."""
    # `fit` checked the file it was given already; this catches a checkpoint restored by other means.
    check_restored_fingerprint(state_dict.get("fingerprint"), trainer.fed_fingerprint, trainer.resume_allow_changes)
    # The loops are restored before the optimizers: these are still what `configure_optimizers` built, and a
    # resume that changed the module's settings puts them back once Lightning has restored the checkpoint's.
    if changes_module_settings(trainer.session.resume_changes):
        trainer.session.configured_optimizers = configured_optimizers(trainer)
    if state_dict.get("base") is not None:
        # The module was restored before the loops: a base it loads itself (left out of its checkpoints) is checked.
        check_same_base(
            BaseFingerprint.from_dict(state_dict["base"]),
            module_base(trainer),
            "This module's frozen base",
            "load the base the run was trained on (the same pretrained weights) or start a new run",
        )
    trainer.federation_state.load_state_dict(state_dict["state"])
    trainer.aggregator.load_state_dict(state_dict["aggregator"])
    trainer.sampler.load_state_dict(state_dict["sampler"])
    trainer.mark_restored()
