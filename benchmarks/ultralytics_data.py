"""Time until Ultralytics can start training from a YOLO export on Drive: copy it, or ``cf.ultralytics_data``?

A YOLO export (``colabfast.testing.layouts.make_yolo``: photo-like 640x480 JPEGs, 0-8 boxes each, a
train and a val split) on the FUSE Drive simulator (100 ms per open, 2 ms per read request, 60 MB/s),
each way measured in a new process with its own empty local folder (a new runtime) on a fresh mount
(nothing cached), median of the repeats:

- ``cp -r``: what a notebook does first, a serial copy of the export to local disk;
- ``cf.stage``: colabfast's parallel copy of the folder (64 threads);
- ``ultralytics_data``, first runtime: packs one mirror per split into a mirrors folder on Drive, then
  stages them and writes the local tree;
- ``ultralytics_data``, next runtime: finds the mirrors by fingerprint, stages them, writes the tree;
- ``ultralytics_data``, again in that runtime: finds the complete tree, writes nothing.

Ultralytics then reads local files in every case, so this is the time that differs. torch, torchvision
and h5py are imported before the clock starts in each new process (a training notebook has torch
imported anyway).

Measured 2026-11-27 on a shared 2-CPU machine (``--images 300 --repeats 1``: 240 train + 60 val, half of
them EXIF-turned, 25.9 MB): ``cp -r`` 57.9 s, ``cf.stage`` 1.6 s, ``ultralytics_data`` first runtime
31.9 s, next runtime 6.0 s, again in that runtime 3.6 s (the two listings of the export on Drive that
``open_dataset`` makes, one per split). So it beats the copy a notebook makes, but on this simulator
colabfast's own parallel copy of the folder is faster still for an export this small; the mirror's
gain is the per-file round trips of a large export, and one file to stage from a zip.

    taskset -c 0,1 python benchmarks/ultralytics_data.py                    # 500 images, a few minutes
    taskset -c 0,1 python benchmarks/ultralytics_data.py --images 2000 --repeats 1
    python benchmarks/ultralytics_data.py --no-sim --images 50             # plain local folders: a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import h5py, torch, torchvision  # imported by any training notebook (Ultralytics imports torch): not timed
start = time.perf_counter()
import colabfast as cf
way, src, mirrors, dst = sys.argv[1:5]
out = {}
if way == "stage":
    cf.stage(src, dst, progress=False)
else:
    data = cf.ultralytics_data(src, mirrors=mirrors, to="disk", progress=False)
    out["first"] = time.perf_counter() - start
    again = time.perf_counter()
    assert cf.ultralytics_data(src, mirrors=mirrors, to="disk", progress=False) == data
    out["again"] = time.perf_counter() - again
    out["images"] = sum(1 for p in data.parent.joinpath("images").rglob("*") if p.is_file())
out.setdefault("first", time.perf_counter() - start)
print(json.dumps(out))
"""


def run(way: str, src: Path, mirrors: Path, runtime: Path) -> dict:
    """One way in a new process whose local folders (TMPDIR, the cache) are ``runtime``: a new runtime."""
    shutil.rmtree(runtime, ignore_errors=True)
    (runtime / "tmp").mkdir(parents=True)
    environ = dict(os.environ, TMPDIR=str(runtime / "tmp"), COLABFAST_CACHE=str(runtime / "cache"),
                   PYTHONPATH=str(ROOT))
    if way == "cp":
        start = time.perf_counter()
        subprocess.run(["cp", "-r", str(src), str(runtime / "tmp" / "copy")], check=True)
        return {"first": time.perf_counter() - start}
    done = subprocess.run([sys.executable, "-c", CHILD, way, str(src), str(mirrors), str(runtime / "tmp" / "copy")],
                          env=environ, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{way} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500, help="JPEGs in the export, 80%% train (default: 500)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way, median reported (default: 2)")
    parser.add_argument("--no-sim", action="store_true", help="read the export from a local folder (a smoke run)")
    args = parser.parse_args()
    from colabfast.testing.layouts import make_yolo

    with tempfile.TemporaryDirectory() as tmp:
        drive = Path(tmp) / "drive"
        train = args.images * 4 // 5
        make_yolo(drive / "export", train, split="train", orientation=6)
        make_yolo(drive / "export", args.images - train, split="val", seed=1)
        (drive / "export/data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnc: 3\n"
                                                "names: [person, car, dog]\n")
        size = sum(p.stat().st_size for p in (drive / "export").rglob("*") if p.is_file())
        times: dict[str, list[float]] = {}
        ways = ("cp", "stage", "ultralytics_data first runtime", "ultralytics_data next runtime")
        for _ in range(args.repeats):
            shutil.rmtree(drive / "mirrors", ignore_errors=True)
            for way in ways:
                if args.no_sim:
                    mount = contextlib.nullcontext(drive)
                else:
                    from colabfast.drive.simulator import DriveSim

                    mount = DriveSim(drive, Path(tmp) / "mnt")
                with mount as sim:
                    top = sim if isinstance(sim, Path) else sim.mountpoint
                    kind = way.split()[0]
                    got = run(kind, top / "export", top / "mirrors", Path(tmp) / "runtime")
                times.setdefault(way, []).append(got["first"])
                if way.endswith("next runtime"):
                    times.setdefault("ultralytics_data again in that runtime", []).append(got["again"])
        where = "local folders (--no-sim)" if args.no_sim else "the Drive simulator's defaults (100 ms/open, 60 MB/s)"
        print(f"{args.images} JPEGs ({train} train), {size / 1e6:.1f} MB with labels, on {where}; "
              f"seconds until training can start, median of {args.repeats}:")
        for way, ts in times.items():
            print(f"  {way:40s} {statistics.median(ts):6.2f} s  (runs: {', '.join(f'{t:.2f}' for t in ts)})")


if __name__ == "__main__":
    main()
