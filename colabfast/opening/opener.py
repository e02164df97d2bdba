""":func:`open_dataset`: what the path is (:mod:`~colabfast.opening.kinds`), its mirror found or packed
(:mod:`~colabfast.opening.found`, named by :mod:`~colabfast.opening.mirrors`), staged (early where it can be:
:mod:`~colabfast.opening.early`) and opened with its drop-in. :mod:`colabfast.opening` says how each step is
decided."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from colabfast.errors import NothingToOpen, OpenRefused
from colabfast.opening.early import _before_staging, _Early, _staging_words
from colabfast.opening.found import (
    OpenOptions,
    _checked,
    _dataset_wanted,
    _found_or_packed,
    _Impostor,
    _listed,
    _packs_split,
    _resolved,
)
from colabfast.opening.kinds import OWN_ARGUMENTS, _empty, what_is
from colabfast.opening.mirrors import default_mirrors, drop_in, kaggle_note
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

    A mirror (an ``.h5`` made by :func:`colabfast.pack`) is staged and opened. A folder, an archive or a
    Hugging Face dataset is packed into a mirror in ``mirrors`` the first time and found there by its
    fingerprint after that (a changed source gets a new mirror), then staged and opened. What was done
    and why is the dataset's ``account``. How each step is decided: [How opening works](../how-opening-works.md).

    Examples:
        >>> import colabfast as cf
        >>> drive = cf.mount()
        Mounted at /content/drive
        >>> ds = cf.open_dataset(drive / "flowers", progress=False)  # packed to My Drive/colabfast-mirrors
        >>> type(ds).__name__, len(ds), ds.classes
        ('H5ImageFolder', 8, ['daisy', 'rose'])
        >>> again = cf.open_dataset(drive / "flowers", progress=False)  # found: nothing packed
        >>> print(again.account)
        listed /content/drive/MyDrive/flowers in ...
        found a mirror of it made ...
        opened as H5ImageFolder: 8 images in 2 classes

    Args:
        path: a mirror, a dataset folder or an archive (:data:`ACCEPTS`), as ``str`` or ``os.PathLike``;
            a mirror's fsspec URL (streamed: :mod:`colabfast.opening.remote`); a Hugging Face ``Dataset``,
            ``DatasetDict``, ``IterableDataset``, ``IterableDatasetDict`` or ``save_to_disk`` folder.
        split: a ``DatasetDict``'s split; KITTI's ``"training"`` (default) or ``"testing"``; what pack
            reads of a VOC tree, a YOLO export, Kaggle's ImageNet zip (``"train"``, ``"val"``) or a folder
            of split folders (``train``, ``val``, ...); None for other layouts.
        transform, target_transform, output: the drop-in dataset's (``output``: ``"pil"``, ``"tensor"``
            uint8 [3, H, W], or ``"bytes"``; see :class:`colabfast.H5ImageFolder`).
        image_size: resize when packing, as :func:`colabfast.pack`; not for a Hugging Face dataset.
        mirrors: the folder of mirrors (default :func:`default_mirrors`: ``colabfast-mirrors`` at the top of
            My Drive for a source on Drive, on Kaggle in ``/kaggle/working``, else beside it).
        to: ``"auto"``, ``"disk"`` or ``"ram"``, as :func:`colabfast.stage`; or ``"stream"``: read where it
            is through a local cache ([streaming](../streaming.md)); ``"auto"`` streams what does not fit.
        cache_limit: bytes the stream cache may take (default: half the local disk's free space, shared
            among torchrun's local ranks).
        progress: show pack's and stage's progress bars and print the account.
        **pack_options: :func:`colabfast.pack`'s ``layout``, ``labels``, ``year``, ``store``, ``quality``,
            ``shuffle``, ``seed``, ``workers``, ``on_error``, ``retries`` (for a Hugging Face dataset:
            ``quality``, ``workers``, ``on_error``, ``retries``; ``store`` only ``"encoded"``).

    Returns:
        The drop-in dataset for the mirror's layout (:data:`DROP_INS`, e.g. :class:`colabfast.H5ImageFolder`);
        its ``account`` (str, one line per step) says what was done.

    Raises:
        NothingToOpen: (a ``FileNotFoundError``) nothing at ``path``, an empty folder, or no images in it.
        MirrorError: a file that is neither mirror nor archive (the message says what to pass); a name in
            ``mirrors`` taken by a file colabfast did not write or a dangling link; a damaged mirror.
        PackRefused: a split the layout lacks; pack options with a mirror; what :func:`colabfast.pack`
            refuses. SplitRefused (a ``PackRefused``): splits to choose from and no ``split``, or a wrong one.
        OpenRefused: (a ``TypeError``) neither a path nor a Hugging Face dataset; an option not pack's.
        FieldError: a Hugging Face dataset's first row that no mirror holds.
        StageRefused: an unknown ``to``; ``cache_limit`` with ``"disk"`` or ``"ram"``.
        CacheLimitError: a ``cache_limit`` below the mirror's largest block of 64 samples, above the local disk's
            free space (the most that fits), or a ``LOCAL_WORLD_SIZE`` that is no number.
        OSError: the mirrors folder cannot be written (pass ``mirrors=`` elsewhere), or as pack and stage raise.
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
                opts = OpenOptions(split, transform, target_transform, output, image_size, mirrors, to, cache_limit,
                                   progress, pack_options)
                dataset = _open(path, opts, stack)
        if progress:
            print(dataset.account)
        return dataset


def _open(path: Any, opts: OpenOptions, stack: contextlib.ExitStack) -> MirrorDataset:
    split, image_size, mirrors, to, progress = opts.split, opts.image_size, opts.mirrors, opts.to, opts.progress
    pack_options = opts.pack_options
    unknown = sorted(set(pack_options) - set(_pack_options())) if pack_options else []  # (imports packing)
    if unknown:
        raise OpenRefused(f"open_dataset() got unexpected keyword arguments {', '.join(unknown)}: it takes pack()'s "
                          f"{', '.join(_pack_options())}")
    steps: list[str] = []
    marked = isinstance(path, (str, os.PathLike)) and any(  # save_to_disk's marks: packing imported only then
        (Path(os.path.expanduser(path)) / name).is_file() for name in ("state.json", "dataset_dict.json"))
    saved = None
    if marked:
        from colabfast.packing.hf import load_saved

        saved = load_saved(path)
    if saved is not None:  # a folder datasets' save_to_disk wrote: its mirrors beside it
        where = Path(os.path.abspath(os.path.expanduser(path)))
        steps.append(f"{where} is a Hugging Face dataset saved with save_to_disk: read with datasets.load_from_disk")
        if mirrors is None:
            mirrors = default_mirrors(where)
            steps += kaggle_note(Path(mirrors))
        path = saved
    if not isinstance(path, (str, os.PathLike)):  # a Hugging Face dataset, packed as pack packs it
        rows, wanted = _dataset_wanted(path, split, image_size, mirrors, pack_options, progress, steps, stack)
        opts = dataclasses.replace(opts, split=None)
        mirror, check = _found_or_packed(rows, wanted, "dataset", opts, steps)
        return _staged_and_opened(rows, "dataset", mirror, check, None, opts, steps)
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
        steps += kaggle_note(folder) if mirrors is None else []
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
            opts = dataclasses.replace(opts, split=split, pack_options=pack_options)
            mirror, check = _found_or_packed(src, wanted, kind, opts, steps, early)
        finally:
            if early is not None:
                early.stop()  # a no-op once the listing named what it staged (then it is taken below)
    return _staged_and_opened(src, kind, mirror, check, early, opts, steps)


def _staged_and_opened(src: Union[Path, _InMemory], kind: str, mirror: Path, check: Optional[_Wanted],
                       early: Optional[_Early], opts: OpenOptions, steps: list[str]) -> MirrorDataset:
    """:func:`open_dataset`'s last steps: ``mirror`` (of ``src``: given, found or packed) staged,
    checked, and opened as its drop-in dataset, whose ``account`` is ``steps``."""
    split, to, progress, pack_options = opts.split, opts.to, opts.progress, opts.pack_options
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
            mirror, check = _found_or_packed(src, check, kind, opts, steps, passed=check.passed + [mirror])
            at = len(steps)
            local = _staged(mirror, to, progress, steps)
            streamed = local is _STREAM
    if kind != "mirror" and _packs_split(kind, pack_options):
        split = None  # it chose what pack read
    dataset = drop_in(mirror if streamed else local, split, transform=opts.transform,
                      target_transform=opts.target_transform, output=opts.output)
    if streamed:
        steps.append(_streamed(dataset, mirror, opts.cache_limit, steps.pop()))
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
