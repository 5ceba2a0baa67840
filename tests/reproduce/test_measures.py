"""What the claims read from fabricated ``summary.json`` payloads."""

import statistics

import pytest

from benchmarks.reproduce import measures
from benchmarks.reproduce.measures import MissingMetricError


def _summary(values, key="global/test_acc", **extra):
    history = [{"round": float(r + 1), key: v} for r, v in enumerate(values)]
    return {"history": history, **extra}


def test_final_best_and_tail_mean():
    summary = _summary([0.1, 0.5, 0.4, 0.6, 0.55, 0.58, 0.57])
    assert measures.final(summary, "global/test_acc") == 0.57
    assert measures.best(summary, "global/test_acc") == 0.6
    assert measures.tail_mean(summary, "global/test_acc", last=3) == pytest.approx((0.55 + 0.58 + 0.57) / 3)


def test_rounds_without_the_metric_and_nan_are_skipped():
    summary = {
        "history": [
            {"round": 1.0},
            {"round": 2.0, "global/test_acc": float("nan")},
            {"round": 3.0, "global/test_acc": 0.3},
        ]
    }
    assert measures.series(summary, "global/test_acc") == [(3.0, 0.3)]


def test_rounds_to_reach_is_the_first_round_at_or_above_target():
    summary = _summary([0.2, 0.5, 0.45, 0.7])
    assert measures.rounds_to_reach(summary, "global/test_acc", 0.5) == 2.0
    assert measures.rounds_to_reach(summary, "global/test_acc", 0.6) == 4.0
    assert measures.rounds_to_reach(summary, "global/test_acc", 0.8) is None


def test_round_to_round_std_uses_the_second_half():
    values = [0.0, 0.9, 0.1, 0.5, 0.6, 0.4, 0.7]  # second half: 0.5, 0.6, 0.4, 0.7
    expected = statistics.pstdev([0.1, -0.2, 0.3])
    assert measures.round_to_round_std(_summary(values), "global/test_acc") == pytest.approx(expected)


def test_round_to_round_std_needs_two_changes():
    with pytest.raises(MissingMetricError, match="at least two rounds"):
        measures.round_to_round_std(_summary([0.5, 0.6]), "global/test_acc")


def test_missing_metric_is_named():
    with pytest.raises(MissingMetricError, match="client/test_acc_mean"):
        measures.final(_summary([0.5]), "client/test_acc_mean")


def test_bmta_prefers_the_personalised_models():
    history = [{"round": 1.0, "client/bmta": 0.4, "personal/bmta": 0.9}]
    assert measures.bmta({"history": history}) == 0.9
    assert measures.bmta({"history": [{"round": 1.0, "client/bmta": 0.4}]}) == 0.4
    with pytest.raises(MissingMetricError, match="client_eval"):
        measures.bmta(_summary([0.5]))


def test_client_accuracies_and_mean_emd():
    summary = {
        "final_client_metrics": {"0": {"test_loss": 1.0, "test_acc": 0.5}, "1": {"test_acc": 0.75}},
        "mean_emd": 1.2,
        "history": [],
    }
    assert sorted(measures.client_accuracies(summary)) == [0.5, 0.75]
    assert measures.mean_emd(summary) == 1.2
    shared = {**summary, "history": [{"round": 1.0, "sharing/emd_after": 0.9}]}
    assert measures.mean_emd(shared) == 0.9
    with pytest.raises(MissingMetricError):
        measures.client_accuracies({"final_client_metrics": {}})
