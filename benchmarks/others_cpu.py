"""How much CPU the processes outside a benchmark's own process tree used while it ran.

The load average cannot tell a benchmark's own tasks from another job's: a run with 2 Ray workers and a driver on
2 cores reaches load 2.3 alone. This module measures the others directly, on Linux, from ``/proc``:

    others = (busy CPU time of the machine) - (CPU time of the benchmark's process tree)

over the timed run, in cores (seconds of CPU per second of wall time). The machine's busy time comes from the first
line of ``/proc/stat`` (user + nice + system + irq + softirq + steal); the tree's from ``/proc/<pid>/stat``
(utime + stime) of every process descended from the benchmark's process, sampled every ``interval_s`` by a small
sampler process of its own (a thread would take the GIL from an in-process benchmark). A process keeps counting as
the tree's after its parent exits (Ray's workers are reparented when its driver ends), and one born during the run
counts from zero.

The estimate errs towards "others": the kernel's own work counts there, and so does the tail of a tree process
that exits between two samples (at most ``interval_s`` of its CPU), or a whole tree process that lives less than
``interval_s``. It never hides another job's CPU time. Measured on a quiet 2-core machine, a 2-worker Flower run
(35 processes in its tree) gave 0.02 cores of others. The sampler's own cost (about 2 ms per sample) counts as the
tree's.

Run as a script, it is the sampler: ``python others_cpu.py --root PID [--interval S]`` takes its first sample,
prints ``ready``, samples until its standard input closes, then prints one JSON line
``{"busy_ticks", "tree_ticks", "wall_s", "clock_ticks"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

PROC = Path("/proc")

ProcessKey = tuple[int, int]
"""(pid, start time in clock ticks since boot): a pid the kernel reuses names another process."""


@dataclass(frozen=True)
class ProcessSample:
    """One process in one sample: its parent and the CPU time it has used (user + system, clock ticks)."""

    ppid: int
    cpu_ticks: int


def read_busy_ticks(proc: Path = PROC) -> int:
    """The machine's busy CPU time since boot, in clock ticks, summed over its CPUs (first line of ``/proc/stat``)."""
    fields = [int(value) for value in (proc / "stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal


def read_processes(proc: Path = PROC) -> dict[ProcessKey, ProcessSample]:
    """Every process's parent and CPU time, from ``/proc/<pid>/stat`` (processes that exit while read are skipped)."""
    table: dict[ProcessKey, ProcessSample] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # it exited between the listing and the read
            continue
        # The command name (field 2) is in parentheses and may hold spaces or parentheses: split after the last one.
        fields = text[text.rindex(")") + 2 :].split()
        # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15, starttime 22.
        table[(int(entry.name), int(fields[19]))] = ProcessSample(int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


class TreeAccount:
    """The CPU time a process tree used between its first and its latest sample.

    Args:
        root_pid: the tree's root; it and every process descended from it count as the tree.
    """

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._tree: set[ProcessKey] = set()
        self._start: dict[ProcessKey, int] = {}
        self._latest: dict[ProcessKey, int] = {}
        self._sampled = False

    def add(self, table: dict[ProcessKey, ProcessSample]) -> None:
        """Takes one sample: finds the tree's processes in it and keeps their CPU times."""
        key_of = {key[0]: key for key in table}
        for key in table.keys() - self._tree:  # once in the tree, always in it: only newcomers are walked
            if self._in_tree(key, table, key_of):
                self._tree.add(key)
        for key in self._tree & table.keys():
            # A tree process already there at the first sample counts from that sample; a later one from its birth.
            self._start.setdefault(key, table[key].cpu_ticks if not self._sampled else 0)
            self._latest[key] = table[key].cpu_ticks
        self._sampled = True

    def _in_tree(self, key: ProcessKey, table: dict[ProcessKey, ProcessSample], key_of: dict[int, ProcessKey]) -> bool:
        seen: set[int] = set()
        pid = key[0]
        while pid not in seen:
            if pid == self.root_pid or key_of.get(pid) in self._tree:
                return True
            seen.add(pid)
            parent = key_of.get(pid)
            if parent is None:
                return False
            pid = table[parent].ppid
        return False

    @property
    def ticks(self) -> int:
        """The tree's CPU time between the first and the latest sample, in clock ticks."""
        return sum(self._latest[key] - self._start[key] for key in self._latest)


def others_cpu_seconds(busy_ticks: int, tree_ticks: int, clock_ticks: int) -> float:
    """The others' CPU time: (busy - tree) / clock_ticks seconds, never below 0 (the tree's count can pass the busy
    time by a tick of rounding)."""
    return max(0, busy_ticks - tree_ticks) / clock_ticks


def others_cores(busy_ticks: int, tree_ticks: int, wall_s: float, clock_ticks: int) -> float:
    """The cores the others kept busy on average: :func:`others_cpu_seconds` per second of ``wall_s``."""
    if wall_s <= 0:
        return 0.0
    return others_cpu_seconds(busy_ticks, tree_ticks, clock_ticks) / wall_s


class OthersCpuMeter:
    """Context manager that measures :func:`others_cores` over the block it wraps, with a sampler process.

    After the block: ``cores`` (:func:`others_cores`), and the CPU seconds behind it, ``others_cpu_s`` and
    ``tree_cpu_s``, over ``wall_s``. All are ``None`` where they cannot be measured (no ``/proc``, or the sampler
    failed): a caller then falls back on the load average.

    Example::

        with OthersCpuMeter() as meter:
            run()
        print(meter.cores)
    """

    def __init__(self, root_pid: int | None = None, interval_s: float = 0.5) -> None:
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.interval_s = interval_s
        self.cores: float | None = None
        self.others_cpu_s: float | None = None
        self.tree_cpu_s: float | None = None
        self.wall_s: float | None = None
        self._sampler: subprocess.Popen[str] | None = None

    def __enter__(self) -> OthersCpuMeter:
        self.cores = self.others_cpu_s = self.tree_cpu_s = self.wall_s = None  # nothing left from an earlier block
        if not (PROC / "stat").exists():
            return self
        command = [sys.executable, str(Path(__file__).resolve()), "--root", str(self.root_pid)]
        command += ["--interval", str(self.interval_s)]
        try:
            sampler = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        except OSError:
            return self
        assert sampler.stdout is not None  # stdout=PIPE above
        if sampler.stdout.readline().strip() == "ready":  # its first sample is taken: the timed block may start
            self._sampler = sampler
        else:
            sampler.kill()
            sampler.wait()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        try:
            output, _ = sampler.communicate(timeout=30)  # closes its stdin: it takes the last sample and reports
            result = json.loads(output.strip().splitlines()[-1])
            busy, tree, ticks = result["busy_ticks"], result["tree_ticks"], result["clock_ticks"]
            self.wall_s, self.tree_cpu_s = float(result["wall_s"]), tree / ticks
            self.others_cpu_s = others_cpu_seconds(busy, tree, ticks)
            self.cores = others_cores(busy, tree, self.wall_s, ticks)
        except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError):
            sampler.kill()
            sampler.wait()


def _sample_until_stdin_closes(root_pid: int, interval_s: float) -> dict[str, float]:
    account = TreeAccount(root_pid)
    busy_start, start = read_busy_ticks(), time.monotonic()
    account.add(read_processes())
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], interval_s)
        if readable and not sys.stdin.readline():  # end of file: the timed block is over
            break
        account.add(read_processes())
    account.add(read_processes())
    busy = read_busy_ticks() - busy_start
    return {
        "busy_ticks": busy,
        "tree_ticks": account.ticks,
        "wall_s": time.monotonic() - start,
        "clock_ticks": os.sysconf("SC_CLK_TCK"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Samples the CPU time of a process tree and of the whole machine.")
    parser.add_argument("--root", type=int, required=True, help="the tree's root pid")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    args = parser.parse_args(argv)
    print(json.dumps(_sample_until_stdin_closes(args.root, args.interval)), flush=True)


if __name__ == "__main__":
    main()
