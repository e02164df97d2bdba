"""Decode batches of encoded images (JPEG bytes) on the GPU with nvJPEG, falling back to the CPU.

Decoded images are RGB uint8 ``[3, H, W]`` on both paths (GPU and CPU pixels agree within a few levels).
Every decoder checks the header's size against ``PIL.Image.MAX_IMAGE_PIXELS`` first; PNG, GIF and WebP
are decoded by PIL (torchvision 0.29's PNG decoder segfaults on a corrupt IDAT).
[Mirrors from strangers](../mirror-format.md#images-from-strangers) says why.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import simplejpeg
import torch
from PIL import Image

from colabfast.errors import ImageSizeError
from colabfast.where.codec import decode_jpeg

__all__ = ["Encoded", "EncodedImages", "ImageSizeError", "check_encoded", "check_pixels", "checked_jpeg_sizes",
           "decode_batch", "decode_cpu", "decode_pil", "encoded_size", "is_encoded", "is_jpeg", "jpeg_mask"]

# File signatures of the formats decoded here (JPEG, PNG, GIF, WebP).
JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_MAGICS = (JPEG_MAGIC, b"\x89PNG", b"GIF8", b"RIFF")


Size = Union[Sequence[int], np.ndarray]  # (H, W)


@dataclasses.dataclass
class Encoded:
    """One encoded image file with the dataset index it came from (errors name the index).

    Attributes:
        data: uint8 tensor ``[num_bytes]``, the file's bytes.
        index: the dataset index of the sample.
    """

    data: torch.Tensor
    index: int


@dataclasses.dataclass
class EncodedImages:
    """A batch of encoded image files packed into one tensor.

    Attributes:
        data: uint8 tensor ``[total_bytes]``, the files back to back.
        lengths: int64 tensor ``[B]``, bytes per file.
        indices: int64 tensor ``[B]`` of dataset indices, or None (errors then name batch positions).
        sizes: int64 tensor ``[B, 2]``, headers' ``(H, W)`` checked already (:func:`checked_jpeg_sizes`), or None.
    """

    data: torch.Tensor
    lengths: torch.Tensor
    indices: Optional[torch.Tensor] = None
    sizes: Optional[torch.Tensor] = None

    @classmethod
    def pack(
        cls, files: Sequence[torch.Tensor], indices: Optional[Sequence[int]] = None, *, shared: bool = False
    ) -> EncodedImages:
        """Pack 1-D uint8 tensors into one; ``shared`` allocates it in shared memory (in a worker)."""
        lengths = torch.tensor([f.numel() for f in files], dtype=torch.int64)
        data = torch.cat(list(files), out=empty_uint8((int(lengths.sum()),), shared=shared))
        ids = None if indices is None else torch.tensor([int(i) for i in indices], dtype=torch.int64)
        return cls(data, lengths, ids)

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[torch.Tensor]:
        """Each file as a 1-D uint8 view into ``data``."""
        return iter(self.data.split(self.lengths.tolist()))

    def where(self, position: int) -> str:
        """``"dataset index 17"`` or, without indices, ``"batch position 3"``: for error messages."""
        if self.indices is None:
            return f"batch position {position}"
        return f"dataset index {int(self.indices[position])}"


def empty_uint8(shape: Sequence[int], *, shared: bool) -> torch.Tensor:
    """An uninitialised uint8 tensor; ``shared`` puts it in shared memory, as ``default_collate`` does in
    a worker so the batch reaches the main process without a copy."""
    if not shared:
        return torch.empty(tuple(shape), dtype=torch.uint8)
    numel = 1
    for n in shape:
        numel *= n
    storage = torch.UntypedStorage._new_shared(numel)
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, tuple(shape))  # type: ignore[call-overload]


def is_encoded(x: object) -> bool:
    """True for an :class:`Encoded` or a 1-D uint8 tensor starting with a JPEG/PNG/GIF/WebP signature."""
    if isinstance(x, Encoded):
        return True
    if not (isinstance(x, torch.Tensor) and x.dim() == 1 and x.dtype == torch.uint8 and x.numel() >= 4):
        return False
    head = bytes(x[:4].tolist())
    return head.startswith(_MAGICS)


def is_jpeg(data: torch.Tensor) -> bool:
    """True when the 1-D uint8 tensor starts with the JPEG signature."""
    return data.numel() >= 3 and bytes(data[:3].tolist()) == JPEG_MAGIC


def jpeg_mask(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Which files packed in ``data`` (uint8 ``[total_bytes]``) at ``starts`` with ``lengths`` (int64 ``[B]``)
    start with the JPEG signature: bool ``[B]``.
    """
    if not len(data):
        return np.zeros(len(lengths), dtype=bool)
    head = data[np.minimum(starts[:, None] + np.arange(3), len(data) - 1)]
    return (lengths >= 3) & (head == np.frombuffer(JPEG_MAGIC, np.uint8)).all(axis=1)


def checked_jpeg_sizes(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                       declared: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``(H, W)`` headers of JPEGs packed back to back, checked against ``declared``: the fast path of
    :func:`check_encoded` for a batch headed to nvJPEG (``simplejpeg.decode_jpeg_header`` per file).

    Args:
        data: uint8 array ``[total_bytes]``.
        starts: int64 array ``[B]``, each file's first byte.
        lengths: int64 array ``[B]``, bytes per file.
        declared: integer array ``[B, >=2]``, the ``(H, W, ...)`` declared for each file.

    Returns:
        ``(sizes, passed)``: int64 ``[B, 2]`` declared sizes; bool ``[B]``, True for a JPEG whose header
        gives the declared size within ``PIL.Image.MAX_IMAGE_PIXELS`` (the others go to :func:`check_encoded`).
    """
    sizes = np.ascontiguousarray(declared[:, :2], dtype=np.int64)
    passed = jpeg_mask(data, starts, lengths)
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None:
        passed &= sizes[:, 0] * sizes[:, 1] <= limit
    header = simplejpeg.decode_jpeg_header
    expected = sizes.tolist()
    for k in np.flatnonzero(passed).tolist():
        a = int(starts[k])
        try:
            h, w, _, _ = header(data[a : a + int(lengths[k])], strict=False)
        except Exception:  # ValueError, or KeyError on a header cut short: check_encoded names it
            passed[k] = False
            continue
        if [h, w] != expected[k]:
            passed[k] = False
    return sizes, passed


def encoded_size(data: np.ndarray) -> tuple[int, int]:
    """``(H, W)`` of an encoded image (uint8 ``[num_bytes]``) from its header alone: a JPEG's SOF, a PNG's
    IHDR, else what ``PIL.Image.open`` reads.

    Raises:
        ValueError: no readable header.
    """
    head = data[:24].tobytes()
    if head.startswith(JPEG_MAGIC):
        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(data, strict=False)
        except Exception as exc:  # ValueError, or KeyError on a file cut short in its header
            raise ValueError(f"no readable JPEG header ({type(exc).__name__}: {exc})") from None
        return int(h), int(w)
    if head.startswith(PNG_MAGIC) and head[12:16] == b"IHDR":
        return int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big")
    try:
        with Image.open(io.BytesIO(data.tobytes())) as img:
            return img.height, img.width
    except Image.DecompressionBombError as exc:  # PIL's check, at twice the limit
        raise ImageSizeError(f"{exc}. If you trust the file, raise PIL.Image.MAX_IMAGE_PIXELS (None: no "
                             "limit)") from None
    except Exception as exc:  # PIL raises many types for bad bytes
        raise ValueError(f"no image header that PIL reads ({type(exc).__name__}: {exc})") from None


def check_encoded(
    data: np.ndarray, where: Union[str, int] = "", size: Optional[Size] = None
) -> tuple[int, int]:
    """The ``(H, W)`` of an encoded image's header, checked before decoding: at most
    ``PIL.Image.MAX_IMAGE_PIXELS`` pixels (None: no limit), and ``size`` when given.

    Raises:
        ImageSizeError: too many pixels, or not ``size``; the message names ``where``.
        ValueError: no readable header.
    """
    try:
        h, w = encoded_size(data)
    except ValueError as exc:
        kind = ImageSizeError if isinstance(exc, ImageSizeError) else ValueError
        fix = "" if kind is ImageSizeError else ". Re-pack or remove that file."
        raise kind(f"cannot decode the image at {_label(where)} ({data.size} bytes, starting "
                   f"{data[:8].tobytes()!r}): {str(exc).rstrip('.')}{fix}") from None
    _check_size(h, w, where, size)
    return h, w


def check_pixels(h: int, w: int, where: Union[str, int] = "") -> None:
    """Refuse a declared ``h`` x ``w`` over ``PIL.Image.MAX_IMAGE_PIXELS`` before memory is allocated by it.

    Raises:
        ImageSizeError: too many pixels; the message names ``where`` and how to raise the limit.
    """
    _check_size(h, w, where, None)


def _check_size(h: int, w: int, where: Union[str, int], size: Optional[Size]) -> None:
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and h * w > limit:
        raise ImageSizeError(
            f"the image at {_label(where)} is {w}x{h}, {h * w / 1e6:.1f} million pixels, more than the limit of "
            f"{limit / 1e6:.1f} million (PIL.Image.MAX_IMAGE_PIXELS): a decompression bomb? If you trust the file, "
            "raise PIL.Image.MAX_IMAGE_PIXELS (None: no limit), in DataLoader workers too")
    if size is not None and (h, w) != (int(size[0]), int(size[1])):
        raise ImageSizeError(f"the image at {_label(where)} is {w}x{h}, not the {int(size[1])}x{int(size[0])} "
                             "declared for it. Re-pack, or copy the mirror again (`colabfast info --verify MIRROR` "
                             "checks every sample)")


def decode_pil(data: np.ndarray, where: Union[str, int] = "", size: Optional[Size] = None) -> Image.Image:
    """Decode one encoded image as ``torchvision.datasets.ImageFolder`` does (``PIL.Image.open(f).convert("RGB")``),
    its size checked first.

    Args:
        data: uint8 array ``[num_bytes]`` of the file.
        where: what to call the image in errors: a dataset index, or a phrase.
        size: the ``(H, W)`` it must have, or None.

    Returns:
        A PIL RGB image of its own.

    Raises:
        ImageSizeError: as :func:`check_encoded`.
        ValueError: the bytes are not a decodable image; the message names ``where``.
    """
    check_encoded(data, where, size)  # before PIL's own check (at twice the limit), in our words
    try:
        with Image.open(io.BytesIO(data.tobytes())) as img:
            return img.convert("RGB")
    except Exception as exc:
        raise ValueError(f"cannot decode the image at {_label(where)} ({data.size} bytes, starting "
                         f"{data[:8].tobytes()!r}): {type(exc).__name__}: {str(exc).rstrip('.')}. Re-pack or remove "
                         "that file.") from None


def decode_hwc(data: Union[torch.Tensor, np.ndarray], where: Union[str, int] = "", size: Optional[Size] = None,
               buffer: Optional[np.ndarray] = None) -> np.ndarray:
    """:func:`decode_cpu`'s pixels as a uint8 array ``[H, W, 3]``, into ``buffer`` where given (C-contiguous,
    at least ``H * W * 3`` bytes). Arguments and errors as :func:`decode_cpu`'s.
    """
    raw = data if isinstance(data, np.ndarray) else data.numpy()
    if raw[:3].tobytes() != JPEG_MAGIC:
        return np.array(decode_pil(raw, where, size))  # a writable copy (asarray's is read-only)
    if buffer is not None and size is not None:
        # The header's own check folded into the decode: the declared size within the pixel limit, and
        # memory for exactly that many pixels, which libjpeg-turbo refuses to overflow before decoding
        # anything; a refusal, or another size, goes the checked way below and gets its error there.
        h, w = int(size[0]), int(size[1])
        _check_size(h, w, where, None)
        try:
            hwc = simplejpeg.decode_jpeg(raw, colorspace="RGB", buffer=buffer.reshape(-1)[: h * w * 3])
        except ValueError:
            hwc = None
        if hwc is not None and hwc.shape[:2] == (h, w):
            return hwc
    h, w = check_encoded(raw, where, size)
    try:
        hwc = simplejpeg.decode_jpeg(raw, colorspace="RGB", buffer=buffer)
    except ValueError:  # a libjpeg warning (strict mode) or a corrupt file: torchcodec/torchvision says which
        try:
            chw = decode_jpeg(torch.from_numpy(raw))
        except (RuntimeError, ValueError) as exc:
            raise ValueError(
                f"cannot decode the image at {_label(where)} ({raw.size} bytes, starting "
                f"{raw[:8].tobytes()!r}): {str(exc).rstrip('.')}. Re-pack or remove that file."
            ) from exc
        hwc = chw.permute(1, 2, 0).numpy()
    if hwc.shape[:2] != (h, w):  # decoders read the size from the header just checked
        raise ImageSizeError(f"the image at {_label(where)} decoded to {hwc.shape[1]}x{hwc.shape[0]}, not the "
                             f"{w}x{h} its header says")
    return hwc


def decode_cpu(
    data: torch.Tensor, where: Union[str, int] = "", out: Optional[np.ndarray] = None,
    size: Optional[Size] = None,
) -> torch.Tensor:
    """Decode one encoded image on the CPU, converted to RGB, its header checked first.

    JPEGs go to libjpeg-turbo (``simplejpeg``) with the settings of ``torchvision.io.decode_image``
    (the same pixels, GIL released), those it only decodes with a warning to ``decode_jpeg``
    (:mod:`colabfast.where.codec`); PNG, GIF and WebP to PIL (:func:`decode_pil`).

    Args:
        data: uint8 tensor ``[num_bytes]`` of a JPEG, PNG, GIF or WebP file.
        where: what to call the image in errors: a dataset index, or a phrase.
        out: optional uint8 array ``[H, W, 3]`` (C-contiguous) to decode into, of exactly the image's size.
        size: the ``(H, W)`` the image must have (without ``out``), or None.

    Returns:
        uint8 tensor ``[3, H, W]``: a CHW view of HWC memory (``out``'s when given).

    Raises:
        ImageSizeError: more pixels than ``PIL.Image.MAX_IMAGE_PIXELS``, or a size other than
            ``out``'s or ``size``, read from the header before decoding.
        ValueError: the bytes are not a decodable image; the message names ``where``.
    """
    hwc = decode_hwc(data, where, out.shape[:2] if out is not None else size, out)
    if out is not None and not np.may_share_memory(hwc, out):  # torchvision's or PIL's array, not a view of out
        np.copyto(out, hwc)
        hwc = out
    return torch.from_numpy(hwc).permute(2, 0, 1)


def _label(where: Union[str, int]) -> str:
    return f"dataset index {where}" if isinstance(where, int) else where or "image"


def decode_batch(images: EncodedImages, device: Union[str, torch.device]) -> list[torch.Tensor]:
    """Decode a batch of encoded files onto ``device``: JPEGs in one nvJPEG call on CUDA.

    JPEGs nvJPEG rejects are retried alone, then decoded on the CPU; other formats are decoded on the
    CPU and copied. Runs on the current CUDA stream.

    Args:
        images: the packed files.
        device: where the decoded images go.

    Returns:
        One uint8 tensor ``[3, H, W]`` per file, in order, on ``device``.

    Raises:
        ImageSizeError: a file's header declares more than ``PIL.Image.MAX_IMAGE_PIXELS`` pixels.
        ValueError: a file cannot be decoded at all; the message names its dataset index (or batch
            position when ``images.indices`` is None).
    """
    device = torch.device(device)
    files = list(images)
    out: list[Optional[torch.Tensor]] = [None] * len(files)
    keys = None if images.indices is None else images.indices.tolist()

    def where(i: int) -> Union[str, int]:
        return f"batch position {i}" if keys is None else int(keys[i])

    jpegs: list[int] = []
    sizes: list = []
    if device.type == "cuda" and files:
        lengths = images.lengths.numpy()
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        jpegs = np.flatnonzero(jpeg_mask(images.data.numpy(), starts, lengths)).tolist()
        # nvJPEG allocates what the header says: check it first (the CPU path checks its own), unless
        # the reader that made the batch did (images.sizes)
        if images.sizes is not None:
            known = images.sizes.tolist()
            sizes = [tuple(known[i]) for i in jpegs]
        else:
            sizes = [check_encoded(files[i].numpy(), where(i)) for i in jpegs]
    if jpegs:
        # torchvision allocates the outputs on the current stream but nvJPEG writes them on its own
        # stream, which does not wait for work still queued on ours: let that work finish first so a
        # just-freed block cannot be overwritten while a queued kernel still reads it. (torchcodec
        # decodes on the current stream, DecodeJpegCuda.cpp; the wait is kept for it too until a GPU
        # test shows it can go.)
        # A blocking event rather than stream.synchronize(): the wait sleeps instead of spinning a CPU,
        # which on 2 CPUs the training thread and the DataLoader workers need.
        done = torch.cuda.Event(blocking=True)
        done.record(torch.cuda.current_stream(device))
        done.synchronize()
        decoded: Sequence[Optional[torch.Tensor]]
        try:
            decoded = decode_jpeg([files[i] for i in jpegs], device=device)
        except (RuntimeError, ValueError):  # one bad file fails the whole call: find it
            decoded = [_decode_one_on_gpu(files[i], device) for i in jpegs]
        for i, img, size in zip(jpegs, decoded, sizes):
            # the header's size, or (a file whose EXIF orientation got applied anyway) the CPU decodes it
            out[i] = img if img is not None and tuple(img.shape[1:]) == size else None
    for i, f in enumerate(files):
        if out[i] is None:
            out[i] = decode_cpu(f, where(i)).to(device, non_blocking=True)
    return out  # type: ignore[return-value]


def _decode_one_on_gpu(data: torch.Tensor, device: torch.device) -> Optional[torch.Tensor]:
    try:
        return decode_jpeg(data, device=device)
    except (RuntimeError, ValueError):
        return None  # decode_batch decodes it on the CPU, or names it in the error
