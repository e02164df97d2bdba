"""Pack a dataset of many small image files into one HDF5 mirror: :func:`pack`.

One big file is what Drive serves well (tens of MB/s) and what a DataLoader reads fastest. The
format is described in :mod:`colabfast.mirror`. Packing runs in resumable parts: images are read
by a thread pool (overlapping Drive's round trips), decoded/checked/re-encoded by worker processes,
and saved as part files named by what went into them; the mirror is then assembled locally,
verified, and moved into place atomically (copied there first when the destination is on Drive).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import stat
import warnings
import zlib
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import h5py
import numpy as np
from PIL import UnidentifiedImageError

from colabfast import env
from colabfast._fileio import (
    FileEntry,
    PathLike,
    human_bytes,
    locked,
    partial_path,
    read_regular,
    retry,
    state_name,
    write_all,
)
from colabfast.archive import archive_suffix
from colabfast.archivesource import ArchiveSource, Position
from colabfast.encoding import encode_image, resized_size
from colabfast.errors import Error
from colabfast.mirror import (
    STORES,
    Header,
    MirrorError,
    check,
    open_h5,
    trust,
    write_array,
)
from colabfast.sources import Source, Split, read_source

__all__ = ["pack", "PackError", "resized_size"]

CHUNK = 256  # samples per part file: the unit of parallel work and of resuming
PIECE = 32  # images per task sent to a worker when packing an archive stream


class PackError(Error, ValueError):
    """Source images (or folders) could not be read or decoded; nothing final was written.

    Attributes:
        failures: ``(path, error message)`` for every bad file.
    """

    def __init__(self, failures: list[tuple[str, str]]):
        self.failures = failures
        shown = "".join(f"\n  {p}: {e}" for p, e in failures[:20])
        more = f"\n  ... and {len(failures) - 20} more" if len(failures) > 20 else ""
        super().__init__(
            f"{len(failures)} source files or folders cannot be read:{shown}{more}\n"
            "Nothing was written to the destination. Fix or delete them and run pack() again "
            "(the images already processed are kept and reused), or pass on_error='skip' to leave them out."
        )


def pack(
    src: Any,
    dst: PathLike,
    *,
    fields: Optional[dict] = None,
    layout: str = "auto",
    labels: Optional[PathLike] = None,
    split: Optional[str] = None,
    store: str = "encoded",
    image_size: Union[int, tuple[int, int], None] = None,
    quality: int = 90,
    shuffle: bool = False,
    seed: int = 0,
    workers: Optional[int] = None,
    on_error: str = "raise",
    retries: int = 5,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Pack a dataset (a folder, an archive read as a stream, or any map-style dataset) into one HDF5
    mirror at ``dst``.

    **Any map-style dataset** (an object with ``__len__`` and ``__getitem__``: yours, a torchvision
    dataset, a Hugging Face ``datasets.Dataset``) is packed sample by sample into typed columns
    (:mod:`colabfast.columns`, format version 3): whatever ``dataset[i]`` returns (a tuple, a dict,
    or one value, made of PIL images, image tensors/arrays, ``tv_tensors``, numbers, strings, bytes,
    arrays and JSON-like lists) comes back from :class:`colabfast.H5Dataset` as it was returned,
    losslessly: a PIL image opened from a JPEG file and left unchanged keeps that file's bytes, any
    other image is stored as PNG unless ``fields`` asks for JPEG (FFCV's ``jpg`` mode). ``dataset[i]``
    runs in ``workers`` forked processes of 8 threads each (it usually waits on Drive), as a
    DataLoader's workers run it. A sample that does not fit the columns of sample 0 (a new key, another
    dtype) is a :class:`colabfast.columns.FieldError` naming the index and field. Resuming an
    interrupted run reuses its finished parts; a finished mirror is reused only for a dataset that
    says what it holds (a layout's files, a Hugging Face ``_fingerprint``, or a ``fingerprint``
    attribute of yours), any other dataset is packed again.

    **Folder layouts** (:mod:`colabfast.layouts`) are read as such datasets, with no code to write:
    ``"coco"`` (``labels=`` the annotation JSON, as ``torchvision.datasets.CocoDetection(root,
    annFile)``; Roboflow's ``_annotations.coco.json`` is found), ``"voc-detection"`` and
    ``"voc-segmentation"`` (a ``VOCdevkit`` tree; ``split=`` the image set), ``"yolo"`` (Ultralytics
    and Roboflow exports; ``split=``), ``"segmentation"`` (``images/`` and ``masks/`` paired by
    name) and ``"csv"`` (``labels=`` the table). ``"auto"`` detects them (a VOC tree with both image
    sets as detection; csv where one table lies at the top of a folder of images), or ``labels=``
    a ``.json`` (coco) or ``.csv``.

    ``dst`` is written over only when it is a mirror of the same source: re-running with the same
    options returns at once, with other options it is rebuilt. Any other file there (yours, or a mirror
    of another source) is refused before anything is read, unless ``overwrite=True``; a folder always
    is. An interrupted run resumes from the parts it finished (kept beside ``dst``, or in the local work
    folder when ``dst`` is on Drive), or from its verified local mirror when it was killed while
    copying it onto Drive. One pack at a time writes to a destination, however its path is spelled
    (links resolved): a second call waits for the first (a lock file in colabfast's cache folder),
    saying so.

    Archives (``.tar``, ``.tar.gz``/``.tgz``/``.tar.bz2``/``.tar.xz``, ``.zip``) are never extracted:
    they are read front to back in one sequential stream (what Drive serves best), inner per-class
    tars are opened as they are met, and images are decoded and resized in the worker processes while
    the next bytes arrive; local disk holds only the mirror being built (its parts move into it one
    by one: at most the mirror and one part, measured by ``colabfast bench pack``). This is how ImageNet's
    official archives (``ILSVRC2012_img_train.tar``: a tar of per-class tars; ``ILSVRC2012_img_val.tar``
    with ``labels=`` the devkit), Kaggle's ``imagenet-object-localization-challenge.zip`` (``split=``
    ``"train"`` or ``"val"``) and a tar/zip of an ImageFolder tree are packed. Classes, targets and sample
    order are ``torchvision.datasets.ImageNet``'s (resp. ``ImageFolder``'s); ``classes`` holds the
    WordNet ids (torchvision's ``wnids``) and the mirror records the class names and where the labels
    came from (``colabfast info`` prints it). A stream resumes from the archive member its last
    finished part reached.

    Args:
        src: the dataset folder or archive, a map-style dataset, or for ``layout="files"`` a list of
            image paths or ``(path, label)`` pairs.
        dst: the mirror file to write, e.g. ``/content/drive/MyDrive/kitti.h5``.
        fields: for a dataset or layout: the column kind or image encoding of fields by name (a
            dict key, a tuple position as ``"0"``, nested as ``"1.boxes"``), e.g. ``{"image":
            "jpeg"}`` (lossy, at ``quality``), ``{"0": "png"}``, ``{"label": "mask"}``.
        layout: for a folder: ``"imagefolder"`` (torchvision ImageFolder: one sub-folder per class,
            ImageNet's ``train/`` and class-folder ``val/``), ``"kitti"`` (``training/image_2`` +
            ``label_2`` (+ ``calib``) and/or ``testing/image_2``), ``"files"``; for an archive: one of
            :data:`colabfast.archivesource.LAYOUTS`; or ``"auto"`` (detected, and printed when
            ``progress``). Folders are followed through links as torchvision does, also links that
            leave ``src``, but not a link back to a folder it is in (a loop). Hidden files and folders
            are left out (torchvision would take macOS's ``._x.jpg`` files and ``.ipynb_checkpoints``
            for data, and ``.ipynb_checkpoints`` beside the class folders for a class): pack warns,
            and the mirror lists each one and why (``colabfast info``).
        labels: ImageNet's devkit ``ILSVRC2012_devkit_t12.tar.gz`` for ``ILSVRC2012_img_val.tar``
            (validation labels; for the training archive, class names only).
        split: ``"train"`` or ``"val"``: the part of Kaggle's ImageNet zip to pack (default train).
        store: ``"encoded"`` keeps each image's encoded bytes (smallest; decoded when loaded);
            ``"raw"`` stores decoded uint8 RGB pixels (no decoding at load time; ~5-10x larger).
        image_size: resize at pack time, as ``torchvision.transforms.Resize(image_size)`` does on a
            PIL image (bilinear, antialiased): an int sets the short side, ``(H, W)`` the exact
            size. With ``store="encoded"`` the result is re-encoded as JPEG at ``quality``. This is
            how ImageNet fits Colab's disk (short side 256: roughly 10-25 GB).
        quality: JPEG quality (1-100) for re-encoded images.
        shuffle: store the samples in a random order (seeded by ``seed``) so that reading the file
            sequentially yields shuffled samples (tensorpack's trick for cold storage); the
            ``order`` dataset maps each stored sample back to its source index. Not for archives:
            they are stored in the archive's order, ``order`` giving each sample's torchvision index.
        seed: the shuffle's seed.
        workers: processes decoding images (default: the CPU count; 0 decodes in this process).
        on_error: unreadable files (truncated, empty, not an image, not a regular file) and folders
            that cannot be listed: ``"raise"`` lists every one in a :class:`PackError` and writes
            nothing final (folders before any image is read); ``"skip"`` packs the rest, warns, and
            records what it skipped in the mirror (``colabfast info`` lists them).
        retries: retries of each read for transient mount errors (EIO, ENOTCONN, ...), as ``stage()``.
        progress: show a tqdm progress bar (images/s; for an archive, its bytes read, the images packed
            and the time left) and say which layout was detected.
        overwrite: replace whatever file is at ``dst`` (by default only a mirror of the same source is
            replaced).

    Returns:
        ``dst`` as a Path.

    Raises:
        PackError: unreadable images or folders with ``on_error="raise"``.
        ArchiveReadError: the archive is truncated or corrupt at the member it names; the finished
            parts are kept and the next run continues from them.
        UnsafeArchiveError: an archive member name is absolute or climbs out with ``..``.
        FileNotFoundError: ``src`` is missing or holds no images.
        ValueError: bad arguments; ``dst`` is a folder, or (without ``overwrite``) a file that is not a
            mirror of ``src``.
        OSError: ``errno.ENOSPC`` when the local disk cannot hold the mirror while it is built.
    """
    if store not in STORES:
        raise ValueError(f"store must be 'encoded' or 'raw', not {store!r}")
    column_layout = _column_layout(src, layout, labels)
    if column_layout is not None or _is_dataset(src):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if not 1 <= quality <= 100:
            raise ValueError(f"quality must be 1..100, not {quality}")
        if shuffle:
            raise ValueError("shuffle=True is for folders of images; a mirror of a dataset keeps its order (a "
                             "loader's random sampler shuffles it)")
        if store != "encoded":
            raise ValueError("store='raw' is for folders of images; a mirror of a dataset stores its images "
                             "encoded (PNG, or the JPEG files' own bytes)")
        from colabfast.hf import packable

        dataset = packable(src) if column_layout is None else _open_layout(src, column_layout, labels, split,
                                                                            on_error, retries)
        return _pack_columns(dataset, dst, column_layout or "dataset", fields,
                             _options(store, _check_size(image_size), quality),
                             env.cpu_count() if workers is None else workers, on_error, progress, overwrite)
    if fields is not None:
        raise ValueError("fields= is for packing a dataset or a layout of colabfast.layouts")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality must be 1..100, not {quality}")
    image_size = _check_size(image_size)  # type: ignore[assignment]  # (H, W) becomes a list: JSON-equal on resume
    given = Path(os.path.abspath(dst))
    dst = Path(os.path.realpath(given))  # one lock and one work folder, however the path is spelled
    workers = env.cpu_count() if workers is None else workers
    options = _options(store, image_size, quality)
    path = os.fspath(src) if isinstance(src, (str, os.PathLike)) else ""
    streamed = archive_suffix(path) is not None and not os.path.isdir(path)
    if streamed and not os.path.isfile(path):
        raise FileNotFoundError(f"no archive at {os.path.abspath(path)}: check the path (on Drive: "
                                "/content/drive/MyDrive/...)")
    if streamed and shuffle:
        raise ValueError("shuffle=True is not available when packing from an archive: the mirror keeps the "
                         "archive's order (a loader's random sampler shuffles it)")
    if not streamed and (labels is not None or split is not None):
        raise ValueError("labels= and split= are for packing from an archive (ImageNet's devkit, Kaggle's zip)")

    work = _work_dir(dst)
    work.parent.mkdir(parents=True, exist_ok=True)
    # Two packs into one destination would delete each other's parts and publish a mix (seen in 2 of
    # 9 concurrent runs): the second waits for the first, saying so.
    with locked(lock_path(dst), f"packing into {dst}"):
        packed_from = _existing_mirror(dst, overwrite, Path(path).name.split(".")[0] or "mirror")
        fingerprint, archive, listed, orders = _listing(path if streamed else src, streamed, options, layout, labels,
                                                        split, shuffle, seed, retries)
        if archive is not None:
            what, described = "archive", f"{archive.path}: {archive.describe()}"
        else:
            assert listed is not None
            source = listed
            what, described = "source", f"{source.root}: {source.describe()}"
        if packed_from is not None:
            _check_same_source(dst, packed_from, archive.path if archive is not None else source.root)
        described = _printable(described)
        if progress:
            print(f"pack: {described}")
        if _complete(dst, fingerprint):
            if progress:
                print(f"pack: {dst} is already a complete mirror of this {what} with these options")
            return given
        build = work / "mirror.h5" if env.is_fuse(dst.parent) else partial_path(dst)
        work.mkdir(parents=True, exist_ok=True)
        if not _complete(build, fingerprint) and not _resume_assembly(build, work, fingerprint):
            if archive is not None:
                _preflight_archive(archive.path, work, store, image_size)
                source, orders, parts = _stream_parts(archive, options, work, workers, progress)
            else:
                if source.unreadable and on_error == "raise":  # before any work, not after it
                    raise PackError([(_printable(p), e) for p, e in source.unreadable])
                _preflight(source, work, store, image_size)
                parts = _make_parts(source, orders, options, work, workers, progress, retries)
            _build(build, work, source, orders, parts, fingerprint, on_error, shuffle, seed, options, archive)
        _publish(build, dst)
        trust(dst)  # opening what we just wrote needs no check in a child process
        shutil.rmtree(work, ignore_errors=True)
    return given


def _is_dataset(src: Any) -> bool:
    """A map-style dataset (not a path, not a list of paths for layout "files")."""
    return (not isinstance(src, (str, os.PathLike, list, tuple)) and hasattr(src, "__getitem__")
            and hasattr(src, "__len__"))


def _column_layout(src: Any, layout: str, labels: Optional[PathLike] = None) -> Optional[str]:
    """The :mod:`colabfast.layouts` layout ``src`` is packed as (given, or detected for ``"auto"``), or None."""
    from colabfast.layouts import LAYOUTS

    if layout in LAYOUTS:
        return layout
    if layout != "auto" or not isinstance(src, (str, os.PathLike)) or not os.path.isdir(src):
        return None
    if labels is not None and str(labels).lower().endswith((".json", ".csv")):
        return "coco" if str(labels).lower().endswith(".json") else "csv"
    root = Path(os.path.abspath(src))
    return next((name for name, cls in LAYOUTS.items() if cls.detect(root)), None)


def _open_layout(src: Any, layout: str, labels: Optional[PathLike], split: Optional[str], on_error: str,
                 retries: int) -> Any:
    from colabfast.layouts import LAYOUTS

    if not isinstance(src, (str, os.PathLike)) or not os.path.isdir(src):
        raise FileNotFoundError(f"layout {layout!r} reads a folder, and {src!r} is not one")
    kwargs: dict[str, Any] = {"on_error": on_error, "retries": retries}
    if labels is not None:
        kwargs["labels"] = labels
    if split is not None:
        kwargs["split"] = split
    try:
        return LAYOUTS[layout](Path(os.path.abspath(src)), **kwargs)  # type: ignore[call-arg]
    except TypeError as exc:
        raise ValueError(f"layout {layout!r} does not take these arguments ({exc})") from None


def _pack_columns(dataset: Any, dst: PathLike, layout: str, fields: Optional[dict], options: dict, workers: int,
                  on_error: str, progress: bool, overwrite: bool) -> Path:
    """:func:`pack` for a map-style dataset or a layout: a mirror of columns (see
    :mod:`colabfast.packing.dataset`)."""
    from colabfast.layouts.base import Layout
    from colabfast.packing import dataset as ds

    given = Path(os.path.abspath(dst))
    dst = Path(os.path.realpath(given))
    is_layout = isinstance(dataset, Layout)
    source = _printable(str(dataset.root)) if is_layout else ds.describe_dataset(dataset)
    work = _work_dir(dst)
    work.parent.mkdir(parents=True, exist_ok=True)
    with locked(lock_path(dst), f"packing into {dst}"):
        packed_from = _existing_mirror(dst, overwrite, "mirror")
        if packed_from is not None and packed_from != source:
            raise ValueError(f"{dst} is a mirror of {packed_from}, not of {source}: packing would replace it, so "
                             "nothing was written. Pass another dst, or overwrite=True to replace it.")
        template, flds, fingerprint = ds.plan(dataset, fields, options, layout)
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
        part_paths, errors = ds.make_parts(dataset, template, flds, options, work, workers, progress, fingerprint)
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
        head = ds.header(layout, source, options, fingerprint, sorted(failures + skipped),
                         dataset.info if is_layout else None)
        build.parent.mkdir(parents=True, exist_ok=True)
        ds.assemble(build, part_paths, flds, template, head, kept, [paths[i] for i in kept])
        _seal(build)
        ds.check_built(build, flds, len(kept))
        _publish(build, dst)
        trust(dst)
        shutil.rmtree(work, ignore_errors=True)
    return given


def _existing_mirror(dst: Path, overwrite: bool, name: str) -> Optional[str]:
    """The source of the mirror at ``dst``, or None when nothing is there (or ``overwrite``); refuses a
    folder, a special file, and (without ``overwrite``) a file that is not a colabfast mirror. Called
    before anything is read, so that a wrong ``dst`` costs nothing."""
    try:
        mode = os.stat(dst).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{dst} is a folder: pack writes one mirror file. Pass a file name, e.g. "
                         f"{dst / (name + '.h5')}")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{dst} is not a regular file (a pipe or a device): pass a mirror file name as dst")
    if overwrite:
        return None
    try:
        with open_h5(dst) as f:
            return Header.read(f, dst, complete=False).source
    except (MirrorError, OSError):
        raise ValueError(f"{dst} exists and is not a readable colabfast mirror: packing would replace it, so nothing "
                         "was read. Pass another dst, or overwrite=True to replace it.") from None


def _check_same_source(dst: Path, packed_from: str, root: Path) -> None:
    """Refuse to replace a mirror of another source (see :func:`pack`'s ``overwrite``)."""
    if packed_from != _printable(str(root)) and os.path.realpath(packed_from) != os.path.realpath(root):
        raise ValueError(f"{dst} is a mirror of {packed_from}, not of {root}: packing would replace it, so "
                         "nothing was written. Pass another dst, or overwrite=True to replace it.")


def _build(build: Path, work: Path, source: Source, orders: dict[str, np.ndarray], parts: _Parts, fingerprint: str,
           on_error: str, shuffle: bool, seed: int, options: dict, archive: Optional[ArchiveSource]) -> None:
    """Assemble the parts in ``work`` into a verified mirror at ``build`` (the parts go into it)."""
    failures = sorted([(_printable(str(s.root / s.files[i].rel)), err)
                       for s in source.splits for i, err in parts.errors[s.name]]
                      + [(_printable(p), e) for p, e in source.unreadable])
    if failures and on_error == "raise":
        raise PackError(failures)
    if failures:
        what = "files and folders" if source.unreadable else "files"
        warnings.warn(f"pack: skipped {len(failures)} unreadable {what}, e.g. {failures[0][0]}: {failures[0][1]}",
                      stacklevel=3)
    hidden = [(_printable(p), e) for p, e in source.hidden]
    if hidden:
        warnings.warn(f"pack: left out {len(hidden)} hidden files or folders that torchvision reads, e.g. "
                      f"{hidden[0][0]}: {hidden[0][1]}. The mirror lists them (colabfast info).", stacklevel=3)
    labels, names = None, None
    if archive is not None:
        labels = archive.labels.origin if archive.labels else f"class folders in {archive.path}"
        names = archive.class_names(source.classes or [])
    head = Header(
        layout=source.layout, store=options["store"], classes=source.classes, image_size=options["image_size"],
        quality=options["quality"], shuffled=shuffle, seed=seed, fingerprint=fingerprint,
        skipped=[{"path": p, "error": e} for p, e in sorted(failures + hidden)], source=_printable(str(source.root)),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), colabfast_version=_version(),
        labels=labels, class_names=None if names is None else [list(n) for n in names],
    )
    _assemble(build, work, source, orders, parts, head)
    _verify(build, {s.name: int(np.count_nonzero(orders[s.name] >= 0)) - len(parts.errors[s.name])
                    for s in source.splits})


def _preflight(source: Source, work: Path, store: str, image_size) -> None:
    """Check before any work that the local disk can hold what packing writes there.

    Kept encoded images make parts and then a mirror of about the source's size each: not enough
    space for those raises ENOSPC. Reading the source from DriveFS also fills Drive's local cache
    with it (DriveFS keeps what it reads under ``/root/.config/Google/DriveFS/<account>/content_cache``,
    so copying N GB off Drive needs about 2 N GB free); when that will not fit, this warns with the
    way through (packing resumes, and :func:`colabfast.refresh_drive` empties the cache) instead of
    refusing: ImageNet (150 GB) is packed from Drive that way on a 70 GB Colab disk. Resized or raw
    stores have no size before decoding; :func:`_assemble` checks again once it is known.
    """
    src_bytes = sum(f.size for s in source.splits for f in s.files)
    output = int(1.02 * src_bytes + 64e6) if store == "encoded" and image_size is None else 0
    free = env.disk_free(work)
    if output > free:
        raise OSError(errno.ENOSPC, f"not enough free space on {work.parent} to pack {source.root}: "
                          f"need {human_bytes(output)} "
                          f"({human_bytes(src_bytes)} of images for the mirror, and a margin), have "
                          f"{human_bytes(free)}. Free space, or pack a resized mirror (image_size=...).")
    if env.drive_kind(source.root) == "drivefs" and output + src_bytes > free:
        warnings.warn(f"pack: reading {human_bytes(src_bytes)} from Drive also fills Drive's local cache, and "
                      f"{work.parent} has {human_bytes(free)} free. If the disk fills up, run "
                      "colabfast.refresh_drive() to empty the cache, then pack() again: it resumes from the "
                      "parts it finished.", stacklevel=3)


def _check_size(image_size) -> Union[int, list[int], None]:
    if image_size is None:
        return None
    if isinstance(image_size, int) and image_size > 0:
        return image_size
    if (isinstance(image_size, (tuple, list)) and len(image_size) == 2
            and all(isinstance(v, int) and v > 0 for v in image_size)):
        return [int(image_size[0]), int(image_size[1])]
    raise ValueError(f"image_size must be a positive int (short side) or (H, W), not {image_size!r}")


def _version() -> str:
    from colabfast import __version__

    return __version__


def _order(n: int, shuffle: bool, seed: int) -> np.ndarray:
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng(seed).permutation(n).astype(np.int64)


def _fingerprint(source: Source, orders: dict[str, np.ndarray], options: dict) -> str:
    h = hashlib.sha256(json.dumps({"layout": source.layout, "classes": source.classes, **options}).encode())
    for s in source.splits:
        h.update(s.name.encode() + b"\0" + orders[s.name].tobytes())
        for f in s.files:
            h.update(_file_key(f))
        if s.objects is not None:
            h.update(s.objects.offsets.tobytes() + s.objects.bbox.tobytes())
    return h.hexdigest()


def _file_key(f: FileEntry) -> bytes:
    """What a fingerprint takes from one source file: its name's bytes (any, as the file system
    holds them: not UTF-8 is fine), size and time."""
    return os.fsencode(f.rel) + f"\0{f.size}\0{f.mtime_ns}\n".encode()


def _printable(name: str) -> str:
    """``name`` as text that can be written as UTF-8 (the mirror's paths, messages): the bytes of a name
    that is not valid UTF-8 (which Python lists as lone surrogates) become ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _complete(path: Path, fingerprint: str) -> bool:
    """True if ``path`` is a complete, verified mirror with this ``fingerprint``: the destination of an
    earlier run (nothing to do), or its local build left when it was killed while copying it onto
    Drive (published again instead of being rebuilt)."""
    if not path.is_file():
        return False
    try:
        with open_h5(path) as f:
            return Header.read(f, path).fingerprint == fingerprint
    except (MirrorError, OSError):
        return False


def source_fingerprint(src: PathLike, *, layout: str = "auto", labels: Optional[PathLike] = None,
                       split: Optional[str] = None, store: str = "encoded",
                       image_size: Union[int, tuple[int, int], None] = None, quality: int = 90,
                       shuffle: bool = False, seed: int = 0, retries: int = 5) -> tuple[str, str]:
    """``(fingerprint, description)`` of the mirror :func:`pack` would make of the folder or archive
    ``src`` with these options: the ``fingerprint`` it records in the mirror (what a finished mirror
    depends on: the files' names, sizes and times, labels, layout and options), and e.g.
    ``"imagefolder layout, 300 images in 10 classes"``. Lists the folder (or looks into the archive),
    reading no image. Raises what :func:`pack` raises for the same source."""
    streamed = archive_suffix(os.fspath(src)) is not None and not os.path.isdir(src)
    fingerprint, archive, source, _ = _listing(src, streamed, _options(store, _check_size(image_size), quality),
                                               layout, labels, split, shuffle, seed, retries)
    if archive is not None:
        return fingerprint, archive.describe()
    assert source is not None
    return fingerprint, source.describe()


def _options(store: str, image_size: Union[int, Sequence[int], None], quality: int) -> dict:
    """The options a mirror records and its fingerprint covers (``image_size`` as :func:`_check_size` returns it)."""
    return {"store": store, "image_size": image_size, "quality": quality if image_size else None}


def _listing(src: Union[PathLike, Sequence[Union[PathLike, tuple[PathLike, Union[int, str]]]]], streamed: bool,
             options: dict, layout: str, labels: Optional[PathLike], split: Optional[str], shuffle: bool, seed: int,
             retries: int) -> tuple[str, Optional[ArchiveSource], Optional[Source], dict[str, np.ndarray]]:
    """What :func:`pack` knows of ``src`` before it reads an image: ``(fingerprint, archive, source,
    orders)``, with ``archive`` the :class:`ArchiveSource` it streams (``source`` None, ``orders``
    empty) or ``source`` the listed folder and ``orders`` each split's order (``archive`` None)."""
    if streamed:
        assert isinstance(src, (str, os.PathLike))  # an archive is one file
        archive = ArchiveSource(src, layout, split, labels, retries)
        return _archive_fingerprint(archive, labels, options), archive, None, {}
    source = read_source(src, layout)
    orders = {s.name: _order(len(s.files), shuffle, seed) for s in source.splits}
    return _fingerprint(source, orders, options), None, source, orders


def lock_path(dst: Path) -> Path:
    """The lock a running :func:`pack` into ``dst`` holds: in colabfast's cache folder, so nothing is
    left beside the user's mirror."""
    return env.cache_dir() / "locks" / f"pack-{state_name(dst)}.lock"


def _work_dir(dst: Path) -> Path:
    """Where parts and the build go: beside ``dst`` on a local disk, else in the local work folder."""
    if not env.is_fuse(dst.parent):
        return dst.with_name(f".{dst.name}.colabfast-pack")
    tag = hashlib.sha1(os.fsencode(dst)).hexdigest()[:10]
    return env.work_dir() / "pack" / f"{dst.stem}-{tag}"


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


def _read_file(path: Path, retries: int = 5) -> Union[bytes, str]:
    try:
        return retry(lambda: read_regular(path), retries)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _load_part(path: Path) -> Optional[dict]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {"blob": z["blob"], "offsets": z["offsets"], "shapes": z["shapes"],
                    "errors": [tuple(e) for e in json.loads(str(z["errors"]))]}
    except (OSError, ValueError, KeyError):
        return None


def _save_part(path: Path, result: dict) -> None:
    tmp = partial_path(path)
    with open(tmp, "wb") as f:
        np.savez(f, blob=np.frombuffer(result["blob"], np.uint8) if isinstance(result["blob"], bytes)
                 else result["blob"], offsets=result["offsets"], shapes=result["shapes"],
                 errors=np.array(json.dumps(result["errors"])))
    os.replace(tmp, path)


def _make_parts(source: Source, orders: dict[str, np.ndarray], options: dict, work: Path, workers: int,
                progress: bool, retries: int) -> _Parts:
    from tqdm.auto import tqdm

    tags = json.dumps(options, sort_keys=True)
    jobs = []  # (split, part path, source indices)
    for s in source.splits:
        order = orders[s.name]
        for k in range(0, len(order), CHUNK):
            idx = order[k : k + CHUNK]
            h = hashlib.sha1(tags.encode())
            for i in idx:
                h.update(_file_key(s.files[i]))
            jobs.append((s, work / f"{s.name or 'all'}-{k // CHUNK:06d}-{h.hexdigest()[:16]}.npz", idx))
    wanted = {p for _, p, _ in jobs}
    for stale in work.glob("*.npz"):
        if stale not in wanted:
            stale.unlink()  # parts of an earlier run with other files or options

    errors: dict[str, list[tuple[int, str]]] = {s.name: [] for s in source.splits}
    todo = []
    for s, path, idx in jobs:
        done = _load_part(path) if path.exists() else None
        if done is None:
            todo.append((s, path, idx))
        else:  # finished by an earlier, interrupted run
            errors[s.name].extend((int(idx[i]), msg) for i, msg in done["errors"])
    total = sum(len(o) for o in orders.values())
    finished = total - sum(len(idx) for _, _, idx in todo)
    if finished and progress:
        print(f"pack: resuming: {finished} of {total} images were packed by an earlier run")
    pool = _process_pool(workers)
    inflight: deque[tuple[Future, Split, Path, np.ndarray]] = deque()

    def finish(fut: Future, s: Split, path: Path, idx: np.ndarray) -> None:
        result = fut.result()
        _save_part(path, result)
        errors[s.name].extend((int(idx[i]), msg) for i, msg in result["errors"])
        bar.update(len(idx))

    with ThreadPoolExecutor(32, thread_name_prefix="colabfast-pack-read") as readers, _stopping(pool), \
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


def _process_pool(workers: int) -> Executor:
    """Worker processes, all started now, before this call starts any thread of its own.

    Fork, as torch's DataLoader uses on Linux: spawn would re-import the caller's ``__main__``, which
    breaks scripts without an ``if __name__ == "__main__"`` guard. Forking before our reader threads
    and tqdm's monitor exist keeps their locks out of the children; the workers only run PIL.
    """
    if workers <= 0:
        return _InlineExecutor()
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_worker_start,
                               initargs=(os.getpid(),))
    with warnings.catch_warnings():  # Python 3.12 warns about fork in any multi-threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pool.submit(int).result()  # with fork, the first submit starts every worker
    return pool


@contextlib.contextmanager
def _stopping(pool: Executor) -> Iterator[Executor]:
    """Shut ``pool`` down after the block; when the block fails (Ctrl-C), without starting the work
    still queued, and without waiting for the pieces being decoded."""
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _worker_start(parent: int) -> None:
    """Worker start-up: leave Ctrl-C to the packing process, and end when that process dies.

    Ctrl-C in a terminal reaches every process of the group: each worker would print its own
    traceback (38 lines with 2 workers) before the packing process's one line; the packing process
    stops the pool instead (:func:`_stopping`). Forked workers hold both ends of their work queue's
    pipe, so they never see it close when the packing process dies (a killed notebook kernel) and
    would wait forever; Linux can signal them instead (prctl PR_SET_PDEATHSIG).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: no such call
        return
    if os.getppid() != parent:  # it died before the call above took effect
        os._exit(1)


class _InlineExecutor(Executor):
    """Runs work in this process (``workers=0``): for debugging, and where processes cannot start."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut


# --- parts from an archive stream ---------------------------------------------------------------


def _archive_fingerprint(archive: ArchiveSource, labels: Optional[PathLike], options: dict) -> str:
    """What a finished mirror of an archive depends on: the archive and labels files (size, mtime),
    the layout and the options."""
    files = [archive.path] + ([Path(labels)] if labels is not None else [])
    stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return hashlib.sha256(json.dumps({"layout": archive.layout, "files": stats, **options}).encode()).hexdigest()


def _preflight_archive(path: Path, work: Path, store: str, image_size) -> None:
    """Kept encoded images make a mirror of about the archive's size (its parts move into it, see
    :func:`_assemble`); resized or raw stores are checked once their size is known."""
    size = path.stat().st_size
    free = env.disk_free(work)
    need = int(1.02 * size + 64e6)
    if store == "encoded" and image_size is None and need > free:
        raise OSError(errno.ENOSPC, f"not enough free space on {work.parent} to pack {path}: need "
                                    f"{human_bytes(need)} ({human_bytes(size)} of images for the mirror, and a "
                                    f"margin), have {human_bytes(free)}. Pack a resized mirror (image_size=...): "
                                    "only the mirror is written locally, never the archive.")
    if env.drive_kind(path) == "drivefs" and size > free:
        warnings.warn(f"pack: DriveFS keeps a copy of what it reads on this disk, and {path} ({human_bytes(size)}) "
                      f"is larger than the {human_bytes(free)} free on {work.parent}. If the disk fills up, run "
                      "colabfast.refresh_drive() to empty that cache, then pack() again: it continues from the "
                      "archive member its last finished part reached.", stacklevel=4)


def _stream_log(work: Path, key: str) -> list[dict]:
    """The finished parts of an earlier run of this stream, in order (``stream.jsonl`` in ``work``).

    One JSON line per part, appended once the part file is in place: its file, the names and errors
    of its images, and where the stream continues after it. A torn last line (a kill while writing
    it) or a missing part file ends the list; parts after that are made again.
    """
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
    """Read the archive once, front to back, and save its images as parts of :data:`CHUNK` images.

    The main thread reads (with parallel readahead) while worker processes decode and resize the
    previous parts. A run resumes after the last part a previous run logged: a plain ``.tar`` is
    entered at that member's offset without reading what came before; a compressed one is read
    through to it. The log is keyed by the archive's name, layout, labels and options, not its size
    or time, so that a truncated upload completed later resumes; the finished mirror's fingerprint
    does include size and time.
    """
    from tqdm.auto import tqdm

    key = json.dumps({"archive": archive.path.name, "layout": archive.layout,
                      "labels": archive.labels.origin if archive.labels else None, **options}, sort_keys=True)
    records = _stream_log(work, key)
    keep = {r["part"] for r in records}
    for stale in work.glob("*.npz"):
        if stale.name not in keep:
            stale.unlink()  # beyond the logged parts, or of another archive or options
    tmp = partial_path(work / "stream.jsonl")  # rewritten without a torn last line, atomically
    tmp.write_text("\n".join([key] + [json.dumps(r) for r in records]) + "\n", encoding="utf-8")
    os.replace(tmp, work / "stream.jsonl")
    names = [n for r in records for n in r["names"]]
    errors = [(k * CHUNK + i, msg) for k, r in enumerate(records) for i, msg in r["errors"]]
    start = Position(*records[-1]["next"]) if records else Position(0, 0)

    if records and progress:
        print(f"pack: resuming after the {len(names)} images an earlier run packed")
    pool = _process_pool(workers)
    inflight: deque[tuple[list[Future], list[str], Position]] = deque()
    log = open(work / "stream.jsonl", "a", encoding="utf-8")

    def finish(futs: list[Future], batch: list[str], after: Position) -> None:
        try:
            result = _joined([fut.result() for fut in futs])
        except BaseException:
            inflight.clear()  # parts are numbered in stream order: none after a failed one is kept
            raise
        k = len(names) // CHUNK
        path = work / f"stream-{k:06d}.npz"
        _save_part(path, result)
        log.write(json.dumps({"part": path.name, "names": batch, "errors": result["errors"],
                              "next": list(after)}) + "\n")
        log.flush()
        errors.extend((k * CHUNK + i, msg) for i, msg in result["errors"])
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
    with log, _stopping(pool), tqdm(total=size, initial=skipped, unit="B", unit_scale=True, unit_divisor=1000,
                                    desc="pack", disable=not progress) as bar:
        bar.set_postfix_str(f"{len(names)} images packed", refresh=False)
        batch: list[tuple[str, Union[bytes, str]]] = []
        after = start
        try:
            for name, data, after in archive.images(start, on_bytes=lambda n: bar.update(n - bar.n)):
                batch.append((name, data))
                if len(batch) == CHUNK:
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
    source = Source("imagefolder", archive.path, [Split("", archive.path, files, targets=targets)], classes)
    part_paths = [work / f"stream-{k:06d}.npz" for k in range((len(names) + CHUNK - 1) // CHUNK)]
    failed = [(int(order[j]), m) for j, m in errors if order[j] >= 0]  # not a superseded copy's
    return source, {"": order}, _Parts(part_paths, {"": part_paths}, {"": failed})


def _drop_from_parts(work: Path, drop: list[int]) -> None:
    """Take the streamed images ``drop`` out of their parts' blobs: a sample left out of the mirror
    takes no bytes there (see :func:`_write_split`). Idempotent, so a resumed run may do it again."""
    by_part: dict[int, list[int]] = {}
    for j in drop:
        by_part.setdefault(j // CHUNK, []).append(j % CHUNK)
    for k, local in by_part.items():
        path = work / f"stream-{k:06d}.npz"
        part = _load_part(path)
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
        _save_part(path, part)


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


# --- assembling, verifying, publishing -------------------------------------------------------------


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
        raise OSError(errno.ENOSPC, f"not enough free space on {build.parent} to build the mirror: need "
                                    f"{human_bytes(need)}, have {human_bytes(free)}")
    moves = _lay_out(build, source, orders, parts, head)
    _plan_moves(work, head.fingerprint or "", moves)
    _move_parts(build, work, moves)
    _seal(build)


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
                part = _load_part(work / name)
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
    _seal(build)
    _verify_attrs(build)
    return True


def _seal(build: Path) -> None:
    with h5py.File(build, "r+", locking=False) as f:
        f.attrs["complete"] = True
    with open(build, "rb+") as f:
        os.fsync(f.fileno())
    trust(build)


def _write_split(g: h5py.Group, s: Split, order: np.ndarray, part_paths: list[Path],
                 bad: set[int]) -> list[tuple[Path, int, int]]:
    """Write the split's index arrays and allocate its ``images``; return ``(part, position in
    images, bytes)`` per part. Failed samples take no bytes in a part's blob, so each blob goes whole."""
    offsets, shapes, kept, crcs, at, pos = [np.zeros(1, np.int64)], [], [], [], [], 0
    for k, path in enumerate(part_paths):
        part = _load_part(path)
        if part is None:
            raise MirrorError(f"{path} is unreadable though it was just checked: run pack() again")
        idx = order[k * CHUNK : (k + 1) * CHUNK]
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
    paths = [_printable(s.files[i].rel).encode("utf-8") for i in kept_idx]
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


def _publish(build: Path, dst: Path) -> None:
    """Move the verified build to ``dst`` atomically (copying it onto Drive first when needed)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if build != partial_path(dst):
        tmp = partial_path(dst)
        shutil.copyfile(build, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if tmp.stat().st_size != build.stat().st_size:
            raise OSError(errno.EIO, f"copying the mirror to {tmp} wrote {tmp.stat().st_size} bytes, expected "
                             f"{build.stat().st_size}; run pack() again")
        _verify_attrs(tmp)
        os.replace(tmp, dst)
        build.unlink()  # only now: a run killed during the copy publishes this verified build again
    else:
        os.replace(build, dst)
    with contextlib.suppress(OSError):  # not every filesystem (FUSE) can fsync a folder
        fd = os.open(dst.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _verify_attrs(path: Path) -> None:
    with open_h5(path) as f:
        check(f, path)
