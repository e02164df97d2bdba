"""The loader's plan, made from the dataset's facts: how batches are read, decoded, transformed and fed
(:func:`plan`, :class:`Plan`, :class:`DatasetFacts`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional, Sized, Union

import numpy as np
import torch
import torch.utils.data
from torch.utils.data import IterableDataset
from torchvision.datasets.vision import StandardTransform

from colabfast.datasets import dropins as datasets
from colabfast.datasets.dropins import unwrap
from colabfast.images.augment import FusedTransform
from colabfast.loading import reader
from colabfast.loading.collate import collate
from colabfast.loading.prefetch import cuda_device
from colabfast.loading.sampler import BlockShuffleSampler, check_shares, shared_seed, world
from colabfast.where import env

__all__ = ["plan", "Plan", "BlockPlan", "ShardPlan", "SAMPLER_PLANS", "ReaderPlan", "DatasetFacts"]

PREFETCH_FACTOR = 4
# Batches each reader thread reads ahead: 2 threads x 2 = 4 batches (benchmarks/README.md, loader/reader).
READER_PREFETCH = 2
MAX_BLOCK_SIZE = 64  # blocks of 64 read cold 1.7-1.9x faster than random order (bench coldreads, benchmarks/)
BLOCKS_PER_BATCH = 16  # so a batch from a class-sorted mirror still mixes >= 16 blocks (classes)


def find_attr(dataset: Any, name: str, default: Any = None) -> Any:
    """``dataset.<name>``, looked up through wrappers (:func:`colabfast.datasets.dropins.unwrap`)."""
    for d in unwrap(dataset):
        value = getattr(d, name, None)
        if value is not None:
            return value
    return default


def is_mirror(dataset: Any) -> bool:
    """True for a colabfast h5 mirror (``dataset.is_mirror``), also inside a ``Subset``."""
    return bool(find_attr(dataset, "is_mirror", False))


@dataclasses.dataclass(frozen=True)
class DatasetFacts:
    """What :func:`plan` needs to know about a dataset, found once by :func:`dataset_facts`.

    Attributes:
        dataset: the dataset as given.
        inner: the dataset under every ``torch.utils.data.Subset``; ``dataset`` itself without one.
        mapping: int64, ``dataset``'s indices mapped onto ``inner``'s, or None without a Subset.
        iterable: an ``IterableDataset``.
        output: ``dataset.output`` (``"tensor"``, ``"bytes"``, ``"pil"``) through wrappers; None if unset.
        mirror: an h5 mirror (``is_mirror``, through wrappers).
        shuffled: a mirror packed in shuffled order (``shuffled``, through wrappers).
        own_transforms: ``inner`` has a ``transform``, ``target_transform`` or ``transforms``.
        per_sample: what the collate keeps per sample (``inner.per_sample()``).
        from_main: the dataset or ``inner``'s transform is defined in ``__main__`` (spawned workers cannot import it).
    """

    dataset: Any = dataclasses.field(repr=False)
    inner: Any = dataclasses.field(repr=False)
    mapping: Optional[np.ndarray] = dataclasses.field(repr=False, compare=False)
    iterable: bool
    output: Optional[str]
    mirror: bool
    shuffled: bool
    own_transforms: bool
    per_sample: frozenset
    from_main: bool

    @property
    def pil_mirror(self) -> bool:
        """A mirror giving PIL images that no transform of its own makes tensors."""
        inner = self.inner
        return (isinstance(inner, datasets.MirrorDataset) and inner.output == "pil" and inner.transform is None
                and (inner.transforms is None or isinstance(inner.transforms, StandardTransform)))


def dataset_facts(dataset: Any) -> DatasetFacts:
    """The :class:`DatasetFacts` of ``dataset``, its Subsets walked once.

    Raises:
        IndexError: a Subset's index is outside the dataset it wraps.
    """
    inner, mapping = datasets.through_subsets(dataset)
    iterable = isinstance(dataset, IterableDataset)
    own = any(getattr(inner, name, None) is not None for name in ("transform", "target_transform", "transforms"))
    per_sample = inner.per_sample() if callable(getattr(inner, "per_sample", None)) else frozenset()
    return DatasetFacts(dataset=dataset, inner=inner, mapping=mapping, iterable=iterable,
                        output=find_attr(dataset, "output"), mirror=is_mirror(dataset),
                        shuffled=bool(find_attr(dataset, "shuffled", False)), own_transforms=own,
                        per_sample=frozenset(per_sample),
                        from_main=_from_main(dataset, getattr(inner, "transform", None)))


# --- the DataLoader ----------------------------------------------------------------------------------


class BlockPlan(NamedTuple):
    """In a :func:`plan`: a :class:`~colabfast.loading.sampler.BlockShuffleSampler` the DataLoader builds."""

    block_size: int
    num_replicas: int = 1
    rank: int = 0

    def build(self, dataset: Sized, generator: Optional[torch.Generator], drop_last: bool) -> BlockShuffleSampler:
        """The sampler, seeded by :func:`~colabfast.loading.sampler.shared_seed` from ``generator``.

        Raises:
            SamplerRefused: ``drop_last`` with fewer samples than replicas.
        """
        return BlockShuffleSampler(dataset, self.block_size, seed=shared_seed(generator),
                                   num_replicas=self.num_replicas, rank=self.rank, drop_last=drop_last)

    def __str__(self) -> str:
        share = f", rank={self.rank}/{self.num_replicas}" if self.num_replicas > 1 else ""
        return f"BlockShuffleSampler(block_size={self.block_size}{share})"


class ShardPlan(NamedTuple):
    """In a :func:`plan`: a shuffling ``DistributedSampler`` for a dataset that is not a mirror."""

    num_replicas: int
    rank: int

    def build(self, dataset: Sized, generator: Optional[torch.Generator],
              drop_last: bool) -> torch.utils.data.DistributedSampler:
        """The ``DistributedSampler``, seeded by :func:`~colabfast.loading.sampler.shared_seed` from ``generator``.

        Raises:
            SamplerRefused: ``drop_last`` with fewer samples than replicas.
        """
        check_shares(len(dataset), self.num_replicas, self.rank, drop_last)
        return torch.utils.data.DistributedSampler(
            dataset,  # type: ignore[arg-type]  # torch's Dataset declares no __len__; this one has one
            self.num_replicas, self.rank, shuffle=True, seed=shared_seed(generator), drop_last=drop_last)

    def __str__(self) -> str:
        return f"DistributedSampler(rank={self.rank}/{self.num_replicas}, shuffle=True)"


SAMPLER_PLANS = (BlockPlan, ShardPlan)  # what the DataLoader builds itself, with its generator and drop_last


class ReaderPlan(NamedTuple):
    """In a :func:`plan`: batches made by ``threads`` reader threads (0: the CUDA feeder), ``prefetch`` ahead,
    ``fused`` (a :class:`~colabfast.images.augment.FusedTransform`) applied as each image is decoded.
    """

    threads: int
    prefetch: int
    fused: Optional[FusedTransform] = None

    def __str__(self) -> str:
        if not self.threads:
            return "in the feeder thread"
        return f"{self.threads} threads" + (", per-sample transforms fused" if self.fused else "")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What :class:`DataLoader` does with its arguments, as :func:`plan` decides it, and why.

    Attributes:
        device: where batches arrive.
        decode: ``"cpu"`` (in the workers), ``"gpu"`` (nvJPEG in the feeder), or ``"auto"`` (arrive decoded).
        reader: the reader threads of :mod:`colabfast.loading.reader`, or None (torch's workers read).
        num_workers: torch's worker processes (0 with a reader).
        persistent_workers: whether the workers survive between epochs.
        prefetch_factor: batches read ahead per worker or reader thread; None without either.
        pin_memory: whether batches are put in pinned memory.
        sampler: a :class:`BlockPlan` or :class:`ShardPlan`, the caller's sampler or batch sampler, or
            torch's default's name (``"RandomSampler"``, ``"SequentialSampler"``).
        layout: memory format of the uint8 image batches, or None where the caller's ``collate_fn`` batches.
        collate_fn: what torch collates with (None: ``default_convert``, without batching).
        reasons: decision name -> why, for every field above.
        facts: what the plan was made from (:class:`DatasetFacts`).
    """

    device: torch.device
    decode: str
    reader: Optional[ReaderPlan]
    num_workers: int
    persistent_workers: bool
    prefetch_factor: Optional[int]
    pin_memory: bool
    sampler: Any
    layout: Optional[torch.memory_format]
    collate_fn: Optional[Callable]
    reasons: dict[str, str]
    facts: DatasetFacts = dataclasses.field(repr=False, compare=False)

    def choices(self) -> dict[str, tuple[Any, str]]:
        """The decisions as ``loader.choices`` lists them: name -> ``(value, why)``."""
        collate_fn: Any = self.collate_fn
        if self.layout is not None:
            collate_fn = "colabfast.loading.collate.collate"
        elif collate_fn is None:
            collate_fn = "default_convert"
        shown = {"device": self.device, "decode": self.decode, "reader": self.reader or "none",
                 "num_workers": self.num_workers, "persistent_workers": self.persistent_workers,
                 "prefetch_factor": self.prefetch_factor, "pin_memory": self.pin_memory, "sampler": self.sampler,
                 "collate_fn": collate_fn}
        return {name: (value, self.reasons[name]) for name, value in shown.items()}


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
    draft: bool = False,
) -> Plan:
    """What :class:`DataLoader` will do with these arguments: a :class:`Plan`.

    A pure function of its arguments (:class:`DataLoader`'s) and the machine: it starts no worker, opens
    nothing and draws no random number. Under ``torch.distributed``, ``shuffle=True`` shards each epoch
    among the ranks; ``shuffle=False`` shards nothing, as torch's ``DataLoader``
    ([Distributed training](../distributed.md)).

    Raises:
        ValueError: ``decode`` is not ``"auto"``, ``"cpu"`` or ``"gpu"``, or ``"gpu"`` without CUDA or
            batching; a mirror gives PIL images (``output="pil"``) that nothing turns into tensors.
        RuntimeError: a CUDA ``device`` without a GPU.
        IndexError: a ``Subset`` holds an index outside the dataset it wraps.
    """
    facts = dataset_facts(dataset)  # everything below asks these, not the dataset
    reasons: dict[str, str] = {}

    def choose(name: str, given: Any, default: Any, why: str) -> Any:
        reasons[name] = "set by caller" if given is not None else why
        return given if given is not None else default

    target = _resolve_device(device)
    cuda = target.type == "cuda"
    reasons["device"] = ("torch sees a GPU" if cuda else "torch sees no GPU") if device == "auto" else "set by caller"
    iterable = facts.iterable
    batching = batch_size is not None or batch_sampler is not None
    decode, reasons["decode"] = _choose_decode(decode, facts, cuda, batching)
    layout: Optional[torch.memory_format] = None
    collate_with = collate_fn
    if collate_fn is None and batching:
        _check_batchable(facts, per_image_transform=transform is not None and not cuda)
        layout = torch.channels_last if cuda or memory_format == torch.channels_last else torch.contiguous_format
        extra: dict[str, Any] = {"per_sample": facts.per_sample} if facts.per_sample else {}
        collate_with = functools.partial(collate, memory_format=layout, **extra)
        reasons["collate_fn"] = f"uint8 images batched {_layout_name(layout)}"
    else:
        reasons["collate_fn"] = "set by caller" if collate_fn is not None else "torch's default without batching"

    threads: Optional[int] = None
    fused: Optional[FusedTransform] = None
    wants_workers = num_workers is not None or worker_init_fn is not None or multiprocessing_context is not None
    readable = layout is not None and batch_sampler is None and bool(batch_size) and not iterable
    fits = False
    if readable:
        cpu_transform = None if cuda else transform
        fits, why_reader = reader.applies(facts.inner, transform_on_cpu=cpu_transform is not None, decode=decode)
        if not fits and (cpu_transform is not None or facts.own_transforms):
            fused, why_reader = reader.fused_for(facts.inner, transform=cpu_transform, decode=decode, draft=draft)
            fits = fused is not None
    if not wants_workers and readable:
        reasons["reader"] = why_reader
        threads = env.cpu_count() if fits else None
        if fits and decode == "gpu":
            # Reading a batch's files is one pread per run: the feeder thread does it itself, just before
            # nvJPEG. Reader threads on top of the feeder and the training thread cost ResNet-50 on an H100
            # pinned to 2 CPUs a fifth of its speed (benchmarks/gpu_feed_probe.py, benchmarks/README.md).
            threads = 0
            reasons["reader"] = ("the feeder thread reads each batch's files (one pread per run) into pinned "
                                 "memory just before nvJPEG decodes them: no reader threads to share 2 CPUs with")
    else:
        reasons["reader"] = ("IterableDataset" if iterable else
                             "the caller chose workers (num_workers, worker_init_fn or multiprocessing_context), "
                             "a collate_fn or a batch_sampler")
    batch_reader = None
    if threads is not None:
        workers = choose("num_workers", None, 0, "the reader threads do the work (see reader)")
        # torch's prefetch_factor counts batches per worker; the reader's threads take its place.
        factor = choose("prefetch_factor", prefetch_factor, READER_PREFETCH if threads else None,
                        f"{READER_PREFETCH} batches read ahead per reader thread" if threads else
                        "read when the feeder needs the batch; feed_depth converted batches wait ahead")
        batch_reader = ReaderPlan(threads, (factor or 0) * threads, fused)
        persistent = False  # torch's, which refuses it without workers; the threads keep theirs (below)
        if fused and persistent_workers is False:
            reasons["persistent_workers"] = "set by caller: the reader threads draw a new base seed each epoch"
        elif fused:
            reasons["persistent_workers"] = ("no worker processes: the reader threads keep their random streams "
                                             "between epochs, as persistent workers do")
        else:
            reasons["persistent_workers"] = ("no worker processes: reader threads start in microseconds"
                                             + (" (persistent_workers=True does not apply)" if persistent_workers
                                                else ""))
    else:
        workers = choose("num_workers", num_workers, *_default_workers(facts, multiprocessing_context,
                                                                       collate_fn, worker_init_fn, transform))
        if num_workers is not None and num_workers > env.cpu_count():
            reasons["num_workers"] = _too_many_workers(num_workers, fits)
        persistent = choose("persistent_workers", persistent_workers, workers > 0,
                            "workers survive between epochs" if workers else "no workers")
        factor = choose("prefetch_factor", prefetch_factor, PREFETCH_FACTOR if workers else None,
                        f"{PREFETCH_FACTOR} batches queued per worker absorb slow reads" if workers else "no workers")
    pin = choose("pin_memory", pin_memory, cuda,
                 "batches go to CUDA: asynchronous copies" if cuda else "batches stay on the CPU")
    order, reasons["sampler"] = _choose_sampler(facts, sampler, batch_sampler, shuffle, batch_size)
    return Plan(device=target, decode=decode, reader=batch_reader, num_workers=workers, persistent_workers=persistent,
                prefetch_factor=factor, pin_memory=pin, sampler=order, layout=layout, collate_fn=collate_with,
                reasons=reasons, facts=facts)


def _too_many_workers(num_workers: int, reader_fits: bool) -> str:
    """Why ``num_workers`` above the CPU count is taken but not what the caller may think."""
    cpus = env.cpu_count()
    why = (f"set by caller: {num_workers} worker processes on {cpus} CPUs (colabfast.where.env.cpu_count()) only take "
           "turns on them")
    if reader_fits:
        why += ("; asking for workers also turned off the reader threads, which make these batches in this process "
                "faster than any number of workers: leave num_workers unset")
    return why


_WARNED: set[int] = set()  # num_workers values warned about in this process


def _choose_decode(decode: str, facts: DatasetFacts, cuda: bool, batching: bool) -> tuple[str, str]:
    if decode not in ("auto", "cpu", "gpu"):
        raise ValueError(f"decode must be 'auto', 'cpu' or 'gpu', got {decode!r}")
    if decode == "gpu" and not (cuda and batching):
        raise ValueError("decode='gpu' needs a CUDA device and batching (a batch_size or batch_sampler)")
    if decode != "auto":
        return decode, "set by caller"
    if facts.output != "bytes":
        return "auto", "images arrive decoded (dataset.output is not 'bytes')"
    if cuda and batching:
        return "gpu", "dataset yields bytes, batches go to CUDA: nvJPEG in batches"
    return "cpu", "dataset yields bytes, batches stay on the CPU: decoded in the workers"


def _default_workers(facts: DatasetFacts, context: Any, *functions: Any) -> tuple[int, str]:
    if facts.iterable:
        return 0, "IterableDataset: every worker would replay the stream"
    if context is None and _spawned() and (facts.from_main or _from_main(None, *functions)):
        return 0, "workers are spawned here and cannot import what a notebook (__main__) defines"
    cpus = env.cpu_count()
    return cpus, f"{cpus} CPUs (colabfast.where.env.cpu_count())"


def _choose_sampler(facts: DatasetFacts, sampler: Any, batch_sampler: Any, shuffle: Optional[bool],
                    batch_size: Optional[int]) -> tuple[Any, str]:
    replicas, rank = world()  # (1, 0) unless torch.distributed is initialised
    ours = sampler is None and batch_sampler is None and not facts.iterable
    shares = (f"; rank {rank} of {replicas} (torch.distributed) reads its share of each epoch, padded or, with "
              "drop_last, truncated as DistributedSampler does" if replicas > 1 else "")
    if ours and shuffle and facts.mirror:
        if facts.shuffled:
            block, why = MAX_BLOCK_SIZE, "a mirror packed in shuffled order: blocks mix classes"
        elif not batch_size:
            block, why = MAX_BLOCK_SIZE, "no batches to mix"
        else:
            block = min(MAX_BLOCK_SIZE, max(1, batch_size // BLOCKS_PER_BATCH))
            spans = -(-batch_size // block)  # blocks that a batch's consecutive positions cover, at least
            why = f"a batch of {batch_size} mixes at least {spans} blocks (pack(shuffle=True) allows {MAX_BLOCK_SIZE})"
        return BlockPlan(block, replicas, rank), f"h5 mirror, shuffle=True, blocks of {block}: {why}{shares}"
    if ours and shuffle and replicas > 1:
        return ShardPlan(replicas, rank), f"shuffle=True, not an h5 mirror{shares}"
    if sampler is not None or batch_sampler is not None:
        return (sampler if sampler is not None else batch_sampler), "set by caller"
    if ours and replicas > 1:  # evaluation, as a rule: each rank's metric is then the whole dataset's
        return "SequentialSampler", (f"torch's default: shuffle=False under torch.distributed, so all {replicas} "
                                     "ranks read the whole dataset, as with torch's DataLoader; pass sampler="
                                     "DistributedSampler(dataset, shuffle=False) to shard it")
    return ("RandomSampler" if shuffle else "SequentialSampler"), "torch's default"


def _check_batchable(facts: DatasetFacts, *, per_image_transform: bool) -> None:
    """Refuse, before any worker starts, a mirror whose PIL images would reach the collate."""
    if not facts.pil_mirror or per_image_transform:  # its own transform (or H5Kitti's joint ones) may make tensors
        return
    mirror = facts.inner
    raise ValueError(
        f"{type(mirror).__name__}({str(mirror.path)!r}) gives PIL images (output='pil', the default, as "
        f"torchvision's) and a batch cannot hold them: pass output='tensor' (uint8 [3, H, W] tensors) or "
        f"output='bytes' (decoded by the loader, on the GPU when there is one), or a transform that makes "
        f"tensors, e.g. transform=torchvision.transforms.v2.PILToTensor()"
    )




def _spawned() -> bool:
    return torch.multiprocessing.get_start_method(allow_none=False) != "fork"


def _from_main(dataset: Any, *functions: Any) -> bool:
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
