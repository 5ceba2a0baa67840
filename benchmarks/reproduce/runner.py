"""Runs the experiments: one ``lightning-fed fit`` each, in parallel subprocesses (or in this process, for tests).

Each run writes into ``<out_dir>/runs/<name>/``: ``summary.json`` (the trainer's), ``run.log`` (its output),
``status.json`` (ok or failed, the error, wall time, the exact command, its fingerprint and the git commit) and,
when W&B is on, its W&B run; and, unless told not to, its record (:mod:`benchmarks.reproduce.records`), the
committed data the reports can be rebuilt from. A failed run is recorded and the others go on. A run whose
``status.json`` says it finished with the same fingerprint can be read back instead of run again
(:func:`finished_results`): a profile of a hundred runs survives a stopped machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.load import LoadRecord, LoadRecorder, mark
from benchmarks.reproduce.experiments import Experiment

OK, FAILED = "ok", "failed"
NOT_RUN = "not run (no status.json)"
"""The error of a :class:`RunResult` that :func:`load_results` makes up for a run that never started."""
_LOG_TAIL_CHARS = 2000


@dataclass
class RunResult:
    """What became of one run."""

    name: str
    status: str
    run_dir: str
    wall_s: float
    command: str
    error: str | None = None
    experiment: str = ""
    seed: int | None = None
    load: dict[str, Any] | None = None
    """The load around the run (:meth:`benchmarks.load.LoadRecord.to_dict`); ``None`` in older ``status.json``."""
    fingerprint: str = ""
    """:func:`run_fingerprint` of the run's command and YAML files; empty in older ``status.json``."""
    commit: dict[str, Any] | None = None
    """The git commit of the tree that ran it (:func:`benchmarks.reproduce.records.git_commit`); ``None`` in older
    ``status.json``."""
    environment: dict[str, Any] | None = None
    """The machine and Python environment that ran it (:func:`benchmarks.reproduce.records.environment`); ``None``
    in older ``status.json``."""

    def __post_init__(self) -> None:
        self.experiment = self.experiment or self.name

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def load_record(self) -> LoadRecord | None:
        """The load around the run, ``None`` where it was not recorded (a ``status.json`` from before)."""
        return None if self.load is None else LoadRecord.from_dict(self.load)

    @property
    def wall_mark(self) -> str:
        """``*`` after the wall time when the run was timed at a load above the cores (``benchmarks/load.py``)."""
        record = self.load_record
        return "" if record is None else mark(record)

    def summary(self) -> dict[str, Any]:
        return json.loads((Path(self.run_dir) / "summary.json").read_text())


@dataclass(frozen=True)
class WandbOptions:
    """Where the runs log in W&B (offline without credentials; see :class:`lightning_fed.loggers.WandbLogger`)."""

    project: str = "lightning-fed-reproduce"
    group: str = "small"


def run_dir_of(out_dir: Path, name: str) -> Path:
    return out_dir / "runs" / name


def fit_args(
    experiment: Experiment,
    profile: str,
    run_dir: Path,
    root: Path,
    wandb: WandbOptions | None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``lightning-fed fit`` arguments of one run: its YAML files (absolute), sweep and profile overrides,
    ``extra``, then where it writes and what it logs to."""
    args = [str(root / part) if part.endswith(".yaml") else part for part in experiment.cli_args(profile)]
    logger = ["--trainer.logger", "false"]
    if wandb is not None:
        logger = [
            "--trainer.logger",
            "lightning_fed.loggers.WandbLogger",
            "--trainer.logger.init_args.project",
            wandb.project,
            "--trainer.logger.init_args.group",
            wandb.group,
            "--trainer.logger.init_args.name",
            experiment.run_name,
            "--trainer.logger.init_args.save_dir",
            str(run_dir),
        ]
    # No checkpoints: a reproduction run is rerun, not resumed, and saving every round costs time.
    placement = [
        "--trainer.run_dir",
        str(run_dir),
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.enable_progress_bar",
        "false",
    ]
    return ["fit", *args, *extra, *placement, *logger]


def shown_command(args: Sequence[str], root: Path) -> str:
    """The command line as the report shows it: paths relative to the repository root, so that it reads the same
    on every machine."""
    return shlex.join(["lightning-fed", *args]).replace(f"{root}/", "")


def run_fingerprint(experiment: Experiment, command: str, root: Path) -> str:
    """What decides a run's outcome, hashed: its command line and the bytes of every YAML file it composes.

    A preset edited after a run (a new tuned choice, say) changes the fingerprint, so it is run again.
    """
    digest = hashlib.sha256(command.encode())
    for config in experiment.configs:
        path = root / config
        digest.update(config.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<missing>") + b"\0")
    return digest.hexdigest()


def finished_result(
    experiment: Experiment,
    profile: str,
    out_dir: Path,
    root: Path,
    wandb: WandbOptions | None = None,
    extra: Sequence[str] = (),
) -> RunResult | None:
    """The recorded result of ``experiment`` when an earlier invocation finished it with the same fingerprint (same
    command, same YAML bytes) and a complete ``summary.json``; ``None`` when it must run."""
    run_dir = run_dir_of(out_dir, experiment.run_name)
    status = run_dir / "status.json"
    if not status.is_file():
        return None
    result = RunResult(**json.loads(status.read_text()))
    command = shown_command(fit_args(experiment, profile, run_dir, root, wandb, extra), root)
    if not result.ok or result.fingerprint != run_fingerprint(experiment, command, root):
        return None
    return result if _check_summary(run_dir) is None else None


def finished_results(
    experiments: Sequence[Experiment],
    profile: str,
    out_dir: Path,
    root: Path,
    wandb: WandbOptions | None = None,
    extra: Sequence[str] = (),
) -> dict[str, RunResult]:
    """Run name -> recorded result, for the ``experiments`` :func:`finished_result` finds finished (what ``--resume``
    reads back instead of running)."""
    found = {run.run_name: finished_result(run, profile, out_dir, root, wandb, extra) for run in experiments}
    return {name: result for name, result in found.items() if result is not None}


def _check_summary(run_dir: Path) -> str | None:
    """``None`` when the run wrote a complete summary, else what is wrong."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return "no summary.json was written"
    summary = json.loads(path.read_text())
    if summary.get("completed_rounds") != summary.get("num_rounds"):
        return f"stopped after {summary.get('completed_rounds')} of {summary.get('num_rounds')} rounds"
    return None


def _log_tail(log_path: Path) -> str:
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    return text[-_LOG_TAIL_CHARS:].strip()


def _run_subprocess(
    args: list[str], log_path: Path, root: Path, env: dict[str, str], timeout_s: float | None
) -> str | None:
    command = [sys.executable, "-m", "lightning_fed.cli.main", *args]
    with log_path.open("w") as log:
        try:
            code = subprocess.run(
                command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout_s:g} s"
    return None if code == 0 else f"exit code {code}"


def _run_in_process(args: list[str], log_path: Path) -> str | None:
    from lightning_fed.cli import FederatedCLI

    with log_path.open("w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            FederatedCLI(args=args)
        except (Exception, SystemExit) as error:
            traceback.print_exc(file=log)
            return f"{type(error).__name__}: {error}"
        finally:
            wandb = sys.modules.get("wandb")
            # An open W&B run would be reused by the next run's logger.
            if wandb is not None and wandb.run is not None:
                wandb.finish()
    return None


def run_one(
    experiment: Experiment,
    profile: str,
    out_dir: Path,
    root: Path,
    wandb: WandbOptions | None = None,
    extra: Sequence[str] = (),
    in_process: bool = False,
    threads: int = 1,
    timeout_s: float | None = None,
    records_dir: Path | None = None,
    commit: dict[str, Any] | None = None,
) -> RunResult:
    """Runs one experiment and records its status; never raises for a failed run.

    ``records_dir``: the record set the run's record is written to (none when ``None``); ``commit``: the tree that
    runs it, as :func:`benchmarks.reproduce.records.git_commit` gives it (asked of git under ``root`` when ``None``).
    """
    from benchmarks.reproduce.records import environment, git_commit, record_run  # records builds on this module

    commit = git_commit(root) if commit is None else commit
    run_dir = run_dir_of(out_dir, experiment.run_name)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").unlink(missing_ok=True)
    args = fit_args(experiment, profile, run_dir, root, wandb, extra)
    command = shown_command(args, root)
    # The run's own cores are its threads; the other workers running beside it count as the load of others. They
    # are started from threads of this same process, so they share its process tree: the load average judges alone.
    with LoadRecorder(threads, measure_others=False) as load:
        start = time.perf_counter()
        missing = experiment.missing_configs(root)
        if missing:
            error: str | None = f"config not found: {', '.join(missing)}"
        elif in_process:
            error = _run_in_process(args, run_dir / "run.log")
        else:
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            env["WANDB_SILENT"] = "true"
            error = _run_subprocess(args, run_dir / "run.log", root, env, timeout_s)
        wall_s = time.perf_counter() - start
    error = error or _check_summary(run_dir)
    if error and not missing:
        tail = _log_tail(run_dir / "run.log")
        error = f"{error}\n{tail}" if tail else error
    status = FAILED if error else OK
    result = RunResult(
        experiment.run_name,
        status,
        str(run_dir),
        wall_s,
        command,
        error,
        experiment.name,
        experiment.seed,
        load.record.to_dict(),
        run_fingerprint(experiment, command, root),
        commit,
        environment(),
    )
    (run_dir / "status.json").write_text(json.dumps(asdict(result), indent=2))
    if records_dir is not None:
        record_run(result, records_dir, commit)
    return result


def run_all(
    experiments: Sequence[Experiment],
    profile: str,
    out_dir: Path,
    root: Path,
    workers: int = 2,
    in_process: bool = False,
    on_done: Callable[[RunResult], None] | None = None,
    finished: Mapping[str, RunResult] | None = None,
    **kwargs: Any,
) -> list[RunResult]:
    """Runs ``experiments`` on ``workers`` parallel subprocesses (sequentially in this process when
    ``in_process``); returns the results in the order given. The runs in ``finished`` (run name -> result, from
    :func:`finished_results`) are read back, not run (``on_done`` is not called for them). ``kwargs`` go to
    :func:`run_one`."""
    if workers < 1:
        raise ValueError(f"`workers` must be at least 1, got {workers}.")
    if kwargs.get("commit") is None:
        from benchmarks.reproduce.records import git_commit

        kwargs["commit"] = git_commit(root)  # one tree for the whole invocation
    if finished:
        todo = [run for run in experiments if run.run_name not in finished]
        ran = iter(run_all(todo, profile, out_dir, root, workers, in_process, on_done, **kwargs))
        return [finished.get(run.run_name) or next(ran) for run in experiments]

    def one(experiment: Experiment) -> RunResult:
        result = run_one(experiment, profile, out_dir, root, in_process=in_process, **kwargs)
        if on_done is not None:
            on_done(result)
        return result

    if in_process or workers == 1:
        return [one(experiment) for experiment in experiments]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, experiments))


def load_results(
    out_dir: Path, experiments: Sequence[Experiment], recorded: Mapping[str, RunResult] | None = None
) -> list[RunResult]:
    """The recorded results of earlier runs (``status.json``), else their records (``recorded``, run name -> result,
    from :func:`benchmarks.reproduce.records.recorded_results`); a run found in neither counts as failed."""
    results = []
    for experiment in experiments:
        run_dir = run_dir_of(out_dir, experiment.run_name)
        path = run_dir / "status.json"
        if path.is_file():
            results.append(RunResult(**json.loads(path.read_text())))
        elif recorded and experiment.run_name in recorded:
            results.append(recorded[experiment.run_name])
        else:
            results.append(
                RunResult(
                    experiment.run_name,
                    FAILED,
                    str(run_dir),
                    0.0,
                    "",
                    NOT_RUN,
                    experiment.name,
                    experiment.seed,
                )
            )
    return results


__all__ = [
    "FAILED",
    "NOT_RUN",
    "OK",
    "RunResult",
    "WandbOptions",
    "finished_result",
    "finished_results",
    "fit_args",
    "load_results",
    "run_all",
    "run_fingerprint",
    "run_one",
    "shown_command",
]
