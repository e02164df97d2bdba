"""Checking a mirror end to end (:func:`verify`, :func:`check_columns`) and describing it (:func:`info`).
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from pathlib import Path
from typing import Any, Optional

import numpy as np

from colabfast.errors import MirrorError
from colabfast.mirror.format import (
    VERIFY_READ,
    Header,
    as_mirror_error,
    attrs_crc32,
    header,
    int_attr,
    invalid,
    split_names,
)
from colabfast.mirror.index import Stored, check_array, load_columns, load_index, read_paths, runs
from colabfast.mirror.safety import open_h5
from colabfast.where._fileio import (
    PathLike,
    human_bytes,
)

__all__ = ["MirrorInfo", "info", "verify", "check_columns"]


@as_mirror_error
def check_columns(path: PathLike, decode: bool = True, progress: bool = False) -> tuple[int, list[str]]:
    """Stream every data column of a version 3 mirror through its checksum, with ``decode`` each str and json
    value decoded too.

    Returns:
        ``(N, problems)``: the number of samples and each problem found, for :func:`verify` to report.

    Raises:
        MirrorError: not a mirror of columns, or one whose index breaks the format (:func:`load_columns`).
    """
    from tqdm.auto import tqdm

    from colabfast.mirror.columns import json_value

    path = Path(path)
    head, n, values, _ = load_columns(path, resident=0)
    assert head.columns is not None  # load_columns refuses other mirrors
    rels, problems = read_paths(path), []
    fd = os.open(path, os.O_RDONLY)
    try:
        for k, spec in enumerate(head.columns["fields"]):
            v = values.get(k)
            data = v[0] if isinstance(v, tuple) else v
            if not isinstance(data, Stored):
                continue  # an image (verify reads those), or numbers whose checksum load_columns checked
            kind, name = spec["kind"], spec["name"]
            ends = (v[1] if isinstance(v, tuple) else np.arange(n + 1, dtype=np.int64)) * data.row_bytes
            whole = decode and kind in ("str", "json")  # each value read whole, to decode it; else in pieces
            spans = [(int(ends[i]), int(ends[j]), range(i, j)) for i, j in runs(np.arange(n), ends, VERIFY_READ)] \
                if whole else [(a, min(a + VERIFY_READ, int(ends[n])), range(0))
                               for a in range(0, int(ends[n]), VERIFY_READ)]
            crc = 0
            with tqdm(total=data.nbytes, unit="B", unit_scale=True, desc=f"verify {name}", disable=not progress) as bar:
                for base, stop, samples in spans:
                    buf = _pread(fd, stop - base, data.offset + base, path)
                    crc = zlib.crc32(buf, crc)
                    for p in samples:
                        raw = buf[ends[p] - base : ends[p + 1] - base].tobytes()
                        try:
                            json_value(raw) if kind == "json" else raw.decode("utf-8", "surrogatepass")
                        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                            problems.append(f"sample {p} ({rels[p]}), field {name!r}: not valid {kind} "
                                            f"({type(exc).__name__}: {str(exc)[:80]})")
                    bar.update(len(buf))
                    del buf  # before the next read: one buffer at a time
            if int_attr(data.attrs, "crc32", path) != attrs_crc32(data.attrs, crc):
                problems.append(f"field {name!r}: {data.name} does not match its checksum")
    finally:
        os.close(fd)
    return n, problems


@as_mirror_error
def verify(path: PathLike, progress: bool = False) -> int:
    """Check every stored image against its checksum and header (no image decoded), the paths and order, and
    a version 3 mirror's other columns (:func:`check_columns`). ``colabfast info --verify`` runs this.

    Returns:
        The number of samples checked.

    Raises:
        MirrorError: a version 1 mirror (no checksums), a KITTI mirror with neither split, or samples
            that differ or do not decode (up to 20 are named, with their fields).
    """
    from tqdm.auto import tqdm

    from colabfast.images.decode import check_encoded

    path = Path(path)
    with open_h5(path) as f:
        head, splits = header(f, path), split_names(f)
    if not splits:  # kitti: no training/ or testing/ (an imagefolder's tables at the root are not read)
        raise invalid(path, "a kitti mirror without a training or testing split")
    total = 0
    bad: list[str] = []
    tables: list[tuple[str, Optional[int]]] = [(split, None) for split in splits]
    if head.columns is not None:  # version 3: the columns, then each image column
        total, bad = check_columns(path, progress=progress)
        tables = [("", k) for k, spec in enumerate(head.columns["fields"]) if spec["kind"] in ("image", "mask")]
    for split, column in tables:
        index = load_index(path, split, column)
        if index.crc32 is None:
            raise MirrorError(f"{path} is a format version {index.header.version} mirror, which has no checksums "
                              "to verify: pack it again with this colabfast")
        rels = read_paths(path, split)
        with open_h5(path) as f:
            order = check_array(f[split] if split else f, "order", path, "<i8", (len(index),), index.header.version)
        if len(np.unique(order)) != len(order) or (len(order) and order.min() < 0):
            raise invalid(path, f"{split or 'the'} order is not distinct source indices")
        offsets, n = index.offsets, len(index)
        fd = os.open(path, os.O_RDONLY)
        try:
            with tqdm(total=int(offsets[-1]), unit="B", unit_scale=True, desc=f"verify {split or path.name}",
                      disable=not progress) as bar:
                for i, j in runs(np.arange(n), offsets, VERIFY_READ):
                    base = int(offsets[i])
                    buf = _pread(fd, int(offsets[j]) - base, index.data_offset + base, path)
                    for k in range(i, j):
                        data = buf[offsets[k] - base : offsets[k + 1] - base]
                        where = f"{split + ' ' if split else ''}sample {k} ({rels[k]})" + (
                            "" if column is None or head.columns is None else
                            f", field {head.columns['fields'][column]['name']!r}")
                        if zlib.crc32(data) != int(index.crc32[k]):
                            bad.append(where)
                        elif head.store == "encoded":
                            try:
                                check_encoded(np.frombuffer(data, np.uint8), where, index.shapes[k][:2])
                            except ValueError as exc:  # names `where`
                                bad.append(str(exc))
                    bar.update(len(buf))
        finally:
            os.close(fd)
        total += n if column is None else 0  # a mirror of columns counted its samples above
    if bad:
        shown = "".join(f"\n  {b}" for b in bad[:20]) + (f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise MirrorError(f"{path}: {len(bad)} of {total} samples do not match their checksums (flipped bytes on "
                          f"disk or in a copy), their declared sizes or their kinds (text or JSON that does not "
                          f"decode):{shown}\nCopy the mirror again, or pack it again.")
    return total


def _pread(fd: int, n: int, offset: int, path: Path) -> memoryview:
    buf = bytearray(n)
    view, pos = memoryview(buf), 0
    while pos < n:
        got = os.preadv(fd, [view[pos:]], offset + pos)
        if got == 0:
            raise MirrorError(f"{path} ended early at byte {offset + pos}: truncated? Copy it again.")
        pos += got
    return view


# --- describing -------------------------------------------------------------------------------------


_HEADER_FIELDS = frozenset(field.name for field in dataclasses.fields(Header))


@dataclasses.dataclass
class MirrorInfo:
    """What :func:`info` reports: its :class:`Header` (whose fields read as its own) and its sample tables."""

    path: Path
    size: int  # bytes on disk
    header: Header
    samples: dict[str, int]  # split ("" for imagefolder/files) -> number of samples
    image_bytes: dict[str, int]  # split -> bytes of image data
    objects: dict[str, int]  # kitti split -> number of labelled objects
    columns: list[dict] = dataclasses.field(default_factory=list)  # version 3: name, kind, what, bytes

    @property
    def format_version(self) -> int:
        return self.header.version

    @property
    def labels(self) -> str:
        """Where the labels came from, for a mirror packed from an archive; else ``""``."""
        return self.header.labels or ""

    def __getattr__(self, name: str) -> Any:
        if name in _HEADER_FIELDS:  # never "header" itself: unpickling asks for attributes before it is set
            return getattr(self.header, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __str__(self) -> str:
        head = self.header
        lines = [
            f"{self.path}: colabfast mirror v{head.version}, {human_bytes(self.size)}, "
            + ("complete" if head.complete else "INCOMPLETE (packing was interrupted)"),
            f"  layout {head.layout}, store {head.store}"
            + (f", resized to {head.image_size}" if head.image_size is not None else "")
            + (f" (JPEG quality {head.quality})" if head.quality is not None and head.store == "encoded"
               and head.image_size is not None else "")
            + (", samples in shuffled order" if head.shuffled else ""),
        ]
        for split, n in self.samples.items():
            name = split or "samples"
            extra = f", {self.objects[split]} objects" if split in self.objects else ""
            lines.append(f"  {name}: {n} images, {human_bytes(self.image_bytes[split])} of image data{extra}")
        if self.columns:
            lines.append(f"  {len(self.columns)} columns:")
            lines += [f"    {c['name']}: {c['kind']}{' ' + c['what'] if c['what'] else ''}, {human_bytes(c['bytes'])}"
                      for c in self.columns]
        if head.classes is not None:
            shown = ", ".join(head.classes[:8]) + (", ..." if len(head.classes) > 8 else "")
            lines.append(f"  {len(head.classes)} classes: {shown}")
        lines.append(f"  packed from {head.source}" + (f", split {head.split!r}," if head.split is not None else "")
                     + f" on {head.created} by colabfast {head.colabfast_version}")
        if head.labels:
            lines.append(f"  labels from {head.labels}")
        notes = (head.layout_info or {}).get("notes")
        if isinstance(notes, list) and notes:  # a layout's leniencies (colabfast.layouts.base.Layout.notes)
            lines.append(f"  read as the format's owner reads it ({len(notes)} leniencies):")
            lines += [f"    {n[0]}: {n[1]}" if isinstance(n, list) and len(n) == 2 else f"    {n}" for n in notes[:20]]
        if head.skipped:
            lines.append(f"  {len(head.skipped)} source files were skipped:")
            lines += [f"    {s['path']}: {s['error']}" for s in head.skipped[:20]]
            if len(head.skipped) > 20:
                lines.append(f"    ... and {len(head.skipped) - 20} more")
        return "\n".join(lines)


@as_mirror_error
def info(path: PathLike) -> MirrorInfo:
    """Describe a mirror (also one whose packing was interrupted). ``colabfast info`` prints this.

    Raises:
        FileNotFoundError, MirrorError: not a readable colabfast mirror.
    """
    path = Path(path)
    with open_h5(path) as f:
        head = Header.read(f, path, complete=False)
        splits = split_names(f)
    if head.complete and not splits:
        raise invalid(path, "a kitti mirror without a training or testing split")
    samples, nbytes, objects, columns = {}, {}, {}, []
    if head.columns is not None and head.complete:
        _, n, values, _ = load_columns(path, resident=0)  # sizes only: nothing big is read
        samples[""], nbytes[""] = n, 0
        for k, spec in enumerate(head.columns["fields"]):
            what = spec.get("dtype", "") + (f" {spec['shape']}" if "shape" in spec else "")
            if spec["kind"] in ("image", "mask"):
                size = int(load_index(path, "", k).offsets[-1])
                nbytes[""] += size
            else:
                v = values[k]
                size = sum(x.nbytes for x in (v if isinstance(v, tuple) else (v,)))  # ndarrays, Stored
            if spec["kind"] == "ragged":
                trail = "".join(f", {d}" for d in spec["shape"])
                what = f"{spec['dtype']} [*{trail}]" if (spec.get("meta") or {}).get("ndim") is None else \
                    f"{spec['dtype']}, any shape of {spec['meta']['ndim']} dimensions"
            columns.append({"name": spec["name"], "kind": spec["kind"], "what": what.strip(), "bytes": size})
        splits = []
    for split in splits if head.complete else []:
        index = load_index(path, split)
        samples[split], nbytes[split] = len(index), int(index.offsets[-1])
        if index.object_offsets is not None:
            objects[split] = int(index.object_offsets[-1])
    return MirrorInfo(path=path, size=path.stat().st_size, header=head, samples=samples, image_bytes=nbytes,
                      objects=objects, columns=columns)
