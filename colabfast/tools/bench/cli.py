"""``colabfast bench [staging|epoch|coldreads|pack|loader|augment|gpu|open|detection|stream|all]``: run scenarios,
print the tables, write Markdown, JSON and a PNG chart into ``--out``.

The top-level CLI mounts this module as its ``bench`` subcommand: ``build_parser(parser)`` adds the
arguments to the subparser it is given and ``run(args)`` executes them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

from colabfast.tools.bench.timing import Result

SCENARIOS = ("staging", "epoch", "coldreads", "pack", "loader", "augment", "gpu", "open", "detection", "stream")
# --size's default: all scenarios at this scale take about 5 minutes on 2 vCPU (staging ~1.5, epoch
# ~3.5: per-file Drive latency and the peers' start-up costs dominate). 1.0 is the full-size run
# (2000 small files and a 1 GB file to stage, 2000 images per image size): about 50 minutes.
DEFAULT_SIZE = 0.1


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``colabfast bench``'s arguments to ``parser`` and return it."""
    parser.description = (
        "Measure colabfast against what users would pick instead, in one run on this machine: staging from "
        "a simulated Drive (vs cp -r, rsync, shutil.copytree, a thread pool, cp, unzip, tar), epoch "
        "throughput (vs torchvision ImageFolder, a naive h5 Dataset, WebDataset, LitData, MosaicML "
        "Streaming, Efficio, FFCV), pack throughput, CPU augmentation (RandomResizedCrop + flip: the loader's reader "
        "threads vs its worker processes, torchvision, FFCV), GPU feeding (CUDA only), and the time from a Drive "
        "folder to the first batch with open_dataset (vs cp -r, cp + unzip, stage -> pack -> stage by hand), and a "
        "COCO detection dataset (its mirror vs torchvision CocoDetection, locally and from Drive; pack vs decoding), "
        "and streaming a mirror 3x the local disk from Drive through a bounded cache (vs MosaicML Streaming). "
        "Prints Markdown tables and writes bench.md, bench.json and bench.png into --out."
    )
    parser.add_argument("scenario", nargs="?", choices=[*SCENARIOS, "all"], default="all",
                        help="what to measure (default: all)")
    parser.add_argument("--size", type=float, default=DEFAULT_SIZE,
                        help=f"scale of every scenario's data (default {DEFAULT_SIZE}: about 5 minutes on 2 vCPU; "
                             "1.0: the full-size run, about 50 minutes)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="repetitions of each measurement; tables show the median and min-max (default 3)")
    parser.add_argument("--out", default="colabfast-bench", help="folder for bench.md, bench.json, bench.png "
                                                                 "(default: ./colabfast-bench)")
    parser.add_argument("--workers", type=int, help="DataLoader workers for every method (default: the CPU count)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch for every loader (default 64)")
    parser.add_argument("--peers", help="comma-separated peers for the epoch scenario, e.g. 'webdataset,ffcv', "
                                        "or 'none' (default: all; those not installed get a note); the stream "
                                        "scenario runs MosaicML Streaming unless --peers leaves it out")
    parser.add_argument("--drive", type=_drive_settings, default={}, metavar="KEY=VALUE,...",
                        help="Drive simulator settings for the staging, epoch, coldreads, open, detection and stream "
                             "scenarios, over the defaults open_ms=100,read_ms=2,mbps=60 (per-open and per-read "
                             "latency in ms, MB/s); eio_open=P,eio_read=P inject EIO faults with probability P")
    parser.add_argument("--mirror-to-disk", type=float, default=3.0,
                        help="stream scenario: the mirror's size over the small local disk's, a tmpfs (default 3)")
    parser.add_argument("--cache-fraction", type=_fractions, default=(0.8,), metavar="F[,F...]",
                        help="stream scenario: cache_limit as a fraction of that tmpfs; several, comma-separated, "
                             "run both engines at each (default 0.8)")
    parser.add_argument("--work", help="folder for the generated data (default: a temp folder)")
    return parser


def _fractions(text: str) -> tuple[float, ...]:
    """``"0.8,0.5"`` -> ``(0.8, 0.5)``, each in (0, 1]."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"need fractions such as 0.8 or 0.8,0.5; got {text!r}") from None
    if not values or not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"each fraction must be in (0, 1]; got {text!r}")
    return values


def _drive_settings(text: str) -> dict[str, float]:
    """``"open_ms=100,mbps=60"`` -> ``{"open_ms": 100.0, "mbps": 60.0}`` (DriveSim's live parameters)."""
    from colabfast.drivesim.fs import DriveSimParams

    live = DriveSimParams.LIVE
    settings = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in live:
            raise argparse.ArgumentTypeError(f"unknown Drive setting {key!r}; known: {', '.join(live)}")
        try:
            settings[key] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key} needs a number, e.g. {key}=100; got {value!r}") from None
    return settings


def _scenarios(args: argparse.Namespace) -> dict[str, Callable[[], list[Result]]]:
    from colabfast.tools.bench import (
        augment,
        coldreads,
        detection,
        epoch,
        gpufeed,
        loader,
        opening,
        packing,
        peers,
        staging,
        streaming,
    )

    chosen = None if args.peers is None else [] if args.peers.strip().lower() == "none" else \
        peers.by_name(args.peers.split(","))
    return {
        "staging": lambda: staging.run(size=args.size, repeats=args.repeats, drive=args.drive, work=args.work),
        "epoch": lambda: epoch.run(size=args.size, repeats=args.repeats, batch_size=args.batch_size,
                                   num_workers=args.workers, peers=chosen, drive=args.drive, work=args.work),
        "coldreads": lambda: coldreads.run(size=args.size, repeats=args.repeats, batch_size=args.batch_size,
                                           workers=args.workers or 2, drive=args.drive, work=args.work),
        "pack": lambda: packing.run(size=args.size, repeats=args.repeats, workers=args.workers, work=args.work)
        + packing.run_archive(size=args.size, repeats=args.repeats, workers=args.workers or 2, work=args.work),
        "loader": lambda: loader.run(size=args.size, repeats=args.repeats, batch_size=args.batch_size,
                                     num_workers=args.workers, work=args.work)
        + loader.run_reader(size=args.size, repeats=max(5, args.repeats), batch_size=args.batch_size, work=args.work),
        "augment": lambda: augment.run(size=args.size, repeats=args.repeats, batch_size=args.batch_size,
                                       workers=args.workers or 2, work=args.work),
        "gpu": lambda: gpufeed.run(size=args.size, repeats=args.repeats, batch_size=args.batch_size,
                                   num_workers=args.workers, work=args.work),
        "open": lambda: opening.run(size=args.size, repeats=args.repeats, batch_size=args.batch_size,
                                    workers=args.workers or 2, drive=args.drive, work=args.work),
        "detection": lambda: detection.run(size=args.size, repeats=args.repeats, workers=args.workers or 2,
                                           drive=args.drive, work=args.work),
        "stream": lambda: streaming.run(size=args.size, repeats=args.repeats, batch_size=args.batch_size,
                                        workers=args.workers or 2, mirror_to_disk=args.mirror_to_disk,
                                        cache_fractions=args.cache_fraction, drive=args.drive, work=args.work,
                                        with_streaming=chosen is None or peers.MOSAICML_STREAMING in chosen),
    }


def run(args: argparse.Namespace) -> int:
    """Run the scenarios ``args`` name, print the tables, write the files; 0 on success.

    Raises:
        ValueError: an unknown peer name, or a bad ``--size``/``--repeats``.
    """
    from colabfast.drivesim.fs import DriveSimParams
    from colabfast.tools.bench import report

    if args.size <= 0 or args.repeats < 1:
        raise ValueError(f"need --size > 0 and --repeats >= 1, got {args.size} and {args.repeats}")
    jobs = _scenarios(args)
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    machine = report.machine()
    print(f"colabfast bench on {report.machine_line(machine)}", flush=True)
    started = time.perf_counter()
    for name in names:
        print(f"colabfast bench: {name} (size {args.size}, {args.repeats} repeats) ...", flush=True)
        rows = jobs[name]()
        print(report.markdown(rows), flush=True)
        results += rows
    settings = {"scenarios": list(names), "size": args.size, "repeats": args.repeats, "workers": args.workers,
                "batch_size": args.batch_size, "peers": args.peers, "drive": DriveSimParams(**args.drive).live(),
                "mirror_to_disk": args.mirror_to_disk, "cache_fraction": list(args.cache_fraction),
                "seconds": round(time.perf_counter() - started, 1)}
    md = out / "bench.md"
    md.write_text(f"# colabfast bench\n\n`{_command(args)}` on {report.machine_line(machine)}\n\n"
                  + report.markdown(results), encoding="utf-8")
    written = [md, report.to_json(results, out / "bench.json", settings=settings, command=_command(args),
                                  machine_info=machine)]
    try:
        written.append(report.plot(results, out / "bench.png", title=f"colabfast bench ({_command(args)})"))
    except ModuleNotFoundError as exc:
        print(f"colabfast bench: no chart: {exc.name} is not installed "
              f"(pip install {exc.name}, or pip install \".[bench]\" from a clone)")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _command(args: argparse.Namespace) -> str:
    parts = ["colabfast bench", args.scenario, f"--size {args.size:g}", f"--repeats {args.repeats}"]
    if args.workers is not None:
        parts.append(f"--workers {args.workers}")
    if args.batch_size != 64:
        parts.append(f"--batch-size {args.batch_size}")
    if args.peers is not None:
        parts.append(f"--peers {args.peers}")
    if args.scenario in ("stream", "all") and (args.mirror_to_disk, args.cache_fraction) != (3.0, (0.8,)):
        parts.append(f"--mirror-to-disk {args.mirror_to_disk:g} --cache-fraction "
                     + ",".join(f"{f:g}" for f in args.cache_fraction))
    if args.drive:
        parts.append("--drive " + ",".join(f"{k}={v:g}" for k, v in args.drive.items()))
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """``python -m colabfast.tools.bench.cli [ARGS]``: the same as ``colabfast bench [ARGS]``."""
    parser = build_parser(argparse.ArgumentParser(prog="colabfast bench"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
