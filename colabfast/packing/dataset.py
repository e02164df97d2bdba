"""Packing a map-style dataset (yours, a Hugging Face one, or a folder layout of
:mod:`colabfast.layouts`) into a mirror of typed columns (format version 3): :func:`pack_columns`.

``dataset[i]`` runs in forked worker processes of a few threads each; its fields
(:mod:`colabfast.mirror.columns`) are encoded there and saved in resumable parts of
:data:`~colabfast.packing.common.CHUNK` samples, then assembled, verified and published. Images kept as their
files are written straight to their place in the mirror (:class:`_Direct`; docs/layouts.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import warnings
import zlib
from collections import deque
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional

import h5py
import numpy as np

import colabfast.packing.common as common
from colabfast.errors import MirrorError
from colabfast.mirror import columns as col
from colabfast.mirror.format import COLUMNS_VERSION, NULLS_VERSION, Header, attrs_crc32
from colabfast.mirror.index import load_columns, load_index, write_array
from colabfast.mirror.safety import trust
from colabfast.mirror.verify import check_columns
from colabfast.packing.common import (
    PackError,
    PackRefused,
    existing_mirror,
    file_key,
    is_complete,
    lock_path,
    pack_work_dir,
    package_version,
    printable,
    publish,
    seal,
    stopping,
)
from colabfast.packing.parts import ARRAY, PIECE, _blob_pieces, _encode_part, _ends, _load, _pool
from colabfast.where._fileio import PathLike, locked, read_json, write_all, write_json_atomic

__all__ = ["pack_columns", "plan", "make_parts", "assemble", "check_built", "header", "identity", "describe_dataset"]


def pack_columns(src: Any, dst: PathLike, *, options: dict, workers: int, on_error: str, progress: bool,
                 overwrite: bool, layout: str, fields: Optional[dict], source: Optional[str] = None,
                 fingerprint: Optional[str] = None, split: Optional[str] = None) -> Path:
    """:func:`colabfast.pack` for the map-style dataset ``src`` (a layout of :mod:`colabfast.layouts`
    is one): a mirror of columns, ``layout`` its name or ``"dataset"``; ``source`` and ``fingerprint``
    what the mirror records, where the caller knows better (an archive extracted to be packed);
    ``split`` the source's split it holds (pack's ``split=``), recorded in its header.
    Returns ``dst`` as given. Raises what :func:`colabfast.pack` raises."""
    from colabfast.layouts.base import Layout

    dataset = src

    given = Path(os.path.abspath(dst))
    dst = Path(os.path.realpath(given))
    is_layout = isinstance(dataset, Layout)
    source = source or (printable(str(dataset.root)) if is_layout else describe_dataset(dataset))
    work = pack_work_dir(dst)
    work.parent.mkdir(parents=True, exist_ok=True)
    with locked(lock_path(dst), f"packing into {dst}"):
        packed_from = existing_mirror(dst, overwrite, "mirror")
        if packed_from is not None and packed_from != source:
            raise PackRefused(f"{dst} is a mirror of {packed_from}, not of {source}: packing would replace it, so "
                             "nothing was written. Pass another dst, or overwrite=True to replace it.")
        template, flds, planned = plan(dataset, fields, options, layout)
        fingerprint = fingerprint or planned
        if is_layout:  # arrays of a layout's targets come back as tensors, as torchvision's models take them
            for f in flds:
                if f.as_ == "ndarray" and f.kind == "array":
                    f.as_ = "tensor"
        n = len(dataset)
        if progress:
            print(f"pack: {source}: {dataset.describe() if is_layout else f'{n} samples'}, fields "
                  + ", ".join(f"{f.name} ({f.kind if f.kind != 'array' else 'array'})" for f in flds
                              if f.as_ != "hidden"))
        if not fingerprint.endswith("-anonymous") and is_complete(dst, fingerprint):
            if progress:
                print(f"pack: {dst} is already a complete mirror of this dataset with these options")
            return given
        build = common.build_path(dst, work)
        work.mkdir(parents=True, exist_ok=True)
        direct = _Direct.start(dataset, template, flds, options, work, build, fingerprint)
        part_paths, errors, n = make_parts(dataset, template, flds, options, work, workers, progress, fingerprint,
                                           direct)
        paths = list(dataset.paths) if is_layout else [str(i) for i in range(n)]
        failures = [(paths[i], e) for i, e in errors]
        skipped = [(printable(p), e) for p, e in (dataset.skipped if is_layout else [])]
        if failures and on_error == "raise":
            raise PackError(failures)
        if failures:
            warnings.warn(f"pack: skipped {len(failures)} samples that failed, e.g. {failures[0][0]}: "
                          f"{failures[0][1]}", stacklevel=3)
        bad = {i for i, _ in errors}
        kept = np.array([i for i in range(n) if i not in bad], dtype=np.int64)
        head = header(layout, source, options, fingerprint, sorted(failures + skipped),
                      dataset.info if is_layout else None, split)
        build.parent.mkdir(parents=True, exist_ok=True)
        assemble(build, part_paths, flds, template, head, kept, [paths[i] for i in kept], direct)
        seal(build)
        check_built(build, flds, len(kept))
        publish(build, dst)
        trust(dst)
        shutil.rmtree(work, ignore_errors=True)
    return given


def describe_dataset(dataset: Any) -> str:
    """What a mirror records as its source for a dataset that is not a folder: its class (and root)."""
    if isinstance(named := getattr(dataset, "source_name", None), str):
        return named
    cls = type(dataset)
    root = getattr(dataset, "root", None)
    return f"{cls.__module__}.{cls.__qualname__}" + (f"({root})" if isinstance(root, (str, os.PathLike)) else "")


def identity(dataset: Any) -> Optional[str]:
    """What tells this dataset's content from another's, where it says: a layout's files (names,
    sizes, times), a Hugging Face dataset's ``_fingerprint``, or a ``fingerprint`` attribute of yours;
    else None (then a finished mirror is never taken for this dataset's: it is packed again)."""
    from colabfast.layouts.base import Layout
    if isinstance(dataset, Layout):
        h = hashlib.sha256(dataset.name.encode())
        for f in dataset.files:
            h.update(file_key(f))
        return h.hexdigest()
    for name in ("fingerprint", "_fingerprint"):
        value = getattr(dataset, name, None)
        if isinstance(value, str) and value:
            return value
    return None


def plan(dataset: Any, fields: Optional[dict], options: dict, layout: str) -> tuple[dict, list[col.Field], str]:
    """``(template, fields, fingerprint)`` from the first sample; raises FieldError for a sample no
    mirror can hold, before any work, LayoutError for a layout with no sample (saying what its
    ``on_error="skip"`` left out), ValueError for another empty dataset."""
    from colabfast.layouts.base import Layout, LayoutError
    n = len(dataset)
    if n == 0 and isinstance(dataset, Layout):
        listed = "; ".join(f"{path}: {why}" for path, why in dataset.skipped[:3])
        raise LayoutError(dataset.root, "no sample to pack" + (
            f': on_error="skip" left out every one ({listed}{"; ..." if len(dataset.skipped) > 3 else ""})'
            if dataset.skipped else ""), fix="Fix the files named, or check that it is the right folder")
    if n == 0:
        raise PackRefused(f"{describe_dataset(dataset)} is empty (len 0): there is nothing to pack")
    try:
        first = dataset[0]
    except IndexError:  # the end, as iterating it would stop there
        raise PackRefused(f"{describe_dataset(dataset)} is empty (dataset[0] raised IndexError though len() is "
                          f"{n}): there is nothing to pack") from None
    from colabfast.packing.hf import none_kinds

    template, flds = col.template_of(first, fields, none_kinds(dataset))
    for f in flds:
        if f.kind in col.IMAGE_KINDS and f.meta.get("encoding") == "jpeg":
            f.meta["quality"] = options.get("quality") or 90
    ident = identity(dataset)
    h = hashlib.sha256(json.dumps({"layout": layout, "n": n, "template": template, "fields": [f.spec() for f in flds],
                                   "options": options, "identity": ident, "source": describe_dataset(dataset)},
                                  sort_keys=True).encode())
    return template, flds, h.hexdigest() + ("" if ident is not None else "-anonymous")


@dataclasses.dataclass
class _Direct:
    """The first image column written by the workers straight into the mirror being built: its ``images``
    array at file offset ``base`` of ``build``, sample ``i`` at ``ends[i]..ends[i + 1]`` (int64 ``[n + 1]``).
    Its plan is saved as ``direct.json``, so a killed run keeps the parts whose CRC-32s still match."""

    build: Path
    column: int
    base: int
    ends: np.ndarray

    PLAN: ClassVar[str] = "direct.json"

    @classmethod
    def start(cls, dataset: Any, template: dict, fields: list[col.Field], options: dict, work: Path, build: Path,
              fingerprint: str) -> Optional[_Direct]:
        """The plan for this pack (continued from ``work``, or a new ``build`` allocated), or None where
        the images' sizes are not known before they are read."""
        plan_path = work / cls.PLAN
        predicted = _predicted_sizes(dataset, template, fields, options)
        if predicted is None:
            plan_path.unlink(missing_ok=True)
            return None
        column, sizes = predicted
        ends = _ends(sizes.tolist())
        want = {"fingerprint": fingerprint, "column": column, "size": int(ends[-1])}
        old = read_json(plan_path)
        if old is not None and {k: old.get(k) for k in want} == want and isinstance(old.get("base"), int) \
                and build.is_file():
            direct = cls(build, column, old["base"], ends)
            direct._drop_unverified(work, fingerprint, len(fields))
            return direct
        for part in work.glob("columns-*.npz"):  # images written into an earlier build are lost with it
            done = _load(part, len(fields))
            if done is None or _wrote_into_build(done):
                part.unlink()
        plan_path.unlink(missing_ok=True)
        with h5py.File(build, "w", locking=False) as h:
            images = _allocate(h.create_group("columns").create_group(str(column)), int(ends[-1]))
            base = int(images.id.get_offset())
        write_json_atomic(plan_path, {**want, "base": base})
        return cls(build, column, base, ends)

    def place(self, start: int, stop: int) -> tuple[str, int, int, np.ndarray]:
        """What a worker needs to write samples ``start..stop``: ``(build, column, base, ends)``."""
        return str(self.build), self.column, self.base, self.ends[start : stop + 1]

    def span(self, start: int, count: int) -> tuple[int, int]:
        """File offset and length of samples ``start..start + count`` in the build."""
        a, b = int(self.ends[start]), int(self.ends[start + count])
        return self.base + a, b - a

    def pristine(self) -> bool:
        """True if ``build`` holds its ``images`` array and nothing else: a run killed while assembling
        it in place may have left some of the rest (or a damaged file), so it is assembled anew."""
        try:
            with h5py.File(self.build, "r", locking=False) as h:
                c = h.get(f"columns/{self.column}")
                images = c.get("images") if isinstance(c, h5py.Group) else None
                return (list(h) == ["columns"] and list(h["columns"]) == [str(self.column)] and not h.attrs
                        and list(c) == ["images"] and isinstance(images, h5py.Dataset)
                        and images.id.get_offset() == self.base and images.shape == (int(self.ends[-1]),))
        except (OSError, KeyError, ValueError):
            return False

    def _drop_unverified(self, work: Path, fingerprint: str, nfields: int) -> None:
        """Delete each finished part whose images in the build do not match its CRC-32s (a run killed
        before they reached the disk): it is made again."""
        fd = os.open(self.build, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for start in range(0, len(self.ends) - 1, common.CHUNK):
                part = _part_path(work, start, fingerprint)
                done = _load(part, nfields) if part.exists() else None
                if done is None or not done.get(f"c{self.column}_direct", False):
                    continue
                crcs = done[f"c{self.column}_crc32"]
                offset, length = self.span(start, len(crcs))
                data = memoryview(os.pread(fd, length, offset))
                at = self.ends[start : start + len(crcs) + 1] - self.ends[start]
                if len(data) != length or any(zlib.crc32(data[a:b]) != c for a, b, c in zip(at[:-1], at[1:], crcs)):
                    part.unlink()
        finally:
            os.close(fd)


def _part_path(work: Path, start: int, fingerprint: str) -> Path:
    """The part file of the samples from ``start`` (a multiple of ``CHUNK``) for this ``fingerprint``."""
    return work / f"columns-{start // common.CHUNK:06d}-{fingerprint[:16]}.npz"


def _wrote_into_build(part: dict) -> bool:
    """True if a part's images of some column were written into the build, not kept in the part."""
    return any(k.endswith("_direct") and bool(v) for k, v in part.items())


def _predicted_sizes(dataset: Any, template: dict, fields: list[col.Field],
                     options: dict) -> Optional[tuple[int, np.ndarray]]:
    """``(column, bytes of each sample)`` for a layout's first image column when its images are stored
    as their files are (sample 0's is): the sizes its listing found; else None."""
    from colabfast.layouts.base import ImageFile, Layout

    column = next((k for k, f in enumerate(fields) if f.kind in col.IMAGE_KINDS), None)
    if not isinstance(dataset, Layout) or column is None or not len(dataset):
        return None
    listed = {f.rel: f.size for f in dataset.files}
    if not all(p in listed for p in dataset.paths):
        return None
    sizes = np.array([listed[p] for p in dataset.paths], dtype=np.int64)
    with contextlib.suppress(Exception):  # sample 0 unreadable: pack reports it as it reports any
        first = col.flatten(dataset[0], template, fields, 0)[column]
        if isinstance(first, ImageFile) and first.path == dataset.paths[0] and len(first.data) == sizes[0] \
                and col.encode(first, fields[column], 0, options)[0] is first.data and sizes.sum() > 0:
            return column, sizes
    return None


def make_parts(dataset: Any, template: dict, fields: list[col.Field], options: dict, work: Path, workers: int,
               progress: bool, fingerprint: str,
               direct: Optional[_Direct] = None) -> tuple[list[Path], list[tuple[int, str]], int]:
    """Run ``dataset[i]`` for every ``i`` in worker processes and save the encoded fields in parts (reusing
    those of an interrupted run with this ``fingerprint``), a few at a time, so nothing grows with ``len()``.
    Returns the part paths in order, ``(index, error)`` of each failed sample, and the sample count (``len()``,
    or the first index raising IndexError, warned). With ``direct``, its images go straight into the mirror."""
    from tqdm.auto import tqdm

    n = len(dataset)
    count = -(-n // common.CHUNK)
    done: dict[int, dict] = {}
    for part in work.glob("*.npz"):
        k = _part_number(part, fingerprint)
        old = _load(part, len(fields)) if k is not None and k < count else None
        if old is not None and direct is None and _wrote_into_build(old):
            old = None  # its images went into a build that is not being continued
        if k is None or old is None:
            part.unlink()
        else:
            done[k] = old
    finished = sum(min(common.CHUNK, n - k * common.CHUNK) for k in done)
    if finished and progress:
        print(f"pack: resuming: {finished} of {n} samples were packed by an earlier run")
    errors: list[tuple[int, str]] = []
    ends = [n]  # the first IndexError of any part
    paths: list[Path] = []

    def record(errs: list, end: Optional[int]) -> None:
        errors.extend((int(i), str(e)) for i, e in errs)
        if end is not None and end < ends[0]:
            ends[0] = end
            bar.total = end
            bar.refresh()

    pool = _pool(dataset, workers)
    inflight: deque[tuple[Future, range]] = deque()
    with stopping(pool), tqdm(total=n, initial=finished, unit="sample", desc="pack", disable=not progress) as bar:
        k = 0
        while k * common.CHUNK < ends[0]:  # the end known so far: no part is made past it
            idx = range(k * common.CHUNK, min(n, (k + 1) * common.CHUNK))
            path = _part_path(work, idx.start, fingerprint)
            paths.append(path)
            if k in done:
                record(done[k]["errors"], _part_end(done[k]))
            else:
                inflight.append((pool.submit(_encode_part, idx.start, idx.stop, template, fields, options, path,
                                             direct.place(idx.start, idx.stop) if direct is not None else None), idx))
            while len(inflight) > max(workers, 1) or inflight and k * common.CHUNK >= ends[0]:
                fut, made = inflight.popleft()
                record(*fut.result())  # the worker saved the part
                bar.update(len(made))
            k += 1
        while inflight:
            fut, made = inflight.popleft()
            record(*fut.result())
            bar.update(len(made))
    end = ends[0]
    if end < n:
        warnings.warn(f"pack: {describe_dataset(dataset)}: len() is {n}, but dataset[{end}] raised IndexError: packed "
                      f"samples 0..{end - 1}, where iterating it stops", stacklevel=3)
        for path in paths[-(-end // common.CHUNK):]:  # parts made past the end, while it was not yet known
            path.unlink(missing_ok=True)
    return paths[: -(-end // common.CHUNK)], sorted(e for e in errors if e[0] < end), end


def _part_number(path: Path, fingerprint: str) -> Optional[int]:
    """``k`` of a part file ``columns-{k:06d}-{fingerprint[:16]}.npz`` of this fingerprint (:func:`_part_path`),
    else None."""
    name = path.name
    head, tail = "columns-", f"-{fingerprint[:16]}.npz"
    number = name[len(head) : -len(tail)] if name.startswith(head) and name.endswith(tail) else ""
    return int(number) if number.isdigit() else None


def _part_end(part: dict) -> Optional[int]:
    """The first index of a part whose ``dataset[i]`` raised IndexError, or None."""
    end = int(part["end"]) if "end" in part else -1
    return end if end >= 0 else None


# --- assembling ---------------------------------------------------------------------------------------


def decide(fields: list[col.Field], parts: list[dict]) -> None:
    """Each array field becomes ``ndarray`` (every sample's shape the same) or ``ragged`` (the same
    trailing dimensions). Raises FieldError naming a sample whose shape fits neither."""
    for k, f in enumerate(fields):
        if f.kind != ARRAY:
            continue
        shapes = np.concatenate([p[f"c{k}_shapes"] for p in parts]) if parts else np.zeros((0, 0), np.int64)
        if len(shapes) and np.all(shapes == shapes[0]):
            f.kind, f.shape = "ndarray", shapes[0].tolist()
        elif len(shapes) and shapes.shape[1] >= 1 and np.all(shapes[:, 1:] == shapes[0, 1:]):
            f.kind, f.shape = "ragged", shapes[0, 1:].tolist()
        elif not len(shapes):
            f.kind, f.shape = "ragged", []
        else:  # any shapes of one ndim (instance masks [N, H, W] of images of many sizes): each sample's kept
            f.kind, f.shape = "ragged", []
            f.meta["ndim"] = int(shapes.shape[1])


def _marks(fields: list[col.Field], parts: list[dict]) -> dict[tuple[str, int], np.ndarray]:
    """Each column's ``nulls`` and ``formats`` (:mod:`colabfast.mirror.columns`) from the parts, where a sample
    has one set (its field's ``meta`` then says so); a part without one holds none."""
    out: dict[tuple[str, int], np.ndarray] = {}
    for k, f in enumerate(fields):
        for name in ("nulls", "formats"):
            key = f"c{k}_{name}"
            f.meta.pop(name, None)
            if any(key in p for p in parts):
                out[name, k] = np.concatenate([p[key] if key in p else np.zeros(int(p["kept"].sum()), np.uint8)
                                               for p in parts])
                f.meta[name] = True
    return out


def assemble(build: Path, part_paths: list[Path], fields: list[col.Field], template: dict, head: Header,
             order: np.ndarray, paths: list[str], direct: Optional[_Direct] = None) -> None:
    """Write the mirror of columns to ``build`` from the parts: numbers and offsets from the parts in
    memory, every column of bytes allocated contiguous and copied a :data:`PIECE` at a time. With
    ``direct``, where its images are in ``build`` already, only the rest is written there.

    Raises:
        MirrorError: a part is unreadable, or holds fewer bytes than it says (a disk error).
        FieldError: an array field whose samples' shapes no column holds (:func:`decide`).
    """
    loaded = [_load(p, len(fields)) for p in part_paths]
    parts = [p for p in loaded if p is not None]
    if len(parts) != len(loaded):
        raise MirrorError(f"a part in {part_paths[0].parent} is unreadable though it was just written: run pack() "
                          "again")
    decide(fields, parts)
    marks = _marks(fields, parts)
    head.columns = {"template": template, "fields": [f.spec() for f in fields]}
    head.version = NULLS_VERSION if any(name == "nulls" for name, _ in marks) else COLUMNS_VERSION
    written = {i for i, p in enumerate(parts) if direct is not None and p.get(f"c{direct.column}_direct", False)}
    in_place = direct is not None and len(written) == len(parts) and direct.pristine()
    target = build if direct is None or in_place else part_paths[0].parent / "rebuild.h5"
    places: list[tuple[int, str, int, int, Optional[str]]] = []  # (column, part array, offset, bytes, to sum)
    sums: dict[str, int] = {}  # each array's CRC-32 (images have one per sample), once its bytes are written
    with h5py.File(target, "r+" if in_place else "w", locking=False) as h:
        head.write(h)
        write_array(h, "order", order.astype(np.int64))
        encoded = [p.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace").encode() for p in paths]
        write_array(h, "paths", np.frombuffer(b"".join(encoded), dtype=np.uint8))
        write_array(h, "path_offsets", _ends([len(p) for p in encoded]))
        group = h.require_group("columns")
        for k, f in enumerate(fields):
            c = group.require_group(str(k))
            there = in_place and direct is not None and k == direct.column
            data = _write_column(c, k, f, parts, c["images"] if there else None)
            for name in ("nulls", "formats"):
                if (name, k) in marks:
                    write_array(c, name, marks[name, k])
            checked = None if data is None or f.kind in col.IMAGE_KINDS else data.name
            if checked is not None:
                sums[checked] = 0  # what an empty array sums to
            if data is not None and not there and data.size:
                places.append((k, f"c{k}_blob", int(data.id.get_offset()), data.size * data.dtype.itemsize, checked))
    fd = os.open(target, os.O_WRONLY)
    src = os.open(build, os.O_RDONLY) if target != build else -1
    try:
        for k, key, base, nbytes, checked in places:
            crc, end = 0, base + nbytes
            for i, path in enumerate(part_paths):
                if direct is not None and k == direct.column and i in written:  # in build, not in the part
                    offset, length = direct.span(i * common.CHUNK, len(parts[i][f"c{k}_crc32"]))
                    pieces: Iterator[bytes] = _read_pieces(src, offset, length, build)
                else:
                    pieces = _blob_pieces(path, key)
                for piece in pieces:
                    if base + len(piece) > end:
                        break
                    write_all(fd, memoryview(piece), base)
                    base += len(piece)
                    if checked is not None:
                        crc = zlib.crc32(piece, crc)
            if base != end:  # never past its place: what follows it in the file is not the parts' to write
                raise MirrorError(f"the parts in {part_paths[0].parent} do not hold the {nbytes} bytes of column {k} "
                                  "that their offsets and shapes say (a disk error?): run pack() again")
            if checked is not None:
                sums[checked] = crc
        os.fsync(fd)
    finally:
        os.close(fd)
        if src >= 0:
            os.close(src)
    if sums:  # each array's checksum, as write_array gives it, now that its bytes are known
        with h5py.File(target, "r+", locking=False) as h:
            for name, crc in sums.items():
                h[name].attrs["crc32"] = np.uint32(attrs_crc32({}, crc))
    if target != build:
        os.replace(target, build)


def _read_pieces(fd: int, offset: int, length: int, path: Path) -> Iterator[bytes]:
    """``length`` bytes of ``fd`` from ``offset``, :data:`PIECE` at a time.

    Raises:
        MirrorError: the file ends early."""
    while length:
        piece = os.pread(fd, min(length, PIECE), offset)
        if not piece:
            raise MirrorError(f"{path} ended early while the mirror was assembled: run pack() again")
        offset += len(piece)
        length -= len(piece)
        yield piece


def _allocate(c: h5py.Group, nbytes: int, name: str = "images", shape: Optional[tuple] = None,
              dtype: Any = np.uint8) -> h5py.Dataset:
    """An array ``name`` of ``nbytes`` (uint8; or of ``shape`` and ``dtype``) in group ``c``: contiguous,
    unfiltered, allocated now and never filled (so it takes no disk until written): its place in the
    file is fixed before its bytes are written there."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return c.create_dataset(name, shape=(nbytes,) if shape is None else shape, dtype=dtype, dcpl=dcpl)


def _write_column(c: h5py.Group, k: int, f: col.Field, parts: list[dict],
                  images: Optional[h5py.Dataset] = None) -> Optional[h5py.Dataset]:
    """Write column ``k`` into group ``c``; a column of bytes is only allocated and returned, for :func:`assemble`
    to fill (``images``, when given, checked to be as large as the parts say: MirrorError if not)."""
    def joined(key: str) -> np.ndarray:
        return np.concatenate([p[key] for p in parts]) if parts else np.zeros(0, np.uint8)

    def offsets() -> np.ndarray:
        out, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            ends = p[f"c{k}_offsets"]
            out.append(base + ends[1:])
            base += int(ends[-1])
        return np.concatenate(out)

    if f.kind in col.IMAGE_KINDS:
        ends = offsets()
        if images is None:
            images = _allocate(c, int(ends[-1]))
        elif images.shape != (int(ends[-1]),):
            raise MirrorError(f"the images written to {c.file.filename} take {images.shape[0]} bytes, the parts say "
                              f"{int(ends[-1])}: run pack() again")
        write_array(c, "image_offsets", ends)
        write_array(c, "image_shapes", np.concatenate([p[f"c{k}_shapes"] for p in parts]).astype(np.int32))
        write_array(c, "image_crc32", np.concatenate([p[f"c{k}_crc32"] for p in parts]).astype(np.uint32))
        return images
    if f.kind in ("int", "float", "bool"):
        write_array(c, "values", joined(f"c{k}_values").astype({"int": "<i8", "float": "<f8", "bool": "u1"}[f.kind]))
        return None
    if f.kind in ("str", "bytes", "json"):
        ends = offsets()
        write_array(c, "offsets", ends)
        return _allocate(c, int(ends[-1]), "data")
    dtype = np.dtype("u1" if f.dtype == "bool" else (f.dtype if f.dtype and f.dtype[0] in "<>|" else
                                                       _torch_dtype(f.dtype)))
    shapes = np.concatenate([p[f"c{k}_shapes"] for p in parts]).astype(np.int64)
    trail = tuple(f.shape or [])
    if f.kind == "ndarray":
        shape: tuple = (len(shapes), *trail)
    elif "ndim" in f.meta:  # every sample's own shape: values flat, offsets in elements
        sizes = np.prod(shapes, axis=1) if len(shapes) else np.zeros(0, np.int64)
        shape = (int(sizes.sum()),)
        write_array(c, "offsets", _ends(sizes.tolist()))
        write_array(c, "shapes", shapes)
    else:
        rows = shapes[:, 0] if len(shapes) else np.zeros(0, np.int64)
        shape = (int(rows.sum()), *trail)
        write_array(c, "offsets", _ends(rows.tolist()))
    return _allocate(c, 0, "values", shape, dtype)


def _torch_dtype(name: Optional[str]) -> str:
    """The NumPy dtype string of a torch dtype's name (``"float32"`` -> ``"<f4"``)."""
    if name == "bool":
        return "u1"
    return np.dtype(name).str


def check_built(build: Path, fields: list[col.Field], n: int) -> None:
    """Reopen ``build`` and read every column back (lengths, offsets, checksums) before it is published."""
    head, count, _, _ = load_columns(build)
    if count != n:
        raise MirrorError(f"{build}: {count} samples written, {n} expected (disk error?); run pack() again")
    problems = check_columns(build, decode=False)[1]  # the data load_columns leaves on disk: streamed
    if problems:
        raise MirrorError(f"{build}: {'; '.join(problems[:5])} (disk error?); run pack() again")
    for k, f in enumerate(fields):
        if f.kind in col.IMAGE_KINDS:
            load_index(build, "", k)


def header(layout: str, source: str, options: dict, fingerprint: str, skipped: list[tuple[str, str]],
           info: Optional[dict], split: Optional[str] = None) -> Header:
    classes = info.get("classes") if info and isinstance(info.get("classes"), list) else None
    return Header(layout=layout, store=options["store"], classes=classes, image_size=options["image_size"],
                  quality=options["quality"], shuffled=False, seed=None, fingerprint=fingerprint,
                  skipped=[{"path": p, "error": e} for p, e in skipped], source=source,
                  created=datetime.now(timezone.utc).isoformat(timespec="seconds"), colabfast_version=package_version(),
                  layout_info=info, split=split, version=COLUMNS_VERSION)
