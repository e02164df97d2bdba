"""torchrun on one machine, measured: each rank's epoch with 2 ranks against one process's, on one mirror.

Writes photo-like JPEGs (``colabfast.testing``) into a temporary folder on local disk, packs them once
(before any clock), then starts ``python -m torch.distributed.run --standalone --nproc_per_node=N`` on
this same script for each setup. Every rank (gloo, on the CPU) opens the mirror with
``cf.open_dataset`` and reads it through ``cf.DataLoader(shuffle=True)``: its share of each epoch
(``set_epoch``), decoded to uint8 batches by the loader's reader threads. An epoch starts on every rank
at once (a barrier) and lasts until the slowest rank is done; one warm-up epoch is not counted, and the
figure is the median of ``--repeats`` epochs. The setups:

- ``1 process``: all the CPUs this process may use (reader threads: one per CPU).
- ``2 ranks``: two processes sharing those CPUs, each reading half the epoch.
- ``1 process, 1 CPU`` and ``2 ranks, 1 CPU each`` (pinned with ``sched_setaffinity`` before the
  loader is built, so each has one reader thread): a multi-GPU VM's case, where each GPU's process has
  CPUs of its own; the ideal ratio is 0.5.

The ratio is the 2-rank epoch over the 1-process epoch of the same CPUs, in the same round; the setups
take turns, ``--rounds`` times. No model runs: this is the
data path alone, what torchrun changes in it (the seed broadcast, the shares, processes sharing CPUs).

    python benchmarks/distributed.py                        # 600 images of 200x150, about 5 minutes on 2 CPUs
    python benchmarks/distributed.py --images 1200 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 32


def rank_main(args: argparse.Namespace) -> None:
    """One rank: pinned (``--cpu``), its share of ``--repeats`` + 1 epochs read, each epoch's seconds written."""
    import torch.distributed as dist

    if args.cpu is not None:  # before colabfast counts CPUs (reader threads), as a VM's per-GPU share
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[(args.cpu + int(os.environ["LOCAL_RANK"])) % len(cpus)]})
    import colabfast as cf

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = cf.open_dataset(args.mirror, output="tensor", progress=False)
    loader = cf.DataLoader(ds, batch_size=BATCH, shuffle=True, device="cpu")
    seconds, samples = [], 0
    for epoch in range(args.repeats + 1):
        loader.set_epoch(epoch)
        dist.barrier()
        start = time.perf_counter()
        samples = sum(len(images) for images, _ in loader)
        seconds.append(time.perf_counter() - start)
    Path(args.out).with_suffix(f".{rank}.json").write_text(json.dumps(
        {"seconds": seconds[1:], "samples": samples, "reader": str(loader.choices["reader"][0]),
         "sampler": str(loader.sampler), "cpus": len(os.sched_getaffinity(0))}))
    dist.destroy_process_group()


def run(mirror: Path, out: Path, ranks: int, repeats: int, pinned: bool) -> dict:
    """One setup under torchrun: each epoch's time (its slowest rank), per-rank samples, what ran."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", __file__,
           "--rank", "--mirror", str(mirror), "--out", str(out), "--repeats", str(repeats)]
    if pinned:
        cmd += ["--cpu", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    records = [json.loads(out.with_suffix(f".{r}.json").read_text()) for r in range(ranks)]
    epochs = [max(r["seconds"][e] for r in records) for e in range(repeats)]
    return {"epoch": statistics.median(epochs), "samples": records[0]["samples"], "reader": records[0]["reader"],
            "cpus": records[0]["cpus"], "sampler": records[0]["sampler"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--size", default="200x150", help="WxH of the JPEGs")
    parser.add_argument("--repeats", type=int, default=5, help="epochs timed per setup and round (median)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four setups, taking turns")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # a rank under torchrun
    parser.add_argument("--mirror", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return
    import colabfast as cf
    from colabfast.testing.data import make_imagefolder

    width, height = map(int, args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = make_imagefolder(root / "src", classes=10, per_class=args.images // 10, size=(width, height))
        start = time.perf_counter()
        mirror = cf.pack(src, root / "mirror.h5", progress=False)
        print(f"{args.images} JPEGs of {args.size} packed in {time.perf_counter() - start:.1f} s; "
              f"{len(os.sched_getaffinity(0))} CPUs; batch {BATCH}; median of {args.repeats} epochs, "
              f"{args.rounds} rounds")
        setups = (("1 process", 1, False), ("2 ranks", 2, False),
                  ("1 process, 1 CPU", 1, True), ("2 ranks, 1 CPU each", 2, True))
        got: dict[str, list[dict]] = {name: [] for name, _, _ in setups}
        for turn in range(args.rounds):  # the setups take turns: a machine shared with other work drifts
            for name, ranks, pinned in setups:
                out = root / f"{name.replace(' ', '_').replace(',', '')}-{turn}"
                got[name].append(run(mirror, out, ranks, args.repeats, pinned))
        print("| setup | samples per rank | reader per rank | epoch (slowest rank), per round | vs 1 process, "
              "per round | median | img/s, all ranks (median) |")
        print("|---|---|---|---|---|---|---|")
        for name, ranks, _ in setups:
            alone = got["1 process, 1 CPU" if "CPU" in name else "1 process"]
            ratios = [mine["epoch"] / one["epoch"] for mine, one in zip(got[name], alone)]
            epochs = [g["epoch"] for g in got[name]]
            first, rate = got[name][0], ranks * got[name][0]["samples"] / statistics.median(epochs)
            print(f"| {name} | {first['samples']} | {first['reader']} | "
                  f"{' / '.join(f'{e * 1000:.0f} ms' for e in epochs)} | {' / '.join(f'{r:.2f}' for r in ratios)} | "
                  f"**{statistics.median(ratios):.2f}** | {rate:,.0f} |")

if __name__ == "__main__":
    main()
