"""CPU loader overhead on one mirror: ``colabfast.DataLoader`` against a hand-tuned and a default
``torch.utils.data.DataLoader``, all yielding ImageNet-normalised float32 batches.

The torch loaders normalise in the main process the way users write it
(``x.float().div_(255).sub_(mean).div_(std)``); colabfast's does it in its own conversion step.
The hand-tuned loader gets colabfast's knobs by hand (workers, persistent workers, prefetch 4).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch
import torch.utils.data as tud

from colabfast.datasets.dropins import H5ImageFolder
from colabfast.loading.loader import DataLoader
from colabfast.packing import pack
from colabfast.testing import data
from colabfast.tools.bench.timing import Result, Spread, usage
from colabfast.where import env

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class _Normalized:
    """A plain loader's batches normalised in the main process, as a training loop would."""

    def __init__(self, loader: tud.DataLoader) -> None:
        self.loader = loader
        self.mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        self.std = torch.tensor(STD).view(1, 3, 1, 1)

    def __iter__(self) -> Iterator:
        for x, y in self.loader:
            yield x.float().div_(255).sub_(self.mean).div_(self.std), y


@dataclasses.dataclass(frozen=True)
class Rates:
    """One loader's repeats (:func:`_rates`): images/s, and CPU milliseconds per image of the whole
    process tree (:func:`colabfast.tools.bench.timing.usage`), each as median, min and max."""

    rate: Spread
    cost: Spread

    def metrics(self) -> dict[str, float]:
        """The row's metrics: ``images/s`` and ``CPU ms/img`` (medians)."""
        return {"images/s": self.rate.median, "CPU ms/img": self.cost.median}

    def note(self) -> str:
        """The ranges, for a row's note."""
        return (f"images/s min-max {self.rate.low:.0f}-{self.rate.high:.0f}, CPU ms/img min-max "
                f"{self.cost.low:.3g}-{self.cost.high:.3g}")


def _rates(loaders: dict[str, Iterable], epochs: int, min_seconds: float = 0.0) -> dict[str, Rates]:
    """Each loader's images/s and CPU milliseconds per image over ``epochs`` timed repeats, after one
    warm-up epoch each; the loaders take turns repeat by repeat, so drift in the machine's speed hits
    all alike. A repeat runs whole epochs until it has lasted ``min_seconds`` (short epochs are mostly
    noise). CPU is the whole process tree's (threads, worker processes) over the repeat."""
    for loader in loaders.values():
        for _ in loader:
            pass
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    costs: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(epochs):
        for name, loader in loaders.items():
            images, start = 0, usage()
            while True:
                for x, _ in loader:
                    images += len(x)
                if time.perf_counter() - start.wall >= min_seconds:
                    break
            spent = usage() - start
            rates[name].append(images / spent.wall)
            costs[name].append(spent.cpu / images * 1e3)
    return {name: Rates(Spread.of(rates[name]), Spread.of(costs[name])) for name in loaders}


def ratios(row: Rates, base: Rates, key: str) -> dict[str, float]:
    """``row`` against ``base`` measured in the same run: ``key`` its images/s over ``base``'s, and
    ``key + " by CPU"`` ``base``'s CPU per image over its own (above 1: ``row`` costs less)."""
    return {key: row.rate.median / base.rate.median, f"{key} by CPU": base.cost.median / row.cost.median}


def run(size: float = 1.0, repeats: int = 4, batch_size: int = 64, num_workers: Optional[int] = None,
        work: Optional[Path] = None) -> list[Result]:
    """Images/s of each loader over the same encoded mirror (224x224 JPEGs), CPU only.

    Args:
        size: 1.0 is 4000 images.
        repeats: timed epochs per loader (median, min, max), after one warm-up epoch.
    """
    workers = env.cpu_count() if num_workers is None else num_workers
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as tmp:
        tmp = Path(tmp)
        n = max(4 * batch_size, int(4000 * size))
        src = data.make_imagefolder(tmp / "src", classes=10, per_class=n // 10, size=(256, 256))
        mirror = pack(src, tmp / "mirror.h5", image_size=(224, 224), progress=False)
        ds = H5ImageFolder(mirror, output="tensor")
        loaders = {
            "torch DataLoader, defaults": _Normalized(tud.DataLoader(ds, batch_size, shuffle=True)),
            "torch DataLoader, hand-tuned": _Normalized(tud.DataLoader(
                ds, batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                prefetch_factor=4 if workers else None)),
            "colabfast.DataLoader, its defaults": DataLoader(ds, batch_size, shuffle=True, device="cpu", mean=MEAN,
                                                             std=STD),
            "colabfast.DataLoader, worker processes": DataLoader(ds, batch_size, shuffle=True, num_workers=workers,
                                                                 device="cpu", mean=MEAN, std=STD),
        }
        how = {"torch DataLoader, defaults": "num_workers=0 (torch's default)",
               "torch DataLoader, hand-tuned": f"{workers} workers, persistent, prefetch_factor=4",
               "colabfast.DataLoader, its defaults": "reader threads (colabfast.loading.reader), as a mirror gets them",
               "colabfast.DataLoader, worker processes": f"num_workers={workers} (its defaults otherwise)"}
        rows = []
        for name, r in _rates(loaders, repeats).items():
            # Result times are seconds per epoch; the rates are what users compare.
            rows.append(Result("loader/cpu", name, len(ds) / r.rate.median, len(ds) / r.rate.high,
                               len(ds) / r.rate.low, repeats, r.metrics(),
                               note=f"{len(ds)} images 224x224, batch {batch_size}, float32 normalised; {how[name]}; "
                                    f"{r.note()}"))
        return rows


def _memcpy_bound(ds: H5ImageFolder, blob: torch.Tensor, batch_size: int) -> Iterator:
    """Each batch's stored bytes copied from a preloaded array (``blob``) into one reused batch buffer:
    the least any reader of this mirror must do (no file reads, no decoding, no fresh pages)."""
    offsets = ds.reader.offsets
    starts = range(0, len(ds), batch_size)
    largest = max(int(offsets[min(s + batch_size, len(ds))] - offsets[s]) for s in starts)
    buffer = torch.empty(largest, dtype=torch.uint8)
    for start in starts:
        end = min(start + batch_size, len(ds))
        out = buffer[: int(offsets[end] - offsets[start])]
        out.copy_(blob[int(offsets[start]) : int(offsets[end])])
        yield out, end - start


def _load(ds: H5ImageFolder):
    import numpy as np

    out = np.empty(int(ds.reader.offsets[-1]), dtype=np.uint8)
    ds.reader.read_into(out, 0)
    return out


class _Counted:
    """Yields (anything with len == images in the batch, _) pairs from a loader or a generator."""

    def __init__(self, make) -> None:
        self.make = make

    def __iter__(self) -> Iterator:
        for batch in self.make():
            images = batch[0]
            yield (range(batch[1]) if isinstance(images, torch.Tensor) and images.dim() == 1 else images), None


def _reader_loaders(ds: H5ImageFolder, workers: int, batch_size: int,
                    layout: Optional[torch.memory_format]) -> dict[str, Iterable]:
    """The three ways of reading ``ds`` that ``run_reader`` compares (FFCV, where installed, is added
    there)."""
    from colabfast.loading.collate import collate
    from colabfast.loading.loader import _Prepared
    from colabfast.loading.reader import BatchReader

    blob = torch.from_numpy(_load(ds))
    bound = _Counted(lambda: _memcpy_bound(ds, blob, batch_size))
    if ds.output == "bytes":
        sampler = tud.BatchSampler(tud.SequentialSampler(ds), batch_size, False)
        reader = BatchReader(ds, threads=workers)
        prepared = _Prepared(ds, keep_jpeg=True, transform=None)
        torch_loader = tud.DataLoader(prepared, batch_size, num_workers=workers, collate_fn=collate,
                                      persistent_workers=True, prefetch_factor=4)
        threads: Iterable = _Counted(lambda: ((b[0].data, len(b[0])) for b in reader.batches(sampler)))
        procs: Iterable = _Counted(lambda: ((b[0].data, len(b[0])) for b in torch_loader))
    else:  # channels_last: the batch as stored (HWC), as FFCV's ToTorchImage(channels_last=True) gives
        threads = DataLoader(ds, batch_size, device="cpu", memory_format=layout)
        procs = DataLoader(ds, batch_size, num_workers=workers, device="cpu", memory_format=layout)
    return {"reader threads": threads, f"{workers} worker processes": procs, "memcpy bound": bound}


def run_reader(size: float = 1.0, repeats: int = 5, batch_size: int = 64, work: Optional[Path] = None,
               min_seconds: float = 3.0) -> list[Result]:
    """Batch reading of mirrors as they sit on local disk (issue 12): ``colabfast.DataLoader``'s reader
    threads against its worker processes (``num_workers`` = CPUs), the memcpy bound of the batch
    bytes (copied into one reused buffer) and, where installed, FFCV reading the same images from its
    own file with as many threads; uint8 batches, no normalisation, no crop.

    Cases: raw pixels 256x256, JPEGs 256x256, JPEGs 500x375 decoded to tensors (each in contiguous
    ``[B, 3, H, W]`` batches and channels-last ones, FFCV's ``ToTorchImage`` layout, where the FFCV
    rows go: raw against ``write_mode="raw"``, JPEG against ``"jpg"``), and the bytes-only hand-over
    of ``decode="gpu"`` (the reader's packed batches vs the workers' collated ones). Methods take
    turns repeat by repeat (median, min, max of ``repeats``; a repeat is whole epochs lasting at least
    ``min_seconds``), each case on its own mirror.
    """
    from torchvision.datasets.folder import make_dataset

    from colabfast.tools.bench.peers import FFCV_JPG, FFCV_RAW

    workers = env.cpu_count()
    ffcv_missing = FFCV_RAW.missing()
    rows = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as folder:
        tmp = Path(folder)
        n = max(4 * batch_size, int(2000 * size))
        src256 = data.make_imagefolder(tmp / "s256", classes=10, per_class=n // 10, size=(256, 256))
        src500 = data.make_imagefolder(tmp / "s500", classes=10, per_class=n // 10, size=(500, 375))
        cases = {
            "raw 256px": (pack(src256, tmp / "raw.h5", store="raw", progress=False), "tensor"),
            "raw 256px, channels_last": (tmp / "raw.h5", "tensor"),
            "JPEG 256px": (pack(src256, tmp / "jpg.h5", progress=False), "tensor"),
            "JPEG 256px, channels_last": (tmp / "jpg.h5", "tensor"),
            "JPEG 500x375": (pack(src500, tmp / "jpg500.h5", progress=False), "tensor"),
            "JPEG 500x375, channels_last": (tmp / "jpg500.h5", "tensor"),
            "JPEG bytes 256px (decode='gpu' hand-over)": (tmp / "jpg.h5", "bytes"),
        }
        # FFCV's own files from the same source images, for the channels-last cases.
        ffcv = {"raw 256px, channels_last": (FFCV_RAW, src256, (256, 256), tmp / "ffcv-raw256"),
                "JPEG 256px, channels_last": (FFCV_JPG, src256, (256, 256), tmp / "ffcv-jpg256"),
                "JPEG 500x375, channels_last": (FFCV_JPG, src500, (500, 375), tmp / "ffcv-jpg500")}
        for case, (mirror, output) in cases.items():
            ds = H5ImageFolder(mirror, output=output)
            layout = torch.channels_last if "channels_last" in case else None
            loaders = _reader_loaders(ds, workers, batch_size, layout)
            peer_note = ""
            if case in ffcv and not ffcv_missing:
                peer, src, image_size, out = ffcv[case]
                classes = sorted(p.name for p in src.iterdir())
                samples = make_dataset(str(src), {c: i for i, c in enumerate(classes)}, extensions=(".jpeg", ".jpg"))
                peer.prepare(samples, out, image_size, workers)
                loaders[peer.name] = peer.loader(out, None, batch_size, workers, None)
                peer_note = f"; {peer.name} {peer.version()}, {workers} threads, {peer.note}"
            elif case in ffcv:
                peer_note = f"; FFCV {ffcv_missing}"
            rates = _rates(loaders, repeats, min_seconds)
            bound, procs = rates["memcpy bound"], rates[f"{workers} worker processes"]
            peer = next((r for name, r in rates.items() if name.startswith("FFCV")), None)
            for name, r in rates.items():
                metrics = {**r.metrics(), "of memcpy bound": r.rate.median / bound.rate.median,
                           **ratios(r, procs, "x worker processes")}
                if peer:
                    metrics.update(ratios(r, peer, "x FFCV"))
                about = peer_note if name.startswith("FFCV") or (name == "reader threads" and not peer) else ""
                rows.append(Result("loader/reader", f"{case}: {name}", len(ds) / r.rate.median, len(ds) / r.rate.high,
                                   len(ds) / r.rate.low, repeats, metrics, reference=name == "memcpy bound",
                                   note=f"{len(ds)} images, batch {batch_size}, local disk (page cache); "
                                        f"{r.note()}{about}"))
    return rows
