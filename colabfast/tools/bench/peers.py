"""The tools a user would pick instead of colabfast, each prepared and read the way its documentation shows.

Every peer turns the same ImageFolder samples into its own format (:attr:`Peer.prepare`, timed by the
caller, which also records the size on disk) and reads them back (:attr:`Peer.loader`) into the same
output as every other method of the epoch scenario: batches ``(images, labels)`` with images a uint8
tensor ``[B, 3, h, w]`` after the same ``transform``, with the same batch size and ``num_workers``.
Each peer decodes with the decoder its documentation uses (PIL, torchvision.io, FFCV's own, SPDL's FFmpeg), named in
:attr:`Peer.decoder` so the tables can say what a row measures.

Peers are optional (``pip install ".[bench]"`` from a clone): :meth:`Peer.missing` says why one cannot run,
and the scenario reports that in a note instead of a number.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import io
import math
import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch

Samples = Sequence[tuple[str, int]]  # (image file, class index), in ImageFolder order
Transform = Callable[[torch.Tensor], torch.Tensor]  # uint8 [3, H, W] -> uint8 [3, h, w]


@dataclasses.dataclass(frozen=True)
class Peer:
    """One alternative to colabfast.

    Attributes:
        name: as the tables show it, e.g. ``"WebDataset"``.
        module: the import name that must be importable.
        distribution: the PyPI name (for the version and the install hint).
        docs: the documentation page followed.
        decoder: what turns the stored bytes into pixels.
        prepare: ``prepare(samples, out, image_size, workers)`` writes the peer's format into the
            folder ``out`` from ``samples``, all of ``image_size`` (width, height) pixels.
        loader: ``loader(out, transform, batch_size, num_workers, cache)`` returns an iterable over
            one epoch of shuffled batches ``(uint8 images [B, 3, h, w], labels)``, re-iterable for more
            epochs. ``cache`` is None for data on local disk; for data on a network drive it is an empty
            local folder, which peers whose docs copy remote data into a local cache use for that.
        note: a caveat the tables print beside the figures.
        imports: modules :meth:`load` imports, so that import time (seconds for some peers) is not
            counted as preparation or reading time.
        install: how to install it, when ``pip install <distribution>`` is not enough.
        views: its batches after a crop are strided views of the uncropped batches (FFCV runs a torch
            transform on whole batches), so the crop's copy is left to whoever uses them; ``colabfast
            bench epoch`` then also times them made dense, as a reference row.
    """

    name: str
    module: str
    distribution: str
    docs: str
    decoder: str
    prepare: Callable[[Samples, Path, tuple[int, int], int], None]
    loader: Callable[[Path, Transform, int, int, Optional[Path]], Iterable]
    note: str = ""
    imports: tuple[str, ...] = ()
    install: str = ""
    views: bool = False

    def load(self) -> None:
        """Import the peer's modules now (its ``module`` and ``imports``)."""
        for name in (self.module, *self.imports):
            importlib.import_module(name)

    def missing(self) -> str:
        """``""`` when the peer is installed, else why not and how to install it."""
        if importlib.util.find_spec(self.module) is None:
            how = self.install or f'pip install {self.distribution}, or pip install ".[bench]" from a clone'
            return f"not installed ({how})"
        return ""

    def version(self) -> str:
        """The installed version, or ``""``."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return ""


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of a ``with`` block (forked workers inherit them)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _identity(x: Any) -> Any:
    return x


class _Mapped(torch.utils.data.Dataset):
    """``dataset`` with ``transform`` applied to each sample's image; samples become ``(image, label)``."""

    def __init__(self, dataset: Any, transform: Transform, image_key: Any = 0, label_key: Any = 1,
                 to_tensor: Callable[[Any], torch.Tensor] = _identity) -> None:
        self.dataset, self.transform = dataset, transform
        self.image_key, self.label_key, self.to_tensor = image_key, label_key, to_tensor

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        sample = self.dataset[index]
        return self.transform(self.to_tensor(sample[self.image_key])), int(sample[self.label_key])


# --- WebDataset --------------------------------------------------------------------------------------


def _wds_prepare(samples: Samples, out: Path, image_size: tuple[int, int], workers: int) -> None:
    import webdataset as wds

    # At least two shards per worker: WebLoader hands whole shards to workers, and one shard would
    # leave the other worker idle. 64 MB at most, as the docs' shards are "a few hundred MB" at most.
    per_shard = max(1, math.ceil(len(samples) / (2 * max(1, workers))))
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=per_shard, maxsize=64e6, verbose=0) as sink:
        for i, (path, label) in enumerate(samples):
            sink.write({"__key__": f"{i:08d}", "jpg": Path(path).read_bytes(), "cls": label})


def _wds_loader(out: Path, transform: Transform, batch_size: int, num_workers: int, cache: Optional[Path]) -> Iterable:
    import webdataset as wds

    urls = sorted(str(p) for p in out.glob("shard-*.tar"))
    dataset = (
        wds.WebDataset(urls, shardshuffle=100)
        .shuffle(1000)
        .decode("torchrgb8")
        .to_tuple("jpg", "cls")
        .map_tuple(transform, _identity)
        .batched(batch_size)
    )
    return wds.WebLoader(dataset, batch_size=None, num_workers=num_workers)


WEBDATASET = Peer(
    name="WebDataset",
    module="webdataset",
    distribution="webdataset",
    docs="https://github.com/webdataset/webdataset#readme (ShardWriter; WebDataset + WebLoader, batching in "
         "the dataset)",
    decoder="PIL (decode('torchrgb8'))",
    prepare=_wds_prepare,
    loader=_wds_loader,
    note="sequential tar shards, no random access: shard shuffle + 1000-sample buffer instead of a full permutation",
)


# --- LitData -----------------------------------------------------------------------------------------


def _litdata_sample(item: tuple[str, int]) -> dict:
    from PIL import Image

    path, label = item
    # An opened JPEG file is stored as its own bytes (litdata's JPEGSerializer), not re-encoded.
    return {"image": Image.open(path), "class": label}


class _LitItem:
    """LitData's per-item ``transform``: the stored dict to ``(transform(image), label)``."""

    def __init__(self, transform: Transform) -> None:
        self.transform = transform

    def __call__(self, item: dict) -> tuple[torch.Tensor, int]:
        return self.transform(item["image"]), item["class"]


def _litdata_prepare(samples: Samples, out: Path, image_size: tuple[int, int], workers: int) -> None:
    import litdata

    # optimize() sets the global multiprocessing start method with force=True: "fork" in notebooks
    # (Colab), "spawn" elsewhere, where its workers would re-run an unguarded __main__. Use what it uses
    # in Colab, and put back what was there, or every DataLoader measured after it would change too.
    method = multiprocessing.get_start_method(allow_none=True)
    # Its working folders (default: chunks/ and data/ in the system temp folder, left behind) go
    # beside the output instead, and are removed with it.
    work = out.parent / f".{out.name}-optimize"
    try:
        with _environ(DATA_OPTIMIZER_CACHE_FOLDER=str(work / "chunks"),
                      DATA_OPTIMIZER_DATA_CACHE_FOLDER=str(work / "data")):
            litdata.optimize(fn=_litdata_sample, inputs=list(samples), output_dir=str(out), chunk_bytes="64MB",
                             num_workers=max(1, workers), start_method="fork", verbose=False)
    finally:
        multiprocessing.set_start_method(method, force=True)
        shutil.rmtree(work, ignore_errors=True)


def _litdata_loader(out: Path, transform: Transform, batch_size: int, num_workers: int,
                    cache: Optional[Path]) -> Iterable:
    import litdata

    # On a network drive the docs prefix the path with "local:", and LitData copies chunks to a
    # local cache before reading them ("Optimize loading on networked drives").
    source = str(out) if cache is None else f"local:{out}"
    dataset = litdata.StreamingDataset(source, cache_dir=None if cache is None else str(cache), shuffle=True,
                                       transform=_LitItem(transform))
    return litdata.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers)


LITDATA = Peer(
    name="LitData",
    module="litdata",
    distribution="litdata",
    docs="https://github.com/Lightning-AI/litData#readme (optimize; StreamingDataset + StreamingDataLoader)",
    decoder="torchvision.io (litdata's JPEG serializer)",
    prepare=_litdata_prepare,
    loader=_litdata_loader,
    note="64 MB chunks, shuffled, then samples within the chunks a worker holds; from Drive: input_dir "
         "'local:<path>', chunks copied to a local cache_dir",
)


# --- MosaicML Streaming ------------------------------------------------------------------------------


def _mds_prepare(samples: Samples, out: Path, image_size: tuple[int, int], workers: int,
                 size_limit: int | str = "64mb") -> None:
    from PIL import Image
    from streaming import MDSWriter

    # "jpeg" columns keep an opened JPEG file's own bytes; no compression (the writer's default):
    # JPEG does not compress further. ``size_limit``: bytes per shard (a cache_limit must be >= 4 shards).
    with MDSWriter(out=str(out), columns={"image": "jpeg", "class": "int"}, size_limit=size_limit) as writer:
        for path, label in samples:
            with Image.open(path) as image:
                writer.write({"image": image, "class": label})


def _pil_to_tensor(image: Any) -> torch.Tensor:
    from torchvision.transforms.v2.functional import pil_to_tensor

    return pil_to_tensor(image.convert("RGB"))


def _mds_dataset_class() -> type:
    from streaming import StreamingDataset

    class MDSImages(StreamingDataset):
        """StreamingDataset whose samples are ``(transform(image), label)`` (the docs subclass it so)."""

        def __init__(self, *, transform: Transform, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.transform = transform

        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            sample = super().__getitem__(index)
            return self.transform(_pil_to_tensor(sample["image"])), int(sample["class"])

    return MDSImages


def _mds_loader(out: Path, transform: Transform, batch_size: int, num_workers: int, cache: Optional[Path],
                cache_limit: Optional[int] = None, timeout: float = 0, **shuffle: Any) -> Iterable:
    from streaming.base.util import clean_stale_shared_memory

    # The docs' advice after an interrupted run (which notebooks have often): stale shared memory
    # from a previous StreamingDataset otherwise makes the next one fail.
    clean_stale_shared_memory()
    # Remote data (a plain path is a remote too) is named by remote= and copied shard by shard into the
    # local= cache; local data is read in place.
    where = {"local": str(out)} if cache is None else {"remote": str(out), "local": str(cache)}
    # cache_limit (bytes): Streaming evicts shards from local= to stay under it. timeout (seconds): a
    # batch that long in coming raises, as a worker whose shard download failed waits forever.
    # shuffle: StreamingDataset's shuffle_algo / shuffle_block_size, where the caller sizes them to the cache.
    dataset = _mds_dataset_class()(**where, shuffle=True, batch_size=batch_size, transform=transform,
                                   cache_limit=cache_limit, **shuffle)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, timeout=timeout)


MOSAICML_STREAMING = Peer(
    name="MosaicML Streaming",
    module="streaming",
    distribution="mosaicml-streaming",
    docs="https://docs.mosaicml.com/projects/streaming/en/stable/getting_started/quick_start.html "
         "(MDSWriter; StreamingDataset + DataLoader)",
    decoder="PIL ('jpeg' column)",
    prepare=_mds_prepare,
    loader=_mds_loader,
    imports=("streaming.base.util",),
    note="64 MB MDS shards, py1e shuffle; from Drive: remote=<path>, shards copied to local=",
)


# --- Efficio -----------------------------------------------------------------------------------------


def _efficio_prepare(samples: Samples, out: Path, image_size: tuple[int, int], workers: int) -> None:
    from efficio import ImageCache

    width, height = image_size
    # size = the images' own size, so the cache holds the same pixels, not resized ones.
    ImageCache.build([p for p, _ in samples], [c for _, c in samples], str(out), size=(height, width),
                     workers=max(1, workers), verbose=False)


def _efficio_loader(out: Path, transform: Transform, batch_size: int, num_workers: int,
                    cache: Optional[Path]) -> Iterable:
    from efficio import CachedImageDataset

    dataset = _Mapped(CachedImageDataset(str(out)), transform)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers)


EFFICIO = Peer(
    name="Efficio",
    module="efficio",
    distribution="efficio",
    docs="https://github.com/HuNTer8272/Efficio#large-image-datasets (ImageCache.build; "
         "DataLoader(CachedImageDataset))",
    decoder="none: decoded uint8 pixels (ImageCache, one .npy)",
    prepare=_efficio_prepare,
    loader=_efficio_loader,
    note="stores decoded pixels, resized to one fixed size",
)


# --- FFCV --------------------------------------------------------------------------------------------


class _PILFiles:
    """The indexed dataset FFCV's writer reads: ``(PIL RGB image, label)`` per sample."""

    def __init__(self, samples: Samples) -> None:
        self.samples = list(samples)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            return image.convert("RGB"), label


def _ffcv_prepare(write_mode: str) -> Callable[[Samples, Path, tuple[int, int], int], None]:
    def prepare(samples: Samples, out: Path, image_size: tuple[int, int], workers: int) -> None:
        from ffcv.fields import IntField, RGBImageField
        from ffcv.writer import DatasetWriter

        out.mkdir(parents=True, exist_ok=True)
        fields = {"image": RGBImageField(write_mode=write_mode, max_resolution=max(image_size), jpeg_quality=90),
                  "label": IntField()}
        with contextlib.redirect_stderr(io.StringIO()):  # its tqdm bar
            DatasetWriter(str(out / "data.beton"), fields, num_workers=max(1, workers)).from_indexed_dataset(
                _PILFiles(samples))

    return prepare


def _ffcv_loader(out: Path, transform: Optional[Transform], batch_size: int, num_workers: int,
                 cache: Optional[Path]) -> Iterable:
    """FFCV's ``Loader`` over ``out``'s file; ``transform=None`` gives its batches as decoded:
    uint8 ``[B, 3, H, W]`` in channels-last memory (``ToTorchImage``'s default)."""
    from ffcv.fields.decoders import IntDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import Squeeze, ToTensor, ToTorchImage

    image = [SimpleRGBImageDecoder(), ToTensor(), ToTorchImage()]
    pipelines = {
        # FFCV runs torch modules on whole batches: the same crop, applied to [B, 3, H, W].
        "image": image if transform is None else [*image, transform],
        "label": [IntDecoder(), ToTensor(), Squeeze()],
    }
    # drop_last=False like every other loader here (FFCV's default drops the last partial batch).
    return Loader(str(out / "data.beton"), batch_size=batch_size, num_workers=max(1, num_workers),
                  order=OrderOption.RANDOM, pipelines=pipelines, drop_last=False)


# FFCV compiles a C extension at install time; pip alone fails without these (Colab lacks them).
_FFCV_INSTALL = "apt-get install libopencv-dev libturbojpeg0-dev pkg-config, then pip install ffcv"
_FFCV_IMPORTS = ("ffcv.writer", "ffcv.fields", "ffcv.fields.decoders", "ffcv.loader", "ffcv.transforms")
_FFCV_DOCS = ("https://docs.ffcv.io/writing_datasets.html and https://docs.ffcv.io/making_dataloaders.html "
              "(DatasetWriter + RGBImageField; Loader with SimpleRGBImageDecoder)")

# FFCV decodes in imdecode (libffcv/libffcv.cpp in its repository) with TJFLAG_FASTDCT | TJFLAG_NOREALLOC.
FFCV_JPG = Peer(
    name="FFCV (jpg)",
    module="ffcv",
    distribution="ffcv",
    docs=_FFCV_DOCS,
    decoder="FFCV (libjpeg-turbo, in threads)",
    prepare=_ffcv_prepare("jpg"),
    loader=_ffcv_loader,
    imports=_FFCV_IMPORTS,
    install=_FFCV_INSTALL,
    note="re-encodes every image as JPEG (quality 90); decodes with libjpeg-turbo's fast integer IDCT "
         "(TJFLAG_FASTDCT; colabfast and torchvision decode with the accurate one); num_workers are threads; "
         "the first epoch compiles the pipeline (numba); the transform runs on whole batches, "
         "so a CenterCrop gives a view of the uncropped batch, its copy left to the batch's user "
         "(the reference row \"made dense\" times them as a model receives them)",
    views=True,
)

FFCV_RAW = Peer(
    name="FFCV (raw)",
    module="ffcv",
    distribution="ffcv",
    docs=_FFCV_DOCS,
    decoder="none: decoded uint8 pixels",
    prepare=_ffcv_prepare("raw"),
    loader=_ffcv_loader,
    imports=_FFCV_IMPORTS,
    install=_FFCV_INSTALL,
    note="num_workers are threads; the first epoch compiles the pipeline (numba); the transform runs on whole batches, "
         "so a CenterCrop gives a view of the uncropped batch, its copy left to the batch's user "
         "(the reference row \"made dense\" times them as a model receives them)",
    views=True,
)


# --- SPDL --------------------------------------------------------------------------------------------
# The pipeline of SPDL's ImageNet example (examples/imagenet_classification.py in facebookresearch/spdl:
# a source of (path, label), PipelineBuilder, .pipe(decode, concurrency=N), .aggregate(batch_size),
# .add_sink, .build(num_threads=N)), each image through the four steps of its "Decoding Process
# Overview" (https://facebookresearch.github.io/spdl/: demux_image, decode_packets with an FFmpeg filter
# description that crops, scales and converts to rgb24, convert_frames merging a batch's frames into
# one buffer, to_torch). The example decodes a batch with one filter for all (load_image_batch); here
# each image is decoded by itself so that each may get its own filter (a random crop per image).

FilterFor = Callable[[int, int], str]  # (width, height) of the stored image -> FFmpeg filter description


def spdl_center_crop(size: int) -> FilterFor:
    """The FFmpeg filter of torchvision's ``CenterCrop(size)``: the same offsets (``round((H - size) / 2)``).
    Even offsets are cropped in the decoder's YUV before the conversion to rgb24, as SPDL's
    ``get_video_filter_desc(crop_width=..., pix_fmt="rgb24")`` does (the cheap order; both benchmark sizes
    have even offsets); odd ones would split 4:2:0 chroma samples (a mean error of 3.6 levels against
    torchvision's crop, measured), so those images are converted whole first."""
    def filter_for(width: int, height: int) -> str:
        import spdl.io

        x, y = int(round((width - size) / 2.0)), int(round((height - size) / 2.0))
        crop = f"crop=w={size}:h={size}:x={x}:y={y}"
        if x % 2 or y % 2:
            return f"format=pix_fmts=rgb24,{crop}"
        return spdl.io.get_video_filter_desc(filter_desc=crop, pix_fmt="rgb24")

    return filter_for


class SPDLLoader:
    """Shuffled batches ``(uint8 images [B, 3, h, w], int64 labels [B])`` of ``items`` (JPEG file, label)
    through an SPDL pipeline; re-iterable, one pipeline (and a fresh permutation) per epoch.

    Each image is decoded by FFmpeg with ``filter_for(width, height)`` (FFmpeg filter syntax; the
    output must be rgb24 of one size for every image), then ``transform`` (uint8 ``[3, H, W]``), if
    given, runs on it; batches are NCHW views of SPDL's NHWC buffer: channels-last, as colabfast's and
    FFCV's. ``num_workers`` is both the decode stage's concurrency and the pipeline's thread count.
    """

    def __init__(self, items: Sequence[tuple[str, int]], filter_for: FilterFor, batch_size: int, num_workers: int,
                 transform: Optional[Transform] = None) -> None:
        self.items, self.filter_for, self.transform = list(items), filter_for, transform
        self.batch_size, self.num_workers = batch_size, max(1, num_workers)

    def _decode(self, item: tuple[str, int]) -> tuple[Any, int]:
        import spdl.io

        path, label = item
        packets = spdl.io.demux_image(path)
        frames = spdl.io.decode_packets(packets, filter_desc=self.filter_for(packets.width, packets.height))
        if self.transform is None:
            return frames, label
        return self.transform(spdl.io.to_torch(spdl.io.convert_frames(frames)).permute(2, 0, 1)), label

    def _collate(self, decoded: list[tuple[Any, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import spdl.io

        labels = torch.tensor([label for _, label in decoded], dtype=torch.int64)
        if self.transform is not None:
            return torch.stack([x for x, _ in decoded]), labels
        # [B, H, W, 3] in one buffer -> [B, 3, H, W] channels-last
        return spdl.io.to_torch(spdl.io.convert_frames([f for f, _ in decoded])).permute(0, 3, 1, 2), labels

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from spdl.pipeline import PipelineBuilder

        order = torch.randperm(len(self.items)).tolist()
        pipeline = (
            PipelineBuilder()
            .add_source([self.items[i] for i in order])
            .pipe(self._decode, concurrency=self.num_workers)
            .aggregate(self.batch_size)
            .pipe(self._collate)
            .add_sink()
            .build(num_threads=self.num_workers, max_failures=0)  # an image that fails fails the epoch
        )
        with pipeline.auto_stop():
            yield from pipeline.get_iterator()


def _spdl_prepare(samples: Samples, out: Path, image_size: tuple[int, int], workers: int) -> None:
    # SPDL reads the JPEG files in place; its ImageNet example takes a list of them (`find val -name
    # '*.JPEG' > flist` and a --prefix): the files' paths relative to the folder above ``out``, so the
    # same list serves the copy on Drive.
    out.mkdir(parents=True, exist_ok=True)
    lines = (f"{os.path.relpath(path, out.parent)}\t{label}\n" for path, label in samples)
    (out / "flist.tsv").write_text("".join(lines))


def _spdl_loader(out: Path, transform: Transform, batch_size: int, num_workers: int, cache: Optional[Path]) -> Iterable:
    from torchvision.transforms import v2

    items = [(str(out.parent / rel), int(label))
             for rel, label in (line.split("\t") for line in (out / "flist.tsv").read_text().splitlines())]
    if isinstance(transform, v2.CenterCrop) and transform.size[0] == transform.size[1]:
        return SPDLLoader(items, spdl_center_crop(transform.size[0]), batch_size, num_workers)
    # Any other transform: FFmpeg decodes to rgb24, the transform runs on each decoded image.
    return SPDLLoader(items, lambda width, height: "format=pix_fmts=rgb24", batch_size, num_workers, transform)


@dataclasses.dataclass(frozen=True)
class _SPDLPeer(Peer):
    """SPDL is missing also where it is installed but none of the FFmpeg libraries it loads (versions
    4-9) is: ``import spdl.io`` succeeds and its first call fails."""

    def missing(self) -> str:
        why = super().missing()
        if why:
            return why
        try:
            import spdl.io

            spdl.io.cpu_storage(1, pin_memory=False)  # the first call into libspdl loads FFmpeg
        except Exception as exc:
            return f"FFmpeg's libraries not found ({self.install}): " + f"{type(exc).__name__}: {exc}"[:200]
        return ""


SPDL = _SPDLPeer(
    name="SPDL",
    module="spdl",
    distribution="spdl",
    docs="https://facebookresearch.github.io/spdl/ (PipelineBuilder; demux_image, decode_packets with a filter, "
         "convert_frames) and examples/imagenet_classification.py in github.com/facebookresearch/spdl",
    decoder="FFmpeg (libavcodec, through spdl.io), crop in its filter graph",
    prepare=_spdl_prepare,
    loader=_spdl_loader,
    imports=("spdl.io", "spdl.pipeline"),
    install="apt-get install libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavfilter8 "
            "libavdevice59 (Debian 12's FFmpeg 5; spdl.io loads FFmpeg 4 to 9 on first use), then pip install spdl",
    note="reads the JPEG files in place from a file list (disk MB: the list); num_workers are threads (decode "
         "concurrency and the pipeline's thread pool)",
)

PEERS: tuple[Peer, ...] = (WEBDATASET, LITDATA, MOSAICML_STREAMING, EFFICIO, FFCV_JPG, FFCV_RAW, SPDL)


def by_name(names: Sequence[str]) -> list[Peer]:
    """The peers named (case-insensitive; ``"ffcv"`` selects both FFCV rows), in :data:`PEERS` order.

    Raises:
        ValueError: a name that is no peer.
    """
    wanted = {n.strip().lower() for n in names if n.strip()}
    known = {p.name.lower() for p in PEERS} | {p.module for p in PEERS} | {p.distribution for p in PEERS}
    unknown = wanted - known
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(p.name for p in PEERS)} (or module names: "
                         f"{', '.join(sorted({p.module for p in PEERS}))})")
    return [p for p in PEERS if {p.name.lower(), p.module, p.distribution} & wanted]
