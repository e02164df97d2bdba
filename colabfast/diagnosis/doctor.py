"""``colabfast doctor``: this machine, where your data lives, and how to feed the GPU from here.

:func:`describe` turns :mod:`colabfast.where.env`'s probes into advice; where staging would put your data and
whether it fits come from :mod:`colabfast.staging` itself, so the advice is what ``stage`` will do.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
import zipfile
from pathlib import Path
from typing import Optional

from colabfast.staging.destination import Destination, check_space, default_destination
from colabfast.staging.extract import archive_suffix, extracted_size, strip_archive_suffix
from colabfast.where import codec, env, mounttable
from colabfast.where import standin as standin
from colabfast.where._fileio import PathLike, human_bytes

__all__ = ["describe"]

LISTING_BUDGET = 5.0  # seconds spent summing the data's size; a big folder on Drive lists slowly

_PLATFORM_NAMES = {
    "colab": "Google Colab",
    "kaggle": "Kaggle",
    "jupyter": "Jupyter kernel (not Colab)",
    "python": "plain Python (not Colab, Kaggle or Jupyter)",
}
_KIND_NAMES = {
    "drivefs": "Google Drive (DriveFS)",
    "ocamlfuse": "Google Drive (google-drive-ocamlfuse)",
    "drivesim": "the Drive simulator",
    "standin": "colabfast's local stand-in for Drive",
}
_REMOTE = ("drivefs", "ocamlfuse", "drivesim")  # Drive kinds where every open is a network round trip


def describe(data: Optional[PathLike] = None) -> str:
    """The environment and concrete advice for feeding a GPU from it, as text (``colabfast doctor``).

    Args:
        data: your dataset folder or file, if any: the advice then says where it lives, whether it fits
            on a RAM disk or a staged copy on disk (its size summed for at most 5 seconds).

    Returns:
        Lines ``name  value`` (platform, CPUs, RAM, disk, ``/dev/shm``, mount rights, Drive, GPU, JPEG
        decoder), then an ``advice`` list, led by install problems
        (:func:`colabfast.where.env.install_problems`), then the ended runs' stream caches it deleted.
    """
    broken = env.install_problems()
    leftovers = _stream_leftovers()  # first: the disk's free space then counts what they took
    work = env.work_dir()
    gpu_info = env.gpu()
    decode = gpu_info is not None and codec.gpu_decode_available()
    drives = env.drive_mounts()
    rows = _machine_rows(work, gpu_info, decode, drives)

    advice = [f"fix this first: {problem}" for problem in broken] + leftovers
    path, plan = None, None
    if data is None:
        advice += _drive_advice(drives)
    else:
        path = os.path.abspath(os.path.expanduser(os.fspath(data)))
        if not os.path.exists(path):
            advice.append(
                f"{path} does not exist: check the path (in Colab, Drive files are under "
                f"{standin.DEFAULT_MOUNTPOINT}/MyDrive after colabfast.mount())"
            )
        else:
            size, files = _tree_size(path)
            if size is None:
                rows.append(("data", f"{path}: over {files:,} files (listing slow)"))
            else:
                rows.append(("data", f"{path}: {human_bytes(size)} in {files:,} files"))
            plan = _stage_plan(path, size)
            advice += _where(path, plan)
    advice.append(_ram_advice(path, plan))
    advice += _compute_advice(gpu_info, decode)

    width = max(len(name) for name, _ in rows)
    text = [f"{name:<{width}}  {value}" for name, value in rows]
    text += ["", "advice:"] + [f"- {a}" for a in advice]
    return "\n".join(text)


def _stream_leftovers() -> list[str]:
    """Delete the stream caches of processes gone (a kernel restarted while it streamed); a line saying so."""
    from colabfast.loading.streaming import clean

    gone = clean()
    if not gone:
        return []
    return [f"deleted {len(gone)} stream cache folder{'s' * (len(gone) > 1)} ({human_bytes(sum(n for _, n in gone))}) "
            f"left under {gone[0][0].parent} by runs that ended while they streamed"]


def _machine_rows(
    work: Path, gpu_info: Optional[dict], decode: bool, drives: list[env.DriveMount]
) -> list[tuple[str, str]]:
    """The report's ``name  value`` rows about the machine."""
    shm = env.shm_size()
    can_mount = "yes" if env.can_mount() else "no"
    has_fuse = "yes" if env.has_fuse() else "no"
    rows = [
        ("platform", _PLATFORM_NAMES[env.platform()]),
        ("CPUs", str(env.cpu_count())),
        ("RAM", f"{human_bytes(env.ram_total())} total, {human_bytes(env.ram_available())} available"),
        ("disk", f"{human_bytes(env.disk_free(work))} free on {work}"),
        ("/dev/shm", "absent" if shm is None else f"{human_bytes(shm)}, {human_bytes(env.disk_free('/dev/shm'))} free"),
        ("mounting", f"tmpfs/bind: {can_mount}, FUSE: {has_fuse}"),
        ("Drive", "; ".join(f"{_KIND_NAMES[d.kind]} at {d.mountpoint}" for d in drives) or "not mounted"),
    ]
    if gpu_info is None:
        rows.append(("GPU", "none"))
    else:
        on_gpu = "yes" if decode else "no"
        rows.append(("GPU", f"{gpu_info['name']}, {human_bytes(gpu_info['memory'])}; JPEG decode on GPU: {on_gpu}"))
    rows.append(("JPEGs", f"decoded by {codec.jpeg_codec()}"))  # colabfast.where.codec: torchcodec or torchvision.io
    return rows


def _tree_size(path: str, budget_s: float = LISTING_BUDGET) -> tuple[Optional[int], int]:
    """(bytes, files) under ``path``; bytes is None when listing takes over ``budget_s`` seconds."""
    if os.path.isfile(path):
        return os.path.getsize(path), 1
    deadline = time.monotonic() + budget_s
    total = files = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
            files += 1
        if time.monotonic() > deadline:
            return None, files
    return total, files


def _drive_advice(drives: list[env.DriveMount]) -> list[str]:
    """Advice without a data path: do not train from a Drive mount; mount Drive in Colab."""
    advice = [
        f"Drive is mounted at {d.mountpoint} ({_KIND_NAMES[d.kind]}): do not train from it, stage "
        f"your data to local disk first: colabfast.stage('{d.mountpoint}/MyDrive/<your data>')"
        for d in drives
    ]
    if not drives and env.in_colab():
        advice.append(f"Drive is not mounted: colabfast.mount() mounts it at {standin.DEFAULT_MOUNTPOINT}")
    advice.append("run `colabfast doctor PATH` with your data folder for advice on that data")
    return advice


def _stage_plan(path: str, size: Optional[int]) -> Optional[tuple[int, Destination]]:
    """What ``colabfast.stage(path)`` would stage: the bytes (an archive's once extracted) and where
    they go, by stage's own rule; None while the size is unknown (listing it took too long)."""
    if size is None:
        return None
    name, single = os.path.basename(path), os.path.isfile(path)
    if single and archive_suffix(path):
        name, single = strip_archive_suffix(name), False
        with contextlib.suppress(OSError, ValueError, zipfile.BadZipFile):  # stage() reports a broken archive
            size = extracted_size(path)
    return size, default_destination(name, size, single=single)


def _where(data: str, plan: Optional[tuple[int, Destination]]) -> list[str]:
    """Advice on where ``data`` lives, and whether staging it (``plan``) fits."""
    where = env.storage(data)
    m = mounttable.mount_of(data)
    if where in _REMOTE:
        advice = [
            f"your data is under {m.mountpoint if m else data} ({_KIND_NAMES[where]}): every file open is a "
            f"network round trip, so training would wait on Drive; stage it first: "
            f"colabfast.stage({data!r})"
        ]
        if plan is not None:
            nbytes, chosen = plan
            # stage()'s own preflight: twice the size when DriveFS caches what it reads, where a
            # folder only warns (DriveFS evicts its cache as the disk fills): its warning is advice here
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    check_space(nbytes, chosen.path or env.work_dir() / os.path.basename(data), Path(data),
                                folder=os.path.isdir(data))
                except OSError as e:
                    advice.append(e.strerror or str(e))
            advice += [str(w.message) for w in caught]
        return advice
    if where == "standin":
        return [
            f"your data is in {_KIND_NAMES[where]} ({standin.root()}): local-disk speed here, Drive speed "
            f"in Colab; colabfast.stage({data!r}) works the same in both"
        ]
    fstype, mountpoint = (m.fstype, m.mountpoint) if m else ("unknown file system", "?")
    if where == "ram":
        return [f"your data is in RAM ({fstype} at {mountpoint}): nothing reads faster"]
    if where == "fuse":
        return [
            f"your data is on a FUSE mount ({fstype} at {mountpoint}): network file systems are slow "
            f"per file; stage it to local disk: colabfast.stage({data!r})"
        ]
    return [f"your data is on local disk ({fstype}): fine to train from"]


def _ram_room() -> tuple[int, str]:
    """Bytes a RAM disk may take, and how that was worked out."""
    avail, keep = env.ram_available(), env.ram_headroom()
    room = max(0, avail - keep)
    how = f"{human_bytes(avail)} available, {human_bytes(keep)} kept for training"
    if not env.can_mount() and env.shm_size() is not None and env.disk_free("/dev/shm") < room:
        room = env.disk_free("/dev/shm")
        how += f", and /dev/shm (free {human_bytes(room)}) is the only RAM disk without mount rights"
    return room, how


def _ram_advice(data: Optional[str], plan: Optional[tuple[int, Destination]]) -> str:
    """Where ``colabfast.stage(data)`` puts the data (``plan``, from stage's own rule), and whether a
    RAM disk could hold it; without a plan, how much a RAM disk can hold."""
    room, how = _ram_room()
    if plan is None:
        return f"a RAM disk can hold up to {human_bytes(room)} ({how})"
    nbytes, chosen = plan
    line = f"your data takes {human_bytes(nbytes)}: colabfast.stage() puts it on "
    if chosen.ram:
        return line + f"a RAM disk ({chosen.why})"
    line += f"local disk, at {chosen.path} ({chosen.why})"
    if nbytes > room:
        return line + f"; it is too big for a RAM disk (room for {human_bytes(room)}: {how})"
    if env.in_colab():
        return line + f"; a RAM disk could hold it (room for {human_bytes(room)}: {how}), leaving little RAM spare"
    return (line + f"; a RAM disk can hold it (room for {human_bytes(room)}: {how}): "
            f"colabfast.stage({data!r}, to='ram') puts it there, and `colabfast ramdisk --release` "
            f"gives the RAM back")


def _compute_advice(gpu_info: Optional[dict], decode: bool) -> list[str]:
    """DataLoader workers, and where JPEGs should be decoded."""
    n = env.recommended_num_workers()
    line = f"DataLoader(num_workers={n}): one worker per CPU this process may use"
    if n <= 2:
        line += (
            f"; with {n} CPUs JPEG decoding caps near 2k images/s at ImageNet size: store pre-resized "
            "images or decode on the GPU"
        )
    if gpu_info is None:
        return [line, "no CUDA GPU" + (": Runtime > Change runtime type > GPU" if env.in_colab() else "")]
    if decode:
        return [
            line,
            f"the GPU decodes JPEGs (nvJPEG): {codec.jpeg_codec().name}.decode_jpeg(data, device='cuda') "
            "takes decoding off the CPUs",
        ]
    return [line, "this torchvision cannot decode JPEGs on the GPU: decoding stays on the CPU workers"]
