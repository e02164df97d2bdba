"""Staging from the Drive simulator: ``colabfast.stage`` against ``cp -r``, ``rsync -a``,
``shutil.copytree``, a plain thread-pool copy, ``cp`` of one big file, ``tar xzf`` and ``unzip``.

Every case reports seconds, MB/s, files/s and the fraction of the simulated link's limit reached:
``max(files x open latency / concurrency, bytes / bandwidth)`` with colabfast's 64 concurrent files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from colabfast.drivesim.fs import DriveSimParams
from colabfast.drivesim.simulator import DriveSim
from colabfast.staging.pipeline import stage
from colabfast.testing import data
from colabfast.tools.bench.timing import Result, measure

CONCURRENCY = 64  # colabfast.stage's default from a FUSE mount


def _copytree_threads(src: Path, dst: Path, workers: int = CONCURRENCY) -> None:
    """A plain thread-pool copy: what a user would write with concurrent.futures."""
    files = [p for p in src.rglob("*") if p.is_file()]
    for d in {p.parent for p in files}:
        (dst / d.relative_to(src)).mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda p: shutil.copyfile(p, dst / p.relative_to(src)), files))


def _fresh(dst: Path) -> None:
    """Remove the last copy (a folder or a file) and flush dirty pages, so each repeat starts alike."""
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    elif dst.exists():
        dst.unlink()
    os.sync()  # earlier cases' writes must not be written back during this one


def _run(cmd: list[str]) -> Callable[[], None]:
    return lambda: subprocess.run(cmd, check=True, capture_output=True)


def _failure(exc: BaseException) -> str:
    """``failed: <last line of the tool's stderr, or the error>``, short enough for a table cell."""
    lines = (getattr(exc, "stderr", None) or b"").decode(errors="replace").strip().splitlines()
    text = lines[-1] if lines else f"{type(exc).__name__}: {exc}"
    return "failed: " + (text if len(text) <= 160 else text[:157] + "...")


def _case(scenario: str, methods: dict[str, Optional[Callable[[], None]]], dst: Path, nbytes: int, nfiles: int,
          limit: float, repeats: dict[str, int]) -> list[Result]:
    rows = []
    for method, fn in methods.items():
        if fn is None:
            rows.append(Result(scenario, method, None, note="not installed"))
            continue
        try:
            med, low, high = measure(fn, repeats.get(method, repeats["default"]), setup=lambda: _fresh(dst))
        except (OSError, subprocess.CalledProcessError) as exc:  # e.g. an injected EIO: the row says so
            rows.append(Result(scenario, method, None, note=_failure(exc)))
            continue
        rows.append(Result(scenario, method, med, low, high, repeats.get(method, repeats["default"]), {
            "MB/s": nbytes / med / 1e6, "files/s": nfiles / med, "link_fraction": limit / med}))
    return rows


def run(size: float = 1.0, repeats: int = 3, baseline_repeats: int = 1, drive: Optional[dict] = None,
        work: Optional[Path] = None, cases: tuple[str, ...] = ("small-files", "large-file", "zip", "tar.gz",
                                                                  "rerun")) -> list[Result]:
    """Measure staging from the simulated Drive.

    Args:
        size: scale of the data: 1.0 is 2000 x 100 kB files (and a 200 MB zip and tar.gz of them),
            one 1 GB file, and 10k files for the re-run; the serial baselines take about
            files x 0.1 s at 1.0 (``cp -r`` of 2000 files: ~3.5 minutes).
        repeats: repetitions of colabfast's methods (median reported).
        baseline_repeats: repetitions of the slow serial baselines.
        drive: simulator settings over :class:`~colabfast.drivesim.fs.DriveSimParams`' defaults
            (100 ms per open, 2 ms per read, 60 MB/s), e.g. ``{"eio_read": 0.001}`` to inject faults;
            a method that fails under faults gets a row with a note.
        work: where to put the data (default: a temp folder).
        cases: which cases to run.

    Returns:
        Rows with ``MB/s``, ``files/s`` and ``link_fraction``; without a usable FUSE, one row per case
        saying why.
    """
    from colabfast.drivesim.fs import available

    ok, why = available()
    if not ok:
        return [Result(f"staging/{case}", "every method", None, note=f"Drive simulator unavailable: {why}")
                for case in cases]
    params = DriveSimParams(**(drive or {}))
    bw = (params.mbps or float("inf")) * 1e6  # bytes/s; no cap: only the opens bound the time
    reps = {"default": repeats, "cp -r": baseline_repeats, "rsync -a": baseline_repeats,
            "shutil.copytree": baseline_repeats}
    rows: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as tmp:
        tmp = Path(tmp)
        drive_src, out = tmp / "drive", tmp / "local"
        nfiles, fsize = max(8, int(2000 * size)), 100_000
        small = data.make_files(drive_src / "small", nfiles, fsize, per_folder=100)
        if {"zip", "tar.gz"} & set(cases):
            with zipfile.ZipFile(drive_src / "small.zip", "w", zipfile.ZIP_STORED) as z:
                for p in sorted(small.rglob("*.bin")):
                    z.write(p, p.relative_to(drive_src).as_posix())
            with tarfile.open(drive_src / "small.tar.gz", "w:gz", compresslevel=1) as t:
                t.add(small, arcname="small")
        big_bytes = int(1e9 * size)
        if "large-file" in cases:
            with open(drive_src / "big.bin", "wb") as f:
                for _ in range(0, big_bytes, 64 << 20):
                    f.write(os.urandom(min(64 << 20, big_bytes - f.tell())))
        nrerun = int(10_000 * size)
        if "rerun" in cases:
            data.make_files(drive_src / "many", nrerun, 1000, per_folder=100)

        with DriveSim(drive_src, tmp / "mnt", params) as sim:
            mnt = sim.mountpoint
            if "small-files" in cases:
                nbytes = nfiles * fsize
                limit = max(nfiles * params.open_ms / 1e3 / CONCURRENCY, nbytes / bw)
                dst = out / "small"
                rows += _case("staging/small-files", {
                    "colabfast.stage": lambda: stage(mnt / "small", dst, progress=False),
                    "thread pool (64 x shutil.copyfile)": lambda: _copytree_threads(mnt / "small", dst),
                    "cp -r": _run(["cp", "-r", str(mnt / "small"), str(dst)]),
                    "rsync -a": _run(["rsync", "-a", f"{mnt / 'small'}/", str(dst)]) if shutil.which("rsync")
                    else None,
                    "shutil.copytree": lambda: shutil.copytree(mnt / "small", dst),
                }, dst, nbytes, nfiles, limit, reps)
            if "large-file" in cases:
                dst = out / "big.bin"
                rows += _case("staging/large-file", {
                    "colabfast.stage": lambda: stage(mnt / "big.bin", dst, progress=False),
                    "cp": _run(["cp", str(mnt / "big.bin"), str(dst)]),
                }, dst, big_bytes, 1, big_bytes / bw, reps)
            for kind in ("zip", "tar.gz"):
                if kind not in cases:
                    continue
                archive = mnt / f"small.{kind}"
                nbytes = archive.stat().st_size
                dst = out / "extracted"
                baseline = (["unzip", "-q", str(archive), "-d", str(dst)] if kind == "zip"
                            else ["tar", "xzf", str(archive), "-C", str(dst)])
                extract = _run(["sh", "-c", f"mkdir -p {dst} && " + " ".join(baseline)])
                rows += _case(f"staging/{kind}", {
                    "colabfast.stage": lambda archive=archive, dst=dst: stage(archive, dst, progress=False),
                    "unzip" if kind == "zip" else "tar xzf": extract if shutil.which(baseline[0]) else None,
                }, dst, nbytes, nfiles, nbytes / bw, reps)
            if "rerun" in cases:
                dst = out / "many"
                stage(mnt / "many", dst, progress=False)
                med, low, high = measure(lambda: stage(mnt / "many", dst, progress=False), repeats)
                rows.append(Result("staging/rerun", "colabfast.stage, nothing to copy", med, low, high, repeats,
                                   {"files/s": nrerun / med}, note=f"{nrerun} files already staged"))
        if "rerun" in cases:  # the same from local disk: colabfast's own cost, without the simulator's
            # (its own destination: one staged from the mount is another source's, and is refused)
            stage(drive_src / "many", out / "many-local", progress=False)
            med, low, high = measure(lambda: stage(drive_src / "many", out / "many-local", progress=False), repeats)
            rows.append(Result("staging/rerun", "colabfast.stage, nothing to copy, source on local disk", med, low,
                               high, repeats, {"files/s": nrerun / med},
                               note="no FUSE: what is left is colabfast's own cost; through the simulator each "
                                    "folder listing is a Python FUSE round trip"))
    return rows
