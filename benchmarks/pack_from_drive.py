"""Pack a folder on Drive straight from Drive, or stage it to local disk first and pack that copy?

``colabfast.open_dataset`` packs a source folder it finds on Drive; this measures both ways on the FUSE
Drive simulator (100 ms per open, 2 ms per read request, 60 MB/s shared) with photo-like JPEGs in an
ImageFolder tree, each way on a fresh mount (nothing cached), alternating, median of the repeats:

- straight: ``pack(drive_folder, local.h5)``: pack's 32 reader threads overlap Drive's round trips
  while its worker processes decode;
- staged: ``stage(drive_folder)`` (64 threads) then ``pack(local_copy, local.h5)``.

    taskset -c 0,1 python benchmarks/pack_from_drive.py               # 300 images, about a minute
    taskset -c 0,1 python benchmarks/pack_from_drive.py --images 500 --repeats 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import colabfast as cf
from colabfast.drivesim.simulator import DriveSim
from colabfast.testing import data


def straight(folder: Path, out: Path) -> float:
    start = time.perf_counter()
    cf.pack(folder, out / "straight.h5", progress=False)
    return time.perf_counter() - start


def staged(folder: Path, out: Path) -> float:
    start = time.perf_counter()
    local = cf.stage(folder, out / "copy", progress=False)
    cf.pack(local, out / "staged.h5", progress=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="JPEGs in the source (default: 300)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way, median reported (default: 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        drive = Path(tmp) / "drive"
        data.make_imagefolder(drive / "src", classes=args.classes, per_class=args.images // args.classes,
                              size=(500, 375), vary=0.2)
        size = sum(p.stat().st_size for p in (drive / "src").rglob("*") if p.is_file())
        times: dict[str, list[float]] = {"straight": [], "staged": []}
        for _ in range(args.repeats):
            for name, way in (("straight", straight), ("staged", staged)):
                out = Path(tmp) / "out"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                with DriveSim(drive, Path(tmp) / "mnt") as sim:
                    times[name].append(way(sim.mountpoint / "src", out))
        print(f"{args.images} JPEGs, {size / 1e6:.1f} MB, Drive simulator defaults (100 ms/open, 60 MB/s):")
        for name, ts in times.items():
            print(f"  {name:8s} {statistics.median(ts):6.1f} s  (runs: {', '.join(f'{t:.1f}' for t in ts)})")


if __name__ == "__main__":
    main()
