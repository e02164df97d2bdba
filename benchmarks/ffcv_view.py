"""What FFCV's rows in ``colabfast bench epoch`` measure: its ``CenterCrop`` batch is a view of the
uncropped batch, so the crop's copy is left to whoever uses the batch. This times, taking turns, FFCV
as it yields, the same batches made dense (``x.contiguous(memory_format=torch.channels_last)``, the
copy a model's first layer or ``.cuda()`` makes of a strided batch) and colabfast's mirror with the
loader's defaults in channels-last (dense already): raw pixels (FFCV ``raw``, ``store="raw"``), or with
``--jpg`` JPEGs (FFCV ``jpg``, the encoded mirror): images/s and CPU ms per image of the process tree,
medians of ``--repeats`` turns. Needs FFCV.

    taskset -c 0,1 python benchmarks/ffcv_view.py [--jpg] [--images 2000] [--size 256 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Callable, Iterable

import torch
from torchvision.datasets import ImageFolder

import colabfast as cf
from colabfast.testing import data
from colabfast.tools.bench import epoch, peers
from colabfast.tools.bench.loader import _rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, nargs=2, default=(256, 256), metavar=("W", "H"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="each method's share of a round")
    parser.add_argument("--jpg", action="store_true", help="JPEGs (FFCV jpg, the encoded mirror), not raw pixels")
    args = parser.parse_args()
    peer, kind, store = (peers.FFCV_JPG, "jpg", "encoded") if args.jpg else (peers.FFCV_RAW, "raw", "raw")
    if missing := peer.missing():
        raise SystemExit(f"FFCV {missing}")
    with tempfile.TemporaryDirectory(prefix="colabfast-ffcv-view-") as name:
        tmp = Path(name)
        src = data.make_imagefolder(tmp / "src", classes=10, per_class=args.images // 10, size=tuple(args.size))
        peer.prepare(ImageFolder(str(src)).samples, tmp / "ffcv", tuple(args.size), 2)
        mirror = cf.pack(src, tmp / f"{store}.h5", store=store, progress=False)
        crop = epoch.transform()
        ffcv = peer.loader(tmp / "ffcv", crop, 64, 2, None)
        ours = cf.DataLoader(cf.H5ImageFolder(mirror, output="tensor", transform=crop), 64, shuffle=True,
                             device="cpu", memory_format=torch.channels_last)
        methods: dict[str, Callable[[], Iterable]] = {
            f"FFCV ({kind}), as it yields": lambda: ffcv,
            f"FFCV ({kind}), each batch made dense": lambda: epoch.Dense(ffcv),
            f"colabfast {store} mirror (defaults, channels-last)": lambda: ours,
        }
        x, _ = next(iter(ffcv))
        print(f"FFCV's batch: shape {tuple(x.shape)}, strides {x.stride()}, dense channels-last: "
              f"{x.is_contiguous(memory_format=torch.channels_last)}")
        # taking turns, a warm-up epoch each first (FFCV compiles its pipeline then); CPU of the process tree
        rates = _rates({key: make() for key, make in methods.items()}, args.repeats, args.seconds)
        dense, as_yielded = rates[f"FFCV ({kind}), each batch made dense"], rates[f"FFCV ({kind}), as it yields"]
        for key, r in rates.items():
            print(f"{key}: {r.rate.median:,.0f} images/s (min-max {r.rate.low:,.0f}-{r.rate.high:,.0f}), "
                  f"{r.cost.median:.3f} CPU ms/img (min-max {r.cost.low:.3f}-{r.cost.high:.3f}); "
                  f"x FFCV made dense {r.rate.median / dense.rate.median:.2f} (by CPU "
                  f"{dense.cost.median / r.cost.median:.2f}), x FFCV as it yields "
                  f"{r.rate.median / as_yielded.rate.median:.2f} (by CPU {as_yielded.cost.median / r.cost.median:.2f})")

if __name__ == "__main__":
    main()
