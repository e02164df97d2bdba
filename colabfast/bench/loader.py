"""CPU loader overhead on one mirror: ``colabfast.DataLoader`` against a hand-tuned and a default
``torch.utils.data.DataLoader``, all yielding ImageNet-normalised float32 batches.

The torch loaders normalise in the main process the way users write it
(``x.float().div_(255).sub_(mean).div_(std)``); colabfast's does it in its own conversion step.
The hand-tuned loader gets colabfast's knobs by hand (workers, persistent workers, prefetch 4).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch
import torch.utils.data as tud

from colabfast import env
from colabfast.bench.timing import Result
from colabfast.datasets import H5ImageFolder
from colabfast.loading import DataLoader
from colabfast.packing import pack
from colabfast.testing import data

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


def _rates(loaders: dict[str, Iterable], epochs: int) -> dict[str, tuple[float, float, float]]:
    """(median, min, max) images/s of each loader over ``epochs`` timed epochs, after one warm-up epoch
    each; the loaders take turns epoch by epoch, so drift in the machine's speed hits all alike."""
    for loader in loaders.values():
        for _ in loader:
            pass
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(epochs):
        for name, loader in loaders.items():
            images, start = 0, time.perf_counter()
            for x, _ in loader:
                images += len(x)
            rates[name].append(images / (time.perf_counter() - start))
    return {name: (sorted(r)[len(r) // 2], min(r), max(r)) for name, r in rates.items()}


def run(size: float = 1.0, repeats: int = 3, batch_size: int = 64, num_workers: Optional[int] = None,
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
            "colabfast.DataLoader": DataLoader(ds, batch_size, shuffle=True, num_workers=workers, device="cpu",
                                               mean=MEAN, std=STD),
        }
        how = {"torch DataLoader, defaults": "num_workers=0 (torch's default)",
               "torch DataLoader, hand-tuned": f"{workers} workers, persistent, prefetch_factor=4",
               "colabfast.DataLoader": f"{workers} workers (its defaults otherwise)"}
        rows = []
        for name, (med, low, high) in _rates(loaders, repeats).items():
            # Result times are seconds per epoch; the rates are what users compare.
            rows.append(Result("loader/cpu", name, len(ds) / med, len(ds) / high, len(ds) / low, repeats,
                               {"images/s": med}, note=f"{len(ds)} images 224x224, batch {batch_size}, "
                                                           f"float32 normalised; {how[name]}"))
        return rows
