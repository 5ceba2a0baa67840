"""The load recorder and reliability rule every benchmark prints under its tables (``benchmarks/load.py``)."""

from __future__ import annotations

import os

import pytest

from benchmarks.load import (
    OTHERS_TOLERANCE_CORES,
    UNRELIABLE_MARK,
    UNRELIABLE_NOTE,
    LoadRecord,
    LoadRecorder,
    describe,
    footnote,
    is_reliable,
    mark,
    read_load,
    wait_for_quiet,
)


class TestIsReliable:
    def test_below_the_core_count_is_reliable(self) -> None:
        assert is_reliable([0.9, 1.1], cpus=2, cores_used=1)

    def test_exactly_at_the_core_count_is_still_reliable(self) -> None:
        assert is_reliable([2.0, 2.0], cpus=2, cores_used=1)

    def test_just_above_the_core_count_is_not(self) -> None:
        assert not is_reliable([2.0, 2.01], cpus=2, cores_used=1)
        assert not is_reliable([2.01, 0.5], cpus=2, cores_used=1)

    def test_a_multi_process_run_counts_its_own_cores_in_the_load(self) -> None:
        # 2 processes on 4 cores at load 4: the others use about 4 - 2 = 2, the cores the run leaves free.
        assert is_reliable([3.0, 4.0], cpus=4, cores_used=2)
        assert not is_reliable([3.0, 4.5], cpus=4, cores_used=2)

    def test_a_run_needing_more_cores_than_the_machine_has_is_never_reliable(self) -> None:
        assert not is_reliable([0.0, 0.0], cpus=1, cores_used=2)
        assert is_reliable([0.0, 0.0], cpus=2, cores_used=2)

    def test_unknown_cpu_count_or_load_is_unreliable(self) -> None:
        assert not is_reliable([0.1, 0.1], cpus=None)
        assert not is_reliable([None, 0.1], cpus=2)
        assert not is_reliable([float("nan"), 0.1], cpus=2)
        assert not is_reliable([], cpus=2)

    def test_more_than_two_samples_are_judged_by_the_highest(self) -> None:
        assert not is_reliable([0.5, 0.6, 2.5, 0.4], cpus=2)

    def test_measured_others_judge_instead_of_the_load(self) -> None:
        # 2 Flower workers and their driver on 2 cores reach load 2.3 alone: the others' 0.02 cores say it was quiet.
        assert is_reliable([2.3, 2.3], cpus=2, cores_used=2, others_cores=0.02)
        # A quiet load average does not hide a job measured beside the run.
        assert not is_reliable([0.5, 0.5], cpus=2, cores_used=2, others_cores=0.5)

    def test_the_others_may_fill_the_cores_the_run_leaves_free_and_a_tolerance(self) -> None:
        assert is_reliable([], cpus=2, cores_used=1, others_cores=1.0 + OTHERS_TOLERANCE_CORES)
        assert not is_reliable([], cpus=2, cores_used=1, others_cores=1.0 + OTHERS_TOLERANCE_CORES + 0.01)
        assert is_reliable([], cpus=2, cores_used=2, others_cores=OTHERS_TOLERANCE_CORES)
        assert not is_reliable([], cpus=2, cores_used=2, others_cores=OTHERS_TOLERANCE_CORES + 0.01)

    def test_measured_others_do_not_excuse_oversubscription_or_an_unknown_cpu_count(self) -> None:
        assert not is_reliable([0.1, 0.1], cpus=1, cores_used=2, others_cores=0.0)
        assert not is_reliable([0.1, 0.1], cpus=None, cores_used=1, others_cores=0.0)

    def test_unmeasurable_others_fall_back_on_the_load(self) -> None:
        assert not is_reliable([2.5, 2.5], cpus=2, cores_used=1, others_cores=float("nan"))
        assert is_reliable([1.5, 1.5], cpus=2, cores_used=1, others_cores=float("nan"))

    def test_cores_used_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="cores_used"):
            is_reliable([0.1, 0.1], cpus=2, cores_used=0)


class TestFormat:
    def test_reliable_run(self) -> None:
        assert describe(LoadRecord(0.9, 1.1, 2)) == "load average 0.9 → 1.1 on 2 CPUs (reliable)"
        assert mark(LoadRecord(0.9, 1.1, 2)) == ""

    def test_unreliable_run_names_the_load_and_the_cores(self) -> None:
        record = LoadRecord(0.9, 3.4, 2, cores_used=1)
        assert describe(record) == "UNRELIABLE: load 3.4 > 2 CPUs (load average 0.9 → 3.4, 1 core used)"
        assert mark(record) == UNRELIABLE_MARK

    def test_oversubscribed_run(self) -> None:
        assert describe(LoadRecord(0.1, 0.2, 1, cores_used=2)).startswith("UNRELIABLE: 2 cores used > 1 CPUs")

    def test_unknown_cpu_count(self) -> None:
        text = describe(LoadRecord(0.1, 0.2, None))
        assert text.startswith("UNRELIABLE: load or CPU count unknown")
        assert "on unknown CPUs" in text

    def test_a_figure_from_several_runs_is_marked_when_any_of_them_is_unreliable(self) -> None:
        assert mark([LoadRecord(0.5, 0.5, 2), LoadRecord(0.5, 2.5, 2)]) == UNRELIABLE_MARK
        assert mark([LoadRecord(0.5, 0.5, 2), LoadRecord(0.5, 1.5, 2)]) == ""
        assert mark([]) == UNRELIABLE_MARK  # no sample: nothing shows it was quiet

    def test_measured_others_are_shown_and_named_when_too_many(self) -> None:
        quiet = LoadRecord(0.9, 2.3, 2, cores_used=2, others_cores=0.02)
        assert describe(quiet) == "load average 0.9 → 2.3 on 2 CPUs, others 0.02 cores (reliable)"
        busy = LoadRecord(0.9, 1.9, 2, cores_used=2, others_cores=0.85)
        assert describe(busy) == (
            "UNRELIABLE: others 0.85 cores > 0.10 left free (load average 0.9 → 1.9 on 2 CPUs, 2 cores used)"
        )

    def test_footnote_gives_the_range_of_the_measured_others(self) -> None:
        records = [LoadRecord(0.5, 2.2, 2, 2, 0.01), LoadRecord(0.6, 2.3, 2, 2, 0.04)]
        expected = "load average 0.5–2.3, others 0.01–0.04 cores, over 2 timed runs on 2 CPUs (all reliable)"
        assert footnote(records) == expected

    def test_footnote_of_one_run_is_its_description(self) -> None:
        assert footnote([LoadRecord(0.9, 1.1, 2)]) == "load average 0.9 → 1.1 on 2 CPUs (reliable)"

    def test_footnote_of_several_runs_gives_the_range_and_the_count(self) -> None:
        text = footnote([LoadRecord(0.5, 0.7, 2), LoadRecord(1.0, 3.4, 2), LoadRecord(0.6, 0.8, 2)])
        assert text == f"load average 0.5–3.4 over 3 timed runs on 2 CPUs (1 UNRELIABLE)\n{UNRELIABLE_NOTE}"
        quiet = footnote([LoadRecord(0.5, 0.7, 2), LoadRecord(0.6, 0.8, 2)])
        assert quiet == "load average 0.5–0.8 over 2 timed runs on 2 CPUs (all reliable)"

    def test_round_trip_through_json_keeps_the_samples(self) -> None:
        record = LoadRecord(0.5, 2.5, 2, cores_used=1)
        data = record.to_dict()
        expected = {"before": 0.5, "after": 2.5, "cpus": 2, "cores_used": 1, "others_cores": None, "reliable": False}
        assert data == expected
        assert LoadRecord.from_dict(data) == record
        measured = LoadRecord(0.5, 2.5, 2, cores_used=2, others_cores=0.03)
        assert measured.to_dict()["reliable"] is True
        assert LoadRecord.from_dict(measured.to_dict()) == measured


class TestRecorder:
    def test_samples_the_load_before_and_after_the_block(self, monkeypatch: pytest.MonkeyPatch) -> None:
        samples = iter([(0.4, 0.0, 0.0), (1.7, 0.0, 0.0)])
        monkeypatch.setattr(os, "getloadavg", lambda: next(samples))
        monkeypatch.setattr(os, "cpu_count", lambda: 2)
        inside = []
        with LoadRecorder(cores_used=1, measure_others=False) as load:
            inside.append((load.record.before, load.record.after))
        assert inside == [(0.4, None)]  # the second sample waits for the block to end
        assert load.record == LoadRecord(0.4, 1.7, 2, 1)
        assert load.record.reliable

    def test_records_the_after_sample_when_the_block_raises(self, monkeypatch: pytest.MonkeyPatch) -> None:
        samples = iter([(0.4, 0.0, 0.0), (3.0, 0.0, 0.0)])
        monkeypatch.setattr(os, "getloadavg", lambda: next(samples))
        recorder = LoadRecorder(cpu_count=lambda: 2, measure_others=False)
        with pytest.raises(RuntimeError), recorder:
            raise RuntimeError("the run failed")
        assert recorder.record.after == 3.0
        assert not recorder.record.reliable

    def test_without_getloadavg_the_load_is_unknown(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delattr(os, "getloadavg")
        assert read_load() is None
        with LoadRecorder(cpu_count=lambda: 2, measure_others=False) as load:
            pass
        assert load.record == LoadRecord(None, None, 2, 1)
        assert not load.record.reliable


class TestWaitForQuiet:
    def test_returns_once_the_load_falls_to_the_limit(self) -> None:
        loads = iter([3.0, 2.5, 2.0])
        naps: list[float] = []
        assert wait_for_quiet(2.0, 60.0, poll_s=5.0, sample=lambda: next(loads), sleep=naps.append, clock=lambda: 0)
        assert naps == [5.0, 5.0]

    def test_gives_up_at_the_timeout(self) -> None:
        now = [0.0]

        def sleep(seconds: float) -> None:
            now[0] += seconds

        assert not wait_for_quiet(2.0, 12.0, poll_s=5.0, sample=lambda: 3.0, sleep=sleep, clock=lambda: now[0])
        assert now[0] == 12.0  # 5 + 5 + the 2 s left, never past the timeout

    def test_gives_up_at_once_when_the_load_cannot_be_read(self) -> None:
        naps: list[float] = []
        assert not wait_for_quiet(2.0, 60.0, sample=lambda: None, sleep=naps.append)
        assert naps == []

    def test_the_recorder_waits_before_its_first_sample(self) -> None:
        loads = iter([5.0, 1.0, 1.0, 1.2])
        naps: list[float] = []
        recorder = LoadRecorder(
            wait_quiet_s=30.0, sample=lambda: next(loads), cpu_count=lambda: 2, sleep=naps.append, measure_others=False
        )
        with recorder:
            pass
        assert len(naps) == 1  # 5.0 is above 2 CPUs, 1.0 is not: one nap between the two polls
        assert recorder.record == LoadRecord(1.0, 1.2, 2, 1)
