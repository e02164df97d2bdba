"""ImageNet's labels as torchvision gives them, read from the devkit (``data/meta.mat``,
``ILSVRC2012_validation_ground_truth.txt``) or Kaggle's ``LOC_synset_mapping.txt`` and
``LOC_val_solution.csv``, parsed as torchvision's ``parse_devkit_archive`` does, nothing extracted.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import posixpath
import tarfile
from pathlib import Path
from typing import Any, Callable, Optional

from colabfast.errors import PackRefused, SourceNotFound
from colabfast.layouts.images import ImageLayout
from colabfast.layouts.registry import register
from colabfast.layouts.tree import tree_of
from colabfast.where._fileio import PathLike, open_regular, read_regular

__all__ = ["ImageNetLabels", "read_devkit", "read_kaggle_labels", "ArchiveLayout", "ImageNetTrain", "ImageNetVal",
           "KaggleTrain", "KaggleVal"]

DEVKIT_META = "data/meta.mat"
DEVKIT_VAL_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
KAGGLE_SYNSETS = "LOC_synset_mapping.txt"
KAGGLE_VAL_SOLUTION = "LOC_val_solution.csv"
KAGGLE_DATA = "ILSVRC/Data/CLS-LOC/"


@dataclasses.dataclass
class ImageNetLabels:
    """Class names and validation labels of ImageNet.

    Attributes:
        class_names: WordNet id -> class names (torchvision's ``wnid_to_classes``).
        val_wnids: each validation image's WordNet id, in sorted file-name order (the devkit), or None.
        val_by_stem: validation image id -> WordNet id (Kaggle), or None.
        origin: where these came from, e.g. ``"ILSVRC2012_devkit_t12.tar.gz (data/meta.mat, ...)"``.
    """

    class_names: dict[str, tuple[str, ...]]
    val_wnids: Optional[list[str]]
    val_by_stem: Optional[dict[str, str]]
    origin: str

    def val_targets(self, names: list[str]) -> list[str]:
        """The WordNet id of each validation file in ``names`` (in any order).

        Raises:
            ValueError: the labels do not cover these files (wrong devkit, or a partial archive).
        """
        if self.val_by_stem is not None:
            missing = [n for n in names if os.path.splitext(os.path.basename(n))[0] not in self.val_by_stem]
            if missing:
                raise PackRefused(f"{self.origin} has no label for {len(missing)} validation images, e.g. {missing[0]}")
            return [self.val_by_stem[os.path.splitext(os.path.basename(n))[0]] for n in names]
        assert self.val_wnids is not None
        if len(names) != len(self.val_wnids):
            raise PackRefused(f"{self.origin} labels {len(self.val_wnids)} validation images, the archive holds "
                              f"{len(names)}: is it the validation archive of the same release?")
        rank = {n: i for i, n in enumerate(sorted(names))}
        return [self.val_wnids[rank[n]] for n in names]


def read_devkit(path: PathLike) -> ImageNetLabels:
    """Read ``ILSVRC2012_devkit_t12.tar.gz`` (or a folder holding its ``data/``) as torchvision does (needs scipy).

    Raises:
        FileNotFoundError: the devkit or one of its two files is missing.
        OSError: (errno ``EINVAL``) one of them is not a regular file (a FIFO is refused, never read).
        ImportError: scipy is not installed.
    """
    path = Path(os.path.abspath(path))
    if path.is_dir():
        root = path if (path / DEVKIT_META).is_file() else path / "ILSVRC2012_devkit_t12"
        meta, truth = read_regular(root / DEVKIT_META), read_regular(root / DEVKIT_VAL_TRUTH)
    else:
        meta, truth = _devkit_members(path)
    idx_to_wnid, class_names = _parse_meta_mat(meta)
    val_wnids = [idx_to_wnid[int(line)] for line in truth.decode("ascii").split()]
    origin = f"{path} ({DEVKIT_META}, {DEVKIT_VAL_TRUTH})"
    return ImageNetLabels(class_names, val_wnids, None, origin)


def _devkit_members(path: Path) -> tuple[bytes, bytes]:
    found: dict[str, bytes] = {}
    # small (2.5 MB): read, never extracted
    with open_regular(path) as raw, tarfile.open(fileobj=io.BufferedReader(raw), mode="r:*") as tar:
        for member in tar:
            for want in (DEVKIT_META, DEVKIT_VAL_TRUTH):
                if member.isfile() and member.name.endswith("/" + want) and want not in found:
                    f = tar.extractfile(member)
                    assert f is not None
                    found[want] = f.read()
    missing = [w for w in (DEVKIT_META, DEVKIT_VAL_TRUTH) if w not in found]
    if missing:
        raise SourceNotFound(f"{path} is not ImageNet's devkit: it has no {' or '.join(missing)} "
                             "(expected ILSVRC2012_devkit_t12.tar.gz)")
    return found[DEVKIT_META], found[DEVKIT_VAL_TRUTH]


def _parse_meta_mat(data: bytes) -> tuple[dict[int, str], dict[str, tuple[str, ...]]]:
    """torchvision's ``parse_meta_mat``: the leaf synsets (no children) are the 1000 classes."""
    try:
        import scipy.io
    except ImportError as exc:
        raise ImportError("reading ImageNet's devkit (meta.mat) needs scipy, as torchvision does: "
                          "pip install scipy (Colab has it)") from exc
    meta = scipy.io.loadmat(io.BytesIO(data), squeeze_me=True)["synsets"]
    leaves = [row for row in meta if row[4] == 0]  # field 4: num_children
    idx_to_wnid = {int(row[0]): str(row[1]) for row in leaves}
    class_names = {str(row[1]): tuple(str(row[2]).split(", ")) for row in leaves}
    return idx_to_wnid, class_names


def read_kaggle_labels(synsets: str, solution: Optional[str], origin: str) -> ImageNetLabels:
    """Labels from Kaggle's ``LOC_synset_mapping.txt`` and (for validation) ``LOC_val_solution.csv`` texts."""
    class_names = {}
    for line in synsets.splitlines():
        wnid, _, words = line.strip().partition(" ")
        if wnid:
            class_names[wnid] = tuple(words.split(", "))
    by_stem = None
    if solution is not None:
        by_stem = {row["ImageId"]: row["PredictionString"].split()[0]
                   for row in csv.DictReader(io.StringIO(solution)) if row.get("PredictionString")}
    return ImageNetLabels(class_names, None, by_stem, origin)


class ArchiveLayout(ImageLayout):
    """ImageNet's own archives, read front to back into an image mirror (never extracted) with the classes,
    targets and order of ``torchvision.datasets.ImageNet``.
    """

    packed = "stream"
    streams = True

    @classmethod
    def archive_labels(cls, path: Path, read: Callable[[str], bytes], labels: Optional[PathLike]) -> Any:
        """The devkit's class names and validation labels (``labels=``), where given."""
        return read_devkit(labels) if labels is not None else None

    @classmethod
    def archive_paths(cls, names: list[str], labels: Any, path: Path) -> list[str]:
        return list(names)  # <wnid>/<file> already


@register
class ImageNetTrain(ArchiveLayout):
    """``ILSVRC2012_img_train.tar``: a tar of per-class tars (``n01440764.tar``, ...)."""

    name = "imagenet-train"
    archive_kinds = ("tar",)
    inner_tars = True
    about_archive = "ImageNet's training archive (a tar of per-class tars)"

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """A tar whose first member is a tar."""
        tree = tree_of(tree)
        return not tree.listed and (tree.first or "").endswith(".tar")


@register
class ImageNetVal(ArchiveLayout):
    """``ILSVRC2012_img_val.tar``: one flat folder of JPEGs, labelled by the devkit (``labels=``)."""

    name = "imagenet-val"
    archive_kinds = ("tar",)
    about_archive = "ImageNet's validation archive (one flat folder)"

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """A tar of images given ``labels=`` (the devkit)."""
        tree = tree_of(tree)
        return not tree.listed and labels is not None and not (tree.first or "").endswith(".tar")

    @classmethod
    def archive_labels(cls, path: Path, read: Callable[[str], bytes], labels: Optional[PathLike]) -> Any:
        """The devkit's labels.

        Raises:
            PackRefused: no ``labels=``."""
        if labels is None:
            raise PackRefused(f"{path} is ImageNet's validation archive: its labels are in the devkit; pass "
                              "labels='.../ILSVRC2012_devkit_t12.tar.gz'")
        return read_devkit(labels)

    @classmethod
    def archive_paths(cls, names: list[str], labels: Any, path: Path) -> list[str]:
        return [f"{w}/{posixpath.basename(n)}" for w, n in zip(labels.val_targets(names), names)]


@register
class KaggleTrain(ArchiveLayout):
    """Kaggle's ``imagenet-object-localization-challenge.zip``, ``ILSVRC/Data/CLS-LOC/train/<wnid>/``
    (``split="train"``, the default), labelled by its ``LOC_synset_mapping.txt``."""

    name = "kaggle-train"
    packs_split = True
    part = "train"
    archive_kinds = ("zip",)
    archive_prefix = f"{KAGGLE_DATA}train/"
    about_archive = "Kaggle's ImageNet zip, train/"

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """A zip holding ``LOC_synset_mapping.txt`` at its top, for ``split`` None or this part."""
        tree = tree_of(tree)
        return tree.archive and tree.listed and tree.is_file(KAGGLE_SYNSETS) and (split or "train") == cls.part

    @classmethod
    def archive_labels(cls, path: Path, read: Callable[[str], bytes], labels: Optional[PathLike]) -> Any:
        """The zip's own class names (and, for val, its ``LOC_val_solution.csv``).

        Raises:
            FileNotFoundError: the zip lacks them."""
        try:
            synsets = read(KAGGLE_SYNSETS).decode("utf-8")
        except KeyError:
            raise SourceNotFound(f"{path} is not Kaggle's ImageNet zip: no {KAGGLE_SYNSETS}") from None
        solution = None
        if cls.part == "val":
            try:
                solution = read(KAGGLE_VAL_SOLUTION).decode("utf-8")
            except KeyError:
                raise SourceNotFound(f"{path} has no {KAGGLE_VAL_SOLUTION}: no validation labels") from None
        return read_kaggle_labels(synsets, solution, f"{path} ({KAGGLE_SYNSETS}"
                                  + (f", {KAGGLE_VAL_SOLUTION})" if solution else ")"))


@register
class KaggleVal(KaggleTrain):
    """Kaggle's ImageNet zip, its flat ``val/`` labelled by ``LOC_val_solution.csv`` (``split="val"``)."""

    name = "kaggle-val"
    part = "val"
    archive_prefix = f"{KAGGLE_DATA}val/"
    about_archive = "Kaggle's ImageNet zip, val/"

    @classmethod
    def archive_paths(cls, names: list[str], labels: Any, path: Path) -> list[str]:
        return ImageNetVal.archive_paths(names, labels, path)
