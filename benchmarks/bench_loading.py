"""Benchmark colabfast.DataLoader against torch DataLoaders measured in the same run. Prints ratios.

CPU (always): images/s of the loader alone, with ImageNet normalisation, for
  - torch default:    torch.utils.data.DataLoader(ds, batch_size, shuffle=True), normalised in the main process
  - torch hand-tuned: the same with colabfast's knobs set by hand (workers, persistent, prefetch 4, pinning)
  - colabfast:        colabfast.DataLoader(ds, batch_size, shuffle=True, mean=..., std=...)
GPU (when torch sees one): ResNet-18 training steps at the dataset's image size, measured by
colabfast.diagnose (data-wait share of each step, images/s), for
  - plain:       torch DataLoader, float normalisation in the workers (the usual torchvision recipe)
  - apex-style:  uint8 collate + NVIDIA apex's data_prefetcher (side stream, normalise on the GPU)
  - colabfast:   colabfast.DataLoader(device="cuda", ...)
and JPEG decoding: colabfast.DataLoader(decode="gpu") vs decode in 2 CPU workers, loader alone.

The dataset comes from a factory, so the same script runs on an in-RAM tensor dataset now and on an h5
mirror later:

    python benchmarks/bench_loading.py --n 2048 --size 224              # in-RAM uint8 images
    python benchmarks/bench_loading.py --dataset "colabfast.H5ImageFolder('/content/in.h5')" \\
        --bytes-dataset "colabfast.H5ImageFolder('/content/in.h5', output='bytes')"

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import Callable, Optional

import numpy as np
import torch
import torch.utils.data as tud
from torch.utils.data import Dataset

import colabfast
from colabfast import env
from colabfast.diagnosis import diagnose
from colabfast.loading import DataLoader, collate

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class RamImages(Dataset):
    """``n`` uint8 images ``[3, size, size]`` viewing HWC memory (as a decoded mirror yields), labels 0..9."""

    def __init__(self, n: int, size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.pixels = torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, generator=g)
        self.labels = torch.arange(n) % 10

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitem__(self, i: int):
        return self.pixels[i].permute(2, 0, 1), int(self.labels[i])


class RamJpegs(Dataset):
    """``n`` photo-like JPEGs of ``size``² as 1-D uint8 tensors (``output="bytes"`` style)."""

    output = "bytes"

    def __init__(self, n: int, size: int, seed: int = 0) -> None:
        from colabfast.testing.data import encode, photo

        rng = np.random.default_rng(seed)
        self.files = [torch.frombuffer(bytearray(encode(photo(size, size, rng))), dtype=torch.uint8) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        return self.files[i], i % 10


class FloatNormalized(Dataset):
    """The usual torchvision recipe: each sample made float and normalised in the worker."""

    def __init__(self, dataset: Dataset) -> None:
        from torchvision.transforms import v2

        self.dataset = dataset
        self.transform = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        image, label = self.dataset[i]
        return self.transform(image), label


def main_process_normalize(batches, device="cpu"):
    """What a user of a plain DataLoader writes in the training loop."""
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    for x, y in batches:
        x = x.to(device, non_blocking=True)
        yield (x.float().div_(255).sub_(mean).div_(std)), y.to(device, non_blocking=True)


class Normalized:
    """A re-iterable: the loader's batches normalised in the main process."""

    def __init__(self, loader, device="cpu") -> None:
        self.loader, self.device, self.dataset = loader, device, loader.dataset

    def __iter__(self):
        return main_process_normalize(iter(self.loader), self.device)


class ApexPrefetcher:
    """NVIDIA apex's examples/imagenet data_prefetcher (uint8 collate, side stream), re-iterable."""

    def __init__(self, loader) -> None:
        self.loader, self.dataset = loader, loader.dataset
        self.mean = torch.tensor([m * 255 for m in MEAN], device="cuda").view(1, 3, 1, 1)
        self.std = torch.tensor([s * 255 for s in STD], device="cuda").view(1, 3, 1, 1)

    def __iter__(self):
        stream = torch.cuda.Stream()  # apex makes one per prefetcher, i.e. per epoch
        it = iter(self.loader)

        def preload():
            try:
                x, y = next(it)
            except StopIteration:
                return None
            with torch.cuda.stream(stream):
                x = x.cuda(non_blocking=True).float().sub_(self.mean).div_(self.std)
                return x, y.cuda(non_blocking=True)

        nxt = preload()
        while nxt is not None:
            torch.cuda.current_stream().wait_stream(stream)
            x, y = nxt
            x.record_stream(torch.cuda.current_stream())
            y.record_stream(torch.cuda.current_stream())
            nxt = preload()
            yield x, y


def loader_rate(loader, epochs: int) -> float:
    """Images/s over ``epochs`` epochs after one warm-up epoch (worker start-up not counted)."""
    for _ in loader:
        pass
    images, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _ in loader:
            images += len(x)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return images / (time.perf_counter() - t0)


def bench_cpu(dataset: Dataset, batch_size: int, epochs: int) -> None:
    workers = env.cpu_count()
    cuda = torch.cuda.is_available()
    default = Normalized(tud.DataLoader(dataset, batch_size, shuffle=True))
    tuned = Normalized(
        tud.DataLoader(dataset, batch_size, shuffle=True, num_workers=workers, persistent_workers=True,
                       prefetch_factor=4, pin_memory=cuda)
    )  # fmt: skip
    ours = DataLoader(dataset, batch_size, shuffle=True, device="cpu", mean=MEAN, std=STD)
    rates = {name: loader_rate(lo, epochs) for name, lo in [("torch default", default), ("torch hand-tuned", tuned),
                                                           ("colabfast", ours)]}  # fmt: skip
    print(f"CPU loader alone, {len(dataset)} images, batch {batch_size}, {workers} workers, {epochs} epochs timed:")
    for name, rate in rates.items():
        print(f"  {name:<17} {rate:10,.0f} images/s")
    print(f"  colabfast / hand-tuned = {rates['colabfast'] / rates['torch hand-tuned']:.2f}x   "
          f"colabfast / default = {rates['colabfast'] / rates['torch default']:.2f}x")  # fmt: skip


def bench_gpu(dataset: Dataset, jpegs: Optional[Dataset], batch_size: int, steps: int) -> None:
    import torchvision
    from torchvision.transforms import v2

    model = torchvision.models.resnet18(num_classes=10).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(batch):
        x, y = batch
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x.contiguous(memory_format=torch.channels_last)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    workers = env.cpu_count()
    common = dict(shuffle=True, num_workers=workers, persistent_workers=True, prefetch_factor=4, pin_memory=True)
    plain = Normalized(tud.DataLoader(FloatNormalized(dataset), batch_size, **common), "cuda")
    apex = ApexPrefetcher(tud.DataLoader(dataset, batch_size, collate_fn=collate, **common))
    ours = DataLoader(dataset, batch_size, shuffle=True, device="cuda", mean=MEAN, std=STD,
                      memory_format=torch.channels_last)  # fmt: skip
    print(f"GPU ({env.gpu()['name']}): ResNet-18 AMP training steps, batch {batch_size}, {steps} steps measured:")
    results = {}
    for name, loader in [("plain", plain), ("apex-style", apex), ("colabfast", ours)]:
        r = diagnose(loader, step, steps=steps, warmup=5, verbose=False)
        results[name] = r.images_per_s
        print(f"  {name:<11} {r.images_per_s:8,.0f} images/s, data wait {r.data_fraction:5.1%} of each step")
    print(f"  colabfast / plain = {results['colabfast'] / results['plain']:.2f}x   "
          f"colabfast / apex-style = {results['colabfast'] / results['apex-style']:.2f}x")  # fmt: skip
    if jpegs is None:
        return
    crop = v2.Compose([v2.Resize(256, antialias=True), v2.CenterCrop(224)])
    gpu = DataLoader(jpegs, batch_size, decode="gpu", transform=crop, mean=MEAN, std=STD)
    cpu = DataLoader(jpegs, batch_size, decode="cpu", num_workers=2, transform=crop, mean=MEAN, std=STD)
    g = diagnose(gpu, steps=steps, warmup=3, verbose=False).loader_images_per_s
    c = diagnose(cpu, steps=steps, warmup=3, verbose=False).loader_images_per_s
    print(f"JPEG decode, loader alone: GPU (nvJPEG) {g:,.0f} images/s, 2 CPU workers {c:,.0f} images/s: {g / c:.2f}x")


def run(
    make_dataset: Callable[[], Dataset],
    make_jpegs: Optional[Callable[[], Dataset]] = None,
    *,
    batch_size: int = 64,
    epochs: int = 2,
    steps: int = 50,
) -> None:
    """Run the benchmarks on ``make_dataset()`` (and GPU decoding on ``make_jpegs()`` if given)."""
    dataset = make_dataset()
    bench_cpu(dataset, batch_size, epochs)
    if torch.cuda.is_available():
        bench_gpu(dataset, make_jpegs() if make_jpegs else None, batch_size, steps)
    else:
        print("GPU: torch sees none; GPU benchmarks skipped.")


def _factory(expression: Optional[str]) -> Optional[Callable[[], Dataset]]:
    if expression is None:
        return None
    names = {"colabfast": colabfast, "torch": torch, "importlib": importlib}
    return lambda: eval(expression, names)  # the user's own command line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", help="Python expression for the dataset (default: in-RAM uint8 images)")
    parser.add_argument("--bytes-dataset", help="expression for a JPEG-bytes dataset (default: in-RAM JPEGs on GPU)")
    parser.add_argument("--n", type=int, default=2048, help="images in the default datasets")
    parser.add_argument("--size", type=int, default=224, help="side of the default datasets' images")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2, help="epochs timed for the CPU loader benchmark")
    parser.add_argument("--steps", type=int, default=50, help="training steps measured per GPU loader")
    args = parser.parse_args()
    make = _factory(args.dataset) or (lambda: RamImages(args.n, args.size))
    make_jpegs = _factory(args.bytes_dataset) or (lambda: RamJpegs(min(args.n, 512), args.size + 32))
    run(make, make_jpegs, batch_size=args.batch_size, epochs=args.epochs, steps=args.steps)


if __name__ == "__main__":
    main()
