"""``colabfast demo``: the problem and the cure, measured side by side on this machine.

Builds a small ImageNet-style folder of real JPEGs, serves it through the Drive simulator (a FUSE
filesystem with Drive's per-open latency and bandwidth), and times one epoch of torchvision's
``ImageFolder`` + ``DataLoader`` straight from "Drive", the staging copy, the same epoch from
local disk, and an epoch from a packed HDF5 mirror. Without FUSE it says so and measures local
disk only.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Optional

from colabfast.drivesim.fs import DriveSimParams
from colabfast.testing import data

__all__ = ["main", "run", "report", "Row"]


@dataclasses.dataclass
class Row:
    what: str
    seconds: float
    images: int  # 0 for rows that are not an epoch (staging, packing)

    @property
    def rate(self) -> Optional[float]:
        return self.images / self.seconds if self.images else None


def _epoch(dataset, workers: int, batch_size: int = 32) -> float:
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers)
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def run(
    classes: int = 10,
    per_class: int = 30,
    size: tuple[int, int] = (500, 375),
    workers: int = 2,
    drive: Optional[dict] = None,
    root: Optional[Path] = None,
    fuse: Optional[bool] = None,
) -> list[Row]:
    """Measure the demo's rows; ``drive`` overrides :class:`~colabfast.drivesim.fs.DriveSimParams`'
    defaults (Drive as measured from Colab), e.g. ``{"open_ms": 5}``; ``fuse=False`` skips the
    simulated Drive (default: use it where FUSE is available).

    Returns:
        One :class:`Row` per measurement, in the order printed.
    """
    import torch
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    from colabfast.datasets.dropins import H5ImageFolder
    from colabfast.drivesim import fs as simfs
    from colabfast.drivesim import simulator
    from colabfast.packing import pack
    from colabfast.staging.pipeline import stage

    with tempfile.TemporaryDirectory(prefix="colabfast-demo-", dir=root) as folder:
        tmp = Path(folder)
        src = data.make_imagefolder(tmp / "drive" / "imagenet-mini", classes=classes, per_class=per_class, size=size)
        n = classes * per_class
        t = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()])
        rows = []
        ok, why = simfs.available()
        if ok and fuse is not False:
            with simulator.DriveSim(tmp / "drive", tmp / "mnt", **(drive or {})) as sim:
                on_drive = sim.mountpoint / src.name
                rows.append(Row("ImageFolder + DataLoader, straight from Drive",
                                _epoch(ImageFolder(on_drive, transform=t), workers), n))
                start = time.perf_counter()
                local = stage(on_drive, tmp / "local" / src.name, progress=False)
                rows.append(Row("colabfast.stage (Drive -> local disk)", time.perf_counter() - start, 0))
        else:
            local = src
        rows.append(Row("ImageFolder + DataLoader, staged on local disk", _epoch(ImageFolder(local, transform=t),
                                                                                 workers), n))
        start = time.perf_counter()
        mirror = pack(local, tmp / "local" / "imagenet-mini.h5", image_size=256, progress=False)
        rows.append(Row("colabfast.pack (resized to 256, one HDF5 file)", time.perf_counter() - start, 0))
        crop = transforms.Compose([transforms.CenterCrop(224), transforms.ConvertImageDtype(torch.float)])
        rows.append(Row("H5ImageFolder mirror (pre-resized, output='tensor')",
                        _epoch(H5ImageFolder(mirror, transform=crop, output="tensor"), workers), n))
        return rows


def report(rows: list[Row]) -> str:
    """The rows as a table, with each epoch's speed-up over the first epoch row."""
    base = next((r.rate for r in rows if r.rate), None)
    lines = [f"{'':52} {'seconds':>8} {'images/s':>9} {'speed-up':>9}", "-" * 81]
    for r in rows:
        rate = f"{r.rate:9.1f}" if r.rate else " " * 9
        speedup = f"{r.rate / base:8.1f}x" if r.rate and base else ""
        lines.append(f"{r.what:52} {r.seconds:8.2f} {rate} {speedup}")
    return "\n".join(lines)


def main(quick: bool = False) -> int:
    """Print the demo's header and table; ``quick`` runs 40 images of 160x120 instead of 300 of 500x375
    (a few seconds: a check that an install works end to end)."""
    from colabfast.drivesim import fs as simfs

    classes, per_class, size = (4, 10, (160, 120)) if quick else (10, 30, (500, 375))
    print(f"colabfast demo: {classes * per_class} ImageNet-style JPEGs ({size[0]}x{size[1]}), one epoch each "
          f"way, 2 DataLoader workers")
    ok, why = simfs.available()
    if ok:
        drive = DriveSimParams()
        print(f"simulated Drive: {drive.open_ms:.0f} ms per file open, {drive.read_ms:.0f} ms per read, "
              f"{drive.mbps:.0f} MB/s\n")
    else:
        print(f"simulated Drive: NOT RUNNING, so there is no Drive row and local disk is measured alone: {why}. "
              f"The simulator needs Debian's fuse3 (sudo apt-get install -y fuse3) and mfusepy "
              f"(pip install mfusepy).\n")
    print(report(run(classes=classes, per_class=per_class, size=size, fuse=ok)))
    return 0
