"""`stage()`: what the source is, where it goes (:mod:`colabfast.staging.destination`), and the copy
(:mod:`colabfast.staging.copy`) or extraction (:mod:`colabfast.staging.archives`) that puts it there.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import posixpath
import stat
import threading
import warnings
from pathlib import Path
from typing import Optional, Sequence, Union, cast

from colabfast.errors import SourceNotFound, StageRefused
from colabfast.staging.archives import stage_archive
from colabfast.staging.copy import stage_tree
from colabfast.staging.destination import (
    JOURNAL,
    RECORD,
    StageOptions,
    check_not_nested,
    is_ours,
    prepare_file,
    prepare_folder,
    resolve_destination,
    stage_lock,
)
from colabfast.staging.extract import archive_suffix, extracted_size, strip_archive_suffix
from colabfast.where import env
from colabfast.where._fileio import (
    PARTIAL_SUFFIX,
    FileEntry,
    PathLike,
    read_json,
    retry,
    scan_tree,
)

__all__ = ["stage"]


def stage(
    src: Union[PathLike, Sequence[PathLike]],
    dst: Optional[PathLike] = None,
    *,
    to: str = "auto",
    workers: Optional[int] = None,
    verify: str = "size",
    retries: int = 5,
    progress: bool = True,
    overwrite: bool = False,
    allow_links: bool = False,
    cancel: Optional[threading.Event] = None,
) -> Path:
    """Copy a folder, file or archive from a slow mount (Drive) to local disk or RAM, fast and safely.

    Files go in parallel (64 at once from Drive, large ones as parallel ranges), each written under a
    temporary name and renamed once whole and verified; a re-run copies only what is missing or changed
    (size and time, as rsync's quick check), so an interrupted cell resumes. An archive is extracted while
    it is read, refusing what would land outside ``dst``. A folder of yours at ``dst`` is never written
    over. How it works: [Staging](../drive-and-staging.md#staging-cfstage-cframdisk).

    Examples:
        >>> import colabfast as cf, torchvision
        >>> drive = cf.mount()
        Mounted at /content/drive
        >>> local = cf.stage(drive / "flowers", progress=False)  # /content/flowers in Colab
        >>> torchvision.datasets.ImageFolder(local).classes
        ['daisy', 'rose']

    Args:
        src: a folder, a file, an archive (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``,
            ``.tar.xz``), or a list of archives extracted into one folder (KITTI's three zips).
        dst: the folder (for a file: the file, or a folder to put it in). Default: ``/content/<name>``
            in Colab (`colabfast.where.env.work_dir` elsewhere), or the RAM disk's, per ``to``; an
            archive's name loses its suffix.
        to: where a default ``dst`` goes: ``"disk"``, ``"ram"`` (a tmpfs, `colabfast.ramdisk`) or
            ``"auto"``: where it was staged before, else in Colab RAM when it takes at most half the
            RAM colabfast may use, else disk.
        workers: files copied at once (default 64 from a FUSE mount such as Drive, else 16).
        verify: ``"size"`` (each copy has the source's size) or ``"sha256"`` (bytes hashed on both
            sides and recorded; re-runs re-hash the staged files).
        retries: retries of each open and read for transient mount errors (EIO, ENOTCONN, ...), with
            backoff from 0.25 s to 8 s.
        progress: show a progress bar (bytes, files, MB/s), or "DST is up to date, nothing copied".
        overwrite: delete what is at ``dst`` when it holds other files (not staged from ``src``).
        allow_links: extract links from archives where they stay inside ``dst`` (refused by default).
        cancel: an event that stops the copy (within 0.25 s; ``OSError(errno.ECANCELED)``).

    Returns:
        The staged folder or file; for an archive holding one top-level folder, that folder.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        StageRefused: (a ``ValueError``) bad arguments, or ``dst`` holds files colabfast did not stage
            from ``src`` (without ``overwrite``), or ``src`` holds files named as colabfast's own.
            Nothing is written.
        OSError: ``errno.ENOSPC`` when the destination lacks space (said before copying, with the
            numbers) or fills while copying; ``errno.EAGAIN`` when an archive changed while read.
        StageError: files that still failed after their retries, listed; the others stay staged.
        UnsafeArchiveError: an archive with absolute names, ``..``, devices or links.
        tarfile.TarError, zipfile.BadZipFile, EOFError: a corrupt or truncated archive (nothing is
            left but a partial extraction a re-run resumes after a read error or an interrupt).
    """
    if verify not in ("size", "sha256"):
        raise StageRefused(f"verify must be 'size' or 'sha256', not {verify!r}")
    if to not in ("auto", "disk", "ram"):
        raise StageRefused(f"to must be 'auto', 'disk' or 'ram', not {to!r}")
    if dst is not None and to != "auto":
        raise StageRefused(f"pass dst or to, not both: to={to!r} only picks a default destination")
    opts = StageOptions(verify, retries, progress, overwrite, allow_links, cancel)
    source = _resolve(src, retries)
    if workers is None:
        workers = 64 if env.is_fuse(source.path) else 16
    if workers < 1:
        raise StageRefused(f"workers must be at least 1, not {workers}")
    if source.kind == "folder":
        source = source.scanned(workers, retries)
        _check_reserved(source.path, source.reserved)
    target = resolve_destination(source.name, dst, to, source.nbytes, single=source.kind == "file")
    if source.kind == "file" and target.is_dir():
        target = target / source.name
    for path in source.archives or [source.path]:
        check_not_nested(path, target)
    if source.kind == "folder" and not source.files and not source.unreadable:
        warnings.warn(f"{source.path} holds no files: staging it makes an empty folder at {target}", stacklevel=2)

    with stage_lock(target):
        if source.kind == "archives":
            return stage_archive(source.archives, target, opts)
        if source.kind == "folder":
            prepare_folder(target, str(source.path), opts)
            stage_tree(source.path, target, source.files, source.dirs, workers, opts, unreadable=source.unreadable)
        else:
            entry = source.files[0]
            prepare_file(target, source.path, entry, opts)
            stage_tree(source.path.parent, target.parent, [entry], [], workers, opts,
                        rename={entry.rel: target.name})
    return target


@dataclasses.dataclass(frozen=True)
class _Input:
    """stage()'s ``src`` resolved once into what it is, and what its destination needs to know."""

    kind: str  # "folder", "file" or "archives" (one archive, or several making one dataset)
    path: Path  # the folder or the file; the first archive
    name: str  # a default destination's name: the source's own, an archive's without its suffix
    nbytes: int  # bytes it takes once staged (for archives, as they declare it: a first estimate)
    archives: list[Path] = dataclasses.field(default_factory=list)
    files: list[FileEntry] = dataclasses.field(default_factory=list)  # a folder's files, or the file
    dirs: list[str] = dataclasses.field(default_factory=list)  # a folder's sub-folders
    unreadable: dict[str, OSError] = dataclasses.field(default_factory=dict)  # sub-folders not listed
    reserved: list[str] = dataclasses.field(default_factory=list)  # left out for their names

    def scanned(self, workers: int, retries: int) -> _Input:
        """This folder with its files and sub-folders listed (in parallel: on Drive each is a round trip)."""
        unreadable: dict[str, OSError] = {}
        reserved: list[str] = []
        files, dirs = scan_tree(self.path, workers, retries, unreadable=unreadable, reserved=reserved)
        return dataclasses.replace(self, nbytes=sum(f.size for f in files), files=files, dirs=dirs,
                                   unreadable=unreadable, reserved=reserved)


def _resolve(src: Union[PathLike, Sequence[PathLike]], retries: int) -> _Input:
    """What ``src`` is: a list of archives, a folder, an archive, or another file.

    Raises:
        FileNotFoundError: it (or one of the archives) does not exist.
        StageRefused: a list holding something other than archives.
    """
    if isinstance(src, (list, tuple)):
        archives = [Path(os.path.abspath(a)) for a in src]
        if not archives or not all(archive_suffix(a) for a in archives):
            raise StageRefused("a list of sources must be archives (.zip, .tar, .tar.gz, ...), extracted into one "
                               "folder")
        for a in archives:
            if not a.is_file():
                raise _not_found(a)
        size = sum(retry(functools.partial(extracted_size, a), retries) for a in archives)
        return _Input("archives", archives[0], strip_archive_suffix(archives[0].name), size, archives=archives)
    path = Path(os.path.abspath(cast(PathLike, src)))
    try:
        st = retry(lambda: os.stat(path), retries)  # Drive may be briefly disconnected even now
    except FileNotFoundError:
        raise _not_found(path) from None
    if stat.S_ISDIR(st.st_mode):
        return _Input("folder", path, path.name, 0)
    if archive_suffix(path):
        size = retry(lambda: extracted_size(path), retries)
        return _Input("archives", path, strip_archive_suffix(path.name), size, archives=[path])
    return _Input("file", path, path.name, st.st_size, files=[FileEntry(path.name, st.st_size, st.st_mtime_ns)])


def _check_reserved(src: Path, reserved: list[str]) -> None:
    """Refuse to stage ``src`` holding files named as colabfast's own in a staged folder (``reserved``),
    except in a folder colabfast staged, whose leftovers they are.

    Raises:
        StageRefused: naming them and the fix.
    """
    staged: dict[str, bool] = {}  # folder (relative to src) -> whether it is inside a folder colabfast staged

    def inside_stage(folder: str) -> bool:
        if folder not in staged:
            staged[folder] = is_ours(read_json(src / folder / RECORD) or {}) or (
                folder != "" and inside_stage(posixpath.dirname(folder)))
        return staged[folder]

    def ours(rel: str) -> bool:
        return inside_stage(posixpath.dirname(rel))

    theirs = sorted(rel for rel in reserved if not ours(rel))
    if theirs:
        shown = ", ".join(theirs[:10]) + (f" and {len(theirs) - 10} more" if len(theirs) > 10 else "")
        raise StageRefused(f"{len(theirs)} files of {src} are named as colabfast names its own in a staged folder "
                           f"(temporary files .NAME{PARTIAL_SUFFIX}, records {RECORD} and {JOURNAL}), so their "
                           f"copies would be taken for colabfast's, and nothing was written: {shown}. Rename them "
                           f"(or delete them, if an interrupted colabfast run left them) and stage again.")


def _not_found(path: Path) -> FileNotFoundError:
    hint = " Is Drive mounted? Call colabfast.mount() first." if "/drive/" in str(path) else ""
    exc = SourceNotFound(f"nothing to stage: {path} does not exist.{hint}")
    exc.errno = errno.ENOENT  # set after: OSError(errno, msg, path) would print the path twice
    return exc


