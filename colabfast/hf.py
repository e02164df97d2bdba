"""Hugging Face ``datasets.Dataset`` as :func:`colabfast.pack` reads it: image features as their
encoded bytes, kept as they are, where that gives back exactly what the dataset returns.

``datasets`` stays optional: nothing here imports it unless a dataset of its is packed.
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image, ImageOps

from colabfast.layouts.base import ImageFile

__all__ = ["packable"]


def _image_features(dataset: Any) -> list[str]:
    features = getattr(dataset, "features", None)
    if not isinstance(features, dict) or not type(dataset).__module__.startswith("datasets"):
        return []
    return [name for name, f in features.items()
            if type(f).__name__ == "Image" and type(f).__module__.startswith("datasets") and getattr(f, "decode", True)]


def packable(dataset: Any) -> Any:
    """``dataset`` itself, or for a Hugging Face dataset with ``Image`` features a view of it whose
    images are :class:`~colabfast.layouts.base.ImageFile` (the encoded bytes, stored as they are), so
    a JPEG stays the JPEG it was. An image that ``datasets`` changes when it decodes it (an EXIF
    orientation it applies, a feature ``mode`` it converts to) comes as the decoded PIL image instead,
    which the mirror stores losslessly: either way the mirror gives back what ``dataset[i]`` gives."""
    names = _image_features(dataset)
    return _EncodedImages(dataset, names) if names else dataset


class _EncodedImages:
    """``dataset[i]`` with its image features read as bytes (``Image(decode=False)``)."""

    def __init__(self, dataset: Any, names: list[str]):
        try:  # installed: the dataset is one of its
            from datasets import Image as ImageFeature
        except ImportError as exc:
            raise ImportError(f"{type(dataset).__module__} datasets need the datasets package: pip install "
                              "datasets") from exc

        raw = dataset
        for name in names:
            raw = raw.cast_column(name, ImageFeature(decode=False))
        self.dataset, self.raw, self.names = dataset, raw, names
        self.features = {name: dataset.features[name] for name in names}
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
