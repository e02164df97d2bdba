"""Turn host batches into model inputs: :class:`Normalize`, :class:`BatchConverter`, :class:`CUDAPrefetcher`.

On CUDA a :class:`Feeder` thread converts on a side stream and hands each batch over with an event
(NVIDIA DALI's and FFCV's hand-over); how it works: [Feeding the GPU](../gpu-feed.md#how-it-works).
"""

from __future__ import annotations

import atexit
import collections.abc
import contextlib
import queue
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from colabfast.images.decode import Encoded, EncodedImages, decode_batch, is_encoded

__all__ = ["CUDAPrefetcher", "BatchConverter", "Normalize", "normalize", "ImageList"]

Floats = Union[float, Sequence[float], torch.Tensor]
# Batches converted ahead of the training loop. On an H100 pinned to 2 CPUs (ResNet-50, batch 128,
# `colabfast bench gpu`), 3 gave 0.78-0.80 of the data-on-GPU ceiling, 2 gave 0.74-0.77, 4 no more
# than 3 (0.76-0.79) for more memory; benchmarks/README.md.
FEED_DEPTH = 3


class ImageList(list):
    """A batch of images that could not be stacked (different sizes): a list of ``[C, H, W]`` tensors."""


class Normalize:
    """Convert images to ``dtype``, normalise with ``mean``/``std`` and set ``memory_format``.

    Integer images are scaled to 0..1 (as ``v2.ToDtype(dtype, scale=True)``), fused with the normalisation
    into one multiply-add computed in float32.

    Args:
        dtype: output dtype; default float32 when ``mean`` or ``std`` is given, else the images' own.
        mean: per-channel mean in 0..1 units (ImageNet: ``(0.485, 0.456, 0.406)``). Default 0.
        std: per-channel standard deviation in 0..1 units (ImageNet: ``(0.229, 0.224, 0.225)``). Default 1.
        memory_format: ``None`` (contiguous) or ``torch.channels_last``.

    Raises:
        ValueError: ``mean``/``std`` with a non-floating ``dtype``, a zero ``std``, or a number of
            values that does not match the images' channels (raised when called).
    """

    def __init__(
        self,
        dtype: Optional[torch.dtype] = None,
        mean: Optional[Floats] = None,
        std: Optional[Floats] = None,
        memory_format: Optional[torch.memory_format] = None,
    ) -> None:
        normalising = mean is not None or std is not None
        if normalising:
            if dtype is None:
                dtype = torch.float32
            if not dtype.is_floating_point:
                raise ValueError(f"mean/std need a floating dtype, got dtype={dtype}")
        self.dtype, self.memory_format = dtype, memory_format
        self.mean = None if mean is None else torch.as_tensor(mean, dtype=torch.float64).flatten()
        self.std = None if std is None else torch.as_tensor(std, dtype=torch.float64).flatten()
        if self.std is not None and bool((self.std == 0).any()):
            raise ValueError(f"std must not be zero, got {self.std.tolist()}")
        self._constants: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def changes_images(self) -> bool:
        """False when every call returns its input unchanged (no dtype, mean, std or memory format)."""
        return not (self.dtype is None and self.mean is None and self.std is None and self.memory_format is None)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """``images``: ``[B, C, H, W]`` or ``[C, H, W]``; returns a new tensor (or ``images`` if nothing to do)."""
        dtype = self.dtype or images.dtype
        scale = 1.0
        if dtype.is_floating_point and not images.dtype.is_floating_point:
            scale = 1.0 / torch.iinfo(images.dtype).max
        if self.mean is None and self.std is None and scale == 1.0:
            if images.dtype == dtype and _has_format(images, self.memory_format):
                return images
            if images.device.type == "cpu" and images.dtype == dtype and \
                    _format(images, self.memory_format) == torch.contiguous_format:
                # numpy copies an HWC-memory uint8 image into CHW 5x faster than torch's copy_ (0.3 vs
                # 1.7 ms at 500x375 on 2 CPUs): the per-image cost of a detection batch's list of images
                return torch.from_numpy(np.ascontiguousarray(images.numpy()))
            return _empty(images, dtype, self.memory_format).copy_(images)
        multiplier, offset = self._scale_and_shift(images, dtype, scale)
        out = _empty(images, dtype, self.memory_format)
        if images.is_cuda:  # one kernel: reads uint8, computes in float32, writes dtype
            return torch.addcmul(offset, images, multiplier, out=out)
        # On the CPU that mixed-dtype kernel is not vectorised (4x slower than these passes).
        work = out if out.dtype == multiplier.dtype else torch.empty_like(out, dtype=multiplier.dtype)
        work.copy_(images)
        torch.addcmul(offset, work, multiplier, out=work)
        return work if work is out else out.copy_(work)

    def _scale_and_shift(self, images: torch.Tensor, dtype: torch.dtype, scale: float) -> tuple[torch.Tensor, ...]:
        if images.dim() < 3 and (self.mean is not None or self.std is not None):
            raise ValueError(f"mean/std apply to images [..., C, H, W], got a tensor of shape {list(images.shape)}")
        channels = images.shape[-3] if images.dim() >= 3 else 1
        compute = torch.promote_types(dtype, torch.float32)
        key = (images.device, compute, scale, channels)
        if key not in self._constants:  # made once: a small host-to-device copy per batch would sync
            mean = torch.zeros(1, dtype=torch.float64) if self.mean is None else self.mean
            std = torch.ones(1, dtype=torch.float64) if self.std is None else self.std
            for name, values in (("mean", mean), ("std", std)):
                if len(values) not in (1, channels):
                    raise ValueError(f"{name} has {len(values)} values but the images have {channels} channels")
            shape = (channels, 1, 1) if images.dim() >= 3 else ()
            multiplier = (scale / std).expand(channels).reshape(shape)
            offset = (-mean / std).expand(channels).reshape(shape)
            self._constants[key] = (multiplier.to(images.device, compute), offset.to(images.device, compute))
        return self._constants[key]

    def __repr__(self) -> str:
        values = lambda t: None if t is None else tuple(round(v, 6) for v in t.tolist())  # noqa: E731
        return (
            f"Normalize(dtype={self.dtype}, mean={values(self.mean)}, std={values(self.std)}, "
            f"memory_format={self.memory_format})"
        )


def normalize(
    images: torch.Tensor,
    *,
    dtype: Optional[torch.dtype] = None,
    mean: Optional[Floats] = None,
    std: Optional[Floats] = None,
    memory_format: Optional[torch.memory_format] = None,
) -> torch.Tensor:
    """One-off :class:`Normalize`: ``normalize(x, mean=..., std=...)``. See it for the arguments."""
    return Normalize(dtype, mean, std, memory_format)(images)


def _format(x: torch.Tensor, memory_format: Optional[torch.memory_format]) -> torch.memory_format:
    # channels_last applies to images ([C, H, W]: HWC memory) and batches; anything else stays contiguous.
    if memory_format is None or x.dim() not in (3, 4):
        return torch.contiguous_format
    return memory_format


def _has_format(x: torch.Tensor, memory_format: Optional[torch.memory_format]) -> bool:
    memory_format = _format(x, memory_format)
    if x.dim() == 3 and memory_format == torch.channels_last:
        return x.permute(1, 2, 0).is_contiguous()
    return x.is_contiguous(memory_format=memory_format)


def _empty(like: torch.Tensor, dtype: torch.dtype, memory_format: Optional[torch.memory_format]) -> torch.Tensor:
    memory_format = _format(like, memory_format)
    if like.dim() == 3 and memory_format == torch.channels_last:
        c, h, w = like.shape
        return torch.empty((h, w, c), dtype=dtype, device=like.device).permute(2, 0, 1)
    return torch.empty(like.shape, dtype=dtype, device=like.device, memory_format=memory_format)


def _same_shape(images: Sequence[torch.Tensor]) -> bool:
    return all(i.shape == images[0].shape and i.dtype == images[0].dtype for i in images)


class BatchConverter:
    """Make one host batch into model inputs on ``device``.

    The images are the batch when it is a tensor, :class:`ImageList` or
    :class:`~colabfast.images.decode.EncodedImages`, else its first element; they are decoded (nvJPEG on
    CUDA), transformed, stacked when their shapes agree, and normalised. Other tensors are moved unchanged.

    Args:
        device: where the batch goes.
        normalize: the :class:`Normalize` applied to the images.
        transform: a batched transform (``transform.batched``, e.g. ``colabfast.images.transforms``) called once
            per batch, or a callable applied per image; None for none.
        non_blocking: copy with ``non_blocking=True``.
    """

    def __init__(
        self,
        device: Union[str, torch.device],
        normalize: Normalize,
        transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        non_blocking: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.normalize, self.transform, self.non_blocking = normalize, transform, non_blocking

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, (torch.Tensor, ImageList, EncodedImages)):
            return self.images(batch)
        if isinstance(batch, (list, tuple)) and batch:
            first, rest = self.images(batch[0]), [self.move(x) for x in batch[1:]]
            if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
                return type(batch)(first, *rest)
            return type(batch)([first, *rest]) if isinstance(batch, tuple) else [first, *rest]
        if isinstance(batch, collections.abc.Mapping) and (self.normalize.changes_images or self.transform):
            raise ValueError(
                f"cannot tell which part of a dict batch (keys {list(batch)}) holds the images for "
                f"mean/std/dtype/memory_format/transform: return (images, ...) tuples from the dataset "
                f"or collate_fn, or normalise inside the collate_fn"
            )
        return self.move(batch)

    def images(self, images: Any) -> Any:
        """Decode, transform, stack and normalise one batch's images; other types go to :meth:`move`."""
        batched = getattr(self.transform, "batched", False)
        if isinstance(images, torch.Tensor):
            images = images.to(self.device, non_blocking=self.non_blocking)
            if self.transform is None:
                return self.normalize(images)
            if batched and images.dim() == 4:
                return self.normalize(self.transform(images))
            images = list(images.unbind(0)) if images.dim() == 4 else [images]
        elif isinstance(images, EncodedImages):
            images = decode_batch(images, self.device)
        elif isinstance(images, ImageList):
            images = self._decode_mixed(images)
        else:
            return self.move(images)
        if batched and self.transform is not None:  # batched implies a transform: getattr(None, ...) is False
            images = self.transform(images)
            if isinstance(images, torch.Tensor):
                return self.normalize(images)
        elif self.transform is not None:
            images = [self.transform(i) for i in images]
        if _same_shape(images):
            return self.normalize(torch.stack(images))
        return [self.normalize(i) for i in images]

    def _decode_mixed(self, images: ImageList) -> list[torch.Tensor]:
        encoded = [i for i, x in enumerate(images) if is_encoded(x)]
        # None where an image is still encoded: each is filled in from the decoded batch below
        out: list[Any] = [None if is_encoded(x) else x.to(self.device, non_blocking=self.non_blocking) for x in images]
        if encoded:
            files = [images[i].data if isinstance(images[i], Encoded) else images[i] for i in encoded]
            indices = [images[i].index if isinstance(images[i], Encoded) else None for i in encoded]
            keys = [k for k in indices if k is not None]
            packed = EncodedImages.pack(files, None if len(keys) < len(indices) else keys)
            for i, img in zip(encoded, decode_batch(packed, self.device)):
                out[i] = img
        return out

    def move(self, x: Any) -> Any:
        """``x`` with every tensor inside (dicts, lists, tuples, namedtuples) moved to the device."""
        if isinstance(x, torch.Tensor):
            return x.to(self.device, non_blocking=self.non_blocking)
        if self.device.type == "cpu":
            return x  # nothing to move: keep the structure exactly as the collate made it
        if isinstance(x, collections.abc.Mapping):
            try:
                mapping_type: Any = type(x)  # a concrete mapping class; a TypeError if it takes no dict
                return mapping_type({k: self.move(v) for k, v in x.items()})
            except TypeError:  # a mapping type that cannot be built from a dict (e.g. defaultdict)
                return {k: self.move(v) for k, v in x.items()}
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(self.move(v) for v in x))
        if type(x) in (list, tuple):
            return type(x)(self.move(v) for v in x)
        if isinstance(x, list):
            return [self.move(v) for v in x]
        return x


def tensors(x: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nested batch (tensors, dicts, lists, tuples)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, collections.abc.Mapping):
        for v in x.values():
            yield from tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from tensors(v)


class Feeder:
    """Convert host batches in a background thread and hand them out in order, with a CUDA event each.

    An error in ``batches`` or ``convert`` is raised at the batch where it happened; at most ``depth``
    converted batches wait; :meth:`close` stops and joins the thread.

    Args:
        batches: iterator of host batches, consumed in the feeder thread only.
        convert: host batch -> converted batch (e.g. :class:`BatchConverter`).
        stream: the side CUDA stream to convert on; None converts on the CPU (no events).
        depth: converted batches that may wait for the consumer (>= 1).

    Raises:
        ValueError: ``depth`` < 1.
    """

    def __init__(
        self, batches: Iterator, convert: Callable[[Any], Any], stream: Optional[torch.cuda.Stream] = None,
        depth: int = 2,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1 (batches queued ahead), got {depth}")
        self.stream = stream
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        # The thread gets no reference to self: dropping the iterator (a `break`) lets __del__ stop it.
        self._thread = threading.Thread(
            target=_feed, args=(batches, convert, stream, self._queue, self._stop), name="colabfast-feeder",
            daemon=True,
        )
        self._thread.start()
        _LIVE.add(self)

    def __iter__(self) -> Feeder:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():  # died without a word: never
                    self.close()
                    raise RuntimeError("the colabfast feeder thread ended without handing over a batch") from None
            except KeyboardInterrupt:  # a notebook's interrupt: the traceback would keep the thread alive
                self.close()
                raise
        if item is _END:
            self.close()
            raise StopIteration
        batch, event, error = item
        if error is not None:
            self.close()
            raise error
        if event is not None:
            assert self.stream is not None  # _feed records an event only on a stream
            consumer = torch.cuda.current_stream(self.stream.device)
            consumer.wait_event(event)
            for t in tensors(batch):
                if t.is_cuda:
                    t.record_stream(consumer)
        return batch

    def close(self) -> None:
        """Stop the feeder thread and wait for it; idempotent. Queued batches are dropped."""
        self._done = True
        self._stop.set()
        while True:  # unblock a put() waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join()
        _LIVE.discard(self)

    def __del__(self) -> None:
        if "_thread" in vars(self):
            self.close()


_END = object()
_LIVE: weakref.WeakSet[Feeder] = weakref.WeakSet()


def _feed(batches: Iterator, convert: Callable, stream: Optional[torch.cuda.Stream], out: queue.Queue,
          stop: threading.Event) -> None:
    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    context = (lambda: torch.cuda.stream(stream)) if stream is not None else contextlib.nullcontext
    try:
        with torch.cuda.device(stream.device) if stream is not None else contextlib.nullcontext():
            while not stop.is_set():
                try:
                    with context():
                        batch = next(batches)
                        converted = convert(batch)
                        del batch  # the pinned host buffer goes back once its copy is done
                        event = None
                        if stream is not None:
                            event = torch.cuda.Event()
                            event.record(stream)
                except StopIteration:
                    put(_END)
                    return
                except BaseException as exc:  # raised in the consumer, at this batch
                    put((None, None, exc))
                    return
                if not put((converted, event, None)):
                    return
                del converted
    finally:
        close = getattr(batches, "close", None)
        if callable(close):
            close()  # a generator must be closed in the thread that runs it


@atexit.register
def _close_all() -> None:
    # Daemon threads are frozen mid-call at interpreter exit (inside a CUDA call, say); stop them first.
    for feeder in list(_LIVE):
        feeder.close()


class Feeding:
    """One loader's feeders, one epoch at a time: :meth:`start` stops the previous one first."""

    def __init__(self, convert: Callable[[Any], Any], stream: Optional[torch.cuda.Stream], depth: int) -> None:
        self.convert, self.stream, self.depth = convert, stream, depth
        self._running: Optional[weakref.ref[Feeder]] = None

    def stop(self) -> None:
        """Close the running feeder, if there is one; idempotent."""
        feeder = self._running() if self._running is not None else None
        if feeder is not None:
            feeder.close()
        self._running = None

    def start(self, batches: Callable[[], Iterator]) -> Feeder:
        """A new epoch's :class:`Feeder` over ``batches()``."""
        self.stop()
        feeder = Feeder(batches(), self.convert, self.stream, self.depth)
        self._running = weakref.ref(feeder)
        return feeder


class CUDAPrefetcher:
    """Wrap any DataLoader so its batches arrive on the GPU, converted ahead by a feeder thread.

    Give the loader ``pin_memory=True`` and the uint8 :func:`colabfast.loading.collate.collate`.

    Args:
        loader: any iterable of batches (re-iterable for several epochs).
        device: the CUDA device, e.g. ``"cuda"`` or ``"cuda:1"``.
        mean, std, dtype, memory_format: as :class:`Normalize` (``mean``/``std`` in 0..1 units).
        transform: applied on the GPU: a :mod:`colabfast.images.transforms` transform to the whole batch,
            any other callable to each image.
        depth: converted batches queued ahead of the training loop.

    Raises:
        RuntimeError: no CUDA GPU is available.
        ValueError: ``device`` is not a CUDA device.
    """

    def __init__(
        self,
        loader: Iterable,
        device: Union[str, torch.device] = "cuda",
        *,
        mean: Optional[Floats] = None,
        std: Optional[Floats] = None,
        dtype: Optional[torch.dtype] = None,
        memory_format: Optional[torch.memory_format] = None,
        transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        depth: int = FEED_DEPTH,
    ) -> None:
        self.loader, self.depth = loader, depth
        self.device = cuda_device(device)
        self.stream = torch.cuda.Stream(device=self.device)  # once per prefetcher (timm#2781)
        self.convert = BatchConverter(self.device, Normalize(dtype, mean, std, memory_format), transform, True)
        self._feeding = Feeding(self.convert, self.stream, depth)

    def __iter__(self) -> Iterator:
        return self._feeding.start(lambda: iter(self.loader))

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


def cuda_device(device: Union[str, torch.device]) -> torch.device:
    """``device`` as a CUDA ``torch.device`` with an index (``"cuda"`` -> ``cuda:<current>``).

    Raises:
        ValueError: ``device`` is not a CUDA device.
        RuntimeError: torch sees no CUDA GPU.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {device}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device={str(device)!r} but torch sees no CUDA GPU (torch.cuda.is_available() is False). "
            f"In Colab: Runtime > Change runtime type > GPU; elsewhere use device='cpu' or 'auto'."
        )
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
