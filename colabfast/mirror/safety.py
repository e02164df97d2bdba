"""Opening a mirror that may come from anyone: vetted in a child process first (:func:`vet`), opened
through a flaky mount's errors (:func:`open_h5`, :func:`read_h5`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar, Union

import h5py
import numpy as np

from colabfast.errors import MirrorError
from colabfast.mirror.format import (
    ATTR_BYTES_PER_SAMPLE,
    GROWING_ATTRS,
    KITTI_SPLITS,
    MAX_ATTR_BYTES,
    MAX_OBJECTS,
    OPEN_RETRIES,
    VET_MOUNT_FAILED,
    VET_TIMEOUT,
    invalid,
    member,
    mount_errno,
)
from colabfast.where._fileio import (
    PathLike,
    backoff,
    file_version,
    human_bytes,
    lagging,
    python_child,
    scoped_files,
)

__all__ = ["open_h5", "read_h5", "vet", "trust"]

T = TypeVar("T")

def _on_flaky_mount(path: Path, fn: Callable[[], T]) -> T:
    """``fn()`` retried ``OPEN_RETRIES`` times with backoff on a flaky mount's transient errors."""
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            code = mount_errno(exc)
            if code is None:
                raise
            if attempt >= OPEN_RETRIES:
                from colabfast.drive.mounting import failure_advice

                advice = failure_advice(path, [OSError(code, os.strerror(code))]) or (
                    "The file may well be fine: the mount it is on (Google Drive?) is failing. Try again later, or "
                    "copy it to local disk first (colabfast.stage).")
                raise OSError(code, f"{path} could not be read: {os.strerror(code)} on each of {attempt + 1} tries. "
                              f"{advice}") from exc
        time.sleep(backoff(attempt))
        attempt += 1


# --- opening: a child process walks the metadata first ---------------------------------------------


def open_h5(path: PathLike) -> h5py.File:
    """Open a vetted mirror read-only with h5py, without HDF5 file locking (it fails on FUSE mounts).

    Raises:
        FileNotFoundError: no such file.
        MirrorError: not a regular file, not HDF5, truncated, or metadata that crashes, hangs or
            breaks the format's rules (see :func:`vet`).
        OSError: the mount it is on still fails (EIO, ENOTCONN, ...) after ``OPEN_RETRIES`` retries.
    """
    path = Path(path)
    return _on_flaky_mount(path, lambda: _open_vetted(path))


def read_h5(path: PathLike, read: Callable[[h5py.File], T]) -> T:
    """``read(f)`` with the mirror at ``path`` open, the open and the reads retried together.

    Raises:
        as :func:`open_h5`, and whatever ``read`` raises.
    """
    path = Path(path)

    def attempt() -> T:
        files = scoped_files()
        if files is None:
            with _open_vetted(path) as f:
                return read(f)
        key = _key(path)  # this version of the file: a file replaced meanwhile is opened anew
        f = files.get(key)
        if f is None or not f.id.valid:
            f = files[key] = _open_vetted(path)
        try:
            return read(f)
        except Exception:
            with contextlib.suppress(Exception):
                files.pop(key).close()  # a failed read may have left the file object in any state
            raise

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
        if mount_errno(exc) is not None:
            raise  # the mount failed, not the file: open_h5 tries again
        raise MirrorError(f"{path} cannot be opened as HDF5 ({exc}): it is truncated (an interrupted copy?) "
                          "or not an HDF5 file. Copy it again, or pack it again.") from exc


_vetted: set[str] = set()  # keys (see _key) of files vetted in, or inherited by, this process


def _key(path: Path) -> str:
    """Names one version of one file (:func:`file_version`) at one path."""
    ident = "\0".join(map(str, (os.path.abspath(path), *file_version(os.stat(path)))))
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def _cache_file() -> Path:
    from colabfast.where.env import cache_dir

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
    """Check once per file version, in a child process with a time limit, that libhdf5 can read all of the
    mirror's metadata (libhdf5 crashes or hangs on some corrupt files: [Mirrors from
    strangers](../mirror-format.md#mirrors-from-strangers)).

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
    child = python_child("from colabfast.mirror.safety import _vet_main; _vet_main(sys.argv[1])")
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
        if (code := mount_errno(exc)) is not None:
            print(code)
            sys.exit(VET_MOUNT_FAILED)
        print(exc if isinstance(exc, MirrorError) else invalid(path, f"HDF5 cannot read its metadata "
                                                             f"({type(exc).__name__}: {exc})"))
        sys.exit(3)


def _samples(f: h5py.File) -> int:
    """The number of samples a mirror's ``image_offsets`` declare (their shapes, nothing read): what
    bounds its attributes (:func:`_read_attrs`)."""
    n = 0
    for g in (f, *(f[s] for s in KITTI_SPLITS if isinstance(f.get(s, getlink=True), h5py.HardLink))):
        if isinstance(g, h5py.Group) and isinstance(ds := member(g, "image_offsets"), h5py.Dataset):
            n += max(0, ds.shape[0] - 1) if len(ds.shape) == 1 else 0
        elif isinstance(g, h5py.Group) and isinstance(ds := member(g, "order"), h5py.Dataset):  # version 3
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
                raise invalid(path, f"more than {MAX_OBJECTS} objects")
            link = g.get(name, getlink=True)
            if not isinstance(link, h5py.HardLink):  # a soft or external link can lead to another file
                raise invalid(path, f"{where} is a {type(link).__name__}; a mirror holds no links")
            obj = g[name]
            if isinstance(obj, h5py.Group):
                if depth >= 3:
                    raise invalid(path, f"{where} is nested deeper than the format's groups")
                visit(obj, depth + 1)
            elif isinstance(obj, h5py.Dataset):
                _read_attrs(obj, path, samples)
                check_storage(obj, path, size)
            else:
                raise invalid(path, f"{where} is a {type(obj).__name__}, not a group or dataset")

    visit(f, 0)


def _read_attrs(obj: Union[h5py.Group, h5py.Dataset], path: str, samples: int) -> None:
    """Read every attribute of ``obj`` and check its size is one a mirror of ``samples`` can have (issue 23)."""
    for name in obj.attrs:
        limit = MAX_ATTR_BYTES + (ATTR_BYTES_PER_SAMPLE * samples if obj.name == "/" and name in GROWING_ATTRS else 0)
        _attr_size(h5py.h5a.open(obj.id, name.encode()).get_storage_size(), limit, obj, name, path, samples)
        value = obj.attrs[name]
        texts = value.ravel().tolist() if isinstance(value, np.ndarray) and value.dtype == object else [value]
        _attr_size(sum(len(t) for t in texts if isinstance(t, (str, bytes))), limit, obj, name, path, samples)


def _attr_size(size: int, limit: int, obj: Union[h5py.Group, h5py.Dataset], name: str, path: str, samples: int) -> None:
    if size > limit:
        raise invalid(path, f"attribute {name!r} of {obj.name} has {human_bytes(size)}, more than a mirror of "
                         f"{samples} samples holds ({human_bytes(limit)})")


def check_storage(ds: h5py.Dataset, path: PathLike, size: int) -> None:
    """Raise MirrorError unless ``ds`` is a plain array whose bytes lie inside the file (not external,
    virtual or chunked).
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
        raise invalid(path, f"dataset {ds.name} is {what}; every dataset of a mirror is a contiguous, unfiltered array")
    nbytes = int(np.prod(ds.shape, dtype=object)) * ds.dtype.itemsize
    if nbytes == 0:
        return
    offset = ds.id.get_offset()
    if offset is None or ds.id.get_storage_size() != nbytes:
        raise invalid(path, f"dataset {ds.name} declares {nbytes} bytes but has "
                         f"{ds.id.get_storage_size()} bytes of storage at offset {offset}")
    if offset + nbytes > size:
        raise invalid(path, f"dataset {ds.name} lies at bytes {offset}..{offset + nbytes}, outside the file "
                         f"({size} bytes; truncated?)")


