"""The published tables of a run set, rewritten from its records: every checked cell gets the records' numbers and
verdict words, and every change is listed for the errata.

A run set rerun at its own tree gives the same verdicts but not always the same digits: reruns are deterministic on
one machine, but another CPU's kernels round differently and a hundred rounds amplify that (REPRODUCTION.md,
errata). Once a set's records are complete, its tables are rewritten from them here rather than by hand, and the
test (``tests/reproduce/test_published_tables.py``) then holds the text to the records.

Only the cells :mod:`~benchmarks.reproduce.published_tables` checks are rewritten, token by token: the wording
around the numbers stays. A cell whose verdicts per seed change shape (``reproduced ×3`` to ``reproduced, partly,
reproduced``) gets the spec's text in place of the old span. Numbers quoted in prose are in no table: the command
lists the lines outside the checked rows that quote a changed number, to check by hand.

Usage, from the repository root::

    python -m benchmarks.reproduce.rewrite v2-full [--records-dir DIR] [--dry-run]
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.reproduce.published import (
    PublishedTable,
    Values,
    evaluate,
    formatted,
    is_speed_up,
    is_variable,
    table_lines,
    token_matches,
    tokens,
    unrecorded_runs,
)
from benchmarks.reproduce.published_tables import TABLES
from benchmarks.reproduce.records import recorded_results, set_dir

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Change:
    """One rewritten cell: its tokens as published and as the records give them."""

    table: str
    row: str
    column: int
    published: tuple[str, ...]
    rebuilt: tuple[str, ...]

    def __str__(self) -> str:
        if len(self.published) == len(self.rebuilt):
            pairs = [f"{old} → {new}" for old, new in zip(self.published, self.rebuilt, strict=True) if old != new]
        else:
            pairs = [f"{' '.join(self.published)} → {' '.join(self.rebuilt)}"]
        return f"{self.table}, row {self.row}, column {self.column}: {'; '.join(pairs)}"


def rewritten_cell(cell: str, specs: Sequence[str], values: Values) -> str:
    """``cell`` with each of its tokens replaced by the one its spec computes from ``values``.

    Raises:
        ValueError: The cell's tokens cannot be matched to its specs (the shape check names why), or a cell with
            more than one spec of variable length changed its tokens.
    """
    found = token_matches(cell)
    groups = [evaluate(spec, values) for spec in specs]
    variable = [index for index, spec in enumerate(specs) if is_variable(spec)]
    if len(variable) > 1 and [match.group() for match in found] != [token for group in groups for token in group]:
        # Which published tokens belong to which of them cannot be told apart.
        raise ValueError(f"{len(variable)} specs of variable length changed their tokens: edit {cell!r} by hand")
    if not variable and len(found) != sum(map(len, groups)):
        raise ValueError(f"{len(found)} tokens in {cell!r}, {sum(map(len, groups))} from the specs {list(specs)}")
    # Each spec's share of the published tokens: a variable spec takes what the others leave.
    spans: list[tuple[int, int]] = []
    start = 0
    for index, group in enumerate(groups):
        if index in variable[:1]:
            length = len(found) - sum(len(other) for other in groups[index + 1 :]) - start
            if length < 0:
                raise ValueError(f"{len(found)} tokens in {cell!r}: too few for the specs {list(specs)}")
        else:
            length = len(group)
        spans.append((start, start + length))
        start += length
    edits: list[tuple[int, int, str]] = []
    for spec, group, (first, last) in zip(specs, groups, spans, strict=True):
        old = [match.group() for match in found[first:last]]
        if old == group:
            continue
        if is_variable(spec) or len(old) != len(group):
            begin = found[first].start() if old else (found[first - 1].end() if first else 0)
            end = found[last - 1].end() if old else begin
            edits.append((begin, end, formatted(spec, values)))
        else:
            edits.extend(
                _token_edit(cell, match, new, speed_up=is_speed_up(spec))
                for match, new in zip(found[first:last], group, strict=True)
                if match.group() != new
            )
    for begin, end, text in sorted(edits, reverse=True):
        cell = cell[:begin] + text + cell[end:]
    return cell


def _token_edit(cell: str, match: re.Match[str], new: str, speed_up: bool) -> tuple[int, int, str]:
    """The edit that puts ``new`` where ``match`` is; a speed-up that turns into ``never`` (or back) drops (or gains)
    its "×", so that "never, 1.00×" becomes "1.00×, 1.00×" and not "1.00, 1.00×"."""
    begin, end = match.start(), match.end()
    if speed_up:
        has_sign = cell[end : end + 1] == "×"
        if new == "never" and has_sign:
            end += 1
        elif match.group() == "never" and new != "never" and not has_sign:
            new += "×"
    return begin, end, new


def _cell_bounds(line: str) -> list[tuple[int, int]]:
    """Where each cell of a table row lies in ``line`` (between its pipes)."""
    pipes = [index for index, char in enumerate(line) if char == "|"]
    return list(zip(pipes, pipes[1:], strict=False))


def rewrite_table(table: PublishedTable, text: str, values: Values) -> tuple[str, list[Change], list[str]]:
    """``text`` with ``table``'s checked cells rewritten from ``values``; the changes; the rows left as they were
    because the records lack some of their runs."""
    lines = text.splitlines(keepends=True)
    changes: list[Change] = []
    unrecorded: list[str] = []
    for row, index in table_lines(text, table.heading).items():
        columns = table.cells.get(row)
        if columns is None:
            continue
        if unrecorded_runs(table, row, values.records):
            unrecorded.append(row)
            continue
        line = lines[index]
        bounds = _cell_bounds(line)
        for column in sorted(columns, reverse=True):  # from the right: the earlier bounds stay valid
            begin, end = bounds[column]
            cell = line[begin + 1 : end]
            new = rewritten_cell(cell, columns[column], values)
            if new != cell:
                line = line[: begin + 1] + new + line[end:]
                changes.append(Change(table.name, row, column, tuple(tokens(cell)), tuple(tokens(new))))
        lines[index] = line
    return "".join(lines), sorted(changes, key=lambda change: (change.row, change.column)), unrecorded


def rewrite_set(record_set: str, records_dir: Path, root: Path, write: bool = True) -> list[Change]:
    """Every table of ``record_set`` under ``root`` rewritten from the records in ``records_dir``; the changes.
    Nothing is written unless every table rewrites."""
    results = list(recorded_results(records_dir).values())
    if not results:
        raise SystemExit(f"no records in {records_dir}: extract them first (--extract-records).")
    tables = [table for table in TABLES if table.record_set == record_set]
    published = {root / table.path: (root / table.path).read_text() for table in tables}
    texts = dict(published)
    changes: list[Change] = []
    for table in tables:
        path = root / table.path
        texts[path], found, unrecorded = rewrite_table(table, texts[path], Values(table.record_set_of(results)))
        if unrecorded:
            print(f"[rewrite] {table.name}: rows {', '.join(unrecorded)} left alone (their runs are not all recorded)")
        changes += found
    if write:
        for path, text in texts.items():
            if text != published[path]:
                path.write_text(text)
    return changes


def _level(line: str) -> int:
    """A markdown heading's level (``### x``: 3); 0 for any other line."""
    hashes = len(line) - len(line.lstrip("#"))
    return hashes if hashes and line[hashes : hashes + 1] == " " else 0


def _section(lines: Sequence[str], index: int) -> range:
    """The lines of the markdown section that holds line ``index``: from its heading to the next heading of the
    same or a higher level."""
    start = next((i for i in range(index, -1, -1) if _level(lines[i])), 0)
    level = _level(lines[start]) or 1
    end = next((i for i in range(start + 1, len(lines)) if 0 < _level(lines[i]) <= level), len(lines))
    return range(start, end)


def quoted_in_prose(changes: Sequence[Change], record_set: str, root: Path) -> list[str]:
    """Lines outside the checked rows that quote numbers a rewritten cell changed, for a person to check (prose is
    in no table): ``path:line: numbers``. Looked for in the sections that hold the set's tables, and anywhere else
    in their files where a line quotes two of them (an errata item, a summary). Only numbers of four characters or
    more with a decimal point count ("96.4", "3.29"): "0.1" or a round count matches too much to help."""
    changed = sorted(
        {
            old
            for change in changes
            if len(change.published) == len(change.rebuilt)
            for old, new in zip(change.published, change.rebuilt, strict=True)
            if old != new and "." in old and len(old) >= 4
        }
    )
    if not changed:
        return []
    pattern = re.compile(r"(?<![\d.])(" + "|".join(map(re.escape, changed)) + r")(?![\d])")
    found = []
    for path in sorted({table.path for table in TABLES if table.record_set == record_set}):
        text = (root / path).read_text()
        lines = text.splitlines()
        checked: set[int] = set()  # every checked row of every set: numbers there are the test's business
        sections: set[int] = set()
        for table in (table for table in TABLES if table.path == path):
            positions = table_lines(text, table.heading)
            checked |= {index for row, index in positions.items() if row in table.cells}
            if table.record_set == record_set:
                sections |= set(_section(lines, min(positions.values())))
        for index, line in enumerate(lines):
            numbers = sorted(set(pattern.findall(line)))
            if index not in checked and (len(numbers) > 1 or (numbers and index in sections)):
                found.append(f"{path}:{index + 1}: {', '.join(numbers)}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reproduce.rewrite", description=__doc__.split("\n")[0])
    sets = sorted({table.record_set for table in TABLES})
    parser.add_argument("record_set", choices=sets, help="the run set whose tables to rewrite")
    parser.add_argument("--records-dir", type=Path, help="its records (default benchmarks/reproduce/records/<set>)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose files to rewrite")
    parser.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    args = parser.parse_args(argv)
    records_dir = args.records_dir or set_dir(args.record_set)
    try:
        changes = rewrite_set(args.record_set, records_dir, args.root, write=not args.dry_run)
    except ValueError as error:  # a cell whose wording and specs disagree: the shape test names it too
        raise SystemExit(f"rewrite: {error}; make the cell and its specs in published_tables.py agree first.") from None
    for change in changes:
        print(f"- {change}")
    print(f"[rewrite] {len(changes)} cells {'would change' if args.dry_run else 'rewritten'}")
    quoted = quoted_in_prose(changes, args.record_set, args.root)
    if quoted:
        print("[rewrite] lines outside the checked rows that quote a changed number (check each by hand):")
        for line in quoted:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
