"""Copy a dataset from a slow mount (Google Drive) to fast local storage: :func:`stage`.

Drive is a FUSE filesystem where every open and every read request is a network round trip, so
``cp -r`` of many small files crawls. ``stage`` overlaps the round trips with threads (the latency
is in the mount, not the CPU), splits large files into ranges read in parallel, extracts archives
while reading them, and makes the result trustworthy: each file is written under a temporary name
and renamed once its size (and, on request, its hash) is confirmed, a source that changes during
its copy is copied again, re-runs skip what is already there, and transient mount errors are
retried per read request.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import os
import posixpath
import shutil
import stat
import sys
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Optional, Sequence, TextIO, Union, cast

from colabfast import env, mounttable
from colabfast._fileio import (
    PARTIAL_SUFFIX,
    STAGE_JOURNAL,
    STAGE_RECORD,
    FileEntry,
    PathLike,
    fits_name_max,
    human_bytes,
    is_partial_name,
    lagging,
    locked,
    partial_path,
    pread_retrying,
    read_json,
    retry,
    scan_tree,
    state_name,
    unchanged,
    write_all,
    write_json_atomic,
)
from colabfast.archive import archive_suffix, extract, extracted_size, links_under, strip_archive_suffix
from colabfast.errors import NotEnoughSpace, SourceNotFound, StageError, StageRefused

__all__ = ["stage", "StageError", "StageRefused", "check_space", "default_destination", "Destination"]

MANIFEST_FORMAT = "colabfast-stage"
MANIFEST_VERSION = 1
RECORD = STAGE_RECORD  # inside a staged folder: what it was staged from, and hashes
JOURNAL = STAGE_JOURNAL  # beside it: hashes appended as files are verified
CHUNK = 1 << 20  # bytes per read() when copying a file
BIG_FILE = 64 << 20  # files at least this large are copied as parallel ranges
RANGE = 16 << 20  # bytes per range of a big file
RAM_FRACTION = 0.5  # to="auto" stages to RAM (in Colab) when the data takes at most this share of spare RAM


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
    :func:`colabfast.env.cache_dir`) says what was staged there; a lock in the cache folder keeps
    two runs from staging to one destination at once.

    Args:
        src: a folder (copied recursively, following symlinks; a file named as colabfast names its
            own files in a staged folder, a temporary ``.NAME.colabfast-partial`` or a record
            ``.colabfast-stage.json`` or ``.colabfast-stage.sha256.jsonl``, is refused by name, unless
            its folder is one colabfast staged: then it is that stage's, and left out), a single
            file, or an archive
            (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``/``.tbz2``, ``.tar.xz``/``.txz``),
            which is extracted while it is read, with no intermediate copy (see
            :mod:`colabfast.archive` for what is refused as unsafe); or a list of archives that
            together make one dataset, extracted into one folder (KITTI's
            ``data_object_image_2.zip``, ``data_object_label_2.zip`` and ``data_object_calib.zip``).
        dst: where to put it. For a folder or an archive, the folder to create; for a file, the
            file path (or an existing folder to put it in). Default: ``/content/<name>`` in Colab,
            ``<tempdir>/colabfast-data-<uid>/<name>`` elsewhere (see
            :func:`colabfast.env.work_dir`), or ``<ramdisk>/<name>`` per ``to``; an archive's name
            loses its suffix (``kitti.tar.gz`` -> ``kitti``).
        to: where a default ``dst`` goes: ``"disk"``, ``"ram"`` (a tmpfs from
            :func:`colabfast.ramdisk`) or ``"auto"``: where an earlier stage of the same source
            already is; else, in Colab, RAM when the data takes at most half of the RAM colabfast
            may use (free RAM minus :func:`colabfast.env.ram_headroom`); else disk. Outside Colab
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
            ``dst`` (see :func:`colabfast.archive.extract`); by default an archive with links is
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
        colabfast.archive.UnsafeArchiveError: a hostile archive.
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
    opts = _Options(verify, retries, progress, overwrite, allow_links, cancel)
    source = _resolve(src, retries)
    if workers is None:
        workers = 64 if env.is_fuse(source.path) else 16
    if workers < 1:
        raise StageRefused(f"workers must be at least 1, not {workers}")
    if source.kind == "folder":
        source = source.scanned(workers, retries)
        _check_reserved(source.path, source.reserved)
    target = _destination(source.name, dst, to, source.nbytes, single=source.kind == "file")
    if source.kind == "file" and target.is_dir():
        target = target / source.name
    for path in source.archives or [source.path]:
        _check_not_nested(path, target)
    if source.kind == "folder" and not source.files and not source.unreadable:
        warnings.warn(f"{source.path} holds no files: staging it makes an empty folder at {target}", stacklevel=2)

    with _locked(target):
        if source.kind == "archives":
            return _stage_archive(source.archives, target, opts)
        if source.kind == "folder":
            _prepare_folder(target, str(source.path), opts)
            _stage_tree(source.path, target, source.files, source.dirs, workers, opts, unreadable=source.unreadable)
        else:
            entry = source.files[0]
            _prepare_file(target, source.path, entry, opts)
            _stage_tree(source.path.parent, target.parent, [entry], [], workers, opts,
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


class _Options(NamedTuple):
    """stage()'s keyword arguments that reach the copy and the extraction."""

    verify: str
    retries: int
    progress: bool
    overwrite: bool
    allow_links: bool
    cancel: Optional[threading.Event] = None


def _say_up_to_date(dst: Path, opts: _Options) -> None:
    """A re-run that finds nothing to do says so, where a copy would show its progress bar."""
    if opts.progress:
        print(f"{dst} is up to date, nothing copied", file=sys.stderr)


def _check_reserved(src: Path, reserved: list[str]) -> None:
    """Refuse to stage ``src`` when it holds files named as colabfast names its own in a staged folder
    (``reserved``, as :func:`colabfast._fileio.scan_tree` leaves them out): copied, each would be
    taken for colabfast's (a temporary file is deleted when a run resumes, a record is read and
    overwritten), so none can be staged as it is, and leaving it out would lose it quietly. Inside a
    folder colabfast staged (its record says so), they are that stage's own leftovers, and stay out.

    Raises:
        StageRefused: naming them and the fix.
    """
    staged: dict[str, bool] = {}  # folder (relative to src) -> whether it is inside a folder colabfast staged

    def inside_stage(folder: str) -> bool:
        if folder not in staged:
            staged[folder] = _ours(read_json(src / folder / RECORD) or {}) or (
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


# --- destination, space, locking, records ----------------------------------------------------------


def _destination(name: str, dst: Optional[PathLike], to: str, nbytes: int, single: bool) -> Path:
    if dst is not None:
        return Path(os.path.abspath(dst))
    chosen = default_destination(name, nbytes, to, single=single)
    if chosen.path is not None:
        return chosen.path
    from colabfast.tmpfs import ramdisk

    if to == "ram":
        return ramdisk().path / name
    with contextlib.suppress(OSError, ValueError):
        return ramdisk().path / name
    return env.work_dir() / name


class Destination(NamedTuple):
    """Where :func:`stage` puts data when no ``dst`` is given (see :func:`default_destination`).

    Attributes:
        ram: on a RAM disk.
        path: the staged path; None for a RAM disk :func:`colabfast.ramdisk` mounts (or grows) first.
        why: the rule that chose it, in words.
    """

    ram: bool
    path: Optional[Path]
    why: str


def default_destination(name: str, nbytes: int, to: str = "auto", *, single: bool = False) -> Destination:
    """Where ``stage(src, to=to)`` puts data named ``name`` taking ``nbytes`` bytes, decided without
    mounting anything: ``colabfast doctor`` asks this too, so its advice is what stage does.

    ``name`` is the staged name (an archive's without its suffix); ``single``: a single file, whose
    record of an earlier stage lives in the cache folder.
    """
    disk = env.work_dir() / name
    if to == "disk":
        return Destination(False, disk, "to='disk'")
    if to == "ram":
        return Destination(True, None, "to='ram'")
    if _record_path(disk, single).exists():
        return Destination(False, disk, f"an earlier stage of it is at {disk}")
    from colabfast.tmpfs import ramdisk_path

    mounted = ramdisk_path()
    if mounted is not None and _record_path(mounted / name, single).exists():
        return Destination(True, mounted / name, f"an earlier stage of it is at {mounted / name}")
    # Outside Colab a RAM disk is the user's call (to="ram"): mounting one unasked would hold RAM
    # after the process ends. In Colab the runtime is the user's alone and goes away with them.
    if not env.in_colab():
        return Destination(False, disk, "outside Colab, to='auto' never mounts a RAM disk; to='ram' does")
    spare = env.ram_available() - env.ram_headroom()
    if nbytes <= RAM_FRACTION * spare:
        return Destination(True, None, f"in Colab, data taking at most half the {human_bytes(max(spare, 0))} "
                                       f"of RAM colabfast may use goes to a RAM disk")
    return Destination(False, disk, f"it takes more than half the {human_bytes(max(spare, 0))} of RAM colabfast "
                                    f"may use")


def _check_not_nested(src: Path, dst: Path) -> None:
    s, d = os.path.realpath(src), os.path.realpath(dst)
    if s == d or d.startswith(s + os.sep) or s.startswith(d + os.sep):
        raise StageRefused(f"cannot stage {src} into {dst}: one is inside the other")


def check_space(nbytes: int, dst: Path, src: Path, *, folder: bool = False) -> None:
    """Raise ``OSError(ENOSPC)`` unless ``dst`` can take ``nbytes`` more (more from DriveFS).

    Reading through DriveFS (Colab's Drive client) also stores what is read in its local cache
    (``~/.config/Google/DriveFS``), so copying N bytes from it takes up to 2N when that cache shares
    the destination's disk, and N on the cache's disk otherwise. The Colab team says DriveFS evicts
    its cache as the disk fills, except files in active use (googlecolab/colabtools#1915): so for a
    ``folder`` of many files, room for N but not 2N is only a warning; a single large file or an
    archive is in use for its whole copy and needs the 2N. A tmpfs destination must also fit in
    the RAM colabfast may use (free RAM minus :func:`colabfast.env.ram_headroom`).
    """
    if nbytes <= 0:
        return
    drive_cache = env.drive_kind(src) == "drivefs"
    cache_dir = env.drivefs_dir()
    free = env.disk_free(dst)
    same_disk = drive_cache and _same_filesystem(dst, cache_dir)
    need = 2 * nbytes if same_disk else nbytes
    if need > free and folder and nbytes <= free:
        warnings.warn(f"{human_bytes(free)} free on {_mountpoint(dst)}: room for the {human_bytes(nbytes)} of "
                      f"data, not for 2 x {human_bytes(nbytes)} with the copy Drive's cache keeps of what is "
                      f"read. DriveFS evicts its cache as the disk fills (googlecolab/colabtools#1915), so "
                      f"staging goes on; if it stops with 'No space left', call colabfast.refresh_drive() to "
                      f"drop the cache and run stage() again.", stacklevel=4)
    elif need > free:
        why = f" (2 x {human_bytes(nbytes)}: Drive caches what it reads)" if same_disk else ""
        raise NotEnoughSpace(errno.ENOSPC, f"not enough free space on {_mountpoint(dst)}: need {human_bytes(need)}"
                             f"{why}, have {human_bytes(free)}. Free some space, stage a subset, or pack the "
                             f"data into a smaller mirror (colabfast.pack with image_size=...).")
    if env.is_ram(dst):
        spare = env.ram_available() - env.ram_headroom()
        if nbytes > spare:
            raise NotEnoughSpace(errno.ENOSPC, f"{human_bytes(nbytes)} will not fit in RAM at {dst}: "
                                 f"{human_bytes(env.ram_available())} free, of which colabfast keeps "
                                 f"{human_bytes(env.ram_headroom())} for training. Stage to disk (to='disk').")
    if drive_cache and not same_disk and nbytes > env.disk_free(cache_dir):
        raise NotEnoughSpace(errno.ENOSPC, f"not enough free space for Drive's cache on {_mountpoint(cache_dir)}: "
                             f"need {human_bytes(nbytes)}, have {human_bytes(env.disk_free(cache_dir))}.")


def _same_filesystem(a: Path, b: Path) -> bool:
    def dev(p: Path) -> int:
        while not p.exists() and p != p.parent:
            p = p.parent
        return p.stat().st_dev

    return dev(Path(os.path.abspath(a))) == dev(Path(os.path.abspath(b)))


def _mountpoint(path: Path) -> str:
    m = mounttable.mount_of(Path(path).parent if not Path(path).exists() else path)
    return m.mountpoint if m else str(path)


def _record_path(dst: Path, single: bool) -> Path:
    """Where the record of a stage to ``dst`` lives: inside a staged folder (it travels and goes with
    the data), and in colabfast's cache folder for a single file (nothing beside it in your folder)."""
    if not single:
        return dst / RECORD
    folder = env.cache_dir() / "stage"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{state_name(dst)}.json"


def _manifest_path(dst: Path) -> Path:
    """The record of a folder or archive staged to ``dst``."""
    return _record_path(dst, single=False)


@contextlib.contextmanager
def _locked(dst: Path) -> Iterator[None]:
    with locked(env.cache_dir() / "locks" / f"{state_name(dst)}.lock", f"staging to {dst}"):
        yield


def _new_manifest(src: Union[Path, str, list], complete: bool, **extra) -> dict:
    source = src if isinstance(src, list) else str(src)
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "source": source, "complete": complete, **extra}


def _ours(record: dict) -> bool:
    return record.get("format") == MANIFEST_FORMAT


def _legacy_record(dst: Path) -> Optional[Path]:
    """Where colabfast 0.1 kept the record of a stage to ``dst``: beside it, ``.NAME.colabfast-stage.json``.
    None where that name would pass NAME_MAX: 0.1 could not have written it, and even a ``stat`` of it
    fails (ENAMETOOLONG)."""
    name = f".{dst.name}.colabfast-stage.json"
    return dst.with_name(name) if fits_name_max(name) else None


def _adopt_legacy_record(dst: Path) -> None:
    """Move a record kept beside ``dst`` by colabfast 0.1 (see :func:`_legacy_record`) inside it."""
    legacy = _legacy_record(dst)
    if legacy is None:
        return
    if legacy.is_file() and dst.is_dir() and not (dst / RECORD).exists():
        os.replace(legacy, dst / RECORD)
    for old in (legacy, legacy.with_suffix(".lock")):
        with contextlib.suppress(OSError):
            old.unlink()


def _refuse_or_clear(dst: Path, source: str, record: dict, opts: _Options) -> None:
    """Refuse to stage into a folder holding files that are not a stage of ``source`` (or, with
    ``overwrite``, empty it first). Nothing is written before this check."""
    if not dst.exists():
        return
    if not dst.is_dir():
        if not opts.overwrite:
            raise StageRefused(f"{dst} is a file, not a folder: cannot stage {source} there. Pass another dst, "
                             f"or overwrite=True to replace it.")
        dst.unlink()
        return
    if _ours(record) and record.get("source") == source:
        return
    entries = sorted(os.listdir(dst))
    if not entries:
        return
    if not opts.overwrite:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        if _ours(record):
            raise StageRefused(f"{dst} was staged from {record.get('source')}, not {source}: staging there would "
                             f"mix two datasets. Pass another dst, or overwrite=True to replace it.")
        raise StageRefused(f"{dst} is a folder colabfast did not stage, and it holds {shown}: staging {source} "
                         f"there could overwrite your files, so nothing was written. Pass another dst, empty "
                         f"the folder, or pass overwrite=True to replace its contents.")
    for name in entries:
        path = dst / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _prepare_folder(dst: Path, source: str, opts: _Options) -> None:
    _adopt_legacy_record(dst)
    _refuse_or_clear(dst, source, read_json(_manifest_path(dst)) or {}, opts)


def _prepare_file(target: Path, src: Path, entry: FileEntry, opts: _Options) -> None:
    """A single file may replace only a file colabfast staged from ``src``, or an identical copy."""
    legacy = _legacy_record(target)
    record = read_json(_record_path(target, single=True)) or {}
    if not record and legacy is not None and (record := read_json(legacy) or {}):  # beside it (colabfast 0.1)
        write_json_atomic(_record_path(target, single=True), record)
    _adopt_legacy_record(target)
    if not target.exists() and not target.is_symlink():
        return
    if target.is_dir():
        raise StageRefused(f"{target} is a folder: cannot stage the file {src} over it")
    if (_ours(record) and record.get("source") == str(src)) or unchanged(target.stat(), entry.size, entry.mtime_ns):
        return
    if not opts.overwrite:
        whose = f"was staged from {record.get('source')}" if _ours(record) else "is a file colabfast did not stage"
        raise StageRefused(f"{target} {whose}: staging {src} would replace it, so nothing was written. Pass "
                         f"another dst, or overwrite=True to replace it.")


class _Hashes:
    """SHA-256 of staged files: the record's, plus a journal appended as each file is verified, so a
    run that is killed keeps what it verified (``.colabfast-stage.json`` + ``.sha256.jsonl``)."""

    def __init__(self, record: Path, old: dict, keep: bool):
        self.journal = record.with_name(record.name.replace(".json", ".sha256.jsonl"))
        self.digests: dict[str, str] = dict(old.get("sha256") or {}) if keep else {}
        if keep:
            with contextlib.suppress(OSError), open(self.journal, encoding="utf-8") as f:
                for line in f:
                    with contextlib.suppress(ValueError, TypeError):
                        rel, digest = json.loads(line)
                        self.digests[rel] = digest
        self._lock = threading.Lock()
        self._file: Optional[TextIO] = None

    def add(self, rel: str, digest: str) -> None:
        with self._lock:
            self.digests[rel] = digest
            if self._file is None:
                self._file = open(self.journal, "a", encoding="utf-8")
            self._file.write(json.dumps([rel, digest]) + "\n")
            self._file.flush()  # in the page cache: survives a killed process

    def close(self, folded: bool) -> None:
        """Close the journal; remove it once its hashes are ``folded`` into the record."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if folded:
            with contextlib.suppress(FileNotFoundError):
                self.journal.unlink()


# --- folders and single files ----------------------------------------------------------------------


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
    opts: _Options,
    rename: Optional[dict[str, str]] = None,
    unreadable: Optional[dict[str, OSError]] = None,
) -> None:
    """Copy ``files`` (relative to ``src``) to ``dst``, skipping unchanged ones."""
    names = rename or {}
    single = bool(names)
    record_path = _record_path(dst / next(iter(names.values())), True) if single else _manifest_path(dst)
    old = read_json(record_path) or {}
    hashes = _Hashes(record_path, old, keep=opts.verify == "sha256")

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
            digests = pool.map(lambda f: _sha256_of(target_of(f.rel)), same)
            todo += [f for f, d in zip(same, digests) if hashes.digests.get(f.rel) != d]
    failures: dict[str, BaseException] = {}
    for rel, exc in (unreadable or {}).items():
        exc.folder = True  # type: ignore[attr-defined]
        failures[f"{rel}/"] = exc
    if not todo and not failures:
        _say_up_to_date(target_of(files[0].rel) if single else dst, opts)
        if not old.get("complete"):
            write_json_atomic(record_path, _new_manifest(src if not single else src / files[0].rel, True,
                                                         sha256=hashes.digests or None))
        hashes.close(folded=True)
        return

    source = src if not single else src / files[0].rel
    check_space(sum(f.size for f in todo), dst, src, folder=not single)
    write_json_atomic(record_path, _new_manifest(source, False, sha256=hashes.digests or None))
    if old and not old.get("complete"):
        _remove_partials(dst if not single else None, [target_of(f.rel) for f in todo])
    copier = _Copier(src, target_of, opts.verify, opts.retries, hashes)
    copier.cancel = opts.cancel
    name = next(iter(names.values())) if single else dst.name
    try:
        failures.update(copier.run(todo, workers, opts.progress, desc=f"stage {name}"))
    finally:
        hashes.close(folded=False)
    write_json_atomic(record_path, _new_manifest(source, not failures, sha256=hashes.digests or None))
    hashes.close(folded=True)
    if failures:
        from colabfast.drive import failure_advice

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
        return _same_identity(st, self.st)

    def check_unchanged(self) -> None:
        """Raise _SourceChanged if the file at ``path`` is no longer what was opened (or was written)."""
        if not self.same_as(retry(lambda: os.stat(self.path), self.retries)):
            raise _SourceChanged(self.path)

    def close(self) -> None:
        os.close(self.fd)


class _Copier:
    """Copies files with a thread pool: small files whole, big files as parallel ranges."""

    def __init__(self, src: Path, target_of: Callable[[str], Path], verify: str, retries: int, hashes: _Hashes):
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
    """One large file copied as ``RANGE``-byte ranges by several threads into one partial file.

    The partial file gets all its space at once (``posix_fallocate``), so a full disk fails the copy
    at its start rather than leaving holes. If the source changes during the copy, the whole file
    is copied again (up to ``retries`` times).
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
                self.changed = not _same_identity(retry(lambda: os.stat(self.path), self.copier.retries),
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


def _same_identity(a: os.stat_result, b: Optional[os.stat_result]) -> bool:
    """The same file, unchanged: size, modification and change time, inode and device (a same-size
    rewrite in place changes the modification time, and the change time even when the modification
    time is put back; a replacement changes the inode)."""
    return b is not None and (a.st_size, a.st_mtime_ns, a.st_ctime_ns, a.st_ino, a.st_dev) == \
        (b.st_size, b.st_mtime_ns, b.st_ctime_ns, b.st_ino, b.st_dev)


# --- archives --------------------------------------------------------------------------------------


def _stage_archive(archives: list[Path], dst: Path, opts: _Options) -> Path:
    """Extract ``archives`` (one, or several that together make one dataset) into the folder ``dst``.

    They are extracted into ``.NAME.colabfast-partial`` beside ``dst`` (resumable after an interrupt
    or a read error: entries already extracted there are skipped; removed after any other error),
    which is renamed to ``dst`` when complete.
    """
    from tqdm.auto import tqdm

    retries = opts.retries
    stats = [retry(functools.partial(os.stat, a), retries) for a in archives]
    identity = [[str(a), st.st_size, st.st_mtime_ns] for a, st in zip(archives, stats)]
    source = str(archives[0]) if len(archives) == 1 else [str(a) for a in archives]
    _adopt_legacy_record(dst)
    old = read_json(_manifest_path(dst)) or {}
    ours = _ours(old) and old.get("source") == source
    if ours and old.get("complete") and old.get("archive") == identity and dst.is_dir():
        if opts.verify != "sha256" or _hashes_match(dst, old.get("sha256") or {}):
            _say_up_to_date(dst, opts)
            return _staged_root(dst, old)
    if not ours:
        _refuse_or_clear_archive(dst, source, old, opts)

    check_space(sum(retry(functools.partial(extracted_size, a), retries) for a in archives), dst, archives[0])
    work = partial_path(dst)
    progress_record = work / RECORD  # what the partial extraction holds
    if work.exists() and (read_json(progress_record) or {}).get("archive") != identity:
        shutil.rmtree(work)  # other archives, or another version of them: start over
    work.mkdir(parents=True, exist_ok=True)
    write_json_atomic(progress_record, _new_manifest(source, False, archive=identity))
    done = 0
    with tqdm(total=sum(st.st_size for st in stats), unit="B", unit_scale=True,
              desc=f"extract {', '.join(a.name for a in archives)}", disable=not opts.progress) as bar:
        def advance(base: int, n: int) -> None:  # n bytes read of the archive that starts at base
            bar.update(base + n - bar.n)

        for archive, st in zip(archives, stats):
            try:
                extract(archive, work, allow_links=opts.allow_links, retries=retries,
                        on_progress=functools.partial(advance, done))
                if not _same_identity(retry(functools.partial(os.stat, archive), retries), st):
                    raise _SourceChanged(archive, "extracted")  # what was extracted may be torn
            except BaseException as exc:
                if not _resumable(exc):
                    shutil.rmtree(work, ignore_errors=True)
                raise
            done += st.st_size
    # An archive holding one folder named like dst (other.tar.gz holding other/) becomes dst itself,
    # not dst/other; with links it stays as it is (a link may lead through that folder's name).
    top = _single_top_folder(work)
    hoist = top != work and top.name == dst.name and not (top / RECORD).exists() and \
        next(links_under(top), None) is None
    root = top if hoist else work
    hashes = None
    if opts.verify == "sha256":
        hashes = {p.relative_to(root).as_posix(): _sha256_of(p) for p in sorted(root.rglob("*"))
                  if p.is_file() and not p.is_symlink() and p != progress_record}
    returned = "" if hoist or top == work else top.name
    write_json_atomic(root / RECORD, _new_manifest(source, True, archive=identity, sha256=hashes, top=returned))
    if dst.exists():
        shutil.rmtree(dst)  # an older staged version of these archives
    os.replace(root, dst)
    if hoist:
        shutil.rmtree(work)  # now only its progress record
    return dst / returned


def _resumable(exc: BaseException) -> bool:
    """Whether a partial extraction that ``exc`` stopped is kept for a re-run to resume: after an
    interrupt or a read error, yes; nothing an attacker chose, a bomb's output, an extraction of a
    corrupt archive or of one that changed meanwhile is kept."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, _SourceChanged) and exc.errno != errno.ENOSPC


def _refuse_or_clear_archive(dst: Path, source: Union[str, list], old: dict, opts: _Options) -> None:
    names = source if isinstance(source, str) else ", ".join(source)
    if not dst.exists() or (dst.is_dir() and not any(dst.iterdir())):
        return
    if not opts.overwrite:
        if _ours(old):
            raise StageRefused(f"{dst} was staged from {old.get('source')}, not {names}: staging there would mix "
                             f"two datasets. Pass another dst, or overwrite=True to replace it.")
        entries = sorted(os.listdir(dst)) if dst.is_dir() else []
        held = f", and it holds {', '.join(entries[:5])}" + (f" and {len(entries) - 5} more" if len(entries) > 5
                                                              else "") if entries else ""
        raise StageRefused(f"{dst} already exists and was not staged from {names}{held}: nothing was written. "
                         f"Remove it, pass another dst, or pass overwrite=True to replace it.")
    # overwrite: the finished extraction replaces dst as a whole (see _stage_archive)


def _hashes_match(root: Path, hashes: dict[str, str]) -> bool:
    return all((root / rel).is_file() and _sha256_of(root / rel) == digest for rel, digest in hashes.items())


def _staged_root(dst: Path, record: dict) -> Path:
    """The path a finished stage of archives to ``dst`` returned, as its record says."""
    top = record.get("top")
    if isinstance(top, str) and "/" not in top and top not in (".", "..") and (dst / top).is_dir():
        return dst / top
    return _single_top_folder(dst)  # recorded before colabfast said, or no longer there


def _single_top_folder(root: Path) -> Path:
    entries = [p for p in root.iterdir() if p.name != RECORD]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else root
