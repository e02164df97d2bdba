"""The loader's reader and feeder in one subprocess: :class:`FeedProcess` (``DataLoader(feed="process")``).

In the training process, the feeder thread (:mod:`colabfast.loading.prefetch`) and the reader threads share the
GIL with the training thread. On 2 CPUs, as Colab's VM has, the training thread needs most of one CPU
just to launch its kernels (``benchmarks/gpu_feed_probe.py`` measures it), so every moment the feed
holds the GIL the GPU may wait for its next kernel. Meta's SPDL measured the same effect and its cure: a
loader of threads inside one subprocess instead of inside the training process (Moto Hira et al.,
"Scalable and Performant Data Loading", arXiv:2504.20067, 2025). :class:`FeedProcess` is that cure for
:class:`colabfast.DataLoader`: one process, started with ``spawn`` (CUDA cannot run in a forked child),
builds the same loader from the same arguments, reads, decodes, transforms and normalises every batch
exactly as the in-process feed would, and hands it over:

- **On CUDA**, through a ring of ``slots`` buffers in the subprocess's GPU memory, opened once in the
  training process by CUDA IPC (``torch.multiprocessing``'s sharing of CUDA tensors), with one
  interprocess CUDA event per slot each way (``torch.cuda.Event(interprocess=True)``). The subprocess
  packs a converted batch's tensors into a free slot and records the slot's *ready* event; the training
  thread makes its stream wait on that event, copies the used bytes into memory of its own (one
  device-to-device copy, 38 MB for a bf16 batch of 128 images of 224x224), records the slot's *free*
  event and hands the slot back. The batch the model sees is ordinary memory of the training process's
  caching allocator, so no lifetime crosses the process boundary. The GPU never waits on the CPU: both
  waits are stream waits on events.
- **On the CPU**, through shared memory: torch's ``ForkingPickler`` moves each batch's tensors into
  shared memory as torch's worker processes do (one copy per batch), at most ``slots`` batches in
  flight.

Whether it pays depends on the machine: on an H200 pinned to 2 CPUs it did not (ResNet-50 trained slower
than with the in-process feed; the subprocess needs twice its solo CPU per batch beside the training
process, benchmarks/README.md, "The feed in a subprocess"), so ``feed="auto"`` keeps the feed in the
training process.

The epoch's order and every random number are drawn in the training process as the in-process feed draws
them (the sampler, :func:`colabfast.images.transforms.reseed`'s seed, the reader threads' base seed,
:func:`colabfast.loading.threadworkers.base_seed`) and sent to the subprocess, which streams each batch's
indices as it needs them, so ``feed="process"`` yields the batches ``feed="thread"`` yields under the
same seed, tensor for tensor (tested).
"""

from __future__ import annotations

import atexit
import itertools
import pickle
import queue
import signal
import threading
import traceback
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from colabfast.errors import FeedProcessError

__all__ = ["FeedProcess", "FeedProcessError"]

ALIGN = 256  # bytes: every tensor in a slot starts at a multiple (a view as any dtype is aligned)
POLL_S = 0.5  # how often a wait for the subprocess checks that it is still alive
CLOSE_S = 10.0  # how long close() waits for the subprocess before terminating it


class _Tensor:
    """Where one tensor of a batch lies in its slot: a byte offset, dtype, shape and strides."""

    __slots__ = ("offset", "dtype", "shape", "stride")

    def __init__(self, offset: int, dtype: torch.dtype, shape: tuple, stride: tuple) -> None:
        self.offset, self.dtype, self.shape, self.stride = offset, dtype, shape, stride

    def __reduce__(self) -> Any:
        return _Tensor, (self.offset, self.dtype, self.shape, self.stride)


def _dense(t: torch.Tensor) -> bool:
    """True where ``t``'s elements fill ``numel`` consecutive places without overlap in some order
    (contiguous, channels-last, or any permutation of a contiguous tensor)."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _walk(x: Any, leaf: Any, kind: type = torch.Tensor) -> Any:
    """``x`` with each ``kind`` in it replaced by ``leaf(it)``: through tuples, namedtuples, lists and dicts."""
    if isinstance(x, kind):
        return leaf(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_walk(v, leaf, kind) for v in x))
    if isinstance(x, (list, tuple)):
        items = [_walk(v, leaf, kind) for v in x]
        return items if type(x) is list else tuple(items) if type(x) is tuple else type(x)(items)
    if isinstance(x, dict):
        mapping = {k: _walk(v, leaf, kind) for k, v in x.items()}
        return mapping if type(x) is dict else type(x)(mapping)
    return x


def packed_size(batch: Any) -> int:
    """Bytes that :func:`pack` needs for ``batch``'s tensors."""
    total = 0

    def count(t: torch.Tensor) -> None:
        nonlocal total
        total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN

    _walk(batch, count)
    return total


def pack(batch: Any, slot: torch.Tensor) -> tuple[Any, int]:
    """Copy every tensor of ``batch`` into ``slot`` (uint8, 1-D, at least :func:`packed_size` bytes,
    on the tensors' device), each at an offset aligned to :data:`ALIGN`, keeping shapes and strides
    (a tensor that is not dense is made contiguous). Returns the batch with each tensor replaced by
    where it lies, and the bytes used; :func:`unpack` makes it a batch again. The copies are
    enqueued on the current stream."""
    used = 0

    def place(t: torch.Tensor) -> _Tensor:
        nonlocal used
        if not _dense(t):
            t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        where = _Tensor(used, t.dtype, tuple(t.shape), tuple(t.stride()))
        if nbytes:
            _view(slot, where).copy_(t)
        used += -(-nbytes // ALIGN) * ALIGN
        return where

    return _walk(batch, place), used


def unpack(meta: Any, memory: torch.Tensor) -> Any:
    """The batch :func:`pack` packed, its tensors views of ``memory`` (the slot's bytes, or a copy)."""
    return _walk(meta, lambda where: _view(memory, where), _Tensor)


def _view(memory: torch.Tensor, where: _Tensor) -> torch.Tensor:
    numel = 1
    for size in where.shape:
        numel *= size
    itemsize = torch.empty((), dtype=where.dtype).element_size()
    if numel == 0:
        return torch.empty(where.shape, dtype=where.dtype, device=memory.device)
    flat = memory[where.offset:where.offset + numel * itemsize].view(where.dtype)
    return flat.as_strided(where.shape, where.stride)


# --- the training process's side --------------------------------------------------------------------


class FeedProcess:
    """One subprocess that makes a :class:`colabfast.DataLoader`'s batches; see the module docstring.

    Args:
        recipe: what makes the loader in the subprocess, called there with no arguments (a
            ``functools.partial`` of :class:`colabfast.DataLoader` with ``feed="thread"``); pickled
            here, so an unpicklable dataset or transform fails at once.
        device: where batches arrive (the loader's device).
        slots: batches in flight between the processes (converted and waiting, or being copied).
        ahead: batches whose indices the subprocess is given ahead of the one handed out (its reader
            threads' read-ahead plus ``slots``).

    Raises:
        ValueError: the recipe cannot be pickled (the message names what to change).
    """

    def __init__(self, recipe: Callable[[], Any], device: torch.device, *, slots: int, ahead: int) -> None:
        try:
            data = pickle.dumps(recipe)
        except Exception as exc:
            raise ValueError(
                f"feed='process' sends the dataset and transforms to a subprocess, and they cannot be "
                f"pickled ({type(exc).__name__}: {exc}); use feed='thread', or make them picklable "
                f"(define classes and functions in a module, not as lambdas)") from exc
        import torch.multiprocessing as mp  # registers torch's reductions: CUDA tensors and events by IPC

        self.device, self.slots, self.ahead = device, slots, max(ahead, slots)
        self.cuda = device.type == "cuda"
        context = mp.get_context("spawn")
        child_inbox, self._outbox = context.Pipe(duplex=False)
        self._inbox, child_outbox = context.Pipe(duplex=False)
        self._process = context.Process(target=_serve, args=(data, child_inbox, child_outbox, slots),
                                        name="colabfast-feed", daemon=True)
        self._process.start()
        child_inbox.close()
        child_outbox.close()
        self._slots: list[Optional[torch.Tensor]] = [None] * slots
        self._ready: list[Any] = []
        self._free: list[Any] = []
        if self.cuda:
            with torch.cuda.device(device):
                self._free = [torch.cuda.Event(interprocess=True) for _ in range(slots)]
                for event in self._free:
                    event.record()  # a handle exists once it is recorded; the slot starts free
            self._outbox.send(("hello", self._free))
        self._epochs = itertools.count()
        self._running: Optional[int] = None  # an epoch the subprocess may still be making
        self._closed = False
        _LIVE.add(self)

    def epoch(self, seeds: tuple[Optional[int], Optional[int]], batch_indices: Iterable) -> Iterator:
        """The batches of one epoch, in order: ``seeds`` is ``(transform_seed, base_seed)`` (None: keep
        the stream), ``batch_indices`` the epoch's batches of indices (read lazily, ``ahead`` batches
        before the one handed out). The previous epoch, if one was left unfinished, is stopped first.

        Raises (while iterating): what the loader raises in the subprocess, at the batch where it
        happened; :class:`FeedProcessError` where the subprocess ends without a word.
        """
        self.hello()
        self._finish()
        eid = next(self._epochs)
        self._outbox.send(("epoch", eid, *seeds))
        self._running = eid
        return self._batches(eid, iter(batch_indices))

    def _batches(self, eid: int, indices: Iterator) -> Iterator:
        ended = False

        def give(n: int) -> None:
            nonlocal ended
            for _ in range(n):
                if ended:
                    return
                try:
                    batch = next(indices)
                except StopIteration:
                    ended = True
                    self._outbox.send(("end", eid))
                    return
                self._outbox.send(("indices", eid, [int(i) for i in batch]))

        try:
            give(self.ahead)
            while self._running == eid:  # not once a later epoch has begun
                message = self._receive()
                kind, of = message[0], message[1]
                if of != eid:  # a stopped epoch's last batches: only their slots matter
                    self._discard(message)
                    continue
                if kind == "done":
                    self._running = None
                    return
                if kind == "error":
                    self._running = None
                    raise message[2]
                batch = self._take(message)
                give(1)
                yield batch
        finally:
            if self._running == eid and not self._closed:
                try:
                    self._outbox.send(("stop", eid))  # drained at the next epoch or close()
                except OSError:
                    pass

    def _receive(self) -> tuple:
        while True:
            try:
                if self._inbox.poll(POLL_S):
                    message = self._inbox.recv()
                    break
            except (EOFError, OSError):
                message = None
                break
            if not self._process.is_alive() and not self._inbox.poll(0):
                message = None
                break
        if message is None:
            code = self._process.exitcode
            self._broken()
            raise FeedProcessError(
                f"the colabfast feed process (feed='process') ended without handing over a batch (exit code "
                f"{code}{': killed by signal ' + str(-code) if code is not None and code < 0 else ''}); a "
                f"new one starts with the next epoch. Out of memory kills it with signal 9: use "
                f"feed='thread' or a smaller batch")
        if message[0] == "slot":  # a slot grew: its new memory, then the batch
            _, slot, memory = message
            self._slots[slot] = memory
            return self._receive()
        if message[0] == "fatal":  # the subprocess could not start its loader
            self._broken()
            raise message[1]
        return message

    def _take(self, message: tuple) -> Any:
        _, _, slot, used, meta = message
        if not self.cuda:
            self._outbox.send(("free", slot))
            return meta  # the tensors came through shared memory
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self._ready[slot])
        memory = torch.empty(used, dtype=torch.uint8, device=self.device)
        source = self._slots[slot]
        assert source is not None
        memory.copy_(source[:used])
        self._free[slot].record(stream)
        self._outbox.send(("free", slot))
        return unpack(meta, memory)

    def _discard(self, message: tuple) -> None:
        if message[0] == "batch":
            self._outbox.send(("free", message[2]))

    def _finish(self) -> None:
        """Wait until the subprocess has stopped an epoch left unfinished (its last batches dropped)."""
        if self._running is None:
            return
        self._outbox.send(("stop", self._running))  # again, if its iterator sent it: nothing is lost
        while self._running is not None:
            message = self._receive()
            if message[1] == self._running and message[0] in ("done", "error"):
                self._running = None
            else:
                self._discard(message)

    def _broken(self) -> None:
        self._running = None
        self.close()

    @property
    def alive(self) -> bool:
        """True while the subprocess runs and :meth:`close` has not been called."""
        return not self._closed and self._process.is_alive()

    def hello(self) -> None:
        """Wait for the subprocess to have built its loader (and, on CUDA, shared its slots' events).

        Raises:
            what building the loader raised in the subprocess; :class:`FeedProcessError` if it died.
        """
        if self.cuda and not self._ready:
            message = self._receive()
            assert message[0] == "ready", message
            self._ready = message[1]

    def close(self) -> None:
        """Stop the subprocess and wait for it (then terminate it); idempotent."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        self._slots = [None] * self.slots  # the IPC mappings go before their owner does
        self._ready = []
        try:
            self._outbox.send(("close",))
        except (OSError, ValueError):
            pass
        self._process.join(CLOSE_S)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(CLOSE_S)
        for connection in (self._inbox, self._outbox):
            connection.close()
        if self.cuda and torch.cuda.is_initialized():
            torch.cuda.ipc_collect()

    def __del__(self) -> None:
        if "_process" in vars(self):
            try:
                self.close()
            except Exception:  # at interpreter exit, modules may be half torn down
                pass


_LIVE: weakref.WeakSet[FeedProcess] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for feed in list(_LIVE):
        feed.close()


# --- the subprocess's side --------------------------------------------------------------------------


_END = object()
_CLOSED = object()


class _Inbox:
    """The subprocess's messages from the training process, sorted by a thread of its own: each
    epoch's batch indices, freed slots, and the epochs to make."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.epochs: queue.Queue = queue.Queue()
        self.indices: queue.Queue = queue.Queue()
        self.free: queue.Queue = queue.Queue()
        self.free_events: list = []
        self.stopped: set[int] = set()
        self.hello = threading.Event()
        self.thread = threading.Thread(target=self._run, name="colabfast-feed-inbox", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                message = self.connection.recv()
                kind = message[0]
                if kind == "indices":
                    self.indices.put((message[1], message[2]))
                elif kind == "free":
                    self.free.put(message[1])
                elif kind == "end":
                    self.indices.put((message[1], _END))
                elif kind == "stop":
                    self.stopped.add(message[1])
                    self.indices.put((message[1], _END))
                elif kind == "epoch":
                    self.epochs.put(message[1:])
                elif kind == "hello":
                    self.free_events = message[1]
                    self.hello.set()
                elif kind == "close":
                    break
        except (EOFError, OSError):
            pass
        self.hello.set()
        for q in (self.epochs, self.indices, self.free):
            q.put(_CLOSED)

    def batch_indices(self, eid: int) -> Iterator[list[int]]:
        """The epoch's batches of indices as the training process sends them; ends at its end or stop."""
        while True:
            item = self.indices.get()
            if item is _CLOSED:
                self.indices.put(_CLOSED)
                return
            of, indices = item
            if of < eid:
                continue  # a stopped epoch's indices, sent before it stopped
            if indices is _END:
                return
            yield indices


class _Closed(Exception):
    pass


def _serve(recipe: bytes, inbox: Any, outbox: Any, slots: int) -> None:
    """The subprocess: build the loader, then make each epoch's batches as the training process asks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the training process's to handle
    torch.set_num_threads(1)  # its CPU work is reads and launches; the reader threads set their own
    messages = _Inbox(inbox)
    try:
        loader = pickle.loads(recipe)()
        cuda = loader.device.type == "cuda"
        stream = None
        ready: list = []
        if cuda:
            torch.cuda.set_device(loader.device)
            stream = torch.cuda.Stream(loader.device)
            ready = [torch.cuda.Event(interprocess=True) for _ in range(slots)]
            for event in ready:
                event.record(stream)
            messages.hello.wait()
            outbox.send(("ready", ready))
    except BaseException as exc:
        _send_error(outbox, "fatal", exc)
        return
    for s in range(slots):
        messages.free.put(s)
    memory: list[Optional[torch.Tensor]] = [None] * slots
    while True:
        epoch = messages.epochs.get()
        if epoch is _CLOSED:
            return
        eid, transform_seed, base_seed = epoch
        try:
            _epoch(loader, messages, outbox, eid, transform_seed, base_seed, stream, ready, memory)
        except _Closed:
            return
        except BaseException as exc:
            if eid in messages.stopped:
                outbox.send(("done", eid))
            else:
                _send_error(outbox, eid, exc)


def _epoch(loader: Any, messages: _Inbox, outbox: Any, eid: int, transform_seed: Optional[int],
           base_seed: Optional[int], stream: Optional[torch.cuda.Stream], ready: list,
           memory: list[Optional[torch.Tensor]]) -> None:
    from colabfast.images import transforms

    if transform_seed is not None:
        transforms.reseed(loader.transform, transform_seed)
    batches = loader._batches(messages.batch_indices(eid), base_seed)
    try:
        for batch in batches:
            if eid in messages.stopped:
                break
            if stream is None:
                converted = loader._convert(batch)
                del batch
                slot = _free_slot(messages)
                outbox.send(("batch", eid, slot, 0, converted))
                continue
            with torch.cuda.stream(stream):
                converted = loader._convert(batch)
                del batch
                slot = _free_slot(messages)
                need = packed_size(converted)
                current = memory[slot]
                if current is None or current.numel() < need:
                    current = memory[slot] = torch.empty(need, dtype=torch.uint8, device=stream.device)
                    outbox.send(("slot", slot, current))
                stream.wait_event(messages.free_events[slot])  # the training process has copied it out
                meta, used = pack(converted, current)
                del converted
                ready[slot].record(stream)
            outbox.send(("batch", eid, slot, used, meta))
    finally:
        close = getattr(batches, "close", None)
        if callable(close):
            close()
    outbox.send(("done", eid))


def _free_slot(messages: _Inbox) -> int:
    slot = messages.free.get()
    if slot is _CLOSED:
        raise _Closed
    return slot


def _send_error(outbox: Any, eid: Any, exc: BaseException) -> None:
    try:
        pickle.dumps(exc)
        error: BaseException = exc
    except Exception:  # an exception that cannot travel: its type, message and traceback as text
        error = RuntimeError(f"{type(exc).__name__}: {exc}\n(in the colabfast feed process)\n"
                             + "".join(traceback.format_exception(exc)))
    try:
        outbox.send(("fatal", error) if eid == "fatal" else ("error", eid, error))
    except (OSError, ValueError):
        pass
