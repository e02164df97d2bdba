"""Issue 41's hostile inputs to the folder layouts: each ends in a colabfast.Error (or, with
on_error="skip", a listed skip) naming the file, in seconds, within BOUND of peak RSS over a valid
input of its kind (measured in a child process by tests/measured.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from measured import BOUND, measure
from PIL import Image

import colabfast
from colabfast.layouts import Coco, Csv, LayoutError, Segmentation, Yolo

MB = 1 << 20


def image(path: Path, color=(0, 0, 0), size: tuple[int, int] = (8, 8)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def coco_json(path: Path, images: str, annotations: str = "[]") -> Path:
    path.write_text('{"images": ' + images + ', "annotations": ' + annotations
                    + ', "categories": [{"id": 1, "name": "thing"}]}')
    return path


def coco_valid(path: Path, size: int) -> Path:
    """A valid COCO JSON of about ``size`` bytes: image entries (all of one file, a.jpg)."""
    entry = '{"id": %d, "file_name": "a.jpg", "width": 8, "height": 8}'
    return coco_json(path, "[" + ",".join(entry % i for i in range(size // 60)) + "]")


# --- item 4: COCO's cost per entry ----------------------------------------------------------------

@pytest.mark.parametrize("entry", ["[]", "0"])
def test_coco_flat_json_of_non_objects_costs_what_a_coco_file_costs(tmp_path, entry):
    """6 MB of ``[]`` (or ``0``) where image entries belong: before, on_error="skip" listed each one,
    over 400 MB above a valid file of that size; now ``[]`` is refused before parsing (more arrays than
    one per 12 bytes) and the ``0``s are one problem."""
    image(tmp_path / "a.jpg")
    valid = coco_valid(tmp_path / "valid.json", 6 * MB)
    bad = coco_json(tmp_path / "bad.json", "[" + ",".join([entry] * (6 * MB // (len(entry) + 1))) + "]")
    code = f"from colabfast.layouts import Coco; Coco({str(tmp_path)!r}, {{!r}}, on_error={{!r}})"
    ok = measure(code.format(str(valid), "skip"))
    assert ok.error is None
    for on_error in ("skip", "raise"):
        got = measure(code.format(str(bad), on_error))
        assert got.peak - ok.peak < BOUND and got.seconds < 30, (on_error, got)
        if on_error == "raise" or entry == "[]":
            assert got.colabfast_error and str(bad) in got.error, got.error
    if entry == "0":
        layout = Coco(tmp_path, bad, on_error="skip")
        assert len(layout) == 0 and len(layout.skipped) == 1
        assert "images[0] is int, not an object (and " in layout.skipped[0][1]


def test_coco_annotation_of_millions_of_values_refused_before_parsing(tmp_path):
    """One annotation whose segmentation has 8 million numbers (32 MB): before, parsed and packed at
    over 300 MB above a one-annotation file; now refused before parsing (MAX_ENTRY_VALUES)."""
    image(tmp_path / "a.jpg")
    img = '[{"id": 1, "file_name": "a.jpg", "width": 8, "height": 8}]'
    ann = '[{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "segmentation": [[%s]]}]'
    valid = coco_json(tmp_path / "valid.json", img, ann % "1, 1, 2, 2, 3, 1")
    bad = coco_json(tmp_path / "bad.json", img, ann % ",".join(["1.5"] * 8_000_000))
    code = f"from colabfast.layouts import Coco; Coco({str(tmp_path)!r}, {{!r}})"
    ok, got = measure(code.format(str(valid))), measure(code.format(str(bad)))
    assert ok.error is None
    assert got.peak - ok.peak < BOUND and got.seconds < 30, got
    assert got.colabfast_error and "an entry (an image or annotation) of 800" in got.error, got.error


def test_skipped_lists_a_thousand_problems_and_counts_the_rest():
    from colabfast.layouts._untrusted import MAX_LISTED, Skipped

    skipped = Skipped()
    for k in range(MAX_LISTED + 500):
        skipped.add(f"f{k}", "bad")
    assert len(skipped) == MAX_LISTED + 1 and skipped[MAX_LISTED - 1] == (f"f{MAX_LISTED - 1}", "bad")
    assert skipped[-1][1].startswith("... and 500 more problems")


# --- item 6: CSV --------------------------------------------------------------------------------

def test_csv_delimiter_found_without_backtracking(tmp_path):
    """64 kB of ``a,",",",...``: csv.Sniffer's regular expressions took minutes of CPU."""
    image(tmp_path / "a.jpg")
    (tmp_path / "labels.csv").write_text("a," + '",",' * (64_000 // 4) + "\n")
    got = measure(f"from colabfast.layouts import Csv; Csv({str(tmp_path)!r})", timeout=120)
    assert got.seconds < 30 and (got.error is None or got.colabfast_error), got


def test_csv_table_of_one_huge_line_refused_before_csv_splits_it(tmp_path):
    """A 24 MB table of one line: csv split it into 12 million fields (over 800 MB) before any error."""
    image(tmp_path / "a.jpg")
    valid = tmp_path / "valid.csv"
    valid.write_text("path,label\na.jpg,cat\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("a," * (12 * MB) + "\n")
    code = f"from colabfast.layouts import Csv; Csv({str(tmp_path)!r}, {{!r}})"
    ok, got = measure(code.format(str(valid))), measure(code.format(str(bad)))
    assert ok.error is None
    assert got.peak - ok.peak < BOUND and got.seconds < 30, got
    assert got.colabfast_error and f"{bad}, line 1: a line of more than" in got.error, got.error


# --- items 9 and 10: what the shared listing refuses ------------------------------------------------

def yolo_tree(root: Path) -> Path:
    (root / "labels/train").mkdir(parents=True)
    for k in range(2):
        image(root / f"images/train/{k}.jpg", size=(10, 10))  # Ultralytics drops an image under 10 pixels a side
        (root / f"labels/train/{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (root / "data.yaml").write_text("names: [thing]\n")
    return root


def csv_tree(root: Path) -> Path:
    for k in range(2):
        image(root / f"{k}.jpg")
    (root / "labels.csv").write_text("path,label\n0.jpg,a\n1.jpg,b\n")
    return root


def seg_tree(root: Path) -> Path:
    for k in range(2):
        image(root / f"images/{k}.jpg")
        (root / "masks").mkdir(exist_ok=True)
        Image.new("L", (8, 8)).save(root / f"masks/{k}.png")
    return root


def link_out(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


# (the layout, its tree, what is added to it, the path refused, the path that stays out of its samples)
OUTSIDE = {
    "yolo image": (Yolo, yolo_tree, lambda r, s: link_out(r / "images/train/000000.jpg", s),
                   "images/train/000000.jpg"),
    "yolo folder": (Yolo, yolo_tree, lambda r, s: link_out(r / "images/train/more", s.parent),
                    "images/train/more/secret.jpg"),
    "csv image": (Csv, csv_tree, lambda r, s: (link_out(r / "2.jpg", s),
                                                (r / "labels.csv").write_text("path,label\n0.jpg,a\n1.jpg,b\n2.jpg,c")),
                  "2.jpg"),
    "segmentation image": (Segmentation, seg_tree, lambda r, s: (link_out(r / "images/2.jpg", s),
                                                                 Image.new("L", (8, 8)).save(r / "masks/2.png")),
                           "images/2.jpg"),
}


@pytest.mark.parametrize("case", OUTSIDE)
def test_symlink_out_of_the_root_is_refused_or_skipped(tmp_path, case):
    cls, tree, add, rel = OUTSIDE[case]
    secret = image(tmp_path / "elsewhere/secret.jpg", (255, 0, 0))
    root = tree(tmp_path / "root")
    add(root, secret)
    with pytest.raises(LayoutError, match="resolves outside") as info:
        cls(root)
    assert rel in str(info.value)
    layout = cls(root, on_error="skip")
    assert len(layout) == 2 and rel not in layout.paths
    assert any("resolves outside" in why and (rel in path or rel in why) for path, why in layout.skipped)


@pytest.mark.parametrize("kind", ["fifo", "dev/zero"])
def test_yolo_label_file_not_regular_is_refused_or_skipped(tmp_path, kind):
    """A label file that is a FIFO (or a link to /dev/zero) read as no labels: the image went in as
    background, silently. Measured in a child: a FIFO opened for reading would block it."""
    root = yolo_tree(tmp_path / "root")
    label = root / "labels/train/1.txt"
    label.unlink()
    os.mkfifo(label) if kind == "fifo" else label.symlink_to("/dev/zero")
    why = "is not a regular file but a FIFO" if kind == "fifo" else "resolves outside"
    got = measure(f"from colabfast.layouts import Yolo; Yolo({str(root)!r})", timeout=60)
    assert got.colabfast_error and f"{label}: {why}" in got.error, got.error
    layout = Yolo(root, on_error="skip")
    assert layout.paths == ["images/train/0.jpg"] and layout.skipped == [(str(label), why + (
        f" {root}" if kind != "fifo" else ""))]


def test_csv_table_that_is_a_fifo_is_refused(tmp_path):
    root = csv_tree(tmp_path / "root")
    (root / "labels.csv").unlink()
    os.mkfifo(root / "labels.csv")
    got = measure(f"from colabfast.layouts import Csv; Csv({str(root)!r})", timeout=60)
    assert got.colabfast_error and "labels.csv: not a regular file but a FIFO" in got.error, got.error


# --- item 13 ------------------------------------------------------------------------------------

def test_coco_file_name_too_long_is_the_images_problem(tmp_path):
    image(tmp_path / "a.jpg")
    long = "x" * 300 + ".jpg"
    coco_json(tmp_path / "_annotations.coco.json", json.dumps(
        [{"id": 1, "file_name": "a.jpg", "width": 8, "height": 8},
         {"id": 2, "file_name": long, "width": 8, "height": 8}]))
    with pytest.raises(LayoutError, match=r"cannot be looked up \(File name too long\) \(image id 2"):
        Coco(tmp_path)
    layout = Coco(tmp_path, on_error="skip")
    assert layout.ids == [1] and "File name too long" in layout.skipped[0][1]


def test_pack_of_a_layout_with_every_sample_skipped_says_what_was_skipped(tmp_path):
    image(tmp_path / "src/a.jpg")
    coco_json(tmp_path / "src/_annotations.coco.json", json.dumps(
        [{"id": 1, "file_name": "missing.jpg", "width": 8, "height": 8}]))
    with pytest.raises(colabfast.Error, match=r'no sample to pack: on_error="skip" left out every one \(.*missing'
                                              r'\.jpg: is missing'):
        colabfast.pack(tmp_path / "src", tmp_path / "m.h5", layout="coco", on_error="skip", progress=False)
    assert not (tmp_path / "m.h5").exists()


# --- issue 51, items 7 and 8: data.yaml read by one loader everywhere -----------------------------------

def alias_bomb(key: str) -> str:
    """A data.yaml of about 350 bytes whose ``key`` is 9 levels of 9 aliases: 387 million strings once walked
    or printed (PyYAML composes it as a few nodes)."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{b}: &{b} [" + ",".join([f"*{a}"] * 9) + "]" for a, b in zip("abcdefgh", "bcdefghi")]
    rest = {"train": "images/train", "names": "[thing]"}
    return "\n".join(lines) + f"\n{key}: *i\n" + "".join(f"{k}: {v}\n" for k, v in rest.items() if k != key)


YAML_CALLS = {  # each reader of a data.yaml, in a child under a 4 GB address space (a regression ends in MemoryError)
    "pack": "colabfast.pack({root!r}, {out!r} + '/m.h5', progress=False)",
    "open_dataset": "colabfast.open_dataset({root!r}, split='train', mirrors={out!r}, to='disk', progress=False)",
    "ultralytics_data": "colabfast.ultralytics_data({root!r}, mirrors={out!r}, to='disk', progress=False)",
}


@pytest.mark.parametrize("call", YAML_CALLS)
def test_a_yaml_alias_bomb_is_refused_as_it_is_read(tmp_path, call):
    """Before, a bomb in ``nc:`` cost each of them over 4 GB (printed in the refusal), one in ``train:``
    ultralytics_data 3 GB; now each is one LayoutError naming the line, at a valid data.yaml's cost."""
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); import colabfast; "
            + YAML_CALLS[call])
    valid = yolo_tree(tmp_path / "valid")
    (valid / "data.yaml").write_text("train: images/train\nnc: 1\nnames: [thing]\n")
    ok = measure(code.format(root=str(valid), out=str(tmp_path / "out-valid")))
    assert ok.error is None, ok.error
    for key in ("nc", "train"):
        root = yolo_tree(tmp_path / key)
        (root / "data.yaml").write_text(alias_bomb(key))
        assert len(alias_bomb(key)) < 400
        got = measure(code.format(root=str(root), out=str(tmp_path / f"out-{key}")))
        assert got.colabfast_error and got.error.startswith(f"LayoutError: {root / 'data.yaml'}, line 6: holds "
                                                            "more than 250000 values with its aliases expanded"), got
        assert len(got.error) < 400 and got.peak - ok.peak < BOUND and got.seconds < 30, got
        assert not any((tmp_path / f"out-{key}").rglob("*.h5")) and not (tmp_path / key / "m.h5").exists()


YAMLS = {  # (data.yaml's bytes, the start of the refusal)
    "recursive": (b"train: images/train\nnames: &n [thing, *n]\n", "line 2: the alias *n is inside its own anchor"),
    "deep": (b"train: images/train\nnames: [thing]\nnc: " + b"[" * 100 + b"]" * 100 + b"\n",
             "line 3: nests more than 64 levels deep"),
    "latin-1": ("train: images/train\nnames: [café]\n".encode("latin-1"), "line 2: not UTF-8 text (byte 31)"),
    "tag": (b"names: !!python/object/apply:os.system [echo hi]\ntrain: images/train\n", "line 1: not valid YAML"),
    "long nc": (b"train: images/train\nnames: [thing]\nnc: '" + b"9" * 500_000 + b"'\n", "nc is '9999"),
    "long int": (b"train: images/train\nnames: [thing]\nnc: " + b"9" * 500_000 + b"\n", "not valid YAML (Exceeds"),
    "13th month": (b"train: images/train\nnames: [thing]\ndate: 2024-13-01\n", "not valid YAML (month must"),
}


@pytest.mark.parametrize("case", YAMLS)
def test_every_reader_of_a_data_yaml_refuses_it_alike(tmp_path, case):
    """pack, open_dataset and ultralytics_data read data.yaml with one loader: the same LayoutError, naming the
    file and the line, its value shown in at most 200 characters; nothing written. Before: a latin-1 data.yaml
    was a raw UnicodeDecodeError in ultralytics_data, a long int or a 13th month a raw ValueError in all three,
    a long nc: printed whole (500 kB)."""
    data, message = YAMLS[case]
    root = yolo_tree(tmp_path / "ds")
    (root / "data.yaml").write_bytes(data)
    calls = [lambda: colabfast.pack(root, tmp_path / "m.h5", progress=False),
             lambda: colabfast.open_dataset(root, split="train", mirrors=tmp_path / "mirrors", to="disk",
                                            progress=False),
             lambda: colabfast.ultralytics_data(root, mirrors=tmp_path / "mirrors", to="disk", progress=False)]
    for call in calls:
        with pytest.raises(LayoutError) as refused:
            call()
        assert str(refused.value).startswith(f"{root / 'data.yaml'}, {message}") or \
            not message.startswith("line") and message in str(refused.value), str(refused.value)[:300]
        assert len(str(refused.value)) < 500
    assert not (tmp_path / "m.h5").exists() and not any(tmp_path.rglob("*.h5"))
