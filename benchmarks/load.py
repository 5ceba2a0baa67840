"""The machine's load around a timed run, and whether a figure taken under it can be trusted.

Every benchmark that prints a time records the 1-minute load average (``os.getloadavg()[0]``) and the CPU count
just before and just after each timed run, and, on Linux, the cores that processes outside the benchmark's own
process tree kept busy during it (``benchmarks/others_cpu.py``) (:class:`LoadRecorder`). It prints them under its
table (:func:`footnote`) and marks a figure taken under too much load with :data:`UNRELIABLE_MARK` (:func:`mark`).

The rule (:func:`is_reliable`). A run that keeps ``k`` cores busy on an ``n``-core machine gets them undisturbed
while the others' work fits in the ``n - k`` cores it leaves free. Where the others were measured::

    reliable  <=>  k <= n  and  others <= n - k + 0.1

(:data:`OTHERS_TOLERANCE_CORES`: the kernel and a quiet machine's daemons use about 0.02 cores). This tells the
benchmark's own processes from another job's, which the load average cannot: 2 Flower workers and their driver
reach load 2.3 on 2 cores alone. Where they were not measured (no ``/proc``, or a caller whose sibling runs share
its process tree), the load average stands in for them. It counts the tasks that are running or waiting for a core,
the timed run's own included; estimating the others as ``load - k`` from every sample, that is
``load - k <= n - k``, i.e.::

    reliable  <=>  k <= n  and  max(load before, load after) <= n

A load exactly equal to the core count is still reliable (every task has a core). A run that needs more cores
than the machine has (``k > n``, e.g. 2 processes on 1 CPU) competes with itself and is never reliable. Counting
the run's ``k`` in the sample taken before it is exact when the benchmark kept those cores busy during the minute
before (its warm-up, the previous repeat) and lenient by at most ``k`` otherwise; the 1-minute average also lags,
so a short run is judged partly by the minute before it. Where the load or the CPU count cannot be read
(``os.getloadavg`` is missing on Windows, ``os.cpu_count()`` may be ``None``), nothing shows that the figure was
quiet, so it counts as unreliable.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

from benchmarks.others_cpu import OthersCpuMeter

UNRELIABLE_MARK = "*"
"""Appended to a figure taken at a load above the cores it uses."""

UNRELIABLE_NOTE = "* unreliable: others' CPU above the cores the run left free (unmeasured: load above cores)"
"""The footnote that explains :data:`UNRELIABLE_MARK`."""

OTHERS_TOLERANCE_CORES = 0.1
"""What the others may use beyond the cores a run leaves free: the kernel and a quiet machine's daemons (about
0.02 cores measured on the 2-core development machine), with room, but well below a job of one busy thread."""


def read_load() -> float | None:
    """The 1-minute load average, or ``None`` where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # AttributeError: Windows has no getloadavg; OSError: it could not be read
        return None


def is_reliable(
    loads: Sequence[float | None], cpus: int | None, cores_used: int = 1, others_cores: float | None = None
) -> bool:
    """Whether a figure timed under ``loads`` (the samples around it) on ``cpus`` CPUs can be trusted.

    Args:
        loads: the 1-minute load averages sampled around the timed run (before, after; more for a figure built
            from several runs). ``None`` is a sample that could not be read.
        cpus: the machine's CPU count, ``None`` when unknown.
        cores_used: the cores the timed run itself keeps busy (processes x threads).
        others_cores: the cores processes outside the run's own tree kept busy during it, ``None`` when not
            measured.

    Returns:
        ``False`` when the CPU count is unknown or ``cores_used > cpus``. Otherwise, with ``others_cores``
        measured: whether it is at most ``cpus - cores_used +`` :data:`OTHERS_TOLERANCE_CORES`. Without it:
        whether every load sample is known and at most ``cpus`` (and there is one). See the module's docstring.
    """
    if cores_used < 1:
        raise ValueError(f"`cores_used` must be at least 1, got {cores_used}.")
    if cpus is None or cores_used > cpus:
        return False
    if others_cores is not None and not math.isnan(others_cores):
        return others_cores <= cpus - cores_used + OTHERS_TOLERANCE_CORES
    if not loads or any(load is None or math.isnan(load) for load in loads):
        return False
    return max(load for load in loads if load is not None) <= cpus


@dataclass
class LoadRecord:
    """The load around one timed run: 1-minute averages before and after it, the CPU count, the cores it used and
    the cores the others used during it (``None`` when not measured)."""

    before: float | None
    after: float | None
    cpus: int | None
    cores_used: int = 1
    others_cores: float | None = None

    @property
    def reliable(self) -> bool:
        """See :func:`is_reliable`."""
        return is_reliable([self.before, self.after], self.cpus, self.cores_used, self.others_cores)

    def to_dict(self) -> dict[str, Any]:
        """The samples and the verdict, for a benchmark's JSON results."""
        return {**asdict(self), "reliable": self.reliable}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadRecord:
        """The inverse of :meth:`to_dict` (the verdict is recomputed, not read)."""
        return cls(data["before"], data["after"], data["cpus"], data.get("cores_used", 1), data.get("others_cores"))


class LoadRecorder:
    """Context manager that samples the load before and after the block it wraps.

    ``wait_quiet_s > 0`` first waits, up to that many seconds, until the load is at most the CPU count (the rule's
    limit), so that a figure is taken on a quiet machine when one becomes quiet in time; the run goes ahead either
    way, and the samples say whether it was quiet.

    ``measure_others`` (default) also measures the others' cores over the block (:class:`OthersCpuMeter`, this
    process's tree being the run's). Turn it off where runs that should count as others share this process's tree
    (sibling runs started from threads of one driver): the load average then judges alone.

    Example::

        with LoadRecorder(cores_used=2) as load:
            run()
        print(seconds, mark(load.record), footnote([load.record]))
    """

    def __init__(
        self,
        cores_used: int = 1,
        wait_quiet_s: float = 0.0,
        sample: Callable[[], float | None] = read_load,
        cpu_count: Callable[[], int | None] = os.cpu_count,
        sleep: Callable[[float], None] = time.sleep,
        measure_others: bool = True,
    ) -> None:
        self.cores_used = cores_used
        self.wait_quiet_s = wait_quiet_s
        self._meter = OthersCpuMeter() if measure_others else None
        self._sample = sample
        self._cpu_count = cpu_count
        self._sleep = sleep
        self.record = LoadRecord(None, None, None, cores_used)

    def __enter__(self) -> LoadRecorder:
        cpus = self._cpu_count()
        if self.wait_quiet_s > 0 and cpus is not None:
            wait_for_quiet(cpus, self.wait_quiet_s, sample=self._sample, sleep=self._sleep)
        self.record = LoadRecord(self._sample(), None, cpus, self.cores_used)
        if self._meter is not None:
            self._meter.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._meter is not None:
            self._meter.__exit__(kind, error, traceback)
            self.record.others_cores = self._meter.cores
        self.record.after = self._sample()


def wait_for_quiet(
    limit: float,
    timeout_s: float,
    poll_s: float = 5.0,
    sample: Callable[[], float | None] = read_load,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Waits until the 1-minute load is at most ``limit``, for at most ``timeout_s`` seconds.

    Returns:
        Whether the load came down in time (``False`` also where it cannot be read).
    """
    deadline = clock() + timeout_s
    while True:
        load = sample()
        if load is not None and load <= limit:
            return True
        remaining = deadline - clock()
        if load is None or remaining <= 0:
            return False
        sleep(min(poll_s, remaining))


def add_wait_quiet_argument(parser: argparse.ArgumentParser) -> None:
    """Adds ``--wait-quiet SECONDS`` (default 0: do not wait), the ``wait_quiet_s`` of every :class:`LoadRecorder`."""
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each timed run, wait up to SECONDS for the 1-minute load to fall to the CPU count (default 0)",
    )


def mark(records: LoadRecord | Iterable[LoadRecord]) -> str:
    """:data:`UNRELIABLE_MARK` when any of the runs a figure is built from is unreliable, else ``""``."""
    many = [records] if isinstance(records, LoadRecord) else list(records)
    return "" if many and all(record.reliable for record in many) else UNRELIABLE_MARK


def _load_text(load: float | None) -> str:
    return "unknown" if load is None else f"{load:.1f}"


def _others_text(record: LoadRecord) -> str:
    return "" if record.others_cores is None else f", others {record.others_cores:.2f} cores"


def describe(record: LoadRecord) -> str:
    """One run's load, e.g. ``load average 0.9 → 2.3 on 2 CPUs, others 0.02 cores (reliable)`` or
    ``UNRELIABLE: others 0.85 cores > 0.10 left free (load average 0.9 → 3.1 on 2 CPUs, 2 cores used)``."""
    cpus = "unknown" if record.cpus is None else str(record.cpus)
    span = f"load average {_load_text(record.before)} → {_load_text(record.after)}"
    if record.reliable:
        return f"{span} on {cpus} CPUs{_others_text(record)} (reliable)"
    used = f"{record.cores_used} core{'s' if record.cores_used != 1 else ''} used"
    if record.cpus is not None and record.cores_used > record.cpus:
        return f"UNRELIABLE: {used} > {cpus} CPUs ({span})"
    if record.cpus is not None and record.others_cores is not None:
        free = record.cpus - record.cores_used + OTHERS_TOLERANCE_CORES
        others = f"others {record.others_cores:.2f} cores > {free:.2f} left free"
        return f"UNRELIABLE: {others} ({span} on {cpus} CPUs, {used})"
    if record.cpus is None or record.before is None or record.after is None:
        return f"UNRELIABLE: load or CPU count unknown ({span} on {cpus} CPUs, {used})"
    return f"UNRELIABLE: load {max(record.before, record.after):.1f} > {cpus} CPUs ({span}, {used})"


def footnote(records: Sequence[LoadRecord]) -> str:
    """The lines printed under a table: the load of every timed run behind it, summed up.

    One run gives :func:`describe`'s line; several give the range of their samples and how many were unreliable,
    followed by :data:`UNRELIABLE_NOTE` when any figure is marked.
    """
    if not records:
        return "load average: no timed run"
    if len(records) == 1:
        line = describe(records[0])
    else:
        loads = [load for record in records for load in (record.before, record.after) if load is not None]
        span = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "unknown"
        cpus = {record.cpus for record in records}
        cpu_text = "unknown" if None in cpus or len(cpus) != 1 else str(cpus.pop())
        others = [record.others_cores for record in records if record.others_cores is not None]
        others_text = f", others {min(others):.2f}–{max(others):.2f} cores," if others else ""
        bad = sum(not record.reliable for record in records)
        verdict = "all reliable" if bad == 0 else f"{bad} UNRELIABLE"
        line = f"load average {span}{others_text} over {len(records)} timed runs on {cpu_text} CPUs ({verdict})"
    if any(not record.reliable for record in records):
        line += f"\n{UNRELIABLE_NOTE}"
    return line
