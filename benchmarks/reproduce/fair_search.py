"""v2's hyperparameter search (PROTOCOL.md): learning-rate cells, the same K settings per cell for every method of a
comparison, and the edge-extension rule.

A comparison has a ladder of learning-rate *cells* on the 1–3 series (…, 0.01, 0.03, 0.1, 0.3, …; factors of about
√10). In each cell a method with hyperparameters of its own runs its K own settings at the cell's rate, and a method
without (FedAvg, Separate, SCAFFOLD) runs K rates spread geometrically over the cell, centred on it. After a round of
the search, when any method's best setting lies in the first or the last cell, that side of the ladder grows by one
cell for every method of the comparison, until every choice is interior or a bound (an lr bound, or
:attr:`Comparison.max_extensions` per side) stops it; such a choice is reported as bounded.

Claim 5 searches FedCurv's λ instead, by the paper's criterion (:func:`fedcurv_lambda_grid`,
:func:`fewest_rounds_choice`), at the paper's fixed η = 0.01.

Everything here is pure: it turns scores into the next settings to run and into each choice's status, so that the
rule is unit-tested on fabricated score tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Setting = Mapping[str, Any]

#: The ratio of one cell to the next, on average (the 1–3 series alternates ×3 and ×3.33).
CELL_RATIO = math.sqrt(10)
INTERIOR, EDGE, BOUNDED = "interior", "edge", "bounded"


def _round3(value: float) -> float:
    return float(f"{value:.3g}")


def next_cell(lr: float, direction: int) -> float:
    """The neighbouring rate of ``lr`` on the 1–3 series (``direction`` +1 up, −1 down)."""
    exponent = math.floor(math.log10(lr) + 1e-9)
    mantissa = lr / 10**exponent
    if direction > 0:
        return _round3(3 * 10**exponent if mantissa < 2 else 10 ** (exponent + 1))
    return _round3(10 ** (exponent - 1) * 3 if mantissa < 2 else 10**exponent)


@dataclass(frozen=True)
class Comparison:
    """The methods of one comparison and their common search.

    Args:
        name: For the report.
        cells: The initial learning-rate cells, ascending, on the 1–3 series.
        k: Settings per cell for every method.
        methods: Run name -> its K own settings (without ``lr``), or ``None`` for a method that has none.
        lr_bounds: The lowest and highest rate a cell may have.
        max_extensions: How many cells each side may grow by.
    """

    name: str
    cells: tuple[float, ...]
    k: int
    methods: Mapping[str, tuple[Setting, ...] | None]
    lr_bounds: tuple[float, float] = (1e-3, 1.0)
    max_extensions: int = 2

    def __post_init__(self) -> None:
        for run, own in self.methods.items():
            if own is not None and len(own) != self.k:
                raise ValueError(f"{run}: {len(own)} own settings, but the comparison gives every method {self.k}")


@dataclass(frozen=True)
class Ladder:
    """Which cells are searched: ``low`` cells added below the initial ones, ``high`` above."""

    low: int = 0
    high: int = 0


def ladder_cells(comparison: Comparison, ladder: Ladder) -> dict[int, float]:
    """Cell index (0 for the first initial cell, negative below it) -> its rate, ascending."""
    cells = dict(enumerate(comparison.cells))
    lr = comparison.cells[0]
    for index in range(-1, -ladder.low - 1, -1):
        lr = next_cell(lr, -1)
        cells[index] = lr
    lr = comparison.cells[-1]
    for index in range(len(comparison.cells), len(comparison.cells) + ladder.high):
        lr = next_cell(lr, +1)
        cells[index] = lr
    return dict(sorted(cells.items()))


def cell_settings(comparison: Comparison, run: str, lr: float) -> tuple[Setting, ...]:
    """The K settings ``run`` gets in the cell of rate ``lr``."""
    own = comparison.methods[run]
    if own is None:
        k = comparison.k
        return tuple({"lr": _round3(lr * CELL_RATIO ** ((j - (k - 1) / 2) / k))} for j in range(k))
    return tuple({**setting, "lr": lr} for setting in own)


def setting_suffix(cell_index: int, j: int) -> str:
    """The tuning-run suffix of the ``j``-th setting in cell ``cell_index``: ``c<cell>k<j>`` (``cm<n>`` below the
    initial cells), stable when the ladder grows."""
    return f"{f'c{cell_index}' if cell_index >= 0 else f'cm{-cell_index}'}k{j}"


def search_settings(comparison: Comparison, run: str, ladder: Ladder) -> dict[str, Setting]:
    """Tuning-run suffix (``c<cell>k<j>``, stable when the ladder grows) -> setting, for every cell of the ladder."""
    return {
        setting_suffix(index, j): setting
        for index, lr in ladder_cells(comparison, ladder).items()
        for j, setting in enumerate(cell_settings(comparison, run, lr))
    }


def cell_of(suffix: str) -> int:
    """The cell index of a tuning-run suffix of :func:`search_settings`."""
    tag = suffix.split("k", 1)[0]
    return -int(tag[2:]) if tag.startswith("cm") else int(tag[1:])


def best_suffix(scores: Mapping[str, float | None]) -> str | None:
    """The suffix of the highest score (``None`` scores are failed runs); ties go to the first in cell order."""
    scored = [(score, -cell_of(suffix), suffix) for suffix, score in scores.items() if score is not None]
    if not scored:
        return None
    best = max(scored, key=lambda item: (item[0], item[1], -setting_index(item[2])))
    return best[2]


def setting_index(suffix: str) -> int:
    """The setting's position ``j`` within its cell, from a suffix of :func:`setting_suffix`."""
    return int(suffix.split("k", 1)[1])


@dataclass(frozen=True)
class Assessment:
    """One round of the rule: each method's status (``interior``, ``edge: low|high`` or ``bounded: …``) and the
    ladder to search next (``None`` when the search is finished)."""

    status: dict[str, str]
    next_ladder: Ladder | None


def assess(comparison: Comparison, ladder: Ladder, scores: Mapping[str, Mapping[str, float | None]]) -> Assessment:
    """The edge-extension rule on ``scores`` (run -> suffix -> validation score) over ``ladder``.

    A method whose best setting is in the lowest (highest) cell is on the low (high) edge; if any method is, that
    side grows by one cell for every method, unless the next cell passes ``lr_bounds`` or the side has grown
    ``max_extensions`` times already: then the methods on that edge are bounded.
    """
    cells = ladder_cells(comparison, ladder)
    lowest, highest = min(cells), max(cells)
    low_lr, high_lr = cells[lowest], cells[highest]
    can_low = ladder.low < comparison.max_extensions and next_cell(low_lr, -1) >= comparison.lr_bounds[0] * 0.999
    can_high = ladder.high < comparison.max_extensions and next_cell(high_lr, +1) <= comparison.lr_bounds[1] * 1.001
    status: dict[str, str] = {}
    grow_low = grow_high = False
    for run in comparison.methods:
        best = best_suffix(scores.get(run, {}))
        if best is None:
            status[run] = "no successful run"
            continue
        cell = cell_of(best)
        if cell == lowest:
            grow_low |= can_low
            status[run] = f"{EDGE}: low" if can_low else f"{BOUNDED}: low (lr {low_lr:g})"
        elif cell == highest:
            grow_high |= can_high
            status[run] = f"{EDGE}: high" if can_high else f"{BOUNDED}: high (lr {high_lr:g})"
        else:
            # An optimum is interior only if both neighbouring cells were scored: a neighbour whose runs all failed
            # (or never ran) could hold a better setting, so the report says so instead of claiming interior.
            run_scores = scores.get(run, {})
            unscored = [
                cells[c]
                for c in (cell - 1, cell + 1)
                if not any(score is not None for suffix, score in run_scores.items() if cell_of(suffix) == c)
            ]
            status[run] = f"{EDGE}: no score at lr {unscored[0]:g}" if unscored else INTERIOR
    if not (grow_low or grow_high):
        return Assessment(status, None)
    return Assessment(status, Ladder(ladder.low + grow_low, ladder.high + grow_high))


def run_search(comparison: Comparison, score_of: Any, ladder: Ladder | None = None) -> tuple[Ladder, Assessment]:
    """The whole rule against ``score_of(run, suffix, setting) -> float | None`` (a fake table in tests, finished
    runs in :mod:`benchmarks.reproduce.command`): grows the ladder until every choice is interior or bounded, or a
    score is unknown (``score_of`` raising :class:`KeyError`: the runs of the next ladder have not run yet)."""
    ladder = ladder or Ladder()
    while True:
        scores = {
            run: {
                suffix: score_of(run, suffix, setting)
                for suffix, setting in search_settings(comparison, run, ladder).items()
            }
            for run in comparison.methods
        }
        outcome = assess(comparison, ladder, scores)
        if outcome.next_ladder is None:
            return ladder, outcome
        try:
            for run in comparison.methods:
                for suffix, setting in search_settings(comparison, run, outcome.next_ladder).items():
                    score_of(run, suffix, setting)
        except KeyError:
            return outcome.next_ladder, outcome
        ladder = outcome.next_ladder


def own_grid_edges(comparison: Comparison, run: str, suffix: str) -> list[str]:
    """Where the setting ``suffix`` of ``run`` sits at an end of the method's own grid, e.g.
    ``["FedGG.mu=1 (highest)"]``; empty for an interior setting and for a method without own settings.

    PROTOCOL.md does not extend own grids (the budgets stay equal) but has the report mark such a choice. Keys that
    move in lockstep over the grid (FedAMP's α_k and λ follow σ) are named once, by the first of them.
    """
    own = comparison.methods[run]
    if own is None:
        return []
    chosen = own[setting_index(suffix)]
    edges: list[str] = []
    orders_seen: list[tuple[int, ...]] = []
    for key in chosen:
        values = [setting[key] for setting in own]
        distinct = sorted(set(values))
        if len(distinct) < 2:
            continue
        order = tuple(distinct.index(value) for value in values)
        if order in orders_seen:
            continue
        orders_seen.append(order)
        if chosen[key] == distinct[0]:
            edges.append(f"{key}={chosen[key]:g} (lowest)")
        elif chosen[key] == distinct[-1]:
            edges.append(f"{key}={chosen[key]:g} (highest)")
    return edges


# Claim 5: FedCurv's λ at η = 0.01, by the paper's criterion.

#: Stage ×10 (PROTOCOL.md), and the bounds an edge extension may reach.
FEDCURV_LAMBDAS = (0.001, 0.01, 0.1, 1.0, 10.0)
FEDCURV_LAMBDA_BOUNDS = (1e-5, 100.0)


def fedcurv_lambda_grid(
    stage10: Mapping[float, tuple[float | None, float]] | None = None,
) -> tuple[tuple[float, ...], str]:
    """The λ values to run next, and the stage.

    ``stage10`` maps each λ run so far to (rounds to the validation target or ``None``, last-5 validation accuracy).
    Without it: stage ×10's grid. If the ×10 best is at an end, one more ×10 step on that side (within the bounds);
    then stage ×2: best/2 and 2·best. Returns ``((), "done")`` when every needed λ has run.
    """
    if not stage10:
        return FEDCURV_LAMBDAS, "x10"
    tens = sorted(lam for lam in stage10 if _is_decade(lam))
    best = fewest_rounds_choice({lam: stage10[lam] for lam in tens})
    if best is None:
        return (), "done"
    if best == tens[0] and best / 10 >= FEDCURV_LAMBDA_BOUNDS[0] * 0.999:
        return (_round3(best / 10),), "x10"
    if best == tens[-1] and best * 10 <= FEDCURV_LAMBDA_BOUNDS[1] * 1.001:
        return (_round3(best * 10),), "x10"
    halves = tuple(lam for lam in (_round3(best / 2), _round3(best * 2)) if lam not in stage10)
    return (halves, "x2") if halves else ((), "done")


def _is_decade(lam: float) -> bool:
    return abs(math.log10(lam) - round(math.log10(lam))) < 1e-6


def fewest_rounds_choice(results: Mapping[float, tuple[float | None, float]]) -> float | None:
    """The λ with the fewest rounds to the target (ties: the higher last-5 accuracy, then the smaller λ); a λ that
    never reaches the target is not chosen."""
    reached = [(rounds, -accuracy, lam) for lam, (rounds, accuracy) in results.items() if rounds is not None]
    return min(reached)[2] if reached else None


__all__ = [
    "BOUNDED",
    "CELL_RATIO",
    "EDGE",
    "FEDCURV_LAMBDAS",
    "FEDCURV_LAMBDA_BOUNDS",
    "INTERIOR",
    "Assessment",
    "Comparison",
    "Ladder",
    "assess",
    "best_suffix",
    "cell_of",
    "cell_settings",
    "fedcurv_lambda_grid",
    "fewest_rounds_choice",
    "ladder_cells",
    "next_cell",
    "own_grid_edges",
    "run_search",
    "search_settings",
    "setting_index",
    "setting_suffix",
]
