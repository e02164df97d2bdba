"""Per-sample CPU augmentation fused with decoding, for the reader threads: :func:`fuse`, :class:`FusedTransform`.

The crop is drawn with torchvision's ``make_params`` arithmetic, then the image decoded and the same
``torchvision.transforms.v2.functional`` kernels called in one pass (FFCV's ``RandomResizedCropRGBImageDecoder``;
Leclerc et al., CVPR 2023): the same pixels as the transforms. ``draft=True`` decodes a JPEG at 1/2, 1/4
or 1/8 scale (libjpeg-turbo's DCT scaling) where the crop shrinks it enough. How it works:
[Feeding the GPU](../gpu-feed.md#how-it-works).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Optional, Union

import numpy as np
import simplejpeg
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from colabfast.images.decode import JPEG_MAGIC, check_encoded, check_pixels, decode_hwc

__all__ = ["FusedTransform", "fuse"]

_LEADING = (v2.RandomResizedCrop, v2.Resize, v2.CenterCrop)
_FLIPS = {v2.RandomHorizontalFlip: -1, v2.RandomVerticalFlip: -2}
_DRAFT_SCALES = (8, 4, 2)  # libjpeg-turbo's power-of-two DCT scalings, largest first


def _native_resize(t: v2.RandomResizedCrop) -> bool:
    """True where ``F.resize`` of a uint8 image with ``t``'s options calls torch's antialiased bilinear
    uint8 kernel itself (torchvision's rule), so :func:`_resized_hwc` may call it directly.
    """
    try:  # an InterpolationMode, or its value (torchvision 0.29 keeps the str)
        bilinear = v2.InterpolationMode(t.interpolation) == v2.InterpolationMode.BILINEAR
    except ValueError:  # a PIL constant: torchvision converts it, its own call decides
        return False
    if not bilinear or t.antialias is not True:
        return False
    try:
        from torchvision.transforms.v2.functional._geometry import _do_native_uint8_resize_on_cpu
    except ImportError:  # another torchvision: its own call decides
        return False
    return bool(_do_native_uint8_resize_on_cpu(v2.InterpolationMode.BILINEAR))


def _resized_hwc(crop: np.ndarray, size: Any) -> torch.Tensor:
    """``F.resize(image, size, BILINEAR, antialias=True)`` of the channels-last pixels ``crop`` (``[h, w, C]``)
    as ``[C, H, W]`` in channels-last memory, without torchvision's Python (tested equal to ``F.resize``).
    """
    h, w, c = crop.shape
    out_h, out_w = int(size[0]), int(size[1])
    image = torch.from_numpy(crop)
    if (out_h, out_w) == (h, w):
        return image.permute(2, 0, 1)
    return _upsample(torch.from_numpy(crop.reshape(1, h, w, c).transpose(0, 3, 1, 2)), (out_h, out_w))[0]


def _upsample(nchw: torch.Tensor, size: Any, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """torch's antialiased bilinear kernel of ``nchw`` (uint8 ``[1, C, h, w]``) to ``size``, into ``out`` where
    given."""
    if out is None:
        return torch._C._nn._upsample_bilinear2d_aa(nchw, [int(size[0]), int(size[1])], False, None)
    return torch._C._nn._upsample_bilinear2d_aa(nchw, [int(size[0]), int(size[1])], False, None, None,  # type: ignore[call-arg]
                                                out=out)  # the out= overload (torch's stubs omit it)


def scratch(name: str, shape: tuple[int, ...], channels_last: bool = False) -> Any:
    """This thread's reused uint8 memory called ``name``, of at least ``shape``'s size (``channels_last``: a
    ``[N, C, H, W]`` tensor), for what is used up before this thread's next call with ``name``.
    """
    held = getattr(_threads, name, None)
    n = math.prod(shape)
    if held is None or held.size < n:
        held = np.empty(max(n, 0 if held is None else 2 * held.size), np.uint8)
        setattr(_threads, name, held)
    if channels_last:
        b, c, h, w = shape
        return torch.from_numpy(held[:n].reshape(b, h, w, c).transpose(0, 3, 1, 2))
    return held if len(shape) == 1 else held[:n].reshape(shape)


_threads = threading.local()  # per reader thread: scratch()'s memory


@dataclasses.dataclass(frozen=True)
class FusedTransform:
    """A leading ``v2.RandomResizedCrop``, ``v2.Resize`` or ``v2.CenterCrop`` (or none) and the random
    flips after it, applied to one stored image in one pass.

    Attributes:
        leading: the leading transform, or None.
        flips: ``(dim, p)`` per flip in order: dim -1 horizontal, -2 vertical; flipped with probability p.
        draft: DCT-scaled JPEG decoding where the crop is shrunk 4x or more (not exact).
        center: a ``v2.CenterCrop`` after a leading ``v2.Resize``, or None.
    """

    leading: Optional[Union[v2.RandomResizedCrop, v2.Resize, v2.CenterCrop]]
    flips: tuple[tuple[int, float], ...]
    draft: bool = False
    center: Optional[v2.CenterCrop] = None  # after a leading Resize: the evaluation transform
    # RandomResizedCrop's log(ratio) bounds as the float32 values its draws take, read once (not per image)
    log_ratio: tuple[float, float] = (0.0, 0.0)
    native: bool = False  # RandomResizedCrop's resize is torch's uint8 kernel, called directly (_resized_hwc)

    def __call__(self, stored: torch.Tensor, shape: Any, raw: bool, where: int,
                 generator: torch.Generator) -> torch.Tensor:
        """The transformed image.

        Args:
            stored: uint8 ``[nbytes]``: the raw HWC pixels (``raw``) or the encoded file.
            shape: the stored image's ``(H, W, C)``.
            raw: whether ``stored`` is raw pixels.
            where: the sample's stored position, for errors.
            generator: the random stream drawn from (one per reader thread).

        Returns:
            uint8 ``[C, h, w]``.

        Raises:
            ValueError: the encoded image cannot be decoded or its header disagrees with ``shape``
                (:func:`colabfast.images.decode.decode_cpu`'s errors).
        """
        image, flipped = self.apply(stored, shape, raw, where, generator)
        for dim in flipped:
            image = image.flip(dim)
        return image

    def apply(self, stored: torch.Tensor, shape: Any, raw: bool, where: int,
              generator: torch.Generator) -> tuple[torch.Tensor, list[int]]:
        """As ``__call__``, the flips drawn but left to the caller: ``(image [C, h, w], dims to flip)``,
        so that a batch's copy can flip as it copies (:class:`colabfast.loading.reader.BatchReader`)."""
        box, flipped = self.draw(shape, generator)
        return self.make(stored, shape, raw, where, box, flipped)

    def output_size(self) -> Optional[tuple[int, int]]:
        """``(H, W)`` of every output whatever the stored image's size, or None where the image's size
        decides it (a ``Resize`` alone, or only flips)."""
        t = self.center if self.center is not None else self.leading
        if isinstance(t, (v2.RandomResizedCrop, v2.CenterCrop)):
            h, w = t.size  # torchvision keeps both sides (_setup_size)
            return int(h), int(w)
        return None

    def draw_batch(self, shapes: Any, generator: torch.Generator) -> list:
        """:meth:`draw` for each of ``shapes`` in order, all before the batch's first image is made."""
        if not (isinstance(self.leading, v2.RandomResizedCrop) or self.flips):
            return [(None, [])] * len(shapes)
        return [self.draw(shape, generator) for shape in shapes]

    def draw(self, shape: Any, generator: torch.Generator) -> tuple[Optional[tuple[int, int, int, int]], list[int]]:
        """The crop box ``(top, left, height, width)`` (None unless ``RandomResizedCrop``) and the dims to flip
        for an image of ``shape``, drawn from ``generator`` in torchvision's order.
        """
        h, w = int(shape[0]), int(shape[1])
        draw = _Draws.of(generator)
        box = draw.crop(self.leading, self.log_ratio, h, w) if isinstance(self.leading, v2.RandomResizedCrop) else None
        flipped = [dim for dim, p in self.flips if draw.uniform(0.0, 1.0) < p]  # v2: "if torch.rand(1) >= p: skip"
        return box, flipped

    def make(self, stored: torch.Tensor, shape: Any, raw: bool, where: int, box: Optional[tuple[int, int, int, int]],
             flipped: list[int]) -> tuple[torch.Tensor, list[int]]:
        """:meth:`apply` with the draws given (:meth:`draw`): no random number is drawn."""
        hwc, box = self._pixels(stored, shape, raw, where, box)
        return self._made(hwc, int(shape[0]), int(shape[1]), box), flipped

    def centre_box(self, shape: Any) -> Optional[tuple[int, int, int, int]]:
        """``(top, left, height, width)`` of a plain ``v2.CenterCrop`` no larger than ``shape`` (torchvision's
        ``_center_crop_compute_crop_anchor``), else None.
        """
        t = self.leading
        if not isinstance(t, v2.CenterCrop):
            return None
        h, w, th, tw = int(shape[0]), int(shape[1]), int(t.size[0]), int(t.size[1])
        if h < th or w < tw:
            return None
        return int(round((h - th) / 2.0)), int(round((w - tw) / 2.0)), th, tw

    def make_into(self, stored: Union[torch.Tensor, np.ndarray], shape: Any, raw: bool, where: int,
                  box: Optional[tuple[int, int, int, int]], flipped: list[int], out: np.ndarray) -> None:
        """:meth:`make` written into ``out`` (uint8 ``[1, C, H, W]``, any strides), flips applied. Raises as
        :meth:`__call__`."""
        hwc, box = self._pixels(stored, shape, raw, where, box, reuse=True)
        h, w = int(shape[0]), int(shape[1])
        t = self.leading  # (a tensor is made only where torch works: torch.from_numpy too drops the GIL)
        if isinstance(t, v2.RandomResizedCrop) and self.native and hwc.dtype == np.uint8:
            assert box is not None
            top, left, bh, bw = box
            crop = np.ascontiguousarray(hwc[top : top + bh, left : left + bw])  # why: see make
            src = torch.from_numpy(crop.reshape(1, bh, bw, crop.shape[2]).transpose(0, 3, 1, 2))  # channels-last
            if (bh, bw) == tuple(out.shape[2:]):
                image = src
            elif flipped:
                image = _upsample(src, out.shape[2:], out=scratch("resized", out.shape, True))
            else:
                _upsample(src, out.shape[2:], out=torch.from_numpy(out))
                return
        elif (centre := self.centre_box(shape)) is not None:
            top, left, th, tw = centre
            view = hwc[top : top + th, left : left + tw].transpose(2, 0, 1)[None]
            if not flipped or flipped == [-2]:  # rows reversed: numpy copies whole rows
                np.copyto(out, view[:, :, ::-1] if flipped else view)
                return
            image = torch.from_numpy(view)
        else:
            image = self._made(hwc, h, w, box)[None]
        torch.from_numpy(out).copy_(image.flip(flipped) if flipped else image)

    def _pixels(self, stored: Union[torch.Tensor, np.ndarray], shape: Any, raw: bool, where: int,
                box: Optional[tuple[int, int, int, int]],
                reuse: bool = False) -> tuple[np.ndarray, Optional[tuple[int, int, int, int]]]:
        """The stored image's pixels ``[H', W', C]`` (decoded: DCT-scaled where allowed; raw: a view of
        ``stored``) and the crop box in them; ``reuse``: decoded into this thread's reused memory."""
        h, w = int(shape[0]), int(shape[1])
        data = stored if isinstance(stored, np.ndarray) else stored.numpy()
        if raw:
            return data.reshape(h, w, int(shape[2])), box
        scale = self._draft_scale(h, w, box) if self.draft and data[:3].tobytes() == JPEG_MAGIC else 1
        if scale > 1:
            check_encoded(data, where, (h, w))  # the declared size, within the pixel limit, before decoding
            try:
                hwc = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-h // scale),
                                             min_width=-(-w // scale))
            except ValueError:  # a libjpeg warning or corrupt data: the exact path decides
                hwc = None
            if hwc is not None:
                if box is None:
                    return hwc, None
                hs, ws = hwc.shape[:2]
                top, left = round(box[0] * hs / h), round(box[1] * ws / w)
                bh = max(1, min(hs - top, round(box[2] * hs / h)))
                bw = max(1, min(ws - left, round(box[3] * ws / w)))
                return hwc, (top, left, bh, bw)
        if reuse:
            check_pixels(h, w, where)  # the declared size allocates: a hostile mirror's 60000x60000 is 10 GiB
        buffer = scratch("decoded", (h * w * 3,)) if reuse else None
        return decode_hwc(data, where, (h, w), buffer), box

    def _made(self, hwc: np.ndarray, h: int, w: int, box: Optional[tuple[int, int, int, int]]) -> torch.Tensor:
        """The transformed image ``[C, h', w']`` of the pixels ``hwc`` (``_pixels``'); flips not applied."""
        t = self.leading
        if isinstance(t, v2.RandomResizedCrop):
            assert box is not None
            top, left, bh, bw = box
            # The crop copied out first (numpy: one memcpy per row), channels-last: torchvision's resize
            # kernel reads it 1.6-2x faster than a strided view (measured), with the same pixels; a raw
            # image's pixels outside the crop are never copied.
            crop = np.ascontiguousarray(hwc[top : top + bh, left : left + bw])
            if self.native and crop.dtype == np.uint8:
                return _resized_hwc(crop, t.size)
            return F.resize(torch.from_numpy(crop).permute(2, 0, 1), t.size, interpolation=t.interpolation,
                            antialias=t.antialias)
        image = torch.from_numpy(hwc).permute(2, 0, 1)
        if isinstance(t, v2.Resize):
            image = F.resize(image, self._resized(image, h, w), interpolation=t.interpolation,
                             max_size=None if image.shape[-2:] != (h, w) else t.max_size, antialias=t.antialias)
        elif isinstance(t, v2.CenterCrop):
            image = F.center_crop(image, output_size=t.size)
        if self.center is not None:
            image = F.center_crop(image, output_size=self.center.size)
        return image

    def _resized(self, image: torch.Tensor, h: int, w: int) -> list[int]:
        """The output size v2.Resize gives the full-size image; a drafted image is resized to it."""
        assert isinstance(self.leading, v2.Resize)
        if image.shape[-2:] == (h, w):
            return self.leading.size
        return list(F._geometry._compute_resized_output_size((h, w), size=self.leading.size,
                                                             max_size=self.leading.max_size))

    def _draft_scale(self, h: int, w: int, box: Optional[tuple[int, int, int, int]]) -> int:
        """The largest of 8, 4, 2 by which the image may be shrunk while decoding and keep twice the output's
        pixels (1: none); 0.3 levels from the exact path on average (docs/gpu-feed.md, "How it works").
        """
        t = self.leading
        need: tuple[float, ...]
        if isinstance(t, v2.RandomResizedCrop) and box is not None:
            need = (t.size[0] * h / box[2], t.size[1] * w / box[3])  # full-image pixels the crop's output needs
        elif isinstance(t, v2.Resize):
            need = tuple(float(v) for v in F._geometry._compute_resized_output_size((h, w), size=t.size,
                                                                                    max_size=t.max_size))
        else:
            return 1
        for s in _DRAFT_SCALES:
            if -(-h // s) >= 2 * need[0] and -(-w // s) >= 2 * need[1]:
                return s
        return 1


class _Draws:
    """torchvision's draws from one generator, each one torch call into a reused one-element tensor."""

    _local = threading.local()

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.f, self.e, self.i = torch.empty(1), torch.empty(1), torch.empty(1, dtype=torch.int64)
        self.fv, self.ev, self.iv = self.f.numpy(), self.e.numpy(), self.i.numpy()  # the same memory

    @classmethod
    def of(cls, generator: torch.Generator) -> _Draws:
        """This thread's draws from ``generator``."""
        draws = getattr(cls._local, "draws", None)
        if draws is None or draws.generator is not generator:
            draws = cls._local.draws = cls(generator)
        return draws

    def uniform(self, lo: float, hi: float) -> float:
        """``torch.empty(1).uniform_(lo, hi).item()``; ``torch.rand(1).item()`` for 0, 1."""
        self.f.uniform_(lo, hi, generator=self.generator)
        return float(self.fv[0])

    def crop(self, t: v2.RandomResizedCrop, log_ratio: tuple[float, float], height: int,
             width: int) -> tuple[int, int, int, int]:
        """``t.make_params``'s crop ``(top, left, height, width)`` for ``height`` x ``width``, in torchvision's order
        (``torchvision/transforms/v2/_geometry.py``).
        """
        g, area, (lo, hi) = self.generator, height * width, log_ratio
        for _ in range(10):
            target_area = area * self.uniform(t.scale[0], t.scale[1])
            torch.exp(self.f.uniform_(lo, hi, generator=g), out=self.e)  # in float32, as torchvision
            aspect_ratio = float(self.ev[0])
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                self.i.random_(0, height - h + 1, generator=g)  # torch.randint's own draw
                i = int(self.iv[0])
                self.i.random_(0, width - w + 1, generator=g)
                return i, int(self.iv[0]), h, w
        in_ratio = float(width) / float(height)
        if in_ratio < min(t.ratio):
            w, h = width, int(round(width / min(t.ratio)))
        elif in_ratio > max(t.ratio):
            h, w = height, int(round(height * max(t.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w


def fuse(transform: Any, *, draft: bool = False) -> Optional[FusedTransform]:
    """``transform`` as a :class:`FusedTransform`, or None where it is anything else.

    Fused: a ``v2.Compose`` (or one transform) of an optional ``v2.RandomResizedCrop``, ``v2.Resize``
    (optionally then ``v2.CenterCrop``) or ``v2.CenterCrop``, then any ``v2.RandomHorizontalFlip`` and
    ``v2.RandomVerticalFlip``; exactly those classes (a subclass may draw otherwise).
    """
    steps = list(transform.transforms) if type(transform) is v2.Compose else [transform]
    leading = steps.pop(0) if steps and type(steps[0]) in _LEADING else None
    center = steps.pop(0) if type(leading) is v2.Resize and steps and type(steps[0]) is v2.CenterCrop else None
    flips = []
    for step in steps:
        if type(step) not in _FLIPS:
            return None
        flips.append((_FLIPS[type(step)], float(np.float32(step.p))))  # torch compares in float32
    if leading is None and not flips:
        return None
    log_ratio = (0.0, 0.0)
    if isinstance(leading, v2.RandomResizedCrop):
        log_ratio = (float(leading._log_ratio[0]), float(leading._log_ratio[1]))
    native = isinstance(leading, v2.RandomResizedCrop) and _native_resize(leading)
    return FusedTransform(leading, tuple(flips), draft, center, log_ratio, native)

