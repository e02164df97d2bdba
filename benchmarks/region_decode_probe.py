"""What decoding only a crop's region saves on the CPU (issue 42, item 1): nvImageCodec's CPU backend
decoding one box of each JPEG, against decoding it whole (nvImageCodec, and simplejpeg as colabfast's
reader threads do). One thread, microseconds per image, the best of ``--repeats`` rounds.

64 photo-like JPEGs per size (``colabfast.testing.data``); boxes: the whole image, its top, bottom or left
half, a 16 px box at the top left or bottom right, and the boxes ``RandomResizedCrop(224)`` draws
(``v2.RandomResizedCrop.get_params``). Each kind is decoded as a list of sub code streams in one
``Decoder.decode`` call (https://docs.nvidia.com/cuda/nvimagecodec/, ``CodeStream.get_sub_code_stream``).

    pip install nvidia-nvimgcodec-cu12
    taskset -c 0 python benchmarks/region_decode_probe.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

import numpy as np
import simplejpeg
import torch
from torchvision.transforms import v2

from colabfast.testing.data import encode, photo


def best(repeats: int, run: Callable[[], object]) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``run()``, after one untimed call."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    saved = os.dup(2)  # fd 2 to /dev/null: nvImageCodec prints load errors for the GPU libraries it lacks
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
    try:
        from nvidia import nvimgcodec as nv
    finally:
        os.dup2(saved, 2)
    decoder = nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                         backends=[nv.Backend(nv.BackendKind.CPU_ONLY)])
    params = nv.DecodeParams(color_spec=nv.ColorSpec.SRGB, apply_exif_orientation=False)
    print(f"nvimgcodec {getattr(nv, '__version__', '?')}, simplejpeg {simplejpeg.__version__}, one thread, "
          f"us per image (best of {args.repeats})", file=sys.stdout)
    for w, h in ((500, 375), (341, 256)):
        files = [encode(photo(w, h, np.random.default_rng(i))) for i in range(64)]
        torch.manual_seed(0)
        crops = [tuple(v2.RandomResizedCrop.get_params(torch.empty(3, h, w), [0.08, 1.0], [3 / 4, 4 / 3]))
                 for _ in files]
        kinds = {"whole image": [(0, 0, h, w)], "top half": [(0, 0, h // 2, w)],
                 "bottom half": [(h - h // 2, 0, h // 2, w)], "left half": [(0, 0, h, w // 2)],
                 "16 px, top left": [(0, 0, 16, 16)], "16 px, bottom right": [(h - 16, w - 16, 16, 16)],
                 "RandomResizedCrop(224) boxes": crops}
        for name, boxes in kinds.items():
            boxes = (boxes * len(files))[: len(files)]

            def regions(boxes: list = boxes, files: list = files) -> None:
                streams = [nv.CodeStream(data).get_sub_code_stream(
                    region=nv.Region(start=(t, x), end=(t + bh, x + bw))) for data, (t, x, bh, bw) in zip(files, boxes)]
                decoder.decode(streams, params=params)

            print(f"{w}x{h}  {name:30s} {best(args.repeats, regions) / len(files) * 1e6:6.0f}")
        buffer = np.empty(h * w * 3, np.uint8)

        def whole(files: list = files, buffer: np.ndarray = buffer) -> None:
            for data in files:
                simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=buffer)

        print(f"{w}x{h}  {'simplejpeg, whole':30s} {best(args.repeats, whole) / len(files) * 1e6:6.0f}")


if __name__ == "__main__":
    main()
