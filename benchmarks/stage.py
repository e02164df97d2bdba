"""Issue 2's staging benchmark: python benchmarks/stage.py [--size 1.0]"""

from __future__ import annotations

import argparse

from colabfast.bench import staging
from colabfast.bench.report import markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=float, default=1.0, help="1.0: 2000 x 100 kB files, a 1 GB file, 10k files")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = staging.run(size=args.size, repeats=args.repeats)
    print(markdown(rows))
    by = {(r.scenario, r.method): r for r in rows}
    checks = [
        ("small files: >= 40x faster than cp -r", "staging/small-files", "cp -r",
         lambda ours, other: other.seconds / ours.seconds >= 40),
        ("small files: within 1.5x of the link limit", "staging/small-files", None,
         lambda ours, _: ours.metrics["link_fraction"] >= 1 / 1.5),
        ("one large file: >= 90% of the bandwidth", "staging/large-file", None,
         lambda ours, _: ours.metrics["link_fraction"] >= 0.9),
        ("zip: >= 80% of the bandwidth", "staging/zip", None, lambda ours, _: ours.metrics["link_fraction"] >= 0.8),
        ("tar.gz: >= 80% of the bandwidth", "staging/tar.gz", None,
         lambda ours, _: ours.metrics["link_fraction"] >= 0.8),
    ]
    print("\nTargets:")
    for text, scenario, other, ok in checks:
        ours = by.get((scenario, "colabfast.stage"))
        if ours is None or (other and by.get((scenario, other)) is None):
            continue
        print(f"- {text}: {'met' if ok(ours, by.get((scenario, other))) else 'NOT met'}")


if __name__ == "__main__":
    main()
