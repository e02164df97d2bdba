"""Decode batches of encoded images (JPEG bytes) on the GPU with nvJPEG, falling back to the CPU.

A 2-vCPU Colab VM decodes about 2k ImageNet-size JPEGs per second at best (``colabfast bench loader``,
benchmarks/README.md); nvJPEG
through ``decode_jpeg(list_of_tensors, device="cuda")`` (TorchCodec's, or torchvision.io's where
torchcodec >= 0.16 is missing: :mod:`colabfast.where.codec`) decodes a whole batch in one
call and leaves the CPUs only reading bytes. Files arrive from the workers packed in one tensor
(:class:`EncodedImages`): hundreds of small tensors would each cost a shared-memory segment when
crossing from a worker process.

Decoded images are uint8 ``[3, H, W]``: grayscale and CMYK files are converted to RGB on both the CPU
and the GPU path, so a batch has one channel count. Decoders differ slightly (chroma upsampling, IDCT):
GPU and CPU pixels agree within a few levels, not exactly.

Bytes from a file are not trusted. Every decoder here reads the image's size from its header first
and refuses one over ``PIL.Image.MAX_IMAGE_PIXELS`` (:func:`check_encoded`: a few kilobytes of JPEG
can declare 16000x16000 pixels, 768 MB decoded), and only libjpeg (simplejpeg, torchcodec or
torchvision, nvJPEG) and PIL see the bytes: torchvision 0.29's PNG decoder segfaults the process on a
corrupt IDAT (libpng's "incorrect data check"), so PNG, GIF and WebP are decoded by PIL, which raises
instead.
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
        indices: int64 tensor ``[B]`` of dataset indices, or None when unknown (then errors name the
            position in the batch).
        sizes: int64 tensor ``[B, 2]``, each file's ``(H, W)`` as its header gives it, set by a reader that
            checked every header already (:func:`checked_jpeg_sizes`) so :func:`decode_batch` does not parse
            them again; None: :func:`decode_batch` checks each header itself.
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
    """Which of the files packed back to back in ``data`` start with the JPEG signature, in one numpy
    expression (no Python per file).

    Args:
        data: uint8 array ``[total_bytes]``.
        starts: int64 array ``[B]``, each file's first byte in ``data``.
        lengths: int64 array ``[B]``, bytes per file.

    Returns:
        bool array ``[B]``.
    """
    if not len(data):
        return np.zeros(len(lengths), dtype=bool)
    head = data[np.minimum(starts[:, None] + np.arange(3), len(data) - 1)]
    return (lengths >= 3) & (head == np.frombuffer(JPEG_MAGIC, np.uint8)).all(axis=1)


def checked_jpeg_sizes(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                       declared: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``(H, W)`` headers of JPEGs packed back to back, checked against the sizes declared for them,
    with one libjpeg-turbo header read per file (``simplejpeg.decode_jpeg_header``) and no other Python
    per file: the fast path of :func:`check_encoded` for a batch headed to nvJPEG.

    Args:
        data: uint8 array ``[total_bytes]``.
        starts: int64 array ``[B]``, each file's first byte.
        lengths: int64 array ``[B]``, bytes per file.
        declared: integer array ``[B, >=2]``, the ``(H, W, ...)`` declared for each file.

    Returns:
        ``(sizes, passed)``: int64 ``[B, 2]``, the declared ``(H, W)`` of every file (its header's too
        where it passed); bool ``[B]``, True where the file is a JPEG whose header reads and gives the
        declared size, within ``PIL.Image.MAX_IMAGE_PIXELS``. A file that did not pass is one for
        :func:`check_encoded`, which says why (or passes it: not a JPEG, say).
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
    """``(H, W)`` of an encoded image from its header alone: a JPEG's SOF (libjpeg-turbo through
    ``simplejpeg``, about 4 us), a PNG's IHDR, else what ``PIL.Image.open`` reads.

    Args:
        data: uint8 array ``[num_bytes]`` of the file.

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
    """The ``(H, W)`` of an encoded image's header (:func:`encoded_size`), checked before decoding it:
    at most ``PIL.Image.MAX_IMAGE_PIXELS`` pixels (None there: no limit; read at each call), and
    ``size`` when given (the ``(H, W)`` a mirror declares for it).

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
    """Refuse a declared ``h`` x ``w`` over ``PIL.Image.MAX_IMAGE_PIXELS`` (None there: no limit) before
    memory is allocated by it, with :func:`check_encoded`'s words.

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
    """Decode one encoded image with PIL, as ``torchvision.datasets.ImageFolder`` loads files:
    ``PIL.Image.open(f).convert("RGB")``, its size checked first (:func:`check_encoded`).

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
    """:func:`decode_cpu`'s pixels as a uint8 array ``[H, W, 3]`` (no tensor made), decoded by libjpeg-turbo
    into ``buffer`` where given (a C-contiguous uint8 array of at least ``H * W * 3`` bytes: the result
    then views it; a JPEG that only torchvision or PIL decodes gets memory of its own). Arguments and
    errors as :func:`decode_cpu`'s; ``data`` may be a uint8 array ``[num_bytes]``."""
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

    JPEGs are decoded by libjpeg-turbo through ``simplejpeg`` with the settings of
    ``torchvision.io.decode_image`` and PIL (accurate IDCT, fancy upsampling), so the pixels are the
    same (tested), straight into ``out`` when given, with the GIL released for the decode, and faster
    than ``torchvision.io.decode_image`` (benchmarks/README.md, "Batch reader vs worker processes and
    FFCV"). JPEGs that libjpeg decodes
    only with a warning (e.g. extraneous bytes before a marker) go to TorchCodec's or torchvision.io's
    ``decode_jpeg`` (:mod:`colabfast.where.codec`).
    Other formats (PNG, GIF, WebP) are decoded by PIL (:func:`decode_pil`; a KITTI PNG decodes about
    as fast as by torchvision, whose libpng binding crashes the process on corrupt data).

    Args:
        data: uint8 tensor ``[num_bytes]`` of a JPEG, PNG, GIF or WebP file.
        where: what to call the image in errors: a dataset index, or a phrase.
        out: optional uint8 array ``[H, W, 3]`` (C-contiguous) to decode into; the image must have
            exactly that size.
        size: the ``(H, W)`` the image must have (without ``out``), or None.

    Returns:
        uint8 tensor ``[3, H, W]``: a CHW view of HWC memory (``out``'s when given), as torchvision
        returns it.

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

    On a CUDA device the JPEGs go to ``decode_jpeg(list, device=...)`` in one call (TorchCodec's, or
    torchvision.io's: :func:`colabfast.where.codec.jpeg_codec`);
    if nvJPEG rejects the batch, each JPEG is retried alone and the ones it still rejects (e.g. CMYK or
    corrupt files) are decoded on the CPU. Other formats (PNG, ...) are decoded on the CPU and copied.
    On a CPU device everything is decoded on the CPU. Runs on the current CUDA stream.

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
