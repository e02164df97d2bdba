"""Pack a dataset of many small image files, or any map-style dataset, into one HDF5 mirror: :func:`pack`.

One big file is what Drive serves well (tens of MB/s) and what a DataLoader reads fastest. The
format is described in :mod:`colabfast.mirror`. :func:`pack` checks its arguments, takes what kind
of source it was given and which registered layout reads it from :func:`~colabfast.packing.resolve.resolve`
(decided once, from one listing), and hands it to that kind's module, one module a kind:

- :mod:`~colabfast.packing.folders`: a folder of images (ImageFolder, KITTI) or a list of files;
- :mod:`~colabfast.packing.archives`: a tar or zip archive, read as one stream;
- :mod:`~colabfast.packing.dataset`: any map-style dataset, a layout of :mod:`colabfast.layouts`
  included, as a mirror of typed columns.

Each exposes one entry function of one shape, ``pack_<kind>(src, dst, *, options, workers, on_error,
progress, overwrite, **what the kind takes) -> Path`` (``options`` as :func:`~colabfast.packing.common._options`
makes them; it returns ``dst`` as given), and builds on :mod:`~colabfast.packing.common`: the lock
and work folder of a destination, the refusal to write over what is not a mirror of the same source,
worker processes, resumable part files of :data:`CHUNK` samples, and sealing, verifying and
publishing the mirror atomically. A new kind of source is one new module of that shape, and one
branch in :func:`pack`.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Optional, Union

from colabfast.errors import SourceNotFound
from colabfast.mirror.encoding import encode_image, resized_size
from colabfast.mirror.format import STORES
from colabfast.packing.archives import _listing as _archive_listing
from colabfast.packing.archives import pack_archive
from colabfast.packing.common import (
    CHUNK,
    Contents,
    PackError,
    PackRefused,
    SplitRefused,
    _check_size,
    _options,
    _printable,
    lock_path,
)
from colabfast.packing.dataset import pack_columns
from colabfast.packing.folders import _listing as _folder_listing
from colabfast.packing.folders import pack_folder
from colabfast.packing.resolve import Resolved, column_layout, resolve
from colabfast.where import env
from colabfast.where._fileio import PathLike

__all__ = ["pack", "PackError", "PackRefused", "SplitRefused", "resized_size", "encode_image", "lock_path",
           "source_fingerprint", "source_listing", "dataset_fingerprint", "CHUNK", "PACK_PARAMETERS", "Resolved",
           "resolve", "column_layout"]


def pack(
    src: Any,
    dst: PathLike,
    *,
    fields: Optional[dict] = None,
    layout: str = "auto",
    labels: Optional[PathLike] = None,
    split: Optional[str] = None,
    year: Union[str, int, None] = None,
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
    (:mod:`colabfast.mirror.columns`, format version 3): whatever ``dataset[i]`` returns (a tuple, a dict,
    or one value, made of PIL images, image tensors/arrays, ``tv_tensors``, numbers, strings, bytes,
    arrays and JSON-like lists) comes back from :class:`colabfast.H5Dataset` as it was returned,
    losslessly: a PIL image opened from a JPEG file and left unchanged keeps that file's bytes, any
    other image is stored as PNG unless ``fields`` asks for JPEG (FFCV's ``jpg`` mode). ``dataset[i]``
    runs in ``workers`` forked processes of 8 threads each (it usually waits on Drive), as a
    DataLoader's workers run it. A sample that does not fit the columns of sample 0 (a new key, another
    dtype), or nests deeper than :data:`colabfast.mirror.columns.MAX_DEPTH`, is a
    :class:`colabfast.mirror.columns.FieldError` naming the index and field; an image over
    ``PIL.Image.MAX_IMAGE_PIXELS`` (the readers' limit) fails as an unreadable file does. The first
    ``dataset[i]`` that raises IndexError ends the dataset, as iterating it would (warned where ``len()``
    said more). Resuming an
    interrupted run reuses its finished parts; a finished mirror is reused only for a dataset that
    says what it holds (a layout's files, a Hugging Face ``_fingerprint``, or a ``fingerprint``
    attribute of yours), any other dataset is packed again.

    **Folder layouts** (:mod:`colabfast.layouts`) are read as such datasets, with no code to write:
    ``"coco"`` (``labels=`` the annotation JSON, as ``torchvision.datasets.CocoDetection(root,
    annFile)``; Roboflow's ``_annotations.coco.json`` is found), ``"voc-detection"`` and
    ``"voc-segmentation"`` (a ``VOCdevkit`` tree, or VOC 2011's ``TrainVal``; ``split=`` the image set,
    ``year=`` the year where it holds several), ``"yolo"`` (Ultralytics
    and Roboflow exports; ``split=``), ``"segmentation"`` (``images/`` and ``masks/`` paired by
    name) and ``"csv"`` (``labels=`` the table). ``"auto"`` detects them (a VOC tree with both image
    sets as detection; csv where one table lies at the top of a folder of images, or where one of
    several is named after a folder of images beside it, as Kaggle's ``train.csv`` for ``train/``), or ``labels=``
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
            :data:`colabfast.packing.archivesource.LAYOUTS`; or ``"auto"`` (detected, and printed when
            ``progress``). Folders are followed through links as torchvision does, also links that
            leave ``src``, but not a link back to a folder it is in (a loop). Hidden files and folders
            are left out (torchvision would take macOS's ``._x.jpg`` files and ``.ipynb_checkpoints``
            for data, and ``.ipynb_checkpoints`` beside the class folders for a class): pack warns,
            and the mirror lists each one and why (``colabfast info``).
        labels: ImageNet's devkit ``ILSVRC2012_devkit_t12.tar.gz`` for ``ILSVRC2012_img_val.tar``
            (validation labels; for the training archive, class names only).
        split: ``"train"`` or ``"val"``: the part of Kaggle's ImageNet zip to pack (default train);
            for a folder layout, its split (VOC's image set, a YOLO export's split, an export zip's split
            folder, checked against a zip's listing before anything is extracted; for a tree of split
            folders, :func:`colabfast.layouts.images.split_folders`, the folder packed as an ImageFolder, as
            ``open_dataset`` opens it). The mirror records it (``colabfast info``).
        year: for the VOC layouts, torchvision's ``year`` (``"2007"`` to ``"2012"``): which
            ``VOC<year>`` folder to pack where the tree holds several (found where torchvision finds
            it: ``VOCdevkit/VOC<year>``, for 2011 ``TrainVal/VOCdevkit/VOC2011``).
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
        FieldError: a dataset's sample that no mirror of its columns holds (see above).
        ArchiveReadError: the archive is truncated or corrupt at the member it names; the finished
            parts are kept and the next run continues from them.
        UnsafeArchiveError: an archive member name is absolute or climbs out with ``..``.
        FileNotFoundError: ``src`` is missing or holds no images.
        LayoutError: a folder layout's annotations are malformed or unsafe (see its class), or it has no
            sample to pack (with ``on_error="skip"``: it says what was left out).
        SplitRefused: (a ``PackRefused``) an export zip of several splits, or a folder of split folders
            (``train/``, ``val/``: torchvision's ``ImageFolder`` would take them for classes; pass
            ``layout="imagefolder"`` if they are), and no ``split`` or one it lacks: the message lists
            its splits and the call to make. Nothing is extracted or written.
        PackRefused: (a ``ValueError``, and a :class:`PackError` with no ``failures``) bad arguments
            (``year=`` for a layout other than VOC's); ``dst`` is a folder, or (without ``overwrite``)
            a file that is not a mirror of ``src``; a layout that does not fit the archive. Nothing is
            written.
        OSError: ``errno.ENOSPC`` when the local disk cannot hold the mirror while it is built.
    """
    if store not in STORES:
        raise PackRefused(f"store must be 'encoded' or 'raw', not {store!r}")
    resolved = resolve(src, layout, labels)
    src, layout = resolved.src, resolved.layout
    folder_layout, packed_archive = _read_as_layout(resolved)
    voc_year = _voc_year(year, folder_layout or packed_archive)
    if folder_layout is not None or packed_archive is not None or resolved.kind == "dataset":
        if on_error not in ("raise", "skip"):
            raise PackRefused(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if not 1 <= quality <= 100:
            raise PackRefused(f"quality must be 1..100, not {quality}")
        if shuffle:
            raise PackRefused("shuffle=True is for folders of images; a mirror of a dataset keeps its order (a "
                             "loader's random sampler shuffles it)")
        if store != "encoded":
            raise PackRefused("store='raw' is for folders of images; a mirror of a dataset stores its images "
                             "encoded (PNG, or the JPEG files' own bytes)")
        if packed_archive is not None:
            from colabfast.packing.unpacked import pack_unpacked

            return pack_unpacked(src, dst, layout=packed_archive, labels=labels, split=split,
                                 options=_options(store, _check_size(image_size), quality),
                                 workers=env.cpu_count() if workers is None else workers, on_error=on_error,
                                 progress=progress, overwrite=overwrite, retries=retries, fields=fields, year=voc_year)
        from colabfast.packing.hf import packable

        dataset = packable(src) if folder_layout is None else _open_layout(src, folder_layout, labels, split,
                                                                            on_error, retries, voc_year)
        return pack_columns(dataset, dst, options=_options(store, _check_size(image_size), quality),
                            workers=env.cpu_count() if workers is None else workers, on_error=on_error,
                            progress=progress, overwrite=overwrite, layout=folder_layout or "dataset", fields=fields,
                            split=split if folder_layout is not None else None)
    if fields is not None:
        raise PackRefused("fields= is for packing a dataset or a layout of colabfast.layouts")
    if on_error not in ("raise", "skip"):
        raise PackRefused(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if not 1 <= quality <= 100:
        raise PackRefused(f"quality must be 1..100, not {quality}")
    image_size = _check_size(image_size)  # type: ignore[assignment]  # (H, W) becomes a list: JSON-equal on resume
    workers = env.cpu_count() if workers is None else workers
    options = _options(store, image_size, quality)
    path = os.fspath(src) if isinstance(src, (str, os.PathLike)) else ""
    streamed = resolved.streamed
    if streamed and not os.path.isfile(path):
        raise SourceNotFound(f"no archive at {os.path.abspath(path)}: check the path (on Drive: "
                             "/content/drive/MyDrive/...)")
    if streamed and shuffle:
        raise PackRefused("shuffle=True is not available when packing from an archive: the mirror keeps the "
                         "archive's order (a loader's random sampler shuffles it)")
    if not streamed and layout == "auto" and labels is None:
        src, split = _split_of_tree(src, split)
    if not streamed and (labels is not None or split is not None):
        raise PackRefused("labels= and split= are for packing from an archive (ImageNet's devkit, Kaggle's zip)")
    if streamed:
        return pack_archive(path, dst, options=options, workers=workers, on_error=on_error, progress=progress,
                            overwrite=overwrite, layout=layout, labels=labels, split=split, seed=seed, retries=retries)
    return pack_folder(src, dst, options=options, workers=workers, on_error=on_error, progress=progress,
                       overwrite=overwrite, layout=layout, shuffle=shuffle, seed=seed, retries=retries)


PACK_PARAMETERS = tuple(inspect.signature(pack).parameters)  # pack's arguments, for those that pass them on


def _split_of_tree(src: Any, split: Optional[str]) -> tuple[Any, Optional[str]]:
    """``src / split`` where ``src`` is a tree of split folders (:func:`colabfast.layouts.images.split_folders`)
    read as an ImageFolder; else ``src``, ``split`` as given (refused next unless None).

    Raises:
        SplitRefused: a tree of splits and ``split`` None or not one of them (torchvision's
            ``ImageFolder`` would take the splits for classes): it lists them and the call to make.
    """
    from colabfast.layouts import ImageFolderLayout, KittiLayout
    from colabfast.layouts.images import split_folders
    from colabfast.layouts.tree import tree_of

    if not isinstance(src, (str, os.PathLike)) or not os.path.isdir(src):
        return src, split
    tree = tree_of(src)
    folders = split_folders(tree)  # one listing; KITTI's tree is ruled out only where it matters
    if folders is None or KittiLayout.detect(tree) or not ImageFolderLayout.detect(tree):
        return src, split
    if split not in folders:
        raise SplitRefused(src, {name: f"{name}/" for name in folders}, split)
    return Path(src) / split, None


def _read_as_layout(resolved: Resolved) -> tuple[Optional[str], Optional[str]]:
    """``(folder_layout, packed_archive)``: the registered layout a folder is read as, or the one an
    archive file is extracted and read as; None each where the source is not that."""
    if not resolved.columns or resolved.kind == "dataset":
        return None, None
    if resolved.kind == "archive" and os.path.isfile(resolved.src):
        return None, resolved.layout
    return resolved.layout, None  # a folder, or a path that is none (reading it as the layout names that)


def _voc_year(year: Union[str, int, None], layout: Optional[str]) -> Optional[str]:
    """``year`` as a string, for the VOC layouts only.

    Raises:
        PackRefused: a ``year`` for another layout or source.
    """
    if year is None:
        return None
    if layout not in ("voc-detection", "voc-segmentation"):
        raise PackRefused(f"year={year!r} picks a Pascal VOC tree's year, and this source is packed as "
                          f"{'layout ' + repr(layout) if layout else 'no VOC layout'}: leave year= out, or pass "
                          "layout='voc-detection' or 'voc-segmentation'")
    return str(year)


def _open_layout(src: Any, layout: str, labels: Optional[PathLike], split: Optional[str], on_error: str,
                 retries: int, year: Optional[str] = None) -> Any:
    from colabfast.layouts import LAYOUTS

    if not isinstance(src, (str, os.PathLike)) or not os.path.isdir(src):
        raise SourceNotFound(f"layout {layout!r} reads a folder, and {src!r} is not one")
    kwargs: dict[str, Any] = {"on_error": on_error, "retries": retries}
    if labels is not None:
        kwargs["labels"] = labels
    if split is not None:
        kwargs["split"] = split
    if year is not None:
        kwargs["year"] = year
    try:
        return LAYOUTS[layout](Path(os.path.abspath(src)), **kwargs)  # type: ignore[call-arg]
    except TypeError as exc:
        raise PackRefused(f"layout {layout!r} does not take these arguments ({exc})") from None


def source_fingerprint(src: PathLike, *, layout: str = "auto", labels: Optional[PathLike] = None,
                       split: Optional[str] = None, year: Union[str, int, None] = None, store: str = "encoded",
                       image_size: Union[int, tuple[int, int], None] = None, quality: int = 90,
                       shuffle: bool = False, seed: int = 0, retries: int = 5,
                       on_error: str = "raise") -> tuple[str, str]:
    """``(fingerprint, description)`` of the mirror :func:`pack` would make of the folder or archive
    ``src`` with these options: the ``fingerprint`` it records in the mirror (what a finished mirror
    depends on: the files' names, sizes and times, labels, layout and options), and e.g.
    ``"imagefolder layout, 300 images in 10 classes"``. Lists the folder (or looks into the archive),
    reading no image; a folder layout of :mod:`colabfast.layouts` also parses its annotations and
    reads its first sample (what fixes the mirror's columns). Raises what :func:`pack` raises for the
    same source."""
    fingerprint, description, _ = source_listing(
        src, layout=layout, labels=labels, split=split, year=year, store=store, image_size=image_size,
        quality=quality, shuffle=shuffle, seed=seed, retries=retries, on_error=on_error)
    return fingerprint, description


def source_listing(src: PathLike, *, layout: str = "auto", labels: Optional[PathLike] = None,
                   split: Optional[str] = None, year: Union[str, int, None] = None, store: str = "encoded",
                   image_size: Union[int, tuple[int, int], None] = None, quality: int = 90,
                   shuffle: bool = False, seed: int = 0, retries: int = 5,
                   on_error: str = "raise") -> tuple[str, str, Contents]:
    """:func:`source_fingerprint`'s ``(fingerprint, description)`` and what the mirror holds
    (:class:`~colabfast.packing.common.Contents`: its samples' paths, its layout, options and classes),
    from the same listing: what a mirror found by that fingerprint is checked against
    (:func:`~colabfast.packing.common.differs`). Raises what :func:`pack` raises for the same source."""
    resolved = resolve(src, layout, labels)
    streamed, layout = resolved.streamed, resolved.layout
    folder_layout, packed_archive = _read_as_layout(resolved)
    options = _options(store, _check_size(image_size), quality)
    if packed_archive is not None:
        from colabfast.packing.unpacked import check_split, unpacked_fingerprint

        check_split(src, packed_archive, labels, split)
        return (unpacked_fingerprint(src, packed_archive, labels, split, options, retries,
                                     _voc_year(year, packed_archive)),
                f"an archive of a {packed_archive} layout, {os.path.getsize(src) / 1e6:.1f} MB",
                Contents(options, layout=packed_archive))
    voc_year = _voc_year(year, folder_layout)
    if folder_layout is not None:
        from colabfast.packing.dataset import plan

        dataset = _open_layout(src, folder_layout, labels, split, on_error, retries, voc_year)
        return plan(dataset, None, options, folder_layout)[2], dataset.describe(), Contents(
            options, layout=folder_layout,
            samples={"": (str(dataset.root), [_printable(p) for p in dataset.paths])})
    if streamed:
        fingerprint, archive = _archive_listing(src, options, layout, labels, split, retries)
        return fingerprint, archive.describe(), Contents(options, source=_printable(str(archive.path)))
    fingerprint, source, _ = _folder_listing(src, options, layout, shuffle, seed)
    return fingerprint, source.describe(), Contents(
        options, layout=source.layout, classes=source.classes,
        samples={s.name: (str(s.root), [_printable(f.rel) for f in s.files]) for s in source.splits})


def dataset_fingerprint(dataset: Any, *, store: str = "encoded", image_size: Union[int, tuple[int, int], None] = None,
                        quality: int = 90) -> str:
    """The fingerprint :func:`pack` records in the mirror of the map-style ``dataset`` (a Hugging Face
    ``datasets.Dataset`` included) with these options, from what the dataset says it holds (its
    ``_fingerprint`` or ``fingerprint``, see :func:`colabfast.packing.dataset.identity`), its length
    and its first sample's fields: reads ``dataset[0]``, nothing else. It ends in ``-anonymous`` for a
    dataset that says nothing of its content (then no mirror is ever taken for its).

    Raises:
        PackRefused: options pack refuses for a dataset, or an empty dataset. FieldError: a first
            sample no mirror holds.
    """
    from colabfast.packing.dataset import plan
    from colabfast.packing.hf import packable

    if store != "encoded":
        raise PackRefused("store='raw' is for folders of images; a mirror of a dataset stores its images "
                         "encoded (PNG, or the JPEG files' own bytes)")
    if not 1 <= quality <= 100:
        raise PackRefused(f"quality must be 1..100, not {quality}")
    return plan(packable(dataset), None, _options(store, _check_size(image_size), quality), "dataset")[2]
