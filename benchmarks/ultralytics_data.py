"""Time until Ultralytics can start training from a YOLO export on Drive, and one epoch from Drive or local disk.

A YOLO export (``colabfast.testing.layouts.make_yolo``: photo-like 640x480 JPEGs, 0-8 boxes each, a
train and a val split) on the FUSE Drive simulator (100 ms per open, 2 ms per read request, 60 MB/s),
each way measured in a new process with its own empty local folder (a new runtime) on a fresh mount
(nothing cached), median of the repeats:

- ``cp -r``: what a notebook does first, a serial copy of the export to local disk;
- ``cf.stage``: colabfast's parallel copy of the folder (64 threads);
- ``ultralytics_data``, first runtime: packs one mirror per split into a mirrors folder on Drive, keeps
  the export's record beside them, then stages the mirrors and writes the local tree;
- ``ultralytics_data``, next runtime: reads the record, checks the export's folder times (stats),
  stages the mirrors, writes the tree (the simulator's counts of opens and folder listings are printed);
- ``ultralytics_data``, again in that runtime: finds the complete tree, stages and writes nothing;
- the link's limit for the mirrors: their bytes at the simulator's bandwidth plus one open (the two
  are staged at once), and a measured ``cat`` of both at once on a fresh mount.

Ultralytics then reads local files in every case, so this is the time that differs. torch, torchvision
and h5py are imported before the clock starts in each new process (a training notebook has torch
imported anyway).

Then one epoch of ``YOLO("yolov8n.yaml")`` (from scratch: no weights downloaded; Ultralytics offline)
on the CPU at ``--imgsz`` (64), ``--batch`` (16), ``workers=2``, each in a new process: from the export
on a fresh simulator mount (a ``data.yaml`` naming it by its absolute path, written outside the export),
and from the tree ``ultralytics_data`` wrote. Printed: the training epoch alone (Ultralytics'
``on_train_epoch_start`` to ``on_train_epoch_end``) and the whole ``train()`` call (its label scan of
both splits, the epoch, the validation), and the factor Drive / local of each. The labels cache
Ultralytics writes beside the export's labels is deleted after each run.

Measured numbers: benchmarks/README.md, "A YOLO export on Drive to a data.yaml Ultralytics trains from".

    taskset -c 0,1 python benchmarks/ultralytics_data.py --images 300 --repeats 3
    taskset -c 0,1 python benchmarks/ultralytics_data.py --images 300 --repeats 1 --no-epochs
    python benchmarks/ultralytics_data.py --no-sim --images 50 --repeats 1   # plain local folders: a smoke run
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
    out["data"] = str(data)
out.setdefault("first", time.perf_counter() - start)
print(json.dumps(out))
"""

EPOCH = r"""
import json, sys, time
from ultralytics import YOLO
data, project, imgsz, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model = YOLO("yolov8n.yaml")  # from scratch: nothing downloaded
marks = {}
model.add_callback("on_train_epoch_start", lambda t: marks.setdefault("epoch_start", time.perf_counter()))
model.add_callback("on_train_epoch_end", lambda t: marks.setdefault("epoch_end", time.perf_counter()))
start = time.perf_counter()
model.train(data=data, epochs=1, imgsz=imgsz, batch=batch, device="cpu", workers=2, plots=False, amp=False,
            project=project, name="one", exist_ok=True, verbose=False, seed=0)
end = time.perf_counter()
images = model.trainer.train_loader.dataset.im_files
print(json.dumps({"train": end - start, "epoch": marks["epoch_end"] - marks["epoch_start"],
                  "images": len(images), "first_image": images[0]}))
"""


def runtime_env(runtime: Path) -> dict:
    """A new runtime's environment: its own local folders (TMPDIR, the cache), Ultralytics offline."""
    shutil.rmtree(runtime, ignore_errors=True)
    (runtime / "tmp").mkdir(parents=True)
    return dict(os.environ, TMPDIR=str(runtime / "tmp"), COLABFAST_CACHE=str(runtime / "cache"),
                PYTHONPATH=str(ROOT), YOLO_OFFLINE="true", YOLO_AUTOINSTALL="false",
                YOLO_CONFIG_DIR=str(runtime / "yolo-settings"))


def run(way: str, src: Path, mirrors: Path, runtime: Path) -> dict:
    """One way in a new process whose local folders (TMPDIR, the cache) are ``runtime``: a new runtime."""
    environ = runtime_env(runtime)
    if way == "cp":
        start = time.perf_counter()
        subprocess.run(["cp", "-r", str(src), str(runtime / "tmp" / "copy")], check=True)
        return {"first": time.perf_counter() - start}
    if way == "link":  # the mirrors read at once, as ultralytics_data stages them
        found = sorted(mirrors.glob("*.h5"))
        start = time.perf_counter()
        cats = [subprocess.Popen(["cat", str(m)], stdout=subprocess.DEVNULL) for m in found]
        if any(c.wait() for c in cats):
            raise SystemExit("cat of a mirror failed")
        return {"first": time.perf_counter() - start}
    done = subprocess.run([sys.executable, "-c", CHILD, way, str(src), str(mirrors), str(runtime / "tmp" / "copy")],
                          env=environ, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{way} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def epoch(data: Path, runtime: Path, imgsz: int, batch: int) -> dict:
    """One epoch of yolov8n from ``data`` in a new process (cwd and outputs in ``runtime``)."""
    environ = runtime_env(runtime)
    done = subprocess.run([sys.executable, "-c", EPOCH, str(data), str(runtime / "runs"), str(imgsz), str(batch)],
                          env=environ, capture_output=True, text=True, check=False, cwd=runtime)
    if done.returncode:
        raise SystemExit(f"training from {data} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def clean_caches(export: Path) -> None:
    """Ultralytics' labels caches (``labels/<split>.cache``) written beside the export's labels."""
    for cache in export.rglob("*.cache"):
        cache.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500, help="JPEGs in the export, 80%% train (default: 500)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way, median reported (default: 2)")
    parser.add_argument("--no-sim", action="store_true", help="read the export from a local folder (a smoke run)")
    parser.add_argument("--no-epochs", action="store_true", help="time only until training can start")
    parser.add_argument("--imgsz", type=int, default=64, help="the epochs' image size (default: 64)")
    parser.add_argument("--batch", type=int, default=16, help="the epochs' batch size (default: 16)")
    args = parser.parse_args()
    from colabfast.drivesim.simulator import DriveSim
    from colabfast.testing.layouts import make_yolo

    with tempfile.TemporaryDirectory() as tmp:
        drive = Path(tmp) / "drive"
        train = args.images * 4 // 5
        make_yolo(drive / "export", train, split="train", orientation=6)
        make_yolo(drive / "export", args.images - train, split="val", seed=1)
        (drive / "export/data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnc: 3\n"
                                                "names: [person, car, dog]\n")
        size = sum(p.stat().st_size for p in (drive / "export").rglob("*") if p.is_file())
        (Path(tmp) / "drive.yaml").write_text("path: {mount}/export\ntrain: images/train\nval: images/val\n"
                                              "nc: 3\nnames: [person, car, dog]\n")
        times: dict[str, list[float]] = {}
        counts: list[dict] = []
        mirror_bytes = 0
        ways = ("cp", "stage", "ultralytics_data first runtime", "ultralytics_data next runtime", "link")
        params = None
        for _ in range(args.repeats):
            shutil.rmtree(drive / "mirrors", ignore_errors=True)
            data = None
            for way in ways:
                mount = contextlib.nullcontext(drive) if args.no_sim else DriveSim(drive, Path(tmp) / "mnt")
                with mount as sim:
                    top = sim if isinstance(sim, Path) else sim.mountpoint
                    kind = way.split()[0]
                    got = run(kind, top / "export", top / "mirrors", Path(tmp) / "runtime")
                    if way.endswith("next runtime") and not isinstance(sim, Path):
                        counts.append(sim.stats())
                    if not isinstance(sim, Path):
                        params = sim.params
                times.setdefault("link's limit, measured: cat of the mirrors at once" if way == "link" else way,
                                 []).append(got["first"])
                print(f"  ({way}: {got['first']:.2f} s)", file=sys.stderr, flush=True)
                if way.endswith("next runtime"):
                    times.setdefault("ultralytics_data again in that runtime", []).append(got["again"])
                    data = Path(got["data"])
                    local_tree = Path(tmp) / "tree"  # kept for the epoch: the next run empties the runtime
                    shutil.rmtree(local_tree, ignore_errors=True)
                    shutil.copytree(data.parent, local_tree)
                    text = (local_tree / "data.yaml").read_text().replace(str(data.parent), str(local_tree))
                    (local_tree / "data.yaml").write_text(text)
            mirror_bytes = sum(p.stat().st_size for p in (drive / "mirrors").glob("*.h5"))
            if not args.no_epochs:
                for where in ("from the Drive mount", "from ultralytics_data's tree"):
                    if where.startswith("from the Drive"):
                        mount = contextlib.nullcontext(drive) if args.no_sim else DriveSim(drive, Path(tmp) / "mnt")
                        with mount as sim:
                            top = sim if isinstance(sim, Path) else sim.mountpoint
                            yaml_path = Path(tmp) / "drive-data.yaml"
                            yaml_path.write_text((Path(tmp) / "drive.yaml").read_text().format(mount=top))
                            got = epoch(yaml_path, Path(tmp) / "runtime", args.imgsz, args.batch)
                        assert got["first_image"].startswith(str(top)), got
                        clean_caches(drive / "export")
                    else:
                        got = epoch(Path(tmp) / "tree" / "data.yaml", Path(tmp) / "runtime", args.imgsz, args.batch)
                        assert got["first_image"].startswith(str(Path(tmp) / "tree")), got
                    print(f"  (epoch {where}: {got['epoch']:.2f} s, train() {got['train']:.2f} s)", file=sys.stderr,
                          flush=True)
                    times.setdefault(f"epoch {where}", []).append(got["epoch"])
                    times.setdefault(f"train() {where}", []).append(got["train"])
        where = "local folders (--no-sim)" if args.no_sim else "the Drive simulator's defaults (100 ms/open, 60 MB/s)"
        print(f"{args.images} JPEGs ({train} train), {size / 1e6:.1f} MB with labels, on {where}; "
              f"seconds until training can start, median of {args.repeats}:")
        medians = {way: statistics.median(ts) for way, ts in times.items()}
        if params is not None and params.mbps:
            limit = mirror_bytes / (params.mbps * 1e6) + params.open_ms / 1000
            times["link's limit: the mirrors' bytes / bandwidth + one open"] = [limit]
            medians[next(reversed(times))] = limit
        for way, ts in times.items():
            print(f"  {way:58s} {medians[way]:7.2f} s  (runs: {', '.join(f'{t:.2f}' for t in ts)})")
        print(f"  the mirrors: {mirror_bytes / 1e6:.1f} MB")
        if counts:
            print(f"  Drive requests of the next runtime (simulator's counts, last run): {counts[-1]}")
        limit_key = "link's limit: the mirrors' bytes / bandwidth + one open"
        if limit_key in medians:
            nxt = medians["ultralytics_data next runtime"]
            cat = medians["link's limit, measured: cat of the mirrors at once"]
            print(f"  next runtime / link's limit: {nxt / medians[limit_key]:.2f}x (computed), "
                  f"{nxt / cat:.2f}x (measured cat); target 1.3x")
        if not args.no_epochs:
            for what in ("epoch", "train()"):
                drive_t = medians[f"{what} from the Drive mount"]
                local_t = medians[f"{what} from ultralytics_data's tree"]
                print(f"  {what} from Drive / from the local tree: {drive_t / local_t:.2f}x "
                      f"(imgsz={args.imgsz}, batch={args.batch}, workers=2, CPU)")


if __name__ == "__main__":
    main()
