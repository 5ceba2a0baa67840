"""PROTOCOL.md's budget cuts for v2's full profile (``lightning-fed reproduce --protocol v2 --profile full --cut N``).

PROTOCOL.md fixed, before any v2 run, what the full profile gives up when it does not fit its target (about 2.5 h
on 2 workers) and in which order. ``--cut N`` applies the first N of these cuts; the report's header names each
cut applied, and a claim a cut removes is listed there with v1's full-profile verdict, which then stands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks.reproduce.claims import Claim
from benchmarks.reproduce.experiments import PAPER_LR_SUFFIX, Experiment


@dataclass(frozen=True)
class BudgetCut:
    """One of PROTOCOL.md's cuts.

    Args:
        what: The cut, in PROTOCOL.md's words.
        drops: Whether a (seeded) run is cut.
        claims: Keys of the claims the cut leaves without runs, which the report then does not judge.
    """

    what: str
    drops: Callable[[Experiment], bool]
    claims: tuple[str, ...] = ()


_PATHOLOGICAL_EXTRAS = {f"pathological_{method}" for method in ("apfl", "fedavg_ft", "fedprox_ft")}

#: PROTOCOL.md, "Budget", full profile: the cuts in the order they are made.
FULL_PROFILE_CUTS: tuple[BudgetCut, ...] = (
    BudgetCut(
        "claims 1 and 2 (Zhao et al.): v1's full result (one seed, 500 rounds) stands",
        lambda run: run.family.startswith("zhao"),
        ("zhao_emd", "zhao_sharing"),
    ),
    BudgetCut(
        "the pathological APFL, FedAvg-FT and FedProx-FT runs, which no claim reads",
        lambda run: run.name in _PATHOLOGICAL_EXTRAS,
    ),
    BudgetCut(
        "the practical HeurFedAMP run, which only a curve reads, to one seed",
        lambda run: run.name == "practical_heurfedamp" and (run.seed or 0) != 0,
    ),
    BudgetCut(
        "the paper-lr runs of claims 7 and 8a (lr 0.01) to the small profile only",
        lambda run: run.name.endswith(PAPER_LR_SUFFIX),
        ("fedgg_rounds" + PAPER_LR_SUFFIX, "baselines_fedgg" + PAPER_LR_SUFFIX),
    ),
)


@dataclass(frozen=True)
class Budget:
    """What is left after the cuts, and what the report says about them."""

    claims: tuple[Claim, ...]
    experiments: list[Experiment]
    lines: list[str]
    """One per cut applied: what was cut and how many runs that removed; a cut claim with v1's verdict."""


def _stands(claim: Claim, v1_verdicts: dict[str, str]) -> str:
    """A cut claim, with v1's verdict where v1 judged it."""
    v1 = None if claim.compared_to is None else v1_verdicts.get(claim.compared_to)
    return claim.number if v1 is None else f"{claim.number} (v1: {v1})"


def apply_cuts(
    count: int,
    claims: Sequence[Claim],
    experiments: Sequence[Experiment],
    v1_verdicts: dict[str, str] | None = None,
) -> Budget:
    """The first ``count`` of :data:`FULL_PROFILE_CUTS` applied to ``claims`` and the seeded ``experiments``.

    ``v1_verdicts`` (claim number -> v1 verdict of the same profile) gives the verdict that stands for a claim a cut
    removes.
    """
    if not 0 <= count <= len(FULL_PROFILE_CUTS):
        raise ValueError(f"`--cut` must be between 0 and {len(FULL_PROFILE_CUTS)} (PROTOCOL.md's cuts), got {count}.")
    kept_claims, kept_runs, lines = list(claims), list(experiments), []
    for number, cut in enumerate(FULL_PROFILE_CUTS[:count], start=1):
        cut_runs = [cut.drops(run) for run in kept_runs]
        dropped = sum(cut_runs)
        kept_runs = [run for run, dropping in zip(kept_runs, cut_runs, strict=True) if not dropping]
        gone = [claim for claim in kept_claims if claim.key in cut.claims]
        kept_claims = [claim for claim in kept_claims if claim.key not in cut.claims]
        line = f"cut {number}: {cut.what} ({dropped} runs; claims not judged here: "
        line += ", ".join(_stands(claim, v1_verdicts or {}) for claim in gone) if gone else "none"
        lines.append(line + ")")
    return Budget(tuple(kept_claims), kept_runs, lines)


__all__ = ["FULL_PROFILE_CUTS", "Budget", "BudgetCut", "apply_cuts"]
