"""Several seeds per run: the mean run a verdict is judged on, and the spread the report shows beside it.

A claim's rule reads one summary per run. With several seeds, :func:`mean_summary` averages the seeds' summaries
round by round (every metric logged by every seed at that round) so that the rule is applied once, to the means,
and :func:`per_seed_summaries` gives the same rule each seed's own runs, for the per-seed values beside it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.reproduce.measures import MissingMetricError, Summary

#: Seed -> run name -> summary, as the report holds them.
SeededSummaries = Mapping[str, Mapping[int, Summary]]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(float(value)) else None


def _mean_entry(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The keys every entry logged, numbers averaged; other values taken from the first entry."""
    shared = set(entries[0]).intersection(*entries[1:])
    mean: dict[str, Any] = {}
    for key in entries[0]:
        if key not in shared:
            continue
        numbers = [_number(entry[key]) for entry in entries]
        if all(number is not None for number in numbers):
            mean[key] = statistics.fmean(n for n in numbers if n is not None)
        else:
            mean[key] = entries[0][key]
    return mean


def mean_summary(summaries: Sequence[Summary]) -> Summary:
    """One summary whose history is the round-by-round mean of ``summaries`` (over the rounds they all logged).

    ``mean_emd`` is averaged; ``final_client_metrics`` pools every seed's clients (keys ``s<i>/<client>``), so that
    a distribution plot shows all of them; other keys come from the first summary.
    """
    if not summaries:
        raise ValueError("no summary to average")
    if len(summaries) == 1:
        return dict(summaries[0])
    mean = dict(summaries[0])
    rounds = min(len(summary.get("history", [])) for summary in summaries)
    mean["history"] = [_mean_entry([summary["history"][i] for summary in summaries]) for i in range(rounds)]
    emds = [_number(summary.get("mean_emd")) for summary in summaries]
    if all(emd is not None for emd in emds):
        mean["mean_emd"] = statistics.fmean(e for e in emds if e is not None)
    mean["final_client_metrics"] = {
        f"s{index}/{client}": metrics
        for index, summary in enumerate(summaries)
        for client, metrics in summary.get("final_client_metrics", {}).items()
    }
    mean["seeds"] = len(summaries)
    return mean


def mean_summaries(seeded: SeededSummaries) -> dict[str, Summary]:
    """Run name -> the mean summary over the seeds that succeeded."""
    return {name: mean_summary([by_seed[seed] for seed in sorted(by_seed)]) for name, by_seed in seeded.items()}


def per_seed_summaries(seeded: SeededSummaries) -> dict[int, dict[str, Summary]]:
    """Seed -> run name -> summary: each seed's runs on their own."""
    result: dict[int, dict[str, Summary]] = defaultdict(dict)
    for name, by_seed in seeded.items():
        for seed, summary in by_seed.items():
            result[seed][name] = summary
    return dict(sorted(result.items()))


def spread(by_seed: Mapping[int, Summary], measure: Callable[[Summary], float]) -> tuple[float, float, list[float]]:
    """``(mean, population std, per-seed values)`` of ``measure`` over the seeds (std 0 for one seed).

    Raises:
        MissingMetricError: If no seed logged what ``measure`` reads.
    """
    values = []
    for seed in sorted(by_seed):
        try:
            values.append(measure(by_seed[seed]))
        except MissingMetricError:
            continue
    if not values:
        raise MissingMetricError("no seed logged the metric")
    return statistics.fmean(values), statistics.pstdev(values), values


__all__ = ["SeededSummaries", "mean_summaries", "mean_summary", "per_seed_summaries", "spread"]
