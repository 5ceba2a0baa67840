"""The others' CPU time around a timed run (``benchmarks/others_cpu.py``): reading ``/proc``, the tree's account,
and the sampler process against a real CPU-burning process inside and outside the tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.others_cpu import (
    OthersCpuMeter,
    ProcessSample,
    TreeAccount,
    others_cores,
    read_busy_ticks,
    read_processes,
)


def write_proc(root: Path, busy: tuple[int, ...], processes: dict[int, tuple[str, int, int, int, int]]) -> None:
    """A fake ``/proc``: the ``cpu`` line and ``<pid>/stat`` for (comm, ppid, utime, stime, starttime)."""
    user, nice, system, idle, iowait, irq, softirq, steal = busy
    (root / "stat").write_text(f"cpu  {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0\ncpu0 1 2 3\n")
    for pid, (comm, ppid, utime, stime, start) in processes.items():
        (root / str(pid)).mkdir()
        # Fields 3..22: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime
        # cstime priority nice threads itrealvalue starttime.
        rest = ["S", ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, stime, 7, 7, 20, 0, 1, 0, start, 99]
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(map(str, rest)) + "\n")
    (root / "self").mkdir()  # not a pid: skipped


class TestReadProc:
    def test_busy_time_leaves_out_idle_and_iowait(self, tmp_path: Path) -> None:
        write_proc(tmp_path, (10, 1, 5, 1000, 300, 2, 3, 4), {})
        assert read_busy_ticks(tmp_path) == 10 + 1 + 5 + 2 + 3 + 4

    def test_reads_parent_and_user_plus_system_time_whatever_the_command_name(self, tmp_path: Path) -> None:
        write_proc(tmp_path, (0,) * 8, {7: ("python", 1, 30, 12, 500), 9: ("a (b) c", 7, 4, 1, 600)})
        assert read_processes(tmp_path) == {(7, 500): ProcessSample(1, 42), (9, 600): ProcessSample(7, 5)}


class TestTreeAccount:
    def test_counts_the_root_and_its_descendants_from_the_first_sample(self) -> None:
        account = TreeAccount(root_pid=10)
        account.add({(10, 1): ProcessSample(1, 100), (11, 2): ProcessSample(10, 50), (20, 3): ProcessSample(1, 900)})
        account.add({(10, 1): ProcessSample(1, 130), (11, 2): ProcessSample(10, 70), (20, 3): ProcessSample(1, 990)})
        assert account.ticks == 30 + 20  # process 20 is not the tree's

    def test_a_process_born_during_the_run_counts_from_zero(self) -> None:
        account = TreeAccount(root_pid=10)
        account.add({(10, 1): ProcessSample(1, 100)})
        account.add({(10, 1): ProcessSample(1, 100), (12, 5): ProcessSample(10, 40), (13, 6): ProcessSample(12, 8)})
        assert account.ticks == 40 + 8

    def test_an_orphan_of_the_tree_stays_the_trees(self) -> None:
        account = TreeAccount(root_pid=10)
        account.add({(10, 1): ProcessSample(1, 0), (11, 2): ProcessSample(10, 0), (12, 3): ProcessSample(11, 0)})
        # Process 11 exits; 12 is reparented to init and keeps working.
        account.add({(10, 1): ProcessSample(1, 0), (12, 3): ProcessSample(1, 25)})
        assert account.ticks == 25

    def test_a_reused_pid_is_another_process(self) -> None:
        account = TreeAccount(root_pid=10)
        account.add({(10, 1): ProcessSample(1, 0), (11, 2): ProcessSample(10, 5)})
        # 11 exits and an unrelated process gets its pid: not the tree's.
        account.add({(10, 1): ProcessSample(1, 0), (11, 9): ProcessSample(1, 300)})
        assert account.ticks == 0

    def test_others_are_the_busy_time_the_tree_did_not_use(self) -> None:
        assert others_cores(busy_ticks=450, tree_ticks=250, wall_s=2.0, clock_ticks=100) == 1.0
        # The tree's count can exceed the busy time by a tick of rounding: never negative.
        assert others_cores(busy_ticks=100, tree_ticks=101, wall_s=1.0, clock_ticks=100) == 0.0
        assert others_cores(busy_ticks=100, tree_ticks=0, wall_s=0.0, clock_ticks=100) == 0.0


BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
class TestMeter:
    def burn(self, seconds: float) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds)])

    def test_a_process_of_the_tree_is_not_counted_as_others_and_one_outside_is(self) -> None:
        # The same burner, once as this process's child (the tree's) and once under a meter rooted at a process
        # that is not its ancestor. It uses 1 s of CPU either way, however loaded the machine is.
        stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            with OthersCpuMeter() as own:
                self.burn(1.0).wait()
            with OthersCpuMeter(root_pid=stranger.pid) as strange:
                self.burn(1.0).wait()
        finally:
            stranger.kill()
            stranger.wait()
        assert own.tree_cpu_s is not None and strange.tree_cpu_s is not None and strange.others_cpu_s is not None
        assert own.tree_cpu_s >= 0.95  # the burner's second, less a tick of rounding at each end
        assert strange.tree_cpu_s < 0.05  # the stranger slept
        assert strange.others_cpu_s >= 0.95
        assert own.cores is not None and own.wall_s is not None and own.others_cpu_s is not None
        assert own.cores == pytest.approx(own.others_cpu_s / own.wall_s)

    def test_without_proc_nothing_is_measured(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        monkeypatch.setattr("benchmarks.others_cpu.PROC", tmp_path)
        with OthersCpuMeter() as meter:
            pass
        assert meter.cores is None
