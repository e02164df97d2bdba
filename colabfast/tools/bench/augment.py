"""CPU augmentation: ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip`` to uint8 batches, every way a
user would run it on 2 CPUs (issue 28). Run pinned: ``taskset -c 0,1 colabfast bench augment``.

Image cases (photo-like JPEGs made by :mod:`colabfast.testing.data`, mirrors made by
:func:`colabfast.pack`, all in the page cache): ``augment/JPEG 500x375`` (ImageNet's average size, an
encoded mirror), ``augment/JPEG 256px`` (packed with ``image_size=256``, the short side, as FFCV's
ImageNet recipe stores it) and ``augment/raw 256px`` (the same, raw pixels). Rows, each images/s
(median, min-max, over ``repeats`` rounds of whole epochs lasting at least ``min_seconds``) and CPU ms per image:

- ``colabfast.DataLoader (defaults)``: ``H5ImageFolder(output="tensor", transform=v2.Compose([crop,
  flip]))`` through the loader's defaults: the crop fused with decoding in its reader threads
  (:mod:`colabfast.images.augment`; the note says what ``loader.choices["reader"]`` chose), batches
  channels-last (``memory_format=torch.channels_last``), FFCV's ``ToTorchImage`` layout;
- ``colabfast.DataLoader(num_workers=N)``: the same in ``workers`` worker processes running
  torchvision's v2 transforms per image (the path before issue 28; the same batches under one seed);
- ``torchvision ImageFolder + v2, N tuned workers``: ``PILToTensor``, the crop, the flip, through a
  ``torch.utils.data.DataLoader`` (persistent workers, ``prefetch_factor=4``) over the JPEG files (the
  256 px files for the raw case: there is no raw file tree);
- ``FFCV`` where installed (else a row saying why not): its own file of the same pixels
  (``write_mode="jpg"``, ``"raw"`` for the raw case), ``RandomResizedCropRGBImageDecoder((224, 224))``,
  ``RandomHorizontalFlip``, ``ToTensor``, ``ToTorchImage`` (its documented ImageNet pipeline without
  normalisation), ``workers`` threads, ``os_cache=True``, random order;
- ``decode-only ceiling`` (JPEG cases, a reference): every image's bytes already in RAM decoded by
  ``workers`` threads with ``simplejpeg`` into a reused buffer per thread, no crop, no batching.

``augment/train ResNet-18 128px``: training steps of ResNet-18 on the CPU fed by the loader's defaults
against a plain torch ``DataLoader`` with ``workers`` workers (see :func:`_training`): training images/s
and the data wait share.

``augment/detection v2``: a map-style dataset of ``(tv_tensors.Image, {"boxes": BoundingBoxes XYXY,
"labels": int64})`` with 0-8 boxes per ~500x375 photo, packed with the image as JPEG and read with
``H5Dataset(transforms=v2.Compose([flip, RandomResizedCrop(224), SanitizeBoundingBoxes()]))``: the
loader's defaults vs ``num_workers=N``, vs the source dataset (JPEG bytes in RAM, ``decode_jpeg`` per
item) through a tuned torch ``DataLoader`` with a list collate.

Every row also gives ``CPU ms/img``: user + system CPU of the whole process tree (threads, worker
processes) per image, median over the rounds (`colabfast.tools.bench.timing.usage`); on a shared machine
it is the steady figure, and on Colab's 2 CPUs a CPU-bound loader runs at about 2 / (CPU s per image).
Every ratio column divides a row's images/s by the named baseline's, measured in the same run: ``x
FFCV``, ``x worker processes``, ``x torchvision`` (``x torch DataLoader`` for detection), ``of decode
ceiling``; each ``... by CPU`` column divides the baseline's CPU per image by the row's (above 1: the row
costs less). Methods take turns round by round (:func:`colabfast.tools.bench.loader._rates`, whose first epoch
of each loader is untimed: FFCV compiles then), so drift in the machine's speed hits all alike.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch

from colabfast.datasets.dropins import H5ImageFolder
from colabfast.datasets.h5dataset import H5Dataset
from colabfast.loading.loader import DataLoader
from colabfast.packing import pack
from colabfast.testing import data
from colabfast.tools.bench.detection import as_lists
from colabfast.tools.bench.loader import _rates, ratios
from colabfast.tools.bench.timing import Result
from colabfast.where.codec import decode_jpeg, jpeg_codec

CROP = 224
OURS = "colabfast.DataLoader (defaults)"
FFCV, CEILING = "FFCV", "decode-only ceiling"
CASES = ("JPEG 500x375", "JPEG 256px", "raw 256px", "detection v2", "train ResNet-18 128px")
TRAIN_CROP, TRAIN_BATCH = 128, 32  # CPU training: small crops, small batches


def _crop_flip() -> Any:
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(CROP), v2.RandomHorizontalFlip()])


def _reader(loader: DataLoader) -> str:
    """``loader.choices["reader"]``, shortened for a note."""
    value, why = loader.choices["reader"]
    return f"reader: {value}" if value != "none" else f"reader: none ({why.split(':')[0]})"


class _Ceiling:
    """One 'epoch' of the decode-only ceiling: all JPEG bytes in RAM decoded by ``threads`` threads."""

    def __init__(self, files: list[bytes], threads: int) -> None:
        import simplejpeg

        self.files, self.threads = files, threads
        # each thread decodes into one reused buffer: fresh memory for every image (520 MB an epoch of
        # 256 px images) made this row measure page faults, and swing 1,400-4,000 images/s between runs
        self.nbytes = max(h * w for h, w, _, _ in map(simplejpeg.decode_jpeg_header, files)) * 3

    def __iter__(self) -> Iterator[tuple[list, None]]:
        import simplejpeg

        def decode(chunk: list[bytes]) -> list[tuple[int, ...]]:
            buffer = np.empty(self.nbytes, np.uint8)
            return [simplejpeg.decode_jpeg(b, "RGB", buffer=buffer).shape for b in chunk]

        chunks = [self.files[k :: self.threads] for k in range(self.threads)]
        with ThreadPoolExecutor(self.threads) as pool:
            done = list(pool.map(decode, chunks))
        yield [x for chunk in done for x in chunk], None


class _Boxes(torch.utils.data.Dataset):
    """The detection case's source: ``(tv_tensors.Image, {"boxes", "labels"})`` from JPEG bytes in RAM,
    0-8 random XYXY boxes per image (seeded by the index), ``transforms`` applied to both."""

    def __init__(self, blobs: list[bytes], transforms: Optional[Any] = None) -> None:
        self.blobs = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        self.transforms = transforms

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[Any, dict[str, Any]]:
        from torchvision import tv_tensors

        image = tv_tensors.Image(decode_jpeg(self.blobs[i]))
        h, w = image.shape[-2:]
        rng = np.random.default_rng(i)
        m = int(rng.integers(0, 9))
        corners = rng.uniform(0, 1, (m, 2, 2)) * (w, h)
        boxes = torch.from_numpy(np.concatenate([corners.min(1), corners.max(1)], 1)).float()
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(h, w)),
                  "labels": torch.from_numpy(rng.integers(1, 91, m))}
        return (image, target) if self.transforms is None else self.transforms(image, target)


def _ffcv(files: Path, out: Path, raw: bool, batch_size: int, workers: int) -> Iterable:
    """FFCV's file of ``files`` (an ImageFolder tree) and its Loader with the augmenting pipeline."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter
    from torchvision.datasets import ImageFolder

    from colabfast.tools.bench.peers import _PILFiles

    # max_resolution above every image's side: FFCV stores the pixels the mirror holds (the 256 px
    # cases are written from the 256 px files, as the mirror was packed with image_size=256)
    fields = {"image": RGBImageField(write_mode="raw" if raw else "jpg", max_resolution=1024, jpeg_quality=90),
              "label": IntField()}
    with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
        DatasetWriter(str(out), fields, num_workers=workers).from_indexed_dataset(_PILFiles(ImageFolder(files).samples))
    pipelines = {"image": [RandomResizedCropRGBImageDecoder((CROP, CROP)), RandomHorizontalFlip(), ToTensor(),
                           ToTorchImage()],
                 "label": [IntDecoder(), ToTensor(), Squeeze()]}
    return Loader(str(out), batch_size=batch_size, num_workers=workers, order=OrderOption.RANDOM,
                  os_cache=True, pipelines=pipelines, drop_last=False)


def _rows(scenario: str, loaders: dict[str, Iterable], baselines: dict[str, str], notes: dict[str, str],
          n: int, repeats: int, min_seconds: float) -> list[Result]:
    """Time ``loaders`` taking turns; each row's images/s and CPU ms per image, and its ratios to every
    baseline measured (``baselines``: metric name -> method; :func:`colabfast.tools.bench.loader.ratios`)."""
    rates = _rates(loaders, repeats, min_seconds)
    rows = []
    for name, r in rates.items():
        metrics = r.metrics()
        for key, base in baselines.items():
            if base in rates:
                metrics.update(ratios(r, rates[base], key))
        note = "; ".join(filter(None, [f"{n} images; {r.note()}", notes.get(name, "")]))
        rows.append(Result(scenario, name, n / r.rate.median, n / r.rate.high, n / r.rate.low, repeats, metrics,
                           note=note, reference=name == CEILING))
    return rows


def run(size: float = 1.0, repeats: int = 4, min_seconds: float = 2.0, batch_size: int = 64, workers: int = 2,
        work: Optional[Path] = None, only: Optional[tuple[str, ...]] = None) -> list[Result]:
    """The rows described in the module docstring.

    Args:
        size: 1.0 is 2000 images per case.
        repeats: timed rounds (median, min, max), after one untimed epoch of each method.
        min_seconds: each round runs whole epochs until it has lasted this long.
        batch_size: images per batch, every method.
        workers: worker processes (threads for FFCV and the ceiling) of every method that takes them.
        work: where to put the data (default: a temp folder).
        only: the cases to run (names in :data:`CASES`; default all).
    """
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    from colabfast.tools.bench.peers import FFCV_RAW

    ffcv_missing = FFCV_RAW.missing()
    procs, tv = f"colabfast.DataLoader(num_workers={workers})", f"torchvision ImageFolder + v2, {workers} tuned workers"
    rows: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as folder:
        tmp = Path(folder)
        n = -(-max(4 * batch_size, int(2000 * size)) // 10) * 10  # 10 classes of n // 10
        src = data.make_imagefolder(tmp / "src", classes=10, per_class=n // 10, size=(500, 375), vary=0.1)
        jpg256: Optional[Path] = None
        for case in (c for c in CASES[:3] if only is None or c in only):
            raw = case.startswith("raw")
            if case == "JPEG 500x375":
                mirror, files = pack(src, tmp / "jpg500.h5", progress=False), src
            else:
                if jpg256 is None:  # packed and exported once for both 256 px cases
                    jpg256 = pack(src, tmp / "jpg256.h5", image_size=256, progress=False)
                    _export(H5ImageFolder(jpg256, output="bytes"), tmp / "src256")
                files = tmp / "src256"
                mirror = pack(src, tmp / "raw256.h5", image_size=256, store="raw", progress=False) if raw else jpg256
            cl = torch.channels_last  # FFCV's layout (and the GPU's): no transposing copy on either side
            ours = DataLoader(H5ImageFolder(mirror, output="tensor", transform=_crop_flip()), batch_size=batch_size,
                              shuffle=True, device="cpu", memory_format=cl)
            loaders: dict[str, Iterable] = {
                OURS: ours,
                procs: DataLoader(H5ImageFolder(mirror, output="tensor", transform=_crop_flip()),
                                  batch_size=batch_size, shuffle=True, device="cpu", num_workers=workers,
                                  memory_format=cl),
                tv: torch.utils.data.DataLoader(
                    ImageFolder(str(files), transform=v2.Compose([v2.PILToTensor(), _crop_flip()])),
                    batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=True,
                    prefetch_factor=4),
            }
            if not ffcv_missing:
                loaders[FFCV] = _ffcv(files, tmp / f"{case.replace(' ', '_')}.beton", raw, batch_size, workers)
            if not raw:
                loaders[CEILING] = _Ceiling([p.read_bytes() for p in sorted(files.rglob("*.*"))], workers)
            notes = {OURS: f"batch {batch_size}, {_reader(ours)}", procs: "v2 per image in worker processes",
                     FFCV: f"FFCV {FFCV_RAW.version()}, {workers} threads, write_mode={'raw' if raw else 'jpg'}"}
            baselines = {"x FFCV": FFCV, "x worker processes": procs, "x torchvision": tv, "of decode ceiling": CEILING}
            scenario = f"augment/{case}"
            rows += _spdl(loaders, notes, files, scenario, batch_size, workers)
            rows += _rows(scenario, loaders, baselines, notes, n, repeats, min_seconds)
            if ffcv_missing:
                rows.append(Result(scenario, FFCV, None, note=f"FFCV {ffcv_missing}"))
        if only is None or CASES[3] in only:
            rows += _detection(src, tmp, n, repeats, min_seconds, batch_size, workers)
        if only is None or CASES[4] in only:
            rows += _training(src, pack(src, tmp / "train.h5", progress=False), repeats, workers,
                              steps=8 if size >= 0.25 else 2)
    return rows


def _training(src: Path, mirror: Path, repeats: int, workers: int, steps: int = 8) -> list[Result]:
    """``augment/train ResNet-18 128px``: ResNet-18 trained on the CPU (SGD, batch 32, float32), each
    batch ``RandomResizedCrop(128)`` + flip of the 500x375 JPEGs, measured by :func:`colabfast.diagnose`
    (``steps`` steps after 2 of warm-up, per repeat): colabfast's loader with its defaults (the crop
    fused with decoding in its reader threads) against a plain ``torch.utils.data.DataLoader`` over
    ``ImageFolder`` + v2 with ``workers`` tuned worker processes. On 2 CPUs the model and the loader
    share the same cores, so the row gives training images/s and the share of each step spent
    waiting for data."""
    import statistics

    import torchvision
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    from colabfast.diagnosis.report import diagnose

    crop = v2.Compose([v2.RandomResizedCrop(TRAIN_CROP), v2.RandomHorizontalFlip()])
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(batch: Any) -> None:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(model(x.float().div_(255)), y)  # the same conversion for both
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    ours = "colabfast.DataLoader (defaults)"
    plain = f"torch DataLoader + ImageFolder + v2, {workers} workers"
    loaders: dict[str, Iterable] = {
        ours: DataLoader(H5ImageFolder(mirror, output="tensor", transform=crop), TRAIN_BATCH, shuffle=True,
                         device="cpu"),
        plain: torch.utils.data.DataLoader(ImageFolder(str(src), transform=v2.Compose([v2.PILToTensor(), crop])),
                                           TRAIN_BATCH, shuffle=True, num_workers=workers, persistent_workers=True,
                                           prefetch_factor=4),
    }
    reports: dict[str, list[Any]] = {name: [] for name in loaders}
    for _ in range(repeats):  # rounds: drift hits both alike
        for name, loader in loaders.items():
            reports[name].append(diagnose(loader, step, steps=steps, warmup=2, verbose=False))
    rows = []
    for name, rs in reports.items():
        secs = [sum(r.data_times) + sum(r.step_times) for r in rs]
        metrics = {"images/s": statistics.median(r.images_per_s for r in rs),
                   "data wait %": statistics.median(r.data_fraction * 100 for r in rs),
                   "loader images/s": statistics.median(r.loader_images_per_s for r in rs)}
        rows.append(Result(f"augment/{CASES[4]}", name, statistics.median(secs), min(secs), max(secs), repeats, metrics,
                           note=f"ResNet-18 on the CPU, SGD, batch {TRAIN_BATCH}, {steps} steps per repeat, "
                                f"RandomResizedCrop({TRAIN_CROP}) + flip"
                                + (f"; {_reader(loaders[name])}" if name == ours else "")))
    rows[0].metrics["x plain DataLoader"] = rows[0].metrics["images/s"] / rows[1].metrics["images/s"]
    return rows


def _detection(src: Path, tmp: Path, n: int, repeats: int, min_seconds: float, batch_size: int,
               workers: int) -> list[Result]:
    """The ``augment/detection v2`` rows: a packed detection dataset vs its source, v2 transforms."""
    from torchvision.transforms import v2

    def pipeline() -> Any:
        return v2.Compose([v2.RandomHorizontalFlip(), v2.RandomResizedCrop(CROP, antialias=True),
                           v2.SanitizeBoundingBoxes()])  # finds "labels" in the target dict

    blobs = [p.read_bytes() for p in sorted(src.rglob("*.JPEG"))][:n]
    mirror = pack(_Boxes(blobs), tmp / "boxes.h5", fields={"0": "jpeg"}, workers=workers, progress=False)
    ours = DataLoader(H5Dataset(mirror, transforms=pipeline()), batch_size, shuffle=True, device="cpu")
    procs = f"colabfast.DataLoader(num_workers={workers})"
    source = f"source dataset + torch DataLoader, {workers} workers"
    loaders: dict[str, Iterable] = {
        OURS: ours,
        procs: DataLoader(H5Dataset(mirror, transforms=pipeline()), batch_size, shuffle=True, device="cpu",
                          num_workers=workers),
        source: torch.utils.data.DataLoader(_Boxes(blobs, pipeline()), batch_size, shuffle=True,
                                            num_workers=workers, persistent_workers=True, prefetch_factor=4,
                                            collate_fn=as_lists),
    }
    notes = {OURS: f"batch {batch_size}, targets per sample; {_reader(ours)}",
             source: f"JPEG bytes in RAM, {jpeg_codec().name}.decode_jpeg per item, list collate, persistent, "
                     "prefetch 4"}
    return _rows("augment/detection v2", loaders, {"x worker processes": procs, "x torch DataLoader": source}, notes,
                 len(blobs), repeats, min_seconds)


def _export(ds: H5ImageFolder, out: Path) -> Path:
    """The mirror's JPEGs as an ImageFolder tree (for the methods that read files); made once."""
    if out.exists():
        return out
    for i, (data_, label) in enumerate(ds):
        folder = out / ds.classes[label]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.jpg").write_bytes(data_.numpy().tobytes())
    return out


SPDL = "SPDL"


def _spdl_crop_flip(width: int, height: int) -> str:
    """One image's ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip`` as an FFmpeg filter: the crop
    drawn by torchvision's own ``RandomResizedCrop.get_params`` (scale (0.08, 1), ratio (3/4, 4/3)), cut in
    the decoder's YUV, scaled bilinearly to 224 x 224, flipped with p = 0.5, converted to rgb24."""
    import spdl.io
    from torchvision.transforms import RandomResizedCrop

    shape = torch.empty(1, 1, 1).expand(3, height, width)  # get_params reads only the size
    i, j, h, w = RandomResizedCrop.get_params(shape, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3])
    flip = ",hflip" if torch.rand(1).item() < 0.5 else ""
    return spdl.io.get_video_filter_desc(
        filter_desc=f"crop=w={w}:h={h}:x={j}:y={i}:exact=1,scale=w={CROP}:h={CROP}:flags=bilinear{flip}",
        pix_fmt="rgb24")


def _spdl(loaders: dict[str, Iterable], notes: dict[str, str], files: Path, scenario: str, batch_size: int,
          workers: int) -> list[Result]:
    """Add the ``SPDL`` row's loader to ``loaders`` (and its note): SPDL's pipeline
    (:class:`colabfast.tools.bench.peers.SPDLLoader`: ``PipelineBuilder``, ``workers`` decoding threads,
    FFmpeg decoding each JPEG file of ``files`` with :func:`_spdl_crop_flip`'s filter); where it cannot
    run, return the row saying why instead."""
    from torchvision.datasets import ImageFolder

    from colabfast.tools.bench.peers import SPDL as PEER
    from colabfast.tools.bench.peers import SPDLLoader

    why = PEER.missing()
    if why:
        return [Result(scenario, SPDL, None, note=f"SPDL {why}")]
    loaders[SPDL] = SPDLLoader(ImageFolder(str(files)).samples, _spdl_crop_flip, batch_size, workers)
    notes[SPDL] = (f"SPDL {PEER.version()}, PipelineBuilder, {workers} threads, the JPEG files decoded by FFmpeg "
                   "with the crop, scale and flip in its filter graph")
    return []
