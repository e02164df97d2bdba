"""Pack a Drive folder into a mirror on Drive: built on local disk and copied over, or straight to Drive?

Where the local disk is short, ``colabfast.pack`` (and so ``open_dataset``) writes the mirror's parts
and build beside its destination instead (``colabfast/packing/placed.py``); this measures what that
costs against the local build, in the same run: photo-like JPEGs in an ImageFolder tree on the FUSE
Drive simulator (100 ms per open, 2 ms per read request, 60 MB/s shared), the mirror written into a
folder of that same mount, each way on a fresh mount, turns alternating, medians of the repeats; CPU
seconds per image of the process tree (the simulator's server counted apart).

    taskset -c 0,1 python benchmarks/pack_straight.py                 # 300 images, about a minute
    taskset -c 0,1 python benchmarks/pack_straight.py --images 600 --repeats 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import colabfast as cf
from colabfast.drivesim.simulator import DriveSim
from colabfast.packing.placed import at_destination
from colabfast.testing import data
from colabfast.tools.bench.timing import usage


def local(src: Path, dst: Path) -> None:
    cf.pack(src, dst, progress=False)


def straight(src: Path, dst: Path) -> None:
    with at_destination():
        cf.pack(src, dst, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="JPEGs in the source (default: 300)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way, median reported (default: 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        drive = Path(tmp) / "drive"
        n = args.classes * (args.images // args.classes)
        data.make_imagefolder(drive / "src", classes=args.classes, per_class=args.images // args.classes,
                              size=(500, 375), vary=0.2)
        size = sum(p.stat().st_size for p in (drive / "src").rglob("*") if p.is_file())
        wall: dict[str, list[float]] = {"local": [], "straight": []}
        cpu: dict[str, list[float]] = {"local": [], "straight": []}
        for turn in range(args.repeats):
            ways = (("local", local), ("straight", straight))
            for name, way in ways if turn % 2 == 0 else ways[::-1]:
                shutil.rmtree(drive / "mirrors", ignore_errors=True)
                with DriveSim(drive, Path(tmp) / "mnt") as sim:
                    start = usage(exclude=[sim.pid] if sim.pid else [])
                    way(sim.mountpoint / "src", sim.mountpoint / "mirrors" / f"{name}.h5")
                    spent = usage(exclude=[sim.pid] if sim.pid else []) - start
                wall[name].append(spent.wall)
                cpu[name].append(spent.cpu / n)
        print(f"{n} JPEGs, {size / 1e6:.1f} MB, Drive simulator defaults (100 ms/open, 60 MB/s), mirror on Drive:")
        for name in wall:
            print(f"  {name:8s} {statistics.median(wall[name]):6.1f} s  {n / statistics.median(wall[name]):6.0f} "
                  f"images/s  {1e3 * statistics.median(cpu[name]):5.2f} CPU-ms/image  (runs: "
                  f"{', '.join(f'{t:.1f}' for t in wall[name])})")
        ratio = statistics.median(wall["straight"]) / statistics.median(wall["local"])
        cost = statistics.median(cpu["straight"]) / statistics.median(cpu["local"])
        print(f"straight / local: {ratio:.2f}x the wall time, {cost:.2f}x the CPU per image")


if __name__ == "__main__":
    main()
