"""The copy engine of :func:`colabfast.stage`: many files copied by a pool of threads, large files as
parallel ranges, each verified against its source and renamed into place.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import os
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from colabfast.errors import NotEnoughSpace, StageError
from colabfast.staging.destination import (
    Hashes,
    check_space,
    manifest_path,
    new_manifest,
    record_of,
    say_up_to_date,
)
from colabfast.where import env
from colabfast.where._fileio import (
    FileEntry,
    is_partial_name,
    lagging,
    partial_path,
    pread_retrying,
    read_json,
    retry,
    unchanged,
    write_all,
    write_json_atomic,
)

if TYPE_CHECKING:
    from colabfast.staging.destination import StageOptions

__all__: list[str] = []  # internal to colabfast.staging: nothing here is public

CHUNK = 1 << 20  # bytes per read() when copying a file
BIG_FILE = 64 << 20  # files at least this large are copied as parallel ranges
RANGE = 16 << 20  # bytes per range of a big file
# Files the last stage_tree of this thread found to copy (0: all up to date, maybe staged by another
# process while this one waited for the stage lock): how open_dataset's account tells "staged" from "found".
_LAST = threading.local()


def copied_last() -> Optional[int]:
    """Files the last stage of a folder or a file in this thread copied (0: nothing, it was up to date
    once this thread held the stage lock); None before any."""
    return getattr(_LAST, "copied", None)

# --- folders and single files ----------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def stage_tree(
    src: Path,
    dst: Path,
    files: list[FileEntry],
    dirs: list[str],
    workers: int,
    opts: StageOptions,
    rename: Optional[dict[str, str]] = None,
    unreadable: Optional[dict[str, OSError]] = None,
) -> None:
    """Copy ``files`` (relative to ``src``) to ``dst``, skipping unchanged ones."""
    names = rename or {}
    single = bool(names)
    record_path = record_of(dst / next(iter(names.values())), True) if single else manifest_path(dst)
    old = read_json(record_path) or {}
    hashes = Hashes(record_path, old, keep=opts.verify == "sha256")

    def target_of(rel: str) -> Path:
        return dst / names.get(rel, rel)


    def stat_or_none(path: Path) -> Optional[os.stat_result]:
        try:
            return path.stat()
        except OSError:
            return None

    dst.mkdir(parents=True, exist_ok=True)
    for d in dirs:
        (dst / d).mkdir(parents=True, exist_ok=True)

    todo = [f for f in files if not unchanged(stat_or_none(target_of(f.rel)), f.size, f.mtime_ns)]
    if opts.verify == "sha256":  # unchanged by size and mtime; now check content against the record
        copying = set(todo)
        same = [f for f in files if f not in copying]
        with ThreadPoolExecutor(env.cpu_count()) as pool:
            digests = pool.map(lambda f: sha256_of(target_of(f.rel)), same)
            todo += [f for f, d in zip(same, digests) if hashes.digests.get(f.rel) != d]
    failures: dict[str, BaseException] = {}
    for rel, exc in (unreadable or {}).items():
        exc.folder = True  # type: ignore[attr-defined]
        failures[f"{rel}/"] = exc
    _LAST.copied = len(todo)
    if not todo and not failures:
        say_up_to_date(target_of(files[0].rel) if single else dst, opts)
        if not old.get("complete"):
            write_json_atomic(record_path, new_manifest(src if not single else src / files[0].rel, True,
                                                         sha256=hashes.digests or None))
        hashes.close(folded=True)
        return

    source = src if not single else src / files[0].rel
    check_space(sum(f.size for f in todo), dst, src, folder=not single)
    write_json_atomic(record_path, new_manifest(source, False, sha256=hashes.digests or None))
    if old and not old.get("complete"):
        _remove_partials(dst if not single else None, [target_of(f.rel) for f in todo])
    copier = _Copier(src, target_of, opts.verify, opts.retries, hashes)
    copier.cancel = opts.cancel
    name = next(iter(names.values())) if single else dst.name
    try:
        failures.update(copier.run(todo, workers, opts.progress, desc=f"stage {name}"))
    finally:
        hashes.close(folded=False)
    write_json_atomic(record_path, new_manifest(source, not failures, sha256=hashes.digests or None))
    hashes.close(folded=True)
    if failures:
        from colabfast.drive.mounting import failure_advice

        raise StageError(src, dst, failures, len(todo) + len(unreadable or {}),
                         failure_advice(src, list(failures.values())))


def _remove_partials(root: Optional[Path], targets: list[Path]) -> None:
    """Delete partial files an interrupted run left behind (under ``root``, or of ``targets``)."""
    if root is None:
        for target in targets:
            with contextlib.suppress(OSError):
                partial_path(target).unlink()
        return
    for folder, _, names in os.walk(root):
        for name in names:
            if is_partial_name(name):  # only what colabfast names so: notes.colabfast-partial is a user's
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))


class _SourceChanged(OSError):
    """A source file's size, modification or change time, or inode differs before and after its copy."""

    def __init__(self, path: Path, what: str = "copied"):
        super().__init__(errno.EAGAIN, f"{path} changed while it was {what} (size, modification or change time, "
                                       f"or inode differ before and after): is something writing to it?")


class _Source:
    """A source file open for reading: reads retried per request, re-opened after transient errors
    (a restarted Drive client invalidates open handles), and its identity kept to detect changes."""

    def __init__(self, path: Path, retries: int):
        self.path, self.retries = path, retries
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:  # listed but not opened: Drive's lag with new files, retried
            stale = lagging(path, exc)
            if stale is None:
                raise
            raise stale from exc
        self.st = os.fstat(self.fd)
        self._lock = threading.Lock()

    def pread(self, n: int, offset: int) -> bytes:
        return pread_retrying(lambda n, offset: os.pread(self.fd, n, offset), n, offset, self.retries, self._reopen)

    def _reopen(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            os.close(self.fd)
            self.fd = fd

    def same_as(self, st: os.stat_result) -> bool:
        return same_identity(st, self.st)

    def check_unchanged(self) -> None:
        """Raise _SourceChanged if the file at ``path`` is no longer what was opened (or was written)."""
        if not self.same_as(retry(lambda: os.stat(self.path), self.retries)):
            raise _SourceChanged(self.path)

    def close(self) -> None:
        os.close(self.fd)


class _Copier:
    """Copies files with a thread pool: small files whole, big files as parallel ranges."""

    def __init__(self, src: Path, target_of: Callable[[str], Path], verify: str, retries: int, hashes: Hashes):
        self.src, self.target_of, self.verify, self.retries = src, target_of, verify, retries
        self.hashes = hashes
        self._done = 0  # bytes copied, updated by worker threads
        self._lock = threading.Lock()
        self.abort = threading.Event()  # set when the run is interrupted
        self.cancel: Optional[threading.Event] = None  # set by another thread: stop (stage's cancel)
        self._queue: collections.deque = collections.deque()  # (FileEntry, attempt) still to start
        self._ranges: collections.deque = collections.deque()  # (FileEntry, task) ranges of started big files
        self._big: list[_BigFile] = []

    def _check_abort(self) -> None:
        if self.abort.is_set():
            raise OSError(errno.ECANCELED, "staging was interrupted")

    def _add(self, n: int) -> None:
        with self._lock:
            self._done += n

    def run(self, todo: list[FileEntry], workers: int, progress: bool, desc: str) -> dict[str, BaseException]:
        """Copy ``todo``; returns the files that failed after their retries (rel -> exception)."""
        from tqdm.auto import tqdm

        failures: dict[str, BaseException] = {}
        self._queue.extend((f, 0) for f in todo)
        pending: dict[Future, FileEntry] = {}
        finished, full = 0, False
        pool = ThreadPoolExecutor(workers, thread_name_prefix="colabfast-stage")
        bar = tqdm(total=sum(f.size for f in todo), unit="B", unit_scale=True,
                   desc=desc, disable=not progress)
        try:
            while True:
                while not full and len(pending) < 2 * workers and (task := self._next_task()):
                    pending[pool.submit(task[1])] = task[0]
                if not pending:
                    break
                if self.cancel is not None and self.cancel.is_set():
                    raise OSError(errno.ECANCELED, f"staging was cancelled ({desc})")
                done, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for fut in done:
                    f, exc = pending.pop(fut), fut.exception()
                    if exc is not None:
                        failures.setdefault(f.rel, exc)  # a big file's first failing range says why
                        full = full or (isinstance(exc, OSError) and exc.errno == errno.ENOSPC)
                    elif fut.result():  # a whole file finished (ranges report False until the last)
                        finished += 1
                bar.update(self._done - bar.n)
                bar.set_postfix_str(f"{finished}/{len(todo)} files", refresh=False)
        except BaseException:  # KeyboardInterrupt from the notebook, or an error of ours
            self.abort.set()  # running copies stop at their next chunk and delete their partial file
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            bar.close()
            for big in self._big:  # ranges never run (a full disk, an interrupt): drop the partial file
                if big.left > 0:
                    with contextlib.suppress(OSError):
                        os.unlink(big.tmp)
        if full:
            raise NotEnoughSpace(errno.ENOSPC, f"the destination filled up while staging ({desc}); nothing incomplete "
                                 "was kept: free space and run stage() again to copy the rest")
        return failures

    def _next_task(self) -> Optional[tuple[FileEntry, Callable[[], bool]]]:
        if self._ranges:
            return self._ranges.popleft()
        if not self._queue:
            return None
        f, attempt = self._queue.popleft()
        if f.size < BIG_FILE:
            return f, (lambda: retry(lambda: self._copy_small(f), self.retries))
        big = _BigFile(self, f, attempt)
        self._big.append(big)
        self._ranges.extend((f, (lambda start=start: big.copy_range(start))) for start in range(0, f.size, RANGE))
        return self._ranges.popleft()

    def requeue(self, f: FileEntry, attempt: int) -> None:
        """Copy ``f`` again from the start (its source changed during the copy)."""
        self._queue.appendleft((f, attempt))

    def _copy_small(self, f: FileEntry) -> bool:
        target = self.target_of(f.rel)
        tmp = partial_path(target)
        h = hashlib.sha256() if self.verify == "sha256" else None
        copied = 0
        src = _Source(self.src / f.rel, self.retries)
        try:
            size = src.st.st_size  # what is there now: the scan may be older
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                while copied < size:
                    self._check_abort()
                    chunk = src.pread(min(CHUNK, size - copied), copied)
                    if not chunk:
                        raise _SourceChanged(src.path)  # it shrank
                    write_all(fd, chunk)
                    if h is not None:
                        h.update(chunk)
                    copied += len(chunk)
                    self._add(len(chunk))
                written = os.fstat(fd).st_size
            finally:
                os.close(fd)
            src.check_unchanged()
            if written != size:
                raise OSError(errno.EIO, f"{tmp} holds {written} bytes after copying {size}")
            if h is not None:
                self._verify_hash(tmp, [(0, size, h.hexdigest())], f)
            os.utime(tmp, ns=(src.st.st_mtime_ns, src.st.st_mtime_ns))
            os.replace(tmp, target)
        except BaseException:
            self._add(-copied)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            src.close()
        return True

    def _verify_hash(self, tmp: Path, ranges: list[tuple[int, int, str]], f: FileEntry) -> None:
        """Re-read the written file; each (start, length, sha256 of source bytes) must match."""
        whole = hashlib.sha256()
        with open(tmp, "rb") as fin:
            for start, length, expected in sorted(ranges):
                fin.seek(start)
                part = hashlib.sha256()
                left = length
                while left and (chunk := fin.read(min(CHUNK, left))):
                    part.update(chunk)
                    whole.update(chunk)
                    left -= len(chunk)
                if part.hexdigest() != expected:
                    raise OSError(errno.EIO, f"{tmp}: bytes {start}..{start + length} differ from "
                                             f"{self.src / f.rel} after copying (local write error?)")
        self.hashes.add(f.rel, whole.hexdigest())


class _BigFile:
    """One large file copied as ``RANGE``-byte ranges by several threads into one preallocated partial file,
    copied again (up to ``retries`` times) if the source changes meanwhile.
    """

    def __init__(self, copier: _Copier, f: FileEntry, attempt: int):
        self.copier, self.f, self.attempt = copier, f, attempt
        self.path = copier.src / f.rel
        self.target = copier.target_of(f.rel)
        self.tmp = partial_path(self.target)
        self.left = -(-f.size // RANGE)
        self.ranges: list[tuple[int, int, str]] = []
        self.failed = self.changed = False
        self.identity: Optional[os.stat_result] = None
        self.written = 0
        self.lock = threading.Lock()

    def _start(self) -> None:
        """Note the source's identity and allocate the partial file (once, by the first range)."""
        st = retry(lambda: os.stat(self.path), self.copier.retries)
        if st.st_size != self.f.size:  # the ranges were cut for another size
            raise _SourceChanged(self.path)
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.posix_fallocate(fd, 0, self.f.size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                os.close(fd)
                raise
            os.ftruncate(fd, self.f.size)  # no fallocate here: every write is still checked
        os.close(fd)
        self.identity = st

    def copy_range(self, start: int) -> bool:
        length = min(RANGE, self.f.size - start)
        try:
            with self.lock:
                if self.identity is None and not (self.failed or self.changed):
                    self._start()
            if self.failed:
                raise OSError(errno.ECANCELED, "another range of this file failed")
            digest = "" if self.changed else retry(lambda: self._copy(start, length), self.copier.retries)
        except _SourceChanged:
            self.changed = True
            digest = ""
        except BaseException:
            with self.lock:
                self.failed = True
                self.left -= 1
                last = self.left == 0
            if last:
                with contextlib.suppress(OSError):
                    os.unlink(self.tmp)
            raise
        with self.lock:
            self.ranges.append((start, length, digest))
            self.written += 0 if self.changed else length
            self.left -= 1
            last = self.left == 0 and not self.failed
        if last:
            self._finish()
        return last and not self.changed

    def _copy(self, start: int, length: int) -> str:
        h = hashlib.sha256() if self.copier.verify == "sha256" else None
        done = 0
        src = _Source(self.path, self.copier.retries)
        try:
            assert self.identity is not None
            if not src.same_as(self.identity):
                exc = _SourceChanged(self.path)
                exc.attempts = 1  # type: ignore[attr-defined]  # not retried per range: the file is
                raise exc
            fd_out = os.open(self.tmp, os.O_WRONLY | os.O_CLOEXEC)
            try:
                while done < length:
                    self.copier._check_abort()
                    chunk = src.pread(min(4 * CHUNK, length - done), start + done)
                    if not chunk:  # it ended early
                        exc = _SourceChanged(self.path)
                        exc.attempts = 1  # type: ignore[attr-defined]
                        raise exc
                    write_all(fd_out, chunk, start + done)
                    if h is not None:
                        h.update(chunk)
                    done += len(chunk)
                    self.copier._add(len(chunk))
            finally:
                os.close(fd_out)
        except BaseException:
            self.copier._add(-done)
            raise
        finally:
            src.close()
        return h.hexdigest() if h is not None else ""

    def _finish(self) -> None:
        try:
            if not self.changed:
                self.changed = not same_identity(retry(lambda: os.stat(self.path), self.copier.retries),
                                                  self.identity)
            if self.changed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.tmp)
                if self.attempt >= self.copier.retries:
                    exc = _SourceChanged(self.path)
                    exc.attempts = self.attempt + 1  # type: ignore[attr-defined]
                    raise exc
                self.copier._add(-self.written)
                st = retry(lambda: os.stat(self.path), self.copier.retries)
                self.copier.requeue(FileEntry(self.f.rel, st.st_size, st.st_mtime_ns), self.attempt + 1)
                return
            if self.written != self.f.size or os.path.getsize(self.tmp) != self.f.size:
                raise OSError(errno.EIO, f"{self.tmp} has the wrong size after copying")
            if self.copier.verify == "sha256":
                self.copier._verify_hash(self.tmp, self.ranges, self.f)
            mtime_ns = self.identity.st_mtime_ns  # type: ignore[union-attr]
            os.utime(self.tmp, ns=(mtime_ns, mtime_ns))
            os.replace(self.tmp, self.target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            raise


def same_identity(a: os.stat_result, b: Optional[os.stat_result]) -> bool:
    """The same file, unchanged: size, modification and change time, inode and device."""
    return b is not None and (a.st_size, a.st_mtime_ns, a.st_ctime_ns, a.st_ino, a.st_dev) == \
        (b.st_size, b.st_mtime_ns, b.st_ctime_ns, b.st_ino, b.st_dev)


