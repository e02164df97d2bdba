"""The interface of folder layouts (see :mod:`colabfast.layouts`): :class:`Layout`, :class:`ImageFile`,
:class:`LayoutError`.

Folder layouts that :func:`colabfast.pack` reads with no Dataset to write: COCO, Pascal VOC,
YOLO (Ultralytics, Roboflow), image/mask pairs and CSV tables.

Each layout is a map-style dataset over the source folder (:class:`Layout`): made from the folder,
it lists the files and parses every annotation (reading no image), then ``layout[i]`` reads sample
``i``'s files and returns its value, which the mirror stores column by column and
:class:`colabfast.H5Dataset` (or the layout's drop-in) gives back. A new layout is one new module
here, registered in :data:`colabfast.layouts.LAYOUTS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

from colabfast.errors import LayoutError, LayoutFileNotFoundError, LayoutNotFoundError, PackRefused
from colabfast.mirror.encoding import ImageFile
from colabfast.where._fileio import FileEntry, PathLike

__all__ = ["BaseLayout", "ImageFile", "Layout", "LayoutError", "LayoutFileNotFoundError", "LayoutNotFoundError"]


def refuse_split(layout: str, split: str) -> None:
    """Raise the refusal of ``split`` for a mirror of ``layout``, which holds one set of samples.

    Raises:
        PackRefused: always."""
    raise PackRefused(f"split={split!r}: a mirror of the {layout} layout has one set of samples; split= picks "
                      "KITTI's training or testing, a split a layout packs (VOC's image set, a YOLO export's "
                      "split), or the part of Kaggle's ImageNet zip to pack")


class BaseLayout:
    """What every registered layout says of itself (see `colabfast.layouts.registry`): its name, how its
    mirrors are packed and opened, its splits, and whether a source is one (`detect`).

    Attributes:
        name: the layout's name (``pack(layout=...)``, what its mirrors record).
        packed: ``"columns"`` (`Layout`: a dataset over the folder, a mirror of columns), ``"images"``
            (`ImageLayout`: an image mirror) or ``"stream"`` (`ArchiveLayout`: an archive read front
            to back into an image mirror).
        drop_in: the dataset class its mirrors open as; None: the one the `colabfast.datasets` stage
            registers for its kind (`colabfast.layouts.registry.drop_in_of`).
        packs_split: ``split=`` picks what is packed (VOC's image set, a YOLO export's split, Kaggle's part).
        labels_suffixes: a ``labels=`` file ending so names this layout for ``layout="auto"``.
    """

    name: ClassVar[str]
    packed: ClassVar[str]
    drop_in: ClassVar[Optional[type]] = None
    packs_split: ClassVar[bool] = False
    labels_suffixes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True if the source whose names are ``tree`` (a `colabfast.layouts.tree.Tree`, or a folder's
        path) holds this layout: cheap, a few listings at most, no parsing. ``labels`` and ``split`` are
        the caller's. Default: never (the layout is packed when named)."""
        return False

    @classmethod
    def split_args(cls, split: Optional[str]) -> dict:
        """The drop-in's arguments for ``open_dataset(..., split=split)`` of a mirror of this layout:
        none. A layout that ``packs_split`` packed the split asked for; any other holds one set of
        samples, so a ``split`` is refused.

        Raises:
            PackRefused: (a ``ValueError``) a ``split`` for a layout without splits."""
        if split is not None and not cls.packs_split:
            refuse_split(cls.name, split)
        return {}


class Layout(BaseLayout):
    """A source folder read as a map-style dataset (see the module's docstring).

    Subclasses set ``name`` and implement ``__init__`` (list and parse; an image read no further
    than the format's own tool reads it to list it: :class:`colabfast.layouts.Yolo` checks headers),
    ``__len__``, ``__getitem__`` and ``detect``.

    Attributes:
        root: the source folder.
        paths: each sample's image path relative to ``root`` (POSIX), in sample order.
        files: every file the mirror depends on (images, masks, annotation files), for its
            fingerprint: a changed file makes ``pack`` and ``open_dataset`` build a new mirror.
        skipped: ``(path, why)`` for what ``on_error="skip"`` left out, and for what the format's own
            tool leaves out or changes where the layout follows it (:class:`colabfast.layouts.Yolo`:
            Ultralytics' rules); also listed by ``colabfast info``: the first 1000 problems, then
            one record counting the rest.
        notes: ``(path, what)`` for each kind of leniency: what a stricter reader would refuse and
            the format's owner reads (COCO image entries without ``width``, as pycocotools reads
            them), how often, an example, and what was done; also in ``info["notes"]`` (so in the
            mirror, listed by ``colabfast info``) where there are any.
        info: JSON-able facts the drop-in reader needs (class names, COCO's categories, ...),
            stored in the mirror.
    """

    packed = "columns"
    root: Path
    paths: list[str]
    files: list[FileEntry]
    skipped: list[tuple[str, str]]
    notes: Sequence[tuple[str, str]] = ()  # none, unless the layout sets its own
    info: dict[str, Any]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} layout, {len(self)} images"
