"""Safe, streaming extraction of ``.zip`` and ``.tar[.gz|.bz2|.xz]`` archives.

Archives are untrusted input. Every entry must land inside the destination: names that are absolute
or climb out with ``..``, links that point outside, and device files or pipes are refused with
:class:`UnsafeArchiveError`. Tar members go through the standard library's ``data`` extraction
filter (PEP 706), which also drops ownership and dangerous mode bits; zip has no such filter, so its
entries get the same checks here.

Archives are read while they are extracted, with parallel readahead (no intermediate copy), so a
tar.gz on Google Drive extracts at the link's bandwidth.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Optional

from colabfast._fileio import ReadaheadFile

# Longest first, so "x.tar.gz" is not taken for ".gz".
ARCHIVE_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tbz2", ".txz", ".tar", ".zip")


class UnsafeArchiveError(ValueError):
    """An archive entry would land outside the destination, or is a device file.

    Attributes:
        archive: the archive's path.
        member: the offending entry's name.
    """

    def __init__(self, archive: os.PathLike | str, member: str, why: str):
        self.archive, self.member = str(archive), member
        super().__init__(
            f"refusing to extract {archive}: entry {member!r} {why}. The archive is unsafe (or was made "
            f"with absolute paths); nothing outside the destination was written. Re-create it with "
            f"relative paths inside one folder."
        )


def archive_suffix(path: os.PathLike | str) -> Optional[str]:
    """The archive suffix of ``path`` (``".tar.gz"``, ``".zip"``, ...), or None for other files."""
    name = os.fspath(path).lower()
    return next((s for s in ARCHIVE_SUFFIXES if name.endswith(s)), None)


def strip_archive_suffix(name: str) -> str:
    """``"kitti.tar.gz"`` -> ``"kitti"``; names without an archive suffix are returned unchanged."""
    suffix = archive_suffix(name)
    return name[: -len(suffix)] if suffix else name


def extracted_size(path: os.PathLike | str) -> int:
    """Bytes the archive will take once extracted: exact for zip, an estimate for tar.

    A ``.tar`` is about its own size. For ``.tar.gz`` the gzip trailer holds the size modulo 2**32
    (RFC 1952, ISIZE); wrapping is undone by assuming the tar is at least 90% of the compressed size,
    which holds for images and other compressed media. bz2 and xz record no size: their archive
    size is the estimate.
    """
    path = os.fspath(path)
    size = os.path.getsize(path)
    suffix = archive_suffix(path)
    if suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            return sum(info.file_size for info in zf.infolist())
    if suffix in (".tar.gz", ".tgz") and size >= 4:
        with open(path, "rb") as f:
            f.seek(-4, io.SEEK_END)
            isize = int.from_bytes(f.read(4), "little")
        while isize < 0.9 * size:
            isize += 1 << 32
        return isize
    return size


def _checked_name(archive: Path, name: str) -> str:
    """The normalised relative path of an archive entry, or UnsafeArchiveError."""
    if "\x00" in name:
        raise UnsafeArchiveError(archive, name, "contains a NUL byte")
    unixy = name.replace("\\", "/")
    if unixy.startswith("/") or (len(unixy) > 1 and unixy[1] == ":"):
        raise UnsafeArchiveError(archive, name, "has an absolute path")
    norm = posixpath.normpath(unixy)
    if norm == ".." or norm.startswith("../"):
        raise UnsafeArchiveError(archive, name, "would land outside the destination ('..')")
    return norm


def _unchanged(target: Path, size: int, mtime: float) -> bool:
    """True if ``target`` was already extracted: same size and mtime (resuming an extraction)."""
    try:
        st = target.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size and int(st.st_mtime) == int(mtime)


def extract(
    archive: os.PathLike | str,
    dst: os.PathLike | str,
    *,
    retries: int = 5,
    on_progress: Optional[Callable[[int], None]] = None,
) -> None:
    """Extract ``archive`` into the folder ``dst``, skipping entries already extracted unchanged.

    Args:
        archive: a ``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``/``.tbz2`` or
            ``.tar.xz``/``.txz`` file (the format is read from the content for tar).
        dst: destination folder, created if missing. Entries already there with the same size and
            modification time are skipped, so an interrupted extraction resumes.
        retries: retries of each read for transient mount errors (EIO, ENOTCONN, ...).
        on_progress: called with the number of archive bytes read so far.

    Raises:
        UnsafeArchiveError: an entry is absolute, climbs out with ``..``, is a link pointing outside
            ``dst``, or is a device file or pipe. Zip names are all checked before anything is
            written; tar is a stream, so entries before the bad one may already be in ``dst``.
        tarfile.TarError, zipfile.BadZipFile: the archive is corrupt (CRC or format errors).
        OSError: reading failed after the retries, or writing failed (e.g. ENOSPC).
    """
    archive, dst = Path(archive), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    with ReadaheadFile(archive, retries=retries) as raw, io.BufferedReader(raw, 1 << 20) as f:
        report = (lambda: on_progress(raw.tell())) if on_progress else (lambda: None)
        if archive_suffix(archive) == ".zip":
            _extract_zip(archive, f, dst, report)
        else:
            _extract_tar(archive, f, dst, report)
        report()


def _extract_tar(archive: Path, f: io.BufferedReader, dst: Path, report: Callable[[], None]) -> None:
    if not hasattr(tarfile, "data_filter"):
        raise RuntimeError(
            f"extracting {archive} safely needs tarfile's extraction filters (PEP 706): "
            "Python 3.9.17+, 3.10.12+, 3.11.4+ or 3.12+"
        )
    # tarfile's own stream mode re-slices its buffer on every read (1.5x slower here); a
    # decompressing file object read strictly forwards in "r:" mode is the same single pass.
    with _decompressed(f) as stream, tarfile.open(fileobj=stream, mode="r:") as tar:
        tar.errorlevel = 2  # raise on every extraction problem, not only fatal ones
        for member in tar:
            _checked_name(archive, member.name)  # the data filter would strip a leading "/"; refuse
            if member.isfile() and _unchanged(dst / member.name, member.size, member.mtime):
                continue
            try:
                tar.extract(member, dst, filter="data")
            except tarfile.FilterError as exc:
                raise UnsafeArchiveError(archive, member.name, _filter_reason(exc)) from exc
            report()


def _decompressed(f: io.BufferedReader) -> io.IOBase:
    """A file object of the tar inside ``f``, by the compression's magic bytes (gzip, bzip2, xz)."""
    head = f.peek(6)[:6]
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=f, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(f)
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(f)
    return contextlib.nullcontext(f)


def _filter_reason(exc: tarfile.FilterError) -> str:
    reasons = {
        "AbsolutePathError": "has an absolute path",
        "OutsideDestinationError": "would land outside the destination",
        "SpecialFileError": "is a device file, pipe or other special file",
        "AbsoluteLinkError": "is a link to an absolute path",
        "LinkOutsideDestinationError": "is a link pointing outside the destination",
    }
    return reasons.get(type(exc).__name__, str(exc))


def _extract_zip(archive: Path, f: io.BufferedReader, dst: Path, report: Callable[[], None]) -> None:
    with zipfile.ZipFile(f) as zf:
        # Check every name before writing anything; then read in file order so reads stay sequential.
        plan = [(info, _checked_name(archive, info.filename)) for info in zf.infolist()]
        for info, _ in plan:
            mode = info.external_attr >> 16 if info.create_system == 3 else 0
            if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                raise UnsafeArchiveError(archive, info.filename, "is a device file, pipe or other special file")
        plan.sort(key=lambda item: item[0].header_offset)
        root = os.path.realpath(dst)
        for info, name in plan:
            target = dst / name
            mode = info.external_attr >> 16 if info.create_system == 3 else 0
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            mtime = time.mktime(info.date_time + (0, 0, -1))
            if stat.S_ISLNK(mode):
                link = zf.read(info).decode("utf-8")
                resolved = os.path.realpath(os.path.join(os.path.dirname(target), link))
                if os.path.isabs(link) or not (resolved == root or resolved.startswith(root + os.sep)):
                    raise UnsafeArchiveError(archive, info.filename, "is a link pointing outside the destination")
                if target.is_symlink() or target.exists():
                    target.unlink()
                os.symlink(link, target)
                continue
            if _unchanged(target, info.file_size, mtime):
                continue
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.utime(target, (mtime, mtime))
            report()
