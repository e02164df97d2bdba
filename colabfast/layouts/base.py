"""The interface of folder layouts (see :mod:`colabfast.layouts`): :class:`Layout`, :class:`ImageFile`,
:class:`LayoutError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

from colabfast.errors import LayoutError, LayoutFileNotFoundError, LayoutNotFoundError, PackRefused
from colabfast.mirror.encoding import ImageFile
from colabfast.where._fileio import FileEntry, PathLike

__all__ = ["BaseLayout", "ImageFile", "Layout", "LayoutError", "LayoutFileNotFoundError", "LayoutNotFoundError"]


def refuse_split(layout: str, split: str) -> None:
    """Raise the refusal (PackRefused) of ``split`` for a mirror of ``layout``, which holds one set of samples."""
    raise PackRefused(f"split={split!r}: a mirror of the {layout} layout has one set of samples; split= picks "
                      "KITTI's training or testing, a split a layout packs (VOC's image set, a YOLO export's "
                      "split), or the part of Kaggle's ImageNet zip to pack")


class BaseLayout:
    """What every registered layout says of itself (see `colabfast.layouts.registry`).

    Attributes:
        name: the layout's name (``pack(layout=...)``, what its mirrors record).
        packed: ``"columns"`` (`Layout`), ``"images"`` (`ImageLayout`) or ``"stream"`` (`ArchiveLayout`).
        drop_in: the dataset class its mirrors open as; None: the one registered for its kind.
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
        """True if the source ``tree`` (a `colabfast.layouts.tree.Tree`, or a folder's path) holds this layout:
        a few listings at most, no parsing. Default: never (the layout is packed when named).
        """
        return False

    @classmethod
    def split_args(cls, split: Optional[str]) -> dict:
        """The drop-in's arguments for ``open_dataset(..., split=split)``: none.

        Raises:
            PackRefused: (a ``ValueError``) a ``split`` for a layout without splits.
        """
        if split is not None and not cls.packs_split:
            refuse_split(cls.name, split)
        return {}


class Layout(BaseLayout):
    """A source folder read as a map-style dataset: made from the folder, it lists the files and parses every
    annotation (reading no image); ``layout[i]`` reads sample ``i``'s files, stored column by column.

    Subclasses set ``name`` and implement ``__init__``, ``__len__``, ``__getitem__`` and ``detect``.

    Attributes:
        root: the source folder.
        paths: each sample's image path relative to ``root`` (POSIX), in sample order.
        files: every file the mirror depends on, for its fingerprint (a changed file means a new mirror).
        skipped: ``(path, why)`` for what ``on_error="skip"`` or the format's own tool leaves out (the
            first 1000, then one record counting the rest; listed by ``colabfast info``).
        notes: ``(path, what)`` for each kind of leniency the format's owner allows (how often, an example,
            what was done); also in ``info["notes"]``.
        info: JSON-able facts the drop-in reader needs (class names, COCO's categories, ...).
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
