"""Two checkouts of colabfast, A and B, timed alternately (A B B A ...) in the same run on one Drive
simulator: the second runtime of ``colabfast.open_dataset`` (``colabfast bench open``'s harness) or the
next runtime of ``colabfast.ultralytics_data`` (``benchmarks/ultralytics_data.py``'s), each a new
process with an empty local disk, so that a change is measured against the code before it on the same
machine load. Prints every run, then each checkout's median as a multiple of the link's limit
(the mirrors' bytes at 60 MB/s plus one open).

    taskset -c 0,1 python benchmarks/second_runtime_ab.py open /path/to/A /path/to/B --pairs 10
    taskset -c 0,1 python benchmarks/second_runtime_ab.py ultralytics /path/to/A /path/to/B --pairs 4
    taskset -c 0,1 python benchmarks/second_runtime_ab.py ultralytics /path/to/A /path/to/A --pairs 3 --images 1500

A and B are folders holding a ``colabfast`` package (a checkout, or a copy of one); each is compiled to
bytecode first, as ``pip install`` does. Measured numbers: benchmarks/README.md, "From a Drive folder to the
first batch" and "A YOLO export on Drive to a data.yaml Ultralytics trains from".
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("open", "ultralytics"))
    parser.add_argument("a", type=Path, help="checkout A (a folder holding colabfast/)")
    parser.add_argument("b", type=Path, help="checkout B")
    parser.add_argument("--pairs", type=int, default=6, help="pairs of runs (default: 6)")
    parser.add_argument("--images", type=int, default=300,
                        help="ultralytics: images in the export, 80%% train (default: 300)")
    args = parser.parse_args()
    trees = [str(args.a.resolve()), str(args.b.resolve())]
    for tree in trees:
        compileall.compile_dir(Path(tree) / "colabfast", quiet=2)
    times: dict[str, list[float]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="cf-ab-") as tmp:
        if args.what == "open":
            limit = _open(Path(tmp), trees, args.pairs, times)
        else:
            limit = _ultralytics(Path(tmp), trees, args.pairs, times, args.images)
    print(f"link's limit {limit:.3f} s")
    for tree, ts in times.items():
        med = statistics.median(ts)
        print(f"{tree}: median {med:.3f} s = {med / limit:.3f}x the link's limit (runs {min(ts) / limit:.3f}-"
              f"{max(ts) / limit:.3f}x, n={len(ts)})")
    if len(times) < 2:  # A and B the same folder: its runs alone
        return
    diffs = [b - a for a, b in zip(*times.values())]
    print(f"B - A per pair: {', '.join(f'{d:+.3f}' for d in diffs)} s; median {statistics.median(diffs):+.3f} s")


def _order(i: int, trees: list[str]) -> list[str]:
    return trees if i % 2 == 0 else trees[::-1]


def _open(tmp: Path, trees: list[str], pairs: int, times: dict[str, list[float]]) -> float:
    """open_dataset's second runtime: 2000 JPEGs, the first runtime (A) packs the mirror once."""
    from colabfast.drivesim.simulator import DriveSim
    from colabfast.testing import data
    from colabfast.tools.bench import opening

    local = tmp / "runtime"
    data.make_imagefolder(tmp / "drive/MyDrive/photos", classes=10, per_class=200, size=opening.IMAGE_SIZE, vary=0.2)
    with DriveSim(tmp / "drive", tmp / "mnt") as sim:
        mounted = sim.mountpoint / "MyDrive"
        os.environ["PYTHONPATH"] = trees[0]
        opening._in_new_runtime(opening.FIRST, mounted, local, 64, 2)
        mirror = next((tmp / "drive/MyDrive/colabfast-mirrors").glob("*.h5")).stat().st_size
        for i in range(pairs):
            for tree in _order(i, trees):
                os.environ["PYTHONPATH"] = tree
                got = opening._in_new_runtime(opening.SECOND, mounted, local, 64, 2)
                times[tree].append(got["seconds"])
                print(f"{tree}: {got['seconds']:.3f} s to the first batch, dataset {got['dataset']:.3f} s", flush=True)
    return mirror / 60e6 + 0.1


def _ultralytics(tmp: Path, trees: list[str], pairs: int, times: dict[str, list[float]], images: int) -> float:
    """ultralytics_data's next runtime: benchmarks/ultralytics_data.py's export (``images``, 80% train, half
    of train EXIF-turned), a fresh mount each."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import ultralytics_data as bench

    from colabfast.drivesim.simulator import DriveSim
    from colabfast.testing.layouts import make_yolo

    drive = tmp / "drive"
    train = images * 4 // 5
    make_yolo(drive / "export", train, split="train", orientation=6)
    make_yolo(drive / "export", images - train, split="val", seed=1)
    (drive / "export/data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnc: 3\n"
                                            "names: [person, car, dog]\n")
    real_env = bench.runtime_env
    for i in range(-1, pairs):
        for tree in _order(i, trees) if i >= 0 else trees[:1]:
            bench.runtime_env = lambda runtime, tree=tree: {**real_env(runtime), "PYTHONPATH": tree}
            with DriveSim(drive, tmp / "mnt") as sim:
                got = bench.run("ultralytics_data", sim.mountpoint / "export", sim.mountpoint / "mirrors",
                                tmp / "runtime")
            if i >= 0:  # the first run packs the mirrors (A)
                times[tree].append(got["first"])
                print(f"{tree}: {got['first']:.3f} s until training can start", flush=True)
    mirrors = sum(p.stat().st_size for p in (drive / "mirrors").glob("*.h5"))
    return mirrors / 60e6 + 0.1


if __name__ == "__main__":
    main()
