"""The trainers' pages (docs/trainers.md), measured: for each trainer, one epoch of a tiny real training
loop on CPU built the way its users build it, and built with the lines docs/trainers.md changes, on the
same data in the same run; the ratio is samples/s with colabfast over samples/s the original way.

- ``detection``: torchvision's detection references (``references/detection/train.py``, ``--use-v2``):
  ``CocoDetection`` + ``wrap_dataset_for_transforms_v2`` + images without annotations removed + a
  ``RandomSampler``/``BatchSampler`` + torch ``DataLoader(num_workers=2, collate_fn=utils.collate_fn)``,
  against ``cf.open_dataset(..., layout="coco", output="tensor")`` wrapped the same way + ``cf.DataLoader``
  with the same batch sampler and collate.
- ``timm``: ``timm.data.create_dataset`` + ``create_loader(is_training=True, use_prefetcher=False,
  num_workers=2)`` (no colour jitter, so both ways do the same random-resized crop, flip and normalize),
  against ``cf.open_dataset(output="tensor", transform=v2 crop + flip)`` + ``cf.DataLoader(mean=, std=)``.
- ``lightning``: a ``LightningDataModule`` over torchvision ``ImageFolder`` + torch ``DataLoader(num_workers=2)``,
  against one over ``cf.open_dataset`` + ``cf.DataLoader``; the second epoch of a two-epoch ``Trainer.fit``
  (timed by a callback).
- ``hf``: ``transformers.Trainer`` on ``load_dataset("imagefolder", ...)`` with ``set_transform``
  (``dataloader_num_workers=2``), against the same ``Trainer`` given ``cf.open_dataset(that dataset)``
  (an ``H5Dataset``, ``output="tensor"``), and a ``Trainer`` whose ``get_train_dataloader`` returns a
  ``cf.DataLoader``; the second epoch of a two-epoch ``Trainer.train`` (timed by a callback).

The model is a tiny convnet on 64x64 crops (detection: a corner of each image), run on one intra-op
thread (``--threads``), so the epoch's time is the data path's plus the trainer's own overhead. Data are
written by ``colabfast.testing`` (photo-like JPEGs of about 500x375) into a temporary folder on local disk;
the mirrors are packed there before the clock starts (the time printed once). A library that is not
installed is skipped with the reason printed. Every figure is a median of ``--repeats`` epochs, the ways
taking turns; one epoch of each way (worker start-up, first reads) is run before and not counted.

    python benchmarks/trainers.py                       # all four, about 3 minutes on 2 CPUs
    python benchmarks/trainers.py --only timm,lightning --images 400 --repeats 5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

import colabfast as cf
from colabfast.testing.data import make_imagefolder
from colabfast.testing.layouts import make_coco

CROP = 64
BATCH = 32
WORKERS = 2  # what the references' -j, timm's --workers and the Lightning / HF examples are given on Colab's 2 CPUs
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def tiny_net(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, classes)
    )


def missing(*modules: str) -> str:
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(absent)} (pip install {' '.join(absent)})" if absent else ""


def turns(ways: dict[str, Callable[[], Any]], repeats: int) -> dict[str, tuple[float, int]]:
    """Each way's median seconds for one epoch and its samples, the ways taking turns; one warm-up each. A way
    returns its samples (the call is timed), or ``(seconds, samples)`` of an epoch its trainer timed."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    counts: dict[str, int] = {}
    for epoch in ways.values():
        epoch()
    for r in range(repeats):
        for name in list(ways)[:: 1 if r % 2 == 0 else -1]:
            t = time.perf_counter()
            got = ways[name]()
            seconds = time.perf_counter() - t
            if isinstance(got, tuple):  # timed by the trainer's own epoch hooks
                seconds, got = got
            counts[name] = got
            times[name].append(seconds)
    return {name: (statistics.median(ts), counts[name]) for name, ts in times.items()}


def report(trainer: str, results: dict[str, tuple[float, int]], baseline: str) -> None:
    base_s, base_n = results[baseline]
    for name, (s, n) in results.items():
        ratio = (n / s) / (base_n / base_s)
        mark = "" if name == baseline else f"  ratio {ratio:.2f}x"
        print(f"  {trainer:9s} {name:52s} {n:5d} samples  {s:6.2f} s  {n / s:7.1f} samples/s{mark}")
    sys.stdout.flush()


# --- torchvision's detection references ------------------------------------------------------------


def detection(work: Path, images: int, repeats: int) -> None:
    if why := missing("torchvision", "pycocotools"):
        print(f"  detection skipped: {why}")
        return
    import torchvision
    from torchvision.datasets import wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2

    img_folder = work / "coco" / "train2017"
    ann_file = work / "coco" / "annotations" / "instances_train2017.json"
    make_coco(img_folder, images, vary=0.2, ann_file=ann_file)
    target_keys = ["boxes", "labels", "image_id"]

    def remove_images_without_annotations(dataset: Any) -> Any:  # coco_utils._coco_remove_images_without_annotations
        keep = [i for i, img_id in enumerate(dataset.ids) if dataset.coco.getAnnIds(imgIds=img_id, iscrowd=None)]
        return torch.utils.data.Subset(dataset, keep)

    def collate_fn(batch: list) -> tuple:  # references/detection/utils.py
        return tuple(zip(*batch))

    t = time.perf_counter()
    mirror = cf.open_dataset(
        img_folder, layout="coco", labels=ann_file, output="tensor", mirrors=work / "mirrors", progress=False
    )
    print(f"  detection (once: packing the mirror of {images} images took {time.perf_counter() - t:.1f} s)")

    torch.manual_seed(0)
    backbone = tiny_net(8)
    optimizer = torch.optim.SGD(backbone.parameters(), lr=0.01)

    def epoch(loader: Any) -> int:  # engine.train_one_epoch's shape: lists of images and of target dicts
        n = 0
        for images_, targets in loader:
            # a corner of each image: the model is not what is measured
            batch = torch.stack([im[:, :CROP, :CROP] for im in images_]).float()
            labels = torch.tensor([int(t["labels"][0]) if len(t["labels"]) else 0 for t in targets])
            loss = nn.functional.cross_entropy(backbone(batch), labels % 8)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n += len(images_)
        return n

    def batch_sampler(dataset: Any) -> Any:
        return torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(dataset), 8, drop_last=True)

    # references/detection/presets.py DetectionPresetTrain(data_augmentation="hflip", use_v2=True): float images
    # made in the workers. (uint8 images to the loop, ToDtype moved into the training step, measured the same
    # ratio on 2026-11-28: 1.01x, benchmarks/README.md.)
    transforms = v2.Compose(
        [
            v2.ToImage(),
            v2.RandomHorizontalFlip(0.5),
            v2.ToDtype(torch.float, scale=True),
            v2.SanitizeBoundingBoxes(),
            v2.ToPureTensor(),
        ]
    )
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        theirs = torchvision.datasets.CocoDetection(str(img_folder), str(ann_file), transforms=transforms)
        theirs = remove_images_without_annotations(wrap_dataset_for_transforms_v2(theirs, target_keys=target_keys))
    ours = mirror
    ours.transforms = transforms  # what CocoDetection(..., transforms=transforms) sets; the wrapper takes it over
    ours = remove_images_without_annotations(wrap_dataset_for_transforms_v2(ours, target_keys=target_keys))
    loader_theirs = torch.utils.data.DataLoader(
        theirs, batch_sampler=batch_sampler(theirs), num_workers=WORKERS, collate_fn=collate_fn, persistent_workers=True
    )
    loader_ours = cf.DataLoader(ours, batch_sampler=batch_sampler(ours), collate_fn=collate_fn)
    baseline = "CocoDetection + DataLoader(num_workers=2)"
    results = turns(
        {baseline: lambda: epoch(loader_theirs), "open_dataset + cf.DataLoader": lambda: epoch(loader_ours)}, repeats
    )
    report("detection", results, baseline)


# --- timm ------------------------------------------------------------------------------------------


def timm_(work: Path, folder: Path, repeats: int) -> None:
    if why := missing("timm"):
        print(f"  timm skipped: {why}")
        return
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_dataset, create_loader
    from torchvision.transforms import v2

    classes = len([p for p in folder.iterdir() if p.is_dir()])
    torch.manual_seed(0)
    model = tiny_net(classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def epoch(loader: Any) -> int:  # timm train.py's train_one_epoch, without the extras
        n = 0
        for input_, target in loader:
            loss = nn.functional.cross_entropy(model(input_), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n += len(target)
        return n

    dataset_train = create_dataset("", root=str(folder), split="train", is_training=True)
    loader_theirs = create_loader(
        dataset_train,
        input_size=(3, CROP, CROP),
        batch_size=BATCH,
        is_training=True,
        color_jitter=0.0,
        num_workers=WORKERS,
        use_prefetcher=False,
        device=torch.device("cpu"),
    )
    train = cf.open_dataset(
        folder,
        output="tensor",
        mirrors=work / "mirrors",
        progress=False,
        transform=v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()]),
    )
    loader_ours = cf.DataLoader(
        train, batch_size=BATCH, shuffle=True, drop_last=True, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD
    )
    results = turns(
        {
            "create_dataset + create_loader(num_workers=2)": lambda: epoch(loader_theirs),
            "open_dataset + cf.DataLoader": lambda: epoch(loader_ours),
        },
        repeats,
    )
    report("timm", results, "create_dataset + create_loader(num_workers=2)")


# --- Lightning -------------------------------------------------------------------------------------


def lightning_(work: Path, folder: Path, repeats: int) -> None:
    if why := missing("lightning"):
        print(f"  lightning skipped: {why}")
        return
    import lightning as L
    import torchvision
    from torchvision.transforms import v2

    classes = len([p for p in folder.iterdir() if p.is_dir()])
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_net(classes)
            self.seen = 0

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            self.seen += len(y)
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class FolderData(L.LightningDataModule):  # what users have: ImageFolder + DataLoader
        def setup(self, stage: str) -> None:
            self.train = torchvision.datasets.ImageFolder(
                str(folder),
                transform=v2.Compose(
                    [
                        v2.RandomResizedCrop(CROP, antialias=True),
                        v2.RandomHorizontalFlip(),
                        v2.ToImage(),
                        v2.ToDtype(torch.float32, scale=True),
                        v2.Normalize(MEAN, STD),
                    ]
                ),
            )

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(
                self.train, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=WORKERS, persistent_workers=True
            )

    class MirrorData(L.LightningDataModule):  # the page's: open_dataset + cf.DataLoader
        def setup(self, stage: str) -> None:
            self.train = cf.open_dataset(
                folder,
                output="tensor",
                mirrors=work / "mirrors",
                progress=False,
                transform=v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()]),
            )

        def train_dataloader(self) -> Any:
            return cf.DataLoader(self.train, batch_size=BATCH, shuffle=True, drop_last=True, mean=MEAN, std=STD)

    class EpochClock(L.Callback):
        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            self.start, self.seen = time.perf_counter(), module.seen

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            self.seconds, self.samples = time.perf_counter() - self.start, module.seen - self.seen

    def fit(data: Any) -> tuple[float, int]:  # the second epoch of a two-epoch fit: workers started, files read once
        torch.manual_seed(0)
        model, clock = Net(), EpochClock()
        trainer = L.Trainer(
            max_epochs=2,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[clock],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, datamodule=data)
        return clock.seconds, clock.samples

    results = turns(
        {
            "ImageFolder + DataLoader(num_workers=2)": lambda: fit(FolderData()),
            "open_dataset + cf.DataLoader": lambda: fit(MirrorData()),
        },
        repeats,
    )
    report("lightning", results, "ImageFolder + DataLoader(num_workers=2)")


# --- Hugging Face Trainer --------------------------------------------------------------------------


def hf(work: Path, folder: Path, repeats: int) -> None:
    if why := missing("transformers", "datasets", "accelerate"):
        print(f"  hf skipped: {why}")
        return
    import datasets
    import transformers
    from torchvision.transforms import v2

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.logging.set_verbosity_error()
    ds = datasets.load_dataset("imagefolder", data_dir=str(folder), split="train", cache_dir=str(work / "hf-cache"))
    classes = ds.features["label"].num_classes
    augment = v2.Compose(
        [
            v2.RandomResizedCrop(CROP, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )

    def preprocess_train(batch: dict) -> dict:  # the image-classification example's set_transform, batched
        return {"pixel_values": [augment(im.convert("RGB")) for im in batch["image"]], "labels": batch["label"]}

    def preprocess_one(sample: dict) -> dict:  # the same for one sample (H5Dataset's transform takes one, a tensor)
        return {"pixel_values": augment(sample["image"]), "labels": sample["label"]}

    def collate_fn(examples: list) -> dict:
        return {
            "pixel_values": torch.stack([e["pixel_values"] for e in examples]),
            "labels": torch.tensor([e["labels"] for e in examples]),
        }

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_net(classes)

        def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict:
            return {"loss": nn.functional.cross_entropy(self.net(pixel_values), labels)}

    class CfTrainer(transformers.Trainer):
        def get_train_dataloader(self) -> Any:
            return cf.DataLoader(
                self.train_dataset,
                batch_size=self.args.train_batch_size,
                shuffle=True,
                collate_fn=self.data_collator,
                drop_last=self.args.dataloader_drop_last,
            )

    class EpochClock(transformers.TrainerCallback):
        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start, self.step = time.perf_counter(), state.global_step

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.seconds, self.samples = time.perf_counter() - self.start, (state.global_step - self.step) * BATCH

    def fit(dataset: Any, trainer_class: type = transformers.Trainer) -> tuple[float, int]:  # the second epoch of two
        torch.manual_seed(0)
        clock = EpochClock()
        args = transformers.TrainingArguments(
            output_dir=str(work / "hf-out"),
            per_device_train_batch_size=BATCH,
            num_train_epochs=2,
            dataloader_drop_last=True,
            dataloader_num_workers=WORKERS,
            dataloader_persistent_workers=True,
            remove_unused_columns=False,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            learning_rate=0.01,
        )
        trainer = trainer_class(
            model=Net(), args=args, train_dataset=dataset, data_collator=collate_fn, callbacks=[clock]
        )
        with contextlib.redirect_stdout(io.StringIO()):  # Trainer prints its metrics dict
            trainer.train()
        return clock.seconds, clock.samples

    source = ds.with_transform(preprocess_train)
    t = time.perf_counter()
    h5 = cf.open_dataset(ds, output="tensor", mirrors=work / "mirrors", progress=False, transform=preprocess_one)
    packed = time.perf_counter() - t
    results = turns(
        {
            "load_dataset('imagefolder') + Trainer": lambda: fit(source),
            "open_dataset(hf dataset) + Trainer": lambda: fit(h5),
            "open_dataset(hf dataset) + Trainer(cf.DataLoader)": lambda: fit(h5, CfTrainer),
        },
        repeats,
    )
    report("hf", results, "load_dataset('imagefolder') + Trainer")
    print(f"  hf (once: packing the mirror of {len(ds)} rows took {packed:.1f} s)")


TRAINERS = ("detection", "timm", "lightning", "hf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400, help="images per dataset (default 400)")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per way (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the training loop")
    parser.add_argument("--only", default=",".join(TRAINERS), help=f"comma-separated subset of {','.join(TRAINERS)}")
    args = parser.parse_args()
    # the tiny model's steps on one intra-op thread: on 2 CPUs, two torch threads spinning on a step that takes
    # microseconds steal the cores the loaders need, for both ways alike; the loaders are what is measured
    torch.set_num_threads(args.threads)
    only = [t.strip() for t in args.only.split(",") if t.strip()]
    if unknown := set(only) - set(TRAINERS):
        parser.error(f"unknown trainers {sorted(unknown)}: choose from {', '.join(TRAINERS)}")
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.images} images, {args.repeats} timed epochs "
        f"per way, batch {BATCH} (detection 8), {CROP}x{CROP} crops, {args.threads} intra-op thread(s)"
    )
    with tempfile.TemporaryDirectory(prefix="colabfast-trainers-") as name:
        work = Path(name)
        folder = make_imagefolder(work / "train", classes=4, per_class=args.images // 4, size=(500, 375), vary=0.2)
        for trainer in only:
            t = time.perf_counter()
            if trainer == "detection":
                detection(work, args.images, args.repeats)
            elif trainer == "timm":
                timm_(work, folder, args.repeats)
            elif trainer == "lightning":
                lightning_(work, folder, args.repeats)
            else:
                hf(work, folder, args.repeats)
            print(f"  ({trainer}: {time.perf_counter() - t:.0f} s in all)")


if __name__ == "__main__":
    main()
