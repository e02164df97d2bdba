"""GPU feed: does training wait for data? Two cases, the process pinned to 2 CPUs as a Colab VM.

``gpu/resnet50-imagenet``: ImageNet-style training, ResNet-50 (bf16 autocast, channels-last, SGD), batch
128, photo-like JPEGs of about 500x375, ``RandomResizedCrop(224)`` + horizontal flip + normalisation.
Rows: the data-on-GPU ceiling (one batch already on the GPU, the step alone); ``colabfast.DataLoader``
with nvJPEG and :mod:`colabfast.images.transforms`, its feed in threads of the training process; the
same feed with torchvision's per-image v2 transforms; NVIDIA DALI where it is installed (``pip
install nvidia-dali-cuda130``; its ResNet-50 example's pipeline: ``external_source`` over the same
mirror's bytes, ``fn.decoders.image_random_crop(device="mixed")``, ``fn.resize``,
``fn.crop_mirror_normalize``). Each row gives images/s, the data wait share, the loader alone and the
fraction of the ceiling.

``gpu/resnet18``: ResNet-18 training steps (AMP, channels-last, SGD) fed from one encoded mirror of
256 px JPEGs, centre-cropped to 224 and ImageNet-normalised, by

- a plain ``torch.utils.data.DataLoader`` (torchvision's reference recipe: float conversion and
  normalisation in the workers, ``pin_memory=True``, ``.to(device, non_blocking=True)`` in the loop);
- an apex-style prefetcher (NVIDIA apex ``examples/imagenet`` ``data_prefetcher``: uint8 collate, copy
  and normalise on a side CUDA stream one batch ahead);
- ``colabfast.DataLoader`` with JPEGs decoded in the CPU workers;
- ``colabfast.DataLoader`` with JPEGs decoded on the GPU (nvJPEG, ``decode="gpu"``).

Every loader has the same batch size; the peers have ``num_workers`` workers, ``colabfast.DataLoader``
its defaults (reader threads for the CPU decode; for nvJPEG, the feeder thread reads the files).
:func:`colabfast.diagnose` times each step (the wait for the next batch, then the step with its GPU
work synchronised) and the loader alone.
Runs only where torch sees a CUDA GPU; elsewhere each row says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import torch

from colabfast.testing import data
from colabfast.tools.bench.timing import Result
from colabfast.where import env

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_SIZE = (256, 256)
CROP = 224
CLASSES = 10
SCENARIO = "gpu/resnet18"
IMAGENET = "gpu/resnet50-imagenet"
CEILING = "batch already on the GPU (ceiling)"
IN_PROCESS = "colabfast.DataLoader (GPU decode, colabfast.images.transforms)"
PER_IMAGE = "colabfast.DataLoader (GPU decode, torchvision v2 per image)"
DALI = "NVIDIA DALI (mixed decode + random crop)"
IMAGENET_METHODS = (CEILING, IN_PROCESS, PER_IMAGE, DALI)
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

    from colabfast.datasets.dropins import H5ImageFolder
    from colabfast.images import transforms
    from colabfast.loading.loader import DataLoader

    crop = v2.CenterCrop(CROP)
    floats = v2.Compose([crop, v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    common = {"batch_size": batch_size, "shuffle": True, "num_workers": workers}
    # colabfast's rows use its defaults (what a user gets): reader threads, or the feeder reading files
    ours = {"device": "cuda", "mean": MEAN, "std": STD, "memory_format": torch.channels_last,
            "batch_size": batch_size, "shuffle": True}
    return {
        METHODS[0]: lambda: _ToCuda(torch.utils.data.DataLoader(
            H5ImageFolder(mirror, transform=floats, output="tensor"), pin_memory=True, **common)),
        METHODS[1]: lambda: ApexPrefetcher(torch.utils.data.DataLoader(
            H5ImageFolder(mirror, transform=crop, output="tensor"), collate_fn=fast_collate, pin_memory=True,
            **common)),
        METHODS[2]: lambda: DataLoader(H5ImageFolder(mirror, transform=crop, output="tensor"), **ours),
        METHODS[3]: lambda: DataLoader(H5ImageFolder(mirror, output="bytes"), decode="gpu",
                                       transform=transforms.CenterCrop(CROP), **ours),
    }


def _train_step(arch: str = "resnet18", dtype: torch.dtype = torch.float16) -> Callable[[Any], None]:
    import torchvision

    model = getattr(torchvision.models, arch)(num_classes=CLASSES).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(batch: Any) -> None:
        x, y = batch
        with torch.autocast("cuda", dtype=dtype):
            loss = loss_fn(model(x.contiguous(memory_format=torch.channels_last)), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run(size: float = 1.0, repeats: int = 3, batch_size: int = 64, num_workers: Optional[int] = None,
        steps: Optional[int] = None, work: Optional[Union[str, Path]] = None, cpus: int = 2) -> list[Result]:
    """Measure the GPU feed: ``gpu/resnet50-imagenet`` (batch 128), then ``gpu/resnet18``.

    Args:
        size: scale: 1.0 is 2560 JPEGs of 256x256 and 60 measured steps per repeat.
        repeats: measurements per loader (median reported, with min and max).
        batch_size: images per step, for every loader.
        num_workers: workers of the peers' loaders and DALI's threads (default: the CPU count, as on
            Colab: 2); colabfast's loaders keep their defaults.
        steps: measured training steps per repeat, after 5 warm-up steps (default: from ``size``).
        work: where to put the data (default: a temp folder).
        cpus: pin the process to this many CPUs while measuring (``os.sched_setaffinity``; Colab has 2);
            0 leaves the affinity alone.

    Returns:
        One row per loader with ``images/s`` (training), ``data wait %`` (share of each step spent
        waiting for the batch) and ``loader images/s`` (the loader alone); without CUDA, rows with a
        note instead.
    """
    if not torch.cuda.is_available():
        why = "no CUDA GPU here (torch.cuda.is_available() is False); this scenario runs only where one is"
        return [Result(IMAGENET, m, None, note=why) for m in IMAGENET_METHODS] + \
            [Result(SCENARIO, m, None, note=why) for m in METHODS]
    with _pinned(cpus):
        workers = env.cpu_count() if num_workers is None else num_workers
        return _imagenet(size, repeats, workers, steps, work) + _resnet18(size, repeats, batch_size, workers,
                                                                           steps, work)


@contextlib.contextmanager
def _pinned(cpus: int) -> Iterator[None]:
    """Run the block on the first ``cpus`` CPUs this process may use (Linux), as a Colab VM has 2."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:cpus])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _measure(scenario: str, method: str, make: Callable[[], Iterable], step: Callable[[Any], None], repeats: int,
             steps: int, note: str, ceiling: Optional[float] = None) -> Result:
    """Train ``steps`` steps ``repeats`` times through :func:`colabfast.diagnose`; a failure is the note."""
    from colabfast.diagnosis.report import diagnose

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
        return Result(scenario, method, None, note=f"failed: {type(exc).__name__}: {exc}"[:200])
    finally:
        loader = None
    metrics = {"images/s": statistics.median(rates), "data wait %": statistics.median(waits),
               "loader images/s": statistics.median(alone)}
    if ceiling:
        metrics["of ceiling"] = statistics.median(rates) / ceiling
    return Result(scenario, method, statistics.median(seconds), min(seconds), max(seconds), repeats, metrics,
                  note=note)


def _imagenet(size: float, repeats: int, workers: int, steps: Optional[int],
              work: Optional[Union[str, Path]]) -> list[Result]:
    from torchvision.transforms import v2

    from colabfast.datasets.dropins import H5ImageFolder
    from colabfast.images import transforms
    from colabfast.loading.loader import DataLoader
    from colabfast.packing import pack

    batch, crop = 128, 224
    steps = steps or max(10, round(40 * size))
    per_class = max(2, round(3000 * size / CLASSES))
    gpu = (env.gpu() or {}).get("name", "CUDA GPU")
    note = (f"{gpu}; batch {batch}, colabfast's default readers (DALI: {workers} threads), {steps} steps per repeat, "
            f"{len(os.sched_getaffinity(0))} CPUs")
    ours = {"batch_size": batch, "shuffle": True, "device": "cuda", "mean": MEAN,  # the loader's defaults
            "std": STD, "dtype": torch.bfloat16, "memory_format": torch.channels_last, "decode": "gpu",
            "drop_last": True}
    batched = transforms.Compose([transforms.RandomResizedCrop(crop), transforms.RandomHorizontalFlip()])
    per_image = v2.Compose([v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip()])
    rows = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as tmp:
        tmp = Path(tmp)
        tree = data.make_imagefolder(tmp / "imagefolder", classes=CLASSES, per_class=per_class, size=(500, 375),
                                     vary=0.15)
        mirror = pack(tree, tmp / "mirror.h5", workers=workers, progress=False)
        step = _train_step("resnet50", torch.bfloat16)
        x = torch.randn(batch, 3, crop, crop, device="cuda").to(torch.bfloat16, memory_format=torch.channels_last)
        y = torch.randint(0, CLASSES, (batch,), device="cuda")
        on_gpu = [(x, y)] * (steps + 5)
        top = _measure(IMAGENET, CEILING, lambda: on_gpu, step, repeats, steps, note)
        top = dataclasses.replace(top, reference=True)
        rows.append(top)
        ceiling = top.metrics.get("images/s") if top.metrics else None
        if ceiling:
            top.metrics["of ceiling"] = 1.0
        makers = {
            IN_PROCESS: lambda: DataLoader(H5ImageFolder(mirror, output="bytes"), transform=batched, **ours),
            PER_IMAGE: lambda: DataLoader(H5ImageFolder(mirror, output="bytes"), transform=per_image, **ours),
        }
        for method, make in makers.items():
            rows.append(_measure(IMAGENET, method, make, step, repeats, steps, note, ceiling))
        dali = _dali(mirror, batch, crop, workers)
        if isinstance(dali, str):
            rows.append(Result(IMAGENET, DALI, None, note=dali))
        else:
            rows.append(_measure(IMAGENET, DALI, dali, step, repeats, steps, note, ceiling))
    return rows


class DaliSource:
    """The callable DALI's ``fn.external_source(batch=True, batch_info=True)`` calls for each batch:
    ``info.epoch_idx`` and ``info.iteration`` -> ``(files, labels)``, lists of 1-D uint8 and int64 [1]
    numpy arrays for one batch of the mirror in a random order per epoch; StopIteration ends the
    epoch. Batches are read by :class:`colabfast.loading.reader.BatchReader` (one pread per run, no
    per-sample dataset calls), so DALI waits on the mirror no longer than colabfast's loader does.
    """

    def __init__(self, mirror: Path, batch: int) -> None:
        from colabfast.datasets.dropins import H5ImageFolder
        from colabfast.loading.reader import BatchReader

        self.dataset = H5ImageFolder(mirror, output="bytes")
        self.reader, self.batch = BatchReader(self.dataset, threads=1), batch

    def __call__(self, info: Any) -> tuple[list, list]:
        import numpy as np

        start = info.iteration * self.batch
        if start + self.batch > len(self.dataset):
            raise StopIteration
        order = np.random.default_rng(info.epoch_idx).permutation(len(self.dataset))
        files, labels = self.reader.read(order[start:start + self.batch])
        # DALI copies what the callback returns (no_copy=False), so views into the batch are safe.
        return [f.numpy() for f in files], [label.reshape(1).numpy() for label in labels]


def _dali(mirror: Path, batch: int, crop: int, threads: int) -> Union[str, Callable[[], Iterable]]:
    """A maker of DALI's ResNet-50 training pipeline over the mirror's bytes, or why there is none."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
    except ImportError:
        return "NVIDIA DALI is not installed (pip install nvidia-dali-cuda130); not measured"
    except Exception as exc:  # installed but its libraries do not load (OSError, RuntimeError): the row says so
        return f"NVIDIA DALI does not import: {type(exc).__name__}: {exc}"[:200]

    source = DaliSource(mirror, batch)

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=torch.cuda.current_device())
    def pipe():  # type: ignore[no-untyped-def]
        files, labels = fn.external_source(source=source, num_outputs=2, batch=True, batch_info=True,
                                           dtype=[types.UINT8, types.INT64])
        images = fn.decoders.image_random_crop(files, device="mixed", output_type=types.RGB)
        images = fn.resize(images, resize_x=crop, resize_y=crop)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="CHW", crop=(crop, crop),
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                          mirror=fn.random.coin_flip())
        return images, labels.gpu()

    class Loader:
        dataset = None

        def __init__(self) -> None:
            self.pipe = pipe()
            self.pipe.build()

        def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            for out in DALIGenericIterator([self.pipe], ["x", "y"], auto_reset=True):
                yield out[0]["x"].contiguous(memory_format=torch.channels_last), out[0]["y"].view(-1)

    return Loader


def _resnet18(size: float, repeats: int, batch_size: int, workers: int, steps: Optional[int],
              work: Optional[Union[str, Path]]) -> list[Result]:
    from colabfast.packing import pack

    steps = steps or max(10, round(60 * size))
    per_class = max(2, round(2560 * size / CLASSES))
    gpu = (env.gpu() or {}).get("name", "CUDA GPU")
    note = f"{gpu}; batch {batch_size}, {workers} workers (colabfast: its default readers), {steps} steps per repeat"
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as tmp:
        tmp = Path(tmp)
        tree = data.make_imagefolder(tmp / "imagefolder", classes=CLASSES, per_class=per_class, size=IMAGE_SIZE)
        mirror = pack(tree, tmp / "mirror.h5", workers=workers, progress=False)
        step = _train_step()
        return [_measure(SCENARIO, method, make, step, repeats, steps, note)
                for method, make in _loaders(mirror, batch_size, workers).items()]
