"""Tiny ImageNet archives in the layouts people download: the official ILSVRC2012 tars and devkit,
and Kaggle's zip. The notebooks' tiny mode, the tests and the benchmarks pack these.

- ``ILSVRC2012_img_train.tar``: a tar of per-class tars ``<wnid>.tar`` holding ``<wnid>_<n>.JPEG``
  (members in a scrambled order, as ``tar`` of a folder stores them);
- ``ILSVRC2012_img_val.tar``: flat ``ILSVRC2012_val_<8 digits>.JPEG``;
- ``ILSVRC2012_devkit_t12.tar.gz``: ``data/meta.mat`` (``synsets`` written with
  ``scipy.io.savemat``: the leaf classes with ILSVRC2012 ids not in WordNet-id order, plus a parent
  synset that is not a class) and ``data/ILSVRC2012_validation_ground_truth.txt``;
- ``imagenet-object-localization-challenge.zip``: ``ILSVRC/Data/CLS-LOC/{train/<wnid>,val}/``,
  ``LOC_synset_mapping.txt``, ``LOC_val_solution.csv`` and annotations that are not images.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from colabfast.testing.data import WNIDS, _size, encode, photo
from colabfast.where._fileio import PathLike

__all__ = ["make_train_tar", "make_imagenet_archives", "make_kaggle_zip"]


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_300_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _images(classes: int, per_class: int, size: tuple[int, int], vary: float, rng: np.random.Generator):
    """``{wnid: [jpeg bytes]}``; class 0's first images are grayscale and CMYK, as a few in ImageNet are."""
    out = {}
    for c, wnid in enumerate(WNIDS[:classes]):
        imgs = []
        for n in range(per_class):
            img = photo(*_size(size, vary, rng), rng)
            if c == 0 and n < 2:
                img = img.convert("L" if n == 0 else "CMYK")
            imgs.append(encode(img))
        out[wnid] = imgs
    return out


def _class_words(wnid: str) -> str:
    return f"class {wnid}, {wnid[-3:]} thing"


def make_train_tar(path: PathLike, *, classes: int = 4, per_class: int = 6, size: tuple[int, int] = (500, 375),
                   vary: float = 0.2, seed: int = 0) -> Path:
    """Write only ``ILSVRC2012_img_train.tar``'s layout (a tar of per-class tars) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_train_tar(path, classes, per_class, size, vary, np.random.default_rng(seed))
    return path


def _write_train_tar(path: Path, classes: int, per_class: int, size: tuple[int, int], vary: float,
                     rng: np.random.Generator) -> None:
    train = _images(classes, per_class, size, vary, rng)
    with open(path, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for wnid in WNIDS[:classes]:  # one class tar in memory at a time
            perm = rng.permutation(per_class)
            inner = _tar_bytes([(f"{wnid}_{i}.JPEG", train[wnid][i]) for i in perm])
            info = tarfile.TarInfo(f"{wnid}.tar")
            info.size, info.mtime = len(inner), 1_300_000_000
            tar.addfile(info, io.BytesIO(inner))


def make_imagenet_archives(folder: PathLike, *, classes: int = 4, train_per_class: int = 6, val_per_class: int = 2,
                           size: tuple[int, int] = (160, 120), vary: float = 0.2, seed: int = 0) -> dict[str, Path]:
    """Write the three official ILSVRC2012 archives (tiny) into ``folder``.

    Returns:
        ``{"train": ..., "val": ..., "devkit": ...}`` paths.
    """
    import scipy.io

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    wnids = list(WNIDS[:classes])
    paths = {"train": folder / "ILSVRC2012_img_train.tar", "val": folder / "ILSVRC2012_img_val.tar",
             "devkit": folder / "ILSVRC2012_devkit_t12.tar.gz"}
    _write_train_tar(paths["train"], classes, train_per_class, size, vary, rng)

    ids = {w: int(i) + 1 for w, i in zip(wnids, rng.permutation(classes))}  # ILSVRC ids: not wnid order
    val = _images(classes, val_per_class, size, vary, rng)
    labelled = [(w, data) for w in wnids for data in val[w]]
    labelled = [labelled[i] for i in rng.permutation(len(labelled))]
    val_names = [f"ILSVRC2012_val_{k + 1:08d}.JPEG" for k in range(len(labelled))]
    paths["val"].write_bytes(_tar_bytes([(n, d) for n, (_, d) in zip(val_names, labelled)][::-1]))
    truth = "".join(f"{ids[w]}\n" for w, _ in labelled)

    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
              "num_train_images"]
    synsets = np.zeros((classes + 1,), dtype=[(f, "O") for f in fields])
    for w in wnids:
        synsets[ids[w] - 1] = (ids[w], w, _class_words(w), "a test class", 0, np.zeros(0), 0, train_per_class)
    synsets[classes] = (classes + 1, "n00001740", "entity", "a parent, not a class", classes,
                        np.arange(1, classes + 1, dtype=np.float64), 1, 0)
    mat = io.BytesIO()
    scipy.io.savemat(mat, {"synsets": synsets})
    devkit = io.BytesIO()
    with tarfile.open(fileobj=devkit, mode="w:gz") as tar:
        for name, data in (("ILSVRC2012_devkit_t12/data/meta.mat", mat.getvalue()),
                           ("ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt", truth.encode()),
                           ("ILSVRC2012_devkit_t12/COPYING", b"test devkit\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    paths["devkit"].write_bytes(devkit.getvalue())
    return paths


def make_kaggle_zip(path: PathLike, *, classes: int = 4, train_per_class: int = 6, val_per_class: int = 2,
                    size: tuple[int, int] = (160, 120), vary: float = 0.2, seed: int = 0) -> Path:
    """Write a tiny ``imagenet-object-localization-challenge.zip`` in Kaggle's layout to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    wnids = list(WNIDS[:classes])
    train, val = _images(classes, train_per_class, size, vary, rng), _images(classes, val_per_class, size, vary, rng)
    labelled = [(w, data) for w in wnids for data in val[w]]
    labelled = [labelled[i] for i in rng.permutation(len(labelled))]
    data = "ILSVRC/Data/CLS-LOC/"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("LOC_synset_mapping.txt", "".join(f"{w} {_class_words(w)}\n" for w in wnids))
        rows = ["ImageId,PredictionString"]
        for k, (w, _) in enumerate(labelled):
            rows.append(f"ILSVRC2012_val_{k + 1:08d},{w} 10 12 90 80 {w} 5 5 40 40 ")
        zf.writestr("LOC_val_solution.csv", "\n".join(rows[:1] + rows[1:][::-1]) + "\n")
        zf.writestr("LOC_sample_submission.csv", "ImageId,PredictionString\n")
        for w in wnids:
            zf.writestr(f"ILSVRC/Annotations/CLS-LOC/train/{w}/{w}_0.xml", "<annotation/>")
            for n in rng.permutation(train_per_class):
                zf.writestr(f"{data}train/{w}/{w}_{n}.JPEG", train[w][n])
        for k, (_, jpeg) in enumerate(labelled):
            zf.writestr(f"{data}val/ILSVRC2012_val_{k + 1:08d}.JPEG", jpeg)
        zf.writestr(f"{data}test/ILSVRC2012_test_00000001.JPEG", labelled[0][1])
    return path
