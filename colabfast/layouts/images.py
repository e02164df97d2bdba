"""The layouts :func:`colabfast.pack` packs into an image mirror (format version 2) rather than a
mirror of columns: ``"imagefolder"``, ``"files"`` and ``"kitti"``. A folder of them is read by
:mod:`colabfast.layouts.sources` and packed by :mod:`colabfast.packing.folders`, so each entry here is what
the registry needs of it (its name, the drop-in its mirrors open as, its split rule), not a dataset.
"""

from __future__ import annotations

from typing import ClassVar, Optional, Union

from colabfast.errors import PackRefused
from colabfast.layouts.base import refuse_split
from colabfast.mirror.format import KITTI_SPLITS

__all__ = ["ImageLayout", "ImageFolderLayout", "FilesLayout", "KittiLayout"]


class ImageLayout:
    """A layout packed into an image mirror (see the module's docstring)."""

    name: ClassVar[str]
    drop_in: ClassVar[Union[str, type]] = "H5ImageFolder"  # the class its mirrors open as (a name: colabfast.<name>)
    columns: ClassVar[bool] = False  # an image mirror, not a mirror of columns

    @classmethod
    def split_args(cls, split: Optional[str]) -> dict:
        """The drop-in's arguments for ``open_dataset(..., split=split)``: none; a mirror of this layout
        has one set of samples, so a ``split`` is refused.

        Raises:
            PackRefused: (a ``ValueError``) any ``split``."""
        if split is not None:
            refuse_split(cls.name, split)
        return {}


class ImageFolderLayout(ImageLayout):
    """torchvision's ``ImageFolder``: one sub-folder per class (ImageNet's ``train/``)."""

    name = "imagefolder"


class FilesLayout(ImageLayout):
    """A folder (or list) of images without classes: an ``H5ImageFolder`` whose targets are -1 (or the
    labels given to pack), as no torchvision class reads a flat folder."""

    name = "files"


class KittiLayout(ImageLayout):
    """KITTI object detection as torchvision's ``Kitti`` reads it: ``training/image_2`` + ``label_2``
    (+ ``calib``) and/or ``testing/image_2``; its mirror holds both splits."""

    name = "kitti"
    drop_in = "H5Kitti"

    @classmethod
    def split_args(cls, split: Optional[str]) -> dict:
        """``{"train": ...}`` for ``split`` ``"training"`` (or None) or ``"testing"``, as torchvision's
        ``Kitti(train=)``.

        Raises:
            PackRefused: (a ``ValueError``) another ``split``."""
        if split not in (None, *KITTI_SPLITS):
            raise PackRefused(f"split={split!r}: a KITTI mirror holds {' and '.join(KITTI_SPLITS)} (default training)")
        return {"train": split != "testing"}
