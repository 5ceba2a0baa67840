"""Every reproduction run's YAML composition, with each profile's overrides, parses; the registry is consistent."""

from pathlib import Path

import pytest

from benchmarks.reproduce.claims import CLAIMS, claims_for, experiments_of
from benchmarks.reproduce.experiments import EXPERIMENTS, experiments_for
from lightning_fed.cli.main import FederatedCLI

ROOT = Path(__file__).parents[2]


def test_every_run_is_in_the_full_profile():
    assert all("full" in run.profiles for run in EXPERIMENTS.values())


# Each run parses with the full profile's overrides (the small profile adds none; the smoke profile's overrides are
# exercised by the end-to-end smoke test), so every composition and every scaling override is checked once.
@pytest.mark.parametrize("run", EXPERIMENTS.values(), ids=list(EXPERIMENTS))
def test_run_parses(run, capsys):
    assert run.missing_configs(ROOT) == [], "the registry names a YAML file that does not exist"
    args = [str(ROOT / a) if a.endswith(".yaml") else a for a in run.cli_args("full")]
    # --print_config parses and validates the whole composition (classes, argument types, unknown keys) and exits.
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=["fit", *args, "--trainer.logger", "false", "--print_config"])
    assert exit_info.value.code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    rounds = run.cli_args("full")[run.cli_args("full").index("--trainer.num_rounds") + 1]
    assert f"num_rounds: {rounds}" in printed
    for name, value in zip(run.args[::2], run.args[1::2]):  # the sweep's values reach the config
        expected = f"class_path: {value}" if value.startswith("lightning_fed.") else f"{name.split('.')[-1]}: {value}"
        assert expected in printed


def test_every_claim_run_is_registered_and_small_covers_all_claims():
    small = {run.name for run in experiments_for("small")}
    for claim in CLAIMS:
        assert claim.runs <= set(EXPERIMENTS), claim.key
        assert set(claim.requires) <= small, f"claim {claim.number} needs runs the small profile leaves out"


def test_smoke_keeps_what_each_verdict_requires():
    smoke = {run.name for run in experiments_for("smoke")}
    for claim in CLAIMS:
        assert set(claim.requires) <= smoke, claim.key


def test_profile_scaling():
    run = EXPERIMENTS["fedgg_paper_beta01"]
    # The small profile is the presets as they are: the run's YAML files (its tuned preset last), nothing else.
    assert run.cli_args("small") == [flag for config in run.configs for flag in ("--config", config)]
    assert run.configs[0] == "configs/experiments/fedgg_paper_beta01.yaml"
    assert "100" in run.cli_args("full")
    with pytest.raises(ValueError, match="`profile`"):
        run.cli_args("huge")


def test_selection_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="nope"):
        experiments_for("small", ["nope"])
    with pytest.raises(ValueError, match="99"):
        claims_for(["99"])
    assert {claim.number for claim in claims_for(["3", "fedamp_practical"])} == {"3", "4"}
    assert experiments_of(claims_for(["5"])) == {"fedcurv_paper", "fedavg_fedcurv"}
