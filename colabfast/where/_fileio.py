"""File I/O for slow, flaky mounts: retries with backoff, atomic writes, parallel readahead.

Private helpers shared by :mod:`colabfast.staging`, :mod:`colabfast.staging.extract` and :mod:`colabfast.pack`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import random
import stat
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Optional, TypeVar, Union

import filelock

T = TypeVar("T")

# What every path argument in colabfast accepts: a str or anything os.fspath takes (pathlib.Path...).
PathLike = Union[str, os.PathLike]

# What Drive's FUSE clients return for trouble that passes: a failed fetch, a client restart, a timeout,
# throttling, a stale view of a file (ESTALE, also :func:`lagging`'s).
TRANSIENT_ERRNOS = frozenset(
    {errno.EIO, errno.ENOTCONN, errno.ETIMEDOUT, errno.EAGAIN, errno.ECONNRESET, errno.ECONNABORTED, errno.ESTALE}
)

BACKOFF_BASE = 0.25  # seconds before the first retry; doubles each time
BACKOFF_CAP = 8.0  # seconds, the longest single wait
MIN_READ = 128 << 10  # bytes: the smallest read request after errors (FUSE's usual max_read)


def lagging(path: PathLike, exc: BaseException) -> Optional[OSError]:
    """An ``ESTALE`` error (transient) where opening ``path`` failed with ``ENOENT`` though ``lstat`` finds it:
    Drive shows a file just written with a lag (googlecolab/colabtools#4506). None otherwise."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code != errno.ENOENT:
        return None
    try:
        os.lstat(path)
    except OSError:
        return None
    return OSError(errno.ESTALE, f"{path}: the mount lists it but could not open it ({exc}); Drive shows files "
                                 "just written with a lag")


def is_transient(exc: BaseException) -> bool:
    """True for an OSError worth retrying (see TRANSIENT_ERRNOS)."""
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def retry(fn: Callable[[], T], retries: int) -> T:
    """Call ``fn``, retrying transient OSErrors up to ``retries`` times with :func:`backoff`.

    Raises:
        OSError: the last transient error once the retries are used up, with ``attempts`` set on it.
    """
    attempt = 0
    while True:
        try:
            return fn()
        except OSError as exc:
            # An error that already carries ``attempts`` was retried below (a read, per range): done.
            if not is_transient(exc) or attempt >= retries or hasattr(exc, "attempts"):
                if not hasattr(exc, "attempts"):
                    exc.attempts = attempt + 1  # type: ignore[attr-defined]
                raise
        time.sleep(backoff(attempt))
        attempt += 1


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt + 1``: ``BACKOFF_BASE * 2**attempt``, capped at
    ``BACKOFF_CAP`` and jittered by +-50% so many threads do not retry in lockstep."""
    return min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt) * random.uniform(0.5, 1.5)


def pread_retrying(
    pread: Callable[[int, int], T], n: int, offset: int, retries: int, reopen: Optional[Callable[[], None]] = None
) -> T:
    """``pread(n, offset)``, retrying transient errors at that offset with backoff, each retry a smaller
    request (down to ``MIN_READ``: FUSE sends at most 128 KiB per request, any of which may fail).
    ``pread`` returns the bytes or a count (``preadv``); ``reopen`` runs before each retry.

    Raises:
        OSError: the last error once ``retries`` retries at one offset failed, with ``attempts`` set.
    """
    attempt = 0
    while True:
        try:
            return pread(n, offset)
        except OSError as exc:
            if not is_transient(exc) or attempt >= retries:
                exc.attempts = attempt + 1  # type: ignore[attr-defined]
                raise
        time.sleep(backoff(attempt))
        attempt += 1
        n = max(min(n, MIN_READ), n // 4)  # smaller, never larger than asked (past a range's end)
        if reopen is not None:
            reopen()


class FileEntry(NamedTuple):
    """A file found by :func:`scan_tree`."""

    rel: str  # POSIX path relative to the scanned root
    size: int  # bytes
    mtime_ns: int


def scan_tree(
    root: Path, workers: int = 32, retries: int = 5, unreadable: Optional[dict[str, OSError]] = None,
    reserved: Optional[list[str]] = None,
    revisit: bool = False,
    links: Optional[list[str]] = None,
    special: Optional[dict[str, str]] = None,
) -> tuple[list[FileEntry], list[str]]:
    """All regular files under ``root`` (following symlinks) and all folders, sorted, listed by a thread
    pool (on Drive each listing is a round trip). A folder reached twice is listed once; dangling links,
    ELOOP and colabfast's own files (:func:`is_own_name`) are left out.

    Args:
        unreadable: if given, records a sub-folder that cannot be listed (relative path -> error) and
            goes on, as ``cp -r``; if None, the error is raised.
        reserved: if given, gets the relative paths left out as colabfast's own names.
        revisit: list a folder again under each link to it, as ``os.walk(followlinks=True)``; loops not.
        links: if given, gets the relative paths of the symlinks met.
        special: if given, records what is neither file nor folder (relative path -> ``"a FIFO"``, ...).

    Returns:
        (files, folders), with paths relative to ``root`` in POSIX form.
    """
    files: list[FileEntry] = []
    dirs: list[str] = []
    top = retry(lambda: os.stat(root), retries)
    seen = {(top.st_dev, top.st_ino)}
    inside = {"": frozenset(seen)}  # with revisit: each folder's own key and its parents'

    Listing = tuple[list[FileEntry], list[tuple[str, tuple[int, int]]]]  # files, (folder, its device+inode)

    def listdir(rel: str) -> Listing:
        def attempt() -> Listing:
            found: list[FileEntry] = []
            subdirs: list[tuple[str, tuple[int, int]]] = []
            linked: list[str] = []  # kept apart until the listing succeeds: a retried one would record twice
            odd: dict[str, str] = {}
            with os.scandir(root / rel if rel else root) as it:
                for entry in it:
                    name = f"{rel}/{entry.name}" if rel else entry.name
                    if is_own_name(entry.name):
                        if reserved is not None:
                            reserved.append(name)
                        continue
                    try:
                        st = entry.stat()  # follows symlinks
                    except OSError as exc:
                        if exc.errno in (errno.ENOENT, errno.ELOOP):  # a dangling link, or links to each other:
                            continue  # nothing to copy (a loop raised, and lost its whole folder)
                        raise
                    if links is not None and entry.is_symlink():
                        linked.append(name)
                    if stat.S_ISDIR(st.st_mode):
                        subdirs.append((name, (st.st_dev, st.st_ino)))
                    elif stat.S_ISREG(st.st_mode):
                        found.append(FileEntry(name, st.st_size, st.st_mtime_ns))
                    else:
                        odd[name] = file_kind(st.st_mode)
            if links is not None:
                links.extend(linked)
            if special is not None:
                special.update(odd)
            return found, subdirs

        return retry(attempt, retries)

    with ThreadPoolExecutor(workers, thread_name_prefix="colabfast-scan") as pool:
        first = pool.submit(listdir, "")
        pending, listing = {first}, {first: ""}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    found, subdirs = fut.result()
                except OSError as exc:
                    rel = listing[fut]
                    if unreadable is None or not rel:
                        raise
                    unreadable[rel] = exc
                    dirs.remove(rel)
                    continue
                files.extend(found)
                parent = listing[fut]
                for name, key in subdirs:
                    if revisit:
                        if key in inside[parent]:  # a link back to a folder it is in: a loop
                            continue
                        inside[name] = inside[parent] | {key}
                    elif key in seen:  # a symlink loop or a second link to a folder
                        continue
                    seen.add(key)
                    dirs.append(name)
                    child = pool.submit(listdir, name)
                    pending.add(child)
                    listing[child] = name
    files.sort()
    dirs.sort()
    return files, dirs


def open_regular(path: PathLike) -> io.FileIO:
    """``path`` opened for reading (unbuffered), refused unless it is a regular file (links followed),
    without blocking on a FIFO (``O_NONBLOCK``, then ``fstat``).

    Raises:
        OSError: the file cannot be opened, or (errno ``EINVAL``) it is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    f = io.FileIO(fd, "rb")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        f.close()
        raise OSError(errno.EINVAL, f"not a regular file but {file_kind(mode)}", os.fspath(path))
    os.set_blocking(fd, True)
    return f


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for messages: ``"a folder"``, ``"a FIFO"``, ``"a socket"``,
    ``"a device"`` or ``"a regular file"``."""
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a regular file" if stat.S_ISREG(mode) else "a device")


def read_regular(path: PathLike) -> bytes:
    """The bytes of the regular file ``path``; see :func:`open_regular`, which raises."""
    with open_regular(path) as f:
        return f.readall()


def python_child(code: str) -> list[str]:
    """The command line of a child Python running ``code``, isolated (``-I``) so that a ``json.py`` in the
    current folder cannot run in it, with this process's absolute ``sys.path`` (but the current folder)
    and colabfast's own folder appended. Arguments after the command are the child's ``sys.argv[1:]``.
    """
    here = os.path.realpath(os.getcwd())
    extra = [p for p in sys.path if os.path.isabs(p) and os.path.realpath(p) != here]
    extra.append(str(Path(__file__).resolve().parents[2]))  # the folder holding colabfast: last, even if the cwd
    prelude = f"import sys; sys.path.extend(p for p in {extra!r} if p not in sys.path)\n"
    return [sys.executable, "-I", "-c", prelude + code]


def human_bytes(n: float) -> str:
    """``n`` bytes for people, decimal (SI, as tqdm counts): ``"812 kB"``, ``"14.2 MB"``, ``"7.1 GB"``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


PARTIAL_SUFFIX = ".colabfast-partial"
STATE_PREFIX = ".colabfast-"  # the start of colabfast's own records inside a folder it staged
STAGE_RECORD = f"{STATE_PREFIX}stage.json"  # inside a staged folder: what it was staged from, and hashes
STAGE_JOURNAL = f"{STATE_PREFIX}stage.sha256.jsonl"  # beside it: hashes appended as files are verified
NAME_MAX = 255  # bytes in one file name on Linux filesystems (ext4, tmpfs, FUSE)


def fits_name_max(name: str) -> bool:
    """True if ``name`` is a valid length for one file name (NAME_MAX bytes); a longer one makes every
    call on it, even ``stat``, fail with ENAMETOOLONG."""
    return len(os.fsencode(name)) <= NAME_MAX


def partial_name(name: str) -> str:
    """The temporary name a file ``name`` is written under: ``.NAME.colabfast-partial``, or, where that
    would pass NAME_MAX bytes (names of 237 bytes and more), ``.HASH.colabfast-partial``."""
    tmp = f".{name}{PARTIAL_SUFFIX}"
    if fits_name_max(tmp):
        return tmp
    return f".{hashlib.sha256(os.fsencode(name)).hexdigest()[:32]}{PARTIAL_SUFFIX}"


def is_partial_name(name: str) -> bool:
    """True if ``name`` has the form of a temporary name colabfast writes (:func:`partial_name`:
    ``.NAME.colabfast-partial``), which it deletes as its own leftover; ``notes.colabfast-partial``
    (no leading dot) is not one."""
    return name.startswith(".") and name.endswith(PARTIAL_SUFFIX) and len(name) > len(PARTIAL_SUFFIX) + 1


def is_own_name(name: str) -> bool:
    """True if colabfast writes files of this name into folders it stages to: a temporary name
    (:func:`is_partial_name`) or a stage's record or journal. Such a file in a source cannot be
    copied as it is: its copy would be taken for colabfast's, overwritten or deleted."""
    return is_partial_name(name) or name in (STAGE_RECORD, STAGE_JOURNAL)


def partial_path(path: Path) -> Path:
    """``path`` under its temporary name (see :func:`partial_name`), in the same folder."""
    return path.with_name(partial_name(path.name))


def unchanged(st: Optional[os.stat_result], size: int, mtime_ns: int) -> bool:
    """True if ``st`` is a regular file of ``size`` bytes modified at ``mtime_ns``: rsync's quick check
    that a copy made earlier (and given its source's time) is still that copy."""
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size == size and st.st_mtime_ns == mtime_ns


def write_all(fd: int, data: bytes | memoryview, offset: Optional[int] = None) -> None:
    """Write all of ``data`` to ``fd`` (at ``offset`` with pwrite, else at the file position).

    ``write(2)`` may write less than asked when the disk is nearly full; the rest is written by
    further calls, and a call that writes nothing raises ``ENOSPC`` rather than leave a hole.
    """
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
        if offset is not None:
            offset += n


def state_name(path: Path) -> str:
    """A file name for colabfast's state about ``path`` (a record, a lock) kept in its cache folder,
    not beside the user's files: unique per absolute path, readable by its first 64 characters."""
    return f"{path.name[:64]}-{hashlib.sha256(os.fsencode(os.path.abspath(path))).hexdigest()[:24]}"


@contextlib.contextmanager
def locked(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on the lock file ``path`` (created with its folder) while the block runs;
    after 2 s of waiting a line says what for. ``filelock`` (flock: released if the holder dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(path)
    try:
        lock.acquire(timeout=2)
    except filelock.Timeout:
        import sys

        print(f"colabfast: waiting for another process {what} ({path})", file=sys.stderr)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def write_json_atomic(path: Path, obj: object) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temporary name, fsync, rename)."""
    tmp = partial_path(path)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None if it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


class ReadaheadFile(io.RawIOBase):
    """A seekable read-only file that keeps ``depth`` blocks of ``block_size`` bytes in flight (parallel
    ``os.pread`` ahead of the consumer), so a stream on Drive reads at the link's bandwidth; transient
    errors are retried per block (:func:`retry`), re-opening the file.

    Args:
        path: the file.
        block_size: bytes per read request sent to the mount.
        depth: blocks in flight; the window is ``block_size * depth`` bytes.
        retries: retries per block for transient errors.
    """

    def __init__(self, path: PathLike, *, block_size: int = 4 << 20, depth: int = 8, retries: int = 5):
        super().__init__()
        self._path = os.fspath(path)
        self._fd = retry(lambda: os.open(self._path, os.O_RDONLY), retries)
        self.size = os.fstat(self._fd).st_size
        self._block = block_size
        self._depth = depth
        self._retries = retries
        self._pool = ThreadPoolExecutor(depth, thread_name_prefix="colabfast-readahead")
        self._blocks: dict[int, Future[bytes]] = {}
        self._pos = 0
        self._lock = threading.Lock()

    def _fetch(self, k: int) -> bytes:
        offset = k * self._block
        length = min(self._block, self.size - offset)
        chunks, done = [], 0
        while done < length:
            chunk = pread_retrying(self._pread, length - done, offset + done, self._retries)
            if not chunk:
                raise OSError(errno.EIO, f"{self._path} ended at byte {offset + done}, expected {self.size}")
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def _pread(self, n: int, offset: int) -> bytes:
        fd = self._fd
        try:
            return os.pread(fd, n, offset)
        except OSError as exc:
            if exc.errno == errno.EBADF and fd != self._fd:  # another thread re-opened meanwhile
                raise OSError(errno.EAGAIN, "file handle replaced") from exc
            if exc.errno in TRANSIENT_ERRNOS:
                self._reopen(fd)
            raise

    def _reopen(self, failed_fd: int) -> None:
        # A Drive client that restarted invalidates open handles; the next attempt needs a new one.
        with self._lock:
            if self._fd != failed_fd:
                return
            try:
                fd = os.open(self._path, os.O_RDONLY)
            except OSError:
                return
            self._fd = fd
            os.close(failed_fd)

    def _window(self, k: int) -> None:
        last = (self.size - 1) // self._block if self.size else -1
        for stale in [b for b in self._blocks if b < k or b >= k + self._depth]:
            self._blocks.pop(stale).cancel()
        for b in range(k, min(k + self._depth, last + 1)):
            if b not in self._blocks:
                self._blocks[b] = self._pool.submit(self._fetch, b)

    def readinto(self, buffer) -> int:
        if self._pos >= self.size:
            return 0
        k = self._pos // self._block
        self._window(k)
        data = self._blocks[k].result()
        start = self._pos - k * self._block
        n = min(len(buffer), len(data) - start)
        memoryview(buffer).cast("B")[:n] = data[start : start + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            for fut in self._blocks.values():
                fut.cancel()
            self._pool.shutdown(wait=True)
            os.close(self._fd)
        super().close()


def file_version(st: os.stat_result) -> tuple[int, ...]:
    """What tells one version of a file from another (``os.stat``/``os.fstat``): size, modification
    and change time, inode and device. A copy, a rewrite or a replacement (``os.replace``, as pack and
    stage publish) changes it."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


_scope = threading.local()  # .files: the files kept open in this thread within one_open()


def scoped_files() -> Optional[dict]:
    """The files :func:`one_open` keeps open in this thread (a dict the reader fills, by its own key),
    or None outside it."""
    return getattr(_scope, "files", None)


@contextlib.contextmanager
def one_open() -> Iterator[None]:
    """Within the block, :func:`colabfast.mirror.safety.read_h5` opens each version of a file once in
    this thread (one ``h5py.File``, closed at the end): on Drive each open is a round trip."""
    if scoped_files() is not None:  # nested: the outer block's files
        yield
        return
    _scope.files = {}
    try:
        yield
    finally:
        files, _scope.files = _scope.files, None
        for f in files.values():
            with contextlib.suppress(Exception):
                f.close()
