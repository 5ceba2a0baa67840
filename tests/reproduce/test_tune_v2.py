"""``lightning-fed reproduce --protocol v2 --tune``'s loop, on fabricated run results (nothing trains): the edge
extension over rounds, claim 5's λ stages, ``--report-only`` replaying the rule, ``--write-presets``."""

import json
import math
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from benchmarks.reproduce import command, tune_v2_command
from benchmarks.reproduce.fair_search import Comparison, Ladder, assess, search_settings
from benchmarks.reproduce.records import set_name
from benchmarks.reproduce.runner import OK, RunResult, run_dir_of
from benchmarks.reproduce.tuning_v2 import fedcurv_choice_status, write_report

ROOT = Path(__file__).parents[2]
DIRICHLET = ("fedgg_fmnist_beta01", "fedavg_fmnist_beta01", "fedprox_fmnist_beta01", "scaffold_fmnist_beta01")
PEAK_LR, PEAK_LAM = 0.1, 0.1


def _lr(run) -> float:
    """The learning rate the tuning run's settings file sets."""
    return float(yaml.safe_load(Path(run.configs[-1]).read_text())["model"]["init_args"]["lr"])


def _curve(run) -> list[float]:
    """A validation curve: for the Dirichlet search it peaks at lr 0.1; FedCurv's runs reach the target fastest at
    λ = 0.1; the FedAvg reference sets the target (its value at half the rounds, 0.25)."""
    method, suffix = run.name.split("__")
    if suffix == "ref":
        return [0.05 * r for r in range(1, 11)]
    if suffix.startswith("lam"):
        speed = 1 + 0.5 / (1 + abs(math.log10(float(suffix[3:]) / PEAK_LAM)))
        return [min(0.9, 0.05 * r * speed) for r in range(1, 11)]
    assert method in DIRICHLET
    return [0.6 - 0.1 * math.log10(_lr(run) / PEAK_LR) ** 2] * 5


@pytest.fixture
def fake_runs(monkeypatch):
    """``run_all`` replaced by one that writes each run's status and summary as a real run would."""
    calls: list[str] = []

    def run_all(experiments, profile, out_dir, root, **kwargs):
        results = []
        for run in experiments:
            calls.append(run.name)
            run_dir = run_dir_of(out_dir, run.run_name)
            run_dir.mkdir(parents=True, exist_ok=True)
            history = [{"round": r, "global/test_acc": a} for r, a in enumerate(_curve(run), start=1)]
            (run_dir / "summary.json").write_text(json.dumps({"history": history}))
            result = RunResult(run.run_name, OK, str(run_dir), 60.0, "fake", None, run.name, run.seed)  # 1 min each
            (run_dir / "status.json").write_text(json.dumps(asdict(result)))
            results.append(result)
        return results

    monkeypatch.setattr(tune_v2_command, "run_all", run_all)
    return calls


def test_tune_v2_loop_extends_edges_runs_lambda_stages_and_replays(
    tmp_path, monkeypatch, fake_runs, capsys, records_in_tmp
):
    root = tmp_path / "repo"
    # The repository's configs without its own v2 choices: the presets this search writes are its own, and a run
    # that composed a choice of the repository's search (configs/tuned_v2) would fail to find it here.
    shutil.copytree(ROOT / "configs", root / "configs", ignore=shutil.ignore_patterns("tuned_v2"))
    monkeypatch.chdir(root)
    out = tmp_path / "out"
    base = ["--protocol", "v2", "--profile", "smoke", "--tune", "--claims", "5", "8a", "--no-wandb", "--in-process"]
    base += ["--out-dir", str(out), "--root", str(root)]

    assert command.main(base) == 0
    # Round 1: 3 cells x K = 4 for each of the 4 methods, the FedAvg reference and stage x10's 5 λ. The Dirichlet
    # optimum (lr 0.1) lies above the first ladder's top cell 0.03: it grows to 0.1 (still the top: edge), then to
    # 0.3, where 0.1 is interior; λ's stage x2 adds 0.05 and 0.2 around 0.1.
    assert len(fake_runs) == 4 * 12 + 6 + 4 * 4 + 2 + 4 * 4
    assert len(set(fake_runs)) == len(fake_runs)
    report = (out / "tune" / "TUNING.md").read_text()
    # The copy beside the records is committed: the same report, with the output directory written as <out-dir>.
    copy = (records_in_tmp / set_name("v2", "smoke", tune=True) / "TUNING.md").read_text()
    assert str(out) in report and str(out) not in copy
    assert copy == report.replace(str(out), "<out-dir>")
    section = report.split("## Dirichlet 0.1")[1].split("##")[0]
    for run in DIRICHLET:
        row = next(line for line in section.splitlines() if line.startswith(f"| {run} |"))
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        assert cells[1] == "20", row  # 5 cells x 4 settings, the same for every method
        own = run in ("fedgg_fmnist_beta01", "fedprox_fmnist_beta01")
        assert "lr=0.1" in cells[2] or not own, row
        # The fake score ignores μ, so the tie goes to the first μ: the lowest of the method's own grid, which the
        # protocol does not extend but marks.
        assert cells[4] == (
            "interior; edge (own grid): " + ("FedGG" if "fedgg" in run else "FedProx") + ".mu=0.001 (lowest)"
            if own
            else "interior"
        ), row
        # The search table: K rows per method, one column per cell, every setting's score.
        table_rows = [line for line in section.splitlines() if line.startswith(f"| {run} | ") and line != row]
        assert len(table_rows) == 4 and all(line.count("|") == 2 + 1 + 5 for line in table_rows), table_rows
        assert "–" not in "".join(table_rows)
    assert "| **0.1** |" in report and "| 0.05 |" in report and "| 0.2 |" in report
    # What λ aims at (the reference's value at half its rounds) and where the choice sits.
    assert "Target: FedAvg's validation accuracy at round 5 of 10, 25.00 %" in report
    assert "Choice: λ = 0.1, interior." in report
    runs = len(fake_runs)
    assert "- search rounds: 3\n" in report  # the first ladders, then two extensions of the Dirichlet ladder
    assert "read back" not in report
    assert not (root / "configs" / "tuned_v2").exists()

    # --report-only replays the rule on the finished runs without running anything; --write-presets writes the choices.
    fake_runs.clear()
    assert command.main([*base, "--report-only", "--write-presets"]) == 0
    assert fake_runs == []
    replayed = (out / "tune" / "TUNING.md").read_text()
    assert replayed.split("## Dirichlet")[1] == report.split("## Dirichlet")[1]
    # It ran nothing, so its wall time is what the runs took themselves.
    assert f"- wall time: {runs:.1f} min (sum of the {runs} runs' own wall times)\n" in replayed
    tuned = root / "configs" / "tuned_v2"
    assert sorted(path.stem for path in tuned.glob("*.yaml")) == sorted([*DIRICHLET, "fedcurv_paper"])
    fedgg = yaml.safe_load((tuned / "fedgg_fmnist_beta01.yaml").read_text())
    assert fedgg["model"]["init_args"]["lr"] == pytest.approx(0.1)
    fedavg = yaml.safe_load((tuned / "fedavg_fmnist_beta01.yaml").read_text())
    assert 0.1 / math.sqrt(10) ** 0.5 < fedavg["model"]["init_args"]["lr"] < 0.1 * math.sqrt(10) ** 0.5
    assert "FedCurv.lam=0.1" in (tuned / "fedcurv_paper.yaml").read_text()
    assert "[reproduce] v2 tuning report:" in capsys.readouterr().out

    # A search started again after a stop reads its finished runs back, and its header says so.
    assert command.main(base) == 0
    assert fake_runs == []
    resumed = (out / "tune" / "TUNING.md").read_text()
    assert f"; {runs} of {runs} runs were finished by earlier invocations and read back " in resumed
    assert f"(their own wall times sum to {runs:.1f} min)" in resumed


def test_the_search_table_tells_a_failed_setting_from_one_not_run_yet(tmp_path):
    toy = Comparison("toy", (0.03, 0.1), 2, {"own": ({"mu": 1}, {"mu": 2}), "plain": None})
    scores = {"own": {"c0k0": 0.5, "c0k1": None, "c1k0": 0.75}, "plain": {"c0k0": 0.25}}
    outcome = assess(toy, Ladder(), scores)
    report = write_report(tmp_path, [(toy, Ladder(), outcome, scores)], {}, {}).read_text()
    rows = [line for line in report.splitlines() if line.startswith(("| own | mu=", "| plain | rate"))]
    rate = {suffix: f"{setting['lr']:g}" for suffix, setting in search_settings(toy, "plain", Ladder()).items()}
    assert rows == [
        "| own | mu=1 | 50.00 | 75.00 |",
        "| own | mu=2 | failed | – |",
        f"| plain | rate 1 of 2 | 25.00 (lr {rate['c0k0']}) | – (lr {rate['c1k0']}) |",
        f"| plain | rate 2 of 2 | – (lr {rate['c0k1']}) | – (lr {rate['c1k1']}) |",
    ]
    # own's best (mu=1 at lr 0.1) is the top cell and the low end of its own grid; plain's is the bottom cell.
    assert "| own | 4 | mu=1, lr=0.1 | 75.00 | edge: high; edge (own grid): mu=1 (lowest) |" in report
    assert f"| plain | 4 | lr={rate['c0k0']} | 25.00 | edge: low |" in report


def test_the_lambda_choice_is_marked_edge_at_an_end_of_the_values_run_and_bounded_at_a_bound():
    # λ -> (rounds to the target or None, last-5 accuracy); the fewest rounds wins.
    assert fedcurv_choice_status({0.001: (55, 0.71), 0.01: (58, 0.71), 0.1: (62, 0.71)}) == (
        "Choice: λ = 0.001, edge (the λ values run so far)."
    )
    interior = {1e-4: (57, 0.7), 0.001: (55, 0.71), 0.01: (58, 0.71)}
    assert fedcurv_choice_status(interior) == "Choice: λ = 0.001, interior."
    assert fedcurv_choice_status({1e-5: (50, 0.7), 1e-4: (57, 0.7)}) == "Choice: λ = 1e-05, bounded (λ ∈ [1e-05, 100])."
    assert fedcurv_choice_status({0.1: (None, 0.5)}) == "Choice: none (no λ reached the target)."
