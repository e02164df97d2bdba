"""colabfast.diagnosis: data-bound vs compute-bound verdicts, wording of fixes, host syncs (CUDA)."""

from __future__ import annotations

import time
import types

import pytest
import torch
import torch.utils.data as tud
from torch.utils.data import Dataset, Subset

from colabfast.diagnosis import report as diagnosis_report
from colabfast.diagnosis.report import Report, diagnose
from colabfast.loading.loader import DataLoader


class Clock:
    """A fake ``perf_counter`` that moves only when told to, so verdicts do not depend on machine load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(diagnosis_report, "time", types.SimpleNamespace(perf_counter=fake, sleep=fake.sleep))
    return fake


class Sleepy(Dataset):
    """uint8 images that take ``delay`` seconds each to load (on ``clock`` if given, else really);
    ``root`` says where they 'live'."""

    def __init__(self, n=64, delay=0.0, root="/tmp/sleepy", clock=None):
        self.n, self.delay, self.root, self.clock = n, delay, root, clock

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            (self.clock.sleep if self.clock is not None else time.sleep)(self.delay)
        return torch.full((3, 8, 8), i % 256, dtype=torch.uint8), i


def test_a_slow_dataset_is_data_bound(clock):
    loader = tud.DataLoader(Sleepy(delay=0.004, clock=clock), batch_size=4)
    report = diagnose(loader, lambda batch: clock.sleep(0.001), steps=8, warmup=1, verbose=False)
    assert report.verdict == "data-bound" and report.data_fraction == pytest.approx(0.016 / 0.017)
    assert report.steps == 8 and len(report.data_times) == len(report.step_times) == 8
    assert report.data_time == pytest.approx(0.016)  # 4 samples x 4 ms
    assert any("num_workers=0" in a for a in report.advice)
    assert report.headline().startswith("data-bound: ")


def test_a_slow_step_is_compute_bound(clock):
    loader = DataLoader(Sleepy(delay=0.0001, clock=clock), 4, num_workers=0)
    report = diagnose(loader, lambda batch: clock.sleep(0.08), steps=5, warmup=1, verbose=False)
    assert report.verdict == "compute-bound" and report.data_fraction == pytest.approx(0.0004 / 0.0804)
    assert report.step_time == pytest.approx(0.08)
    assert report.images_per_s == pytest.approx(4 / 0.0804) and report.loader_images_per_s == pytest.approx(4 / 0.0004)
    assert "a faster loader will not speed training up" in report.advice[0]


def test_drive_data_is_worded_as_a_drive_mount(monkeypatch):
    monkeypatch.setattr(diagnosis_report.env, "drive_kind", lambda path: "drivefs")
    ds = Sleepy(delay=0.003, root="/content/drive/MyDrive/imagenet")
    report = diagnose(tud.DataLoader(Subset(ds, range(40)), 4), lambda b: None, steps=4, warmup=1, verbose=False)
    assert report.storage == "Google Drive" and report.data_path == "/content/drive/MyDrive/imagenet"
    assert "/content/drive/MyDrive/imagenet (a Drive mount)" in report.advice[0]
    assert "stage it" in report.advice[0]
    assert "Drive mount" in str(report)


@pytest.mark.parametrize(
    "where, words",
    [("drivefs", "Google Drive"), ("drivesim", "Google Drive"), ("standin", "Google Drive"), ("fuse", "FUSE"),
     ("ram", "RAM"), ("disk", "local disk")],
)
def test_storage_is_worded_from_env_storage(monkeypatch, where, words):
    monkeypatch.setattr(diagnosis_report.env, "storage", lambda path: where)
    assert diagnosis_report._storage("/data") == words


def test_prints_the_verdict_once_unless_silenced(capsys):
    loader = DataLoader(Sleepy(16), 4, num_workers=0)
    report = diagnose(loader, lambda b: None, steps=3, warmup=1)
    out = capsys.readouterr().out
    assert out.count("colabfast.diagnose:") == 1 and str(report) in out
    assert "<pre>" in report._repr_html_()
    diagnose(loader, steps=3, warmup=1, verbose=False)
    assert capsys.readouterr().out == ""


def test_loader_alone_and_short_epochs():
    loader = DataLoader(Sleepy(6), 2, num_workers=0)  # 3 batches per epoch
    report = diagnose(loader, steps=5, warmup=2, verbose=False)
    assert isinstance(report, Report) and report.verdict == "loader only" and report.loader_images_per_s > 0
    assert report.headline().startswith("loader only: ")
    stepped = diagnose(loader, lambda b: None, steps=7, warmup=2, verbose=False)
    assert stepped.steps == 7  # epochs restart when they run out
    with pytest.raises(ValueError, match="no batches"):
        diagnose(tud.DataLoader(Sleepy(0), 2), lambda b: None, steps=2, verbose=False)


def test_finds_where_the_data_lives_through_wrappers():
    class Folder(Dataset):
        def __init__(self):
            self.samples = [("/data/train/a/1.jpg", 0)]

    assert diagnosis_report._data_path(Subset(Subset(Folder(), [0]), [0])) == "/data/train/a/1.jpg"
    assert diagnosis_report._data_path(tud.ConcatDataset([Sleepy(root="/x")])) == "/x"
    assert diagnosis_report._data_path(object()) is None


@pytest.mark.cuda
def test_cuda_work_counts_as_step_time_and_item_is_flagged():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.ones(1, device="cuda")

    def step(batch):
        # ~100 ms of GPU time (2e8 cycles at 1-2 GHz), asynchronous to the host: far above a batch of
        # 4 tiny images' load time even on the fastest GPU (10 ms was too close on an H100).
        torch.cuda._sleep(200_000_000)
        return (x * 2).sum().item()  # a host sync every step

    report = diagnose(DataLoader(Sleepy(), 4, num_workers=0), step, steps=5, warmup=1, verbose=False)
    assert report.verdict == "compute-bound" and report.step_time > 0.05, (report.data_time, report.step_time)
    assert report.host_syncs_per_step is not None and report.host_syncs_per_step >= 1
    assert any("host syncs" in a for a in report.advice)


def test_the_slowest_stage_of_the_loader_is_named_where_data_waits():
    """Issue 38, item 6: from colabfast.DataLoader.stage_times(), the loader's own stages ("wait" is the
    training loop's, not one of them)."""
    from colabfast.loading.stages import StageTime

    def report(verdict, fraction, stages):
        return Report(verdict=verdict, advice=[], steps=4, data_time=0.01, step_time=0.01, data_fraction=fraction,
                      images_per_s=1.0, loader_images_per_s=1.0, gpu_utilization=None, host_syncs_per_step=None,
                      data_path=None, storage=None, data_times=[], step_times=[], stages=stages)

    stages = {"read": StageTime(64, 0.2), "decode+transform": StageTime(64, 0.71), "collate": StageTime(64, 0.09),
              "wait": StageTime(4, 5.0)}
    bound = report("data-bound", 0.5, stages)
    assert bound.slowest_stage() == ("decode+transform", pytest.approx(0.71))
    assert bound.headline() == "data-bound: 50% of each step waits for data; decode+transform takes 71% of the " \
                               "loader's time."
    assert "loader stages: read 0.2 s (64), decode+transform 0.71 s (64)" in str(bound)
    assert "takes" not in report("compute-bound", 0.01, stages).headline()
    assert report("data-bound", 0.5, None).slowest_stage() is None
    assert report("data-bound", 0.5, {"wait": StageTime(4, 1.0)}).slowest_stage() is None
