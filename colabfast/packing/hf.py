"""Hugging Face ``datasets.Dataset`` as :func:`colabfast.pack` reads it, so that the mirror gives back
what ``dataset[i]`` gives, by ``datasets``' own rules (``datasets/features/image.py``, ``Image.decode_example``):

- an ``Image`` feature's value is its encoded bytes, kept as they are and decoded with ``PIL.Image.open``
  (same pixels, mode, ``format``); one ``datasets`` changes as it decodes (EXIF orientation, a feature
  ``mode``) is stored as the decoded image, losslessly (``format`` None);
- any feature may hold None, which comes back as None; the feature names the column's kind.

:func:`colabfast.open_dataset` takes these too (:func:`hf_kind`, :func:`mirror_stem`, :func:`materialized`).
``datasets`` stays optional: nothing here imports it unless a dataset of its is packed or opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
from PIL import Image, ImageOps

from colabfast.images.decode import check_encoded
from colabfast.layouts.base import ImageFile

__all__ = ["packable", "none_kinds", "hf_kind", "mirror_stem", "materialized", "load_saved", "HF_KINDS"]

# The classes of ``datasets`` that open_dataset takes, by name (``datasets/arrow_dataset.py``,
# ``datasets/iterable_dataset.py``, ``datasets/dataset_dict.py``): found by module name, not imported.
HF_KINDS = ("Dataset", "DatasetDict", "IterableDataset", "IterableDatasetDict")


def _is_hf(dataset: Any) -> bool:
    return isinstance(getattr(dataset, "features", None), dict) and type(dataset).__module__.startswith("datasets")


def _image_features(dataset: Any) -> list[str]:
    if not _is_hf(dataset):
        return []
    return [name for name, f in dataset.features.items()
            if type(f).__name__ == "Image" and type(f).__module__.startswith("datasets") and getattr(f, "decode", True)]


def _kind(feature: Any) -> Optional[str]:
    """The column kind of a top-level feature's values (:mod:`colabfast.mirror.columns`), or None where the
    values themselves say (lists, dicts: JSON)."""
    name = type(feature).__name__
    if name == "Image" and getattr(feature, "decode", True):
        return "image"
    if name == "ClassLabel":
        return "int"
    dtype = str(getattr(feature, "dtype", "")) if name == "Value" else ""
    if dtype in ("string", "large_string"):
        return "str"
    if dtype in ("binary", "large_binary"):
        return "bytes"
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "int"
    if dtype.startswith("float") or dtype == "double":
        return "float"
    return None


def none_kinds(dataset: Any) -> Optional[dict[str, str]]:
    """For a dataset :func:`packable` made of a Hugging Face one, the column kind of each feature whose
    None in the first row cannot say it (:func:`colabfast.mirror.columns.template_of`'s ``defaults``); else None."""
    return dataset.none_kinds if isinstance(dataset, _EncodedImages) else None


def packable(dataset: Any) -> Any:
    """``dataset`` itself, or for a Hugging Face dataset a view of it whose images are
    :class:`~colabfast.layouts.base.ImageFile` (the encoded bytes) and which says its features' kinds.

    Raises:
        ImportError: a dataset of ``datasets`` with image features, and ``datasets`` is not installed.
    """
    return _EncodedImages(dataset, _image_features(dataset)) if _is_hf(dataset) else dataset


class _EncodedImages:
    """``dataset[i]`` with its image features (``names``) read as bytes (``Image(decode=False)``)."""

    def __init__(self, dataset: Any, names: list[str]):
        raw = dataset
        if names:
            try:  # installed: the dataset is one of its
                from datasets import Image as ImageFeature
            except ImportError as exc:
                raise ImportError(f"{type(dataset).__module__} datasets need the datasets package: pip install "
                                  "datasets") from exc
        for name in names:
            raw = raw.cast_column(name, ImageFeature(decode=False))
        self.dataset, self.raw, self.names = dataset, raw, names
        self.features = {name: dataset.features[name] for name in names}
        self.none_kinds = {name: kind for name, f in dataset.features.items() if (kind := _kind(f)) is not None}
        self.fingerprint = getattr(dataset, "_fingerprint", None)
        cls = type(dataset)
        self.source_name = f"{cls.__module__}.{cls.__qualname__}"  # what the mirror records it was packed from

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, index: int) -> Any:
        # one row, sliced from the Arrow table and made Python by itself: Dataset.__getitem__ (query_table,
        # Table.fast_slice, PythonFormatter.format_row in datasets/formatting/formatting.py)
        row = dict(self.raw[index])
        for name in self.names:
            value = row[name]
            if value is None:
                continue
            data = value.get("bytes")
            if data is None and value.get("path"):
                with open(value["path"], "rb") as f:
                    data = f.read()
            row[name] = self._as_stored(name, data, value, index)
        return row

    def _as_stored(self, name: str, data: bytes, value: dict, index: int) -> Any:
        """The image as the mirror stores it: its file (``ImageFile``, checked and decoded by pack as any
        image is), or where ``datasets`` would change it as it decodes it, the changed PIL image. Bytes
        whose header PIL cannot read, or that declare more than ``PIL.Image.MAX_IMAGE_PIXELS``, are
        passed on as a file unread, for pack to refuse as any image (naming the row; ``on_error``)."""
        feature = self.features[name]
        where = f"row {index}, feature {name!r}" + (f" ({value['path']})" if value.get("path") else "")
        kept = ImageFile(data, where, kind="image", keep=True)
        try:
            check_encoded(np.frombuffer(data, np.uint8), where)  # its header, before any pixel is decoded
            with Image.open(io.BytesIO(data)) as img:
                turned = img.getexif().get(Image.ExifTags.Base.Orientation) is not None
                if not turned and (not feature.mode or feature.mode == img.mode):
                    return kept
                out = ImageOps.exif_transpose(img) if turned else img.copy()
            return out.convert(feature.mode) if feature.mode and feature.mode != out.mode else out
        except Exception:  # PIL raises many types for bad bytes: pack's check of the file names them
            return kept


def hf_kind(obj: Any) -> Optional[str]:
    """``"Dataset"``, ``"DatasetDict"``, ``"IterableDataset"`` or ``"IterableDatasetDict"`` where ``obj``
    is one of ``datasets``' (or of a subclass), by its classes' module names (nothing is imported);
    else None."""
    for cls in type(obj).__mro__:
        if cls.__name__ in HF_KINDS and cls.__module__.split(".")[0] == "datasets":
            return cls.__name__
    return None


def load_saved(path: Any) -> Optional[Any]:
    """The ``Dataset`` or ``DatasetDict`` that ``save_to_disk`` wrote to the folder ``path``
    (``dataset_info.json`` and ``state.json``, or ``dataset_dict.json``: ``datasets/load.py``), read with
    ``datasets.load_from_disk``; None for any other path.

    Raises:
        ImportError: such a folder, and ``datasets`` is not installed (the message says to install it)."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    folder = Path(os.path.abspath(os.path.expanduser(path)))
    if not ((folder / "dataset_info.json").is_file() and (folder / "state.json").is_file()
            or (folder / "dataset_dict.json").is_file()):
        return None
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(f"{folder} is a Hugging Face dataset saved with save_to_disk: reading it needs the "
                          "datasets package: pip install datasets") from exc
    return datasets.load_from_disk(str(folder))


def mirror_stem(dataset: Any, split: Optional[str]) -> str:
    """A readable start of the name of the mirror of ``dataset``: its ``info.dataset_name`` (or
    ``builder_name``, e.g. ``"generator"``; else ``"hf-dataset"``) and ``split``, as letters, digits,
    ``.``, ``_`` and ``-`` (``"mnist-train"``)."""
    info = getattr(dataset, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None) or "hf-dataset"
    stem = "-".join(str(part) for part in (name, split) if part)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:80] or "hf-dataset"


BATCH_BYTES = 64 << 20  # rows of an IterableDataset held before they are written to disk, at most (or one row)


@contextlib.contextmanager
def materialized(iterable: Any, work: Path, progress: bool = True) -> Iterator[tuple[Any, int]]:
    """An ``IterableDataset`` read once into a map-style ``datasets.Dataset`` in a new folder under ``work``
    (deleted after the block), images kept as their bytes; yields it and its rows' count. Written by
    ``datasets``' ``ArrowWriter`` in batches of at most `BATCH_BYTES`; its ``_fingerprint`` is the SHA-256 of
    the Arrow file (docs/layouts.md). ``progress``: show a bar of the rows read.
    """
    try:  # installed: the dataset is one of its
        import datasets
        import pyarrow as pa
        from datasets.arrow_writer import ArrowWriter
    except ImportError as exc:
        raise ImportError(f"{type(iterable).__module__} datasets need the datasets package: pip install "
                          "datasets") from exc
    from tqdm.auto import tqdm

    features = getattr(iterable, "features", None)
    rows = iterable.decode(False) if features is not None and hasattr(iterable, "decode") else iterable
    work.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="hf-iterable-", dir=work))
    try:
        path = folder / "rows.arrow"
        # a file Arrow writes itself (through a Python file, each record batch was copied once more)
        writer = ArrowWriter(features=features, stream=pa.OSFile(str(path), "wb"))
        try:
            held = 0
            for row in tqdm(rows, desc="read the IterableDataset", unit="row", disable=not progress):
                example = features.encode_example(row) if features is not None else row
                writer.write(example)  # written by datasets' count (its writer_batch_size), or here by bytes
                held += _nbytes(example)
                if held >= BATCH_BYTES:
                    writer.write_examples_on_file()
                    held = 0
            writer.finalize()
        finally:
            writer.close()
        pa.default_memory_pool().release_unused()  # the batches' Arrow copies, which its allocator would keep
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        split = getattr(iterable, "split", None)
        info = iterable.info.copy() if getattr(iterable, "info", None) is not None else datasets.DatasetInfo()
        read = datasets.Dataset.from_file(str(path), info=info, split=datasets.NamedSplit(str(split)) if split
                                          is not None else datasets.Split.TRAIN)
        dataset = datasets.Dataset(read.data, info=read.info, split=read.split, fingerprint=h.hexdigest())
        yield dataset, len(dataset)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _nbytes(value: Any) -> int:
    """About the bytes ``value`` (an encoded row) holds: its bytes and strings, arrays, 8 a number."""
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 8))
