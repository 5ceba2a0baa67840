"""The published tables, rebuilt from the committed records (:mod:`benchmarks.reproduce.records`).

REPRODUCTION.md, the docs' reproduction page and configs/tuned_v2/TUNING.md quote numbers from runs that are not
committed. This module says where each number of those tables comes from, computes it from a record set, and
compares: ``tests/reproduce/test_published_tables.py`` fails on any number (or verdict word) that differs.

A table is found by its file and the heading above it; a row by its first cell. Each checked cell is described by
its *tokens*, in the order they appear: every number (``12``, ``83.1``) and verdict word (``reproduced``, ``partly``,
``not``, ``never``) of the cell. A token spec is a literal (``=5``, the 5 of "LeNet-5") or an expression
``name[key]`` with an optional format (``bmta[practical_fedamp]:.1f``), computed from the records:

* ``final``, ``best``, ``last5``: the global test accuracy at the last round, its best, the mean of the last 5 (%);
* ``bmta``: FedAMP's best mean test accuracy (%); ``sd_bmta``: its population std over the seeds (points);
* ``emd``: the partition's mean EMD; ``xi``: FedAMP's mean self-weight ξ_ii at the last round;
* ``std``: the round-to-round std of the accuracy over the second half (points); ``std_runs``: the same per run,
  averaged over the seeds;
* ``mid``: FedAvg's accuracy at half its rounds (%); ``mid_round``: that round;
* ``reach[a>b]`` / ``reach_mid[a>b]``: the rounds ``a`` takes to reach ``b``'s final / mid accuracy (``never``);
  ``x[a>b]`` / ``x_mid[a>b]``: ``b``'s rounds over ``a``'s (the speed-up); ``x_lo[a>b]`` / ``x_hi[a>b]``: the
  smallest and largest speed-up of the seeds (a range, "1.57–2.10×"; ``never`` where a seed never gets there);
* ``recovered[iid>one_class>share...]``: the share of the IID − 1-class gap the best shared fraction recovers (%);
* ``verdict[claim]``: the claim's verdict word on the seed means; ``seeds[claim]``: the verdicts per seed, as the
  tables write them (``reproduced ×3``, or ``not, partly, not``); ``ours[claim]``: the figure the report writes
  for the claim (every number of it).

A key ending in ``@<seed>`` is computed on that seed's run alone (``x[a>b@1]``). Numbers are compared as the table
writes them, so a spec's format is the table's rounding.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.reproduce import measures
from benchmarks.reproduce.claims import CLAIM_SETS, GLOBAL_ACC, NO_VERDICT, Claim
from benchmarks.reproduce.experiments import default_seeds, experiments_for
from benchmarks.reproduce.exploratory import EXPLORATORY
from benchmarks.reproduce.measures import Summary
from benchmarks.reproduce.rules import NOT
from benchmarks.reproduce.runner import RunResult
from benchmarks.reproduce.seeds import mean_summaries, per_seed_summaries
from benchmarks.reproduce.tuning_v2 import FEDCURV_RUN

#: A cell's numbers and verdict words, in order.
TOKEN = re.compile(r"\d+(?:\.\d+)?|reproduced|partly|not|never")
_SPEC = re.compile(r"^(?P<name>\w+)\[(?P<key>[^\]]+)\](?::(?P<format>.+))?$")


class _Never:
    """A target never reached: formats as ``never`` whatever the table's number format."""

    def __format__(self, spec: str) -> str:
        return "never"


NEVER = _Never()


#: Specs whose key is a claim, not runs.
_CLAIM_VALUES = frozenset({"verdict", "seeds", "ours"})

#: Specs whose value is several tokens ("reproduced ×3", a whole figure).
_VARIABLE = frozenset({"seeds", "ours"})
_SPEED_UPS = frozenset({"x", "x_mid"})


def token_matches(text: str) -> list[re.Match[str]]:
    """The numbers and verdict words of a cell, in order, with where each lies in ``text``."""
    return list(TOKEN.finditer(text.replace("\u2212", "-")))  # one character for one: the places stay ``text``'s


def tokens(text: str) -> list[str]:
    """The numbers and verdict words of a cell, in order."""
    return [match.group() for match in token_matches(text)]


@dataclass
class RecordSet:
    """A record set's runs as the reports read them: seeds, their means, and the claims judged on them."""

    results: Sequence[RunResult]
    protocol: str
    claims: tuple[Claim, ...] = ()
    #: The runs the set was made of (its profile's) and the seeds each ran with, where known: a claim's runs outside
    #: them are not read, and a run is recorded only when all of its seeds are.
    planned: Mapping[str, tuple[int, ...]] | None = None
    seeded: dict[str, dict[int, Summary]] = field(init=False)
    means: dict[str, Summary] = field(init=False)

    def __post_init__(self) -> None:
        seeded: dict[str, dict[int, Summary]] = {}
        for result in self.results:
            if result.ok:
                seeded.setdefault(result.experiment, {})[result.seed or 0] = result.summary()
        self.seeded = seeded
        self.means = mean_summaries(seeded)
        self.claims = self.claims or CLAIM_SETS[self.protocol]

    def claim(self, key: str) -> Claim:
        for claim in self.claims:
            if claim.key == key:
                return claim
        raise KeyError(f"no claim {key!r} in protocol {self.protocol}")


def _short(verdict: str) -> str:
    return "not" if verdict == NOT else verdict


def _seed_words(words: Sequence[str]) -> str:
    if len(words) > 1 and len(set(words)) == 1:
        return f"{words[0]} ×{len(words)}"
    return ", ".join(words)


class Values:
    """The expressions a token spec can name, computed on the seed means or on one seed (``@<seed>``)."""

    def __init__(self, records: RecordSet) -> None:
        self.records = records
        self._per_seed = per_seed_summaries(records.seeded)

    def _runs(self, seed: int | None) -> Mapping[str, Summary]:
        return self.records.means if seed is None else self._per_seed.get(seed, {})

    def value(self, name: str, key: str) -> Any:
        key, _, seed_text = key.partition("@")
        seed = int(seed_text) if seed_text else None
        runs = self._runs(seed)
        args = key.split(">")
        method: Callable[..., Any] | None = getattr(self, f"_{name}", None)
        if method is None:
            raise KeyError(f"unknown value {name!r}")
        return method(runs, seed, *args)

    # Accuracies, in percent.
    def _final(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        return 100 * measures.final(runs[run], GLOBAL_ACC)

    def _best(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        return 100 * measures.best(runs[run], GLOBAL_ACC)

    def _last5(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        return 100 * measures.tail_mean(runs[run], GLOBAL_ACC)

    def _bmta(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        return 100 * measures.bmta(runs[run])

    def _sd_bmta(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        by_seed = self.records.seeded[run]
        return 100 * statistics.pstdev(measures.bmta(by_seed[s]) for s in sorted(by_seed))

    def _emd(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        return measures.mean_emd(runs[run])

    def _xi(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        return measures.final(runs[run], "fedamp/xi_self_mean")

    def _std(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        return 100 * measures.round_to_round_std(runs[run], GLOBAL_ACC)

    def _std_runs(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        by_seed = self.records.seeded[run]
        return 100 * statistics.fmean(measures.round_to_round_std(by_seed[s], GLOBAL_ACC) for s in sorted(by_seed))

    def _mid(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> float:
        return 100 * measures.at_fraction(runs[run], GLOBAL_ACC, 0.5)

    def _mid_round(self, runs: Mapping[str, Summary], seed: int | None, run: str) -> str:
        points = measures.series(runs[run], GLOBAL_ACC)
        return f"{max(round_ for round_, _ in points if round_ <= 0.5 * points[-1][0]):g}"

    # Rounds to a target, and speed-ups.
    def _target(self, runs: Mapping[str, Summary], base: str, mid: bool) -> float:
        summary = runs[base]
        return measures.at_fraction(summary, GLOBAL_ACC, 0.5) if mid else measures.final(summary, GLOBAL_ACC)

    def _rounds(self, runs: Mapping[str, Summary], run: str, base: str, mid: bool) -> float | None:
        return measures.rounds_to_reach(runs[run], GLOBAL_ACC, self._target(runs, base, mid))

    def _reach(self, runs: Mapping[str, Summary], seed: int | None, run: str, base: str) -> Any:
        rounds = self._rounds(runs, run, base, False)
        return NEVER if rounds is None else f"{rounds:g}"

    def _reach_mid(self, runs: Mapping[str, Summary], seed: int | None, run: str, base: str) -> Any:
        rounds = self._rounds(runs, run, base, True)
        return NEVER if rounds is None else f"{rounds:g}"

    def _speedup(self, runs: Mapping[str, Summary], run: str, base: str, mid: bool) -> Any:
        ours, theirs = self._rounds(runs, run, base, mid), self._rounds(runs, base, base, mid)
        if ours is None:
            return NEVER
        return math.inf if theirs is None else theirs / ours

    def _x(self, runs: Mapping[str, Summary], seed: int | None, run: str, base: str) -> Any:
        return self._speedup(runs, run, base, False)

    def _x_mid(self, runs: Mapping[str, Summary], seed: int | None, run: str, base: str) -> Any:
        return self._speedup(runs, run, base, True)

    def _per_seed_speedups(self, run: str, base: str) -> list[Any]:
        return [self._speedup(self._per_seed[seed], run, base, False) for seed in sorted(self._per_seed)]

    def _x_lo(self, runs: Mapping[str, Summary], seed: int | None, run: str, base: str) -> Any:
        found = self._per_seed_speedups(run, base)
        return NEVER if any(speedup is NEVER for speedup in found) else min(found)

    def _x_hi(self, runs: Mapping[str, Summary], seed: int | None, run: str, base: str) -> Any:
        reached = [speedup for speedup in self._per_seed_speedups(run, base) if speedup is not NEVER]
        return max(reached) if reached else NEVER

    def _recovered(self, runs: Mapping[str, Summary], seed: int | None, iid: str, one: str, *shared: str) -> float:
        final = {name: measures.final(runs[name], GLOBAL_ACC) for name in (iid, one, *shared)}
        best = max(final[name] for name in shared)
        return 100 * (best - final[one]) / (final[iid] - final[one])

    # Verdicts.
    def _verdict(self, runs: Mapping[str, Summary], seed: int | None, key: str) -> str:
        claim = self.records.claim(key)
        seeded = self.records.seeded if seed is None else {name: {seed: summary} for name, summary in runs.items()}
        verdict = claim.evaluate(runs, seeded).verdict
        if verdict == NO_VERDICT:
            raise KeyError(f"claim {key!r} has no verdict on these records")
        return _short(verdict)

    def _ours(self, runs: Mapping[str, Summary], seed: int | None, key: str) -> str:
        claim = self.records.claim(key)
        seeded = self.records.seeded if seed is None else {name: {seed: summary} for name, summary in runs.items()}
        return claim.evaluate(runs, seeded).ours

    def _seeds(self, runs: Mapping[str, Summary], seed: int | None, key: str) -> str:
        return _seed_words([self._verdict(self._per_seed[s], s, key) for s in sorted(self._per_seed)])


def unrecorded_runs(table: PublishedTable, row: str, records: RecordSet) -> set[str]:
    """The runs row ``row`` of ``table`` reads that ``records`` lack: the row can be checked, or rewritten, only
    when this is empty."""
    specs = [spec for column in table.cells[row].values() for spec in column]
    return {run for run in runs_read(specs, records) if not _all_seeds_recorded(run, records)}


def _all_seeds_recorded(run: str, records: RecordSet) -> bool:
    """Whether every seed ``run`` was planned with is recorded (any seed, where the plan is unknown): a mean over
    the seeds that happen to have finished is not the published mean."""
    recorded = records.seeded.get(run, {})
    if records.planned is None or run not in records.planned:
        return bool(recorded)
    return set(records.planned[run]) <= set(recorded)


def runs_read(specs: Sequence[str], records: RecordSet) -> set[str]:
    """The runs (experiment names) that ``specs`` read: the names in their keys, and for ``verdict``, ``seeds`` and
    ``ours`` every run of the claim that the set was planned with (a claim lists its runs of every profile)."""
    needed: set[str] = set()
    for spec in specs:
        if spec.startswith("="):
            continue
        match = _SPEC.match(spec)
        if match is None:
            raise ValueError(f"bad token spec {spec!r}: write name[key] or name[key]:format or =literal")
        key = match["key"].partition("@")[0]
        if match["name"] in _CLAIM_VALUES:
            claim_runs = set(records.claim(key).runs)
            needed |= claim_runs if records.planned is None else claim_runs & set(records.planned)
        else:
            needed |= set(key.split(">"))
    return needed


def formatted(spec: str, values: Values) -> str:
    """One spec's text as the table writes it: a literal's own, or the expression's value in the spec's format."""
    if spec.startswith("="):
        return spec[1:]
    match = _SPEC.match(spec)
    if match is None:
        raise ValueError(f"bad token spec {spec!r}: write name[key] or name[key]:format or =literal")
    return format(values.value(match["name"], match["key"]), match["format"] or "")


def evaluate(spec: str, values: Values) -> list[str]:
    """The tokens of one spec: a literal's own, or the expression's value formatted as the table writes it."""
    return tokens(formatted(spec, values))


def _value_name(spec: str) -> str:
    """The value a spec reads (``x`` of ``x[a>b@1]:.2f``); a literal's text for a literal."""
    return spec.split("[")[0]


def is_variable(spec: str) -> bool:
    """Whether ``spec`` gives a number of tokens that depends on the records (``seeds``, ``ours``)."""
    return _value_name(spec) in _VARIABLE


def is_speed_up(spec: str) -> bool:
    """Whether ``spec`` is one speed-up, which the text writes "1.57×" and, where the target is never reached,
    ``never`` without the sign (``x``, ``x_mid``; a range's ends are written "1.57–2.10×")."""
    return _value_name(spec) in _SPEED_UPS


@dataclass(frozen=True)
class PublishedTable:
    """One published table and where each checked cell's tokens come from.

    Args:
        name: How the test names it.
        path: The file, relative to the repository root.
        heading: The heading line above the table (the first table after it is read).
        record_set: The record set it rests on (``records/<record_set>/``).
        protocol: Whose claims its verdicts are.
        cells: Row key (its first cell) -> column index (0 = the first cell) -> token specs, in order.
        claims: The claims its ``verdict``, ``seeds`` and ``ours`` specs name, where they are not the protocol's own
            (an exploratory set's, labelled).
    """

    name: str
    path: str
    heading: str
    record_set: str
    protocol: str
    cells: Mapping[str, Mapping[int, Sequence[str]]]
    claims: tuple[Claim, ...] = ()

    def record_set_of(self, results: Sequence[RunResult]) -> RecordSet:
        """The runs of ``results`` as this table's values read them."""
        return RecordSet(results, self.protocol, self.claims, planned_runs(self.record_set))


def table_lines(text: str, heading: str) -> dict[str, int]:
    """Row key -> line index (in ``text.splitlines()``) of the first table at or after the first line that starts
    with ``heading`` (a heading, or the table's own header row)."""
    lines = text.splitlines()
    start = next((index for index, line in enumerate(lines) if line.startswith(heading)), None)
    if start is None:
        raise KeyError(f"heading {heading!r} not found")
    rows: dict[str, int] = {}
    seen = False
    for index in range(start, len(lines)):
        line = lines[index]
        if line.startswith("|"):
            seen = True
            key = split_row(line)[0]
            if set(key) <= set("-: ") or key == "#":
                continue
            rows[key] = index
        elif seen:
            break
    if not rows:
        raise KeyError(f"no table after heading {heading!r}")
    return rows


def split_row(line: str) -> list[str]:
    """The cells of a table row, stripped."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def planned_runs(record_set: str) -> dict[str, tuple[int, ...]]:
    """The runs (experiment names) record set ``record_set`` is made of, each with the seeds it ran: its profile's
    (``v2-full``), or an exploratory set's (``v2-exploratory-<name>``). A search (``-tune``) has no table of this
    kind: TUNING.md is rebuilt whole (:func:`rebuilt_tuning_report`)."""
    if record_set.startswith("v2-exploratory-"):
        exploratory = EXPLORATORY[record_set.removeprefix("v2-exploratory-")]
        return {run.name: exploratory.seeds for run in exploratory.experiments}
    if record_set.endswith("-tune"):
        raise ValueError(f"{record_set!r} is a search: its runs are the tuning runs, not a profile's")
    protocol, profile = record_set.split("-")[:2]
    return {run.name: default_seeds(protocol, profile, run.name) for run in experiments_for(profile, protocol=protocol)}


def read_table(text: str, heading: str) -> dict[str, list[str]]:
    """Row key -> cells of the first table at or after the first line that starts with ``heading``."""
    lines = text.splitlines()
    return {row: split_row(lines[index]) for row, index in table_lines(text, heading).items()}


@dataclass(frozen=True)
class Difference:
    """A checked cell whose tokens differ from the records'."""

    table: str
    row: str
    column: int
    published: list[str]
    rebuilt: list[str]

    def __str__(self) -> str:
        return (
            f"{self.table}, row {self.row!r}, column {self.column}: published {self.published}, "
            f"records give {self.rebuilt}"
        )


def compare(table: PublishedTable, text: str, values: Values) -> list[Difference]:
    """Every checked cell of ``table`` (read from ``text``) whose tokens differ from what the records give; a
    value the records cannot give counts as a difference that says why."""
    rows = read_table(text, table.heading)
    differences = []
    for row, columns in table.cells.items():
        cells = rows.get(row)
        for column, specs in columns.items():
            published = tokens(cells[column]) if cells is not None and column < len(cells) else ["<no such cell>"]
            try:
                rebuilt = [token for spec in specs for token in evaluate(spec, values)]
            except (KeyError, ValueError, ZeroDivisionError) as error:
                rebuilt = [f"<{type(error).__name__}: {error}>"]
            if published != rebuilt:
                differences.append(Difference(table.name, row, column, published, rebuilt))
    return differences


def shape_differences(table: PublishedTable, text: str) -> list[str]:
    """What the specs of ``table`` get wrong about the published text, without any record: a cell whose count of
    tokens differs from its specs', or whose literal is not the token at its place. Checked on every run of the
    tests, so that a table's wording and its specs stay in step before the records exist."""
    rows = read_table(text, table.heading)
    problems = []
    for row, columns in table.cells.items():
        if row not in rows:
            problems.append(f"{table.name}: no row {row!r}")
            continue
        for column, specs in columns.items():
            published = tokens(rows[row][column]) if column < len(rows[row]) else []
            variable = [index for index, spec in enumerate(specs) if is_variable(spec)]
            if variable:  # a spec of several tokens: only the literals before it have a fixed place
                specs = specs[: variable[0]]
                published = published[: len(specs)]
            if len(published) != len(specs):
                problems.append(
                    f"{table.name}, row {row!r}, column {column}: {len(published)} tokens {published}, "
                    f"{len(specs)} specs {list(specs)}"
                )
                continue
            for token, spec in zip(published, specs, strict=True):
                if spec.startswith("=") and tokens(spec[1:]) != [token]:
                    where = f"{table.name}, row {row!r}, column {column}"
                    problems.append(f"{where}: {spec!r} where the text has {token!r}")
    return problems


#: Header lines of a generated report that say when, where and how it was written, not what the runs gave.
_CIRCUMSTANCES = ("- date:", "- machine:", "- command:")

#: How a published report marks an editorial note: a blockquote line, which the generator never writes. A note says
#: what the report is beside other run sets (e.g. that its choices are not the presets'); the runs' numbers stay
#: the generator's, which is what the comparison checks.
_EDITORIAL = ">"


def report_differences(published: str, rebuilt: str, name: str) -> list[str]:
    """Line by line, the tokens of a published generated report (TUNING.md) against the same report rebuilt from
    records. Left out: the header lines of date, machine and command, blank lines, and the published report's
    editorial notes (blockquote lines, which the generator never writes); a difference names the published line."""

    def compared(text: str) -> list[tuple[int, str]]:
        return [
            (number, line)
            for number, line in enumerate(text.splitlines(), start=1)
            if line.strip() and not line.startswith((*_CIRCUMSTANCES, _EDITORIAL))
        ]

    keep, again = compared(published), compared(rebuilt)
    problems = [
        f"{name}, line {number}: published {tokens(old)}, records give {tokens(new)} ({old[:60]!r})"
        for (number, old), (_, new) in zip(keep, again, strict=False)
        if tokens(old) != tokens(new)
    ]
    if len(keep) != len(again):
        problems.append(f"{name}: {len(keep)} lines published, {len(again)} rebuilt")
    return problems


def rebuilt_tuning_report(records_dir: Path, out_dir: Path, root: Path) -> str:
    """v2's TUNING.md written again by ``--tune --report-only`` from the search's records alone."""
    from benchmarks.reproduce.command import main

    args = ["--protocol", "v2", "--profile", "small", "--tune", "--report-only", "--no-wandb", "--no-records"]
    main([*args, "--out-dir", str(out_dir), "--records-dir", str(records_dir), "--root", str(root)])
    return (out_dir / "tune" / "TUNING.md").read_text()


#: The columns of a published table that quote a search report's choices (REPRODUCTION.md's v2 choice table).
CHOICE_COLUMNS = ("rerun's choice", "rerun's score")


def search_choices(report: str) -> dict[str, tuple[str, str]]:
    """Each run's choice and score as a search report (TUNING.md) gives them: its comparisons' choice tables
    (``| run | settings | choice | score | status |``), and claim 5's λ, the bold row of its table, whose score is
    its rounds to the target."""
    found: dict[str, tuple[str, str]] = {}
    for line in report.splitlines():
        cells = split_row(line) if line.startswith("| ") else []
        if len(cells) == 5 and cells[1].isdigit():
            found[cells[0]] = (cells[2], cells[3])
        elif len(cells) == 3 and cells[0].startswith("**"):
            found[FEDCURV_RUN] = (cells[0], cells[1])
    return found


def choice_differences(published: str, report: str, name: str) -> list[str]:
    """The rows of ``published``'s choice table (the one whose header has :data:`CHOICE_COLUMNS`) against the
    search report they quote. Numbers compare by value, so a cell may write 1e-5 for the report's 1e-05."""

    def values(text: str) -> list[float | str]:
        return [float(token) if token[0].isdigit() else token for token in tokens(text)]

    lines = published.splitlines()
    header = next(
        (index for index, line in enumerate(lines) if all(c in split_row(line) for c in CHOICE_COLUMNS)), None
    )
    if header is None:
        return [f"{name}: no table with the columns {', '.join(CHOICE_COLUMNS)}"]
    columns = [split_row(lines[header]).index(column) for column in CHOICE_COLUMNS]
    choices = search_choices(report)
    problems = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        cells = split_row(line)
        quoted = choices.get(cells[0])
        if quoted is None:
            problems.append(f"{name}, row {cells[0]!r}: the search report has no choice for it")
            continue
        for column, heading, source in zip(columns, CHOICE_COLUMNS, quoted, strict=True):
            if values(cells[column]) != values(source):
                problems.append(f"{name}, row {cells[0]!r}, {heading}: {cells[column]!r}; the report gives {source!r}")
    return problems


def render_row(table: PublishedTable, row: str, values: Values, width: int) -> str:
    """A table row whose checked cells hold exactly the records' tokens (what a synthetic table is built from)."""
    cells = [row] + [""] * (width - 1)
    for column, specs in table.cells[row].items():
        cells[column] = " ".join(token for spec in specs for token in evaluate(spec, values))
    return "| " + " | ".join(cells) + " |"


__all__ = [
    "CHOICE_COLUMNS",
    "NEVER",
    "Difference",
    "PublishedTable",
    "RecordSet",
    "Values",
    "choice_differences",
    "compare",
    "evaluate",
    "formatted",
    "is_speed_up",
    "is_variable",
    "planned_runs",
    "read_table",
    "rebuilt_tuning_report",
    "report_differences",
    "render_row",
    "runs_read",
    "search_choices",
    "shape_differences",
    "split_row",
    "table_lines",
    "token_matches",
    "tokens",
    "unrecorded_runs",
]
