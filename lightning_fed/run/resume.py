"""Which checkpoint ``ckpt_path`` names, and whether this configuration may resume it.

``ckpt_path`` is one of:

- ``"last"``: the newest checkpoint of the newest run *of this configuration* in ``<default_root_dir>/runs`` (in
  ``run_dir`` when that is given). Runs of other configurations in the same root are never picked; when there are
  runs but none matches, the error names the closest one and what differs.
- a run directory, or a run id (the name of a directory in ``<default_root_dir>/runs``): that run's newest checkpoint.
- a checkpoint file.
- Lightning's ``"best"``, ``"hpc"`` and ``"registry..."``, passed on unchanged.

A named run or file is checked against this configuration's fingerprint (:mod:`lightning_fed.run.fingerprint`): any
difference not named in ``resume_allow_changes`` is an error listing each key with its old and new value.
``"last"`` with nothing to resume is an error too: a resume that silently starts afresh (or tests a random
initialisation) is worse than no resume.

A checkpoint is verified before it is used (:mod:`lightning_fed.run.integrity`: every zip entry's CRC, and the keys
Lightning restores from). A run (by ``"last"``, its directory or its id) resumes from its newest intact checkpoint,
warning about the damaged ones skipped; a file named by the user is refused when damaged, naming an intact checkpoint
of its run. ``"last"`` skips, with a warning, a run none of whose checkpoints can be read.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch import LightningDataModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn

from lightning_fed.run.fingerprint import (
    Fingerprint,
    differences,
    experiment_fingerprint,
    format_differences,
    is_allowed,
)
from lightning_fed.run.identity import CHECKPOINTS_DIR, RUNS_DIR, checkpoint_dir, runs_root
from lightning_fed.run.integrity import CorruptCheckpointError, checkpoint_files, describe, read_checkpoint

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule

    from lightning_fed.trainer import FederatedTrainer

# Lightning's own names for a checkpoint, resolved by Lightning.
_LIGHTNING_NAMES = ("best", "hpc")


class ResumeError(ValueError):
    """``ckpt_path`` names nothing to resume, or a run of another configuration."""


@dataclass
class ResumeTarget:
    """What a ``ckpt_path`` resolved to.

    Attributes:
        checkpoint: The path (or Lightning name) to hand to Lightning; ``None`` for a fresh start.
        run_dir: The run directory the checkpoint belongs to, which a resumed fit continues; ``None`` when it belongs
            to none (a file elsewhere, a Lightning name, a fresh start).
        changes: The fingerprint keys that differ from the checkpoint's and are allowed to.
    """

    checkpoint: str | None = None
    run_dir: Path | None = None
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest intact checkpoint of ``directory`` (a run directory or a ``checkpoints/`` folder), in the order of
    :func:`~lightning_fed.run.integrity.checkpoint_files`, skipping those that fail
    :func:`~lightning_fed.run.integrity.read_checkpoint`; ``None`` when there is none."""
    for path in checkpoint_files(_folder(directory)):
        try:
            read_checkpoint(path)
        except CorruptCheckpointError:
            continue
        return path
    return None


def _folder(directory: Path) -> Path:
    return directory if directory.name == CHECKPOINTS_DIR else checkpoint_dir(directory)


def _fingerprint_of(checkpoint: Mapping[str, Any]) -> Fingerprint | None:
    try:
        fingerprint = checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["federated"].get("fingerprint")
    except (KeyError, TypeError, AttributeError):
        return None
    return dict(fingerprint) if fingerprint is not None else None


def checkpoint_fingerprint(path: Path) -> Fingerprint | None:
    """The experiment fingerprint a checkpoint carries; ``None`` for a checkpoint saved without one.

    Only the pickled structure is read (the tensors stay on disk, mapped); :func:`read_checkpoint` checks the CRCs.

    Raises:
        ResumeError: When the file cannot be read as a checkpoint.
    """
    try:
        return _fingerprint_of(read_checkpoint(path, verify=False))
    except CorruptCheckpointError as error:
        raise ResumeError(f"`ckpt_path`: cannot read the checkpoint {error}") from error


def compare(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The differences between a checkpoint's fingerprint and this one, over the groups this one describes.

    A ``validate``/``test`` call given dataloaders rather than a datamodule has no ``data`` group to compare.
    """
    groups = {key.split(".", 1)[0] for key in new}
    return {key: change for key, change in differences(old, new).items() if key.split(".", 1)[0] in groups}


def _blocking(diff: Mapping[str, tuple[Any, Any]], allowed: Iterable[str]) -> dict[str, tuple[Any, Any]]:
    allowed = list(allowed)
    return {key: change for key, change in diff.items() if not is_allowed(key, allowed)}


def resolve_ckpt_path(
    trainer: FederatedTrainer, ckpt_path: str | Path | None, fingerprint: Fingerprint
) -> ResumeTarget:
    """Resolves ``ckpt_path`` for ``fit``, ``validate`` or ``test`` and checks the configuration against it.

    Raises:
        ResumeError: Nothing to resume, no such checkpoint/run, or a run of another configuration.
    """
    if ckpt_path is None:
        return ResumeTarget()
    text = str(ckpt_path)
    if text in _LIGHTNING_NAMES or text.startswith("registry"):
        return ResumeTarget(checkpoint=text)
    allowed = trainer.resume_allow_changes
    if text == "last":
        return _last(trainer, fingerprint, allowed)
    path = Path(text)
    if path.is_dir():
        run_dir = path.parent if path.name == CHECKPOINTS_DIR else path
        return _named_run(run_dir, f"run directory {run_dir}", fingerprint, allowed)
    if path.is_file():
        parent = path.parent
        in_a_run = parent.name == CHECKPOINTS_DIR and parent.parent.parent.name == RUNS_DIR
        return _named_file(path, parent.parent if in_a_run else None, fingerprint, allowed)
    by_id = runs_root(trainer) / text
    if "/" not in text and by_id.is_dir():
        return _named_run(by_id, f"run {text}", fingerprint, allowed)
    raise ResumeError(
        f"`ckpt_path` must be 'last', a checkpoint file, a run directory or a run id in {runs_root(trainer)}; "
        f"got {text!r}, which is none of them" + (" (a link to a missing file)" if path.is_symlink() else "") + "."
    )


def _named_run(run_dir: Path, what: str, fingerprint: Fingerprint, allowed: list[str]) -> ResumeTarget:
    files = checkpoint_files(checkpoint_dir(run_dir))
    if not files:
        raise ResumeError(f"`ckpt_path`: {what} has no checkpoint in {checkpoint_dir(run_dir)} to resume from.")
    checkpoint, saved = _newest_intact(files)
    return _checked(checkpoint, saved, run_dir, fingerprint, allowed)


def _named_file(path: Path, run_dir: Path | None, fingerprint: Fingerprint, allowed: list[str]) -> ResumeTarget:
    """A file named by the user resumes only as it is: a corrupt one is refused, offering an intact one of its run."""
    try:
        saved = _fingerprint_of(read_checkpoint(path))
    except CorruptCheckpointError as error:
        others = [other for other in checkpoint_files(path.parent) if other.resolve() != path.resolve()]
        intact = _first_intact(others) if run_dir is not None else None
        what = (
            f"resume from the run's newest intact checkpoint instead (--ckpt_path {intact[0]}) or start a new run"
            if intact is not None
            else "start a new run (leave out `ckpt_path`) or restore the file from a copy"
        )
        raise ResumeError(f"Cannot resume from {describe(path)}: {error.reason}; {what}.") from error
    return _checked(path, saved, run_dir, fingerprint, allowed)


def _first_intact(files: list[Path]) -> tuple[Path, Fingerprint | None] | None:
    for path in files:
        try:
            return path, _fingerprint_of(read_checkpoint(path))
        except CorruptCheckpointError:
            continue
    return None


def _newest_intact(files: list[Path]) -> tuple[Path, Fingerprint | None]:
    """The newest of a run's ``files`` (newest first) that :func:`read_checkpoint` accepts, and its fingerprint; a
    warning names the newer ones that were skipped and the one used.

    Raises:
        ResumeError: When none of them is intact.
    """
    failures: list[CorruptCheckpointError] = []
    for path in files:
        try:
            saved = _fingerprint_of(read_checkpoint(path))
        except CorruptCheckpointError as error:
            failures.append(error)
            continue
        if failures:
            skipped = "; ".join(f"{describe(failure.path)} ({failure.reason})" for failure in failures)
            rank_zero_warn(f"Skipping the corrupt checkpoint {skipped}: resuming from the previous intact one, {path}.")
        return path, saved
    newest = failures[0]
    raise ResumeError(
        f"Cannot resume from {describe(newest.path)}: {newest.reason}, and its run has no earlier intact checkpoint;"
        " start a new run (leave out `ckpt_path`) or restore the file from a copy."
    )


def _checked(
    checkpoint: Path, saved: Fingerprint | None, run_dir: Path | None, fingerprint: Fingerprint, allowed: list[str]
) -> ResumeTarget:
    if saved is None:
        rank_zero_warn(
            f"The checkpoint {checkpoint} carries no experiment fingerprint (it was saved by an older version):"
            " whether it belongs to this configuration cannot be checked."
        )
        return ResumeTarget(str(checkpoint), run_dir)
    diff = compare(saved, fingerprint)
    blocking = _blocking(diff, allowed)
    if blocking:
        name = run_dir.name if run_dir is not None else str(checkpoint)
        raise ResumeError(
            f"Cannot resume {name}: it was run with another configuration. Differences (checkpoint -> now):\n"
            f"{format_differences(blocking)}\n"
            f"Start a new run (leave out `ckpt_path`), or allow these changes with "
            f"resume_allow_changes={sorted(blocking)} (CLI: --trainer.resume_allow_changes)."
        )
    return ResumeTarget(str(checkpoint), run_dir, diff)


def _last(trainer: FederatedTrainer, fingerprint: Fingerprint, allowed: list[str]) -> ResumeTarget:
    candidates = _candidates(trainer)
    where = trainer.run_dir or runs_root(trainer)
    if not candidates:
        raise ResumeError(
            f"`ckpt_path` is 'last' but there is nothing to resume: no checkpoint under {where}. Leave out "
            "`ckpt_path` to start a new run, or check `default_root_dir`."
        )
    scored = []
    for run_dir, files in candidates:
        readable = _first_readable(files)
        if isinstance(readable, CorruptCheckpointError):
            # Its configuration cannot be told: one damaged run must not block every other run of the root.
            name = f"run {run_dir.name}" if run_dir is not None else f"the checkpoints in {files[0].parent}"
            rank_zero_warn(f"`ckpt_path` 'last' skips {name}: none of its checkpoints can be read ({readable}).")
            continue
        checkpoint, saved = readable
        diff = {} if saved is None else compare(saved, fingerprint)
        scored.append((_blocking(diff, allowed), run_dir, checkpoint, files))
    if not scored:
        raise ResumeError(
            f"`ckpt_path` is 'last' but there is nothing to resume: none of the {len(candidates)} run(s) under "
            f"{where} has a readable checkpoint. Leave out `ckpt_path` to start a new run."
        )
    matching = [entry for entry in scored if not entry[0]]
    if matching:
        _, run_dir, _, files = max(matching, key=lambda entry: entry[2].stat().st_mtime)
        # The fingerprint was read from the structure alone; the CRCs of the run's checkpoints are checked now.
        checkpoint, saved = _newest_intact(files)
        return _checked(checkpoint, saved, run_dir, fingerprint, allowed)
    blocking, run_dir, checkpoint, _ = min(scored, key=lambda entry: (len(entry[0]), -entry[2].stat().st_mtime))
    closest = run_dir.name if run_dir is not None else str(checkpoint)
    raise ResumeError(
        f"`ckpt_path` is 'last' but none of the {len(scored)} run(s) under {where} has this configuration. "
        f"The closest, {closest}, differs in (checkpoint -> now):\n{format_differences(blocking)}\n"
        f"Start a new run (leave out `ckpt_path`), or resume it with resume_allow_changes={sorted(blocking)} "
        "(CLI: --trainer.resume_allow_changes)."
    )


def _first_readable(files: list[Path]) -> tuple[Path, Fingerprint | None] | CorruptCheckpointError:
    """The newest of ``files`` whose structure loads (CRCs unchecked: every run of the root is read), and its
    fingerprint; else the newest file's error."""
    errors: list[CorruptCheckpointError] = []
    for path in files:
        try:
            return path, _fingerprint_of(read_checkpoint(path, verify=False))
        except CorruptCheckpointError as error:
            errors.append(error)
    return errors[0]


def _candidates(trainer: FederatedTrainer) -> list[tuple[Path | None, list[Path]]]:
    """``(run dir, its checkpoints, newest first)`` of every run that ``"last"`` may resume."""
    if trainer.run_dir:
        run_dirs = [Path(trainer.run_dir)]
    else:
        root = runs_root(trainer)
        run_dirs = sorted(path for path in root.iterdir() if path.is_dir()) if root.is_dir() else []
    found: list[tuple[Path | None, list[Path]]] = []
    for run_dir in run_dirs:
        files = checkpoint_files(checkpoint_dir(run_dir))
        if files:
            found.append((run_dir, files))
    # A checkpoint callback given a directory of its own keeps its runs' checkpoints there, as in plain Lightning.
    for callback in trainer.checkpoint_callbacks:
        if (
            isinstance(callback, ModelCheckpoint)
            and callback not in trainer.session.run_checkpoints
            and callback.dirpath
        ):
            files = checkpoint_files(Path(callback.dirpath))
            if files:
                found.append((None, files))
    return found


def warn_allowed_changes(target: ResumeTarget) -> None:
    """Says which allowed settings changed when a run is resumed, so the log of the run tells."""
    if target.changes:
        rank_zero_warn(
            f"Resuming {target.run_dir.name if target.run_dir else target.checkpoint} with changed settings "
            f"(allowed by `resume_allow_changes`):\n{format_differences(target.changes)}"
        )


def evaluation_checkpoint(
    trainer: FederatedTrainer,
    model: LightningModule | None,
    dataloaders: Any,
    datamodule: Any,
    ckpt_path: str | Path | None,
) -> str | None:
    """The checkpoint ``validate``/``test`` should load: ``ckpt_path`` resolved as ``fit`` resolves it."""
    if ckpt_path is None:
        return None
    if datamodule is None and isinstance(dataloaders, LightningDataModule):
        datamodule = dataloaders
    if datamodule is None and dataloaders is None:
        datamodule = getattr(trainer, "datamodule", None)
    module = model if model is not None else trainer.lightning_module
    fingerprint = experiment_fingerprint(trainer, module, datamodule)
    return resolve_ckpt_path(trainer, ckpt_path, fingerprint).checkpoint


def check_resumable(
    trainer: FederatedTrainer,
    model: LightningModule,
    datamodule: Any,
    stage: str,
    ckpt_path: str | Path | None,
) -> None:
    """Decides, before a run starts, whether ``ckpt_path`` may be resumed (``fit``) or evaluated (``validate``,
    ``test``), as the run itself will decide it.

    ``lightning-fed`` calls this while it holds back Lightning's output, so that a refused resume is the one line
    that names what to change, not the last line after Lightning's banner (``Seed set to 0``, ``GPU available``,
    ...). The warnings the resolution gives (a corrupt checkpoint skipped) are left to the run, which resolves
    ``ckpt_path`` again and gives them once.

    Raises:
        ResumeError: As :func:`resolve_ckpt_path` or :func:`evaluation_checkpoint` raise it.
    """
    if ckpt_path is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if stage == "fit":
            resolve_ckpt_path(trainer, ckpt_path, experiment_fingerprint(trainer, model, datamodule))
        else:
            evaluation_checkpoint(trainer, model, None, datamodule, ckpt_path)


def check_restored_fingerprint(saved: Any, current: Any, allowed: list[str]) -> None:
    """Refuses a restored checkpoint whose fingerprint differs from this fit's in keys not ``allowed``."""
    if saved is None or current is None:
        return
    blocking = [key for key in compare(saved, current) if not is_allowed(key, allowed)]
    if blocking:
        raise ResumeError(
            f"The checkpoint was saved by a run of another configuration (differing: {', '.join(blocking)});"
            " allow the changes with `resume_allow_changes` or start a new run."
        )


__all__ = [
    "ResumeError",
    "ResumeTarget",
    "check_restored_fingerprint",
    "check_resumable",
    "checkpoint_fingerprint",
    "compare",
    "evaluation_checkpoint",
    "latest_checkpoint",
    "resolve_ckpt_path",
    "warn_allowed_changes",
]
