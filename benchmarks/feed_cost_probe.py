"""What one batch of the GPU feed costs on the CPU, without training: the in-process feed, the same work
in one thread as feed='process' runs it (1 or 2 intra-op threads), and feed='process' itself.

    taskset -c 0,1 python benchmarks/feed_cost_probe.py [--images 1500] [--batches 40]

Prints batches/s and CPU ms per batch for each, then cProfile's top functions of the one-thread loop.
Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

from colabfast.datasets.dropins import H5ImageFolder
from colabfast.images import transforms
from colabfast.loading.feedprocess import pack, packed_size
from colabfast.loading.loader import DataLoader
from colabfast.packing import pack as pack_mirror
from colabfast.testing import data
from colabfast.tools.bench.gpufeed import MEAN, STD


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    tmp = Path(tempfile.mkdtemp(prefix="colabfast-cost-"))
    tree = data.make_imagefolder(tmp / "tree", classes=10, per_class=args.images // 10, size=(500, 375), vary=0.15)
    mirror = pack_mirror(tree, tmp / "m.h5", progress=False)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    batched = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()])
    kw = dict(batch_size=128, shuffle=True, device="cuda", mean=MEAN, std=STD, dtype=torch.bfloat16,
              memory_format=torch.channels_last, decode="gpu", drop_last=True, transform=batched)

    def forever(make):
        while True:
            yield from make()

    def timed(name, batches, n):
        for _ in range(5):
            next(batches)
        torch.cuda.synchronize()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            next(batches)
        torch.cuda.synchronize()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"| {name} | {n / wall:.1f} | {wall / n * 1e3:.1f} | {cpu / n * 1e3:.1f} |", flush=True)

    def child_like(dl, slot, stream):
        def run():
            for b in dl._batches():
                with torch.cuda.stream(stream):
                    c = dl._convert(b)
                    del b
                    pack(c, slot)
                    del c
                yield None
        return run

    print("| variant | batches/s | wall ms per batch | CPU ms per batch (this process) |\n|---|---|---|---|")
    dl = DataLoader(H5ImageFolder(mirror, output="bytes"), **kw)
    timed("in-process feed (feeder thread), loader alone", forever(lambda: iter(dl)), args.batches)
    stream = torch.cuda.Stream()
    probe = next(iter(dl))
    slot = torch.empty(packed_size(probe) * 2, dtype=torch.uint8, device="cuda")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        timed(f"one thread: read, convert, pack ({threads} intra-op)", forever(child_like(dl, slot, stream)),
              args.batches)
    torch.set_num_threads(1)
    profile = cProfile.Profile()
    batches = forever(child_like(dl, slot, stream))
    for _ in range(5):
        next(batches)
    profile.enable()
    for _ in range(20):
        next(batches)
    torch.cuda.synchronize()
    profile.disable()
    torch.set_num_threads(2)
    proc = DataLoader(H5ImageFolder(mirror, output="bytes"), feed="process", **kw)
    timed("feed='process', loader alone (CPU: training process only)", forever(lambda: iter(proc)), args.batches)
    proc.close()
    s = io.StringIO()
    pstats.Stats(profile, stream=s).sort_stats("tottime").print_stats(22)
    print(s.getvalue()[-6000:])


if __name__ == "__main__":
    main()
