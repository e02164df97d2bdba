"""From a Drive folder to the first batch: :func:`colabfast.open_dataset` in a first and a second runtime,
against the Colab folklore cell and the hand-written stage -> pack -> stage sequence; one scenario
``open/first-batch``.

The Drive simulator (100 ms per open, 60 MB/s by default) serves ``MyDrive/photos``, an ImageFolder
tree of photo-like JPEGs (about 500x375), and ``MyDrive/photos.zip`` of it. Every measurement runs in
a new Python process with its own empty local disk and cache (``TMPDIR``, ``COLABFAST_CACHE``): a new
runtime, Drive still mounted. The simulator drops a file's cached pages at each open, so every read
of Drive goes through the simulated link. The time runs from the call (after the imports) to the
first batch of a DataLoader (batch ``batch_size``, ``CenterCrop(224)`` on uint8 tensors): for the
folklore cell a torch DataLoader with ``workers`` worker processes, for colabfast's rows
``colabfast.DataLoader`` with its defaults (the crop fused in its reader threads: no worker start).
"After the imports" holds for both sides: torchvision's ``ImageFolder`` and ``cf.open_dataset`` /
``cf.DataLoader`` (modules colabfast imports on first use) are imported before the clock starts; what
they import inside the call (h5py, the reader) is timed. colabfast's modules are compiled to bytecode
first, as ``pip install`` does: a checkout run with ``PYTHONDONTWRITEBYTECODE`` would otherwise compile
them inside the timed stretch (0.03-0.05 s of the second runtime here), which no installed copy does:

- ``colabfast.open_dataset, first runtime``: no mirror on Drive: it packs one into
  ``MyDrive/colabfast-mirrors``, flushes Drive, stages it; then ``colabfast.DataLoader``.
- ``colabfast.open_dataset, second runtime``: the mirror kept on Drive, local disk empty: it lists the
  source, finds the mirror and stages it.
- ``cp -r + ImageFolder`` and ``cp zip + unzip + ImageFolder``: the folklore cell, then torchvision's
  ImageFolder and a torch DataLoader, every runtime alike.
- ``by hand: stage -> pack -> flush -> stage``: README's step-by-step calls (a mirror
  ``MyDrive/photos.h5``), in a first and a second runtime.

The reference row is the link's limit for the mirror: its bytes at the simulator's bandwidth plus
one open; the second runtime's ``x link limit`` is its time over that (target: within 1.2x).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

from colabfast.testing import data
from colabfast.tools.bench.timing import Result

SCENARIO = "open/first-batch"
CLASSES = 10
IMAGE_SIZE = (500, 375)  # (width, height), each varied by up to 20%
FIRST, SECOND = "colabfast.open_dataset, first runtime", "colabfast.open_dataset, second runtime"
CP, UNZIP = "cp -r + ImageFolder", "cp zip + unzip + ImageFolder"
BY_HAND, BY_HAND_AGAIN = ("by hand: stage -> pack -> flush -> stage, first runtime",
                          "by hand: stage -> pack -> flush -> stage, second runtime")
METHODS = (FIRST, SECOND, CP, UNZIP, BY_HAND, BY_HAND_AGAIN)


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _compile_colabfast() -> None:
    """Write colabfast's bytecode where it is missing, as ``pip install`` does for the package it installs
    (a source checkout may lack it: ``PYTHONDONTWRITEBYTECODE``); a folder that cannot be written is left."""
    import compileall

    import colabfast

    compileall.compile_dir(Path(colabfast.__file__).parent, quiet=2)


def _runtime(method: str, drive: Path, local: Path, batch_size: int, workers: int) -> dict[str, Any]:
    """Run ``method`` in this (new) process: from the call to the first batch; returns what it measured."""
    import torch
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    import colabfast as cf

    crop = v2.CenterCrop(224)
    done: dict[str, Any] = {}

    def folklore(folder: Path) -> Any:
        dataset = ImageFolder(folder, transform=v2.Compose([v2.PILToTensor(), crop]))
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)

    open_dataset, DataLoader = cf.open_dataset, cf.DataLoader  # imported before the call, as ImageFolder is
    start = time.perf_counter()
    if method in (FIRST, SECOND):
        ds = open_dataset(drive / "photos", transform=crop, output="tensor", progress=False)
        loader = DataLoader(ds, batch_size, shuffle=True, device="cpu")  # its defaults: reader threads
        done.update(account=ds.account, staged=str(ds.path))
    elif method in (BY_HAND, BY_HAND_AGAIN):
        root = cf.stage(drive / "photos", local / "photos", progress=False)
        cf.pack(root, drive / "photos.h5", progress=False)
        cf.flush_drive(drive, quiet=True)
        staged = cf.stage(drive / "photos.h5", local / "photos.h5", progress=False)
        loader = DataLoader(cf.H5ImageFolder(staged, transform=crop, output="tensor"), batch_size, shuffle=True,
                            device="cpu")
    elif method == CP:
        subprocess.run(["cp", "-r", str(drive / "photos"), str(local / "photos")], check=True)
        loader = folklore(local / "photos")
    elif method == UNZIP:
        subprocess.run(["cp", str(drive / "photos.zip"), str(local)], check=True)
        subprocess.run(["unzip", "-q", str(local / "photos.zip"), "-d", str(local)], check=True)
        loader = folklore(local / "photos")
    else:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    done["dataset"] = time.perf_counter() - start
    batches = iter(loader)
    images, _ = next(batches)
    done["seconds"] = time.perf_counter() - start  # the batch in hand: not the iterator's shutdown (below)
    del batches  # an epoch left early waits for the batches in flight (reader threads, or torch's workers)
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224), images.shape
    return done


def _in_new_runtime(method: str, drive: Path, local: Path, batch_size: int, workers: int) -> dict[str, Any]:
    """:func:`_runtime` in a new Python process whose local disk and cache are ``local`` (emptied first)."""
    shutil.rmtree(local, ignore_errors=True)
    (local / "tmp").mkdir(parents=True)
    os.sync()  # earlier runs' writes must not be written back during this one
    environ = dict(os.environ, TMPDIR=str(local / "tmp"), COLABFAST_CACHE=str(local / "cache"))
    done = subprocess.run([sys.executable, "-m", __name__, method, str(drive), str(local), str(batch_size),
                           str(workers)], env=environ, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    staged = Path(result.get("staged", local))
    if not staged.is_relative_to(local) and staged.is_file():  # in Colab: /content or the RAM disk
        staged.unlink()
    return result


def run(size: float = 1.0, repeats: int = 3, batch_size: int = 64, workers: int = 2, drive: Optional[dict] = None,
        work: Optional[Union[str, Path]] = None) -> list[Result]:
    """Measure the time to the first batch from a folder on the Drive simulator; one scenario ``open/first-batch``.

    Args:
        size: scale: 1.0 is 2000 JPEGs of about 500x375 in 10 classes (about 110 MB).
        repeats: rounds; each runs every method once, in a new process (median reported, with min and max).
        batch_size: images in the first batch.
        workers: the folklore cell's DataLoader worker processes (2: Colab); colabfast's loader chooses.
        drive: simulator settings over :class:`~colabfast.drivesim.fs.DriveSimParams`' defaults (100 ms
            per open, 2 ms per read, 60 MB/s).
        work: where to put the data (default: a temp folder).

    Returns:
        One row per method (seconds to the first batch; ``MB``: what it read from Drive's data) and the
        link's limit for the mirror as a reference row; the second runtime's row has ``x link limit``.
        Or one row saying why the simulator cannot run.
    """
    from colabfast.drivesim.fs import DriveSimParams, available
    from colabfast.drivesim.simulator import DriveSim
    from colabfast.where.env import MIRRORS_FOLDER

    ok, why = available()
    if not ok:
        return [Result(SCENARIO, "every method", None, note=f"Drive simulator unavailable: {why}")]
    params = DriveSimParams(**(drive or {}))
    _compile_colabfast()
    per_class = max(2, round(2000 * size / CLASSES))
    n = per_class * CLASSES
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    to_dataset: dict[str, list[float]] = {m: [] for m in METHODS}
    notes: dict[str, str] = {}
    # The runtimes' local disk is a short path in the system's temp folder whatever ``work`` is: torch's
    # DataLoader workers hung on their first batch with TMPDIR 80 characters deep (a pytest tmp_path).
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as name, \
            tempfile.TemporaryDirectory(prefix="cf-runtime-") as runtime:
        tmp, local = Path(name), Path(runtime) / "local"
        my_drive = tmp / "drive" / "MyDrive"
        src = data.make_imagefolder(my_drive / "photos", classes=CLASSES, per_class=per_class, size=IMAGE_SIZE,
                                    vary=0.2)
        source_bytes = _bytes(src)
        with zipfile.ZipFile(my_drive / "photos.zip", "w", zipfile.ZIP_STORED) as z:
            for p in sorted(src.rglob("*")):
                z.write(p, p.relative_to(my_drive).as_posix())
        with DriveSim(tmp / "drive", tmp / "mnt", params) as sim:
            mounted = sim.mountpoint / "MyDrive"
            for _ in range(repeats):  # rounds: the machine's load drifts alike for every method
                shutil.rmtree(my_drive / MIRRORS_FOLDER, ignore_errors=True)
                (my_drive / "photos.h5").unlink(missing_ok=True)
                for method in METHODS:  # each second runtime right after its first
                    result = _in_new_runtime(method, mounted, local, batch_size, workers)
                    times[method].append(result["seconds"])
                    to_dataset[method].append(result["dataset"])
                    if "account" in result:
                        notes[method] = result["account"].replace("\n", "; ").replace(str(tmp), "...") \
                            .replace(runtime, "...")
            mirror = next((my_drive / MIRRORS_FOLDER).glob("photos-*.h5")).stat().st_size
    limit = mirror / ((params.mbps or float("inf")) * 1e6) + params.open_ms / 1e3
    rows = []
    for method, ts in times.items():
        med = statistics.median(ts)
        metrics = {"images/s": n / med, "dataset s": statistics.median(to_dataset[method])}
        if method == SECOND:
            metrics["x link limit"] = med / limit
        rows.append(Result(SCENARIO, method, med, min(ts), max(ts), len(ts), metrics, note=notes.get(method, "")))
    rows.append(Result(SCENARIO, "link limit: the mirror at the link's bandwidth + one open", limit, limit, limit, 1,
                       {"images/s": n / limit, "mirror MB": mirror / 1e6}, reference=True,
                       note=f"{n} JPEGs (~{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}), {source_bytes / 1e6:.0f} MB; mirror "
                            f"{mirror / 1e6:.0f} MB; Drive simulator {params.open_ms:g} ms/open, {params.mbps:g} MB/s; "
                            f"each run a new process with an empty local disk; first batch of {batch_size}, "
                            f"{workers} workers"))
    return rows


if __name__ == "__main__":  # one runtime: METHOD DRIVE LOCAL BATCH_SIZE WORKERS; prints what it measured as JSON
    method, drive_dir, local_dir, batch, nworkers = sys.argv[1:]
    print(json.dumps(_runtime(method, Path(drive_dir), Path(local_dir), int(batch), int(nworkers))))
