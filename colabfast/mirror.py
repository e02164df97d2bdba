"""The HDF5 mirror format: what :func:`colabfast.pack` writes and the datasets read, and its checks.

A mirror is one HDF5 file holding a whole dataset, so Drive serves one big file instead of thousands
of small ones: version 2, a sample table (imagefolder, kitti, files), and versions 3 and 4, a mirror
of columns (any dataset, the layouts of :mod:`colabfast.layouts`; 4 where a column holds None), every
dataset contiguous, unfiltered and checksummed. The format is specified once, in
``docs/mirror-format.md`` (the groups, datasets and attributes of each version, the checksums, and
what is checked before a mirror from a stranger is trusted); this module is its implementation:
:class:`Header` reads and writes the root attributes, :func:`load_columns` a mirror of columns,
:func:`colabfast.gpudecode.check_encoded` an encoded image's header. Any problem is one
:class:`MirrorError` naming the file (and the sample).
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import h5py
import numpy as np

from colabfast._fileio import TRANSIENT_ERRNOS, PathLike, backoff, file_version, human_bytes, lagging, python_child
from colabfast.errors import MirrorError

FORMAT = "colabfast-mirror"
FORMAT_VERSION = 2  # what pack writes for imagefolder, kitti and files (unchanged since: older colabfast reads them)
COLUMNS_VERSION = 3  # what pack writes for a mirror of columns (any dataset, the layouts of colabfast.layouts)
NULLS_VERSION = 4  # a mirror of columns with None values (a nulls array): colabfast before it refuses it, rather
# than return each None's placeholder (0, "", a 1x1 image); a mirror without them stays version 3, which it reads
READ_VERSIONS = (1, 2, 3, 4)
# An image mirror's layouts (format version 2); a mirror of columns records its layout's registered name
# (colabfast.layouts.registry), which the format only asks to be a name: the registry opens it.
IMAGE_LAYOUTS = ("imagefolder", "kitti", "files")
LAYOUT_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}\Z")
STORES = ("encoded", "raw")
KITTI_SPLITS = ("training", "testing")
KITTI_CALIB_KEYS = ("P0", "P1", "P2", "P3", "R0_rect", "Tr_velo_to_cam", "Tr_imu_to_velo")
OBJECT_COLUMNS = {  # kitti objects/<name>: dtype, shape of one row
    "type": ("u1", ()), "truncated": ("f8", ()), "occluded": ("i8", ()), "alpha": ("f8", ()),
    "bbox": ("f8", (4,)), "dimensions": ("f8", (3,)), "location": ("f8", (3,)), "rotation_y": ("f8", ()),
}
VET_TIMEOUT = 60.0  # seconds the child process may take to walk a mirror's metadata
VET_MOUNT_FAILED = 4  # the vetting child's exit status for a transient I/O error (stdout: its errno)
OPEN_RETRIES = 5  # retries of opening a mirror, and of reading its index, on a flaky mount (as stage's)
MAX_ATTR_BYTES = 1 << 20  # the most bytes of an attribute, but those that grow with the samples:
GROWING_ATTRS = ("classes", "class_names", "skipped")  # each: MAX_ATTR_BYTES + ATTR_BYTES_PER_SAMPLE per sample
ATTR_BYTES_PER_SAMPLE = 4096  # a class name (a folder name, NAME_MAX 255 bytes, JSON-escaped), or a skipped file
MAX_PATH_BYTES = 4096  # PATH_MAX: the most bytes of one sample's source path
MIN_ENCODED_BYTES = 67  # the smallest PNG (1x1 grey); every JPEG is larger: what one encoded sample takes at least
MAX_OBJECTS = 10_000  # groups and datasets: a mirror has about 20
VERIFY_READ = 64 << 20  # bytes per read when verifying every sample
RESIDENT_BYTES = 64 << 20  # column data load_columns reads whole (smallest columns first); the rest is read per sample
NO_IMAGES = -1  # load_index's column for a mirror of columns read without images (its samples' order only)

T = TypeVar("T")
__all__ = ["MirrorError", "MirrorInfo", "Index", "Stored", "info", "verify", "load_index", "load_columns",
           "check_columns", "read_paths", "read_order", "open_h5", "read_h5", "vet", "trust", "write_array", "Header",
           "header", "header_crc32", "attrs_crc32", "file_version", "runs"]


def _bad(path: PathLike, what: str) -> MirrorError:
    return MirrorError(f"{path} is not a valid colabfast mirror: {what}. The file is corrupt or was not "
                       "written by colabfast.pack: copy it again, or pack it again.")


def _as_mirror_error(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn what h5py raises on a corrupt file (KeyError, OSError without errno, TypeError, ...) into
    MirrorError naming the file; a real I/O error (EIO on a mount) stays an OSError."""

    @functools.wraps(fn)
    def wrapper(f_or_path: Any, *args: Any, **kwargs: Any) -> T:
        try:
            return fn(f_or_path, *args, **kwargs)
        except (MirrorError, FileNotFoundError):
            raise
        except OSError as exc:
            if exc.errno is not None:
                raise
            raise _bad(_name(f_or_path), f"HDF5 cannot read it ({exc})") from exc
        except (KeyError, ValueError, TypeError, RuntimeError, IndexError, OverflowError) as exc:
            if (code := _mount_errno(exc)) is not None:
                raise OSError(code, f"{_name(f_or_path)}: {exc}") from exc
            raise _bad(_name(f_or_path), f"HDF5 cannot read it ({type(exc).__name__}: {exc})") from exc

    return wrapper


def _mount_errno(exc: BaseException) -> Optional[int]:
    """The errno of ``exc`` if it is a flaky mount's transient error (EIO, ENOTCONN, ...: see
    :mod:`colabfast._fileio`), else None. h5py sets ``errno`` on most; where it raises another type,
    libhdf5's text still says ``errno = 5``."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and (found := re.search(r"\berrno = (\d+)", str(exc))):
        code = int(found.group(1))
    return code if code in TRANSIENT_ERRNOS else None


def _on_flaky_mount(path: Path, fn: Callable[[], T]) -> T:
    """``fn()`` (opening the mirror, reading its index), retried ``OPEN_RETRIES`` times with backoff
    on a flaky mount's transient errors. A mirror on Drive fails now and then where the file is fine:
    the error that is left says so, rather than that the file is truncated."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            code = _mount_errno(exc)
            if code is None:
                raise
            if attempt >= OPEN_RETRIES:
                from colabfast.drive import failure_advice

                advice = failure_advice(path, [OSError(code, os.strerror(code))]) or (
                    "The file may well be fine: the mount it is on (Google Drive?) is failing. Try again later, or "
                    "copy it to local disk first (colabfast.stage).")
                raise OSError(code, f"{path} could not be read: {os.strerror(code)} on each of {attempt + 1} tries. "
                              f"{advice}") from exc
        time.sleep(backoff(attempt))
        attempt += 1


def _name(f_or_path: Any) -> str:
    return f_or_path.filename if isinstance(f_or_path, h5py.File) else str(f_or_path)


# --- opening: a child process walks the metadata first ---------------------------------------------


def open_h5(path: PathLike) -> h5py.File:
    """Open a mirror read-only with h5py, without HDF5 file locking, once :func:`vet` passed it.

    Locking fails on FUSE and network mounts (Drive) and buys nothing for a file that is never
    modified once complete.

    Raises:
        FileNotFoundError: no such file.
        MirrorError: not a regular file, not HDF5, truncated, or metadata that crashes, hangs or
            breaks the format's rules (see :func:`vet`).
        OSError: the mount it is on still fails (EIO, ENOTCONN, ...) after ``OPEN_RETRIES`` retries.
    """
    path = Path(path)
    return _on_flaky_mount(path, lambda: _open_vetted(path))


def read_h5(path: PathLike, read: Callable[[h5py.File], T]) -> T:
    """``read(f)`` with the mirror at ``path`` open (see :func:`open_h5`): the open and what ``read``
    reads retried together on a flaky mount's transient errors, as :func:`open_h5` retries the open.

    Raises:
        as :func:`open_h5`, and whatever ``read`` raises.
    """
    path = Path(path)

    def attempt() -> T:
        with _open_vetted(path) as f:
            return read(f)

    return _on_flaky_mount(path, attempt)


def _open_vetted(path: Path) -> h5py.File:
    """:func:`open_h5` without its retries (for :func:`read_h5`, which retries more than the open)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"no mirror at {path}: pack one with colabfast.pack(source, {str(path)!r})") from None
    if not stat.S_ISREG(mode):  # a FIFO would block the open forever, a device never ends
        raise MirrorError(f"{path} is not a regular file (a folder, pipe or device): a mirror is one file "
                          "written by colabfast.pack")
    vet(path)
    return _open(path)


def _open(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as exc:
        if (stale := lagging(path, exc)) is not None:
            raise stale from exc  # the mount lists the file but did not open it: open_h5 tries again
        if _mount_errno(exc) is not None:
            raise  # the mount failed, not the file: open_h5 tries again
        raise MirrorError(f"{path} cannot be opened as HDF5 ({exc}): it is truncated (an interrupted copy?) "
                          "or not an HDF5 file. Copy it again, or pack it again.") from exc


_vetted: set[str] = set()  # keys (see _key) of files vetted in, or inherited by, this process


def _key(path: Path) -> str:
    """Names one version of one file (:func:`file_version`) at one path."""
    ident = "\0".join(map(str, (os.path.abspath(path), *file_version(os.stat(path)))))
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def _cache_file() -> Path:
    from colabfast.env import cache_dir

    return cache_dir() / "vetted-mirrors.json"


def _cached() -> dict[str, float]:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(key: str) -> None:
    """Record a passed file in this process and in the cache file that later processes read (spawned
    DataLoader workers, the next session); keeps the newest 1000. A lost race only costs a re-vet."""
    _vetted.add(key)
    cache = _cached()
    cache[key] = time.time()
    keep = dict(sorted(cache.items(), key=lambda kv: kv[1])[-1000:])
    target = _cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(keep))
        os.replace(tmp, target)
    except OSError:  # a read-only home: the verdict holds for this process only
        pass


def trust(path: PathLike) -> None:
    """Record ``path`` as vetted without a child process: for a mirror this process has just written
    (:func:`colabfast.pack` calls it), so opening what you packed yourself costs nothing."""
    _remember(_key(Path(path)))


def vet(path: PathLike, timeout: Optional[float] = None) -> None:
    """Check once per file version (path, size, modification and change time, inode) that libhdf5 can
    read all of the mirror's metadata, in a child process with a time limit.

    libhdf5 segfaults or loops forever on some corrupt files (found by fuzzing h5py 3.16 / HDF5 2.0);
    a library in a notebook must not take the kernel down with it. The child opens the file, walks
    every group, dataset and attribute, and checks every dataset's storage (:func:`_check_storage`).
    A passed file is remembered in this process and in ``colabfast.env.cache_dir()``.

    Args:
        timeout: seconds (default :data:`VET_TIMEOUT`).

    Raises:
        MirrorError: the child crashed, ran out of time, or found a file that breaks the format.
    """
    path = Path(path)
    key = _key(path)
    if key in _vetted:
        return
    if key in _cached():
        _vetted.add(key)
        return
    timeout = VET_TIMEOUT if timeout is None else timeout
    child = python_child("from colabfast.mirror import _vet_main; _vet_main(sys.argv[1])")
    try:
        done = subprocess.run([*child, str(path)], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise MirrorError(f"{path}: reading its HDF5 metadata did not finish in {timeout:g} s (libhdf5 loops on "
                          "some corrupt files). The file is corrupt: copy it again, or pack it again.") from None
    if done.returncode < 0:
        raise MirrorError(f"{path}: libhdf5 crashed (signal {-done.returncode}) reading its metadata, in a child "
                          "process that protected this one. The file is corrupt: copy it again, or pack it again.")
    if done.returncode == 3:  # _vet_main's verdict
        raise MirrorError(done.stdout.strip())
    if done.returncode == VET_MOUNT_FAILED:  # no verdict: open_h5 tries again
        failed = int(done.stdout) if done.stdout.strip().isdigit() else errno.EIO
        raise OSError(failed, f"{path}: {os.strerror(failed)} while the child process read its metadata")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MirrorError(f"{path}: the child process checking its metadata failed (exit {done.returncode}: "
                          f"{tail}); the file is corrupt, or this Python cannot start {sys.executable}.")
    _remember(key)


def _vet_main(path: str) -> None:
    """The child process of :func:`vet`: exit 0 if the file passes, else 3 with the reason on stdout,
    or VET_MOUNT_FAILED with the errno where the mount failed (no verdict on the file)."""
    try:
        with _open(Path(path)) as f:
            _walk(f, path, os.path.getsize(path), _samples(f))
    except Exception as exc:  # h5py raises many types on corrupt metadata: each a verdict, unless the mount failed
        if (code := _mount_errno(exc)) is not None:
            print(code)
            sys.exit(VET_MOUNT_FAILED)
        print(exc if isinstance(exc, MirrorError) else _bad(path, f"HDF5 cannot read its metadata "
                                                             f"({type(exc).__name__}: {exc})"))
        sys.exit(3)


def _samples(f: h5py.File) -> int:
    """The number of samples a mirror's ``image_offsets`` declare (their shapes, nothing read): what
    bounds its attributes (:func:`_read_attrs`)."""
    n = 0
    for g in (f, *(f[s] for s in KITTI_SPLITS if isinstance(f.get(s, getlink=True), h5py.HardLink))):
        if isinstance(g, h5py.Group) and isinstance(ds := _member(g, "image_offsets"), h5py.Dataset):
            n += max(0, ds.shape[0] - 1) if len(ds.shape) == 1 else 0
        elif isinstance(g, h5py.Group) and isinstance(ds := _member(g, "order"), h5py.Dataset):  # version 3
            n += ds.shape[0] if len(ds.shape) == 1 else 0
    return n


def _walk(f: h5py.File, path: str, size: int, samples: int) -> None:
    """Touch every object and attribute (what a crash or a loop would hit) and check each dataset."""
    seen = 0

    def visit(g: h5py.Group, depth: int) -> None:
        nonlocal seen
        _read_attrs(g, path, samples)
        for name in g:
            seen += 1
            where = f"{g.name.rstrip('/')}/{name}"
            if seen > MAX_OBJECTS:
                raise _bad(path, f"more than {MAX_OBJECTS} objects")
            link = g.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):  # a soft or external link can lead to another file
                raise _bad(path, f"{where} is a {type(link).__name__}; a mirror holds no links")
            obj = g[name]
            if isinstance(obj, h5py.Group):
                if depth >= 3:
                    raise _bad(path, f"{where} is nested deeper than the format's groups")
                visit(obj, depth + 1)
            elif isinstance(obj, h5py.Dataset):
                _read_attrs(obj, path, samples)
                _check_storage(obj, path, size)
            else:
                raise _bad(path, f"{where} is a {type(obj).__name__}, not a group or dataset")

    visit(f, 0)


def _read_attrs(obj: Union[h5py.Group, h5py.Dataset], path: str, samples: int) -> None:
    """Read every attribute of ``obj`` and check that its size is one a mirror of ``samples`` samples
    can have (a 60 MB ``classes`` took 49 s and 2.25 GB to parse, issue 23): fixed-size values before
    they are read; text (variable-length: HDF5 keeps it in a heap and knows its size only by reading
    it) here, in the vetting child, so the process that parses it never meets an oversized one."""
    for name in obj.attrs:
        limit = MAX_ATTR_BYTES + (ATTR_BYTES_PER_SAMPLE * samples if obj.name == "/" and name in GROWING_ATTRS else 0)
        _attr_size(h5py.h5a.open(obj.id, name.encode()).get_storage_size(), limit, obj, name, path, samples)
        value = obj.attrs[name]
        texts = value.ravel().tolist() if isinstance(value, np.ndarray) and value.dtype == object else [value]
        _attr_size(sum(len(t) for t in texts if isinstance(t, (str, bytes))), limit, obj, name, path, samples)


def _attr_size(size: int, limit: int, obj: Union[h5py.Group, h5py.Dataset], name: str, path: str, samples: int) -> None:
    if size > limit:
        raise _bad(path, f"attribute {name!r} of {obj.name} has {human_bytes(size)}, more than a mirror of {samples} "
                         f"samples holds ({human_bytes(limit)})")


def _check_storage(ds: h5py.Dataset, path: PathLike, size: int) -> None:
    """Raise MirrorError unless ``ds`` is a plain array whose bytes lie inside the file.

    HDF5 can keep a dataset's data in other files (external storage: a reader would return another
    file's bytes, or block on a FIFO), assemble it from other datasets (virtual), or split it into
    chunks through filters; none of that is in the format, and each would defeat ``pread``.
    """
    dcpl = ds.id.get_create_plist()
    what = None
    if ds.is_virtual or dcpl.get_layout() == h5py.h5d.VIRTUAL:
        what = "a virtual dataset (its data comes from other datasets or files)"
    elif dcpl.get_external_count():
        what = "stored in external files"
    elif dcpl.get_nfilters():
        what = "filtered (compressed)"
    elif dcpl.get_layout() != h5py.h5d.CONTIGUOUS:
        what = "chunked or compact, not contiguous"
    elif ds.dtype.kind not in "uif" or ds.dtype.names is not None or h5py.check_vlen_dtype(ds.dtype) is not None:
        what = f"of type {ds.dtype}, not plain numbers"
    if what is not None:
        raise _bad(path, f"dataset {ds.name} is {what}; every dataset of a mirror is a contiguous, unfiltered array")
    nbytes = int(np.prod(ds.shape, dtype=object)) * ds.dtype.itemsize
    if nbytes == 0:
        return
    offset = ds.id.get_offset()
    if offset is None or ds.id.get_storage_size() != nbytes:
        raise _bad(path, f"dataset {ds.name} declares {nbytes} bytes but has "
                         f"{ds.id.get_storage_size()} bytes of storage at offset {offset}")
    if offset + nbytes > size:
        raise _bad(path, f"dataset {ds.name} lies at bytes {offset}..{offset + nbytes}, outside the file "
                         f"({size} bytes; truncated?)")


# --- the header (root attributes) ------------------------------------------------------------------


@dataclasses.dataclass
class Header:
    """A mirror's root attributes: checked and parsed by :meth:`read`, written by :meth:`write`.

    An optional attribute (``quality``, ``seed``, ``fingerprint``, ``labels``, ``class_names``,
    ``split``) is absent from the file where its field is None.
    """

    layout: str  # one of IMAGE_LAYOUTS, or for a mirror of columns its layout's registered name
    store: str  # one of STORES
    classes: Optional[list[str]]  # in class index order; None where the layout has no classes
    image_size: Any  # None, int (short side) or [H, W]
    quality: Optional[int]  # JPEG quality 1..100 of resized encoded images
    shuffled: bool  # stored in a seeded random order (pack's shuffle=True)
    skipped: list[dict]  # {"path": str, "error": str} for each source file left out
    source: str  # the folder or archive packed
    created: str  # when, ISO 8601 in UTC
    colabfast_version: str  # the colabfast that packed it
    seed: Optional[int] = None  # pack's seed
    fingerprint: Optional[str] = None  # what pack compares to find its own earlier work (hex)
    labels: Optional[str] = None  # where the labels came from, for a mirror packed from an archive
    class_names: Optional[list[list[str]]] = None  # each class's names, from an archive's labels
    columns: Optional[dict] = None  # version 3: {"template": ..., "fields": [...]} (colabfast.columns)
    layout_info: Optional[dict] = None  # version 3: what a layout's drop-in needs (COCO's categories, ...)
    # the split of the source that was packed (pack's split=: a YOLO export's, VOC's image set, an export
    # zip's folder, Kaggle's ImageNet zip's part); None where pack read the whole source, or before it was kept
    split: Optional[str] = None
    version: int = FORMAT_VERSION  # the format version
    complete: bool = False  # the mirror is whole (set last, once everything else is written)

    def attrs(self) -> dict[str, Any]:
        """The root attributes as :meth:`write` gives them to h5py, in that order: text, ints and bools,
        the JSON ones (``image_size``, ``classes``, ``skipped``, ``class_names``) as text; then
        ``header_crc32`` (:func:`header_crc32`), and ``complete`` where it is true."""
        attrs = {
            "format": FORMAT, "format_version": self.version, "layout": self.layout, "store": self.store,
            "image_size": json.dumps(self.image_size), "shuffled": self.shuffled, "seed": self.seed,
            "classes": json.dumps(self.classes), "source": self.source, "fingerprint": self.fingerprint,
            "skipped": json.dumps(self.skipped), "created": self.created, "colabfast_version": self.colabfast_version,
            "quality": self.quality, "labels": self.labels,
            "class_names": None if self.class_names is None else json.dumps(self.class_names),
            "columns": None if self.columns is None else json.dumps(self.columns),
            "layout_info": None if self.layout_info is None else json.dumps(self.layout_info),
            "split": self.split,
        }
        attrs = {key: value for key, value in attrs.items() if value is not None}
        attrs["header_crc32"] = header_crc32(attrs)
        if self.complete:
            attrs["complete"] = True
        return attrs

    def write(self, f: h5py.File) -> None:
        """Write :meth:`attrs` as the root attributes of ``f`` (a mirror being built: pack sets
        ``complete`` on its own, once the rest of the file is written and synced)."""
        for key, value in self.attrs().items():
            f.attrs[key] = value

    @staticmethod
    @_as_mirror_error
    def read(f: h5py.File, path: PathLike, complete: bool = True) -> Header:
        """Check and parse the root attributes of ``f``, the mirror at ``path``.

        Args:
            complete: raise unless the mirror is complete (``False``: describe an interrupted one).

        Raises:
            MirrorError: not a mirror, a version this colabfast does not read, incomplete, an unknown
                layout or store, a malformed attribute, (version 2) a ``header_crc32`` mismatch, or
                (version 3) a column that pack does not write (a field returned as anything but
                :data:`colabfast.columns.RETURNS` allows, a box format or canvas that is not
                torchvision's: :func:`colabfast.columns.spec_problem`), naming the column.
        """
        attrs = f.attrs
        fmt = attrs.get("format")
        if not isinstance(fmt, str) or fmt != FORMAT:
            raise MirrorError(f"{path} is an HDF5 file but not a colabfast mirror (no format={FORMAT!r} attribute). "
                              "Make one with colabfast.pack().")
        version = _int(attrs, "format_version", path, -1)
        if version not in READ_VERSIONS:
            raise MirrorError(f"{path} is a colabfast mirror of format version {version}; this colabfast reads "
                              f"versions {', '.join(map(str, READ_VERSIONS))}. Pack it again with this version, or "
                              "install the colabfast that wrote it.")
        done = _flag(attrs, "complete", path)
        if complete and not done:
            raise MirrorError(f"{path} is an incomplete mirror: packing it was interrupted before it finished. "
                              "Run colabfast.pack() again; it resumes where it stopped.")
        if version >= 2 and _int(attrs, "header_crc32", path) != header_crc32(attrs):
            raise _bad(path, "its root attributes do not match their checksum (header_crc32)")
        layout, store = _text(attrs, "layout", path), _text(attrs, "store", path)
        if layout is None or not LAYOUT_NAME.match(layout):
            raise _bad(path, f"layout {(layout or '')[:80]!r} is not a layout's name (lowercase letters, digits "
                             "and '-')")
        if store not in STORES:
            raise MirrorError(f"{path} stores images as {store!r}, which this colabfast does not know (it knows "
                              f"{', '.join(STORES)}). A newer colabfast may have written it: upgrade, or pack it "
                              "again.")
        quality = _int(attrs, "quality", path)
        if quality is not None and not 1 <= quality <= 100:
            raise _bad(path, f"JPEG quality {quality} is not 1..100")
        from colabfast.columns import spec_problem

        columns = _json(attrs, "columns", path, lambda v: True)
        if columns is not None and (problem := spec_problem(columns)) is not None:
            raise _bad(path, problem)  # names the column
        if columns is None and layout not in IMAGE_LAYOUTS:
            raise _bad(path, f"unknown layout {layout!r} for an image mirror (its layout is one of "
                             f"{', '.join(IMAGE_LAYOUTS)}), and no columns attribute")
        if columns is not None and (layout in IMAGE_LAYOUTS or version < COLUMNS_VERSION):
            raise _bad(path, f"a {layout} mirror of format version {version} with a columns attribute")
        return Header(
            layout=layout, store=store, classes=_json(attrs, "classes", path, lambda v: v is None or _str_list(v)),
            image_size=_json(attrs, "image_size", path, _image_size), quality=quality,
            shuffled=_flag(attrs, "shuffled", path), skipped=_json(attrs, "skipped", path, _skipped, []),
            source=_text(attrs, "source", path) or "", created=_text(attrs, "created", path) or "",
            colabfast_version=_text(attrs, "colabfast_version", path) or "", seed=_int(attrs, "seed", path),
            fingerprint=_text(attrs, "fingerprint", path), labels=_text(attrs, "labels", path),
            class_names=_json(attrs, "class_names", path, _name_lists), columns=columns,
            layout_info=_json(attrs, "layout_info", path, lambda v: isinstance(v, dict)),
            split=_text(attrs, "split", path), version=version, complete=done,
        )


header = Header.read  # its name before the header read and wrote itself


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value.tolist() if isinstance(value, (np.generic, np.ndarray)) else value


def attrs_crc32(attrs: Mapping[str, Any], start: int = 0, skip: Sequence[str] = ("crc32",)) -> int:
    """zlib.crc32 of ``attrs`` (but ``skip``) as sorted JSON, continuing from ``start``; the same for
    the values given to h5py and those it reads back."""
    plain = {k: _plain(attrs[k]) for k in sorted(attrs) if k not in skip}
    return zlib.crc32(json.dumps(plain, sort_keys=True).encode(), start)


def header_crc32(attrs: Mapping[str, Any]) -> int:
    """The ``header_crc32`` of a mirror with root attributes ``attrs``."""
    return attrs_crc32(attrs, skip=("complete", "header_crc32"))


def _text(attrs: Any, name: str, path: PathLike, default: Optional[str] = None) -> Optional[str]:
    value = attrs.get(name)
    if value is None:
        return default
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(path, f"attribute {name!r} is not UTF-8 text") from None
    if not isinstance(value, str):
        raise _bad(path, f"attribute {name!r} is {type(value).__name__}, not text")
    return value


def _int(attrs: Any, name: str, path: PathLike, default: Optional[int] = None) -> Optional[int]:
    value = attrs.get(name)
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise _bad(path, f"attribute {name!r} is {value!r}, not an integer")
    return int(value)


def _flag(attrs: Any, name: str, path: PathLike) -> bool:
    value = attrs.get(name, False)
    if not isinstance(value, (bool, np.bool_, int, np.integer)) or int(value) not in (0, 1):
        raise _bad(path, f"attribute {name!r} is {value!r}, not true or false")
    return bool(value)


def _json(attrs: Any, name: str, path: PathLike, valid, default: Any = None) -> Any:
    raw = _text(attrs, name, path)
    if raw is None:
        return default
    try:
        value = json.loads(raw)
    except ValueError:
        raise _bad(path, f"attribute {name!r} is not JSON") from None
    if not valid(value):
        raise _bad(path, f"attribute {name!r} is not what the format says ({raw[:80]!r})")
    return value


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _image_size(v: Any) -> bool:
    def positive(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x > 0

    return v is None or positive(v) or (isinstance(v, list) and len(v) == 2 and all(positive(x) for x in v))


def _name_lists(v: Any) -> bool:
    return isinstance(v, list) and all(_str_list(x) for x in v)


def _skipped(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, dict) and isinstance(s.get("path"), str)
                                       and isinstance(s.get("error"), str) for s in v)


def check(f: h5py.File, path: PathLike) -> None:
    """Raise MirrorError unless ``f`` is a complete mirror of a format version this colabfast reads."""
    header(f, path)


def split_names(f: h5py.File) -> list[str]:
    """The sample tables in a mirror: ``[""]`` (the root group) or the KITTI splits present."""
    layout = f.attrs.get("layout")
    if isinstance(layout, str) and layout == "kitti":
        return [s for s in KITTI_SPLITS if isinstance(f.get(s, getlink=True), h5py.HardLink)]
    return [""]


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
    ds = _member(g, name)
    if not isinstance(ds, h5py.Dataset):
        raise _bad(path, f"it has no dataset {where}")

    def fits(k: int, have: int, want: Optional[int]) -> bool:
        return want is None or (have <= want if at_most and k == 0 else have == want)

    if ds.dtype != np.dtype(dtype) or len(ds.shape) != len(shape) or not all(
            fits(k, have, want) for k, (have, want) in enumerate(zip(ds.shape, shape))):
        wanted = [("<=" if at_most and k == 0 else "") + ("*" if s is None else str(s)) for k, s in enumerate(shape)]
        raise _bad(path, f"{where} is {ds.dtype} {list(ds.shape)}, expected {np.dtype(dtype)} "
                         f"[{', '.join(wanted)}]")
    _check_storage(ds, path, os.path.getsize(path))
    return ds


def _member(g: h5py.Group, name: str) -> Any:
    """``g[name]`` where that is a hard link, else None. Never through a soft or external link (another
    file); and a read that fails (EIO on a mount) raises, where ``g.get`` would say there is no member."""
    return g[name] if isinstance(g.get(name, getlink=True), h5py.HardLink) else None


def _array(g: h5py.Group, name: str, path: PathLike, dtype: str, shape: tuple, version: int,
           at_most: bool = False) -> np.ndarray:
    """Read ``g[name]`` after :func:`_dataset`'s checks; from version 2 on, check its ``crc32``."""
    return _read_checked(_dataset(g, name, path, dtype, shape, at_most), path, version)


def _read_checked(ds: h5py.Dataset, path: PathLike, version: int) -> np.ndarray:
    """Read ``ds`` (checked by :func:`_dataset`); from version 2 on, check its ``crc32``."""
    data = ds[()] if ds.size else np.zeros(ds.shape, ds.dtype)
    if version >= 2:
        attrs = {k: ds.attrs[k] for k in ds.attrs}
        if _int(attrs, "crc32", path) != attrs_crc32(attrs, zlib.crc32(np.ascontiguousarray(data).data)):
            raise _bad(path, f"{ds.name} does not match its checksum (flipped bytes?)")
    return data


def _offsets(data: np.ndarray, end: int, what: str, path: PathLike) -> None:
    if len(data) < 1 or data[0] != 0 or data[-1] != end or np.any(np.diff(data) < 0):
        raise _bad(path, f"{what} do not rise from 0 to {end} (the size of what they index)")


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
        """Compare each stored image (bytes-like, e.g. a uint8 tensor's ``.numpy()``) with its checksum.

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


@_as_mirror_error
def load_index(path: PathLike, split: str = "", column: Optional[int] = None) -> Index:
    """Read and check the sample table of ``split`` (``""``, or ``"training"``/``"testing"`` for KITTI),
    or of image column ``column`` of a version 3 mirror (its ``images`` and the split's ``order``).

    Every array is checked against the file's size and the sample count before it is read: lengths,
    offsets rising from 0 to the data's size, raw sizes equal to H x W x 3, targets within the
    classes, KITTI objects within their columns and type codes within their names, and (version 2)
    each array's checksum. Paths are checked by :func:`read_paths` when read.

    Raises:
        FileNotFoundError: no such file.
        MirrorError: anything wrong with the file, named.
        OSError: the mount it is on still fails (EIO, ENOTCONN, ...) after ``OPEN_RETRIES`` retries.
    """
    path = Path(path)
    return read_h5(path, lambda f: _load_index(f, path, split, column))


def _group(f: h5py.File, path: Path, split: str, head: Header) -> h5py.Group:
    if head.layout != "kitti" and not split:
        return f
    if split not in split_names(f) or not isinstance(f[split], h5py.Group):
        raise MirrorError(f"{path} has no {split!r} split (it has: {', '.join(split_names(f)) or 'none'})")
    return f[split]


def column_group(g: h5py.Group, path: PathLike, k: int, head: Header) -> h5py.Group:
    """The group of column ``k`` (version 3: ``columns/<k>``), checked to be one."""
    if head.columns is None or not 0 <= k < len(head.columns["fields"]):
        raise _bad(path, f"it has no column {k}")
    c = _member(g, "columns")
    c = _member(c, str(k)) if isinstance(c, h5py.Group) else None
    if not isinstance(c, h5py.Group):
        raise _bad(path, f"it has no group {g.name.rstrip('/')}/columns/{k}")
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
    offsets = _array(g, "image_offsets", path, "<i8", (images.shape[0] // least + 1,), v, at_most=True)
    n = len(offsets) - 1
    _offsets(offsets, images.shape[0], "image_offsets", path)
    shapes = _array(g, "image_shapes", path, "<i4", (n, 3), v)
    if n and (shapes[:, :2].min() < 1 or np.any(shapes[:, 2] != 3)):
        raise _bad(path, "image_shapes holds a shape that is not (H >= 1, W >= 1, 3)")
    sizes = np.diff(offsets)
    if head.store == "raw" and np.any(shapes.astype(np.int64).prod(axis=1) != sizes):
        i = int(np.flatnonzero(shapes.astype(np.int64).prod(axis=1) != sizes)[0])
        raise _bad(path, f"raw image {i} has {sizes[i]} bytes but its shape {shapes[i].tolist()} needs "
                         f"{int(np.prod(shapes[i].astype(np.int64)))}")
    if head.store == "encoded" and np.any(sizes < MIN_ENCODED_BYTES):
        i = int(np.flatnonzero(sizes < MIN_ENCODED_BYTES)[0])
        raise _bad(path, f"encoded image {i} has {sizes[i]} bytes, fewer than any JPEG or PNG")
    for name, dtype, shape in (("paths", "u1", (n * MAX_PATH_BYTES,)), ("path_offsets", "<i8", (n + 1,))):
        _dataset(g, name, path, dtype, shape, at_most=name == "paths")  # read when asked for (read_paths, verify)
    index = Index(path, split, head, images.id.get_offset() or 0, offsets, shapes, None,
                  _array(g, "image_crc32", path, "<u4", (n,), v) if v >= 2 else None,
                  _array(g, "order", path, "<i8", (n,), v))
    if head.layout != "kitti":
        targets = _array(g, "targets", path, "<i8", (n,), v)
        if head.layout == "imagefolder" and not head.classes:
            raise _bad(path, "an imagefolder mirror without classes")
        if head.classes is not None and n and (targets.min() < 0 or targets.max() >= len(head.classes)):
            raise _bad(path, f"a target is outside 0..{len(head.classes) - 1} (the {len(head.classes)} classes)")
        index.targets = targets
    elif split == "training":
        _kitti_objects(g, path, index)
    if head.layout == "kitti" and "calib" in g:
        calib = g["calib"]
        if not isinstance(calib, h5py.Group):
            raise _bad(path, f"{g.name}/calib is not a group")
        index.calib = {k: _array(calib, k, path, "<f8", (n, 9 if k == "R0_rect" else 12), v)
                       for k in KITTI_CALIB_KEYS if k in calib}
    return index


def _column_index(f: h5py.File, g: h5py.Group, path: Path, head: Header, k: int) -> Index:
    """The :class:`Index` of image or mask column ``k`` of a version 3 mirror: as a sample table's,
    with any channel count 1..4 (a grey image, a palette mask, RGBA)."""
    v, c = head.version, column_group(g, path, k, head)
    n = _dataset(g, "order", path, "<i8", (None,)).shape[0]
    images = _dataset(c, "images", path, "u1", (None,))
    if images.shape[0] < n * MIN_ENCODED_BYTES:
        raise _bad(path, f"{c.name}/images holds {images.shape[0]} bytes, too few for {n} images")
    offsets = _array(c, "image_offsets", path, "<i8", (n + 1,), v)
    _offsets(offsets, images.shape[0], f"{c.name}/image_offsets", path)
    shapes = _array(c, "image_shapes", path, "<i4", (n, 3), v)
    if n and (shapes[:, :2].min() < 1 or shapes[:, 2].min() < 1 or shapes[:, 2].max() > 4):
        raise _bad(path, f"{c.name}/image_shapes holds a shape that is not (H >= 1, W >= 1, 1..4)")
    if n and np.diff(offsets).min() < MIN_ENCODED_BYTES:
        raise _bad(path, f"an image of {c.name} has fewer bytes than any JPEG or PNG")
    _dataset(g, "paths", path, "u1", (n * MAX_PATH_BYTES,), at_most=True)
    _dataset(g, "path_offsets", path, "<i8", (n + 1,))
    store = "encoded"
    return Index(path, "", dataclasses.replace(head, store=store), images.id.get_offset() or 0, offsets, shapes, None,
                 _array(c, "image_crc32", path, "<u4", (n,), v), _array(g, "order", path, "<i8", (n,), v))


def _rows_index(g: h5py.Group, path: Path, head: Header) -> Index:
    """The :class:`Index` of a version 3 mirror read without images (``column=NO_IMAGES``): its samples'
    order, each sample's image empty (no bytes, shape 0 x 0 x 0, the CRC-32 of nothing), so that
    :class:`colabfast.datasets.MirrorReader` orders, counts and reads it as it does any mirror."""
    v = head.version
    n = _dataset(g, "order", path, "<i8", (None,)).shape[0]
    _dataset(g, "paths", path, "u1", (n * MAX_PATH_BYTES,), at_most=True)
    _dataset(g, "path_offsets", path, "<i8", (n + 1,))
    return Index(path, "", dataclasses.replace(head, store="encoded"), 0, np.zeros(n + 1, np.int64),
                 np.zeros((n, 3), np.int32), None, np.zeros(n, np.uint32), _array(g, "order", path, "<i8", (n,), v))


@dataclasses.dataclass(frozen=True)
class Stored:
    """A column's data array as :func:`load_columns` leaves it: checked against the file and the format,
    not read. ``name`` is its HDF5 path, ``offset`` its place in the file (0 when empty; contiguous,
    so rows ``a:b`` are bytes ``offset + a * row_bytes`` to ``offset + b * row_bytes``), ``attrs`` its
    attributes (``crc32`` covers its bytes, then the others: :func:`attrs_crc32`)."""

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
    _int(attrs, "crc32", path)  # an integer: check_columns compares it
    return Stored(ds.name, ds.id.get_offset() or 0, ds.dtype, tuple(ds.shape), attrs)


@_as_mirror_error
def load_columns(path: PathLike, resident: Optional[int] = None
                 ) -> tuple[Header, int, dict[int, Any], dict[tuple[str, int], np.ndarray]]:
    """``(header, N, values, marks)`` of a version 3 or 4 mirror: ``values`` maps each column that is not
    an image or mask to what it stores, checked (lengths against ``N``, offsets rising to the data's size,
    shapes against the ``columns`` attribute, at most ``MAX_JSON_BYTES`` of JSON per sample, checksums of
    what is read): a NumPy array ``[N]`` (int, float, bool), ``[N, *shape]`` (ndarray), ``(rows [M,
    *trail], offsets [N + 1])`` (ragged; with ``shapes [N, ndim]`` where each sample has its own
    shape), or ``(data uint8 [bytes], offsets [N + 1])`` (str, bytes, json). ``marks`` maps
    ``("nulls", k)`` and ``("formats", k)`` to column ``k``'s uint8 ``[N]`` array of that name, where
    its field has one (:mod:`colabfast.columns`: 1 where the value is None, resp. where the image
    keeps its stored file's format).

    Opening costs the index, not the data: the data arrays (ndarray values, ragged rows, str/bytes/
    json data) are read whole only while their sizes add up to ``resident`` bytes (default
    :data:`RESIDENT_BYTES`), smallest first; each other one is a :class:`Stored`, for the caller to
    read per sample (:class:`colabfast.H5Dataset`) or stream (:func:`check_columns`, which checks its
    checksum).

    Raises:
        MirrorError: not a mirror of columns, or a column that breaks the format.
    """
    from colabfast.columns import MAX_JSON_BYTES

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
                        raise _bad(path, f"column {k} has nulls, which a mirror of format version {v} does not")
                    marks[mark, k] = _array(c, mark, path, "u1", (n,), v)
                    if n and int(marks[mark, k].max()) > 1:
                        raise _bad(path, f"column {k}'s {mark} holds values other than 0 and 1")
            if kind in ("image", "mask"):
                continue
            if kind in ("int", "float", "bool"):
                out[k] = _array(c, "values", path, {"int": "<i8", "float": "<f8", "bool": "u1"}[kind], (n,), v)
            elif kind in ("str", "bytes", "json"):
                data = _stored(c, "data", path, "u1", (size,), at_most=True)
                offsets = _array(c, "offsets", path, "<i8", (n + 1,), v)
                _offsets(offsets, data.shape[0], f"{c.name}/offsets", path)
                sizes = np.diff(offsets)
                if kind == "json" and n and int(sizes.max()) > MAX_JSON_BYTES:  # what a read would parse
                    i = int(sizes.argmax())
                    raise _bad(path, f"sample {i} of column {k} ({spec['name'][:80]!r}) holds {int(sizes[i])} bytes "
                                     f"of JSON, more than pack writes ({MAX_JSON_BYTES})")
                out[k] = (data, offsets)
            else:
                dtype = "u1" if spec["dtype"] == "bool" else spec["dtype"]
                try:
                    dt = np.dtype(dtype)
                except TypeError:
                    raise _bad(path, f"column {k} has dtype {dtype!r}") from None
                if dt.kind not in "uif" or dt.itemsize > 8:
                    raise _bad(path, f"column {k} has dtype {dtype!r}, not plain numbers")
                shape = tuple(spec["shape"])
                row = int(np.prod(shape, dtype=object)) * dt.itemsize
                if kind == "ndarray":
                    if row and n * row > size:
                        raise _bad(path, f"column {k} declares more bytes than the file holds")
                    out[k] = _stored(c, "values", path, dt.str, (n, *shape))
                else:
                    bound = size // row if row else None  # rows of zero bytes: bounded by the offsets
                    offsets = _array(c, "offsets", path, "<i8", (n + 1,), v)
                    rows = _stored(c, "values", path, dt.str, (bound if bound is not None else None, *shape),
                                   at_most=bound is not None)
                    _offsets(offsets, rows.shape[0], f"{c.name}/offsets", path)
                    ndim = (spec.get("meta") or {}).get("ndim")
                    if ndim is not None:  # each sample's shape: values flat
                        if not isinstance(ndim, int) or not 1 <= ndim <= 8 or shape:
                            raise _bad(path, f"column {k} has a malformed ndim {ndim!r}")
                        shapes = _array(c, "shapes", path, "<i8", (n, ndim), v)
                        if n and (shapes.min() < 0 or np.any(np.prod(shapes, axis=1) != np.diff(offsets))):
                            raise _bad(path, f"column {k}: a sample's shape does not match its size")
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
    object_offsets = _array(g, "object_offsets", path, "<i8", (len(index) + 1,), v)
    m = int(object_offsets[-1]) if len(object_offsets) else 0
    _offsets(object_offsets, m, "object_offsets", path)
    if not isinstance(_member(g, "objects"), h5py.Group):
        raise _bad(path, f"{g.name} has no objects group")
    o = g["objects"]
    objects = {k: _array(o, k, path, dtype, (m, *row), v) for k, (dtype, row) in OBJECT_COLUMNS.items()}
    names = _json(o["type"].attrs, "names", path, _str_list)
    if names is None or (m and int(objects["type"].max()) >= len(names)):
        raise _bad(path, f"{o.name}/type holds a code outside its {len(names or [])} names")
    index.object_offsets, index.objects, index.type_names = object_offsets, objects, names


@_as_mirror_error
def read_paths(path: PathLike, split: str = "") -> list[str]:
    """Each sample's source path, relative to the mirror's ``source`` attribute, checked: UTF-8,
    relative, no ``..``.

    Raises:
        MirrorError: a path table that breaks the format.
    """
    path = Path(path)

    def read(f: h5py.File) -> tuple[np.ndarray, bytes]:
        head = header(f, path)
        g = _group(f, path, split, head)
        n = _dataset(g, "order", path, "<i8", (None,)).shape[0]  # bounds both, before reading
        offsets = _array(g, "path_offsets", path, "<i8", (n + 1,), head.version)
        return offsets, _array(g, "paths", path, "u1", (n * MAX_PATH_BYTES,), head.version, at_most=True).tobytes()

    offsets, blob = read_h5(path, read)
    _offsets(offsets, len(blob), "path_offsets", path)
    out, ends = [], offsets.tolist()
    for i, (a, b) in enumerate(zip(ends, ends[1:])):
        try:
            out.append(blob[a:b].decode("utf-8"))
        except UnicodeDecodeError:
            raise _bad(path, f"path {i} is not UTF-8") from None
    # All paths joined by NUL, which no path may hold: one scan instead of 1.28M (ImageNet) checks.
    if b"\0" in blob or _not_plain("\0" + "\0".join(out) + "\0"):
        i = next(i for i, rel in enumerate(out) if "\0" in rel or _not_plain(f"\0{rel}\0"))
        raise _bad(path, f"path {i} ({out[i][:80]!r}) is not a plain relative path")
    return out


@_as_mirror_error
def read_order(path: PathLike, split: str = "") -> np.ndarray:
    """Each stored sample's index in the source's order (``split``'s ``order``), checked: int64, one
    per sample.

    Raises:
        MirrorError: an order table that breaks the format.
    """
    path = Path(path)

    def read(f: h5py.File) -> np.ndarray:
        head = header(f, path)
        g = _group(f, path, split, head)
        n = _dataset(g, "order", path, "<i8", (None,)).shape[0]
        return _array(g, "order", path, "<i8", (n,), head.version)

    return read_h5(path, read)


def _not_plain(joined: str) -> bool:
    """True if NUL-separated paths hold an empty one, a leading "/", or an empty, "." or ".." component
    (substring scans: a regex took 1 s on ImageNet's 1.28M paths)."""
    dots = (f"{a}{d}{b}" for d in (".", "..") for a in "/\0" for b in "/\0")
    return any(bad in joined for bad in ("\0\0", "\0/", "//", "/\0", *dots))


def runs(positions: Union[Sequence[int], np.ndarray], offsets: np.ndarray, max_bytes: int) -> list[tuple[int, int]]:
    """Cut ``positions`` into runs of consecutive stored samples, each to be read with one read.

    Args:
        positions: stored positions (ints, e.g. int64 ``[K]``), in the order they are to be read;
            sorted, they make the fewest runs. They are never reordered.
        offsets: int64 ``[N + 1]``, the split's ``image_offsets`` (sample ``p`` is bytes
            ``offsets[p]`` to ``offsets[p + 1]`` of ``images``).
        max_bytes: the most bytes (of ``images``) one run reads, unless one sample alone is larger.

    Returns:
        Half-open ranges ``(a, b)`` covering ``range(len(positions))`` in order: ``positions[a:b]``
        are stored one after the other (each one more than the one before: a repeated position
        starts a new run), so bytes ``offsets[positions[a]]`` to ``offsets[positions[b - 1] + 1]``
        hold them; each run is as long as that and ``max_bytes`` allow.
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


@_as_mirror_error
def check_columns(path: PathLike, decode: bool = True, progress: bool = False) -> tuple[int, list[str]]:
    """Stream every data column of a version 3 mirror (ndarray values, ragged rows, str/bytes/json data:
    what :func:`load_columns` may leave on disk) through its checksum, in reads of at most
    ``VERIFY_READ`` bytes (or one sample), and with ``decode`` each str value through UTF-8 and each
    json value through the JSON parser, as :class:`colabfast.H5Dataset` reads them.

    Returns:
        ``(N, problems)``: the number of samples, and each problem found (a sample that does not
        decode, naming its stored position, source path and field; a column that does not match its
        checksum), for the caller to report (:func:`verify`).

    Raises:
        MirrorError: not a mirror of columns, or one whose index breaks the format (:func:`load_columns`).
    """
    from tqdm.auto import tqdm

    from colabfast.columns import json_value

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
            crc = 0
            with tqdm(total=data.nbytes, unit="B", unit_scale=True, desc=f"verify {name}", disable=not progress) as bar:
                for i, j in runs(np.arange(n), ends, VERIFY_READ):
                    base = int(ends[i])
                    buf = _pread(fd, int(ends[j]) - base, data.offset + base, path)
                    crc = zlib.crc32(buf, crc)
                    for p in range(i, j) if decode and kind in ("str", "json") else ():
                        raw = buf[ends[p] - base : ends[p + 1] - base].tobytes()
                        try:
                            json_value(raw) if kind == "json" else raw.decode("utf-8", "surrogatepass")
                        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                            problems.append(f"sample {p} ({rels[p]}), field {name!r}: not valid {kind} "
                                            f"({type(exc).__name__}: {str(exc)[:80]})")
                    bar.update(len(buf))
            if _int(data.attrs, "crc32", path) != attrs_crc32(data.attrs, crc):
                problems.append(f"field {name!r}: {data.name} does not match its checksum")
    finally:
        os.close(fd)
    return n, problems


@_as_mirror_error
def verify(path: PathLike, progress: bool = False) -> int:
    """Check every stored image of a version 2 mirror against its checksum, and its paths and order;
    and each encoded image's header against its declared shape and ``PIL.Image.MAX_IMAGE_PIXELS``
    (:func:`colabfast.gpudecode.check_encoded`; no image is decoded). Of a version 3 mirror, also every
    other column: its checksum, and each str and JSON value decoded (:func:`check_columns`).

    Reads the whole file once, in reads of 64 MB; CRC-32 runs at about 3.5 GB/s per core (measured
    here), so the disk is the limit. ``colabfast info --verify`` runs this.

    Returns:
        The number of samples checked.

    Raises:
        MirrorError: a version 1 mirror (no checksums), a KITTI mirror with neither split, or samples
            that differ or do not decode (up to 20 are named, with their fields).
    """
    from tqdm.auto import tqdm

    from colabfast.gpudecode import check_encoded

    path = Path(path)
    with open_h5(path) as f:
        head, splits = header(f, path), split_names(f)
    if not splits:  # kitti: no training/ or testing/ (an imagefolder's tables at the root are not read)
        raise _bad(path, "a kitti mirror without a training or testing split")
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
            order = _array(f[split] if split else f, "order", path, "<i8", (len(index),), index.header.version)
        if len(np.unique(order)) != len(order) or (len(order) and order.min() < 0):
            raise _bad(path, f"{split or 'the'} order is not distinct source indices")
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
    """What :func:`info` reports about a mirror: its :class:`Header`, whose fields read as its own
    (``info.layout`` is ``info.header.layout``; ``format_version`` is its ``version``, ``labels``
    is ``""`` where it has none), and what its sample tables hold."""

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


@_as_mirror_error
def info(path: PathLike) -> MirrorInfo:
    """Describe a mirror (also one whose packing was interrupted). ``colabfast info`` prints this.

    A complete mirror's sample tables are checked as :func:`load_index` does; an incomplete one is
    described by its attributes only (its tables may be half written).

    Raises:
        FileNotFoundError, MirrorError: not a readable colabfast mirror.
    """
    path = Path(path)
    with open_h5(path) as f:
        head = Header.read(f, path, complete=False)
        splits = split_names(f)
    if head.complete and not splits:
        raise _bad(path, "a kitti mirror without a training or testing split")
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
