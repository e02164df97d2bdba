"""Whole batches read from a mirror by threads in the training process: :class:`BatchReader`.

Each run of consecutive samples is one ``pread`` straight into the batch's memory, decoded in the same
thread (FFCV's loader: Leclerc et al., CVPR 2023). ``colabfast.DataLoader`` uses it where it gives the
same batches as its worker path (:func:`applies`). How it works: [Feeding the GPU](../gpu-feed.md#how-it-works).
"""

from __future__ import annotations

import functools
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from colabfast.datasets.dropins import H5ImageFolder, MirrorDataset, through_subsets, undecodable
from colabfast.datasets.h5dataset import H5Dataset
from colabfast.datasets.mirrorreader import MAX_READ
from colabfast.errors import MirrorError
from colabfast.images.augment import FusedTransform, fuse, scratch
from colabfast.images.decode import (
    EncodedImages,
    check_encoded,
    check_pixels,
    checked_jpeg_sizes,
    decode_cpu,
    jpeg_mask,
)
from colabfast.loading.collate import collate_value
from colabfast.loading.prefetch import ImageList
from colabfast.loading.stages import COLLATE, DECODE, READ, StageClock, now
from colabfast.loading.threadworkers import Joined, in_order
from colabfast.mirror.index import runs
from colabfast.where import env

__all__ = ["BatchReader", "applies", "fused_for"]


def applies(dataset: Any, *, transform_on_cpu: bool, decode: str) -> tuple[bool, str]:
    """Whether :class:`BatchReader` can read ``dataset``'s batches, and why (or why not): an
    :class:`~colabfast.H5ImageFolder` (or a ``Subset`` of one) with no transforms of its own,
    ``output="tensor"`` or ``"bytes"``, and no per-image CPU ``transform``.
    """
    dataset = through_subsets(dataset)[0]
    if isinstance(dataset, H5Dataset) and not transform_on_cpu and (decode != "cpu" or dataset.output != "bytes"):
        if dataset.batchable():
            return True, ("threads in this process read whole batches (colabfast.loading.reader), targets from the "
                          "columns")
        return False, ("worker processes: the samples are not (image, target) pairs of 3-channel uint8 tensors "
                       "without transforms (H5Dataset.batchable)")
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
    return True, "threads in this process read whole batches (colabfast.loading.reader): no per-sample Python"


def fused_for(dataset: Any, *, transform: Optional[Callable], decode: str,
              draft: bool = False) -> tuple[Optional[FusedTransform], str]:
    """The per-sample transform :class:`BatchReader` can run fused with decoding
    (:func:`colabfast.images.augment.fuse`), and why (or why not).

    It can for an :class:`~colabfast.H5ImageFolder` with ``output="tensor"`` and one fusing transform (its
    own or the loader's), or an :class:`~colabfast.H5Dataset` of ``(image, target)`` pairs
    (:meth:`~colabfast.H5Dataset.batchable`) and a fusing loader ``transform``.
    """
    inner = through_subsets(dataset)[0]
    if decode == "gpu" or getattr(inner, "output", None) != "tensor":
        return None, "worker processes: transforms run per sample on images that are not decoded tensors"
    own = type(inner) is H5ImageFolder and inner.transforms is not None
    if own and (inner.target_transform is not None or transform is not None):
        return None, "worker processes: transforms run per sample, the dataset's and the loader's or a target's"
    if not own and not (type(inner) is H5ImageFolder or (isinstance(inner, H5Dataset) and inner.batchable())):
        return None, "worker processes: the dataset's own transforms run per sample in Python"
    what, given = ("the dataset's transform", inner.transform) if own else ("DataLoader(transform=...)", transform)
    fused = fuse(given, draft=draft)
    if fused is None:
        return None, (f"worker processes: transforms run per sample in Python, and {what} is not one the reader "
                      "fuses with decoding (a leading v2 RandomResizedCrop, Resize or CenterCrop, then flips: "
                      "colabfast.images.augment.fuse)")
    return fused, ("threads in this process decode and transform each sample in one pass (colabfast.images.augment), "
                   "drawing as worker processes would: the same batches, no worker start")


class BatchReader:
    """Batches of an :class:`~colabfast.H5ImageFolder` read by threads, as the loader's collate builds them.

    Each batch is ``[images, targets]``: ``targets`` int64 ``[B]``; ``images`` a uint8 ``[B, 3, H, W]``
    tensor (``output="tensor"``, one size), an :class:`~colabfast.loading.prefetch.ImageList` (sizes
    differ), or an :class:`~colabfast.images.decode.EncodedImages` (``output="bytes"``). Every batch owns
    its memory; memory the caller dropped is reused.

    Args:
        dataset: the mirror dataset, or a ``Subset`` of it (see :func:`applies`).
        threads: batches read at once; 0 reads each batch in the iterating thread when asked.
        prefetch: batches read ahead (default ``2 * threads``).
        channels_last: the memory layout of same-size image batches.
        pin_memory: allocate batches in pinned memory (needs CUDA).
        fused: a per-sample transform run as each image is decoded (see :func:`fused_for`).
        index_map: int64 indices mapped through first, when ``dataset`` is the mirror under Subsets.
        clock: where each stage's time is added (:mod:`colabfast.loading.stages`; default its own).

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
        fused: Optional[FusedTransform] = None,
        index_map: Optional[np.ndarray] = None,
        clock: Optional[StageClock] = None,
    ) -> None:
        self.clock = clock if clock is not None else StageClock()
        self.dataset, self._map = (dataset, index_map) if index_map is not None else through_subsets(dataset)
        self.fused = fused
        self.threads = max(0, threads)
        self.prefetch = 0 if not self.threads else max(1, prefetch if prefetch is not None else 2 * self.threads)
        self.channels_last, self.pin_memory = channels_last, pin_memory
        # in stored order, as everything read; a mirror of columns builds each target (H5Dataset.target_at)
        targets = self.dataset.reader.index.targets
        self._targets = None if targets is None else torch.from_numpy(np.asarray(targets, dtype=np.int64))
        self._per_sample = self.dataset.per_sample() if targets is None else frozenset()
        self._memory = _Recycled(keep=self.prefetch + self.threads + 2)  # in flight, + the caller's
        self._on_fuse = env.is_fuse(self.dataset.reader.path)

    def batches(self, batch_indices: Iterable[Sequence[int]]) -> Iterator[list]:
        """The batches for ``batch_indices`` (e.g. a ``BatchSampler``), in order, ``prefetch`` ahead."""
        if not self.threads:
            for indices in batch_indices:
                yield self.read(indices)
            return
        with ThreadPoolExecutor(self.threads, thread_name_prefix="colabfast-reader") as pool:
            def submit(k: int, indices: list, stop: threading.Event) -> Any:
                made = self.split(indices, None, self.threads) if k == 0 else None
                if made is not None:  # the epoch's first batch: every thread makes a piece of it
                    pieces, join = made
                    return Joined([pool.submit(piece) for piece in pieces], join)
                return pool.submit(self._checked, indices, stop)

            yield from in_order(submit, batch_indices, self.prefetch)

    def _checked(self, indices: list[int], stop: threading.Event) -> list:
        if stop.is_set():
            return []
        return self.read(indices)

    def split(self, indices: Sequence[int], generator: Optional[torch.Generator],
              parts: int) -> Optional[tuple[list[Callable[[], list]], Callable[[list[list]], list]]]:
        """The batch for ``indices`` as ``parts`` pieces for as many threads, and how to join them: the same
        batch :meth:`read` makes, sooner (all random draws made here). None where splitting gains nothing.
        """
        if parts < 2 or len(indices) < 2 * parts or self.dataset.output == "bytes" or self._targets is None:
            return None
        if self.fused is None and self.dataset.reader.store == "raw":
            return None
        indices = list(indices)
        positions = self._positions(indices)
        self._within_limit(positions)  # before the batch's memory is allocated by the declared sizes
        shapes = self.dataset.reader.shapes[positions]
        draws = None
        if self.fused is not None:
            g = generator if generator is not None else torch.default_generator
            draws = self.fused.draw_batch(shapes, g)
        bounds = [len(indices) * k // parts for k in range(parts + 1)]
        batch = self._batch_memory(shapes)  # each piece decodes into its rows: no copy to join them
        pieces: list[Callable[[], list]] = [
            functools.partial(self.read, indices[a:b], None, None if draws is None else draws[a:b],
                              None if batch is None else batch[a:b])
            for a, b in zip(bounds, bounds[1:])]
        return pieces, functools.partial(self._join, batch)

    def _batch_memory(self, shapes: np.ndarray) -> Optional[torch.Tensor]:
        """The whole batch's image memory (``[B, H, W, C]`` channels-last, else ``[B, C, H, W]``) where
        its images (stored ``shapes``) all have one size known before decoding, else None."""
        size = self.fused.output_size() if self.fused is not None else None
        if size is None and (self.fused is None or self.fused.leading is None):  # the stored size is kept
            size = (int(shapes[0][0]), int(shapes[0][1])) if bool((shapes[:, :2] == shapes[0, :2]).all()) else None
        channels = 3 if self.dataset.reader.store == "encoded" else int(shapes[0][2])  # decoded: RGB
        if size is None or (self.dataset.reader.store == "raw" and not bool((shapes[:, 2] == channels).all())):
            return None
        h, w = size
        return self._empty((len(shapes), h, w, channels) if self.channels_last else (len(shapes), channels, h, w))

    def _join(self, batch: Optional[torch.Tensor], pieces: list[list]) -> list:
        """One batch of :meth:`split`'s pieces, as :meth:`read` makes it whole (collate time, no samples:
        the pieces counted theirs)."""
        start = now()
        try:
            return self._joined(batch, pieces)
        finally:
            self.clock.add(COLLATE, now() - start, 0)

    def _joined(self, batch: Optional[torch.Tensor], pieces: list[list]) -> list:
        images = [p[0] for p in pieces]
        targets = torch.cat([p[1] for p in pieces])
        if all(isinstance(x, torch.Tensor) for x in images) and len({x.shape[1:] for x in images}) == 1:
            n, (c, h, w) = sum(len(x) for x in images), images[0].shape[1:]
            out = batch if batch is not None else self._empty((n, h, w, c) if self.channels_last else (n, c, h, w))
            start = 0
            for x in images:  # made in their rows of ``batch``; else copied there
                made, row = (x.permute(0, 2, 3, 1) if self.channels_last else x), out[start:start + len(x)]
                if made.data_ptr() != row.data_ptr():
                    row.copy_(made)
                start += len(x)
            return [out.permute(0, 3, 1, 2) if self.channels_last else out, targets]
        # Images of different sizes: each as the whole batch's path makes it (fused: CHW memory; decoded
        # only: a CHW view of HWC memory, as decode_cpu returns it).
        if self.fused is not None:
            return [ImageList([image.contiguous() for x in images for image in x]), targets]
        return [ImageList([image.permute(1, 2, 0).contiguous().permute(2, 0, 1) for x in images for image in x]),
                targets]

    def _positions(self, indices: Sequence[int]) -> list[int]:
        mapped = indices if self._map is None else self._map[np.asarray(indices, dtype=np.int64)]
        return self.dataset.positions_of([int(i) for i in mapped])  # where they are stored

    def read(self, indices: Sequence[int], generator: Optional[torch.Generator] = None,
             draws: Optional[list] = None, out: Optional[torch.Tensor] = None) -> list:
        """One batch for ``indices``, drawing from ``generator`` (or ``draws`` made already); ``out``: image memory."""
        mapped = indices if self._map is None else self._map[np.asarray(indices, dtype=np.int64)]
        indices = [int(i) for i in mapped]  # the mirror's
        positions = self.dataset.positions_of(indices)  # where they are stored: all reads go by these
        self._within_limit(positions)  # memory is allocated by the declared sizes before any header is read
        clock = self.clock
        start, mark = now(), clock.mark()  # what is not read, decoded or transformed below: collate
        if self._targets is not None:
            targets = self._targets[positions]
        else:
            targets = collate_value([self.dataset.target_at(p) for p in positions], (1,), self._per_sample)
        if self.dataset.output == "bytes":
            t = now()
            images = self._read_bytes(positions, indices)
            clock.add(READ, now() - t, len(positions))
        elif self.fused is not None:
            images = self._read_fused(positions, generator, draws, out)
        else:
            images = self._read_images(positions, out)
        clock.add_rest(COLLATE, start, mark, len(positions))
        return [images, targets]

    # --- reading ---------------------------------------------------------------------------------

    def _read_runs(self, indices: Sequence[int], batch: torch.Tensor, starts: Sequence[int]) -> None:
        """Fill ``batch`` with stored samples ``indices``, one read (at most ``MAX_READ``) per run."""
        offsets = self.dataset.reader.offsets
        order = np.argsort(indices, kind="stable")
        for a, b in runs(np.asarray(indices, dtype=np.int64)[order], offsets, MAX_READ):
            run = order[a:b].tolist()  # places in the batch, in stored order
            buffers, first = [], 0
            for j in range(1, len(run) + 1):  # places next to each other in the batch too: one buffer
                if j == len(run) or run[j] != run[j - 1] + 1:
                    buffers.append(batch[starts[run[first]] : starts[run[j - 1] + 1]])
                    first = j
            self._fill(buffers, int(offsets[indices[run[0]]]))

    def _read_bytes(self, indices: list[int], keys: list[int]) -> EncodedImages:
        """The stored files at positions ``indices``; ``keys`` (their dataset indices) name them in
        decoding errors, as the worker path's do."""
        offsets = self.dataset.reader.offsets
        lengths = torch.from_numpy((offsets[np.add(indices, 1)] - offsets[indices]).astype(np.int64))
        data = self._empty((int(lengths.sum()),))
        starts = np.concatenate(([0], np.cumsum(lengths.numpy())))
        self._read_runs(indices, data, starts.tolist())
        files = data.split(lengths.tolist())
        if self.dataset.verify:
            self.dataset.reader.index.check_samples(indices, [f.numpy() for f in files])
        # The declared sizes, within the pixel limit, before nvJPEG allocates: one header read per file
        # (checked_jpeg_sizes); a file that fails it goes through the full check, which says why.
        sizes, passed = checked_jpeg_sizes(data.numpy(), starts[:-1], lengths.numpy(),
                                           self.dataset.reader.shapes[indices])
        for k in np.flatnonzero(~passed).tolist():
            self._check(indices[k], files[k])
        # Only JPEGs go to nvJPEG (the worker path decodes others on the CPU): the signature of every
        # file at once, no per-sample Python.
        jpeg = jpeg_mask(data.numpy(), starts[:-1], lengths.numpy())
        if not jpeg.all():
            k = int(np.flatnonzero(~jpeg)[0])
            raise MirrorError(f"{self.dataset.path}: sample {keys[k]} is not a JPEG, and decode='gpu' decodes "
                              "JPEGs only: pass decode='cpu'")
        return EncodedImages(data, lengths, torch.tensor(keys, dtype=torch.int64), torch.from_numpy(sizes))

    def _read_images(self, indices: list[int], given: Optional[torch.Tensor] = None) -> Any:
        """The images at stored positions ``indices`` (into ``given`` where it has the batch's shape)."""
        reader = self.dataset.reader
        shapes = reader.shapes[indices]
        same = bool((shapes == shapes[0]).all())
        if reader.store == "raw" and same:
            h, w, c = (int(v) for v in shapes[0])
            shape = (len(indices), h, w, c)
            hwc = self._empty(shape) if self.channels_last else self._memory.empty(shape)
            per = h * w * c
            t = now()
            self._read_runs(indices, hwc.view(-1), range(0, (len(indices) + 1) * per, per))
            if self.dataset.verify:
                reader.index.check_samples(indices, [image.numpy() for image in hwc.view(len(indices), -1)])
            self.clock.add(READ, now() - t, len(indices))
            if self.channels_last:
                return hwc.permute(0, 3, 1, 2)
            out = self._empty((len(indices), c, h, w))
            np.copyto(out.numpy(), hwc.numpy().transpose(0, 3, 1, 2))  # numpy's transposing copy: 3.7x torch's
            return out
        t = now()
        stored = self.dataset._stored(indices)  # one read per run; verified there when asked
        t1 = now()
        self.clock.add(READ, t1 - t, len(indices))
        try:
            return self._decoded(indices, stored, shapes, same, given)
        finally:
            self.clock.add(DECODE, now() - t1, len(indices))

    def _decoded(self, indices: list[int], stored: list[torch.Tensor], shapes: np.ndarray, same: bool,
                 given: Optional[torch.Tensor]) -> Any:
        """:meth:`_read_images` once the ``stored`` samples at positions ``indices`` are read."""
        reader = self.dataset.reader
        for i, data in zip(indices, stored):  # sizes from the headers before allocating by the declared ones
            if reader.store == "encoded":
                self._check(i, data)
        if not same:
            return ImageList([self._image(i, data) for i, data in zip(indices, stored)])
        h, w, c = (int(v) for v in shapes[0])
        if self.channels_last:  # decoded straight into the batch (GIL released)
            out = self._alloc((len(indices), h, w, c), given)
            slots = out.numpy()  # numpy, not torch: torch ops would start intra-op threads from each reader thread
            for k, (i, data) in enumerate(zip(indices, stored)):
                self._decode(i, data, slots[k])
            return out.permute(0, 3, 1, 2)
        # Contiguous [B, 3, H, W]: each image decoded into a small buffer that stays in the CPU's cache,
        # then transposed into its slot (the batch is written once, never read back).
        out = self._alloc((len(indices), c, h, w), given)
        slots, scratch = out.numpy(), np.empty((h, w, c), dtype=np.uint8)
        for k, (i, data) in enumerate(zip(indices, stored)):
            self._decode(i, data, scratch)
            np.copyto(slots[k], scratch.transpose(2, 0, 1))
        return out

    def _read_fused(self, indices: list[int], generator: Optional[torch.Generator],
                    draws: Optional[list] = None, given: Optional[torch.Tensor] = None) -> Any:
        """The images at stored positions ``indices`` through ``fused``, made straight into the batch's rows
        where every output has one size.
        """
        assert self.fused is not None
        reader, fused = self.dataset.reader, self.fused
        raw = reader.store == "raw"
        g = generator if generator is not None else torch.default_generator
        if draws is None:
            draws = fused.draw_batch(reader.shapes[indices], g)
        size = fused.output_size()
        channels = set(reader.shapes[indices, 2].tolist()) if raw else {3}  # decoded: RGB
        if size is not None and len(channels) == 1:  # every image made straight into the batch
            c, (h, w) = channels.pop(), size
            out = self._alloc((len(indices), h, w, c) if self.channels_last else (len(indices), c, h, w), given)
            slots = out.numpy().transpose(0, 3, 1, 2) if self.channels_last else out.numpy()  # [B, C, H, W] views
            clock, t = self.clock, now()
            rows = self._crop_rows(indices, draws) if raw else None
            if rows is not None:  # raw: only the rows each crop covers were read, one image after the other
                memory, starts, shapes, draws = rows
                t1 = now()
                clock.add(READ, t1 - t, len(indices))
                if len(set(map(tuple, shapes))) == 1 and not any(flipped for _, flipped in draws):
                    centre = fused.centre_box(shapes[0])
                    if centre is not None:  # one centre crop: the whole batch in one copy
                        _, left, th, tw = centre
                        h, w, c = (int(v) for v in shapes[0])
                        np.copyto(slots, memory[: len(indices) * h * w * c].reshape(len(indices), h, w, c)
                                  [:, :th, left : left + tw].transpose(0, 3, 1, 2))
                        clock.add(DECODE, now() - t1, len(indices))
                        return out.permute(0, 3, 1, 2) if self.channels_last else out
            else:
                memory, starts = self.dataset._spans(indices, lambda n: scratch("read", (n,)))
                shapes = reader.shapes[indices].tolist()  # Python ints: no numpy scalar per image below
                t1 = now()
                clock.add(READ, t1 - t, len(indices))
            offsets = reader.offsets
            sizes = ([h * w * c for h, w, c in shapes] if raw else
                     (offsets[np.add(indices, 1)] - offsets[indices]).tolist())  # bytes
            for k, (i, start, n) in enumerate(zip(indices, starts, sizes)):
                box, flipped = draws[k]
                try:
                    fused.make_into(memory[start : start + n], shapes[k], raw, i, box, flipped, slots[k : k + 1])
                except ValueError as exc:
                    raise undecodable(reader, i, exc) from exc
            clock.add(DECODE, now() - t1, len(indices))
            return out.permute(0, 3, 1, 2) if self.channels_last else out
        images = []
        t = now()
        stored = self.dataset._stored(indices)  # one read per run
        t1 = now()
        self.clock.add(READ, t1 - t, len(indices))
        for k, (i, data) in enumerate(zip(indices, stored)):
            try:
                images.append(fused.make(data, reader.shapes[i], raw, i, *draws[k]))
            except ValueError as exc:
                raise undecodable(reader, i, exc) from exc
        self.clock.add(DECODE, now() - t1, len(indices))
        first = images[0][0]
        if any(x.shape != first.shape for x, _ in images):
            return ImageList([_flipped(x, dims).contiguous() for x, dims in images])
        c, h, w = first.shape
        if self.channels_last:
            out = self._alloc((len(images), h, w, c), given)
            slots = out.numpy()
            for k, (x, dims) in enumerate(images):
                hwc = x.permute(1, 2, 0)
                if dims:  # torch's flip: numpy copies a reversed row of 3-byte pixels 3 bytes at a time
                    out[k].copy_(hwc.flip([d - 1 for d in dims]))  # (224x224: 33 against 455 us, one core)
                else:
                    np.copyto(slots[k], hwc.numpy())
            return out.permute(0, 3, 1, 2)
        out = self._alloc((len(images), c, h, w), given)
        slots = out.numpy()
        for k, (x, dims) in enumerate(images):
            np.copyto(slots[k], _flipped(x.numpy(), dims))
        return out

    def _crop_rows(self, indices: list[int], draws: list) -> Optional[tuple[np.ndarray, list[int], list, list]]:
        """Raw pixels read crop first, only the rows each crop covers: ``(memory, starts, shapes, draws)``, or
        None where that reads no less or costs more (no crop box, ``verify``, in memory, runs on a FUSE mount).
        """
        reader, fused = self.dataset.reader, self.fused
        assert fused is not None
        if self.dataset.verify or reader.blob is not None:
            return None
        if self._on_fuse:  # a batch mostly of runs is read a run at a time
            ordered = np.sort(np.asarray(indices, dtype=np.int64))
            if 2 * int(np.count_nonzero(np.diff(ordered) == 1)) > len(indices):
                return None
        stored = reader.shapes[indices]
        if not any(box is not None or flipped for box, flipped in draws) and bool((stored == stored[0]).all()):
            centre = fused.centre_box(stored[0])  # one centre crop: one size, one place in every image
            if centre is None:
                return None
            top, _, height, _ = centre
            row = int(stored[0][1]) * int(stored[0][2])  # bytes
            length = height * row
            memory = scratch("read", (len(indices) * length,))
            reader.read_ranges(memory, (reader.offsets[indices] + top * row).tolist(), [length] * len(indices))
            rows = (height, int(stored[0][1]), int(stored[0][2]))
            return memory, list(range(0, len(indices) * length, length)), [rows] * len(indices), draws
        positions, starts, lengths, shapes, moved = [], [], [], [], []
        at, centres = 0, dict[tuple[int, int, int], Optional[tuple[int, int, int, int]]]()
        for i, (box, flipped) in zip(indices, draws):
            h, w, c = (int(v) for v in reader.shapes[i])
            shape = (h, w, c)
            if box is not None:
                crop = box
            elif (crop := centres.get(shape)) is None:
                crop = centres[shape] = fused.centre_box(shape)
                if crop is None:
                    return None
            top, left, height, width = crop
            row = w * c  # bytes
            positions.append(int(reader.offsets[i]) + top * row)
            starts.append(at)
            lengths.append(height * row)
            shapes.append((height, w, c))
            moved.append(((0, left, height, width) if box is not None else None, flipped))
            at += height * row
        memory = scratch("read", (at,))
        reader.read_ranges(memory, positions, lengths)
        return memory, starts, shapes, moved

    def _image(self, index: int, data: torch.Tensor) -> torch.Tensor:
        if self.dataset.reader.store == "raw":
            h, w, c = (int(v) for v in self.dataset.reader.shapes[index])
            return data.view(h, w, c).permute(2, 0, 1).clone()
        return self._decode(index, data, size=self.dataset.reader.shapes[index][:2])

    def _within_limit(self, positions: Sequence[int]) -> None:
        """Raise MirrorError where an image at ``positions`` declares more than ``PIL.Image.MAX_IMAGE_PIXELS``."""
        reader = self.dataset.reader
        limit = Image.MAX_IMAGE_PIXELS
        if reader.store != "encoded" or limit is None or not len(positions):
            return
        shapes = reader.shapes[np.asarray(positions, dtype=np.int64)]
        over = np.flatnonzero(shapes[:, 0].astype(np.int64) * shapes[:, 1].astype(np.int64) > limit)
        if len(over):
            position = int(positions[int(over[0])])
            h, w = (int(v) for v in shapes[int(over[0])][:2])
            try:
                check_pixels(h, w, position)
            except ValueError as exc:
                raise undecodable(reader, position, exc) from exc

    def _check(self, index: int, data: torch.Tensor) -> None:
        """Raise MirrorError unless the encoded image's header gives its declared size, within the
        pixel limit (:func:`~colabfast.images.decode.check_encoded`)."""
        try:
            check_encoded(data.numpy(), index, self.dataset.reader.shapes[index][:2])
        except ValueError as exc:
            raise undecodable(self.dataset.reader, index, exc) from exc

    def _decode(self, index: int, data: torch.Tensor, out: Optional[np.ndarray] = None,
                size: Optional[np.ndarray] = None) -> torch.Tensor:
        try:
            return decode_cpu(data, index, out, size)
        except ValueError as exc:
            raise undecodable(self.dataset.reader, index, exc) from exc

    def _alloc(self, shape: tuple[int, ...], given: Optional[torch.Tensor]) -> torch.Tensor:
        """``given`` where it has ``shape`` (a row range of a batch split in pieces), else new memory."""
        return given if given is not None and tuple(given.shape) == shape else self._empty(shape)

    def _empty(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.pin_memory:  # torch's caching host allocator reuses freed pinned blocks itself
            return torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        return self._memory.empty(shape)

    def _fill(self, out: list[torch.Tensor], start: int) -> None:
        """Fill ``out`` from the image data at ``start``: from RAM, else one ``preadv`` with retries."""
        reader = self.dataset.reader
        if reader.blob is not None:
            for part in out:
                np.copyto(part.numpy(), reader.blob[start : start + part.numel()].numpy())
                start += part.numel()
        else:
            reader.read_into([part.numpy() for part in out], start)



def _flipped(x: Any, dims: Sequence[int]) -> Any:
    """``x`` (a ``[C, H, W]`` tensor, or an array) reversed along ``dims`` (-1 columns, -2 rows): a view."""
    for d in dims:
        x = x.flip(d) if isinstance(x, torch.Tensor) else np.flip(x, d)
    return x


class _Recycled:
    """uint8 batch memory reused once nothing references it (a fresh page costs a fault on first write)."""

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

