"""benchmarks/robustness.py: the matrix's plumbing on a tiny FedAvg run, and how rules are built."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# The script belongs to the repository checkout, not to the installed library (see tests/reproduce/conftest.py).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.robustness import RULE_DEFAULTS, load_rule, main, make_rule, markdown_table, parse_rule  # noqa: E402
from lightning_fed.aggregators import FedAvg  # noqa: E402
from lightning_fed.datamodules.vision import DEBIAN_FASHION_MNIST_DIR, FASHION_MNIST_DIR_ENV  # noqa: E402


def _fashion_mnist_installed() -> bool:
    return os.path.isdir(os.environ.get(FASHION_MNIST_DIR_ENV, DEBIAN_FASHION_MNIST_DIR))


@pytest.mark.skipif(not _fashion_mnist_installed(), reason="needs the system copy of Fashion-MNIST")
def test_fedavg_row_runs_and_missing_rules_are_skipped(tmp_path, capsys):
    # main() runs its fits with 1 thread (--threads), then gives this process its own count back: the tests after
    # this one (their float sums, so their trajectories) must not depend on it having run.
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        table = main(
            [
                "--rules",
                "lightning_fed.aggregators.FedAvg",
                "lightning_fed.aggregators.NoSuchRule",
                "--fractions",
                "0",
                "0.5",
                "--attacks",
                "sign_flip",
                "alie",
                "--rounds",
                "1",
                "--clients",
                "2",
                "--samples-per-client",
                "40",
                "--data-dir",
                str(tmp_path),
            ]
        )
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "skipped lightning_fed.aggregators.NoSuchRule: it does not import" in out
    header, _, row = table.splitlines()
    assert header == "| rule | clean | 50% sign_flip | 50% alie |"
    name, *cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert name == "FedAvg" and len(cells) == 3 and all(0.0 <= float(cell) <= 1.0 for cell in cells)
    assert out.count("FedAvg fraction=") == 3  # the clean run once, not once per attack


def test_rules_get_the_defenders_settings_unless_given():
    class MultiKrum:
        def __init__(self, num_byzantine: int, num_selected: int) -> None:
            self.kwargs = (num_byzantine, num_selected)

    assert make_rule(MultiKrum, None, 10, 0.3).kwargs == (3, 7)
    assert make_rule(MultiKrum, {"num_byzantine": 1, "num_selected": 2}, 10, 0.3).kwargs == (1, 2)
    assert RULE_DEFAULTS["Bulyan"](10, 3) == {"num_byzantine": 1}  # n >= 4f + 3
    assert RULE_DEFAULTS["TrimmedMean"](10, 0) == {"beta": 0.1}
    assert isinstance(make_rule(FedAvg, None, 10, 0.3), FedAvg)
    assert parse_rule('a.B={"beta": 0.2}') == ("a.B", {"beta": 0.2}) and parse_rule("a.B") == ("a.B", None)
    assert load_rule("lightning_fed.aggregators.FedAvg") is FedAvg


def test_table_averages_seeds_and_marks_missing_cells():
    results = {("FedAvg", 0.0, "none"): [0.5, 0.7], ("FedAvg", 0.1, "alie"): [0.4]}
    table = markdown_table(results, [0.0, 0.1], ["alie", "gaussian"])
    assert table.splitlines()[2] == "| FedAvg | 0.600 | 0.400 | - |"
