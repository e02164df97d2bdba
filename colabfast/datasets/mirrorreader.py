"""Reading a mirror's samples with ``pread``: :class:`MirrorReader`, safe in threads and forked
workers, reading runs of consecutive samples in one call.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union, cast

import numpy as np
import torch

from colabfast.errors import MirrorError, MountError, NotEnoughSpace
from colabfast.mirror.index import Index, load_index, runs
from colabfast.where._fileio import PathLike, file_version, human_bytes, is_transient, pread_retrying, retry

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["MirrorReader", "mount_failed", "stored_positions"]

MAX_READ = 64 << 20  # bytes: the largest single read of a run of consecutive samples
RETRIES = 5  # retries of a transient read error at one offset, as colabfast.stage's default
IOV_MAX = 512  # buffers per os.preadv call, below every system's limit (1024 on Linux)


class MirrorReader:
    """Reads the images of one sample table of a mirror, fast and fork-safe, by stored position.

    ``positions`` (int64 ``[N]``, or None in source order) maps a dataset index to its stored position
    (:func:`stored_positions`); loaded in each process, never pickled.

    Args:
        path: the mirror file.
        split: ``""`` for imagefolder/files mirrors, ``"training"``/``"testing"`` for KITTI.
        in_memory: load all image data into one shared-memory tensor now, shared with workers (forked
            or spawned, via torch.multiprocessing), never copied per worker.
        column: in a mirror of columns (format version 3), the image or mask column to read.

    A file replaced at ``path`` since (size, times, inode: :func:`colabfast.where._fileio.file_version`)
    is refused at the first read in each process: make the dataset again.

    Raises:
        FileNotFoundError: no such file.
        MirrorError: not a complete mirror of a format version this colabfast reads, one that breaks
            the format (checked by :func:`colabfast.mirror.index.load_index`), or no such split; when
            reading, a file that changed since.
        OSError: ``errno.ENOSPC`` when ``in_memory`` data does not fit in ``/dev/shm``.
    """

    _fd: Optional[int]  # this process's file handle, opened on first read (_handles)
    _pid: int  # the process that opened _fd

    def __init__(self, path: PathLike, split: str = "", in_memory: bool = False, column: Optional[int] = None):
        self.path, self.split, self.column = Path(os.path.abspath(path)), split, column
        self._load_metadata()
        self._version = self._loaded  # the file version the dataset is made from: the only one any process reads
        self.blob: Optional[torch.Tensor] = None
        # reads of the image data through a bounded local cache, where streamed: a
        # colabfast.datasets.stream.StreamCache (which imports this module, so not named here)
        self.stream: Optional[Any] = None
        if in_memory:
            self.blob = self._load_all()
            if self._fd is not None:
                os.close(self._fd)  # the blob makes the file handle redundant
            self._fd, self._pid = None, -1

    def _load_metadata(self) -> None:
        # Every array checked against the file and the format (colabfast.mirror.index.load_index); the image
        # data is contiguous and inside the file: a fixed place, read with pread.
        self._loaded = file_version(os.stat(self.path))  # before the index: a change after it shows at the first read
        self.index: Index = load_index(self.path, self.split, self.column)
        self.offsets: np.ndarray = self.index.offsets
        self.shapes: np.ndarray = self.index.shapes
        self.store = self.index.header.store
        self.data_offset: int = self.index.data_offset
        self.positions: Optional[np.ndarray] = stored_positions(self.index.order, self.path)
        self._fd = None
        self._pid = -1

    def __getstate__(self) -> dict:
        return {"path": self.path, "split": self.split, "column": self.column, "blob": self.blob,
                "version": self._version, "stream": self.stream}

    def __setstate__(self, state: dict) -> None:
        self.path, self.split, self.column, self.blob = state["path"], state["split"], state["column"], state["blob"]
        self._load_metadata()  # a spawned worker: refused at its first read if the file changed since (_handles)
        self._version = state["version"]
        self.stream = state.get("stream")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _handles(self) -> int:
        # Never a memory map: a file truncated or replaced under a map kills the process with SIGBUS,
        # where pread returns a short read we can name. Reads go straight into the caller's buffer.
        if self._pid != os.getpid() or self._fd is None:  # first use in this process (a worker, a fork)
            fd = retry(lambda: os.open(self.path, os.O_RDONLY), RETRIES)
            if file_version(os.fstat(fd)) != self._version or self._loaded != self._version:
                os.close(fd)
                raise self._changed()
            self._fd, self._pid = fd, os.getpid()
        return self._fd

    def _changed(self) -> MirrorError:
        return MirrorError(f"{self.path} changed since this dataset was made from it (replaced or rewritten: a new "
                           "run of colabfast.pack or stage?), so its index no longer describes the file. Make the "
                           "dataset again once the file is final.")

    def read_into(self, out: Union[np.ndarray, Sequence[np.ndarray]], start: int) -> None:
        """Fill ``out`` (a contiguous array, or a list of them filled in turn with one ``os.preadv``) with
        the image data from byte ``start`` on. Transient errors are retried as :func:`colabfast.stage`
        retries them (:func:`colabfast.where._fileio.pread_retrying`).

        Raises:
            MirrorError: the file ends early (truncated, or replaced by a shorter one).
            OSError: a read still fails after the retries.
        """
        if self.stream is not None:
            outs = [out] if isinstance(out, np.ndarray) else list(out)
            flat = [np.frombuffer(memoryview(cast("Buffer", o)).cast("B"), dtype=np.uint8) for o in outs]
            at = list(itertools.accumulate((len(f) for f in flat), initial=start))[:-1]
            return self.stream.read(flat, at, self._read_direct)
        self._read_direct(out, start)

    def _read_direct(self, out: Union[np.ndarray, Sequence[np.ndarray]], start: int) -> None:
        """:meth:`read_into` from the file itself, never through :attr:`stream`."""
        # numpy's stubs declare ndarray a Buffer only from Python 3.12 on
        pieces = [memoryview(cast("Buffer", o)).cast("B") for o in ([out] if isinstance(out, np.ndarray) else out)]
        ends = list(itertools.accumulate(len(piece) for piece in pieces))
        total, base = (ends[-1] if ends else 0), self.data_offset + start
        try:
            handle = _Handle(self._handles(), self.path)
        except OSError as exc:
            if not is_transient(exc):
                raise
            raise self._mount_failed(exc, "opening it to read image data") from exc

        def preadv(n: int, offset: int) -> int:
            return os.preadv(handle.fd, _buffers(pieces, ends, offset - base, n), offset)

        try:
            pos = 0
            while pos < total:
                try:
                    n = pread_retrying(preadv, total - pos, base + pos, RETRIES, handle.reopen)
                except OSError as exc:
                    if not is_transient(exc):
                        raise
                    raise self._mount_failed(exc, f"reading image data at byte {base + pos}") from exc
                if n == 0:
                    raise MirrorError(f"{self.path} ended early while reading image data at byte "
                                      f"{base + pos}: the file was truncated or replaced. "
                                      "Copy it again (colabfast.stage), or pack it again.")
                pos += n
        finally:
            handle.close()

    def read_ranges(self, memory: np.ndarray, starts: Sequence[int], lengths: Sequence[int]) -> None:
        """Fill ``memory`` (1-D uint8) with the image data ranges ``starts[k] .. starts[k] + lengths[k]``,
        one ``os.preadv`` each; a range that fails is read again by :meth:`read_into`. Raises as it."""
        if self.stream is not None:
            at = 0
            pieces = []
            for n in lengths:
                pieces.append(memory[at : at + n])
                at += n
            return self.stream.read(pieces, starts, self._read_direct)
        try:
            fd: Optional[int] = self._handles()
        except OSError:
            fd = None  # read_into raises what it should, or retries a transient error
        at = 0
        for start, n in zip(starts, lengths):
            piece = memory[at : at + n]
            try:  # (numpy's stubs declare ndarray a Buffer only from Python 3.12 on)
                done = -1 if fd is None else os.preadv(fd, [cast("Buffer", piece)], self.data_offset + start)
            except OSError:
                done = -1
            if done != n:
                self.read_into(piece, start)
            at += n

    def _mount_failed(self, exc: OSError, what: str) -> OSError:
        return mount_failed(self.path, exc, what)

    def index_of(self, position: int) -> int:
        """The dataset index of the sample stored at ``position`` (the inverse of ``positions``; for
        error messages, which name what the user indexed)."""
        if self.positions is None:
            return int(position)
        return int(np.flatnonzero(self.positions == position)[0])

    def read(self, position: int) -> torch.Tensor:
        """The bytes of stored sample ``position`` as a new uint8 tensor ``[nbytes]`` of its own."""
        return self.views([position])[0].clone()

    def views(self, indices: Sequence[int]) -> list[torch.Tensor]:
        """The bytes of stored positions ``indices`` as uint8 tensors ``[nbytes]``, in ``indices`` order,
        viewing one buffer (one read per run of consecutive positions, :meth:`spans`). Pass them through
        :func:`compact` before they leave the process: pickling a view copies its whole buffer.
        """
        memory, starts = self.spans(indices)
        whole = self.blob if self.blob is not None else torch.from_numpy(memory)
        return [whole[a : a + int(self.offsets[i + 1] - self.offsets[i])] for a, i in zip(starts, indices)]

    def spans(self, indices: Sequence[int],
              into: Optional[Callable[[int], np.ndarray]] = None) -> tuple[np.ndarray, list[int]]:
        """``(memory, starts)``: stored sample ``indices[k]`` is ``memory[starts[k]:]`` (uint8, one read per
        run). ``into(nbytes)``, where given, returns the 1-D uint8 memory to read into (a reader thread's)."""
        if self.blob is not None:
            if self._loaded != self._version:  # a spawned worker's index is of another file than the blob
                raise self._changed()
            return self.blob.numpy(), [int(self.offsets[i]) for i in indices]
        ordered = sorted(set(int(i) for i in indices))
        spans = [(int(self.offsets[ordered[a]]), int(self.offsets[ordered[b - 1] + 1]), a, b)
                 for a, b in runs(ordered, self.offsets, MAX_READ)]
        total = sum(end - base for base, end, _, _ in spans)
        memory = into(total) if into is not None else torch.empty(total, dtype=torch.uint8).numpy()
        self.read_ranges(memory, [base for base, _, _, _ in spans], [end - base for base, end, _, _ in spans])
        at, where = 0, {}
        for base, end, a, b in spans:
            for i in ordered[a:b]:
                where[i] = at + int(self.offsets[i]) - base
            at += end - base
        return memory, [where[int(i)] for i in indices]

    def _load_all(self) -> torch.Tensor:
        nbytes = int(self.offsets[-1])
        free = _shm_free()
        if nbytes > free:
            raise NotEnoughSpace(errno.ENOSPC, f"in_memory=True needs {human_bytes(nbytes)} of shared memory "
                              f"(/dev/shm) for {self.path}, which has {human_bytes(free)} free. Stage the mirror to a "
                              f"RAM disk instead (colabfast.stage(path, to='ram')): reading it is as fast.")
        blob = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
        step = 64 << 20
        for start in range(0, nbytes, step):
            self.read_into(blob[start : start + step].numpy(), start)
        return blob


def mount_failed(path: Path, exc: OSError, what: str) -> MountError:
    """The error for a transient ``exc`` at ``path`` that outlasted the retries (``what`` was being done):
    what to do about the mount."""
    from colabfast.drive.mounting import failure_advice

    tries = getattr(exc, "attempts", RETRIES + 1)
    advice = failure_advice(path, [exc]) or ("The mount it is on (Google Drive?) is failing. Try again, "
                                             "or stage the mirror to local disk first (colabfast.stage).")
    return MountError(exc.errno, f"{path}: {what} failed {tries} times ({exc.strerror}). {advice}")


def _buffers(pieces: list[memoryview], ends: list[int], at: int, n: int) -> list[memoryview]:
    """Where bytes ``at .. at + n`` of ``pieces`` filled one after the other go (``ends``: their
    cumulative lengths): at most ``IOV_MAX`` buffers, so a longer request reads short (callers loop)."""
    out: list[memoryview] = []
    k = bisect.bisect_right(ends, at)
    while k < len(pieces) and n > 0 and len(out) < IOV_MAX:
        lo = at - (ends[k] - len(pieces[k]))
        piece = pieces[k][lo : lo + n]
        out.append(piece)
        at, n, k = at + len(piece), n - len(piece), k + 1
    return out


class _Handle:
    """The file handle one :meth:`MirrorReader.read_into` call reads through: the reader's shared one,
    until an error; then one of its own. A restarted Drive client (ENOTCONN) invalidates open
    handles, but the shared one cannot be swapped under the threads reading through it."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path, self.own = fd, path, False

    def reopen(self) -> None:
        with contextlib.suppress(OSError):  # still failing: the next attempt fails too, and counts
            fd = os.open(self.path, os.O_RDONLY)
            self.close()
            self.fd, self.own = fd, True

    def close(self) -> None:
        if self.own:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.own = False


def stored_positions(order: np.ndarray, path: PathLike) -> Optional[np.ndarray]:
    """Where each sample of a mirror is stored, from its ``order`` dataset.

    Args:
        order: int64 ``[N]``, each stored sample's index in the source's order (torchvision's index;
            with gaps where ``pack(on_error="skip")`` left files out).
        path: the mirror, for the error.

    Returns:
        int64 ``[N]``: entry ``i`` is the stored position of the dataset's sample ``i``; None when
        they are stored in that order (indexing then costs nothing extra).

    Raises:
        MirrorError: two stored samples claim one source index.
    """
    if bool(np.all(order[1:] > order[:-1])):
        return None
    positions = np.argsort(order, kind="stable")
    ranked = order[positions]
    twice = ranked[1:][ranked[1:] == ranked[:-1]]
    if len(twice):
        raise MirrorError(f"{path}: its order dataset lists source index {int(twice[0])} twice: the mirror is "
                          "corrupt. Copy it again, or pack it again.")
    return positions.astype(np.int64)




def _shm_free() -> int:
    try:
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return 0


