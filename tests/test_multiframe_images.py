"""Multi-frame image files (an animated GIF, WebP or PNG, a multi-page TIFF) read as the format's owner
reads them: in an ImageFolder tree as torchvision's ImageFolder does (``pil_loader`` in
``torchvision/datasets/folder.py``: ``Image.open(f).convert("RGB")``, the first frame), in a YOLO
export as Ultralytics does (``imread`` in ``ultralytics/utils/patches.py``: the first frame or page),
by every output of the mirror: PIL, tensor, the stored bytes decoded, and batches of
``colabfast.DataLoader``. A reader that decoded every frame (``torchvision.io.decode_image`` gives a
GIF as ``[N, H, W, C]``) would give another shape or other pixels."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.io import ImageReadMode, decode_image

import colabfast as cf
from colabfast.images.decode import decode_cpu
from colabfast.layouts import Yolo
from colabfast.where.codec import quiet_torchvision

RNG = np.random.default_rng(7)
W, H = 32, 24


def frames(n: int = 3) -> list[Image.Image]:
    """``n`` frames of random pixels, each unlike the others."""
    return [Image.fromarray(RNG.integers(0, 256, (H, W, 3), dtype=np.uint8)) for _ in range(n)]


def animated(fmt: str, **extra: object) -> bytes:
    """A file of 3 frames in ``fmt`` (GIF, WEBP, PNG: APNG, TIFF: one page each), saved with ``save_all``."""
    first, *rest = frames()
    out = io.BytesIO()
    extra.update({"duration": 100, "loop": 0} if fmt in ("GIF", "WEBP", "PNG") else {})
    if fmt == "WEBP":
        extra["lossless"] = True
    first.save(out, fmt, save_all=True, append_images=rest, **extra)
    data = out.getvalue()
    with Image.open(io.BytesIO(data)) as img:
        assert getattr(img, "n_frames", 1) == 3, fmt
    return data


FILES = {  # name in the tree -> the file's format (a GIF named .png: ImageFolder lists it by its name)
    "a/pages.tiff": ("TIFF", {}), "a/anim.webp": ("WEBP", {}), "b/anim.png": ("PNG", {}),
    "b/gif_named.png": ("GIF", {}),
    # an APNG whose IDAT image is not a frame of its animation: PIL and libpng read that image
    "b/hidden_default.png": ("PNG", {"default_image": True}),
}


def test_imagefolder_multiframe_files_are_their_first_frame_in_every_output(tmp_path):
    root = tmp_path / "tree"
    for name, (fmt, extra) in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(animated(fmt, **extra))
    tv = ImageFolder(str(root))
    want = [(np.asarray(image), label) for image, label in tv]
    assert len(want) == len(FILES) and all(a.shape == (H, W, 3) for a, _ in want)
    m = cf.pack(root, tmp_path / "m.h5", progress=False)
    pil, tensor = cf.H5ImageFolder(m), cf.H5ImageFolder(m, output="tensor")
    encoded = cf.H5ImageFolder(m, output="bytes")
    assert [(Path(p).relative_to(root), c) for p, c in pil.samples] == [
        (Path(p).relative_to(root), c) for p, c in tv.samples]
    for i, (pixels, label) in enumerate(want):
        image, got = pil[i]
        assert image.mode == "RGB" and np.array_equal(np.asarray(image), pixels) and got == label, tv.samples[i]
        chw, got = tensor[i]
        assert tuple(chw.shape) == (3, H, W) and np.array_equal(chw.permute(1, 2, 0).numpy(), pixels), tv.samples[i]
        assert np.array_equal(decode_cpu(encoded[i][0]).permute(1, 2, 0).numpy(), pixels), tv.samples[i]
        # torchvision's own decoder on the stored bytes (decode_gif would give every frame of a GIF kept)
        with quiet_torchvision():  # deprecated by torchvision 0.29, the oracle here all the same
            theirs = decode_image(encoded[i][0], mode=ImageReadMode.RGB)
        assert np.array_equal(theirs.permute(1, 2, 0).numpy(), pixels), tv.samples[i]
    images, labels = next(iter(cf.DataLoader(tensor, len(want), num_workers=0, device="cpu")))
    assert tuple(images.shape) == (len(want), 3, H, W)
    assert np.array_equal(images.permute(0, 2, 3, 1).numpy(), np.stack([p for p, _ in want]))
    assert labels.tolist() == [label for _, label in want]


def test_yolo_multiframe_files_are_what_ultralytics_reads(tmp_path):
    """Ultralytics keeps them (``verify_image_label``) and reads the first page or frame (``imread``)."""
    utils = pytest.importorskip("ultralytics.data.utils")
    from ultralytics.utils.patches import imread

    root = tmp_path / "ds"
    (root / "images").mkdir(parents=True)
    (root / "data.yaml").write_text("names: [x]\n")
    for name, fmt in {"pages.tiff": "TIFF", "anim.webp": "WEBP", "anim.png": "PNG"}.items():
        (root / "images" / name).write_bytes(animated(fmt))
    (root / "labels").mkdir()
    (root / "labels/anim.txt").write_text("0 0.5 0.5 0.2 0.4\n")  # the others: background images
    paths = Yolo(root).paths
    mirror = cf.H5Dataset(cf.pack(root, tmp_path / "y.h5", progress=False))
    tensors = cf.H5Dataset(tmp_path / "y.h5", output="tensor")
    assert paths == ["images/anim.png", "images/anim.webp", "images/pages.tiff"] and len(mirror) == 3
    for i, rel in enumerate(paths):
        image = root / rel
        kept = utils.verify_image_label((str(image), str(root / "labels" / (image.stem + ".txt")), "", False, 1, 0,
                                         0, False))
        assert kept[1] is not None, kept[-1]
        theirs = imread(str(image))[..., ::-1]  # BGR to RGB
        assert theirs.shape == (H, W, 3), rel
        assert np.array_equal(np.asarray(mirror[i][0]), theirs), rel
        assert np.array_equal(tensors[i][0].permute(1, 2, 0).numpy(), theirs), rel
