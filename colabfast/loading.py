"""A drop-in ``torch.utils.data.DataLoader`` that keeps the GPU fed: :class:`DataLoader`, :func:`collate`.

Change ``torch.utils.data.DataLoader`` to ``colabfast.DataLoader`` and the loader picks tuned defaults
for the machine (workers, pinned memory, persistent workers, prefetch depth, a block-shuffling sampler
for h5 mirrors), batches images as uint8, and, on a GPU, copies and normalises them ahead on
a side CUDA stream in a feeder thread (:mod:`colabfast.prefetch`), decoding JPEG bytes with nvJPEG
(:mod:`colabfast.gpudecode`). Every choice is listed in ``loader.choices`` and ``repr(loader)``;
nothing overrides an argument the caller passed.
"""

from __future__ import annotations

import collections.abc
import copy
import functools
import operator
import weakref
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Sized, Union, cast

import torch
import torch.utils.data
from torch.utils.data import Dataset, IterableDataset, default_collate, get_worker_info

from colabfast import datasets, env, reader, transforms
from colabfast.datasets import compact, unwrap
from colabfast.gpudecode import Encoded, EncodedImages, decode_cpu, empty_uint8, is_encoded, is_jpeg
from colabfast.prefetch import FEED_DEPTH, BatchConverter, Feeder, Floats, ImageList, Normalize, cuda_device
from colabfast.sampler import BlockShuffleSampler

__all__ = ["DataLoader", "collate", "plan", "BlockPlan", "ReaderPlan"]

PREFETCH_FACTOR = 4
# Batches each reader thread reads ahead: 2 threads x 2 = 4 batches (benchmarks/README.md, loader/reader).
READER_PREFETCH = 2
MAX_BLOCK_SIZE = 64  # blocks of 64 read cold 1.7-1.9x faster than random order (bench coldreads, benchmarks/)
BLOCKS_PER_BATCH = 16  # so a batch from a class-sorted mirror still mixes >= 16 blocks (classes)


# --- the uint8 collate -----------------------------------------------------------------------------


def collate(batch: Sequence[Any], *, memory_format: torch.memory_format = torch.channels_last) -> Any:
    """``default_collate`` for image datasets: images stay uint8 and are batched with one memcpy each.

    The image is a sample's first element (torchvision's ``(image, target)`` convention) or the sample
    itself when it is a tensor. Images:

    - same-shape uint8 ``[C, H, W]``: one tensor allocated as ``[B, H, W, C]`` (in shared memory in a
      worker, as ``default_collate`` does) and returned as its ``permute(0, 3, 1, 2)`` view, a
      channels-last ``[B, C, H, W]`` batch; a sample that is a CHW view of HWC memory (what
      ``torchvision.io.decode_jpeg`` returns) is copied with one memcpy. With
      ``memory_format=torch.contiguous_format`` the batch is a contiguous ``[B, C, H, W]`` instead.
    - different sizes: an :class:`~colabfast.prefetch.ImageList` (a list) of the images.
    - encoded files (1-D uint8 JPEG/PNG bytes): one :class:`~colabfast.gpudecode.EncodedImages` that
      packs all files into a single tensor plus their lengths.
    - other tensors (e.g. float images from a transform): stacked as ``default_collate`` does.

    Everything else is collated like ``default_collate`` (numbers to tensors, dicts per key,
    namedtuples, equal-length sequences transposed), except that a sequence of dicts, a sequence
    whose length differs between samples, an empty sequence, or None is kept per sample (a list of
    the samples' values): KITTI target lists are never transposed and a test split's None targets
    pass.

    Args:
        batch: the samples.
        memory_format: layout of same-shape uint8 image batches (see above).

    Returns:
        The batch, structured like one sample.
    """
    elem = batch[0]
    if _is_image(elem):
        return _collate_images(batch, memory_format)
    if isinstance(elem, (tuple, list)) and elem and _is_image(elem[0]) and _same_length(batch):
        images = _collate_images([sample[0] for sample in batch], memory_format)
        rest = [collate_value(parts) for parts in list(zip(*batch))[1:]]
        if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
            return type(elem)(images, *rest)
        return [images, *rest]  # default_collate also turns tuples into lists
    return collate_value(batch)


def collate_value(values: Sequence[Any]) -> Any:
    """``default_collate`` of one part of the samples, keeping dict lists, ragged lists and None per sample."""
    elem = values[0]
    if elem is None:
        return list(values)
    if isinstance(elem, collections.abc.Mapping):
        collated = {key: collate_value([v[key] for v in values]) for key in elem}
        try:
            if isinstance(elem, collections.abc.MutableMapping):
                clone = copy.copy(elem)
                clone.update(collated)
                return clone
            mapping_type: Any = type(elem)  # a concrete mapping class; a TypeError if it takes no dict
            return mapping_type(collated)
        except TypeError:
            return collated
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(collate_value(parts) for parts in zip(*values)))
    if isinstance(elem, collections.abc.Sequence) and not isinstance(elem, (str, bytes)):
        if not elem or not _same_length(values) or all(isinstance(x, collections.abc.Mapping) for x in elem):
            return list(values)
        transposed = [collate_value(parts) for parts in zip(*values)]
        if isinstance(elem, tuple):
            return transposed
        try:
            copied: Any = copy.copy(elem)  # a mutable sequence, else the assignment raises TypeError
            copied[:] = transposed
            return copied
        except TypeError:
            return transposed
    return default_collate(cast(list, values))  # torch types the batch a list; any sequence collates


def _same_length(values: Sequence[Any]) -> bool:
    return all(len(v) == len(values[0]) for v in values)


def _is_image(x: Any) -> bool:
    return is_encoded(x) or (isinstance(x, torch.Tensor) and x.dim() == 3)


def _collate_images(images: Sequence[Any], memory_format: torch.memory_format) -> Any:
    encoded = [is_encoded(x) for x in images]
    if all(encoded):
        files = [x.data if isinstance(x, Encoded) else x for x in images]
        indices = [x.index for x in images] if all(isinstance(x, Encoded) for x in images) else None
        return EncodedImages.pack(files, indices, shared=get_worker_info() is not None)
    if any(encoded) or not all(isinstance(x, torch.Tensor) and x.dim() == 3 for x in images):
        return ImageList([compact(x) for x in images])  # some decoded in the worker, some left for the GPU
    first = images[0]
    if any(x.shape != first.shape or x.dtype != first.dtype for x in images):
        return ImageList([compact(x) for x in images])  # passed on as they are: they must own their memory
    if first.dtype != torch.uint8 or memory_format != torch.channels_last:
        return default_collate(list(images))
    c, h, w = first.shape
    out = empty_uint8((len(images), h, w, c), shared=get_worker_info() is not None)
    torch.stack([x.permute(1, 2, 0) for x in images], out=out)
    return out.permute(0, 3, 1, 2)


# --- decoding and transforming in the workers --------------------------------------------------------


class _Prepared(Dataset):
    """The caller's dataset with each sample's image decoded (and transformed) in the worker.

    Attributes not found here are looked up on the wrapped dataset, so ``loader.dataset.classes``
    still works; the dataset itself is ``loader.dataset.dataset``, as with ``Subset``.
    """

    def __init__(self, dataset: Dataset, *, keep_jpeg: bool, transform: Optional[Callable], decode: bool = True,
                 views: bool = False) -> None:
        self.dataset, self.keep_jpeg, self.transform = dataset, keep_jpeg, transform
        self.decode = decode  # False: samples pass as they are (the wrapper is there for `views` only)
        # True where the loader's collate copies every image it batches: a mirror may then hand its
        # images over as views of its read buffer (MirrorDataset.items), saving a copy per image.
        self.views = views

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> Any:
        sample = self.dataset[index]
        return sample if not self.decode and self.transform is None else self._prepare(index, sample)

    def __getitems__(self, indices: list) -> list:
        # Keep the wrapped dataset's batched reads (a mirror reads runs of consecutive samples at once).
        if self.views and isinstance(self.dataset, datasets.MirrorDataset):
            samples = self.dataset.items(indices, views=True)
        elif callable(getitems := getattr(self.dataset, "__getitems__", None)):
            samples = getitems(indices)
        else:
            samples = [self.dataset[i] for i in indices]
        if not self.decode and self.transform is None:
            return samples
        return [self._prepare(i, s) for i, s in zip(indices, samples)]

    def _prepare(self, index: Any, sample: Any) -> Any:
        image = sample[0] if isinstance(sample, (tuple, list)) else sample
        if is_encoded(image):
            key = operator.index(index) if hasattr(index, "__index__") else None
            if self.keep_jpeg and is_jpeg(image):  # decoded in batches on the GPU; errors name the index
                image = image if key is None else Encoded(image, key)
            else:
                image = decode_cpu(image, f"dataset key {index!r}" if key is None else key)
        if self.transform is not None and not isinstance(image, Encoded):
            image = self.transform(image)
        if not isinstance(sample, (tuple, list)):
            return image
        if isinstance(sample, tuple) and hasattr(sample, "_fields"):
            named: Any = sample  # a namedtuple of some class: it has _replace
            return named._replace(**{sample._fields[0]: image})
        return type(sample)([image, *sample[1:]]) if type(sample) in (tuple, list) else [image, *sample[1:]]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "dataset":  # not during unpickling, before `dataset` is set
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset!r})"


def find_attr(dataset: Any, name: str, default: Any = None) -> Any:
    """``dataset.<name>``, looking through wrappers to the dataset inside (:func:`colabfast.datasets.unwrap`)."""
    for d in unwrap(dataset):
        value = getattr(d, name, None)
        if value is not None:
            return value
    return default


def is_mirror(dataset: Any) -> bool:
    """True for a colabfast h5 mirror (``dataset.is_mirror``), also inside a ``Subset``."""
    return bool(find_attr(dataset, "is_mirror", False))


# --- the DataLoader ----------------------------------------------------------------------------------


class BlockPlan(NamedTuple):
    """In a :func:`plan`: a :class:`~colabfast.sampler.BlockShuffleSampler` with blocks of ``block_size``,
    which the DataLoader builds (drawing its seed from the ``generator``)."""

    block_size: int

    def __str__(self) -> str:
        return f"BlockShuffleSampler(block_size={self.block_size})"


class ReaderPlan(NamedTuple):
    """In a :func:`plan`: batches read by ``threads`` threads of :mod:`colabfast.reader`, ``prefetch``
    batches ahead of the one handed out."""

    threads: int
    prefetch: int

    def __str__(self) -> str:
        return f"{self.threads} threads"


def plan(
    dataset: Any,
    *,
    batch_size: Optional[int] = 1,
    shuffle: Optional[bool] = None,
    sampler: Any = None,
    batch_sampler: Any = None,
    num_workers: Optional[int] = None,
    collate_fn: Optional[Callable] = None,
    pin_memory: Optional[bool] = None,
    worker_init_fn: Optional[Callable] = None,
    multiprocessing_context: Any = None,
    prefetch_factor: Optional[int] = None,
    persistent_workers: Optional[bool] = None,
    device: Union[str, torch.device] = "auto",
    memory_format: Optional[torch.memory_format] = None,
    decode: str = "auto",
    transform: Optional[Callable] = None,
) -> dict[str, tuple[Any, str]]:
    """What :class:`DataLoader` will choose for these arguments: name -> ``(value, why)``.

    A pure function of its arguments and the machine (CPUs, GPU, start method): it starts no worker,
    opens nothing and draws no random number, so the defaults can be read and tested before a
    loader exists. Keys: ``device``, ``decode``, ``reader`` (a :class:`ReaderPlan` or ``"none"``),
    ``num_workers``, ``persistent_workers``, ``prefetch_factor``, ``pin_memory``, ``sampler`` (a
    :class:`BlockPlan` where the loader builds a block sampler), ``collate_fn``. The arguments are
    :class:`DataLoader`'s; see there for what each default means.

    Raises:
        ValueError: ``decode`` is not ``"auto"``, ``"cpu"`` or ``"gpu"``, or ``"gpu"`` without CUDA or batching.
        RuntimeError: a CUDA ``device`` without a GPU.
        IndexError: a ``Subset`` of a mirror holds an index outside the mirror.
    """
    choices: dict[str, tuple[Any, str]] = {}

    def choose(name: str, given: Any, default: Any, why: str) -> Any:
        choices[name] = (given, "set by caller") if given is not None else (default, why)
        return choices[name][0]

    target = _resolve_device(device)
    cuda = target.type == "cuda"
    choices["device"] = (target, ("torch sees a GPU" if cuda else "torch sees no GPU") if device == "auto"
                         else "set by caller")
    iterable = isinstance(dataset, IterableDataset)
    batching = batch_size is not None or batch_sampler is not None
    cpus = env.cpu_count()
    spawns = multiprocessing_context is None and _spawned()
    decode = _choose_decode(decode, dataset, cuda, batching, choices)

    threads = None
    wants_workers = num_workers is not None or worker_init_fn is not None or multiprocessing_context is not None
    if not wants_workers and collate_fn is None and batch_sampler is None and batch_size and not iterable:
        fits, why = reader.applies(dataset, transform_on_cpu=transform is not None and not cuda, decode=decode)
        threads = cpus if fits else None
        choices["reader"] = ("none", why)
    else:
        choices["reader"] = ("none", "IterableDataset" if iterable else
                             "the caller chose workers (num_workers, worker_init_fn or multiprocessing_context), "
                             "a collate_fn or a batch_sampler")
    if threads is not None:
        num_workers = choose("num_workers", None, 0, "the reader threads do the work (see reader)")
        # torch's prefetch_factor counts batches per worker; the reader's threads take its place.
        factor = choose("prefetch_factor", prefetch_factor, READER_PREFETCH,
                        f"{READER_PREFETCH} batches read ahead per reader thread")
        choices["reader"] = (ReaderPlan(threads, factor * threads), choices["reader"][1])
        choices["persistent_workers"] = (False, "no worker processes: reader threads start in microseconds"
                                         + (" (persistent_workers=True does not apply)" if persistent_workers else ""))
    elif iterable:
        num_workers = choose("num_workers", num_workers, 0, "IterableDataset: every worker would replay the stream")
    elif spawns and _from_main(dataset, collate_fn, worker_init_fn, transform):
        why = "workers are spawned here and cannot import what a notebook (__main__) defines"
        num_workers = choose("num_workers", num_workers, 0, why)
    else:
        num_workers = choose("num_workers", num_workers, cpus, f"{cpus} CPUs (colabfast.env.cpu_count())")
    workers = num_workers > 0
    if threads is None:
        choose("persistent_workers", persistent_workers, workers,
               "workers survive between epochs" if workers else "no workers")
        choose("prefetch_factor", prefetch_factor, PREFETCH_FACTOR if workers else None,
               f"{PREFETCH_FACTOR} batches queued per worker absorb slow reads" if workers else "no workers")
    choose("pin_memory", pin_memory, cuda,
           "batches go to CUDA: asynchronous copies" if cuda else "batches stay on the CPU")

    if sampler is None and batch_sampler is None and shuffle and not iterable and is_mirror(dataset):
        if find_attr(dataset, "shuffled", False) or not batch_size:
            block, why = MAX_BLOCK_SIZE, "a mirror packed in shuffled order: blocks mix classes"
        else:
            block = min(MAX_BLOCK_SIZE, max(1, batch_size // BLOCKS_PER_BATCH))
            why = f"a batch mixes {BLOCKS_PER_BATCH} blocks (pack(shuffle=True) allows {MAX_BLOCK_SIZE})"
        choices["sampler"] = (BlockPlan(block), f"h5 mirror, shuffle=True, blocks of {block}: {why}")
    elif sampler is not None or batch_sampler is not None:
        choices["sampler"] = (sampler if sampler is not None else batch_sampler, "set by caller")
    else:
        choices["sampler"] = ("RandomSampler" if shuffle else "SequentialSampler", "torch's default")

    if collate_fn is None and batching:
        layout = torch.channels_last if cuda or memory_format == torch.channels_last else torch.contiguous_format
        choices["collate_fn"] = ("colabfast.loading.collate", f"uint8 images batched {_layout_name(layout)}")
    else:
        choose("collate_fn", collate_fn, "default_convert", "torch's default without batching")
    return choices


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` with tuned defaults and GPU feeding; a drop-in replacement.

    Takes every ``torch.utils.data.DataLoader`` argument, positionally in the same order too, with the
    same meaning; version-specific ones (``in_order``, ``pin_memory_device``) pass through
    ``**kwargs``. Arguments left unset get tuned values, recorded with the reason in
    ``loader.choices`` (name -> ``(value, why)``) and shown by ``repr(loader)``:

    - ``num_workers``: the CPUs this process may use (:func:`colabfast.env.cpu_count`; 2 on Colab),
      or 0 for an ``IterableDataset`` (each worker would replay the whole stream), and 0 where workers
      are spawned (macOS, Windows) and the dataset or a function comes from ``__main__`` (a notebook
      cell), which spawned workers cannot import.
    - ``persistent_workers``: True with workers (no re-forking, re-importing and re-opening files
      every epoch). Workers then keep the dataset object they started with.
    - ``prefetch_factor``: 4 with workers: 2 workers x 4 = 8 batches queued absorb slow reads (a cold
      block, a large JPEG) that the default 2 x 2 does not; the cost is memory, e.g. 8 x 38 MB of
      shared memory for batches of 256 uint8 images of 224x224.
    - ``pin_memory``: True when batches go to CUDA (required for asynchronous copies).
    - ``sampler``: a :class:`~colabfast.sampler.BlockShuffleSampler` when ``shuffle=True`` and the
      dataset is an h5 mirror (``dataset.is_mirror``, also through ``Subset``), seeded from
      ``generator`` or torch's global RNG as ``RandomSampler`` is; blocks of 64 items for a mirror
      packed with ``shuffle=True``, else of ``min(64, batch_size // 16)`` so batches mix classes.
    - ``collate_fn``: :func:`collate` (uint8 images, batched channels-last for the GPU; contiguous on
      the CPU unless ``memory_format=torch.channels_last``).

    Args:
        dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
            drop_last, timeout, worker_init_fn, multiprocessing_context, generator, prefetch_factor,
            persistent_workers, **kwargs: as ``torch.utils.data.DataLoader`` (defaults above).
        device: where batches arrive: ``"auto"`` (CUDA if torch sees a GPU, else CPU), ``"cpu"``,
            ``"cuda"``, ``"cuda:1"`` or a ``torch.device``. On CUDA, batches are converted ahead by a feeder
            thread on a side stream (:class:`~colabfast.prefetch.CUDAPrefetcher`) and every tensor arrives there.
        mean: per-channel mean in 0..1 units (torchvision ``Normalize`` convention, ImageNet:
            ``(0.485, 0.456, 0.406)``); uint8 images are scaled by 1/255 first. Default: none.
        std: per-channel standard deviation in 0..1 units (ImageNet: ``(0.229, 0.224, 0.225)``).
        dtype: image dtype, e.g. ``torch.float32``, ``torch.float16``, ``torch.bfloat16``. Default:
            float32 when ``mean``/``std`` are given, else the images keep their dtype (uint8).
        memory_format: ``None``: contiguous ``[B, C, H, W]`` as a plain DataLoader gives;
            ``torch.channels_last``: channels-last (faster convolutions under AMP on tensor cores).
        decode: where encoded images (a dataset yielding JPEG/PNG bytes, e.g.
            ``H5ImageFolder(output="bytes")``) are decoded. ``"gpu"``: JPEGs in batches with nvJPEG in
            the main process (other formats in the workers, on the CPU); needs a CUDA ``device``.
            ``"cpu"``: in the workers. ``"auto"``: ``"gpu"`` when the dataset yields bytes
            (``dataset.output == "bytes"``) and batches go to CUDA, ``"cpu"`` when they stay on the
            CPU. Decoded images are RGB uint8 ``[3, H, W]``. An undecodable file raises ``ValueError``
            naming its dataset index.
        transform: applied to the images (uint8 ``[C, H, W]``, after decoding) before batching: on
            the GPU in the feeder thread when ``device`` is CUDA, per image in the workers otherwise.
            A :mod:`colabfast.transforms` transform (``Compose([RandomResizedCrop(224),
            RandomHorizontalFlip()])``) transforms each batch at once; any other callable, e.g. a
            torchvision v2 transform, is called per image (slower on the GPU: ``loader.choices`` says
            which). Use it to bring images of different sizes to one size. It sees the image only:
            transforms that must also move boxes belong in the dataset. The random steps of a
            :mod:`colabfast.transforms` transform drawing in this process (on CUDA, or with no
            workers) are reseeded each epoch from ``generator`` (or torch's global RNG), so
            ``torch.manual_seed`` before the loop repeats a run; one built with ``generator=`` is left alone.
        feed_depth: on CUDA, converted batches the feeder thread queues ahead of the training loop
            (:class:`~colabfast.prefetch.Feeder`, default 3): GPU memory for that many batches stays
            allocated; 2-4 measured within noise of each other on an H100 (benchmarks/README.md).

    Raises:
        ValueError: a bad ``decode``/``mean``/``std``/``dtype`` combination, ``feed_depth`` < 1, or any error
            ``torch.utils.data.DataLoader`` raises for its arguments.
        RuntimeError: a CUDA ``device`` without a GPU.

    Differences from a plain DataLoader, all visible in ``choices``: ``iter(loader)`` is a generator
    (no ``len``; use ``len(loader)``); with ``decode`` or ``transform`` in the workers
    ``loader.dataset`` is a thin wrapper around the caller's dataset.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: Optional[int] = None,
        collate_fn: Optional[Callable] = None,
        pin_memory: Optional[bool] = None,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: Optional[bool] = None,
        device: Union[str, torch.device] = "auto",
        mean: Optional[Floats] = None,
        std: Optional[Floats] = None,
        dtype: Optional[torch.dtype] = None,
        memory_format: Optional[torch.memory_format] = None,
        decode: str = "auto",
        transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        feed_depth: int = FEED_DEPTH,
        **kwargs: Any,
    ) -> None:
        if feed_depth < 1:
            raise ValueError(f"feed_depth must be >= 1 (converted batches queued ahead on the GPU), got {feed_depth}")
        choices = plan(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
                       num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory,
                       worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                       prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, device=device,
                       memory_format=memory_format, decode=decode, transform=transform)
        target: torch.device = choices["device"][0]
        cuda = target.type == "cuda"
        num_workers, persistent_workers = choices["num_workers"][0], choices["persistent_workers"][0]
        prefetch_factor, pin_memory = choices["prefetch_factor"][0], choices["pin_memory"][0]
        decode = choices["decode"][0]
        plan_reader = choices["reader"][0] if isinstance(choices["reader"][0], ReaderPlan) else None
        threads = plan_reader.threads if plan_reader is not None else None
        if threads is not None:
            prefetch_factor = None  # torch's, per worker: the reader's threads have their own (ReaderPlan.prefetch)
        batching = batch_size is not None or batch_sampler is not None
        value, why = choices["sampler"]
        if isinstance(value, BlockPlan):  # built here: drawing its seed moves the generator, as RandomSampler
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
            # torch's Dataset declares no __len__; a mirror (a map-style dataset) has one
            sampler, shuffle = BlockShuffleSampler(cast(Sized, dataset), value.block_size, seed=seed), None
            choices["sampler"] = (sampler, why)

        if threads is None and (decode in ("cpu", "gpu") or (transform is not None and not cuda)):
            dataset = _Prepared(dataset, keep_jpeg=decode == "gpu", transform=None if cuda else transform,
                                views=collate_fn is None and num_workers > 0)
        elif threads is None and collate_fn is None and num_workers > 0 and isinstance(dataset, datasets.MirrorDataset):
            # The collate below copies every image it batches: the mirror's images may stay views.
            dataset = _Prepared(dataset, keep_jpeg=False, transform=None, decode=False, views=True)

        if collate_fn is None and batching:
            layout = torch.channels_last if cuda or memory_format == torch.channels_last else torch.contiguous_format
            collate_fn = functools.partial(collate, memory_format=layout)

        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            **kwargs,
        )
        self.device = target
        self.normalize = Normalize(dtype, mean, std, memory_format)
        self.transform, self.feed_depth = transform, feed_depth
        choices["normalize"] = (self.normalize, "from dtype, mean, std, memory_format")
        if transform is not None:
            if not cuda:
                why = "per image in the workers"
            elif getattr(transform, "batched", False):
                why = "whole batches on the GPU, in the feeder thread"
            else:
                why = "per image on the GPU, in the feeder thread (fallback: colabfast.transforms batch)"
            choices["transform"] = (transform, why)
        self.choices = choices
        self._convert = BatchConverter(target, self.normalize, transform if cuda else None, non_blocking=cuda)
        self._reader = None
        if threads is not None:
            assert plan_reader is not None
            self._reader = reader.BatchReader(dataset, threads=threads, prefetch=plan_reader.prefetch,
                                              pin_memory=pin_memory,
                                              channels_last=cuda or memory_format == torch.channels_last)
        # One side stream per loader, made here and never per epoch (timm#2781).
        self._stream = torch.cuda.Stream(device=target) if cuda else None
        self._feeder: Any = None  # weakref to this epoch's feeder thread (colabfast.prefetch.Feeder)

    def _batches(self) -> Iterator:
        if self._reader is not None:
            # the reader runs only with a batch_size and no batch_sampler: torch made a BatchSampler
            assert self.batch_sampler is not None
            return self._reader.batches(self.batch_sampler)
        return super().__iter__()

    # A generator of converted batches, not torch's _BaseDataLoaderIter (see "Differences" above).
    def __iter__(self) -> Iterator:  # type: ignore[override]
        previous = self._feeder() if self._feeder is not None else None
        if previous is not None:
            # first: its thread may still be drawing from the transform's generator, and two feeders
            # must never read one DataLoader iterator at once (as colabfast.prefetch.restart says)
            previous.close()
        if self.transform is not None and (self._stream is not None or self.num_workers == 0):
            # The transform draws in this process: a seed per epoch from the loader's generator, as
            # torch draws its workers' base seed (workers reseed from that one themselves); drawn
            # only for colabfast.transforms' random steps.
            transforms.reseed(self.transform, self.generator)
        if self._stream is None:
            return map(self._convert, self._batches())
        feeder = Feeder(self._batches(), self._convert, self._stream, self.feed_depth)
        self._feeder = weakref.ref(feeder)
        return feeder

    def set_epoch(self, epoch: int) -> None:
        """Forward ``epoch`` to the sampler (and batch sampler) that have ``set_epoch``, e.g. for DDP."""
        sampler: Any  # any of them may have set_epoch: a DistributedSampler, a BlockShuffleSampler, ...
        for sampler in (self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
                return

    def __repr__(self) -> str:
        if "choices" not in vars(self):  # __init__ failed
            return super().__repr__()
        try:
            size = f", {len(self.dataset)} samples"  # type: ignore[arg-type]
        except TypeError:
            size = ""
        inner = self.dataset.dataset if isinstance(self.dataset, _Prepared) else self.dataset
        lines = [f"colabfast.DataLoader({type(inner).__name__}{size}, batch_size={self.batch_size})"]
        width = max(len(name) for name in self.choices)
        for name, (value, why) in self.choices.items():
            lines.append(f"  {name:<{width}} = {value!s:<24} # {why}")
        return "\n".join(lines)


def _choose_decode(decode: str, dataset: Any, cuda: bool, batching: bool, choices: dict) -> str:
    if decode not in ("auto", "cpu", "gpu"):
        raise ValueError(f"decode must be 'auto', 'cpu' or 'gpu', got {decode!r}")
    if decode == "gpu" and not (cuda and batching):
        raise ValueError("decode='gpu' needs a CUDA device and batching (a batch_size or batch_sampler)")
    if decode != "auto":
        choices["decode"] = (decode, "set by caller")
        return decode
    if find_attr(dataset, "output") != "bytes":
        choices["decode"] = ("auto", "images arrive decoded (dataset.output is not 'bytes')")
        return "auto"
    if cuda and batching:
        choices["decode"] = ("gpu", "dataset yields bytes, batches go to CUDA: nvJPEG in batches")
        return "gpu"
    choices["decode"] = ("cpu", "dataset yields bytes, batches stay on the CPU: decoded in the workers")
    return "cpu"


def _spawned() -> bool:
    """True when workers start by spawn/forkserver (macOS, Windows), not by fork (Linux, Colab)."""
    return torch.multiprocessing.get_start_method(allow_none=False) != "fork"


def _from_main(dataset: Any, *functions: Any) -> bool:
    """True if the dataset (or a dataset it wraps) or one of the functions is defined in ``__main__``."""
    wrapped = list(unwrap(dataset))
    return any(getattr(type(d), "__module__", None) == "__main__" for d in wrapped) or any(
        f is not None and getattr(f, "__module__", None) == "__main__" for f in functions
    )


def _resolve_device(device: Union[str, torch.device]) -> torch.device:
    if device == "auto":
        return cuda_device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    return cuda_device(device) if device.type == "cuda" else device


def _layout_name(memory_format: torch.memory_format) -> str:
    return "channels-last" if memory_format == torch.channels_last else "contiguous"
