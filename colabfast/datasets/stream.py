"""Reading a mirror on a slow mount (Drive) through a bounded local cache: :class:`StreamCache`.

A mirror larger than local storage cannot be staged; read straight from the Drive mount, every batch
waits for the link, and DriveFS keeps a copy of everything read on the same disk. A stream cache
fetches the mirror's image data ahead of the loop instead, along the order the epoch will read it,
into files on local disk that never take more than ``cache_limit`` bytes, and deletes each piece once
the epoch is past it.

- **Units.** The image data (contiguous in a mirror) is cut into units of ``unit`` consecutive stored
  samples, 64 by default: the blocks of :class:`colabfast.BlockShuffleSampler`, which reads each block
  in one stretch of the epoch. A unit is fetched with large sequential reads (one request stream per
  fetch thread, :data:`FETCHERS` of them, so the link's per-request latency overlaps) into
  ``<cache>/u<unit>-<k>``, written under a temporary name and renamed once complete.
- **The plan.** :meth:`StreamCache.start` takes the epoch's read order (stored positions, as the sampler
  will give them) and its batch size. A unit is fetched in the order of its first use, once the cache
  has room for it, and deleted once every batch that reads it has been read (:meth:`StreamCache.advance`,
  which :class:`colabfast.DataLoader` calls as its batches come out of the readers). Fetching in
  first-use order and evicting on last use cannot deadlock when the limit holds the units of any one
  batch (a unit's samples are one stretch of the order): :meth:`start` refuses a smaller limit with
  the smallest that works, and the constructor one smaller than the largest unit.
- **Readers** (threads, or torch's worker processes, which share the cache folder) read a range from
  its unit's file, waiting for a unit the plan has yet to fetch. A range of no planned unit (a
  ``dataset[i]`` outside the loop, a sampler whose order is not known ahead) is read from the mount
  itself, as without a cache.
- **DriveFS.** Reading through Colab's Drive client also fills its own cache on the same disk
  (``~/.config/Google/DriveFS``): after each ``cache_limit`` bytes fetched, the fetch threads pause
  and :func:`colabfast.refresh_drive` drops it (DriveFS only; refused while other files on Drive are
  open, which is then said once as a warning), so on Colab the local peak stays within twice the
  limit.
- **Failures** are those of a staged read: a transient error (a Drive disconnect) is retried as
  :func:`colabfast.stage` retries it, then raised naming the file and the byte offset; a mirror
  replaced on Drive while it streams is refused as :class:`~colabfast.datasets.mirrorreader.MirrorReader`
  refuses one. The error reaches the reader that waits for the unit, in this process or a worker.

The same idea, a bounded local cache of a remote dataset's shards with prefetch along the epoch,
is MosaicML Streaming's (``StreamingDataset(remote, local, cache_limit)``,
https://docs.mosaicml.com/projects/streaming/en/stable/dataset_configuration/shard_retrieval.html);
this one reads the mirror itself, with no second export of the data, and keeps colabfast's samplers,
reader threads and resumable epochs. Both measured side by side: ``colabfast bench stream``
(benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import os
import shutil
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from colabfast.datasets.mirrorreader import RETRIES, mount_failed
from colabfast.errors import CacheLimitError, MirrorError
from colabfast.where._fileio import file_version, human_bytes, is_transient, pread_retrying

__all__ = ["FETCHERS", "UNIT_SAMPLES", "MountSource", "RemoteSource", "StreamCache"]

UNIT_SAMPLES = 64  # stored samples per unit: BlockShuffleSampler's default block
FETCHERS = 4  # fetch threads: each a stream of large reads, so the mount's per-request latency overlaps
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
        self._set_unit(self.unit)
        largest = int(self.sizes.max()) if len(self.sizes) else 0
        if self.limit < largest:
            raise CacheLimitError(f"cache_limit={human_bytes(self.limit)} cannot hold one block of {self.unit} samples "
                                  f"of {self.source.name} (the largest is {human_bytes(largest)}): pass cache_limit="
                                  f"{largest} or more (a few times that lets the cache fetch ahead)")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._owner = os.getpid()
        self._finalizer: Optional[weakref.finalize] = weakref.finalize(self, remove, self.directory, self._owner)
        self._init_local()
        self.fetched = 0  # bytes fetched from the mount by this process's threads, all epochs
        self.peak = 0  # most bytes the cache's files took at once (this process's account)
        self.plan_bytes = 0  # what the current plan fetches

    def _set_unit(self, unit: int) -> None:
        n = len(self.offsets) - 1
        self.unit = unit
        self.bounds = self.offsets[np.r_[np.arange(0, n, unit), n]] if n else self.offsets[:1].copy()
        self.sizes = np.diff(self.bounds)

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
        self._used = 0  # bytes of the units present or being fetched
        self._done = 0  # batches read (advance)
        self._error: Optional[BaseException] = None
        self._since_refresh = 0  # bytes fetched since Drive's own cache was last dropped
        self._drivefs = False  # the mirror is on DriveFS (Colab's Drive client), whose cache is dropped
        self._refreshing = self._refresher = False
        self._inflight = 0  # units being fetched
        self._warned = False
        self._plan_mtime = -1

    def __getstate__(self) -> dict:
        keep = ("path", "data_offset", "source", "directory", "limit", "unit", "offsets", "bounds", "sizes", "_owner")
        return {k: vars(self)[k] for k in keep}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._finalizer = None  # the folder is the owner's to delete
        self._init_local()
        self.fetched = self.peak = self.plan_bytes = 0

    # --- the owner: plans and fetch threads ------------------------------------------------------

    def start(self, order: Any, batches: Any, unit: Optional[int] = None) -> None:
        """Plan an epoch and start fetching: ``order`` (int64 ``[M]``) the stored positions in the order
        they will be read, ``batches`` (int64 ``[M]``) the batch each is read in, non-decreasing from 0;
        ``unit``: stored samples per unit from now on (the sampler's block, where it is smaller than
        the units so far: a unit must be one stretch of the order for the cache to stay small).
        Units already cached that the plan fetches first are kept; every other file is deleted.

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
            np.add.at(live, batches[first[used]], self.sizes[used])
            np.add.at(live, last[used] + 1, -self.sizes[used])
            need = int(np.cumsum(live).max())
            if need > self.limit:
                size = int(np.bincount(batches).max())
                bound = max(need, self.smallest_limit(size))
                raise CacheLimitError(f"cache_limit={human_bytes(self.limit)} cannot hold what this epoch reads "
                                      f"from {self.source.name} at once ({human_bytes(need)} in blocks of {self.unit} "
                                      f"samples read before and after one batch): pass cache_limit={bound} or more, "
                                      "or a smaller batch_size. A mirror packed without shuffle=True is read in blocks "
                                      "of 1, samples from all over the file: pack it with shuffle=True to stream it")
        # kept: cached units among the first the plan fetches, within the limit (fetched at once anyway)
        prefix = fetch[np.cumsum(self.sizes[fetch]) <= self.limit]
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
            self._used = int(self.sizes[list(keep)].sum()) if keep else 0
            self._next, self._done, self._error = 0, 0, None
            self._planned = np.zeros(count, dtype=bool)
            self._planned[used] = True
            self.plan_bytes = int(self.sizes[fetch].sum()) - self._used
        _write_atomically(self.directory / "plan.npy", lambda f: np.save(f, self._planned))
        from colabfast.where import env

        self._drivefs = isinstance(self.source, MountSource) and env.drive_kind(self.path) == "drivefs"
        _unlink(self.directory / "error.txt")
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._fetching, args=(self._stop,), daemon=True,
                                          name=f"colabfast-stream-{k}") for k in range(FETCHERS)]
        for t in self._threads:
            t.start()

    def smallest_limit(self, batch_size: int) -> int:
        """The smallest ``limit`` that holds what a batch of ``batch_size`` consecutive samples of any
        epoch's order reads: the largest units such a batch can touch (every unit is one stretch of the
        order, ``unit`` long but the last)."""
        touched = min(len(self.sizes), 3 + (max(batch_size, 1) - 1) // self.unit)
        return int(np.sort(self.sizes)[::-1][:touched].sum())

    def advance(self, done: int) -> None:
        """``done`` batches of the plan have been read: delete the units no later batch reads."""
        with self._cond:
            self._done = max(self._done, done)
            gone = False
            while self._expiry and self._expiry[0][0] < self._done:
                _, u = heapq.heappop(self._expiry)
                if self._present.pop(u, None) is not None:
                    _unlink(self._file(u))
                    self._used -= int(self.sizes[u])
                    gone = True
            if gone:
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
        """Stop fetching and delete the cache folder."""
        self.stop()
        if self._finalizer is not None:
            self._finalizer()

    def _fetching(self, stop: threading.Event) -> None:
        handle = None
        try:
            while True:
                with self._cond:
                    while True:
                        if stop.is_set() or self._next >= len(self._fetch):
                            return
                        if self._refreshing or (self._drivefs and self._since_refresh >= self.limit):
                            self._refreshing = True  # every fetch thread lets go of the mount first
                            if handle is not None:
                                self.source.close(handle)
                                handle = None
                            if self._inflight == 0 and not self._refresher:
                                self._refresher, refresh = True, True
                                break
                            self._cond.wait(0.5)
                            continue
                        u = int(self._fetch[self._next])
                        if u in self._present:  # kept from the last epoch
                            self._next += 1
                            continue
                        if self._used + int(self.sizes[u]) > self.limit:
                            self._cond.wait(0.5)  # until advance() deletes what the epoch is past
                            continue
                        self._next += 1
                        self._used += int(self.sizes[u])
                        self._inflight += 1
                        refresh = False
                        break
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
                with self._cond:
                    self._present[u] = int(self._last[u])
                    heapq.heappush(self._expiry, (int(self._last[u]), u))
                    self.peak = max(self.peak, self._used)
                    self._cond.notify_all()
                if self._done > self._last[u]:  # the epoch is past it already (read directly meanwhile)
                    self.advance(self._done)
        except BaseException as exc:  # noqa: BLE001 (handed to the readers waiting for units)
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            said = f"{type(exc).__name__}: {exc}".encode()
            with contextlib.suppress(OSError):
                _write_atomically(self.directory / "error.txt", lambda f: f.write(said))
        finally:
            if handle is not None:
                self.source.close(handle)

    def _fetch_unit(self, handle: Any, u: int) -> None:
        start, end = int(self.bounds[u]), int(self.bounds[u + 1])
        target, part = self._file(u), self.directory / f".u{self.unit}-{u}.part"
        buffer = bytearray(min(PIECE, max(end - start, 1)))
        with open(part, "wb") as out:
            pos = start
            while pos < end:
                view = memoryview(buffer)[: min(PIECE, end - pos)]
                n = self.source.read(handle, view, self.data_offset + pos)
                out.write(view[:n])
                pos += n
        if self.source.changed():
            _unlink(part)
            raise self.source.changed_error()
        os.replace(part, target)
        with self._cond:
            self.fetched += end - start
            self._since_refresh += end - start

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
        for piece, start in zip(pieces, starts):
            n = len(piece)
            at = 0
            while at < n:
                b = int(start) + at
                u = int(np.searchsorted(self.bounds, b, side="right")) - 1
                if u < 0 or u >= len(self.sizes):
                    direct(piece[at:], b)  # outside the image data (another column's bytes)
                    break
                k = min(n - at, int(self.bounds[u + 1]) - b)
                part = piece[at : at + k]
                if not planned[u]:
                    self._direct(part, b, direct)
                elif not self._read_cached(part, u, b):
                    later.append((part, u, b))
                at += k
        for part, u, b in later:
            self._wait(u)
            if not self._read_cached(part, u, b):
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

    def _read_cached(self, part: np.ndarray, u: int, b: int) -> bool:
        try:
            fd = os.open(self._file(u), os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            view, at = memoryview(part).cast("B"), b - int(self.bounds[u])  # type: ignore[arg-type]
            done = 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], at + done)
                if got <= 0:
                    raise MirrorError(f"{self._file(u)}: the cached block of {self.source.name} ended early (the "
                                      "local disk failed?). Open the dataset again.")
                done += got
            return True
        finally:
            os.close(fd)

    def _wait(self, u: int) -> None:
        if os.getpid() == self._owner:
            with self._cond:
                while u not in self._present and self._error is None:
                    if not any(t.is_alive() for t in self._threads):
                        return  # not fetching (stopped): the caller reads it directly
                    self._cond.wait(0.5)
                if self._error is not None:
                    raise self._error
            return
        deadline = time.monotonic() + PATIENCE
        while not self._file(u).exists():
            error = self.directory / "error.txt"
            if error.exists():
                raise OSError(f"{self.source.name}: streaming failed: {error.read_text(errors='replace')}")
            if time.monotonic() > deadline or not self.directory.exists():
                return  # read directly
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


class MountSource:
    """Where a stream cache fetches from: the mirror's file on a mount (Drive), read with ``pread``.

    ``read`` retries a transient error (a Drive disconnect, an ``EIO``) as :func:`colabfast.stage`
    retries it (:func:`colabfast.where._fileio.pread_retrying`, through a handle of its own after a
    failure), then raises an ``OSError`` naming the file and the byte offset."""

    def __init__(self, path: Path, version: tuple) -> None:
        self.path, self.version, self.name = Path(path), version, str(path)

    def open(self) -> int:
        from colabfast.where._fileio import retry

        try:
            fd = retry(lambda: os.open(self.path, os.O_RDONLY), RETRIES)
        except OSError as exc:
            if not is_transient(exc):
                raise
            raise mount_failed(self.path, exc, "opening it to stream image data") from exc
        if file_version(os.fstat(fd)) != self.version:
            os.close(fd)
            raise self.changed_error()
        return fd

    def read(self, fd: int, view: memoryview, offset: int) -> int:
        """Read into ``view`` from byte ``offset``: the bytes read, at least one."""
        handle = {"fd": fd}

        def reopen() -> None:
            with contextlib.suppress(OSError):
                handle["fd"] = os.open(self.path, os.O_RDONLY)

        try:
            n = pread_retrying(functools.partial(_preadv_into, handle, view), len(view), offset, RETRIES, reopen)
        except OSError as exc:
            if not is_transient(exc):
                raise
            raise mount_failed(self.path, exc, f"streaming image data at byte {offset}") from exc
        finally:
            if handle["fd"] != fd:
                with contextlib.suppress(OSError):
                    os.close(handle["fd"])
        if n == 0:
            raise MirrorError(f"{self.path} ended at byte {offset} while it was streamed: the file was truncated or "
                              "replaced. Open the dataset again once the file is final.")
        return n

    def close(self, fd: int) -> None:
        with contextlib.suppress(OSError):  # the mount may be gone (unmounted, disconnected)
            os.close(fd)

    def changed(self) -> bool:
        """Whether the file at the path is another version now (an open handle keeps the old file)."""
        return file_version(os.stat(self.path)) != self.version

    def changed_error(self) -> MirrorError:
        return MirrorError(f"{self.path} changed on the mount while it was streamed (replaced or rewritten: a new run "
                           "of colabfast.pack?), so its index no longer describes the file. Open the dataset again "
                           "once the file is final.")


class RemoteSource:
    """Where a stream cache fetches from: a mirror at an fsspec URL (``gs://``, ``s3://``, ``https://``,
    ``memory://``; https://filesystem-spec.readthedocs.io), read with ``seek`` and ``read`` of the file
    fsspec opens. Its version is what ``fs.info`` says of it (size, and its modification time or ETag
    where the filesystem gives them).

    Raises:
        ImportError: fsspec is not installed (``pip install fsspec``, and ``gcsfs`` for ``gs://``).
        FileNotFoundError: nothing at ``url``.
    """

    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise ImportError(f"streaming {url} needs fsspec: pip install 'colabfast[bucket]' (and gcsfs for gs://, "
                              "s3fs for s3://)") from exc

        self.name = url
        self.fs, self.remote = fsspec.core.url_to_fs(url)
        self.version = self._version()

    def _version(self) -> tuple:
        info = self.fs.info(self.remote)
        keys = ("size", "mtime", "LastModified", "updated", "ETag", "etag", "created")
        return tuple(str(info.get(k)) for k in keys)

    @property
    def size(self) -> int:
        return int(self.version[0])

    def open(self) -> Any:
        if self._version() != self.version:
            raise self.changed_error()
        return self.fs.open(self.remote, "rb")

    def read(self, f: Any, view: memoryview, offset: int) -> int:
        f.seek(offset)
        data = f.read(len(view))
        if not data:
            raise MirrorError(f"{self.name} ended at byte {offset} while it was streamed: the file was truncated or "
                              "replaced. Open the dataset again once the file is final.")
        view[: len(data)] = data
        return len(data)

    def close(self, f: Any) -> None:
        with contextlib.suppress(Exception):
            f.close()

    def changed(self) -> bool:
        return self._version() != self.version

    def changed_error(self) -> MirrorError:
        return MirrorError(f"{self.name} changed while it was streamed (replaced or rewritten), so its index no longer "
                           "describes the file. Open the dataset again once the file is final.")


def _preadv_into(handle: dict, view: memoryview, n: int, offset: int) -> int:
    return os.preadv(handle["fd"], [view[:n]], offset)


def _write_atomically(path: Path, write: Callable[[Any], Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove(directory: Path, owner: int) -> None:
    """Delete ``directory`` (a stream cache's), from process ``owner`` only."""
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)
