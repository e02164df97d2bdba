"""Time spent per stage of a loader's work: :class:`StageClock`, read as :class:`StageTime` per stage.

Timed where each stage runs, per thread without a lock (the shape of SPDL's ``TaskStatsHook``):

- ``"read"``: bytes from the mirror (``pread``), or the dataset's ``__getitem__`` where torch's fetcher
  reads in this process; counted in samples.
- ``"decode+transform"``: decoding images and the per-sample transform; samples.
- ``"collate"``: making the batch from the samples; samples.
- ``"copy"``: on CUDA, the feeder's copy to the GPU and the GPU work it launches; batches.
- ``"wait"``: the training loop waiting in ``next()`` for a batch; batches.

Work in other processes (torch's worker processes) is not seen here.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Optional

__all__ = ["STAGES", "StageClock", "StageTime", "since"]

STAGES = ("read", "decode+transform", "collate", "copy", "wait")
READ, DECODE, COLLATE, COPY, WAIT = range(len(STAGES))
now = time.perf_counter_ns


@dataclasses.dataclass(frozen=True)
class StageTime:
    """One stage's work: ``count`` items in ``seconds`` of wall time, summed over threads."""

    count: int
    seconds: float

    @property
    def per_item(self) -> float:
        """Seconds per item (0 for none)."""
        return self.seconds / self.count if self.count else 0.0


class StageClock:
    """Counts and nanoseconds per stage, added by any thread without a lock, summed when read."""

    def __init__(self) -> None:
        self._local = threading.local()
        # each live thread's [count, ns] * len(STAGES); those of threads that ended, summed in _ended
        self._slots: list[tuple[threading.Thread, list[int]]] = []
        self._ended = [0] * (2 * len(STAGES))
        self._lock = threading.Lock()  # taken once per thread, when it first adds, and to read

    def __reduce__(self) -> Any:  # pickled to a worker process: a clock of its own there
        return (StageClock, ())

    def _mine(self) -> list[int]:
        try:
            return self._local.slots
        except AttributeError:
            slots = self._local.slots = [0] * (2 * len(STAGES))
            with self._lock:
                self._fold()  # reader threads come and go each epoch: what ended is kept as a sum
                self._slots.append((threading.current_thread(), slots))
            return slots

    def _fold(self) -> None:
        live = []
        for thread, slots in self._slots:
            if thread.is_alive():
                live.append((thread, slots))
            else:
                self._ended = [a + b for a, b in zip(self._ended, slots)]
        self._slots = live

    def add(self, stage: int, ns: int, count: int = 1) -> None:
        """Add ``ns`` nanoseconds and ``count`` items to ``stage`` (an index of :data:`STAGES`) in this thread."""
        slots = self._mine()
        slots[2 * stage] += count
        slots[2 * stage + 1] += ns

    def mark(self) -> int:
        """This thread's nanoseconds so far in ``read`` and ``decode+transform``, for :meth:`add_rest`."""
        slots = self._mine()
        return slots[2 * READ + 1] + slots[2 * DECODE + 1]

    def add_rest(self, stage: int, start: int, mark: int, count: int) -> None:
        """Add to ``stage`` the time since ``start`` not already added to ``read`` or ``decode+transform``."""
        self.add(stage, now() - start - (self.mark() - mark), count)

    def times(self) -> dict[str, StageTime]:
        """Every stage that ran so far, in pipeline order: name -> :class:`StageTime`."""
        with self._lock:
            self._fold()
            slots = [self._ended, *(s for _, s in self._slots)]
        totals = [sum(s[k] for s in slots) for k in range(2 * len(STAGES))]
        return {name: StageTime(totals[2 * i], totals[2 * i + 1] / 1e9)
                for i, name in enumerate(STAGES) if totals[2 * i]}


def since(after: dict[str, StageTime], before: Optional[dict[str, StageTime]]) -> dict[str, StageTime]:
    """The work of each stage between two readings of :meth:`StageClock.times`."""
    before = before or {}
    out = {}
    for name, t in after.items():
        b = before.get(name, StageTime(0, 0.0))
        if t.count > b.count:
            out[name] = StageTime(t.count - b.count, t.seconds - b.seconds)
    return out
