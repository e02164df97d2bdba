"""Train straight from a mirror on Drive, or stage it first? One cold epoch each way, on the Drive simulator.

A mirror is packed from ImageNet-like photos, put behind the FUSE Drive simulator (100 ms per open,
2 ms per read request, 60 MB/s shared), and read with ``H5ImageFolder(output="tensor")`` and
``colabfast.DataLoader``: block-shuffled and fully random, straight from the simulated Drive (each epoch
reopens the file, which drops its cached pages: every epoch reads through the link), then from the copy
``colabfast.stage`` makes on local disk. The "reads only" rows fetch each batch's JPEG bytes and decode
nothing: what the link costs, apart from the 2 CPUs' decoding. Prints images/s per row and the stage time.

    taskset -c 0,1 python benchmarks/drive_reads.py            # 1500 images, about a minute
    taskset -c 0,1 python benchmarks/drive_reads.py --images 3000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from torch.utils.data import RandomSampler

import colabfast as cf
from colabfast.drivesim.simulator import DriveSim
from colabfast.testing import data


def epoch(mirror: Path, sampler: str, batch_size: int, output: str) -> float:
    """Images/s of one epoch of ``mirror`` read with a fresh dataset and loader, after its first batch."""
    ds = cf.H5ImageFolder(mirror, output=output)
    order = cf.BlockShuffleSampler(ds, 64) if sampler == "block" else RandomSampler(ds)
    loader = cf.DataLoader(ds, batch_size=batch_size, sampler=order, device="cpu")
    batches = iter(loader)
    next(batches)  # the clock starts at the first batch: worker start-up is not reading
    start = time.perf_counter()
    seen = sum(len(labels) for _, labels in batches)
    return seen / (time.perf_counter() - start)


def reads(mirror: Path, sampler: str, batch_size: int) -> float:
    """Images/s of the reads alone: the JPEG bytes of each batch of one epoch (``__getitems__``: one read
    per run of neighbouring images), in this thread, nothing decoded."""
    ds = cf.H5ImageFolder(mirror, output="bytes")
    order = list(cf.BlockShuffleSampler(ds, 64) if sampler == "block" else RandomSampler(ds))
    start = time.perf_counter()
    for i in range(0, len(order), batch_size):
        ds.__getitems__(order[i:i + batch_size])
    return len(order) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1500, help="images in the mirror (default: 1500)")
    parser.add_argument("--image-size", type=int, default=160, help="short side packed, pixels (default: 160)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="epochs per row, median reported (default: 2)")
    parser.add_argument("--output", default="tensor", choices=("tensor", "bytes"),
                        help="H5ImageFolder's output: decoded tensors, or the JPEG bytes (the reads alone)")
    args = parser.parse_args()

    runs = range(args.repeats)
    with tempfile.TemporaryDirectory(prefix="colabfast-drive-reads-") as tmp:
        tmp = Path(tmp)
        src = data.make_imagefolder(tmp / "src", classes=10, per_class=args.images // 10, size=(500, 375), vary=0.2)
        (tmp / "drive").mkdir()
        packed = cf.pack(src, tmp / "drive" / "mirror.h5", image_size=args.image_size, shuffle=True, progress=False)
        size = packed.stat().st_size
        print(f"mirror: {args.images} images at short side {args.image_size}, {size / 1e6:.1f} MB "
              f"({size / args.images / 1e3:.1f} kB per image); output={args.output!r}, batch {args.batch_size}, "
              f"median of {args.repeats} epochs")
        with DriveSim(tmp / "drive", tmp / "mnt") as sim:
            on_drive = sim.mountpoint / "mirror.h5"
            epoch(on_drive, "block", args.batch_size, args.output)  # warm-up: imports, threads
            rows = {}
            for sampler in ("block", "random"):
                rows[f"from Drive, {sampler}"] = [epoch(on_drive, sampler, args.batch_size, args.output) for _ in runs]
                rows[f"from Drive, {sampler}, reads only"] = [reads(on_drive, sampler, args.batch_size) for _ in runs]
            start = time.perf_counter()
            local = cf.stage(on_drive, tmp / "local" / "mirror.h5", progress=False)
            staged_s = time.perf_counter() - start
        for sampler in ("block", "random"):
            rows[f"staged, {sampler}"] = [epoch(local, sampler, args.batch_size, args.output) for _ in runs]
            rows[f"staged, {sampler}, reads only"] = [reads(local, sampler, args.batch_size) for _ in runs]
    for name, rates in rows.items():
        print(f"{name:34} {statistics.median(rates):8.0f} images/s  ({', '.join(f'{r:.0f}' for r in rates)})")
    print(f"stage (one file through the simulator): {staged_s:.1f} s, {size / staged_s / 1e6:.1f} MB/s")


if __name__ == "__main__":
    main()
