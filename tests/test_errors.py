"""colabfast.errors (issue 38, item 4): every refusal a user can hit in stage, pack, open_dataset,
fetch and ramdisk is a colabfast.Error, and still the builtin it was (``except ValueError`` and
friends catch what they caught), with the same message."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from PIL import Image

import colabfast as cf
from colabfast.layouts import images as sources
from colabfast.staging import destination as staging
from colabfast.where import tmpfs


def _folders(root: Path) -> None:
    (root / "empty").mkdir()
    (root / "file.txt").write_text("not a dataset")
    (root / "imgs" / "cat").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(root / "imgs" / "cat" / "0.png")


REFUSALS = [
    # (name, call, the colabfast class, the builtin it always was, words of the message)
    ("pack: no such folder", lambda t: cf.pack(t / "missing", t / "m.h5", progress=False),
     cf.errors.SourceNotFound, FileNotFoundError, "does not exist"),
    ("pack: no such archive", lambda t: cf.pack(t / "missing.zip", t / "m.h5", progress=False),
     cf.errors.SourceNotFound, FileNotFoundError, "no archive at"),
    ("pack: a folder of no images", lambda t: cf.pack(t / "empty", t / "m.h5", progress=False),
     cf.errors.SourceNotFound, FileNotFoundError, "no image files"),
    ("pack: an empty list", lambda t: cf.pack([], t / "m.h5", progress=False),
     cf.errors.SourceNotFound, FileNotFoundError, "empty list of files"),
    ("pack: a file that is no dataset", lambda t: cf.pack(t / "file.txt", t / "m.h5", progress=False),
     cf.errors.SourceNotAFolder, NotADirectoryError, "not a dataset folder"),
    ("pack: a list with a folder layout",
     lambda t: cf.pack([t / "imgs" / "cat" / "0.png"], t / "m.h5", layout="imagefolder", progress=False),
     cf.errors.PackRefused, ValueError, "layout='files'"),
    ("pack: a KITTI label line of 3 fields", lambda t: sources._parse_labels(["Car 0 0"], ["000000"], t),
     cf.LayoutError, ValueError, "15 fields"),
    ("open_dataset: no such path", lambda t: cf.open_dataset(t / "missing", progress=False),
     cf.errors.NothingToOpen, FileNotFoundError, "does not exist"),
    ("open_dataset: a pack option it does not take", lambda t: cf.open_dataset(t / "imgs", bogus=1),
     cf.errors.OpenRefused, TypeError, "unexpected keyword arguments bogus"),
    ("stage: no such source", lambda t: cf.stage(t / "missing", t / "dst", progress=False),
     cf.errors.SourceNotFound, FileNotFoundError, "nothing to stage"),
    ("stage: no room", lambda t: staging.check_space(1 << 60, t, t),
     cf.NotEnoughSpace, OSError, "not enough free space"),
    ("ramdisk: an unreadable size", lambda t: tmpfs.parse_size("lots"),
     cf.errors.StageRefused, ValueError, "as a size"),
    ("ramdisk: more than the RAM", lambda t: cf.ramdisk(1 << 60, t / "ram"),
     cf.errors.StageRefused, ValueError, "would starve this machine"),
    ("fetch: not a Drive link", lambda t: cf.fetch("not a link at all", t / "dl"),
     cf.errors.FetchRefused, ValueError, "not a Google Drive link"),
    ("fetch: a malformed hash", lambda t: cf.fetch("1AbCdEfGhIjKlMnOpQrStUvWxYz012345", t / "dl", hash="nope"),
     cf.errors.FetchRefused, ValueError, "md5:<hex>"),
]


@pytest.mark.parametrize("call, cls, builtin, words", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals_are_colabfast_errors_and_still_their_builtin(local, call, cls, builtin, words):
    """Each of these was a bare builtin (FileNotFoundError, ValueError, TypeError, OSError): ``except
    colabfast.Error`` missed it and only the CLI's catch-all printed it as a line."""
    _folders(local)
    with pytest.raises(builtin, match=words) as info:
        call(local)
    assert isinstance(info.value, cf.Error) and type(info.value) is cls, type(info.value)
    assert type(info.value).__module__ == "colabfast.errors"
    if builtin is OSError:
        assert info.value.errno == errno.ENOSPC


def test_errors_module_imports_nothing_of_colabfast():
    """Any module may import colabfast.errors: it imports none of colabfast's (no import circle)."""
    import ast

    import colabfast.errors

    tree = ast.parse(Path(colabfast.errors.__file__).read_text())
    imported = [n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [None])]
    assert not [m for m in imported if m and m.split(".")[0] == "colabfast"], imported


def test_excerpt_shows_any_value_in_one_bounded_line():
    """What a refusal quotes of a stranger's value (issue 51): at most 200 characters on one line, however large
    the value; a graph of 9 levels of 9 shared lists (387 million leaves, printed by repr) is walked only as far
    as it prints; a tensor is its dtype and shape."""
    import time

    import torch

    from colabfast.errors import QUOTED, excerpt

    bomb: object = ["lol"] * 9
    for _ in range(8):
        bomb = [bomb] * 9
    loop: list = []
    loop.append(loop)
    start = time.process_time()
    shown = [excerpt(v) for v in (bomb, loop, "x" * 10**7, {"a\nb": torch.zeros(5056, dtype=torch.uint8)}, 3)]
    assert time.process_time() - start < 5  # a repr of the bomb would take minutes and gigabytes
    assert all(len(s) <= QUOTED and "\n" not in s for s in shown), shown
    assert shown[3] == "{'a\\nb': <uint8 Tensor of shape [5056]>}" and shown[4] == "3"
