"""The verdict rules on fabricated numbers: each branch (reproduced / partly / not) and its threshold."""

import pytest

from benchmarks.reproduce.rules import (
    NOT,
    PARTLY,
    REPRODUCED,
    accuracy_falls_with_emd,
    at_least_and_steadier,
    beats_baselines,
    fedamp_pathological,
    fedamp_practical,
    fewer_rounds,
    sharing_recovers,
)


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([(0.0, 0.84), (0.72, 0.83), (1.44, 0.79), (1.8, 0.49)], REPRODUCED),
        # A rise within 1 point between neighbours is noise, not a violation.
        ([(0.0, 0.84), (0.72, 0.845), (1.8, 0.49)], REPRODUCED),
        # Points arrive in any order; the rule sorts them by EMD.
        ([(1.8, 0.49), (0.0, 0.84), (1.44, 0.79)], REPRODUCED),
        # The 1-class split is lowest but an intermediate level rises by 3 points: not monotone.
        ([(0.0, 0.80), (0.72, 0.83), (1.8, 0.49)], PARTLY),
        # Lowest at EMD 1.8 but only 2 points below IID (the paper's smallest fall is 6.5).
        ([(0.0, 0.84), (1.8, 0.82)], PARTLY),
        ([(0.0, 0.84), (1.44, 0.70), (1.8, 0.75)], NOT),
        ([(0.0, 0.50), (1.8, 0.60)], NOT),
    ],
)
def test_accuracy_falls_with_emd(points, expected):
    assert accuracy_falls_with_emd(points).verdict == expected


def test_accuracy_falls_with_emd_needs_two_levels():
    with pytest.raises(ValueError, match="`points`"):
        accuracy_falls_with_emd([(0.0, 0.8)])


@pytest.mark.parametrize(
    ("shared", "expected"),
    [
        ({0.05: 0.76, 0.1: 0.81}, REPRODUCED),  # best β recovers (0.81 - 0.40) / 0.44 = 93 %
        ({0.05: 0.62}, REPRODUCED),  # exactly 50 %
        ({0.05: 0.50}, PARTLY),  # 23 %
        ({0.05: 0.45}, NOT),  # 11 %
        ({0.05: 0.30}, NOT),  # sharing made it worse
    ],
)
def test_sharing_recovers(shared, expected):
    verdict = sharing_recovers(iid=0.84, no_sharing=0.40, shared=shared)
    assert verdict.verdict == expected
    assert "β" in verdict.ours


def test_sharing_with_no_gap_is_not_reproduced():
    verdict = sharing_recovers(iid=0.80, no_sharing=0.79, shared={0.1: 0.80})
    assert verdict.verdict == NOT and "gap below" in verdict.ours


@pytest.mark.parametrize(
    ("fedamp", "fedavg", "separate", "expected"),
    [
        ({"FedAMP": 0.98, "HeurFedAMP": 0.98}, 0.78, 0.977, REPRODUCED),  # the paper's FMNIST numbers
        ({"FedAMP": 0.98, "HeurFedAMP": 0.85}, 0.78, 0.977, PARTLY),  # HeurFedAMP only 7 points above FedAvg
        ({"FedAMP": 0.93, "HeurFedAMP": 0.93}, 0.78, 0.98, PARTLY),  # far above FedAvg, 5 points below Separate
        ({"FedAMP": 0.80, "HeurFedAMP": 0.81}, 0.78, 0.98, NOT),
    ],
)
def test_fedamp_pathological(fedamp, fedavg, separate, expected):
    assert fedamp_pathological(fedamp, fedavg, separate).verdict == expected


@pytest.mark.parametrize(
    ("fedamp", "separate", "fedavg", "expected"),
    [
        (0.91, 0.867, 0.795, REPRODUCED),
        (0.86, 0.867, 0.795, PARTLY),  # below Separate
        (0.91, 0.78, 0.795, PARTLY),  # Separate below FedAvg
        (0.79, 0.867, 0.795, NOT),
    ],
)
def test_fedamp_practical(fedamp, separate, fedavg, expected):
    assert fedamp_practical(fedamp, separate, fedavg).verdict == expected


@pytest.mark.parametrize(
    ("rounds", "baseline_rounds", "expected"),
    [
        (35, 51, REPRODUCED),  # FedCurv's Table 1, 1.46x
        (45, 51, PARTLY),  # 1.13x
        (51, 51, NOT),
        (60, 51, NOT),
        (None, 51, NOT),  # never reaches the target
        (20, None, REPRODUCED),  # FedAvg never reaches it, the method does
    ],
)
def test_fewer_rounds(rounds, baseline_rounds, expected):
    verdict = fewer_rounds("FedCurv", rounds, baseline_rounds, 0.9, speedup_needed=1.2)
    assert verdict.verdict == expected
    assert ("FedCurv never reaches it" in verdict.ours) == (rounds is None)


@pytest.mark.parametrize(
    ("accuracy", "oscillation", "expected"),
    [(0.98, 0.01, REPRODUCED), (0.98, 0.03, PARTLY), (0.96, 0.01, PARTLY), (0.96, 0.03, NOT)],
)
def test_at_least_and_steadier(accuracy, oscillation, expected):
    verdict = at_least_and_steadier("rFedAvg+", accuracy, 0.97, oscillation, baseline_oscillation=0.02)
    assert verdict.verdict == expected


@pytest.mark.parametrize(
    ("accuracy", "expected"), [(0.64, REPRODUCED), (0.616, REPRODUCED), (0.61, PARTLY), (0.60, NOT)]
)
def test_beats_baselines(accuracy, expected):
    baselines = {"FedAvg": 0.616, "SCAFFOLD": 0.612, "FedProx": 0.605}
    assert beats_baselines("FedGG", accuracy, baselines).verdict == expected


def test_beats_baselines_needs_a_baseline():
    with pytest.raises(ValueError, match="`baselines`"):
        beats_baselines("FedGG", 0.6, {})
