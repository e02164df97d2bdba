"""The uint8 collate: :func:`collate`, ``default_collate`` for image datasets."""

from __future__ import annotations

import collections.abc
import copy
from typing import Any, Sequence, cast

import torch
from torch.utils.data import default_collate, get_worker_info

from colabfast.datasets.dropins import compact
from colabfast.images.decode import Encoded, EncodedImages, empty_uint8, is_encoded
from colabfast.loading.prefetch import ImageList

__all__ = ["collate", "collate_value"]


def collate(batch: Sequence[Any], *, memory_format: torch.memory_format = torch.channels_last,
            per_sample: frozenset = frozenset()) -> Any:
    """``default_collate`` for image datasets: images stay uint8 and are batched with one memcpy each.

    The image is a sample's first element or the sample itself when it is a tensor:

    - same-shape uint8 ``[C, H, W]``: a channels-last ``[B, C, H, W]`` batch (``[B, H, W, C]`` memory, shared
      in a worker); contiguous with ``memory_format=torch.contiguous_format``.
    - different sizes: an :class:`~colabfast.loading.prefetch.ImageList` (a list) of the images.
    - encoded files (1-D uint8 JPEG/PNG bytes): one :class:`~colabfast.images.decode.EncodedImages`.
    - other tensors: stacked as ``default_collate`` does.

    The rest is collated like ``default_collate``, except that sequences of dicts, ragged sequences, empty
    sequences, tensors of different shapes (boxes ``[M, 4]``), dicts holding them, and None stay a list per
    sample (as torchvision's detection models take targets).

    Args:
        batch: the samples.
        memory_format: layout of same-shape uint8 image batches.
        per_sample: paths in a sample (tuple positions and dict keys, e.g. ``(1,)``) always kept per sample:
            what :meth:`colabfast.H5Dataset.per_sample` names.

    Returns:
        The batch, structured like one sample.
    """
    elem = batch[0]
    if _is_image(elem):
        return _collate_images(batch, memory_format)
    if isinstance(elem, (tuple, list)) and elem and _is_image(elem[0]) and _same_length(batch):
        images = _collate_images([sample[0] for sample in batch], memory_format)
        rest = [collate_value(parts, (i,), per_sample) for i, parts in enumerate(zip(*batch)) if i]
        if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
            return type(elem)(images, *rest)
        return [images, *rest]  # default_collate also turns tuples into lists
    return collate_value(batch, (), per_sample)


def collate_value(values: Sequence[Any], path: tuple = (), per_sample: frozenset = frozenset()) -> Any:
    """``default_collate`` of the samples' part at ``path``, keeping what :func:`collate` keeps per sample."""
    elem = values[0]
    if elem is None or path in per_sample:
        return list(values)
    if isinstance(elem, torch.Tensor) and any(v.shape != elem.shape for v in values):
        return list(values)  # ragged targets (boxes [M, 4], labels [M]): one per sample, as torchvision's detection
    if isinstance(elem, collections.abc.Mapping):
        if any(isinstance(v, torch.Tensor) and any(x[k].shape != v.shape for x in values) for k, v in elem.items()):
            return list(values)  # a detection target ({"boxes": [M, 4], "labels": [M]}): the dicts, one per sample
        collated = {key: collate_value([v[key] for v in values], (*path, key), per_sample) for key in elem}
        try:
            if isinstance(elem, collections.abc.MutableMapping):
                clone = copy.copy(elem)
                clone.update(collated)
                return clone
            mapping_type: Any = type(elem)  # a concrete mapping class; a TypeError if it takes no dict
            return mapping_type(collated)
        except TypeError:
            return collated
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(collate_value(parts, (*path, i), per_sample) for i, parts in enumerate(zip(*values))))
    if isinstance(elem, collections.abc.Sequence) and not isinstance(elem, (str, bytes)):
        if not elem or not _same_length(values) or all(isinstance(x, collections.abc.Mapping) for x in elem):
            return list(values)
        transposed = [collate_value(parts, (*path, i), per_sample) for i, parts in enumerate(zip(*values))]
        if isinstance(elem, tuple):
            return transposed
        try:
            copied: Any = copy.copy(elem)  # a mutable sequence, else the assignment raises TypeError
            copied[:] = transposed
            return copied
        except TypeError:
            return transposed
    return default_collate(cast(list, values))  # torch types the batch a list; any sequence collates


def _same_length(values: Sequence[Any]) -> bool:
    return all(len(v) == len(values[0]) for v in values)


def _is_image(x: Any) -> bool:
    return is_encoded(x) or (isinstance(x, torch.Tensor) and x.dim() == 3)


def _collate_images(images: Sequence[Any], memory_format: torch.memory_format) -> Any:
    encoded = [is_encoded(x) for x in images]
    if all(encoded):
        files = [x.data if isinstance(x, Encoded) else x for x in images]
        indices = [x.index for x in images] if all(isinstance(x, Encoded) for x in images) else None
        return EncodedImages.pack(files, indices, shared=get_worker_info() is not None)
    if any(encoded) or not all(isinstance(x, torch.Tensor) and x.dim() == 3 for x in images):
        return ImageList([compact(x) for x in images])  # some decoded in the worker, some left for the GPU
    first = images[0]
    if any(x.shape != first.shape or x.dtype != first.dtype for x in images):
        return ImageList([compact(x) for x in images])  # passed on as they are: they must own their memory
    if first.dtype != torch.uint8 or memory_format != torch.channels_last:
        return default_collate(list(images))
    c, h, w = first.shape
    out = empty_uint8((len(images), h, w, c), shared=get_worker_info() is not None)
    torch.stack([x.permute(1, 2, 0) for x in images], out=out)
    return out.permute(0, 3, 1, 2)
