"""PROTOCOL.md's budget cuts for v2's full profile (``--cut N``): the runs and claims each cut removes, in order,
with claims 3, 4 and 7 keeping their three seeds whatever is cut."""

import json

import pytest

from benchmarks.reproduce import command
from benchmarks.reproduce.budget import FULL_PROFILE_CUTS, apply_cuts
from benchmarks.reproduce.claims import claims_for, experiments_of
from benchmarks.reproduce.command import V1_RECORD
from benchmarks.reproduce.experiments import PAPER_LR_SUFFIX, default_seeds, experiments_for
from benchmarks.reproduce.report import read_v1_verdicts


def _full_v2(seeds=None):
    claims = claims_for(None, "v2")
    chosen = [run for run in experiments_for("full", None, "v2") if run.name in experiments_of(claims)]
    return claims, [run.with_seed(seed) for run in chosen for seed in (seeds or default_seeds("v2", "full", run.name))]


def test_each_cut_removes_what_protocol_md_names_in_its_order():
    claims, runs = _full_v2(seeds=(0, 1, 2))  # every run at 3 seeds, so that cut 3 has seeds to remove
    v1 = read_v1_verdicts(V1_RECORD / "full.json")
    left = [apply_cuts(count, claims, runs, v1) for count in range(len(FULL_PROFILE_CUTS) + 1)]
    names = [{run.name for run in budget.experiments} for budget in left]

    assert names[0] - names[1] == {run.name for run in runs if run.family.startswith("zhao")}
    assert names[1] - names[2] == {"pathological_apfl", "pathological_fedavg_ft", "pathological_fedprox_ft"}
    heur = [[run.seed for run in budget.experiments if run.name == "practical_heurfedamp"] for budget in left[2:4]]
    assert heur == [[0, 1, 2], [0]]
    assert names[3] - names[4] == {run.name for run in runs if run.name.endswith(PAPER_LR_SUFFIX)}
    assert {claim.number for claim in claims} - {claim.number for claim in left[4].claims} == {
        "1",
        "2",
        "7 (lr 0.01)",
        "8a (lr 0.01)",
    }
    # The report's lines: every cut with its count of runs, and the claims it leaves to v1's verdict.
    lines = left[4].lines
    assert len(lines) == 4 and lines[0].startswith("cut 1: claims 1 and 2")
    assert "claims not judged here: 1 (v1: reproduced), 2 (v1: reproduced))" in lines[0]
    assert "(9 runs; claims not judged here: none)" in lines[1]
    assert "claims not judged here: 7 (lr 0.01), 8a (lr 0.01)" in lines[3]


def test_claims_3_4_and_7_keep_three_seeds_after_every_cut():
    claims, runs = _full_v2()
    budget = apply_cuts(len(FULL_PROFILE_CUTS), claims, runs)
    seeds: dict[str, set] = {}
    for run in budget.experiments:
        seeds.setdefault(run.name, set()).add(run.seed)
    kept = {claim.number: claim for claim in budget.claims}
    for number in ("3", "4", "7"):
        assert all(seeds[name] == {0, 1, 2} for name in kept[number].requires), number
    assert all(name in seeds for claim in budget.claims for name in claim.requires)


def test_a_cut_outside_the_list_or_the_full_v2_profile_is_refused(capsys):
    claims, runs = _full_v2()
    with pytest.raises(ValueError, match="between 0 and 4"):
        apply_cuts(5, claims, runs)
    with pytest.raises(SystemExit, match="--protocol v2 --profile full"):
        command.main(["--protocol", "v2", "--profile", "small", "--cut", "1", "--list"])


def test_the_command_lists_the_runs_left_after_the_cuts(capsys):
    assert command.main(["--protocol", "v2", "--profile", "full", "--cut", "4", "--list", "--no-wandb"]) == 0
    printed = capsys.readouterr()
    assert "zhao_" not in printed.out and PAPER_LR_SUFFIX not in printed.out
    assert "# 40 runs (22 experiments), protocol v2, profile full" in printed.err
    assert json.loads((V1_RECORD / "full.json").read_text())["seeds"] == [0]


def test_the_report_names_the_cuts_it_ran_under(tmp_path, fake_fit):
    argv = ["--protocol", "v2", "--profile", "full", "--cut", "4", "--in-process", "--no-wandb"]
    command.main([*argv, "--out-dir", str(tmp_path)])
    assert len(fake_fit) == 40
    header = (tmp_path / "REPRODUCTION.md").read_text().split("\n## ")[0]
    assert "- budget cuts (PROTOCOL.md): cut 1: claims 1 and 2" in header and "cut 4: the paper-lr runs" in header
    payload = json.loads((tmp_path / "reproduction.json").read_text())
    assert {claim["number"] for claim in payload["claims"]} >= {"3", "4", "7"}
    assert not {"1", "2", "7 (lr 0.01)"} & {claim["number"] for claim in payload["claims"]}
