"""A robust aggregator (NormBound over Multi-Krum) sharded over 2 CPU processes (``strategy="ddp"``, gloo) against
the same run in 1 process: the ranks gather every client's update, so they keep the same clients and reach the
same model as one process, also when the ranks hold different numbers of accepted updates (none on one rank in
the last round, which too few clients survive and so is skipped)."""

from __future__ import annotations

import pytest
from test_ddp_rounds import _assert_same_run, _launch, _one_process, _ranks, _wait

from lightning_fed.aggregators.normbound import CLIPPED_KEY
from lightning_fed.aggregators.robust import SKIPPED_KEY

# Two processes per test: the slow tier (`python -m pytest -q -m slow`, run by .ci/run).
pytestmark = pytest.mark.slow


def test_robust_aggregation_two_processes_equal_one(tmp_path):
    two_process = _launch(tmp_path / "ddp", "--algorithm", "robust")
    one = _one_process(tmp_path / "one", "robust")
    assert _wait(two_process) == 0, (tmp_path / "ddp" / "stderr.txt").read_text()[-4000:]
    two = _ranks(tmp_path / "ddp")
    _assert_same_run(two, one)
    # Each rank trained half of the clients, yet every rank selected from all six, as one process did.
    assert set(two[0]["client_models"]).isdisjoint(two[1]["client_models"])
    selected = two[0]["callback_states"][0]["selected"]
    assert selected == one["callback_states"][0]["selected"] and [len(s) for s in selected] == [3, 3, 0]
    history = two[0]["history"]
    assert [entry["clients/rejected"] for entry in history] == [0.0, 1.0, 3.0]
    assert [entry[SKIPPED_KEY] for entry in history] == [0.0, 0.0, 1.0]
    assert selected[2] == [] and two[0]["weights"]["net.0.weight"].isfinite().all()
    # The bound cut some updates and not others, so both paths of NormBound ran on the ranks.
    clipped = [entry[CLIPPED_KEY] for entry in history]
    assert 0.0 < sum(clipped) < len(clipped), clipped
