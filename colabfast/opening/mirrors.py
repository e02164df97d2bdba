"""Where a source's mirrors live and what they are named: :func:`default_mirrors`, :func:`mirror_name`,
:func:`drop_in`, and the older mirrors beside a new one.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from colabfast.staging.extract import strip_archive_suffix
from colabfast.where import env
from colabfast.where._fileio import (
    PathLike,
    human_bytes,
    retry,
)
from colabfast.where.env import MIRRORS_FOLDER

if TYPE_CHECKING:
    from colabfast.datasets.dropins import MirrorDataset
    from colabfast.mirror.format import Header

__all__ = ["default_mirrors", "mirror_name", "drop_in", "default_dataset_mirrors"]


def default_mirrors(src: Path) -> Path:
    """Where mirrors of ``src`` go by default: ``colabfast-mirrors`` at the top of My Drive when ``src``
    is on Google Drive (also for a shared drive's folder: your own Drive is where you may write), else
    a ``colabfast-mirrors`` folder beside ``src``; on Kaggle, in ``/kaggle/working`` (its input is read-only)."""
    if env.in_kaggle() and env.drive_kind(src) is None:
        return env.kaggle_working() / MIRRORS_FOLDER
    if env.drive_kind(src) is not None:
        for folder in src.parents:
            if folder.name in ("MyDrive", "My Drive"):
                return folder / MIRRORS_FOLDER
            if folder.name in ("Shareddrives", "Shared drives") and (folder.parent / "MyDrive").is_dir():
                return folder.parent / "MyDrive" / MIRRORS_FOLDER
    return src.parent / MIRRORS_FOLDER


def kaggle_note(folder: Path) -> list[str]:
    """The account's line on Kaggle saying where its mirrors go by default (``folder``); none elsewhere."""
    if not env.in_kaggle():
        return []
    return [f"on Kaggle: mirrors go to {folder}, its writable folder, kept as the notebook's output (/kaggle/input "
            "is read-only); staged copies go to local disk"]


def default_dataset_mirrors() -> Path:
    """Where mirrors of a Hugging Face dataset go by default (it has no folder to put them beside):
    ``colabfast-mirrors`` at the top of My Drive when Drive is mounted (:func:`colabfast.where.env.drive_mounts`),
    so the next runtime finds them, else in colabfast's local cache folder (:func:`colabfast.where.env.cache_dir`).
    Where several Drives are mounted, the one at Colab's ``/content/drive`` wins, then the others by
    their mountpoints' order (never by chance: a second call must find the first call's mirror). On
    Kaggle, ``/kaggle/working/colabfast-mirrors``."""
    if env.in_kaggle():
        return env.kaggle_working() / MIRRORS_FOLDER
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
    name: str  # the start of its mirror's name (colabfast.packing.hf.mirror_stem)
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
    import colabfast.datasets  # noqa: F401 (registers the drop-ins)
    from colabfast.errors import MirrorError
    from colabfast.layouts.registry import drop_in_of
    from colabfast.mirror.format import header
    from colabfast.mirror.safety import read_h5

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
    from colabfast.errors import MirrorError
    from colabfast.mirror.format import header
    from colabfast.mirror.safety import read_h5

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
        NotWritable: (an ``OSError``) naming ``folder`` and the fix (``mirrors=`` elsewhere)."""
    from colabfast.packing.common import check_writable

    check_writable(folder, "mirrors=")


def _seconds(t: float) -> str:
    return f"{t:.1f} s" if t < 10 else f"{t:.0f} s"


