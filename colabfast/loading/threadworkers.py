"""Batches made in threads as torch's worker processes would make them: :class:`ThreadWorkers`.

Thread ``w`` makes batch ``k`` when ``k % workers == w``, drawing from a generator seeded ``base_seed + w``
as worker ``w`` seeds torch's (``torch/utils/data/_utils/worker.py``): the same batches, no worker start.
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch

from colabfast.loading.resume import Marks

__all__ = ["Joined", "ThreadWorkers", "base_seed", "in_order", "worker_generators"]


def _one_intraop_thread() -> None:
    """Run this thread's torch ops on one core, as torch's workers do (OpenMP keeps the count per thread)."""
    torch.get_num_threads()  # this thread's own lazy initialisation first (it would take the default set next)
    torch.set_num_threads(1)


_OPENMP = "OpenMP" in torch.__config__.parallel_info()


def in_order(submit: Callable[[int, list, threading.Event], Future], batch_indices: Iterable[Sequence[int]],
             prefetch: int, start: int = 0) -> Iterator[Any]:
    """``submit(k, indices, stop)``'s results for each batch ``k``, in order, ``prefetch`` ahead.

    A consumer that stops early, or a failed batch, cancels what is queued and sets ``stop``.
    """
    pending: collections.deque[Future] = collections.deque()
    stop = threading.Event()
    try:
        for k, indices in enumerate(batch_indices, start):
            pending.append(submit(k, list(indices), stop))
            if len(pending) > prefetch:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        stop.set()
        for f in pending:
            f.cancel()


class Joined:
    """Pieces of one batch made by several threads, joined by :meth:`result` in the caller's thread."""

    def __init__(self, pieces: list[Future], join: Callable[[list], Any]) -> None:
        self.pieces, self.join = pieces, join

    def result(self) -> Any:
        return self.join([piece.result() for piece in self.pieces])

    def cancel(self) -> bool:
        return all([piece.cancel() for piece in self.pieces])


def base_seed(generator: Optional[torch.Generator]) -> int:
    """An epoch's workers' base seed, drawn from ``generator`` as torch's ``_BaseDataLoaderIter`` draws it."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def worker_generators(base_seed: int, workers: int) -> list[torch.Generator]:
    """CPU generators in the states torch's workers start from: worker ``w`` seeds ``base_seed + w``."""
    return [torch.Generator().manual_seed(base_seed + w) for w in range(workers)]


class ThreadWorkers:
    """Batches made by ``fetch`` in ``workers`` threads, each standing in for one worker process.

    Args:
        fetch: ``(indices, generator) -> batch``, what a worker does for one batch.
        workers: threads; batch ``k`` is made by thread ``k % workers``.
        prefetch: batches made ahead of the one handed out.
        persistent: keep each thread's random stream between epochs (``persistent_workers=True``).
        generator: where the base seed is drawn from (None: torch's global).
        split: ``(indices, generator, parts)`` -> ``(pieces, join)`` or None: each epoch's first batch is
            made by every thread at once (:meth:`colabfast.loading.reader.BatchReader.split`).

    Raises (while iterating): whatever ``fetch`` raises, with a note naming the batch's indices.
    """

    def __init__(self, fetch: Callable[[list, torch.Generator], Any], *, workers: int, prefetch: int,
                 persistent: bool = True, generator: Optional[torch.Generator] = None,
                 split: Optional[Callable[[list, torch.Generator, int], Any]] = None) -> None:
        self.fetch, self.workers, self.split = fetch, max(1, workers), split
        self.prefetch = max(self.workers, prefetch)
        self.persistent, self.generator = persistent, generator
        self._generators: Optional[list[torch.Generator]] = None

    def batches(self, batch_indices: Iterable[Sequence[int]], seed: Optional[int] = None, *, start: int = 0,
                states: Optional[list[torch.Tensor]] = None, marks: Optional[Marks] = None) -> Iterator[Any]:
        """The batches for ``batch_indices``, in order, ``prefetch`` ahead.

        Args:
            seed: the workers' base seed (resuming), else drawn here as torch does.
            start: the epoch's position of the first batch (resuming).
            states: the threads' generator states to start from (:meth:`states_before`).
            marks: where each thread records its generator's state as it begins a batch.
        """
        if states is not None:
            if len(states) != self.workers:
                raise ValueError(f"{len(states)} generator states for {self.workers} reader threads")
            self._generators = [torch.Generator() for _ in states]
            for g, state in zip(self._generators, states):
                g.set_state(state)
        elif seed is not None:
            self._generators = worker_generators(seed, self.workers)
        elif self._generators is None or not self.persistent:
            # torch's _BaseDataLoaderIter draws its workers' base seed so, before the sampler's first draw
            self._generators = worker_generators(base_seed(self.generator), self.workers)
        with ExitStack() as stack:
            pools = [stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix=f"colabfast-worker-{w}"))
                     for w in range(self.workers)]
            if _OPENMP:
                n = torch.get_num_threads()  # this thread's, and the process default
                for f in [pool.submit(_one_intraop_thread) for pool in pools]:
                    f.result()
                torch.set_num_threads(n)  # the default back: the reader threads keep their 1
            generators = self._generators

            def submit(k: int, indices: list, stop: threading.Event) -> Any:
                g = generators[k % self.workers]
                if k == start and self.split:
                    _mark(marks, k, g)
                    made = self.split(indices, g, self.workers)
                    if made is not None:  # the epoch's first batch, drawn from its thread's generator, made by all
                        pieces, join = made
                        return Joined([pool.submit(self._piece, piece, indices)
                                       for pool, piece in zip(pools, pieces)], join)
                return pools[k % self.workers].submit(self._make, g, indices, stop, k, marks)

            yield from in_order(submit, batch_indices, self.prefetch, start)

    def states_before(self, position: int, marks: Marks) -> list[torch.Tensor]:
        """Each thread's generator state just before its first batch at or after ``position``."""
        if self._generators is None:
            raise ValueError("the reader threads have no random streams yet: no epoch has started")
        states = []
        with marks.lock:
            for w, g in enumerate(self._generators):
                state = marks.get(position + (w - position) % self.workers)
                states.append(state if state is not None else g.get_state())
        return states

    def _piece(self, piece: Callable[[], Any], indices: list) -> Any:
        try:
            return piece()
        except Exception as exc:
            _name_batch(exc, indices)
            raise

    def _make(self, generator: torch.Generator, indices: list, stop: threading.Event, k: int = 0,
              marks: Optional[Marks] = None) -> Any:
        if stop.is_set():
            return None
        _mark(marks, k, generator)
        try:
            batch = self.fetch(indices, generator)
        except Exception as exc:
            _name_batch(exc, indices)
            raise
        return batch


def _mark(marks: Optional[Marks], k: int, generator: torch.Generator) -> None:
    if marks is not None:
        with marks.lock:
            marks.record(k, generator.get_state())


def _name_batch(exc: Exception, indices: list) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        shown = indices if len(indices) <= 8 else [*indices[:8], "..."]
        exc.add_note(f"(in a colabfast.DataLoader reader thread, making the batch of indices {shown})")
