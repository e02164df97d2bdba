"""Packing a folder of images (torchvision's ImageFolder, KITTI) or a list of image files:
:func:`pack_folder`.

The folder is listed first (:mod:`colabfast.layouts.images`); images are then read by a thread pool
(overlapping Drive's round trips), decoded/checked/re-encoded by worker processes, and saved as part
files named by what went into them; the mirror is assembled locally from the parts (which move into
it one by one), verified, and published. An archive stream (:mod:`colabfast.packing.archives`) makes
parts of the same kind and is assembled here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import shutil
import warnings
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Union

import h5py
import numpy as np
from PIL import Image, UnidentifiedImageError

import colabfast.packing.common as common
from colabfast.errors import MirrorError, NotEnoughSpace
from colabfast.layouts.images import ImageListing as Source  # (renamed after the merge)
from colabfast.layouts.images import Split, read_source
from colabfast.mirror.encoding import encode_image
from colabfast.mirror.format import Header, check
from colabfast.mirror.index import write_array
from colabfast.mirror.safety import open_h5, trust
from colabfast.packing.archivesource import ArchiveSource
from colabfast.packing.common import (
    PackError,
    _verify_attrs,
    check_same_source,
    existing_mirror,
    file_key,
    is_complete,
    load_part,
    lock_path,
    pack_work_dir,
    package_version,
    printable,
    process_pool,
    publish,
    save_part,
    seal,
    stopping,
)
from colabfast.where import env
from colabfast.where._fileio import PathLike, human_bytes, locked, open_regular, partial_path, retry, write_all

__all__ = ["pack_folder", "BuildOptions"]


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """What :func:`_build` records in a mirror's header beside its images (``options`` as
    :func:`~colabfast.packing.common.mirror_options` makes them), and what it does with unreadable files."""

    fingerprint: str
    options: dict
    on_error: str
    shuffle: bool
    seed: int
    archive: Optional[ArchiveSource] = None  # the archive the parts were streamed from


def pack_folder(src: Any, dst: PathLike, *, options: dict, workers: int, on_error: str, progress: bool,
                overwrite: bool, layout: str, shuffle: bool, seed: int, retries: int,
                recorded: Optional[tuple[str, Path]] = None) -> Path:
    """:func:`colabfast.pack` for a folder (``layout`` ``"imagefolder"``, ``"kitti"`` or ``"auto"``) or, for
    ``"files"``, a list of image paths or ``(path, label)`` pairs; ``options`` as :func:`~colabfast.packing.
    common.mirror_options` makes them; ``recorded``: the fingerprint and source the mirror records instead of
    the folder's (an archive extracted to it). Returns ``dst`` as given. Raises what :func:`colabfast.pack`
    raises."""
    given = Path(os.path.abspath(dst))
    dst = Path(os.path.realpath(given))  # one lock and one work folder, however the path is spelled
    path = os.fspath(src) if isinstance(src, (str, os.PathLike)) else ""
    work = pack_work_dir(dst)
    work.parent.mkdir(parents=True, exist_ok=True)
    # Two packs into one destination would delete each other's parts and publish a mix (seen in 2 of
    # 9 concurrent runs): the second waits for the first, saying so.
    with locked(lock_path(dst), f"packing into {dst}"):
        packed_from = existing_mirror(dst, overwrite, Path(path).name.split(".")[0] or "mirror")
        fingerprint, source, orders = _listing(src, options, layout, shuffle, seed)
        if recorded is not None:
            fingerprint, source.root = recorded
        if packed_from is not None:
            check_same_source(dst, packed_from, source.root)
        described = printable(f"{source.root}: {source.describe()}")
        if progress:
            print(f"pack: {described}")
        if is_complete(dst, fingerprint):
            if progress:
                print(f"pack: {dst} is already a complete mirror of this source with these options")
            return given
        build = common.build_path(dst, work)
        work.mkdir(parents=True, exist_ok=True)
        if not is_complete(build, fingerprint) and not _resume_assembly(build, work, fingerprint):
            if source.unreadable and on_error == "raise":  # before any work, not after it
                raise PackError([(printable(p), e) for p, e in source.unreadable])
            jobs = _plan_parts(source, orders, options, work)
            _preflight(source, work, options["store"], options["image_size"], reused=_reused(jobs))
            parts = _make_parts(source, orders, options, jobs, workers, progress, retries)
            _build(build, work, source, orders, parts, BuildOptions(fingerprint, options, on_error, shuffle, seed))
        publish(build, dst)
        trust(dst)  # opening what we just wrote needs no check in a child process
        shutil.rmtree(work, ignore_errors=True)
    return given


def _listing(src: Any, options: dict, layout: str, shuffle: bool,
             seed: int) -> tuple[str, Source, dict[str, np.ndarray]]:
    """What :func:`pack_folder` knows of ``src`` before it reads an image: ``(fingerprint, source,
    orders)``, ``orders`` each split's order."""
    source = read_source(src, layout)
    orders = {s.name: _order(len(s.files), shuffle, seed) for s in source.splits}
    return _fingerprint(source, orders, options), source, orders


def _order(n: int, shuffle: bool, seed: int) -> np.ndarray:
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(seed).permutation(n).astype(np.int64)


def _fingerprint(source: Source, orders: dict[str, np.ndarray], options: dict) -> str:
    h = hashlib.sha256(json.dumps({"layout": source.layout, "classes": source.classes, **options}).encode())
    for s in source.splits:
        h.update(s.name.encode() + b"\0" + orders[s.name].tobytes())
        for f in s.files:
            h.update(file_key(f))
        if s.objects is not None:
            h.update(s.objects.offsets.tobytes() + s.objects.bbox.tobytes())
    return h.hexdigest()


def _preflight(source: Source, work: Path, store: str, image_size, reused: int = 0) -> None:
    """Check before any work that the local disk can hold what packing writes there.

    Kept encoded images make parts and then a mirror of about the source's size each: not enough
    space for those raises ENOSPC. The ``reused`` bytes of parts an earlier run left (stopped by a
    full disk, say) are on the disk already and move into the mirror: they are not needed again.
    Reading the source from DriveFS also fills Drive's local cache with it (DriveFS keeps what it
    reads under ``/root/.config/Google/DriveFS/<account>/content_cache``, so copying N GB off Drive
    needs about 2 N GB free); when that will not fit, this warns with the way through (packing
    resumes, and :func:`colabfast.refresh_drive` empties the cache) instead of refusing: ImageNet
    (150 GB) is packed from Drive that way on a 70 GB Colab disk. Resized or raw stores have no size
    before decoding; :func:`_assemble` checks again once it is known.
    """
    src_bytes = sum(f.size for s in source.splits for f in s.files)
    output = max(int(1.02 * src_bytes + 64e6) - reused, 0) if store == "encoded" and image_size is None else 0
    free = env.disk_free(work)
    if output > free:
        less = f", less the {human_bytes(reused)} of parts an earlier run left" if reused else ""
        raise NotEnoughSpace(errno.ENOSPC, f"not enough free space on {work.parent} to pack {source.root}: "
                          f"need {human_bytes(output)} "
                          f"({human_bytes(src_bytes)} of images for the mirror, and a margin{less}), have "
                          f"{human_bytes(free)}. Free space, or pack a resized mirror (image_size=...).")
    if env.drive_kind(source.root) == "drivefs" and output + src_bytes > free:
        warnings.warn(f"pack: reading {human_bytes(src_bytes)} from Drive also fills Drive's local cache, and "
                      f"{work.parent} has {human_bytes(free)} free. If the disk fills up, run "
                      "colabfast.refresh_drive() to empty the cache, then pack() again: it resumes from the "
                      "parts it finished.", stacklevel=4)


def _build(build: Path, work: Path, source: Source, orders: dict[str, np.ndarray], parts: _Parts,
           how: BuildOptions) -> None:
    """Assemble the parts in ``work`` into a verified mirror at ``build`` (the parts go into it)."""
    fingerprint, options, on_error, shuffle, seed, archive = (how.fingerprint, how.options, how.on_error,
                                                              how.shuffle, how.seed, how.archive)
    failures = sorted([(printable(str(s.root / s.files[i].rel)), err)
                       for s in source.splits for i, err in parts.errors[s.name]]
                      + [(printable(p), e) for p, e in source.unreadable])
    if failures and on_error == "raise":
        raise PackError(failures)
    if failures:
        what = "files and folders" if source.unreadable else "files"
        warnings.warn(f"pack: skipped {len(failures)} unreadable {what}, e.g. {failures[0][0]}: {failures[0][1]}",
                      stacklevel=4)
    hidden = [(printable(p), e) for p, e in source.hidden]
    if hidden:
        warnings.warn(f"pack: left out {len(hidden)} hidden files or folders that torchvision reads, e.g. "
                      f"{hidden[0][0]}: {hidden[0][1]}. The mirror lists them (colabfast info).", stacklevel=4)
    labels, names = None, None
    if archive is not None:
        labels = archive.labels.origin if archive.labels else f"class folders in {archive.path}"
        names = archive.class_names(source.classes or [])
    head = Header(
        layout=source.layout, store=options["store"], classes=source.classes, image_size=options["image_size"],
        quality=options["quality"], shuffled=shuffle, seed=seed, fingerprint=fingerprint,
        skipped=[{"path": p, "error": e} for p, e in sorted(failures + hidden)], source=printable(str(source.root)),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), colabfast_version=package_version(),
        labels=labels, class_names=None if names is None else [list(n) for n in names],
        split=archive.layout.split("-", 1)[1] if archive is not None and archive.layout.startswith("kaggle-") else None,
    )
    _assemble(build, work, source, orders, parts, head)
    _verify(build, {s.name: int(np.count_nonzero(orders[s.name] >= 0)) - len(parts.errors[s.name])
                    for s in source.splits})


# --- decoding, in worker processes -----------------------------------------------------------------


def _encode_chunk(items: list[Union[bytes, str]], store: str, image_size, quality: int) -> dict:
    """Encode one part's images; a str item is a read error. Runs in a worker process."""
    blobs, shapes, errors = [], [], []
    for i, data in enumerate(items):
        blob, shape = b"", (0, 0, 0)
        if isinstance(data, str):
            errors.append((i, data))
        else:
            try:
                blob, shape = encode_image(data, store, image_size, quality)
            except Exception as exc:  # PIL raises many types for bad files; each is reported
                errors.append((i, _why(exc, data)))
        blobs.append(blob)
        shapes.append(shape)
    lengths = np.array([len(b) for b in blobs], dtype=np.int64)
    return {"blob": b"".join(blobs), "offsets": np.concatenate([[0], np.cumsum(lengths)]),
            "shapes": np.array(shapes, dtype=np.int32).reshape(-1, 3), "errors": errors}


def _why(exc: Exception, data: bytes) -> str:
    if not data:
        return "empty file (0 bytes)"
    if isinstance(exc, UnidentifiedImageError):  # PIL's message names an in-memory buffer: useless
        return "not an image, or a format PIL cannot read"
    return f"{type(exc).__name__}: {exc}"


# --- parts ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Parts:
    paths: list[Path]
    by_split: dict[str, list[Path]]  # in stored order
    errors: dict[str, list[tuple[int, str]]]  # split -> (source index, message)


SNIFF = 16 << 20  # files larger than this are read whole only where an image format could start as they do


def _read_file(path: Path, retries: int = 5) -> Union[bytes, str]:
    """The bytes of an image file, or why it cannot be packed. A file over :data:`SNIFF` bytes is read
    whole only where PIL could open it (:func:`_may_be_image`): a sparse 200 MB file named ``.jpg`` cost
    twice its size (read, then sent to a worker) to learn it was not an image."""
    def read() -> Union[bytes, str]:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > SNIFF:
                head = f.read(64 << 10)
                if not _may_be_image(head):
                    return (f"not an image, or a format PIL cannot read ({size} bytes, starting {head[:8]!r}; not "
                            "read whole)")
                f.seek(0)
            return f.readall()

    try:
        return retry(read, retries)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _may_be_image(head: bytes) -> bool:
    """Whether PIL could open a file that starts with ``head``: a format's own test of the first 16 bytes
    accepts them (as ``PIL.Image.open`` asks), or a format without one opens from its header."""
    Image.init()
    blind = []
    for name, (_, accept) in Image.OPEN.items():
        if accept is None:
            blind.append(name)
        elif accept(head[:16]):
            return True
    try:
        with Image.open(io.BytesIO(head), formats=blind):
            return True
    except Exception:  # PIL raises many types for a header it does not read
        return False


_Job = tuple[Split, Path, np.ndarray]  # a part: its split, its file, its samples' source indices


def _plan_parts(source: Source, orders: dict[str, np.ndarray], options: dict, work: Path) -> list[_Job]:
    """The parts of this source with these options, each named by what goes into it, so that a part an
    earlier run finished is found and reused; parts of an earlier run with other files or options are
    deleted now (before :func:`_preflight` measures the free space)."""
    tags = json.dumps(options, sort_keys=True)
    jobs: list[_Job] = []
    for s in source.splits:
        order = orders[s.name]
        for k in range(0, len(order), common.CHUNK):
            idx = order[k : k + common.CHUNK]
            h = hashlib.sha1(tags.encode())
            for i in idx:
                h.update(file_key(s.files[i]))
            jobs.append((s, work / f"{s.name or 'all'}-{k // common.CHUNK:06d}-{h.hexdigest()[:16]}.npz", idx))
    wanted = {p for _, p, _ in jobs}
    for stale in work.glob("*.npz"):
        if stale not in wanted:
            stale.unlink()  # parts of an earlier run with other files or options
    return jobs


def _reused(jobs: list[_Job]) -> int:
    """Bytes on disk of the parts an earlier run finished, which :func:`_make_parts` will reuse."""
    total = 0
    for _, path, _ in jobs:
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def _make_parts(source: Source, orders: dict[str, np.ndarray], options: dict, jobs: list[_Job], workers: int,
                progress: bool, retries: int) -> _Parts:
    """Make the parts :func:`_plan_parts` planned, reusing those an earlier run finished."""
    from tqdm.auto import tqdm

    errors: dict[str, list[tuple[int, str]]] = {s.name: [] for s in source.splits}
    todo = []
    for s, path, idx in jobs:
        done = load_part(path) if path.exists() else None
        if done is None:
            todo.append((s, path, idx))
        else:  # finished by an earlier, interrupted run
            errors[s.name].extend((int(idx[i]), msg) for i, msg in done["errors"])
    total = sum(len(o) for o in orders.values())
    finished = total - sum(len(idx) for _, _, idx in todo)
    if finished and progress:
        print(f"pack: resuming: {finished} of {total} images were packed by an earlier run")
    pool = process_pool(workers)
    inflight: deque[tuple[Future, Split, Path, np.ndarray]] = deque()

    def finish(fut: Future, s: Split, path: Path, idx: np.ndarray) -> None:
        result = fut.result()
        save_part(path, result)
        errors[s.name].extend((int(idx[i]), msg) for i, msg in result["errors"])
        bar.update(len(idx))

    with ThreadPoolExecutor(32, thread_name_prefix="colabfast-pack-read") as readers, stopping(pool), \
            tqdm(total=total, initial=finished, unit="img", desc="pack", disable=not progress) as bar:
        for s, path, idx in todo:
            items = list(readers.map(lambda p: _read_file(p, retries), [s.root / s.files[i].rel for i in idx]))
            inflight.append((pool.submit(_encode_chunk, items, options["store"], options["image_size"],
                                         options["quality"] or 90), s, path, idx))
            while len(inflight) > max(workers, 1):
                finish(*inflight.popleft())
        while inflight:
            finish(*inflight.popleft())
    by_split = {s.name: [p for t, p, _ in jobs if t is s] for s in source.splits}
    return _Parts([p for _, p, _ in jobs], by_split, errors)


# --- assembling, verifying -----------------------------------------------------------------------


def _assemble(build: Path, work: Path, source: Source, orders: dict[str, np.ndarray], parts: _Parts,
              head: Header) -> None:
    """Write the mirror to ``build``, moving each part's images into it and deleting the part.

    Peak disk use is the mirror plus one part, not the parts plus the mirror (ImageNet at 160 px:
    about 10 GB, not 20). In three steps, each safe to kill:

    1. :func:`_lay_out` writes every index array and allocates the ``images`` datasets (their bytes
       unwritten, so the file takes no room for them yet), then closes the file: HDF5's metadata
       is final and on disk from here on. Where each part's images go is saved in ``work``
       (:func:`_plan_moves`), so a killed run continues with what it did not move.
    2. :func:`_move_parts` writes each part's image bytes at their place in the file (``pwrite``),
       syncs, notes the part as moved and deletes it.
    3. ``complete`` is set in a last open, and the file synced.
    """
    build.parent.mkdir(parents=True, exist_ok=True)
    sizes = [_part_bytes(p) for p in parts.paths]
    total, free = sum(sizes), env.disk_free(build.parent)
    if os.stat(build.parent).st_dev == os.stat(work).st_dev:  # the parts shrink as the mirror grows
        need = max(sizes, default=0) + 0.02 * total + 64e6
    else:
        need = 1.02 * total
    if need > free:
        raise NotEnoughSpace(errno.ENOSPC, f"not enough free space on {build.parent} to build the mirror: need "
                                    f"{human_bytes(need)}, have {human_bytes(free)}")
    moves = _lay_out(build, source, orders, parts, head)
    _plan_moves(work, head.fingerprint or "", moves)
    _move_parts(build, work, moves)
    seal(build)


def _part_bytes(path: Path) -> int:
    with np.load(path, allow_pickle=False) as z:
        return int(z["offsets"][-1])


def _lay_out(build: Path, source: Source, orders: dict[str, np.ndarray], parts: _Parts,
             head: Header) -> list[tuple[str, int, int]]:
    """Write ``build`` whole but for the image bytes; return ``(part file name, file offset, bytes)``
    for every part, where :func:`_move_parts` puts its images."""
    with h5py.File(build, "w", locking=False) as f:
        head.write(f)
        placed = []
        for s in source.splits:
            g = f.create_group(s.name) if s.name else f
            at = _write_split(g, s, orders[s.name], parts.by_split[s.name], {i for i, _ in parts.errors[s.name]})
            placed.append((g["images"], at))
        moves = []
        for images, at in placed:
            base = images.id.get_offset()  # contiguous and allocated: a fixed place in the file
            moves += [(path.name, int(base) + pos, n) for path, pos, n in at if n]
    return moves


def _plan_moves(work: Path, fingerprint: str, moves: list[tuple[str, int, int]]) -> None:
    """Save where each part goes (``assemble.jsonl`` in ``work``: a header line, then one line per
    part moved, appended by :func:`_move_parts`)."""
    tmp = partial_path(work / "assemble.jsonl")
    tmp.write_text(json.dumps({"fingerprint": fingerprint, "moves": moves}) + "\n", encoding="utf-8")
    os.replace(tmp, work / "assemble.jsonl")


def _move_parts(build: Path, work: Path, moves: list[tuple[str, int, int]]) -> None:
    """Copy each part's image bytes to its place in ``build`` and delete the part (see :func:`_assemble`)."""
    done = _moved(work)
    fd = os.open(build, os.O_WRONLY)
    try:
        with open(work / "assemble.jsonl", "a", encoding="utf-8") as log:
            for name, offset, nbytes in moves:
                if name in done:
                    continue
                part = load_part(work / name)
                if part is None or len(part["blob"]) != nbytes:
                    raise MirrorError(f"{work / name} is missing or unreadable while building {build}: delete "
                                      f"{work} and run pack() again")
                write_all(fd, memoryview(part["blob"]), offset)
                os.fsync(fd)  # on disk before the part goes
                log.write(json.dumps(name) + "\n")
                log.flush()
                os.fsync(log.fileno())
                (work / name).unlink()
    finally:
        os.close(fd)


def _moved(work: Path) -> set[str]:
    """The parts :func:`_move_parts` finished in an earlier run (a torn last line counts as not moved:
    its part file is still there, and writing its bytes again is harmless)."""
    names = set()
    with contextlib.suppress(FileNotFoundError):
        for line in (work / "assemble.jsonl").read_text(encoding="utf-8").splitlines()[1:]:
            with contextlib.suppress(ValueError):
                names.add(json.loads(line))
    return names


def _resume_assembly(build: Path, work: Path, fingerprint: str) -> bool:
    """Finish a mirror whose assembly an earlier run began (killed while moving parts into it);
    False if there is none to finish for this ``fingerprint``."""
    try:
        plan = json.loads((work / "assemble.jsonl").read_text(encoding="utf-8").splitlines()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return False
    if plan.get("fingerprint") != fingerprint or not build.is_file():
        return False
    moves = [(str(n), int(o), int(b)) for n, o, b in plan["moves"]]
    done = _moved(work)
    if any(name not in done and not (work / name).is_file() for name, _, _ in moves):
        return False  # a part is gone that was never moved: build again
    _move_parts(build, work, moves)
    seal(build)
    _verify_attrs(build)
    return True


def _write_split(g: h5py.Group, s: Split, order: np.ndarray, part_paths: list[Path],
                 bad: set[int]) -> list[tuple[Path, int, int]]:
    """Write the split's index arrays and allocate its ``images``; return ``(part, position in
    images, bytes)`` per part. Failed samples take no bytes in a part's blob, so each blob goes whole."""
    offsets, shapes, kept, crcs, at, pos = [np.zeros(1, np.int64)], [], [], [], [], 0
    for k, path in enumerate(part_paths):
        part = load_part(path)
        if part is None:
            raise MirrorError(f"{path} is unreadable though it was just checked: run pack() again")
        idx = order[k * common.CHUNK : (k + 1) * common.CHUNK]
        keep = np.array([int(i) >= 0 and int(i) not in bad for i in idx], dtype=bool)  # -1: a superseded copy
        blob, ends = part["blob"], part["offsets"]
        offsets.append(pos + ends[1:][keep])
        shapes.append(part["shapes"][keep])
        crcs += [zlib.crc32(blob[ends[i] : ends[i + 1]]) for i in np.flatnonzero(keep)]
        kept.append(idx[keep])
        at.append((path, pos, len(blob)))
        pos += len(blob)
    # Contiguous, unfiltered, its room allocated now but never filled (so it takes no disk until
    # written): its place in the file is fixed before any image byte is written.
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    g.create_dataset("images", shape=(pos,), dtype=np.uint8, dcpl=dcpl)
    kept_idx = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    write_array(g, "image_offsets", np.concatenate(offsets).astype(np.int64))
    write_array(g, "image_shapes", np.concatenate(shapes).astype(np.int32).reshape(-1, 3)
                if shapes else np.zeros((0, 3), np.int32))
    write_array(g, "image_crc32", np.array(crcs, dtype=np.uint32))
    write_array(g, "order", kept_idx)
    paths = [printable(s.files[i].rel).encode("utf-8") for i in kept_idx]
    write_array(g, "paths", np.frombuffer(b"".join(paths), dtype=np.uint8))
    write_array(g, "path_offsets", np.concatenate([[0], np.cumsum([len(p) for p in paths])]).astype(np.int64))
    if s.targets is not None:
        write_array(g, "targets", s.targets[kept_idx])
    if s.objects is not None:
        _write_objects(g, s, kept_idx)
    if s.calib is not None:
        calib = g.create_group("calib")
        for key, rows in s.calib.items():
            write_array(calib, key, rows[kept_idx])
    return at


def _write_objects(g: h5py.Group, s: Split, kept: np.ndarray) -> None:
    o = s.objects
    assert o is not None
    rows = [np.arange(o.offsets[i], o.offsets[i + 1]) for i in kept]
    sel = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    counts = np.array([len(r) for r in rows], dtype=np.int64)
    write_array(g, "object_offsets", np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    names = sorted(set(o.type))
    code = {n: i for i, n in enumerate(names)}
    objects = g.create_group("objects")
    write_array(objects, "type", np.array([code[o.type[i]] for i in sel], dtype=np.uint8), names=json.dumps(names))
    for column in ("truncated", "occluded", "alpha", "bbox", "dimensions", "location", "rotation_y"):
        write_array(objects, column, getattr(o, column)[sel])


def _verify(path: Path, expected: dict[str, int]) -> None:
    """Reopen read-only and check completeness, counts and offsets before the mirror is published."""
    with open_h5(path) as f:
        check(f, path)
        for split, n in expected.items():
            g = f[split] if split else f
            offsets = g["image_offsets"][:]
            if len(offsets) != n + 1 or offsets[-1] != g["images"].shape[0] or np.any(np.diff(offsets) < 0):
                raise MirrorError(f"{path}: the {split or 'sample'} table is inconsistent after writing "
                                  "(disk error?); run pack() again")
            if len(g["order"]) != n or g["path_offsets"].shape[0] != n + 1:
                raise MirrorError(f"{path}: metadata counts disagree after writing; run pack() again")
