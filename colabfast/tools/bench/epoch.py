"""Epoch throughput: images/s of one epoch over an ImageNet-style tree of real JPEGs, every way a user
would read it, from local disk and from the Drive simulator.

Methods, all yielding the same batches (uint8 images ``[B, 3, 224, 224]`` after one ``CenterCrop(224)``,
and labels) with the same batch size; the others' loaders with ``num_workers`` workers (threads for
FFCV), colabfast's mirrors through :class:`colabfast.DataLoader` with its defaults, as a user runs it
(its reader threads, the crop fused with decoding; it used to be given ``num_workers`` too, which
put the crop in worker processes), and ``memory_format=torch.channels_last``: FFCV's layout
(``ToTorchImage``'s default), and what a GPU training step in channels-last wants; in
``torch.contiguous_format`` each image also goes through a transposing copy, about 75 us per 224 px
image on one core, which FFCV's rows do not pay either:

- torchvision ``ImageFolder`` over the files (PIL decode), a plain ``torch.utils.data.DataLoader``;
- the naive h5 Dataset of the seeds (:class:`NaiveH5`): vlen JPEG bytes, ``num_workers=0``;
- colabfast's encoded and raw mirrors (:func:`colabfast.pack`, :class:`colabfast.H5ImageFolder`,
  :class:`colabfast.DataLoader`); from Drive also the mirror staged to local disk first;
- the peers of :mod:`colabfast.tools.bench.peers` (WebDataset, LitData, MosaicML Streaming, Efficio, FFCV, SPDL);
- the decode-only ceiling (local only): TorchCodec or torchvision.io (:mod:`colabfast.where.codec`) on the
  encoded files already in RAM;
- for a peer whose crop yields strided views of the uncropped batches (FFCV: its torch transforms run
  on whole batches), the same loader with each batch made dense (local only, a reference row: the copy
  a model's first layer or ``.cuda()`` makes of such a batch, which every other method's batches have
  paid already).

How each figure is taken:

- preparation (``prep s``, ``disk MB``): each method's own conversion of the tree, timed once.
- local disk (page cache warm, as after staging): the loader is built and one epoch run untimed
  (worker start-up, FFCV's compilation: ``1st epoch s``); then the methods take turns: ``repeats``
  rounds, each method timed for whole epochs lasting at least ``MIN_SECONDS`` per round (per-epoch
  median, min and max over the rounds).
- Drive (cold): each repeat builds a fresh loader over the prepared data on the simulated Drive and
  times it through one full epoch; reopening files there drops the kernel's cached pages (FUSE without
  ``keep_cache``), so every repeat reads from the simulated link (``Drive MB``: what it read).
- cost (``CPU ms/img``): user + system CPU of the whole process tree (threads, worker processes) per
  image over each timed repeat (`colabfast.tools.bench.timing.usage`), the median; on Drive the
  simulator's server is counted apart (``Drive sim CPU ms/img``). On a shared machine this is the
  steadier figure; on Colab's 2 CPUs a CPU-bound loader runs at about 2 / (CPU s per image).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import h5py
import numpy as np
import torch
from PIL import Image

from colabfast.testing import data
from colabfast.tools.bench import peers as peer_module
from colabfast.tools.bench.timing import Result, Spread, usage
from colabfast.where import env
from colabfast.where.codec import decode_jpeg, jpeg_codec

# (width, height): pre-resized ImageNet (FFCV's and most recipes' 256 px) and ImageNet's average size.
IMAGE_SIZES = {"256px": (256, 256), "500x375": (500, 375)}
CROP = 224
CLASSES = 10


MIN_SECONDS = 3.0  # a local repeat runs whole epochs for at least this long


def transform() -> torch.nn.Module:
    """The one transform every method applies: ``CenterCrop(224)`` on uint8 ``[3, H, W]`` (or a batch)."""
    from torchvision.transforms import v2

    return v2.CenterCrop(CROP)


class NaiveH5(torch.utils.data.Dataset):
    """The seeds' h5 Dataset, kept as the baseline it is: every JPEG as a variable-length uint8 entry of
    one h5py dataset, the file opened once in ``__init__`` and read through h5py per sample, decoded by
    PIL. The open handle cannot cross into DataLoader workers (h5py handles break across a fork and
    cannot be pickled), which is why it runs with ``num_workers=0``."""

    def __init__(self, path: Path, transform: Callable) -> None:
        self.file = h5py.File(path, "r")
        self.images, self.labels = self.file["images"], self.file["labels"][:]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.transforms.v2.functional import pil_to_tensor

        with Image.open(io.BytesIO(self.images[index].tobytes())) as image:
            pixels = pil_to_tensor(image.convert("RGB"))
        return self.transform(pixels), int(self.labels[index])

    @staticmethod
    def write(samples: Sequence[tuple[str, int]], path: Path) -> None:
        """Write ``samples`` (file, label) the naive way: one vlen entry per file."""
        with h5py.File(path, "w") as f:
            images = f.create_dataset("images", (len(samples),), dtype=h5py.vlen_dtype(np.uint8))
            for i, (file, _) in enumerate(samples):
                images[i] = np.frombuffer(Path(file).read_bytes(), dtype=np.uint8)
            f.create_dataset("labels", data=np.array([label for _, label in samples], dtype=np.int64))


class EncodedInRAM(torch.utils.data.Dataset):
    """The decode-only ceiling: the encoded files as uint8 tensors in RAM, decoded by TorchCodec or torchvision.io
    (whichever :func:`colabfast.where.codec.jpeg_codec` names)
    (the decoder of colabfast's encoded mirror), so nothing but decoding and the transform costs."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable) -> None:
        self.files = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p, _ in samples]
        self.labels = [label for _, label in samples]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(decode_jpeg(self.files[index])), self.labels[index]


class PixelsInRAM(torch.utils.data.Dataset):
    """The raw-pixel ceiling: every image decoded once into one uint8 tensor ``[N, H, W, 3]`` in RAM
    (what a ``TensorDataset`` of the images holds), served as CHW views with the same transform, so
    nothing but indexing, the transform and batching costs."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable) -> None:
        first = decode_jpeg(torch.frombuffer(bytearray(Path(samples[0][0]).read_bytes()), dtype=torch.uint8))
        self.pixels = torch.empty((len(samples), first.shape[1], first.shape[2], 3), dtype=torch.uint8)
        for i, (p, _) in enumerate(samples):
            data = torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8)
            self.pixels[i] = decode_jpeg(data).permute(1, 2, 0)
        self.labels = [label for _, label in samples]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.pixels[index].permute(2, 0, 1)), self.labels[index]


@dataclasses.dataclass
class _Method:
    """One way to read the tree.

    Attributes:
        name: as the tables show it.
        open_loader: ``open_loader(root, cache)`` returns a loader over the prepared copy at ``root``:
            on local disk with ``cache`` None, or on the simulated Drive with ``cache`` an empty local
            folder the method may fill (staging, the peers' local caches).
        prepare: ``prepare(root)`` writes the method's format under ``root``; None: nothing to prepare.
        load: imports what the method needs, run untimed before ``prepare``.
        data: the file or folder under ``root`` that holds what it reads (its size is ``disk MB``).
        note: the caveat the tables print.
        missing: why it cannot run here (a peer not installed), or ``""``.
        reference: a yardstick (the decode-only ceiling), not an alternative.
        slow: a slow baseline, timed ``baseline_repeats`` times.
        local, drive: which sources it runs from.
        prepared: ``{"prep s", "disk MB"}`` once prepared.
        failed: why preparing failed, or ``""``.
    """

    name: str
    open_loader: Callable[[Path, Optional[Path]], Iterable]
    prepare: Optional[Callable[[Path], None]] = None
    load: Optional[Callable[[], None]] = None
    data: str = ""
    note: str = ""
    missing: str = ""
    reference: bool = False
    slow: bool = False
    local: bool = True
    drive: bool = True
    prepared: Optional[dict[str, float]] = None
    failed: str = ""


def _methods(samples: list[tuple[str, int]], image_size: tuple[int, int], batch_size: int, workers: int,
             peer_list: Sequence[peer_module.Peer]) -> list[_Method]:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    from colabfast.datasets.dropins import H5ImageFolder
    from colabfast.loading.loader import DataLoader
    from colabfast.packing import pack
    from colabfast.staging.pipeline import stage

    crop = transform()

    def plain(dataset: Any, num_workers: int = workers) -> Iterable:
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers)

    def ours(dataset: Any) -> Iterable:  # the in-RAM ceilings: not mirrors, read by workers
        return DataLoader(dataset, batch_size, shuffle=True, num_workers=workers, device="cpu")

    def defaults(dataset: Any) -> Iterable:  # a mirror: the loader's own choices, in FFCV's layout
        return DataLoader(dataset, batch_size, shuffle=True, device="cpu", memory_format=torch.channels_last)

    def mirror(name: str) -> Callable[[Path, Optional[Path]], Iterable]:
        return lambda root, cache: defaults(H5ImageFolder(root / name, transform=crop, output="tensor"))

    def staged(root: Path, cache: Optional[Path]) -> Iterable:
        local = stage(root / "encoded.h5", cache / "encoded.h5", progress=False)
        return defaults(H5ImageFolder(local, transform=crop, output="tensor"))

    src = Path(samples[0][0]).parent.parent
    methods = [
        _Method("torchvision ImageFolder", lambda root, cache: plain(ImageFolder(
            root / "imagefolder", transform=v2.Compose([v2.PILToTensor(), crop]))), data="imagefolder",
            note="one file per image, PIL decode, torch DataLoader", slow=True),
        _Method("naive h5 Dataset (vlen, num_workers=0)",
                lambda root, cache: plain(NaiveH5(root / "naive.h5", crop), num_workers=0),
                prepare=lambda out: NaiveH5.write(samples, out / "naive.h5"), data="naive.h5",
                note="h5py file opened in __init__: breaks in workers, so no workers; PIL decode", slow=True),
        _Method("colabfast encoded mirror", mirror("encoded.h5"),
                prepare=lambda out: pack(src, out / "encoded.h5", store="encoded", workers=workers, progress=False),
                data="encoded.h5",
                note="pack(store='encoded'); H5ImageFolder(output='tensor') + colabfast.DataLoader (defaults: "
                     "reader threads, the crop fused; channels-last); libjpeg-turbo decode"),
        _Method("colabfast raw mirror", mirror("raw.h5"),
                prepare=lambda out: pack(src, out / "raw.h5", store="raw", workers=workers, progress=False),
                data="raw.h5",
                note="pack(store='raw'): decoded pixels; H5ImageFolder + colabfast.DataLoader (defaults, "
                     "channels-last)"),
        _Method("colabfast encoded mirror, staged first", staged, local=False,
                note="colabfast.stage() of the mirror to local disk, then the epoch; both timed"),
    ]
    for peer in peer_list:
        def open_peer(root: Path, cache: Optional[Path], peer: peer_module.Peer = peer) -> Iterable:
            return peer.loader(root / _slug(peer.name), crop, batch_size, workers, cache)

        def prepare_peer(out: Path, peer: peer_module.Peer = peer) -> None:
            peer.prepare(samples, out / _slug(peer.name), image_size, workers)

        version = peer.version()
        methods.append(_Method(f"{peer.name} {version}".strip(), open_peer, prepare=prepare_peer, load=peer.load,
                               data=_slug(peer.name), note=f"{peer.note}; decode: {peer.decoder}",
                               missing=peer.missing()))
        if peer.views:  # the same loader over the same data, each batch made dense as it is handed out
            methods.append(_Method(
                f"{peer.name} {version}".strip() + ", each batch made dense",
                lambda root, cache, open_peer=open_peer: Dense(open_peer(root, cache)), load=peer.load,
                missing=peer.missing(), reference=True, drive=False,
                note="the row above, each batch made dense as a model's first layer or .cuda() makes a strided "
                     "batch: x.contiguous(memory_format=torch.channels_last)"))
    methods.append(_Method(f"decode-only ceiling ({jpeg_codec().name}, JPEGs in RAM)",
                           lambda root, cache: ours(EncodedInRAM(samples, crop)), reference=True, drive=False,
                           note="the same decoder on the same bytes already in RAM: no I/O"))
    methods.append(_Method("decoded pixels in RAM (TensorDataset-like)",
                           lambda root, cache: ours(PixelsInRAM(samples, crop)), reference=True, drive=False,
                           note="every image decoded into one uint8 tensor in RAM: the ceiling for a raw mirror"))
    return methods


class Dense:
    """``loader``'s batches ``(images, labels)`` with ``images`` made dense in channels-last memory
    (a no-op for a batch that is already); re-iterable as ``loader`` is."""

    def __init__(self, loader: Iterable) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[tuple[torch.Tensor, Any]]:
        for x, y in self.loader:
            yield x.contiguous(memory_format=torch.channels_last), y


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _epoch(loader: Iterable) -> int:
    """Run one epoch; return the images seen. Raises if a batch is not what every method must yield."""
    images = 0
    for batch in loader:
        x = batch[0]
        if not (isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and tuple(x.shape[1:]) == (3, CROP, CROP)):
            got = f"{type(x).__name__} {getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}"
            raise RuntimeError(f"batches must hold uint8 images [B, 3, {CROP}, {CROP}]; got {got}")
        images += len(x)
    return images


def _failed(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return "failed: " + (text if len(text) <= 160 else text[:157] + "...")


def _prepare(methods: list[_Method], out: Path) -> None:
    for m in methods:
        if m.missing:
            continue
        try:
            if m.load is not None:
                m.load()
            start = time.perf_counter()
            if m.prepare is not None:
                with contextlib.redirect_stdout(io.StringIO()):  # peers print progress
                    m.prepare(out)
        except Exception as exc:  # a peer's failure is a row's note, not the end of the suite
            m.failed = _failed(exc)
            continue
        m.prepared = {} if m.reference else {"prep s": time.perf_counter() - start}
        if m.data:
            m.prepared["disk MB"] = _tree_bytes(out / m.data) / 1e6


def _skipped(scenario: str, m: _Method) -> Optional[Result]:
    reason = m.missing or m.failed
    return Result(scenario, m.name, None, note=reason, reference=m.reference) if reason else None


def _timed(loader: Iterable, min_seconds: float) -> tuple[float, int, float]:
    """Whole epochs of ``loader`` until ``min_seconds`` have passed: (seconds per epoch, images per epoch,
    CPU ms per image of the process tree)."""
    epochs, images, start, cpu = 0, 0, time.perf_counter(), usage().cpu
    while True:
        images = _epoch(loader)
        epochs += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / epochs, images, (usage().cpu - cpu) / (epochs * images) * 1e3


def _local(scenario: str, methods: list[_Method], root: Path, repeats: int, baseline_repeats: int,
           min_seconds: float = MIN_SECONDS) -> list[Result]:
    """Every local method's loader is opened (one untimed warm-up epoch each), then the methods take
    turns repeat by repeat, so drift in the machine's speed hits all of them alike; a repeat is whole
    epochs lasting at least ``min_seconds`` (epochs of a fraction of a second are mostly noise)."""
    rows: dict[str, Result] = {}
    loaders: dict[str, Any] = {}
    times: dict[str, list[float]] = {}
    costs: dict[str, list[float]] = {}
    images: dict[str, int] = {}
    first: dict[str, float] = {}
    chosen = [m for m in methods if m.local]
    try:
        for m in chosen:
            skipped = _skipped(scenario, m)
            if skipped:
                rows[m.name] = skipped
                continue
            try:
                start = time.perf_counter()
                loaders[m.name] = m.open_loader(root, None)
                _epoch(loaders[m.name])
                first[m.name], times[m.name], costs[m.name] = time.perf_counter() - start, [], []
            except Exception as exc:
                rows[m.name] = Result(scenario, m.name, None, note=_failed(exc), reference=m.reference)
                loaders.pop(m.name, None)
        for rep in range(max(repeats, baseline_repeats)):
            for m in chosen:
                if m.name not in loaders or rep >= (baseline_repeats if m.slow else repeats):
                    continue
                try:
                    seconds, images[m.name], cost = _timed(loaders[m.name], min_seconds)
                    times[m.name].append(seconds)
                    costs[m.name].append(cost)
                except Exception as exc:
                    rows[m.name] = Result(scenario, m.name, None, note=_failed(exc), reference=m.reference)
                    del loaders[m.name]
    finally:
        loaders.clear()
        gc.collect()  # the loaders' workers, files and shared memory go before the next scenario
    for m in chosen:
        if m.name in rows or not times.get(m.name):
            continue
        t, cost = times[m.name], Spread.of(costs[m.name])
        med = float(np.median(t))
        spread = f"CPU ms/img min-max {cost.low:.3g}-{cost.high:.3g}"
        rows[m.name] = Result(scenario, m.name, med, min(t), max(t), len(t),
                              {"images/s": images[m.name] / med, "CPU ms/img": cost.median,
                               "1st epoch s": first[m.name], **(m.prepared or {})},
                              note="; ".join(filter(None, [m.note, spread])), reference=m.reference)
    return [rows[m.name] for m in chosen if m.name in rows]


def _drive(scenario: str, methods: list[_Method], sim: Any, root: Path, repeats: int, baseline_repeats: int,
           cache: Path) -> list[Result]:
    rows = []
    for m in methods:
        if not m.drive:
            continue
        skipped = _skipped(scenario, m)
        if skipped:
            rows.append(skipped)
            continue
        reps = baseline_repeats if m.slow else repeats
        times, costs, sim_costs, images, read = [], [], [], 0, 0
        loader = None
        try:
            for _ in range(reps):
                shutil.rmtree(cache, ignore_errors=True)
                cache.mkdir(parents=True)
                before = sim.stats()["bytes_read"]
                start = usage(exclude=[sim.pid])
                loader = m.open_loader(root, cache)
                images = _epoch(loader)
                spent = usage(exclude=[sim.pid]) - start
                times.append(spent.wall)
                costs.append(spent.cpu / images * 1e3)
                sim_costs.append(spent.excluded / images * 1e3)
                read = sim.stats()["bytes_read"] - before
                loader = None
                gc.collect()
        except Exception as exc:
            rows.append(Result(scenario, m.name, None, note=_failed(exc), reference=m.reference))
            continue
        finally:
            loader = None
            gc.collect()
        med = float(np.median(times))
        cost = Spread.of(costs)
        rows.append(Result(scenario, m.name, med, min(times), max(times), reps,
                           {"images/s": images / med, "CPU ms/img": cost.median,
                            "Drive sim CPU ms/img": float(np.median(sim_costs)), "Drive MB": read / 1e6},
                           note="; ".join(filter(None, [m.note, f"CPU ms/img min-max {cost.low:.3g}-{cost.high:.3g} "
                                                        "(the Drive simulator's server apart)"])),
                           reference=m.reference))
    shutil.rmtree(cache, ignore_errors=True)
    return rows


def run(
    size: float = 1.0,
    repeats: int = 3,
    baseline_repeats: int = 1,
    image_sizes: Sequence[str] = tuple(IMAGE_SIZES),
    sources: Sequence[str] = ("local", "drive"),
    batch_size: int = 64,
    num_workers: Optional[int] = None,
    peers: Optional[Sequence[peer_module.Peer]] = None,
    drive: Optional[dict] = None,
    work: Optional[Path] = None,
    min_seconds: float = MIN_SECONDS,
) -> list[Result]:
    """Measure epoch throughput; one scenario ``epoch/<image size>/<source>`` per combination.

    Args:
        size: scale: 1.0 is 2000 images (10 classes) per image size; the slow baselines from Drive
            take about images x 0.1 s / num_workers at 1.0 (ImageFolder: ~100 s per epoch).
        repeats: timed repeats per method (median reported, with min and max). From local disk the
            methods take turns repeat by repeat and a repeat is whole epochs lasting ``min_seconds``.
        baseline_repeats: timed epochs of the slow baselines (ImageFolder, naive h5).
        image_sizes: keys of :data:`IMAGE_SIZES`.
        sources: ``"local"`` and/or ``"drive"`` (the Drive simulator; needs FUSE).
        batch_size: images per batch, for every method.
        num_workers: loader workers for every method but the naive h5 one (default: the CPU count,
            as on Colab: 2); also the processes each method's preparation may use.
        peers: the peers to run (default: all of :data:`colabfast.tools.bench.peers.PEERS`; those not
            installed get a row with a note).
        drive: simulator settings over :class:`~colabfast.drivesim.fs.DriveSimParams`' defaults
            (100 ms per open, 2 ms per read, 60 MB/s).
        work: where to put the data (default: a temp folder).

    Returns:
        Rows with ``images/s``; local rows also ``1st epoch s``, ``prep s`` and ``disk MB``; Drive rows
        ``Drive MB`` (read through the simulator in the last timed epoch).

    Raises:
        ValueError: an unknown image size or source.
    """
    unknown = [s for s in image_sizes if s not in IMAGE_SIZES] + [s for s in sources if s not in ("local", "drive")]
    if unknown:
        raise ValueError(f"unknown image size or source {unknown}; image sizes: {', '.join(IMAGE_SIZES)}; "
                         "sources: local, drive")
    # Imported here, before any worker forks, so that no worker pays torchvision's import.
    from torchvision.datasets import ImageFolder

    workers = env.cpu_count() if num_workers is None else num_workers
    peer_list = peer_module.PEERS if peers is None else peers
    n_per_class = max(2, round(2000 * size / CLASSES))
    rows: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as tmp:
        tmp = Path(tmp)
        prepared: dict[str, list[_Method]] = {}
        for key in image_sizes:
            width, height = IMAGE_SIZES[key]
            root = tmp / "data" / key
            tree = data.make_imagefolder(root / "imagefolder", classes=CLASSES, per_class=n_per_class,
                                         size=(width, height), seed=len(prepared))
            samples = ImageFolder(tree).samples
            methods = _methods(samples, (width, height), batch_size, workers, peer_list)
            _prepare(methods, root)
            prepared[key] = methods
            if "local" in sources:
                rows += _local(f"epoch/{key}/local", methods, root, repeats, baseline_repeats, min_seconds)
        if "drive" in sources:
            from colabfast.drivesim.fs import available
            from colabfast.drivesim.simulator import DriveSim

            ok, why = available()
            if not ok:
                return rows + [Result(f"epoch/{key}/drive", "every method", None,
                                      note=f"Drive simulator unavailable: {why}") for key in prepared]
            with DriveSim(tmp / "data", tmp / "mnt", **(drive or {})) as sim:
                for key, methods in prepared.items():
                    rows += _drive(f"epoch/{key}/drive", methods, sim, sim.mountpoint / key, repeats,
                                   baseline_repeats, tmp / "cache")
    return rows

