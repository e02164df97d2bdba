"""Timing for benchmarks: repeats, medians, the CPU a process tree spends, and the rows scenarios return.

On a shared machine wall-clock rates of one pipeline swing 3x within minutes while the CPU seconds it
spends per image stay within about 15%, and on Colab's 2 dedicated CPUs a CPU-bound loader runs at
about 2 / (CPU seconds per image): so scenarios report both (:func:`usage`).
"""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import time
from typing import Any, Callable, Collection, Optional

import psutil


@dataclasses.dataclass
class Result:
    """One measured row of a scenario.

    Attributes:
        scenario: e.g. ``"staging/small-files"``.
        method: what was measured, e.g. ``"colabfast.stage"``, ``"cp -r"``.
        seconds: median wall time of the repeats, in seconds (None: could not run; see ``note``).
        low, high: min and max wall time over the repeats, in seconds.
        repeats: how many times it ran.
        metrics: derived figures (``MB/s``, ``files/s``, ``images/s``, ``link_fraction``, ...).
        note: why a method did not run, or a caveat.
        reference: a yardstick rather than something a user would pick instead (the decode-only
            ceiling); reports never count it as an alternative.
    """

    scenario: str
    method: str
    seconds: Optional[float]
    low: Optional[float] = None
    high: Optional[float] = None
    repeats: int = 0
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    note: str = ""
    reference: bool = False

    @property
    def speed(self) -> Optional[float]:
        """Higher is faster: ``images/s`` when the row has it, else 1 / seconds; None if it did not run."""
        if self.seconds is None:
            return None
        return self.metrics.get("images/s") or 1.0 / self.seconds


@dataclasses.dataclass(frozen=True)
class Usage:
    """A reading of the clocks (:func:`usage`); the difference of two is what happened between them.

    Attributes:
        wall: ``time.perf_counter()``, seconds.
        cpu: user + system CPU seconds of this process (all its threads) and its child processes,
            those still running and those already reaped, less the ``excluded`` ones.
        excluded: the same of the processes named to :func:`usage` (a Drive simulator's server) and
            their own children.
    """

    wall: float
    cpu: float
    excluded: float = 0.0

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.wall - other.wall, self.cpu - other.cpu, self.excluded - other.excluded)


def _process_cpu(p: psutil.Process) -> float:
    """User + system CPU seconds of ``p`` and of its children it has reaped; 0 where it is gone."""
    try:
        t = p.cpu_times()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 0.0
    return t.user + t.system + t.children_user + t.children_system


def usage(exclude: Collection[int] = ()) -> Usage:
    """The clocks now: wall time, and the CPU time of this process tree with the processes ``exclude``
    (pids of children, with their own children) counted apart.

    The tree's CPU is ``getrusage(RUSAGE_SELF)`` + ``getrusage(RUSAGE_CHILDREN)`` (every thread; the
    children reaped, e.g. worker processes of a finished epoch) + each live descendant's own and reaped
    children's time (``psutil``: the live worker processes). A child that exits between two readings is
    counted in the second either way, once it is reaped; one that exits while being read adds up to
    the few milliseconds of that read.
    """
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    live = psutil.Process(os.getpid()).children(recursive=True)
    apart = {p.pid for p in live if p.pid in exclude}
    for p in live:  # the children of an excluded process are excluded too
        try:
            if p.pid not in apart and any(a.pid in apart for a in p.parents()):
                apart.add(p.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    excluded = float(sum(_process_cpu(p) for p in live if p.pid in apart))
    cpu += sum(_process_cpu(p) for p in live if p.pid not in apart)
    return Usage(time.perf_counter(), cpu, excluded)


@dataclasses.dataclass(frozen=True)
class Spread:
    """The median, min and max of repeated measurements (of at least one)."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Collection[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def __str__(self) -> str:
        return f"{self.median:.3g} ({self.low:.3g}-{self.high:.3g})"


def measure(
    fn: Callable[[], Any], repeats: int = 3, setup: Optional[Callable[[], Any]] = None
) -> tuple[float, float, float]:
    """(median, min, max) wall seconds of ``fn()`` over ``repeats`` runs; ``setup()`` runs untimed before each."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)
