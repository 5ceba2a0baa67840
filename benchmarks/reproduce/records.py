"""A run's result as committed data: one small compressed JSON record per run, under
``benchmarks/reproduce/records/<set>/`` (``<set>`` is ``<protocol>-<profile>``, ``-tune`` for a search).

``runs/`` is not committed, so a report rebuilt from it cannot be checked by anyone else. A record holds what the
reports read from a run, and what says where it came from:

* ``run``, ``experiment``, ``seed``, ``status``, ``error``, ``wall_s``, ``load`` and ``command``: the runner's
  ``status.json``;
* ``run_fingerprint`` (the command and the bytes of every YAML file it composes, :func:`runner.run_fingerprint`)
  and ``summary.fingerprint`` (the trainer's experiment fingerprint);
* ``commit``: the git commit of the tree that ran it (``id``, ``dirty``, and ``source``: ``git`` when the runner
  asked git, ``declared`` when the record was extracted later and the tree is the one
  ``records/RUN_SETS.json`` names for the set);
* ``environment``: what the digits depend on besides the tree (:func:`environment`): Python, torch and numpy
  versions, the CPU model, its cores and the platform. The runner records its own; an extracted record has one only
  when the extraction declares it ran on the machine and environment that made the runs (``None`` otherwise): two
  machines that differ here give the same verdicts but not always the same digits (REPRODUCTION.md, errata);
* ``summary``: the trainer's ``summary.json`` with its per-round ``history`` stored by column (each metric's values
  over the rounds, ``null`` where a round did not log it), without ``final`` (the last round of the history, rebuilt
  on reading) and without the machine's run directory.

The runner writes a record after every run (:func:`write_record`); :func:`extract_records` makes them from run
directories an older runner wrote; :func:`recorded_results` reads them back as the runner's results, so that
``lightning-fed reproduce --report-only`` works from the records alone.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.reproduce.experiments import Experiment
from benchmarks.reproduce.runner import RunResult

#: Where the committed records live: one folder per run set.
RECORDS_DIR = Path(__file__).resolve().parent / "records"
FORMAT = 1
_SUFFIX = ".json.gz"
#: Summary keys a record leaves out: machine paths, and ``final``, which is the history's last entry.
_DROPPED = ("run_dir", "run_id", "final", "history")
#: What a record and a copied report write for the runs' output directory.
OUT_DIR = "<out-dir>"
_ERROR_CHARS = 2000


def set_name(protocol: str, profile: str, tune: bool = False, exploratory: str | None = None) -> str:
    """The record set of an invocation: ``v2-small``, ``v2-small-tune``, ``v2-exploratory-<name>``."""
    if exploratory:
        return f"{protocol}-exploratory-{exploratory}"
    return f"{protocol}-{profile}" + ("-tune" if tune else "")


def set_dir(name: str) -> Path:
    """The committed folder of record set ``name`` (:data:`RECORDS_DIR` read when called, so a test can move it)."""
    return RECORDS_DIR / name


def git_commit(root: Path) -> dict[str, Any]:
    """The checkout's commit and whether its tracked files differ from it; ``id`` None outside a git checkout."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"id": commit, "dirty": bool(dirty) if commit else None, "source": "git" if commit else None}


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what :func:`platform.processor` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def environment(source: str = "runner") -> dict[str, Any]:
    """This machine and Python environment, as a record keeps them: what a run's digits depend on besides its tree.
    ``source`` says who vouches that the runs had it (``runner``: the runner, which started them here)."""
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "source": source,
    }


def _columns(history: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    keys: dict[str, None] = {}
    for entry in history:
        keys.update(dict.fromkeys(entry))
    return {key: [entry.get(key) for entry in history] for key in keys}


def _rows(columns: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    length = max((len(values) for values in columns.values()), default=0)
    return [
        {key: values[index] for key, values in columns.items() if values[index] is not None} for index in range(length)
    ]


def compact_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary.json`` as a record stores it (history by column, no paths, no ``final``)."""
    kept = {key: value for key, value in summary.items() if key not in _DROPPED}
    kept["history_columns"] = _columns(summary.get("history", []))
    return kept


def expand_summary(compact: Mapping[str, Any]) -> dict[str, Any]:
    """The summary a report reads, rebuilt from :func:`compact_summary`."""
    summary = {key: value for key, value in compact.items() if key != "history_columns"}
    history = _rows(compact.get("history_columns", {}))
    summary["history"] = history
    summary["final"] = history[-1] if history else {}
    return summary


def without_out_dir(text: str, out_dir: Path | str) -> str:
    """``text`` with the output directory ``out_dir`` (a path of the machine that ran the runs) written as
    :data:`OUT_DIR`, so that what is committed names no machine's paths."""
    return re.sub(re.escape(str(out_dir)) + r"(?![\w.-])", OUT_DIR, text)


def copy_beside_records(source: Path, records_dir: Path, name: str, out_dir: Path | str) -> Path:
    """A generated report (or its ``reproduction.json``) written as ``<records_dir>/<name>``, beside the records it
    was built from, with the output directory ``out_dir`` written as :data:`OUT_DIR`: the copy is committed, and
    names no machine's paths."""
    records_dir.mkdir(parents=True, exist_ok=True)
    target = records_dir / name
    target.write_text(without_out_dir(source.read_text(), out_dir))
    return target


def make_record(
    result: RunResult,
    summary: Mapping[str, Any] | None,
    commit: Mapping[str, Any],
    environment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of one run: its status, where it came from (its tree and, where known, its environment), and
    (when it wrote one) its summary. The output directory the run's directory lies in (``<out>`` of
    ``<out>/runs/<run>``) is written as :data:`OUT_DIR` in its command and error."""
    out_dir = Path(result.run_dir).parent.parent if result.run_dir else None

    def scrubbed(text: str | None) -> str | None:
        return text if text is None or out_dir is None else without_out_dir(text, out_dir)

    error = None if result.error is None else result.error[-_ERROR_CHARS:]
    return {
        "format": FORMAT,
        "run": result.name,
        "experiment": result.experiment,
        "seed": result.seed,
        "status": result.status,
        "error": scrubbed(error),
        "wall_s": result.wall_s,
        "load": result.load,
        "command": scrubbed(result.command),
        "run_fingerprint": result.fingerprint,
        "commit": dict(commit),
        "environment": None if environment is None else dict(environment),
        "summary": None if summary is None else compact_summary(summary),
    }


RUN_SETS = RECORDS_DIR / "RUN_SETS.json"


def declared_commit(set_name: str, experiment: str | None = None, run_sets: Path = RUN_SETS) -> dict[str, Any] | None:
    """The tree ``records/RUN_SETS.json`` declares for a run set (for ``experiment``, where the set ran on two
    trees), as a record's ``commit``: ``{"id", "dirty": None, "source": "declared", "tree": name}``; ``None`` when
    the set declares none."""
    if not run_sets.is_file():
        return None
    payload = json.loads(run_sets.read_text())
    entry = payload.get("sets", {}).get(set_name)
    if entry is None:
        return None
    name = entry.get("tree_by_experiment", {}).get(experiment, entry.get("tree"))
    tree = payload.get("trees", {}).get(name) if name else None
    if tree is None:
        return None
    return {"id": tree.get("commit") or tree.get("tree"), "dirty": None, "source": "declared", "tree": name}


def record_path(set_dir: Path, run_name: str) -> Path:
    return set_dir / f"{run_name}{_SUFFIX}"


def write_record(set_dir: Path, record: Mapping[str, Any]) -> Path:
    """Writes ``record`` as ``<set_dir>/<run>.json.gz``; the bytes depend on the record only (no time stamp in the
    gzip header), so an unchanged run leaves an unchanged file."""
    set_dir.mkdir(parents=True, exist_ok=True)
    path = record_path(set_dir, record["run"])
    data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    temporary.replace(path)
    return path


def read_record(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    if record.get("format") != FORMAT:
        raise ValueError(f"{path}: record format {record.get('format')!r}, this code reads format {FORMAT}.")
    return record


def read_records(set_dir: Path) -> dict[str, dict[str, Any]]:
    """Run name -> record, for every record of the set (empty when the folder does not exist)."""
    if not set_dir.is_dir():
        return {}
    return {path.name[: -len(_SUFFIX)]: read_record(path) for path in sorted(set_dir.glob(f"*{_SUFFIX}"))}


@dataclass
class RecordedResult(RunResult):
    """A :class:`RunResult` read from a record: its summary comes from the record, not from a run directory."""

    recorded_summary: dict[str, Any] | None = field(default=None, repr=False)
    commit: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        if self.recorded_summary is None:
            raise FileNotFoundError(f"the record of {self.name!r} holds no summary (status {self.status})")
        return expand_summary(self.recorded_summary)


def result_of(record: Mapping[str, Any], set_dir: Path) -> RecordedResult:
    """The runner's result of a record (its ``run_dir`` names the record file)."""
    return RecordedResult(
        name=record["run"],
        status=record["status"],
        run_dir=str(record_path(set_dir, record["run"])),
        wall_s=record["wall_s"],
        command=record["command"],
        error=record["error"],
        experiment=record["experiment"],
        seed=record["seed"],
        load=record["load"],
        fingerprint=record["run_fingerprint"],
        recorded_summary=record["summary"],
        commit=record["commit"],
    )


def recorded_results(set_dir: Path, experiments: Iterable[Experiment] | None = None) -> dict[str, RecordedResult]:
    """Run name -> result, for the records of ``set_dir`` (only those of ``experiments`` when given)."""
    records = read_records(set_dir)
    wanted = None if experiments is None else {run.run_name for run in experiments}
    return {name: result_of(record, set_dir) for name, record in records.items() if wanted is None or name in wanted}


def record_run(
    result: RunResult, set_dir: Path, commit: Mapping[str, Any], environment: Mapping[str, Any] | None = None
) -> Path:
    """Writes the record of a finished run (its summary when it wrote one), with the environment the runner stored
    with the run, else ``environment`` (one vouched for after the fact)."""
    path = Path(result.run_dir) / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else None
    return write_record(set_dir, make_record(result, summary, commit, result.environment or environment))


def extract_records(
    out_dir: Path,
    set_dir: Path,
    commit_of: Callable[[RunResult], Mapping[str, Any] | None],
    experiments: Iterable[Experiment] | None = None,
    environment: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Records of the runs in ``<out_dir>/runs/*/`` that hold a ``status.json`` (only those of ``experiments`` when
    given), for run directories an older runner wrote. The tree of each is its ``status.json``'s commit when it
    has one, else ``commit_of(result)`` (the declared tree, :func:`declared_commit`); the environment is its
    ``status.json``'s when it has one, else ``environment``, the one the extraction vouches the runs had (none known
    when ``None``).

    Raises:
        ValueError: A run's tree is neither in its ``status.json`` nor given by ``commit_of``.
    """
    wanted = None if experiments is None else {run.run_name for run in experiments}
    written = []
    for status in sorted((out_dir / "runs").glob("*/status.json")):
        result = RunResult(**json.loads(status.read_text()))
        if wanted is not None and result.name not in wanted:
            continue
        commit = result.commit or commit_of(result)
        if commit is None:
            raise ValueError(f"no tree is known for run {result.name!r}: pass --commit, or declare it in RUN_SETS.json")
        written.append(record_run(result, set_dir, commit, environment))
    return written


__all__ = [
    "FORMAT",
    "OUT_DIR",
    "RECORDS_DIR",
    "RUN_SETS",
    "RecordedResult",
    "compact_summary",
    "copy_beside_records",
    "declared_commit",
    "environment",
    "expand_summary",
    "extract_records",
    "git_commit",
    "make_record",
    "read_record",
    "read_records",
    "record_path",
    "record_run",
    "recorded_results",
    "result_of",
    "set_dir",
    "set_name",
    "without_out_dir",
    "write_record",
]
