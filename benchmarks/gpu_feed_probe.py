"""Where does ResNet-50 training lose time to the GPU feed? Variants of the feed against the ceiling.

    taskset -c 0,1 python benchmarks/gpu_feed_probe.py [--images 1500] [--steps 20] [--repeats 3]

The same ResNet-50 step as ``colabfast bench gpu`` (bf16 autocast, channels-last, SGD, batch 128,
``RandomResizedCrop(224)`` + flip, 1500 photo-like JPEGs of about 500x375 decoded by nvJPEG), one
process pinned to 2 CPUs. Each variant trains from a fresh iterator with a CUDA sync after each step (as
:func:`colabfast.diagnose` does, and a loop that logs ``loss.item()``), interleaved with the data-on-GPU
ceiling. It reports images/s, the fraction of the ceiling, the data wait share and the CPU milliseconds
each thread spent per step (``/proc/self/task/*/stat``; worker processes, and the feed subprocess of
``feed='process'``, as one entry), and the ceiling's CPU launch time per step: how long the step's
Python runs before the GPU is waited for. When that is close to the step's GPU time, any CPU the feed
takes slows training. Needs a CUDA GPU."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from colabfast.datasets.dropins import H5ImageFolder
from colabfast.images import transforms
from colabfast.loading import reader
from colabfast.loading.loader import DataLoader
from colabfast.packing import pack
from colabfast.testing import data
from colabfast.tools.bench.gpufeed import MEAN, STD, _train_step

BATCH, CROP, CLASSES = 128, 224, 10


def _make_class(args: tuple[str, str, int, int]) -> None:
    root, name, per_class, seed = args
    data.make_imagefolder(root, classes=[name], per_class=per_class, size=(500, 375), vary=0.15, seed=seed)


def blocking_sync(device: int = 0) -> int:
    """Make this process's waits for the GPU sleep instead of spin: ``CU_CTX_SCHED_BLOCKING_SYNC`` on
    ``device``'s primary context (the CUDA driver API's ``cuDevicePrimaryCtxSetFlags``; CUDA's
    default lets a thread that waits, in a synchronize or in a library such as nvJPEG, spin a CPU
    core while other contexts have the GPU). Returns the driver's result (0: set), or -1 where there
    is no CUDA driver."""
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return -1
    handle = ctypes.c_int()
    for result in (driver.cuInit(0), driver.cuDeviceGet(ctypes.byref(handle), device)):
        if result:
            return int(result)
    set_flags = getattr(driver, "cuDevicePrimaryCtxSetFlags_v2", None) or driver.cuDevicePrimaryCtxSetFlags
    return int(set_flags(handle, ctypes.c_uint(0x04)))


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) per thread of this process, by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        name = names.get(int(tid), comm)
        if name.startswith(("colabfast-reader", "ThreadPoolExecutor")):
            name = "reader threads"
        elif int(tid) == threading.main_thread().native_id:
            name = "training (main)"
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def children_cpu() -> float:
    """CPU seconds of this process's child processes (worker processes), from psutil."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def measure(loader, step, steps: int, warmup: int = 5) -> tuple[float, float, dict[str, float]]:
    """Train ``warmup`` then ``steps`` steps from a fresh iterator, a CUDA sync after each step (as
    :func:`colabfast.diagnose`): images/s, data wait %, and CPU ms per step by thread over the
    measured steps (worker processes as one entry)."""
    def epochs():  # as many epochs as the steps need (an epoch of 1500 images is 11 batches)
        while True:
            yield from loader

    batches = epochs()
    for _ in range(warmup):
        step(next(batches))
    torch.cuda.synchronize()
    waited = 0.0
    c0, k0, p0, t0 = thread_cpu(), children_cpu(), time.process_time(), time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - t
        step(batch)
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    c1, k1, p1 = thread_cpu(), children_cpu(), time.process_time()
    del batches
    use = {k: (c1.get(k, 0.0) - c0.get(k, 0.0)) / steps * 1e3 for k in c1}
    use["worker processes"] = (k1 - k0) / steps * 1e3
    use["whole process"] = (p1 - p0) / steps * 1e3  # with threads that ended meanwhile (a feeder per epoch)
    return BATCH * steps / elapsed, waited / elapsed * 100, use


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="variant names separated by ; (default: all)")
    parser.add_argument("--blocking-sync", action="store_true",
                        help="this (training) process's CUDA waits sleep instead of spin (blocking_sync)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    if args.blocking_sync:
        print(f"blocking sync in the training process: driver result {blocking_sync()}")
    tmp = Path(tempfile.mkdtemp(prefix="colabfast-probe-"))
    names = [f"n{i:08d}" for i in range(CLASSES)]
    with multiprocessing.Pool(min(CLASSES, os.cpu_count() or 1)) as pool:  # before pinning: all CPUs
        pool.map(_make_class, [(str(tmp / "tree"), n, args.images // CLASSES, i) for i, n in enumerate(names)])
    mirror = pack(tmp / "tree", tmp / "mirror.h5", progress=False)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CPUs {sorted(os.sched_getaffinity(0))}")

    step = _train_step("resnet50", torch.bfloat16)
    x = torch.randn(BATCH, 3, CROP, CROP, device="cuda").to(torch.bfloat16, memory_format=torch.channels_last)
    y = torch.randint(0, CLASSES, (BATCH,), device="cuda")
    for _ in range(5):
        step((x, y))
    torch.cuda.synchronize()
    launch, total = [], []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step((x, y))
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        launch.append(t1 - t0)
        total.append(time.perf_counter() - t0)
    print(f"ceiling step: CPU launch {statistics.median(launch) * 1e3:.1f} ms of "
          f"{statistics.median(total) * 1e3:.1f} ms per step (median of 20)")

    batched = transforms.Compose([transforms.RandomResizedCrop(CROP), transforms.RandomHorizontalFlip()])
    ours = {"batch_size": BATCH, "shuffle": True, "device": "cuda", "mean": MEAN, "std": STD,
            "dtype": torch.bfloat16, "memory_format": torch.channels_last, "decode": "gpu", "drop_last": True,
            "transform": batched}

    def loader(threads=None, pinned=True, **kw):
        """colabfast's loader; ``threads``/``pinned`` override how its batch reader reads the files."""
        dl = DataLoader(H5ImageFolder(mirror, output="bytes"), **{**ours, **kw})
        if dl._reader is not None:
            if threads is not None:
                dl._reader.threads, dl._reader.prefetch = threads, 2 * threads
                dl._reader._memory = reader._Recycled(keep=3 * threads + 2)
            dl._reader.pin_memory = pinned
        return dl

    variants = {
        "ceiling": lambda: [(x, y)] * (args.steps + 5),  # a list: iter() gives a fresh pass
        "defaults: the feeder reads, pinned": lambda: loader(feed="thread"),
        "feed in a subprocess (feed='process')": lambda: loader(feed="process"),
        "the feeder reads, pageable": lambda: loader(pinned=False, feed="thread"),
        "2 reader threads, pinned": lambda: loader(threads=2, feed="thread"),
        "2 reader threads, pageable (before)": lambda: loader(threads=2, pinned=False, feed="thread"),
        "torch's num_workers=0 (collate, pin)": lambda: loader(num_workers=0),
        "torch's num_workers=2 (processes)": lambda: loader(num_workers=2),
    }
    only = [v for v in args.only.split(";") if v]
    chosen = [v for v in variants if not only or v in only or v == "ceiling"]
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in chosen}
    cpu: dict[str, list[dict[str, float]]] = {v: [] for v in chosen}
    loaders = {}
    for r in range(args.repeats):
        for v in chosen:  # interleaved: drift hits every variant alike
            if v not in loaders:
                loaders[v] = variants[v]()
            rate, wait, use = measure(loaders[v], step, args.steps)
            cpu[v].append(use)
            results[v].append((rate, wait))
            print(f"  repeat {r} {v}: {rate:,.0f} img/s, wait {wait:.1f}%", flush=True)
    ceiling = statistics.median(rate for rate, _ in results["ceiling"])
    print("\n| variant | images/s | of ceiling | data wait % | CPU ms per batch by thread |\n|---|---|---|---|---|")
    for v in chosen:
        rate = statistics.median(r for r, _ in results[v])
        wait = statistics.median(w for _, w in results[v])
        keys = sorted({k for use in cpu[v] for k in use})
        med = {k: statistics.median(use.get(k, 0.0) for use in cpu[v]) for k in keys}
        shown = ", ".join(f"{k} {ms:.1f}" for k, ms in sorted(med.items(), key=lambda kv: -kv[1]) if ms >= 0.5)
        print(f"| {v} | {rate:,.0f} | {rate / ceiling:.2f} | {wait:.1f} | {shown} |")


if __name__ == "__main__":
    main()
