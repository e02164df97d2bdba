"""Hugging Face ``datasets.Dataset`` as :func:`colabfast.pack` reads it, so that the mirror gives back
what ``dataset[i]`` gives, by ``datasets``' own rules (``datasets/features/image.py``,
``Image.decode_example``; ``datasets/features/features.py``, ``Value``):

- an ``Image`` feature's value is its encoded bytes, kept as they are (JPEG, PNG in any mode such as
  16-bit ``I;16``, WebP, TIFF, GIF...) and decoded as ``datasets`` decodes them (``PIL.Image.open``),
  so it comes back with the same pixels, mode and ``format``; an image that ``datasets`` changes when
  it decodes it (an EXIF orientation it applies, a feature ``mode`` it converts to) comes as the
  decoded PIL image instead, stored losslessly (its ``format`` None, as ``datasets`` gives it);
- any feature may hold None (``datasets`` allows it for every feature): it comes back as None, and
  where the first row holds None the feature names the column's kind (``Value("string")`` str,
  integers and ``ClassLabel`` int, floats float, ``bool``, binary bytes, ``Image`` image).

:func:`colabfast.open_dataset` takes these datasets too (:func:`hf_kind`, :func:`mirror_stem`,
:func:`materialized`).

``datasets`` stays optional: nothing here imports it unless a dataset of its is packed or opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

from PIL import Image, ImageOps

from colabfast.layouts.base import ImageFile

__all__ = ["packable", "none_kinds", "hf_kind", "mirror_stem", "materialized", "HF_KINDS"]

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
    :class:`~colabfast.layouts.base.ImageFile` (the encoded bytes, stored as they are), so a JPEG stays
    the JPEG it was (see the module's docstring), and which says its features' kinds
    (:func:`none_kinds`).

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
        feature = self.features[name]
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            turned = img.getexif().get(Image.ExifTags.Base.Orientation) is not None
            if not turned and (not feature.mode or feature.mode == img.mode):
                return ImageFile(data, value.get("path") or f"{index}/{name}", kind="image", keep=True)
            out = ImageOps.exif_transpose(img) if turned else img.copy()
        return out.convert(feature.mode) if feature.mode and feature.mode != out.mode else out


def hf_kind(obj: Any) -> Optional[str]:
    """``"Dataset"``, ``"DatasetDict"``, ``"IterableDataset"`` or ``"IterableDatasetDict"`` where ``obj``
    is one of ``datasets``' (or of a subclass), by its classes' module names (nothing is imported);
    else None."""
    for cls in type(obj).__mro__:
        if cls.__name__ in HF_KINDS and cls.__module__.split(".")[0] == "datasets":
            return cls.__name__
    return None


def mirror_stem(dataset: Any, split: Optional[str]) -> str:
    """A readable start of the name of the mirror of ``dataset``: its ``info.dataset_name`` (or
    ``builder_name``, e.g. ``"generator"``; else ``"hf-dataset"``) and ``split``, as letters, digits,
    ``.``, ``_`` and ``-`` (``"mnist-train"``)."""
    info = getattr(dataset, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None) or "hf-dataset"
    stem = "-".join(str(part) for part in (name, split) if part)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:80] or "hf-dataset"


@contextlib.contextmanager
def materialized(iterable: Any, work: Path, progress: bool = True) -> Iterator[tuple[Any, int]]:
    """An ``IterableDataset`` read once, front to back, into a map-style ``datasets.Dataset`` in a new
    folder under ``work`` (deleted after the block), its images kept as the bytes it holds (read with
    ``decode(False)``: decoding then encoding again would change a JPEG); yields it and its rows' count.

    Its ``_fingerprint`` is the SHA-256 of what was read (the Arrow file ``datasets`` wrote, schema
    with its features included): an ``IterableDataset`` has no fingerprint of its own
    (``datasets/iterable_dataset.py``: only ``Dataset`` has ``_fingerprint``,
    ``datasets/arrow_dataset.py``), and nothing else tells whether the files or generator behind it
    give the same rows as before, so its content is what identifies it. ``progress``: show
    ``datasets``' progress bar while it reads.
    """
    try:  # installed: the dataset is one of its
        import datasets
        from datasets.utils.tqdm import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    except ImportError as exc:
        raise ImportError(f"{type(iterable).__module__} datasets need the datasets package: pip install "
                          "datasets") from exc

    features = getattr(iterable, "features", None)
    rows = iterable.decode(False) if features is not None and hasattr(iterable, "decode") else iterable
    work.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="hf-iterable-", dir=work))
    quiet = not progress and not are_progress_bars_disabled()
    try:
        if quiet:
            disable_progress_bars()
        split = getattr(iterable, "split", None)
        read = datasets.Dataset.from_generator(
            _rows, gen_kwargs={"source": rows}, features=features, cache_dir=str(folder),
            fingerprint=hashlib.sha256(str(folder).encode()).hexdigest()[:16],  # no hashing of the generator
            split=datasets.NamedSplit(str(split)) if split is not None else datasets.Split.TRAIN)
        if quiet:
            enable_progress_bars()
            quiet = False
        h = hashlib.sha256()
        for cache in read.cache_files:
            with open(cache["filename"], "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        info = read.info.copy()
        if getattr(iterable, "info", None) is not None:  # its own names, not "generator"'s
            info.dataset_name = iterable.info.dataset_name
            info.builder_name = iterable.info.builder_name
        dataset = datasets.Dataset(read.data, info=info, split=read.split, fingerprint=h.hexdigest())
        yield dataset, len(dataset)
    finally:
        if quiet:
            enable_progress_bars()
        shutil.rmtree(folder, ignore_errors=True)


def _rows(source: Any) -> Iterator[Any]:
    yield from source
