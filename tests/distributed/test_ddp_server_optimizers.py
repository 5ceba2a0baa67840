"""FedAdam over 2 CPU processes (``strategy="ddp"``, gloo) against the same run in 1 process.

Every rank steps the server optimizer from the mean reduced over ranks, so the ranks must hold the same m and v,
and those must equal one process's; the run's BatchNorm buffers take the reduced mean.
"""

from __future__ import annotations

import pytest
from test_ddp_rounds import _assert_same_run, _launch, _one_process, _ranks, _wait

# Two processes per test: the slow tier (`python -m pytest -q -m slow`, run by .ci/run).
pytestmark = pytest.mark.slow


def test_fedadam_two_processes_equal_one(tmp_path):
    process = _launch(tmp_path / "two", "--algorithm", "fedadam")
    one = _one_process(tmp_path / "one", "fedadam")
    assert _wait(process) == 0, (tmp_path / "two" / "stderr.txt").read_text()[-4000:]
    two = _ranks(tmp_path / "two")
    _assert_same_run(two, one)
    state = two[0]["aggregator_state"]
    assert state["num_steps"] == len(one["history"]) and set(state) == {"num_steps", "m", "v"}
    assert "net.1.running_var" not in state["m"]  # a buffer: averaged, never stepped
