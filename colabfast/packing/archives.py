"""Packing an archive (``.tar``, ``.tar.gz``/``.tgz``/``.tar.bz2``/``.tar.xz``, ``.zip``) read as one
stream, never extracted: :func:`pack_archive`.

:class:`colabfast.packing.archivesource.ArchiveSource` reads it front to back while worker processes decode;
parts are logged as finished, so a run resumes after the member its last part reached, and assembled into an
ImageFolder-shaped mirror by :mod:`colabfast.packing.folders`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import warnings
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Optional, Union

import numpy as np

import colabfast.packing.common as common
from colabfast.errors import MirrorError, NotEnoughSpace
from colabfast.layouts.images import ImageListing as Source  # (renamed after the merge)
from colabfast.layouts.images import Split
from colabfast.mirror.format import IMAGEFOLDER
from colabfast.mirror.safety import trust
from colabfast.packing.archivesource import ArchiveSource, Position
from colabfast.packing.common import (
    check_same_source,
    existing_mirror,
    is_complete,
    load_part,
    lock_path,
    pack_work_dir,
    printable,
    process_pool,
    publish,
    save_part,
    stopping,
)
from colabfast.packing.folders import BuildOptions, _build, _encode_chunk, _Parts, _resume_assembly
from colabfast.staging.extract import archive_suffix
from colabfast.where import env
from colabfast.where._fileio import FileEntry, PathLike, human_bytes, locked, partial_path

__all__ = ["pack_archive"]

PIECE = 32  # images per task sent to a worker when packing an archive stream


def pack_archive(src: PathLike, dst: PathLike, *, options: dict, workers: int, on_error: str, progress: bool,
                 overwrite: bool, layout: str, labels: Optional[PathLike], split: Optional[str], seed: int,
                 retries: int, prefix: str = "") -> Path:
    """:func:`colabfast.pack` for the archive ``src`` (``layout`` a registered layout that streams, or
    ``"auto"``; ``prefix`` the split folder read), never shuffled (``seed`` is recorded as given);
    ``options`` as :func:`~colabfast.packing.common.mirror_options` makes them. Returns ``dst`` as given.
    Raises what :func:`colabfast.pack` raises."""
    given = Path(os.path.abspath(dst))
    dst = Path(os.path.realpath(given))  # one lock and one work folder, however the path is spelled
    path = os.fspath(src)
    work = pack_work_dir(dst)
    work.parent.mkdir(parents=True, exist_ok=True)
    with locked(lock_path(dst), f"packing into {dst}"):  # one pack at a time: see pack_folder
        packed_from = existing_mirror(dst, overwrite, Path(path).name.split(".")[0] or "mirror")
        fingerprint, archive = _listing(path, options, layout, labels, split, retries, prefix)
        if packed_from is not None:
            check_same_source(dst, packed_from, archive.path)
        described = printable(f"{archive.path}: {archive.describe()}")
        if progress:
            print(f"pack: {described}")
        if is_complete(dst, fingerprint):
            if progress:
                print(f"pack: {dst} is already a complete mirror of this archive with these options")
            return given
        build = common.build_path(dst, work)
        work.mkdir(parents=True, exist_ok=True)
        if not is_complete(build, fingerprint) and not _resume_assembly(build, work, fingerprint):
            reused = sum((work / r["part"]).stat().st_size for r in _stream_log(work, _stream_key(archive, options)))
            _preflight_archive(archive.path, work, options["store"], options["image_size"], reused)
            source, orders, parts = _stream_parts(archive, options, work, workers, progress)
            how = BuildOptions(fingerprint, options, on_error, False, seed, archive)
            _build(build, work, source, orders, parts, how)
        publish(build, dst)
        trust(dst)  # opening what we just wrote needs no check in a child process
        shutil.rmtree(work, ignore_errors=True)
    return given


def _listing(path: PathLike, options: dict, layout: str, labels: Optional[PathLike], split: Optional[str],
             retries: int, prefix: str = "") -> tuple[str, ArchiveSource]:
    """What :func:`pack_archive` knows of the archive before it reads an image: ``(fingerprint, archive)``;
    ``prefix``: the split folder inside it that is read."""
    archive = ArchiveSource(path, layout, split, labels, retries, prefix)
    fingerprint = _archive_fingerprint(archive, labels, options)
    return (fingerprint if not prefix else hashlib.sha256(f"{fingerprint}\0{prefix}".encode()).hexdigest()), archive


def _archive_fingerprint(archive: ArchiveSource, labels: Optional[PathLike], options: dict) -> str:
    """What a finished mirror of an archive depends on: the archive and labels files (size, mtime),
    the layout and the options."""
    files = [archive.path] + ([Path(labels)] if labels is not None else [])
    stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(json.dumps({"layout": archive.layout, "files": stats, **options}).encode()).hexdigest()


def _preflight_archive(path: Path, work: Path, store: str, image_size, reused: int = 0) -> None:
    """Kept encoded images make a mirror of about the archive's size (its parts move into it, see
    :func:`_assemble`), less the ``reused`` bytes of parts an earlier run left, which are on the disk
    already; resized or raw stores are checked once their size is known."""
    size = path.stat().st_size
    free = env.disk_free(work)
    need = max(int(1.02 * size + 64e6) - reused, 0)
    if store == "encoded" and image_size is None and need > free:
        less = f", less the {human_bytes(reused)} of parts an earlier run left" if reused else ""
        raise NotEnoughSpace(errno.ENOSPC, f"not enough free space on {work.parent} to pack {path}: need "
                                    f"{human_bytes(need)} ({human_bytes(size)} of images for the mirror, and a "
                                    f"margin{less}), have {human_bytes(free)}. Pack a resized mirror "
                                    "(image_size=...): only the mirror is written locally, never the archive.")
    if env.drive_kind(path) == "drivefs" and size > free:
        warnings.warn(f"pack: DriveFS keeps a copy of what it reads on this disk, and {path} ({human_bytes(size)}) "
                      f"is larger than the {human_bytes(free)} free on {work.parent}. If the disk fills up, run "
                      "colabfast.refresh_drive() to empty that cache, then pack() again: it continues from the "
                      "archive member its last finished part reached.", stacklevel=5)


def _stream_key(archive: ArchiveSource, options: dict) -> str:
    """What an earlier run's parts must have been made of to be reused (see :func:`_stream_parts`)."""
    return json.dumps({"archive": archive.path.name, "layout": archive.layout,
                       "labels": archive.labels.origin if archive.labels else None, **options}, sort_keys=True)


def _stream_log(work: Path, key: str) -> list[dict]:
    """The finished parts of an earlier run of this stream, in order: one JSON line per part in
    ``stream.jsonl``, written once its file is in place; a torn line or a missing part ends the list."""
    log = work / "stream.jsonl"
    records: list[dict] = []
    try:
        lines = log.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return records
    if not lines or lines[0] != key:
        return records
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except ValueError:
            break
        if not (work / record["part"]).is_file():  # parts are renamed into place before their line is written
            break
        records.append(record)
    return records


def _stream_parts(archive: ArchiveSource, options: dict, work: Path, workers: int,
                  progress: bool) -> tuple[Source, dict[str, np.ndarray], _Parts]:
    """Read the archive once (parallel readahead) and save its images as parts of
    :data:`~colabfast.packing.common.CHUNK` images, decoded by workers. A run resumes after the last
    logged part (a plain ``.tar`` entered at that member's offset); the log's key leaves out the archive's
    size and time, so a truncated upload completed later resumes."""
    from tqdm.auto import tqdm

    key = _stream_key(archive, options)
    records = _stream_log(work, key)
    keep = {r["part"] for r in records}
    for stale in work.glob("*.npz"):
        if stale.name not in keep:
            stale.unlink()  # beyond the logged parts, or of another archive or options
    tmp = partial_path(work / "stream.jsonl")  # rewritten without a torn last line, atomically
    tmp.write_text("\n".join([key] + [json.dumps(r) for r in records]) + "\n", encoding="utf-8")
    os.replace(tmp, work / "stream.jsonl")
    names = [n for r in records for n in r["names"]]
    errors = [(k * common.CHUNK + i, msg) for k, r in enumerate(records) for i, msg in r["errors"]]
    start = Position(*records[-1]["next"]) if records else Position(0, 0)

    if records and progress:
        print(f"pack: resuming after the {len(names)} images an earlier run packed")
    pool = process_pool(workers)
    inflight: deque[tuple[list[Future], list[str], Position]] = deque()
    log = open(work / "stream.jsonl", "a", encoding="utf-8")

    def finish(futs: list[Future], batch: list[str], after: Position) -> None:
        try:
            result = _joined([fut.result() for fut in futs])
        except BaseException:
            inflight.clear()  # parts are numbered in stream order: none after a failed one is kept
            raise
        k = len(names) // common.CHUNK
        path = work / f"stream-{k:06d}.npz"
        save_part(path, result)
        log.write(json.dumps({"part": path.name, "names": batch, "errors": result["errors"],
                              "next": list(after)}) + "\n")
        log.flush()
        errors.extend((k * common.CHUNK + i, msg) for i, msg in result["errors"])
        names.extend(batch)
        bar.set_postfix_str(f"{len(names)} images packed", refresh=False)

    def submit(batch: list[tuple[str, Union[bytes, str]]], after: Position) -> None:
        # Pieces smaller than a part keep every worker busy; parts stay the unit of resuming.
        items = [data for _, data in batch]
        futs = [pool.submit(_encode_chunk, items[k : k + PIECE], options["store"], options["image_size"],
                            options["quality"] or 90) for k in range(0, len(items), PIECE)]
        inflight.append((futs, [n for n, _ in batch], after))
        while len(inflight) > 2:  # one part being read, one decoding, one queued: ~3 x 28 MB of ImageNet JPEGs
            finish(*inflight.popleft())

    size = archive.path.stat().st_size
    skipped = start.member if archive_suffix(archive.path) == ".tar" else 0  # a plain tar resumes at that offset
    with log, stopping(pool), tqdm(total=size, initial=skipped, unit="B", unit_scale=True, unit_divisor=1000,
                                    desc="pack", disable=not progress) as bar:
        bar.set_postfix_str(f"{len(names)} images packed", refresh=False)
        batch: list[tuple[str, Union[bytes, str]]] = []
        after = start
        try:
            for name, data, after in archive.images(start, on_bytes=lambda n: bar.update(n - bar.n)):
                batch.append((name, data))
                if len(batch) == common.CHUNK:
                    submit(batch, after)
                    batch = []
            if batch:
                submit(batch, after)
        finally:  # also on a truncated archive or an interrupt: keep the parts being made, for the next run
            while inflight:
                finish(*inflight.popleft())
    # tar and unzip keep the last copy of a repeated member: the earlier ones get order -1, left out
    superseded = archive.superseded(names)
    _drop_from_parts(work, superseded)
    paths, targets, classes, order = archive.samples(names, skip=superseded)
    files = [FileEntry(p, 0, 0) for p in paths]
    # An ImageFolder-shaped mirror (classes, targets) whatever the archive's layout; "labels" says whence.
    source = Source(IMAGEFOLDER, archive.path, [Split("", archive.path, files, targets=targets)], classes)
    part_paths = [work / f"stream-{k:06d}.npz" for k in range((len(names) + common.CHUNK - 1) // common.CHUNK)]
    failed = [(int(order[j]), m) for j, m in errors if order[j] >= 0]  # not a superseded copy's
    return source, {"": order}, _Parts(part_paths, {"": part_paths}, {"": failed})


def _drop_from_parts(work: Path, drop: list[int]) -> None:
    """Take the streamed images ``drop`` out of their parts' blobs: a sample left out of the mirror
    takes no bytes there (see :func:`_write_split`). Idempotent, so a resumed run may do it again."""
    by_part: dict[int, list[int]] = {}
    for j in drop:
        by_part.setdefault(j // common.CHUNK, []).append(j % common.CHUNK)
    for k, local in by_part.items():
        path = work / f"stream-{k:06d}.npz"
        part = load_part(path)
        if part is None:
            raise MirrorError(f"{path} is unreadable though it was just written: run pack() again")
        ends = part["offsets"]
        sizes = np.diff(ends)
        if not sizes[local].any():
            continue
        sizes[local] = 0
        part["blob"] = b"".join(part["blob"][ends[i]:ends[i + 1]].tobytes() for i in np.flatnonzero(sizes))
        part["offsets"] = np.concatenate([[0], np.cumsum(sizes)])
        part["shapes"][local] = 0
        save_part(path, part)


def _joined(results: list[dict]) -> dict:
    """One part's result from its pieces' (:func:`_encode_chunk` results, in order)."""
    if len(results) == 1:
        return results[0]
    offsets, errors, base, count = [np.zeros(1, np.int64)], [], 0, 0
    for r in results:
        offsets.append(base + r["offsets"][1:])
        errors += [(count + i, msg) for i, msg in r["errors"]]
        base += int(r["offsets"][-1])
        count += len(r["shapes"])
    return {"blob": b"".join(r["blob"] for r in results), "offsets": np.concatenate(offsets),
            "shapes": np.concatenate([r["shapes"] for r in results]), "errors": errors}
