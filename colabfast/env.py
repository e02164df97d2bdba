"""Where colabfast runs and with what: Colab, Kaggle or plain Python; mounts; CPUs, RAM, disk, GPU.

Every other module asks this one instead of probing the machine itself, so there is one definition
of "we are in Colab", "this path is on Drive" or "this path is in RAM".
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import psutil

# What Colab's own drive module checks (google/colab/drive.py). `import google.colab` is no proof:
# the package installs anywhere, and colabfast's stand-in injects a module of that name.
COLAB_MARKER = "/var/colab/hostname"
COLAB_CONTENT = "/content"

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Mount:
    """One entry of the mount table (``/proc/self/mountinfo``).

    Attributes:
        mountpoint: where it is mounted.
        fstype: kernel filesystem type, e.g. ``"ext4"``, ``"tmpfs"``, ``"fuse.drive"``.
        source: the mount source, e.g. ``"/dev/sda1"``, ``"drive"``, ``"colabfast-drivesim"``.
    """

    mountpoint: str
    fstype: str
    source: str


def in_colab() -> bool:
    """True on a real Google Colab runtime (the file ``/var/colab/hostname`` exists)."""
    return os.path.exists(COLAB_MARKER)


def in_kaggle() -> bool:
    """True in a Kaggle notebook (``KAGGLE_KERNEL_RUN_TYPE`` is set there, and only there)."""
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ


def in_notebook() -> bool:
    """True inside a Jupyter/IPython kernel (Colab included), False in a plain interpreter."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def platform() -> str:
    """``"colab"``, ``"kaggle"``, ``"jupyter"`` or ``"python"``."""
    if in_colab():
        return "colab"
    if in_kaggle():
        return "kaggle"
    return "jupyter" if in_notebook() else "python"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts() -> list[Mount]:
    """The mount table of this process, in mount order (later entries shadow earlier ones)."""
    table = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) >= 5 and len(tail) >= 2:
                    table.append(Mount(_unescape(fields[4]), tail[0], _unescape(tail[1])))
    except OSError:  # not Linux: report every path as on one unknown filesystem
        pass
    return table


def mount_of(path: str | os.PathLike) -> Optional[Mount]:
    """The mount that holds ``path`` (the longest mountpoint prefix of its real path), or None."""
    real = os.path.realpath(path)
    best: Optional[Mount] = None
    for m in mounts():
        mp = m.mountpoint
        if real == mp or real.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mountpoint):
                best = m
    return best


def drive_kind(path: str | os.PathLike) -> Optional[str]:
    """Which Google Drive client serves ``path``, if any.

    Returns:
        ``"drivefs"`` (Colab's current client, fstype ``fuse.drive``), ``"ocamlfuse"``
        (google-drive-ocamlfuse, Colab's old client), ``"drivesim"`` (colabfast's FUSE simulator of
        Drive), ``"standin"`` (colabfast's local stand-in folder), or None for anything else.
    """
    m = mount_of(path)
    if m is not None:
        if m.source == "colabfast-drivesim":
            return "drivesim"
        if m.fstype == "fuse.drive":
            return "drivefs"
        if "ocamlfuse" in m.fstype or "ocamlfuse" in m.source:
            return "ocamlfuse"
    root = os.path.realpath(standin_root())
    real = os.path.realpath(path)
    if real == root or real.startswith(root + os.sep):
        return "standin"
    return None


def standin_root() -> Path:
    """The folder that plays Google Drive outside Colab (see :func:`colabfast.mount`).

    ``$COLABFAST_DRIVE_ROOT`` when set, else ``~/colabfast-drive``. It holds ``MyDrive/`` and
    ``Shareddrives/`` as Drive does.
    """
    return Path(os.environ.get("COLABFAST_DRIVE_ROOT") or Path.home() / "colabfast-drive")


def is_ram(path: str | os.PathLike) -> bool:
    """True if ``path`` lives in RAM (a ``tmpfs`` or ``ramfs`` mount, e.g. ``/dev/shm``)."""
    m = mount_of(path)
    return m is not None and m.fstype in ("tmpfs", "ramfs")


def is_fuse(path: str | os.PathLike) -> bool:
    """True if ``path`` is on a FUSE filesystem (Drive, the simulator, sshfs, ...)."""
    m = mount_of(path)
    return m is not None and (m.fstype == "fuse" or m.fstype.startswith("fuse."))


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, which containers restrict), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def ram_total() -> int:
    """Physical memory in bytes."""
    return psutil.virtual_memory().total


def ram_available() -> int:
    """Memory in bytes that can be given to new data without swapping (``MemAvailable``)."""
    return psutil.virtual_memory().available


def ram_headroom() -> int:
    """Bytes of RAM colabfast leaves free for training itself: max(2 GiB, 25% of total)."""
    return max(2 * GiB, ram_total() // 4)


def disk_free(path: str | os.PathLike) -> int:
    """Free bytes on the filesystem holding ``path`` (the nearest existing ancestor of it)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def work_dir() -> Path:
    """Where colabfast puts local data by default: ``/content`` in Colab, else a temp folder."""
    if in_colab():
        return Path(COLAB_CONTENT)
    return Path(tempfile.gettempdir()) / "colabfast"


def is_root() -> bool:
    """True when running as root, which mounting a tmpfs needs (Colab runs as root)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def gpu() -> Optional[dict]:
    """The first CUDA GPU as ``{"name": str, "memory": bytes}``, or None when torch sees none."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "memory": props.total_memory}


def gpu_utilization() -> Optional[float]:
    """Current utilisation of GPU 0 in percent from NVML (``nvidia-ml-py``), or None without it."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # NVML raises its own error types for "no driver", "no device", ...
        return None
