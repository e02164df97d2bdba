"""Which library decodes JPEGs through torch here, TorchCodec (0.16+) or ``torchvision.io``, and a decode through it.

Chosen at the first call, with the stored pixels on both (EXIF orientation not applied); how and why: the
"Which library decodes JPEGs through torch" section of docs/gpu-feed.md. :func:`jpeg_codec` says which is used
(``colabfast doctor`` prints it); :func:`gpu_decode_available` whether it decodes on the GPU here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import threading
import warnings
from importlib import metadata
from typing import Any, Callable, Iterator, Optional, Union, overload

import numpy as np
import torch

from colabfast.where import env

__all__ = ["JpegCodec", "MIN_TORCHCODEC", "decode_jpeg", "gpu_decode_available", "jpeg_codec", "quiet_torchvision",
           "without_exif"]

MIN_TORCHCODEC = (0, 16)  # the first torchcodec with decode_jpeg (and the one torchvision 0.29 points to)

Files = Union[torch.Tensor, "list[torch.Tensor]"]


@dataclasses.dataclass(frozen=True)
class JpegCodec:
    """The library :func:`decode_jpeg` uses in this process.

    Attributes:
        name: ``"torchcodec"`` or ``"torchvision.io"``.
        version: that package's version.
        why: why this one, e.g. ``"torchcodec 0.11.0 is older than 0.16"``.
    """

    name: str
    version: str
    why: str

    def __str__(self) -> str:
        return f"{self.name} {self.version} ({self.why})"


_lock = threading.Lock()
_chosen: Optional[tuple[JpegCodec, Callable[..., Any]]] = None


def jpeg_codec() -> JpegCodec:
    """The library that decodes JPEGs through torch here, chosen at the first call (see the module)."""
    return _choice()[0]


@overload
def decode_jpeg(data: torch.Tensor, device: Union[str, torch.device] = "cpu") -> torch.Tensor: ...


@overload
def decode_jpeg(data: list[torch.Tensor], device: Union[str, torch.device] = "cpu") -> list[torch.Tensor]: ...


def decode_jpeg(data: Files, device: Union[str, torch.device] = "cpu") -> Files:
    """Decode one JPEG, or a list of them, to uint8 RGB ``[3, H, W]`` on ``device``.

    Grayscale and CMYK files come back as RGB; the stored pixels are returned, with no EXIF rotation.
    On CUDA a list is decoded in one nvJPEG call.

    Args:
        data: a 1-D uint8 CPU tensor of a file's bytes, or a list of them.
        device: where the pixels go ("cpu" or a CUDA device).

    Returns:
        A tensor, or a list of them for a list.

    Raises:
        RuntimeError: a file the decoder refuses (corrupt, truncated; on CUDA, one bad file fails the
            call). ValueError where the backend checks its arguments so.
    """
    return _choice()[1](data, torch.device(device))


def gpu_decode_available() -> bool:
    """True when :func:`decode_jpeg` decodes JPEGs on the GPU (nvJPEG, ``device="cuda"``); tried on a
    tiny JPEG, so it costs a CUDA initialisation (and the codec's choice)."""
    if env.gpu() is None:
        return False
    try:
        import simplejpeg

        data = simplejpeg.encode_jpeg(np.zeros((16, 16, 3), np.uint8))
        pixels = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), device="cuda")
        return tuple(pixels.shape) == (3, 16, 16)
    except Exception:  # no CUDA build, no nvJPEG, driver too old: all mean "no"
        return False


def _choice() -> tuple[JpegCodec, Callable[..., Any]]:
    global _chosen
    if _chosen is None:
        with _lock:
            if _chosen is None:
                _chosen = _choose()
    return _chosen


def _reset() -> None:
    """Forget the choice (tests choose again under other conditions)."""
    global _chosen
    with _lock:
        _chosen = None


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit()) if part else ""
        parts.append(int(digits or 0))
    return tuple(parts)


def _choose() -> tuple[JpegCodec, Callable[..., Any]]:
    try:
        version = metadata.version("torchcodec")
    except metadata.PackageNotFoundError:
        return _torchvision("torchcodec is not installed")
    if _version(version) < MIN_TORCHCODEC:
        return _torchvision(f"torchcodec {version} is older than {'.'.join(map(str, MIN_TORCHCODEC))}, "
                            "which has no decode_jpeg")
    try:
        decoders = importlib.import_module("torchcodec.decoders")
        decode = _torchcodec_decode(decoders.decode_jpeg)
        _probe(decode)
    except Exception as exc:  # a wheel built for another torch, a missing library, ...: torchvision's then
        return _torchvision(f"torchcodec {version} did not work: {type(exc).__name__}: {str(exc)[:300]}")
    return JpegCodec("torchcodec", version, f"torchcodec >= {'.'.join(map(str, MIN_TORCHCODEC))}"), decode


def _probe(decode: Callable[..., Any]) -> None:
    """Decode a tiny JPEG (made by simplejpeg) on the CPU: the native library loads and gives its pixels."""
    import simplejpeg

    pixels = np.zeros((8, 16, 3), np.uint8)
    pixels[:, 8:] = 200
    data = torch.frombuffer(bytearray(simplejpeg.encode_jpeg(pixels, quality=95)), dtype=torch.uint8)
    got = decode(data, torch.device("cpu"))
    want = simplejpeg.decode_jpeg(data.numpy(), colorspace="RGB")
    if tuple(got.shape) != (3, 8, 16) or not np.array_equal(got.permute(1, 2, 0).numpy(), want):
        raise RuntimeError(f"its decode_jpeg gave {tuple(got.shape)}, not libjpeg-turbo's pixels")


def _torchcodec_decode(decode: Callable[..., Any]) -> Callable[..., Any]:
    def run(data: Files, device: torch.device) -> Files:
        if isinstance(data, torch.Tensor):
            return decode(without_exif(data), mode="RGB", device=device)
        return decode([without_exif(d) for d in data], mode="RGB", device=device)

    return run


def _torchvision(why: str) -> tuple[JpegCodec, Callable[..., Any]]:
    import torchvision
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as tv_decode_jpeg

    def run(data: Files, device: torch.device) -> Files:
        with quiet_torchvision():
            return tv_decode_jpeg(data, mode=ImageReadMode.RGB, device=device)

    return JpegCodec("torchvision.io", torchvision.__version__, why), run


@contextlib.contextmanager
def quiet_torchvision() -> Iterator[None]:
    """Silence torchvision 0.29's DeprecationWarning from ``torchvision.io`` (raised on every call) around
    a call; other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torchvision\.io")
        yield


_APP1, _APP15, _SOS, _EOI = 0xE1, 0xEF, 0xDA, 0xD9


def without_exif(data: torch.Tensor) -> torch.Tensor:
    """``data`` (a JPEG's bytes), or a copy whose APP1 (EXIF, XMP) segments before the image data are
    marked APP15 instead, so no decoder applies an EXIF orientation. Segment lengths are kept; the
    pixels are unchanged (libjpeg and nvJPEG read no APPn segment but Adobe's APP14 and JFIF's APP0)."""
    raw = data.numpy()
    found = []
    pos, n = 2, raw.size
    while pos + 4 <= n and raw[pos] == 0xFF:
        marker = int(raw[pos + 1])
        if marker == 0xFF:  # a fill byte before a marker
            pos += 1
            continue
        if marker in (_SOS, _EOI):
            break
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:  # markers without a length
            pos += 2
            continue
        if marker == _APP1:
            found.append(pos + 1)
        length = (int(raw[pos + 2]) << 8) | int(raw[pos + 3])
        if length < 2:
            break
        pos += 2 + length
    if not found:
        return data
    copy = data.clone()
    copy[found] = _APP15
    return copy
