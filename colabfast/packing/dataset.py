"""Packing a map-style dataset (yours, a Hugging Face one, or a folder layout of
:mod:`colabfast.layouts`) into a mirror of typed columns (format version 3): :func:`pack_columns`.

``dataset[i]`` runs in worker processes (forked, as torch's DataLoader forks its workers), each
with a few threads, since a dataset's ``__getitem__`` usually waits on Drive; what it returns is
cut into fields (:mod:`colabfast.columns`), encoded there, and saved in resumable parts of
:data:`~colabfast.packing.common.CHUNK` samples, which are then assembled into the mirror, verified and
published as every mirror is.

Where a layout's images are kept as their files are (JPEGs, 8-bit RGB PNGs), their sizes are known
from the listing before any is read, so every image's place in the mirror is too: the mirror's
``images`` array is allocated first, and the workers write each part's images straight to their
place (:class:`_Direct`); assembling then writes only the indexes. Writing the images once instead
of twice, with a read between (part file, then mirror), took ``colabfast bench detection``'s pack of
2000 photos from 0.68 to 0.82 of the decode bound on 2 CPUs (``benchmarks/README.md``). Where a
size differs from the file's (an image re-encoded, a file changed, a sample skipped), the mirror is
assembled again from the parts and from what was written, as without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
import warnings
import zlib
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, Optional

import h5py
import numpy as np

import colabfast.packing.common as common
from colabfast import columns as col
from colabfast import env
from colabfast._fileio import PathLike, locked, partial_path, read_json, write_all, write_json_atomic
from colabfast.mirror import COLUMNS_VERSION, Header, MirrorError, load_columns, load_index, trust, write_array
from colabfast.packing.common import (
    PackError,
    PackRefused,
    _complete,
    _existing_mirror,
    _file_key,
    _InlineExecutor,
    _printable,
    _publish,
    _seal,
    _stopping,
    _version,
    _work_dir,
    _worker_start,
    lock_path,
)

__all__ = ["pack_columns", "plan", "make_parts", "assemble", "check_built", "header", "identity", "describe_dataset"]

THREADS = 8  # threads per worker process calling dataset[i]: they overlap a dataset's reads from Drive
ARRAY = "array"  # a field of arrays before packing decides: ndarray or ragged

_dataset: Any = None  # the dataset, in each worker process (inherited through fork, or sent once)


def pack_columns(src: Any, dst: PathLike, *, options: dict, workers: int, on_error: str, progress: bool,
                 overwrite: bool, layout: str, fields: Optional[dict], source: Optional[str] = None,
                 fingerprint: Optional[str] = None) -> Path:
    """:func:`colabfast.pack` for the map-style dataset ``src`` (a layout of :mod:`colabfast.layouts`
    is one): a mirror of columns, ``layout`` its name or ``"dataset"``; ``source`` and ``fingerprint``
    what the mirror records, where the caller knows better (an archive extracted to be packed).
    Returns ``dst`` as given. Raises what :func:`colabfast.pack` raises."""
    from colabfast.layouts.base import Layout

    dataset = src

    given = Path(os.path.abspath(dst))
    dst = Path(os.path.realpath(given))
    is_layout = isinstance(dataset, Layout)
    source = source or (_printable(str(dataset.root)) if is_layout else describe_dataset(dataset))
    work = _work_dir(dst)
    work.parent.mkdir(parents=True, exist_ok=True)
    with locked(lock_path(dst), f"packing into {dst}"):
        packed_from = _existing_mirror(dst, overwrite, "mirror")
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
        if not fingerprint.endswith("-anonymous") and _complete(dst, fingerprint):
            if progress:
                print(f"pack: {dst} is already a complete mirror of this dataset with these options")
            return given
        build = work / "mirror.h5" if env.is_fuse(dst.parent) else partial_path(dst)
        work.mkdir(parents=True, exist_ok=True)
        direct = _Direct.start(dataset, template, flds, options, work, build, fingerprint)
        part_paths, errors = make_parts(dataset, template, flds, options, work, workers, progress, fingerprint,
                                        direct)
        paths = list(dataset.paths) if is_layout else [str(i) for i in range(n)]
        failures = [(paths[i], e) for i, e in errors]
        skipped = [(_printable(p), e) for p, e in (dataset.skipped if is_layout else [])]
        if failures and on_error == "raise":
            raise PackError(failures)
        if failures:
            warnings.warn(f"pack: skipped {len(failures)} samples that failed, e.g. {failures[0][0]}: "
                          f"{failures[0][1]}", stacklevel=3)
        bad = {i for i, _ in errors}
        kept = np.array([i for i in range(n) if i not in bad], dtype=np.int64)
        head = header(layout, source, options, fingerprint, sorted(failures + skipped),
                         dataset.info if is_layout else None)
        build.parent.mkdir(parents=True, exist_ok=True)
        assemble(build, part_paths, flds, template, head, kept, [paths[i] for i in kept], direct)
        _seal(build)
        check_built(build, flds, len(kept))
        _publish(build, dst)
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
            h.update(_file_key(f))
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
    first = dataset[0]
    template, flds = col.template_of(first, fields)
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
    """The first image column of a layout whose images are kept as their files are, written by the
    workers straight into the mirror being built (see the module's docstring): its ``images`` array
    allocated in ``build`` at file offset ``base`` before any image is read, sample ``i``'s bytes at
    ``ends[i]..ends[i + 1]`` of it (int64 ``[n + 1]``, from the listed file sizes).

    Its plan is saved in the work folder (``direct.json``), so a run killed midway continues: the
    parts it finished are kept where their images in ``build`` still match their CRC-32s.
    """

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
               direct: Optional[_Direct] = None) -> tuple[list[Path], list[tuple[int, str]]]:
    """Run ``dataset[i]`` for every ``i`` in worker processes and save the encoded fields in parts
    (reusing the parts of an earlier, interrupted run with this ``fingerprint``); return the part
    paths in order and ``(index, error)`` of each sample that failed. With ``direct``, the workers
    write the images of its column into the mirror being built, where their sizes are as predicted."""
    from tqdm.auto import tqdm

    n = len(dataset)
    jobs = [(_part_path(work, k, fingerprint), range(k, min(n, k + common.CHUNK)))
            for k in range(0, n, common.CHUNK)]
    wanted = {p for p, _ in jobs}
    for stale in work.glob("*.npz"):
        if stale not in wanted:
            stale.unlink()
    errors: list[tuple[int, str]] = []
    todo = []
    for path, idx in jobs:
        done = _load(path, len(fields)) if path.exists() else None
        if done is not None and direct is None and _wrote_into_build(done):
            done = None  # its images went into a build that is not being continued
        if done is None:
            todo.append((path, idx))
        else:
            errors += [(int(i), str(e)) for i, e in done["errors"]]
    finished = n - sum(len(idx) for _, idx in todo)
    if finished and progress:
        print(f"pack: resuming: {finished} of {n} samples were packed by an earlier run")
    pool = _pool(dataset, workers)
    inflight: deque[tuple[Future, Path, range]] = deque()
    def finish(fut: Future, path: Path, idx: range) -> None:
        errors.extend((int(i), str(e)) for i, e in fut.result())  # the worker saved the part
        bar.update(len(idx))

    with _stopping(pool), tqdm(total=n, initial=finished, unit="sample", desc="pack", disable=not progress) as bar:
        for path, idx in todo:
            inflight.append((pool.submit(_encode_part, idx.start, idx.stop, template, fields, options, path,
                                         direct.place(idx.start, idx.stop) if direct is not None else None), path, idx))
            while len(inflight) > max(workers, 1):
                finish(*inflight.popleft())
        while inflight:
            finish(*inflight.popleft())
    return [p for p, _ in jobs], sorted(errors)


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
                 path: Path, place: Optional[tuple[str, int, int, np.ndarray]] = None) -> list[tuple[int, str]]:
    """Samples ``start..stop`` fetched (by threads), encoded and saved as the part at ``path`` (in the
    worker: only the failures travel back); runs in a worker process. Returns ``(index, error)`` of
    each sample that failed. With ``place`` (:meth:`_Direct.place`), the images of its column are
    written to the build at their place when every sample of the part is there with the predicted
    size (the part then records ``c{k}_direct``), else kept in the part.

    Raises:
        FieldError: a sample that does not fit the fields (a bug to fix, not a bad file to skip).
    """
    def one(i: int) -> tuple[Optional[list], str]:
        try:
            sample = _dataset[i]
        except col.FieldError:
            raise
        except Exception as exc:  # a bad file in a layout, or anything a dataset's own code raises
            return None, _why(exc)
        values = col.flatten(sample, template, fields, i)
        try:
            return [col.encode(v, f, i, options) for v, f in zip(values, fields)], ""
        except col.FieldError:
            raise
        except Exception as exc:  # PIL on an unreadable image file
            return None, _why(exc)

    with ThreadPoolExecutor(THREADS) as threads:
        results = list(threads.map(one, range(start, stop)))
    out: dict[str, Any] = {"errors": [(start + j, why) for j, (enc, why) in enumerate(results) if enc is None]}
    kept = [enc for enc, _ in results if enc is not None]
    out["kept"] = np.array([enc is not None for enc, _ in results], dtype=bool)
    for k, f in enumerate(fields):
        vals = [enc[k] for enc in kept]
        if f.kind in col.IMAGE_KINDS:
            blobs = [b for b, _ in vals]
            if place is not None and place[1] == k and not out["errors"] and \
                    np.array_equal(_ends([len(b) for b in blobs]), place[3] - place[3][0]):
                fd = os.open(place[0], os.O_WRONLY | os.O_CLOEXEC)
                try:
                    write_all(fd, memoryview(b"".join(blobs)), place[2] + int(place[3][0]))
                finally:
                    os.close(fd)
                out[f"c{k}_blob"], out[f"c{k}_direct"] = np.zeros(0, np.uint8), np.array(True)
            else:
                out[f"c{k}_blob"] = _blob(blobs)
            out[f"c{k}_offsets"] = _ends([len(b) for b in blobs])
            out[f"c{k}_shapes"] = np.array([s for _, s in vals], dtype=np.int32).reshape(-1, 3)
            out[f"c{k}_crc32"] = np.array([zlib.crc32(b) for b, _ in vals], dtype=np.uint32)
        elif f.kind in ("int", "float", "bool"):
            out[f"c{k}_values"] = np.array(vals, dtype={"int": np.int64, "float": np.float64, "bool": np.uint8}[f.kind])
        elif f.kind in ("str", "bytes", "json"):
            out[f"c{k}_blob"] = _blob(vals)
            out[f"c{k}_offsets"] = _ends([len(b) for b in vals])
        else:
            ndims = {v.ndim for v in vals}
            if len(ndims) > 1:
                raise col.FieldError(f"field {f.name!r} holds arrays of {sorted(ndims)} dimensions in samples "
                                     f"{start}..{stop - 1}: every sample's must have as many dimensions")
            out[f"c{k}_blob"] = _blob([np.ascontiguousarray(v).tobytes() for v in vals])
            ndim = ndims.pop() if ndims else 0
            out[f"c{k}_shapes"] = np.array([v.shape for v in vals], dtype=np.int64).reshape(len(vals), ndim)
    _save(path, out)
    return out["errors"]


def _blob(parts: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def _ends(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _save(path: Path, result: dict) -> None:
    tmp = partial_path(path)
    arrays = {k: v for k, v in result.items() if k != "errors"}
    with open(tmp, "wb") as f:
        np.savez(f, errors=np.array(json.dumps(result["errors"])), **arrays)
    os.replace(tmp, path)


def _load(path: Path, nfields: int, skip: tuple[str, ...] = ()) -> Optional[dict]:
    """A part's arrays (but those named in ``skip``: the image bytes, read when they are written)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in z.files if k not in skip}
    except (OSError, ValueError, KeyError, EOFError):
        return None
    out["errors"] = [tuple(e) for e in json.loads(str(out["errors"]))]
    if "kept" not in out:
        return None
    return out


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


def assemble(build: Path, part_paths: list[Path], fields: list[col.Field], template: dict, head: Header,
             order: np.ndarray, paths: list[str], direct: Optional[_Direct] = None) -> None:
    """Write the mirror of columns to ``build`` from the parts: every column but the images from the
    parts held in memory (numbers, arrays, text: small), then the images part by part, each written at
    its place in the file (the ``images`` datasets are allocated first, contiguous, at a fixed offset),
    so memory holds one part's images at a time, not the dataset's.

    With ``direct``, where every part's images of its column are in ``build`` already, only the rest
    is written there; else a new file is written (those images read from ``build``) and replaces it.
    """
    blobs = tuple(f"c{k}_blob" for k, f in enumerate(fields) if f.kind in col.IMAGE_KINDS)
    loaded = [_load(p, len(fields), skip=blobs) for p in part_paths]
    parts = [p for p in loaded if p is not None]
    if len(parts) != len(loaded):
        raise MirrorError(f"a part in {part_paths[0].parent} is unreadable though it was just written: run pack() "
                          "again")
    decide(fields, parts)
    head.columns = {"template": template, "fields": [f.spec() for f in fields]}
    head.version = COLUMNS_VERSION
    written = {i for i, p in enumerate(parts) if direct is not None and p.get(f"c{direct.column}_direct", False)}
    in_place = direct is not None and len(written) == len(parts) and direct.pristine()
    target = build if direct is None or in_place else part_paths[0].parent / "rebuild.h5"
    places: list[tuple[int, int]] = []  # (column, file offset of its images), to be written
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
            images = _write_column(c, k, f, parts, c["images"] if there else None)
            if images is not None and not there:
                places.append((k, int(images.id.get_offset() or 0)))
    fd = os.open(target, os.O_WRONLY)
    src = os.open(build, os.O_RDONLY) if target != build else -1
    try:
        for k, base in places:
            for i, path in enumerate(part_paths):
                if direct is not None and k == direct.column and i in written:  # in build, not in the part
                    offset, length = direct.span(i * common.CHUNK, len(parts[i][f"c{k}_crc32"]))
                    blob = os.pread(src, length, offset)
                    if len(blob) != length:
                        raise MirrorError(f"{build} ended early while the mirror was assembled: run pack() again")
                else:
                    with np.load(path, allow_pickle=False) as z:
                        blob = z[f"c{k}_blob"]
                write_all(fd, memoryview(blob), base)
                base += len(blob)
        os.fsync(fd)
    finally:
        os.close(fd)
        if src >= 0:
            os.close(src)
    if target != build:
        os.replace(target, build)


def _allocate(c: h5py.Group, nbytes: int) -> h5py.Dataset:
    """An ``images`` array of ``nbytes`` in group ``c``: contiguous, unfiltered, allocated now and never
    filled (so it takes no disk until written): its place in the file is fixed before the images are
    written there."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return c.create_dataset("images", shape=(nbytes,), dtype=np.uint8, dcpl=dcpl)


def _write_column(c: h5py.Group, k: int, f: col.Field, parts: list[dict],
                  images: Optional[h5py.Dataset] = None) -> Optional[h5py.Dataset]:
    """Write column ``k`` into group ``c``; an image column's ``images`` is only allocated (returned),
    or, given, checked to be as large as the parts' images."""
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
    elif f.kind in ("int", "float", "bool"):
        write_array(c, "values", joined(f"c{k}_values").astype({"int": "<i8", "float": "<f8", "bool": "u1"}[f.kind]))
    elif f.kind in ("str", "bytes", "json"):
        write_array(c, "data", joined(f"c{k}_blob").astype(np.uint8))
        write_array(c, "offsets", offsets())
    else:
        dtype = np.dtype("u1" if f.dtype == "bool" else (f.dtype if f.dtype and f.dtype[0] in "<>|" else
                                                           _torch_dtype(f.dtype)))
        flat = np.frombuffer(joined(f"c{k}_blob").astype(np.uint8).tobytes(), dtype=dtype)
        shapes = np.concatenate([p[f"c{k}_shapes"] for p in parts])
        trail = tuple(f.shape or [])
        if f.kind == "ndarray":
            write_array(c, "values", flat.reshape(len(shapes), *trail))
        elif "ndim" in f.meta:  # every sample's own shape: values flat, offsets in elements
            write_array(c, "values", flat)
            write_array(c, "offsets", _ends(np.prod(shapes, axis=1).tolist() if len(shapes) else []))
            write_array(c, "shapes", shapes.astype(np.int64))
        else:
            write_array(c, "values", flat.reshape(-1, *trail))
            write_array(c, "offsets", _ends(shapes[:, 0].tolist() if len(shapes) else []))
    return None


def _torch_dtype(name: Optional[str]) -> str:
    """The NumPy dtype string of a torch dtype's name (``"float32"`` -> ``"<f4"``)."""
    if name == "bool":
        return "u1"
    return np.dtype(name).str


def check_built(build: Path, fields: list[col.Field], n: int) -> None:
    """Reopen ``build`` and read every column back (lengths, offsets, checksums) before it is published."""
    head, count, _ = load_columns(build)
    if count != n:
        raise MirrorError(f"{build}: {count} samples written, {n} expected (disk error?); run pack() again")
    for k, f in enumerate(fields):
        if f.kind in col.IMAGE_KINDS:
            load_index(build, "", k)


def header(layout: str, source: str, options: dict, fingerprint: str, skipped: list[tuple[str, str]],
           info: Optional[dict]) -> Header:
    classes = info.get("classes") if info and isinstance(info.get("classes"), list) else None
    return Header(layout=layout, store=options["store"], classes=classes, image_size=options["image_size"],
                  quality=options["quality"], shuffled=False, seed=None, fingerprint=fingerprint,
                  skipped=[{"path": p, "error": e} for p, e in skipped], source=source,
                  created=datetime.now(timezone.utc).isoformat(timespec="seconds"), colabfast_version=_version(),
                  layout_info=info, version=COLUMNS_VERSION)
