"""A mirror's sample tables: :class:`Index`, :func:`load_index`, :func:`load_columns`, paths, order and runs."""

from __future__ import annotations

import dataclasses
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import h5py
import numpy as np

from colabfast.errors import MirrorError
from colabfast.mirror.format import (
    IMAGEFOLDER,
    KITTI,
    KITTI_CALIB_KEYS,
    MAX_PATH_BYTES,
    MIN_ENCODED_BYTES,
    NO_IMAGES,
    NULLS_VERSION,
    OBJECT_COLUMNS,
    RESIDENT_BYTES,
    as_mirror_error,
    attrs_crc32,
    header,
    int_attr,
    invalid,
    is_str_list,
    json_attr,
    member,
    split_names,
)
from colabfast.mirror.safety import check_storage, read_h5
from colabfast.where._fileio import (
    PathLike,
)

if TYPE_CHECKING:
    from colabfast.mirror.format import Header

__all__ = ["Index", "Stored", "load_index", "load_columns", "read_paths", "read_order", "write_array", "runs"]

# --- the sample tables ------------------------------------------------------------------------------


def write_array(g: h5py.Group, name: str, data: np.ndarray, **attrs: Any) -> h5py.Dataset:
    """Create dataset ``g[name]`` (contiguous, unfiltered) with ``attrs`` and its ``crc32`` attribute."""
    data = np.ascontiguousarray(data)
    ds = g.create_dataset(name, data=data)
    for key, value in attrs.items():
        ds.attrs[key] = value
    ds.attrs["crc32"] = np.uint32(attrs_crc32(attrs, zlib.crc32(data.data)))
    return ds


def _dataset(g: h5py.Group, name: str, path: PathLike, dtype: str, shape: tuple,
             at_most: bool = False) -> h5py.Dataset:
    """``g[name]``, checked to be a contiguous dataset of ``dtype`` and ``shape`` (None: any length;
    ``at_most``: the first dimension no longer than ``shape[0]``) inside the file; nothing read yet."""
    where = f"{g.name.rstrip('/')}/{name}"
    ds = member(g, name)
    if not isinstance(ds, h5py.Dataset):
        raise invalid(path, f"it has no dataset {where}")

    def fits(k: int, have: int, want: Optional[int]) -> bool:
        return want is None or (have <= want if at_most and k == 0 else have == want)

    if ds.dtype != np.dtype(dtype) or len(ds.shape) != len(shape) or not all(
            fits(k, have, want) for k, (have, want) in enumerate(zip(ds.shape, shape))):
        wanted = [("<=" if at_most and k == 0 else "") + ("*" if s is None else str(s)) for k, s in enumerate(shape)]
        raise invalid(path, f"{where} is {ds.dtype} {list(ds.shape)}, expected {np.dtype(dtype)} "
                         f"[{', '.join(wanted)}]")
    check_storage(ds, path, os.path.getsize(path))
    return ds


def check_array(g: h5py.Group, name: str, path: PathLike, dtype: str, shape: tuple, version: int,
           at_most: bool = False) -> np.ndarray:
    """Read ``g[name]`` after :func:`_dataset`'s checks; from version 2 on, check its ``crc32``."""
    return _read_checked(_dataset(g, name, path, dtype, shape, at_most), path, version)


def _read_checked(ds: h5py.Dataset, path: PathLike, version: int) -> np.ndarray:
    """Read ``ds`` (checked by :func:`_dataset`); from version 2 on, check its ``crc32``."""
    data = ds[()] if ds.size else np.zeros(ds.shape, ds.dtype)
    if version >= 2:
        attrs = {k: ds.attrs[k] for k in ds.attrs}
        if int_attr(attrs, "crc32", path) != attrs_crc32(attrs, zlib.crc32(np.ascontiguousarray(data).data)):
            raise invalid(path, f"{ds.name} does not match its checksum (flipped bytes?)")
    return data


def _offsets(data: np.ndarray, end: int, what: str, path: PathLike) -> None:
    if len(data) < 1 or data[0] != 0 or data[-1] != end or np.any(np.diff(data) < 0):
        raise invalid(path, f"{what} do not rise from 0 to {end} (the size of what they index)")


@dataclasses.dataclass
class Index:
    """One split's sample table, checked against the file and the format (:func:`load_index`)."""

    path: Path
    split: str
    header: Header
    data_offset: int  # file offset of ``images`` (0 when it is empty)
    offsets: np.ndarray  # int64 [N + 1]
    shapes: np.ndarray  # int32 [N, 3]
    targets: Optional[np.ndarray]  # int64 [N]; None for kitti
    crc32: Optional[np.ndarray]  # uint32 [N]; None for version 1
    order: np.ndarray  # int64 [N]: each stored sample's index in the source's order
    object_offsets: Optional[np.ndarray] = None  # int64 [N + 1], kitti training
    objects: Optional[dict[str, np.ndarray]] = None  # column -> [M, ...]
    type_names: Optional[list[str]] = None
    calib: Optional[dict[str, np.ndarray]] = None  # key -> float64 [N, 12] ([N, 9] for R0_rect)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def check_samples(self, indices: Sequence[int], stored: Sequence[Any]) -> None:
        """Compare each stored image (bytes-like) with its checksum.

        Raises:
            MirrorError: a sample's bytes differ from what was packed; names it and its source file.
        """
        if self.crc32 is None:
            raise MirrorError(f"{self.path} is a format version {self.header.version} mirror, which has no "
                              "checksums to verify: pack it again with this colabfast")
        for i, data in zip(indices, stored):
            if zlib.crc32(data) != int(self.crc32[i]):
                rel = read_paths(self.path, self.split)[i]
                raise MirrorError(f"{self.path}: sample {i} ({rel}) does not match its checksum: the mirror is "
                                  "corrupt (flipped bytes on disk or in a copy). Copy it again, or pack it again.")


@as_mirror_error
def load_index(path: PathLike, split: str = "", column: Optional[int] = None) -> Index:
    """Read and check the sample table of ``split`` (``""``, or ``"training"``/``"testing"`` for KITTI),
    or of image column ``column`` of a version 3 mirror.

    Every array is checked against the file's size and the sample count before it is read.

    Raises:
        FileNotFoundError: no such file.
        MirrorError: anything wrong with the file, named.
        OSError: the mount it is on still fails (EIO, ENOTCONN, ...) after ``OPEN_RETRIES`` retries.
    """
    path = Path(path)
    return read_h5(path, lambda f: _load_index(f, path, split, column))


def _group(f: h5py.File, path: Path, split: str, head: Header) -> h5py.Group:
    if head.layout != KITTI and not split:
        return f
    if split not in split_names(f) or not isinstance(f[split], h5py.Group):
        raise MirrorError(f"{path} has no {split!r} split (it has: {', '.join(split_names(f)) or 'none'})")
    return f[split]


def column_group(g: h5py.Group, path: PathLike, k: int, head: Header) -> h5py.Group:
    """The group of column ``k`` (version 3: ``columns/<k>``), checked to be one."""
    if head.columns is None or not 0 <= k < len(head.columns["fields"]):
        raise invalid(path, f"it has no column {k}")
    c = member(g, "columns")
    c = member(c, str(k)) if isinstance(c, h5py.Group) else None
    if not isinstance(c, h5py.Group):
        raise invalid(path, f"it has no group {g.name.rstrip('/')}/columns/{k}")
    return c


def _load_index(f: h5py.File, path: Path, split: str, column: Optional[int] = None) -> Index:
    head = header(f, path)
    g, v = _group(f, path, split, head), head.version
    if head.columns is not None:
        if column == NO_IMAGES:
            return _rows_index(g, path, head)
        if column is None or head.columns["fields"][column]["kind"] not in ("image", "mask"):
            raise MirrorError(f"{path} is a mirror of columns: its images are read by column (colabfast.H5Dataset)")
        return _column_index(f, g, path, head, column)
    images = _dataset(g, "images", path, "u1", (None,))
    least = MIN_ENCODED_BYTES if head.store == "encoded" else 3  # bytes per sample: N bounded before reading
    offsets = check_array(g, "image_offsets", path, "<i8", (images.shape[0] // least + 1,), v, at_most=True)
    n = len(offsets) - 1
    _offsets(offsets, images.shape[0], "image_offsets", path)
    shapes = check_array(g, "image_shapes", path, "<i4", (n, 3), v)
    if n and (shapes[:, :2].min() < 1 or np.any(shapes[:, 2] != 3)):
        raise invalid(path, "image_shapes holds a shape that is not (H >= 1, W >= 1, 3)")
    sizes = np.diff(offsets)
    if head.store == "raw" and np.any(shapes.astype(np.int64).prod(axis=1) != sizes):
        i = int(np.flatnonzero(shapes.astype(np.int64).prod(axis=1) != sizes)[0])
        raise invalid(path, f"raw image {i} has {sizes[i]} bytes but its shape {shapes[i].tolist()} needs "
                         f"{int(np.prod(shapes[i].astype(np.int64)))}")
    if head.store == "encoded" and np.any(sizes < MIN_ENCODED_BYTES):
        i = int(np.flatnonzero(sizes < MIN_ENCODED_BYTES)[0])
        raise invalid(path, f"encoded image {i} has {sizes[i]} bytes, fewer than any JPEG or PNG")
    for name, dtype, shape in (("paths", "u1", (n * MAX_PATH_BYTES,)), ("path_offsets", "<i8", (n + 1,))):
        _dataset(g, name, path, dtype, shape, at_most=name == "paths")  # read when asked for (read_paths, verify)
    index = Index(path, split, head, images.id.get_offset() or 0, offsets, shapes, None,
                  check_array(g, "image_crc32", path, "<u4", (n,), v) if v >= 2 else None,
                  check_array(g, "order", path, "<i8", (n,), v))
    if head.layout != KITTI:
        targets = check_array(g, "targets", path, "<i8", (n,), v)
        if head.layout == IMAGEFOLDER and not head.classes:
            raise invalid(path, "an imagefolder mirror without classes")
        if head.classes is not None and n and (targets.min() < 0 or targets.max() >= len(head.classes)):
            raise invalid(path, f"a target is outside 0..{len(head.classes) - 1} (the {len(head.classes)} classes)")
        index.targets = targets
    elif split == "training":
        _kitti_objects(g, path, index)
    if head.layout == KITTI and "calib" in g:
        calib = g["calib"]
        if not isinstance(calib, h5py.Group):
            raise invalid(path, f"{g.name}/calib is not a group")
        index.calib = {k: check_array(calib, k, path, "<f8", (n, 9 if k == "R0_rect" else 12), v)
                       for k in KITTI_CALIB_KEYS if k in calib}
    return index


def _column_index(f: h5py.File, g: h5py.Group, path: Path, head: Header, k: int) -> Index:
    """The :class:`Index` of image or mask column ``k`` of a version 3 mirror: as a sample table's,
    with any channel count 1..4 (a grey image, a palette mask, RGBA)."""
    v, c = head.version, column_group(g, path, k, head)
    n = _dataset(g, "order", path, "<i8", (None,)).shape[0]
    images = _dataset(c, "images", path, "u1", (None,))
    if images.shape[0] < n * MIN_ENCODED_BYTES:
        raise invalid(path, f"{c.name}/images holds {images.shape[0]} bytes, too few for {n} images")
    offsets = check_array(c, "image_offsets", path, "<i8", (n + 1,), v)
    _offsets(offsets, images.shape[0], f"{c.name}/image_offsets", path)
    shapes = check_array(c, "image_shapes", path, "<i4", (n, 3), v)
    if n and (shapes[:, :2].min() < 1 or shapes[:, 2].min() < 1 or shapes[:, 2].max() > 4):
        raise invalid(path, f"{c.name}/image_shapes holds a shape that is not (H >= 1, W >= 1, 1..4)")
    if n and np.diff(offsets).min() < MIN_ENCODED_BYTES:
        raise invalid(path, f"an image of {c.name} has fewer bytes than any JPEG or PNG")
    _dataset(g, "paths", path, "u1", (n * MAX_PATH_BYTES,), at_most=True)
    _dataset(g, "path_offsets", path, "<i8", (n + 1,))
    store = "encoded"
    return Index(path, "", dataclasses.replace(head, store=store), images.id.get_offset() or 0, offsets, shapes, None,
                 check_array(c, "image_crc32", path, "<u4", (n,), v), check_array(g, "order", path, "<i8", (n,), v))


def _rows_index(g: h5py.Group, path: Path, head: Header) -> Index:
    """The :class:`Index` of a version 3 mirror read without images: each sample's image empty."""
    v = head.version
    n = _dataset(g, "order", path, "<i8", (None,)).shape[0]
    _dataset(g, "paths", path, "u1", (n * MAX_PATH_BYTES,), at_most=True)
    _dataset(g, "path_offsets", path, "<i8", (n + 1,))
    return Index(path, "", dataclasses.replace(head, store="encoded"), 0, np.zeros(n + 1, np.int64),
                 np.zeros((n, 3), np.int32), None, np.zeros(n, np.uint32),
                 check_array(g, "order", path, "<i8", (n,), v))


@dataclasses.dataclass(frozen=True)
class Stored:
    """A column's data array left on disk, checked: its HDF5 ``name``, file ``offset`` (contiguous) and ``attrs``."""

    name: str
    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]
    attrs: dict

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=object)) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes

    def rows(self, data: Union[bytes, memoryview, np.ndarray], count: int) -> np.ndarray:
        """``count`` rows of this array from their bytes (read at ``offset + a * row_bytes``)."""
        return np.frombuffer(data, self.dtype, count * int(np.prod(self.shape[1:], dtype=object))).reshape(
            count, *self.shape[1:])


def _stored(g: h5py.Group, name: str, path: PathLike, dtype: str, shape: tuple, at_most: bool = False) -> Stored:
    ds = _dataset(g, name, path, dtype, shape, at_most)
    attrs = {k: ds.attrs[k] for k in ds.attrs}
    int_attr(attrs, "crc32", path)  # an integer: check_columns compares it
    return Stored(ds.name, ds.id.get_offset() or 0, ds.dtype, tuple(ds.shape), attrs)


@as_mirror_error
def load_columns(path: PathLike, resident: Optional[int] = None
                 ) -> tuple[Header, int, dict[int, Any], dict[tuple[str, int], np.ndarray]]:
    """``(header, N, values, marks)`` of a version 3 or 4 mirror, every column checked against the format.

    ``values`` maps each column that is not an image or mask to a NumPy array ``[N]`` or ``[N, *shape]``,
    ``(rows, offsets)`` (ragged; plus ``shapes [N, ndim]`` where each sample has its own), or
    ``(data, offsets)`` (str, bytes, json); data arrays beyond ``resident`` bytes (default
    :data:`RESIDENT_BYTES`) are left on disk as :class:`Stored`. ``marks`` maps ``("nulls", k)`` and
    ``("formats", k)`` to column ``k``'s uint8 ``[N]`` arrays.

    Raises:
        MirrorError: not a mirror of columns, or a column that breaks the format.
    """
    from colabfast.mirror.columns import MAX_JSON_BYTES

    path = Path(path)

    def read(f: h5py.File) -> tuple[Header, int, dict[int, Any], dict[tuple[str, int], np.ndarray]]:
        head = header(f, path)
        if head.columns is None:
            raise MirrorError(f"{path} is a {head.layout} mirror, not a mirror of columns")
        g, v = f, head.version
        n = _dataset(g, "order", path, "<i8", (None,)).shape[0]
        size = os.path.getsize(path)
        out: dict[int, Any] = {}
        marks: dict[tuple[str, int], np.ndarray] = {}
        for k, spec in enumerate(head.columns["fields"]):
            kind, c = spec["kind"], column_group(g, path, k, head)
            for mark in ("nulls", "formats"):  # spec_problem checked the kinds that may have them
                if (spec.get("meta") or {}).get(mark):
                    if mark == "nulls" and v < NULLS_VERSION:
                        raise invalid(path, f"column {k} has nulls, which a mirror of format version {v} does not")
                    marks[mark, k] = check_array(c, mark, path, "u1", (n,), v)
                    if n and int(marks[mark, k].max()) > 1:
                        raise invalid(path, f"column {k}'s {mark} holds values other than 0 and 1")
            if kind in ("image", "mask"):
                continue
            if kind in ("int", "float", "bool"):
                out[k] = check_array(c, "values", path, {"int": "<i8", "float": "<f8", "bool": "u1"}[kind], (n,), v)
            elif kind in ("str", "bytes", "json"):
                data = _stored(c, "data", path, "u1", (size,), at_most=True)
                offsets = check_array(c, "offsets", path, "<i8", (n + 1,), v)
                _offsets(offsets, data.shape[0], f"{c.name}/offsets", path)
                sizes = np.diff(offsets)
                if kind == "json" and n and int(sizes.max()) > MAX_JSON_BYTES:  # what a read would parse
                    i = int(sizes.argmax())
                    raise invalid(path, f"sample {i} of column {k} ({spec['name'][:80]!r}) holds {int(sizes[i])} bytes "
                                     f"of JSON, more than pack writes ({MAX_JSON_BYTES})")
                out[k] = (data, offsets)
            else:
                dtype = "u1" if spec["dtype"] == "bool" else spec["dtype"]
                try:
                    dt = np.dtype(dtype)
                except TypeError:
                    raise invalid(path, f"column {k} has dtype {dtype!r}") from None
                if dt.kind not in "uif" or dt.itemsize > 8:
                    raise invalid(path, f"column {k} has dtype {dtype!r}, not plain numbers")
                shape = tuple(spec["shape"])
                row = int(np.prod(shape, dtype=object)) * dt.itemsize
                if kind == "ndarray":
                    if row and n * row > size:
                        raise invalid(path, f"column {k} declares more bytes than the file holds")
                    out[k] = _stored(c, "values", path, dt.str, (n, *shape))
                else:
                    bound = size // row if row else None  # rows of zero bytes: bounded by the offsets
                    offsets = check_array(c, "offsets", path, "<i8", (n + 1,), v)
                    rows = _stored(c, "values", path, dt.str, (bound if bound is not None else None, *shape),
                                   at_most=bound is not None)
                    _offsets(offsets, rows.shape[0], f"{c.name}/offsets", path)
                    ndim = (spec.get("meta") or {}).get("ndim")
                    if ndim is not None:  # each sample's shape: values flat
                        if not isinstance(ndim, int) or not 1 <= ndim <= 8 or shape:
                            raise invalid(path, f"column {k} has a malformed ndim {ndim!r}")
                        shapes = check_array(c, "shapes", path, "<i8", (n, ndim), v)
                        if n and (shapes.min() < 0 or np.any(np.prod(shapes, axis=1) != np.diff(offsets))):
                            raise invalid(path, f"column {k}: a sample's shape does not match its size")
                        out[k] = (rows, offsets, shapes)
                    else:
                        out[k] = (rows, offsets)
        # What fits in `resident`, smallest first, is read whole (and its checksum checked) as before: a
        # dataset's targets and names then cost no read per sample, which on Drive is a round trip each
        stored = sorted(((x.nbytes, k, i) for k, v in out.items()
                         for i, x in enumerate(v if isinstance(v, tuple) else (v,)) if isinstance(x, Stored)))
        budget = RESIDENT_BYTES if resident is None else resident
        for nbytes, k, i in stored:
            if nbytes > budget:
                break
            budget -= nbytes
            parts = list(out[k]) if isinstance(out[k], tuple) else [out[k]]
            parts[i] = _read_checked(f[parts[i].name], path, v)
            out[k] = tuple(parts) if isinstance(out[k], tuple) else parts[0]
        return head, n, out, marks

    return read_h5(path, read)


def _kitti_objects(g: h5py.Group, path: Path, index: Index) -> None:
    v = index.header.version
    object_offsets = check_array(g, "object_offsets", path, "<i8", (len(index) + 1,), v)
    m = int(object_offsets[-1]) if len(object_offsets) else 0
    _offsets(object_offsets, m, "object_offsets", path)
    if not isinstance(member(g, "objects"), h5py.Group):
        raise invalid(path, f"{g.name} has no objects group")
    o = g["objects"]
    objects = {k: check_array(o, k, path, dtype, (m, *row), v) for k, (dtype, row) in OBJECT_COLUMNS.items()}
    names = json_attr(o["type"].attrs, "names", path, is_str_list)
    if names is None or (m and int(objects["type"].max()) >= len(names)):
        raise invalid(path, f"{o.name}/type holds a code outside its {len(names or [])} names")
    index.object_offsets, index.objects, index.type_names = object_offsets, objects, names


@as_mirror_error
def read_paths(path: PathLike, split: str = "") -> list[str]:
    """Each sample's source path relative to the ``source`` attribute, checked (UTF-8, relative, no ``..``).

    Raises:
        MirrorError: a path table that breaks the format.
    """
    path = Path(path)

    def read(f: h5py.File) -> tuple[np.ndarray, bytes]:
        head = header(f, path)
        g = _group(f, path, split, head)
        n = _dataset(g, "order", path, "<i8", (None,)).shape[0]  # bounds both, before reading
        offsets = check_array(g, "path_offsets", path, "<i8", (n + 1,), head.version)
        return offsets, check_array(g, "paths", path, "u1", (n * MAX_PATH_BYTES,), head.version, at_most=True).tobytes()

    offsets, blob = read_h5(path, read)
    _offsets(offsets, len(blob), "path_offsets", path)
    out, ends = [], offsets.tolist()
    for i, (a, b) in enumerate(zip(ends, ends[1:])):
        try:
            out.append(blob[a:b].decode("utf-8"))
        except UnicodeDecodeError:
            raise invalid(path, f"path {i} is not UTF-8") from None
    # All paths joined by NUL, which no path may hold: one scan instead of 1.28M (ImageNet) checks.
    if b"\0" in blob or _not_plain("\0" + "\0".join(out) + "\0"):
        i = next(i for i, rel in enumerate(out) if "\0" in rel or _not_plain(f"\0{rel}\0"))
        raise invalid(path, f"path {i} ({out[i][:80]!r}) is not a plain relative path")
    return out


@as_mirror_error
def read_order(path: PathLike, split: str = "") -> np.ndarray:
    """Each stored sample's index in the source's order (``split``'s ``order``), checked.

    Raises:
        MirrorError: an order table that breaks the format.
    """
    path = Path(path)

    def read(f: h5py.File) -> np.ndarray:
        head = header(f, path)
        g = _group(f, path, split, head)
        n = _dataset(g, "order", path, "<i8", (None,)).shape[0]
        return check_array(g, "order", path, "<i8", (n,), head.version)

    return read_h5(path, read)


def _not_plain(joined: str) -> bool:
    """True if NUL-separated paths hold an empty one, a leading "/", or an empty, "." or ".." component
    (substring scans: a regex took 1 s on ImageNet's 1.28M paths)."""
    dots = (f"{a}{d}{b}" for d in (".", "..") for a in "/\0" for b in "/\0")
    return any(bad in joined for bad in ("\0\0", "\0/", "//", "/\0", *dots))


def runs(positions: Union[Sequence[int], np.ndarray], offsets: np.ndarray, max_bytes: int) -> list[tuple[int, int]]:
    """Cut ``positions`` into runs of consecutive stored samples, each to be read with one read.

    Args:
        positions: stored positions, in reading order (never reordered).
        offsets: int64 ``[N + 1]``, the split's ``image_offsets``.
        max_bytes: the most bytes one run reads, unless one sample alone is larger.

    Returns:
        Half-open ranges ``(a, b)`` covering ``range(len(positions))`` in order, ``positions[a:b]`` stored
        one after the other.
    """
    at = np.asarray(positions, dtype=np.int64)
    if not len(at):
        return []
    cuts = np.flatnonzero(np.diff(at) != 1) + 1
    starts, ends = np.concatenate(([0], cuts)), np.concatenate((cuts, [len(at)]))
    if bool(((offsets[at[ends - 1] + 1] - offsets[at[starts]]) <= max_bytes).all()):  # each stretch one run
        return list(zip(starts.tolist(), ends.tolist()))
    breaks = cuts.tolist()
    out = []
    for a, b in zip([0, *breaks], [*breaks, len(at)]):  # each a stretch of consecutive positions
        while a < b:
            first = int(at[a])
            end = int(np.searchsorted(offsets, offsets[first] + max_bytes, "right")) - 1  # the furthest end in reach
            cut = min(b, a + max(1, end - first))
            out.append((a, cut))
            a = cut
    return out


