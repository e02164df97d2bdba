"""Where a copy goes and whether it fits (:func:`default_destination`, :func:`check_space`), and the
records beside a staged copy: its manifest, its lock, and the hashes of what was verified.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path
from typing import Iterator, NamedTuple, Optional, TextIO, Union

from colabfast.errors import NotEnoughSpace, StageRefused
from colabfast.where import env, mounttable
from colabfast.where._fileio import (
    STAGE_JOURNAL,
    STAGE_RECORD,
    FileEntry,
    PathLike,
    fits_name_max,
    human_bytes,
    locked,
    read_json,
    state_name,
    unchanged,
    write_json_atomic,
)

__all__ = ["check_space", "default_destination", "Destination"]

MANIFEST_FORMAT = "colabfast-stage"
MANIFEST_VERSION = 1
RECORD = STAGE_RECORD  # inside a staged folder: what it was staged from, and hashes
JOURNAL = STAGE_JOURNAL  # beside it: hashes appended as files are verified
RAM_FRACTION = 0.5  # to="auto" stages to RAM (in Colab) when the data takes at most this share of spare RAM


class StageOptions(NamedTuple):
    """stage()'s keyword arguments that reach the copy and the extraction."""

    verify: str
    retries: int
    progress: bool
    overwrite: bool
    allow_links: bool
    cancel: Optional[threading.Event] = None


def say_up_to_date(dst: Path, opts: StageOptions) -> None:
    """A re-run that finds nothing to do says so, where a copy would show its progress bar."""
    if opts.progress:
        print(f"{dst} is up to date, nothing copied", file=sys.stderr)


# --- destination, space, locking, records ----------------------------------------------------------


def resolve_destination(name: str, dst: Optional[PathLike], to: str, nbytes: int, single: bool) -> Path:
    if dst is not None:
        return Path(os.path.abspath(dst))
    chosen = default_destination(name, nbytes, to, single=single)
    if chosen.path is not None:
        return chosen.path
    from colabfast.where.tmpfs import ramdisk

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
    """Where ``stage(src, to=to)`` puts ``name`` of ``nbytes``, decided without mounting anything (``colabfast
    doctor`` asks this too); ``single``: a single file.
    """
    disk = env.work_dir() / name
    if to == "disk":
        return Destination(False, disk, "to='disk'")
    if to == "ram":
        return Destination(True, None, "to='ram'")
    if record_of(disk, single).exists():
        return Destination(False, disk, f"an earlier stage of it is at {disk}")
    from colabfast.where.tmpfs import ramdisk_path

    mounted = ramdisk_path()
    if mounted is not None and record_of(mounted / name, single).exists():
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


def check_not_nested(src: Path, dst: Path) -> None:
    s, d = os.path.realpath(src), os.path.realpath(dst)
    if s == d or d.startswith(s + os.sep) or s.startswith(d + os.sep):
        raise StageRefused(f"cannot stage {src} into {dst}: one is inside the other")


def check_space(nbytes: int, dst: Path, src: Path, *, folder: bool = False) -> None:
    """Raise ``OSError(ENOSPC)`` unless ``dst`` can take ``nbytes`` more: up to twice that from DriveFS, whose
    cache may share the disk (googlecolab/colabtools#1915); a tmpfs within the RAM colabfast may use
    (:func:`colabfast.where.env.ram_headroom`). See [Drive and staging](../drive-and-staging.md#how-it-works).
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


def record_of(dst: Path, single: bool) -> Path:
    """Where the record of a stage to ``dst`` lives: inside a staged folder (it travels and goes with
    the data), and in colabfast's cache folder for a single file (nothing beside it in your folder)."""
    if not single:
        return dst / RECORD
    folder = env.cache_dir() / "stage"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{state_name(dst)}.json"


def manifest_path(dst: Path) -> Path:
    """The record of a folder or archive staged to ``dst``."""
    return record_of(dst, single=False)


@contextlib.contextmanager
def stage_lock(dst: Path) -> Iterator[None]:
    with locked(env.cache_dir() / "locks" / f"{state_name(dst)}.lock", f"staging to {dst}"):
        yield


def new_manifest(src: Union[Path, str, list], complete: bool, **extra) -> dict:
    source = src if isinstance(src, list) else str(src)
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "source": source, "complete": complete, **extra}


def is_ours(record: dict) -> bool:
    return record.get("format") == MANIFEST_FORMAT


def _legacy_record(dst: Path) -> Optional[Path]:
    """Where colabfast 0.1 kept a stage's record (``.NAME.colabfast-stage.json``), None past NAME_MAX."""
    name = f".{dst.name}.colabfast-stage.json"
    return dst.with_name(name) if fits_name_max(name) else None


def adopt_legacy_record(dst: Path) -> None:
    """Move a record kept beside ``dst`` by colabfast 0.1 (see :func:`_legacy_record`) inside it."""
    legacy = _legacy_record(dst)
    if legacy is None:
        return
    if legacy.is_file() and dst.is_dir() and not (dst / RECORD).exists():
        os.replace(legacy, dst / RECORD)
    for old in (legacy, legacy.with_suffix(".lock")):
        with contextlib.suppress(OSError):
            old.unlink()


def _refuse_or_clear(dst: Path, source: str, record: dict, opts: StageOptions) -> None:
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
    if is_ours(record) and record.get("source") == source:
        return
    entries = sorted(os.listdir(dst))
    if not entries:
        return
    if not opts.overwrite:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        if is_ours(record):
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


def prepare_folder(dst: Path, source: str, opts: StageOptions) -> None:
    adopt_legacy_record(dst)
    _refuse_or_clear(dst, source, read_json(manifest_path(dst)) or {}, opts)


def prepare_file(target: Path, src: Path, entry: FileEntry, opts: StageOptions) -> None:
    """A single file may replace only a file colabfast staged from ``src``, or an identical copy."""
    legacy = _legacy_record(target)
    record = read_json(record_of(target, single=True)) or {}
    if not record and legacy is not None and (record := read_json(legacy) or {}):  # beside it (colabfast 0.1)
        write_json_atomic(record_of(target, single=True), record)
    adopt_legacy_record(target)
    if not target.exists() and not target.is_symlink():
        return
    if target.is_dir():
        raise StageRefused(f"{target} is a folder: cannot stage the file {src} over it")
    if (is_ours(record) and record.get("source") == str(src)) or unchanged(target.stat(), entry.size, entry.mtime_ns):
        return
    if not opts.overwrite:
        whose = f"was staged from {record.get('source')}" if is_ours(record) else "is a file colabfast did not stage"
        refused = StageRefused(f"{target} {whose}: staging {src} would replace it, so nothing was written. Pass "
                               f"another dst, or overwrite=True to replace it.")
        refused.target, refused.staged_from = target, record.get("source") if is_ours(record) else None  # type: ignore[attr-defined]
        raise refused


class Hashes:
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


