"""The mirror format's constants and its header (the root attributes): :class:`Header`, its checks and CRC-32."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import zlib
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence, TypeVar

import h5py
import numpy as np

from colabfast.errors import MirrorError
from colabfast.where._fileio import (
    TRANSIENT_ERRNOS,
    PathLike,
)

__all__ = ["Header", "header", "header_crc32", "attrs_crc32"]

FORMAT = "colabfast-mirror"
FORMAT_VERSION = 2  # what pack writes for imagefolder, kitti and files (unchanged since: older colabfast reads them)
COLUMNS_VERSION = 3  # what pack writes for a mirror of columns (any dataset, the layouts of colabfast.layouts)
NULLS_VERSION = 4  # a mirror of columns with None values (a nulls array): colabfast before it refuses it, rather
# than return each None's placeholder (0, "", a 1x1 image); a mirror without them stays version 3, which it reads
READ_VERSIONS = (1, 2, 3, 4)
# An image mirror's layouts (format version 2); a mirror of columns records its layout's registered name
# (colabfast.layouts.registry), which the format only asks to be a name: the registry opens it.
IMAGEFOLDER, KITTI, FILES = "imagefolder", "kitti", "files"
IMAGE_LAYOUTS = (IMAGEFOLDER, KITTI, FILES)
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


def invalid(path: PathLike, what: str) -> MirrorError:
    return MirrorError(f"{path} is not a valid colabfast mirror: {what}. The file is corrupt or was not "
                       "written by colabfast.pack: copy it again, or pack it again.")


def as_mirror_error(fn: Callable[..., T]) -> Callable[..., T]:
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
            raise invalid(_name(f_or_path), f"HDF5 cannot read it ({exc})") from exc
        except (KeyError, ValueError, TypeError, RuntimeError, IndexError, OverflowError) as exc:
            if (code := mount_errno(exc)) is not None:
                raise OSError(code, f"{_name(f_or_path)}: {exc}") from exc
            raise invalid(_name(f_or_path), f"HDF5 cannot read it ({type(exc).__name__}: {exc})") from exc

    return wrapper


def mount_errno(exc: BaseException) -> Optional[int]:
    """The errno of ``exc`` if it is a flaky mount's transient error (EIO, ENOTCONN, ...), else None."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and (found := re.search(r"\berrno = (\d+)", str(exc))):
        code = int(found.group(1))
    return code if code in TRANSIENT_ERRNOS else None


def _name(f_or_path: Any) -> str:
    return f_or_path.filename if isinstance(f_or_path, h5py.File) else str(f_or_path)


# --- the header (root attributes) ------------------------------------------------------------------


@dataclasses.dataclass
class Header:
    """A mirror's root attributes: checked and parsed by :meth:`read`, written by :meth:`write`; an optional
    one is absent where its field is None.
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
    columns: Optional[dict] = None  # version 3: {"template": ..., "fields": [...]} (colabfast.mirror.columns)
    layout_info: Optional[dict] = None  # version 3: what a layout's drop-in needs (COCO's categories, ...)
    # the split of the source that was packed (pack's split=: a YOLO export's, VOC's image set, an export
    # zip's folder, Kaggle's ImageNet zip's part); None where pack read the whole source, or before it was kept
    split: Optional[str] = None
    version: int = FORMAT_VERSION  # the format version
    complete: bool = False  # the mirror is whole (set last, once everything else is written)

    def attrs(self) -> dict[str, Any]:
        """The root attributes as :meth:`write` gives them to h5py, ``header_crc32`` and ``complete`` last."""
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
    @as_mirror_error
    def read(f: h5py.File, path: PathLike, complete: bool = True) -> Header:
        """Check and parse the root attributes of ``f``, the mirror at ``path``.

        Args:
            complete: raise unless the mirror is complete (``False``: describe an interrupted one).

        Raises:
            MirrorError: not a mirror, a version this colabfast does not read, incomplete, an unknown layout
                or store, a malformed attribute, a ``header_crc32`` mismatch, or a column pack does not write
                (:func:`colabfast.mirror.columns.spec_problem`), naming the column.
        """
        attrs = f.attrs
        fmt = attrs.get("format")
        if not isinstance(fmt, str) or fmt != FORMAT:
            raise MirrorError(f"{path} is an HDF5 file but not a colabfast mirror (no format={FORMAT!r} attribute). "
                              "Make one with colabfast.pack().")
        version = int_attr(attrs, "format_version", path, -1)
        if version not in READ_VERSIONS:
            raise MirrorError(f"{path} is a colabfast mirror of format version {version}; this colabfast reads "
                              f"versions {', '.join(map(str, READ_VERSIONS))}. Pack it again with this version, or "
                              "install the colabfast that wrote it.")
        done = _flag(attrs, "complete", path)
        if complete and not done:
            raise MirrorError(f"{path} is an incomplete mirror: packing it was interrupted before it finished. "
                              "Run colabfast.pack() again; it resumes where it stopped.")
        if version >= 2 and int_attr(attrs, "header_crc32", path) != header_crc32(attrs):
            raise invalid(path, "its root attributes do not match their checksum (header_crc32)")
        layout, store = _text(attrs, "layout", path), _text(attrs, "store", path)
        if layout is None or not LAYOUT_NAME.match(layout):
            raise invalid(path, f"layout {(layout or '')[:80]!r} is not a layout's name (lowercase letters, digits "
                             "and '-')")
        if store not in STORES:
            raise MirrorError(f"{path} stores images as {store!r}, which this colabfast does not know (it knows "
                              f"{', '.join(STORES)}). A newer colabfast may have written it: upgrade, or pack it "
                              "again.")
        quality = int_attr(attrs, "quality", path)
        if quality is not None and not 1 <= quality <= 100:
            raise invalid(path, f"JPEG quality {quality} is not 1..100")
        from colabfast.mirror.columns import spec_problem

        columns = json_attr(attrs, "columns", path, lambda v: True)
        if columns is not None and (problem := spec_problem(columns)) is not None:
            raise invalid(path, problem)  # names the column
        if columns is None and layout not in IMAGE_LAYOUTS:
            raise invalid(path, f"unknown layout {layout!r} for an image mirror (its layout is one of "
                             f"{', '.join(IMAGE_LAYOUTS)}), and no columns attribute")
        if columns is not None and (layout in IMAGE_LAYOUTS or version < COLUMNS_VERSION):
            raise invalid(path, f"a {layout} mirror of format version {version} with a columns attribute")
        return Header(
            layout=layout, store=store,
            classes=json_attr(attrs, "classes", path, lambda v: v is None or is_str_list(v)),
            image_size=json_attr(attrs, "image_size", path, _image_size), quality=quality,
            shuffled=_flag(attrs, "shuffled", path), skipped=json_attr(attrs, "skipped", path, _skipped, []),
            source=_text(attrs, "source", path) or "", created=_text(attrs, "created", path) or "",
            colabfast_version=_text(attrs, "colabfast_version", path) or "", seed=int_attr(attrs, "seed", path),
            fingerprint=_text(attrs, "fingerprint", path), labels=_text(attrs, "labels", path),
            class_names=json_attr(attrs, "class_names", path, _name_lists), columns=columns,
            layout_info=json_attr(attrs, "layout_info", path, lambda v: isinstance(v, dict)),
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
            raise invalid(path, f"attribute {name!r} is not UTF-8 text") from None
    if not isinstance(value, str):
        raise invalid(path, f"attribute {name!r} is {type(value).__name__}, not text")
    return value


def int_attr(attrs: Any, name: str, path: PathLike, default: Optional[int] = None) -> Optional[int]:
    value = attrs.get(name)
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise invalid(path, f"attribute {name!r} is {value!r}, not an integer")
    return int(value)


def _flag(attrs: Any, name: str, path: PathLike) -> bool:
    value = attrs.get(name, False)
    if not isinstance(value, (bool, np.bool_, int, np.integer)) or int(value) not in (0, 1):
        raise invalid(path, f"attribute {name!r} is {value!r}, not true or false")
    return bool(value)


def json_attr(attrs: Any, name: str, path: PathLike, valid, default: Any = None) -> Any:
    raw = _text(attrs, name, path)
    if raw is None:
        return default
    try:
        value = json.loads(raw)
    except ValueError:
        raise invalid(path, f"attribute {name!r} is not JSON") from None
    if not valid(value):
        raise invalid(path, f"attribute {name!r} is not what the format says ({raw[:80]!r})")
    return value


def is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _image_size(v: Any) -> bool:
    def positive(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x > 0

    return v is None or positive(v) or (isinstance(v, list) and len(v) == 2 and all(positive(x) for x in v))


def _name_lists(v: Any) -> bool:
    return isinstance(v, list) and all(is_str_list(x) for x in v)


def _skipped(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, dict) and isinstance(s.get("path"), str)
                                       and isinstance(s.get("error"), str) for s in v)


def check(f: h5py.File, path: PathLike) -> None:
    """Raise MirrorError unless ``f`` is a complete mirror of a format version this colabfast reads."""
    header(f, path)


def split_names(f: h5py.File) -> list[str]:
    """The sample tables in a mirror: ``[""]`` (the root group) or the KITTI splits present."""
    layout = f.attrs.get("layout")
    if isinstance(layout, str) and layout == KITTI:
        return [s for s in KITTI_SPLITS if isinstance(f.get(s, getlink=True), h5py.HardLink)]
    return [""]


def member(g: h5py.Group, name: str) -> Any:
    """``g[name]`` where that is a hard link, else None. Never through a soft or external link (another
    file); and a read that fails (EIO on a mount) raises, where ``g.get`` would say there is no member."""
    return g[name] if isinstance(g.get(name, getlink=True), h5py.HardLink) else None


