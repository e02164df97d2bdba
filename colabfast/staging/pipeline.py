"""`stage()`: what the source is (a folder, a file, archives, a list of them), where it goes
(:mod:`colabfast.staging.destination`), and the copy (:mod:`colabfast.staging.copy`) or the extraction
(:mod:`colabfast.staging.archives`) that puts it there. The package's docstring (:mod:`colabfast.staging`)
says what staging guarantees."""

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
    """Copy a folder, file or archive from a slow mount (Drive) to local disk or RAM.

    Safe to re-run: files already staged and unchanged (same size and modification time, as rsync's
    quick check; plus the SHA-256 recorded when each was copied, with ``verify="sha256"``) are
    skipped, so re-running a cell after an interruption or a kill copies only what is missing. Each
    file is written as ``.NAME.colabfast-partial`` and renamed only once its full size is written
    (a short write or a full disk is an error, never a hole) and verified, so nothing partial ever
    looks complete. A file whose size, modification or change time, or inode changes while it is
    copied is copied again (an archive that changes while it is extracted is an error). A record
    ``.colabfast-stage.json`` inside a staged folder (for a single file: in
    :func:`colabfast.where.env.cache_dir`) says what was staged there; a lock in the cache folder keeps
    two runs from staging to one destination at once.

    Args:
        src: a folder (copied recursively, following symlinks; a file named as colabfast names its
            own files in a staged folder, a temporary ``.NAME.colabfast-partial`` or a record
            ``.colabfast-stage.json`` or ``.colabfast-stage.sha256.jsonl``, is refused by name, unless
            its folder is one colabfast staged: then it is that stage's, and left out), a single
            file, or an archive
            (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``/``.tbz2``, ``.tar.xz``/``.txz``),
            which is extracted while it is read, with no intermediate copy (see
            :mod:`colabfast.staging.extract` for what is refused as unsafe); or a list of archives that
            together make one dataset, extracted into one folder (KITTI's
            ``data_object_image_2.zip``, ``data_object_label_2.zip`` and ``data_object_calib.zip``).
        dst: where to put it. For a folder or an archive, the folder to create; for a file, the
            file path (or an existing folder to put it in). Default: ``/content/<name>`` in Colab,
            ``<tempdir>/colabfast-data-<uid>/<name>`` elsewhere (see
            :func:`colabfast.where.env.work_dir`), or ``<ramdisk>/<name>`` per ``to``; an archive's name
            loses its suffix (``kitti.tar.gz`` -> ``kitti``).
        to: where a default ``dst`` goes: ``"disk"``, ``"ram"`` (a tmpfs from
            :func:`colabfast.ramdisk`) or ``"auto"``: where an earlier stage of the same source
            already is; else, in Colab, RAM when the data takes at most half of the RAM colabfast
            may use (free RAM minus :func:`colabfast.where.env.ram_headroom`); else disk. Outside Colab
            ``"auto"`` never mounts a RAM disk. Only with ``dst=None``.
        workers: files copied at once (threads). Default: 64 from a FUSE mount such as Drive,
            where the time goes to round trips, else 16.
        verify: ``"size"``: a copy must have exactly the source's size. ``"sha256"``: also hash
            the bytes read from the source and the bytes written, compare, and record each file's
            hash as it completes; re-runs then re-hash the staged files (reading them locally).
        retries: retries for transient mount errors (EIO, ENOTCONN, ETIMEDOUT, EAGAIN), waiting
            0.25 s, 0.5 s, 1 s, ... (capped at 8 s) between attempts: per open of a file, and per
            read request at one offset (a failed read is retried, in smaller requests, not the file).
        progress: show a tqdm progress bar (a widget in notebooks) with bytes, files and MB/s, or,
            when nothing needs copying, the line "DST is up to date, nothing copied" (on stderr).
        overwrite: replace what is at ``dst`` when it holds other files (a folder colabfast did not
            stage, or one staged from another source): they are deleted first. Without it that is
            an error, and nothing is written.
        allow_links: extract symbolic and hard links from archives, as long as they stay inside
            ``dst`` (see :func:`colabfast.staging.extract.extract`); by default an archive with links is
            refused.
        cancel: an event another thread sets to stop copying files (within 0.25 s; partial files
            are deleted, files already copied stay): stage then raises ``OSError(errno.ECANCELED)``.
            :func:`colabfast.open_dataset` stages the mirror it expects while it lists the source,
            and cancels that when the listing names another.

    Returns:
        The staged path: the folder, the file, or for an archive the extraction folder (or, when
        the archive holds a single top-level folder, that folder inside it; one named like the
        extraction folder, ``other/`` in ``other.tar.gz`` staged to ``.../other``, is that folder
        itself, not ``.../other/other``, unless it holds links).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        StageRefused: (a ``ValueError``) bad arguments; or ``dst`` holds files colabfast did not
            stage from ``src`` (a folder of yours, or another dataset) and ``overwrite`` is False:
            the message names the folder and what is in it; or a folder ``src`` holds files named
            as colabfast's own (see ``src``), which could not be told from them once copied.
            Nothing is written.
        OSError: ``errno.ENOSPC`` before copying when the destination lacks space, with the numbers
            (from DriveFS, reading also fills Drive's local cache, so a single file or an archive
            needs twice its size; for a folder that is only a warning, as DriveFS evicts its cache
            as the disk fills), or when the disk fills while copying or an archive expands beyond
            the free space; ``errno.EAGAIN`` when an archive changed while it was extracted; or an
            archive could not be read after the retries (a re-run resumes its extraction).
        StageError: some files (or sub-folders that cannot be listed) failed after their retries,
            or kept changing while copied; it lists them. The others stay staged.
        colabfast.staging.extract.UnsafeArchiveError: a hostile archive.
        tarfile.TarError, zipfile.BadZipFile, EOFError: a corrupt or truncated archive. An archive
            that fails leaves nothing at ``dst`` or beside it, except after an interrupt or a read
            error, when its partial extraction stays for a re-run to resume.
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
    """What ``src`` is: a list of archives, a folder (not listed yet: see :meth:`_Input.scanned`),
    an archive, or another file.

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
    """Refuse to stage ``src`` when it holds files named as colabfast names its own in a staged folder
    (``reserved``, as :func:`colabfast.where._fileio.scan_tree` leaves them out): copied, each would be
    taken for colabfast's (a temporary file is deleted when a run resumes, a record is read and
    overwritten), so none can be staged as it is, and leaving it out would lose it quietly. Inside a
    folder colabfast staged (its record says so), they are that stage's own leftovers, and stay out.

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


