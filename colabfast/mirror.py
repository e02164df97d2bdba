"""The HDF5 mirror format: what :func:`colabfast.pack` writes and the datasets read.

A mirror is one HDF5 file holding a whole image dataset, so Drive serves one big file instead of
thousands of small ones. Format version 1, all datasets contiguous and unfiltered (so readers can
``pread`` them at a fixed file offset), no variable-length types, no pickle::

    /                        attrs: format="colabfast-mirror", format_version=1, layout
                             ("imagefolder" | "kitti" | "files"), store ("encoded" | "raw"),
                             image_size, quality, shuffled, seed, classes, skipped (JSON),
                             source, created, colabfast_version, and complete=1, written last
    <split>/                 "" (the root group) for imagefolder/files; "training", "testing" for kitti
        images               uint8 [total bytes]: every image back to back (encoded file bytes, or
                             raw pixels in HWC order)
        image_offsets        int64 [N + 1]: image i is images[image_offsets[i]:image_offsets[i + 1]]
        image_shapes         int32 [N, 3]: (H, W, 3) of each decoded image
        paths, path_offsets  uint8 [bytes], int64 [N + 1]: each sample's source path (UTF-8),
                             relative to the source folder
        order                int64 [N]: each stored sample's index in the source's own order
                             (differs from 0..N-1 when packed with shuffle=True)
        targets              int64 [N]: class index (imagefolder; files: label or -1)
        objects/...          kitti training only: per-object columns, sample i owns rows
                             object_offsets[i]:object_offsets[i + 1] (int64 [N + 1]):
                             type (uint8 code into the JSON attr ``names``), truncated (f64),
                             occluded (int64), alpha (f64), bbox (f64 [M, 4]), dimensions
                             (f64 [M, 3]), location (f64 [M, 3]), rotation_y (f64)
        calib/<key>          kitti: float64 [N, k] for P0..P3, R0_rect, Tr_velo_to_cam,
                             Tr_imu_to_velo (NaN where a sample has no calib file)

Encoded images are JPEG (RGB or grayscale, as found) or RGB PNG: any other source file (CMYK JPEG,
palette/RGBA/16-bit PNG, BMP, a PNG named .JPEG, ...) is stored as the lossless PNG of
``PIL.Image.open(f).convert("RGB")``, so every decoder returns exactly PIL's pixels.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import h5py
import numpy as np

from colabfast._fileio import PathLike, human_bytes

FORMAT = "colabfast-mirror"
FORMAT_VERSION = 1
LAYOUTS = ("imagefolder", "kitti", "files")
STORES = ("encoded", "raw")
KITTI_SPLITS = ("training", "testing")
KITTI_CALIB_KEYS = ("P0", "P1", "P2", "P3", "R0_rect", "Tr_velo_to_cam", "Tr_imu_to_velo")



class MirrorError(ValueError):
    """A file is not a complete colabfast mirror that this version can read; the message says why."""


def open_h5(path: PathLike) -> h5py.File:
    """Open a mirror read-only with h5py, without HDF5 file locking.

    Locking fails on FUSE and network mounts (Drive) and buys nothing for a file that is never
    modified once complete.

    Raises:
        FileNotFoundError: no such file.
        MirrorError: the file is not HDF5, or is truncated.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no mirror at {path}: pack one with colabfast.pack(source, {str(path)!r})")
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as exc:
        raise MirrorError(f"{path} cannot be opened as HDF5 ({exc}): it is truncated (an interrupted copy?) "
                          "or not an HDF5 file. Copy it again, or pack it again.") from exc


def check(f: h5py.File, path: PathLike) -> None:
    """Raise MirrorError unless ``f`` is a complete mirror of a format version this colabfast reads."""
    attrs = f.attrs
    if attrs.get("format") != FORMAT:
        raise MirrorError(f"{path} is an HDF5 file but not a colabfast mirror (no format={FORMAT!r} attribute). "
                          "Make one with colabfast.pack().")
    version = int(attrs.get("format_version", -1))
    if version != FORMAT_VERSION:
        raise MirrorError(f"{path} is a colabfast mirror of format version {version}; this colabfast reads "
                          f"version {FORMAT_VERSION}. Pack it again with this version, or install the "
                          "colabfast that wrote it.")
    if not attrs.get("complete", False):
        raise MirrorError(f"{path} is an incomplete mirror: packing it was interrupted before it finished. "
                          "Run colabfast.pack() again; it resumes where it stopped.")


def split_names(f: h5py.File) -> list[str]:
    """The sample tables in a mirror: ``[""]`` (the root group) or the KITTI splits present."""
    if f.attrs.get("layout") == "kitti":
        return [s for s in KITTI_SPLITS if s in f]
    return [""]


def json_attr(f: h5py.File, name: str, default: Any = None) -> Any:
    """A JSON-encoded attribute of the mirror, decoded."""
    raw = f.attrs.get(name)
    return default if raw is None else json.loads(raw)


def utf8_table(data: np.ndarray, offsets: np.ndarray) -> list[str]:
    """Decode a ``paths``/``path_offsets`` pair into strings."""
    blob = data.tobytes()
    return [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(len(offsets) - 1)]


@dataclasses.dataclass
class MirrorInfo:
    """What :func:`info` reports about a mirror."""

    path: Path
    size: int  # bytes on disk
    layout: str
    store: str
    complete: bool
    format_version: int
    samples: dict[str, int]  # split ("" for imagefolder/files) -> number of samples
    image_bytes: dict[str, int]  # split -> bytes of image data
    classes: Optional[list[str]]
    objects: dict[str, int]  # kitti split -> number of labelled objects
    image_size: Any
    quality: Optional[int]
    shuffled: bool
    skipped: list[dict]
    source: str
    created: str
    colabfast_version: str

    def __str__(self) -> str:
        lines = [
            f"{self.path}: colabfast mirror v{self.format_version}, {human_bytes(self.size)}, "
            + ("complete" if self.complete else "INCOMPLETE (packing was interrupted)"),
            f"  layout {self.layout}, store {self.store}"
            + (f", resized to {self.image_size}" if self.image_size is not None else "")
            + (f" (JPEG quality {self.quality})" if self.quality is not None and self.store == "encoded"
               and self.image_size is not None else "")
            + (", samples in shuffled order" if self.shuffled else ""),
        ]
        for split, n in self.samples.items():
            name = split or "samples"
            extra = f", {self.objects[split]} objects" if split in self.objects else ""
            lines.append(f"  {name}: {n} images, {human_bytes(self.image_bytes[split])} of image data{extra}")
        if self.classes is not None:
            shown = ", ".join(self.classes[:8]) + (", ..." if len(self.classes) > 8 else "")
            lines.append(f"  {len(self.classes)} classes: {shown}")
        lines.append(f"  packed from {self.source} on {self.created} by colabfast {self.colabfast_version}")
        if self.skipped:
            lines.append(f"  {len(self.skipped)} source files were skipped as unreadable:")
            lines += [f"    {s['path']}: {s['error']}" for s in self.skipped[:20]]
            if len(self.skipped) > 20:
                lines.append(f"    ... and {len(self.skipped) - 20} more")
        return "\n".join(lines)


def info(path: PathLike) -> MirrorInfo:
    """Describe a mirror (also one whose packing was interrupted). ``colabfast info`` prints this.

    Raises:
        FileNotFoundError, MirrorError: not a readable colabfast mirror.
    """
    path = Path(path)
    with open_h5(path) as f:
        if f.attrs.get("format") != FORMAT:
            check(f, path)
        samples, nbytes, objects = {}, {}, {}
        for split in split_names(f):
            g = f[split] if split else f
            if "image_offsets" in g:
                samples[split] = len(g["image_offsets"]) - 1
                nbytes[split] = int(g["images"].shape[0])
            if "object_offsets" in g:
                objects[split] = int(g["object_offsets"][-1])
        quality = f.attrs.get("quality")
        return MirrorInfo(
            path=path, size=path.stat().st_size, layout=str(f.attrs.get("layout")),
            store=str(f.attrs.get("store")), complete=bool(f.attrs.get("complete", False)),
            format_version=int(f.attrs.get("format_version", -1)), samples=samples, image_bytes=nbytes,
            classes=json_attr(f, "classes"), objects=objects, image_size=json_attr(f, "image_size"),
            quality=None if quality is None else int(quality), shuffled=bool(f.attrs.get("shuffled", False)),
            skipped=json_attr(f, "skipped", []), source=str(f.attrs.get("source", "")),
            created=str(f.attrs.get("created", "")), colabfast_version=str(f.attrs.get("colabfast_version", "")),
        )
