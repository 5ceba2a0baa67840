"""``--resume``: a profile stopped part-way runs only what did not finish, and never keeps a run whose command or
YAML bytes changed since."""

import json
from pathlib import Path

from benchmarks.reproduce import command
from benchmarks.reproduce.experiments import Experiment
from benchmarks.reproduce.runner import OK, finished_result, finished_results, run_all


def _experiments(root: Path) -> list[Experiment]:
    (root / "configs").mkdir(exist_ok=True)
    for name in ("a", "b"):
        (root / "configs" / f"{name}.yaml").write_text(f"trainer:\n  num_rounds: 2  # {name}\n")
    return [Experiment(name, (f"configs/{name}.yaml",), "fedgg") for name in ("a", "b")]


def _ran(calls: list[list[str]]) -> list[str]:
    return [Path(args[args.index("--trainer.run_dir") + 1]).name for args in calls]


def test_resume_reads_back_finished_runs_and_runs_the_rest(tmp_path, fake_fit):
    experiments = _experiments(tmp_path)
    out = tmp_path / "out"
    first = run_all(experiments[:1], "small", out, tmp_path, in_process=True)
    assert first[0].ok and first[0].fingerprint
    assert _ran(fake_fit) == ["a"]

    finished = finished_results(experiments, "small", out, tmp_path)
    results = run_all(experiments, "small", out, tmp_path, in_process=True, finished=finished)
    assert [r.name for r in results] == ["a", "b"] and all(r.status == OK for r in results)
    assert _ran(fake_fit) == ["a", "b"]  # a was read back, not run again
    assert results[0].wall_s == first[0].wall_s


def test_resume_runs_again_what_changed_failed_or_stopped_part_way(tmp_path, fake_fit):
    a, b = _experiments(tmp_path)
    out = tmp_path / "out"
    run_all([a, b], "small", out, tmp_path, in_process=True)
    assert finished_result(a, "small", out, tmp_path) is not None

    # A preset edited after the run: a new fingerprint.
    (tmp_path / "configs" / "a.yaml").write_text("trainer:\n  num_rounds: 3\n")
    assert finished_result(a, "small", out, tmp_path) is None
    # Another command line (an override) for the same YAML.
    assert finished_result(b, "small", out, tmp_path, extra=["--trainer.num_rounds", "3"]) is None
    assert finished_result(b, "small", out, tmp_path) is not None
    # A summary that stops short of the rounds (a killed run that left an old status.json beside it).
    summary = out / "runs" / "b" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "completed_rounds": 1}))
    assert finished_result(b, "small", out, tmp_path) is None
    # A failed run.
    status = out / "runs" / "b" / "status.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "completed_rounds": 2}))
    status.write_text(json.dumps({**json.loads(status.read_text()), "status": "failed"}))
    assert finished_result(b, "small", out, tmp_path) is None
    # A status.json from before fingerprints: never trusted.
    status.write_text(json.dumps({k: v for k, v in json.loads(status.read_text()).items() if k != "fingerprint"}))
    assert finished_result(b, "small", out, tmp_path) is None


def test_the_command_resumes_and_says_what_it_read_back(tmp_path, fake_fit, monkeypatch, capsys):
    a, b = _experiments(tmp_path)
    monkeypatch.setattr(command, "claims_for", lambda keys, protocol: [])
    monkeypatch.setattr(command, "experiments_of", lambda claims: {"a", "b"})
    monkeypatch.setattr(command, "experiments_for", lambda profile, runs, protocol: [a, b])
    monkeypatch.setattr(command, "default_seeds", lambda protocol, profile, name: (0,))
    out = ["--out-dir", str(tmp_path / "o")]
    base = ["--profile", "small", "--in-process", "--no-wandb", "--root", str(tmp_path), *out]

    assert command.main(base) == 0
    assert _ran(fake_fit) == ["a.seed0", "b.seed0"]
    (tmp_path / "configs" / "b.yaml").write_text("trainer:\n  num_rounds: 2  # edited\n")
    capsys.readouterr()

    assert command.main([*base, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert _ran(fake_fit) == ["a.seed0", "b.seed0", "b.seed0"]
    assert "1 runs, profile small, in this process" in printed and "(1 finished earlier, read back)" in printed
    report = (tmp_path / "o" / "REPRODUCTION.md").read_text()
    assert "1 of 2 runs were finished by earlier invocations and read back" in report
