"""Image/mask pairs for semantic segmentation: ``root/images/`` and ``root/masks/`` (or
``root/labels/``) with the same sub-folders, an image and its mask paired by path without extension
(``images/a/1.jpg`` with ``masks/a/1.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from colabfast.layouts._folder import (
    check_on_error,
    image_size,
    list_files,
    read_file,
    refuse,
    reject,
    stem,
)
from colabfast.layouts._untrusted import Skipped
from colabfast.layouts.base import ImageFile, Layout, LayoutError
from colabfast.layouts.images import IMG_EXTENSIONS, is_image
from colabfast.layouts.registry import register
from colabfast.layouts.tree import tree_of
from colabfast.where._fileio import FileEntry, PathLike

__all__ = ["Segmentation"]

MASK_FOLDERS = ("masks", "labels")  # the first present is used


@register
class Segmentation(Layout):
    """A folder of images and their masks as a map-style dataset, sorted by image path.

    ``seg[i]`` is ``(ImageFile(kind="image"), ImageFile(kind="mask"))``; masks are kept losslessly in
    their own mode (a palette PNG stays ``"P"``).

    Args:
        root: the folder holding ``images/`` and ``masks/`` (else ``labels/``).
        on_error: ``"raise"``: an unpaired file, two files with one stem, or a FIFO, device or symlink
            leading out of ``root`` raise :class:`LayoutError`; ``"skip"``: listed in ``skipped``.
        retries: retries of each file read on Drive's transient errors.

    Raises:
        LayoutError: no ``images/`` or no ``masks/``/``labels/`` with images, or (``on_error="raise"``)
            an unpaired, ambiguous or refused file; ``seg[i]``: a mask whose size differs from its image's.
        FileNotFoundError: ``root`` does not exist.
    """

    name = "segmentation"

    def __init__(self, root: PathLike, *, on_error: str = "raise", retries: int = 5):
        check_on_error(on_error)
        self.root, self.on_error, self.retries = Path(root), on_error, retries
        self.skipped: Skipped = Skipped()
        files, refused = list_files(self.root, retries)
        present = [d for d in MASK_FOLDERS if any(f.rel.startswith(d + "/") and is_image(f.rel) for f in files)]
        if not any(f.rel.startswith("images/") and is_image(f.rel) for f in files) or not present:
            raise LayoutError(self.root, "expected images in images/ and their masks in masks/ (or labels/)",
                              fix="point to the folder that holds both")
        self.mask_folder = present[0]
        for rel in sorted(refused):
            if rel.startswith(("images/", self.mask_folder + "/")) and is_image(rel):
                reject(refuse(self.root, rel, refused), on_error, self.skipped)
        images = self._by_stem(files, "images")
        masks = self._by_stem(files, self.mask_folder)
        self.paths, self.files, self._masks = [], [], []
        for key in sorted(images.keys() | masks.keys(), key=lambda k: (images.get(k) or masks[k]).rel):
            image, mask = images.get(key), masks.get(key)
            if image is None:
                assert mask is not None
                reject(LayoutError(self.root / mask.rel, "a mask without an image",
                                   fix=f"add images/{key}.<ext> or delete the mask"), on_error, self.skipped)
            elif mask is None:
                reject(LayoutError(self.root / image.rel, "an image without a mask",
                                   fix=f"add {self.mask_folder}/{key}.png or delete the image"),
                       on_error, self.skipped)
            else:
                self.paths.append(image.rel)
                self._masks.append(mask.rel)
                self.files += [image, mask]
        self.files.sort()
        self.info: dict[str, Any] = {"masks": self.mask_folder}

    def _by_stem(self, files: list[FileEntry], folder: str) -> dict[str, FileEntry]:
        """The image files under ``folder/`` by their path in it without extension; two with one stem
        (``a.jpg``, ``a.png``) are rejected: neither would pair unambiguously."""
        found: dict[str, list[FileEntry]] = {}
        for f in files:
            if f.rel.startswith(folder + "/") and is_image(f.rel):
                found.setdefault(stem(f.rel[len(folder) + 1 :]), []).append(f)
        unique = {}
        for key, group in found.items():
            if len(group) == 1:
                unique[key] = group[0]
                continue
            names = ", ".join(f.rel for f in group)
            for f in group:
                reject(LayoutError(self.root / f.rel, f"several files with the stem {folder}/{key}: {names}",
                                   fix="keep one (pairs are matched by path without extension)"),
                       self.on_error, self.skipped)
        return unique

    def __getitem__(self, index: int) -> tuple[ImageFile, ImageFile]:
        """Pair ``index``.

        Raises:
            LayoutError: the mask's size differs from the image's, or either header cannot be read.
            OSError: a file cannot be read (after ``retries`` on transient errors).
        """
        image, mask = self.paths[index], self._masks[index]
        image_data, mask_data = read_file(self.root, image, self.retries), read_file(self.root, mask, self.retries)
        image_size_, mask_size = image_size(image_data, self.root / image), image_size(mask_data, self.root / mask)
        if image_size_ != mask_size:
            raise LayoutError(self.root / mask, f"the mask is {mask_size[0]}x{mask_size[1]} pixels, its image "
                              f"{image} is {image_size_[0]}x{image_size_[1]}", fix="a mask has its image's size")
        return ImageFile(image_data, image), ImageFile(mask_data, mask, kind="mask")

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True if the folder holds ``images/`` and a ``masks/`` with images in it, or a ``labels/``
        with images and no ``.txt`` (which would be YOLO's labels)."""
        tree = tree_of(tree)
        if not tree.is_dir("images"):
            return False
        if tree.first_file("masks", _is_image_name) is not None:
            return True
        return (tree.first_file("labels", _is_image_name) is not None
                and tree.first_file("labels", lambda name: name.lower().endswith(".txt")) is None)


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)
