"""Timing for benchmarks: repeats, medians, and the rows scenarios return."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Optional


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
