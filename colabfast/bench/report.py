"""Benchmark results as Markdown tables (pandas-free), with ratios against colabfast's own row."""

from __future__ import annotations

from itertools import groupby

from colabfast.bench.timing import Result

OURS = "colabfast"


def _ours(rows: list[Result]) -> Result | None:
    return next((r for r in rows if r.method.startswith(OURS) and r.seconds), None)


def markdown(results: list[Result]) -> str:
    """One Markdown table per scenario: time (median, min-max), rates, and each method's time
    as a multiple of colabfast's (``12.0x`` = takes 12 times as long)."""
    out = []
    for scenario, group in groupby(results, key=lambda r: r.scenario):
        rows = list(group)
        ours = _ours(rows)
        keys = [k for k in ("images/s", "MB/s", "files/s", "link_fraction") if any(k in r.metrics for r in rows)]
        out.append(f"### {scenario}\n")
        out.append("| method | seconds (min-max) | " + " | ".join(keys) + " | time vs colabfast |")
        out.append("|---|---|" + "---|" * len(keys) + "---|")
        for r in rows:
            if r.seconds is None:
                out.append(f"| {r.method} | {r.note or 'n/a'} |" + " |" * len(keys) + " |")
                continue
            cells = [f"{r.metrics[k]:.2f}" if k in r.metrics else "" for k in keys]
            ratio = f"{r.seconds / ours.seconds:.1f}x" if ours else ""
            spread = f"{r.seconds:.2f} ({r.low:.2f}-{r.high:.2f})" if r.repeats > 1 else f"{r.seconds:.2f}"
            out.append(f"| {r.method} | {spread} | " + " | ".join(cells) + f" | {ratio} |")
        notes = [f"{r.method}: {r.note}" for r in rows if r.note and r.seconds is not None]
        out.extend(["", *[f"- {n}" for n in notes]] if notes else [""])
    return "\n".join(out)
