import json
import sys
from pathlib import Path

import pytest

# The suite is `benchmarks.reproduce`, a package of the repository checkout rather than of the installed library:
# make the checkout importable however pytest was started (`pytest` does not put the working directory on the path).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture
def fake_fit(monkeypatch):
    """``lightning-fed fit`` replaced by one that writes a complete two-round summary; returns the args of each call."""
    calls: list[list[str]] = []

    def fit(args: list[str], log_path: Path) -> str | None:
        calls.append(args)
        run_dir = Path(args[args.index("--trainer.run_dir") + 1])
        history = [{"round": 1.0, "global/test_acc": 0.5}, {"round": 2.0, "global/test_acc": 0.6}]
        summary = {"num_rounds": 2, "completed_rounds": 2, "history": history, "final": history[-1]}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return None

    from benchmarks.reproduce import runner  # after the path set-up above

    monkeypatch.setattr(runner, "_run_in_process", fit)
    return calls


@pytest.fixture(autouse=True)
def records_in_tmp(tmp_path_factory, monkeypatch):
    """Every record a test's runs write goes to a temporary folder, not to the committed records/."""
    from benchmarks.reproduce import records

    folder = tmp_path_factory.mktemp("records")
    monkeypatch.setattr(records, "RECORDS_DIR", folder)
    return folder
