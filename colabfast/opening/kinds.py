"""What a path given to :func:`colabfast.open_dataset` is: a mirror, a folder, an archive, or nothing it
can open (:func:`what_is`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

from colabfast.errors import NothingToOpen
from colabfast.staging.extract import archive_suffix
from colabfast.where._fileio import (
    human_bytes,
    retry,
)

__all__ = ["ACCEPTS", "what_is"]

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # the first 8 bytes of an HDF5 file (pack writes no user block)
ACCEPTS = ("open_dataset accepts a mirror made by colabfast.pack (.h5), a dataset folder (an ImageFolder tree "
           "of class folders, KITTI's training/image_2 + label_2, a COCO folder with its annotation JSON, a "
           "VOCdevkit tree, a YOLO export (images/ + labels/ + data.yaml), images/ + masks/ folders, a folder of "
           "images with one CSV table of labels (or Kaggle's train.csv beside train/), a folder of split folders "
           "(train/, val/, ...) with split=, a Hugging Face dataset's save_to_disk folder, or a folder of images), "
           "or an archive of an ImageFolder tree or "
           "ImageNet's (.zip, .tar, .tar.gz, .tgz, .tar.bz2, .tar.xz)")
# pack()'s arguments that are open_dataset's own (split, image_size, progress) or that it decides (src, dst;
# fields and overwrite: a mirror open_dataset packs is of the source as it is, at a name no other file takes)
OWN_ARGUMENTS = ("src", "dst", "split", "image_size", "progress", "fields", "overwrite")


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
        from colabfast.errors import MirrorError

        raise MirrorError(_one_file(path) or f"{path} is a file of {human_bytes(st.st_size)} that is neither an HDF5 "
                          f"mirror nor an archive (by its name, {path.suffix or 'no suffix'}). {ACCEPTS}.")
    from colabfast.errors import MirrorError

    raise MirrorError(f"{path} is not a regular file or a folder (a pipe, socket or device). {ACCEPTS}.")


def _one_file(path: Path) -> Optional[str]:
    """What a dataset's own file given alone (by its name: a CSV table, a COCO JSON, YOLO's data.yaml, an
    image) is, and what to pass instead; None for any other file."""
    from colabfast.layouts.images import IMG_EXTENSIONS

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


