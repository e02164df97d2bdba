"""colabfast.DataLoader.state_dict / load_state_dict: a loader restored after k batches (a fresh loader, a
new process) yields exactly the batches the uninterrupted one yields next, with the reader threads, worker
processes, shuffle, DDP shares and random transforms; states it cannot resume are refused, and every state
that breaks the schema (docs/resume.md; issue 51, item 6), generated from valid ones, is one LoaderStateError
from load_state_dict itself, the loader left as it was."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2

import colabfast as cf
from colabfast.images import transforms
from colabfast.packing import pack
from colabfast.testing.data import make_imagefolder

CROP_FLIP = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()])


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resume")
    src = make_imagefolder(out / "src", classes=3, per_class=12, size=(60, 44), vary=0.3)
    return pack(src, out / "m.h5", progress=False)


class Draws(Dataset):
    """A dataset of its indices and random numbers drawn from torch's, Python's and NumPy's global RNG, as
    a dataset's own random transforms draw (read by torch's fetcher in worker processes or here)."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, int(torch.randint(10**6, ())), random.randrange(10**6), np.random.randint(10**6)])


def _copy(batch: Any) -> Any:
    x, y = batch if isinstance(batch, (tuple, list)) else (batch, None)
    return x.cpu().clone(), None if y is None else y.cpu().clone()


def _same(a: list, b: list) -> None:
    assert len(a) == len(b) and len(a) > 0
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb)
        assert (ya is None and yb is None) or torch.equal(ya, yb)


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _resumed_equals_uninterrupted(make: Callable[[], Any], k: int, epochs: int = 2, seed: int = 5) -> None:
    """Run ``make()`` for ``epochs`` uninterrupted; then again, stopping after ``k`` batches of the
    first epoch, and resume a fresh loader (the global RNGs seeded differently, then restored as a
    checkpoint restores the training loop's): the batches after k and the next epochs are the
    uninterrupted ones."""
    _seed(seed)
    whole = make()
    expected = [[_copy(b) for b in whole] for _ in range(epochs)]

    _seed(seed)
    first = make()
    it = iter(first)
    head = [_copy(next(it)) for _ in range(k)]
    state, rngs = first.state_dict(), (torch.get_rng_state(), random.getstate(), np.random.get_state())
    del it, first
    _same(head, expected[0][:k])

    _seed(seed + 1000)  # a new process: another loader, the global RNGs anywhere
    again = make()
    torch.set_rng_state(rngs[0])  # the training loop's checkpoint restores its own RNGs
    random.setstate(rngs[1])
    np.random.set_state(rngs[2])
    again.load_state_dict(state)
    got = [[_copy(b) for b in again] for _ in range(epochs)]
    _same(got[0], expected[0][k:])
    for e in range(1, epochs):
        _same(got[e], expected[e])


@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("k", [1, 4])
def test_reader_threads_with_random_crops_resume_exactly(mirror, persistent, k):
    def make() -> cf.DataLoader:
        ds = cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP)
        loader = cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu", persistent_workers=persistent)
        assert loader._threads is not None and loader._threads.workers == 2  # fused in 2 reader threads
        return loader

    _resumed_equals_uninterrupted(make, k, epochs=3)


def test_the_loaders_own_generator_is_restored_too(mirror):
    def make() -> cf.DataLoader:
        ds = cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP)
        return cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu", generator=torch.Generator().manual_seed(9))

    torch.manual_seed(0)
    whole = make()
    expected = [[_copy(b) for b in whole] for _ in range(2)]
    first = make()
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    again = cf.DataLoader(cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP), batch_size=4,
                          shuffle=True, device="cpu", generator=torch.Generator().manual_seed(777))
    again.load_state_dict(state)
    _same([_copy(b) for b in again], expected[0][3:])
    _same([_copy(b) for b in again], expected[1])


def test_a_colabfast_transform_drawing_in_this_process_resumes_exactly(mirror):
    crop = transforms.Compose([transforms.RandomResizedCrop(20), transforms.RandomHorizontalFlip()])

    def make() -> cf.DataLoader:
        ds = cf.H5ImageFolder(mirror, output="tensor")
        loader = cf.DataLoader(ds, batch_size=5, shuffle=True, device="cpu", num_workers=0, transform=crop)
        assert loader._threads is None
        return loader

    _resumed_equals_uninterrupted(make, 2)


@pytest.mark.filterwarnings("ignore:.*worker processes:UserWarning")  # 3 workers on 2 CPUs: said, and meant
@pytest.mark.parametrize("workers,persistent,k", [(0, False, 5), (2, True, 5), (2, False, 5), (2, True, 4),
                                                  (3, True, 7), (3, False, 1)])
def test_worker_processes_resume_with_their_random_streams(workers, persistent, k):
    def make() -> cf.DataLoader:
        return cf.DataLoader(Draws(), batch_size=3, shuffle=True, device="cpu", num_workers=workers,
                             persistent_workers=persistent if workers else None)

    _resumed_equals_uninterrupted(make, k, epochs=3)


@pytest.mark.parametrize("persistent", [True, False])
def test_a_colabfast_transform_in_worker_processes_resumes_exactly(mirror, persistent):
    crop = transforms.Compose([transforms.RandomResizedCrop(20), transforms.RandomHorizontalFlip()])

    def make() -> cf.DataLoader:
        ds = cf.H5ImageFolder(mirror, output="bytes")
        loader = cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu", num_workers=2, transform=crop,
                               persistent_workers=persistent)
        assert loader._reader is None and "workers" in loader.choices["transform"][1]
        return loader

    _resumed_equals_uninterrupted(make, 3)


def test_block_shuffle_under_ddp_shares_resumes_with_set_epoch(mirror):
    def make() -> cf.DataLoader:
        ds = cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP)
        sampler = cf.BlockShuffleSampler(ds, 4, seed=3, num_replicas=2, rank=1)
        return cf.DataLoader(ds, batch_size=3, sampler=sampler, device="cpu")

    torch.manual_seed(0)
    whole = make()
    expected = []
    for epoch in (7, 8):
        whole.set_epoch(epoch)
        expected.append([_copy(b) for b in whole])
    torch.manual_seed(0)
    first = make()
    first.set_epoch(7)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    again = make()
    again.load_state_dict(state)
    _same([_copy(b) for b in again], expected[0][2:])
    again.set_epoch(8)
    _same([_copy(b) for b in again], expected[1])
    assert expected[0][0][1].tolist() != expected[1][0][1].tolist() or \
        not torch.equal(expected[0][0][0], expected[1][0][0])  # the epochs differ: set_epoch mattered


def test_a_state_saved_between_epochs_starts_the_next_epoch(mirror):
    def make() -> cf.DataLoader:
        ds = cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP)
        return cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu", generator=torch.Generator().manual_seed(1))

    whole = make()
    expected = [[_copy(b) for b in whole] for _ in range(2)]
    first = make()
    _same([_copy(b) for b in first], expected[0])
    assert first.state_dict()["position"] is None
    again = make()
    again.load_state_dict(first.state_dict())
    _same([_copy(b) for b in again], expected[1])


@pytest.mark.parametrize("persistent", [True, False])
def test_worker_processes_saved_between_epochs_carry_on(persistent):
    def make() -> cf.DataLoader:
        return cf.DataLoader(Draws(), batch_size=3, shuffle=True, device="cpu", num_workers=2,
                             persistent_workers=persistent, generator=torch.Generator().manual_seed(4))

    _seed(0)
    expected = [[_copy(b) for b in make_one] for make_one in [make()] for _ in range(2)]
    _seed(0)
    first = make()
    _same([_copy(b) for b in first], expected[0])
    state, rngs = first.state_dict(), (torch.get_rng_state(), random.getstate(), np.random.get_state())
    assert state["position"] is None and (state["workers"] is not None) == persistent
    _seed(99)
    again = make()
    torch.set_rng_state(rngs[0])
    again.load_state_dict(state)
    _same([_copy(b) for b in again], expected[1])


def test_states_it_cannot_resume_are_refused(mirror):
    ds = cf.H5ImageFolder(mirror, output="tensor")
    loader = cf.DataLoader(ds, batch_size=4, device="cpu")
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(cf.LoaderStateError, match="batch_size 4, this one has 6"):
        cf.DataLoader(ds, batch_size=6, device="cpu").load_state_dict(state)
    with pytest.raises(cf.LoaderStateError, match="version 2"):
        loader.load_state_dict({"epoch": 3})
    with pytest.raises(cf.LoaderStateError, match="version 2"):
        loader.load_state_dict("not a dict")  # type: ignore[arg-type]
    threads = cf.DataLoader(cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP), batch_size=4,
                            shuffle=True, device="cpu")
    next(iter(threads))
    with pytest.raises(cf.LoaderStateError, match="num_workers 0, this one has 1"):
        cf.DataLoader(cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP), batch_size=4, shuffle=True,
                      device="cpu", num_workers=1).load_state_dict(threads.state_dict())
    assert issubclass(cf.LoaderStateError, ValueError)


def test_a_new_process_resumes_from_a_checkpoint_on_disk(mirror, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        from torchvision.transforms import v2
        import colabfast as cf
        stop, out, ckpt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
        torch.manual_seed(0)
        ds = cf.H5ImageFolder({str(mirror)!r}, output="tensor",
                              transform=v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()]))
        loader = cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu")
        if stop < 0:  # the resumed run
            checkpoint = torch.load(ckpt)  # weights_only: the state is tensors and numbers
            torch.set_rng_state(checkpoint["rng"])
            loader.load_state_dict(checkpoint["loader"])
        batches = []
        for x, y in loader:
            batches.append((x, y))
            if len(batches) == stop:  # a checkpoint after this step, then the runtime is gone
                torch.save({{"loader": loader.state_dict(), "rng": torch.get_rng_state()}}, ckpt)
                break
        torch.save(batches, out)
    """))
    ckpt = str(tmp_path / "checkpoint.pt")
    for stop, out in (("99", "whole.pt"), ("3", "head.pt"), ("-1", "tail.pt")):
        subprocess.run([sys.executable, str(script), stop, str(tmp_path / out), ckpt], check=True, timeout=300)
    whole, head, tail = (torch.load(tmp_path / f"{n}.pt") for n in ("whole", "head", "tail"))
    assert len(head) == 3 and len(tail) == len(whole) - 3
    _same(head + tail, whole)


@pytest.mark.cuda
@pytest.mark.parametrize("output", ["tensor", "bytes"])
def test_on_cuda_the_feeder_threads_transform_resumes_exactly(mirror, output):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    crop = transforms.Compose([transforms.RandomResizedCrop(20), transforms.RandomHorizontalFlip()])

    def make() -> cf.DataLoader:  # the crops drawn by the feeder thread, ahead of the loop (JPEGs: nvJPEG)
        ds = cf.H5ImageFolder(mirror, output=output)
        return cf.DataLoader(ds, batch_size=4, shuffle=True, device="cuda", transform=crop, feed_depth=3)

    _resumed_equals_uninterrupted(make, 3)


# --- the state's schema: every malformed state is one LoaderStateError from load_state_dict, nothing changed ---


def _block_loader(mirror: Path, block_size: int = 4) -> cf.DataLoader:
    ds = cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP)
    return cf.DataLoader(ds, batch_size=4, sampler=cf.BlockShuffleSampler(ds, block_size, seed=3), device="cpu",
                         generator=torch.Generator().manual_seed(2))


LOADERS: dict[str, Callable[[Path], cf.DataLoader]] = {  # together they fill every key of the schema
    "reader threads, a generator": lambda m: cf.DataLoader(
        cf.H5ImageFolder(m, output="tensor", transform=CROP_FLIP), batch_size=4, shuffle=True, device="cpu",
        generator=torch.Generator().manual_seed(1)),
    "a colabfast transform here": lambda m: cf.DataLoader(
        cf.H5ImageFolder(m, output="tensor"), batch_size=5, shuffle=True, device="cpu", num_workers=0,
        transform=transforms.Compose([transforms.RandomResizedCrop(20), transforms.RandomHorizontalFlip()])),
    "worker processes": lambda m: cf.DataLoader(Draws(), batch_size=3, shuffle=True, device="cpu", num_workers=2,
                                                persistent_workers=True),
    "a block sampler": _block_loader,
}


def _walk(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every value in a state (dicts, lists, tuples), with its path of keys and indices, outermost first."""
    yield path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) \
        else ()
    for key, inner in items:
        yield from _walk(inner, (*path, key))


def _replaced(state: Any, path: tuple, new: Any = KeyError) -> Any:
    """A copy of ``state`` with the value at ``path`` replaced by ``new`` (KeyError: removed)."""
    if not path:
        return new
    key, rest = path[0], path[1:]
    if isinstance(state, dict):
        out = dict(state)
        if rest or new is not KeyError:
            out[key] = _replaced(state[key], rest, new)
        else:
            del out[key]
        return out
    out = list(state)
    if rest or new is not KeyError:
        out[key] = _replaced(state[key], rest, new)
    else:
        del out[key]
    return tuple(out) if isinstance(state, tuple) else out


def _wrong(value: Any, key: Any) -> list[Any]:
    """Values of another type than ``value``, and values of its type out of range (for its ``key``)."""
    if value is None:
        return ["none", 0]
    if isinstance(value, bool):
        return [1, "yes"]
    if isinstance(value, int):
        return [str(value), float(value), 2**64] + ([] if key == "seed" else [-1])  # a seed may be any int64
    if isinstance(value, float):
        return [str(value), [value]]
    if isinstance(value, str):
        return [value + "?", 1]
    if isinstance(value, torch.Tensor):
        return [value.tolist(), value[:-1], value.to(torch.float32), torch.zeros_like(value[:1]).expand(2 * len(value))]
    if isinstance(value, (list, tuple)):
        return [dict(enumerate(value)), (*value, value[-1] if value else 0), value[:-1]] if value else \
            [{}, [torch.zeros(5056, dtype=torch.uint8)]]
    if isinstance(value, dict):
        return [list(value.values()), {**value, "data_source": []}]
    raise AssertionError(f"a state holds {type(value)}")


def _malformed(state: dict, other: dict) -> Iterator[tuple[str, Any]]:
    """(what is wrong, the state) for each value of ``state`` removed, of another type, out of range, and for
    extra keys, a state of another loader (``other``), and what is no state at all."""
    for path, value in _walk(state):
        if path and not isinstance(path[-1], int) or path[-2:-1] == ("workers",):
            yield f"{path} missing", _replaced(state, path)
        for k, wrong in enumerate(_wrong(value, path[-1] if path else None)):
            yield f"{path} wrong #{k}", _replaced(state, path, wrong)
    yield "an extra key", {**state, "data_source": []}
    if "start" in state:
        yield "an extra key in start", {**state, "start": {**state["start"], "shuffle": False}}
        yield "a sampler's extra field", _replaced(state, ("start", "samplers", 0), {"data_source": [], "shuffle": 0})
    else:
        yield "a sampler's extra field", _replaced(state, ("samplers", 0), {"data_source": [], "shuffle": 0})
    yield "another loader's state", other


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("between", [False, True], ids=["mid-epoch", "between epochs"])
@pytest.mark.parametrize("name", list(LOADERS))
def test_every_malformed_state_is_one_loader_state_error_and_changes_nothing(mirror, name, between):
    make = LOADERS[name]
    _seed(0)
    saved = make(mirror)
    it = iter(saved)
    for _ in range(2):
        next(it)
    if between:
        for _ in it:
            pass
    state = saved.state_dict()
    other = {  # a state of another dataset, batch size or sampler
        "reader threads, a generator": lambda: LOADERS["a block sampler"](mirror),
        "a colabfast transform here": lambda: cf.DataLoader(cf.H5ImageFolder(mirror, output="tensor"), batch_size=4,
                                                            shuffle=True, device="cpu", num_workers=0,
                                                            transform=transforms.RandomHorizontalFlip()),
        "worker processes": lambda: cf.DataLoader(Draws(), batch_size=3, shuffle=False, device="cpu", num_workers=2,
                                                  persistent_workers=True),
        "a block sampler": lambda: _block_loader(mirror, 6),
    }[name]()
    next(iter(other))
    if between:
        other = LOADERS["reader threads, a generator"](mirror) if name != "reader threads, a generator" else other
    def built() -> cf.DataLoader:  # the same loader each time (a block sampler draws its seed as it is built)
        _seed(7)
        return make(mirror)

    loader, twin = built(), built()
    before = loader.state_dict()
    cases = list(_malformed(state, other.state_dict()))
    cases += [("not a dict", [state]), ("an old version", {**state, "colabfast.DataLoader": 1})]
    assert len(cases) > 40
    wrong = []
    for what, bad in cases:
        try:
            loader.load_state_dict(bad)
        except cf.LoaderStateError as exc:
            assert len(str(exc)) < 600 and "\n" not in str(exc), (what, str(exc))
        except Exception as exc:  # noqa: BLE001 - what this test looks for
            wrong.append(f"{what}: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        else:
            wrong.append(f"{what}: accepted")
            loader = built()  # its state is not a malformed one's; the next case starts afresh
            continue
        if not _same_state(loader.state_dict(), before):
            wrong.append(f"{what}: refused, but the loader changed")
    assert wrong == [], f"{len(wrong)} of {len(cases)}:\n" + "\n".join(wrong)
    _seed(7)
    after = [_copy(b) for b in loader]
    _seed(7)
    _same(after, [_copy(b) for b in twin])  # the refused states left it as it was
    fresh = make(mirror)
    fresh.load_state_dict(state)  # and the valid one still resumes
    assert len([_copy(b) for b in fresh]) == (len(fresh) if between else len(fresh) - 2)
