"""Copy a dataset from a slow mount (Google Drive) to fast local storage: :func:`stage`.

Drive is a FUSE filesystem where every open and every read request is a network round trip, so
``cp -r`` of many small files crawls. ``stage`` overlaps the round trips with threads (the latency
is in the mount, not the CPU), splits large files into ranges read in parallel, extracts archives
while reading them, and makes the result trustworthy: each file is written under a temporary name
and renamed once complete, re-runs skip what is already there, and transient mount errors are
retried.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

from colabfast import env
from colabfast._fileio import (
    PARTIAL_SUFFIX,
    FileEntry,
    PathLike,
    human_bytes,
    partial_path,
    read_json,
    retry,
    scan_tree,
    write_json_atomic,
)
from colabfast.archive import archive_suffix, extract, extracted_size, strip_archive_suffix

MANIFEST_FORMAT = "colabfast-stage"
MANIFEST_VERSION = 1
CHUNK = 1 << 20  # bytes per read() when copying a file
BIG_FILE = 64 << 20  # files at least this large are copied as parallel ranges
RANGE = 16 << 20  # bytes per range of a big file
RAM_FRACTION = 0.5  # to="auto" stages to RAM when the data takes at most this share of spare RAM


class StageError(OSError):
    """Some files could not be staged; the others are staged and stay.

    Attributes:
        failures: source path (relative to the staged root) -> the exception that stopped it.
        dst: where the successful files are.
    """

    def __init__(self, src: Path, dst: Path, failures: dict[str, BaseException], total: int):
        self.failures, self.dst = failures, dst
        shown = sorted(failures.items())[:20]
        lines = "".join(f"\n  {rel}: {_describe(exc)}" for rel, exc in shown)
        more = f"\n  ... and {len(failures) - len(shown)} more" if len(failures) > len(shown) else ""
        super().__init__(
            errno.EIO,
            f"{len(failures)} of {total} files could not be staged from {src} to {dst}:{lines}{more}\n"
            f"The other files are staged and stay; run stage() again to retry only the missing ones.",
        )

    def __str__(self) -> str:
        return self.strerror


def _describe(exc: BaseException) -> str:
    attempts = getattr(exc, "attempts", 1)
    return f"{exc}" + (f" (after {attempts} attempts)" if attempts > 1 else "")


def stage(
    src: Union[PathLike, Sequence[PathLike]],
    dst: Optional[PathLike] = None,
    *,
    to: str = "auto",
    workers: Optional[int] = None,
    verify: str = "size",
    retries: int = 5,
    progress: bool = True,
) -> Path:
    """Copy a folder, file or archive from a slow mount (Drive) to local disk or RAM.

    Safe to re-run: files already staged and unchanged (same size and modification time, as rsync's
    quick check; plus the SHA-256 recorded when they were copied, with ``verify="sha256"``) are
    skipped, so re-running a cell after an interruption copies only what is missing. Each file is
    written as ``.NAME.colabfast-partial`` and renamed when complete and verified, so nothing partial
    ever looks complete. A manifest ``.NAME.colabfast-stage.json`` beside the destination records
    the state; a lock file beside it keeps two runs from staging the same destination at once.

    Args:
        src: a folder (copied recursively, following symlinks), a single file, or an archive
            (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``/``.tbz2``, ``.tar.xz``/``.txz``),
            which is extracted while it is read, with no intermediate copy (see
            :mod:`colabfast.archive` for what is refused as unsafe); or a list of archives that
            together make one dataset, extracted into one folder (KITTI's
            ``data_object_image_2.zip``, ``data_object_label_2.zip`` and ``data_object_calib.zip``).
        dst: where to put it. For a folder or an archive, the folder to create; for a file, the
            file path (or an existing folder to put it in). Default: ``/content/<name>`` in Colab,
            ``<tempdir>/colabfast/<name>`` elsewhere, or ``<ramdisk>/<name>`` per ``to``; an
            archive's name loses its suffix (``kitti.tar.gz`` -> ``kitti``).
        to: where a default ``dst`` goes: ``"disk"``, ``"ram"`` (a tmpfs from
            :func:`colabfast.ramdisk`) or ``"auto"``: where an earlier stage of the same source
            already is, else RAM when the data takes at most half of the RAM colabfast may use
            (free RAM minus :func:`colabfast.env.ram_headroom`), else disk. Only with ``dst=None``.
        workers: files copied at once (threads). Default: 64 from a FUSE mount such as Drive,
            where the time goes to round trips, else 16.
        verify: ``"size"``: a copy must have exactly the source's size. ``"sha256"``: also hash
            the bytes read from the source and the bytes written, compare, and record the hash;
            re-runs then re-hash the staged files (reading them locally, not from Drive).
        retries: retries per file (or per range) for transient mount errors (EIO, ENOTCONN,
            ETIMEDOUT, EAGAIN), waiting 0.25 s, 0.5 s, 1 s, ... (capped at 8 s) between attempts.
        progress: show a tqdm progress bar (a widget in notebooks) with bytes, files and MB/s.

    Returns:
        The staged path: the folder, the file, or for an archive the extraction folder (or, when
        the archive holds a single top-level folder, that folder inside it).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        ValueError: bad arguments, or ``dst`` is an existing folder colabfast did not stage.
        OSError: ``errno.ENOSPC`` before copying when the destination lacks space, with the numbers
            (from DriveFS, reading also fills Drive's local cache, so twice the data is needed).
        StageError: some files failed after their retries; it lists them. The others stay staged.
        colabfast.archive.UnsafeArchiveError: a hostile archive; nothing is left at ``dst``.
    """
    if verify not in ("size", "sha256"):
        raise ValueError(f"verify must be 'size' or 'sha256', not {verify!r}")
    if to not in ("auto", "disk", "ram"):
        raise ValueError(f"to must be 'auto', 'disk' or 'ram', not {to!r}")
    if dst is not None and to != "auto":
        raise ValueError(f"pass dst or to, not both: to={to!r} only picks a default destination")
    if isinstance(src, (list, tuple)):
        archives = [Path(os.path.abspath(a)) for a in src]
        if not archives or not all(archive_suffix(a) for a in archives):
            raise ValueError("a list of sources must be archives (.zip, .tar, .tar.gz, ...), extracted into one folder")
        for a in archives:
            if not a.is_file():
                raise FileNotFoundError(errno.ENOENT, f"nothing to stage: {a} does not exist", str(a))
        size = sum(retry(lambda a=a: extracted_size(a), retries) for a in archives)
        target = _destination(strip_archive_suffix(archives[0].name), dst, to, size)
        with _locked(target):
            return _stage_archive(archives, target, verify, retries, progress)
    src = Path(os.path.abspath(src))
    try:
        st = retry(lambda: os.stat(src), retries)  # Drive may be briefly disconnected even now
    except FileNotFoundError:
        hint = " Is Drive mounted? Call colabfast.mount() first." if "/drive/" in str(src) else ""
        raise FileNotFoundError(errno.ENOENT, f"nothing to stage: {src} does not exist.{hint}", str(src)) from None
    if workers is None:
        workers = 64 if env.is_fuse(src) else 16
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")

    if stat.S_ISDIR(st.st_mode):
        files, dirs = scan_tree(src, workers, retries)
        target = _destination(src.name, dst, to, sum(f.size for f in files))
        _check_not_nested(src, target)
        with _locked(target):
            _stage_tree(src, target, files, dirs, workers, verify, retries, progress)
        return target
    if archive_suffix(src):
        target = _destination(strip_archive_suffix(src.name), dst, to, retry(lambda: extracted_size(src), retries))
        _check_not_nested(src, target)
        with _locked(target):
            return _stage_archive([src], target, verify, retries, progress)
    target = _destination(src.name, dst, to, st.st_size)
    if target.is_dir():
        target = target / src.name
    _check_not_nested(src, target)
    with _locked(target):
        _stage_tree(src.parent, target.parent, [FileEntry(src.name, st.st_size, st.st_mtime_ns)], [],
                    workers, verify, retries, progress, rename={src.name: target.name})
    return target


# --- destination, space, locking -------------------------------------------------------------------


def _destination(name: str, dst: Optional[PathLike], to: str, nbytes: int) -> Path:
    if dst is not None:
        return Path(os.path.abspath(dst))
    disk = env.work_dir() / name
    if to == "disk":
        return disk
    from colabfast.tmpfs import ramdisk, ramdisk_path

    if to == "ram":
        return ramdisk() / name
    if _manifest_path(disk).exists():
        return disk
    mounted = ramdisk_path()
    if mounted is not None and _manifest_path(mounted / name).exists():
        return mounted / name
    if nbytes <= RAM_FRACTION * (env.ram_available() - env.ram_headroom()):
        with contextlib.suppress(OSError, ValueError):
            return ramdisk() / name
    return disk


def _check_not_nested(src: Path, dst: Path) -> None:
    s, d = os.path.realpath(src), os.path.realpath(dst)
    if s == d or d.startswith(s + os.sep) or s.startswith(d + os.sep):
        raise ValueError(f"cannot stage {src} into {dst}: one is inside the other")


def check_space(nbytes: int, dst: Path, src: Path) -> None:
    """Raise ``OSError(ENOSPC)`` unless ``dst`` can take ``nbytes`` more (more from DriveFS).

    Reading through DriveFS (Colab's Drive client) also stores what is read in its local cache
    (``~/.config/Google/DriveFS``), so copying N bytes from it takes 2N when that cache shares the
    destination's disk, and N on the cache's disk otherwise. A tmpfs destination must also fit in
    the RAM colabfast may use (free RAM minus :func:`colabfast.env.ram_headroom`).
    """
    if nbytes <= 0:
        return
    drive_cache = env.drive_kind(src) == "drivefs"
    cache_dir = env.drivefs_dir()
    free = env.disk_free(dst)
    same_disk = drive_cache and _same_filesystem(dst, cache_dir)
    need = 2 * nbytes if same_disk else nbytes
    if need > free:
        why = f" (2 x {human_bytes(nbytes)}: Drive caches what it reads)" if same_disk else ""
        raise OSError(errno.ENOSPC, f"not enough free space on {_mountpoint(dst)}: need {human_bytes(need)}"
                      f"{why}, have {human_bytes(free)}. Free some space, stage a subset, or pack the "
                      f"data into a smaller mirror (colabfast.pack with image_size=...).")
    if env.is_ram(dst):
        spare = env.ram_available() - env.ram_headroom()
        if nbytes > spare:
            raise OSError(errno.ENOSPC, f"{human_bytes(nbytes)} will not fit in RAM at {dst}: "
                          f"{human_bytes(env.ram_available())} free, of which colabfast keeps "
                          f"{human_bytes(env.ram_headroom())} for training. Stage to disk (to='disk').")
    if drive_cache and not same_disk and nbytes > env.disk_free(cache_dir):
        raise OSError(errno.ENOSPC, f"not enough free space for Drive's cache on {_mountpoint(cache_dir)}: "
                      f"need {human_bytes(nbytes)}, have {human_bytes(env.disk_free(cache_dir))}.")


def _same_filesystem(a: Path, b: Path) -> bool:
    def dev(p: Path) -> int:
        while not p.exists() and p != p.parent:
            p = p.parent
        return p.stat().st_dev

    return dev(Path(os.path.abspath(a))) == dev(Path(os.path.abspath(b)))


def _mountpoint(path: Path) -> str:
    m = env.mount_of(Path(path).parent if not Path(path).exists() else path)
    return m.mountpoint if m else str(path)


def _manifest_path(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}.colabfast-stage.json")


@contextlib.contextmanager
def _locked(dst: Path) -> Iterator[None]:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst.with_name(f".{dst.name}.colabfast-stage.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _new_manifest(src: Union[Path, str, list], complete: bool, **extra) -> dict:
    source = src if isinstance(src, list) else str(src)
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "source": source, "complete": complete, **extra}


# --- folders and single files ----------------------------------------------------------------------


def _unchanged(path: Path, f: FileEntry) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == f.size and st.st_mtime_ns == f.mtime_ns


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stage_tree(
    src: Path,
    dst: Path,
    files: list[FileEntry],
    dirs: list[str],
    workers: int,
    verify: str,
    retries: int,
    progress: bool,
    rename: Optional[dict[str, str]] = None,
) -> None:
    """Copy ``files`` (relative to ``src``) to ``dst``, skipping unchanged ones."""
    manifest_path = _manifest_path(dst if not rename else dst / next(iter(rename.values())))
    old = read_json(manifest_path) or {}
    hashes: dict[str, str] = dict(old.get("sha256") or {}) if verify == "sha256" else {}
    target_of = (lambda rel: dst / rename.get(rel, rel)) if rename else (lambda rel: dst / rel)

    dst.mkdir(parents=True, exist_ok=True)
    for d in dirs:
        (dst / d).mkdir(parents=True, exist_ok=True)

    todo = [f for f in files if not _unchanged(target_of(f.rel), f)]
    if verify == "sha256":  # unchanged by size and mtime; now check content against the record
        copying = set(todo)
        same = [f for f in files if f not in copying]
        with ThreadPoolExecutor(env.cpu_count()) as pool:
            digests = pool.map(lambda f: _sha256_of(target_of(f.rel)), same)
            todo += [f for f, d in zip(same, digests) if hashes.get(f.rel) != d]
    if not todo:
        if not old.get("complete"):
            write_json_atomic(manifest_path, _new_manifest(src, True, sha256=hashes or None))
        return

    check_space(sum(f.size for f in todo), dst, src)
    write_json_atomic(manifest_path, _new_manifest(src, False, sha256=hashes or None))
    if old and not old.get("complete"):
        _remove_partials(dst)
    copier = _Copier(src, target_of, verify, retries)
    name = next(iter(rename.values())) if rename else dst.name
    failures = copier.run(todo, workers, progress, desc=f"stage {name}")
    hashes.update(copier.hashes)
    write_json_atomic(manifest_path, _new_manifest(src, not failures, sha256=hashes or None))
    if failures:
        raise StageError(src, dst, failures, len(todo))


def _remove_partials(root: Path) -> None:
    """Delete partial files an interrupted run left behind."""
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(PARTIAL_SUFFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))


class _Copier:
    """Copies files with a thread pool: small files whole, big files as parallel ranges."""

    def __init__(self, src: Path, target_of, verify: str, retries: int):
        self.src, self.target_of, self.verify, self.retries = src, target_of, verify, retries
        self.hashes: dict[str, str] = {}
        self._done = 0  # bytes copied, updated by worker threads
        self._lock = threading.Lock()
        self.abort = threading.Event()  # set when the run is interrupted

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
        tasks = self._tasks(todo)
        pending: dict[Future, FileEntry] = {}
        finished, full = 0, False
        pool = ThreadPoolExecutor(workers, thread_name_prefix="colabfast-stage")
        bar = tqdm(total=sum(f.size for f in todo), unit="B", unit_scale=True,
                   desc=desc, disable=not progress)
        try:
            while True:
                while not full and len(pending) < 2 * workers and (task := next(tasks, None)):
                    pending[pool.submit(task[1])] = task[0]
                if not pending:
                    break
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
        if full:
            raise OSError(errno.ENOSPC, f"the destination filled up while staging ({desc}); "
                          "free space and run stage() again to copy the rest")
        return failures

    def _tasks(self, todo: Iterable[FileEntry]):
        for f in todo:
            if f.size < BIG_FILE:
                yield f, (lambda f=f: retry(lambda: self._copy_small(f), self.retries))
            else:
                big = _BigFile(self, f)
                for start in range(0, f.size, RANGE):
                    yield f, (lambda big=big, start=start: big.copy_range(start))

    def _copy_small(self, f: FileEntry) -> bool:
        target = self.target_of(f.rel)
        tmp = partial_path(target)
        h = hashlib.sha256() if self.verify == "sha256" else None
        copied = 0
        try:
            with open(self.src / f.rel, "rb", buffering=0) as fin, open(tmp, "wb", buffering=0) as fout:
                buf = memoryview(bytearray(min(max(f.size, 1), CHUNK) + 1))
                while n := fin.readinto(buf):
                    self._check_abort()
                    fout.write(buf[:n])
                    if h is not None:
                        h.update(buf[:n])
                    copied += n
                    self._add(n)
            if copied != f.size:
                raise OSError(errno.EAGAIN, f"{self.src / f.rel} changed while staging: expected "
                                            f"{f.size} bytes, read {copied}")
            if h is not None:
                self._verify_hash(tmp, [(0, f.size, h.hexdigest())], f)
            os.utime(tmp, ns=(f.mtime_ns, f.mtime_ns))
            os.replace(tmp, target)
        except BaseException:
            self._add(-copied)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
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
        with self._lock:
            self.hashes[f.rel] = whole.hexdigest()


class _BigFile:
    """One large file copied as ``RANGE``-byte ranges by several threads into one partial file."""

    def __init__(self, copier: _Copier, f: FileEntry):
        self.copier, self.f = copier, f
        self.target = copier.target_of(f.rel)
        self.tmp = partial_path(self.target)
        self.left = -(-f.size // RANGE)
        self.ranges: list[tuple[int, int, str]] = []
        self.failed = False
        self.lock = threading.Lock()
        with open(self.tmp, "wb") as out:
            out.truncate(f.size)

    def copy_range(self, start: int) -> bool:
        length = min(RANGE, self.f.size - start)
        try:
            if self.failed:
                raise OSError(errno.ECANCELED, "another range of this file failed")
            digest = retry(lambda: self._copy(start, length), self.copier.retries)
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
            self.left -= 1
            last = self.left == 0 and not self.failed
        if last:
            self._finish()
        return last

    def _copy(self, start: int, length: int) -> str:
        h = hashlib.sha256() if self.copier.verify == "sha256" else None
        done = 0
        try:
            with open(self.copier.src / self.f.rel, "rb", buffering=0) as fin:
                fd_out = os.open(self.tmp, os.O_WRONLY)
                try:
                    while done < length:
                        self.copier._check_abort()
                        chunk = os.pread(fin.fileno(), min(4 * CHUNK, length - done), start + done)
                        if not chunk:
                            raise OSError(errno.EAGAIN, f"{self.copier.src / self.f.rel} changed while "
                                                        f"staging: it ended at byte {start + done}")
                        os.pwrite(fd_out, chunk, start + done)
                        if h is not None:
                            h.update(chunk)
                        done += len(chunk)
                        self.copier._add(len(chunk))
                finally:
                    os.close(fd_out)
        except BaseException:
            self.copier._add(-done)
            raise
        return h.hexdigest() if h is not None else ""

    def _finish(self) -> None:
        try:
            if os.path.getsize(self.tmp) != self.f.size:
                raise OSError(errno.EIO, f"{self.tmp} has the wrong size after copying")
            if self.copier.verify == "sha256":
                self.copier._verify_hash(self.tmp, self.ranges, self.f)
            os.utime(self.tmp, ns=(self.f.mtime_ns, self.f.mtime_ns))
            os.replace(self.tmp, self.target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            raise


# --- archives --------------------------------------------------------------------------------------


def _stage_archive(archives: list[Path], dst: Path, verify: str, retries: int, progress: bool) -> Path:
    """Extract ``archives`` (one, or several that together make one dataset) into the folder ``dst``."""
    from tqdm.auto import tqdm

    stats = [retry(lambda a=a: os.stat(a), retries) for a in archives]
    identity = [[str(a), st.st_size, st.st_mtime_ns] for a, st in zip(archives, stats)]
    source = str(archives[0]) if len(archives) == 1 else [str(a) for a in archives]
    names = ", ".join(a.name for a in archives)
    manifest_path = _manifest_path(dst)
    old = read_json(manifest_path) or {}
    ours = old.get("format") == MANIFEST_FORMAT and old.get("source") == source
    if ours and old.get("complete") and old.get("archive") == identity and dst.is_dir():
        if verify != "sha256" or _hashes_match(dst, old.get("sha256") or {}):
            return _single_top_folder(dst)
    if dst.exists() and not ours and (not dst.is_dir() or any(dst.iterdir())):
        raise ValueError(f"{dst} already exists and was not staged from {names}: remove it or pass another dst")

    check_space(sum(retry(lambda a=a: extracted_size(a), retries) for a in archives), dst, archives[0])
    work = partial_path(dst)  # resumable: entries already extracted there unchanged are skipped
    if old.get("archive") not in (None, identity) and work.exists():
        shutil.rmtree(work)  # other archives, or another version of them: start over
    write_json_atomic(manifest_path, _new_manifest(source, False, archive=identity))
    done = 0
    with tqdm(total=sum(st.st_size for st in stats), unit="B", unit_scale=True,
              desc=f"extract {names}", disable=not progress) as bar:
        for archive, st in zip(archives, stats):
            try:
                extract(archive, work, retries=retries, on_progress=lambda n, done=done: bar.update(done + n - bar.n))
            except ValueError:  # UnsafeArchiveError: keep nothing an attacker chose
                shutil.rmtree(work, ignore_errors=True)
                manifest_path.unlink()
                raise
            done += st.st_size
    hashes = None
    if verify == "sha256":
        hashes = {str(p.relative_to(work)): _sha256_of(p) for p in sorted(work.rglob("*"))
                  if p.is_file() and not p.is_symlink()}
    if dst.exists():
        shutil.rmtree(dst)  # an older staged version of these archives
    os.replace(work, dst)
    write_json_atomic(manifest_path, _new_manifest(source, True, archive=identity, sha256=hashes))
    return _single_top_folder(dst)


def _hashes_match(root: Path, hashes: dict[str, str]) -> bool:
    return all((root / rel).is_file() and _sha256_of(root / rel) == digest for rel, digest in hashes.items())


def _single_top_folder(root: Path) -> Path:
    entries = list(root.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else root
