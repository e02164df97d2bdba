"""How :class:`colabfast.DataLoader` drives the stream caches of a streamed mirror
(:mod:`colabfast.datasets.stream`): each epoch's read order given to them before the epoch starts, and
its progress as batches come out of the readers.

The order is known ahead without drawing from any random stream, so an epoch streamed reads the
same batches as the same epoch staged: a :class:`colabfast.BlockShuffleSampler`'s ``order(epoch)``
(what :class:`colabfast.DataLoader` uses for ``shuffle=True`` on a mirror), a ``SequentialSampler``'s
``0 .. n-1``, or the explicit batches of a resumed epoch. Any other sampler's order is drawn as the
epoch runs: its reads then go to the mount directly, with no cache (``loader.choices`` says so).
"""

from __future__ import annotations

import contextlib
import functools
import os
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np
from torch.utils.data import BatchSampler, SequentialSampler

from colabfast.datasets.dropins import through_subsets
from colabfast.datasets.stream import UNIT_SAMPLES, StreamCache, remove
from colabfast.loading.sampler import BlockShuffleSampler
from colabfast.where._fileio import human_bytes

__all__ = ["cache_folder", "choice", "default_limit", "known_order", "planned", "stream", "streams_of"]


def known_order(loader: Any, later: int = 0) -> Optional[Callable[[], np.ndarray]]:
    """A function giving the dataset indices (int64) the loader's next epoch reads in order, where its
    sampler says them ahead without drawing; None otherwise. ``later=1``: the epoch after that one's,
    as far as it can be told now (a ``BlockShuffleSampler`` at the next ``epoch``, which is what it
    takes by itself and what a loop calling ``set_epoch`` gives it). The epoch is the sampler's now;
    the order is computed when called (a block shuffle of ImageNet's 1.28 million takes 0.5 s)."""
    batch_sampler = loader.batch_sampler
    if type(batch_sampler) is not BatchSampler:  # a caller's batch sampler: its grouping is its own
        return None
    sampler = batch_sampler.sampler
    if isinstance(sampler, BlockShuffleSampler):
        epoch = sampler.epoch + later

        def order() -> np.ndarray:
            return sampler.order(epoch)
    elif type(sampler) is SequentialSampler:
        n = len(sampler)

        def order() -> np.ndarray:
            return np.arange(n, dtype=np.int64)
    else:
        return None
    size, drop = batch_sampler.batch_size, batch_sampler.drop_last

    def ordered() -> np.ndarray:
        out = order()
        return out[: len(out) // size * size] if drop else out

    return ordered


def choice(loader: Any, dataset: Any) -> Optional[tuple[str, str]]:
    """``loader.choices["stream"]`` for a loader of a streamed ``dataset``: what its caches do, and why;
    None for a dataset that does not stream."""
    streams = streams_of(dataset)
    if not streams:
        return None
    limit = human_bytes(sum(s.limit for s in streams))
    if known_order(loader) is not None:
        return (f"fetched ahead, at most {limit}", f"{type(loader.batch_sampler.sampler).__name__} says each epoch's "
                "order before it starts: its blocks are fetched in that order and deleted once read")
    return ("read from the mount", "the sampler draws its order as the epoch runs (not a BlockShuffleSampler or "
            "sequential): no block can be fetched ahead; pass shuffle=True or sampler=BlockShuffleSampler(dataset)")


def planned(loader: Any, dataset: Any, batch_indices: Optional[Iterable], batches: Callable[[], Iterator]) -> Iterator:
    """``batches()`` (the epoch's host batches, from the readers of ``dataset``, the loader's own under any
    wrapper of the loader's) with the dataset's stream caches told
    the epoch's plan first and each batch's progress as it comes out; ``batches`` unchanged for a
    dataset that does not stream. ``batch_indices``: the epoch's batches where given (a resumed
    epoch's rest, empty placeholders included), else the loader's sampler's. Closing or dropping the
    iterator returned before its end (a ``break``, an exception, ``next(iter(loader))``) leaves the plan."""
    streams = streams_of(dataset)
    if not streams:
        return batches()
    then: Optional[Callable[[], np.ndarray]] = None  # the next epoch's positions: its first blocks fetched ahead
    if isinstance(batch_indices, list):
        lists = [b for b in batch_indices if len(b)]
        indices = np.asarray([i for b in lists for i in b], dtype=np.int64)
        which = np.repeat(np.arange(len(lists), dtype=np.int64), [len(b) for b in lists])
    elif batch_indices is None and (order := known_order(loader)) is not None:
        indices = order()
        which = np.arange(len(indices), dtype=np.int64) // loader.batch_size
        if (after := known_order(loader, later=1)) is not None:  # computed by a fetch thread, once it gets there
            then = functools.partial(_positions_of, dataset, after)
    else:
        for s in streams:
            s.start([], [])  # no plan: every read goes to the mount
        return batches()
    positions = _positions(dataset, indices)
    sampler = getattr(loader.batch_sampler, "sampler", None)
    block = sampler.block_size if isinstance(sampler, BlockShuffleSampler) else None
    unit = min(block, UNIT_SAMPLES) if block is not None else UNIT_SAMPLES  # each unit one stretch of the order
    plans = [(s, s.start(positions, which, unit=unit, then=then)) for s in streams]
    return _Advancing(batches(), plans)


def _positions_of(dataset: Any, order: Callable[[], np.ndarray]) -> np.ndarray:
    return _positions(dataset, order())


def _positions(dataset: Any, indices: np.ndarray) -> np.ndarray:
    inner, mapping = through_subsets(dataset)
    if mapping is not None:
        indices = mapping[indices]
    at = getattr(getattr(inner, "reader", None), "positions", None)
    return indices if at is None else at[indices]


def streams_of(dataset: Any) -> list[StreamCache]:
    """The stream caches of ``dataset``'s mirror readers (through ``Subset`` wrappers); [] for a dataset
    that does not stream."""
    out: list[StreamCache] = []
    for r in _readers(through_subsets(dataset)[0]):
        s = getattr(r, "stream", None)
        if s is not None and s not in out:
            out.append(s)
    return out


def stream(dataset: Any, limit: int, directory: Path, unit: int = UNIT_SAMPLES,
           source: Optional[Any] = None) -> list[StreamCache]:
    """Make ``dataset`` (a mirror drop-in, or a ``Subset`` of one) read its image data through stream
    caches in ``directory``: one per image column, sharing ``limit`` bytes in proportion to their data;
    fetched from ``source`` (:class:`~colabfast.datasets.streamsource.RemoteSource`), default the dataset's
    file itself (:class:`~colabfast.datasets.streamsource.MountSource`).

    Raises:
        CacheLimitError: a column's share cannot hold its largest block of ``unit`` samples.
    """
    readers = [r for r in _readers(through_subsets(dataset)[0]) if int(r.offsets[-1]) > 0 and r.blob is None]
    total = sum(int(r.offsets[-1]) for r in readers)
    out = []
    for k, r in enumerate(readers):
        share = limit if len(readers) == 1 else limit * int(r.offsets[-1]) // total
        r.stream = StreamCache(r, Path(directory) / f"column-{k}", share, unit, source)
        out.append(r.stream)
    weakref.finalize(dataset, remove, Path(directory), os.getpid())  # the folder, once the dataset goes
    return out


def _readers(dataset: Any) -> list[Any]:
    readers = list(getattr(dataset, "_readers", {}).values())
    if getattr(dataset, "reader", None) is not None and dataset.reader not in readers:
        readers.append(dataset.reader)
    return readers


def cache_folder(stem: str) -> Path:
    """A new folder for one dataset's stream caches, ``<work_dir>/.colabfast-stream/<stem>-<random>``."""
    import tempfile

    from colabfast.where import env

    root = env.work_dir() / ".colabfast-stream"
    root.mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{stem}-", dir=root))


def default_limit(folder: Path) -> tuple[int, str]:
    """``open_dataset``'s ``cache_limit`` when none is given, and why: half the free space where ``folder``
    is, divided among torchrun's ``LOCAL_WORLD_SIZE`` ranks (each streams into a cache of its own)."""
    from colabfast.where import env

    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return (env.disk_free(folder) // 2 // ranks,
            "half the local disk's free space" + (f", shared by {ranks} local ranks" if ranks > 1 else ""))


class _Advancing:
    """``batches``, telling each stream cache of ``plans`` (with its plan's number) each batch read. Ended,
    closed, dropped (even unstarted: the plan started with the iterator) or failed, it leaves the plans:
    before the last batch, so that no fetch thread waits for room that no batch will free."""

    def __init__(self, batches: Iterator, plans: list[tuple[StreamCache, int]]) -> None:
        self._batches, self._plans, self._read = batches, plans, 0

    def __iter__(self) -> Iterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._batches)
        except BaseException:  # the end (StopIteration) too: reads outside the loop go to the mount
            self.close()
            raise
        self._read += 1
        for s, _ in self._plans:
            s.advance(self._read)  # batches 0 .. read-1 are read: what only they read can go
        return batch

    def _leave(self) -> None:
        plans, self._plans = self._plans, []
        for s, plan in plans:
            s.leave(plan)

    def close(self) -> None:
        self._leave()  # first: the reader threads that close() waits for may wait for a block of the plan
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit, what leave() uses may be gone already
            self._leave()  # the readers close as they are dropped (in any thread: nothing is waited for here)
