"""v1's published verdicts as data (``benchmarks/reproduce/v1_record``): the same as REPRODUCTION.md's tables, and
what a v2 report prints beside its own on a machine without v1's runs."""

import re
from pathlib import Path

import pytest

from benchmarks.reproduce.command import V1_RECORD, default_v1_report
from benchmarks.reproduce.report import read_v1_verdicts, shown_path
from benchmarks.reproduce.rules import NOT, PARTLY, REPRODUCED

ROOT = Path(__file__).parents[2]
_WORDS = {"reproduced": REPRODUCED, "partly": PARTLY, "not": NOT}


def _published(section: str) -> dict[str, str]:
    """Claim number -> verdict of the v1 table under ``section`` in REPRODUCTION.md (the verdict is the fifth cell)."""
    text = (ROOT / "REPRODUCTION.md").read_text()
    body = text.split(f"### {section}\n", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:-1] for line in body.splitlines() if re.match(r"\| \d+[a-c]? \|", line)]
    return {cells[0].strip(): _WORDS[cells[4].strip().strip("*")] for cells in rows}


@pytest.mark.parametrize(("profile", "section"), [("small", "Small profile, 3 seeds"), ("full", "Full profile")])
def test_the_record_holds_the_published_v1_verdicts(profile, section):
    published = _published(section)
    assert len(published) == 10
    assert read_v1_verdicts(V1_RECORD / f"{profile}.json") == published


def test_v2_reads_this_machines_v1_runs_first_then_the_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert default_v1_report("small") == V1_RECORD / "small.json"
    local = tmp_path / "runs" / "reproduce" / "small" / "reproduction.json"
    local.parent.mkdir(parents=True)
    local.write_text('{"claims": []}')
    assert default_v1_report("small").resolve() == local
    assert not default_v1_report("smoke").is_file()  # no record: the report says "none found"


def test_a_report_names_the_v1_record_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert shown_path(V1_RECORD / "small.json") == "benchmarks/reproduce/v1_record/small.json"
    outside = tmp_path / "reproduction.json"
    assert shown_path(outside) == str(outside)  # not below the working directory: shown as given
