"""Reading a mirror on a slow mount (Drive) through a bounded local cache: :class:`StreamCache`.

The mirror's image data is fetched ahead of the loop in units of ``unit`` stored samples, along the
epoch's read order, into local files that never take more than ``cache_limit`` bytes; each unit is
deleted once the epoch is past it. How it works (plans, eviction, DriveFS, failures): docs/streaming.md.
Same idea as MosaicML Streaming's ``cache_limit``
(https://docs.mosaicml.com/projects/streaming/en/stable/dataset_configuration/shard_retrieval.html).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import shutil
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from colabfast.datasets.streamsource import MountSource
from colabfast.errors import CacheLimitError, Error, MirrorError, MountError, NotEnoughSpace
from colabfast.where._fileio import human_bytes

__all__ = ["FETCHERS", "NEXT_UNITS", "UNIT_SAMPLES", "StreamCache"]

UNIT_SAMPLES = 64  # stored samples per unit: BlockShuffleSampler's default block
FETCHERS = 4  # fetch threads: each a stream of large reads, so the mount's per-request latency overlaps
# Units of the next epoch fetched ahead once this epoch's are all claimed: enough for its first batches
NEXT_UNITS = 2 * FETCHERS
PIECE = 8 << 20  # bytes per read of a unit from the mount
WAIT = 0.002  # seconds between looks for a unit, in worker processes (threads wait on an event)
PATIENCE = 600.0  # seconds a worker waits for one unit before it gives up (the fetch threads stopped)


class StreamCache:
    """The local cache one :class:`~colabfast.datasets.mirrorreader.MirrorReader` reads its mirror's image
    data through (see the module's docstring).

    Args:
        reader: the mirror's reader (its path, data offset, sample offsets and file version).
        directory: a folder of its own on local storage, made here and deleted with the cache.
        limit: bytes the cache's files may take at most.
        unit: stored samples per unit.

    Raises:
        CacheLimitError: ``limit`` is smaller than the largest unit.
    """

    def __init__(self, reader: Any, directory: Path, limit: int, unit: int = UNIT_SAMPLES,
                 source: Optional[Any] = None):
        self.path, self.data_offset = Path(reader.path), int(reader.data_offset)
        self.source = source if source is not None else MountSource(self.path, reader._version)
        self.directory, self.limit, self.unit = Path(directory), int(limit), int(unit)
        self.offsets = np.asarray(reader.offsets, dtype=np.int64)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.page = _page(self.directory)
        self._set_unit(self.unit)
        largest = int(self.disk.max()) + self.overhead if len(self.sizes) else 0
        if self.limit < largest:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise CacheLimitError(f"cache_limit={human_bytes(self.limit)} cannot hold one block of {self.unit} samples "
                                  f"of {self.source.name} (the largest takes {human_bytes(largest)} on local disk): "
                                  f"pass cache_limit={largest} or more (a few times that lets the cache fetch ahead)")
        self._owner = os.getpid()
        self._init_local()
        self._finalizer: Optional[weakref.finalize] = weakref.finalize(self, _release, self.directory, self._owner,
                                                                       self._handles, self.source)
        # One handle opened now, while the dataset and its loader are made: the first epoch's first block
        # then starts over the link at once, without an open's round trip in the first batch's wait.
        self._warming = threading.Thread(target=self._warm, daemon=True, name="colabfast-stream-open")
        self._warming.start()
        self.fetched = 0  # bytes fetched from the mount by this process's threads, all epochs
        self.peak = 0  # most bytes the cache's files took at once (this process's account)
        self.plan_bytes = 0  # what the current plan fetches

    def _set_unit(self, unit: int) -> None:
        n = len(self.offsets) - 1
        self.unit = unit
        self.bounds = self.offsets[np.r_[np.arange(0, n, unit), n]] if n else self.offsets[:1].copy()
        self.sizes = np.diff(self.bounds)
        # What the limit counts: the disk each unit's file takes (whole pages), and the plan's file.
        self.disk = -(-self.sizes // self.page) * self.page
        # plan.npy (a byte a unit and a header), twice: the next one is written beside it, then renamed
        self.overhead = 2 * -(-(len(self.sizes) + 128) // self.page) * self.page

    def _init_local(self) -> None:
        """The state that stays in the process that made it (threads, locks), fresh after unpickling."""
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._present: dict[int, int] = {}  # unit -> its last batch in the plan
        self._expiry: list[tuple[int, int]] = []  # heap of (last batch, unit) of the units present
        self._planned = np.zeros(len(self.sizes), dtype=bool)
        self._fetch: np.ndarray = np.zeros(0, dtype=np.int64)
        self._last: np.ndarray = np.zeros(0, dtype=np.int64)
        self._next = 0  # next position in _fetch to claim
        self._then: np.ndarray = np.zeros(0, dtype=np.int64)  # units the next epoch fetches first (a guess)
        self._then_from: Optional[Callable[[], Any]] = None  # what gives _then's positions, until a thread asks
        self._then_busy = False  # a fetch thread is computing _then
        self._then_next = 0  # next position in _then to claim, once _fetch is all claimed
        self._pinned: set[int] = set()  # units on disk for the next epoch: advance() leaves them
        self._fetching_now: set[int] = set()  # units being fetched
        self._handles: list[Any] = []  # open handles on the source that no fetch thread holds now
        self._closed = False
        self._trash: list[int] = []  # units read for the last time, whose files are yet to be deleted
        self._running = 0  # fetch threads that will look at _trash again
        self._used = 0  # bytes of the units present or being fetched
        self._done = 0  # batches read (advance)
        self._error: Optional[BaseException] = None
        self._since_refresh = 0  # bytes fetched since Drive's own cache was last dropped
        self._drivefs = False  # the mirror is on DriveFS (Colab's Drive client), whose cache is dropped
        self._refreshing = self._refresher = False
        self._inflight = 0  # units being fetched
        self._warned = False
        self._plan_mtime = -1
        self._plans = 0  # plans started or left: start() returns the number, leave() takes it
        self._total = 0  # batches in the plan

    def __getstate__(self) -> dict:
        keep = ("path", "data_offset", "source", "directory", "limit", "unit", "offsets", "bounds", "sizes", "disk",
                "overhead", "page", "_owner")
        return {k: vars(self)[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._finalizer = None  # the folder is the owner's to delete
        self._init_local()
        self.fetched = self.peak = self.plan_bytes = 0

    # --- the owner: plans and fetch threads ------------------------------------------------------

    def start(self, order: Any, batches: Any, unit: Optional[int] = None,
              then: Optional[Callable[[], Any]] = None) -> int:
        """Plan an epoch and start fetching; units already cached that the plan fetches first are kept.

        Args:
            order: int64 ``[M]``, the stored positions in the order they will be read.
            batches: int64 ``[M]``, the batch each is read in, non-decreasing from 0.
            unit: stored samples per unit from now on (the sampler's block, where smaller).
            then: a function giving the next epoch's likely stored positions (int64), in order; once
                this plan is claimed the threads fetch its first :data:`NEXT_UNITS` units.

        Returns:
            the plan's number, for :meth:`leave`.

        Raises:
            CacheLimitError: the limit cannot hold the units that are live (read before and after) at
                some batch: the message gives the smallest limit that works.
        """
        self.stop()
        if unit is not None and unit != self.unit:
            self._set_unit(int(unit))
        self._owner = os.getpid()  # the process that plans fetches (feed="process": the feed's subprocess)
        positions: np.ndarray = np.asarray(order, dtype=np.int64)
        batches = np.asarray(batches, dtype=np.int64)
        units = positions // self.unit
        count = len(self.sizes)
        first = np.full(count, -1, dtype=np.int64)
        last = np.full(count, -1, dtype=np.int64)
        at = np.arange(len(positions), dtype=np.int64)
        first[units[::-1]] = at[::-1]  # numpy keeps the last write: the earliest use
        last[units] = batches  # the latest batch
        used = np.flatnonzero(first >= 0)
        fetch = used[np.argsort(first[used], kind="stable")]
        if len(positions):
            # the bytes live at each batch (first use <= batch <= last use): fetching in first-use order and
            # deleting after the last use never waits forever when the limit holds the most live at once
            live = np.zeros(int(batches[-1]) + 2, dtype=np.int64)
            np.add.at(live, batches[first[used]], self.disk[used])
            np.add.at(live, last[used] + 1, -self.disk[used])
            need = int(np.cumsum(live).max()) + self.overhead
            if need > self.limit:
                size = int(np.bincount(batches).max())
                bound = max(need, self.smallest_limit(size))
                raise CacheLimitError(f"cache_limit={human_bytes(self.limit)} cannot hold what this epoch reads "
                                      f"from {self.source.name} at once ({human_bytes(need)} in blocks of {self.unit} "
                                      f"samples read before and after one batch): pass cache_limit={bound} or more, "
                                      "or a smaller batch_size. A mirror packed without shuffle=True is read in blocks "
                                      "of 1, samples from all over the file: pack it with shuffle=True to stream it")
        # kept: cached units among the first the plan fetches, within the limit (fetched at once anyway)
        prefix = self._first(fetch)
        cached = self._cached()
        keep = set(cached) & set(prefix.tolist())
        for u in cached:
            if u not in keep:
                _unlink(self._file(u))
        for name in os.listdir(self.directory):
            if name.startswith("."):  # a partial unit or plan of an earlier run
                _unlink(self.directory / name)
        with self._cond:
            self._fetch, self._last = fetch, last
            self._present = {u: int(last[u]) for u in keep}
            self._expiry = sorted((b, u) for u, b in self._present.items())  # a sorted list is a heap
            self._used = int(self.disk[list(keep)].sum()) if keep else 0
            self._next, self._done, self._error, self._trash = 0, 0, None, []
            self._then, self._then_from, self._then_busy = np.zeros(0, dtype=np.int64), then, False
            self._then_next, self._pinned = 0, set()
            self._planned = np.zeros(count, dtype=bool)  # a new array: a read waits only for its own plan's units
            self._planned[used] = True
            self.plan_bytes = int(self.sizes[fetch].sum()) - (int(self.sizes[list(keep)].sum()) if keep else 0)
            self._plans, self._total = self._plans + 1, int(batches[-1]) + 1 if len(batches) else 0
            self._cond.notify_all()  # reads waiting for the last plan's units read them directly now
        _write_atomically(self.directory / "plan.npy", lambda f: np.save(f, self._planned))
        from colabfast.where import env

        self._drivefs = isinstance(self.source, MountSource) and env.drive_kind(self.path) == "drivefs"
        _unlink(self.directory / "error.txt")
        self._stop = threading.Event()
        self._running = FETCHERS
        self._threads = [threading.Thread(target=self._fetching, args=(self._stop,), daemon=True,
                                          name=f"colabfast-stream-{k}") for k in range(FETCHERS)]
        for t in self._threads:
            t.start()
        return self._plans

    def leave(self, plan: int) -> None:
        """End plan number ``plan`` (:meth:`start`'s), where no later plan replaced it: its epoch's iterator
        ended, or was closed or dropped (this may run in any thread, from the garbage collector). Every
        read goes to the mount from now on, as without a plan; left before its last batch was read, the
        fetch threads stop too (not waited for here), else they go on with the next epoch's first units."""
        empty = np.zeros(len(self.sizes), dtype=bool)
        with self._cond:
            if plan != self._plans:
                return
            if self._done < self._total:  # no batch will free the room the threads wait for
                self._stop.set()
            self._planned, self._plans = empty, self._plans + 1
            self._cond.notify_all()
        tmp = self.directory / f".plan.npy.{os.getpid()}.left"  # not start()'s name: it may run meanwhile
        with contextlib.suppress(OSError):  # for worker processes (none left: the dataset and its folder are gone)
            with open(tmp, "wb") as f:
                np.save(f, empty)
            os.replace(tmp, self.directory / "plan.npy")

    def _first(self, units: np.ndarray) -> np.ndarray:
        """The first of ``units`` (in fetch order) that the limit holds together."""
        return units[np.cumsum(self.disk[units]) <= self.limit - self.overhead]

    def smallest_limit(self, batch_size: int) -> int:
        """The smallest ``limit`` that holds what a batch of ``batch_size`` consecutive samples of any
        epoch's order reads: the largest units such a batch can touch (every unit is one stretch of the
        order, ``unit`` long but the last)."""
        touched = min(len(self.sizes), 3 + (max(batch_size, 1) - 1) // self.unit)
        return int(np.sort(self.disk)[::-1][:touched].sum()) + self.overhead

    def advance(self, done: int) -> None:
        """``done`` batches of the plan have been read: delete the units no later batch reads.

        The files are deleted by a fetch thread where one runs (it frees the room it waits for), else
        here: the training thread that calls this makes no system call then. A system call gives up
        the GIL, and taking it back waits for the reader threads' switch interval (5 ms)."""
        with self._cond:
            self._done = max(self._done, done)
            while self._expiry and self._expiry[0][0] < self._done:
                _, u = heapq.heappop(self._expiry)
                if self._present.pop(u, None) is not None and u not in self._pinned:  # pinned: the next epoch's
                    self._trash.append(u)
            if not self._trash:
                return
            if self._running:
                self._cond.notify_all()
                return
            trash, self._trash = self._trash, []
        self._empty(trash)

    def _empty(self, trash: list[int]) -> None:
        """Delete the units in ``trash`` (no longer present), then count their room free."""
        for u in trash:
            _unlink(self._file(u))
        with self._cond:
            self._used -= int(self.disk[trash].sum())
            self._cond.notify_all()

    def stop(self) -> None:
        """Stop the fetch threads (the files stay, for :meth:`start` to keep or delete)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []

    def close(self) -> None:
        """Stop fetching, let go of the source, and delete the cache folder."""
        with self._cond:
            self._closed = True
        self.stop()
        if self._finalizer is not None:
            self._finalizer()
        else:
            _release(self.directory, -1, self._handles, self.source)  # a copy's handles (feed="process")

    def _plan_next(self, then: Callable[[], Any]) -> None:
        """Compute the next epoch's first units from ``then`` (outside the lock); none where it fails: a
        guess that cannot be made is no error of this epoch's."""
        try:
            units = self._first(_first_uses(np.asarray(then(), dtype=np.int64) // self.unit))[:NEXT_UNITS]
        except Exception:  # noqa: BLE001
            units = np.zeros(0, dtype=np.int64)
        with self._cond:
            self._then, self._then_busy = units, False
            self._cond.notify_all()

    def _warm(self) -> None:
        try:
            handle = self.source.open()
        except Exception:  # noqa: BLE001 (a fetch thread opens again, and reports what fails)
            return
        with self._cond:
            if not self._closed and not self._refreshing:
                self._handles.append(handle)
                return
        self.source.close(handle)

    def _fetching(self, stop: threading.Event) -> None:
        handle, running = None, True
        try:
            while True:
                trash, refresh, then = [], False, None
                with self._cond:
                    while True:
                        if stop.is_set():
                            return
                        if self._trash:  # deleted outside the lock: readers and advance() go on meanwhile
                            trash, self._trash = self._trash, []
                            break
                        if self._refreshing or (self._drivefs and self._since_refresh >= self.limit):
                            self._refreshing = True  # every fetch thread lets go of the mount first
                            if handle is not None:
                                self.source.close(handle)
                                handle = None
                            while self._handles:
                                self.source.close(self._handles.pop())
                            if self._inflight == 0 and not self._refresher:
                                self._refresher, refresh = True, True
                                break
                            self._cond.wait(0.5)
                            continue
                        if self._next < len(self._fetch):
                            u, ahead = int(self._fetch[self._next]), False
                            if u in self._present:  # kept from the last epoch
                                self._next += 1
                                continue
                        elif self._then_from is not None:  # this plan's all claimed: what the next epoch reads first
                            then, self._then_from, self._then_busy = self._then_from, None, True
                            break
                        elif self._then_busy:
                            self._cond.wait(0.5)
                            continue
                        elif self._then_next < len(self._then):  # the next epoch's first units
                            u, ahead = int(self._then[self._then_next]), True
                            if u in self._present or u in self._fetching_now or u in self._pinned:
                                self._pinned.add(u)  # this epoch's copy stays for the next
                                self._then_next += 1
                                continue
                        else:
                            self._running -= 1  # under the lock that saw _trash empty: advance() deletes now
                            running = False
                            return
                        if self._used + int(self.disk[u]) > self.limit - self.overhead:
                            self._cond.wait(0.5)  # until advance() deletes what the epoch is past
                            continue
                        if ahead:
                            self._then_next += 1
                        else:
                            self._next += 1
                        self._used += int(self.disk[u])
                        self._inflight += 1
                        self._fetching_now.add(u)
                        if handle is None and self._handles:
                            handle = self._handles.pop()
                        break
                if trash:
                    self._empty(trash)
                    continue
                if then is not None:
                    self._plan_next(then)
                    continue
                if refresh:
                    try:
                        self._drop_drive_cache()
                    finally:
                        with self._cond:
                            self._since_refresh, self._refreshing, self._refresher = 0, False, False
                            self._cond.notify_all()
                    continue
                try:
                    if handle is None:
                        handle = self.source.open()
                    self._fetch_unit(handle, u)
                finally:
                    with self._cond:
                        self._inflight -= 1
                        self._fetching_now.discard(u)
                with self._cond:
                    if ahead:
                        self._pinned.add(u)
                    else:
                        self._present[u] = int(self._last[u])
                        heapq.heappush(self._expiry, (int(self._last[u]), u))
                    self.peak = max(self.peak, self._used + self.overhead)
                    self._cond.notify_all()
                if not ahead and self._done > self._last[u]:  # the epoch is past it already (read directly)
                    self.advance(self._done)
        except BaseException as exc:  # noqa: BLE001 (handed to the readers waiting for units)
            if handle is not None:
                self.source.close(handle)
                handle = None
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            said = f"{type(exc).__name__}: {exc}".encode()
            with contextlib.suppress(OSError):
                _write_atomically(self.directory / "error.txt", lambda f: f.write(said))
        finally:
            with self._cond:
                if running:
                    self._running -= 1
                if handle is not None:  # kept open for the next epoch's threads: an open is a round trip
                    self._handles.append(handle)
                if not self._running and self._trash:
                    trash, self._trash = self._trash, []
                else:
                    trash = []
            if trash:
                self._empty(trash)

    def _fetch_unit(self, handle: Any, u: int) -> None:
        start, end = int(self.bounds[u]), int(self.bounds[u + 1])
        target, part = self._file(u), self.directory / f".u{self.unit}-{u}.part"
        buffer = bytearray(min(PIECE, max(end - start, 1)))
        with self._created(part) as out:
            pos = start
            while pos < end:
                view = memoryview(buffer)[: min(PIECE, end - pos)]
                n = self.source.read(handle, view, self.data_offset + pos)
                out.write(view[:n])
                pos += n
        self.source.forget(handle, self.data_offset + start, end - start)
        if self.source.changed(self.data_offset + end):
            _unlink(part)
            raise self.source.changed_error()
        os.replace(part, target)
        with self._cond:
            self.fetched += end - start
            self._since_refresh += end - start

    @contextlib.contextmanager
    def _created(self, part: Path) -> Iterator[Any]:
        """A unit's file ``part`` made anew (:func:`_create`); the local disk filling up while it is
        written is :class:`~colabfast.errors.NotEnoughSpace` naming the folder (the partial file deleted)."""
        try:
            with _create(part) as out:
                yield out
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or isinstance(exc, Error):
                raise
            _unlink(part)
            raise NotEnoughSpace(errno.ENOSPC, f"{self.directory}: the local disk filled up while streaming "
                                 f"{self.source.name} into this cache ({human_bytes(self._used)} of its "
                                 f"cache_limit={human_bytes(self.limit)} in use): something else writes to that disk. "
                                 "Free space there, or open the dataset again with a smaller cache_limit") from None

    def _drop_drive_cache(self) -> None:
        from colabfast.where import env

        if env.drive_kind(self.path) != "drivefs":
            return
        from colabfast.drive.mounting import refresh_drive
        from colabfast.errors import DriveError

        try:
            refresh_drive(self.path, quiet=True)
        except DriveError as exc:
            if not self._warned:
                self._warned = True
                warnings.warn(f"streaming {self.path}: Drive's own cache could not be dropped ({exc}); it may fill "
                              "the disk with what was streamed. Close other files open on Drive.", stacklevel=2)

    # --- every process: reads ----------------------------------------------------------------------

    def read(self, pieces: Sequence[np.ndarray], starts: Sequence[int],
             direct: Callable[[np.ndarray, int], None]) -> None:
        """Fill each 1-D uint8 ``pieces[k]`` with image data bytes from ``starts[k]`` on (offsets into the
        image data, as :meth:`MirrorReader.read_ranges` takes them): from the cached units, waiting for
        those the plan has yet to fetch; ``direct(piece, start)`` reads what no planned unit holds.

        Raises:
            OSError, MirrorError: the fetch of a unit this read waits for failed (its error).
        """
        later: list[tuple[np.ndarray, int, int]] = []
        planned = self._plan()
        fds: dict[int, int] = {}  # a unit's file, opened once per call (a batch reads a few units)
        try:
            self._read(pieces, starts, direct, planned, later, fds)
        finally:
            for fd in fds.values():
                os.close(fd)

    def _read(self, pieces: Sequence[np.ndarray], starts: Sequence[int], direct: Callable[[np.ndarray, int], None],
              planned: np.ndarray, later: list, fds: dict[int, int]) -> None:
        count = len(self.sizes)
        units = np.searchsorted(self.bounds, np.asarray(starts, dtype=np.int64), side="right") - 1  # one call
        for piece, start, u in zip(pieces, starts, units.tolist()):
            n, at = len(piece), 0
            while at < n:  # a piece runs on into the next units (they are contiguous)
                b = int(start) + at
                if u < 0 or u >= count:
                    direct(piece[at:], b)  # outside the image data (another column's bytes)
                    break
                k = min(n - at, int(self.bounds[u + 1]) - b)
                part = piece[at : at + k]
                if not planned[u]:
                    self._direct(part, b, direct)
                elif not self._read_cached(part, u, b, fds):
                    later.append((part, u, b))
                at, u = at + k, u + 1
        for part, u, b in later:
            self._wait(u, planned)
            if not self._read_cached(part, u, b, fds):
                self._direct(part, b, direct)  # deleted since it arrived: the plan changed under a stray read

    def _direct(self, part: np.ndarray, b: int, direct: Callable[[np.ndarray, int], None]) -> None:
        """Image data bytes from ``b`` on into ``part``, from the source itself: the mirror's file through
        ``direct`` (its reader's retrying read), or a remote one through a handle of this call's own."""
        if isinstance(self.source, MountSource):
            direct(part, b)
            return
        handle, view, done = self.source.open(), memoryview(part).cast("B"), 0  # type: ignore[arg-type]
        try:
            while done < len(view):
                done += self.source.read(handle, view[done:], self.data_offset + b + done)
        finally:
            self.source.close(handle)

    def _plan(self) -> np.ndarray:
        if os.getpid() == self._owner:
            return self._planned
        try:
            mtime = os.stat(self.directory / "plan.npy").st_mtime_ns
            if mtime != self._plan_mtime:
                planned = np.load(self.directory / "plan.npy")
                if len(planned) != len(self.sizes):  # units of another size than this copy's: read directly
                    planned = np.zeros(len(self.sizes), dtype=bool)
                self._planned, self._plan_mtime = planned, mtime
        except (OSError, ValueError):
            pass  # no plan yet: every read is direct
        return self._planned

    def _read_cached(self, part: np.ndarray, u: int, b: int, fds: dict[int, int]) -> bool:
        fd = fds.get(u)
        if fd is None:
            try:
                fd = fds[u] = os.open(self._file(u), os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                return False
        view, at = memoryview(part).cast("B"), b - int(self.bounds[u])  # type: ignore[arg-type]
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], at + done)
            if got <= 0:
                raise MirrorError(f"{self._file(u)}: the cached block of {self.source.name} ended early (the local "
                                  "disk failed?). Open the dataset again.")
            done += got
        return True

    def _wait(self, u: int, planned: np.ndarray) -> None:
        """Until unit ``u`` of plan ``planned`` is fetched; at once where that plan ended (left, or
        replaced by the next epoch's) or its threads stopped: the caller then reads it directly."""
        if os.getpid() == self._owner:
            with self._cond:
                while u not in self._present and self._error is None:
                    if self._planned is not planned or not any(t.is_alive() for t in self._threads):
                        return
                    self._cond.wait(0.5)
                if self._error is not None:
                    raise self._error
            return
        deadline = time.monotonic() + PATIENCE
        while not self._file(u).exists():
            error = self.directory / "error.txt"
            if error.exists():  # the owner's fetch failed: its error, raised again in this worker
                said = error.read_text(errors="replace")
                if said.startswith("NotEnoughSpace: "):  # the local disk filled up: the owner's error, here too
                    raise NotEnoughSpace(errno.ENOSPC, said.split("] ", 1)[-1])
                raise MountError(errno.EIO, f"{self.source.name}: streaming failed: {said}")
            if time.monotonic() > deadline or not self.directory.exists() or self._plan() is not planned:
                return  # read directly: gone, or the plan it read for ended
            time.sleep(WAIT)

    # --- helpers ---------------------------------------------------------------------------------------

    def _file(self, u: int) -> Path:
        return self.directory / f"u{self.unit}-{u}"

    def _cached(self) -> list[int]:
        prefix = f"u{self.unit}-"
        out = []
        for name in os.listdir(self.directory):
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                out.append(int(name[len(prefix):]))
            elif name.startswith("u"):
                _unlink(self.directory / name)  # units of another size
        return out

    def local_bytes(self) -> int:
        """Bytes the cache's files take now (a listing of the folder)."""
        total = 0
        for entry in os.scandir(self.directory):
            with contextlib.suppress(OSError):
                total += entry.stat().st_size
        return total

    def __repr__(self) -> str:
        return (f"StreamCache({self.source.name}, limit={human_bytes(self.limit)}, {len(self.sizes)} blocks of "
                f"{self.unit} samples, at {self.directory})")


def _write_atomically(path: Path, write: Callable[[Any], Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    with _create(tmp) as f:
        write(f)
    os.replace(tmp, path)


def _create(path: Path) -> Any:
    """``path`` made anew for writing, ``O_EXCL | O_NOFOLLOW``: what was at that name (a partial file of
    a run that stopped, a link planted there) is unlinked first, never written through."""
    _unlink(path)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb")


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _page(folder: Path) -> int:
    """The unit of space a file takes in ``folder``'s filesystem (4096 bytes on a tmpfs or ext4)."""
    try:
        return max(512, os.statvfs(folder).f_frsize)
    except (OSError, AttributeError):
        return 4096


def _first_uses(units: np.ndarray) -> np.ndarray:
    """The distinct values of ``units`` in the order of their first occurrence."""
    _, at = np.unique(units, return_index=True)
    return units[np.sort(at)]


def _release(directory: Path, owner: int, handles: list, source: Any) -> None:
    """Close the idle ``handles`` on ``source``, and delete ``directory`` from process ``owner``."""
    while handles:
        source.close(handles.pop())
    remove(directory, owner)


def remove(directory: Path, owner: int) -> None:
    """Delete ``directory`` (a stream cache's), from process ``owner`` only."""
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)
