"""Check the issues' speed targets against one run of ``colabfast bench``.

    colabfast bench all --size 1 --out results/
    python benchmarks/targets.py results/bench.json

Every ratio compares two methods measured in that same run, on the same data and machine. Nothing
is asserted: the script prints each target, the measured ratio, and whether it was met.
"""

from __future__ import annotations

import argparse
import json
from typing import Callable, Optional


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bench_json", help="bench.json written by colabfast bench")
    rows = json.load(open(parser.parse_args().bench_json, encoding="utf-8"))["results"]

    def row(scenario: str, method: str) -> Optional[dict]:
        return next((r for r in rows if r["scenario"] == scenario and r["method"].startswith(method)
                     and r["seconds"] is not None), None)

    def ratio(scenario: str, ours: str, other: str) -> Optional[float]:
        a, b = row(scenario, ours), row(scenario, other)
        return a["speed"] / b["speed"] if a and b else None

    def check(issue: str, what: str, value: Optional[float], ok: Callable[[float], bool], unit: str = "x") -> None:
        if value is None:
            print(f"  {issue}: {what}: not measured in this run")
        else:
            print(f"  {issue}: {what}: {value:.2f}{unit} {'(met)' if ok(value) else '(NOT met)'}")

    def metric(scenario: str, method: str, key: str) -> Optional[float]:
        r = row(scenario, method)
        return r["metrics"].get(key) if r else None

    print("Issue 2, staging from the simulated Drive (100 ms per open, 2 ms per read, 60 MB/s):")
    check("2", "2000 x 100 kB files, colabfast.stage vs cp -r (target >= 40x)",
          ratio("staging/small-files", "colabfast.stage", "cp -r"), lambda v: v >= 40)
    check("2", "2000 x 100 kB files, fraction of the link limit (target >= 0.67, within 1.5x)",
          metric("staging/small-files", "colabfast.stage", "link_fraction"), lambda v: v >= 1 / 1.5, "")
    for case, target in (("large-file", 0.9), ("zip", 0.8), ("tar.gz", 0.8)):
        check("2", f"{case}: fraction of the bandwidth (target >= {target})",
              metric(f"staging/{case}", "colabfast.stage", "link_fraction"), lambda v, t=target: v >= t, "")
    for where, method in (("through the simulator", "colabfast.stage, nothing to copy"),
                          ("source on local disk", "colabfast.stage, nothing to copy, source on local disk")):
        rerun = next((r for r in rows if r["scenario"] == "staging/rerun" and r["method"] == method), None)
        check("2", f"re-run of a completed stage of 10k files, {where} (target: well under 1 s)",
              rerun and rerun["seconds"], lambda v: v < 0.5, " s")

    print("Issue 3, HDF5 mirrors (same images, same DataLoader workers and batch):")
    for size in sorted({r["scenario"].split("/")[1] for r in rows if r["scenario"].startswith("epoch/")}):
        local, drive = f"epoch/{size}/local", f"epoch/{size}/drive"
        check("3", f"{size}: encoded mirror vs the decode-only ceiling (target >= 0.9)",
              ratio(local, "colabfast encoded mirror", "decode-only ceiling"), lambda v: v >= 0.9)
        check("3", f"{size}: raw mirror vs decoded pixels in RAM, TensorDataset-like (target >= 0.8)",
              ratio(local, "colabfast raw mirror", "decoded pixels in RAM"), lambda v: v >= 0.8)
        for other in ("torchvision ImageFolder", "naive h5 Dataset"):
            check("3", f"{size}: encoded mirror vs {other}", ratio(local, "colabfast encoded mirror", other),
                  lambda v: v >= 1)
            check("3", f"{size}: raw mirror vs {other}", ratio(local, "colabfast raw mirror", other), lambda v: v >= 1)
        check("3", f"{size}: from Drive, stage the mirror then read vs ImageFolder straight from the mount",
              ratio(drive, "colabfast encoded mirror, staged first", "torchvision ImageFolder"), lambda v: v >= 1)
    for output in ("bytes", "tensor"):
        check("3", f"cold reads from Drive ({output}): BlockShuffleSampler vs a random sampler",
              ratio(f"cold-reads/{output}", "colabfast.BlockShuffleSampler", "torch RandomSampler"),
              lambda v: v >= 1)
    for r in rows:
        if r["scenario"].startswith("pack/") and r["seconds"] is not None:
            print(f"  3: {r['scenario']} {r['method']}: {r['metrics'].get('images/s', 0):.0f} images/s")

    print("Issue 17, packing ImageNet's training tar from the simulated Drive:")
    check("17", "pack(archive) vs min(link, 2-CPU decode+resize) (target >= 0.8)",
          metric("pack/archive", "colabfast.pack(archive)", "x bound"), lambda v: v >= 0.8, "")
    peak, mirror = (metric("pack/archive", "colabfast.pack(archive)", k) for k in ("peak disk MB", "mirror MB"))
    check("17", "peak local disk / mirror size (target: the mirror and a small margin)",
          peak / mirror if peak and mirror else None, lambda v: v <= 1.2, "x")

    print("Issue 26, open_dataset: from a folder on the simulated Drive to the first batch (colabfast bench open):")
    first, second = "colabfast.open_dataset, first runtime", "colabfast.open_dataset, second runtime"
    check("26", "second runtime vs the link's limit for the mirror (mirror / bandwidth + one open; target <= 1.2x)",
          metric("open/first-batch", second, "x link limit"), lambda v: v <= 1.2)
    for other in ("cp -r + ImageFolder", "cp zip + unzip + ImageFolder",
                  "by hand: stage -> pack -> flush -> stage, second runtime"):
        check("26", f"second runtime vs {other}", ratio("open/first-batch", second, other), lambda v: v >= 1)
    check("26", "first runtime vs the hand-written stage -> pack -> flush -> stage",
          ratio("open/first-batch", first, "by hand: stage -> pack -> flush -> stage, first runtime"), lambda v: v >= 1)

    print("Issue 25, a COCO-style detection dataset (colabfast bench detection, 2 CPUs):")
    read, items, loader = "detection/read", "colabfast H5CocoDetection(output='tensor'), item by item", \
        "colabfast H5CocoDetection(output='tensor') + colabfast.DataLoader"
    tv_items, tv_loader = "torchvision CocoDetection + v2.PILToTensor, item by item", \
        "torchvision CocoDetection + v2.PILToTensor + torch DataLoader"
    check("25", "mirror item by item vs CocoDetection item by item (target >= 2x)", ratio(read, items, tv_items),
          lambda v: v >= 2)
    check("25", "mirror + colabfast.DataLoader vs CocoDetection + torch DataLoader, 2 workers (target >= 2x)",
          ratio(read, loader, tv_loader), lambda v: v >= 2)
    check("25", "cold from Drive: stage the mirror + read vs CocoDetection on the mount (target >= 10x)",
          ratio("detection/drive", "colabfast: stage the mirror", "torchvision CocoDetection on the Drive mount"),
          lambda v: v >= 10)
    check("25", "pack(layout='coco') vs the decode bound, 2 processes (target >= 0.8)",
          metric("detection/pack", "colabfast.pack(folder, layout='coco')", "x decode bound"), lambda v: v >= 0.8, "")

    print("Issue 28, CPU augmentation (augment: RandomResizedCrop(224) + flip, FFCV's channels-last layout):")
    for case, target in (("JPEG 500x375", 1.2), ("JPEG 256px", 1.2), ("raw 256px", 1.0)):
        check("28", f"{case}: colabfast.DataLoader's defaults vs FFCV (target >= {target})",
              metric(f"augment/{case}", "colabfast.DataLoader (defaults)", "x FFCV"), lambda v, t=target: v >= t)
        check("28", f"{case}: the reader threads vs worker processes (same batches)",
              metric(f"augment/{case}", "colabfast.DataLoader (defaults)", "x worker processes"), lambda v: v >= 1.0)
        check("28", f"{case}: colabfast.DataLoader's defaults vs torchvision ImageFolder + v2, tuned workers",
              metric(f"augment/{case}", "colabfast.DataLoader (defaults)", "x torchvision"), lambda v: v >= 1.0)
    check("28", "detection v2 (boxes, SanitizeBoundingBoxes): the mirror + colabfast.DataLoader vs the source "
                "dataset + torch DataLoader", metric("augment/detection v2", "colabfast.DataLoader (defaults)",
                                                     "x torch DataLoader"), lambda v: v >= 1.0)

    print("Issue 12, the batch reader (loader/reader: mirrors in the page cache, FFCV's channels-last layout):")
    reader = "loader/reader"
    check("12", "raw 256 px vs FFCV raw (target >= 1.0)",
          metric(reader, "raw 256px, channels_last: reader threads", "x FFCV"), lambda v: v >= 1.0)
    check("12", "raw 256 px, fraction of the memcpy bound (target >= 0.5)",
          metric(reader, "raw 256px, channels_last: reader threads", "of memcpy bound"), lambda v: v >= 0.5, "")
    for case in ("JPEG 256px", "JPEG 500x375"):
        check("12", f"{case} vs FFCV jpg (target >= 1.0)",
              metric(reader, f"{case}, channels_last: reader threads", "x FFCV"), lambda v: v >= 1.0)
    check("12", "JPEG bytes hand-over for decode='gpu' (target >= 50,000 images/s)",
          metric(reader, "JPEG bytes 256px (decode='gpu' hand-over): reader threads", "images/s"),
          lambda v: v >= 50_000, " images/s")

    print("Issue 11, the GPU feed (colabfast bench gpu, on a GPU, the process pinned to 2 CPUs):")
    ours, dali = "colabfast.DataLoader (GPU decode, colabfast.images.transforms)", "NVIDIA DALI"
    check("11", "ResNet-50, ImageNet-style: fraction of the data-on-GPU ceiling (target >= 0.9)",
          metric("gpu/resnet50-imagenet", ours, "of ceiling"), lambda v: v >= 0.9, "")
    check("11", "ResNet-50, ImageNet-style: vs NVIDIA DALI in the same run (target >= 1.0)",
          ratio("gpu/resnet50-imagenet", ours, dali), lambda v: v >= 1.0)
    check("11", "the GPU-decode loader alone (target >= 8,000 images/s on an H100)",
          metric("gpu/resnet50-imagenet", ours, "loader images/s"), lambda v: v >= 8000, " images/s")
    check("11", "ResNet-18, 256 px, GPU decode: data wait (target <= 10% of each step)",
          metric("gpu/resnet18", "colabfast.DataLoader (GPU decode)", "data wait %"), lambda v: v <= 10, "%")

    print("Issue 4, feeding the GPU:")
    ours = "colabfast.DataLoader, its defaults"
    check("4", "CPU loader, colabfast.DataLoader vs a hand-tuned torch DataLoader (target: no slower, >= 1.0)",
          ratio("loader/cpu", ours, "torch DataLoader, hand-tuned"), lambda v: v >= 1.0)
    check("4", "CPU loader, colabfast.DataLoader vs the default torch DataLoader",
          ratio("loader/cpu", ours, "torch DataLoader, defaults"), lambda v: v >= 1)
    gpu = [r for r in rows if r["scenario"].startswith("gpu/")]
    if not any(r["seconds"] for r in gpu):
        print("  4: GPU rows: not measured (no CUDA GPU in this run)")
    for r in gpu:
        if r["seconds"] is not None:
            print(f"  4: {r['method']}: {r['metrics']}")


if __name__ == "__main__":
    main()
