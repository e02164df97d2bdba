"""What decoding only a crop's box, and a cheaper resize, would save on the CPU (issues 42 and 55): CPU
microseconds per image (``time.thread_time``) of each piece of a ``RandomResizedCrop(224)`` on one thread,
then whether each decoder scales to two Python threads (images/s with 2 threads over 1).

128 photo-like JPEGs per size (``colabfast.testing.data``), the boxes ``v2.RandomResizedCrop.get_params``
draws. Pieces: ``simplejpeg`` decoding whole (colabfast's reader threads), nvImageCodec's CPU decoder whole
and only the box (``CodeStream.get_sub_code_stream(region=...)``, https://docs.nvidia.com/cuda/nvimagecodec/),
libjpeg-turbo's lossless crop (``tjTransform`` with ``TJXOPT_CROP`` through PyTurboJPEG 1.x, on MCU
boundaries) then a decode of the cropped JPEG, and the crop's resize to 224x224 by torch's antialiased
bilinear uint8 kernel (torchvision v2's), OpenCV's ``INTER_LINEAR`` and ``INTER_AREA``, and PIL's
``BILINEAR``, each with its largest and mean difference from v2's pixels. A decoder that is not
installed prints a line saying so. PyTurboJPEG 2.x needs libjpeg-turbo 3.0 (its partial decode,
``tj3SetCroppingRegion``); Debian 12 and 13 ship 2.1.5.

    pip install nvidia-nvimgcodec-cu12 "pyturbojpeg<2" opencv-python-headless   # + apt-get install libturbojpeg0
    taskset -c 0,1 python benchmarks/region_decode_probe.py
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any, Callable

import numpy as np
import simplejpeg
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from colabfast.testing.data import encode, photo


def cost(run: Callable[[], object], n: int, repeats: int) -> float:
    """CPU microseconds per image of the cheapest of ``repeats`` calls of ``run()`` (``n`` images each)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        run()
        best = min(best, time.thread_time() - start)
    return best / n * 1e6


def scaling(make: Callable[[], Callable[[], object]], n: int) -> float:
    """Images/s of two threads over one, each thread running its own ``make()`` four times."""
    def rate(threads: int) -> float:
        runs = [make() for _ in range(threads)]
        workers = [threading.Thread(target=lambda r=r: [r() for _ in range(4)]) for r in runs]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return 4 * n * threads / (time.perf_counter() - start)

    rate(1)
    return rate(2) / rate(1)


def nvimgcodec() -> Any:
    saved = os.dup(2)  # fd 2 to /dev/null: nvImageCodec prints load errors for the GPU libraries it lacks
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
    try:
        from nvidia import nvimgcodec as nv
        return nv
    except ImportError:
        return None
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    nv = nvimgcodec()
    for w, h in ((500, 375), (341, 256)):
        probe(w, h, nv, args.repeats)


def probe(w: int, h: int, nv: Any, repeats: int) -> None:
    """The pieces' costs for JPEGs of ``w`` x ``h`` (see the module docstring)."""
    files = [encode(photo(w, h, np.random.default_rng(i))) for i in range(128)]
    n = len(files)
    torch.manual_seed(0)
    boxes = [tuple(int(v) for v in v2.RandomResizedCrop.get_params(torch.empty(3, h, w), [0.08, 1.0],
                                                                   [3 / 4, 4 / 3])) for _ in files]
    whole = [simplejpeg.decode_jpeg(f, "RGB") for f in files]
    crops = [np.ascontiguousarray(x[t : t + bh, left : left + bw]) for x, (t, left, bh, bw) in zip(whole, boxes)]
    print(f"\n{w}x{h}: CPU us per image, one thread (best of {repeats}); 2 threads / 1 thread")

    def simple() -> Callable[[], None]:
        buffer = np.empty(h * w * 3, np.uint8)
        return lambda: [simplejpeg.decode_jpeg(f, "RGB", buffer=buffer) for f in files]

    print(f"  simplejpeg, whole                     {cost(simple(), n, repeats):6.0f}   "
          f"x{scaling(simple, n):.2f}")
    if nv is None:
        print("  nvImageCodec: not installed (pip install nvidia-nvimgcodec-cu12)")
    else:
        params = nv.DecodeParams(color_spec=nv.ColorSpec.SRGB, apply_exif_orientation=False)

        def decoder() -> object:
            return nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                              backends=[nv.Backend(nv.BackendKind.CPU_ONLY)])

        def nv_whole() -> Callable[[], None]:
            d = decoder()
            return lambda: [d.decode(nv.CodeStream(f), params=params) for f in files]

        def nv_box() -> Callable[[], None]:
            d = decoder()
            return lambda: [d.decode(nv.CodeStream(f).get_sub_code_stream(region=nv.Region(
                start=(t, left), end=(t + bh, left + bw))), params=params)
                for f, (t, left, bh, bw) in zip(files, boxes)]

        print(f"  nvImageCodec CPU, whole               {cost(nv_whole(), n, repeats):6.0f}   "
              f"x{scaling(nv_whole, n):.2f}")
        print(f"  nvImageCodec CPU, the box only        {cost(nv_box(), n, repeats):6.0f}   "
              f"x{scaling(nv_box, n):.2f}")
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()

        def lossless() -> None:
            for f, (t, left, bh, bw) in zip(files, boxes):
                x0, y0 = left // 16 * 16, t // 16 * 16  # MCU boundaries of 4:2:0
                x1, y1 = min(w, -(-(left + bw) // 16) * 16), min(h, -(-(t + bh) // 16) * 16)
                tj.decode(tj.crop(f, x0, y0, x1 - x0, y1 - y0), pixel_format=turbojpeg.TJPF_RGB)

        print(f"  libjpeg-turbo lossless crop + decode  {cost(lossless, n, repeats):6.0f}")
    except Exception as exc:  # not installed, or PyTurboJPEG 2.x over libjpeg-turbo 2.1
        print(f"  PyTurboJPEG: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    out = torch.empty(1, 224, 224, 3, dtype=torch.uint8).permute(0, 3, 1, 2)

    def torch_aa() -> None:
        for c in crops:
            src = torch.from_numpy(c.reshape(1, *c.shape).transpose(0, 3, 1, 2))
            torch._C._nn._upsample_bilinear2d_aa(src, [224, 224], False, None, None, out=out)  # type: ignore[call-arg]

    print(f"  resize, torch AA bilinear (v2's)      {cost(torch_aa, n, repeats):6.0f}   0 levels from v2")
    want = [F.resize(torch.from_numpy(c).permute(2, 0, 1), [224, 224], antialias=True).permute(1, 2, 0).numpy()
            for c in crops]
    resizes: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
    try:
        import cv2

        cv2.setNumThreads(1)
        resizes["OpenCV INTER_LINEAR"] = lambda c: cv2.resize(c, (224, 224), interpolation=cv2.INTER_LINEAR)
        resizes["OpenCV INTER_AREA"] = lambda c: cv2.resize(c, (224, 224), interpolation=cv2.INTER_AREA)
    except ImportError:
        print("  OpenCV: not installed")
    from PIL import Image

    resizes["PIL BILINEAR"] = lambda c: np.asarray(Image.fromarray(c).resize((224, 224), Image.BILINEAR))
    for name, resize in resizes.items():
        diff = [np.abs(resize(c).astype(np.int16) - x) for c, x in zip(crops, want)]
        print(f"  resize, {name:30s}{cost(lambda r=resize: [r(c) for c in crops], n, repeats):6.0f}   "
              f"max {max(int(d.max()) for d in diff)}, mean {np.mean([d.mean() for d in diff]):.2f} levels from v2")



if __name__ == "__main__":
    main()
