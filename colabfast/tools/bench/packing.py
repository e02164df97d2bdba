"""Pack throughput and mirror size per store mode: :func:`colabfast.pack` of an ImageNet-style tree of
real JPEGs (500x375, ImageNet's average) from local disk, as it is (``encoded``, ``raw``) and resized to
a 256 px short side at pack time (how ImageNet fits Colab's disk).

Each row reports images/s, MB/s of source JPEGs consumed, the mirror's size, and that size as a
multiple of the source's. The peers' own preparation times and sizes are in the epoch scenario.

``pack/archive`` packs ``ILSVRC2012_img_train.tar``'s layout (a tar of per-class tars) straight from
the Drive simulator and compares it with the lower of its two bounds, both measured in the same run:
the link (the simulator's bandwidth, in images/s at the archive's bytes per image) and the decode +
resize rate of ``workers`` processes on the same images already in memory. It also reports the peak
local disk use (sampled) against the mirror's and the archive's sizes.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Optional, Sequence, Union

import psutil

from colabfast.testing import data
from colabfast.tools.bench.timing import Result, measure
from colabfast.where import env

IMAGE_SIZE = (500, 375)  # (width, height)
CLASSES = 10
# (store, image_size) per row: as stored, and pre-resized to a 256 px short side.
MODES: tuple[tuple[str, Optional[int]], ...] = (("encoded", None), ("raw", None), ("encoded", 256), ("raw", 256))


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(size: float = 1.0, repeats: int = 3, modes: Sequence[tuple[str, Optional[int]]] = MODES,
        workers: Optional[int] = None, work: Optional[Union[str, Path]] = None) -> list[Result]:
    """Measure :func:`colabfast.pack` per store mode; one scenario ``pack/500x375``.

    Args:
        size: scale: 1.0 is 2000 JPEGs of 500x375 (about 120 MB).
        repeats: packs per mode (median reported, with min and max); each starts from nothing.
        modes: ``(store, image_size)`` pairs, see :data:`MODES`.
        workers: pack's decoding processes (default: the CPU count).
        work: where to put the data (default: a temp folder).

    Returns:
        Rows with ``images/s``, ``MB/s`` (source bytes per second), ``mirror MB`` and ``x source``.
    """
    from colabfast.packing import pack

    workers = env.cpu_count() if workers is None else workers
    per_class = max(2, round(2000 * size / CLASSES))
    n = per_class * CLASSES
    scenario = f"pack/{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}"
    rows = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as name:
        tmp = Path(name)
        src = data.make_imagefolder(tmp / "imagefolder", classes=CLASSES, per_class=per_class, size=IMAGE_SIZE)
        source_bytes = _bytes(src)
        out = tmp / "out"
        dst = out / "mirror.h5"
        for store, image_size in modes:
            method = f"colabfast.pack store={store!r}" + (f", image_size={image_size}" if image_size else "")

            def once(store: str = store, image_size: Optional[int] = image_size) -> None:
                pack(src, dst, store=store, image_size=image_size, workers=workers, progress=False)

            med, low, high = measure(once, repeats, setup=lambda: shutil.rmtree(out, ignore_errors=True))
            mirror = dst.stat().st_size
            note = f"{n} JPEGs, {source_bytes / 1e6:.0f} MB"
            if image_size:
                note += f"; resized to a {image_size} px short side"
                note += ", re-encoded as JPEG q90" if store == "encoded" else ""
            rows.append(Result(scenario, method, med, low, high, repeats, {
                "images/s": n / med, "MB/s": source_bytes / med / 1e6, "mirror MB": mirror / 1e6,
                "x source": mirror / source_bytes,
            }, note=note))
        shutil.rmtree(out, ignore_errors=True)
    return rows


def _peak_bytes(folder: Path, stop: threading.Event, peak: list[int]) -> None:
    """Sample the disk the files under ``folder`` take (allocated blocks: the mirror being built is
    sparse until its images are moved in) every 50 ms until ``stop``, and once more after it, into
    ``peak[0]``."""
    while True:
        done = stop.is_set()
        with contextlib.suppress(OSError):  # a part renamed or deleted while listed
            peak[0] = max(peak[0], sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file()))
        if done:
            return
        time.sleep(0.05)


def run_archive(size: float = 1.0, repeats: int = 3, workers: int = 2, image_size: int = 256,
                work: Optional[Union[str, Path]] = None) -> list[Result]:
    """Pack a tar of per-class tars from the Drive simulator; one scenario ``pack/archive``.

    Args:
        size: scale: 1.0 is 10 classes x 600 JPEGs of about 500x375 (about 330 MB, some 9 s of packing
            on 2 CPUs: a pack's fixed costs, its first read from Drive and writing the mirror, weigh
            about 0.15 of the rate in a 3 s run, and nothing in the hours ImageNet takes).
        repeats: repeats of each measurement, interleaved (median reported).
        workers: pack's decoding processes, and the processes of the decode + resize bound (2: Colab).
        image_size: the short side images are resized to (and re-encoded as JPEG q90).
        work: where to put the data (default: a temp folder).

    Returns:
        Rows: the pack (``images/s``, ``archive MB/s``, ``x bound``, ``peak disk MB``), and the two
        bounds as reference rows; or one row saying why the simulator cannot run.
    """
    from colabfast.drivesim.fs import DriveSimParams, available
    from colabfast.drivesim.simulator import DriveSim
    from colabfast.packing import pack
    from colabfast.packing.archivesource import ArchiveSource
    from colabfast.packing.folders import _encode_chunk
    from colabfast.testing.imagenet_archives import make_train_tar

    scenario = "pack/archive"
    ok, why = available()
    if not ok:
        return [Result(scenario, "colabfast.pack", None, note=f"Drive simulator unavailable: {why}")]
    drive = DriveSimParams()  # Drive's figures: 100 ms per open, 60 MB/s
    per_class = max(2, round(600 * size))
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as name:
        tmp = Path(name)
        archive = make_train_tar(tmp / "drive" / "ILSVRC2012_img_train.tar", classes=CLASSES, per_class=per_class,
                                 size=IMAGE_SIZE)
        nbytes = archive.stat().st_size
        images = [data for _, data, _ in ArchiveSource(archive).images()]
        n = len(images)
        chunks = [images[k : k + 64] for k in range(0, n, 64)]
        out = tmp / "out"
        times: dict[str, list[float]] = {"pack": [], "cpu": [], "server": []}
        peak = [0]
        with DriveSim(tmp / "drive", tmp / "mnt", drive) as sim, \
                ProcessPoolExecutor(workers) as pool:
            server = psutil.Process(sim.pid)
            list(pool.map(int, range(workers)))  # started before timing
            for _ in range(repeats):  # interleaved: the machine's load drifts alike for both
                start = time.perf_counter()
                list(pool.map(_encode_chunk, chunks, repeat("encoded"), repeat(image_size), repeat(90)))
                times["cpu"].append(time.perf_counter() - start)
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                stop = threading.Event()
                watcher = threading.Thread(target=_peak_bytes, args=(out, stop, peak))
                watcher.start()
                start, busy = time.perf_counter(), sum(server.cpu_times()[:2])
                pack(sim.mountpoint / archive.name, out / "train.h5", image_size=image_size, workers=workers,
                     progress=False)
                times["pack"].append(time.perf_counter() - start)
                times["server"].append(sum(server.cpu_times()[:2]) - busy)
                stop.set()
                watcher.join()
            mirror = (out / "train.h5").stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    bandwidth = (drive.mbps or float("inf")) * 1e6  # bytes/s
    link = bandwidth / (nbytes / n)  # images/s the link carries
    cpu = n / med["cpu"]
    bound, which = (link, "link") if link <= cpu else (cpu, f"decode+resize on {workers} CPUs")
    rate = n / med["pack"]
    # The simulator is a Python FUSE server on the same CPUs (a real Drive client is a process on the
    # VM too): its share of the CPUs is not there for decoding, which the bound's run did not pay.
    share = min(0.99, med["server"] / med["pack"] / workers)
    note = (f"{n} JPEGs (~{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}) in {CLASSES} class tars, {nbytes / 1e6:.0f} MB archive on "
            f"the Drive simulator ({drive.open_ms:.0f} ms/open, {drive.mbps} MB/s); resized to "
            f"{image_size} px, JPEG q90; bound = {which}; the simulator used {share:.0%} of the {workers} CPUs")
    cpu_left = min(link, cpu * (1 - share))
    return [
        Result(scenario, f"colabfast.pack(archive), {workers} workers", med["pack"], min(times["pack"]),
               max(times["pack"]), repeats, {"images/s": rate, "archive MB/s": nbytes / med["pack"] / 1e6,
                                             "x bound": rate / bound, "simulator CPU %": 100 * share,
                                             "x bound, CPU left": rate / cpu_left, "peak disk MB": peak[0] / 1e6,
                                             "mirror MB": mirror / 1e6, "archive MB": nbytes / 1e6}, note=note),
        Result(scenario, f"bound: decode+resize, {workers} processes, bytes in memory", med["cpu"],
               min(times["cpu"]), max(times["cpu"]), repeats, {"images/s": cpu}, reference=True),
        Result(scenario, "bound: link bandwidth", nbytes / bandwidth, nbytes / bandwidth, nbytes / bandwidth, 1,
               {"images/s": link}, note="computed: the archive's bytes at the simulator's bandwidth", reference=True),
    ]
