"""What a claim measures in one run's ``summary.json``: final, best and tail-mean accuracy, rounds to a target,
round-to-round stability and the clients' accuracies.

Every function takes the parsed summary (see :mod:`lightning_fed.run.reporting`) and raises :class:`MissingMetricError`
naming the key when the run never logged it, so that a claim reports what is missing instead of a wrong number.
"""

from __future__ import annotations

import math
import statistics
from itertools import pairwise
from typing import Any

Summary = dict[str, Any]

#: The per-client accuracy a personalised method reports (its own models), else the global model's.
PERSONAL_BMTA, GLOBAL_BMTA = "personal/bmta", "client/bmta"


class MissingMetricError(KeyError):
    """The run's summary holds no value of the metric a claim needs."""

    def __str__(self) -> str:
        return str(self.args[0])


def series(summary: Summary, key: str) -> list[tuple[float, float]]:
    """``(round, value)`` for every round that logged a finite ``key``, in round order."""
    points = []
    for index, entry in enumerate(summary.get("history", [])):
        value = entry.get(key)
        if value is not None and math.isfinite(float(value)):
            points.append((float(entry.get("round", index + 1)), float(value)))
    if not points:
        raise MissingMetricError(f"the run logged no {key!r}")
    return points


def final(summary: Summary, key: str) -> float:
    """The last logged value of ``key``."""
    return series(summary, key)[-1][1]


def best(summary: Summary, key: str) -> float:
    """The largest logged value of ``key`` (the papers' "highest test accuracy")."""
    return max(value for _, value in series(summary, key))


def tail_mean(summary: Summary, key: str, last: int = 5) -> float:
    """The mean of the last ``last`` logged values: a final accuracy that one noisy round cannot flip."""
    values = [value for _, value in series(summary, key)][-last:]
    return statistics.fmean(values)


def at_fraction(summary: Summary, key: str, fraction: float = 0.5) -> float:
    """The value of ``key`` at ``fraction`` of the run: the last logged round at or before ``fraction`` × the last
    logged round (the first logged value when none is). Claim 5's mid-curve target (PROTOCOL.md)."""
    points = series(summary, key)
    cutoff = fraction * points[-1][0]
    before = [value for round_, value in points if round_ <= cutoff]
    return before[-1] if before else points[0][1]


def late_gain(summary: Summary, key: str, fraction: float = 0.25, last: int = 5) -> float:
    """How much ``key`` still rose over the last ``fraction`` of the run: the mean of its last ``last`` values minus
    the mean of the ``last`` values ending at the start of that stretch (a plateau check)."""
    values = [value for _, value in series(summary, key)]
    start = max(1, int(round(len(values) * (1 - fraction))))
    earlier = values[max(0, start - last) : start]
    return statistics.fmean(values[-last:]) - statistics.fmean(earlier)


def rounds_to_reach(summary: Summary, key: str, target: float) -> float | None:
    """The first round whose ``key`` is at least ``target``; ``None`` when no round reaches it."""
    return next((round_ for round_, value in series(summary, key) if value >= target), None)


def round_to_round_std(summary: Summary, key: str, from_fraction: float = 0.5) -> float:
    """Population std of the change of ``key`` between consecutive logged rounds, over the last part of the run
    (from ``from_fraction`` of the rounds on), the "oscillation" the rFedAvg paper compares."""
    values = [value for _, value in series(summary, key)]
    tail = values[int(len(values) * from_fraction) :]
    changes = [later - earlier for earlier, later in pairwise(tail)]
    if not changes:
        raise MissingMetricError(f"{key!r} needs at least two rounds in the second half of the run")
    return statistics.pstdev(changes)


def bmta(summary: Summary) -> float:
    """FedAMP's best mean test accuracy: of the personalised models when the run has them, else of the global
    model on every client's own test split."""
    for key in (PERSONAL_BMTA, GLOBAL_BMTA):
        try:
            return final(summary, key)
        except MissingMetricError:
            continue
    raise MissingMetricError(f"the run logged neither {PERSONAL_BMTA!r} nor {GLOBAL_BMTA!r} (is client_eval on?)")


def mean_client_accuracy_key(summary: Summary) -> str:
    """The per-round mean client accuracy matching :func:`bmta`'s choice."""
    for key in ("personal/test_acc_mean", "client/test_acc_mean"):
        if any(key in entry for entry in summary.get("history", [])):
            return key
    raise MissingMetricError("the run logged no per-client accuracy (personal/test_acc_mean or client/test_acc_mean)")


def client_accuracies(summary: Summary) -> list[float]:
    """Each client's accuracy in the last per-client evaluation (personalised models when the run has them)."""
    values = []
    for metrics in summary.get("final_client_metrics", {}).values():
        key = next((k for k in metrics if "acc" in k.lower()), None)
        if key is not None and math.isfinite(float(metrics[key])):
            values.append(float(metrics[key]))
    if not values:
        raise MissingMetricError("the run's final_client_metrics hold no accuracy")
    return values


def mean_emd(summary: Summary) -> float:
    """The partition's mean EMD (after data sharing when the run shared data)."""
    for entry in summary.get("history", [])[:1]:
        if entry.get("sharing/emd_after") is not None:
            return float(entry["sharing/emd_after"])
    if summary.get("mean_emd") is None:
        raise MissingMetricError("the summary holds no 'mean_emd'")
    return float(summary["mean_emd"])


__all__ = [
    "MissingMetricError",
    "at_fraction",
    "late_gain",
    "best",
    "bmta",
    "client_accuracies",
    "final",
    "mean_client_accuracy_key",
    "mean_emd",
    "round_to_round_std",
    "rounds_to_reach",
    "series",
    "tail_mean",
]
