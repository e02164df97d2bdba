"""The layout registry (issue 38 item 1): a layout is one class registered from its own module, and
pack, open_dataset, the mirror's drop-in and the command's --layout take it from there."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import colabfast as cf
from colabfast import cli
from colabfast.layouts import REGISTRY, ImageFile, Layout, register, unregister
from colabfast.layouts.base import FileEntry
from colabfast.opening.mirrors import drop_in


class H5Tiles(cf.H5Dataset):
    """The toy layout's own drop-in."""

    layouts = ("tiles",)


class Tiles(Layout):
    """A toy layout: ``tiles/<label>-<n>.png``, the label the file name's first part."""

    name = "tiles"
    drop_in = H5Tiles

    def __init__(self, root, *, on_error: str = "raise", retries: int = 5):
        self.root = Path(root)
        names = sorted(os.listdir(self.root / "tiles"))
        self.paths = [f"tiles/{n}" for n in names]
        self.files = [FileEntry(p, (st := os.stat(self.root / p)).st_size, st.st_mtime_ns) for p in self.paths]
        self.skipped, self.info = [], {}

    def __getitem__(self, i: int):
        rel = self.paths[i]
        return ImageFile((self.root / rel).read_bytes(), rel), int(rel.split("/")[1].split("-")[0])

    @classmethod
    def detect(cls, tree, **hints) -> bool:
        return tree.is_dir("tiles")


@pytest.fixture
def tiles(tmp_path):
    register(Tiles)
    root = tmp_path / "toy"
    (root / "tiles").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(5):
        Image.fromarray(rng.integers(0, 256, (8 + k, 10, 3), dtype=np.uint8)).save(root / "tiles" / f"{k % 2}-{k}.png")
    yield root
    unregister("tiles")


def test_a_layout_registered_from_a_test_module_packs_and_opens(tiles, tmp_path):
    mirror = cf.pack(tiles, tmp_path / "toy.h5", workers=0, progress=False)  # layout="auto" detects it
    assert cf.info(mirror).layout == "tiles"
    opened = cf.open_dataset(tiles, mirrors=tmp_path / "mirrors", progress=False)
    assert type(opened) is H5Tiles
    assert type(drop_in(mirror)) is H5Tiles
    ref = Tiles(tiles)
    for ds in (opened, cf.H5Dataset(mirror)):
        assert len(ds) == 5
        for i in range(5):
            image, label = ds[i]
            expected = np.asarray(Image.open(tiles / ref.paths[i]))
            assert label == ref[i][1] and np.array_equal(np.asarray(image), expected)
    assert "tiles" in cli._PACK_LAYOUTS and list(cli._PACK_LAYOUTS).count("tiles") == 1


def test_a_split_is_refused_for_a_layout_without_splits(tiles, tmp_path):
    cf.pack(tiles, tmp_path / "toy.h5", workers=0, progress=False)
    with pytest.raises(cf.errors.PackRefused, match="split='val': a mirror of the tiles layout has one set of samples"):
        drop_in(tmp_path / "toy.h5", split="val")


def test_a_mirror_of_a_layout_this_process_has_not_registered_is_named(tiles, tmp_path):
    mirror = cf.pack(tiles, tmp_path / "toy.h5", workers=0, progress=False)
    unregister("tiles")
    try:
        with pytest.raises(cf.MirrorError, match="layout 'tiles', which this process has not registered"):
            drop_in(mirror)
        assert "tiles" not in cli._PACK_LAYOUTS
    finally:
        register(Tiles)


def test_the_command_offers_the_registered_layouts_and_the_archives():
    assert list(cli._PACK_LAYOUTS) == ["auto", *REGISTRY]
    assert {"imagenet-train", "imagenet-val", "kaggle-train", "kaggle-val"} <= set(REGISTRY)
    assert {"imagefolder", "kitti", "files", "coco", "voc-detection", "yolo", "csv"} <= set(cli._PACK_LAYOUTS)


@pytest.mark.parametrize("name, error, match", [
    ("Tiles", ValueError, "lowercase letters"),
    ("auto", ValueError, "not one of auto"),
    ("dataset", ValueError, "not one of auto"),
    ("coco", ValueError, "layout 'coco' is registered already"),
])
def test_register_refuses_a_bad_or_taken_name(name, error, match):
    bad = type("Bad", (Layout,), {"name": name})
    with pytest.raises(error, match=match):
        register(bad)
    assert REGISTRY.get(name) is not bad


def test_register_takes_layout_classes_only():
    with pytest.raises(TypeError, match="subclass of colabfast.layouts.Layout"):
        register(object)  # type: ignore[arg-type]


def test_the_options_open_dataset_and_the_command_pass_on_are_packs():
    """pack's options are read from its signature, not copied: open_dataset takes each one but its
    own arguments, and `colabfast pack` has a flag for each."""
    import inspect

    from colabfast import opening
    from colabfast.opening.kinds import OWN_ARGUMENTS
    from colabfast.packing import pack

    signature = set(inspect.signature(pack).parameters)
    assert set(opening.PACK_OPTIONS) == signature - set(OWN_ARGUMENTS)
    flags = {a.dest for a in cli.build_parser()._subparsers._group_actions[0].choices["pack"]._actions}
    assert signature - {"fields", "on_error", "progress"} <= flags  # on_error: --skip-errors; progress: --quiet
    assert {"skip_errors", "quiet"} <= flags


def test_resolve_decides_the_kind_and_the_registered_layout_once(tiles, tmp_path):
    import shutil

    from colabfast.packing import resolve

    assert (resolve(tiles).kind, resolve(tiles).name, resolve(tiles).route) == ("folder", "tiles", "columns")
    zipped = shutil.make_archive(str(tmp_path / "export"), "zip", tiles.parent, tiles.name)
    assert (resolve(zipped).kind, resolve(zipped).name) == ("archive", "tiles")  # a zip resolves as its folder
    plain = tmp_path / "plain"
    (plain / "cats").mkdir(parents=True)
    r = resolve(plain)
    assert (r.kind, r.name, r.columns, r.route) == ("folder", "imagefolder", False, "images")
    assert resolve(Tiles(tiles)).kind == "dataset" and resolve(Tiles(tiles)).columns
    assert resolve([str(tiles / "tiles" / "0-0.png")], "files").kind == "files"
    assert resolve(r) is r


def test_resolve_reads_a_zip_of_a_registered_layout_from_its_names(tmp_path):
    import zipfile

    from colabfast.packing import resolve

    path = tmp_path / "voc.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("VOCdevkit/VOC2012/ImageSets/Segmentation/train.txt", "a\n")
        z.writestr("VOCdevkit/VOC2012/JPEGImages/a.jpg", b"")
    r = resolve(path)
    assert (r.kind, r.name, r.columns, r.route) == ("archive", "voc-segmentation", True, "unpacked")
    assert resolve(path, "imagenet-train").route == "stream"


SCRATCH = '''
"""Three layouts of a user's own, one of each kind, each one class and its registration."""
import os
import types
from pathlib import Path

import numpy as np

from colabfast.layouts import ArchiveLayout, ImageLayout, Layout, register
from colabfast.layouts.base import FileEntry, ImageFile
from colabfast.layouts.images import ImageListing, Split


@register
class Strips(Layout):
    """columns: strips/<label>-<n>.png, the label in the name."""

    name = "scratch-strips"

    def __init__(self, root, *, on_error="raise", retries=5):
        self.root = Path(root)
        self.paths = [f"strips/{n}" for n in sorted(os.listdir(self.root / "strips"))]
        self.files = [FileEntry(p, (st := os.stat(self.root / p)).st_size, st.st_mtime_ns) for p in self.paths]
        self.skipped, self.info = [], {}

    def __getitem__(self, i):
        rel = self.paths[i]
        return ImageFile((self.root / rel).read_bytes(), rel), int(rel.split("/")[1].split("-")[0])

    @classmethod
    def detect(cls, tree, **hints):
        return tree.is_dir("strips")


@register
class Named(ImageLayout):
    """images: one flat folder of <class>_<n>.png beside a NAMED marker, the class in the name."""

    name = "scratch-named"

    @classmethod
    def detect(cls, tree, **hints):
        return tree.is_file("NAMED")

    @classmethod
    def read(cls, root, workers=32):
        names = sorted(n for n in os.listdir(root) if n.endswith(".png"))
        classes = sorted({n.split("_")[0] for n in names})
        files = [FileEntry(n, (st := os.stat(root / n)).st_size, st.st_mtime_ns) for n in names]
        targets = np.array([classes.index(n.split("_")[0]) for n in names], dtype=np.int64)
        return ImageListing("imagefolder", root, [Split("", root, files, targets=targets)], classes)


@register
class Listed(ArchiveLayout):
    """archive: a zip of flat images beside CLASSES.txt (one "<file> <class>" line each), read as one stream."""

    name = "scratch-listed"
    archive_kinds = ("zip",)

    @classmethod
    def detect(cls, tree, **hints):
        return tree.archive and tree.is_file("CLASSES.txt")

    @classmethod
    def archive_labels(cls, path, read, labels):
        by_file = dict(line.split() for line in read("CLASSES.txt").decode().splitlines())
        return types.SimpleNamespace(origin=f"{path} (CLASSES.txt)", by_file=by_file)

    @classmethod
    def archive_paths(cls, names, labels, path):
        return [f"{labels.by_file[n]}/{n}" for n in names]
'''


def test_a_new_layout_of_each_kind_is_one_module_and_its_registration(tmp_path, monkeypatch):
    """Issue 54, item 2: a layout of columns, of image folders and of archives, written in a package of the
    user's own that colabfast knows nothing of, is detected by layout="auto", packed, and opened with the
    drop-in of its kind, folder or zip."""
    import importlib
    import zipfile

    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "__init__.py").write_text(SCRATCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("scratch")
    rng = np.random.default_rng(1)

    def png(path: Path, k: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (6 + k, 8, 3), dtype=np.uint8)).save(path)

    try:
        for k in range(4):
            png(tmp_path / "s" / "strips" / f"{k % 2}-{k}.png", k)
            png(tmp_path / "n" / f"{'ab'[k % 2]}_{k}.png", k)
        (tmp_path / "n" / "NAMED").write_text("")
        with zipfile.ZipFile(tmp_path / "listed.zip", "w") as z:
            z.writestr("CLASSES.txt", "x.png cat\ny.png dog\nz.png cat\n")
            for name in ("x.png", "y.png", "z.png"):
                png(tmp_path / "tmp" / name, 1)
                z.write(tmp_path / "tmp" / name, name)

        strips = cf.open_dataset(tmp_path / "s", progress=False)
        assert type(strips) is cf.H5Dataset and [strips[k][1] for k in range(4)] == [0, 0, 1, 1]  # 0-0, 0-2, 1-1, 1-3
        named = cf.open_dataset(tmp_path / "n", output="tensor", progress=False)
        assert type(named) is cf.H5ImageFolder and named.classes == ["a", "b"] and named.targets == [0, 0, 1, 1]
        shapes = [tuple(named[k][0].shape) for k in range(4)]
        assert shapes == [(3, 6, 8), (3, 8, 8), (3, 7, 8), (3, 9, 8)]  # a_0, a_2, b_1, b_3
        listed = cf.open_dataset(tmp_path / "listed.zip", progress=False)
        assert type(listed) is cf.H5ImageFolder and listed.classes == ["cat", "dog"]
        in_classes = [p.rsplit("/", 2)[-2:] for p, _ in listed.samples]
        assert in_classes == [["cat", "x.png"], ["cat", "z.png"], ["dog", "y.png"]]
        assert cf.info(named.path).layout == cf.info(listed.path).layout == "imagefolder"  # the format's kind
    finally:
        for name in ("scratch-strips", "scratch-named", "scratch-listed"):
            unregister(name)
