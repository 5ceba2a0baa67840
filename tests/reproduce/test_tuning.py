"""The hyperparameter search: the same budget for every method, settings that reach the config, validation data
only, and the choice of the best validation score."""

import json
from pathlib import Path

import pytest

from benchmarks.reproduce.claims import CLAIMS
from benchmarks.reproduce.experiments import EXPERIMENTS, REGISTRIES, TUNED_DIR, TUNED_DIRS, experiments_for
from benchmarks.reproduce.runner import FAILED, OK, RunResult
from benchmarks.reproduce.tuning import (
    BUDGET,
    SEARCHES,
    collect,
    compose,
    lr_span,
    tuning_runs,
    write_tuned_presets,
    write_tuning_report,
)
from lightning_fed.cli.main import FederatedCLI

ROOT = Path(__file__).parents[2]
_ZHAO = ("zhao_",)


def test_every_compared_method_is_searched_with_the_same_budget():
    compared = {name for claim in CLAIMS for name in claim.runs if not name.startswith(_ZHAO)}
    small = {run.name for run in experiments_for("small")}
    assert compared & small <= set(SEARCHES), "a method of a claim in the small profile has no search"
    assert all(len(settings) == BUDGET for settings in SEARCHES.values())
    assert all(len({tuple(sorted(s.items())) for s in settings}) == BUDGET for settings in SEARCHES.values())


def test_every_method_of_a_claim_searches_the_same_learning_rate_range():
    for claim in CLAIMS:
        searched = [name for name in sorted(claim.runs) if name in SEARCHES]
        ranges = {
            name: (min(s["lr"] for s in SEARCHES[name]), max(s["lr"] for s in SEARCHES[name])) for name in searched
        }
        assert len(set(ranges.values())) <= 1, f"claim {claim.number}: unequal learning-rate ranges {ranges}"


def test_lr_span_spaces_nine_rates_geometrically_between_the_ends():
    span = lr_span((0.005, 0.01, 0.02))
    assert len(span) == BUDGET and span[0] == 0.005 and span[-1] == 0.02
    assert span[4] == pytest.approx(0.01)
    ratios = [later / earlier for earlier, later in zip(span, span[1:], strict=False)]
    assert max(ratios) == pytest.approx(min(ratios), rel=0.01)


def test_fedamp_searches_sigma_on_the_practical_split_with_the_safe_step():
    sigmas = {setting["FedAMP.sigma"] for setting in SEARCHES["practical_fedamp"]}
    assert len(sigmas) == 3 and min(sigmas) == 0.05
    for setting in SEARCHES["practical_fedamp"]:
        assert setting["FedAMP.alpha_k"] == pytest.approx(setting["FedAMP.sigma"] / 19)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tuning_runs(list(EXPERIMENTS.values()), ROOT, tmp_path_factory.mktemp("tune"))


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_a_tuning_run_evaluates_on_validation_data_with_its_setting(name, runs, capsys):
    run = runs[name][-1]
    args = [str(ROOT / a) if a.endswith(".yaml") and not Path(a).is_absolute() else a for a in run.cli_args("small")]
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=["fit", *args, "--trainer.logger", "false", "--print_config"])
    assert exit_info.value.code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "evaluation_split: validation" in printed
    preset_rounds = compose(ROOT, EXPERIMENTS[name].configs)["trainer"]["num_rounds"]
    assert f"num_rounds: {max(5, round(preset_rounds / 2))}\n" in printed  # half the rounds by default
    assert "val_fraction: 0.0\n" not in printed
    for path, value in SEARCHES[name][-1].items():
        shown = str(value).lower() if isinstance(value, bool) else value
        assert f"{path.rsplit('.', 1)[-1]}: {shown}" in printed, path


def _result(tmp_path: Path, name: str, accuracies: list[float] | None) -> RunResult:
    run_dir = tmp_path / name
    run_dir.mkdir()
    if accuracies is None:
        return RunResult(name, FAILED, str(run_dir), 1.0, "", "exit code 1", name, 0)
    history = [{"round": r + 1, "global/test_acc": acc} for r, acc in enumerate(accuracies)]
    (run_dir / "summary.json").write_text(json.dumps({"history": history}))
    return RunResult(name, OK, str(run_dir), 1.0, "", None, name, 0)


def test_the_best_validation_score_is_chosen_and_a_failed_setting_is_reported(tmp_path):
    finals = [0.5, 0.7, None, 0.72, 0.6, 0.1, 0.3, 0.2, 0.1]
    results = [
        _result(tmp_path, f"fedavg_fedcurv__t{i}", None if acc is None else [0.1] * 5 + [acc] * 5)
        for i, acc in enumerate(finals)
    ]
    search = collect("fedavg_fedcurv", results)
    assert search.scores[2] is None and search.scores[3] == pytest.approx(0.72)
    assert search.chosen == 3
    chosen_lr, failed_lr = (SEARCHES["fedavg_fedcurv"][index]["lr"] for index in (3, 2))
    text = write_tuning_report(tmp_path, [search], {"date": "today"}).read_text()
    assert f"| **lr={chosen_lr:g}** | **72.00** |" in text
    assert f"| lr={failed_lr:g} | failed |" in text
    payload = json.loads((tmp_path / "tuning.json").read_text())
    assert payload["searches"]["fedavg_fedcurv"]["chosen"] == {"lr": chosen_lr}


def test_the_chosen_setting_becomes_a_preset_that_composes_after_the_runs_own(tmp_path, capsys):
    finals = [0.5, 0.7, 0.6, 0.72, 0.6, 0.1, 0.3, 0.2, 0.1]
    results = [_result(tmp_path, f"fedavg_fedcurv__t{i}", [acc] * 5) for i, acc in enumerate(finals)]
    search = collect("fedavg_fedcurv", results)
    experiment = EXPERIMENTS["fedavg_fedcurv"]
    (preset,) = write_tuned_presets([experiment], [search], ROOT, {"date": "today"}, out_dir=tmp_path / "tuned")
    text = preset.read_text()
    chosen_lr, third_lr = (SEARCHES["fedavg_fedcurv"][index]["lr"] for index in (3, 2))
    assert preset.name == "fedavg_fedcurv.yaml"
    assert f"# Chosen: lr={chosen_lr:g}." in text and f"#   lr={third_lr:g}: 60.00 %" in text
    base = [str(ROOT / c) for c in experiment.configs if not c.startswith(TUNED_DIR)]
    args = [arg for config in [*base, str(preset)] for arg in ("--config", config)]
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=["fit", *args, "--trainer.logger", "false", "--print_config"])
    assert exit_info.value.code == 0, capsys.readouterr().err
    assert f"    lr: {chosen_lr}\n" in capsys.readouterr().out


@pytest.mark.parametrize("protocol", ["v1", "v2"])
def test_every_tuned_preset_is_composed_last_by_its_run(protocol):
    tuned_dir, registry = TUNED_DIRS[protocol], REGISTRIES[protocol]
    presets = sorted((ROOT / tuned_dir).glob("*.yaml"))
    assert presets, f"the search's chosen settings are committed under {tuned_dir}"
    for preset in presets:
        assert registry[preset.stem].configs[-1] == f"{tuned_dir}/{preset.name}"
