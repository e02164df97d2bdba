"""Where colabfast runs and with what: Colab, Kaggle or plain Python; Drive; CPUs, RAM, disk, GPU.

The one definition of "in Colab", "on Drive" or "in RAM"; :mod:`colabfast.where.mounttable` reads the mounts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Optional

import psutil

from colabfast.where import mounttable
from colabfast.where import standin as standin
from colabfast.where._fileio import PathLike
from colabfast.where.mounttable import Mount

__all__ = ["DriveMount", "in_colab", "in_kaggle", "in_notebook", "platform", "kaggle_working",
           "drive_kind", "drive_mounts", "standin_mountpoints", "drivefs_dir", "cache_dir", "work_dir",
           "storage", "is_ram", "is_fuse", "cpu_count", "ram_total", "ram_available", "ram_headroom", "disk_free",
           "can_mount", "has_fuse", "shm_size", "recommended_num_workers", "gpu",
           "gpu_utilization", "REQUIRED", "install_problems"]

MIRRORS_FOLDER = "colabfast-mirrors"  # at the top of My Drive, or beside a source that is not on Drive

# What Colab's own drive module checks (google/colab/drive.py). `import google.colab` is no proof:
# the package installs anywhere, and colabfast's stand-in injects a module of that name.
COLAB_MARKER = "/var/colab/hostname"
COLAB_CONTENT = "/content"

GiB = 1 << 30


def in_colab() -> bool:
    """True on a real Google Colab runtime (the file ``/var/colab/hostname`` exists)."""
    return os.path.exists(COLAB_MARKER)


# Kaggle's notebooks: input/ (the datasets, read-only) and working/ (kept as output); another root for tests
KAGGLE_ROOT = os.environ.get("COLABFAST_KAGGLE_ROOT", "/kaggle")
KAGGLE_VARS = ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE")  # set in Kaggle's notebooks


def in_kaggle() -> bool:
    """True in a Kaggle notebook: one of its variables (``KAGGLE_KERNEL_RUN_TYPE``, ``KAGGLE_URL_BASE``)
    is set, or ``/kaggle/input`` exists (`KAGGLE_ROOT`)."""
    return any(name in os.environ for name in KAGGLE_VARS) or os.path.isdir(os.path.join(KAGGLE_ROOT, "input"))


def kaggle_working() -> Path:
    """Kaggle's writable folder, ``/kaggle/working``: kept as the notebook's output (about 20 GB)."""
    return Path(KAGGLE_ROOT) / "working"


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


def _client(m: Mount) -> Optional[str]:
    """Which Drive client a mount is, from the mount table alone (no I/O on the mount)."""
    if m.source == mounttable.DRIVESIM_SOURCE:
        return "drivesim"
    if m.fstype == "fuse.drive":
        return "drivefs"
    if "ocamlfuse" in m.fstype or "ocamlfuse" in m.source:
        return "ocamlfuse"
    return None


def drive_kind(path: PathLike) -> Optional[str]:
    """Which Google Drive client serves ``path``, if any.

    Returns:
        ``"drivefs"`` (Colab's client, fstype ``fuse.drive``), ``"ocamlfuse"`` (google-drive-ocamlfuse),
        ``"drivesim"`` (colabfast's simulator), ``"standin"`` (the local stand-in, or where
        :func:`colabfast.mount` exposed it), or None for anything else.
    """
    m = mounttable.mount_of(path)
    if m is not None:
        client = _client(m)
        if client is not None:
            return client
        if m.mountpoint != "/" and standin.is_bind(m):
            return "standin"
    root = os.path.realpath(standin.root())
    real = os.path.realpath(path)
    if real == root or real.startswith(root + os.sep) or standin.is_links(path):
        return "standin"
    return None


@dataclasses.dataclass(frozen=True)
class DriveMount:
    """A place where Google Drive (or colabfast's stand-in for it) is mounted.

    Attributes:
        mountpoint: e.g. ``"/content/drive"``; Drive's files are under ``mountpoint/MyDrive``.
        kind: ``"drivefs"``, ``"ocamlfuse"``, ``"drivesim"`` or ``"standin"`` (see :func:`drive_kind`).
    """

    mountpoint: str
    kind: str


def standin_mountpoints() -> list[str]:
    """Mountpoints where :func:`colabfast.mount` exposed Drive locally and that still expose it: the
    stand-in's registry checked against this machine's mount table (:func:`colabfast.where.standin.mountpoints`)."""
    return standin.mountpoints()


def drive_mounts() -> list[DriveMount]:
    """Every Google Drive mount visible to this process, in mount order (the mount table, then
    :func:`standin_mountpoints`)."""
    found: dict[str, str] = {}
    for m in mounttable.mounts():
        kind = _client(m) or ("standin" if m.mountpoint != "/" and standin.is_bind(m) else None)
        if kind is not None:
            found[m.mountpoint] = kind
    for mp in standin_mountpoints():
        found.setdefault(os.path.realpath(mp), "standin")
    return [DriveMount(mp, kind) for mp, kind in found.items()]


def drivefs_dir() -> Path:
    """DriveFS's state folder, ``$HOME/.config/Google/DriveFS``: its content cache (everything read
    through the mount), metadata and logs. Colab's drive module keeps its config under
    ``$HOME/.config/Google``; ``HOME`` is ``/root`` there."""
    return Path(os.environ.get("HOME") or Path.home()) / ".config" / "Google" / "DriveFS"


def cache_dir() -> Path:
    """Where colabfast keeps downloads: ``$COLABFAST_CACHE``, else ``$XDG_CACHE_HOME/colabfast``, else
    ``~/.cache/colabfast``."""
    if os.environ.get("COLABFAST_CACHE"):
        return Path(os.environ["COLABFAST_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "colabfast"


def _in_ram(m: Optional[Mount]) -> bool:
    return m is not None and m.fstype in ("tmpfs", "ramfs")


def _on_fuse(m: Optional[Mount]) -> bool:
    return m is not None and (m.fstype == "fuse" or m.fstype.startswith("fuse."))


def is_ram(path: PathLike) -> bool:
    """True if ``path`` lives in RAM (a ``tmpfs`` or ``ramfs`` mount, e.g. ``/dev/shm``)."""
    return _in_ram(mounttable.mount_of(path))


def is_fuse(path: PathLike) -> bool:
    """True if ``path`` is on a FUSE filesystem (Drive, the simulator, sshfs, ...)."""
    return _on_fuse(mounttable.mount_of(path))


def storage(path: PathLike) -> str:
    """Where ``path`` lives, from the mount table (``colabfast doctor`` and :func:`colabfast.diagnose` use it).

    Returns:
        A :func:`drive_kind`, else ``"fuse"`` (sshfs, rclone...), ``"ram"`` (tmpfs, ramfs) or ``"disk"``.
    """
    kind = drive_kind(path)
    if kind is not None:
        return kind
    m = mounttable.mount_of(path)
    return "fuse" if _on_fuse(m) else "ram" if _in_ram(m) else "disk"


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


def disk_free(path: PathLike) -> int:
    """Free bytes on the filesystem holding ``path`` (the nearest existing ancestor of it)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def work_dir() -> Path:
    """Where colabfast puts local data by default: ``/content`` in Colab, else
    ``<tempdir>/colabfast-data-<uid>``, made for this user alone (mode 0700; not named ``colabfast``,
    which a script in the temp folder would import).

    Raises:
        PermissionError: that folder exists but is not this user's own folder (another user, or a
            link, put it there first).
    """
    if in_colab():
        return Path(COLAB_CONTENT)
    path = Path(tempfile.gettempdir()) / f"colabfast-data-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a folder of yours (uid {os.getuid()}): someone else made it, so "
                              f"colabfast will not put your data there. Remove it, or set TMPDIR elsewhere.")
    return path


def is_root() -> bool:
    """True when running as root, which mounting a tmpfs needs (Colab runs as root)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


CAP_SYS_ADMIN = 21  # linux/capability.h: mount(2) needs it


def can_mount() -> bool:
    """True when this process may mount file systems (a tmpfs RAM disk, a bind mount): root with
    ``CAP_SYS_ADMIN`` in its effective capabilities. Colab has both; most Docker containers lack the
    capability even as root."""
    if not is_root():
        return False
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def has_fuse() -> bool:
    """True when FUSE file systems can be mounted here (``/dev/fuse`` exists)."""
    return os.path.exists("/dev/fuse")


def shm_size() -> Optional[int]:
    """Size in bytes of ``/dev/shm`` (a RAM-backed tmpfs on Linux; 5.8 GB on Colab), or None without it."""
    try:
        return shutil.disk_usage("/dev/shm").total
    except OSError:
        return None


def recommended_num_workers() -> int:
    """DataLoader worker processes to use: one per CPU this process may run on, the number above which
    torch's DataLoader warns (``DataLoader.check_worker_number_rationality``)."""
    return cpu_count()


def gpu() -> Optional[dict]:
    """The first CUDA GPU as ``{"name": str, "memory": bytes}``, or None; from torch, else NVML
    (``nvidia-ml-py``) where torch has no CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            torch = None
    if torch is not None and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return {"name": props.name, "memory": props.total_memory}
    nvml = _nvml()
    if nvml is None:
        return None
    pynvml, handle = nvml
    try:
        name = pynvml.nvmlDeviceGetName(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    except Exception:  # NVML raises its own error types for "no driver", "no device", ...
        return None
    return {"name": name.decode() if isinstance(name, bytes) else name, "memory": int(memory)}


def _nvml() -> Optional[tuple]:
    """``(pynvml, handle of GPU 0)`` when ``nvidia-ml-py`` is installed and finds a GPU, else None."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # NVML raises its own error types for "no driver", "no device", ...
        return None


def gpu_utilization() -> Optional[float]:
    """Current utilisation of GPU 0 in percent from NVML (``nvidia-ml-py``), or None without it."""
    nvml = _nvml()
    if nvml is None:
        return None
    pynvml, handle = nvml
    try:
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # NVML raises its own error types
        return None


# What colabfast imports to do its work (pyproject's dependencies), by import name.
REQUIRED = ("torch", "torchvision", "numpy", "h5py", "simplejpeg", "PIL", "tqdm", "psutil", "filelock", "yaml",
            "defusedxml")


def install_problems() -> list[str]:
    """What keeps colabfast from working in this Python, one sentence each with the fix: a required
    package (:data:`REQUIRED`) that does not import, and a torch/torchvision pair that was not built
    together (torchvision ``0.(m + 15)`` goes with torch ``2.m``, as PyTorch's compatibility table
    lists; a mismatched pair fails at ``import torchvision`` with "operator torchvision::nms does not
    exist"). Imports every required package, so it takes a few seconds. Empty when all is well.
    """
    import importlib
    from importlib.metadata import PackageNotFoundError, version

    problems = []
    for name in REQUIRED:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken install raises anything: ImportError, RuntimeError, OSError
            problems.append(f"import {name} fails ({type(exc).__name__}: {str(exc).strip()[:300]})")
    try:
        pair = version("torch"), version("torchvision")
    except PackageNotFoundError:
        return problems
    torch_v, vision_v = (tuple(int(p) for p in v.split("+")[0].split(".")[:2] if p.isdigit()) for v in pair)
    if len(torch_v) == 2 and len(vision_v) == 2 and torch_v[0] == 2 and vision_v != (0, torch_v[1] + 15):
        problems.append(f"torch {pair[0]} and torchvision {pair[1]} were not built together: torchvision "
                        f"0.{vision_v[1]} goes with torch 2.{vision_v[1] - 15}. Install the pair "
                        f"(pip install 'torchvision==0.{torch_v[1] + 15}.*'), or, in Colab, restart the runtime "
                        "after a pip install that replaced torch")
    return problems
