"""``colabfast bench stream`` (colabfast/tools/bench/streaming.py): the plumbing at a tiny size on a quick
simulated Drive; figures are benchmarks/README.md's, not asserted here."""

from __future__ import annotations

import argparse
import threading
import time

import pytest
import torch

from colabfast.tools.bench import cli, peers, streaming
from colabfast.where import env

QUICK_DRIVE = {"open_ms": 5.0, "read_ms": 0.5, "mbps": 500.0}


@pytest.mark.fuse
def test_stream_scenario(need_fuse, tmp_path):
    if not env.is_root():
        pytest.skip("mounting the small tmpfs needs root")
    # cache_limit half the tmpfs: Streaming's local use runs over its cache_limit (1.5x it measured here
    # with 2 workers), and a full tmpfs would fail its row rather than test the plumbing. A mirror twice
    # the tmpfs: colabfast's cache_limit must hold a few blocks of 64 samples.
    rows = streaming.run(size=0.06, repeats=1, batch_size=16, workers=1, image_size=96, mirror_to_disk=2,
                         cache_fractions=(0.5,), drive=QUICK_DRIVE, work=tmp_path)
    by = {r.method: r for r in rows}
    mds, ours = streaming.method_names((0.5,))
    assert list(by) == [streaming.LINK, streaming.STAGED, mds, ours]
    n = 600
    for method in (streaming.LINK, streaming.STAGED):
        row = by[method]
        assert row.reference and row.seconds is not None, row.note
        assert row.metrics["images/s"] == pytest.approx(streaming.EPOCHS * n / row.seconds)
    assert "mirror" in by[streaming.LINK].note and "tmpfs" in by[streaming.LINK].note
    streamed = []
    if peers.MOSAICML_STREAMING.missing():
        assert "not installed" in by[mds].note
    else:
        streamed.append(by[mds])
    streamed.append(by[ours])
    for row in streamed:
        assert row.seconds is not None, row.note
        assert not row.reference
        assert row.metrics["images/s"] == pytest.approx(streaming.EPOCHS * n / row.seconds)
        assert row.metrics["same samples"] == streaming.CHECKED  # the staged mirror's samples, by index
        assert row.metrics["Drive MB"] > 0  # read through the simulator
        limit = row.metrics["cache_limit MB"]
        assert 0 < row.metrics["local peak MB"] <= limit / 0.5  # the tmpfs held the cache, and no more than itself
        assert row.metrics["x min(link, staged)"] > 0


def test_stream_without_root_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(env, "is_root", lambda: False)
    rows = streaming.run(size=0.01, work=tmp_path)
    assert [r.seconds for r in rows] == [None, None, None]
    assert [r.method for r in rows] == [streaming.STAGED, *streaming.method_names((0.8,))]
    assert all("needs root" in r.note or "Drive simulator unavailable" in r.note for r in rows)


def test_stream_rejects_a_disk_larger_than_the_mirror():
    with pytest.raises(ValueError, match="mirror_to_disk > 1"):
        streaming.run(mirror_to_disk=0.5)
    with pytest.raises(ValueError, match="cache fraction"):
        streaming.run(cache_fractions=(0.8, 1.5))


@pytest.mark.parametrize("small_tmpfs", ["8m"], indirect=True)
def test_peak_use_sees_a_file_that_came_and_went(small_tmpfs):
    with streaming.PeakUse(small_tmpfs, every=0.001) as peak:
        start = peak.peak
        (small_tmpfs / "f").write_bytes(b"x" * (2 << 20))
        time.sleep(0.05)
        (small_tmpfs / "f").unlink()
    assert peak.peak - start >= 2 << 20
    assert peak.used() < 2 << 20


def test_epochs_fail_a_loader_that_stalls(monkeypatch):
    monkeypatch.setattr(streaming, "STALL_S", 0.2)

    never = threading.Event()

    def stalls():
        yield torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2)
        never.wait()  # a loader stuck for good: waiting for it would hang the test (pytest-timeout)
        yield torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2)

    with pytest.raises(TimeoutError, match="no batch in 0.2 s"):
        streaming._epochs(stalls(), 8)
    never.set()


def test_the_stall_alarm_keeps_an_outer_alarm(monkeypatch):
    """pytest-timeout's signal method is an outer SIGALRM timer: the stall alarm must neither cancel it
    (the test would lose its timeout) nor outlast it (its handler is called when its time comes)."""
    import signal

    fired = []

    def outer(signum, frame):
        fired.append(time.monotonic())

    before = signal.signal(signal.SIGALRM, outer)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        with streaming._stall_alarm(5.0) as rearm:
            rearm()
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 5.0
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 25.0 < left <= 30.0 and signal.getsignal(signal.SIGALRM) is outer  # set again, for what is left
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # the outer deadline comes inside the block
        start = time.monotonic()
        with streaming._stall_alarm(5.0) as rearm:
            rearm()
            while not fired and time.monotonic() - start < 3:
                time.sleep(0.01)
        assert fired and fired[0] - start < 2.0, "the outer handler was not called at its deadline"
        time.sleep(0.1)
        assert len(fired) == 1 and signal.getitimer(signal.ITIMER_REAL)[0] == 0  # called once, not set again
        # and with no outer alarm, none is left behind
        signal.setitimer(signal.ITIMER_REAL, 0)
        with streaming._stall_alarm(5.0) as rearm:
            rearm()
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def test_epochs_check_the_batches():
    batch = (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2))
    assert streaming._epochs([batch, batch], 8) == 2 * 4
    with pytest.raises(RuntimeError, match=r"uint8 images \[B, 3, 9, 9\]"):
        streaming._epochs([batch], 9)


def test_cli_stream_options():
    parser = cli.build_parser(argparse.ArgumentParser())
    args = parser.parse_args(["stream", "--mirror-to-disk", "4", "--cache-fraction", "0.8,0.5"])
    assert (args.scenario, args.mirror_to_disk, args.cache_fraction) == ("stream", 4.0, (0.8, 0.5))
    assert "--mirror-to-disk 4 --cache-fraction 0.8,0.5" in cli._command(args)
    assert "--mirror-to-disk" not in cli._command(parser.parse_args(["stream"]))
    for bad in ("0", "1.5", "0.8,x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["stream", "--cache-fraction", bad])
