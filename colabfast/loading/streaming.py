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
import shutil
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np
from torch.utils.data import BatchSampler, SequentialSampler

from colabfast.datasets.dropins import through_subsets
from colabfast.datasets.stream import UNIT_SAMPLES, StreamCache, remove
from colabfast.errors import CacheLimitError, quoted
from colabfast.loading.sampler import BlockShuffleSampler
from colabfast.where._fileio import human_bytes, locked

__all__ = ["cache_folder", "choice", "clean", "discard", "known_order", "limit_for", "planned", "stream",
           "streams_of"]


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
    weakref.finalize(dataset, discard, Path(directory), os.getpid())  # the folder, once the dataset goes
    return out


def _readers(dataset: Any) -> list[Any]:
    readers = list(getattr(dataset, "_readers", {}).values())
    if getattr(dataset, "reader", None) is not None and dataset.reader not in readers:
        readers.append(dataset.reader)
    return readers


OWNER = ".owner"  # in each stream folder: locked by the process that uses it, for as long as it does
_held: dict[str, int] = {}  # folder -> the descriptor of its owner lock, in the process that made it


def cache_folder(stem: str) -> Path:
    """A new folder (mode 0700) for one dataset's stream caches, ``<work_dir>/.colabfast-stream/<stem>-<random>``,
    locked as this process's until :func:`discard`; the folders of processes gone (a kernel restarted, a
    ``kill -9``) are deleted first (:func:`clean`)."""
    import tempfile

    from colabfast.where import env

    root = env.work_dir() / ".colabfast-stream"
    root.mkdir(mode=0o700, exist_ok=True)
    clean()
    with locked(root / ".lock", "making a stream cache folder"):  # clean() never sees it without its lock
        folder = Path(tempfile.mkdtemp(prefix=f"{stem}-", dir=root))  # mode 0700, a name no other takes
        _held[str(folder)] = _lock(folder / OWNER)
    return folder


def clean() -> list[tuple[Path, int]]:
    """Delete the stream folders under ``<work_dir>/.colabfast-stream`` whose owner is gone: their lock is
    free (the kernel lets go of a process's locks as it ends, however it ends); never one a live process
    holds. Returns each folder deleted, with the bytes it took."""
    from colabfast.where import env

    root = env.work_dir() / ".colabfast-stream"
    out: list[tuple[Path, int]] = []
    if not root.is_dir():
        return out
    with locked(root / ".lock", "cleaning the stream cache folders"):
        for entry in os.scandir(root):
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False) or entry.path in _held:
                continue
            try:
                fd = _lock(Path(entry.path) / OWNER)  # a folder without one: its maker died making it
            except OSError:  # BlockingIOError: its owner lives; anything else: not ours to judge
                continue
            try:
                taken = 0
                for folder, _, names in os.walk(entry.path):
                    for name in names:
                        with contextlib.suppress(OSError):
                            taken += os.lstat(os.path.join(folder, name)).st_blocks * 512
                shutil.rmtree(entry.path, ignore_errors=True)
                out.append((Path(entry.path), taken))
            finally:
                os.close(fd)
    return out


def discard(folder: Path, owner: int) -> None:
    """Delete ``folder`` (made by :func:`cache_folder`) and let go of its lock, from process ``owner`` only."""
    if os.getpid() == owner:
        remove(Path(folder), owner)
        fd = _held.pop(str(folder), None)
        if fd is not None:
            os.close(fd)


def _lock(path: Path) -> int:
    """A descriptor holding ``flock(path)`` (made if missing); ``BlockingIOError`` while another holds it.
    ``flock`` itself, not ``filelock``: a torch worker forked from the owner shares the descriptor, and
    only a close by every holder, never an unlock from one, may let go of the lock."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def limit_for(folder: Path, cache_limit: Optional[int], drivefs: bool = False) -> tuple[int, str]:
    """``open_dataset``'s stream cache limit at ``folder``, and why: ``cache_limit`` where the local disk
    can hold it, else half the free space; both divided among torchrun's ``LOCAL_WORLD_SIZE`` ranks
    (each streams into a cache of its own). ``drivefs``: Drive's own cache takes as much again there.

    Raises:
        CacheLimitError: ``cache_limit`` is more than the free space (the message gives the most that
            fits), or ``LOCAL_WORLD_SIZE`` is not a whole number.
    """
    from colabfast.where import env

    value = os.environ.get("LOCAL_WORLD_SIZE", "").strip() or "1"
    try:
        ranks = max(1, int(value))
    except ValueError:
        raise CacheLimitError(f"LOCAL_WORLD_SIZE={quoted(value)} is not a whole number: torchrun sets it to the "
                              "number of processes on this machine. Unset it, or set it to that number") from None
    free = env.disk_free(folder)
    shared = f", shared by {ranks} local ranks" if ranks > 1 else ""
    if cache_limit is None:
        return free // 2 // ranks, "half the local disk's free space" + shared
    room = free // (2 if drivefs else 1) // ranks
    if cache_limit > room:
        drive = ", and Drive's own cache takes as much again" if drivefs else ""
        raise CacheLimitError(f"cache_limit={human_bytes(cache_limit)} is more than the local disk holds at "
                              f"{folder.parent}: {human_bytes(free)} free{shared}{drive}. Pass cache_limit={room} "
                              "or less, or none (half the free space)")
    return cache_limit, "cache_limit"


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
