"""Whole batches read from a mirror by threads in the training process: :class:`BatchReader`.

A plain ``DataLoader`` over a mirror pays, per sample, a Python call, and per batch a worker process,
a collate and a trip through shared memory. For a mirror those costs are most of the work: raw
pixels need no decoding at all, and JPEG decoding (libjpeg-turbo through ``simplejpeg``, see
:func:`~colabfast.gpudecode.decode_cpu`) and ``os.pread`` release the GIL. So for the indices of one
batch (mostly runs of consecutive samples, as :class:`~colabfast.sampler.BlockShuffleSampler` draws
them) this reads each run with one ``pread`` straight into the batch's own memory, decodes encoded
images in the same thread straight into their slots of the batch, and hands the batch over as
``colabfast.loading.collate`` would have built it. A pool of threads reads
``prefetch`` batches ahead, in order. FFCV's loader works the same way (threads in one process,
whole-batch reads into preallocated memory; Leclerc et al., "FFCV: Accelerating Training by
Removing Data Bottlenecks", CVPR 2023); the figures against it are in ``benchmarks/README.md``.

``colabfast.DataLoader`` uses it on its own where it gives the same batches as its worker path
(:func:`applies` says when and why not), and says so in ``loader.choices["reader"]``.
"""

from __future__ import annotations

import collections
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Subset

from colabfast.datasets import MAX_READ, H5ImageFolder, MirrorDataset, undecodable
from colabfast.gpudecode import JPEG_MAGIC, EncodedImages, check_encoded, decode_cpu
from colabfast.mirror import MirrorError
from colabfast.prefetch import ImageList

__all__ = ["BatchReader", "applies"]


def _mirror_of(dataset: Any) -> tuple[Any, Optional[np.ndarray]]:
    """The dataset under any ``torch.utils.data.Subset`` wrappers, and the int64 array that maps the
    outer dataset's indices onto its (None without a Subset).

    Raises:
        IndexError: a Subset's index is outside the dataset it wraps (as indexing it would).
    """
    mapping: Optional[np.ndarray] = None
    while isinstance(dataset, Subset):
        idx = np.asarray(dataset.indices, dtype=np.int64).reshape(-1)
        mapping = idx if mapping is None else idx[mapping]
        dataset = dataset.dataset
    if mapping is not None:
        n = len(dataset)
        if len(mapping) and (mapping.min() < -n or mapping.max() >= n):
            raise IndexError(f"a Subset index is outside its dataset of {n} samples")
        mapping = np.where(mapping < 0, mapping + n, mapping)
    return dataset, mapping


def applies(dataset: Any, *, transform_on_cpu: bool, decode: str) -> tuple[bool, str]:
    """Whether :class:`BatchReader` can read ``dataset``'s batches, and why (or why not).

    It can for an :class:`~colabfast.H5ImageFolder`, or a ``Subset`` of one (a train/validation
    split), with no ``transform`` or ``target_transform`` of its own, ``output="tensor"`` or
    ``"bytes"``, and no per-image ``DataLoader(transform=...)`` to run on the CPU: then a sample is
    its stored bytes, decoded or not, and its label, which threads can produce without running the
    caller's Python per sample.
    """
    dataset = _mirror_of(dataset)[0]
    if type(dataset) is not H5ImageFolder:
        kind = "a KITTI mirror (targets built per sample)" if isinstance(dataset, MirrorDataset) else "not a mirror"
        return False, f"worker processes: {kind}"
    if dataset.transform is not None or dataset.target_transform is not None:
        return False, "worker processes: the dataset's own transforms run per sample in Python"
    if transform_on_cpu:
        return False, "worker processes: DataLoader(transform=...) runs per image on the CPU"
    if dataset.output == "pil":
        return False, "worker processes: output='pil' makes PIL images per sample"
    if dataset.output == "bytes" and decode == "cpu":
        return False, "worker processes: decode='cpu' of bytes"
    return True, "threads in this process read whole batches (colabfast.reader): no per-sample Python"


class BatchReader:
    """Batches of an :class:`~colabfast.H5ImageFolder` read by threads, as the loader's collate builds them.

    Each batch is ``[images, targets]``: ``targets`` int64 ``[B]``; ``images`` for ``output="tensor"``
    a uint8 ``[B, 3, H, W]`` tensor (channels-last memory when ``channels_last``, else contiguous)
    when all images of the batch have one size, else an :class:`~colabfast.prefetch.ImageList`; for
    ``output="bytes"`` an :class:`~colabfast.gpudecode.EncodedImages` (the batch's files back to back
    in one tensor, read with one ``pread`` per run of consecutive samples, no per-sample tensors).
    Every batch owns its memory: nothing is reused while the caller holds the batch or any view of
    it. Memory the caller has dropped is reused for later batches (up to ``prefetch + threads + 2``
    batches' worth kept for the reader's lifetime: fresh pages cost a fault each); with
    ``pin_memory`` it is allocated in pinned memory through torch's caching host allocator, which
    reuses freed blocks itself, so the copy to the GPU is asynchronous.

    Args:
        dataset: the mirror dataset, or a ``Subset`` of it (see :func:`applies`); the indices given to
            :meth:`batches` and :meth:`read` are this dataset's.
        threads: batches read at once (default: the CPUs this process may use).
        prefetch: batches read ahead of the one handed out (default ``2 * threads``); memory is
            bounded by ``prefetch + threads + 2`` batches besides those the caller holds.
        channels_last: the memory layout of same-size image batches.
        pin_memory: allocate image batches in pinned memory (needs CUDA).

    Raises (while iterating):
        MirrorError: an image cannot be decoded, a read ends early (the file was truncated), or with
            ``dataset.verify`` an image differs from its CRC-32; each names the file and sample.
        OSError: a read failed after the retries of transient errors (EIO, ENOTCONN, ...).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        threads: int,
        prefetch: Optional[int] = None,
        channels_last: bool = False,
        pin_memory: bool = False,
    ) -> None:
        self.dataset, self._map = _mirror_of(dataset)
        self.threads = max(1, threads)
        self.prefetch = max(1, prefetch if prefetch is not None else 2 * self.threads)
        self.channels_last, self.pin_memory = channels_last, pin_memory
        self._targets = torch.from_numpy(np.asarray(self.dataset.reader.index.targets, dtype=np.int64))
        self._memory = _Recycled(keep=self.prefetch + self.threads + 2)  # in flight, + the caller's

    def batches(self, batch_indices: Iterable[Sequence[int]]) -> Iterator[list]:
        """The batches for ``batch_indices`` (e.g. a ``BatchSampler``), in order, ``prefetch`` ahead."""
        pending: collections.deque[Future] = collections.deque()
        stop = threading.Event()
        with ThreadPoolExecutor(self.threads, thread_name_prefix="colabfast-reader") as pool:
            try:
                for indices in batch_indices:
                    pending.append(pool.submit(self._checked, list(indices), stop))
                    if len(pending) > self.prefetch:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:  # the consumer stopped early or a batch failed: drop what is queued
                stop.set()
                for f in pending:
                    f.cancel()

    def _checked(self, indices: list[int], stop: threading.Event) -> list:
        if stop.is_set():
            return []
        return self.read(indices)

    def read(self, indices: Sequence[int]) -> list:
        """One batch for ``indices`` (see the class docstring)."""
        mapped = indices if self._map is None else self._map[np.asarray(indices, dtype=np.int64)]
        indices = [int(i) for i in mapped]
        targets = self._targets[indices]
        if self.dataset.output == "bytes":
            return [self._read_bytes(indices), targets]
        return [self._read_images(indices), targets]

    # --- reading ---------------------------------------------------------------------------------

    def _runs(self, indices: Sequence[int]) -> list[tuple[int, int]]:
        """``(first, last)`` sample of each run of consecutive indices in ``indices``' order, split so
        that no read exceeds ``MAX_READ`` bytes."""
        offsets = self.dataset.reader.offsets
        runs, first = [], indices[0]
        for prev, i in zip(indices, indices[1:]):
            if i != prev + 1 or offsets[i + 1] - offsets[first] > MAX_READ:
                runs.append((first, prev))
                first = i
        runs.append((first, indices[-1]))
        return runs

    def _read_bytes(self, indices: list[int]) -> EncodedImages:
        offsets = self.dataset.reader.offsets
        lengths = torch.from_numpy((offsets[np.add(indices, 1)] - offsets[indices]).astype(np.int64))
        data = self._memory.empty((int(lengths.sum()),))
        pos = 0
        for first, last in self._runs(indices):
            n = int(offsets[last + 1] - offsets[first])
            self._fill(data[pos : pos + n], int(offsets[first]))
            pos += n
        files = data.split(lengths.tolist())
        if self.dataset.verify:
            self.dataset.reader.index.check_samples(indices, [f.numpy() for f in files])
        for i, f in zip(indices, files):  # the declared sizes, within the pixel limit, before nvJPEG allocates
            self._check(i, f)
        # Only JPEGs go to nvJPEG (the worker path decodes others on the CPU): the signature of every
        # file at once, no per-sample Python.
        starts = np.concatenate(([0], np.cumsum(lengths.numpy())[:-1]))
        head = data.numpy()[np.minimum(starts[:, None] + np.arange(3), len(data) - 1)]
        jpeg = (lengths.numpy() >= 3) & (head == np.frombuffer(JPEG_MAGIC, np.uint8)).all(axis=1)
        if not jpeg.all():
            k = int(np.flatnonzero(~jpeg)[0])
            raise MirrorError(f"{self.dataset.path}: sample {indices[k]} is not a JPEG, and decode='gpu' decodes "
                              "JPEGs only: pass decode='cpu'")
        return EncodedImages(data, lengths, torch.tensor(indices, dtype=torch.int64))

    def _read_images(self, indices: list[int]) -> Any:
        reader = self.dataset.reader
        shapes = reader.shapes[indices]
        same = bool((shapes == shapes[0]).all())
        if reader.store == "raw" and same:
            h, w, c = (int(v) for v in shapes[0])
            shape = (len(indices), h, w, c)
            hwc = self._empty(shape) if self.channels_last else self._memory.empty(shape)
            flat = hwc.view(-1)
            pos = 0
            for first, last in self._runs(indices):
                n = int(reader.offsets[last + 1] - reader.offsets[first])
                self._fill(flat[pos : pos + n], int(reader.offsets[first]))
                pos += n
            if self.dataset.verify:
                per = h * w * c
                images = [flat[k * per : (k + 1) * per].numpy() for k in range(len(indices))]
                reader.index.check_samples(indices, images)
            if self.channels_last:
                return hwc.permute(0, 3, 1, 2)
            out = self._empty((len(indices), c, h, w))
            np.copyto(out.numpy(), hwc.numpy().transpose(0, 3, 1, 2))  # numpy's transposing copy: 3.7x torch's
            return out
        stored = self.dataset._stored(indices)  # one read per run; verified there when asked
        for i, data in zip(indices, stored):  # sizes from the headers before allocating by the declared ones
            if reader.store == "encoded":
                self._check(i, data)
        if not same:
            return ImageList([self._image(i, data) for i, data in zip(indices, stored)])
        h, w, c = (int(v) for v in shapes[0])
        if self.channels_last:  # decoded straight into the batch (GIL released)
            out = self._empty((len(indices), h, w, c))
            slots = out.numpy()  # numpy, not torch: torch ops would start intra-op threads from each reader thread
            for k, (i, data) in enumerate(zip(indices, stored)):
                self._decode(i, data, slots[k])
            return out.permute(0, 3, 1, 2)
        # Contiguous [B, 3, H, W]: each image decoded into a small buffer that stays in the CPU's cache,
        # then transposed into its slot (the batch is written once, never read back).
        out = self._empty((len(indices), c, h, w))
        slots, scratch = out.numpy(), np.empty((h, w, c), dtype=np.uint8)
        for k, (i, data) in enumerate(zip(indices, stored)):
            self._decode(i, data, scratch)
            np.copyto(slots[k], scratch.transpose(2, 0, 1))
        return out

    def _image(self, index: int, data: torch.Tensor) -> torch.Tensor:
        if self.dataset.reader.store == "raw":
            h, w, c = (int(v) for v in self.dataset.reader.shapes[index])
            return data.view(h, w, c).permute(2, 0, 1).clone()
        return self._decode(index, data, size=self.dataset.reader.shapes[index][:2])

    def _check(self, index: int, data: torch.Tensor) -> None:
        """Raise MirrorError unless the encoded image's header gives its declared size, within the
        pixel limit (:func:`~colabfast.gpudecode.check_encoded`)."""
        try:
            check_encoded(data.numpy(), index, self.dataset.reader.shapes[index][:2])
        except ValueError as exc:
            raise undecodable(self.dataset.path, index, exc) from exc

    def _decode(self, index: int, data: torch.Tensor, out: Optional[np.ndarray] = None,
                size: Optional[np.ndarray] = None) -> torch.Tensor:
        try:
            return decode_cpu(data, index, out, size)
        except ValueError as exc:
            raise undecodable(self.dataset.path, index, exc) from exc

    def _empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.pin_memory:  # torch's caching host allocator reuses freed pinned blocks itself
            return torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        return self._memory.empty(shape)

    def _fill(self, out: torch.Tensor, start: int) -> None:
        """``out`` (a 1-D uint8 tensor) from the image data at ``start``: from RAM for ``in_memory``
        mirrors, else ``pread`` with retries of transient errors (:meth:`MirrorReader.read_into`)."""
        reader = self.dataset.reader
        if reader.blob is not None:
            np.copyto(out.numpy(), reader.blob[start : start + out.numel()].numpy())
        else:
            reader.read_into(out.numpy(), start)



class _Recycled:
    """uint8 batch memory that is reused once nothing references it any more.

    Fresh memory for every batch costs a page fault per 4 KiB page on first write: for a 12.6 MB
    batch of 256 px images that was 3.5 ms of 4.8 ms to fill it (1.3 ms into reused memory), measured
    on the development machine. Batches are handed to the caller as tensors made with
    ``torch.from_numpy`` from arrays kept here; a tensor (and every view of it) holds a reference to
    its array, so an array whose only references are this pool's is free for the next batch. Nothing
    a caller still holds is ever overwritten. At most ``keep`` arrays are tracked, for the reader's
    lifetime (as persistent workers keep their batches in flight between epochs); when a new one is
    needed, a free one of another size or else the oldest is forgotten (a batch the caller holds
    stays the caller's).
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._arrays: list[np.ndarray] = []
        self._lock = threading.Lock()
        # The count getrefcount reports for an array only a list holds (2 on CPython 3.8-3.13: the
        # list's and the argument's); measured, not assumed, as interpreters may borrow the argument.
        probe = [np.empty(1, dtype=np.uint8)]
        self._unheld = sys.getrefcount(probe[0])

    def empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``shape`` (contiguous), in reused memory when some is free."""
        nbytes = int(np.prod(shape))
        with self._lock:  # find and claim under the lock: the claim is the reference the tensor takes
            arrays = self._arrays
            for i in range(len(arrays)):
                # Any tensor or view of the array adds a reference to the list's.
                if arrays[i].nbytes == nbytes and sys.getrefcount(arrays[i]) == self._unheld:
                    return torch.from_numpy(arrays[i]).view(shape)
            if len(arrays) >= self.keep:  # forget one: a free one of another size, else the oldest
                free = [i for i in range(len(arrays)) if sys.getrefcount(arrays[i]) == self._unheld]
                arrays.pop(free[0] if free else 0)  # a batch the caller holds stays the caller's
            arrays.append(np.empty(nbytes, dtype=np.uint8))
            return torch.from_numpy(arrays[-1]).view(shape)

