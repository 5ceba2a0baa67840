"""SIGTERM to a 2-process run (``strategy="ddp"``, gloo): both ranks stop at the same client boundary, exit 143, one
line is printed (by rank 0), the last completed round's checkpoint is intact and the resumed run ends bit-identical
to an uninterrupted 2-process run.

The signal is real: rank 0 pauses after its first client of round 1 (``Pauser``) while rank 1 trains on and waits at
the next client boundary; the test sends SIGTERM to the launching process (rank 0), whose handler passes it on to
the rank it launched, as a scheduler's signal to the job would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.resume import _equal, run_script_until_sigterm

# Two processes per test: the slow tier (`python -m pytest -q -m slow`, run by .ci/run).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "helpers" / "distributed_run.py"
LINE = "lightning-fed: interrupted by SIGTERM after round 1; resume with --ckpt_path last"


def _env() -> dict[str, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _command(root: Path, *args: str) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    return [sys.executable, str(SCRIPT), str(root), str(root / "out.pt"), "--devices", "2", *args]


def _ranks(root: Path) -> list[dict]:
    return [torch.load(root / f"out.pt.rank{r}", weights_only=True) for r in range(2)]


def test_sigterm_stops_both_ranks_at_one_boundary_and_resumes_bit_identical(tmp_path):
    reference_dir, root, marker = tmp_path / "reference", tmp_path / "stopped", tmp_path / "paused"
    reference = subprocess.Popen(
        _command(reference_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env()
    )
    try:
        pause = ["--pause-round", "1", "--pause-client-index", "0", "--marker", str(marker)]
        stopped = run_script_until_sigterm(marker, command=_command(root, *pause), env=_env(), timeout=240)
        assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-4000:]
        assert [line for line in stopped.stderr.splitlines() if "SIGTERM" in line] == [LINE]
        assert "Traceback" not in stopped.stderr
        assert not list(root.glob("out.pt.rank*"))
        # Rank 0 trained 1 of its 2 clients of round 1; rank 1 at most its own 2.
        trained = (tmp_path / "paused.clients").read_text().split()
        assert sum(entry.startswith("0/") for entry in trained) == 4
        assert 1 <= sum(entry.startswith("1/") for entry in trained) <= 3
        checkpoints = sorted(p.name for p in (root / "run" / "checkpoints").iterdir())
        assert checkpoints == ["last.ckpt", "round0000.ckpt"]
        resumed = subprocess.run(_command(root, "--resume"), capture_output=True, text=True, env=_env(), timeout=240)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert reference.wait(timeout=240) == 0
    finally:
        reference.kill()
    results, expected = _ranks(root), _ranks(reference_dir)
    for rank in range(2):
        # Only the rounds after the checkpoint ran again.
        assert {key.split("/")[0] for key in results[rank]["client_models"]} <= {"1", "2"}
        for key in ("weights", "store", "callback_states", "aggregator_state", "global_step"):
            assert _equal(results[rank][key], expected[rank][key]), f"rank {rank}: {key} differs after resume"
