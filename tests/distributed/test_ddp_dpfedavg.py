"""DP-FedAvg over 2 CPU processes (``strategy="ddp"``, gloo) against the same run in 1 process: the clipped sums are
reduced over ranks and the noise is added once, the same on every rank, so every rank ends with one process's
model, clip norm and ε."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.distributed_run import NUM_ROUNDS, fit, result
from helpers.resume import _equal

# Two processes per test: the slow tier (`python -m pytest -q -m slow`, run by .ci/run).
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "helpers" / "distributed_run.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_processes(root: Path) -> list[dict]:
    root.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    command = [
        sys.executable,
        str(SCRIPT),
        str(root),
        str(root / "out.pt"),
        "--devices",
        "2",
        "--algorithm",
        "dpfedavg",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return [torch.load(root / f"out.pt.rank{rank}", weights_only=True) for rank in range(2)]


def _privacy(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k.startswith("privacy/")} for entry in history]


def test_dpfedavg_two_processes_equal_one(tmp_path):
    rank0, rank1 = _two_processes(tmp_path / "two")
    one = result(*fit(str(tmp_path / "one"), 1, "dpfedavg"))
    for key in ("weights", "aggregator_state"):
        assert _equal(rank0[key], rank1[key]), f"the ranks disagree on {key}"
    assert _equal(_privacy(rank0["history"]), _privacy(rank1["history"]))
    # Each rank trained only its share of the clients.
    assert rank0["client_models"] and rank1["client_models"]
    assert not rank0["client_models"].keys() & rank1["client_models"].keys()
    for name, tensor in one["weights"].items():
        torch.testing.assert_close(rank0["weights"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    assert rank0["aggregator_state"]["rounds"] == one["aggregator_state"]["rounds"] == NUM_ROUNDS
    assert abs(rank0["aggregator_state"]["clip_norm"] - one["aggregator_state"]["clip_norm"]) < 1e-9
    for two_entry, one_entry in zip(_privacy(rank0["history"]), _privacy(one["history"]), strict=True):
        assert two_entry.keys() == one_entry.keys() and "privacy/epsilon" in one_entry
        for key, value in one_entry.items():
            assert abs(two_entry[key] - value) <= 1e-9 * max(1.0, abs(value)), key
