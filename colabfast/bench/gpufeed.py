"""GPU feed: does training wait for data? ResNet-18 training steps (AMP, channels-last, SGD) fed from
one encoded mirror of 256 px JPEGs, centre-cropped to 224 and ImageNet-normalised, by

- a plain ``torch.utils.data.DataLoader`` (torchvision's reference recipe: float conversion and
  normalisation in the workers, ``pin_memory=True``, ``.to(device, non_blocking=True)`` in the loop);
- an apex-style prefetcher (NVIDIA apex ``examples/imagenet`` ``data_prefetcher``: uint8 collate, copy
  and normalise on a side CUDA stream one batch ahead);
- ``colabfast.DataLoader`` with JPEGs decoded in the CPU workers;
- ``colabfast.DataLoader`` with JPEGs decoded on the GPU (nvJPEG, ``decode="gpu"``).

Every loader has the same batch size and ``num_workers``. :func:`colabfast.diagnose` times each step
(the wait for the next batch, then the step with its GPU work synchronised) and the loader alone.
Runs only where torch sees a CUDA GPU; elsewhere each row says so.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import torch

from colabfast import env
from colabfast.bench.timing import Result
from colabfast.testing import data

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_SIZE = (256, 256)
CROP = 224
CLASSES = 10
SCENARIO = "gpu/resnet18"
METHODS = (
    "plain DataLoader (normalise in workers)",
    "apex-style prefetcher (uint8, side stream)",
    "colabfast.DataLoader (CPU decode)",
    "colabfast.DataLoader (GPU decode)",
)


def fast_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """apex's ``fast_collate``: images stay uint8, stacked ``[B, 3, H, W]``; labels int64 ``[B]``."""
    return torch.stack([image for image, _ in batch]), torch.tensor([label for _, label in batch])


class ApexPrefetcher:
    """NVIDIA apex's ``data_prefetcher`` (examples/imagenet/main_amp.py) made re-iterable: each epoch
    gets a new side stream, as apex makes one per prefetcher; copies and normalises the next uint8
    batch there while the current one trains, and ``record_stream``s what it hands out."""

    def __init__(self, loader: Iterable) -> None:
        self.loader = loader
        self.dataset = getattr(loader, "dataset", None)  # for diagnose()'s report of where data lives
        self.mean = torch.tensor([m * 255 for m in MEAN], device="cuda").view(1, 3, 1, 1)
        self.std = torch.tensor([s * 255 for s in STD], device="cuda").view(1, 3, 1, 1)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        stream = torch.cuda.Stream()
        batches = iter(self.loader)

        def preload() -> Optional[tuple[torch.Tensor, torch.Tensor]]:
            try:
                x, y = next(batches)
            except StopIteration:
                return None
            with torch.cuda.stream(stream):
                x = x.cuda(non_blocking=True).float().sub_(self.mean).div_(self.std)
                x = x.contiguous(memory_format=torch.channels_last)
                return x, y.cuda(non_blocking=True)

        upcoming = preload()
        while upcoming is not None:
            torch.cuda.current_stream().wait_stream(stream)
            x, y = upcoming
            x.record_stream(torch.cuda.current_stream())
            y.record_stream(torch.cuda.current_stream())
            upcoming = preload()
            yield x, y


class _ToCuda:
    """The plain recipe's loop body: ``.to("cuda", non_blocking=True)`` for each batch (re-iterable)."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.dataset = loader, loader.dataset

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in self.loader:
            yield x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)


def _loaders(mirror: Path, batch_size: int, workers: int) -> dict[str, Callable[[], Iterable]]:
    from torchvision.transforms import v2

    from colabfast.datasets import H5ImageFolder
    from colabfast.loading import DataLoader

    crop = v2.CenterCrop(CROP)
    floats = v2.Compose([crop, v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    common = {"batch_size": batch_size, "shuffle": True, "num_workers": workers}
    ours = {"device": "cuda", "mean": MEAN, "std": STD, "memory_format": torch.channels_last, **common}
    return {
        METHODS[0]: lambda: _ToCuda(torch.utils.data.DataLoader(
            H5ImageFolder(mirror, transform=floats, output="tensor"), pin_memory=True, **common)),
        METHODS[1]: lambda: ApexPrefetcher(torch.utils.data.DataLoader(
            H5ImageFolder(mirror, transform=crop, output="tensor"), collate_fn=fast_collate, pin_memory=True,
            **common)),
        METHODS[2]: lambda: DataLoader(H5ImageFolder(mirror, transform=crop, output="tensor"), **ours),
        METHODS[3]: lambda: DataLoader(H5ImageFolder(mirror, output="bytes"), decode="gpu", transform=crop, **ours),
    }


def _train_step() -> Callable[[Any], None]:
    import torchvision

    model = torchvision.models.resnet18(num_classes=CLASSES).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(batch: Any) -> None:
        x, y = batch
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x.contiguous(memory_format=torch.channels_last)), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run(size: float = 1.0, repeats: int = 3, batch_size: int = 64, num_workers: Optional[int] = None,
        steps: Optional[int] = None, work: Optional[Union[str, Path]] = None) -> list[Result]:
    """Measure the GPU feed; one scenario ``gpu/resnet18``.

    Args:
        size: scale: 1.0 is 2560 JPEGs of 256x256 and 60 measured steps per repeat.
        repeats: measurements per loader (median reported, with min and max).
        batch_size: images per step, for every loader.
        num_workers: loader workers for every loader (default: the CPU count, as on Colab: 2).
        steps: measured training steps per repeat, after 5 warm-up steps (default: from ``size``).
        work: where to put the data (default: a temp folder).

    Returns:
        One row per loader with ``images/s`` (training), ``data wait %`` (share of each step spent
        waiting for the batch) and ``loader images/s`` (the loader alone); without CUDA, rows with a
        note instead.
    """
    if not torch.cuda.is_available():
        why = "no CUDA GPU here (torch.cuda.is_available() is False); this scenario runs only where one is"
        return [Result(SCENARIO, m, None, note=why) for m in METHODS]
    from colabfast.diagnosis import diagnose
    from colabfast.packing import pack

    workers = env.cpu_count() if num_workers is None else num_workers
    steps = steps or max(10, round(60 * size))
    per_class = max(2, round(2560 * size / CLASSES))
    rows = []
    gpu = (env.gpu() or {}).get("name", "CUDA GPU")
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as tmp:
        tmp = Path(tmp)
        tree = data.make_imagefolder(tmp / "imagefolder", classes=CLASSES, per_class=per_class, size=IMAGE_SIZE)
        mirror = pack(tree, tmp / "mirror.h5", workers=workers, progress=False)
        step = _train_step()
        for method, make in _loaders(mirror, batch_size, workers).items():
            seconds, rates, waits, alone = [], [], [], []
            try:
                loader = make()
                for _ in range(repeats):
                    report = diagnose(loader, step, steps=steps, warmup=5, verbose=False)
                    seconds.append(sum(report.data_times) + sum(report.step_times))
                    rates.append(report.images_per_s)
                    waits.append(report.data_fraction * 100)
                    alone.append(report.loader_images_per_s)
            except Exception as exc:  # one loader's failure is its row's note
                rows.append(Result(SCENARIO, method, None, note=f"failed: {type(exc).__name__}: {exc}"[:200]))
                continue
            finally:
                loader = None
            rows.append(Result(SCENARIO, method, statistics.median(seconds), min(seconds), max(seconds), repeats, {
                "images/s": statistics.median(rates), "data wait %": statistics.median(waits),
                "loader images/s": statistics.median(alone),
            }, note=f"{gpu}; batch {batch_size}, {workers} workers, {steps} steps per repeat"))
    return rows
