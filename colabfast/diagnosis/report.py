"""Is training waiting for data? :func:`diagnose` measures it and says what to change.

Per step it times the wait for the next batch and ``step(batch)`` (CUDA synchronised, so GPU work counts as
compute), the loader alone, GPU utilisation (NVML) and host syncs in ``step``, and words the fix by where the data
lives (:mod:`colabfast.where.env`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from typing import Any, Callable, Generator, Iterable, Optional

import torch

from colabfast.datasets.dropins import unwrap
from colabfast.images.decode import EncodedImages
from colabfast.loading.prefetch import tensors
from colabfast.loading.stages import StageTime, since
from colabfast.where import env

__all__ = ["Report", "diagnose"]

DATA_BOUND = 0.20  # data-bound when at least this share of each step waits for data
# Compute-bound below this share: the data wait colabfast aims at for a fed GPU (ResNet-18 from a local
# mirror), which `colabfast bench gpu` measures as its "data wait %" column.
COMPUTE_BOUND = 0.05
NVML_INTERVAL = 0.2  # seconds between GPU utilisation samples
WORK_STAGES = ("read", "decode+transform", "collate", "copy")  # the loader's own (colabfast.loading.stages), not "wait"


@dataclasses.dataclass
class Report:
    """What :func:`diagnose` measured. Times in seconds, rates in images per second.

    Attributes:
        verdict: ``"data-bound"``, ``"partly data-bound"``, ``"compute-bound"``, or ``"loader only"``
            when no ``step`` was given.
        advice: the fixes, most important first (empty when nothing needs fixing).
        steps: measured steps (after the warm-up).
        data_time: mean wait for the next batch per step.
        step_time: mean time in ``step(batch)`` per step, GPU work included; None without ``step``.
        data_fraction: ``data_time / (data_time + step_time)``; None without ``step``.
        images_per_s: training throughput (data and step); None without ``step``.
        loader_images_per_s: the loader alone, without ``step``.
        gpu_utilization: mean GPU utilisation in percent during the steps (NVML); None without it.
        host_syncs_per_step: CUDA host syncs per call of ``step``; None when not checked (no CUDA).
        data_path: where the dataset reads from, if found (its ``root``, ``path``, first sample...).
        storage: ``"Google Drive"``, ``"FUSE"``, ``"RAM"``, ``"local disk"``, or None if unknown.
        data_times, step_times: the per-step measurements.
        stages: the loader's time per stage (``colabfast.DataLoader.stage_times()``); None for torch's.
    """

    verdict: str
    advice: list[str]
    steps: int
    data_time: float
    step_time: Optional[float]
    data_fraction: Optional[float]
    images_per_s: Optional[float]
    loader_images_per_s: float
    gpu_utilization: Optional[float]
    host_syncs_per_step: Optional[float]
    data_path: Optional[str]
    storage: Optional[str]
    data_times: list[float] = dataclasses.field(repr=False)
    step_times: list[float] = dataclasses.field(repr=False)
    stages: Optional[dict[str, StageTime]] = None

    def slowest_stage(self) -> Optional[tuple[str, float]]:
        """The stage of the loader's own work (``"read"``, ``"decode+transform"``, ``"collate"``,
        ``"copy"``) that took longest, and its share of their time; None where none was timed."""
        work = {name: t.seconds for name, t in (self.stages or {}).items() if name in WORK_STAGES}
        total = sum(work.values())
        if total <= 0:
            return None
        name = max(work, key=work.__getitem__)
        return name, work[name] / total

    def headline(self) -> str:
        """One line: the verdict with its number, and the loader's slowest stage where data waits."""
        slowest = self.slowest_stage()
        if self.data_fraction is None:
            stage = f"; {slowest[0]} takes {slowest[1]:.0%} of the loader's time" if slowest else ""
            return f"loader only: {self.loader_images_per_s:,.0f} images/s{stage}"
        share = f"{self.data_fraction:.0%} of each step waits for data"
        if slowest is not None and self.verdict in ("data-bound", "partly data-bound"):
            share += f"; {slowest[0]} takes {slowest[1]:.0%} of the loader's time"
        return f"{self.verdict}: {share}."

    def __str__(self) -> str:
        lines = [f"colabfast.diagnose: {self.headline()}"]
        lines += [f"  {advice}" for advice in self.advice]
        if self.step_time is not None:
            lines.append(
                f"  per step: {self.data_time * 1e3:.1f} ms waiting for data + {self.step_time * 1e3:.1f} ms "
                f"in step() ({self.steps} steps measured)"
            )
            lines.append(
                f"  throughput: {self.images_per_s:,.0f} images/s training, "
                f"{self.loader_images_per_s:,.0f} images/s from the loader alone"
            )
        if self.gpu_utilization is not None:
            lines.append(f"  GPU utilisation: {self.gpu_utilization:.0f}% (NVML)")
        if self.host_syncs_per_step is not None:
            lines.append(f"  host syncs in step(): {self.host_syncs_per_step:.1f} per step")
        if self.stages:
            lines.append("  loader stages: " + ", ".join(f"{name} {t.seconds:.3g} s ({t.count})"
                                                        for name, t in self.stages.items()))
        if self.data_path is not None:
            lines.append(f"  data: {self.data_path} ({self.storage or 'unknown storage'})")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"


def diagnose(
    loader: Iterable,
    step: Optional[Callable[[Any], Any]] = None,
    *,
    steps: int = 50,
    warmup: int = 5,
    verbose: bool = True,
) -> Report:
    """Measure whether training waits for data, print the verdict and the fix, return a :class:`Report`.

    Args:
        loader: a ``colabfast.DataLoader``, a ``torch.utils.data.DataLoader``, a
            :class:`~colabfast.loading.prefetch.CUDAPrefetcher`, or any re-iterable of batches. It is
            iterated twice (with ``step``, then alone); an epoch shorter than ``warmup + steps``
            starts again.
        step: one training step, called as ``step(batch)`` (forward, backward, optimiser step). None
            measures the loader alone.
        steps: steps measured, after ``warmup`` steps that are not (worker start-up, cuDNN autotuning).
        warmup: steps run first and not measured.
        verbose: print the report once at the end.

    Returns:
        The :class:`Report`.

    Raises:
        ValueError: ``steps < 1``, or the loader yields no batches.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    data_times: list[float] = []
    step_times: list[float] = []
    gpu_util = syncs = None
    images_per_s = None
    clock = _stage_clock(loader)
    stages = None
    if step is not None:
        sampler = _Utilization() if env.gpu() is not None else None
        data_times, step_times, images, syncs, stages = _time_steps(loader, step, steps, warmup, sampler, clock)
        gpu_util = sampler.mean() if sampler is not None else None
        images_per_s = images / (sum(data_times) + sum(step_times))
    loader_rate, alone = _loader_rate(loader, steps, warmup, clock)
    stages = stages if step is not None else alone

    dataset = _dataset(loader)
    path = _data_path(dataset)
    storage = _storage(path) if path is not None else None
    data_time = sum(data_times) / len(data_times) if data_times else 0.0
    fraction = step_time = None
    if step is not None:
        step_time = sum(step_times) / len(step_times)
        fraction = data_time / (data_time + step_time) if data_time + step_time > 0 else 0.0
    verdict = _verdict(fraction)
    advice = _advice(verdict, loader, dataset, path, storage, syncs)
    report = Report(
        verdict=verdict,
        advice=advice,
        steps=len(step_times) if step is not None else steps,
        data_time=data_time,
        step_time=step_time,
        data_fraction=fraction,
        images_per_s=images_per_s,
        loader_images_per_s=loader_rate,
        gpu_utilization=gpu_util,
        host_syncs_per_step=syncs,
        data_path=path,
        storage=storage,
        data_times=data_times,
        step_times=step_times,
        stages=stages,
    )
    if verbose:
        print(report)
    return report


# --- measuring ---------------------------------------------------------------------------------------


def _batches(loader: Iterable) -> Generator[Any, None, None]:
    """The loader's batches, starting a new epoch when one ends."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yielded no batches")


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _stage_clock(loader: Any) -> Optional[Callable[[], dict[str, StageTime]]]:
    """The loader's ``stage_times`` (``colabfast.DataLoader``'s), also inside a wrapper, or None."""
    while loader is not None and not callable(getattr(loader, "stage_times", None)):
        loader = getattr(loader, "loader", None)  # CUDAPrefetcher, timm's PrefetchLoader
    return None if loader is None else loader.stage_times


def _time_steps(
    loader: Iterable, step: Callable[[Any], Any], steps: int, warmup: int, utilization: Optional[_Utilization],
    clock: Optional[Callable[[], dict[str, StageTime]]] = None,
) -> tuple[list[float], list[float], int, Optional[float], Optional[dict[str, StageTime]]]:
    data_times, step_times, images, sync_count = [], [], 0, 0
    check_syncs = torch.cuda.is_available()
    batches = _batches(loader)
    before = None
    try:
        for i in range(warmup + steps):
            if i == warmup and utilization is not None:
                utilization.start()
            if i == warmup and clock is not None:
                before = clock()
            t0 = time.perf_counter()
            batch = next(batches)
            t1 = time.perf_counter()
            if check_syncs:
                with _SyncCounter() as counter:
                    step(batch)
                sync_count += counter.count if i >= warmup else 0
            else:
                step(batch)
            if _cuda_in_use():  # the step's GPU work belongs to the step, not to the next data wait
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i >= warmup:
                data_times.append(t1 - t0)
                step_times.append(t2 - t1)
                images += _batch_len(batch)
        stages = since(clock(), before) if clock is not None else None
    finally:
        batches.close()
        if utilization is not None:
            utilization.stop()
    return data_times, step_times, images, (sync_count / steps if check_syncs else None), stages


def _loader_rate(loader: Iterable, steps: int, warmup: int,
                 clock: Optional[Callable[[], dict[str, StageTime]]] = None
                 ) -> tuple[float, Optional[dict[str, StageTime]]]:
    """The loader's images/s alone, and its time per stage meanwhile (None without a ``clock``)."""
    batches = _batches(loader)
    for _ in range(warmup):
        next(batches)
    if _cuda_in_use():
        torch.cuda.synchronize()
    before = clock() if clock is not None else None
    images, t0 = 0, time.perf_counter()
    for _ in range(steps):
        images += _batch_len(next(batches))
    if _cuda_in_use():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    stages = since(clock(), before) if clock is not None else None
    batches.close()
    return images / elapsed if elapsed > 0 else float("inf"), stages


def _batch_len(batch: Any) -> int:
    """Images in a batch: the leading size of its images (the first element), else of its first tensor."""
    images = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if isinstance(images, torch.Tensor) and images.dim():
        return int(images.shape[0])
    if isinstance(images, (list, EncodedImages)):
        return len(images)
    first = next(tensors(batch), None)
    return int(first.shape[0]) if first is not None and first.dim() else 1


class _SyncCounter:
    """Count CUDA host syncs inside a ``with`` block via ``torch.cuda.set_sync_debug_mode("warn")``."""

    def __enter__(self) -> _SyncCounter:
        self.count = 0
        self._mode = torch.cuda.get_sync_debug_mode()
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.set_sync_debug_mode(self._mode)
        self._warnings.__exit__(*exc)
        syncs = [w for w in self._caught if "synchronizing" in str(w.message)]
        self.count = len(syncs)
        for w in self._caught:  # pass on the user's own warnings
            if w not in syncs:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


class _Utilization:
    """Samples GPU utilisation (NVML) in a background thread."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="colabfast-nvml", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(NVML_INTERVAL):
            value = env.gpu_utilization()
            if value is None:
                return
            self.samples.append(value)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def mean(self) -> Optional[float]:
        return sum(self.samples) / len(self.samples) if self.samples else None


# --- where the data lives and what to do -------------------------------------------------------------


def _dataset(loader: Any) -> Any:
    while loader is not None and not hasattr(loader, "dataset"):
        loader = getattr(loader, "loader", None)  # CUDAPrefetcher, timm's PrefetchLoader
    return getattr(loader, "dataset", None)


def _data_path(dataset: Any) -> Optional[str]:
    """Where ``dataset`` reads from: its ``root``/``path``/``filename``, or its first sample's path
    (``samples[0][0]`` as ImageFolder, ``imgs``, ``images`` as torchvision's Kitti)."""
    for d in unwrap(dataset):
        for name in ("root", "path", "filename"):
            value = getattr(d, name, None)
            if isinstance(value, str) or hasattr(value, "__fspath__"):
                return str(value)
        for name in ("samples", "imgs", "images"):  # instance lists only: never trigger a lazy property
            items = vars(d).get(name) if hasattr(d, "__dict__") else None
            if isinstance(items, (list, tuple)) and items:
                first = items[0][0] if isinstance(items[0], (list, tuple)) else items[0]
                if isinstance(first, str) or hasattr(first, "__fspath__"):
                    return str(first)
    return None


def _storage(path: str) -> str:
    """:attr:`Report.storage` for ``path``: every Drive kind of :func:`colabfast.where.env.storage` is Google Drive."""
    return {"fuse": "FUSE", "ram": "RAM", "disk": "local disk"}.get(env.storage(path), "Google Drive")


def _verdict(fraction: Optional[float]) -> str:
    if fraction is None:
        return "loader only"
    if fraction >= DATA_BOUND:
        return "data-bound"
    if fraction >= COMPUTE_BOUND:
        return "partly data-bound"
    return "compute-bound"


def _advice(
    verdict: str, loader: Any, dataset: Any, path: Optional[str], storage: Optional[str], syncs: Optional[float]
) -> list[str]:
    advice = []
    if verdict in ("data-bound", "partly data-bound"):
        mirror = any(getattr(d, "is_mirror", False) for d in unwrap(dataset))
        if storage in ("Google Drive", "FUSE"):
            where = "a Drive mount" if storage == "Google Drive" else "a FUSE mount"
            advice.append(
                f"The dataset reads from {path} ({where}), where every file is a network round trip: "
                f"stage it to local disk (colabfast.stage) or pack it into an HDF5 mirror."
            )
        elif path is not None and not mirror:
            advice.append(
                f"The dataset reads from {path} ({storage}) and is not an HDF5 mirror: pack it into one "
                f"(one file, pre-resized images) so the workers read blocks instead of opening and decoding files."
            )
        workers = getattr(loader, "num_workers", None)
        if workers == 0:
            advice.append(
                f"num_workers=0 loads data in the training process: use colabfast.DataLoader or "
                f"num_workers={env.cpu_count()}."
            )
        if torch.cuda.is_available() and _yields_bytes(dataset) is False:
            advice.append(
                "JPEG decoding on the CPU is the usual limit on 2 vCPUs: load encoded bytes "
                "(H5ImageFolder(output='bytes')) and decode on the GPU with colabfast.DataLoader(decode='gpu')."
            )
        if not advice:
            advice.append("Make the dataset's __getitem__ cheaper (pre-resize images, move transforms to the GPU).")
    elif verdict == "compute-bound":
        advice.append("step() is the limit: a faster loader will not speed training up.")
    if syncs is not None and syncs >= 1:
        advice.append(
            f"step() makes {syncs:.1f} host syncs per step (e.g. loss.item(), .cpu(), printing a CUDA "
            f"tensor): each stops the CPU until the GPU finishes. Log every N steps instead."
        )
    return advice


def _yields_bytes(dataset: Any) -> Optional[bool]:
    """True/False when the dataset says whether it yields encoded bytes (``output``), else None."""
    for d in unwrap(dataset):
        output = getattr(d, "output", None)
        if output is not None:
            return output == "bytes"
    return None
