"""Checks that a run killed with SIGKILL (or stopped by SIGTERM) mid-round and resumed from `last` ends bit-identical.

Algorithms with state use it as::

    assert_resume_bit_identical(tmp_path, "--callback", "lightning_fed.callbacks.FedCurv={\\"lam\\": 1.0}")
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

SCRIPT = Path(__file__).parent / "resume_run.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def run_script_until_sigterm(
    marker: Path, *args: str, command: list[str] | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Starts a run that pauses at a client boundary (it writes ``marker`` and waits for ``marker.go``), sends it a
    real SIGTERM with ``os.kill`` once it has paused, lets it go on, and returns how it ended. ``command``: the run to
    start (default: ``resume_run.py`` with ``args``); ``env``: its environment."""
    command = command if command is not None else [sys.executable, str(SCRIPT), *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as process:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                stdout, stderr = process.communicate()
                raise AssertionError(f"the run never paused (status {process.returncode}):\n{stderr[-4000:]}")
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGTERM)
        Path(f"{marker}.go").touch()
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)  # NaN == NaN here


def _without_times(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if not k.startswith("time/")} for entry in history]


def assert_resume_bit_identical(
    tmp_path: Path, *algorithm_args: str, kill_round: int = 2, client_index: int = 1
) -> dict:
    """Runs uninterrupted, then killed at (kill_round, client_index) and resumed; asserts identical end states."""
    reference_dir, resumed_dir = tmp_path / "reference", tmp_path / "resumed"
    done = run_script(str(reference_dir), str(reference_dir / "out.pt"), *algorithm_args)
    assert done.returncode == 0, done.stderr[-4000:]
    killed = run_script(
        str(resumed_dir),
        str(resumed_dir / "never.pt"),
        *algorithm_args,
        "--kill-round",
        str(kill_round),
        "--kill-client-index",
        str(client_index),
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    resumed = run_script(str(resumed_dir), str(resumed_dir / "out.pt"), *algorithm_args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return assert_same_end_state(reference_dir / "out.pt", resumed_dir / "out.pt", rounds_run_here=4 - kill_round)


def assert_same_end_state(reference_out: Path, resumed_out: Path, rounds_run_here: int) -> dict:
    """The resumed run (which ran ``rounds_run_here`` rounds itself) ended where the reference did, bit for bit."""
    reference = torch.load(reference_out, weights_only=True)
    result = torch.load(resumed_out, weights_only=True)
    assert result["rounds_run_here"] == rounds_run_here, "the resumed run did not start from the checkpoint"
    for name, tensor in reference["weights"].items():
        assert torch.equal(result["weights"][name], tensor), f"{name} differs after resume"
    assert _without_times(result["history"]) == _without_times(reference["history"])
    for key in ("store", "callback_states", "aggregator_state", "clients_seen"):
        assert _equal(result[key], reference[key]), f"{key} differs after resume"
    return result
