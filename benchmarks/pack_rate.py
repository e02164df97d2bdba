"""Pack's rate on a COCO-style folder against the decode bound, alone (``colabfast bench detection``'s
``detection/pack`` scenario without the reading ones): what issue 25's "packing rate vs the decode bound
(>= 0.8)" measures, quick enough to compare code versions one after another.

    taskset -c 0,1 python benchmarks/pack_rate.py --images 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from colabfast.testing.layouts import make_coco
from colabfast.tools.bench import detection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="colabfast-pack-rate-") as name:
        tmp = Path(name)
        folder = tmp / "coco"
        make_coco(folder, args.images, size=detection.IMAGE_SIZE, vary=0.2)
        ours, bound = detection._pack(folder, tmp / "coco.h5", args.images, args.repeats, args.workers, "")
        for row in (ours, bound):
            print(f"{row.method}: {row.seconds:.2f} s ({row.low:.2f}-{row.high:.2f}), "
                  f"{row.metrics['images/s']:,.0f} img/s")
        print(f"x decode bound: {ours.metrics['x decode bound']:.2f}")


if __name__ == "__main__":
    main()
