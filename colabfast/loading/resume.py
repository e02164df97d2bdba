"""What :meth:`colabfast.DataLoader.state_dict` keeps so that a new process resumes mid-epoch: an epoch's
start (:class:`EpochStart`), the random streams the loader's threads hold before each batch
(:class:`Marks`), and the replay of an epoch's first draws (:func:`rest_of_epoch`).

torchdata's ``StatefulDataLoader`` convention (https://github.com/meta-pytorch/data,
``torchdata/stateful_dataloader/``), plus the random streams colabfast owns, so the batches are exact
with random crops too: what is restored and what not is in [Resuming](../resume.md).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, cast

import numpy as np
import torch
import torch.utils.data

from colabfast.errors import LoaderStateError, excerpt
from colabfast.images import transforms

__all__ = ["VERSION", "EpochStart", "Marks", "Restoring", "Stamped", "Stamping", "check", "epoch_start",
           "rest_of_epoch", "restore_between_epochs", "rng_state", "sampler_fields", "set_rng_state",
           "set_sampler_fields", "state_of"]

VERSION = 2  # of the state_dict's layout (2: with sampler and batches); load_state_dict refuses others


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
        rng: the state of the loader's ``generator`` (or of torch's global generator).
        samplers: :func:`sampler_fields` of the loader's samplers.
        seeded: whether the threads or workers already had their random streams.
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

    Threads record under the lock before they draw (:meth:`record`); :meth:`before` answers with the
    states before a batch not yet handed out.
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


# --- torch's worker processes: batches stamped with the worker's random streams ---------------------------


def _steps_in(dataset: Any) -> list:
    """The :mod:`colabfast.images.transforms` random steps of ``dataset``'s ``transform`` and of the
    datasets it wraps (``.dataset``: the loader's wrapper, ``Subset``), outermost first."""
    steps, seen = [], 0
    while dataset is not None and seen < 4:
        steps += transforms.random_steps(vars(dataset).get("transform") if hasattr(dataset, "__dict__") else None)
        dataset, seen = getattr(dataset, "dataset", None), seen + 1
    return steps


def worker_states(dataset: Any) -> tuple:
    """This worker's random streams: torch's, Python's and NumPy's RNG and each colabfast transform step's."""
    steps = [s.generator.get_state() if s._worker is not None else None for s in _steps_in(dataset)]
    version, words, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = cast(tuple, np.random.get_state(legacy=True))
    # as tensors and numbers only, so torch.load(weights_only=True) reads a checkpoint holding them
    return (torch.get_rng_state(), [version, torch.tensor(words), gauss],
            [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached], steps)


def set_worker_states(dataset: Any, states: tuple, worker_id: int) -> None:
    """Put this worker process's streams back as :func:`worker_states` took them (in worker ``worker_id``)."""
    torch_state, (version, words, gauss), (name, keys, pos, has_gauss, cached), steps = states
    torch.set_rng_state(torch_state)
    random.setstate((version, tuple(words.tolist()), gauss))
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    for step, state in zip(_steps_in(dataset), steps):
        if state is not None:
            step.generator = torch.Generator()
            step.generator.set_state(state)
            step._worker = worker_id  # drawn from already in this worker: not reseeded (_Random.rng)


class Stamped:
    """A batch from worker ``worker`` with its random ``states`` after making it (:func:`worker_states`);
    ``batch`` None for an empty batch (a placeholder that keeps the workers' turns)."""

    __slots__ = ("batch", "worker", "states")

    def __init__(self, batch: Any, worker: int, states: tuple) -> None:
        self.batch, self.worker, self.states = batch, worker, states

    def pin_memory(self, *args: Any) -> Stamped:  # torch's pin-memory thread calls it
        from torch.utils.data._utils.pin_memory import pin_memory

        return Stamped(None if self.batch is None else pin_memory(self.batch), self.worker, self.states)


class Stamping:
    """The loader's ``collate_fn`` in its worker processes: the batch :class:`Stamped`."""

    def __init__(self, collate_fn: Callable) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: list) -> Stamped:
        info = torch.utils.data.get_worker_info()
        batch = self.collate_fn(samples) if len(samples) else None
        return Stamped(batch, info.id if info is not None else 0, worker_states(info.dataset if info else None))


class Restoring:
    """The loader's ``worker_init_fn`` for workers that resume: after it, each worker's random streams
    are put back from ``states`` (worker id -> :func:`worker_states`), where it has them."""

    def __init__(self, worker_init_fn: Optional[Callable], states: dict[int, tuple]) -> None:
        self.worker_init_fn, self.states = worker_init_fn, states

    def __call__(self, worker_id: int) -> None:
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        if worker_id in self.states:
            info = torch.utils.data.get_worker_info()
            set_worker_states(info.dataset if info is not None else None, self.states[worker_id], worker_id)


def _stamps(loader: Any) -> bool:
    return bool(loader.num_workers > 0 and loader._threads is None and loader._reader is None
                and loader.batch_size is not None)


@contextlib.contextmanager
def starting_workers(loader: Any, starting: bool) -> Iterator[None]:
    """Around the start of torch's iterator: workers' batches come stamped (:class:`Stamping`), and a resumed
    loader's workers start from its states (:class:`Restoring`).
    """
    restore, loader._restore = loader._restore, None
    if not (starting and _stamps(loader)):
        yield
        return
    collate_fn, init, generator = loader.collate_fn, loader.worker_init_fn, loader.generator
    loader.collate_fn = Stamping(collate_fn)
    if restore is not None:
        loader.worker_init_fn = Restoring(init, restore["workers"])
        # torch's iterator draws its base seed from loader.generator, the sampler from its own reference
        # (or the global RNG): a stand-in in the state that draws the epoch's seed, or any (not used)
        loader.generator = torch.Generator()
        if restore["rng"] is not None:
            loader.generator.set_state(restore["rng"])
    try:
        yield
    finally:
        loader.collate_fn, loader.worker_init_fn, loader.generator = collate_fn, init, generator


def unstamped(loader: Any, batches: Iterator, start: int) -> Iterator:
    """``batches`` from torch's iterator, each :class:`Stamped` one recorded in ``loader``'s marks at
    its position in the epoch (from ``start``) and handed on as its batch; placeholders dropped."""
    marks, position = loader._marks, start
    for item in batches:
        if isinstance(item, Stamped):
            if item.batch is None:
                continue
            with marks.lock:
                marks.record(position, (item.worker, item.states), "workers")
            item = item.batch
        position += 1
        yield item


def yielded(loader: Any, marks: Marks) -> None:
    """The training loop took batch ``loader._yielded - 1``: its worker's streams (if stamped) are now
    the ones that worker resumes from."""
    with marks.lock:
        stamp = marks.get(loader._yielded - 1, "workers")
    if stamp is not None:
        loader._worker_states[stamp[0]] = stamp[1]
    marks.forget_before(loader._yielded)


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
                             "batch_size": loader.batch_size, "num_workers": loader.num_workers,
                             "sampler": [_described(s) for s in _samplers(loader)], "batches": _batches(loader),
                             "threads": None, "transform": None}
    workers = dict(loader._worker_states) if _stamps(loader) else None
    if loader._start is None or loader._finished:  # between epochs: what the next one starts from
        kept = threads is not None and threads.persistent and threads._generators is not None
        state.update(position=None, samplers=sampler_fields(_samplers(loader)),
                     rng=None if loader.generator is None else loader.generator.get_state(),
                     threads=[g.get_state() for g in threads._generators] if kept else None,
                     workers=workers if _threads_kept(loader) else None)
        return state
    state["workers"] = workers
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


# --- the state's schema (docs/resume.md, "The state's schema"): all of it checked before anything changes ---

_COMMON = ("colabfast.DataLoader", "length", "batch_size", "num_workers", "sampler", "batches", "position",
           "threads", "workers", "transform")
KEYS = {"mid-epoch": {*_COMMON, "start"}, "between epochs": {*_COMMON, "samplers", "rng"}}
_SETTINGS = ("block_size", "shuffle", "num_replicas", "rank", "drop_last", "batch_size", "replacement")
_FIX = "pass what loader.state_dict() returned, to a loader built the same way"


def _described(sampler: Any) -> Optional[str]:
    """What tells ``sampler``'s orders from another's: its class and its settings, e.g.
    ``"BlockShuffleSampler(block_size=64, shuffle=True, ...)"``; None for none."""
    if sampler is None:
        return None
    settings = [f"{k}={getattr(sampler, k)!r}" for k in _SETTINGS if isinstance(getattr(sampler, k, None), int)]
    return f"{type(sampler).__qualname__}({', '.join(settings)})"


def _batches(loader: Any) -> Optional[int]:
    try:
        return len(loader)
    except TypeError:
        return None


def _refuse(where: str, why: str, fix: str = _FIX) -> LoaderStateError:
    return LoaderStateError(f"this state_dict's {where} {why}: {fix}")


def _int(value: Any, where: str, low: int, high: int) -> None:
    if type(value) is not int or not low <= value < high:
        raise _refuse(where, f"is {excerpt(value)}, not an int in [{low}, {high})")


def _rng(value: Any, where: str, device: Any = "cpu") -> None:
    """``value`` is a state a ``torch.Generator`` on ``device`` takes (tried on one of its own)."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1 or value.is_cuda:
        raise _refuse(where, f"is {excerpt(value)}, not a generator's state (a uint8 CPU tensor)")
    try:
        torch.Generator(device=device).set_state(value)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise _refuse(where, f"is not a generator's state ({str(exc)[:100]})") from None


def _rngs(value: Any, where: str, count: int) -> None:
    if not isinstance(value, list) or len(value) != count:
        raise _refuse(where, f"is {excerpt(value)}, not a list of {count} generator states")
    for k, state in enumerate(value):
        _rng(state, f"{where}[{k}]")


def _fields(value: Any, where: str, loader: Any) -> None:
    """``value`` is what `sampler_fields` takes of this loader's samplers: the same fields, each
    of its type and range."""
    mine = sampler_fields(_samplers(loader))
    if not isinstance(value, list) or len(value) != len(mine):
        raise _refuse(where, f"is {excerpt(value)}, not a list of {len(mine)} samplers' fields")
    for k, (got, want) in enumerate(zip(value, mine)):
        if not isinstance(got, dict) or set(got) != set(want):
            raise _refuse(f"{where}[{k}]", f"is {excerpt(got)}: this loader's sampler has the fields {sorted(want)}")
        for name, v in got.items():
            if isinstance(want[name], bool):
                if type(v) is not bool:
                    raise _refuse(f"{where}[{k}][{name!r}]", f"is {excerpt(v)}, not a bool")
            else:
                _int(v, f"{where}[{k}][{name!r}]", 0 if name == "epoch" else -2**63, 2**63)


def _worker(value: Any, where: str, steps: int) -> None:
    """``value`` is what `worker_states` takes in a worker of a dataset of ``steps`` random steps,
    each stream tried on a generator of its own kind."""
    if not isinstance(value, tuple) or len(value) != 4 or not isinstance(value[1], list) or len(value[1]) != 3 \
            or not isinstance(value[2], list) or len(value[2]) != 5:
        raise _refuse(where, f"is {excerpt(value)}, not a worker's random streams")
    (version, words, gauss), (name, keys, pos, has_gauss, cached) = value[1], value[2]
    _rng(value[0], f"{where}[0]")
    if type(version) is not int or not isinstance(words, torch.Tensor) or words.dtype != torch.int64 or \
            words.shape != (625,) or not (gauss is None or type(gauss) is float):
        raise _refuse(f"{where}[1]", "is not Python's random state")
    try:
        random.Random().setstate((version, tuple(words.tolist()), gauss))
    except (ValueError, TypeError, OverflowError) as exc:
        raise _refuse(f"{where}[1]", f"is not Python's random state ({str(exc)[:100]})") from None
    if not isinstance(name, str) or not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or \
            keys.shape != (624,) or not bool(((keys >= 0) & (keys < 2**32)).all()) or has_gauss not in (0, 1) \
            or type(has_gauss) is not int or type(cached) is not float:
        raise _refuse(f"{where}[2]", "is not NumPy's random state")
    _int(pos, f"{where}[2][2]", 0, 625)
    try:
        np.random.RandomState().set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    except (ValueError, TypeError, OverflowError) as exc:
        raise _refuse(f"{where}[2]", f"is not NumPy's random state ({str(exc)[:100]})") from None
    if not isinstance(value[3], list) or len(value[3]) != steps:
        raise _refuse(f"{where}[3]", f"is {excerpt(value[3])}, not a list of {steps} random steps' states")
    for k, state in enumerate(value[3]):
        if state is not None:
            _rng(state, f"{where}[3][{k}]")


def _keeps_streams(loader: Any) -> bool:
    """Whether ``loader``'s reader threads or worker processes keep their random streams across epochs."""
    threads = loader._threads
    return bool(threads.persistent if threads is not None else loader.num_workers > 0 and loader.persistent_workers)


def check(loader: Any, state: Any) -> None:
    """Refuse a ``state`` that ``loader`` cannot resume, checking the schema (docs/resume.md) first.

    Raises:
        LoaderStateError: one, naming the key and what is wrong with it (a bounded excerpt of the value).
    """
    version = state.get("colabfast.DataLoader") if isinstance(state, dict) else None
    if type(version) is not int or version != VERSION:
        raise LoaderStateError(f"not a colabfast.DataLoader state_dict of version {VERSION} (found version "
                               f"{excerpt(version)}): {_FIX}" + (" (version 1 came from colabfast before issue 51: "
                                                                 "start the epoch afresh)" if version == 1 else ""))
    kind = "between epochs" if state.get("position") is None else "mid-epoch"
    if set(state) != KEYS[kind]:
        missing, extra = sorted(KEYS[kind] - set(state)), sorted(map(str, set(state) - KEYS[kind]))
        why = "; ".join(([f"lacks {', '.join(missing)}"] if missing else [])
                        + ([f"has keys no state has: {excerpt(extra)}"] if extra else []))
        raise LoaderStateError(f"this state_dict (a state {kind}) {why}: {_FIX}")
    mine: Any
    for name, mine in (("length", _length(loader)), ("batch_size", loader.batch_size),
                       ("num_workers", loader.num_workers), ("sampler", [_described(s) for s in _samplers(loader)]),
                       ("batches", _batches(loader))):
        got = state[name]
        if type(got) is not type(mine):
            raise _refuse(name, f"is {excerpt(got)} (a {type(got).__name__}), not {excerpt(mine)}")
        if isinstance(got, list) and len(got) == len(mine):  # the samplers: the one that differs
            got, mine = next(((a, b) for a, b in zip(got, mine) if a != b), (got, mine))
        if got != mine:
            raise LoaderStateError(f"the state_dict was saved by a loader with {name} {excerpt(got)}, this "
                                   f"one has {excerpt(mine)}: build the loader as the one that saved it")
    batches, threads = _batches(loader), loader._threads
    device = loader.generator.device if loader.generator is not None else "cpu"
    if kind == "mid-epoch":
        _int(state["position"], "position", 0, (batches if batches is not None else 2**63 - 1) + 1)
        start = state["start"]
        if not isinstance(start, dict) or set(start) != {"rng", "samplers", "seeded"}:
            raise _refuse("start", f"is {excerpt(start)}, not a dict of rng, samplers and seeded")
        _rng(start["rng"], "start['rng']", device)
        _fields(start["samplers"], "start['samplers']", loader)
        if type(start["seeded"]) is not bool or start["seeded"] and not _keeps_streams(loader):
            raise _refuse("start['seeded']", f"is {excerpt(start['seeded'])}, not a bool (False where the threads "
                          "or workers do not persist)")
    else:
        _fields(state["samplers"], "samplers", loader)
        if (state["rng"] is None) != (loader.generator is None):
            raise _refuse("rng", f"is {excerpt(state['rng'])}, but this loader has "
                          f"{'no' if loader.generator is None else 'a'} generator")
        if state["rng"] is not None:
            _rng(state["rng"], "rng", device)
    mid = kind == "mid-epoch"
    # what the streams of the threads, workers and transform may be (None, or a value), and must be (a value)
    _carried(state["threads"], "threads", threads is not None and (mid or threads.persistent),
             threads is not None and mid and (state["start"]["seeded"] or state["position"] > 0),
             lambda v: _rngs(v, "threads", threads.workers))
    _carried(state["workers"], "workers", _stamps(loader) and (mid or loader.persistent_workers),
             _stamps(loader) and mid, lambda v: _workers(v, loader, state))
    _carried(state["transform"], "transform", mid and reseeds(loader), mid and reseeds(loader),
             lambda v: _rngs(v, "transform", len(transforms.random_states(loader.transform))))


def _carried(value: Any, where: str, may: bool, must: bool, check: Callable[[Any], None]) -> None:
    if value is None and not must:
        return
    if not may:
        raise _refuse(where, f"is {excerpt(value)}, where this loader keeps no such random streams (None)")
    check(value)


def _workers(value: Any, loader: Any, state: dict) -> None:
    """``value`` holds the streams of each worker that made one of the batches handed out (batch ``k``
    by worker ``k % num_workers``), and, where the workers persist, of those of earlier epochs."""
    if not isinstance(value, dict):
        raise _refuse("workers", f"is {excerpt(value)}, not a dict of worker id -> random streams")
    for w, streams in value.items():
        _int(w, f"workers key {excerpt(w)}", 0, loader.num_workers)
        _worker(streams, f"workers[{w}]", len(_steps_in(loader.dataset)))
    handed = state["position"] if state["position"] is not None else state["batches"] or 0
    reached = set(range(min(handed, loader.num_workers)))
    fresh = state["position"] is not None and not state["start"]["seeded"]  # workers started this epoch
    if not reached <= set(value) or fresh and set(value) != reached:
        raise _refuse("workers", f"holds the streams of workers {sorted(value)}, but workers {sorted(reached)} "
                      "made the batches handed out")


def restore_between_epochs(loader: Any, state: dict[str, Any]) -> None:
    """Put ``loader`` where the one that saved ``state`` (between two epochs) stood."""
    set_sampler_fields(_samplers(loader), state["samplers"])
    if state["rng"] is not None and loader.generator is not None:
        loader.generator.set_state(state["rng"])
    if state["threads"] is not None:
        loader._threads._generators = _generators(state["threads"])
    if state["workers"] is not None:  # persistent workers: the next epoch's new ones carry on their streams
        loader._worker_states = dict(state["workers"])
        loader._restore = {"workers": state["workers"], "rng": None}  # and draw no base seed, as they did not


def _generators(states: list[torch.Tensor]) -> list[torch.Generator]:
    generators = [torch.Generator() for _ in states]
    for g, s in zip(generators, states):
        g.set_state(s)
    return generators


def rest_of_epoch(loader: Any, state: dict[str, Any]) -> Iterator:
    """The batches of the epoch ``state`` stopped in, from its position on: its first draws made again,
    earlier batches skipped as index lists, the streams restored, torch's global RNG put back.
    """
    start, y = EpochStart.from_dict(state["start"]), state["position"]
    now = rng_state(None) if loader.generator is None else None
    set_rng_state(loader.generator, start.rng)
    set_sampler_fields(_samplers(loader), start.samplers)
    loader._start = start
    if reseeds(loader):
        transforms.reseed(loader.transform, loader.generator)
        transforms.set_random_states(loader.transform, state["transform"])
    seed, before_seed = None, rng_state(loader.generator)
    if not start.seeded:  # the epoch drew a base seed for its threads or workers (restored, or new ones)
        seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())
    order = torch.utils.data.DataLoader._index_sampler.fget(loader)  # type: ignore[attr-defined]
    rest = list(itertools.islice(iter(order), y, None))
    after = rng_state(loader.generator)
    if _stamps(loader):  # new workers, in their turns; torch draws the epoch's base seed again
        loader._worker_states = dict(state["workers"] or {})
        loader._restore = {"workers": loader._worker_states, "rng": None if start.seeded else before_seed}
        rest = [[]] * (y % loader.num_workers) + rest
    loader._yielded = loader._timed.position = y
    make = functools.partial(loader._batches, rest, seed, start=y, states=state["threads"])
    batches = map(loader._convert, make()) if loader._feeding is None else loader._feeding.start(make)
    set_rng_state(loader.generator, after if now is None else now)  # torch's iterator drew a base seed again
    return batches
