"""A source's mirror found by its fingerprint, or packed: what is wanted of it (the folder's layout
and split, or a dataset object's), the checks that a file at a mirror's name is that mirror, and
packing it when none is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import inspect
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from colabfast.errors import Error, NothingToOpen, OpenRefused, SourceNotFound
from colabfast.opening.kinds import ACCEPTS
from colabfast.opening.mirrors import (
    _beside,
    _check_writable,
    _created,
    _InMemory,
    _look_at,
    _older_mirrors,
    _seconds,
    default_dataset_mirrors,
    kaggle_note,
    mirror_name,
)
from colabfast.where import env
from colabfast.where._fileio import (
    PathLike,
    human_bytes,
    locked,
    retry,
    state_name,
)

if TYPE_CHECKING:
    from colabfast.opening.early import _Early


__all__ = ["OpenOptions"]  # internal to colabfast.opening: its steps' options


@dataclasses.dataclass(frozen=True)
class OpenOptions:
    """What :func:`colabfast.open_dataset` was asked for (its arguments but ``path``), carried through
    its steps; ``split`` and ``pack_options`` as the source's resolution leaves them."""

    split: Optional[str] = None
    transform: Optional[Callable] = None
    target_transform: Optional[Callable] = None
    output: str = "pil"
    image_size: Any = None
    mirrors: Optional[PathLike] = None
    to: str = "auto"
    cache_limit: Optional[int] = None
    progress: bool = True
    pack_options: dict = dataclasses.field(default_factory=dict)  # pack's options, checked by open_dataset


class _Impostor(Exception):
    """A complete mirror found at the name of this source's mirror, recording its fingerprint, whose
    samples are not the source's (see :func:`colabfast.packing.common.differs`); the message is
    the account's line."""


@dataclasses.dataclass
class _Wanted:
    """The mirror :func:`open_dataset` looks for: the source's fingerprint, and what that mirror
    holds, from one listing of the source (see :func:`colabfast.packing.source_listing`)."""

    folder: Path  # the mirrors folder
    fingerprint: str
    contents: Any  # colabfast.packing.common.Contents
    passed: list[Path] = dataclasses.field(default_factory=list)  # files at its names that are not it


def _checked(mirror: Path, local: Path, src: Union[Path, _InMemory], wanted: Optional[_Wanted]) -> str:
    """What was found at ``mirror`` (staged at ``local``), in words: the mirror given, or (with
    ``wanted``) the mirror of ``src`` that open_dataset looked for.

    Raises:
        MirrorError: not a complete colabfast mirror, or (``wanted``) not one recording the
            fingerprint of ``src`` with these options: a file at that name is never overwritten.
        _Impostor: (``wanted``) one recording that fingerprint whose samples are not the source's.
    """
    from colabfast.errors import MirrorError
    from colabfast.packing.common import differs

    m = _look_at(local)
    assert m is not None  # staged, or opened where it is
    if wanted is None:
        if m.header is None:
            raise MirrorError(m.why)
        return f"{mirror} is a mirror of {m.header.source} made {_created(m.header)} ({human_bytes(m.size)})"
    if m.header is None or m.fingerprint != wanted.fingerprint:
        whose = (f"a mirror of {m.header.source}" if m.header is not None
                 else f"not a complete colabfast mirror ({m.why})")
        raise MirrorError(f"{mirror} is {whose}, where open_dataset would put the mirror of {src}: it is never "
                          f"overwritten. Move it away, or pass mirrors= another folder.")
    # The fingerprint is an attribute any file can carry: what it stands for is checked too.
    why = differs(local, wanted.contents)
    if why is not None:
        raise _Impostor(f"{mirror} records the fingerprint of {src} with these options, but {why}: it is not "
                        "this source's mirror, so it is not used (nor overwritten: delete it if you do not need it)")
    return f"found a mirror of it made {_created(m.header)} ({human_bytes(m.size)}): {mirror}"


def _listed(src: Path, kind: str, split: Optional[str], image_size: Any, folder: Path,
            options: dict, steps: list[str]) -> _Wanted:
    """List ``src`` (no image read): the mirror of it with these options, in the mirrors ``folder``,
    that open_dataset wants."""
    from colabfast.packing import SplitRefused, source_listing

    packs_split = _packs_split(kind, options)
    if kind == "folder" and not packs_split:  # a wrong split is named now, not after packing
        from colabfast.layouts import REGISTRY

        layout = options.get("layout")  # given, or as _resolved decided it
        if layout in REGISTRY:
            REGISTRY[layout].split_args(split)
    start = time.perf_counter()
    listing = inspect.signature(source_listing).parameters  # the options a mirror's fingerprint depends on
    fingerprint_options = {k: v for k, v in options.items() if k in listing and k not in ("split", "image_size")}
    try:
        fingerprint, described, contents = source_listing(src, split=split if packs_split else None,
                                                          image_size=image_size, **fingerprint_options)
    except SplitRefused as exc:
        raise exc.to("open_dataset") from None
    except FileNotFoundError as exc:
        if isinstance(exc, Error) and not isinstance(exc, SourceNotFound):  # a layout's missing file (a COCO JSON)
            raise
        raise NothingToOpen(f"{exc}. {src} holds {_contents(src)}. {ACCEPTS}.") from exc
    steps.append(f"listed {src} in {_seconds(time.perf_counter() - start)}: {described}")
    return _Wanted(folder, fingerprint, contents)


MAX_BESIDE = 10  # files at a mirror's names that are not it, before open_dataset gives up on that folder


def _found_or_packed(src: Union[Path, _InMemory], wanted: _Wanted, kind: str, opts: OpenOptions, steps: list[str],
                     early: Optional[_Early] = None, passed: Optional[list[Path]] = None
                     ) -> tuple[Path, Optional[_Wanted]]:
    """The mirror of ``src`` with the options ``opts`` in its mirrors folder, packed there now unless a file
    has its name; with that file, ``wanted`` (what :func:`_checked` checks once it is staged). Its name
    is :func:`mirror_name`'s, or, beside the ``passed`` files that took the earlier names but are
    not it, the next copy's.

    Raises:
        MirrorError: a symbolic link at the name (pack would write where it leads, outside the
            folder), or ``MAX_BESIDE`` files at its names that are not it.
    """
    from colabfast.errors import MirrorError
    from colabfast.packing import pack

    split, image_size, progress, options = opts.split, opts.image_size, opts.progress, opts.pack_options
    packs_split = _packs_split(kind, options)
    folder, passed = wanted.folder, passed or []
    wanted.passed = passed
    if len(passed) >= MAX_BESIDE:
        raise MirrorError(f"{folder} holds {len(passed)} files at the names of the mirror of {src} that are not it "
                          f"({', '.join(p.name for p in passed[:3])}, ...): move them away, or pass mirrors= another "
                          "folder.")
    dst = folder / mirror_name(src, wanted.fingerprint, len(passed))
    if early is not None:
        early.expect(dst)  # staging another mirror (the source changed) stops now, before any packing
    # One process at a time looks for this mirror and packs it: a second one waits, then finds it.
    with locked(env.cache_dir() / "locks" / f"open-{state_name(dst)}.lock", f"opening {dst}"):
        try:  # pack publishes a mirror whole (a rename), so a file at its name is complete or foreign
            retry(lambda: os.stat(dst), 5)
            return dst, wanted
        except FileNotFoundError:
            if os.path.islink(dst):  # pack would follow it, and write the mirror where it leads
                raise MirrorError(f"{dst} is a symbolic link to {os.readlink(dst)}, which does not exist: "
                                  "open_dataset never writes a mirror through a link, which would put it outside "
                                  f"{folder}. Remove the link, or pass mirrors= another folder.") from None
        _check_writable(folder)
        start = time.perf_counter()
        try:
            pack(src.dataset if isinstance(src, _InMemory) else src, dst, split=split if packs_split else None,
                 image_size=image_size, progress=progress, **options)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                try:
                    _check_writable(folder)
                except OSError as cause:  # the mirrors folder, not the local disk pack builds on, is the problem
                    raise cause from exc
            raise
    made = _look_at(dst)
    assert made is not None and made.header is not None  # pack published it, complete
    where = f"beside {passed[-1].name}" if passed else f"no mirror of it with these options in {folder}:"
    read = ("reading the dataset" if isinstance(src, _InMemory) else
            f"reading the source straight from {'Drive' if env.drive_kind(src) is not None else 'where it is'}")
    steps.append(f"{where} packed {dst} in {_seconds(time.perf_counter() - start)} ({human_bytes(made.size)}), "
                 f"{read}")
    for old in _older_mirrors(folder, src, dst):
        if old.path in passed:
            continue
        if isinstance(src, _InMemory) and old.header is not None:  # a name says less than a path
            steps.append(f"kept {old.path.name}, made {_created(old.header)} ({human_bytes(old.size)}): a mirror "
                         "of another dataset of this name or split, or of an earlier version of this one")
        else:
            steps.append(_beside(old, made.header))
    if env.drive_kind(folder) is not None:
        steps.append(_flushed(folder))
    return dst, None


FOLDER_OPTIONS = ("layout", "labels", "year", "shuffle", "seed")  # pack's options that a dataset object refuses


def _dataset_wanted(obj: Any, split: Optional[str], image_size: Any, mirrors: Optional[PathLike], options: dict,
                    progress: bool, steps: list[str], stack: contextlib.ExitStack) -> tuple[_InMemory, _Wanted]:
    """The Hugging Face dataset ``obj`` (the split ``split`` of a ``DatasetDict``; an ``IterableDataset``
    read to local disk first, for as long as ``stack`` is open) and the mirror of it that
    :func:`open_dataset` wants, found by its fingerprint.

    Raises:
        OpenRefused: ``obj`` is not a Hugging Face dataset. SplitRefused, PackRefused: see
            :func:`_pick_split`; a folder's pack option. FieldError: a first sample no mirror holds.
    """
    from colabfast.packing import PackRefused, dataset_fingerprint
    from colabfast.packing.common import Contents, mirror_options
    from colabfast.packing.dataset import describe_dataset
    from colabfast.packing.hf import hf_kind, materialized, mirror_stem

    kind = hf_kind(obj)
    if kind is None:
        raise OpenRefused(_not_openable(obj))
    given = sorted(set(options) & set(FOLDER_OPTIONS))
    if given:
        raise PackRefused(f"{', '.join(given)}: pack options for a folder or an archive; a Hugging Face {kind} is "
                          "packed as its rows are (its columns, in its order): leave them out")
    if image_size is not None:  # pack keeps a dataset's images as they are: it would only be recorded
        raise PackRefused(f"image_size={image_size!r}: a Hugging Face {kind}'s images are packed as it holds them, "
                          "so that the mirror's samples equal dataset[i]; resize them in the dataset first "
                          "(dataset.map, or a transform), or leave image_size out")
    dataset, split = _pick_split(obj, split, kind)
    if kind.startswith("Iterable"):
        start = time.perf_counter()
        dataset, n = stack.enter_context(materialized(dataset, env.work_dir() / "hf", progress))
        steps.append(f"read the IterableDataset's {n:,} rows to local disk in {_seconds(time.perf_counter() - start)}"
                     ": it has no fingerprint (datasets gives one to a Dataset only), so its rows are read on every "
                     "call and its mirror is found by their SHA-256")
    elif not isinstance(getattr(dataset, "_fingerprint", None), str):
        raise OpenRefused(f"this {type(dataset).__name__} has no _fingerprint (datasets/arrow_dataset.py sets one on "
                          "every Dataset): open_dataset cannot tell its mirror from a stale one. Pack it with "
                          "colabfast.pack(dataset, path) and open that: colabfast.open_dataset(path)")
    name = mirror_stem(dataset, split)
    store, quality = options.get("store", "encoded"), options.get("quality", 90)
    fingerprint = dataset_fingerprint(dataset, store=store, quality=quality)
    columns = ", ".join(getattr(dataset, "column_names", None) or [])
    src = _InMemory(dataset, name, describe_dataset(dataset),
                    f"the Hugging Face dataset {name} ({len(dataset):,} rows: {columns}; its fingerprint "
                    f"{dataset._fingerprint[:16]})")
    steps.append(f"{src}: its mirror is found by that fingerprint, with the options")
    folder = Path(os.path.abspath(mirrors)) if mirrors is not None else default_dataset_mirrors()
    steps += kaggle_note(folder) if mirrors is None else []
    return src, _Wanted(folder, fingerprint, Contents(mirror_options(store, None, quality), source=src.source,
                                                      layout="dataset"))


def _pick_split(obj: Any, split: Optional[str], kind: str) -> tuple[Any, Optional[str]]:
    """``(dataset, split)``: for a ``DatasetDict`` (or ``IterableDatasetDict``) its split ``split``, or
    its only one when ``split`` is None; for a dataset itself, the dataset and its own split
    (``dataset.split``, None for one made with ``from_dict``).

    Raises:
        SplitRefused: (a ``PackRefused``, a ``colabfast.Error``) a dict of several splits and no
            ``split``, or a ``split`` it lacks: the message lists its splits and the call to make.
        PackRefused: ``split`` given with a dataset of another split (or of none).
    """
    from colabfast.packing import PackRefused, SplitRefused

    if kind.endswith("Dict"):
        names = [str(name) for name in obj]
        if split in names or (split is None and len(names) == 1):
            chosen = split if split is not None else names[0]
            return obj[chosen], chosen
        found = {name: f"{obj[name].num_rows:,} rows" if getattr(obj[name], "num_rows", None) is not None
                 else "rows not counted" for name in names}
        raise SplitRefused(f"this {kind}", found, split, "open_dataset", expr="dataset_dict")
    own = getattr(obj, "split", None)
    own = str(own) if own is not None else None
    if split is not None and split != own:
        raise PackRefused(f"split={split!r}: this {kind} is one split already ({own or 'it records none'}); "
                          f"split= picks one of a DatasetDict's. Leave split= out, or pass the DatasetDict")
    return obj, own


def _not_openable(obj: Any) -> str:
    """Why open_dataset does not take ``obj`` (neither a path nor a Hugging Face dataset), and what to call."""
    cls = type(obj)
    what = f"a {cls.__module__}.{cls.__qualname__}"
    if hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and not isinstance(obj, (list, tuple, dict)):
        return (f"open_dataset got {what}, a map-style dataset: unlike a Hugging Face Dataset (whose _fingerprint "
                "changes with its rows) it has no fingerprint that says whether its samples changed, so open_dataset "
                "could not tell its mirror from a stale one. Pack it once with colabfast.pack(dataset, "
                "'/content/drive/MyDrive/colabfast-mirrors/mine.h5') and open that mirror: "
                "colabfast.open_dataset('/content/drive/MyDrive/colabfast-mirrors/mine.h5')")
    return (f"open_dataset got {what}: it takes a path (str or os.PathLike: {ACCEPTS[len('open_dataset accepts '):]}) "
            "or a Hugging Face datasets.Dataset, DatasetDict (with split=) or IterableDataset")


def _resolved(src: Path, split: Optional[str], options: dict) -> Any:
    """What the folder or archive ``src`` is (`colabfast.packing.resolve`: its layout, given or detected,
    and for a tree of split folders the one ``split`` opens), decided here once and handed to listing and
    packing by name.

    Raises:
        SplitRefused: a tree of split folders and no ``split``, or one it lacks (naming open_dataset)."""
    from colabfast.packing import SplitRefused, resolve

    try:
        return resolve(src, options.get("layout", "auto"), options.get("labels"), split)
    except SplitRefused as exc:
        raise exc.to("open_dataset") from None


def _packs_split(kind: str, options: dict) -> bool:
    """Whether ``split`` chooses what pack reads (an archive's part, VOC's image set, a YOLO export's
    split), rather than a split of the mirror (KITTI's); ``options["layout"]`` a folder's layout, as
    :func:`_resolved` gives it."""
    from colabfast.layouts import LAYOUTS

    layout = options.get("layout")
    return kind == "archive" or layout in LAYOUTS and LAYOUTS[layout].packs_split


def _contents(folder: Path) -> str:
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        return f"nothing that can be listed ({exc.strerror})"
    if not names:
        return "nothing (it is empty)"
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return f"{len(names)} entries: {shown}"


def _flushed(folder: Path) -> str:
    """Push the new mirror to Drive (:func:`colabfast.flush_drive`); what happened, in words."""
    from colabfast.drive.mounting import flush_drive
    from colabfast.errors import DriveError

    start = time.perf_counter()
    try:
        flush_drive(folder, quiet=True)
    except DriveError as exc:  # the mirror is complete here; only its upload is in doubt
        warnings.warn(f"open_dataset: {exc}", stacklevel=4)
        return (f"flushing Drive failed ({exc}): the mirror may not be on Drive yet; call "
                "colabfast.flush_drive() before this runtime ends")
    return f"flushed Drive in {_seconds(time.perf_counter() - start)}, so the next runtime finds the mirror"


