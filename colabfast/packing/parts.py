"""One part of a dataset's samples encoded in a pack worker: :func:`_encode_part` reads ``dataset[i]``
in threads, encodes each field, and saves the part to a file beside the mirror.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import tempfile
import warnings
import zipfile
import zlib
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Iterator, Optional

import numpy as np

from colabfast.errors import MirrorError
from colabfast.mirror import columns as col
from colabfast.packing.common import (
    _InlineExecutor,
    _worker_start,
)
from colabfast.where._fileio import partial_path, write_all

__all__: list[str] = []  # internal to colabfast.packing: nothing here is public

THREADS = 8  # threads per worker process calling dataset[i]: they overlap a dataset's reads from Drive
IN_FLIGHT = 128 << 20  # bytes of samples a worker holds at once: fewer at a time where samples are large
SPOOL = 64 << 20  # bytes of a part's encoded values kept in memory; past that they go to a file beside it
PIECE = 16 << 20  # bytes copied at a time from a part into the mirror
ARRAY = "array"  # a field of arrays before packing decides: ndarray or ragged

_dataset: Any = None  # the dataset, in each worker process (inherited through fork, or sent once)


def _pool(dataset: Any, workers: int) -> Executor:
    """Worker processes holding ``dataset`` (inherited through fork; sent pickled once where only spawn
    exists), or this process for ``workers=0``."""
    global _dataset
    if workers <= 0:
        _dataset = dataset
        return _InlineExecutor()
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    _dataset = dataset
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_start,
                               initargs=(os.getpid(), None if method == "fork" else dataset))
    with warnings.catch_warnings():  # Python 3.12 warns about fork in any multi-threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pool.submit(int).result()
    return pool


def _start(parent: int, dataset: Any) -> None:
    global _dataset
    if dataset is not None:
        _dataset = dataset
    _worker_start(parent)


def _encode_part(start: int, stop: int, template: dict, fields: list[col.Field], options: dict,
                 path: Path, place: Optional[tuple[str, int, int, np.ndarray]] = None
                 ) -> tuple[list[tuple[int, str]], Optional[int]]:
    """In a worker: samples ``start..stop`` fetched by threads (at most :data:`IN_FLIGHT` bytes), encoded via
    spools (:data:`SPOOL`) and saved as the part at ``path``; with ``place``, its column's images written to the
    build where all sizes match. Returns the failures and the first index raising IndexError (or None).
    Raises FieldError: a sample that does not fit the fields."""
    def one(i: int) -> tuple[Optional[list], str, bool]:
        try:
            sample = _dataset[i]
        except col.FieldError:
            raise
        except IndexError:
            return None, "", True
        except Exception as exc:  # a bad file in a layout, or anything a dataset's own code raises
            return None, _why(exc), False
        values = col.flatten(sample, template, fields, i)
        try:  # each value encoded, and whether it was a None (stored as its placeholder)
            return [(col.encode(v, f, i, options), v is None and f.kind in col.NULLABLE)
                    for v, f in zip(values, fields)], "", False
        except col.FieldError:
            raise
        except Exception as exc:  # PIL on an unreadable image file
            return None, _why(exc), False

    blobs = [k for k, f in enumerate(fields) if f.kind in col.IMAGE_KINDS or f.kind in ("str", "bytes", "json")
             or f.kind == ARRAY]
    keep = max(1 << 20, SPOOL // max(1, len(blobs)))
    spools = {k: _Spool(keep, path.parent) for k in blobs}
    lengths: dict[int, list[int]] = {k: [] for k in blobs}
    shapes: dict[int, list] = {k: [] for k, f in enumerate(fields) if f.kind in col.IMAGE_KINDS or f.kind == ARRAY}
    crcs: dict[int, list[int]] = {k: [] for k, f in enumerate(fields) if f.kind in col.IMAGE_KINDS}
    scalars: dict[int, list] = {k: [] for k, f in enumerate(fields) if f.kind in ("int", "float", "bool")}
    marks: dict[str, dict[int, list[bool]]] = {"nulls": {k: [] for k, f in enumerate(fields) if f.kind in col.NULLABLE},
                                               "formats": {k: [] for k in crcs}}
    errors: list[tuple[int, str]] = []
    kept = np.zeros(stop - start, dtype=bool)

    def take(j: int, enc: list) -> int:
        """Sample ``j``'s encoded values into the columns; returns the bytes it held."""
        kept[j - start] = True
        size = 0
        for k, (f, (v, null)) in enumerate(zip(fields, enc)):
            if k in marks["nulls"]:
                marks["nulls"][k].append(null)
            if f.kind in col.IMAGE_KINDS:
                blob, shape, own = v
                marks["formats"][k].append(own)
                spools[k].write(blob)
                lengths[k].append(len(blob))
                shapes[k].append(shape)
                crcs[k].append(zlib.crc32(blob))
                size += max(len(blob), int(np.prod(shape)))  # its decoded pixels were held too
            elif k in scalars:
                scalars[k].append(v)
            elif f.kind in ("str", "bytes", "json"):
                spools[k].write(v)
                lengths[k].append(len(v))
                size += len(v)
            else:
                arr = np.ascontiguousarray(v)
                spools[k].write(arr.reshape(-1).view(np.uint8))  # no copy of the array
                lengths[k].append(arr.nbytes)
                shapes[k].append(arr.shape)
                size += arr.nbytes
        return size

    end: Optional[int] = None
    largest = 0  # bytes of the largest sample seen (1 once any was fetched): how many may be fetched at once
    try:
        with ThreadPoolExecutor(THREADS) as threads:
            pending: deque[tuple[int, Future]] = deque()
            i = start
            while i < stop and end is None or pending:
                # one sample at a time until one is seen, then as many as IN_FLIGHT holds of the largest
                window = max(1, min(2 * THREADS, IN_FLIGHT // largest)) if largest else 1
                while i < stop and end is None and len(pending) < window:
                    pending.append((i, threads.submit(one, i)))
                    i += 1
                j, fut = pending.popleft()
                enc, why, ended = fut.result()
                del fut  # it holds the sample too
                largest = max(largest, 1)
                if end is not None:
                    continue  # fetched while the end was not yet known
                if ended:
                    end = j
                elif enc is None:
                    errors.append((j, why))
                else:
                    largest = max(largest, take(j, enc))
                del enc  # the sample's memory, before the next is awaited
        arrays: dict[str, np.ndarray] = {"kept": kept, "end": np.array(-1 if end is None else end, dtype=np.int64)}
        for name, flags in marks.items():  # saved only where set: assemble() takes a part without them as all 0
            arrays.update({f"c{k}_{name}": np.array(v, dtype=np.uint8) for k, v in flags.items() if any(v)})
        for k, f in enumerate(fields):
            if f.kind in col.IMAGE_KINDS:
                ends = _ends(lengths[k])
                if place is not None and place[1] == k and not errors and end is None and \
                        np.array_equal(ends, place[3] - place[3][0]):
                    fd = os.open(place[0], os.O_WRONLY | os.O_CLOEXEC)
                    try:
                        at = place[2] + int(place[3][0])
                        for piece in _pieces(spools[k]):
                            write_all(fd, piece, at)
                            at += len(piece)
                    finally:
                        os.close(fd)
                    spools.pop(k).close()
                    spools[k] = _Spool(0, path.parent)  # the part keeps none of them
                    arrays[f"c{k}_direct"] = np.array(True)
                arrays[f"c{k}_offsets"] = ends
                arrays[f"c{k}_shapes"] = np.array(shapes[k], dtype=np.int32).reshape(-1, 3)
                arrays[f"c{k}_crc32"] = np.array(crcs[k], dtype=np.uint32)
            elif k in scalars:
                arrays[f"c{k}_values"] = np.array(scalars[k], dtype={"int": np.int64, "float": np.float64,
                                                                      "bool": np.uint8}[f.kind])
            elif f.kind in ("str", "bytes", "json"):
                arrays[f"c{k}_offsets"] = _ends(lengths[k])
            else:
                ndims = {len(shape) for shape in shapes[k]}
                if len(ndims) > 1:
                    raise col.FieldError(f"field {f.name!r} holds arrays of {sorted(ndims)} dimensions in samples "
                                         f"{start}..{stop - 1}: every sample's must have as many dimensions")
                ndim = ndims.pop() if ndims else 0
                arrays[f"c{k}_shapes"] = np.array(shapes[k], dtype=np.int64).reshape(len(shapes[k]), ndim)
        _save(path, errors, arrays, {f"c{k}_blob": spool for k, spool in spools.items()})
    finally:
        for spool in spools.values():
            spool.close()
    return errors, end


class _Spool:
    """Bytes appended in memory up to ``keep`` bytes, then in an unnamed file in ``folder``: moved there
    before a write that would pass ``keep`` (``tempfile.SpooledTemporaryFile`` moves after it, so a
    300 MB array was copied into memory whole first)."""

    def __init__(self, keep: int, folder: Path) -> None:
        self.keep, self.folder = keep, folder
        self.file: IO[bytes] = io.BytesIO()
        self.size = 0

    def write(self, data: Any) -> None:
        n = memoryview(data).nbytes
        if isinstance(self.file, io.BytesIO) and self.size + n > self.keep:
            disk = tempfile.TemporaryFile(dir=self.folder)
            disk.write(self.file.getbuffer())
            self.file.close()
            self.file = disk
        self.file.write(data)
        self.size += n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.file.seek(offset, whence)

    def read(self, n: int) -> bytes:
        return self.file.read(n)

    def close(self) -> None:
        self.file.close()


def _pieces(spool: Any) -> Iterator[bytes]:
    """What was written to ``spool``, from its start, :data:`PIECE` bytes at a time."""
    spool.seek(0)
    while piece := spool.read(PIECE):
        yield piece


def _ends(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _save(path: Path, errors: list, arrays: dict[str, np.ndarray], blobs: dict[str, _Spool]) -> None:
    """Write a part: an ``.npz`` (what ``np.savez`` writes: uncompressed ``.npy`` members) of ``arrays``,
    the ``errors`` as JSON, and each of ``blobs`` (spooled bytes) as a uint8 array copied a piece at a
    time, so no part is ever held whole in memory. Written under a temporary name, then renamed."""
    tmp = partial_path(path)
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        for key, value in {"errors": np.array(json.dumps(errors)), **arrays}.items():
            with z.open(f"{key}.npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(value), allow_pickle=False)
        for key, spool in blobs.items():
            size = spool.seek(0, os.SEEK_END)
            with z.open(f"{key}.npy", "w", force_zip64=True) as out:
                np.lib.format.write_array_header_1_0(out, {"descr": "|u1", "fortran_order": False, "shape": (size,)})
                for piece in _pieces(spool):
                    out.write(piece)
    os.replace(tmp, path)


def _load(path: Path, nfields: int) -> Optional[dict]:
    """A part's arrays but its bytes (``c{k}_blob``: read a piece at a time when they are written,
    :func:`_blob_pieces`), or None where it is unreadable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in z.files if not k.endswith("_blob")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    out["errors"] = [tuple(e) for e in json.loads(str(out["errors"]))]
    if "kept" not in out:
        return None
    return out


def _blob_pieces(path: Path, key: str) -> Iterator[bytes]:
    """The bytes of a part's uint8 array ``key`` (:func:`_save`), :data:`PIECE` at a time; MirrorError
    where the part is not what :func:`_save` wrote."""
    try:
        with zipfile.ZipFile(path) as z, z.open(f"{key}.npy") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(f)
            if dtype != np.uint8 or len(shape) != 1:
                raise ValueError(f"{key} is {dtype} {list(shape)}, not bytes")
            left = int(shape[0])
            while left:
                piece = f.read(min(left, PIECE))
                if not piece:
                    raise ValueError(f"{key} ends {left} bytes early")
                left -= len(piece)
                yield piece
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise MirrorError(f"the part {path} is unreadable though it was just written ({exc}): run pack() again") \
            from None


