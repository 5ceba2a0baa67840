"""What one fit of a ``FederatedTrainer`` owns besides its settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_fed.context import RoundResult
from lightning_fed.functional.federated_state import BaseFingerprint
from lightning_fed.run.fingerprint import Fingerprint
from lightning_fed.run.resumed_settings import ConfiguredOptimizers

if TYPE_CHECKING:
    from lightning_fed.run.reporting import RunReporter


@dataclass
class RunSession:
    """The state of a fit's run: where it writes, what defines it, and what it has reported.

    The trainer holds one; :meth:`~lightning_fed.FederatedTrainer.fit` starts it afresh (:meth:`start`), and the
    modules that name, resume and report a run read and write it here rather than in private trainer fields.

    Attributes:
        run_checkpoints: The ``ModelCheckpoint`` callbacks given no ``dirpath``: each fit points them at its own run
            directory (set once, when the trainer is built).
        fingerprint: What defines the latest fit's experiment, as its checkpoints carry it.
        restored: Whether the running fit restored a checkpoint (the run seed then comes from it).
        run_dir: The fit's run directory once decided (``summary.json``, plots, ``checkpoints/``, W&B).
        reporter: Sends the fit's rounds to the loggers and the run directory; set when the rounds start.
        last_round_result: The latest round's result in this process.
        summary_path: Where ``summary.json`` was last written (rank 0).
        resume_changes: The fingerprint keys a resume was allowed to change, with their old and new values.
        configured_optimizers: What ``configure_optimizers`` built, kept while a resume that changed the module's
            settings restores the checkpoint, to be put back over the restored optimizers
            (:mod:`lightning_fed.run.resumed_settings`).
        base: The id of the fit's module and the fingerprint of its frozen base, computed once per fit when first
            needed (a restore, a checkpoint, a deployed task).
    """

    run_checkpoints: list[ModelCheckpoint] = field(default_factory=list)
    fingerprint: Fingerprint | None = None
    restored: bool = False
    run_dir: Path | None = None
    reporter: RunReporter | None = None
    last_round_result: RoundResult | None = None
    summary_path: Path | None = None
    resume_changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    configured_optimizers: ConfiguredOptimizers | None = None
    base: tuple[int, BaseFingerprint] | None = None

    def start(
        self, fingerprint: Fingerprint, restored: bool, changes: dict[str, tuple[Any, Any]] | None = None
    ) -> None:
        """Starts a fit: its fingerprint, whether it resumes (and the changes it was allowed), and a run directory
        still to decide (each fit gets its own; a resumed run continues in its own)."""
        self.fingerprint = fingerprint
        self.restored = restored
        self.resume_changes = dict(changes or {})
        self.configured_optimizers = None
        self.run_dir = None
        self.base = None


__all__ = ["RunSession"]
