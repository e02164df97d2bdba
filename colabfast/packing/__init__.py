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
progress, overwrite, **what the kind takes) -> Path`` (``options`` as :func:`~colabfast.packing.common.mirror_options`
makes them; it returns ``dst`` as given), and builds on :mod:`~colabfast.packing.common`: the lock
and work folder of a destination, the refusal to write over what is not a mirror of the same source,
worker processes, resumable part files of :data:`CHUNK` samples, and sealing, verifying and
publishing the mirror atomically. Where the local disk is short for a destination on Drive,
:func:`pack` packs again with the work folder beside the destination (:mod:`~colabfast.packing.placed`).
A new kind of source is one new module of that shape, and one branch in :func:`pack`.
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
    check_writable,
    lock_path,
    mirror_options,
    printable,
)
from colabfast.packing.dataset import pack_columns
from colabfast.packing.folders import _listing as _folder_listing
from colabfast.packing.folders import pack_folder
from colabfast.packing.placed import tries
from colabfast.packing.source import Source, resolve
from colabfast.where import env
from colabfast.where._fileio import PathLike

__all__ = ["pack", "PackError", "PackRefused", "SplitRefused", "resized_size", "encode_image", "lock_path",
           "source_fingerprint", "source_listing", "dataset_fingerprint", "CHUNK", "PACK_PARAMETERS", "Source",
           "resolve"]


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
    """Pack a dataset (a folder, an archive, or any map-style dataset) into one HDF5 mirror at ``dst``.

    One big file is what Drive serves well and what a loader reads fastest. ``layout="auto"`` sees what
    the source is (a zip as the folder it holds) and reads it as the format's own tool does; the mirror
    then opens with that layout's drop-in (`H5ImageFolder`, `H5Kitti`, `H5CocoDetection`, ...; `H5Dataset`
    for any dataset: its samples come back as ``dataset[i]`` returned them). Archives of images
    (ImageNet's, an ImageFolder tree) are read front to back as one stream, never extracted. A run is
    resumable, and ``dst`` is only ever replaced whole, by a verified mirror of the same source. How it
    works, layout by layout: [Layouts and mirrors](../layouts.md).

    Examples:
        >>> import colabfast as cf
        >>> drive = cf.mount()
        Mounted at /content/drive
        >>> mirror = cf.pack(drive / "flowers", drive / "flowers.h5", progress=False)
        >>> ds = cf.H5ImageFolder(mirror)  # torchvision's ImageFolder, read from one file
        >>> len(ds), ds.classes
        (8, ['daisy', 'rose'])

    Args:
        src: a folder, an archive (``.zip``, ``.tar``, ``.tar.gz``...), a map-style dataset, or for
            ``layout="files"`` a list of image paths or ``(path, label)`` pairs.
        dst: the mirror to write, e.g. ``/content/drive/MyDrive/kitti.h5``.
        fields: for a dataset or a layout of columns: a field's kind or image encoding by name (a dict
            key, a tuple position ``"0"``, nested ``"1.boxes"``), e.g. ``{"image": "jpeg"}``.
        layout: a registered layout's name (``colabfast.layouts.REGISTRY``: ``"imagefolder"``, ``"kitti"``,
            ``"coco"``, ``"yolo"``, ``"imagenet-train"``...) or ``"auto"`` (detected; printed with ``progress``).
        labels: the annotation file where the layout takes one (a COCO JSON, a CSV table, ImageNet's devkit).
        split: what to pack of a source of several: a tree of split folders' folder, VOC's image set, a
            YOLO export's split, Kaggle's ``"train"``/``"val"``. The mirror records it.
        year: VOC's year where the tree holds several (``"2007"`` to ``"2012"``, as torchvision's).
        store: ``"encoded"`` keeps each image file's bytes; ``"raw"`` stores decoded RGB pixels (folders).
        image_size: resize as ``torchvision.transforms.Resize(image_size)`` (int: short side; ``(H, W)``),
            re-encoded as JPEG at ``quality`` when ``store="encoded"``.
        quality: JPEG quality (1-100) of re-encoded images.
        shuffle, seed: store a folder's samples in a random order seeded by ``seed``; indices stay the source's.
        workers: processes decoding and checking images (default: the CPUs; 0: this process).
        on_error: ``"raise"`` lists every unreadable file or folder in a `PackError` and writes nothing;
            ``"skip"`` packs the rest, warns, and records what it skipped (``colabfast info``).
        retries: retries of each read for transient mount errors, as `stage`'s.
        progress: show a progress bar and say which layout was detected.
        overwrite: replace whatever file is at ``dst`` (by default only a mirror of the same source).

    Returns:
        ``dst`` as a ``Path``.

    Raises:
        PackError: unreadable images or folders (``on_error="raise"``).
        PackRefused: (a ``ValueError``) bad arguments, a layout that does not fit the source, ``dst`` a
            folder or (without ``overwrite``) a file that is not a mirror of ``src``. Nothing is written.
        SplitRefused: (a ``PackRefused``) a source of several splits without ``split``, or with one it
            lacks: it lists them and the call to make. Nothing is read or extracted.
        FileNotFoundError: ``src`` is missing or holds no images. LayoutError: malformed annotations.
        FieldError: a dataset's sample that no mirror of its columns holds.
        ArchiveReadError: a truncated or corrupt archive (the next run resumes from the parts kept).
        UnsafeArchiveError: an archive member named absolute or climbing out with ``..``.
        NotEnoughSpace: (an ``OSError``, ``errno.ENOSPC``) neither local disk nor ``dst``'s holds the build
            (for ``dst`` on Drive, pack writes straight there when local is short: :mod:`~colabfast.packing.placed`).
        NotWritable: (an ``OSError``) ``dst``'s folder is read-only or not yours: nothing is written.
    """
    if store not in STORES:
        raise PackRefused(f"store must be 'encoded' or 'raw', not {store!r}")
    if on_error not in ("raise", "skip"):
        raise PackRefused(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if not 1 <= quality <= 100:
        raise PackRefused(f"quality must be 1..100, not {quality}")
    source = resolve(src, layout, labels, split, retries)
    target = Path(os.path.abspath(os.fspath(dst)))
    if not os.path.lexists(target):  # a read-only folder (Kaggle's /kaggle/input) named before any work
        check_writable(target.parent, "dst=", target.name)
    route, voc_year = source.route, _voc_year(year, source)
    options = mirror_options(store, _check_size(image_size), quality)
    workers = env.cpu_count() if workers is None else workers
    common: dict[str, Any] = {"options": options, "workers": workers, "on_error": on_error, "progress": progress,
              "overwrite": overwrite}
    if route in ("dataset", "columns") or route == "unpacked" and source.columns:
        if shuffle:
            raise PackRefused("shuffle=True is for folders of images; a mirror of a dataset keeps its order (a "
                              "loader's random sampler shuffles it)")
        if store != "encoded":
            raise PackRefused("store='raw' is for folders of images; a mirror of a dataset stores its images "
                              "encoded (PNG, or the JPEG files' own bytes)")
    elif fields is not None:
        raise PackRefused("fields= is for packing a dataset or a layout of colabfast.layouts")
    # Where the local disk is short for a mirror bound for Drive, packed again straight there; in this
    # frame, so that a warning's stacklevel still names the caller's line.
    for attempt in tries(dst, progress):
        with attempt:
            if route == "dataset":
                from colabfast.packing.hf import packable

                return pack_columns(packable(source.src), dst, layout="dataset", fields=fields, **common)
            if route == "columns":
                dataset = _open_layout(source, on_error, retries, voc_year)
                return pack_columns(dataset, dst, layout=source.name, fields=fields, split=source.split, **common)
            archive = source.path or Path()  # set for an archive (and a folder)
            if route == "unpacked":
                from colabfast.packing.unpacked import pack_unpacked

                return pack_unpacked(archive, dst, layout=source.name, labels=labels, split=source.split or source.root
                                     or None, retries=retries, fields=fields, year=voc_year, **common)
            if route == "stream":
                if not archive.is_file():
                    raise SourceNotFound(f"no archive at {archive}: check the path (on Drive: "
                                         "/content/drive/MyDrive/...)")
                if shuffle:
                    raise PackRefused("shuffle=True is not available when packing from an archive: the mirror keeps "
                                      "the archive's order (a loader's random sampler shuffles it)")
                return pack_archive(archive, dst, layout=source.name, labels=labels, split=source.split, seed=seed,
                                    retries=retries, prefix=source.prefix if source.root else "", **common)
            if labels is not None or source.split is not None:
                raise PackRefused("labels= and split= are for packing from an archive (ImageNet's devkit, Kaggle's "
                                  "zip)")
            return pack_folder(source.folder or source.src, dst, layout=source.name, shuffle=shuffle, seed=seed,
                               retries=retries, **common)
    raise AssertionError("unreachable: the last attempt returns or raises")


PACK_PARAMETERS = tuple(inspect.signature(pack).parameters)  # pack's arguments, for those that pass them on


def _voc_year(year: Union[str, int, None], source: Source) -> Optional[str]:
    """``year`` as a string, for the VOC layouts only.

    Raises:
        PackRefused: a ``year`` for another layout or source.
    """
    if year is None:
        return None
    if source.name not in ("voc-detection", "voc-segmentation"):
        raise PackRefused(f"year={year!r} picks a Pascal VOC tree's year, and this source is packed as layout "
                          f"{source.name!r}: leave year= out, or pass layout='voc-detection' or 'voc-segmentation'")
    return str(year)


def _open_layout(source: Source, on_error: str, retries: int, year: Optional[str] = None) -> Any:
    """The `Layout` over the folder ``source`` reads.

    Raises:
        SourceNotFound: the path is not a folder. PackRefused: arguments the layout does not take."""
    if source.folder is None or not source.folder.is_dir():
        raise SourceNotFound(f"layout {source.name!r} reads a folder, and {source.src!r} is not one")
    kwargs: dict[str, Any] = {"on_error": on_error, "retries": retries}
    for name, value in (("labels", source.labels), ("split", source.split), ("year", year)):
        if value is not None:
            kwargs[name] = value
    try:
        return source.layout(source.folder, **kwargs)  # type: ignore[call-arg]
    except TypeError as exc:
        raise PackRefused(f"layout {source.name!r} does not take these arguments ({exc})") from None


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
    source = resolve(src, layout, labels, split, retries)
    options = mirror_options(store, _check_size(image_size), quality)
    route, voc_year = source.route, _voc_year(year, source)
    archive = source.path or Path()  # set for an archive (and a folder)
    if route == "unpacked":
        from colabfast.packing.unpacked import check_split, unpacked_fingerprint

        split = source.split or source.root or None
        check_split(archive, source.name, labels, split)
        return (unpacked_fingerprint(archive, source.name, labels, split, options, retries, voc_year),
                f"an archive of a {source.name} layout, {os.path.getsize(archive) / 1e6:.1f} MB",
                Contents(options, layout=source.name))
    if route == "columns":
        from colabfast.packing.dataset import plan

        dataset = _open_layout(source, on_error, retries, voc_year)
        return plan(dataset, None, options, source.name)[2], dataset.describe(), Contents(
            options, layout=source.name,
            samples={"": (str(dataset.root), [printable(p) for p in dataset.paths])})
    if route == "stream":
        fingerprint, streamed = _archive_listing(archive, options, source.name, labels, source.split, retries,
                                                 source.prefix if source.root else "")
        return fingerprint, streamed.describe(), Contents(options, source=printable(str(streamed.path)))
    fingerprint, listed, _ = _folder_listing(source.folder or source.src, options, source.name, shuffle, seed)
    return fingerprint, listed.describe(), Contents(
        options, layout=listed.layout, classes=listed.classes,
        samples={s.name: (str(s.root), [printable(f.rel) for f in s.files]) for s in listed.splits})


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
    return plan(packable(dataset), None, mirror_options(store, _check_size(image_size), quality), "dataset")[2]
