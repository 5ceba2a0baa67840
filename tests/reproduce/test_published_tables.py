"""The published tables against the committed records (benchmarks/reproduce/published.py), and the records
themselves: written by the runner, extracted from older run directories, read back by --report-only."""

import dataclasses
import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks.reproduce import command
from benchmarks.reproduce.experiments import experiments_for
from benchmarks.reproduce.exploratory import EXPLORATORY
from benchmarks.reproduce.published import (
    NEVER,
    RecordSet,
    Values,
    choice_differences,
    compare,
    rebuilt_tuning_report,
    render_row,
    report_differences,
    runs_read,
    search_choices,
    shape_differences,
    table_lines,
    tokens,
    unrecorded_runs,
)
from benchmarks.reproduce.published_tables import TABLES
from benchmarks.reproduce.records import (
    OUT_DIR,
    RUN_SETS,
    compact_summary,
    declared_commit,
    environment,
    expand_summary,
    extract_records,
    make_record,
    read_records,
    recorded_results,
    without_out_dir,
    write_record,
)
from benchmarks.reproduce.rewrite import Change, quoted_in_prose, rewrite_table, rewritten_cell
from benchmarks.reproduce.rewrite import main as rewrite_main
from benchmarks.reproduce.runner import FAILED, OK, RunResult

ROOT = Path(__file__).parents[2]
COMMITTED = ROOT / "benchmarks" / "reproduce" / "records"
#: records/RUN_SETS.json: each published run set's tree, runs and (once committed) its "records" line.
DECLARED = json.loads(RUN_SETS.read_text())

#: How a missing record set is made (REPRODUCTION.md, "Run sets and their trees").
MAKE = {
    "v1-small": "lightning-fed reproduce --profile small --extract-records --out-dir <v1 small runs>",
    "v1-full": "lightning-fed reproduce --profile full --extract-records --out-dir <v1 full runs>",
    "v2-small": "lightning-fed reproduce --protocol v2 --profile small --extract-records --out-dir <v2 small runs>",
    "v2-full": "lightning-fed reproduce --protocol v2 --profile full --extract-records --out-dir <v2 full runs>",
    "v2-small-tune": "lightning-fed reproduce --protocol v2 --profile small --tune --extract-records --out-dir "
    "<v2 search runs>",
    "v2-exploratory-claim5-e50": "lightning-fed reproduce --protocol v2 --exploratory claim5-e50",
}


def _missing(name: str) -> str:
    return (
        f"not yet backed by records: benchmarks/reproduce/records/{name}/ holds none; make it with `{MAKE[name]}` "
        "(the runs of the tree records/RUN_SETS.json names)"
    )


def _not_checkable(name: str, why: str) -> None:
    """Skip while a set's records are still being made; fail once RUN_SETS.json says they are committed, so a
    deleted or partial record set cannot turn the table check into a skip."""
    if "records" in DECLARED["sets"].get(name, {}):
        pytest.fail(f"records/RUN_SETS.json says {name}'s records are committed, but {why}")
    pytest.skip(why)


@pytest.mark.parametrize("table", TABLES, ids=[table.name for table in TABLES])
def test_each_spec_describes_its_published_cell(table):
    assert shape_differences(table, (ROOT / table.path).read_text()) == []


ROWS = [(table, row) for table in TABLES for row in table.cells]


@pytest.mark.parametrize(("table", "row"), ROWS, ids=[f"{table.name}, {row}" for table, row in ROWS])
def test_every_published_number_equals_the_records(table, row):
    found = recorded_results(COMMITTED / table.record_set)
    if not found:
        _not_checkable(table.record_set, f"{table.name}: {_missing(table.record_set)}")
    records = table.record_set_of(list(found.values()))
    # A record set is rerun over several sessions: a row is checked once every run it reads is recorded.
    unrecorded = sorted(unrecorded_runs(table, row, records))
    if unrecorded:
        _not_checkable(
            table.record_set,
            f"{table.name}, row {row}: {len(unrecorded)} of its runs are not yet in records/{table.record_set}/"
            f" ({', '.join(unrecorded)}); {MAKE[table.record_set]}",
        )
    one_row = dataclasses.replace(table, cells={row: table.cells[row]})
    differences = compare(one_row, (ROOT / table.path).read_text(), Values(records))
    assert not differences, "\n".join(map(str, differences))


@pytest.mark.parametrize("name", [name for name, declared in DECLARED["sets"].items() if "records" in declared])
def test_a_set_declared_recorded_holds_a_record_of_every_run(name):
    records = read_records(COMMITTED / name)
    runs = DECLARED["sets"][name]["runs"]
    assert len(records) == runs, (
        f"records/RUN_SETS.json declares {runs} runs for {name}, records/{name}/ holds {len(records)}"
    )
    assert {record["status"] for record in records.values()} == {OK}


def test_a_row_reads_the_runs_its_keys_and_its_claims_name(synthetic):
    records = synthetic.records
    assert runs_read(["=5", "x[a>b@1]:.2f", "final[c]:.1f", "recovered[d>e>f>g]"], records) == set("abcdefg")
    claim_runs = set(records.claim("fedgg_rounds").runs)
    assert runs_read(["verdict[fedgg_rounds]"], records) == claim_runs == runs_read(["seeds[fedgg_rounds]"], records)
    with pytest.raises(ValueError, match="bad token spec"):
        runs_read(["final"], records)


def test_tuning_md_equals_the_search_rebuilt_from_its_records(tmp_path):
    set_dir = COMMITTED / "v2-small-tune"
    if not read_records(set_dir):
        _not_checkable("v2-small-tune", f"configs/tuned_v2/TUNING.md: {_missing('v2-small-tune')}")
    rebuilt = rebuilt_tuning_report(set_dir, tmp_path, ROOT)
    published = (ROOT / "configs" / "tuned_v2" / "TUNING.md").read_text()
    assert report_differences(published, rebuilt, "TUNING.md") == []


# Synthetic records: the mechanism on made-up runs, every value computed from them.


def _summary(name: str, seed: int, rounds: int = 30) -> dict:
    """A run's summary with a noisy rising accuracy, BMTA, a mean EMD and FedAMP's self-weight."""
    rng = random.Random(f"{name}/{seed}")
    top = rng.uniform(0.5, 0.9)
    history = []
    best = 0.0
    for round_ in range(1, rounds + 1):
        accuracy = top * (1 - math.exp(-round_ / rng.uniform(3, 12))) + rng.uniform(-0.03, 0.03)
        best = max(best, accuracy)
        entry = {"round": float(round_), "global/test_acc": accuracy, "client/bmta": best}
        if round_ % 3 == 0:  # a metric not logged every round
            entry["fedamp/xi_self_mean"] = rng.uniform(0, 1)
        history.append(entry)
    return {
        "num_rounds": rounds,
        "completed_rounds": rounds,
        "seed": seed,
        "history": history,
        "final": history[-1],
        "mean_emd": rng.uniform(0.0, 1.8),
        "run_dir": f"/somewhere/{name}",
        "run_id": name,
        "fingerprint": "f" * 8,
    }


def _experiments_of(record_set: str) -> list:
    """The runs (unseeded) of a record set: a profile's, or an exploratory set's."""
    if record_set.startswith("v2-exploratory-"):
        return list(EXPLORATORY[record_set.removeprefix("v2-exploratory-")].experiments)
    protocol, profile = record_set.split("-")[:2]
    return experiments_for(profile, protocol=protocol)


def _write_synthetic(set_dir: Path, record_set: str) -> None:
    for run in _experiments_of(record_set):
        for seed in (0, 1, 2):
            name = f"{run.name}.seed{seed}"
            result = RunResult(name, OK, "", 60.0, f"lightning-fed fit {name}", None, run.name, seed, None, "fp")
            write_record(set_dir, make_record(result, _summary(run.name, seed), {"id": "abc", "source": "git"}))


@pytest.fixture
def synthetic(tmp_path):
    """The v2 small profile's runs, three seeds each, as records."""
    set_dir = tmp_path / "v2-small"
    _write_synthetic(set_dir, "v2-small")
    return Values(RecordSet(list(recorded_results(set_dir).values()), "v2"))


def _rendered(table, values) -> str:
    width = 1 + max(column for columns in table.cells.values() for column in columns)
    rows = [render_row(table, row, values, width) for row in table.cells]
    header = [table.heading] if table.heading.startswith("|") else [table.heading, "", "| # |" + " x |" * (width - 1)]
    return "\n".join([*header, "|---|" + "---|" * (width - 1), *rows])


def test_a_table_rendered_from_records_reads_back_equal_and_one_edited_number_fails(synthetic):
    table = next(table for table in TABLES if table.name == "REPRODUCTION.md, v2 small")
    text = _rendered(table, synthetic)
    assert compare(table, text, synthetic) == []
    # Edit one number of the fair-search FedGG row (its target accuracy) and nothing else.
    row = next(line for line in text.splitlines() if line.startswith("| 7 |"))
    number = tokens(row.split("|")[4])[2]  # the "ours" cell, column 3
    edited = row.replace(f" {number} ", f" {float(number) + 0.1:.1f} ", 1)
    differences = compare(table, text.replace(row, edited), synthetic)
    assert [(d.row, d.column) for d in differences] == [("7", 3)]
    assert number in differences[0].rebuilt and number not in differences[0].published


def test_a_verdict_word_edited_fails(synthetic):
    table = next(table for table in TABLES if table.name == "docs, v2 small")
    text = _rendered(table, synthetic)
    row = next(line for line in text.splitlines() if line.startswith("| 4 |"))
    cells = row.split("|")
    word = {"reproduced": "partly", "partly": "not", "not": "reproduced"}[cells[4].strip()]
    edited = "|".join([*cells[:4], f" {word} ", *cells[5:]])
    differences = compare(table, text.replace(row, edited), synthetic)
    assert [(d.row, d.column) for d in differences] == [("4", 3)]


def test_a_value_the_records_lack_is_a_difference_that_says_why(synthetic, tmp_path):
    table = next(table for table in TABLES if table.name == "REPRODUCTION.md, v2 small")
    text = _rendered(table, synthetic)
    partial = tmp_path / "partial"
    for name, record in read_records(Path(synthetic.records.results[0].run_dir).parent).items():
        if not name.startswith("practical_fedamp."):
            write_record(partial, record)
    values = Values(RecordSet(list(recorded_results(partial).values()), "v2"))
    differences = {(d.row, d.column): d.rebuilt for d in compare(table, text, values)}
    assert ("4", 3) in differences and "KeyError" in differences[("4", 3)][0]


def test_the_shape_check_catches_a_literal_the_text_does_not_have():
    table = next(table for table in TABLES if table.name == "REPRODUCTION.md, v2 small")
    published = (ROOT / table.path).read_text()
    text = published.replace("Fashion-MNIST, LeNet-5, FedGG at μ = 1", "Fashion-MNIST, LeNet-7, FedGG at μ = 1", 1)
    assert text != published
    assert any("'=5'" in problem for problem in shape_differences(table, text))


def test_a_record_keeps_the_summary_a_report_reads_and_no_machine_path():
    summary = _summary("pathological_fedamp", 0)
    command = "lightning-fed fit --trainer.run_dir /machine/out/runs/r --trainer.default_root_dir /machine/out/runs/r"
    error = "failed: /machine/out/runs/r/run.log"
    result = RunResult("r", FAILED, "/machine/out/runs/r", 1.0, command, error)
    record = make_record(result, summary, {"id": "abc", "dirty": False})
    back = expand_summary(json.loads(json.dumps(record))["summary"])
    assert back["history"] == summary["history"]  # the rounds without xi stay without it
    assert back["final"] == summary["final"]
    assert "run_dir" not in compact_summary(summary) and "/somewhere" not in json.dumps(record)
    # The output directory the runs lay in is a path of the machine that ran them: written as <out-dir>.
    assert "/machine" not in json.dumps(record)
    assert record["command"] == command.replace("/machine/out", OUT_DIR)
    assert record["error"].endswith("<out-dir>/runs/r/run.log")


def test_the_output_directory_is_replaced_only_where_it_is_the_whole_path():
    assert without_out_dir("--out-dir /m/out and /m/out/runs/a", "/m/out") == "--out-dir <out-dir> and <out-dir>/runs/a"
    assert without_out_dir("/m/out2/runs/a /m/out.d", "/m/out") == "/m/out2/runs/a /m/out.d"


def test_a_record_file_is_the_same_bytes_for_the_same_run(tmp_path):
    record = make_record(RunResult("r", OK, "", 1.0, "cmd"), _summary("r", 0), {"id": "abc"})
    first = write_record(tmp_path / "a", record).read_bytes()
    assert write_record(tmp_path / "b", record).read_bytes() == first


def test_the_runner_writes_records_and_the_report_rebuilds_from_them_alone(fake_fit, tmp_path, records_in_tmp):
    out = tmp_path / "out"
    args = ["--profile", "smoke", "--claims", "3", "--in-process", "--no-wandb", "--out-dir", str(out)]
    assert command.main(args) == 0
    set_dir = records_in_tmp / "v1-smoke"
    written = read_records(set_dir)
    assert set(written) == {f"{name}.seed0" for name in fake_fit_names(fake_fit)}
    assert all(record["commit"]["source"] == "git" and record["commit"]["id"] for record in written.values())
    # What the digits depend on besides the tree: the runner vouches for its own machine and environment.
    assert all(record["environment"] == environment() for record in written.values())
    assert environment()["torch"] == torch.__version__.split("+")[0] and environment()["cores"] >= 1
    assert (set_dir / "report.md").is_file() and (set_dir / "reproduction.json").is_file()
    # The copies beside the records are committed: the output directory (a machine's path) is written as <out-dir>.
    assert str(out) in (out / "REPRODUCTION.md").read_text()
    for name in ("report.md", "reproduction.json"):
        assert str(out) not in (set_dir / name).read_text() and OUT_DIR in (set_dir / name).read_text()
    assert all(str(out) not in record["command"] for record in written.values())
    first = json.loads((out / "reproduction.json").read_text())

    shutil.rmtree(out)  # no runs/ left: the records alone
    assert command.main([*args, "--report-only"]) == 0
    again = json.loads((out / "reproduction.json").read_text())
    assert [claim["ours"] for claim in again["claims"]] == [claim["ours"] for claim in first["claims"]]
    assert all(run["status"] == "ok" for run in again["runs"])


def fake_fit_names(calls) -> set[str]:
    return {Path(args[args.index("--trainer.run_dir") + 1]).name.split(".seed")[0] for args in calls}


def test_no_records_writes_none(fake_fit, tmp_path, records_in_tmp):
    args = ["--profile", "smoke", "--claims", "3", "--in-process", "--no-wandb", "--out-dir", str(tmp_path)]
    assert command.main([*args, "--no-records"]) == 0
    assert not (records_in_tmp / "v1-smoke").exists()


def _old_run(out_dir: Path, name: str, experiment: str) -> None:
    """A run directory as the runner wrote it before records: a status.json without a commit."""
    run_dir = out_dir / "runs" / name
    run_dir.mkdir(parents=True)
    status = {"name": name, "status": OK, "run_dir": str(run_dir), "wall_s": 3.0, "command": "c"}
    (run_dir / "status.json").write_text(json.dumps({**status, "experiment": experiment, "seed": 0}))
    (run_dir / "summary.json").write_text(json.dumps(_summary(experiment, 0)))


def test_extracted_records_name_the_tree_the_run_set_declares(tmp_path):
    _old_run(tmp_path, "practical_fedamp.seed0", "practical_fedamp")
    _old_run(tmp_path, "zhao_iid.seed0", "zhao_iid")
    extract_records(tmp_path, tmp_path / "v1-small", lambda r: declared_commit("v1-small", r.experiment))
    found = read_records(tmp_path / "v1-small")
    trees = DECLARED["trees"]
    assert found["practical_fedamp.seed0"]["commit"]["id"] == trees["v1-small-b"]["commit"]  # re-run after the
    assert found["zhao_iid.seed0"]["commit"]["id"] == trees["v1-small-a"]["commit"]  # common-range tuning
    assert found["zhao_iid.seed0"]["commit"]["source"] == "declared"


def test_an_extracted_record_has_an_environment_only_where_one_is_known(tmp_path):
    _old_run(tmp_path, "zhao_iid.seed0", "zhao_iid")
    status = tmp_path / "runs" / "zhao_iid.seed0" / "status.json"
    args = ["--profile", "smoke", "--claims", "1", "--out-dir", str(tmp_path), "--extract-records", "--no-wandb"]
    assert command.main([*args, "--commit", "1234567", "--records-dir", str(tmp_path / "a")]) == 0
    assert read_records(tmp_path / "a")["zhao_iid.seed0"]["environment"] is None  # an older runner's: unknown
    assert command.main([*args, "--commit", "1234567", "--records-dir", str(tmp_path / "b"), "--same-machine"]) == 0
    vouched = read_records(tmp_path / "b")["zhao_iid.seed0"]["environment"]
    assert vouched == environment("declared: extracted with --same-machine")
    # A run whose runner stored its environment keeps that one, whatever the extraction says.
    stored = {**environment(), "cpu": "the machine that ran it"}
    status.write_text(json.dumps({**json.loads(status.read_text()), "environment": stored}))
    assert command.main([*args, "--commit", "1234567", "--records-dir", str(tmp_path / "c"), "--same-machine"]) == 0
    assert read_records(tmp_path / "c")["zhao_iid.seed0"]["environment"] == stored


def test_extracting_a_set_without_a_declared_tree_asks_for_commit(tmp_path, capsys):
    _old_run(tmp_path, "zhao_iid.seed0", "zhao_iid")
    args = ["--profile", "smoke", "--claims", "1", "--out-dir", str(tmp_path), "--extract-records", "--no-wandb"]
    with pytest.raises(SystemExit, match="--extract-records: no tree is known for run 'zhao_iid.seed0'"):
        command.main(args)
    assert command.main([*args, "--commit", "1234567"]) == 0


def test_every_declared_run_set_names_a_tree_that_exists():
    for name, entry in DECLARED["sets"].items():
        for tree in {entry["tree"], *entry.get("tree_by_experiment", {}).values()} - {None}:
            assert tree in DECLARED["trees"], name


def test_the_exploratory_set_lists_its_runs_and_its_estimate(tmp_path, capsys):
    args = ["--protocol", "v2", "--exploratory", "claim5-e50", "--list", "--no-wandb", "--out-dir", str(tmp_path)]
    assert command.main(args) == 0
    printed = capsys.readouterr()
    commands = printed.out.splitlines()
    assert len(commands) == 6
    assert all("--trainer.local_epochs 50" in line and "--model.init_args.lr 0.01" in line for line in commands)
    assert sum("fedcurv_lam1e-3.yaml" in line for line in commands) == 2
    assert "not a verdict" in printed.err and "worker-min" in printed.err


def test_the_exploratory_set_is_reported_as_exploratory(fake_fit, tmp_path, records_in_tmp):
    args = ["--protocol", "v2", "--exploratory", "claim5-e50", "--in-process", "--no-wandb", "--out-dir", str(tmp_path)]
    assert command.main([*args, "--profile", "smoke"]) == 0
    report = (tmp_path / "REPRODUCTION.md").read_text()
    assert "exploratory (REPRODUCTION.md, declared before it ran)" in report
    assert "| 5 (exploratory: E = 50, λ = 1) |" in report
    assert len(read_records(records_in_tmp / "v2-exploratory-claim5-e50")) == 6


def test_the_cut_runs_are_the_seven_runs_cut_1_keeps_and_cut_4_drops(tmp_path, capsys):
    base = ["--protocol", "v2", "--profile", "full", "--list", "--no-wandb", "--out-dir", str(tmp_path)]
    command.main([*base, "--cut", "4"])
    four = set(capsys.readouterr().out.splitlines())
    command.main([*base, "--cut", "1"])
    one = set(capsys.readouterr().out.splitlines())
    assert four < one and len(one - four) == 7
    names = {line.split("--trainer.run_dir ")[1].split()[0].rsplit("/", 1)[1] for line in one - four}
    assert names == {
        *(f"pathological_{method}.seed0" for method in ("apfl", "fedavg_ft", "fedprox_ft")),
        *(f"{method}_fmnist_beta01_lr001.seed0" for method in ("fedgg", "fedavg", "fedprox", "scaffold")),
    }


@pytest.mark.parametrize("table", TABLES, ids=[table.name for table in TABLES])
def test_every_table_renders_from_records_of_its_run_set_and_reads_back_equal(table, tmp_path):
    _write_synthetic(tmp_path, table.record_set)
    values = Values(table.record_set_of(list(recorded_results(tmp_path).values())))
    assert compare(table, _rendered(table, values), values) == []


def test_the_search_report_replays_from_a_records_folder(tmp_path):
    rebuilt = rebuilt_tuning_report(tmp_path / "no-records-yet", tmp_path / "out", ROOT)
    published = (ROOT / "configs" / "tuned_v2" / "TUNING.md").read_text()
    # The same sections and search tables; every score of them differs (no run recorded: "–").
    assert [line for line in rebuilt.splitlines() if line.startswith("## ")][:4] == [
        line for line in published.splitlines() if line.startswith("## ")
    ][:4]
    assert report_differences(published, rebuilt, "TUNING.md")


def test_a_published_reports_editorial_note_is_not_compared_but_its_numbers_are():
    rebuilt = "# Search\n\n- date: 2026-11-28\n\n| run | score |\n|---|---|\n| a | 92.20 |\n"
    noted = rebuilt.replace("# Search\n", "# Search\n\n> The presets are another search's choices.\n")
    assert report_differences(noted.replace("2026-11-28", "2026-11-27"), rebuilt, "R.md") == []
    # A note does not excuse a number: the score under it is still read.
    problems = report_differences(noted.replace("92.20", "92.65"), rebuilt, "R.md")
    assert problems == ["R.md, line 9: published ['92.65'], records give ['92.20'] ('| a | 92.65 |')"]


def test_reproduction_md_quotes_the_choices_and_scores_of_the_search_report():
    # TUNING.md is the search's records' (the test above); REPRODUCTION.md's choice table quotes it.
    reproduction = (ROOT / "REPRODUCTION.md").read_text()
    tuning = (ROOT / "configs" / "tuned_v2" / "TUNING.md").read_text()
    assert choice_differences(reproduction, tuning, "REPRODUCTION.md") == []


_REPORT = """## pathological

| run | settings | choice | validation score, % | status |
|---|---|---|---|---|
| pathological_fedamp | 12 | FedAMP.sigma=0.1, FedAMP.alpha_k=0.005263, lr=0.1 | 92.20 | interior |

## FedCurv λ (claim 5, η = 0.01)

| λ | rounds to target | last-5 accuracy, % |
|---|---|---|
| 5e-06 | 52 | 71.63 |
| **1e-05** | **52** | **71.73** |
"""


def test_a_table_quoting_the_search_reads_its_choices_and_scores_from_the_report():
    assert search_choices(_REPORT) == {
        "pathological_fedamp": ("FedAMP.sigma=0.1, FedAMP.alpha_k=0.005263, lr=0.1", "92.20"),
        "fedcurv_paper": ("**1e-05**", "**52**"),
    }
    table = (
        "| run | v1 choice (score) | rerun's choice | rerun's score | rerun's status |\n|---|---|---|---|---|\n"
        "| pathological_fedamp | σ 0.05, lr 0.15 (93.55) | σ 0.1 (α_k 0.005263), lr 0.1 | 92.20 | interior |\n"
        "| fedcurv_paper | λ 0.01 | λ 1e-5 | 52 rounds to the target | bounded; η = 0.01 |\n\nAfter the table.\n"
    )
    assert choice_differences(table, _REPORT, "R.md") == []
    assert choice_differences(table.replace("92.20", "92.65"), _REPORT, "R.md") == [
        "R.md, row 'pathological_fedamp', rerun's score: '92.65'; the report gives '92.20'"
    ]
    assert choice_differences(table.replace("σ 0.1 (", "σ 0.3 ("), _REPORT, "R.md") == [
        "R.md, row 'pathological_fedamp', rerun's choice: 'σ 0.3 (α_k 0.005263), lr 0.1';"
        " the report gives 'FedAMP.sigma=0.1, FedAMP.alpha_k=0.005263, lr=0.1'"
    ]
    unknown = table.replace("| fedcurv_paper |", "| fedcurv_e50 |")
    assert choice_differences(unknown, _REPORT, "R.md") == [
        "R.md, row 'fedcurv_e50': the search report has no choice for it"
    ]
    assert choice_differences("no table", _REPORT, "R.md") == [
        "R.md: no table with the columns rerun's choice, rerun's score"
    ]


# Rewriting a set's tables from its records (benchmarks/reproduce/rewrite.py).


def _values_of(record_set: str, directory: Path, table=None) -> Values:
    _write_synthetic(directory, record_set)
    results = list(recorded_results(directory).values())
    return Values(table.record_set_of(results) if table else RecordSet(results, record_set.split("-")[0]))


@pytest.mark.parametrize("name", ["REPRODUCTION.md, v2 full", "docs, v2 full", "REPRODUCTION.md, v1 small"])
def test_the_published_file_rewritten_from_records_equals_them_and_keeps_everything_else(name, tmp_path):
    table = next(table for table in TABLES if table.name == name)
    values = _values_of(table.record_set, tmp_path, table)
    published = (ROOT / table.path).read_text()
    rewritten, changes, unrecorded = rewrite_table(table, published, values)
    assert unrecorded == [] and changes
    assert compare(table, rewritten, values) == []
    # Only the table's checked rows change; every other line, and each row's words and pipes, stay.
    rows = set(table_lines(published, table.heading).values())
    before, after = published.splitlines(), rewritten.splitlines()
    assert len(before) == len(after)
    assert [line for i, line in enumerate(before) if i not in rows] == [
        line for i, line in enumerate(after) if i not in rows
    ]
    assert all(after[i].count("|") == before[i].count("|") for i in rows)
    # Rewriting again from the same records changes nothing.
    assert rewrite_table(table, rewritten, values)[1] == []


def test_a_rewrite_restores_an_edited_number_and_names_it(synthetic):
    table = next(table for table in TABLES if table.name == "REPRODUCTION.md, v2 small")
    text = _rendered(table, synthetic)
    row = next(line for line in text.splitlines() if line.startswith("| 7 |"))
    number = tokens(row.split("|")[4])[2]
    edited = text.replace(row, row.replace(f" {number} ", f" {float(number) + 0.1:.1f} ", 1))
    rewritten, changes, _ = rewrite_table(table, edited, synthetic)
    assert rewritten == text
    assert [(change.row, change.column) for change in changes] == [("7", 3)]
    assert f"{float(number) + 0.1:.1f} → {number}" in str(changes[0])


def test_verdicts_per_seed_that_change_shape_are_rewritten_whole(tmp_path):
    table = next(table for table in TABLES if table.name == "docs, v2 full")
    values = _values_of("v2-full", tmp_path, table)
    text = _rendered(table, values)
    row = next(line for line in text.splitlines() if line.startswith("| 7 |"))
    cells = row.split("|")
    seeds = format(values.value("seeds", "fedgg_rounds"))
    speedups = cells[5].split()[len(tokens(seeds)) :]  # the speed-ups of seeds 2 and 0, after the verdicts
    written = text.replace(row, "|".join([*cells[:5], f" {seeds} ({'–'.join(speedups)}×) ", *cells[6:]]))
    other = "not, partly, not" if seeds == "reproduced ×3" else "reproduced ×3"
    edited = written.replace(f" {seeds} (", f" {other} (", 1)
    assert edited != written
    rewritten, changes, _ = rewrite_table(table, edited, values)
    assert rewritten == written and [(change.row, change.column) for change in changes] == [("7", 4)]


def test_rows_whose_runs_are_not_all_recorded_are_left_alone(tmp_path):
    table = next(table for table in TABLES if table.name == "REPRODUCTION.md, v2 full")
    _write_synthetic(tmp_path / "all", "v2-full")
    for path in (tmp_path / "all").iterdir():
        if not path.name.startswith("practical_"):
            (tmp_path / "some").mkdir(exist_ok=True)
            shutil.copy(path, tmp_path / "some" / path.name)
    values = Values(table.record_set_of(list(recorded_results(tmp_path / "some").values())))
    published = (ROOT / table.path).read_text()
    rewritten, changes, unrecorded = rewrite_table(table, published, values)
    assert "4" in unrecorded and "3" not in unrecorded
    lines = table_lines(published, table.heading)
    assert rewritten.splitlines()[lines["4"]] == published.splitlines()[lines["4"]]
    assert {change.row for change in changes} <= set(table.cells) - set(unrecorded)


class _SpeedUps:
    """Values whose per-seed speed-ups are given: ``None`` is a seed that never reaches the target."""

    def __init__(self, speed_ups):
        self.speed_ups = speed_ups

    def value(self, name, key):
        speed_up = self.speed_ups[int(key.partition("@")[2])]
        return NEVER if speed_up is None else speed_up


def test_a_speed_up_that_becomes_never_or_stops_being_never_keeps_the_times_sign():
    specs = [f"x[fedgg>fedavg@{seed}]:.2f" for seed in (0, 1, 2)]
    published = " (never, 1.00×, 1.00×) "
    reached = rewritten_cell(published, specs, _SpeedUps([1.0, 1.0, 1.25]))
    assert reached == " (1.00×, 1.00×, 1.25×) "
    assert rewritten_cell(reached, specs, _SpeedUps([None, 1.0, None])) == " (never, 1.00×, never) "


def test_a_run_with_some_of_its_seeds_recorded_is_not_recorded(tmp_path):
    """A mean over the seeds that happen to have finished (a set still running) is not the published mean."""
    table = next(table for table in TABLES if table.name == "REPRODUCTION.md, v2 small")
    _write_synthetic(tmp_path, "v2-small")
    (tmp_path / "practical_fedavg.seed2.json.gz").unlink()
    values = Values(table.record_set_of(list(recorded_results(tmp_path).values())))
    assert unrecorded_runs(table, "4", values.records) == {"practical_fedavg"}
    assert unrecorded_runs(table, "3", values.records) == set()
    published = (ROOT / table.path).read_text()
    _, _, unrecorded = rewrite_table(table, published, values)
    assert "4" in unrecorded and "3" not in unrecorded


def test_the_rewrite_command_writes_the_files_and_prints_the_errata(tmp_path, capsys):
    table = next(table for table in TABLES if table.name == "REPRODUCTION.md, v2 full")
    _write_synthetic(tmp_path / "records", "v2-full")
    for path in {t.path for t in TABLES if t.record_set == "v2-full"}:
        (tmp_path / "root" / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / "root" / path)
    args = ["v2-full", "--records-dir", str(tmp_path / "records"), "--root", str(tmp_path / "root")]
    assert rewrite_main([*args, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert (tmp_path / "root" / table.path).read_text() == (ROOT / table.path).read_text()
    assert rewrite_main(args) == 0
    assert capsys.readouterr().out.replace("rewritten", "would change") == dry
    assert dry.count("\n- REPRODUCTION.md, v2 full, row ") >= 1 and " → " in dry
    values = _values_of("v2-full", tmp_path / "records", table)
    assert compare(table, (tmp_path / "root" / table.path).read_text(), values) == []


def test_the_lines_that_quote_a_changed_number_are_listed_for_a_person(tmp_path):
    changes = [
        Change("t", "3", 3, ("96.4", "0.1", "12"), ("96.5", "0.2", "13")),
        Change("t", "5", 3, ("78.2",), ("77.9",)),
    ]
    text = (ROOT / "REPRODUCTION.md").read_text().splitlines()
    full = text.index(next(line for line in text if line.startswith("### v2 full profile")))
    v1 = text.index(next(line for line in text if line.startswith("### Full profile")))
    inserted = {
        full + 1: "In this section, 96.4 and 0.1 and 12.",  # one number, in the set's own section: listed
        v1 + 1: "Far away, a lone 96.4, and 96.45.",  # one number, elsewhere: a coincidence, not listed
        v1 + 2: "Far away, 96.4 beside 78.2.",  # two numbers, elsewhere: an errata item or a summary, listed
    }
    for index in sorted(inserted, reverse=True):
        text.insert(index, inserted[index])
    shutil.copytree(ROOT / "docs" / "reproduction", tmp_path / "docs" / "reproduction")
    (tmp_path / "REPRODUCTION.md").write_text("\n".join(text) + "\n")
    found = dict(line.rsplit(": ", 1) for line in quoted_in_prose(changes, "v2-full", tmp_path))
    line_of = {
        index: f"REPRODUCTION.md:{index + 1 + sum(1 for other in inserted if other < index)}" for index in inserted
    }
    assert found[line_of[full + 1]] == "96.4"  # not 0.1 (too short to look for) nor 12 (no decimal point)
    assert line_of[v1 + 1] not in found
    assert found[line_of[v1 + 2]] == "78.2, 96.4"


def test_a_cell_whose_wording_lost_a_number_stops_the_rewrite_with_one_line(tmp_path):
    _write_synthetic(tmp_path / "records", "v2-full")
    shutil.copytree(ROOT / "docs" / "reproduction", tmp_path / "root" / "docs" / "reproduction")
    shutil.copy(ROOT / "REPRODUCTION.md", tmp_path / "root" / "REPRODUCTION.md")
    docs = tmp_path / "root" / "docs" / "reproduction" / "index.md"
    # The docs' table comes second: REPRODUCTION.md's would already be rewritten when the docs' fails.
    docs.write_text(docs.read_text().replace("(BMTA, 3 seeds)", "(BMTA)", 1))
    args = ["v2-full", "--records-dir", str(tmp_path / "records"), "--root", str(tmp_path / "root")]
    with pytest.raises(SystemExit, match=r"^rewrite: 7 tokens in .*make the cell and its specs in published_tables"):
        rewrite_main(args)
    assert (tmp_path / "root" / "REPRODUCTION.md").read_text() == (ROOT / "REPRODUCTION.md").read_text()


def test_a_cell_the_specs_cannot_be_matched_to_is_refused(synthetic):
    specs = ["final[zhao_iid]:.1f", "seeds[zhao_emd]"]
    written = f"{format(synthetic.value('final', 'zhao_iid'), '.1f')} ({format(synthetic.value('seeds', 'zhao_emd'))})"
    assert rewritten_cell(written, specs, synthetic) == written
    with pytest.raises(ValueError, match="too few for the specs"):
        rewritten_cell("no numbers here", specs, synthetic)
    with pytest.raises(ValueError, match="2 specs of variable length changed their tokens"):
        rewritten_cell("reproduced ×3, not ×3", ["seeds[zhao_emd]", "seeds[zhao_sharing]"], synthetic)
