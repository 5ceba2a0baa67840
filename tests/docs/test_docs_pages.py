"""The README stays one screen around the two commands, and the figures the docs quote agree with their sources.

The two commands live once, in README.md between ``--8<-- [start:commands]`` and ``[end:commands]``; the site's
"Get started" page includes that section, and this file checks what the commands name. The reproduction verdicts
on docs/reproduction/index.md are checked against v1's published record (``benchmarks/reproduce/v1_record``, which
the v2 runner reads) and against REPRODUCTION.md's v2 tables, the curated record of the runs.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
REPRODUCTION_PAGE = ROOT / "docs" / "reproduction" / "index.md"


def commands() -> list[str]:
    """The README's two commands, in order."""
    text = README.read_text()
    section = text.split("<!-- --8<-- [start:commands] -->\n", 1)[1].split("<!-- --8<-- [end:commands] -->", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_readme_is_one_screen_with_the_two_commands():
    assert len(README.read_text().splitlines()) <= 200
    assert len(commands()) == 2


def test_the_install_command_names_what_the_repository_has():
    install, _ = commands()
    toml = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    project = toml.loads((ROOT / "pyproject.toml").read_text())["project"]
    for step in (s.strip() for s in install.split("&&")):
        words = shlex.split(step)
        if words[:3] == ["pip", "install", "-e"]:
            extras = re.fullmatch(r"\.\[([\w,-]+)\]", words[3])
            assert extras, f"the install command installs {words[3]!r}, not this checkout with extras"
            assert set(extras.group(1).split(",")) <= set(project["optional-dependencies"])
        elif words[0] == "lightning-fed":
            assert "lightning-fed" in project["scripts"]
            assert (ROOT / words[words.index("--config") + 1]).is_file()
        else:
            assert words[:2] == ["pip", "install"], step


def test_ci_runs_the_readme_test_command():
    _, test = commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in (line.strip() for line in ci)


def test_get_started_includes_the_commands_from_the_readme():
    page = (ROOT / "docs" / "get-started.md").read_text()
    assert '--8<-- "README.md:commands"' in page
    assert "pytest -q\n```" not in page  # included, not copied


def _table(text: str, heading: str) -> dict[str, list[str]]:
    """Claim -> cells of the first table after ``heading`` (a line that starts with it)."""
    start = next(i for i, line in enumerate(text.splitlines()) if line.startswith(heading))
    rows: dict[str, list[str]] = {}
    for line in text.splitlines()[start + 1 :]:
        if line.startswith(("| #", "|---")):
            continue
        if not line.startswith("| "):
            if rows:
                break
            continue
        cells = [c.strip().strip("*") for c in line.split("|")[1:-1]]
        rows[cells[0]] = cells
    return rows


def _numbers(text: str) -> list[str]:
    # Figures, not the digits of a name (MNIST-1D, LeNet-5).
    return re.findall(r"(?<![\w-])\d+(?:\.\d+)?(?![A-Za-z])", text)


@pytest.mark.parametrize(
    ("profile", "heading", "per_seed"),
    [
        ("small", "## Latest small-profile results (protocol v1)", True),
        ("full", "## Latest full-profile results", False),
    ],
)
def test_the_v1_verdicts_and_figures_are_the_published_record(profile, heading, per_seed):
    record = json.loads((ROOT / "benchmarks" / "reproduce" / "v1_record" / f"{profile}.json").read_text())
    page = _table(REPRODUCTION_PAGE.read_text(), heading)
    assert set(page) == {claim["number"] for claim in record["claims"]}
    for claim in record["claims"]:
        cells = page[claim["number"]]
        verdict = cells[-2] if per_seed else cells[-1]
        assert claim["verdict"].startswith(verdict.replace("not", "not reproduced") if verdict == "not" else verdict)
        if per_seed:
            assert cells[-1] == claim["per_seed"]
        ours = cells[-3] if per_seed else cells[-2]
        # The record may shorten a long cell (`…`), never change a figure.
        missing = [n for n in _numbers(claim["ours"]) if n not in _numbers(ours)]
        assert not missing, f"claim {claim['number']}: {missing} of the record are not on the page"


def _verdict_words(text: str) -> list[str]:
    # The verdicts, without the details in parentheses (ratios, "never") that one table gives and the other not.
    return re.findall(r"reproduced|partly|not", re.sub(r"\([^)]*\)", "", text))


@pytest.mark.parametrize(
    ("page_heading", "record_heading"),
    [
        ("**Small profile, 3 seeds**", "### v2 small profile, 3 seeds"),
        ("**Full profile, 3 seeds for claims 3, 4 and 7**", "### v2 full profile"),
    ],
)
def test_the_v2_verdicts_are_reproduction_mds(page_heading, record_heading):
    page = _table(REPRODUCTION_PAGE.read_text(), page_heading)
    record = _table((ROOT / "REPRODUCTION.md").read_text(), record_heading)
    compared = 0
    for claim, cells in page.items():
        if cells[-3] == "–":  # v1's result stands (PROTOCOL.md's cut 1): no v2 row
            continue
        verdict, per_seed, v1 = record[claim][-3:]
        assert (cells[-3], cells[-1]) == (verdict, v1), claim
        assert _verdict_words(per_seed) == _verdict_words(cells[-2]), claim
        compared += 1
    assert compared >= 8
