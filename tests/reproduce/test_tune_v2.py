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
from benchmarks.reproduce.runner import OK, RunResult, run_dir_of

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
            result = RunResult(run.run_name, OK, str(run_dir), 0.0, "fake", None, run.name, run.seed)
            (run_dir / "status.json").write_text(json.dumps(asdict(result)))
            results.append(result)
        return results

    monkeypatch.setattr(tune_v2_command, "run_all", run_all)
    return calls


def test_tune_v2_loop_extends_edges_runs_lambda_stages_and_replays(tmp_path, monkeypatch, fake_runs, capsys):
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "configs", root / "configs")
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
    section = report.split("## Dirichlet 0.1")[1].split("##")[0]
    for run in DIRICHLET:
        row = next(line for line in section.splitlines() if line.startswith(f"| {run} |"))
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        assert cells[1] == "20", row  # 5 cells x 4 settings, the same for every method
        assert cells[4] == "interior", row
        assert "lr=0.1" in cells[2] or run in ("fedavg_fmnist_beta01", "scaffold_fmnist_beta01"), row
    assert "| **0.1** |" in report and "| 0.05 |" in report and "| 0.2 |" in report
    assert not (root / "configs" / "tuned_v2").exists()

    # --report-only replays the rule on the finished runs without running anything; --write-presets writes the choices.
    fake_runs.clear()
    assert command.main([*base, "--report-only", "--write-presets"]) == 0
    assert fake_runs == []
    assert (out / "tune" / "TUNING.md").read_text().split("## Dirichlet")[1] == report.split("## Dirichlet")[1]
    tuned = root / "configs" / "tuned_v2"
    assert sorted(path.stem for path in tuned.glob("*.yaml")) == sorted([*DIRICHLET, "fedcurv_paper"])
    fedgg = yaml.safe_load((tuned / "fedgg_fmnist_beta01.yaml").read_text())
    assert fedgg["model"]["init_args"]["lr"] == pytest.approx(0.1)
    fedavg = yaml.safe_load((tuned / "fedavg_fmnist_beta01.yaml").read_text())
    assert 0.1 / math.sqrt(10) ** 0.5 < fedavg["model"]["init_args"]["lr"] < 0.1 * math.sqrt(10) ** 0.5
    assert "FedCurv.lam=0.1" in (tuned / "fedcurv_paper.yaml").read_text()
    assert "[reproduce] v2 tuning report:" in capsys.readouterr().out
