"""Small real datasets made on the spot: photo-like JPEG/PNG files in ImageNet and KITTI layouts.

The demo, the notebooks' tiny mode, the tests and the benchmarks use these instead of downloads. The
files are real (PIL writes them), photo-like (smooth colour fields, edges and sensor noise, so JPEG
sizes and decode costs resemble photos) and deterministic for a given seed.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence, Union

import numpy as np
from PIL import Image, ImageDraw

from colabfast.where._fileio import PathLike

__all__ = ["make_imagefolder", "make_kitti", "make_files", "add_broken_images", "photo", "encode", "WNIDS"]

# Real ImageNet class ids (wnids), so trees look like ILSVRC2012 train/ and val/.
WNIDS = (
    "n01440764", "n01443537", "n01484850", "n01491361", "n01494475", "n01496331", "n01498041",
    "n01514668", "n01514859", "n01518878", "n01530575", "n01531178", "n01532829", "n01534433",
    "n01537544", "n01558993", "n01560419", "n01580077", "n01582220", "n01592084",
)  # fmt: skip

KITTI_TYPES = ("Car", "Van", "Truck", "Pedestrian", "Person_sitting", "Cyclist", "Tram", "Misc")


def photo(width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """A photo-like RGB image: smooth colour field, a few shapes, mild noise.

    Args:
        width, height: size in pixels.
        rng: the random source (``np.random.default_rng(seed)``).

    Returns:
        A ``PIL.Image`` in mode ``"RGB"``.
    """
    coarse = rng.integers(0, 256, (height // 24 + 2, width // 24 + 2, 3), dtype=np.uint8)
    img = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 6))):
        x0, x1 = sorted(rng.integers(0, width, 2).tolist())
        y0, y1 = sorted(rng.integers(0, height, 2).tolist())
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1 + 1, y1 + 1), fill=colour)
    noise = rng.normal(0.0, 6.0, (height, width, 3))
    pixels = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def encode(img: Image.Image, fmt: str = "JPEG", quality: int = 90) -> bytes:
    """``img`` encoded as ``fmt`` (``"JPEG"`` at ``quality``, or any format PIL writes)."""
    buf = io.BytesIO()
    if fmt == "JPEG":
        img.save(buf, format=fmt, quality=quality)
    else:
        img.save(buf, format=fmt)
    return buf.getvalue()


def _size(size: tuple[int, int], vary: float, rng: np.random.Generator) -> tuple[int, int]:
    if not vary:
        return size
    w, h = size
    f = rng.uniform(1 - vary, 1 + vary, 2)
    return max(8, int(w * f[0])), max(8, int(h * f[1]))


def make_imagefolder(
    root: PathLike,
    *,
    classes: Union[int, Sequence[str]] = 4,
    per_class: int = 10,
    size: tuple[int, int] = (500, 375),
    vary: float = 0.0,
    quality: int = 90,
    odd_files: bool = False,
    seed: int = 0,
) -> Path:
    """Write an ImageNet-style tree ``root/<wnid>/<wnid>_<n>.JPEG`` of photo-like JPEGs.

    Args:
        root: folder to create (may exist; existing files of the same names are overwritten).
        classes: a number of classes (named by real ImageNet wnids) or the class folder names.
        per_class: images per class.
        size: (width, height) in pixels; ImageNet averages about 500x375.
        vary: relative jitter of each side (0.2 gives sizes within +-20%), as in real datasets.
        quality: JPEG quality.
        odd_files: also add the files real datasets hold and loaders trip on: a CMYK JPEG, a
            grayscale JPEG, a PNG saved under a ``.JPEG`` name, RGBA and palette PNGs, an upper-case
            ``.JPG``, an image in a nested folder; and junk loaders must ignore: ``.DS_Store``,
            ``Thumbs.db``, ``desktop.ini``, ``notes.txt``, a macOS ``._`` AppleDouble file and an
            ``.ipynb_checkpoints`` folder.
        seed: random seed; the same arguments give the same bytes.

    Returns:
        ``Path(root)``.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    names = list(WNIDS[:classes]) if isinstance(classes, int) else list(classes)
    if isinstance(classes, int) and classes > len(WNIDS):
        names += [f"n{90000000 + i:08d}" for i in range(classes - len(WNIDS))]
    for name in names:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(per_class):
            w, h = _size(size, vary, rng)
            (folder / f"{name}_{n}.JPEG").write_bytes(encode(photo(w, h, rng), quality=quality))
    if odd_files:
        _add_odd_files(root / names[0], root, rng, size)
    return root


def _add_odd_files(folder: Path, root: Path, rng: np.random.Generator, size: tuple[int, int]) -> None:
    w, h = size
    stem = folder.name
    img = photo(w, h, rng)
    (folder / f"{stem}_cmyk.JPEG").write_bytes(encode(img.convert("CMYK")))
    (folder / f"{stem}_gray.JPEG").write_bytes(encode(photo(w, h, rng).convert("L")))
    (folder / f"{stem}_png_named.JPEG").write_bytes(encode(photo(w, h, rng), "PNG"))
    (folder / f"{stem}_rgba.png").write_bytes(encode(photo(w, h, rng).convert("RGBA"), "PNG"))
    (folder / f"{stem}_palette.png").write_bytes(encode(photo(w, h, rng).convert("P"), "PNG"))
    (folder / f"{stem}_upper.JPG").write_bytes(encode(photo(w, h, rng)))
    (folder / "nested").mkdir(exist_ok=True)
    (folder / "nested" / f"{stem}_nested.jpeg").write_bytes(encode(photo(w, h, rng)))
    (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1" + bytes(64))
    (folder / "Thumbs.db").write_bytes(bytes(128))
    (folder / "desktop.ini").write_text("[.ShellClassInfo]\n")
    (folder / "notes.txt").write_text("not an image\n")
    (folder / f"._{stem}_0.JPEG").write_bytes(b"\x00\x05\x16\x07" + bytes(80))  # AppleDouble
    checkpoints = root / ".ipynb_checkpoints"
    checkpoints.mkdir(exist_ok=True)
    (checkpoints / "stray-checkpoint.jpg").write_bytes(encode(photo(w, h, rng)))


def add_broken_images(folder: PathLike, seed: int = 0) -> list[Path]:
    """Add unreadable files with image names to ``folder``: truncated, zero-byte, not an image.

    Returns:
        The paths written, sorted.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = encode(photo(120, 90, np.random.default_rng(seed)))
    bad = {
        folder / "broken_truncated.JPEG": data[: len(data) // 2],
        folder / "broken_empty.JPEG": b"",
        folder / "broken_text.jpg": b"this is not an image\n" * 4,
    }
    for path, content in bad.items():
        path.write_bytes(content)
    return sorted(bad)


def kitti_label_line(rng: np.random.Generator, width: int, height: int) -> str:
    """One line of a KITTI ``label_2`` file: 15 space-separated fields, or a ``DontCare`` row."""
    x0, x1 = sorted(rng.uniform(0, width - 1, 2).round(2).tolist())
    y0, y1 = sorted(rng.uniform(0, height - 1, 2).round(2).tolist())
    if rng.random() < 0.15:
        return f"DontCare -1 -1 -10 {x0:.2f} {y0:.2f} {x1:.2f} {y1:.2f} -1 -1 -1 -1000 -1000 -1000 -10"
    kind = KITTI_TYPES[int(rng.integers(len(KITTI_TYPES)))]
    truncated = float(rng.choice([0.0, 0.0, 0.0, 0.31, 0.87]))
    occluded = int(rng.integers(0, 4))
    alpha, rot = rng.uniform(-3.14, 3.14, 2).round(2)
    h3, w3, l3 = rng.uniform(0.5, 4.5, 3).round(2)
    loc = rng.uniform(-20, 60, 3).round(2)
    return (
        f"{kind} {truncated:.2f} {occluded} {alpha:.2f} {x0:.2f} {y0:.2f} {x1:.2f} {y1:.2f} "
        f"{h3:.2f} {w3:.2f} {l3:.2f} {loc[0]:.2f} {loc[1]:.2f} {loc[2]:.2f} {rot:.2f}"
    )


def kitti_calib(rng: np.random.Generator) -> str:
    """The text of a KITTI ``calib`` file (P0-P3, R0_rect, Tr_velo_to_cam, Tr_imu_to_velo)."""
    def row(n: int) -> str:
        return " ".join(f"{v:.12e}" for v in rng.normal(0, 100, n))

    keys = [("P0", 12), ("P1", 12), ("P2", 12), ("P3", 12), ("R0_rect", 9),
            ("Tr_velo_to_cam", 12), ("Tr_imu_to_velo", 12)]  # fmt: skip
    return "".join(f"{k}: {row(n)}\n" for k, n in keys) + "\n"


def make_kitti(
    root: PathLike,
    *,
    train: int = 8,
    test: int = 4,
    size: tuple[int, int] = (1242, 375),
    vary: bool = True,
    seed: int = 0,
) -> Path:
    """Write a KITTI object-detection tree (the layout of ``data_object_image_2.zip`` + labels + calib).

    ``root/training/{image_2,label_2,calib}/NNNNNN.{png,txt,txt}`` and
    ``root/testing/{image_2,calib}/``. Labels have 15 fields per object with ``DontCare`` rows mixed
    in; one training image has no objects. Real KITTI images are 1242x375 PNGs, give or take a few
    pixels, which ``vary`` imitates.

    Returns:
        ``Path(root)``.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    for split, count in (("training", train), ("testing", test)):
        for sub in ("image_2", "calib") + (("label_2",) if split == "training" else ()):
            (root / split / sub).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            w, h = size
            if vary:
                w, h = w - int(rng.integers(0, 18)), h + int(rng.integers(-5, 2))
            stem = f"{i:06d}"
            (root / split / "image_2" / f"{stem}.png").write_bytes(encode(photo(w, h, rng), "PNG"))
            (root / split / "calib" / f"{stem}.txt").write_text(kitti_calib(rng))
            if split == "training":
                n = 0 if i == 1 else int(rng.integers(1, 8))
                lines = [kitti_label_line(rng, w, h) for _ in range(n)]
                (root / split / "label_2" / f"{stem}.txt").write_text("".join(s + "\n" for s in lines))
    return root


def make_files(
    root: PathLike, count: int, size: int, *, per_folder: int = 0, seed: int = 0
) -> Path:
    """Write ``count`` files of ``size`` random (incompressible) bytes under ``root``.

    Args:
        per_folder: when > 0, spread the files over sub-folders of this many files each.

    Returns:
        ``Path(root)``.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / f"d{i // per_folder:04d}" if per_folder else root
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:06d}.bin").write_bytes(rng.bytes(size))
    return root
