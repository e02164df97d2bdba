"""Datasets over mirrors of columns (format version 3): :class:`H5Dataset` for any of them, and the
drop-ins for torchvision's ``CocoDetection``, ``VOCDetection`` and ``VOCSegmentation``.

Column data under :data:`colabfast.mirror.format.RESIDENT_BYTES` in all is read at open, else one
``pread`` per sample (docs/mirror-format.md).
"""

from __future__ import annotations

import contextlib
import functools
import io
import operator
import os
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np
import torch
from PIL import Image
from torchvision import datasets

from colabfast.datasets.dropins import MirrorDataset, compact, undecodable
from colabfast.datasets.mirrorreader import MirrorReader
from colabfast.errors import IndexTypeError, MirrorError
from colabfast.images.decode import check_encoded, decode_cpu
from colabfast.layouts.registry import drop_in_of, register_drop_in
from colabfast.mirror import columns as col
from colabfast.mirror.format import IMAGE_LAYOUTS, NO_IMAGES, Header
from colabfast.mirror.index import Stored, load_columns
from colabfast.mirror.safety import read_h5
from colabfast.mirror.verify import check_columns
from colabfast.where._fileio import PathLike

if TYPE_CHECKING:
    from pycocotools.coco import COCO

__all__ = ["H5Dataset", "H5CocoDetection", "H5VOCDetection", "H5VOCSegmentation", "IndexTypeError"]

OUTPUTS = ("auto", "pil", "tensor", "bytes")


class H5Dataset(MirrorDataset):
    """Any mirror of columns (``pack`` of a map-style dataset, or of a folder layout), its samples
    shaped as the source returned them.

    ``dataset[i]`` is sample ``i`` as packed (a tuple, a dict, or one value), every value as it was:
    PIL images (same mode and palette), ``[C, H, W]`` uint8 tensors or ``[H, W, C]`` ndarrays, numbers,
    strings, bytes, arrays and tensors of their dtype and shape, ``tv_tensors``, JSON. The folder layouts
    give ``(image, target)`` with a PIL RGB image:

    - ``"yolo"``: ``{"boxes": float32 [M, 4] XYXY in pixels, "labels": int64 [M]}``, plus ``"segments"``
      (per object ``[[x, y], ...]`` in pixels) for a segment dataset (see :class:`colabfast.layouts.Yolo`);
    - ``"segmentation"``: the mask, a PIL image in its file's mode;
    - ``"csv"``: the label (or a tuple of them); one column of class names adds ImageFolder's
      ``classes``, ``class_to_idx`` and ``targets``;
    - ``"coco"``, ``"voc-detection"``, ``"voc-segmentation"``: dicts; :class:`H5CocoDetection`,
      :class:`H5VOCDetection` and :class:`H5VOCSegmentation` give torchvision's items.

    Examples:
        >>> import colabfast as cf, torchvision
        >>> fake = torchvision.datasets.FakeData(size=4, image_size=(3, 16, 16), num_classes=2)
        >>> ds = cf.H5Dataset(cf.pack(fake, "fake.h5", progress=False))
        >>> image, label = ds[0]
        >>> image.size, image == fake[0][0], label == fake[0][1]
        ((16, 16), True, True)

    Args:
        path: a mirror of columns (``colabfast info`` lists them).
        transform, target_transform, transforms: as torchvision's for an ``(image, target)`` sample;
            for any other sample, ``transform`` takes the whole sample.
        output: ``"auto"`` (images as given), ``"pil"``, ``"tensor"`` (uint8 ``[C, H, W]``, JPEGs by
            libjpeg-turbo) or ``"bytes"`` (encoded, uint8 ``[nbytes]``, for ``DataLoader(decode="gpu")``).
        in_memory, verify: as :class:`colabfast.H5ImageFolder`'s; ``verify`` also checks every
            per-sample column's checksum at open (:func:`colabfast.mirror.verify.check_columns`).

    Raises:
        FileNotFoundError: no file at ``path``.
        MirrorError: not a complete mirror of columns (the message names the class that reads it), a
            layout other than a drop-in's, a broken format (:mod:`colabfast.mirror`), a checksum
            mismatch with ``verify``; when reading, an image or str/JSON value that does not decode.
        ValueError: ``output="bytes"`` without an image column, or ``target_transform`` for a sample
            that is not a pair.
    """

    layouts: tuple[str, ...] = ()  # a drop-in's layouts: others are refused

    def __init__(
        self,
        path: PathLike,
        transform: Optional[Callable] = None,
        target_transform: Optional[Callable] = None,
        transforms: Optional[Callable] = None,
        *,
        output: str = "auto",
        in_memory: bool = False,
        verify: bool = False,
    ):
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, not {output!r}")
        layout = read_h5(path, lambda f: Header.read(f, path)).layout
        if self.layouts and layout not in self.layouts or not self.layouts and layout in IMAGE_LAYOUTS:
            wanted = "of " + " or ".join(map(repr, self.layouts)) if self.layouts else "a mirror of columns"
            raise MirrorError(f"{path} is a mirror of layout {layout!r}, not {wanted}: open it with "
                              f"colabfast.{_reads(layout)} (or colabfast.open_dataset, which picks the class a "
                              "mirror's layout needs)")
        head, n, values, marks = load_columns(path)
        assert head.columns is not None  # its layout is not an image mirror's: Header.read checked it has columns
        self.fields = [col.Field.from_spec(s) for s in head.columns["fields"]]
        self.template: dict = head.columns["template"]
        images = [k for k, f in enumerate(self.fields) if f.kind in col.IMAGE_KINDS]
        # the first image column, or None: a mirror of numbers, text and arrays, read through an index of
        # its samples without images (NO_IMAGES), so it is ordered, counted and pickled as any mirror
        self.image_column: Optional[int] = images[0] if images else None
        if self.image_column is None:
            if output == "bytes":
                raise ValueError(f"output='bytes' gives the first image column's encoded bytes, and {path} holds no "
                                 "image column: leave output as it is")
            base = output if output != "auto" else "tensor"  # no image to apply to
        else:
            first = self.fields[self.image_column]
            base = output if output != "auto" else ("pil" if first.as_ == "pil" else "tensor")
        self.pair = "tuple" in self.template and len(self.template["tuple"]) == 2
        if target_transform is not None and not self.pair:
            raise ValueError(f"target_transform is for (image, target) samples, and {path}'s are not pairs: pass "
                             "transform=, which takes the whole sample")
        super().__init__(path, "", output=base, in_memory=in_memory, verify=verify, transforms=transforms,
                         transform=transform, target_transform=target_transform,
                         column=NO_IMAGES if self.image_column is None else self.image_column)
        self.mode = output
        self.header = head
        self.info: dict = head.layout_info or {}
        self.classes: list[str] = head.classes or []
        self._values = values
        self._marks = marks  # each column's nulls and formats (colabfast.mirror.index.load_columns)
        if head.layout == "csv":
            self._table_classes()
        self._readers = {k: self.reader if k == self.image_column else
                         MirrorReader(path, "", in_memory=in_memory, column=k) for k in images}
        if n != len(self.reader):
            raise MirrorError(f"{path}: its columns hold {n} samples and its images {len(self.reader)}")
        if verify and (problems := check_columns(path, decode=False)[1]):
            raise MirrorError(f"{path}: {'; '.join(problems[:5])}. The mirror is corrupt (flipped bytes on disk or in "
                              "a copy): copy it again, or pack it again.")

    def _table_classes(self) -> None:
        """A CSV table of one label column of class names: ``classes`` (sorted, as ImageFolder sorts its
        class folders), ``class_to_idx`` and ``targets`` (each sample's class index, in dataset order),
        as torchvision's ``ImageFolder`` has them. Its mirror records the names per column (the layout's
        ``info["classes"]``), so mirrors packed before this read the same."""
        named, columns = self.info.get("classes"), self.info.get("columns")
        labels = [k for k, f in enumerate(self.fields) if k != self.image_column and f.as_ != "hidden"]
        if not (isinstance(named, dict) and isinstance(columns, list) and len(columns) == 1 and len(labels) == 1
                and isinstance(named.get(columns[0]), list) and self.fields[labels[0]].kind == "int"):
            return
        self.classes = list(named[columns[0]])
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        values = np.asarray(self._values[labels[0]])
        # set by name: an attribute of CSV mirrors only (H5VOCSegmentation's targets are torchvision's, file paths)
        setattr(self, "targets", values[self.positions_of(range(len(self)))].tolist())  # noqa: B010

    # --- reading ---

    def _want(self, k: int) -> str:
        """What image column ``k`` returns: ``"pil"``, ``"tensor"``, ``"ndarray"`` or ``"Image"``."""
        if self.mode == "auto" or (self.mode == "bytes" and k != self.image_column):
            return self.fields[k].as_
        return self.mode

    def _decode(self, index: int, stored: torch.Tensor) -> Any:
        return None if self.image_column is None else self._decode_column(self.image_column, index, stored)

    def _decode_column(self, k: int, position: int, stored: torch.Tensor) -> Any:
        f, reader = self.fields[k], self._readers[k]
        size = reader.shapes[position][:2]
        want = self._want(k)
        try:
            if want == "bytes":
                check_encoded(stored.numpy(), position, size)
                return stored
            rgb = f.meta.get("rgb") or int(reader.shapes[position][2]) == 3
            if want != "pil" and rgb and f.kind == "image":  # libjpeg-turbo, no PIL: the fast path
                chw = decode_cpu(stored, position, size=size)
                if want == "tensor":
                    return chw
                return col.image_value(chw.permute(1, 2, 0).numpy(), col.Field(f.name, f.kind, want))
            check_encoded(stored.numpy(), position, size)
            with Image.open(io.BytesIO(stored.numpy().tobytes())) as img:
                img.load()
                out = img.convert("RGB") if f.meta.get("rgb") else img.copy()
                if self._mark("formats", k, position):  # its file's bytes: as PIL opens it, so is dataset[i]
                    out.format = img.format
            if f.kind == "mask" and out.mode == "P" and want != "pil":  # class ids, not the palette's colours
                return col.image_value(np.array(out)[:, :, None], col.Field(f.name, f.kind, want))
            return col.image_value(out, col.Field(f.name, f.kind, want))
        except Exception as exc:  # decoders raise many types for bad bytes; pack decoded them all
            raise undecodable(reader, position, exc) from exc

    def _mark(self, name: str, k: int, position: int) -> bool:
        """Whether column ``k``'s ``nulls`` (its value is None) or ``formats`` (its image keeps its file's
        format) array holds 1 at ``position``; False where it has none."""
        marks = self._marks.get((name, k))
        return marks is not None and bool(marks[position])

    def value(self, k: int, position: int) -> Any:
        """Column ``k``'s value for the sample at stored ``position``, as the field returns it."""
        f = self.fields[k]
        if self._mark("nulls", k, position):
            return None
        if f.kind in col.IMAGE_KINDS:
            (stored,) = self._readers[k].views([position])
            if self.verify:
                self._readers[k].index.check_samples([position], [stored.numpy()])
            return compact(self._decode_column(k, position, stored))
        v = self._values[k]
        if f.kind in ("int", "float", "bool"):
            return col.scalar_value(v[position].item(), f)
        if f.kind in ("str", "bytes", "json"):
            data, offsets = v
            raw = self._rows(data, int(offsets[position]), int(offsets[position + 1])).tobytes()
            try:
                if f.kind == "str":
                    return raw.decode("utf-8", "surrogatepass")
                return raw if f.kind == "bytes" else col.json_value(raw)
            except (UnicodeDecodeError, ValueError, RecursionError) as exc:
                raise MirrorError(f"{self.path}: sample {position}, field {f.name!r} is not valid "
                                  f"{f.kind} ({type(exc).__name__}): the mirror is corrupt; pack it again") from None
        if f.kind == "ndarray":
            arr = self._rows(v, position, position + 1)[0]
        else:
            rows, offsets = v[0], v[1]
            arr = self._rows(rows, int(offsets[position]), int(offsets[position + 1]))
            if len(v) == 3:  # each sample's own shape
                arr = arr.reshape(tuple(int(d) for d in v[2][position]))
        # a box column's canvas: its hidden column (colabfast.mirror.columns.spec_problem checked it is one)
        canvas = self.value(f.meta["canvas"], position) if "canvas" in f.meta else None
        return col.array_value(arr, f, canvas)

    def _rows(self, data: Any, a: int, b: int) -> np.ndarray:
        """Rows ``a:b`` of a column's data (``load_columns``' ndarray, or a :class:`colabfast.mirror.index.Stored`
        read here: one ``pread`` through the image reader's handle, with its retries and its check that
        the file did not change)."""
        if not isinstance(data, Stored):
            return data[a:b]
        buf = np.empty((b - a) * data.row_bytes, np.uint8)
        if len(buf):
            self.reader.read_into(buf, data.offset + a * data.row_bytes - self.reader.data_offset)
        return data.rows(buf, b - a)

    def batchable(self) -> bool:
        """Whether :class:`colabfast.loading.reader.BatchReader`'s threads can read this dataset's batches: items
        ``(image, target)`` whose image is the first image column, 3-channel, as uint8 ``[3, H, W]``
        tensors (or encoded bytes), and no transforms (the threads build exactly what ``__getitem__``
        builds: :meth:`target_at` gives the target)."""
        if self.image_column is None:
            return False
        first = self.fields[self.image_column]
        as_tensor = self.mode in ("tensor", "bytes") or (self.mode == "auto" and first.as_ == "tensor")
        return (self.pair and self.transforms is None and self.transform is None and as_tensor
                and self._image_first() and bool((self.reader.shapes[:, 2] == 3).all()))

    def _image_first(self) -> bool:
        return self.template["tuple"][0] == {"column": self.image_column}

    def per_sample(self) -> frozenset:
        """Where a batch keeps each sample's value (:func:`colabfast.loading.collate.collate`'s ``per_sample``):
        every ragged or JSON field, or the dict holding it (a detection target ``{"boxes", "labels"}``
        stays one dict per sample, as torchvision's detection models take them), so that the batch's
        structure never depends on what its samples happen to hold."""
        out: set[tuple] = set()

        def walk(t: dict, path: tuple, holder: Optional[tuple]) -> None:
            if "tuple" in t:
                for i, sub in enumerate(t["tuple"]):
                    walk(sub, (*path, i), None)
            elif "dict" in t:
                for key, sub in t["dict"]:
                    walk(sub, (*path, key), path if holder is None else holder)
            elif self.fields[t["column"]].kind in ("ragged", "json"):
                out.add(path if holder is None else holder)

        walk(self.template, (), None)
        return frozenset(out)

    def target_at(self, position: int) -> Any:
        """The target of the ``(image, target)`` sample at stored ``position``, as ``__getitem__`` gives it."""
        values = [None if f.as_ == "hidden" or k == self.image_column else self.value(k, position)
                  for k, f in enumerate(self.fields)]
        return col.unflatten(values, self.template["tuple"][1])

    def raw_sample(self, index: int, image: Any = None) -> Any:
        """Sample ``index`` before transforms (``image``: its first image column, already read)."""
        (position,) = self.positions_of(self._checked([index]))
        values = [image if k == self.image_column and image is not None and not self._mark("nulls", k, position)
                  else (None if f.as_ == "hidden" else self.value(k, position)) for k, f in enumerate(self.fields)]
        return col.unflatten(values, self.template)

    def sample(self, index: int, image: Any) -> Any:
        item = self.raw_sample(index, image)
        if self.pair:
            if self.transforms is not None:
                return tuple(self.transforms(*item))
            return item
        return self.transform(item) if self.transform is not None else item

    def extra_repr(self) -> str:
        shown = ", ".join(f"{f.name}: {f.kind}" for f in self.fields if f.as_ != "hidden")
        return super().extra_repr() + f"\nLayout: {self.header.layout}; fields: {shown}"


class _PairOf(H5Dataset):
    """A drop-in whose item is ``(image, target)`` made of two named fields of a layout's dict."""

    image_field = "image"
    target_field = "target"

    def __init__(self, path: PathLike, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, transforms: Optional[Callable] = None, *,
                 output: str = "pil", in_memory: bool = False, verify: bool = False):
        super().__init__(path, None, None, None, output=output, in_memory=in_memory, verify=verify)
        from torchvision.datasets.vision import StandardTransform

        if transforms is not None and (transform is not None or target_transform is not None):
            raise ValueError("Only transforms or transform/target_transform can be passed as argument")
        self.transform, self.target_transform = transform, target_transform
        self.transforms = transforms if transforms is not None else (
            StandardTransform(transform, target_transform) if transform or target_transform else None)
        self.pair = True
        names = [f.name for f in self.fields]
        for name in (self.image_field, self.target_field):
            if name not in names:
                raise MirrorError(f"{path}: a {self.header.layout} mirror without a {name!r} field")
        self._image_k, self._target_k = names.index(self.image_field), names.index(self.target_field)

    def _image_first(self) -> bool:
        return self._image_k == self.image_column

    def _checked(self, indices: Sequence[int]) -> list[int]:
        for i in indices:  # ints, numpy ints and 0-d integer tensors pass; a slice, a float, a str do not
            try:
                operator.index(i)
            except TypeError:
                raise self._not_an_index(i) from None
        return super()._checked(indices)

    def _not_an_index(self, index: Any) -> Exception:
        """What ``dataset[index]`` raises for an ``index`` that is not an int (a slice)."""
        return IndexTypeError(f"{type(self).__name__} indices are ints, not {type(index).__name__}: index one sample "
                              "at a time (or take torch.utils.data.Subset(dataset, indices))")

    def per_sample(self) -> frozenset:
        return frozenset({(1,)}) if self.fields[self._target_k].kind in ("ragged", "json") else frozenset()

    def target_at(self, position: int) -> Any:
        return self.value(self._target_k, position)

    def raw_sample(self, index: int, image: Any = None) -> Any:
        (position,) = self.positions_of(self._checked([index]))
        if image is None or self._image_k != self.image_column:
            image = self.value(self._image_k, position)
        return image, self.value(self._target_k, position)

    @property
    def images(self) -> list[str]:
        """Source image paths, in dataset order (as torchvision's ``images``)."""
        return self.source_paths


class H5CocoDetection(_PairOf, datasets.CocoDetection):
    """A drop-in for ``torchvision.datasets.CocoDetection(root, annFile)`` reading a mirror packed with
    ``layout="coco"``: the same ``ids`` (sorted image ids), ``categories`` and items ``(image, target)``
    (a PIL RGB image, its annotation dicts in the JSON's order). A ``CocoDetection`` subclass, so
    ``wrap_dataset_for_transforms_v2`` wraps it (``target_keys`` too); ``coco`` is pycocotools' ``COCO``,
    for torchvision's detection references. A non-int index raises ``ValueError``, as ``CocoDetection``.

    Args and Raises: as :class:`H5Dataset` (``output`` default ``"pil"``, as torchvision's).
    """

    layouts = ("coco",)

    def __init__(self, path: PathLike, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, transforms: Optional[Callable] = None, **kwargs: Any):
        super().__init__(path, transform, target_transform, transforms, **kwargs)
        names = [f.name for f in self.fields]
        ids = [self.value(names.index("id"), p) for p in self.positions_of(range(len(self)))] if "id" in names else []
        self.ids: list[int] = ids
        self.categories: list[dict] = self.info.get("categories", [])

    def _not_an_index(self, index: Any) -> Exception:
        return ValueError(f"Index must be of type integer, got {type(index)} instead.")  # CocoDetection's words

    @functools.cached_property
    def coco(self) -> COCO:
        """pycocotools' ``COCO`` of this mirror, as ``COCO(annFile)`` builds it (the JSON's keys, images and
        annotations in its order; older mirrors: ``ids`` order), indexed by ``COCO.createIndex``.

        Raises:
            ImportError: pycocotools is not installed (``pip install pycocotools``).
            MirrorError: a corrupt mirror (as reading its samples raises).
        """
        try:
            from pycocotools.coco import COCO
        except ImportError as exc:  # an optional dependency: what torchvision's COCO references use too
            raise ImportError(f"{type(self).__name__}.coco is pycocotools' COCO of the mirror, and pycocotools is "
                              "not installed: pip install pycocotools (Colab has it)") from exc

        names = [f.name for f in self.fields]
        entry_k = names.index("coco") if "coco" in names else None
        images, annotations, places = [], [], []
        for i, position in enumerate(self.positions_of(range(len(self)))):
            if entry_k is not None:
                held = self.value(entry_k, position)
                images.append(held["image"])
                places.append(held.get("places"))
            else:
                h, w = (int(v) for v in self.reader.shapes[position][:2])
                rel = os.path.relpath(self.source_paths[i], self.header.source)
                images.append({"id": self.ids[i], "file_name": rel, "height": h, "width": w})
            annotations += self.value(self._target_k, position)
        parts = {"images": images, "annotations": annotations, "categories": list(self.categories)}
        if places and None not in places:  # the JSON's order (pycocotools keeps it), not the sorted ids'
            parts["images"] = [images[j] for j in sorted(range(len(images)), key=lambda j: places[j][0])]
            at = [k for place in places for k in place[1]]
            parts["annotations"] = [a for _, a in sorted(zip(at, annotations), key=lambda pair: pair[0])]
        other = self.info.get("coco_other", {})  # the JSON's info, licenses, ..., in its keys' order
        keys = [k for k in self.info.get("coco_keys", []) if k in parts or k in other]
        dataset = {k: parts[k] if k in parts else other[k] for k in keys}
        dataset.update((k, v) for k, v in parts.items() if k not in dataset)
        coco = COCO()
        coco.dataset = dataset
        with contextlib.redirect_stdout(io.StringIO()):  # createIndex prints its progress
            coco.createIndex()
        return coco

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("coco", None)  # built again where used: a DataLoader worker needs none
        return state


class _VOCDropIn(_PairOf):
    """What the VOC drop-ins share: torchvision's ``year`` and ``image_set`` (the mirror's, checked
    where given) and its ``images`` and ``targets`` (the source files' paths)."""

    _TARGET_DIR: str
    _TARGET_FILE_EXT: str

    def __init__(self, path: PathLike, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, transforms: Optional[Callable] = None, *,
                 year: Optional[str] = None, image_set: Optional[str] = None, **kwargs: Any):
        super().__init__(path, transform, target_transform, transforms, **kwargs)
        self.year: str = str(self.info.get("year", ""))
        self.image_set: str = str(self.info.get("split", ""))
        for name, wanted, held in (("year", year, self.year), ("image_set", image_set, self.image_set)):
            if wanted is not None and str(wanted) != held:
                raise ValueError(f"{name}={wanted!r}, and {path} is a mirror of VOC{self.year}'s {self.image_set!r} "
                                 f"image set: open the mirror of that {name} (colabfast.pack(voc_root, dst, "
                                 f"layout={self.header.layout!r}, year=..., split=...) packs it), or leave {name}= out")

    @property
    def targets(self) -> list[str]:
        """Each sample's annotation XML (detection) or mask PNG (segmentation) at pack time, as
        torchvision's ``targets``: ``<VOC folder>/<target folder>/<id><ext>``."""
        return [os.path.join(os.path.dirname(os.path.dirname(image)), self._TARGET_DIR,
                             os.path.splitext(os.path.basename(image))[0] + self._TARGET_FILE_EXT)
                for image in self.images]


class H5VOCDetection(_VOCDropIn, datasets.VOCDetection):
    """A drop-in for ``torchvision.datasets.VOCDetection`` reading a mirror packed with
    ``layout="voc-detection"``: items ``(image, target)``, a PIL RGB image and the XML parsed as
    torchvision parses it, in the image set's order; ``wrap_dataset_for_transforms_v2`` wraps it.

    Args: as :class:`H5Dataset` (``output`` default ``"pil"``), and ``year``, ``image_set`` (keyword
    only): the mirror's, checked where given.

    Raises: as :class:`H5Dataset`; ``ValueError`` for a ``year`` or ``image_set`` that is not the
    mirror's; a non-int index: :class:`IndexTypeError`.
    """

    layouts = ("voc-detection",)
    _TARGET_DIR, _TARGET_FILE_EXT = "Annotations", ".xml"


class H5VOCSegmentation(_VOCDropIn, datasets.VOCSegmentation):
    """A drop-in for ``torchvision.datasets.VOCSegmentation`` reading a mirror packed with
    ``layout="voc-segmentation"``: items ``(image, mask)``, the mask as PIL opens the PNG (``"P"``,
    VOC's palette, 255 at borders); ``wrap_dataset_for_transforms_v2`` wraps it.

    Args and Raises: as :class:`H5VOCDetection`'s.
    """

    layouts = ("voc-segmentation",)
    target_field = "mask"
    _TARGET_DIR, _TARGET_FILE_EXT = "SegmentationClass", ".png"


def _reads(layout: str) -> str:
    """The name of the class that reads a mirror of ``layout`` (`colabfast.layouts.registry.drop_in_of`),
    ``H5Dataset`` for a layout not registered."""
    try:
        return drop_in_of(layout)[0].__name__
    except (KeyError, LookupError):
        return "H5Dataset"


register_drop_in(H5Dataset, "columns")
for _dataset in (H5CocoDetection, H5VOCDetection, H5VOCSegmentation):
    register_drop_in(_dataset, *_dataset.layouts)
