"""The report from fabricated run results: a failed run is marked, its claims get no verdict, the rest goes on."""

import json
from pathlib import Path

from benchmarks.reproduce.claims import NO_VERDICT, claims_for
from benchmarks.reproduce.experiments import EXPERIMENTS
from benchmarks.reproduce.report import run_context, write_report
from benchmarks.reproduce.rules import NOT, PARTLY, REPRODUCED
from benchmarks.reproduce.runner import FAILED, OK, RunResult, run_one


def _ok_run(tmp_path: Path, name: str, accuracies: list[float], **summary) -> RunResult:
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)
    history = [{"round": float(r + 1), "global/test_acc": acc} for r, acc in enumerate(accuracies)]
    payload = {
        "num_rounds": len(accuracies),
        "completed_rounds": len(accuracies),
        "history": history,
        "final": history[-1],
        "mean_emd": 0.0,
        "final_client_metrics": {},
        **summary,
    }
    (run_dir / "summary.json").write_text(json.dumps(payload))
    return RunResult(name, OK, str(run_dir), 1.0, f"lightning-fed fit {name}")


def _failed_run(tmp_path: Path, name: str) -> RunResult:
    return RunResult(
        name,
        FAILED,
        str(tmp_path / "runs" / name),
        2.0,
        f"lightning-fed fit {name}",
        "exit code 1\nRuntimeError: the data went missing",
    )


def test_failed_run_is_marked_and_the_other_claims_still_get_verdicts(tmp_path):
    claims = claims_for(["5", "7"])
    results = [
        _failed_run(tmp_path, "fedcurv_paper"),
        _ok_run(tmp_path, "fedavg_fedcurv", [0.2, 0.3, 0.4]),
        # FedGG reaches FedAvg's final 0.5 in round 2 of 4: a 2x speed-up.
        _ok_run(tmp_path, "fedgg_paper_beta01", [0.3, 0.5, 0.55, 0.6]),
        _ok_run(tmp_path, "fedavg_fedgg_beta01", [0.2, 0.3, 0.4, 0.5]),
    ]
    report = write_report(tmp_path, "small", claims, results, run_context("lightning-fed reproduce", 60.0, "test"))

    assert report.verdicts["fedcurv_rounds"].verdict == NO_VERDICT
    assert "fedcurv_paper" in report.verdicts["fedcurv_rounds"].ours
    assert report.verdicts["fedgg_rounds"].verdict == REPRODUCED
    assert "2.00×" in report.verdicts["fedgg_rounds"].ours
    text = report.path.read_text()
    assert "| fedcurv_paper | **FAILED** |" in text and "RuntimeError: the data went missing" in text
    assert "| 7 |" in text and f"**{REPRODUCED}**" in text and f"**{NO_VERDICT}**" in text
    assert "1 failed" in text
    # The figures of the runs that worked are drawn; FedCurv's curve shows the FedAvg run alone.
    assert {path.name for path in report.figures} == {"curves_fedcurv_rounds.png", "curves_fedgg_rounds.png"}
    assert all(path.stat().st_size > 0 for path in report.figures)
    verdicts = json.loads((tmp_path / "reproduction.json").read_text())
    assert [claim["verdict"] for claim in verdicts["claims"]] == [NO_VERDICT, REPRODUCED]
    assert [run["status"] for run in verdicts["runs"]] == [FAILED, OK, OK, OK]


def test_a_run_without_the_claimed_metric_gives_no_verdict_not_a_crash(tmp_path):
    claims = claims_for(["4"])
    results = [_ok_run(tmp_path, f"practical_{method}", [0.5]) for method in ("fedamp", "separate", "fedavg")]
    report = write_report(tmp_path, "small", claims, results, {})
    assert report.verdicts["fedamp_practical"].verdict == NO_VERDICT
    assert "client_eval" in report.verdicts["fedamp_practical"].ours
    assert any("curves_fedamp_practical.png" in error for error in report.figure_errors)
    assert "could not be drawn" in report.path.read_text()


def test_sweep_claims_read_every_successful_level(tmp_path):
    claims = claims_for(["1", "2"])
    runs = {
        "zhao_iid": (0.0, 0.84),
        "zhao_emd_0.72": (0.72, 0.83),
        "zhao_1class": (1.8, 0.40),
        "zhao_share_0.05": (1.44, 0.55),
        "zhao_share_0.1": (1.2, 0.70),
    }
    results = [_ok_run(tmp_path, name, [acc], mean_emd=emd) for name, (emd, acc) in runs.items()]
    results.append(_failed_run(tmp_path, "zhao_emd_1.44"))
    report = write_report(tmp_path, "small", claims, results, {})
    assert report.verdicts["zhao_emd"].verdict == REPRODUCED
    assert "EMD 0.72" in report.verdicts["zhao_emd"].ours and "1.44" not in report.verdicts["zhao_emd"].ours
    # The best beta (10 %) recovers (0.70 - 0.40) / 0.44 = 68 % of the gap.
    assert report.verdicts["zhao_sharing"].verdict == REPRODUCED and "68 %" in report.verdicts["zhao_sharing"].ours
    assert {"accuracy_vs_emd.png", "accuracy_vs_beta.png"} <= {path.name for path in report.figures}


def test_fedamp_claims_draw_client_distributions_and_pick_up_xi_heatmaps(tmp_path):
    claims = claims_for(["3"])
    results = []
    for method, (bmta, accs) in {
        "fedamp": (0.9, [0.8, 1.0]),
        "heurfedamp": (0.9, [0.9, 0.9]),
        "separate": (0.95, [0.9, 1.0]),
        "fedavg": (0.5, [0.3, 0.7]),
    }.items():
        key = "client" if method == "fedavg" else "personal"
        result = _ok_run(
            tmp_path,
            f"pathological_{method}",
            [0.5],
            final_client_metrics={str(i): {"test_acc": a} for i, a in enumerate(accs)},
        )
        summary_path = Path(result.run_dir) / "summary.json"
        summary = json.loads(summary_path.read_text())
        for entry in summary["history"]:
            entry.update({f"{key}/bmta": bmta, f"{key}/test_acc_mean": bmta})
        summary_path.write_text(json.dumps(summary))
        results.append(result)
    (Path(results[0].run_dir) / "xi").mkdir()
    for round_number in (10, 20):
        (Path(results[0].run_dir) / "xi" / f"round_{round_number:04d}.png").write_bytes(f"png {round_number}".encode())
    report = write_report(tmp_path, "small", claims, results, {})
    assert report.verdicts["fedamp_pathological"].verdict == PARTLY  # 40 points above FedAvg, 5 below Separate
    names = {path.name for path in report.figures}
    assert {"client_accuracy_pathological.png", "curves_fedamp_pathological.png", "xi_pathological_fedamp.png"} <= names
    assert (tmp_path / "xi_pathological_fedamp.png").read_bytes() == b"png 20"  # the latest round's heatmap


def test_run_one_records_a_missing_config_and_a_crashing_run(tmp_path):
    missing = EXPERIMENTS["zhao_iid"].__class__("ghost", ("configs/none.yaml",), "fedgg")
    result = run_one(missing, "smoke", tmp_path, Path(__file__).parents[2], in_process=True)
    assert result.status == FAILED and "config not found: configs/none.yaml" in result.error
    assert json.loads((tmp_path / "runs" / "ghost" / "status.json").read_text())["status"] == FAILED

    broken = run_one(
        EXPERIMENTS["fedgg_paper_beta01"],
        "smoke",
        tmp_path,
        Path(__file__).parents[2],
        extra=["--trainer.num_roundz", "1"],
        in_process=True,
    )
    assert broken.status == FAILED and "SystemExit" in broken.error
    assert "num_roundz" in (tmp_path / "runs" / "fedgg_paper_beta01" / "run.log").read_text()


def test_baseline_claim_without_any_baseline_gives_no_verdict(tmp_path):
    fedamp = _ok_run(tmp_path, "practical_fedamp", [0.5])
    summary_path = Path(fedamp.run_dir) / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["history"][0]["personal/bmta"] = 0.5
    summary_path.write_text(json.dumps(summary))
    failed = [_failed_run(tmp_path, f"practical_{m}") for m in ("apfl", "fedavg_ft", "fedprox_ft")]
    report = write_report(tmp_path, "small", claims_for(["8c"]), [fedamp, *failed], {})
    assert report.verdicts["baselines_fedamp"].verdict == NO_VERDICT
    assert "no baseline run succeeded" in report.verdicts["baselines_fedamp"].ours
    assert report.path.read_text().count("**FAILED**") == 3


def _seeded_run(tmp_path: Path, name: str, seed: int, accuracies: list[float]) -> RunResult:
    result = _ok_run(tmp_path, f"{name}.seed{seed}", accuracies)
    return RunResult(result.name, OK, result.run_dir, 1.0, result.command, None, name, seed)


def test_the_verdict_is_judged_on_the_seeds_mean_with_each_seed_beside_it(tmp_path):
    claims = claims_for(["7"])
    results = [
        # Seed 0: FedGG reaches FedAvg's final 0.5 at round 2 of 4 (2x); seed 1: never (FedAvg ends at 0.7).
        _seeded_run(tmp_path, "fedgg_paper_beta01", 0, [0.3, 0.5, 0.55, 0.6]),
        _seeded_run(tmp_path, "fedavg_fedgg_beta01", 0, [0.2, 0.3, 0.4, 0.5]),
        _seeded_run(tmp_path, "fedgg_paper_beta01", 1, [0.3, 0.4, 0.5, 0.6]),
        _seeded_run(tmp_path, "fedavg_fedgg_beta01", 1, [0.2, 0.5, 0.6, 0.7]),
    ]
    report = write_report(tmp_path, "small", claims, results, {})

    # Means: FedGG 0.3, 0.45, 0.525, 0.6; FedAvg 0.2, 0.4, 0.5, 0.6 -> FedAvg's final 0.6 reached at round 4 by both.
    assert report.verdicts["fedgg_rounds"].verdict == NOT
    assert "1.00×" in report.verdicts["fedgg_rounds"].ours
    assert report.seed_verdicts[0]["fedgg_rounds"].verdict == REPRODUCED
    assert report.seed_verdicts[1]["fedgg_rounds"].verdict == NOT
    text = report.path.read_text()
    assert "## Per seed" in text
    assert "| fedgg_paper_beta01 | 2 | 60.0 ± 0.0 (60.0, 60.0) | – |" in text
    assert "| fedavg_fedgg_beta01 | 2 | 60.0 ± 10.0 (50.0, 70.0) | – |" in text
    payload = json.loads((tmp_path / "reproduction.json").read_text())
    assert payload["claims"][0]["per_seed"] == {"0": REPRODUCED, "1": NOT}
