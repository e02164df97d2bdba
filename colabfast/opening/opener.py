""":func:`open_dataset`: what the path is (:mod:`~colabfast.opening.kinds`), its mirror found or packed
(:mod:`~colabfast.opening.found`, named by :mod:`~colabfast.opening.mirrors`), staged (early where it can be:
:mod:`~colabfast.opening.early`) and opened with its drop-in. :mod:`colabfast.opening` says how each step is
decided."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from colabfast.errors import NothingToOpen, OpenRefused
from colabfast.opening.early import _before_staging, _Early, _staging_words
from colabfast.opening.found import (
    _checked,
    _dataset_wanted,
    _found_or_packed,
    _Impostor,
    _listed,
    _packs_split,
    _resolved,
)
from colabfast.opening.kinds import OWN_ARGUMENTS, _empty, what_is
from colabfast.opening.mirrors import default_mirrors, drop_in
from colabfast.where import env
from colabfast.where._fileio import PathLike, human_bytes

if TYPE_CHECKING:
    from colabfast.datasets.dropins import MirrorDataset
    from colabfast.opening.found import _Wanted
    from colabfast.opening.mirrors import _InMemory

__all__ = ["open_dataset"]


def _pack_options() -> tuple[str, ...]:
    """pack()'s keyword options that open_dataset passes on: every one in pack's signature
    (:data:`colabfast.packing.PACK_PARAMETERS`) but :data:`OWN_ARGUMENTS`."""
    from colabfast.packing import PACK_PARAMETERS

    return tuple(name for name in PACK_PARAMETERS if name not in OWN_ARGUMENTS)


def open_dataset(
    path: Union[PathLike, Any],
    split: Optional[str] = None,
    *,
    transform: Optional[Callable] = None,
    target_transform: Optional[Callable] = None,
    output: str = "pil",
    image_size: Optional[Any] = None,
    mirrors: Optional[PathLike] = None,
    to: str = "auto",
    cache_limit: Optional[int] = None,
    progress: bool = True,
    **pack_options: Any,
) -> MirrorDataset:
    """Open a dataset where it is (on Drive, another slow mount, or local) as a fast drop-in dataset.

    - **A mirror** (an ``.h5`` made by :func:`colabfast.pack`): staged and opened.
    - **A folder or an archive** in a layout :func:`colabfast.pack` reads: its mirror made with these
      options is looked for in ``mirrors`` by the fingerprint pack records (the source's file names,
      sizes and times, its labels, layout and options; listing the source reads no image) and, when
      there is none, packed there (resumable, as pack is; a second runtime calling this on the same
      source waits for the first's pack lock and then finds its mirror). A source that changed since
      its mirror was made gets a new mirror; the old one is kept and named in the account. A mirror
      found is checked against the listing too (its samples' paths and order, what it records as
      skipped, its layout, options and classes: what the fingerprint stands for), since any file can
      carry a fingerprint: one that does not hold the source is left as it is, and the source's
      mirror is packed beside it (``<name>-<12 hex digits>.1.h5``), the account saying why. When
      the mirror is on Drive, Drive is flushed (:func:`colabfast.flush_drive`) so that the next
      runtime finds it. Then the mirror is staged and opened. Mirrors of the source's other splits,
      layouts or options are its siblings, kept and named as such in the account; only a mirror of
      the same split, layout and options made from an earlier version of the source is named as one
      to delete.
    - **A Hugging Face dataset**: a ``datasets.Dataset``, the split ``split`` of a ``DatasetDict``
      (``split`` may be left out where it holds one), or an ``IterableDataset`` that ends (each
      recognised by its class's module, ``datasets.arrow_dataset``, ``datasets.dataset_dict``,
      ``datasets.iterable_dataset``: ``datasets`` is not imported to tell). It is packed as
      :func:`colabfast.pack` packs it (its columns and types; images as the bytes it holds, see
      :mod:`colabfast.packing.hf`) into ``mirrors``, default :func:`default_dataset_mirrors` (My Drive's
      ``colabfast-mirrors`` when Drive is mounted, else colabfast's cache folder), named
      ``<info.dataset_name or info.builder_name>[-<split>]-<12 hex digits>.h5``
      (:func:`colabfast.packing.hf.mirror_stem`), and found again there by the fingerprint pack records,
      which covers the dataset's own ``_fingerprint`` (set on every ``Dataset`` and changed by
      every transform that changes its rows: ``datasets/arrow_dataset.py``, ``datasets/fingerprint.py``)
      with its length, first sample's columns and the options. It opens as a
      :class:`colabfast.H5Dataset` whose ``ds[i]`` equals ``dataset[i]`` (for a dataset with no
      format set: ``with_format("torch")``'s values are stored as pack stores tensors, a 0-d tensor
      coming back of shape [1]). An ``IterableDataset`` has
      no ``_fingerprint`` (``datasets/iterable_dataset.py``), and nothing else says whether the
      files or generator behind it still give the same rows, so its rows are read on every call, to
      a temporary Arrow file on local disk (:func:`colabfast.packing.hf.materialized`; deleted once the
      mirror is found or packed), and the SHA-256 of that file is its fingerprint: it is packed
      again only when its rows changed. Its values come back as its features declare them, as the
      same rows read into a ``Dataset`` (a ``float32`` column's values rounded to float32, where
      iterating an ``IterableDataset.from_generator`` gives the generator's own floats). A torch
      ``Dataset`` (any other object) has no fingerprint that says its samples are unchanged, and is
      refused: pack it with ``colabfast.pack(dataset, path)`` and open the mirror at ``path``.

    The source is packed straight from where it is, not staged to local disk first: on the Drive
    simulator the two take about the same time (benchmarks/README.md, "Packing straight from Drive, or
    staging first"), and staging needs local disk for a copy of the source (twice its size, with
    DriveFS's cache) besides the mirror, which a 150 GB ImageNet folder does not fit.

    Staging follows :func:`colabfast.stage`'s rule: RAM disk in Colab when the mirror takes at most
    half the RAM colabfast may use, else local disk; a mirror already on local disk or RAM is opened
    where it is (``to="auto"``). Called again in the same runtime this lists the source, finds the
    mirror and its staged copy, and copies nothing; in a new runtime it stages the mirror from Drive
    and packs nothing. Processes of one machine calling it at once (torchrun's ranks) take turns
    through the pack and stage locks: one packs and stages, the others wait, find the mirror and its
    staged copy, copy nothing and open the same file (their accounts say so).

    What it did and why (with sizes, counts, dates and seconds) is printed when ``progress`` and kept
    as the dataset's ``account`` (also in its ``repr``), e.g. ``found a mirror of it made 2026-11-20
    14:03 UTC (1.2 GB): ...; staged to RAM disk ... in 14 s``.

    Args:
        path: a mirror file, a dataset folder, or an archive (see :data:`ACCEPTS`), as a ``str`` or
            ``os.PathLike``; a mirror's fsspec URL (``gs://bucket/imagenet.h5``: streamed, see
            :mod:`colabfast.opening.remote`); or a Hugging Face ``datasets.Dataset``, ``DatasetDict`` or
            ``IterableDataset`` (or ``IterableDatasetDict``).
        split: a ``DatasetDict``'s split (a ``Dataset``'s own split is accepted too); KITTI's
            ``"training"`` (default) or ``"testing"``; what pack reads of a VOC tree (the image set), a
            YOLO export or an export zip (the split folder), or of Kaggle's ImageNet zip
            (``"train"``, ``"val"``); of a folder whose folders are all splits (``train``, ``val``,
            ``valid``, ``test``: PyTorch's tutorial ``hymenoptera/{train,val}/<class>``, an unzipped
            Roboflow export) that no layout reads whole, the split folder opened as a folder of its own
            (its mirror kept in the tree's mirrors folder); None for other layouts.
        transform, target_transform, output: the drop-in dataset's (``output``: ``"pil"``,
            ``"tensor"`` uint8 [3, H, W], or ``"bytes"``; see :class:`colabfast.H5ImageFolder`).
        image_size: resize when packing, as :func:`colabfast.pack` (an int short side, or ``(H, W)``);
            not for a Hugging Face dataset, whose images are kept as ``dataset[i]`` gives them.
        mirrors: the folder holding mirrors (default: ``colabfast-mirrors`` at the top of My Drive
            for a source on Drive, else beside the source; see :func:`default_mirrors`; for a Hugging
            Face dataset :func:`default_dataset_mirrors`). Mirrors are
            named ``<source name>-<12 hex digits of the fingerprint>.h5`` (:func:`mirror_name`).
        to: where the mirror is staged: ``"auto"``, ``"disk"`` or ``"ram"``, as :func:`colabfast.stage`;
            or ``"stream"``: not staged, but read where it is through a local cache of at most
            ``cache_limit`` bytes, fetched ahead along each epoch's order and emptied behind it
            (:mod:`colabfast.datasets.stream`; docs/streaming.md), for a mirror larger than local
            storage. ``"auto"`` streams a mirror on a slow mount that stage's space rule says does not
            fit (the account says so).
        cache_limit: bytes the stream cache's files may take on local disk (``to="stream"``, or
            ``"auto"`` when it streams); default: half the local disk's free space at
            :func:`colabfast.where.env.work_dir`, divided among torchrun's ``LOCAL_WORLD_SIZE`` ranks
            (each streams into a cache of its own). On Colab, Drive's own cache of what is streamed
            is dropped after each ``cache_limit`` bytes, so the local peak stays within twice it.
        progress: show pack's and stage's progress bars and print the account.
        **pack_options: :func:`colabfast.pack`'s ``layout``, ``labels``, ``year``, ``store``, ``quality``,
            ``shuffle``, ``seed``, ``workers``, ``on_error``, ``retries`` (for a Hugging Face dataset:
            ``quality``, ``workers``, ``on_error``, ``retries``; ``store`` only ``"encoded"``).

    Returns:
        The drop-in dataset for the mirror's layout (:data:`DROP_INS`): :class:`colabfast.H5ImageFolder`
        for ImageFolder trees, archives and folders of images (targets -1), :class:`colabfast.H5Kitti`
        for KITTI, :class:`colabfast.H5CocoDetection`, :class:`colabfast.H5VOCDetection` and
        :class:`colabfast.H5VOCSegmentation` for COCO and VOC, :class:`colabfast.H5Dataset` for YOLO
        exports, image/mask folders, CSV tables, Hugging Face datasets and mirrors of any dataset; its
        ``account`` attribute
        (str, one line per step) says what was done.

    Raises:
        FileNotFoundError: nothing at ``path``, or a folder holding no images (naming what it holds);
            :class:`NothingToOpen` for an empty folder, at once.
        MirrorError: (a ``ValueError``) a file that is not a mirror or archive (a CSV table, a JSON or
            YAML file, an image: what to pass instead).
        PackRefused: (a ``ValueError``) a split the layout lacks, pack options given with a mirror, or
            an argument :func:`colabfast.pack` refuses. SplitRefused (a ``PackRefused``): a folder of split
            folders, or an export zip of several splits (checked against its listing: nothing is
            extracted), opened without ``split`` or with one it lacks; the message lists its splits and
            the call to make; so is a ``DatasetDict`` of several splits without ``split``, or with
            one it lacks (its splits with their rows, and ``open_dataset(dataset_dict, split=...)``).
            PackRefused also: ``split`` given with a ``Dataset`` of another split; a folder's pack
            option (``layout``, ``labels``, ``year``, ``shuffle``, ``seed``), ``image_size`` (its images
            are kept as it holds them) or ``store="raw"`` with a Hugging Face dataset.
        OpenRefused: (a ``TypeError``) ``path`` is neither a path nor a Hugging Face dataset (a
            torch ``Dataset``: the message says to ``colabfast.pack`` it and open the mirror).
        FieldError: a Hugging Face dataset's first row that no mirror holds.
        StageRefused: (a ``ValueError``) a ``to`` that is not ``"auto"``, ``"disk"``, ``"ram"`` or
            ``"stream"``; ``cache_limit`` with ``"disk"`` or ``"ram"``.
        CacheLimitError: (a ``ValueError``) a ``cache_limit`` smaller than the mirror's largest block
            of 64 samples (the message gives the smallest that works), or above the local disk's free
            space (the most that fits), or a ``LOCAL_WORLD_SIZE`` that is no number;
            :class:`colabfast.DataLoader` raises it too for one that cannot hold the blocks one batch reads.
        TypeError: an option that is not pack's.
        OSError: the mirrors folder cannot be written (read-only or full Drive; the message says to
            pass ``mirrors=`` elsewhere), or as pack and stage raise.
        MirrorError: the mirror's name in ``mirrors`` is taken by a file colabfast did not write (it
            is never overwritten) or by a symbolic link to nothing (never written through: the
            mirror would land outside ``mirrors``), or a mirror is damaged.
        PackError, UnsafeArchiveError, StageError, DriveError: as the steps raise them.
    """
    with contextlib.ExitStack() as stack:  # an IterableDataset's rows, read to local disk, go once packed
        if to not in ("auto", "disk", "ram", "stream") or (cache_limit is not None and to in ("disk", "ram")):
            from colabfast.errors import StageRefused

            raise StageRefused(f"to must be 'auto', 'disk', 'ram' or 'stream', not {to!r}" if to not in
                               ("disk", "ram") else f"cache_limit is for to='stream' (or 'auto'), not to={to!r}")
        if cache_limit is not None and (not isinstance(cache_limit, int) or cache_limit < 1):
            from colabfast.errors import CacheLimitError

            raise CacheLimitError(f"cache_limit must be a positive number of bytes, not {cache_limit!r}")
        from colabfast.opening.remote import is_url, open_remote

        if is_url(path):  # a bucket's mirror (fsspec), streamed
            if image_size is not None or mirrors is not None or pack_options:
                from colabfast.packing import PackRefused

                raise PackRefused(f"{path} is a URL: only a mirror is opened from one, so image_size, mirrors and "
                                  "pack's options do not apply; pack the dataset first and open its mirror's URL")
            dataset = open_remote(str(path), split, transform=transform, target_transform=target_transform,
                                  output=output, to=to, cache_limit=cache_limit)
        else:
            from colabfast.where._fileio import one_open

            with one_open():  # the header, layout and index read through one open of the mirror
                dataset = _open(path, split, transform, target_transform, output, image_size, mirrors, to,
                                progress, pack_options, stack, cache_limit)
        if progress:
            print(dataset.account)
        return dataset


def _open(path: Any, split: Optional[str], transform: Optional[Callable], target_transform: Optional[Callable],
          output: str, image_size: Any, mirrors: Optional[PathLike], to: str, progress: bool, pack_options: dict,
          stack: contextlib.ExitStack, cache_limit: Optional[int] = None) -> MirrorDataset:
    unknown = sorted(set(pack_options) - set(_pack_options())) if pack_options else []  # (imports packing)
    if unknown:
        raise OpenRefused(f"open_dataset() got unexpected keyword arguments {', '.join(unknown)}: it takes pack()'s "
                          f"{', '.join(_pack_options())}")
    steps: list[str] = []
    if not isinstance(path, (str, os.PathLike)):  # a Hugging Face dataset, packed as pack packs it
        rows, wanted = _dataset_wanted(path, split, image_size, mirrors, pack_options, progress, steps, stack)
        mirror, check = _found_or_packed(rows, wanted, "dataset", None, image_size, progress, pack_options, steps)
        return _staged_and_opened(rows, "dataset", None, mirror, check, None, image_size, to, progress, pack_options,
                                  steps, transform, target_transform, output, cache_limit)
    src = Path(os.path.abspath(os.path.expanduser(path)))
    kind = what_is(src)
    # before anything is imported or listed with retries (an empty folder took 13 s to be refused)
    if kind == "folder" and (held := _empty(src)) is not None:
        raise NothingToOpen(f"nothing to open: {src} is an empty folder (it holds {held}): pass the folder that "
                            "holds the dataset")
    if kind == "mirror":
        given = [name for name, v in (("image_size", image_size), ("mirrors", mirrors)) if v is not None]
        if given or pack_options:
            from colabfast.packing import PackRefused

            raise PackRefused(f"{src} is a mirror already: {', '.join(given + sorted(pack_options))} apply when "
                             "open_dataset packs a folder or an archive")
        mirror, check = src, None
    early = None
    if kind != "mirror":
        folder = Path(os.path.abspath(mirrors)) if mirrors is not None else default_mirrors(src)
        given = pack_options.get("layout", "auto")  # a folder's layout is the one its mirror records
        early = _Early.start(src, folder, to, progress, split, None if given == "auto" or kind != "folder" else given)
        try:
            source = _resolved(src, split, pack_options)  # decided once (a listing on Drive), given to pack
            if source.root and kind == "folder":  # a tree of splits: the split's folder opened as a folder of
                steps.append(f"{src} holds the splits {', '.join(source.splits or ())}: opening {source.root}/")
                if early is not None:  # its own, its mirror kept in the tree's mirrors folder
                    early.stop()
                src, split = source.folder, None
                early = _Early.start(src, folder, to, progress)
            if kind == "folder" or source.columns:
                pack_options = {**pack_options, "layout": source.name}
            wanted = _listed(src, kind, split, image_size, folder, pack_options, steps)
            mirror, check = _found_or_packed(src, wanted, kind, split, image_size, progress, pack_options, steps,
                                             early)
        finally:
            if early is not None:
                early.stop()  # a no-op once the listing named what it staged (then it is taken below)
    return _staged_and_opened(src, kind, split, mirror, check, early, image_size, to, progress, pack_options, steps,
                              transform, target_transform, output, cache_limit)


def _staged_and_opened(src: Union[Path, _InMemory], kind: str, split: Optional[str], mirror: Path,
                       check: Optional[_Wanted], early: Optional[_Early], image_size: Any, to: str, progress: bool,
                       pack_options: dict, steps: list[str], transform: Optional[Callable],
                       target_transform: Optional[Callable], output: str,
                       cache_limit: Optional[int] = None) -> MirrorDataset:
    """:func:`open_dataset`'s last steps: ``mirror`` (of ``src``: given, found or packed) staged,
    checked, and opened as its drop-in dataset, whose ``account`` is ``steps``."""
    # A mirror found (or given) is checked in its staged copy, which is opened next anyway: one
    # vetting of one file, not one of the copy on Drive (read over the link) and one of the local copy.
    at = len(steps)
    local = (early.take(mirror, steps) if early is not None else None) or _staged(mirror, to, progress, steps)
    streamed = local is _STREAM
    while kind == "mirror" or check is not None:
        try:
            steps.insert(at, _checked(mirror, mirror if streamed else local, src, check))
            break
        except _Impostor as exc:  # a file claiming this source's fingerprint: packed beside, never overwritten
            assert check is not None  # only a mirror looked for is checked for what it holds
            steps.append(str(exc))
            mirror, check = _found_or_packed(src, check, kind, split, image_size, progress, pack_options, steps,
                                             passed=check.passed + [mirror])
            at = len(steps)
            local = _staged(mirror, to, progress, steps)
            streamed = local is _STREAM
    if kind != "mirror" and _packs_split(kind, pack_options):
        split = None  # it chose what pack read
    dataset = drop_in(mirror if streamed else local, split, transform=transform, target_transform=target_transform,
                      output=output)
    if streamed:
        steps.append(_streamed(dataset, mirror, cache_limit, steps.pop()))
    steps.append(f"opened as {type(dataset).__name__}: {len(dataset):,} {'samples' if kind == 'dataset' else 'images'}"
                 + (f" in {len(dataset.classes)} classes" if getattr(dataset, "classes", None) else ""))
    dataset.account = "\n".join(steps)
    return dataset


_STREAM = Path("<streamed>")  # what _staged returns for a mirror read where it is through a stream cache


def _staged(mirror: Path, to: str, progress: bool, steps: list[str]) -> Path:
    """``mirror`` staged by :func:`colabfast.stage`'s rule (or where it is, when local and ``to="auto"``);
    ``_STREAM`` for one to stream (``to="stream"``, or ``"auto"`` where it does not fit), the reason the
    last of ``steps``."""
    from colabfast.errors import NotEnoughSpace
    from colabfast.staging.copy import copied_last
    from colabfast.staging.pipeline import stage

    where = env.storage(mirror)
    if to == "stream":
        steps.append("to='stream'")
        return _STREAM
    if to == "auto" and where in ("disk", "ram"):
        steps.append(f"opened in place: it is on local {'RAM' if where == 'ram' else 'disk'} already")
        return mirror
    before = _before_staging(mirror, to)
    start = time.perf_counter()
    try:
        local = stage(mirror, to=to, progress=progress)
    except NotEnoughSpace as exc:
        if to != "auto":
            raise
        steps.append(f"it does not fit on local storage ({exc.strerror or exc})")
        return _STREAM
    steps.append(_staging_words(local, before, time.perf_counter() - start, copied=copied_last()))
    return local


def _streamed(dataset: MirrorDataset, mirror: Path, cache_limit: Optional[int], why: str) -> str:
    """Make ``dataset`` (opened on ``mirror`` where it is) read through a stream cache; the account's line."""
    from colabfast.datasets.stream import UNIT_SAMPLES
    from colabfast.loading.streaming import cache_folder, discard, limit_for, stream

    directory = cache_folder(mirror.stem)
    try:
        cache_limit, how = limit_for(directory, cache_limit, drivefs=env.drive_kind(mirror) == "drivefs")
        caches = stream(dataset, cache_limit, directory)
    except BaseException:
        discard(directory, os.getpid())
        raise
    blocks = sum(len(c.sizes) for c in caches)
    return (f"streamed from {mirror} through a local cache of at most {human_bytes(cache_limit)} ({how}) at "
            f"{directory}: {blocks:,} blocks of {UNIT_SAMPLES} samples, fetched ahead along each epoch's order by "
            f"colabfast.DataLoader ({why})")
