"""Safe, streaming extraction of ``.zip`` and ``.tar[.gz|.bz2|.xz]`` archives.

Only folders and regular files inside the destination (links with ``allow_links``), written through
``O_NOFOLLOW`` folders; headers bounded before they are read; bytes counted against free space;
archives read with parallel readahead. Why: [Drive and staging](../drive-and-staging.md#how-it-works).
"""

from __future__ import annotations

import bz2
import contextlib
import errno
import gzip
import io
import lzma
import os
import posixpath
import re
import stat
import tarfile
import time
import zipfile
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, Optional

from colabfast.errors import NotEnoughSpace, UnsafeArchiveError, quoted
from colabfast.where._fileio import ReadaheadFile, human_bytes, partial_name, unchanged, write_all

__all__ = ["UnsafeArchiveError", "extract", "archive_suffix", "extracted_size"]

# Longest first, so "x.tar.gz" is not taken for ".gz".
ARCHIVE_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tbz2", ".txz", ".tar", ".zip")

CHUNK = 1 << 20  # bytes per write
SPACE_MARGIN = (1 << 20, 256 << 20)  # bytes left free on the destination: 2% of its size, within these
LINK_HOPS = 40  # links followed while resolving one link target (Linux's own limit, MAXSYMLINKS)
MAX_NAME = 4096  # bytes in an entry's name or link target (Linux's PATH_MAX)
MAX_HEADER = 1 << 20  # bytes in one tar header record (pax, GNU long name), checked before it is read
MAX_HEADERS = 8  # header records before one member (a pax header, a long name and a long link need 3)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_LINK_FIX = ("Datasets do not need links, so colabfast refuses them by default; nothing outside the "
             "destination was written. If you trust this archive, pass allow_links=True: links that "
             "stay inside the destination are then extracted.")


def archive_suffix(path: os.PathLike | str) -> Optional[str]:
    """The archive suffix of ``path`` (``".tar.gz"``, ``".zip"``, ...), or None for other files."""
    name = os.fspath(path).lower()
    return next((s for s in ARCHIVE_SUFFIXES if name.endswith(s)), None)


def strip_archive_suffix(name: str) -> str:
    """``"kitti.tar.gz"`` -> ``"kitti"``; names without an archive suffix are returned unchanged."""
    suffix = archive_suffix(name)
    return name[: -len(suffix)] if suffix else name


def extracted_size(path: os.PathLike | str) -> int:
    """Bytes the archive declares it will take extracted: exact for zip, about its size for ``.tar``, the
    gzip ISIZE (RFC 1952) unwrapped for ``.tar.gz``, the archive's size for bz2 and xz.
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


def safe_relpath(archive: os.PathLike | str, name: str, *, backslash_separators: bool = False) -> str:
    """The normalised relative POSIX path of the entry ``name`` (``""`` for the archive's root);
    ``backslash_separators=True`` reads backslashes as separators (``unzip``'s MS-DOS rule).

    Raises:
        UnsafeArchiveError: the name has a NUL byte, is absolute (``/x``, ``C:\\x``), or climbs out
            of the destination with ``..``.
    """
    if "\x00" in name:
        raise UnsafeArchiveError(archive, name, "contains a NUL byte")
    if len(name) > MAX_NAME:  # characters; the bytes are checked where a file is made (ENAMETOOLONG)
        raise UnsafeArchiveError(archive, name, f"has a name of {len(name)} characters (at most {MAX_NAME})")
    path = name.replace("\\", "/") if backslash_separators else name
    if path.startswith("/") or re.match(r"[A-Za-z]:[/\\]", path):
        raise UnsafeArchiveError(archive, name, "has an absolute path")
    norm = posixpath.normpath(path) if path else "."
    if norm == ".." or norm.startswith("../"):
        raise UnsafeArchiveError(archive, name, "would land outside the destination ('..')")
    return "" if norm == "." else norm


def check_tar_member(archive: os.PathLike | str, member: tarfile.TarInfo, *, allow_links: bool = False) -> str:
    """The safe relative path of a tar ``member``; folders and regular files pass, links with ``allow_links``.

    Raises:
        UnsafeArchiveError: an unsafe name, a device file, pipe or other special file, or a link.
    """
    name = safe_relpath(archive, member.name)
    if member.issym() or member.islnk():
        if not allow_links:
            kind = "symbolic" if member.issym() else "hard"
            raise UnsafeArchiveError(archive, member.name, f"is a {kind} link (to {quoted(member.linkname)})",
                                     _LINK_FIX)
        if len(member.linkname) > MAX_NAME:
            raise UnsafeArchiveError(archive, member.name, f"is a link to a target of {len(member.linkname)} "
                                                           f"characters (at most {MAX_NAME})")
    elif not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(archive, member.name, "is a device file, pipe or other special file")
    if not name and not member.isdir():
        raise UnsafeArchiveError(archive, member.name, "has no name")
    return name


def open_tar(archive: os.PathLike | str, stream: IO[bytes]) -> tarfile.TarFile:
    """``tarfile.open(fileobj=stream, mode="r:")`` for the tar ``archive``, each header record's declared size
    checked (at most :data:`MAX_HEADER` bytes, :data:`MAX_HEADERS` records) before it is read.

    Raises:
        UnsafeArchiveError: a header record over those bounds, or an extended sparse map.
        tarfile.TarError, EOFError: the archive is corrupt or truncated.
    """
    return tarfile.open(fileobj=stream, mode="r:", tarinfo=_bounded_tarinfo(archive))


def _bounded_tarinfo(archive: os.PathLike | str) -> type[tarfile.TarInfo]:
    """A ``TarInfo`` class that checks each header record's size before ``tarfile`` reads it (its
    documented extension point, ``_proc_member``), naming ``archive`` in its errors."""

    def refuse(info: tarfile.TarInfo, why: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(archive, info.name or f"(the header at byte {info.offset})", why)

    class BoundedTarInfo(tarfile.TarInfo):
        def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
            records = {tarfile.GNUTYPE_LONGNAME: "GNU long name", tarfile.GNUTYPE_LONGLINK: "GNU long link",
                       tarfile.XHDTYPE: "pax header", tarfile.SOLARIS_XHDTYPE: "pax header",
                       tarfile.XGLTYPE: "global pax header"}
            if self.type in records:
                what = records[self.type]
                chain = getattr(tar, "_colabfast_headers", 0) + 1
                if self.size > MAX_HEADER:
                    raise refuse(self, f"is a {what} record of {self.size} bytes (at most {MAX_HEADER})")
                if chain > MAX_HEADERS:
                    raise refuse(self, f"is header record {chain} in a row (at most {MAX_HEADERS})")
                if self.type == tarfile.XGLTYPE and self.size + _pax_size(tar.pax_headers) > MAX_HEADER:
                    raise refuse(self, f"takes the global pax fields over {MAX_HEADER} bytes")
                tar._colabfast_headers = chain  # type: ignore[attr-defined]
            else:
                tar._colabfast_headers = 0  # type: ignore[attr-defined]
                if self.type == tarfile.GNUTYPE_SPARSE and self._sparse_structs[1]:  # type: ignore[attr-defined]
                    raise refuse(self, "is a sparse file whose map goes on past its header (tar --sparse): "
                                       "datasets need none")
            return super()._proc_member(tar)  # type: ignore[misc]

        def _proc_gnusparse_10(self, next: tarfile.TarInfo, pax_headers: dict, tar: tarfile.TarFile) -> None:
            raise refuse(next, "is a sparse file in pax format 1.0 (tar --sparse), whose map is read from "
                               "its data: datasets need none")

    return BoundedTarInfo


def _pax_size(fields: Mapping[str, str]) -> int:
    return sum(len(k) + len(v) for k, v in fields.items())


def extract(
    archive: os.PathLike | str,
    dst: os.PathLike | str,
    *,
    allow_links: bool = False,
    retries: int = 5,
    on_progress: Optional[Callable[[int], None]] = None,
) -> None:
    """Extract ``archive`` into the folder ``dst``, skipping entries already extracted unchanged.

    Args:
        archive: a ``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``/``.tbz2`` or
            ``.tar.xz``/``.txz`` file (the format is read from the content for tar).
        dst: destination folder, created if missing; entries there with the same size and time are
            skipped (a resume); an entry given twice is written twice, the last wins.
        allow_links: extract links whose targets, resolved in the extracted tree, stay inside ``dst``
            (all checked again at the end; on failure the links made are removed).
        retries: retries of each read for transient mount errors (EIO, ENOTCONN, ...).
        on_progress: called with the number of archive bytes read so far.

    Raises:
        UnsafeArchiveError: an entry is absolute, climbs out with ``..``, is a link (or one leading
            outside ``dst``), goes through a link, or is a device file or pipe. Zip entries are all
            checked first; tar entries before the bad one may already be in ``dst``.
        OSError: ``errno.ENOSPC`` when the entries would leave less than a margin (2% of the disk,
            1 MiB to 256 MiB) free on ``dst``, counted as they are written; reading failed after
            the retries; or another write error.
        tarfile.TarError, zipfile.BadZipFile, EOFError: the archive is corrupt or truncated.
    """
    archive, dst = Path(archive), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    with ReadaheadFile(archive, retries=retries) as raw, io.BufferedReader(raw, 1 << 20) as f, \
            _Extraction(archive, dst, allow_links) as out:
        report = (lambda: on_progress(raw.tell())) if on_progress else (lambda: None)
        if archive_suffix(archive) == ".zip":
            _extract_zip(out, f, report)
        else:
            _extract_tar(out, f, report)
        out.check_links()
        report()


def _extract_tar(out: _Extraction, f: io.BufferedReader[Any], report: Callable[[], None]) -> None:
    # tarfile's own stream mode re-slices its buffer on every read (1.5x slower here); a
    # decompressing file object read strictly forwards in "r:" mode is the same single pass.
    with decompressed(f) as stream, open_tar(out.archive, stream) as tar:
        for member in tar:
            name = check_tar_member(out.archive, member, allow_links=out.allow_links)
            if member.isdir():
                out.directory(name)
            elif member.issym():
                out.symlink(name, member.linkname)
            elif member.islnk():
                out.hardlink(name, safe_relpath(out.archive, member.linkname))
            else:
                src = tar.extractfile(member)
                assert src is not None  # a regular file always has a reader
                out.file(name, src, member.size, _ns(member.mtime), member.mode)
            report()


def _ns(seconds: float) -> int:
    whole = int(seconds)
    return whole * 1_000_000_000 + round((seconds - whole) * 1e9)


def decompressed(f: io.BufferedReader[Any]) -> contextlib.AbstractContextManager[Any]:
    """A file object of the tar inside ``f``, by the compression's magic bytes (gzip, bzip2, xz)."""
    head = f.peek(6)[:6]
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=f, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(f)
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(f)
    return contextlib.nullcontext(f)


def _zip_entry(archive: Path, info: zipfile.ZipInfo, allow_links: bool) -> tuple[str, str]:
    """(kind, safe relative path) of a zip entry; kind is "dir", "file" or "link"."""
    # Info-ZIP unzip reads backslashes as separators only in names made on MS-DOS/FAT (host 0) that
    # have no "/" (unzip 6.0, extract.c); elsewhere they are part of the name.
    dos = info.create_system == 0 and "/" not in info.filename
    name = safe_relpath(archive, info.filename, backslash_separators=dos)
    mode = info.external_attr >> 16 if info.create_system == 3 else 0
    if (dos and info.filename.endswith("\\")) or info.filename.endswith("/") or stat.S_ISDIR(mode):
        return "dir", name
    if stat.S_ISLNK(mode):
        if not allow_links:
            raise UnsafeArchiveError(archive, info.filename, "is a symbolic link", _LINK_FIX)
        if info.file_size > MAX_NAME:  # its data is the target, read whole: check before reading
            raise UnsafeArchiveError(archive, info.filename, f"is a link to a target of {info.file_size} bytes "
                                                             f"(at most {MAX_NAME})")
        kind = "link"
    elif stat.S_IFMT(mode) in (0, stat.S_IFREG):  # no type bits (zipfile.writestr's 0o600): a file
        kind = "file"
    else:
        raise UnsafeArchiveError(archive, info.filename, "is a device file, pipe or other special file")
    if not name:
        raise UnsafeArchiveError(archive, info.filename, "has no name")
    return kind, name


def _extract_zip(out: _Extraction, f: IO[bytes], report: Callable[[], None]) -> None:
    with zipfile.ZipFile(f) as zf:
        # Check every entry before writing anything; then read in file order so reads stay sequential.
        plan = [(info, *_zip_entry(out.archive, info, out.allow_links)) for info in zf.infolist()]
        plan.sort(key=lambda item: item[0].header_offset)  # stable: a repeated name keeps its order
        for info, kind, name in plan:
            if kind == "dir":
                out.directory(name)
            elif kind == "link":
                out.symlink(name, zf.read(info).decode("utf-8", "surrogateescape"))
            else:
                mtime_ns = int(time.mktime(info.date_time + (0, 0, -1))) * 1_000_000_000
                mode = info.external_attr >> 16 if info.create_system == 3 else 0
                with zf.open(info) as src:
                    out.file(name, src, info.file_size, mtime_ns, mode or 0o644)
                report()


def links_under(root: Path) -> Iterator[str]:
    """The relative paths of the symbolic links under ``root``, following none."""
    folders = [""]
    while folders:
        rel = folders.pop()
        with os.scandir(os.path.join(root, rel)) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_symlink():
                    yield path
                elif entry.is_dir(follow_symlinks=False):
                    folders.append(path)


class _Extraction:
    """Writes entries under ``dst`` through folder descriptors opened with ``O_NOFOLLOW``, counting bytes."""

    def __init__(self, archive: Path, dst: Path, allow_links: bool):
        self.archive, self.dst, self.allow_links = archive, dst, allow_links
        self.root = os.open(dst, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.written: set[str] = set()  # entries written by this run: a repeat is written again
        self.links: list[str] = []
        self.extracted = 0  # bytes
        self._dir: tuple[str, int] = ("", self.root)  # the last folder opened: entries come in order
        st = os.fstatvfs(self.root)
        self.margin = min(SPACE_MARGIN[1], max(SPACE_MARGIN[0], st.f_blocks * st.f_frsize // 50))
        self._free = st.f_bavail * st.f_frsize
        self._since_check = 0

    def __enter__(self) -> _Extraction:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is not None:
                self._remove_links()
        finally:
            if self._dir[1] != self.root:
                os.close(self._dir[1])
            os.close(self.root)

    # --- folders ---

    def _walk(self, rel: str, create: bool, entry: Optional[str] = None) -> int:
        """A new descriptor of the folder ``rel`` (created where missing), never through a link."""
        fd = os.dup(self.root)
        done: list[str] = []
        try:
            for part in rel.split("/") if rel else []:
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    why = f"goes through {'/'.join(done + [part])!r}, which is {self._what(fd, part)}, not a folder"
                    raise UnsafeArchiveError(self.archive, entry or rel, why) from None
                os.close(fd)
                fd = nfd
                done.append(part)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _what(dfd: int, name: str) -> str:
        """What the entry ``name`` in the folder ``dfd`` is, for an error: a link (and its target) or a file."""
        if stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
            return f"a link (to {os.readlink(name, dir_fd=dfd)!r}; files are never written through links)"
        return "a file"

    def _parent(self, rel: str) -> tuple[int, str]:
        """(descriptor of the folder holding ``rel``, ``rel``'s own name); the descriptor is cached."""
        folder, _, name = rel.rpartition("/")
        if folder != self._dir[0]:
            fd = self._walk(folder, create=True, entry=rel)
            if self._dir[1] != self.root:
                os.close(self._dir[1])
            self._dir = (folder, fd)
        return self._dir[1], name

    def directory(self, rel: str) -> None:
        if rel:
            os.close(self._walk(rel, create=True))

    # --- files ---

    def file(self, rel: str, src: IO[bytes], size: int, mtime_ns: int, mode: int) -> None:
        """Write ``size`` bytes from ``src`` to ``rel`` under a temporary name, then rename it."""
        dfd, name = self._parent(rel)
        if rel not in self.written:
            try:
                st: Optional[os.stat_result] = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if unchanged(st, size, mtime_ns):  # extracted by an earlier, interrupted run
                self.written.add(rel)
                return
        self._need(rel, size)
        tmp = partial_name(name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     (mode & 0o755) | 0o600, dir_fd=dfd)
        try:
            written = 0
            while chunk := src.read(CHUNK):
                written += len(chunk)
                if written > size:
                    raise UnsafeArchiveError(self.archive, rel, f"holds more than the {size} bytes it declares")
                self._count(rel, len(chunk))
                try:
                    write_all(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    self._refresh()
                    self._no_space(rel, len(chunk))
            if written != size or os.fstat(fd).st_size != size:
                raise OSError(errno.EIO, f"{self.archive}: entry {quoted(rel)} gave {written} of its {size} bytes "
                                         f"(a truncated or corrupt archive?)")
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # replaces a file or link, not a folder
        except IsADirectoryError:
            os.unlink(tmp, dir_fd=dfd)
            raise UnsafeArchiveError(self.archive, rel, "is a file, but the archive also has a folder "
                                                        "of that name") from None
        self.written.add(rel)

    def _need(self, rel: str, nbytes: int) -> None:
        if nbytes > self._free - self.margin:
            self._refresh()
            if nbytes > self._free - self.margin:
                self._no_space(rel, nbytes)

    def _count(self, rel: str, nbytes: int) -> None:
        self.extracted += nbytes
        self._free -= nbytes
        self._since_check += nbytes
        if self._free < self.margin or self._since_check >= 64 << 20:  # others may write there too
            self._refresh()
            if self._free < self.margin:
                self._no_space(rel, nbytes)

    def _refresh(self) -> None:
        st = os.fstatvfs(self.root)
        self._free = st.f_bavail * st.f_frsize
        self._since_check = 0

    def _no_space(self, rel: str, nbytes: int) -> None:
        raise NotEnoughSpace(errno.ENOSPC, f"{self.archive} does not fit in {self.dst}: entry {quoted(rel)} needs "
                                    f"{human_bytes(nbytes)} more, {human_bytes(max(self._free, 0))} is free and "
                                    f"{human_bytes(self.margin)} is kept spare ({human_bytes(self.extracted)} "
                                    f"extracted so far). The archive expands beyond the free space (a "
                                    f"decompression bomb, or a disk too small): free space or extract elsewhere.")

    # --- links ---

    def _replace(self, dfd: int, name: str, rel: str) -> None:
        """Remove the file or link ``name`` a link entry ``rel`` replaces (the last copy wins); a folder stays."""
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except OSError:  # a folder: unlink(2) says EISDIR on Linux, EPERM elsewhere
            if not stat.S_ISDIR(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                raise
            raise UnsafeArchiveError(self.archive, rel, "is a link, but the archive also has a folder of that name "
                                                        "(a link never replaces a folder)") from None

    def symlink(self, rel: str, target: str) -> None:
        if self.resolve(posixpath.dirname(rel), target) is None:
            raise UnsafeArchiveError(self.archive, rel, f"is a link to {quoted(target)}, outside the destination")
        dfd, name = self._parent(rel)
        self._replace(dfd, name, rel)
        os.symlink(target, name, dir_fd=dfd)
        self.links.append(rel)
        self.written.add(rel)

    def hardlink(self, rel: str, target: str) -> None:
        """A hard link to ``target``, a regular file extracted earlier (tar names it from the root)."""
        folder, _, tname = target.rpartition("/")
        try:
            tfd = self._walk(folder, create=False, entry=rel)
        except FileNotFoundError:
            tfd = None
        try:
            st = os.stat(tname, dir_fd=tfd, follow_symlinks=False) if tfd is not None else None
            if st is None or not stat.S_ISREG(st.st_mode):
                raise UnsafeArchiveError(self.archive, rel, f"is a hard link to {quoted(target)}, which is not a file "
                                                            f"extracted before it")
            dfd, name = self._parent(rel)
            self._replace(dfd, name, rel)
            os.link(tname, name, src_dir_fd=tfd, dst_dir_fd=dfd, follow_symlinks=False)
        finally:
            if tfd is not None:
                os.close(tfd)
        self.written.add(rel)

    def resolve(self, folder: str, target: str) -> Optional[str]:
        """Where the link ``target`` in ``folder`` leads relative to ``dst``, link by link; None if it leaves
        ``dst``, cannot be resolved, or takes over LINK_HOPS links (unlike ``realpath``, CVE-2025-4517).
        """
        if not target or target.startswith("/"):
            return None
        parts: list[str] = []
        todo = list(reversed(f"{folder}/{target}".split("/")))  # the link's own folder may hold links too
        hops = 0
        while todo:
            part = todo.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    return None
                parts.pop()
                continue
            path = os.path.join(self.dst, *parts, part)
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                parts.append(part)  # not there (yet): read it as a name
                continue
            except OSError:
                return None
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                link = os.readlink(path)
                if hops > LINK_HOPS or link.startswith("/"):
                    return None
                todo.extend(reversed(link.split("/")))
            else:
                parts.append(part)
        return "/".join(parts)

    def check_links(self) -> None:
        """Resolve every link under ``dst`` once all are in place (a later link can redirect an earlier one)."""
        for rel in links_under(self.dst):
            target = os.readlink(os.path.join(self.dst, rel))
            if not self.allow_links:
                self.links.append(rel)  # removed on the way out
                raise UnsafeArchiveError(self.archive, rel, f"is a link (to {quoted(target)}), left by an earlier "
                                                            f"extraction", _LINK_FIX)
            if self.resolve(posixpath.dirname(rel), target) is None:
                self.links.append(rel)
                raise UnsafeArchiveError(self.archive, rel, f"is a link to {quoted(target)}, which with the links "
                                                            f"after it leads outside the destination")

    def _remove_links(self) -> None:
        """Remove the symbolic links this failed extraction made and those :meth:`check_links` refused."""
        for rel in reversed(self.links):
            folder, _, name = rel.rpartition("/")
            try:
                dfd = self._walk(folder, create=False)
            except (OSError, UnsafeArchiveError):
                continue  # its folder is gone, so is the link
            try:  # never mask the error that ended the extraction
                if stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=dfd)
            except OSError:
                pass
            finally:
                os.close(dfd)
        self.links.clear()
