"""The ``colabfast`` command: ``stage``, ``ramdisk``, ``pack``, ``info``, ``drivesim``, ``demo``, ``bench``,
``doctor``."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Iterator, Optional

from colabfast.errors import Error

__all__ = ["main", "build_parser"]


def _stage(args: argparse.Namespace) -> int:
    from colabfast.staging.pipeline import stage

    out = stage(args.src, args.dst, to="ram" if args.ram else "auto", workers=args.workers, verify=args.verify,
                retries=args.retries, progress=not args.quiet, overwrite=args.overwrite,
                allow_links=args.allow_links)
    print(out)
    return 0


def _pack(args: argparse.Namespace) -> int:
    from colabfast.packing import pack

    size = args.image_size
    image_size = None if size is None else (size[0] if len(size) == 1 else (size[0], size[1]))
    pack(args.src, args.dst, layout=args.layout, labels=args.labels, split=args.split, year=args.year, store=args.store,
         image_size=image_size, quality=args.quality, shuffle=args.shuffle, seed=args.seed, workers=args.workers,
         on_error="skip" if args.skip_errors else "raise", retries=args.retries, progress=not args.quiet,
         overwrite=args.overwrite)
    print(args.dst)
    return 0


def _open(args: argparse.Namespace) -> int:
    from colabfast.opening.opener import open_dataset

    size = args.image_size
    image_size = None if size is None else (size[0] if len(size) == 1 else (size[0], size[1]))
    options = {"layout": args.layout} if args.layout != "auto" else {}
    if args.store != "encoded":
        options["store"] = args.store
    if args.labels is not None:
        options["labels"] = args.labels
    dataset = open_dataset(args.path, args.split, image_size=image_size, mirrors=args.mirrors, to=args.to,
                           progress=not args.quiet, **options)
    print(dataset.path)
    return 0


def _info(args: argparse.Namespace) -> int:
    from colabfast.mirror.verify import info, verify

    print(info(args.mirror))
    if args.verify:
        n = verify(args.mirror, progress=True)
        print(f"  verified: the {n} samples match their checksums, their declared sizes and kinds")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from colabfast.tools.demo import main

    return main(quick=args.quick)


def _doctor(args: argparse.Namespace) -> int:
    from colabfast.diagnosis.doctor import describe

    print(describe(args.data))
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    import torch

    from colabfast.datasets.dropins import H5ImageFolder
    from colabfast.diagnosis.report import diagnose
    from colabfast.images import transforms as T
    from colabfast.loading.loader import DataLoader
    from colabfast.opening.opener import open_dataset

    cuda = torch.cuda.is_available()
    ds = open_dataset(args.path, output="bytes" if cuda else "tensor", progress=not args.quiet)
    classify = isinstance(ds, H5ImageFolder)
    crop: Any = T.Compose([T.RandomResizedCrop(args.crop), T.RandomHorizontalFlip()])
    if not cuda:  # per image in the reader threads, fused with decoding
        from torchvision.transforms import v2

        crop = v2.Compose([v2.RandomResizedCrop(args.crop, antialias=True), v2.RandomHorizontalFlip()])
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        transform=crop if classify else None, mean=(0.485, 0.456, 0.406) if classify else None,
                        std=(0.229, 0.224, 0.225) if classify else None,
                        dtype=torch.bfloat16 if classify and cuda else None,
                        memory_format=torch.channels_last if classify else None)
    step = None
    if args.model != "none":
        if not classify:
            raise ValueError(f"--model trains a classifier, and {args.path} opens as {type(ds).__name__}: "
                             "leave --model out to measure the loader alone")
        step = _classifier_step(args.model, len(ds.classes) or 1, loader.device)
    if not args.quiet:
        print(repr(loader))
    diagnose(loader, step, steps=args.steps, warmup=min(5, args.steps))
    return 0


def _classifier_step(arch: str, classes: int, device: Any) -> Any:
    """One training step of torchvision's ``arch`` (SGD; bf16 autocast on CUDA) on ``(images, labels)``."""
    import torch
    import torchvision

    model = getattr(torchvision.models, arch)(num_classes=classes).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(batch: Any) -> None:
        x, y = batch
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _ramdisk(args: argparse.Namespace) -> int:
    from colabfast.where.tmpfs import ramdisk, release_ramdisk

    if args.release:
        where = args.path or "the default RAM disk"
        print(f"released {where}" if release_ramdisk(args.path) else f"no RAM disk to release at {where}")
    else:
        print(ramdisk(args.size, args.path))
    return 0


def _drivesim(args: argparse.Namespace) -> int:
    from colabfast.drivesim.simulator import cli

    return cli(args)


class _LayoutChoices:
    """``--layout``'s choices: ``auto`` and the registered layouts (:mod:`colabfast.layouts.registry`,
    the archives' among them). Looked up when argparse checks a value or prints a command's usage, so
    that ``colabfast --help`` imports neither the layouts nor numpy."""

    def _names(self) -> list[str]:
        from colabfast.layouts import REGISTRY

        return ["auto", *REGISTRY]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()


_PACK_LAYOUTS = _LayoutChoices()


class _Version(argparse.Action):
    """``--version``: the version, then the install check the README gives: every package colabfast
    imports, and the torch/torchvision pair (:func:`colabfast.where.env.install_problems`); exit 1 with
    what is broken and the fix."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from colabfast import __version__
        from colabfast.where.env import install_problems

        print(f"colabfast {__version__}", flush=True)
        problems = install_problems()
        for problem in problems:
            print(f"colabfast cannot work in this Python: {problem}", file=sys.stderr)
        parser.exit(1 if problems else 0)


# What --labels and --split mean, by layout: the same for pack and open (which packs what it opens)
_LABELS_HELP = ("coco: the annotation JSON; csv: the table of labels; ImageNet's ILSVRC2012_devkit_t12.tar.gz: the "
                "labels of ILSVRC2012_img_val.tar (class names only for the training tar)")
_SPLIT_HELP = ("what to read, by layout: voc-*: the image set (train, val, trainval...; default train); yolo: the "
               "export's split folder (train, valid, test...; needed where it has several); coco: none (pass a "
               "Roboflow export's split folder, or --labels its JSON); Kaggle's ImageNet zip: train (default) or val; "
               "a folder of split folders (train/, val/...: torchvision's ImageFolder would take them for classes): "
               "the one to read; ImageNet's tars, imagefolder, segmentation, csv, files: none (each tar or folder is "
               "one split)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="colabfast",
        description="End the data-loading bottleneck of PyTorch training in Colab and Jupyter.",
    )
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print colabfast's version, and check that what it imports works here")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("open", help="a dataset (folder, archive or mirror) to a staged mirror, packing it once",
                       description="What colabfast.open_dataset does: find the mirror of a dataset folder or "
                                   "archive (packed by earlier runs, in colabfast-mirrors at the top of My Drive, "
                                   "or beside a source that is not on Drive), else pack it there and flush Drive; "
                                   "then stage the mirror to RAM or local disk. Prints what it did and why, then "
                                   "the staged mirror's path.")
    p.add_argument("path", help="dataset folder, archive, or mirror (.h5)")
    p.add_argument("--split", help=_SPLIT_HELP + "; kitti: the mirror's split to open, training (default) or testing")
    p.add_argument("--mirrors", metavar="DIR", help="folder of mirrors (default: colabfast-mirrors at the top of "
                                                    "My Drive, or beside the source)")
    p.add_argument("--to", choices=["auto", "disk", "ram", "stream"], default="auto",
                   help="where the mirror is staged (default auto: RAM in Colab when it fits, else disk); stream: "
                        "read in place through a bounded local cache, nothing staged")
    p.add_argument("--layout", choices=_PACK_LAYOUTS, default="auto", help="what PATH holds (default: detected)")
    p.add_argument("--labels", metavar="FILE", help=_LABELS_HELP)
    p.add_argument("--store", choices=["encoded", "raw"], default="encoded",
                   help="a new mirror keeps encoded files (default) or stores decoded pixels")
    p.add_argument("--image-size", type=int, nargs="+", metavar="N",
                   help="resize when packing: one number sets the short side, two set H W")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars, no account: only the path")
    p.set_defaults(run=_open)

    p = sub.add_parser("stage", help="copy a dataset (folder, file or archive) from Drive to local disk or RAM",
                       description="Copy a folder, file or archive (.zip, .tar[.gz|.bz2|.xz]) from a slow "
                                   "mount such as Google Drive to local disk or RAM; re-runs copy only what "
                                   "is missing. Prints the staged path (and, on stderr, when a re-run "
                                   "had nothing to copy).")
    p.add_argument("src", help="folder, file or archive to stage")
    p.add_argument("dst", nargs="?", help="destination (default: /content/<name> in Colab, else "
                                          "<tempdir>/colabfast-data-<uid>/<name>)")
    p.add_argument("--ram", action="store_true", help="stage into a tmpfs RAM disk")
    p.add_argument("--workers", type=int, help="files copied at once (default: 64 from FUSE mounts, else 16)")
    p.add_argument("--verify", choices=["size", "sha256"], default="size",
                   help="check sizes (default), or also SHA-256 of what was read and written")
    p.add_argument("--retries", type=int, default=5, help="retries per file for transient errors (default 5)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what is in DST (a folder colabfast did not stage, or another source's stage)")
    p.add_argument("--allow-links", action="store_true",
                   help="extract links in archives (refused by default); each must stay inside DST")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_stage)

    p = sub.add_parser("ramdisk", help="mount a tmpfs RAM disk to stage into, or release one",
                       description="Mount a tmpfs RAM disk (or reuse the one mounted) and print its path; "
                                   "with --release, unmount it, deleting what is on it, to free its RAM.")
    p.add_argument("size", nargs="?", help="most it may hold, e.g. 8G (default: the RAM colabfast may use)")
    p.add_argument("--path", help="mount point (default: /content/ramdisk in Colab, else "
                                  "<tempdir>/colabfast-data-<uid>/ramdisk)")
    p.add_argument("--release", action="store_true", help="unmount the RAM disk, deleting what is on it")
    p.set_defaults(run=_ramdisk)

    p = sub.add_parser("pack", help="pack an image dataset into one HDF5 mirror file",
                       description="Pack an ImageFolder, KITTI or plain folder of images, or an archive read "
                                   "as a stream (ImageNet's official tars, Kaggle's ImageNet zip, a tar/zip of "
                                   "an ImageFolder tree), into one HDF5 mirror (resumable; the destination may "
                                   "be on Drive).")
    p.add_argument("src", help="dataset folder or archive")
    p.add_argument("dst", help="mirror file to write, e.g. /content/drive/MyDrive/kitti.h5")
    p.add_argument("--layout", choices=_PACK_LAYOUTS, default="auto",
                   help="what src holds (default auto: detected); imagenet-* and kaggle-* are for archives")
    p.add_argument("--labels", metavar="FILE", help=_LABELS_HELP)
    p.add_argument("--split", help=_SPLIT_HELP)
    p.add_argument("--year", help="voc-*: the year (2007 to 2012, as torchvision's year) where the tree holds several")
    p.add_argument("--store", choices=["encoded", "raw"], default="encoded",
                   help="keep encoded files (default) or store decoded pixels")
    p.add_argument("--image-size", type=int, nargs="+", metavar="N",
                   help="resize: one number sets the short side, two set H W")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of resized images (default 90)")
    p.add_argument("--shuffle", action="store_true", help="store samples in a seeded random order")
    p.add_argument("--seed", type=int, default=0, help="the seed of --shuffle's order (default 0)")
    p.add_argument("--workers", type=int, help="decoding processes (default: CPU count)")
    p.add_argument("--skip-errors", action="store_true", help="leave unreadable images out instead of failing")
    p.add_argument("--retries", type=int, default=5, help="retries per read for transient errors (default 5)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the file at DST even if it is not a mirror of SRC (by default refused)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_pack)

    p = sub.add_parser("info", help="describe a mirror", description="Print a mirror's layout, counts, classes, "
                                                                      "sizes, completion and skipped files.")
    p.add_argument("mirror", help="the mirror file (.h5) to describe, e.g. /content/drive/MyDrive/kitti.h5")
    p.add_argument("--verify", action="store_true",
                   help="also read every stored image and check its checksum (format version 2)")
    p.set_defaults(run=_info)

    from colabfast.drivesim.simulator import build_parser as drivesim_parser

    p = drivesim_parser(sub.add_parser("drivesim", help="serve a folder as a simulated Google Drive (FUSE): "
                                                        "latency, bandwidth, faults"))
    p.set_defaults(run=_drivesim)

    p = sub.add_parser("demo", help="show the Drive bottleneck and the cure, measured on this machine",
                       description="Build 300 ImageNet-style JPEGs, serve them through the Drive simulator "
                                   "(FUSE), and time an epoch from Drive, staging, an epoch from local disk, "
                                   "packing, and an epoch from the mirror. About a minute.")
    p.add_argument("--quick", action="store_true",
                   help="40 small JPEGs instead of 300: every step in a few seconds (checks an install)")
    p.set_defaults(run=_demo)

    from colabfast.tools.bench import cli as bench_cli

    p = bench_cli.build_parser(sub.add_parser("bench", help="benchmark colabfast against what users would pick "
                                                            "instead: tables, JSON and a plot"))
    p.set_defaults(run=bench_cli.run)

    p = sub.add_parser("doctor", help="describe this machine (Colab, Drive, RAM, disk, GPU) and how to feed its GPU",
                       description="Describe this machine (Colab or not, Drive, RAM, disk, GPU) and give advice "
                                   "on feeding its GPU; with a data path, on where that data should live.")
    p.add_argument("data", nargs="?", help="your dataset folder or archive, for advice on where it lives")
    p.set_defaults(run=_doctor)

    p = sub.add_parser("diagnose", help="is training from this dataset waiting for data? (colabfast.diagnose)",
                       description="Open a dataset as open_dataset does (a mirror, folder or archive), feed it "
                                   "through colabfast.DataLoader with its defaults (a random crop and flip for "
                                   "classification, normalised; on a GPU decoded by nvJPEG), and measure with "
                                   "colabfast.diagnose: the loader alone, or with --model a training step of a "
                                   "torchvision model, and the share of each step that waits for data, with the fix.")
    p.add_argument("path", help="dataset folder, archive, or mirror (.h5)")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    p.add_argument("--crop", type=int, default=224, help="RandomResizedCrop size for classification (default 224)")
    p.add_argument("--steps", type=int, default=30, help="batches measured after 5 warm-up batches (default 30)")
    p.add_argument("--model", default="none", help="a torchvision classifier to train, e.g. resnet50 (default none: "
                                                   "the loader alone)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars, no loader description")
    p.set_defaults(run=_diagnose)
    return parser


# How the library's messages name an option -> how this command spells it.
_CLI_SPELLING = {"pass on_error='skip'": "pass --skip-errors", "overwrite=True": "--overwrite",
                 "allow_links=True": "--allow-links", "labels= and split=": "--labels and --split",
                 "pass labels='.../ILSVRC2012_devkit_t12.tar.gz'": "pass --labels .../ILSVRC2012_devkit_t12.tar.gz",
                 "pass labels=devkit": "pass --labels DEVKIT", "(image_size=...)": "(--image-size N)",
                 "with layout='csv' and labels=": "with --layout csv --labels ", "pass labels= the table":
                 "pass --labels TABLE",
                 "with layout='coco' and labels=": "with --layout coco --labels ",
                 "run pack() again": "run the same command again", "then pack() again": "then run the same "
                 "command again", "colabfast.pack()": "colabfast pack", "pack()": "colabfast pack"}


def _cli_words(message: str) -> str:
    for api, cli in _CLI_SPELLING.items():
        message = message.replace(api, cli)
    return message


def _warn_in_one_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings on the command line: one line each, no source line (they are meant for the user)."""
    print(f"colabfast: warning: {_cli_words(str(message))}", file=sys.stderr if file is None else file)


def main(argv: Optional[list[str]] = None) -> int:
    import warnings

    args = build_parser().parse_args(argv)
    warnings.showwarning = _warn_in_one_line
    if args.command in ("pack", "open") and args.image_size is not None and len(args.image_size) > 2:
        build_parser().error("--image-size takes one number (short side) or two (H W)")
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except (Error, OSError, ValueError) as exc:
        print(f"colabfast {args.command}: {_cli_words(str(exc))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
