"""Tests for colabfast.tools.bench: every scenario runs at a tiny size and returns well-formed rows, and the
Markdown, JSON and PNG reports and the CLI are written and well-formed. Speed is never asserted here
(benchmarks/ and ``colabfast bench`` measure it); the simulated Drive runs with small latencies."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from colabfast.testing import data
from colabfast.tools.bench import cli, epoch, gpufeed, packing, peers, report, staging
from colabfast.tools.bench.timing import Result

ROOT = Path(__file__).resolve().parents[1]
# A quick Drive: the plumbing is what is tested, not the latency.
QUICK_DRIVE = {"open_ms": 5.0, "read_ms": 0.5, "mbps": 500.0}
# A peer that is never installed: its rows must carry a note instead of a number.
ABSENT = peers.Peer(name="Absent", module="colabfast_no_such_module", distribution="colabfast-no-such-dist",
                    docs="", decoder="", prepare=lambda *a: None, loader=lambda *a: [])


def check_rows(rows: list[Result], prefix: str) -> None:
    assert rows, "no rows"
    for r in rows:
        assert r.scenario.startswith(prefix) and r.method
        if r.seconds is None:
            assert r.note, f"{r.method}: a row without a figure must say why"
            continue
        assert r.seconds > 0 and r.low <= r.seconds <= r.high and r.repeats >= 1
        assert all(math.isfinite(v) and v >= 0 for v in r.metrics.values()), r


@pytest.mark.slow
@pytest.mark.fuse
def test_staging_scenario(need_fuse, tmp_path):
    rows = staging.run(size=0.004, repeats=1, drive=QUICK_DRIVE, work=tmp_path)
    check_rows(rows, "staging/")
    assert {r.scenario for r in rows} == {f"staging/{c}" for c in ("small-files", "large-file", "zip", "tar.gz",
                                                                   "rerun")}
    ours = [r for r in rows if r.method == "colabfast.stage"]
    assert len(ours) == 4 and all({"MB/s", "files/s", "link_fraction"} <= set(r.metrics) for r in ours)
    assert "cp -r" in {r.method for r in rows}
    assert [r.method for r in rows if r.scenario == "staging/rerun"] == [
        "colabfast.stage, nothing to copy", "colabfast.stage, nothing to copy, source on local disk"]


def test_staging_without_fuse_says_why(monkeypatch):
    from colabfast.drivesim import fs as simfs

    monkeypatch.setattr(simfs, "available", lambda: (False, "no /dev/fuse here"))
    rows = staging.run(size=0.004, cases=("small-files", "zip"))
    assert [(r.scenario, r.seconds) for r in rows] == [("staging/small-files", None), ("staging/zip", None)]
    assert all("no /dev/fuse here" in r.note for r in rows)


@pytest.mark.slow
@pytest.mark.fuse
def test_epoch_scenario(need_fuse, tmp_path):
    chosen = [peers.WEBDATASET, ABSENT]
    rows = epoch.run(size=0.01, repeats=1, image_sizes=("256px",), batch_size=8, num_workers=1, peers=chosen,
                     drive=QUICK_DRIVE, work=tmp_path, min_seconds=0.0)
    check_rows(rows, "epoch/256px/")
    by = {(r.scenario, r.method): r for r in rows}
    for source in ("local", "drive"):
        for method in ("torchvision ImageFolder", "naive h5 Dataset (vlen, num_workers=0)",
                       "colabfast encoded mirror", "colabfast raw mirror"):
            row = by[(f"epoch/256px/{source}", method)]
            assert row.seconds is not None, row.note
            # 20 images per epoch, however long it took
            assert row.metrics["images/s"] == pytest.approx(20 / row.seconds)
        assert "not installed" in by[(f"epoch/256px/{source}", "Absent")].note
    local = [r for r in rows if r.scenario == "epoch/256px/local"]
    ceilings = sorted(r.method for r in local if r.reference)
    assert [m.split(" (")[0] for m in ceilings] == ["decode-only ceiling", "decoded pixels in RAM"]
    encoded = by[("epoch/256px/local", "colabfast encoded mirror")]
    assert {"1st epoch s", "prep s", "disk MB"} <= set(encoded.metrics) and encoded.metrics["disk MB"] > 0
    staged = by[("epoch/256px/drive", "colabfast encoded mirror, staged first")]
    assert staged.seconds is not None and staged.metrics["Drive MB"] > 0
    wds = [r for r in local if r.method.startswith("WebDataset")]
    assert len(wds) == 1 and (wds[0].seconds is not None or "not installed" in wds[0].note)


def test_local_methods_take_turns_and_each_repeat_lasts_min_seconds(tmp_path, monkeypatch):
    """Issue 12: the local epochs ran each method's repeats back to back and lasted a fraction of a
    second; now the methods alternate round by round and a repeat is whole epochs of >= min_seconds."""
    import itertools
    import types

    log, clock = [], [0.0]
    monkeypatch.setattr(epoch, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    class Loader:
        def __init__(self, name):
            self.name = name

        def __iter__(self):
            log.append(self.name)
            clock[0] += 0.01  # every epoch takes 10 ms of the test's clock
            yield torch.zeros(2, 3, epoch.CROP, epoch.CROP, dtype=torch.uint8), None

    methods = [epoch._Method(n, open_loader=lambda root, cache, n=n: Loader(n), slow=n == "slow")
               for n in ("a", "b", "slow")]
    rows = epoch._local("epoch/x/local", methods, tmp_path, repeats=3, baseline_repeats=1, min_seconds=0.035)
    assert log[:3] == ["a", "b", "slow"]  # the untimed first epochs
    runs = [(name, len(list(group))) for name, group in itertools.groupby(log[3:])]
    assert [name for name, _ in runs] == ["a", "b", "slow", "a", "b", "a", "b"]
    assert all(epochs == 4 for _, epochs in runs)  # whole 10 ms epochs until 35 ms have passed
    by = {r.method: r for r in rows}
    assert by["a"].repeats == 3 and by["slow"].repeats == 1
    assert by["a"].seconds == pytest.approx(0.01) and by["a"].low <= by["a"].seconds <= by["a"].high
    assert by["a"].metrics["images/s"] == pytest.approx(200)


def test_a_peer_whose_crops_are_views_also_gets_a_row_made_dense(tmp_path):
    """FFCV runs a torch transform on whole batches, so its CenterCrop yields strided views of the
    uncropped batches; the epoch bench also times them made dense, as a reference row."""
    from torchvision.transforms import v2

    def loader(out, transform, batch_size, workers, cache):
        full = torch.randint(0, 256, (2, 256, 256, 3), dtype=torch.uint8).permute(0, 3, 1, 2)  # channels-last
        return [(transform(full), torch.zeros(2, dtype=torch.int64))] * 3

    views = peers.Peer(name="Views", module="torch", distribution="torch", docs="", decoder="none",
                       prepare=lambda *a: None, loader=loader, views=True)
    x, _ = next(iter(loader(None, v2.CenterCrop(epoch.CROP), 2, 1, None)))
    assert not x.is_contiguous(memory_format=torch.channels_last)  # what FFCV yields
    dense, _ = next(iter(epoch.Dense([(x, None)])))
    assert dense.is_contiguous(memory_format=torch.channels_last) and torch.equal(dense, x)

    rows = epoch.run(size=0.01, repeats=1, image_sizes=("256px",), sources=("local",), batch_size=8,
                     num_workers=1, peers=[views, ABSENT], work=tmp_path, min_seconds=0.0)
    check_rows(rows, "epoch/256px/local")
    by = {r.method.split(" ")[0] + (" dense" if "made dense" in r.method else ""): r for r in rows}
    assert not by["Views"].reference and by["Views"].metrics["images/s"] == pytest.approx(6 / by["Views"].seconds)
    made = by["Views dense"]
    assert made.reference and made.seconds is not None
    assert made.method == f"Views {views.version()}, each batch made dense"
    assert "contiguous" in made.note and "disk MB" not in made.metrics
    assert [r.method for r in rows if r.method.startswith("Absent")] == ["Absent"]  # not a view: no such row


def test_epoch_rejects_unknown_image_size():
    with pytest.raises(ValueError, match="unknown image size"):
        epoch.run(image_sizes=("1024px",))


def test_epoch_batches_must_match(tmp_path):
    good = [(torch.zeros(4, 3, epoch.CROP, epoch.CROP, dtype=torch.uint8), torch.zeros(4))]
    assert epoch._epoch(good) == 4
    with pytest.raises(RuntimeError, match="uint8 images"):
        epoch._epoch([(torch.zeros(4, 3, 256, 256, dtype=torch.uint8), torch.zeros(4))])


@pytest.mark.slow
def test_coldreads_scenario(need_fuse, tmp_path):
    from colabfast.tools.bench import coldreads

    rows = coldreads.run(size=0.01, repeats=1, batch_size=16, drive=QUICK_DRIVE, work=tmp_path)
    check_rows(rows, "cold-reads/")
    assert {r.method for r in rows} == {"torch RandomSampler", "colabfast.BlockShuffleSampler(64)"}
    assert {r.scenario for r in rows} == {"cold-reads/bytes", "cold-reads/tensor"}
    assert all(r.metrics["reads/epoch"] > 0 for r in rows)  # the simulator served them


def test_loader_scenario(tmp_path):
    from colabfast.tools.bench import loader

    rows = loader.run(size=0.01, repeats=1, batch_size=16, num_workers=1, work=tmp_path)
    check_rows(rows, "loader/cpu")
    assert [r.method for r in rows] == ["torch DataLoader, defaults", "torch DataLoader, hand-tuned",
                                        "colabfast.DataLoader, its defaults", "colabfast.DataLoader, worker processes"]
    assert "reader threads" in rows[2].note and "num_workers=1" in rows[3].note


def test_pack_scenario(tmp_path):
    rows = packing.run(size=0.01, repeats=1, modes=(("encoded", None), ("raw", 256)), workers=1, work=tmp_path)
    check_rows(rows, "pack/500x375")
    encoded, raw = rows
    assert encoded.method == "colabfast.pack store='encoded'" and raw.method.endswith("image_size=256")
    # raw pixels of 500x375 shrunk to a 256 px short side: 341x256x3 bytes each, 20 images
    assert raw.metrics["mirror MB"] == pytest.approx(20 * 341 * 256 * 3 / 1e6, rel=0.05)
    assert encoded.metrics["x source"] == pytest.approx(1.0, abs=0.1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the rows written where there is no GPU")
def test_gpu_scenario_without_cuda_says_so():
    rows = gpufeed.run(size=0.01)
    assert [r.method for r in rows] == [*gpufeed.IMAGENET_METHODS, *gpufeed.METHODS]
    assert all(r.seconds is None and "no CUDA GPU" in r.note for r in rows)


@pytest.mark.cuda
def test_gpu_scenario(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rows = gpufeed.run(size=0.05, repeats=1, batch_size=16, steps=3, work=tmp_path)
    check_rows(rows, "gpu/")
    assert {r.scenario for r in rows} == {"gpu/resnet50-imagenet", "gpu/resnet18"}
    measured = [r for r in rows if "DALI" not in r.method or r.seconds is not None]  # DALI is optional
    assert len(measured) >= len(rows) - 1
    assert all(r.seconds is not None and 0 <= r.metrics["data wait %"] <= 100 for r in measured), rows


def test_dali_source_gives_each_epoch_a_permutation_of_the_mirror_in_whole_batches(tmp_path):
    """DALI's external_source callback (batch_info=True: epoch_idx and iteration), checked without
    DALI: each epoch is a permutation of the mirror's files and labels, whole batches only."""
    from types import SimpleNamespace

    from colabfast.datasets.dropins import H5ImageFolder
    from colabfast.packing import pack
    from colabfast.testing import data

    tree = data.make_imagefolder(tmp_path / "tree", classes=3, per_class=5, size=(40, 30))
    mirror = pack(tree, tmp_path / "m.h5", workers=1, progress=False)
    source, ds = gpufeed.DaliSource(mirror, batch=4), H5ImageFolder(mirror, output="bytes")
    expected = {bytes(ds[i][0].numpy()): ds[i][1] for i in range(len(ds))}
    epochs = []
    for epoch_idx in (0, 1):
        seen, iteration = [], 0
        while True:
            try:
                files, labels = source(SimpleNamespace(epoch_idx=epoch_idx, iteration=iteration))
            except StopIteration:
                break
            assert len(files) == len(labels) == 4 and all(f.dtype.name == "uint8" for f in files)
            seen += [(bytes(f), int(label[0])) for f, label in zip(files, labels)]
            iteration += 1
        assert iteration == len(ds) // 4 and len(set(seen)) == len(seen)
        assert all(expected[f] == label for f, label in seen)
        epochs.append(seen)
    assert epochs[0] != epochs[1]  # a new order each epoch


def test_fast_collate_keeps_uint8():
    images, labels = gpufeed.fast_collate([(torch.full((3, 4, 4), i, dtype=torch.uint8), i) for i in range(3)])
    assert images.dtype == torch.uint8 and images.shape == (3, 3, 4, 4) and labels.tolist() == [0, 1, 2]


def test_peers_by_name():
    assert [p.name for p in peers.by_name(["WebDataset", "ffcv"])] == ["WebDataset", "FFCV (jpg)", "FFCV (raw)"]
    assert peers.by_name(["mosaicml-streaming"]) == [peers.MOSAICML_STREAMING]
    with pytest.raises(ValueError, match="unknown peer"):
        peers.by_name(["tfrecord"])
    assert "pip install colabfast-no-such-dist" in ABSENT.missing()


def sample_rows() -> list[Result]:
    return [
        Result("epoch/x", "torchvision ImageFolder", 4.0, 3.5, 4.5, 3, {"images/s": 50.0}),
        Result("epoch/x", "colabfast encoded mirror", 1.0, 0.9, 1.2, 3, {"images/s": 200.0, "disk MB": 1.5},
               note="a caveat"),
        Result("epoch/x", "WebDataset", 2.0, 2.0, 2.0, 3, {"images/s": 100.0}),
        Result("epoch/x", "FFCV", None, note="not installed (pip install ffcv)"),
        Result("epoch/x", "decode-only ceiling", 0.5, 0.5, 0.5, 3, {"images/s": 400.0}, reference=True),
        Result("staging/y", "colabfast.stage", 2.0, 2.0, 2.0, 1, {"MB/s": 10.0}),
        Result("staging/y", "cp -r", 20.0, 20.0, 20.0, 1, {"MB/s": 1.0}),
        Result("gpu/z", "plain DataLoader", None, note="no CUDA GPU here"),
    ]


def test_markdown_ratios_and_notes():
    text = report.markdown(sample_rows())
    assert "| method | seconds (min-max) | images/s | disk MB | colabfast speed-up |" in text
    assert "| torchvision ImageFolder | 4.00 (3.50-4.50) | 50.0 |  | 4.0x |" in text
    assert "| FFCV | not installed (pip install ffcv) |" in text
    assert "decode-only ceiling (reference)" in text
    # the ceiling is a reference, not the best alternative: WebDataset is
    assert "vs the best alternative (WebDataset): **2.00x**" in text
    assert "vs the best alternative (cp -r): **10.00x**" in text
    assert text.count("a caveat") == 1


def test_json_has_every_figure_and_the_machine(tmp_path):
    path = report.to_json(sample_rows(), tmp_path / "bench.json", settings={"size": 0.01})
    doc = json.loads(path.read_text())
    assert doc["schema"] == report.SCHEMA and doc["settings"] == {"size": 0.01}
    assert doc["machine"]["cpus"] >= 1 and "torch" in doc["machine"]["packages"] and doc["machine"]["describe"]
    assert len(doc["results"]) == len(sample_rows())
    row = next(r for r in doc["results"] if r["method"] == "colabfast encoded mirror")
    assert row["metrics"] == {"images/s": 200.0, "disk MB": 1.5} and row["vs_best_alternative"] == 2.0
    assert row["low"] == 0.9 and row["high"] == 1.2 and row["repeats"] == 3
    summary = {s["scenario"]: s for s in doc["summary"]}
    assert summary["staging/y"]["speedup_vs_best_alternative"] == pytest.approx(10.0)
    assert summary["gpu/z"]["colabfast"] is None


def test_png_chart(tmp_path):
    import matplotlib.image

    path = report.plot(sample_rows(), tmp_path / "bench.png")
    pixels = matplotlib.image.imread(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pixels.ndim == 3 and pixels.shape[0] > 300


@pytest.mark.slow
@pytest.mark.fuse
def test_pack_archive_scenario(need_fuse, tmp_path):
    rows = packing.run_archive(size=0.01, repeats=1, workers=1, image_size=64, work=tmp_path)
    check_rows(rows, "pack/archive")
    pack, cpu, link = rows
    assert cpu.reference and link.reference and not pack.reference
    bound = min(cpu.metrics["images/s"], link.metrics["images/s"])
    assert pack.metrics["x bound"] == pytest.approx(pack.metrics["images/s"] / bound)
    assert "bound = " in pack.note
    # The parts move into the mirror: the mirror and a part or two at most, never twice the mirror.
    assert 0.9 * pack.metrics["mirror MB"] <= pack.metrics["peak disk MB"] <= pack.metrics["mirror MB"] + 1


@pytest.mark.slow
@pytest.mark.fuse
def test_open_scenario(need_fuse, tmp_path):
    from colabfast.tools.bench import opening

    rows = opening.run(size=0.01, repeats=1, batch_size=4, drive=QUICK_DRIVE, work=tmp_path)
    check_rows(rows, "open/first-batch")
    by = {r.method: r for r in rows}
    assert list(by)[:-1] == list(opening.METHODS) and all(by[m].seconds is not None for m in opening.METHODS)
    assert "packed" in by[opening.FIRST].note and "flushed Drive" in by[opening.FIRST].note
    second = by[opening.SECOND]
    assert "found a mirror of it" in second.note and "packed" not in second.note
    limit = rows[-1]
    assert limit.reference and limit.metrics["mirror MB"] > 0
    assert second.metrics["x link limit"] == pytest.approx(second.seconds / limit.seconds)
    assert not list(tmp_path.iterdir())  # its data is gone


@pytest.mark.slow
@pytest.mark.fuse
def test_detection_scenario(need_fuse, tmp_path):
    pytest.importorskip("pycocotools")
    from colabfast.tools.bench import detection

    rows = detection.run(size=0.001, repeats=1, workers=1, drive=QUICK_DRIVE, work=tmp_path)
    for r in rows:
        check_rows([r], "detection/")
        assert r.seconds is not None, r.note
        assert r.metrics["images/s"] == pytest.approx(2 * detection.BATCH / r.seconds)  # 32 images at the least
    by = {(r.scenario, r.method): r for r in rows}
    assert [(r.scenario, r.reference) for r in rows] == [
        ("detection/pack", False), ("detection/pack", True), *[("detection/read", False)] * 4,
        ("detection/drive", False), ("detection/drive", False)]
    pack, bound = rows[:2]
    assert pack.metrics["x decode bound"] == pytest.approx(pack.metrics["images/s"] / bound.metrics["images/s"])
    assert pack.metrics["mirror MB"] > 0
    items, loader = by[("detection/read", detection.H5_ITEMS)], by[("detection/read", detection.H5_LOADER)]
    for r in (items, loader):
        assert r.metrics["x CocoDetection item by item"] == pytest.approx(
            r.metrics["images/s"] / by[("detection/read", detection.TV_ITEMS)].metrics["images/s"])
        assert "x CocoDetection + DataLoader" in r.metrics
    assert "x CocoDetection on Drive" in by[("detection/drive", detection.STAGED)].metrics
    assert not list(tmp_path.iterdir())  # its data is gone


def test_detection_scenario_without_fuse_says_why(monkeypatch, tmp_path):
    from colabfast.drivesim import fs as simfs
    from colabfast.tools.bench import detection

    monkeypatch.setattr(simfs, "available", lambda: (False, "no /dev/fuse here"))
    rows = detection._drive(tmp_path, tmp_path, tmp_path / "a.json", tmp_path / "coco.h5", 1, 1, 1, {}, "")
    assert [(r.scenario, r.seconds) for r in rows] == [("detection/drive", None)] and "no /dev/fuse" in rows[0].note


def test_cli_writes_the_reports(tmp_path, capsys):
    parser = cli.build_parser(argparse.ArgumentParser(prog="colabfast bench"))
    args = parser.parse_args(["pack", "--size", "0.01", "--repeats", "1", "--workers", "1", "--out",
                              str(tmp_path / "out"), "--work", str(tmp_path)])
    assert cli.run(args) == 0
    printed = capsys.readouterr().out
    assert "### pack/500x375" in printed and "bench.json" in printed
    doc = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert "### pack/archive" in printed
    assert doc["settings"]["scenarios"] == ["pack"] and len(doc["results"]) in (len(packing.MODES) + 1,
                                                                                len(packing.MODES) + 3)
    assert "colabfast bench pack --size 0.01" in (tmp_path / "out" / "bench.md").read_text()
    assert (tmp_path / "out" / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_rejects_unknown_peer_and_bad_size(tmp_path):
    parser = cli.build_parser(argparse.ArgumentParser())
    with pytest.raises(ValueError, match="unknown peer"):
        cli.run(parser.parse_args(["epoch", "--peers", "tfrecord", "--out", str(tmp_path)]))
    with pytest.raises(ValueError, match="--size > 0"):
        cli.run(parser.parse_args(["pack", "--size", "0", "--out", str(tmp_path)]))


def test_cli_drive_settings():
    parser = cli.build_parser(argparse.ArgumentParser())
    args = parser.parse_args(["staging", "--drive", "open_ms=5, eio_read=0.01"])
    assert args.drive == {"open_ms": 5.0, "eio_read": 0.01}
    for bad in ("latency=5", "open_ms=fast"):
        with pytest.raises(SystemExit):
            parser.parse_args(["staging", "--drive", bad])


def test_cli_module_help():
    done = subprocess.run([sys.executable, "-m", "colabfast.tools.bench.cli", "--help"], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert "staging,epoch,coldreads,pack,loader,augment,gpu,open,detection,stream,all" in done.stdout
    assert "--size" in done.stdout


def test_augment_scenario(tmp_path):
    from colabfast.tools.bench import augment

    rows = augment.run(size=0.02, repeats=1, min_seconds=0, batch_size=16, workers=2, work=tmp_path)
    cases = [f"augment/{c}" for c in augment.CASES]
    assert list(dict.fromkeys(r.scenario for r in rows)) == cases
    procs, tv = "colabfast.DataLoader(num_workers=2)", "torchvision ImageFolder + v2, 2 tuned workers"
    ffcv_missing = peers.FFCV_RAW.missing()
    for case in cases:
        got = {r.method: r for r in rows if r.scenario == case}
        ours = got[augment.OURS]
        measured = [r for r in got.values() if r.seconds is not None]
        if case == "augment/train ResNet-18 128px":  # training steps through colabfast.diagnose
            plain = got["torch DataLoader + ImageFolder + v2, 2 workers"]
            assert set(got) == {augment.OURS, plain.method} and len(measured) == 2
            assert all(0 <= r.metrics["data wait %"] <= 100 and r.metrics["images/s"] > 0 for r in measured)
            assert ours.metrics["x plain DataLoader"] == pytest.approx(ours.metrics["images/s"] /
                                                                       plain.metrics["images/s"])
            assert "reader: 2 threads, per-sample transforms fused" in ours.note and "2 steps" in ours.note
            continue
        assert all(r.metrics["images/s"] > 0 and r.low <= r.seconds <= r.high for r in measured)
        # epochs of 70 images: 4 batches of 16 at the least, rounded up to 10 classes of 7
        assert all(r.seconds == pytest.approx(70 / r.metrics["images/s"]) and "70 images" in r.note for r in measured)
        assert procs in got and got[procs].metrics["x worker processes"] == 1.0
        assert ours.metrics["x worker processes"] == pytest.approx(ours.metrics["images/s"] / got[procs].metrics[
            "images/s"])
        if case == "augment/detection v2":
            source = got["source dataset + torch DataLoader, 2 workers"]
            assert set(got) == {augment.OURS, procs, source.method} and source.metrics["x torch DataLoader"] == 1.0
            assert ours.metrics["x torch DataLoader"] == pytest.approx(ours.metrics["images/s"] / source.speed)
            assert "reader: none" in ours.note  # v2 transforms of boxes: not fused, worker processes
            continue
        assert "reader: 2 threads, per-sample transforms fused" in ours.note  # the defaults: reader threads
        assert got[tv].metrics["x torchvision"] == 1.0
        assert ours.metrics["x torchvision"] == pytest.approx(ours.metrics["images/s"] / got[tv].metrics["images/s"])
        ceiling = got.get(augment.CEILING)
        assert (ceiling is not None) == (case != "augment/raw 256px")
        if ceiling:
            assert ceiling.reference and ceiling.metrics["of decode ceiling"] == 1.0
            assert ours.metrics["of decode ceiling"] == pytest.approx(ours.metrics["images/s"] / ceiling.speed)
        ffcv = got[augment.FFCV]
        if ffcv_missing:
            assert ffcv.seconds is None and "not installed" in ffcv.note and "x FFCV" not in ours.metrics
        else:
            assert ffcv.metrics["x FFCV"] == 1.0 and "FFCV 1." in ffcv.note
            assert ours.metrics["x FFCV"] == pytest.approx(ours.metrics["images/s"] / ffcv.metrics["images/s"])
        spdl = got[augment.SPDL]  # the same files through SPDL's pipeline, or a row saying why not
        assert (spdl.seconds is None) == bool(peers.SPDL.missing()) and "SPDL" in spdl.note
    assert not list(tmp_path.iterdir())  # its data is gone


def test_augment_one_case_without_ffcv(monkeypatch, tmp_path):
    from colabfast.tools.bench import augment

    monkeypatch.setattr(peers, "FFCV_RAW", ABSENT)  # as where FFCV is not installed
    rows = augment.run(size=0.01, repeats=1, min_seconds=0, batch_size=8, workers=1, work=tmp_path,
                       only=("raw 256px",))
    assert {r.scenario for r in rows} == {"augment/raw 256px"}
    by = {r.method: r for r in rows}
    assert set(by) == {augment.OURS, "colabfast.DataLoader(num_workers=1)",
                       "torchvision ImageFolder + v2, 1 tuned workers", augment.FFCV, augment.SPDL}
    assert by[augment.FFCV].seconds is None and "not installed" in by[augment.FFCV].note
    # SPDL: measured where it imports, else a row saying why
    assert (by[augment.SPDL].seconds is None) == bool(peers.SPDL.missing())
    assert all(r.metrics["images/s"] > 0 and "x FFCV" not in r.metrics for r in rows if r.seconds is not None)
    assert "### augment/raw 256px" in report.markdown(rows)  # a row that did not run shows its note


def test_spdl_peer_center_crop_is_torchvisions(tmp_path):
    """SPDL's epoch loader, where spdl imports: every image once per epoch, uint8 [B, 3, 224, 224]
    channels-last, and the pixels of colabfast's decoder + CenterCrop(224) up to FFmpeg's colour
    conversion (a crop one pixel off differs several times more). Elsewhere it is reported missing."""
    from torchvision.datasets import ImageFolder

    from colabfast.where.codec import decode_jpeg

    why = peers.SPDL.missing()
    if why:  # not installed, or installed without FFmpeg: the benchmark's rows say so, and how to install
        assert "libavcodec59" in why and "pip install spdl" in why
        return
    assert peers.by_name(["spdl"]) == [peers.SPDL]
    # one image per class, so a label names its image; odd sizes: odd centre offsets
    tree = data.make_imagefolder(tmp_path / "imagefolder", classes=5, per_class=1, size=(331, 283), vary=0.1)
    samples = ImageFolder(tree).samples
    peers.SPDL.prepare(samples, tmp_path / "spdl", (331, 283), 2)
    loader = peers.SPDL.loader(tmp_path / "spdl", epoch.transform(), 2, 2, None)
    for _ in range(2):  # re-iterable
        batches = list(loader)
        assert [len(x) for x, _ in batches] == [2, 2, 1]
        labels = torch.cat([y for _, y in batches])
        assert sorted(labels.tolist()) == list(range(5))
    for x, y in batches:
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, 224, 224)
        assert x.is_contiguous(memory_format=torch.channels_last)
        for image, label in zip(x, y.tolist()):
            full = decode_jpeg(torch.frombuffer(bytearray(Path(samples[label][0]).read_bytes()), dtype=torch.uint8))
            h, w = full.shape[1:]
            top, left = round((h - 224) / 2), round((w - 224) / 2)
            errors = [(image.int() - full[:, top + dy: top + dy + 224, left + dx: left + dx + 224].int()).abs()
                      .float().mean().item() for dy, dx in ((0, 0), (1, 0), (0, 1))]
            assert errors[0] < 3.0 and errors[0] < min(errors[1:]) / 2, errors


def test_spdl_augment_filter_gives_random_crops_of_224(tmp_path):
    """augment's SPDL row: RandomResizedCrop(224) + flip in FFmpeg's filter, one crop per image and epoch."""
    from torchvision.datasets import ImageFolder

    from colabfast.tools.bench import augment

    if peers.SPDL.missing():
        return  # test_spdl_peer_center_crop_is_torchvisions checks the message
    tree = data.make_imagefolder(tmp_path / "src", classes=2, per_class=3, size=(320, 240))
    loader = peers.SPDLLoader(ImageFolder(tree).samples, augment._spdl_crop_flip, 6, 2)
    (a, _), (b, _) = next(iter(loader)), next(iter(loader))
    assert a.dtype == torch.uint8 and a.shape == b.shape == (6, 3, 224, 224)
    assert not torch.equal(a.sort(0).values, b.sort(0).values)  # new crops every epoch, whatever the order
    assert 20 < a.float().mean() < 235  # pictures, not a blank frame


def test_spdl_without_ffmpeg_is_missing(monkeypatch):
    """Installed, but none of the FFmpeg libraries spdl.io loads on first use: a note with the apt-get line."""
    if not peers.SPDL.missing():
        import spdl.io

        def no_ffmpeg(*args: object, **kwargs: object) -> None:
            raise RuntimeError("Failed to import libspdl.")

        monkeypatch.setattr(spdl.io, "cpu_storage", no_ffmpeg)
    why = peers.SPDL.missing()
    assert "libavcodec59" in why and "pip install spdl" in why


_BURN = """
import sys, time
while time.process_time() < {seconds}:  # its own CPU clock: as long as it takes on a busy machine
    pass
sys.stdout.write("spent\\n"); sys.stdout.flush()
sys.stdin.read()  # alive until the test closes its stdin
"""


def _burner(seconds: float) -> subprocess.Popen:
    """A child that spends ``seconds`` of CPU, says so on stdout, and stays alive until its stdin closes."""
    child = subprocess.Popen([sys.executable, "-c", _BURN.format(seconds=seconds)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "spent\n"
    return child


def test_usage_counts_live_and_reaped_children_and_keeps_the_excluded_apart():
    """CPU per image is the whole process tree's: a worker process still running counts, and so does one
    already reaped; a Drive simulator's server (an excluded pid) is counted apart, not in the tree."""
    from colabfast.tools.bench.timing import usage

    start = usage()
    worker, server = _burner(0.3), _burner(0.2)
    try:
        tick = 0.02  # /proc counts a live process's CPU in clock ticks (10 ms)
        live = usage(exclude=[server.pid]) - start
        assert live.cpu >= 0.3 - tick and live.excluded >= 0.2 - tick
        whole = usage() - start  # nothing excluded: both in the tree
        assert whole.cpu >= 0.5 - 2 * tick and whole.excluded == 0
        assert whole.cpu - live.cpu >= 0.2 - tick  # the server's share was not in the tree's (it sleeps meanwhile)
    finally:
        for child in (worker, server):
            child.stdin.close()
            child.wait()
    reaped = usage() - start
    assert reaped.cpu >= 0.5 and reaped.wall > 0  # RUSAGE_CHILDREN holds them now


def test_usage_counts_this_process_threads():
    import threading
    import time

    from colabfast.tools.bench.timing import usage

    def spin() -> None:
        begun = time.thread_time()
        while time.thread_time() - begun < 0.2:
            pass

    start = usage()
    threads = [threading.Thread(target=spin) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (usage() - start).cpu >= 0.4
