"""From where the data is to a fast dataset in one call: :func:`open_dataset`.

It does what the step-by-step calls do (:func:`colabfast.pack` a folder or archive into a mirror,
:func:`colabfast.flush_drive`, :func:`colabfast.stage` the mirror, open it with its drop-in dataset),
deciding each step the way a careful user would. The decisions are small functions, each given what
it decides from (what the path is, where its mirrors live, what a mirror is named, which dataset reads
it), and :func:`open_dataset` only wires them, as torchvision's ``datasets/folder.py`` does.

A source's mirrors are found by the fingerprint :func:`colabfast.pack` records in each (the source's
files with their sizes and times, its layout, the options), and named by it, so a changed source or
other options make a new mirror beside the old ones, which stay until you delete them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import inspect
import os
import stat
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from colabfast import env
from colabfast._fileio import PathLike, file_version, human_bytes, locked, partial_path, retry, state_name, unchanged
from colabfast.archive import archive_suffix, strip_archive_suffix
from colabfast.env import MIRRORS_FOLDER  # re-exported: the folder open_dataset keeps mirrors in
from colabfast.errors import Error, NothingToOpen, OpenRefused, SourceNotFound

if TYPE_CHECKING:
    from colabfast.datasets import MirrorDataset
    from colabfast.mirror import Header

# The readers (h5py, torchvision: 0.2-0.3 s to import in a new runtime) are imported where they are used,
# not here: open_dataset starts copying a mirror before it needs them (issue 26's time to the first batch).

__all__ = ["open_dataset", "DROP_INS", "MIRRORS_FOLDER", "ACCEPTS", "what_is", "default_mirrors", "mirror_name",  # noqa: F822 (DROP_INS: module __getattr__)
           "drop_in", "NothingToOpen", "OpenRefused", "default_dataset_mirrors"]

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # the first 8 bytes of an HDF5 file (pack writes no user block)
ACCEPTS = ("open_dataset accepts a mirror made by colabfast.pack (.h5), a dataset folder (an ImageFolder tree "
           "of class folders, KITTI's training/image_2 + label_2, a COCO folder with its annotation JSON, a "
           "VOCdevkit tree, a YOLO export (images/ + labels/ + data.yaml), images/ + masks/ folders, a folder of "
           "images with one CSV table of labels (or Kaggle's train.csv beside train/), a folder of split folders "
           "(train/, val/, ...) with split=, or a folder of images), or an archive of an ImageFolder tree or "
           "ImageNet's (.zip, .tar, .tar.gz, .tgz, .tar.bz2, .tar.xz)")
# pack()'s arguments that are open_dataset's own (split, image_size, progress) or that it decides (src, dst;
# fields and overwrite: a mirror open_dataset packs is of the source as it is, at a name no other file takes)
OWN_ARGUMENTS = ("src", "dst", "split", "image_size", "progress", "fields", "overwrite")


def _pack_options() -> tuple[str, ...]:
    """pack()'s keyword options that open_dataset passes on: every one in pack's signature
    (:data:`colabfast.packing.PACK_PARAMETERS`) but :data:`OWN_ARGUMENTS`."""
    from colabfast.packing import PACK_PARAMETERS

    return tuple(name for name in PACK_PARAMETERS if name not in OWN_ARGUMENTS)


def _drop_ins() -> dict[str, tuple[type[MirrorDataset], Callable[[Optional[str]], dict]]]:
    """The layout a mirror records -> the dataset that reads it, and the function that makes its
    arguments from ``split``: each registered layout's ``drop_in`` and ``split_args``
    (:mod:`colabfast.layouts.registry`), and :class:`colabfast.H5Dataset` for a mirror of any dataset."""
    from colabfast.layouts import REGISTRY
    from colabfast.layouts.registry import ANY_DATASET, drop_in_of

    return {name: drop_in_of(name) for name in (*REGISTRY, ANY_DATASET)}


def __getattr__(name: str) -> Any:
    if name == "PACK_OPTIONS":  # from pack's signature, which imports the packing modules
        return _pack_options()
    if name == "DROP_INS":  # made when asked for (its classes import h5py and torchvision), from the registry
        return _drop_ins()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def what_is(path: Path) -> str:
    """``"mirror"`` (an HDF5 file), ``"folder"`` or ``"archive"`` (by its suffix).

    Raises:
        FileNotFoundError: nothing at ``path``.
        MirrorError: (a ``ValueError``) another kind of file, named with its size and first bytes'
            kind, and what :func:`open_dataset` accepts.
    """
    try:
        st = retry(lambda: os.stat(path), 5)  # Drive may be briefly disconnected
    except FileNotFoundError:
        hint = " Is Drive mounted? Call colabfast.mount() first." if "/drive/" in str(path) else ""
        raise NothingToOpen(f"nothing to open: {path} does not exist.{hint}") from None
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    if stat.S_ISREG(st.st_mode) and archive_suffix(path):
        return "archive"
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            if f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                return "mirror"
        from colabfast.mirror import MirrorError  # here: h5py loads in 0.2 s, and a mirror is staged first

        raise MirrorError(_one_file(path) or f"{path} is a file of {human_bytes(st.st_size)} that is neither an HDF5 "
                          f"mirror nor an archive (by its name, {path.suffix or 'no suffix'}). {ACCEPTS}.")
    from colabfast.mirror import MirrorError

    raise MirrorError(f"{path} is not a regular file or a folder (a pipe, socket or device). {ACCEPTS}.")


def _one_file(path: Path) -> Optional[str]:
    """What a dataset's own file given alone (by its name: a CSV table, a COCO JSON, YOLO's data.yaml, an
    image) is, and what to pass instead; None for any other file."""
    from colabfast.sources import IMG_EXTENSIONS

    suffix = path.suffix.lower()
    if suffix == ".csv":
        return f"{path} is a CSV table: pass its folder ({path.parent}) with layout='csv' and labels='{path}'"
    if suffix == ".json":
        return (f"{path} is a JSON file: for COCO annotations, pass the folder of their images with layout='coco' "
                f"and labels='{path}'")
    if suffix in (".yaml", ".yml"):
        return f"{path} is a YAML file: for a YOLO export's data.yaml, pass its folder ({path.parent})"
    if suffix in IMG_EXTENSIONS:
        return f"{path} is one image: pass the folder that holds the images ({path.parent})"
    return None


def _empty(folder: Path) -> Optional[str]:
    """What ``folder`` holds when that is nothing a layout reads (nothing, or hidden entries only), in
    words; None when it holds more or cannot be listed (the listing that follows says why). One listing."""
    try:
        names = retry(lambda: os.listdir(folder), 5)
    except OSError:
        return None
    if any(not name.startswith(".") for name in names):
        return None
    return f"only hidden entries ({', '.join(sorted(names)[:3])}{', ...' if len(names) > 3 else ''})" if names \
        else "nothing"


def default_mirrors(src: Path) -> Path:
    """Where mirrors of ``src`` go by default: ``colabfast-mirrors`` at the top of My Drive when ``src``
    is on Google Drive (also for a shared drive's folder: your own Drive is where you may write), else
    a ``colabfast-mirrors`` folder beside ``src``."""
    if env.drive_kind(src) is not None:
        for folder in src.parents:
            if folder.name in ("MyDrive", "My Drive"):
                return folder / MIRRORS_FOLDER
            if folder.name in ("Shareddrives", "Shared drives") and (folder.parent / "MyDrive").is_dir():
                return folder.parent / "MyDrive" / MIRRORS_FOLDER
    return src.parent / MIRRORS_FOLDER


def default_dataset_mirrors() -> Path:
    """Where mirrors of a Hugging Face dataset go by default (it has no folder to put them beside):
    ``colabfast-mirrors`` at the top of My Drive when Drive is mounted (:func:`colabfast.env.drive_mounts`),
    so the next runtime finds them, else in colabfast's local cache folder (:func:`colabfast.env.cache_dir`).
    Where several Drives are mounted, the one at Colab's ``/content/drive`` wins, then the others by
    their mountpoints' order (never by chance: a second call must find the first call's mirror)."""
    colab = os.path.join(env.COLAB_CONTENT, "drive")
    for mount in sorted(env.drive_mounts(), key=lambda m: (m.mountpoint != colab, m.mountpoint)):
        for name in ("MyDrive", "My Drive"):
            if os.path.isdir(os.path.join(mount.mountpoint, name)):
                return Path(mount.mountpoint) / name / MIRRORS_FOLDER
    return env.cache_dir() / MIRRORS_FOLDER


@dataclasses.dataclass
class _InMemory:
    """A dataset object :func:`open_dataset` packs (a Hugging Face ``Dataset``), where a path would be."""

    dataset: Any  # what pack packs
    name: str  # the start of its mirror's name (colabfast.hf.mirror_stem)
    source: str  # what its mirror records as its source (colabfast.packing.dataset.describe_dataset)
    described: str  # for the account and messages

    def __str__(self) -> str:
        return self.described


def mirror_name(src: Union[Path, _InMemory], fingerprint: str, copy: int = 0) -> str:
    """``<name>-<first 12 hex digits of the fingerprint>.h5``: one name per source and options, so a
    changed source, or other options, never overwrites another mirror (``flowers.zip`` -> ``flowers-...``).
    ``copy`` k > 0 names the mirror packed beside k files that took the name but do not hold this
    source (``<name>-<12 hex digits>.<k>.h5``)."""
    return f"{strip_archive_suffix(src.name)}-{fingerprint[:12]}{f'.{copy}' if copy else ''}.h5"


def drop_in(mirror: PathLike, split: Optional[str] = None, **kwargs: Any) -> MirrorDataset:
    """The dataset that reads ``mirror`` (:data:`DROP_INS`, by the layout it records), ``split`` picking
    KITTI's ``"training"`` (default) or ``"testing"``; ``kwargs`` go to the dataset (``transform``,
    ``target_transform``, ``output``).

    Raises:
        MirrorError: not a mirror this colabfast reads. PackRefused (a ``ValueError``): a ``split`` the
            layout lacks.
    """
    from colabfast.layouts.registry import drop_in_of
    from colabfast.mirror import MirrorError, header, read_h5

    layout = read_h5(mirror, lambda f: header(f, mirror).layout)
    try:
        cls, split_args = drop_in_of(layout)
    except KeyError:
        raise MirrorError(f"{mirror} is a mirror of layout {layout!r}, which this process has not registered "
                          "(colabfast.layouts.register): import the module that registers it, or upgrade "
                          "colabfast if a newer one wrote the mirror") from None
    return cls(mirror, **split_args(split), **kwargs)


@dataclasses.dataclass
class _Mirror:
    """What a file in a mirrors folder is (see :func:`_look_at`)."""

    path: Path
    header: Optional[Header]  # None: not a complete colabfast mirror
    fingerprint: str
    size: int
    why: str = ""  # why it is not one


def _look_at(path: Path) -> Optional[_Mirror]:
    """The mirror at ``path``; None when nothing is there."""
    from colabfast.mirror import MirrorError, header, read_h5

    try:
        size = retry(lambda: path.stat().st_size, 5)
    except FileNotFoundError:
        return None
    try:
        head, fingerprint = read_h5(path, lambda f: (header(f, path), str(f.attrs.get("fingerprint", ""))))
    except (MirrorError, OSError) as exc:
        return _Mirror(path, None, "", size, str(exc))
    return _Mirror(path, head, fingerprint, size)


def _created(head: Header) -> str:
    """``"2026-11-20 14:03 UTC"`` from the mirror's ISO time."""
    try:
        return datetime.fromisoformat(head.created).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return head.created or "at an unknown time"


def _options_of(head: Header) -> tuple:
    return head.store, head.image_size, head.quality if head.image_size is not None else None


def _older_mirrors(folder: Path, src: Union[Path, _InMemory], keep: Path) -> list[_Mirror]:
    """Complete mirrors of ``src`` in ``folder`` other than ``keep`` (made from an earlier version of
    it, or with other options), by their name and the source they record."""
    stem = glob.escape(keep.name.rsplit("-", 1)[0])
    recorded = src.source if isinstance(src, _InMemory) else str(src)
    found = []
    for path in sorted(folder.glob(f"{stem}-*.h5")):
        if path == keep:
            continue
        m = _look_at(path)
        if m is not None and m.header is not None and (m.header.source == recorded
                                                       or m.header.source.startswith(f"{recorded}/")):
            found.append(m)
    return found


def _beside(old: _Mirror, made: Header) -> str:
    """What the account says of ``old``, a mirror of the same source as the one just packed (whose
    header is ``made``): a sibling, kept (the source's other split or layout, or other options: the
    new mirror does not replace it), or the mirror of an earlier version of the source (the same split,
    layout and options, another fingerprint), which the user may delete."""
    head = old.header
    assert head is not None  # _older_mirrors gives complete mirrors
    kept, size = f"kept {old.path.name}, made {_created(head)}", human_bytes(old.size)
    if head.layout != made.layout:
        return f"{kept}: a sibling, the source's {head.layout} layout ({size})"
    if head.split is None and made.split is not None:
        return (f"{kept}: a sibling, of another split or an earlier version of the source (made before colabfast "
                f"recorded which split a mirror holds) ({size})")
    if head.split != made.split:
        return f"{kept}: a sibling, the source's split {head.split!r} ({size})"
    if _options_of(head) != _options_of(made):
        return f"{kept}: a sibling, other options (store={head.store}, image_size={head.image_size}) ({size})"
    return f"{kept} from an earlier version of the source ({size}): delete it when you no longer need it"


def _check_writable(folder: Path) -> None:
    """Make ``folder`` and write a byte there, before any packing: a read-only or full Drive is named now.

    Raises:
        OSError: with the cause's errno, naming ``folder`` and the fix (``mirrors=`` elsewhere).
    """
    probe = partial_path(folder / f".probe-{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"\0")
        probe.unlink()
    except OSError as exc:
        raise _cannot_write(folder, exc) from exc


def _cannot_write(folder: Path, exc: OSError) -> OSError:
    where = "Drive" if env.drive_kind(folder) is not None else "it"
    why = {errno.EROFS: f"{where} is read-only", errno.ENOSPC: f"{where} is full",
           errno.EDQUOT: f"{where} is over its storage quota"}.get(exc.errno or 0, exc.strerror or str(exc))
    local = env.work_dir() / MIRRORS_FOLDER
    return OSError(exc.errno, f"cannot write a mirror into {folder}: {why} ({exc}). Nothing was overwritten. Pass "
                              f"mirrors= a folder with room that you may write, e.g. another Drive folder, or "
                              f"mirrors={str(local)!r} (local disk: gone when the runtime ends, so the next one "
                              "packs again).")


def _seconds(t: float) -> str:
    return f"{t:.1f} s" if t < 10 else f"{t:.0f} s"


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
      :mod:`colabfast.hf`) into ``mirrors``, default :func:`default_dataset_mirrors` (My Drive's
      ``colabfast-mirrors`` when Drive is mounted, else colabfast's cache folder), named
      ``<info.dataset_name or info.builder_name>[-<split>]-<12 hex digits>.h5``
      (:func:`colabfast.hf.mirror_stem`), and found again there by the fingerprint pack records,
      which covers the dataset's own ``_fingerprint`` (set on every ``Dataset`` and changed by
      every transform that changes its rows: ``datasets/arrow_dataset.py``, ``datasets/fingerprint.py``)
      with its length, first sample's columns and the options. It opens as a
      :class:`colabfast.H5Dataset` whose ``ds[i]`` equals ``dataset[i]`` (for a dataset with no
      format set: ``with_format("torch")``'s values are stored as pack stores tensors, a 0-d tensor
      coming back of shape [1]). An ``IterableDataset`` has
      no ``_fingerprint`` (``datasets/iterable_dataset.py``), and nothing else says whether the
      files or generator behind it still give the same rows, so its rows are read on every call, to
      a temporary Arrow file on local disk (:func:`colabfast.hf.materialized`; deleted once the
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
    and packs nothing.

    What it did and why (with sizes, counts, dates and seconds) is printed when ``progress`` and kept
    as the dataset's ``account`` (also in its ``repr``), e.g. ``found a mirror of it made 2026-11-20
    14:03 UTC (1.2 GB): ...; staged to RAM disk ... in 14 s``.

    Args:
        path: a mirror file, a dataset folder, or an archive (see :data:`ACCEPTS`), as a ``str`` or
            ``os.PathLike``; or a Hugging Face ``datasets.Dataset``, ``DatasetDict`` or
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
        to: where the mirror is staged: ``"auto"``, ``"disk"`` or ``"ram"``, as :func:`colabfast.stage`.
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
        StageRefused: (a ``ValueError``) a ``to`` that is not ``"auto"``, ``"disk"`` or ``"ram"``.
        TypeError: an option that is not pack's.
        OSError: the mirrors folder cannot be written (read-only or full Drive; the message says to
            pass ``mirrors=`` elsewhere), or as pack and stage raise.
        MirrorError: the mirror's name in ``mirrors`` is taken by a file colabfast did not write (it
            is never overwritten) or by a symbolic link to nothing (never written through: the
            mirror would land outside ``mirrors``), or a mirror is damaged.
        PackError, UnsafeArchiveError, StageError, DriveError: as the steps raise them.
    """
    with contextlib.ExitStack() as stack:  # an IterableDataset's rows, read to local disk, go once packed
        return _open(path, split, transform, target_transform, output, image_size, mirrors, to, progress,
                     pack_options, stack)


def _open(path: Any, split: Optional[str], transform: Optional[Callable], target_transform: Optional[Callable],
          output: str, image_size: Any, mirrors: Optional[PathLike], to: str, progress: bool, pack_options: dict,
          stack: contextlib.ExitStack) -> MirrorDataset:
    unknown = sorted(set(pack_options) - set(_pack_options())) if pack_options else []  # (imports packing)
    if unknown:
        raise OpenRefused(f"open_dataset() got unexpected keyword arguments {', '.join(unknown)}: it takes pack()'s "
                          f"{', '.join(_pack_options())}")
    if to not in ("auto", "disk", "ram"):
        from colabfast.staging import StageRefused

        raise StageRefused(f"to must be 'auto', 'disk' or 'ram', not {to!r}")
    steps: list[str] = []
    if not isinstance(path, (str, os.PathLike)):  # a Hugging Face dataset, packed as pack packs it
        rows, wanted = _dataset_wanted(path, split, image_size, mirrors, pack_options, progress, steps, stack)
        mirror, check = _found_or_packed(rows, wanted, "dataset", None, image_size, progress, pack_options, steps)
        return _staged_and_opened(rows, "dataset", None, mirror, check, None, image_size, to, progress, pack_options,
                                  steps, transform, target_transform, output)
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
        if early is not None:  # what follows imports the readers (h5py, the layouts: 0.3 s holding the GIL)
            early.copying.wait(timeout=1.0)
        try:
            if kind == "folder":  # detected once (a listing of the folder on Drive), then given to pack
                layout = _folder_layout(src, pack_options)
                inner = _split_folder(src, split, layout, pack_options, steps)
                if inner is not None:  # opened as that folder, its mirror kept in the tree's mirrors folder
                    if early is not None:
                        early.stop()
                    src, split = inner, None
                    early = _Early.start(src, folder, to, progress)
                    layout = _folder_layout(src, pack_options)
                pack_options = {**pack_options, "layout": layout}
            elif kind == "archive":  # an export of a registered layout: its zip's names read once, here
                from colabfast.packing import resolve

                resolved = resolve(src, pack_options.get("layout", "auto"), pack_options.get("labels"))
                if resolved.columns:
                    pack_options = {**pack_options, "layout": resolved.layout}
            wanted = _listed(src, kind, split, image_size, folder, pack_options, steps)
            mirror, check = _found_or_packed(src, wanted, kind, split, image_size, progress, pack_options, steps,
                                             early)
        finally:
            if early is not None:
                early.stop()  # a no-op once the listing named what it staged (then it is taken below)
    return _staged_and_opened(src, kind, split, mirror, check, early, image_size, to, progress, pack_options, steps,
                              transform, target_transform, output)


def _staged_and_opened(src: Union[Path, _InMemory], kind: str, split: Optional[str], mirror: Path,
                       check: Optional[_Wanted], early: Optional[_Early], image_size: Any, to: str, progress: bool,
                       pack_options: dict, steps: list[str], transform: Optional[Callable],
                       target_transform: Optional[Callable], output: str) -> MirrorDataset:
    """:func:`open_dataset`'s last steps: ``mirror`` (of ``src``: given, found or packed) staged,
    checked, and opened as its drop-in dataset, whose ``account`` is ``steps``."""
    # A mirror found (or given) is checked in its staged copy, which is opened next anyway: one
    # vetting of one file, not one of the copy on Drive (read over the link) and one of the local copy.
    at = len(steps)
    local = (early.take(mirror, steps) if early is not None else None) or _staged(mirror, to, progress, steps)
    while kind == "mirror" or check is not None:
        try:
            steps.insert(at, _checked(mirror, local, src, check))
            break
        except _Impostor as exc:  # a file claiming this source's fingerprint: packed beside, never overwritten
            assert check is not None  # only a mirror looked for is checked for what it holds
            steps.append(str(exc))
            mirror, check = _found_or_packed(src, check, kind, split, image_size, progress, pack_options, steps,
                                             passed=check.passed + [mirror])
            at = len(steps)
            local = _staged(mirror, to, progress, steps)
    if kind != "mirror" and _packs_split(kind, pack_options):
        split = None  # it chose what pack read
    dataset = drop_in(local, split, transform=transform, target_transform=target_transform, output=output)
    steps.append(f"opened as {type(dataset).__name__}: {len(dataset):,} {'samples' if kind == 'dataset' else 'images'}"
                 + (f" in {len(dataset.classes)} classes" if getattr(dataset, "classes", None) else ""))
    dataset.account = "\n".join(steps)
    if progress:
        print(dataset.account)
    return dataset


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
    from colabfast.mirror import MirrorError
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

        layout = _folder_layout(src, options)
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


def _found_or_packed(src: Union[Path, _InMemory], wanted: _Wanted, kind: str, split: Optional[str], image_size: Any,
                     progress: bool, options: dict, steps: list[str], early: Optional[_Early] = None,
                     passed: Optional[list[Path]] = None) -> tuple[Path, Optional[_Wanted]]:
    """The mirror of ``src`` with these options in its mirrors folder, packed there now unless a file
    has its name; with that file, ``wanted`` (what :func:`_checked` checks once it is staged). Its name
    is :func:`mirror_name`'s, or, beside the ``passed`` files that took the earlier names but are
    not it, the next copy's.

    Raises:
        MirrorError: a symbolic link at the name (pack would write where it leads, outside the
            folder), or ``MAX_BESIDE`` files at its names that are not it.
    """
    from colabfast.mirror import MirrorError
    from colabfast.packing import pack

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
    from colabfast.hf import hf_kind, materialized, mirror_stem
    from colabfast.packing import PackRefused, dataset_fingerprint
    from colabfast.packing.common import Contents, _options
    from colabfast.packing.dataset import describe_dataset

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
    return src, _Wanted(folder, fingerprint, Contents(_options(store, None, quality), source=src.source,
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


def _folder_layout(src: Path, options: dict) -> str:
    """The layout pack reads the folder ``src`` as (given, or detected: a few listings), decided here
    once (:func:`colabfast.packing.resolve`) and handed to listing and packing by name."""
    from colabfast.packing import resolve
    from colabfast.sources import detect_layout

    layout = resolve(src, options.get("layout", "auto"), options.get("labels")).layout
    return detect_layout(src) if layout == "auto" else layout


def _split_folder(src: Path, split: Optional[str], layout: str, options: dict, steps: list[str]) -> Optional[Path]:
    """The folder of ``src`` to open where ``src`` is a tree of splits (:func:`colabfast.sources.split_folders`,
    e.g. PyTorch's tutorial ``hymenoptera/train/{ants,bees}`` and ``val/``) that was detected as an
    ImageFolder (its splits taken for classes) or a folder of images: ``src / split`` (said in
    ``steps``). None for any other folder, or a layout given.

    Raises:
        SplitRefused: (a ``PackRefused``) a tree of splits and ``split`` None or not one of them: the
            message lists them and the call to make.
    """
    from colabfast.packing import SplitRefused
    from colabfast.sources import split_folders

    if options.get("layout", "auto") != "auto" or options.get("labels") is not None or \
            layout not in ("imagefolder", "files"):
        return None
    folders = split_folders(src)
    if folders is None:
        return None
    if split not in folders:  # None too: the splits are not classes of one dataset
        raise SplitRefused(src, {name: f"{name}/" for name in folders}, split, "open_dataset")
    steps.append(f"{src} holds the splits {', '.join(folders)}: opening {split}/")
    return src / split


def _packs_split(kind: str, options: dict) -> bool:
    """Whether ``split`` chooses what pack reads (an archive's part, VOC's image set, a YOLO export's
    split), rather than a split of the mirror (KITTI's); ``options["layout"]`` a folder's layout, as
    :func:`_folder_layout` gives it."""
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
    from colabfast.drive import DriveError, flush_drive

    start = time.perf_counter()
    try:
        flush_drive(folder, quiet=True)
    except DriveError as exc:  # the mirror is complete here; only its upload is in doubt
        warnings.warn(f"open_dataset: {exc}", stacklevel=4)
        return (f"flushing Drive failed ({exc}): the mirror may not be on Drive yet; call "
                "colabfast.flush_drive() before this runtime ends")
    return f"flushed Drive in {_seconds(time.perf_counter() - start)}, so the next runtime finds the mirror"


class _Early:
    """Stages the newest mirror of a source in its mirrors folder while :func:`open_dataset` lists the
    source, which is what says whether that mirror is still the source's: in a new runtime the mirror
    usually is, and its copy then starts a listing's time earlier (on the Drive simulator, 0.4 s of
    2000 images in 10 folders). The copy on Drive is vetted (:func:`colabfast.mirror.vet`) at the same
    time, so its staged copy, the same bytes (stage copies a file again when it changes during the
    copy), needs no second vetting. When the listing names another mirror (the source changed, or
    other options), the copy is cancelled before anything is packed.
    """

    def __init__(self, src: Path, folder: Path, to: str, progress: bool, split: Optional[str] = None,
                 layout: Optional[str] = None):
        self.candidate: Optional[Path] = None
        self.local: Optional[Path] = None
        self.vetted: Optional[tuple[int, ...]] = None  # the version of the Drive copy that was vetted
        self.error: Optional[BaseException] = None
        self.seconds = 0.0
        self.before: Any = None  # _before_staging's, for the account
        self.chosen, self.cancel = threading.Event(), threading.Event()
        self.copying = threading.Event()  # set once the copy is under way (or there is none)
        self._thread = threading.Thread(target=self._run, args=(src, folder, to, progress, split, layout),
                                        daemon=True, name="colabfast-open-stage")
        self._thread.start()

    @classmethod
    def start(cls, src: Path, folder: Path, to: str, progress: bool, split: Optional[str] = None,
              layout: Optional[str] = None) -> Optional[_Early]:
        """Start staging the newest mirror of ``src`` in ``folder`` (of ``split`` and ``layout``, where
        given: see :meth:`_fits`), where that is a slow mount (a mirror on local disk is opened where
        it is); None where there is nothing to start."""
        if env.drive_kind(folder) is None and not env.is_fuse(folder):
            return None
        return cls(src, folder, to, progress, split, layout)

    MAX_LOOKED_AT = 4  # headers read (a round trip or more each on Drive) to find the mirror of a split

    def _run(self, src: Path, folder: Path, to: str, progress: bool, split: Optional[str],
             layout: Optional[str]) -> None:
        from colabfast.staging import stage

        try:
            stem = glob.escape(strip_archive_suffix(src.name))
            found = sorted(((p.stat().st_mtime_ns, p) for p in folder.glob(f"{stem}-*.h5")), reverse=True)
            if split is None and layout is None:  # the newest, as its name says nothing more (one listing)
                self.candidate = found[0][1] if found else None
            else:  # the source's other splits and layouts are siblings in this folder: not staged
                self.candidate = next((p for _, p in found[: self.MAX_LOOKED_AT]
                                       if not self.cancel.is_set() and self._fits(p, split, layout)), None)
            self.chosen.set()
            if self.candidate is None or self.cancel.is_set():
                return
            start = time.perf_counter()
            candidate = self.candidate
            before = file_version(os.stat(candidate))
            vetting = threading.Thread(target=self._vet, args=(candidate, before), daemon=True,
                                       name="colabfast-open-vet")
            vetting.start()  # a child process reading the metadata, while the bytes are copied
            try:
                self.before = _before_staging(candidate, to)
                self.copying.set()
                self.local = stage(candidate, to=to, progress=progress, cancel=self.cancel)
                self.seconds = time.perf_counter() - start
            finally:
                vetting.join()
        except BaseException as exc:  # noqa: BLE001 (reported by take(), or the normal path raises it again)
            self.error = exc
        finally:
            self.chosen.set()
            self.copying.set()

    @staticmethod
    def _fits(path: Path, split: Optional[str], layout: Optional[str]) -> bool:
        """Whether the mirror at ``path`` may be the one asked for: of ``layout`` (None: any), and of
        ``split`` or of no recorded split (KITTI's, whose mirror holds both, or one made before
        colabfast recorded splits)."""
        m = _look_at(path)
        return (m is not None and m.header is not None and m.header.split in (None, split)
                and layout in (None, m.header.layout))

    def _vet(self, candidate: Path, before: tuple[int, ...]) -> None:
        self.copying.wait()  # importing the vetting (h5py) holds the GIL: the copy starts first
        from colabfast.mirror import MirrorError, vet

        try:
            vet(candidate)
        except (MirrorError, OSError):
            return  # not vetted: the staged copy is vetted when it is opened, and fails there
        if file_version(os.stat(candidate)) == before:
            self.vetted = before

    def expect(self, mirror: Path) -> None:
        """The listing says the mirror is ``mirror``: a copy of any other stops now."""
        self.chosen.wait()
        self.wanted = self.candidate == mirror
        self.stop()

    wanted = False  # the listing named the mirror this stages

    def stop(self) -> None:
        """Cancel the copy and wait for the thread, unless the listing named the mirror it stages."""
        if not self.wanted:
            self.cancel.set()
            self._thread.join()

    def take(self, mirror: Path, steps: list[str]) -> Optional[Path]:
        """The staged copy of ``mirror`` if this is what it staged (trusted when the Drive copy it was
        copied from is the version vetted), else None (the caller stages it)."""
        from colabfast.mirror import trust

        if not self.wanted or self.candidate != mirror:
            self.stop()
            return None
        self._thread.join()
        if self.error is not None or self.local is None:
            return None  # staging it again says what is wrong, as it would have without this
        try:
            if self.vetted is not None and file_version(os.stat(mirror)) == self.vetted:
                trust(self.local)  # the same bytes as the vetted copy on Drive
        except OSError:
            return None
        steps.append(_staging_words(self.local, self.before, self.seconds, ", begun while the source was listed"))
        return self.local


def _staged(mirror: Path, to: str, progress: bool, steps: list[str]) -> Path:
    """``mirror`` staged by :func:`colabfast.stage`'s rule (or where it is, when local and ``to="auto"``)."""
    from colabfast.staging import stage

    where = env.storage(mirror)
    if to == "auto" and where in ("disk", "ram"):
        steps.append(f"opened in place: it is on local {'RAM' if where == 'ram' else 'disk'} already")
        return mirror
    before = _before_staging(mirror, to)
    start = time.perf_counter()
    local = stage(mirror, to=to, progress=progress)
    steps.append(_staging_words(local, before, time.perf_counter() - start))
    return local


def _before_staging(mirror: Path, to: str) -> tuple[os.stat_result, Any, Optional[os.stat_result]]:
    """What :func:`_staging_words` compares with: the mirror's stat, where stage will put it and why,
    and what is there now."""
    from colabfast.staging import default_destination

    st = retry(lambda: os.stat(mirror), 5)
    chosen = default_destination(mirror.name, st.st_size, to, single=True)
    there = None
    if chosen.path is not None:
        with contextlib.suppress(FileNotFoundError):
            there = os.stat(chosen.path)
    return st, chosen, there


def _staging_words(local: Path, before: tuple[os.stat_result, Any, Optional[os.stat_result]], took: float,
                   extra: str = "") -> str:
    st, chosen, there = before
    place = "the RAM disk" if env.is_ram(local) else "local disk"
    if chosen.path == local and unchanged(there, st.st_size, st.st_mtime_ns):
        return f"already staged to {place} at {local}: nothing copied"
    rate = f", {st.st_size / took / 1e6:.0f} MB/s" if took > 0.1 else ""
    return f"staged to {place} at {local} in {_seconds(took)} ({human_bytes(st.st_size)}{rate}; {chosen.why}){extra}"
