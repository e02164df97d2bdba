"""Streaming a mirror from Drive through a bounded local cache (issue 43, item 1): colabfast's
``open_dataset(path, to="stream", cache_limit=...)`` against MosaicML Streaming's ``StreamingDataset``
with the same ``cache_limit``, on the Drive simulator; one scenario ``stream/two-epochs``.

One process, one run. An ImageNet-like ImageFolder (photo-like JPEGs of about 500x375) is packed
into a mirror (``image_size`` short side, shuffled) in the simulator's backing folder, and the
mirror's own JPEG bytes are exported once, in the mirror's order, as MDS shards beside it: both
engines read the same samples. "The small local disk" is a tmpfs sized so that the mirror is
``mirror_to_disk`` times it (3 by default); ``cache_limit`` is a fraction of it (0.8 by default; with
several fractions both engines run at each).

Rows, each two epochs with the same batch size and the same output (uint8 ``[B, 3, S, S]`` after
``CenterCrop(S)``, S the packed short side), timed from making the dataset to the last batch:

- ``link`` (reference): the mirror's bytes twice at the simulator's bandwidth, as images/s; the
  simulator also charges ``read_ms`` per read request of at most 128 KiB, which this leaves out.
- ``staged`` (reference): the mirror copied to ordinary local disk (not the tmpfs; page cache
  warm) and read by ``colabfast.DataLoader(..., shuffle=True)``: the staged mirror's rate.
- ``MosaicML Streaming``: ``StreamingDataset(remote=<mount>/mds, local=<tmpfs>/mds-cache,
  cache_limit=..., shuffle=True, batch_size=...)`` through torch's DataLoader with ``workers``
  workers, decoding with PIL as its docs do. It refuses a ``cache_limit`` under 4 shards, so the
  shards are cut to the least ``cache_limit / 8`` (at most its default 64 MB).
- ``colabfast stream``: ``colabfast.open_dataset(<mount>/mirror.h5, to="stream", cache_limit=...)``
  and ``colabfast.DataLoader(ds, batch_size, shuffle=True)``; its cache goes under
  :func:`colabfast.where.env.work_dir` (``<tempdir>/colabfast-data-<uid>`` outside Colab), so the
  temp folder is the tmpfs for that row.

Each streaming row's ``x min(link, staged)`` is its rate over the lower of the two references
(issue 43's target: 0.8 or more); ``local peak MB`` is the most the tmpfs held while the row ran
(``os.statvfs`` polled every 5 ms by a thread), against ``cache_limit MB``; ``Drive MB`` is what it
read through the simulator; ``same samples`` how many of 8 samples, by index, equal the staged
mirror's (image pixels and label). A row that hands out no batch for :data:`STALL_S` seconds (a
Streaming worker whose shard copy failed on the full tmpfs waits for it forever) fails with a note
saying what the tmpfs held.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import torch

from colabfast.tools.bench import peers
from colabfast.tools.bench.timing import Result

SCENARIO = "stream/two-epochs"
CLASSES = 10
EPOCHS = 2
SOURCE_SIZE = (500, 375)  # (width, height) of the source JPEGs, each side varied by up to 20%
LINK, STAGED = "link: the mirror at the link's bandwidth", "staged: the mirror on local disk, colabfast.DataLoader"
OURS = 'colabfast stream: open_dataset(to="stream")'
CHECKED = 8  # samples compared by index with the staged mirror's
POLL_S = 0.005
# A row waiting this long for a batch fails (its note says so) instead of hanging the run: a Streaming
# worker whose shard copy failed (ENOSPC on the small disk) waits for that shard forever.
STALL_S = 60.0


class PeakUse:
    """The most bytes a filesystem held while a ``with`` block ran: a thread polls ``os.statvfs``."""

    def __init__(self, path: Path, every: float = POLL_S) -> None:
        self.path, self.every = path, every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="colabfast-bench-peak", daemon=True)

    def used(self) -> int:
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def _poll(self) -> None:
        while True:
            self.peak = max(self.peak, self.used())
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> PeakUse:
        self.peak = self.used()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.used())


@contextlib.contextmanager
def tmpfs(path: Path, nbytes: int) -> Iterator[Path]:
    """A tmpfs of ``nbytes`` (rounded up to 4 KiB pages) mounted at ``path`` (made if missing); unmounted
    after, also on error. Needs root."""
    path.mkdir(parents=True, exist_ok=True)
    pages = -(-nbytes // 4096)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={pages * 4096}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        gc.collect()  # files a dropped dataset still holds open would keep the mount busy
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@contextlib.contextmanager
def temp_folder(path: Path) -> Iterator[None]:
    """``tempfile.gettempdir()`` is ``path`` for the ``with`` block (so is colabfast's work_dir under it)."""
    before = tempfile.tempdir
    tempfile.tempdir = str(path)
    try:
        yield
    finally:
        tempfile.tempdir = before


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """SIGTERM (``timeout``, a CI runner's cancel) raises SystemExit in the ``with`` block, so that the
    tmpfs and the simulator are unmounted on the way out; the handler before is put back after."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _empty(folder: Path) -> None:
    gc.collect()
    for p in folder.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


@contextlib.contextmanager
def _stall_alarm(seconds: float) -> Iterator[Callable[[], None]]:
    """Yields ``rearm()``; unless it is called every ``seconds``, TimeoutError is raised in the main thread
    (SIGALRM), so a loader that stops handing out batches fails its row instead of hanging the run.

    An alarm already set around it (pytest-timeout's ``signal`` method, say) keeps its deadline and its
    handler: the stall timer never runs past that deadline, the outer handler is called when the deadline
    comes inside the block, and the outer timer is set again, for what is left of it, on the way out."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    outer = signal.getsignal(signal.SIGALRM)
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    deadline = time.monotonic() + left if left > 0 else None
    called: list[bool] = []  # the outer handler, once its time came

    def remaining() -> float:
        return max((deadline or 0.0) - time.monotonic(), 1e-3)

    def stalled(signum: int, frame: Any) -> None:
        if deadline is not None and time.monotonic() >= deadline - 1e-3 and callable(outer):
            called.append(True)
            outer(signum, frame)  # the outer alarm's time came first
            return
        raise TimeoutError(f"no batch in {seconds:g} s")

    def rearm() -> None:
        signal.setitimer(signal.ITIMER_REAL, seconds if deadline is None else min(seconds, remaining()))

    signal.signal(signal.SIGALRM, stalled)
    try:
        yield rearm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer)
        if deadline is not None and not called:
            signal.setitimer(signal.ITIMER_REAL, remaining())


def _epochs(loader: Iterable, side: int) -> int:
    """Run :data:`EPOCHS` epochs; the images seen. Raises if a batch is not uint8 ``[B, 3, side, side]``,
    and TimeoutError if none comes for :data:`STALL_S` seconds."""
    images = 0
    with _stall_alarm(STALL_S) as rearm:
        for _ in range(EPOCHS):
            rearm()
            for batch in loader:
                rearm()
                x = batch[0]
                if not (isinstance(x, torch.Tensor) and x.dtype == torch.uint8
                        and tuple(x.shape[1:]) == (3, side, side)):
                    got = f"{type(x).__name__} {getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}"
                    raise RuntimeError(f"batches must hold uint8 images [B, 3, {side}, {side}]; got {got}")
                images += len(x)
    return images


def _same(dataset: Any, reference: Any, n: int) -> int:
    """How many of ``CHECKED`` indices spread over ``n`` give the same (image, label) in both datasets."""
    same = 0
    for i in sorted({round(k * (n - 1) / (CHECKED - 1)) for k in range(CHECKED)}):
        (a, la), (b, lb) = dataset[i], reference[i]
        same += int(torch.equal(a, b) and int(la) == int(lb))
    return same


def _failed(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return "failed: " + (text if len(text) <= 200 else text[:197] + "...")


def _export_mds(mirror: Path, out: Path, scratch: Path, shard_bytes: int) -> None:
    """The mirror's samples as MDS shards in ``out``, in the mirror's order, each image its stored JPEG bytes."""
    from colabfast.datasets.dropins import H5ImageFolder

    ds = H5ImageFolder(mirror, output="bytes")
    scratch.mkdir(parents=True)
    samples = []
    for i in range(len(ds)):
        data, label = ds[i]
        path = scratch / f"{i:08d}.jpg"
        path.write_bytes(data.numpy().tobytes())
        samples.append((str(path), int(label)))
    peers._mds_prepare(samples, out, (0, 0), 1, size_limit=shard_bytes)
    shutil.rmtree(scratch)


def run(size: float = 1.0, repeats: int = 1, batch_size: int = 64, workers: int = 2, image_size: int = 256,
        mirror_to_disk: float = 3.0, cache_fractions: Sequence[float] = (0.8,), drive: Optional[dict] = None,
        work: Optional[Union[str, Path]] = None, with_streaming: bool = True) -> list[Result]:
    """Two epochs of a mirror streamed from the Drive simulator through a bounded cache on a small tmpfs.

    Args:
        size: scale: 1.0 is 10000 JPEGs (10 classes), about 210 MB as a mirror at 256 px.
        repeats: rounds; in each every row runs once, in turn, with an empty cache (median reported).
        batch_size: images per batch, for every row.
        workers: torch DataLoader workers of the Streaming rows (colabfast's loader chooses its own).
        image_size: the short side the mirror is packed at; every row yields ``CenterCrop(image_size)``.
        mirror_to_disk: the mirror's size over the tmpfs's (3: a mirror 3x the local disk).
        cache_fractions: each a ``cache_limit`` as a fraction of the tmpfs (in (0, 1]); both engines run
            at each.
        drive: simulator settings over :class:`~colabfast.drivesim.fs.DriveSimParams`' defaults (100 ms
            per open, 2 ms per read request, 60 MB/s).
        work: where to put the data (default: a temp folder); the staged copy goes there too.
        with_streaming: run MosaicML Streaming's rows (False: they say they were left out; no MDS export).

    Returns:
        The rows :data:`LINK`, :data:`STAGED` (references), then per cache fraction MosaicML Streaming
        and colabfast's stream (:func:`method_names`), with ``images/s``; the streaming rows also ``x
        min(link, staged)``, ``local peak MB``, ``cache_limit MB``, ``Drive MB`` and ``same samples``. A
        row that cannot run carries a note instead (a missing peer, no root for the tmpfs, no FUSE, an
        API not in this colabfast, a full tmpfs).

    Raises:
        ValueError: ``size``, ``repeats``, ``mirror_to_disk`` or a cache fraction out of range.
    """
    from torchvision.transforms import v2

    from colabfast.datasets.dropins import H5ImageFolder
    from colabfast.drivesim.fs import DriveSimParams, available
    from colabfast.drivesim.simulator import DriveSim
    from colabfast.loading.loader import DataLoader
    from colabfast.packing import pack
    from colabfast.testing import data
    from colabfast.where import env

    fractions = tuple(cache_fractions)
    if size <= 0 or repeats < 1 or mirror_to_disk <= 1 or not fractions or not all(0 < f <= 1 for f in fractions):
        raise ValueError(f"need size > 0, repeats >= 1, mirror_to_disk > 1 and each cache fraction in (0, 1]; got "
                         f"{size}, {repeats}, {mirror_to_disk}, {fractions}")
    names = method_names(fractions)
    ok, why = available()
    if not ok or not env.is_root():
        why = f"Drive simulator unavailable: {why}" if not ok else "mounting the small tmpfs needs root"
        return [Result(SCENARIO, m, None, note=why, reference=m == STAGED) for m in [STAGED, *names]]
    params = DriveSimParams(**(drive or {}))
    crop = v2.CenterCrop(image_size)
    per_class = max(2, round(10000 * size / CLASSES))
    n = per_class * CLASSES
    streaming_missing = peers.MOSAICML_STREAMING.missing() if with_streaming else "left out of this run (--peers)"
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as name:
        tmp = Path(name)
        backing = tmp / "drive"
        backing.mkdir()
        src = data.make_imagefolder(tmp / "src", classes=CLASSES, per_class=per_class, size=SOURCE_SIZE, vary=0.2)
        mirror = pack(src, backing / "mirror.h5", image_size=image_size, shuffle=True, progress=False)
        shutil.rmtree(src)
        nbytes = mirror.stat().st_size
        disk = int(nbytes / mirror_to_disk)
        limits = {f: int(f * disk) for f in fractions}
        shard_bytes = min(64 << 20, min(limits.values()) // 8)  # one export for every limit
        if not streaming_missing:
            try:
                peers.MOSAICML_STREAMING.load()
                _export_mds(mirror, backing / "mds", tmp / "export", shard_bytes)
            except Exception as exc:  # a peer's failure is its row's note
                streaming_missing = _failed(exc)
        staged_path = tmp / "local" / "mirror.h5"
        staged_path.parent.mkdir()
        shutil.copyfile(mirror, staged_path)
        staged = H5ImageFolder(staged_path, transform=crop, output="tensor")

        def run_staged(small: Path, sim: Any) -> tuple[Iterable, Any]:
            return DataLoader(staged, batch_size, shuffle=True, device="cpu"), staged

        def run_streaming(cache_limit: int) -> Callable[[Path, Any], tuple[Iterable, Any]]:
            def make(small: Path, sim: Any) -> tuple[Iterable, Any]:
                # Its docs' advice for a cache that holds a few shards: shuffle in blocks of samples that span
                # fewer shards than fit (py1br: shards shuffled, then samples within blocks of about that
                # size); its default block (262,144 samples, the whole set here) spreads batches over every shard.
                per_shard = max(1, int(shard_bytes / (nbytes / len(staged))))
                block = per_shard * max(1, cache_limit // shard_bytes // 2)
                loader = peers._mds_loader(sim.mountpoint / "mds", crop, batch_size, workers, small / "mds-cache",
                                           cache_limit=cache_limit, timeout=STALL_S if workers else 0,
                                           shuffle_algo="py1br", shuffle_block_size=block)
                return loader, loader.dataset
            return make

        def run_ours(cache_limit: int) -> Callable[[Path, Any], tuple[Iterable, Any]]:
            def make(small: Path, sim: Any) -> tuple[Iterable, Any]:
                import colabfast

                # Its cache goes under colabfast's work_dir, in the temp folder: the small tmpfs here.
                with temp_folder(small):
                    ds = colabfast.open_dataset(sim.mountpoint / "mirror.h5", to="stream", cache_limit=cache_limit,
                                                transform=crop, output="tensor", progress=False)
                return DataLoader(ds, batch_size, shuffle=True, device="cpu"), ds
            return make

        runs: dict[str, tuple[Callable[[Path, Any], tuple[Iterable, Any]], Optional[int]]] = {
            STAGED: (run_staged, None)}
        for (mds, ours), f in zip(zip(names[::2], names[1::2]), fractions):
            runs[mds] = (run_streaming(limits[f]), limits[f])
            runs[ours] = (run_ours(limits[f]), limits[f])
        figures: dict[str, list[dict[str, float]]] = {m: [] for m in runs}
        notes: dict[str, str] = {}
        if streaming_missing:
            notes.update({m: streaming_missing for m in names[::2]})
        with _terminated_as_exit(), tmpfs(tmp / "small", disk) as small, DriveSim(backing, tmp / "mnt", params) as sim:
            for _ in range(repeats):  # rounds: the machine's load drifts alike for every row
                for method, (make, limit) in runs.items():
                    if method in notes:
                        continue
                    try:
                        figures[method].append(_one(make, small, sim, image_size, staged, n, streams=limit is not None,
                                                    ours=method in names[1::2]))
                    except Exception as exc:  # e.g. the stream API not in this colabfast yet
                        notes[method] = str(exc)
                    finally:
                        _empty(small)
    rows = _rows(figures, notes, {m: limit for m, (_, limit) in runs.items()}, n, nbytes, params)
    rows[0].note = (f"{n} JPEGs (~{SOURCE_SIZE[0]}x{SOURCE_SIZE[1]}) packed at {image_size} px: mirror "
                    f"{nbytes / 1e6:.1f} MB on the Drive simulator ({params.open_ms:g} ms/open, {params.read_ms:g} "
                    f"ms/read, {params.mbps:g} MB/s); local disk a tmpfs of {disk / 1e6:.1f} MB (the mirror / "
                    f"{mirror_to_disk:g}); {EPOCHS} epochs, batch {batch_size}, CenterCrop({image_size}), uint8")
    for r in rows:
        if r.method in names[::2] and r.seconds is not None:
            r.note = "; ".join(filter(None, [r.note, (
                f"MDS shards of {shard_bytes / 1e6:.2f} MB (the least cache_limit / 8: Streaming wants 4 shards in its "
                f"cache), py1br shuffle in blocks of half the shards the cache holds, remote=<mount>/mds, "
                f"local=<tmpfs>/mds-cache, torch DataLoader with {workers} "
                f"workers; decode: {peers.MOSAICML_STREAMING.decoder}")]))
    return rows


def method_names(fractions: Sequence[float]) -> list[str]:
    """The streaming rows' names, two per cache fraction: MosaicML Streaming's, then colabfast's."""
    version = peers.MOSAICML_STREAMING.version()
    mds = f"{peers.MOSAICML_STREAMING.name} {version}".strip()
    return [name for f in fractions for name in (f"{mds}, cache_limit {f:g} x disk", f"{OURS}, {f:g} x disk")]


def _one(make: Callable[[Path, Any], tuple[Iterable, Any]], small: Path, sim: Any, side: int, staged: Any, n: int,
         streams: bool, ours: bool) -> dict[str, float]:
    """One row's two epochs: seconds, images, Drive bytes, the tmpfs's peak, same samples."""
    loader = dataset = None
    before = sim.stats()["bytes_read"]
    with PeakUse(small) as peak, (temp_folder(small) if ours else contextlib.nullcontext()):
        try:
            start = time.perf_counter()
            loader, dataset = make(small, sim)
            images = _epochs(loader, side)
            seconds = time.perf_counter() - start
            read = sim.stats()["bytes_read"] - before
            same = _same(dataset, staged, n) if streams else CHECKED
        except Exception as exc:  # the row's note: what failed, and what the small disk held meanwhile
            st = os.statvfs(small)
            raise RuntimeError(f"{_failed(exc)} (the small disk held up to {peak.peak / 1e6:.1f} MB of its "
                               f"{st.f_blocks * st.f_frsize / 1e6:.1f} MB meanwhile)") from exc
        finally:
            loader = dataset = None
            gc.collect()
            if "streaming" in sys.modules:  # what a StreamingDataset leaves in /dev/shm (its docs' advice)
                from streaming.base.util import clean_stale_shared_memory

                clean_stale_shared_memory()
    out = {"seconds": seconds, "images": images, "Drive MB": read / 1e6, "same samples": same}
    if streams:
        out["local peak MB"] = peak.peak / 1e6
    return out


def _rows(figures: dict[str, list[dict[str, float]]], notes: dict[str, str], limits: dict[str, Optional[int]], n: int,
          nbytes: int, params: Any) -> list[Result]:
    link_s = EPOCHS * nbytes / (params.mbps * 1e6) if params.mbps else None
    rows = []
    if link_s is not None:
        rows.append(Result(SCENARIO, LINK, link_s, link_s, link_s, 1, {"images/s": EPOCHS * n / link_s,
                                                                       "Drive MB": EPOCHS * nbytes / 1e6},
                           reference=True))
    floor = None
    for method, runs in figures.items():
        limit = limits[method]
        if method in notes or not runs:
            rows.append(Result(SCENARIO, method, None, note=notes.get(method, "did not run"), reference=limit is None))
            continue
        seconds = [r["seconds"] for r in runs]
        med = statistics.median(seconds)
        metrics = {"images/s": runs[0]["images"] / med, "Drive MB": max(r["Drive MB"] for r in runs)}
        if limit is None:  # the staged mirror
            floor = min(metrics["images/s"], EPOCHS * n / link_s) if link_s else metrics["images/s"]
        else:
            if floor:
                metrics["x min(link, staged)"] = metrics["images/s"] / floor
            metrics["local peak MB"] = max(r["local peak MB"] for r in runs)
            metrics["cache_limit MB"] = limit / 1e6
            metrics["same samples"] = min(r["same samples"] for r in runs)
        note = ""
        if any(r["images"] != EPOCHS * n for r in runs):
            note = f"{runs[0]['images']} images in {EPOCHS} epochs of a {n}-image mirror"
        rows.append(Result(SCENARIO, method, med, min(seconds), max(seconds), len(seconds), metrics, note=note,
                           reference=limit is None))
    return rows
