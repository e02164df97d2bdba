"""What a source is, decided once: :func:`resolve`.

:func:`colabfast.pack`, :func:`colabfast.packing.source_listing` (the fingerprint) and
:func:`colabfast.open_dataset` each need to know whether a source is a folder, an archive, a list of
files or a map-style dataset, and which registered layout (:mod:`colabfast.layouts.registry`) reads
it. :func:`resolve` decides both from one listing of a folder (or one read of a zip's central
directory) and returns them as a :class:`Resolved`; ``open_dataset`` then hands the decided layout
on by name, so packing and listing the same source ask nothing twice.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from colabfast.staging.extract import archive_suffix
from colabfast.where._fileio import PathLike

__all__ = ["Resolved", "resolve", "column_layout"]

KINDS = ("folder", "archive", "files", "dataset")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A source and what it is (see :func:`resolve`).

    Attributes:
        src: the source as given (a path, a list of files, a dataset).
        kind: ``"folder"``, ``"archive"`` (a file with an archive's suffix), ``"files"`` (a list of
            image paths, or of ``(path, label)`` pairs) or ``"dataset"`` (any map-style dataset).
        layout: the registered layout that reads it as a dataset (``"coco"``, ``"yolo"``, a layout of
            your own; from a folder, or from an archive extracted); ``"dataset"`` for a dataset; else
            the layout as given: ``"auto"`` for a folder of images or an archive read as a stream
            means what :mod:`colabfast.layouts.images` and :mod:`colabfast.packing.archivesource` detect as they
            list it (ImageFolder, KITTI or plain files; ImageNet's or Kaggle's archives).
        labels: the ``labels=`` file, as given.
    """

    src: Any
    kind: str
    layout: str
    labels: Optional[PathLike] = None

    @property
    def columns(self) -> bool:
        """Packed as a mirror of columns (:mod:`colabfast.packing.dataset`): a dataset, or a
        registered :class:`~colabfast.layouts.Layout` read as one."""
        from colabfast.layouts import LAYOUTS

        return self.kind == "dataset" or self.layout in LAYOUTS

    @property
    def streamed(self) -> bool:
        """An archive read as one stream (:mod:`colabfast.packing.archives`), not extracted."""
        return self.kind == "archive" and not self.columns


def resolve(src: Any, layout: str = "auto", labels: Optional[PathLike] = None) -> Resolved:
    """What ``src`` is and which layout reads it (see :class:`Resolved`): a map-style dataset is
    ``"dataset"``; a path with an archive's suffix that is no folder an ``"archive"``, its layout
    the one given or, for ``"auto"``, the registered layout its zip's member names show
    (:meth:`~colabfast.layouts.Layout.detect_names`, from the central directory: no member read);
    a folder's layout the one given or, for ``"auto"``, the first registered layout that a
    ``labels=`` file's suffix names or that detects the folder (:func:`column_layout`: one listing).
    Reads no image and parses no annotation. A path that does not exist resolves as a folder; packing
    it names what is missing."""
    if isinstance(src, Resolved):
        return src
    if _is_dataset(src):
        return Resolved(src, "dataset", "dataset")
    if isinstance(src, (list, tuple)):
        return Resolved(src, "files", layout, labels)
    path = os.fspath(src)
    if archive_suffix(path) is not None and not os.path.isdir(path):
        found = None
        if os.path.isfile(path):
            from colabfast.packing.unpacked import archive_layout

            found = archive_layout(path, layout)
        return Resolved(src, "archive", found or layout, labels)
    return Resolved(src, "folder", column_layout(src, layout, labels) or layout, labels)


def _is_dataset(src: Any) -> bool:
    """A map-style dataset (not a path, not a list of paths for layout "files")."""
    return (not isinstance(src, (str, os.PathLike, list, tuple)) and hasattr(src, "__getitem__")
            and hasattr(src, "__len__"))


def column_layout(src: Any, layout: str, labels: Optional[PathLike] = None) -> Optional[str]:
    """The layout of :data:`colabfast.layouts.LAYOUTS` the folder ``src`` is packed as (given, or
    detected for ``"auto"``: the first registered layout whose ``labels_suffixes`` end ``labels``,
    else whose ``detect`` says so of the folder, asking only those its one listing makes worth
    asking), or None."""
    from colabfast.layouts import LAYOUTS, detect_layout
    from colabfast.layouts.tree import tree_of

    if layout in LAYOUTS:
        return layout
    if layout != "auto" or not isinstance(src, (str, os.PathLike)) or not os.path.isdir(src):
        return None
    found = detect_layout(tree_of(src), labels)
    return found.name if found.packed == "columns" else None
