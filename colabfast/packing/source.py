"""What a source is, decided once: a `Source`, made by `resolve`.

`colabfast.pack`, `colabfast.packing.source_listing` (the fingerprint), `colabfast.open_dataset` and
`colabfast.ultralytics_data` need to know the same things of a source: is it a folder, an archive, a
list of files or a map-style dataset; which registered layout reads it (`colabfast.layouts.registry`);
is it a tree of split folders, and which split is read. `resolve` decides them from the source's
`colabfast.layouts.tree.Tree` (one listing of a folder, a zip's central directory, a tar's first
member), the same for a folder and an archive of it, and every step after takes the `Source` as it is.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Optional

from colabfast.errors import PackRefused, SplitRefused
from colabfast.layouts import BaseLayout, detect_layout, layout_class
from colabfast.layouts.registry import AnyDataset
from colabfast.layouts.tree import Tree, split_folders, tree_of
from colabfast.staging.extract import archive_suffix
from colabfast.where._fileio import PathLike

__all__ = ["Source", "resolve"]

KINDS = ("folder", "archive", "files", "dataset")
ROUTES = ("dataset", "columns", "images", "stream", "unpacked")


@dataclasses.dataclass(frozen=True)
class Source:
    """A source and what it is (see `resolve`).

    Attributes:
        src: the source as given (a path, a list of files, a dataset).
        kind: ``"folder"``, ``"archive"`` (a file with an archive's suffix), ``"files"`` (a list of image
            paths or ``(path, label)`` pairs) or ``"dataset"`` (a map-style dataset).
        layout: the registered layout class that reads it (``"dataset"``'s for a dataset).
        path: the folder or archive, absolute; None for files and datasets.
        tree: its names; None for files and datasets.
        root: the split folder read of a tree of split folders (``"train"``), ``""`` for the whole.
        split: what the layout packs of it (VOC's image set, a YOLO split, Kaggle's part), or None.
        splits: a tree of split folders' splits (name -> where), None for any other source.
        labels: the ``labels=`` file, as given.
    """

    src: Any
    kind: str
    layout: type[BaseLayout]
    path: Optional[Path] = None
    tree: Optional[Tree] = dataclasses.field(default=None, repr=False, compare=False)
    root: str = ""
    split: Optional[str] = None
    splits: Optional[dict[str, str]] = None
    labels: Optional[PathLike] = None

    @property
    def name(self) -> str:
        """The layout's name."""
        return self.layout.name

    @property
    def folder(self) -> Optional[Path]:
        """The folder read (a split folder's, for a tree of splits); None for anything but a folder."""
        if self.kind != "folder" or self.path is None:
            return None
        return self.path / self.root if self.root else self.path

    @property
    def route(self) -> str:
        """How it is packed: ``"dataset"`` (a map-style dataset into a mirror of columns), ``"columns"``
        (a folder read by its `Layout`), ``"images"`` (a folder or list of files listed by its
        `ImageLayout`), ``"stream"`` (an archive read front to back) or ``"unpacked"`` (an archive
        extracted, then read as its folder)."""
        if self.kind == "dataset":
            return "dataset"
        if self.kind == "archive":
            return "stream" if getattr(self.layout, "streams", False) else "unpacked"
        return "columns" if self.layout.packed == "columns" else "images"

    @property
    def columns(self) -> bool:
        """Packed as a mirror of columns (a dataset, or a registered `Layout`)."""
        return self.kind == "dataset" or self.layout.packed == "columns"

    @property
    def prefix(self) -> str:
        """For an archive, the folder inside it that is read (its wrapping folder, the split's), ``""``
        for its top."""
        if self.tree is None:
            return ""
        return self.tree.prefix + (f"{self.root}/" if self.root else "")


def resolve(src: Any, layout: str = "auto", labels: Optional[PathLike] = None, split: Optional[str] = None,
            retries: int = 5) -> Source:
    """What ``src`` is and which layout reads it (see `Source`): a map-style dataset is ``"dataset"``;
    a list of files ``"files"``; a path with an archive's suffix that is no folder an ``"archive"``;
    anything else a ``"folder"`` (one that does not exist too: packing it names what is missing). The
    layout is the one given, or for ``"auto"`` the one `colabfast.layouts.detect_layout` sees in the
    source's tree. A tree of split folders that an image layout would read whole (PyTorch's tutorial's
    ``hymenoptera/{train,val}``, a Roboflow COCO export's ``train/``, ``valid/``: its splits taken for
    classes) is read one split at a time: ``split`` picks the folder, whose own layout is detected.
    Reads no image and parses no annotation. A `Source` is returned as it is.

    Raises:
        SplitRefused: (a ``PackRefused``) a tree of split folders and ``split`` None or not one of them:
            the message lists them and the call to make. Nothing is read.
        PackRefused: a ``layout`` that is not registered.
        ArchiveReadError: an archive whose index (a zip's central directory, a tar's first member)
            cannot be read.
    """
    if isinstance(src, Source):
        return src
    if _is_dataset(src):
        return Source(src, "dataset", AnyDataset)
    given = _given(layout)
    if isinstance(src, (list, tuple)):
        return Source(src, "files", given or layout_class("files"), labels=labels, split=split)
    path = Path(os.path.abspath(os.fspath(src)))
    kind = "archive" if archive_suffix(path) is not None and not path.is_dir() else "folder"
    if kind == "archive" and not path.is_file():
        return Source(src, kind, given or layout_class("imagefolder"), path, labels=labels, split=split)
    tree = tree_of(path, retries)
    found = given or detect_layout(tree, labels, split)
    if given is None and labels is None and found.packed == "images" and (folders := split_folders(tree)):
        if split not in folders:  # None too: the splits are not classes of one dataset
            raise SplitRefused(path, {name: f"{name}/" for name in folders}, split)
        inner = detect_layout(tree.sub(split), None, None)
        return Source(src, kind, inner, path, tree, root=split, splits={name: f"{name}/" for name in folders})
    return Source(src, kind, found, path, tree, split=split, labels=labels)


def _given(layout: str) -> Optional[type[BaseLayout]]:
    """The registered layout named ``layout``; None for ``"auto"``.

    Raises:
        PackRefused: a name that is not registered."""
    if layout == "auto":
        return None
    try:
        return layout_class(layout)
    except KeyError as exc:
        raise PackRefused(str(exc.args[0])) from None


def _is_dataset(src: Any) -> bool:
    """A map-style dataset (not a path, not a list of paths for layout "files")."""
    return (not isinstance(src, (str, os.PathLike, list, tuple)) and hasattr(src, "__getitem__")
            and hasattr(src, "__len__"))
