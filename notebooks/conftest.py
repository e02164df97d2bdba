"""Run the notebooks under nbval on tiny data generated on the spot, with no edits to them.

Each notebook reads its parameters from the environment, with Colab's values as defaults. Before a
notebook's kernel starts, this sets the environment that kernel inherits: tiny mode, small batches and
epochs, this checkout on ``PYTHONPATH``, and a fresh temporary folder that plays Google Drive
(``COLABFAST_DRIVE_ROOT``, shown at ``/content/drive`` by ``colabfast.mount()``) and holds what the
notebooks stage (``TMPDIR``, colabfast's local work folder outside Colab). The quickstart also gets the
FUSE Drive simulator (``COLABFAST_DRIVE_SIM``), so its first measurement shows Drive's latency.
Variables you set yourself win. The environment is restored once the kernel has started, so the tests
in ``tests/`` never see it; at the end of the session anything a notebook left mounted is taken down
and the temporary folder removed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parent.parent

# notebook -> its kernel's environment in the local tests
TINY = {
    "quickstart.ipynb": {
        "COLABFAST_DRIVE_SIM": "open_ms=100,read_ms=2,mbps=60",
        "COLABFAST_MODEL": "mobilenet_v3_small",  # ResNet-18's step is slow on 2 CPUs: the data would not show
        "COLABFAST_BATCH_SIZE": "16",
        "COLABFAST_IMAGE_SIZE": "32",
        "COLABFAST_DRIVE_STEPS": "6",
        "COLABFAST_STEPS": "4",
    },
    "kitti.ipynb": {
        "COLABFAST_VAL_SIZE": "2",
        "COLABFAST_BATCH_SIZE": "2",
        "COLABFAST_EPOCHS": "1",
        "COLABFAST_MIN_SIZE": "96",
        "COLABFAST_MAX_SIZE": "288",
        "COLABFAST_ROIS": "64",
        "COLABFAST_PRETRAINED": "0",  # no downloads in the tests
    },
    "imagenet.ipynb": {
        "COLABFAST_SOURCE": "official",  # tiny official archives; "kaggle" and "folders" run the same way
        "COLABFAST_PACK_SIZE": "36",
        "COLABFAST_CROP": "32",
        "COLABFAST_BATCH_SIZE": "16",
        "COLABFAST_EPOCHS": "2",
        "COLABFAST_STEPS": "3",
        "COLABFAST_SAVE_EVERY": "3",  # 4 steps an epoch: a checkpoint mid-epoch, with the loader's state
    },
    "detection.ipynb": {
        "COLABFAST_BATCH_SIZE": "4",
        "COLABFAST_STEPS": "2",
        "COLABFAST_MIN_SIZE": "96",
        "COLABFAST_MAX_SIZE": "160",
        "COLABFAST_PRETRAINED": "0",  # no downloads in the tests
    },
    "yolo.ipynb": {  # YOLOv8n built from its YAML: no weights downloaded in the tests
        "COLABFAST_MODEL": "yolov8n.yaml",
        "COLABFAST_EPOCHS": "1",
        "COLABFAST_IMAGE_SIZE": "64",
        "COLABFAST_BATCH_SIZE": "4",
        "YOLO_OFFLINE": "true",
        "YOLO_AUTOINSTALL": "false",
    },
    "kaggle.ipynb": {  # a stand-in /kaggle in the session's folder (set in _kernel_env)
        "KAGGLE_KERNEL_RUN_TYPE": "Interactive",
        "COLABFAST_BATCH_SIZE": "8",
        "COLABFAST_IMAGE_SIZE": "32",
    },
    "huggingface.ipynb": {  # its tiny dataset is built in memory: no hub in the tests
        "COLABFAST_BATCH_SIZE": "8",
        "COLABFAST_STEPS": "3",
        "COLABFAST_IMAGE_SIZE": "32",
    },
}

_workdir: Optional[Path] = None


def _session_dir() -> Path:
    global _workdir
    if _workdir is None:
        _workdir = Path(tempfile.mkdtemp(prefix="colabfast-notebooks-"))
        (_workdir / "tmp").mkdir()
    return _workdir


def _kernel_env(notebook: str) -> dict:
    work = _session_dir()
    env = {
        "COLABFAST_TINY": "1",
        "COLABFAST_DRIVE_ROOT": str(work / "drive"),
        **({"COLABFAST_KAGGLE_ROOT": str(work / "kaggle")} if notebook == "kaggle.ipynb" else {}),
        **TINY[notebook],
    }
    env = {k: os.environ.get(k, v) for k, v in env.items()}  # what the caller set wins
    env["TMPDIR"] = str(work / "tmp")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    if notebook != "quickstart.ipynb" and "COLABFAST_DRIVE_SIM" not in os.environ:
        env["COLABFAST_DRIVE_SIM"] = ""
    return env


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """nbval starts a notebook's kernel while setting up its first cell: give it the notebook's environment."""
    name = item.path.name
    if name not in TINY:
        yield
        return
    saved = dict(os.environ)
    os.environ.update(_kernel_env(name))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _mounts_under(folder: Path) -> list[str]:
    """Mountpoints at or below ``folder``, deepest first."""
    prefix = str(folder)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == prefix or mp.startswith(prefix + "/"):
                found.append(mp)
    return sorted(set(found), key=len, reverse=True)


def pytest_sessionfinish(session):
    """Take down what a failed notebook left mounted (the stand-in Drive, a RAM disk) and remove the folder."""
    if _workdir is None:
        return
    saved = os.environ.get("COLABFAST_DRIVE_ROOT")
    os.environ["COLABFAST_DRIVE_ROOT"] = str(_workdir / "drive")
    try:
        from colabfast.drive import mounting
        from colabfast.where import env

        if env.standin_mountpoints():
            print(f"\nnotebooks: a notebook left Drive mounted at {', '.join(env.standin_mountpoints())}; unmounting")
            mounting.flush_and_unmount_standin()
    finally:
        if saved is None:
            del os.environ["COLABFAST_DRIVE_ROOT"]
        else:
            os.environ["COLABFAST_DRIVE_ROOT"] = saved
    for mp in _mounts_under(_workdir):
        subprocess.run(["umount", "-l", mp], check=False, capture_output=True)
    shutil.rmtree(_workdir, ignore_errors=True)
