"""Batches made in threads of the training process as worker processes would make them: :class:`ThreadWorkers`.

With a per-sample random transform on the CPU (a random crop and flip at least), a plain
``torch.utils.data.DataLoader`` makes each batch in a worker process and sends it back through shared
memory. Where colabfast can do that work in threads instead (:func:`colabfast.loading.reader.fused_for` says
when: the crop is fused with decoding by :mod:`colabfast.images.augment`, whose heavy parts release the GIL),
:class:`ThreadWorkers` deals the batches out as torch deals them to its workers and gives each thread
the random stream its worker would have, so the loader yields exactly the same batches as with
``num_workers`` worker processes: no worker start (seconds on Colab), no pickling, no shared-memory
batches.

Thread ``w`` makes batch ``k`` when ``k % workers == w`` (torch's in-order loader deals them out so), one
batch after another, drawing from a ``torch.Generator`` seeded as worker ``w`` seeds torch's
(``base_seed + w``, ``torch/utils/data/_utils/worker.py``), the base seed drawn from the loader's
``generator`` as torch draws it: once for the loader's life (as persistent workers keep their streams),
or each epoch with ``persistent_workers=False``. Nothing touches torch's global generator, which the
training loop may be drawing from at the same time.
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
    """Run this thread's torch ops on one core, as torch's workers do (``torch.set_num_threads(1)``).

    ATen's OpenMP backend keeps the number per thread (OpenMP's ``nthreads-var`` of the calling thread),
    so the reader threads run their kernels serially while the training thread keeps its own; two
    reader threads each starting a team of intra-op threads on 2 CPUs ran no faster than one.
    """
    torch.get_num_threads()  # this thread's own lazy initialisation first (it would take the default set next)
    torch.set_num_threads(1)


_OPENMP = "OpenMP" in torch.__config__.parallel_info()


def in_order(submit: Callable[[int, list, threading.Event], Future], batch_indices: Iterable[Sequence[int]],
             prefetch: int, start: int = 0) -> Iterator[Any]:
    """The results of ``submit(k, indices, stop)`` for each batch ``k`` of ``batch_indices`` (counted
    from ``start``), in order, submitted ``prefetch`` ahead of the one handed out. A consumer that stops
    early, or a batch that fails, cancels what is queued and sets ``stop`` for work already running."""
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
    """Pieces of one batch made by several threads, as one pending batch for :func:`in_order`:
    :meth:`result` waits for every piece and joins them (in the caller's thread); :meth:`cancel`
    cancels the pieces not started."""

    def __init__(self, pieces: list[Future], join: Callable[[list], Any]) -> None:
        self.pieces, self.join = pieces, join

    def result(self) -> Any:
        return self.join([piece.result() for piece in self.pieces])

    def cancel(self) -> bool:
        return all([piece.cancel() for piece in self.pieces])


def base_seed(generator: Optional[torch.Generator]) -> int:
    """The base seed of an epoch's workers, drawn from ``generator`` (None: torch's global generator) as
    torch's ``_BaseDataLoaderIter`` draws it."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def worker_generators(base_seed: int, workers: int) -> list[torch.Generator]:
    """CPU generators in the states torch's ``DataLoader`` workers ``0 .. workers - 1`` start from: worker
    ``w`` calls ``torch.manual_seed(base_seed + w)``."""
    return [torch.Generator().manual_seed(base_seed + w) for w in range(workers)]


class ThreadWorkers:
    """Batches made by ``fetch`` in ``workers`` threads, each standing in for one worker process.

    Args:
        fetch: ``(indices, generator) -> batch``, what a worker does for one batch (read, decode,
            transform, collate), drawing from ``generator``.
        workers: threads; batch ``k`` is made by thread ``k % workers``, one after another.
        prefetch: batches made ahead of the one handed out (torch's ``prefetch_factor * num_workers``).
        persistent: keep each thread's random stream from epoch to epoch (torch's
            ``persistent_workers=True``); False draws a new base seed each epoch.
        generator: where the base seed is drawn from (the loader's ``generator``; None: torch's global).
        split: ``(indices, generator, parts)`` -> ``(pieces, join)`` or None
            (:meth:`colabfast.loading.reader.BatchReader.split`): each epoch's first batch, its random numbers
            drawn from thread 0's generator as thread 0 would draw them, is made by every thread at
            once, so the training loop gets it sooner; the batches are the same.

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
        """The batches for ``batch_indices`` (e.g. a ``BatchSampler``), in order, ``prefetch`` ahead.

        Args:
            seed: the workers' base seed drawn already (resuming: the one the epoch began with), else drawn
                here as torch does.
            start: the epoch's position of the first batch (resuming an epoch, the batches before it
                left out of ``batch_indices``): batch ``k`` is still made by thread ``k % workers``.
            states: the threads' generator states to start from (:meth:`states_before`), instead of
                seeding them; nothing is drawn.
            marks: where each thread records its generator's state as it begins a batch
                (:class:`~colabfast.loading.resume.Marks`), for :meth:`states_before`.
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
        """Each thread's generator state just before the first batch at or after ``position`` it makes
        (batch ``k`` by thread ``k % workers``): recorded in ``marks`` if it has begun that batch, else
        the generator's current state, which that batch has not drawn from yet."""
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
    """Record ``generator``'s state before batch ``k`` draws from it (see :class:`Marks`)."""
    if marks is not None:
        with marks.lock:
            marks.record(k, generator.get_state())


def _name_batch(exc: Exception, indices: list) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        shown = indices if len(indices) <= 8 else [*indices[:8], "..."]
        exc.add_note(f"(in a colabfast.DataLoader reader thread, making the batch of indices {shown})")
