""":class:`DataLoader`: a ``torch.utils.data.DataLoader`` built from its plan (:mod:`colabfast.loading.planning`)."""

from __future__ import annotations

import contextlib
import functools
import gc
import operator
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Sized, Union, cast

import torch
import torch.utils.data
from torch.utils.data import Dataset

from colabfast.datasets import dropins as datasets
from colabfast.errors import LoaderStateError
from colabfast.images import transforms
from colabfast.images.decode import Encoded, decode_cpu, is_encoded, is_jpeg
from colabfast.loading import reader, resume, stages, streaming, threadworkers
from colabfast.loading.planning import _WARNED, SAMPLER_PLANS, BlockPlan, plan
from colabfast.loading.prefetch import FEED_DEPTH, BatchConverter, Feeding, Floats, Normalize
from colabfast.loading.stages import StageClock, StageTime
from colabfast.where import env

if TYPE_CHECKING:
    from colabfast.loading.planning import Plan

__all__ = ["DataLoader", "LoaderStateError"]

# --- decoding and transforming in the workers --------------------------------------------------------


class _Prepared(Dataset):
    """The caller's dataset with each sample's image decoded (and transformed) in the worker; other
    attributes are the wrapped dataset's.
    """

    def __init__(self, dataset: Dataset, *, keep_jpeg: bool, transform: Optional[Callable], decode: bool = True,
                 views: bool = False, clock: Optional[StageClock] = None) -> None:
        self.dataset, self.keep_jpeg, self.transform = dataset, keep_jpeg, transform
        # the dataset's __getitem__ as "read", decoding and transforming here as "decode+transform"
        self.clock = clock if clock is not None else StageClock()
        self.decode = decode  # False: samples pass as they are (the wrapper is there for `views` only)
        # True where the loader's collate copies every image it batches: a mirror may then hand its
        # images over as views of its read buffer (MirrorDataset.items), saving a copy per image.
        self.views = views

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: Any) -> Any:
        t = stages.now()
        sample = self.dataset[index]
        t1 = stages.now()
        self.clock.add(stages.READ, t1 - t)
        if not self.decode and self.transform is None:
            return sample
        sample = self._prepare(index, sample)
        self.clock.add(stages.DECODE, stages.now() - t1)
        return sample

    def __getitems__(self, indices: list) -> list:
        if not indices:  # an empty batch keeping the workers' turns (colabfast.loading.resume)
            return []
        t = stages.now()
        # Keep the wrapped dataset's batched reads (a mirror reads runs of consecutive samples at once).
        if self.views and isinstance(self.dataset, datasets.MirrorDataset):
            samples = self.dataset.items(indices, views=True)
        elif callable(getitems := getattr(self.dataset, "__getitems__", None)):
            samples = getitems(indices)
        else:
            samples = [self.dataset[i] for i in indices]
        t1 = stages.now()
        self.clock.add(stages.READ, t1 - t, len(indices))
        if not self.decode and self.transform is None:
            return samples
        samples = [self._prepare(i, s) for i, s in zip(indices, samples)]
        self.clock.add(stages.DECODE, stages.now() - t1, len(indices))
        return samples

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
        if name.startswith("__") or name in ("dataset", "clock"):  # not during unpickling, before they are set
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset!r})"
class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` with tuned defaults and GPU feeding; a drop-in replacement.

    It takes every ``torch.utils.data.DataLoader`` argument, positionally in the same order, with the same
    meaning. Those left unset are chosen for the machine (2 CPUs on Colab): ``num_workers`` (the CPUs),
    ``persistent_workers``, ``prefetch_factor=4``, ``pin_memory`` for CUDA, a `BlockShuffleSampler` for a
    shuffled mirror, the uint8 `colabfast.loading.collate.collate`. Each choice and its reason are in
    ``loader.choices`` and ``repr(loader)``; ``loader.plan`` is the `Plan` they come from. Over a mirror
    (``H5ImageFolder(output="tensor" or "bytes")``) batches are read by threads of this process, and a
    torchvision v2 ``RandomResizedCrop``/``Resize``/``CenterCrop`` + flip runs fused with decoding in
    those threads, giving exactly the batches of ``num_workers`` worker processes under the same seed.
    On CUDA a feeder thread copies, decodes (nvJPEG) and normalises batches on a side stream one step
    ahead. How each default is chosen, with the measurements: [Feeding the GPU](../gpu-feed.md).

    Examples:
        >>> import colabfast as cf
        >>> from torchvision.transforms import v2
        >>> ds = cf.H5ImageFolder("flowers.h5", output="tensor")  # a mirror cf.pack made
        >>> loader = cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu",
        ...                        transform=v2.RandomResizedCrop(32, antialias=True))
        >>> images, labels = next(iter(loader))
        >>> images.shape, images.dtype, labels.shape
        (torch.Size([4, 3, 32, 32]), torch.uint8, torch.Size([4]))
        >>> loader.choices["transform"][1]
        'per image, fused with decoding in the reader threads'

    Args:
        device: where batches arrive: ``"auto"`` (CUDA if torch sees a GPU, else CPU), ``"cpu"``,
            ``"cuda"``, ``"cuda:1"`` or a ``torch.device``.
        mean: per-channel mean in 0..1 units (torchvision ``Normalize``'s; ImageNet: ``(0.485, 0.456,
            0.406)``); uint8 images are scaled by 1/255 first. Default: none.
        std: per-channel standard deviation in 0..1 units (ImageNet: ``(0.229, 0.224, 0.225)``).
        dtype: image dtype (``torch.float32``, ``torch.bfloat16``, ...). Default: float32 with ``mean``/``std``,
            else the images' own (uint8).
        memory_format: ``None`` (contiguous ``[B, C, H, W]``) or ``torch.channels_last``.
        decode: where encoded images (``H5ImageFolder(output="bytes")``) are decoded: ``"gpu"`` (JPEGs by
            nvJPEG in batches; needs CUDA), ``"cpu"``, or ``"auto"`` (``"gpu"`` for bytes going to CUDA).
            Decoded images are RGB uint8 ``[3, H, W]``.
        transform: applied to each image (uint8 ``[C, H, W]``) before batching: in the feeder thread on
            CUDA (a `colabfast.images.transforms` transform does a whole batch at once), else per image on
            the CPU, fused with decoding where it can be (``loader.choices["transform"]`` says where).
        feed_depth: on CUDA, converted batches queued ahead of the training loop (default 3).
        draft: decode a JPEG at 1/2, 1/4 or 1/8 scale where a fused crop shrinks it at least that much
            (libjpeg-turbo's DCT scaling): faster, 0.3 grey levels from torchvision's pixels on average.

    Raises:
        ValueError: a bad ``decode``/``mean``/``std``/``dtype`` combination, ``feed_depth`` < 1, PIL images
            (``output="pil"``) that nothing makes tensors before batching (the message says what to pass),
            or what ``torch.utils.data.DataLoader`` raises for its arguments.
        RuntimeError: a CUDA ``device`` without a GPU.
        SamplerRefused: ``drop_last=True`` sharding fewer samples than ``torch.distributed`` has ranks.

    `state_dict` and `load_state_dict` resume an epoch where a lost runtime left it, with the same batches
    ([Resuming](../resume.md)). Unlike torch's, ``iter(loader)`` is a generator (``len(loader)`` works).
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
        draft: bool = False,
        **kwargs: Any,
    ) -> None:
        if feed_depth < 1:
            raise ValueError(f"feed_depth must be >= 1 (converted batches queued ahead on the GPU), got {feed_depth}")
        p = plan(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
                 num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, worker_init_fn=worker_init_fn,
                 multiprocessing_context=multiprocessing_context, prefetch_factor=prefetch_factor,
                 persistent_workers=persistent_workers, device=device, memory_format=memory_format, decode=decode,
                 transform=transform, draft=draft)
        cuda = p.device.type == "cuda"
        if num_workers is not None and num_workers > env.cpu_count() and num_workers not in _WARNED:
            _WARNED.add(num_workers)
            warnings.warn(f"colabfast.DataLoader: {p.reasons['num_workers']}", stacklevel=2)
        if isinstance(p.sampler, SAMPLER_PLANS):  # built here: drawing its seed moves the generator, as RandomSampler
            # torch's Dataset declares no __len__; a mirror (a map-style dataset) has one
            sampler, shuffle = p.sampler.build(cast(Sized, dataset), generator, drop_last), None
        clock = StageClock()  # where this process's threads add the time each stage takes (stage_times)
        super().__init__(
            _prepared(dataset, p, transform, clock),
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            p.num_workers,
            _TimedCollate(clock, p.collate_fn) if isinstance(p.collate_fn, functools.partial) and p.layout is not None
            else p.collate_fn,
            p.pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            # torch's, per worker: a reader's threads have their own (ReaderPlan.prefetch)
            prefetch_factor=None if p.reader is not None else p.prefetch_factor,
            persistent_workers=p.persistent_workers,
            **kwargs,
        )
        self.plan = p
        self._clock = clock
        self.device = p.device
        self.normalize = Normalize(dtype, mean, std, memory_format)
        self.transform, self.feed_depth = transform, feed_depth
        self.choices = p.choices()
        if isinstance(p.sampler, BlockPlan):
            self.choices["sampler"] = (self.sampler, p.reasons["sampler"])
        self.choices["normalize"] = (self.normalize, "from dtype, mean, std, memory_format")
        if transform is not None:
            fused = p.reader is not None and p.reader.fused is not None
            self.choices["transform"] = (transform, _where_transform_runs(transform, cuda, fused))
        if (stream := streaming.choice(self, dataset)) is not None:
            self.choices["stream"] = stream
        self._convert = BatchConverter(p.device, self.normalize, transform if cuda else None, non_blocking=cuda)
        self._reader: Optional[reader.BatchReader] = None
        self._threads: Optional[threadworkers.ThreadWorkers] = None
        self._feeding: Optional[Feeding] = None
        # what state_dict() describes: the epoch's start, batches yielded, the threads' marks (resume.py)
        self._start: Optional[resume.EpochStart] = None
        self._yielded, self._finished, self._marks = 0, False, resume.Marks()
        self._loaded: Optional[dict[str, Any]] = None  # a mid-epoch state_dict, resumed by the next iter()
        self._once: Optional[_Once] = None
        # torch's workers' random streams after their last batch handed out; what new ones start from
        self._worker_states: dict[int, tuple] = {}
        self._restore: Optional[dict[str, Any]] = None
        if p.reader is not None:
            self._reader = reader.BatchReader(p.facts.inner, threads=p.reader.threads, prefetch=p.reader.prefetch,
                                              pin_memory=p.pin_memory, channels_last=p.layout == torch.channels_last,
                                              fused=p.reader.fused, index_map=p.facts.mapping, clock=clock)
        if self._reader is not None and self._reader.fused is not None:  # random draws: dealt out as to workers
            self._threads = threadworkers.ThreadWorkers(self._reader.read, workers=self._reader.threads,
                                                        prefetch=self._reader.prefetch,
                                                        persistent=persistent_workers is not False, generator=generator,
                                                        split=self._reader.split)
        # On CUDA each epoch's batches are converted by a feeder thread on the loader's one side stream,
        # made here and never per epoch (timm#2781).
        self._timed = _TimedConvert(self._convert, clock)
        self._feeding = Feeding(self._timed, torch.cuda.Stream(device=p.device), feed_depth) if cuda else None

    def _batches(self, batch_indices: Optional[Iterable] = None, base_seed: Optional[int] = None, *,
                 start: int = 0, states: Optional[list] = None) -> Iterator:
        """The epoch's host batches, before converting (arguments: resuming, as :meth:`ThreadWorkers.batches`)."""
        inner = self.dataset.dataset if isinstance(self.dataset, _Prepared) else self.dataset
        return streaming.planned(self, inner, batch_indices,  # the plan first: workers read once started
                                 lambda: self._host_batches(batch_indices, base_seed, start=start, states=states))

    def _host_batches(self, batch_indices: Optional[Iterable], base_seed: Optional[int], *, start: int,
                      states: Optional[list]) -> Iterator:
        # the reader runs only with a batch_size and no batch_sampler: torch made a BatchSampler
        indices = batch_indices if batch_indices is not None else self.batch_sampler
        if self._threads is not None:
            return self._threads.batches(indices, seed=base_seed, start=start, states=states,  # type: ignore[arg-type]
                                         marks=self._marks)
        if self._reader is not None:
            assert indices is not None
            return self._reader.batches(indices)
        if batch_indices is not None:  # resuming: torch's iterator takes the epoch's rest from _index_sampler
            self._once = _Once(torch.utils.data.DataLoader._index_sampler.fget(self), batch_indices)  # type: ignore[attr-defined]
            if self._iterator is not None:  # persistent workers keep their index sampler: new ones take _Once
                self._iterator._shutdown_workers()  # type: ignore[attr-defined]
                self._iterator = None
        starting = self.num_workers > 0 and (not self.persistent_workers or self._iterator is None)
        with _frozen_for_fork(starting and self._forks()), resume.starting_workers(self, starting):
            batches = super().__iter__()
        return resume.unstamped(self, batches, start) if self.num_workers > 0 else batches

    @property
    def _index_sampler(self) -> Any:  # torch's, or while resuming the rest of the epoch first (_Once)
        once = vars(self).get("_once")
        return once if once is not None else torch.utils.data.DataLoader._index_sampler.fget(self)  # type: ignore[attr-defined]

    def _forks(self) -> bool:
        context = self.multiprocessing_context
        method = context.get_start_method() if context is not None else \
            torch.multiprocessing.get_start_method(allow_none=False)
        return method == "fork"

    # A generator of converted batches, not torch's _BaseDataLoaderIter (see "Differences" above).
    def __iter__(self) -> Iterator:  # type: ignore[override]
        if self._feeding is not None:
            # first: the last epoch's feeder thread may still be drawing from the transform's generator
            self._feeding.stop()
        if self._once is not None:  # a resumed epoch's rest was for that epoch only
            self._once.rest = None
        self._start = resume.epoch_start(self)
        if not self._start.seeded:  # new workers this epoch, seeded anew
            self._worker_states = {}
        self._yielded, self._finished, self._marks = 0, False, resume.Marks()
        self._timed.marks, self._timed.position = self._marks, 0
        if self._loaded is not None:
            loaded, self._loaded = self._loaded, None
            return self._waited(resume.rest_of_epoch(self, loaded))
        if resume.reseeds(self):
            # The transform draws in this process: a seed per epoch from the loader's generator, as
            # torch draws its workers' base seed (workers reseed from that one themselves); drawn
            # only for colabfast.images.transforms' random steps.
            transforms.reseed(self.transform, self.generator)
        if self._feeding is None:
            return self._waited(map(self._convert, self._batches()))
        return self._waited(self._feeding.start(self._batches))

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, for :meth:`load_state_dict` in a new process (torchdata's
        ``StatefulDataLoader`` convention; [Resuming](../resume.md)). Save it with the model's checkpoint.

        Returns:
            a dict of numbers, strings, lists and CPU tensors (``torch.load(weights_only=True)`` reads it).
        """
        return resume.state_of(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (:meth:`state_dict` of a loader built the same way): the next ``iter(loader)``
        yields the rest of its epoch, or the next epoch. Restore torch's global RNG from the same checkpoint.

        Raises:
            LoaderStateError: ``state`` breaks the schema (docs/resume.md), or was saved by a loader of another
                dataset length, batch size, ``num_workers``, sampler or number of reader threads; the loader is
                left as it was.
        """
        resume.check(self, state)
        self._loaded = state if state["position"] is not None else None
        if self._loaded is None:
            resume.restore_between_epochs(self, state)

    def _waited(self, batches: Iterator) -> Iterator:
        add, now, wait = self._clock.add, stages.now, stages.WAIT
        marks = self._marks  # this epoch's: a newer iterator counts its own batches
        try:
            while True:
                start = now()
                try:
                    batch = next(batches)
                except StopIteration:
                    if marks is self._marks:
                        self._finished = True
                    return
                add(wait, now() - start)
                if marks is self._marks:
                    self._yielded += 1
                    resume.yielded(self, marks)
                yield batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def stage_times(self) -> dict[str, StageTime]:
        """The time this loader's work took so far, per stage (:mod:`colabfast.loading.stages`), in pipeline
        order: name -> :class:`~colabfast.loading.stages.StageTime`. Work in worker processes is not counted.
        """
        return self._clock.times()

    def close(self) -> None:
        """Stop the feeder thread; iterating again starts it anew."""
        if self._feeding is not None:
            self._feeding.stop()

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


def _prepared(dataset: Any, p: Plan, transform: Optional[Callable], clock: StageClock) -> Any:
    """The dataset torch's workers read: the caller's, or wrapped in :class:`_Prepared`."""
    cuda = p.device.type == "cuda"
    if p.reader is not None:
        return dataset
    if p.decode in ("cpu", "gpu") or (transform is not None and not cuda):
        return _Prepared(dataset, keep_jpeg=p.decode == "gpu", transform=None if cuda else transform,
                         views=p.layout is not None and p.num_workers > 0, clock=clock)
    if p.layout is not None and p.num_workers > 0 and p.facts.mapping is None and \
            isinstance(p.facts.inner, datasets.MirrorDataset):
        return _Prepared(dataset, keep_jpeg=False, transform=None, decode=False, views=True, clock=clock)
    return dataset


class _TimedCollate(functools.partial):
    """The plan's collate, timed (stage ``"collate"``)."""

    clock: StageClock

    def __new__(cls, clock: StageClock, collate_fn: functools.partial) -> _TimedCollate:
        self = super().__new__(cls, collate_fn.func, *collate_fn.args, **collate_fn.keywords)
        self.clock = clock
        return self

    def __reduce__(self) -> Any:  # to worker processes: with a clock of their own (StageClock.__reduce__)
        return _TimedCollate, (self.clock, functools.partial(self.func, *self.args, **self.keywords))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = stages.now()
        batch = super().__call__(*args, **kwargs)
        self.clock.add(stages.COLLATE, stages.now() - start, len(args[0]) if args else 0)
        return batch


class _TimedConvert:
    """The feeder's :class:`~colabfast.loading.prefetch.BatchConverter`, timed (stage ``"copy"``), recording
    the transform's random states per batch in ``marks``.
    """

    def __init__(self, convert: Callable[[Any], Any], clock: StageClock) -> None:
        self.convert, self.clock = convert, clock
        self.marks: Optional[resume.Marks] = None
        self.position = 0
        transform = getattr(convert, "transform", None)
        self._random = transform is not None and bool(transforms.random_states(transform))

    def __call__(self, batch: Any) -> Any:
        if self._random and self.marks is not None:
            with self.marks.lock:
                self.marks.record(self.position, transforms.random_states(getattr(self.convert, "transform", None)),
                                  "transform")
        self.position += 1
        start = stages.now()
        out = self.convert(batch)
        self.clock.add(stages.COPY, stages.now() - start)
        return out


class _Once:
    """A resumed epoch's index sampler: yields ``rest`` while set, else the sampler's own."""

    def __init__(self, sampler: Any, rest: Iterable) -> None:
        self.sampler, self.rest = sampler, cast(Optional[Iterable], rest)

    def __iter__(self) -> Iterator:
        return iter(self.rest if self.rest is not None else self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def _where_transform_runs(transform: Callable, cuda: bool, threads: bool = False) -> str:
    if not cuda:
        return "per image, fused with decoding in the reader threads" if threads else "per image in the workers"
    if getattr(transform, "batched", False):
        return "whole batches on the GPU, in the feeder thread"
    return "per image on the GPU, in the feeder thread (fallback: colabfast.images.transforms batch)"


@contextlib.contextmanager
def _frozen_for_fork(forking: bool) -> Iterator[None]:
    """Fork workers with this process's objects frozen out of their collectors' reach (``gc.freeze``).

    A child's collector freeing an inherited CUDA tensor aborts it (docs/gpu-feed.md, "How it works").
    """
    if not (forking and torch.cuda.is_initialized()):
        yield
        return
    gc.collect()  # what is garbage now goes here, where CUDA works, not in the children
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
