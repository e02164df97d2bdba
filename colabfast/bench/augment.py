"""CPU augmentation: ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip`` to uint8 batches, every way a
user would run it on 2 CPUs (issue 28).

Cases (photo-like JPEGs made by :mod:`colabfast.testing.data`, mirrors in the page cache): ``JPEG
500x375`` (ImageNet's average size, an encoded mirror), ``JPEG 256px`` (packed with ``image_size=256``,
the short side, as FFCV's ImageNet recipe stores it) and ``raw 256px`` (the same, raw pixels). Methods:

- ``colabfast.DataLoader`` with its defaults over ``H5ImageFolder(output="tensor", transform=...)``: the
  reader threads with the crop fused into decoding (:mod:`colabfast.augment`); batches channels-last
  (``memory_format=torch.channels_last``, as a CUDA loader makes them), FFCV's ``ToTorchImage`` layout;
- the same with ``num_workers=2``: worker processes running torchvision's v2 transforms per image (the
  path before issue 28; the same batches under the same seed);
- torchvision ``ImageFolder`` + v2 (``PILToTensor``, the crop, the flip) through a tuned
  ``torch.utils.data.DataLoader`` (2 persistent workers, ``prefetch_factor=4``), over the JPEG files;
- FFCV where installed: its own file of the same images (``write_mode="jpg"``, or ``"raw"`` for the raw
  case), ``RandomResizedCropRGBImageDecoder((224, 224))``, ``RandomHorizontalFlip``, ``ToTensor``,
  ``ToTorchImage`` (its documented ImageNet pipeline without normalisation), 2 threads;
- the decode-only ceiling (JPEG cases, a reference): every file's bytes already in RAM decoded by 2
  threads with ``simplejpeg``, no crop, no batching.

Methods take turns repeat by repeat (:func:`colabfast.bench.loader._rates`); rows give images/s and the
ratio to FFCV, to the worker processes and to the ceiling, all from the same run.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Optional

import torch

from colabfast import env
from colabfast.bench.loader import _rates
from colabfast.bench.timing import Result
from colabfast.datasets import H5ImageFolder
from colabfast.loading import DataLoader
from colabfast.packing import pack
from colabfast.testing import data

CROP = 224


def _crop_flip() -> Any:
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(CROP), v2.RandomHorizontalFlip()])


class _Ceiling:
    """One 'epoch' of the decode-only ceiling: all JPEG bytes in RAM decoded by ``threads`` threads."""

    def __init__(self, files: list[bytes], threads: int) -> None:
        self.files, self.threads = files, threads

    def __iter__(self) -> Iterable[tuple[list, None]]:
        import simplejpeg

        chunks = [self.files[k :: self.threads] for k in range(self.threads)]
        with ThreadPoolExecutor(self.threads) as pool:
            done = list(pool.map(lambda c: [simplejpeg.decode_jpeg(b, "RGB") for b in c], chunks))
        yield [x for chunk in done for x in chunk], None


def _ffcv(src: Path, out: Path, raw: bool, max_side: int, batch_size: int, workers: int) -> Iterable:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter
    from torchvision.datasets import ImageFolder

    from colabfast.bench.peers import _PILFiles

    fields = {"image": RGBImageField(write_mode="raw" if raw else "jpg", max_resolution=max_side, jpeg_quality=90),
              "label": IntField()}
    with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
        DatasetWriter(str(out), fields, num_workers=workers).from_indexed_dataset(_PILFiles(ImageFolder(src).samples))
    pipelines = {"image": [RandomResizedCropRGBImageDecoder((CROP, CROP)), RandomHorizontalFlip(), ToTensor(),
                           ToTorchImage()],
                 "label": [IntDecoder(), ToTensor(), Squeeze()]}
    return Loader(str(out), batch_size=batch_size, num_workers=workers, order=OrderOption.RANDOM,
                  pipelines=pipelines, drop_last=False)


def run(size: float = 1.0, repeats: int = 3, min_seconds: float = 2.0, batch_size: int = 64,
        work: Optional[Path] = None, only: Optional[tuple[str, ...]] = None) -> list[Result]:
    """The rows described in the module docstring; ``size`` 1.0 is 2000 images per case; ``only``: the
    cases to run (default all)."""
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    from colabfast.bench.peers import FFCV_RAW

    workers = env.cpu_count()
    ffcv_missing = FFCV_RAW.missing()
    rows: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as folder:
        tmp = Path(folder)
        n = max(4 * batch_size, int(2000 * size))
        src = data.make_imagefolder(tmp / "src", classes=10, per_class=n // 10, size=(500, 375), vary=0.1)
        # FFCV's max_resolution above every image's longest side: it stores the same pixels as the mirror
        cases = {"JPEG 500x375": (pack(src, tmp / "jpg500.h5", progress=False), src, False, 1024),
                 "JPEG 256px": (pack(src, tmp / "jpg256.h5", image_size=256, progress=False), None, False, 1024),
                 "raw 256px": (pack(src, tmp / "raw256.h5", image_size=256, store="raw", progress=False), None,
                               True, 1024)}
        cases = {k: v for k, v in cases.items() if only is None or k in only}
        files256 = _export(H5ImageFolder(cases["JPEG 256px"][0], output="bytes"), tmp / "src256")
        for case, (mirror, files, raw, max_side) in cases.items():
            files = files or files256
            ds = H5ImageFolder(mirror, output="tensor", transform=_crop_flip())
            # channels-last batches, FFCV's layout (and the GPU's): no transposing copy on either side
            cl = torch.channels_last
            ours = DataLoader(ds, batch_size=batch_size, shuffle=True, device="cpu", memory_format=cl)
            loaders: dict[str, Iterable] = {
                "colabfast.DataLoader (defaults)": ours,
                f"colabfast.DataLoader(num_workers={workers})": DataLoader(
                    H5ImageFolder(mirror, output="tensor", transform=_crop_flip()), batch_size=batch_size,
                    shuffle=True, device="cpu", num_workers=workers, memory_format=cl),
                f"torchvision ImageFolder + v2, {workers} tuned workers": torch.utils.data.DataLoader(
                    ImageFolder(str(files), transform=v2.Compose([v2.PILToTensor(), _crop_flip()])),
                    batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=True,
                    prefetch_factor=4),
            }
            if not ffcv_missing:
                loaders["FFCV"] = _ffcv(files, tmp / f"{case.replace(' ', '_')}.beton", raw, max_side, batch_size,
                                        workers)
            if not raw:
                blobs = [ds.reader.read(p).numpy().tobytes() for p in range(len(ds))]
                loaders["decode-only ceiling"] = _Ceiling(blobs, workers)
            rates = _rates(loaders, repeats, min_seconds)
            by = {name: r[0] for name, r in rates.items()}
            ffcv_rate = by.get("FFCV")
            procs = by[f"colabfast.DataLoader(num_workers={workers})"]
            for name, (med, low, high) in rates.items():
                metrics = {"images/s": med, "x worker processes": med / procs}
                if ffcv_rate:
                    metrics["x FFCV"] = med / ffcv_rate
                if "decode-only ceiling" in by:
                    metrics["of decode ceiling"] = med / by["decode-only ceiling"]
                note = f"{len(ds)} images, batch {batch_size}; images/s min-max {low:.0f}-{high:.0f}"
                if name == "colabfast.DataLoader (defaults)":
                    note += f"; reader: {ours.choices['reader'][0]}"
                if name == "FFCV" or (name.endswith("(defaults)") and ffcv_missing):
                    note += f"; FFCV {ffcv_missing or FFCV_RAW.version()}"
                rows.append(Result(f"augment/{case}", name, len(ds) / med, len(ds) / high, len(ds) / low, repeats,
                                   metrics, note=note, reference=name == "decode-only ceiling"))
    return rows


def _export(ds: H5ImageFolder, out: Path) -> Path:
    """The mirror's JPEGs as an ImageFolder tree (for the baselines that read files)."""
    for i, (data_, label) in enumerate(ds):
        folder = out / ds.classes[label]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.jpg").write_bytes(data_.numpy().tobytes())
    return out

