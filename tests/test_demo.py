"""colabfast demo on a tiny size: every row is measured, with and without FUSE."""

from __future__ import annotations

from colabfast import demo
from colabfast.testing import drivesim

FAST = {"open_ms": 5.0, "read_ms": 1.0, "mbps": None}


def test_demo_measures_every_row():
    rows = demo.run(classes=2, per_class=3, size=(64, 48), workers=1, drive=FAST)
    assert [r.what.split(" (")[0].split(",")[0] for r in rows] == [
        "ImageFolder + DataLoader", "colabfast.stage", "ImageFolder + DataLoader", "colabfast.pack",
        "H5ImageFolder mirror"]
    assert all(r.seconds > 0 for r in rows)
    assert [r.images for r in rows] == [6, 0, 6, 0, 6]
    table = demo.report(rows)
    assert "straight from Drive" in table and "1.0x" in table


def test_demo_without_fuse_measures_local_disk(monkeypatch, capsys):
    monkeypatch.setattr(drivesim, "available", lambda: (False, "no /dev/fuse"))
    rows = demo.run(classes=2, per_class=2, size=(48, 32), workers=0)
    assert "FUSE is not available here (no /dev/fuse)" in capsys.readouterr().out
    assert len(rows) == 3 and "local disk" in rows[0].what
