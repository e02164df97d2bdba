"""What :meth:`colabfast.DataLoader.state_dict` keeps so that a new process resumes mid-epoch: an epoch's
start (:class:`EpochStart`), the random streams the loader's threads hold before each batch (:class:`Marks`),
and the replay of an epoch's first draws (:func:`rest_of_epoch`).

The convention is torchdata's ``StatefulDataLoader`` (https://github.com/meta-pytorch/data,
``torchdata/stateful_dataloader/``): ``state_dict()``
describes the batches yielded so far by the latest iterator, ``load_state_dict()`` makes the next
``iter(loader)`` yield exactly the batches the uninterrupted loader would have yielded next. Where
torchdata fast-forwards the sampler and leaves random transforms to the dataset, colabfast also restores
the random streams it owns, so the batches are exact with random crops too:

- the epoch's order: the loader's ``generator`` (or torch's global RNG) as it was when the epoch began,
  and the samplers' seed and epoch (``set_epoch``; a
  :class:`~colabfast.loading.sampler.BlockShuffleSampler` counting epochs itself, its seed drawn as the
  loader was built). The epoch's first draws (transform seed, workers' base seed, the sampler's seed)
  are made again from that state, in the order the epoch made them, and the batches already yielded
  are skipped as index lists, without reading them. torch's global RNG is then put back as it was
  before (the training loop's own draws, restored by the caller from its checkpoint, stay theirs);
  the loader's own ``generator`` is left where the epoch's draws leave it.
- the reader threads' streams (:class:`~colabfast.loading.threadworkers.ThreadWorkers`): each thread's
  generator state just before the first batch it has not handed out yet, recorded by the threads as
  they begin each batch (they run ahead of the training loop).
- the random steps of a :mod:`colabfast.images.transforms` transform drawing in this process: on CUDA,
  run by the feeder thread ahead of the loop, their generators' states before the next batch, recorded
  the same way; on the CPU without workers, their states as they are (nothing runs ahead).

Worker processes' own random streams (a dataset drawing random numbers in ``__getitem__``) are not
restored, as in torchdata: the sampler's order is exact, the workers start from new seeds.
"""

from __future__ import annotations

import functools
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.utils.data

from colabfast.errors import LoaderStateError
from colabfast.images import transforms

__all__ = ["VERSION", "EpochStart", "Marks", "check", "epoch_start", "rest_of_epoch", "restore_between_epochs",
           "rng_state", "sampler_fields", "set_rng_state", "set_sampler_fields", "state_of"]

VERSION = 1  # of the state_dict's layout; load_state_dict refuses others


def rng_state(generator: Optional[torch.Generator]) -> torch.Tensor:
    """The state of ``generator`` (None: torch's global CPU generator), a uint8 tensor."""
    return generator.get_state() if generator is not None else torch.random.get_rng_state()


def set_rng_state(generator: Optional[torch.Generator], state: torch.Tensor) -> None:
    """Put ``generator`` (None: torch's global CPU generator) in ``state``."""
    if generator is not None:
        generator.set_state(state)
    else:
        torch.random.set_rng_state(state)


# DistributedSampler's and BlockShuffleSampler's: the seed too (colabfast.DataLoader draws a
# BlockShuffleSampler's seed as it is built, so a loader built in a new process has another)
_EPOCH_FIELDS = ("seed", "epoch", "_epoch_set")


def sampler_fields(samplers: Iterable[Any]) -> list[dict[str, Any]]:
    """The seed and epoch fields of each of ``samplers`` (those with ``set_epoch``; ``{}`` for the others)."""
    return [{f: getattr(s, f) for f in _EPOCH_FIELDS if hasattr(s, f)} if hasattr(s, "set_epoch") else {}
            for s in samplers]


def set_sampler_fields(samplers: Iterable[Any], fields: list[dict[str, Any]]) -> None:
    """Put back what :func:`sampler_fields` took from the same samplers."""
    for sampler, values in zip(samplers, fields):
        for name, value in values.items():
            setattr(sampler, name, value)


@dataclass
class EpochStart:
    """What an epoch's first draws come from, taken before it draws anything.

    Attributes:
        rng: the state of the loader's ``generator`` (or of torch's global generator when it has none).
        samplers: :func:`sampler_fields` of the loader's samplers.
        seeded: whether the reader threads or worker processes already had their random streams
            (persistent ones draw no new base seed).
    """

    rng: torch.Tensor
    samplers: list[dict[str, Any]]
    seeded: bool

    def to_dict(self) -> dict[str, Any]:
        return {"rng": self.rng, "samplers": self.samplers, "seeded": self.seeded}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpochStart:
        return cls(d["rng"], d["samplers"], d["seeded"])


class Marks:
    """Random streams' states recorded just before the batch at each position of an epoch is made.

    Threads that make batches ahead of the training loop record here as they begin a batch
    (:meth:`record`); :meth:`before` answers with the states before a batch not yet handed out.
    Thread-safe: a thread records under the lock before it draws, so a state read under the lock is
    either the one recorded for that batch or the stream's current one, untouched by it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._states: dict[tuple[str, int], Any] = {}

    def record(self, position: int, state: Any, stream: str = "threads") -> None:
        """Record ``state`` of ``stream`` (taken by the caller under :attr:`lock`) for the batch at
        ``position``."""
        self._states[stream, position] = state

    def get(self, position: int, stream: str = "threads") -> Any:
        """The state of ``stream`` recorded for ``position``, or None (call under :attr:`lock`)."""
        return self._states.get((stream, position))

    def forget_before(self, position: int) -> None:
        """Drop the states of batches before ``position`` (handed out: never asked for again)."""
        with self.lock:
            for key in [key for key in self._states if key[1] < position]:
                del self._states[key]

    def any(self) -> bool:
        """Whether anything was recorded (a thread has begun a batch of this epoch)."""
        with self.lock:
            return bool(self._states)

    def clear(self) -> None:
        with self.lock:
            self._states.clear()


# --- a colabfast.DataLoader's state (its methods call these; `loader` is the DataLoader) ----------------


def reseeds(loader: Any) -> bool:
    """Whether ``loader``'s transform draws in this process, reseeded each epoch (on CUDA by the
    feeder thread; on the CPU without workers)."""
    return loader.transform is not None and (loader._feeding is not None or loader.num_workers == 0)


def _samplers(loader: Any) -> tuple:
    return loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)


def _threads_kept(loader: Any) -> bool:
    """Whether the epoch starting now draws no base seed: its threads or workers keep their streams."""
    threads = loader._threads
    if threads is not None:
        return bool(threads.persistent and threads._generators is not None)
    return bool(loader.num_workers > 0 and loader.persistent_workers and loader._iterator is not None)


def epoch_start(loader: Any) -> EpochStart:
    """``loader``'s :class:`EpochStart`, taken as an epoch begins, before it draws anything."""
    return EpochStart(rng_state(loader.generator), sampler_fields(_samplers(loader)), _threads_kept(loader))


def _length(loader: Any) -> Optional[int]:
    try:
        return len(loader.dataset)
    except TypeError:
        return None


def state_of(loader: Any) -> dict[str, Any]:
    """:meth:`colabfast.DataLoader.state_dict`'s dict for ``loader`` (its docstring says what it holds)."""
    threads = loader._threads
    state: dict[str, Any] = {"colabfast.DataLoader": VERSION, "length": _length(loader),
                             "batch_size": loader.batch_size, "threads": None, "transform": None}
    if loader._start is None or loader._finished:  # between epochs: what the next one starts from
        kept = threads is not None and threads.persistent and threads._generators is not None
        state.update(position=None, samplers=sampler_fields(_samplers(loader)),
                     rng=None if loader.generator is None else loader.generator.get_state(),
                     threads=[g.get_state() for g in threads._generators] if kept else None)
        return state
    y = loader._yielded
    state.update(position=y, start=loader._start.to_dict())
    if threads is not None and (loader._start.seeded or y > 0 or loader._marks.any()):
        # (else the threads have not drawn their epoch's base seed yet: the resume draws it again)
        state["threads"] = threads.states_before(y, loader._marks)
    if reseeds(loader):
        with loader._marks.lock:
            before = loader._marks.get(y, "transform")
            state["transform"] = before if before is not None else transforms.random_states(loader.transform)
    return state


def check(loader: Any, state: Any) -> None:
    """Refuse a ``state`` that ``loader`` cannot resume (see :meth:`colabfast.DataLoader.load_state_dict`)."""
    version = state.get("colabfast.DataLoader") if isinstance(state, dict) else None
    if version != VERSION:
        raise LoaderStateError(f"not a colabfast.DataLoader state_dict of version {VERSION} (found version "
                               f"{version!r}): pass what loader.state_dict() returned")
    for name, mine in (("length", _length(loader)), ("batch_size", loader.batch_size)):
        if state[name] != mine:
            raise LoaderStateError(f"the state_dict was saved by a loader with {name} {state[name]}, this one "
                                   f"has {mine}: build the loader as the one that saved it")
    threads = loader._threads.workers if loader._threads is not None else 0
    if state["threads"] is not None and len(state["threads"]) != threads:
        raise LoaderStateError(f"the state_dict was saved by a loader with {len(state['threads'])} reader threads, "
                               f"this one has {threads}: pass the same num_workers")


def restore_between_epochs(loader: Any, state: dict[str, Any]) -> None:
    """Put ``loader`` where the one that saved ``state`` (between two epochs) stood."""
    set_sampler_fields(_samplers(loader), state["samplers"])
    if state["rng"] is not None and loader.generator is not None:
        loader.generator.set_state(state["rng"])
    if state["threads"] is not None:
        loader._threads._generators = _generators(state["threads"])


def _generators(states: list[torch.Tensor]) -> list[torch.Generator]:
    generators = [torch.Generator() for _ in states]
    for g, s in zip(generators, states):
        g.set_state(s)
    return generators


def rest_of_epoch(loader: Any, state: dict[str, Any]) -> Iterator:
    """The batches of the epoch ``state`` stopped in, from its position on: the epoch's first draws made
    again from its start in the order the epoch made them (transform seed, base seed, the sampler's
    own), the batches before skipped as index lists (nothing read), the threads' and the transform's
    streams restored; torch's global RNG then put back as it was, the loader's generator left where
    the epoch's draws leave it."""
    start, y = EpochStart.from_dict(state["start"]), state["position"]
    now = rng_state(None) if loader.generator is None else None
    set_rng_state(loader.generator, start.rng)
    set_sampler_fields(_samplers(loader), start.samplers)
    loader._start = start
    if reseeds(loader):
        transforms.reseed(loader.transform, loader.generator)
        transforms.set_random_states(loader.transform, state["transform"])
    seed = None
    if not start.seeded:  # the epoch drew a base seed for its threads or workers (restored, or new ones)
        seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())
    order = torch.utils.data.DataLoader._index_sampler.fget(loader)  # type: ignore[attr-defined]
    rest = list(itertools.islice(iter(order), y, None))
    after = rng_state(loader.generator)
    loader._yielded = loader._timed.position = y
    make = functools.partial(loader._batches, rest, seed, start=y, states=state["threads"])
    batches = map(loader._convert, make()) if loader._feeding is None else loader._feeding.start(make)
    set_rng_state(loader.generator, after if now is None else now)  # torch's iterator drew a base seed again
    return batches
