"""Verdict rules: numbers in, ``reproduced`` / ``partly`` / ``not`` out.

Each rule was written down, with its thresholds, before any small- or full-profile result existed (the thresholds
come from the papers' own figures, quoted beside each rule), and is never changed to make a claim pass. The rules
take plain numbers, so they are unit-tested on fabricated values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

REPRODUCED, PARTLY, NOT = "reproduced", "partly", "not reproduced"


@dataclass(frozen=True)
class Verdict:
    """A rule's outcome: the verdict and the measured figure it rests on, in words."""

    verdict: str
    ours: str


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def accuracy_falls_with_emd(
    points: Sequence[tuple[float, float]], min_total_drop: float = 0.05, max_rise: float = 0.01
) -> Verdict:
    """Zhao claim 1. ``points`` are (mean EMD, accuracy), one per split.

    reproduced: from one EMD level to the next the accuracy never rises by more than ``max_rise``, the largest EMD
    (the 1-class split) has the lowest accuracy, and it is at least ``min_total_drop`` below the smallest EMD's
    (the paper's smallest fall is 6.5 points, MNIST); partly: the largest EMD is the lowest, but the fall is smaller
    or not monotone; not: otherwise.
    """
    if len(points) < 2:
        raise ValueError(f"`points` needs at least two EMD levels, got {len(points)}.")
    ordered = sorted(points)
    accuracies = [accuracy for _, accuracy in ordered]
    drop = accuracies[0] - accuracies[-1]
    monotone = all(later - earlier <= max_rise for earlier, later in pairwise(accuracies))
    lowest_last = accuracies[-1] <= min(accuracies)
    ours = ", ".join(f"EMD {emd:.2f}: {pct(acc)}" for emd, acc in ordered) + f"; fall {pct(drop)}"
    if lowest_last and monotone and drop >= min_total_drop:
        return Verdict(REPRODUCED, ours)
    return Verdict(PARTLY if lowest_last and drop > 0 else NOT, ours)


def sharing_recovers(
    iid: float,
    no_sharing: float,
    shared: Mapping[float, float],
    large: float = 0.5,
    some: float = 0.2,
    min_gap: float = 0.02,
) -> Verdict:
    """Zhao claim 2. ``shared`` maps β to the accuracy with sharing and warm-up.

    The recovered fraction of the IID − non-IID gap is (acc_β − acc_0) / (acc_IID − acc_0) at the best β. reproduced:
    ≥ ``large`` (the paper recovers 30 of ~38 points on CIFAR-10 with β = 10 %); partly: ≥ ``some``; not: less, or
    a gap below ``min_gap`` (nothing to recover at this scale).
    """
    if not shared:
        raise ValueError("`shared` needs at least one beta.")
    gap = iid - no_sharing
    beta, accuracy = max(shared.items(), key=lambda item: item[1])
    recovered = (accuracy - no_sharing) / gap if gap > 0 else 0.0
    listing = ", ".join(f"β {b:g}: {pct(a)}" for b, a in sorted(shared.items()))
    ours = (
        f"IID {pct(iid)}, 1-class {pct(no_sharing)}, {listing}; β = {beta:g} recovers {100 * recovered:.0f} % of"
        " the gap"
    )
    if gap < min_gap:
        return Verdict(NOT, ours + f" (gap below {pct(min_gap)})")
    return Verdict(REPRODUCED if recovered >= large else PARTLY if recovered >= some else NOT, ours)


def fedamp_pathological(
    fedamp: Mapping[str, float],
    fedavg: float,
    separate: float,
    margin: float = 0.10,
    close: float = 0.02,
    weak_margin: float = 0.05,
) -> Verdict:
    """FedAMP claim 3 (BMTA). ``fedamp`` maps "FedAMP" and "HeurFedAMP" to their BMTA.

    reproduced: each is ≥ FedAvg + ``margin`` (the paper: +20 points on FMNIST) and ≥ Separate − ``close``;
    partly: at least one is ≥ FedAvg + ``weak_margin``; not: otherwise.
    """
    listing = ", ".join(f"{name} {pct(value)}" for name, value in fedamp.items())
    ours = f"{listing}; FedAvg {pct(fedavg)}; Separate {pct(separate)}"
    if all(value >= fedavg + margin and value >= separate - close for value in fedamp.values()):
        return Verdict(REPRODUCED, ours)
    return Verdict(PARTLY if any(value >= fedavg + weak_margin for value in fedamp.values()) else NOT, ours)


def fedamp_practical(fedamp: float, separate: float, fedavg: float) -> Verdict:
    """FedAMP claim 4 (BMTA): FedAMP ≥ Separate > FedAvg (FMNIST: 90.97 ≥ 86.73 > 79.50).

    reproduced: both orderings hold; partly: FedAMP > FedAvg but one ordering fails; not: FedAMP ≤ FedAvg.
    """
    ours = f"FedAMP {pct(fedamp)}, Separate {pct(separate)}, FedAvg {pct(fedavg)}"
    if fedamp >= separate > fedavg:
        return Verdict(REPRODUCED, ours)
    return Verdict(PARTLY if fedamp > fedavg else NOT, ours)


def _rounds(rounds: float | None) -> str:
    return "never reaches it" if rounds is None else f"{rounds:g} rounds"


def fewer_rounds(
    method: str, rounds: float | None, baseline_rounds: float | None, target: float, speedup_needed: float
) -> Verdict:
    """Claims 5 and 7: rounds to a target accuracy, against FedAvg's rounds to it.

    reproduced: FedAvg's rounds / the method's ≥ ``speedup_needed``; partly: the method gets there in fewer rounds;
    not: in as many or more, or never. When FedAvg never gets there (possible only with a target above its best)
    the method reaching it counts as a speed-up.
    """
    ours = f"to {pct(target)}: {method} {_rounds(rounds)}, FedAvg {_rounds(baseline_rounds)}"
    if rounds is None:
        return Verdict(NOT, ours)
    if baseline_rounds is None:
        return Verdict(REPRODUCED, ours)
    speedup = baseline_rounds / rounds
    ours += f" ({speedup:.2f}×)"
    return Verdict(REPRODUCED if speedup >= speedup_needed else PARTLY if speedup > 1 else NOT, ours)


def fewer_rounds_two_targets(
    method: str,
    mid: tuple[float | None, float | None, float],
    final: tuple[float | None, float | None, float],
    speedup_needed: float = 1.2,
) -> Verdict:
    """v2's claim 5 (PROTOCOL.md): rounds to FedAvg's accuracy at half its rounds (``mid``: the paper's 90 %
    column, 1.46×) and to its final accuracy (``final``: the paper's 95 % column, 1.07×). Each target is
    ``(method's rounds, FedAvg's rounds, target)``.

    reproduced: speed-up ≥ ``speedup_needed`` at the mid target and ≥ 1× at the final one; partly: > 1× at one of
    the two; not: otherwise (a method that never reaches a target has no speed-up there).
    """

    def speedup(rounds: float | None, baseline: float | None) -> float | None:
        if rounds is None:
            return None
        return math.inf if baseline is None else baseline / rounds

    parts, speedups = [], []
    for label, (rounds, baseline, target) in (("mid", mid), ("final", final)):
        value = speedup(rounds, baseline)
        speedups.append(value)
        shown = "" if value is None or math.isinf(value) else f" ({value:.2f}×)"
        parts.append(f"{label}: to {pct(target)}: {method} {_rounds(rounds)}, FedAvg {_rounds(baseline)}{shown}")
    at_mid, at_final = speedups
    ours = "; ".join(parts)
    if at_mid is not None and at_final is not None and at_mid >= speedup_needed and at_final >= 1:
        return Verdict(REPRODUCED, ours)
    return Verdict(PARTLY if any(s is not None and s > 1 for s in speedups) else NOT, ours)


def at_least_and_steadier(
    method: str, accuracy: float, baseline: float, oscillation: float, baseline_oscillation: float
) -> Verdict:
    """rFedAvg+ claim 6: accuracy ≥ FedAvg's and steadier across rounds (smaller round-to-round std).

    reproduced: both; partly: one of the two; not: neither.
    """
    ours = (
        f"{method} {pct(accuracy)} vs FedAvg {pct(baseline)}; round-to-round std {100 * oscillation:.2f} vs "
        f"{100 * baseline_oscillation:.2f} points"
    )
    holds = (accuracy >= baseline) + (oscillation <= baseline_oscillation)
    return Verdict(REPRODUCED if holds == 2 else PARTLY if holds == 1 else NOT, ours)


def beats_baselines(method: str, accuracy: float, baselines: Mapping[str, float]) -> Verdict:
    """Claim 8: the paper's method against the baselines its paper compares with, on the paper's metric.

    reproduced: ≥ every baseline; partly: ≥ at least one; not: below all.
    """
    if not baselines:
        raise ValueError("`baselines` needs at least one baseline.")
    listing = ", ".join(f"{name} {pct(value)}" for name, value in sorted(baselines.items(), key=lambda kv: -kv[1]))
    ours = f"{method} {pct(accuracy)}; {listing}"
    beaten = sum(accuracy >= value for value in baselines.values())
    return Verdict(REPRODUCED if beaten == len(baselines) else PARTLY if beaten else NOT, ours)


__all__ = [
    "NOT",
    "PARTLY",
    "REPRODUCED",
    "Verdict",
    "accuracy_falls_with_emd",
    "at_least_and_steadier",
    "beats_baselines",
    "fedamp_pathological",
    "fedamp_practical",
    "fewer_rounds",
    "fewer_rounds_two_targets",
    "sharing_recovers",
]
