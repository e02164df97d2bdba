"""The notebooks' data cells outside tiny mode: a dataset that is not where the parameters say is an error
listing what was expected and what is there, and nothing is written to the user's folders (issue 23 item 17).

The parameter and data cells run here, in this process, with the notebook's environment variables;
the whole notebooks run under nbval (see notebooks/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def run_cells(notebook: str, monkeypatch, **environ: str) -> dict:
    """Run ``notebook``'s parameter cell and its data cell (the one that writes the demo data) with
    ``environ`` set; return their namespace."""
    monkeypatch.setenv("COLABFAST_TINY", "0")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    cells = [c.source for c in nbformat.read(NOTEBOOKS / notebook, 4).cells if c.cell_type == "code"]
    parameters = next(s for s in cells if 'os.environ.get("COLABFAST_TINY"' in s)
    data = next(s for s in cells if "from colabfast.testing." in s)
    namespace: dict = {}
    exec(compile("import colabfast as cf\n" + parameters, f"{notebook}:parameters", "exec"), namespace)
    exec(compile(data, f"{notebook}:data", "exec"), namespace)
    return namespace


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_imagenet_missing_train_archive_is_an_error(monkeypatch, tmp_path):
    """The user has Kaggle's zip and left SOURCE="official": no synthetic archives beside it, an error."""
    imagenet = tmp_path / "imagenet"
    imagenet.mkdir()
    (imagenet / "imagenet-object-localization-challenge.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    demo = tmp_path / "demo"
    with pytest.raises(FileNotFoundError) as caught:
        run_cells("imagenet.ipynb", monkeypatch, COLABFAST_SOURCE="official", COLABFAST_IMAGENET=str(imagenet),
                  COLABFAST_DEMO_DIR=str(demo))
    message = str(caught.value)
    assert "missing: ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar, ILSVRC2012_devkit_t12.tar.gz" in message
    assert f"{imagenet} holds: imagenet-object-localization-challenge.zip" in message
    assert "That looks like SOURCE = 'kaggle'" in message and "DEMO = True" in message
    assert tree(imagenet) == ["imagenet-object-localization-challenge.zip"]
    assert not demo.exists()


def test_imagenet_demo_lives_in_its_own_folder(monkeypatch, tmp_path):
    imagenet, demo = tmp_path / "imagenet", tmp_path / "demo"
    imagenet.mkdir()
    monkeypatch.setenv("COLABFAST_PACK_SIZE", "36")
    ns = run_cells("imagenet.ipynb", monkeypatch, COLABFAST_SOURCE="folders", COLABFAST_IMAGENET=str(imagenet),
                   COLABFAST_DEMO_DIR=str(demo), COLABFAST_TINY="1")
    assert tree(imagenet) == []
    assert ns["train_src"] == demo / "train" and (demo / "train").is_dir() and (demo / "val").is_dir()
    assert ns["MIRRORS"] == demo / "mirrors" and ns["CHECKPOINT"].parent == demo / "checkpoints"


def test_quickstart_missing_data_is_an_error(monkeypatch, tmp_path):
    (tmp_path / "mine").mkdir()
    with pytest.raises(FileNotFoundError, match=r"is not a folder \(.* holds: mine\)"):
        run_cells("quickstart.ipynb", monkeypatch, COLABFAST_DATA=str(tmp_path / "typo"))
    assert tree(tmp_path) == ["mine"]


def test_kitti_missing_folder_is_an_error(monkeypatch, tmp_path):
    (tmp_path / "kitti").mkdir()
    (tmp_path / "kitti" / "data_object_image_2.zip").write_bytes(b"")
    with pytest.raises(FileNotFoundError) as caught:
        run_cells("kitti.ipynb", monkeypatch, COLABFAST_KITTI_DIR=str(tmp_path / "kitti"),
                  COLABFAST_DEMO_DIR=str(tmp_path / "demo"))
    assert "is not a KITTI folder: it needs training/image_2" in str(caught.value)
    assert "holds: data_object_image_2.zip" in str(caught.value)
    assert tree(tmp_path) == ["kitti", "kitti/data_object_image_2.zip"]


def test_detection_missing_annotations_is_an_error(monkeypatch, tmp_path):
    """DATA names the export's top folder, not its train/: an error saying so, nothing written."""
    export = tmp_path / "my-dataset"
    (export / "train").mkdir(parents=True)
    (export / "train" / "_annotations.coco.json").write_text("{}")
    (export / "README.roboflow.txt").write_text("")
    with pytest.raises(FileNotFoundError) as caught:
        run_cells("detection.ipynb", monkeypatch, COLABFAST_DATA=str(export), COLABFAST_DEMO_DIR=str(tmp_path / "demo"))
    message = str(caught.value)
    assert f"{export / '_annotations.coco.json'} is not there" in message
    assert "holds: README.roboflow.txt, train" in message and "set DATA to one of them" in message
    assert tree(tmp_path) == ["my-dataset", "my-dataset/README.roboflow.txt", "my-dataset/train",
                              "my-dataset/train/_annotations.coco.json"]


def test_detection_takes_an_export_zip_as_it_is(monkeypatch, tmp_path):
    """Roboflow's export zip on Drive is DATA (the notebook said to unzip it onto Drive): the data cell
    extracts nothing, and step 3 opens the zip's SPLIT with open_dataset."""
    import zipfile

    from colabfast.testing.layouts import make_coco

    export = tmp_path / "export"
    make_coco(export / "train", 2, size=(32, 24))
    make_coco(export / "valid", 1, size=(32, 24))
    archive = tmp_path / "my-dataset.coco.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(export.rglob("*")):
            z.write(path, path.relative_to(export).as_posix())
    before = tree(tmp_path)
    ns = run_cells("detection.ipynb", monkeypatch, COLABFAST_DATA=str(archive), COLABFAST_SPLIT="valid")
    assert ns["ZIP"] is True and ns["DATA"] == archive and ns["SPLIT"] == "valid" and ns["ANNOTATIONS"] is None
    assert tree(tmp_path) == before


def test_detection_missing_export_zip_is_an_error(monkeypatch, tmp_path):
    (tmp_path / "mine.zip").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"typo.zip is not there \(.* holds: mine.zip\)"):
        run_cells("detection.ipynb", monkeypatch, COLABFAST_DATA=str(tmp_path / "typo.zip"))
    assert tree(tmp_path) == ["mine.zip"]


def test_detection_takes_labels_elsewhere(monkeypatch, tmp_path):
    """COCO's own layout: images in one folder, the JSON elsewhere (CocoDetection's root and annFile)."""
    (tmp_path / "train2017").mkdir()
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "instances_train2017.json").write_text("{}")
    ns = run_cells("detection.ipynb", monkeypatch, COLABFAST_DATA=str(tmp_path / "train2017"),
                   COLABFAST_LABELS=str(tmp_path / "annotations" / "instances_train2017.json"))
    assert ns["ANNOTATIONS"] == tmp_path / "annotations" / "instances_train2017.json"
    assert ns["MIRROR"].endswith("colabfast-mirrors/" + f"{tmp_path.name}-train2017.h5")


def test_detection_demo_lives_in_its_own_folder(monkeypatch, tmp_path):
    mine, demo = tmp_path / "mine", tmp_path / "demo"
    mine.mkdir()
    ns = run_cells("detection.ipynb", monkeypatch, COLABFAST_DATA=str(mine), COLABFAST_DEMO_DIR=str(demo),
                   COLABFAST_TINY="1")
    assert tree(mine) == []
    assert ns["DATA"] == demo / "data" / "train"
    assert ns["ANNOTATIONS"] == demo / "data" / "train" / "_annotations.coco.json"
    assert ns["ANNOTATIONS"].is_file() and len(list(ns["DATA"].glob("*.jpg"))) == 12
    assert ns["MIRROR"] == f"{demo}/mirrors/train.h5"
