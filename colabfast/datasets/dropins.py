"""The drop-ins over image mirrors: :class:`MirrorDataset`, :class:`H5ImageFolder` (torchvision's
``ImageFolder``) and :class:`H5Kitti` (``Kitti``), and seeing through ``Subset``/``ConcatDataset`` to the
mirror below (:func:`through_subsets`, :func:`read_order`, :func:`unwrap`). :mod:`colabfast.datasets` says
how they read safely in workers and how their two orders meet."""

from __future__ import annotations

import operator
import os
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch
from numpy.typing import NDArray
from PIL import Image
from torch.utils.data import ConcatDataset, Subset, get_worker_info
from torchvision.datasets import ImageFolder, Kitti, VisionDataset
from torchvision.datasets.folder import IMG_EXTENSIONS, default_loader

from colabfast.datasets.mirrorreader import MirrorReader
from colabfast.errors import IndexTypeError, MirrorError
from colabfast.images.decode import ImageSizeError, check_encoded, decode_cpu, decode_pil
from colabfast.layouts.registry import register_drop_in
from colabfast.mirror.format import KITTI, Header
from colabfast.mirror.index import read_paths
from colabfast.mirror.safety import read_h5
from colabfast.where._fileio import PathLike

__all__ = ["H5ImageFolder", "H5Kitti", "MirrorDataset", "read_order", "through_subsets", "unwrap"]

OUTPUTS = ("pil", "tensor", "bytes")
def through_subsets(dataset: Any) -> tuple[Any, Optional[np.ndarray]]:
    """The dataset under any ``torch.utils.data.Subset`` wrappers (``random_split`` makes them), and
    the int64 array that maps the outer dataset's indices onto its (None without a Subset), with
    negative indices counted from the end.

    Raises:
        IndexError: a Subset's index is outside the dataset it wraps (as indexing it would).
    """
    mapping: Optional[np.ndarray] = None
    while isinstance(dataset, Subset):
        idx = np.asarray(dataset.indices, dtype=np.int64).reshape(-1)
        mapping = idx if mapping is None else idx[mapping]
        dataset = dataset.dataset
    if mapping is not None:
        n = len(dataset)
        if len(mapping) and (mapping.min() < -n or mapping.max() >= n):
            raise IndexError(f"a Subset index is outside its dataset of {n} samples")
        mapping = np.where(mapping < 0, mapping + n, mapping)
    return dataset, mapping


def read_order(dataset: Any) -> Optional[NDArray[np.int64]]:
    """The indices of ``dataset`` in its stored order, for samplers that read the file in runs
    (:class:`colabfast.BlockShuffleSampler`).

    Args:
        dataset: a mirror dataset, a (nested) ``Subset`` of one, or any other dataset.

    Returns:
        int64 ``[len(dataset)]``, a permutation of ``arange(len(dataset))``; None when that is the
        identity or ``dataset`` is not a mirror.

    Raises:
        IndexError: a Subset's index is outside the dataset it wraps.
    """
    base, mapping = through_subsets(dataset)
    if not isinstance(base, MirrorDataset):
        return None
    positions = base.reader.positions
    if positions is not None:
        stored = positions if mapping is None else positions[mapping]
    elif mapping is not None:
        stored = mapping
    else:
        return None
    if bool(np.all(stored[1:] >= stored[:-1])):
        return None
    return np.argsort(stored, kind="stable").astype(np.int64)


def unwrap(dataset: Any) -> Iterator[Any]:
    """``dataset`` and the datasets inside it, outermost first: through ``Subset`` (``.dataset``),
    ``ConcatDataset`` (its first part) and any wrapper holding its dataset in an instance attribute
    ``dataset`` (colabfast's loader wrapper, most user wrappers). At most 16 levels."""
    for _ in range(16):
        if dataset is None:
            return
        yield dataset
        if isinstance(dataset, ConcatDataset):
            dataset = dataset.datasets[0] if dataset.datasets else None
        else:
            dataset = vars(dataset).get("dataset") if hasattr(dataset, "__dict__") else None


def compact(x: Any) -> Any:
    """``x``, or a copy if it is a tensor viewing a larger buffer (which pickling would take along);
    a CHW view of HWC memory stays HWC underneath."""
    if not isinstance(x, torch.Tensor) or x.untyped_storage().nbytes() <= x.numel() * x.element_size():
        return x
    if x.dim() == 3 and x.stride(0) == 1:  # CHW over HWC memory, as decoders and raw mirrors give
        return x.permute(1, 2, 0).clone(memory_format=torch.contiguous_format).permute(2, 0, 1)
    return x.clone(memory_format=torch.contiguous_format)


def undecodable(reader: MirrorReader, position: int, exc: Exception) -> MirrorError:
    """The error for the sample stored at ``position`` in ``reader``'s mirror that failed to decode
    with ``exc``, naming it by its dataset index (and its stored position where that differs)."""
    path, index = reader.path, reader.index_of(position)
    where = f"sample {index}" + (f" (stored at {position})" if index != position else "")
    if isinstance(exc, ImageSizeError):
        return MirrorError(f"{path}: {where}: {exc}")
    return MirrorError(f"{path}: {where} cannot be decoded ({type(exc).__name__}: {exc}). pack() decoded "
                       f"every image, so the mirror is corrupt: `colabfast info --verify {path}` checks every "
                       "sample; copy it again, or pack it again.")


def _layout(path: PathLike) -> str:
    return read_h5(path, lambda f: Header.read(f, path).layout)
class MirrorDataset(VisionDataset):
    """What the mirror datasets share; ``colabfast.DataLoader`` recognises them by ``is_mirror``."""

    is_mirror = True
    account: Optional[str] = None  # what colabfast.open_dataset did to open it, shown in the repr

    def __init__(
        self,
        path: PathLike,
        split: str,
        *,
        output: str,
        in_memory: bool,
        verify: bool = False,
        transforms: Optional[Callable] = None,
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        column: Optional[int] = None,
    ):
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, not {output!r}")
        # VisionDataset's, by name: a drop-in also derives from the torchvision class it replaces (for
        # wrap_dataset_for_transforms_v2), whose own __init__ (its files, pycocotools) must not run
        VisionDataset.__init__(self, os.fspath(path), transforms=transforms, transform=transform,
                               target_transform=target_transform)
        self.path = Path(os.path.abspath(path))
        self.output = output
        self.reader = MirrorReader(path, split, in_memory=in_memory, column=column)
        # packed in a seeded random order: reads in stored order (BlockShuffleSampler) mix classes
        self.shuffled = self.reader.index.header.shuffled
        self.verify = verify
        if verify and self.reader.index.crc32 is None:
            raise MirrorError(f"verify=True needs checksums, and {path} is a format version "
                              f"{self.reader.index.header.version} mirror without them: pack it again")
        if output == "bytes" and self.reader.store != "encoded":
            raise ValueError(f"output='bytes' needs a mirror of encoded images, and {path} stores raw "
                             "pixels: use output='tensor'")

    def __len__(self) -> int:
        return len(self.reader)

    def image(self, index: int) -> Any:
        """Sample ``index``'s image per ``output``: a PIL RGB image, a uint8 tensor [3, H, W], or the
        encoded bytes (uint8 [nbytes]). Tensors own their memory.

        Raises:
            MirrorError: the image does not decode, its header disagrees with ``image_shapes`` or
                exceeds ``PIL.Image.MAX_IMAGE_PIXELS``, or the file changed since the dataset was made.
        """
        (position,) = self.positions_of(self._checked([index]))
        return compact(self._decode(position, self._stored([position])[0]))

    def _checked(self, indices: Sequence[int]) -> list[int]:
        """``indices`` as ints in ``range(len(self))`` (negative ones from the end); IndexError outside it,
        IndexTypeError (a TypeError as ``ImageFolder``'s, an AttributeError as ``Kitti``'s) for a non-int."""
        n, out = len(self), []
        for i in indices:
            try:
                k = operator.index(i)  # ints, numpy ints and 0-d integer tensors
            except TypeError:
                raise IndexTypeError(f"{type(self).__name__} indices are ints, not {type(i).__name__}: index one "
                                     "sample at a time (or take torch.utils.data.Subset(dataset, indices))") from None
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of range for {self.path}'s {n} samples")
            out.append(k + n if k < 0 else k)
        return out

    def positions_of(self, indices: Sequence[int]) -> list[int]:
        """The stored positions of samples ``indices`` (in ``range(len(self))``): where
        :class:`MirrorReader` finds them (see :func:`stored_positions`)."""
        at = self.reader.positions
        return [int(i) for i in indices] if at is None else at[np.asarray(indices, dtype=np.int64)].tolist()

    def _spans(self, positions: Sequence[int],
               into: Optional[Callable[[int], np.ndarray]] = None) -> tuple[np.ndarray, list[int]]:
        """:meth:`MirrorReader.spans` of ``positions``, checked as :meth:`_stored` checks."""
        memory, starts = self.reader.spans(positions, into)
        if self.verify:
            offsets = self.reader.offsets
            self.reader.index.check_samples(positions, [memory[a : a + int(offsets[p + 1] - offsets[p])]
                                                        for a, p in zip(starts, positions)])
        return memory, starts

    def _stored(self, positions: Sequence[int]) -> list[torch.Tensor]:
        views = self.reader.views(positions)
        if self.verify:  # zlib.crc32 of every image read; its cost: benchmarks/README.md, "Checking images..."
            self.reader.index.check_samples(positions, [v.numpy() for v in views])
        return views

    def _decode(self, index: int, stored: torch.Tensor) -> Any:
        """Stored sample ``index`` (a stored position) decoded per ``output``."""
        if self.reader.store == "raw":  # load_index checked that H x W x 3 is the stored size
            h, w, c = (int(v) for v in self.reader.shapes[index])
            hwc = stored.view(h, w, c)
            return Image.fromarray(hwc.numpy()) if self.output == "pil" else hwc.permute(2, 0, 1)
        # One rule on every path: the header's size is the declared one, within the pixel limit,
        # before anything is decoded (colabfast.images.decode.check_encoded); GPU decoding gets bytes checked so.
        size = self.reader.shapes[index][:2]
        try:
            if self.output == "bytes":
                check_encoded(stored.numpy(), index, size)
                return stored
            if self.output == "tensor":
                return decode_cpu(stored, index, size=size)
            return decode_pil(stored.numpy(), index, size)
        except Exception as exc:  # decoders raise many types for bad bytes; pack decoded them all
            raise undecodable(self.reader, index, exc) from exc

    def sample(self, index: int, image: Any) -> Any:
        """The dataset item for ``index`` given its image (targets and transforms added)."""
        raise NotImplementedError

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """Items for a batch: one read per run of consecutive indices, compacted in a worker (:meth:`items`).
        A subclass with its own ``__getitem__`` (``wrap_dataset_for_transforms_v2``'s) gets that, per index."""
        if type(self).__getitem__ is not MirrorDataset.__getitem__:
            return [self[i] for i in indices]
        return self.items(indices, views=get_worker_info() is None)

    def items(self, indices: Sequence[int], *, views: bool) -> list[Any]:
        """Items for ``indices``; ``views=True`` leaves raw images as views of the read buffer, right only
        where nothing pickles them (``colabfast.DataLoader``'s collate copies them)."""
        indices = self._checked(indices)
        positions = self.positions_of(indices)
        images = [self._decode(p, data) for p, data in zip(positions, self._stored(positions))]
        items = [self.sample(i, image) for i, image in zip(indices, images)]
        if views:
            return items
        return [tuple(compact(x) for x in item) if isinstance(item, tuple) else compact(item) for item in items]

    @cached_property
    def source_paths(self) -> list[str]:
        """Where each sample came from (absolute paths at pack time), in dataset order."""
        root, stored = self.reader.index.header.source, read_paths(self.path, self.reader.split)
        rels = stored if self.reader.positions is None else [stored[p] for p in self.reader.positions.tolist()]
        return [os.path.join(root, rel) for rel in rels]

    def extra_repr(self) -> str:
        opened = "".join(f"\n  {line}" for line in self.account.splitlines()) if self.account else ""
        return f"Mirror: {self.path} ({self.reader.store} images), output={self.output!r}" + \
            (f"\nOpened by open_dataset:{opened}" if opened else "")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("source_paths", None)  # a cached list of every path stays out of worker pickles
        return state


class H5ImageFolder(MirrorDataset, ImageFolder):
    """A drop-in for ``torchvision.datasets.ImageFolder`` reading a mirror made by :func:`colabfast.pack`.

    An ``ImageFolder`` subclass (its ``__init__`` never runs), so ``isinstance`` checks pass and
    ``wrap_dataset_for_transforms_v2`` wraps it. Same ``classes``, ``class_to_idx``, ``targets``,
    ``samples``, ``imgs`` and sample order as ``ImageFolder`` (or ``ImageNet`` for its archives), whatever
    the stored order; items ``(image, class_index)`` with the pixels ``ImageFolder`` + PIL give.

    Args:
        path: the mirror (``layout`` imagefolder or files).
        transform: applied to the image (existing ImageFolder pipelines work with ``output="pil"``).
        target_transform: applied to the class index.
        output: ``"pil"`` (PIL RGB image); ``"tensor"`` (uint8 [3, H, W]: JPEGs by libjpeg-turbo, PNGs
            by PIL); ``"bytes"`` (encoded, uint8 [nbytes], for ``colabfast.DataLoader(decode="gpu")``).
        in_memory: load the image data into shared RAM once (see :class:`MirrorReader`).
        verify: check every image read against its CRC-32 (docs/mirror-format.md); off by default,
            costly for raw pixels (benchmarks/README.md). ``colabfast info --verify`` checks all at once.

    Raises:
        FileNotFoundError, MirrorError: not a complete mirror this version reads, a broken format
            (:mod:`colabfast.mirror`), an image that does not decode, disagrees with its shape or
            exceeds ``PIL.Image.MAX_IMAGE_PIXELS``, a ``verify`` mismatch, or the file replaced since.
        ValueError: a KITTI mirror (use :class:`H5Kitti`), or ``output="bytes"`` on raw pixels.
    """

    def __init__(
        self,
        path: PathLike,
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        *,
        output: str = "pil",
        in_memory: bool = False,
        verify: bool = False,
    ):
        if _layout(path) == KITTI:
            raise ValueError(f"{path} is a KITTI mirror: open it with colabfast.H5Kitti")
        super().__init__(path, "", output=output, in_memory=in_memory, verify=verify, transform=transform,
                         target_transform=target_transform)
        self.classes: list[str] = self.reader.index.header.classes or []
        targets = self.reader.index.targets
        assert targets is not None  # not a KITTI mirror (checked above): load_index read its targets
        positions = self.reader.positions
        self._targets: np.ndarray = targets if positions is None else targets[positions]  # in dataset order
        # archive packs: the devkit, Kaggle's CSV, ...
        self.labels_from = self.reader.index.header.labels or ""
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        # ImageFolder's other attributes: what it would have loaded the source files with
        self.loader, self.extensions = default_loader, IMG_EXTENSIONS

    def extra_repr(self) -> str:
        return super().extra_repr() + (f"\nLabels from: {self.labels_from}" if self.labels_from else "")

    @property
    def targets(self) -> list[int]:
        """The class index of every sample, in dataset order (as ``ImageFolder.targets``)."""
        return self._targets.tolist()

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``(source path, class index)`` of every sample (as ``ImageFolder.samples``)."""
        return list(zip(self.source_paths, self.targets))

    imgs = samples

    def sample(self, index: int, image: Any) -> tuple[Any, int]:
        target = int(self._targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class H5Kitti(MirrorDataset, Kitti):
    """A drop-in for ``torchvision.datasets.Kitti`` reading a mirror made by :func:`colabfast.pack`.

    A ``Kitti`` subclass (its ``__init__`` never runs): ``wrap_dataset_for_transforms_v2`` wraps it.
    Items ``(image, target)``: ``target`` one dict per object as torchvision parses the label files
    (``type``, ``truncated``, ``occluded``, ``alpha``, ``bbox`` [x1, y1, x2, y2] pixels, ``dimensions``
    [h, w, l] and ``location`` [x, y, z] metres, ``rotation_y`` radians); ``None`` for the test split.
    Images sorted by file name (torchvision's ``os.listdir`` order is arbitrary).

    Args:
        path: a KITTI mirror.
        train: the ``training`` split if True, else ``testing``.
        transform, target_transform, transforms: as in torchvision.
        output, in_memory, verify: as in :class:`H5ImageFolder`.

    Raises:
        FileNotFoundError, MirrorError: not a complete KITTI mirror, it lacks the split, or as in
            :class:`H5ImageFolder`.
    """

    def __init__(
        self,
        path: PathLike,
        train: bool = True,
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        transforms: Optional[Callable] = None,
        *,
        output: str = "pil",
        in_memory: bool = False,
        verify: bool = False,
    ):
        split = "training" if train else "testing"
        layout = _layout(path)
        if layout != KITTI:
            raise ValueError(f"{path} is not a KITTI mirror (layout {layout!r}): open it with colabfast.H5ImageFolder")
        super().__init__(path, split, output=output, in_memory=in_memory, verify=verify, transforms=transforms,
                         transform=transform, target_transform=target_transform)
        self.train = train
        index = self.reader.index
        self._objects, self._type_names, self._object_offsets = index.objects, index.type_names, index.object_offsets

    @property
    def images(self) -> list[str]:
        """Source image paths (as ``Kitti.images``)."""
        return self.source_paths

    @property
    def targets(self) -> list[str]:
        """Source label file paths (as ``Kitti.targets``); empty for the test split."""
        if not self.train:
            return []
        return [p.replace("/image_2/", "/label_2/").rsplit(".", 1)[0] + ".txt" for p in self.source_paths]

    def target(self, index: int) -> Optional[list[dict]]:
        """The label of sample ``index`` as torchvision's Kitti returns it (before transforms)."""
        if not self.train:
            return None
        o, names, offsets = self._objects, self._type_names, self._object_offsets
        assert o is not None and names is not None and offsets is not None  # load_index reads them for training
        (at,) = self.positions_of(self._checked([index]))
        a, b = int(offsets[at]), int(offsets[at + 1])
        return [
            {
                "type": names[o["type"][j]],
                "truncated": float(o["truncated"][j]),
                "occluded": int(o["occluded"][j]),
                "alpha": float(o["alpha"][j]),
                "bbox": o["bbox"][j].tolist(),
                "dimensions": o["dimensions"][j].tolist(),
                "location": o["location"][j].tolist(),
                "rotation_y": float(o["rotation_y"][j]),
            }
            for j in range(a, b)
        ]

    def calib(self, index: int) -> dict[str, np.ndarray]:
        """The camera calibration of sample ``index``: ``P0``-``P3`` float64 [3, 4] projection
        matrices, ``R0_rect`` [3, 3], ``Tr_velo_to_cam`` and ``Tr_imu_to_velo`` [3, 4]; empty if
        the source had no calib folder."""
        calib = self.reader.index.calib or {}
        (at,) = self.positions_of(self._checked([index]))
        return {k: rows[at].reshape(3, 3 if k == "R0_rect" else 4) for k, rows in calib.items()}

    def sample(self, index: int, image: Any) -> tuple[Any, Any]:
        target = self.target(index)
        if self.transforms:
            image, target = self.transforms(image, target)
        return image, target


register_drop_in(H5ImageFolder, "images", "stream")
register_drop_in(H5Kitti, KITTI)
