"""What a mirror stores for one image file: :func:`encode_image` (pack's rule for an ImageFolder's
files and for layouts' images), and torchvision's ``Resize`` size rule (:func:`resized_size`)."""

from __future__ import annotations

import dataclasses
import io
from typing import Optional, Sequence, Union

import simplejpeg
from PIL import Image

__all__ = ["ImageFile", "encode_image", "resized_size", "exact_everywhere", "exif_orientation", "oriented_size"]


@dataclasses.dataclass(frozen=True)
class ImageFile:
    """An image or mask file's bytes, as a layout returns them: stored as ``pack`` stores an ImageFolder's
    files (``kind="image"``), or losslessly in the file's own mode (``kind="mask"``); ``orient``: read as
    Ultralytics reads images (OpenCV's RGB, :func:`opencv_rgb`), its EXIF orientation applied.
    """

    data: bytes
    path: str  # relative to the layout's root, for messages
    kind: str = "image"  # "image" or "mask"
    keep: bool = False  # an image kept in its own mode (as PIL opens the file), not converted to RGB
    orient: bool = False  # apply the file's EXIF orientation (kind "image", not keep)


# EXIF orientation (tag 274) -> the transpose that makes the image upright, as ``PIL.ImageOps.exif_transpose``
# and OpenCV's decoders apply it (1: upright already; 5 to 8 swap width and height).
ORIENTATIONS = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
                5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
                8: Image.Transpose.ROTATE_90}


def resized_size(width: int, height: int, image_size: Union[int, Sequence[int]]) -> tuple[int, int]:
    """(width, height) after ``torchvision.transforms.Resize(image_size)`` (its
    ``_compute_resized_output_size`` rule: an int is the new short side, the long side truncated)."""
    if isinstance(image_size, int):
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = image_size, int(image_size * long / short)
        return (new_short, new_long) if width <= height else (new_long, new_short)
    return int(image_size[1]), int(image_size[0])


def exact_everywhere(fmt: Optional[str], mode: str, data: bytes) -> bool:
    """True if every decoder (PIL, torchvision/libjpeg-turbo, nvJPEG) yields PIL's RGB pixels."""
    if fmt == "JPEG":
        return mode in ("RGB", "L")
    if fmt == "PNG":  # 8-bit truecolour: IHDR bit depth at byte 24, colour type at byte 25
        return mode == "RGB" and len(data) > 25 and data[24] == 8 and data[25] == 2
    return False


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation of the opened image ``img``, 1 to 8 (1 where it has none, or an unreadable
    or invalid one: Ultralytics' ``exif_size`` ignores those too)."""
    try:
        value = img.getexif().get(274)
    except Exception:  # a malformed EXIF block: as exif_size, the image is taken as it is stored
        return 1
    return value if value in ORIENTATIONS else 1


def oriented_size(img: Image.Image) -> tuple[int, int]:
    """(width, height) of ``img`` once its EXIF orientation is applied (Ultralytics' ``exif_size``)."""
    return img.size[::-1] if exif_orientation(img) in (5, 6, 7, 8) else img.size


def opencv_rgb(img: Image.Image) -> Image.Image:
    """``img`` in RGB as OpenCV's ``imdecode(..., IMREAD_COLOR)`` decodes it, which is how Ultralytics reads
    images (``imread`` in ``ultralytics/utils/patches.py``): a 16-bit grey image keeps each value's high
    byte (``>> 8``), where Pillow's ``convert("RGB")`` clips it to 255; any other mode (palette, 16-bit
    RGB, alpha dropped) is ``convert("RGB")``, whose pixels are OpenCV's."""
    if img.mode.startswith("I;16") or img.mode == "I" and img.format == "PNG":
        import numpy as np

        return Image.fromarray((np.asarray(img).astype(np.uint32) >> 8).astype(np.uint8)).convert("RGB")
    return img.convert("RGB")


def _decodes_scaled(data: bytes) -> bool:
    """True if libjpeg-turbo decodes the JPEG ``data`` at 1/8 scale without an error or a warning."""
    try:
        simplejpeg.decode_jpeg(data, colorspace="GRAY", min_height=1, min_width=1, strict=True)  # 1/8 scale
    except ValueError:  # a libjpeg warning or error: PIL, which tolerates warnings, decides
        return False
    return True


def encode_image(data: bytes, store: str, image_size, quality: int,
                 orient: bool = False) -> tuple[bytes, tuple[int, int, int]]:
    """What the mirror stores for one source file, and the decoded (H, W, 3) shape.

    Each file is decoded as torchvision's ImageFolder loads it (``pil_loader`` in
    ``torchvision/datasets/folder.py``) or, where kept as it is, checked by a strict 1/8-scale decode;
    ``orient``: read as Ultralytics reads images (OpenCV's RGB, :func:`opencv_rgb`: a 16-bit grey image
    keeps its high byte), a rotated file stored as its upright pixels. Details:
    [The mirror format](../mirror-format.md#images).

    Raises:
        ImageSizeError: the header declares more than ``PIL.Image.MAX_IMAGE_PIXELS`` pixels.
        Exception: whatever PIL raises for a file it cannot read (``UnidentifiedImageError``,
            ``OSError("image file is truncated")``, ...).
    """
    from colabfast.images.decode import check_pixels

    img = Image.open(io.BytesIO(data))
    fmt, mode = img.format, img.mode
    # The readers' limit, from the header: PIL only warns up to twice it, and a mirror would keep an image
    # that every reader then refuses.
    check_pixels(img.height, img.width, "this file")
    turn = ORIENTATIONS.get(exif_orientation(img)) if orient else None
    as_is = turn is None and exact_everywhere(fmt, mode, data)  # every decoder gives the pixels wanted
    if store == "encoded" and image_size is None and as_is:
        width, height = img.size
        if fmt != "JPEG":
            img.load()
        elif not _decodes_scaled(data):
            img.draft(mode, (max(1, width // 8), max(1, height // 8)))
            img.load()
        return data, (height, width, 3)
    rgb = opencv_rgb(img) if orient else img.convert("RGB")
    if turn is not None:  # after the conversion, as OpenCV turns its decoded BGR: the same pixels either way
        rgb = rgb.transpose(turn)
    # A tRNS chunk of a 1-bit or 16-bit grey PNG stays in ``info`` as one int, which PIL cannot save
    # with RGB; ImageFolder's pixels have no transparency either.
    rgb.info.pop("transparency", None)
    if image_size is not None:
        size = resized_size(rgb.width, rgb.height, image_size)
        if size != rgb.size:
            rgb = rgb.resize(size, Image.Resampling.BILINEAR)
    shape = (rgb.height, rgb.width, 3)
    if store == "raw":
        return rgb.tobytes(), shape
    if image_size is None and as_is:
        return data, shape
    out = io.BytesIO()
    if image_size is None:
        rgb.save(out, format="PNG")  # lossless: any decoder then gives PIL's convert("RGB") pixels
    else:
        rgb.save(out, format="JPEG", quality=quality)
    return out.getvalue(), shape
