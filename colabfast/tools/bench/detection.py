"""A COCO-style detection dataset: reading its mirror against ``torchvision.datasets.CocoDetection``
on the same folder, locally and cold from the Drive simulator, and packing it against the decode
bound. Three scenarios, each measured in one run, its methods taking turns round by round so that
the machine's load drifts alike for all:

- ``detection/read``: one full pass over the dataset, images as uint8 ``[C, H, W]`` tensors and
  targets as COCO's lists of annotation dicts, from local disk (the files in the page cache, as
  after staging): :class:`colabfast.H5CocoDetection` with ``output="tensor"``, item by item and
  through :class:`colabfast.DataLoader` (its defaults: its reader threads read whole batches,
  images of different sizes as a list, targets per sample), against ``CocoDetection`` with ``v2.PILToTensor()``, item by
  item and through a torch ``DataLoader`` with ``workers`` worker processes (the tuned baseline).
- ``detection/drive``: the same pass with the data on the Drive simulator (100 ms per open, 60 MB/s
  by default), cold: what :func:`colabfast.open_dataset` does with a mirror on Drive (stage it to
  local disk, then read it) against ``CocoDetection`` reading the folder on the mount through a
  torch ``DataLoader`` with ``workers`` workers. The simulator drops a file's cached pages at each
  open, so every run reads through the simulated link.
- ``detection/pack``: ``colabfast.pack(folder, layout="coco")`` with ``workers`` processes against
  the decode bound: decoding every image fully as torchvision's datasets do (PIL,
  ``convert("RGB")``) in ``workers`` processes, the files' bytes already in memory. (Pack checks a
  JPEG it keeps by decoding it at 1/8 scale, which reads all its entropy-coded data for less:
  :func:`colabfast.mirror.encoding.encode_image`.)

Run pinned to 2 CPUs, as Colab has: ``taskset -c 0,1 colabfast bench detection``.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional, Union

from colabfast.tools.bench.timing import Result

READ, DRIVE, PACK = "detection/read", "detection/drive", "detection/pack"
IMAGE_SIZE = (500, 375)  # (width, height), each varied by up to 20%
BATCH = 16  # images per batch: detection models train on small batches
H5_ITEMS = "colabfast H5CocoDetection(output='tensor'), item by item"
H5_LOADER = "colabfast H5CocoDetection(output='tensor') + colabfast.DataLoader"
TV_ITEMS = "torchvision CocoDetection + v2.PILToTensor, item by item"
TV_LOADER = "torchvision CocoDetection + v2.PILToTensor + torch DataLoader"
STAGED = "colabfast: stage the mirror, then H5CocoDetection + colabfast.DataLoader"
ON_DRIVE = "torchvision CocoDetection on the Drive mount + torch DataLoader"


def as_lists(batch: list) -> tuple:
    """A collate that keeps a batch's images and targets as lists (tuples), as detection needs."""
    return tuple(zip(*batch))


def _pass(samples: Any) -> int:
    """Go through an iterable of ``(image, target)`` items or batches of them; the images seen."""
    import torch

    seen = 0
    for images, targets in samples:
        if isinstance(images, torch.Tensor):  # one item
            images, targets = [images], [targets]
        assert len(images) == len(targets) and all(i.dtype == torch.uint8 and i.ndim == 3 for i in images)
        seen += len(images)
    return seen


def _decode(chunk: list[bytes]) -> int:
    """Decode each encoded image in ``chunk`` to RGB pixels, as pack checks them; how many."""
    from PIL import Image

    for data in chunk:
        with Image.open(io.BytesIO(data)) as img:
            img.convert("RGB")
    return len(chunk)


def _rounds(methods: dict[str, Callable[[], int]], repeats: int, n: int,
            setup: Optional[Callable[[str], Any]] = None) -> dict[str, list[float]]:
    """Time each method ``repeats`` times, the methods taking turns round by round; each run must
    see ``n`` images. ``setup(method)`` runs untimed before each run."""
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(repeats):
        for name, fn in methods.items():
            if setup is not None:
                setup(name)
            start = time.perf_counter()
            seen = fn()
            times[name].append(time.perf_counter() - start)
            if seen != n:
                raise RuntimeError(f"{name}: saw {seen} images, expected {n}")
    return times


def _row(scenario: str, method: str, ts: list[float], n: int, note: str = "", **metrics: float) -> Result:
    med = statistics.median(ts)
    return Result(scenario, method, med, min(ts), max(ts), len(ts), {"images/s": n / med, **metrics}, note=note)


def _with_ratio(rows: list[Result], baseline: str, label: str) -> list[Result]:
    """Add ``label``: each colabfast row's images/s over the ``baseline`` row's, to the colabfast rows."""
    base = next(r for r in rows if r.method == baseline)
    for r in rows:
        if r.method.startswith("colabfast"):
            r.metrics[label] = r.metrics["images/s"] / base.metrics["images/s"]
    return rows


def run(size: float = 1.0, repeats: int = 3, workers: int = 2, drive: Optional[dict] = None,
        work: Optional[Union[str, Path]] = None) -> list[Result]:
    """Measure reading, cold reading from Drive and packing of a COCO-style detection folder.

    Args:
        size: scale: 1.0 is 2000 photo-like JPEGs of about 500x375 (about 110 MB) with 0 to 8
            annotated objects each (:func:`colabfast.testing.layouts.make_coco`).
        repeats: runs of each method (median reported, with min and max), in rounds. The Drive
            baseline runs once: it is bound by the simulator's per-open latency, and takes minutes
            at full size.
        workers: worker processes of every DataLoader that takes them, pack's processes and the
            decode bound's (2: Colab's CPUs).
        drive: simulator settings over :class:`~colabfast.drivesim.fs.DriveSimParams`' defaults (100 ms
            per open, 2 ms per read, 60 MB/s).
        work: where to put the data (default: a temp folder).

    Returns:
        Rows of the scenarios ``detection/pack``, ``detection/read`` and ``detection/drive`` (or one
        row saying why the simulator cannot run), each with ``images/s``; colabfast's rows carry
        their ratio to the baseline (``x CocoDetection``, ``x decode bound``).
    """
    from colabfast.testing.layouts import make_coco

    n = max(2 * BATCH, round(2000 * size))
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as name:
        tmp = Path(name)
        folder = tmp / "drive" / "coco"
        ann = make_coco(folder, n, size=IMAGE_SIZE, vary=0.2)
        source_mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        note = (f"{n} JPEGs (~{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}), {source_mb:.0f} MB, 0-8 objects each "
                f"(colabfast.testing.layouts.make_coco); batches of {BATCH}, {workers} workers")
        mirror = tmp / "drive" / "coco.h5"
        rows = _pack(folder, mirror, n, repeats, workers, note)
        rows += _read(folder, ann, mirror, n, repeats, workers, note)
        rows += _drive(tmp, folder, ann, mirror, n, repeats, workers, drive or {}, note)
    return rows


def _pack(folder: Path, mirror: Path, n: int, repeats: int, workers: int, note: str) -> list[Result]:
    """``detection/pack``: pack's images/s against the decode bound; leaves the mirror at ``mirror``."""
    from colabfast.packing import pack

    images = [p.read_bytes() for p in sorted(folder.glob("*.jpg"))]
    chunks = [images[k : k + 64] for k in range(0, len(images), 64)]
    out = mirror.parent / "packs"

    def packed() -> int:
        shutil.rmtree(out, ignore_errors=True)  # each pack from nothing (in the timing: a few ms)
        pack(folder, out / "coco.h5", layout="coco", workers=workers, progress=False)
        return n

    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(int, range(workers)))  # started before timing
        methods = {
            f"colabfast.pack(folder, layout='coco'), {workers} workers": packed,
            f"bound: PIL decode + convert('RGB'), {workers} processes, bytes in memory": lambda: sum(
                pool.map(_decode, chunks)),
        }
        times = _rounds(methods, repeats, n)
    (out / "coco.h5").rename(mirror)
    shutil.rmtree(out, ignore_errors=True)
    (ours, ours_t), (bound, bound_t) = times.items()
    rows = [_row(PACK, ours, ours_t, n, note=note, **{"mirror MB": mirror.stat().st_size / 1e6}),
            _row(PACK, bound, bound_t, n)]
    rows[1].reference = True
    rows[0].metrics["x decode bound"] = rows[0].metrics["images/s"] / rows[1].metrics["images/s"]
    return rows


def _read(folder: Path, ann: Path, mirror: Path, n: int, repeats: int, workers: int, note: str) -> list[Result]:
    """``detection/read``: a full pass over the mirror and over the folder, from local disk."""
    import torch
    from torchvision.datasets import CocoDetection
    from torchvision.transforms import v2

    import colabfast as cf

    def h5_items() -> int:
        ds = cf.H5CocoDetection(mirror, output="tensor")
        return _pass(ds[i] for i in range(len(ds)))

    def h5_loader() -> int:
        ds = cf.H5CocoDetection(mirror, output="tensor")
        return _pass(cf.DataLoader(ds, BATCH, device="cpu"))  # its defaults: the reader threads

    def coco() -> CocoDetection:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools' "loading annotations into memory..."
            return CocoDetection(str(folder), str(ann), transform=v2.PILToTensor())

    def tv_items() -> int:
        ds = coco()
        return _pass(ds[i] for i in range(len(ds)))

    def tv_loader() -> int:
        return _pass(torch.utils.data.DataLoader(coco(), BATCH, num_workers=workers, collate_fn=as_lists))

    methods = {H5_ITEMS: h5_items, H5_LOADER: h5_loader, TV_ITEMS: tv_items, TV_LOADER: tv_loader}
    for fn in methods.values():  # untimed: the files into the page cache, the imports done
        fn()
    times = _rounds(methods, repeats, n)
    rows = [_row(READ, m, ts, n, note=note if m == H5_ITEMS else "") for m, ts in times.items()]
    return _with_ratio(_with_ratio(rows, TV_ITEMS, "x CocoDetection item by item"), TV_LOADER,
                       "x CocoDetection + DataLoader")


def _drive(tmp: Path, folder: Path, ann: Path, mirror: Path, n: int, repeats: int, workers: int,
           settings: dict, note: str) -> list[Result]:
    """``detection/drive``: from the Drive simulator, cold: stage the mirror and read it, against
    CocoDetection reading the folder on the mount."""
    import torch
    from torchvision.datasets import CocoDetection
    from torchvision.transforms import v2

    import colabfast as cf
    from colabfast.drivesim.fs import DriveSimParams, available
    from colabfast.drivesim.simulator import DriveSim

    ok, why = available()
    if not ok:
        return [Result(DRIVE, "every method", None, note=f"Drive simulator unavailable: {why}")]
    params = DriveSimParams(**settings)
    local = tmp / "local"
    with DriveSim(tmp / "drive", tmp / "mnt", params) as sim:
        on_drive = sim.mountpoint

        def staged() -> int:
            path = cf.stage(on_drive / mirror.name, local / mirror.name, progress=False)
            ds = cf.H5CocoDetection(path, output="tensor")
            return _pass(cf.DataLoader(ds, BATCH, device="cpu"))  # its defaults: the reader threads

        def mounted() -> int:
            with contextlib.redirect_stdout(io.StringIO()):
                ds = CocoDetection(str(on_drive / folder.name), str(on_drive / folder.name / ann.name),
                                   transform=v2.PILToTensor())
            return _pass(torch.utils.data.DataLoader(ds, BATCH, num_workers=workers, collate_fn=as_lists))

        def setup(_: str) -> None:
            shutil.rmtree(local, ignore_errors=True)
            local.mkdir()

        times = _rounds({STAGED: staged}, repeats, n, setup=setup)
        times |= _rounds({ON_DRIVE: mounted}, 1, n, setup=setup)
    shutil.rmtree(local, ignore_errors=True)
    link = (f"Drive simulator {params.open_ms:g} ms/open, {params.read_ms:g} ms/read, {params.mbps:g} MB/s; "
            f"mirror {mirror.stat().st_size / 1e6:.0f} MB; cold: the simulator drops cached pages at each open")
    rows = [_row(DRIVE, STAGED, times[STAGED], n, note=link),
            _row(DRIVE, ON_DRIVE, times[ON_DRIVE], n, note="1 run: bound by the per-open latency")]
    return _with_ratio(rows, ON_DRIVE, "x CocoDetection on Drive")
