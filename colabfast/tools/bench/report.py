"""Benchmark results as Markdown tables (pandas-free), a JSON file and a PNG bar chart, with ratios
measured within one run: colabfast's best row against every other row, and every row against the best
alternative (the fastest row that is neither colabfast's nor a reference such as the decode ceiling)."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import platform
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from colabfast.tools.bench.timing import Result

OURS = "colabfast"
CPU = "CPU ms/img"  # the metric of CPU per image (colabfast.tools.bench.timing.usage)
SCHEMA = 1  # version of the JSON layout written by to_json
# Distributions whose versions a report records (the peers' too, when installed).
PACKAGES = ("colabfast", "torch", "torchvision", "numpy", "h5py", "pillow", "mfusepy", "matplotlib",
            "webdataset", "litdata", "mosaicml-streaming", "efficio", "ffcv", "spdl")
COLOURS = {"ours": "#e8710a", "alternative": "#80868b", "reference": "#c6dafc"}


def scenarios(results: Sequence[Result]) -> list[tuple[str, list[Result]]]:
    """``(scenario, rows)`` in order of first appearance (rows of one scenario need not be adjacent)."""
    order: dict[str, list[Result]] = {}
    for r in results:
        order.setdefault(r.scenario, []).append(r)
    return list(order.items())


def is_ours(r: Result) -> bool:
    return r.method.startswith(OURS) and not r.reference


def ours(rows: Sequence[Result]) -> Optional[Result]:
    """colabfast's fastest measured row, or None."""
    measured = [r for r in rows if is_ours(r) and r.speed]
    return max(measured, key=lambda r: r.speed) if measured else None


def best_alternative(rows: Sequence[Result]) -> Optional[Result]:
    """The fastest measured row that is neither colabfast's nor a reference, or None."""
    measured = [r for r in rows if not is_ours(r) and not r.reference and r.speed]
    return max(measured, key=lambda r: r.speed) if measured else None


def _num(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _ratio(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.1f}x" if x >= 1 else f"{x:.2f}x"


def markdown(results: Sequence[Result]) -> str:
    """One Markdown table per scenario: seconds (median, min-max over the repeats), every metric the
    rows carry, and colabfast's speed-up over each row (``12.0x``: colabfast's best row is 12 times as
    fast; ``0.5x``: that row is twice as fast as colabfast) where the scenario has alternatives, and
    by CPU per image where the rows carry it (``CPU ms/img``: the baseline's over colabfast's). Rows
    that did not run show their note; other rows' notes follow each table, each note once per report."""
    out: list[str] = []
    noted: set[str] = set()
    for scenario, rows in scenarios(results):
        mine, best = ours(rows), best_alternative(rows)
        # A ratio column only where colabfast has something to be compared with.
        keys = list(dict.fromkeys(k for r in rows for k in r.metrics)) + (["colabfast speed-up"] if best else [])
        out.append(f"### {scenario}\n")
        out.append("| " + " | ".join(["method", "seconds (min-max)", *keys]) + " |")
        out.append("|" + "---|" * (2 + len(keys)))
        for r in rows:
            name = f"{r.method} (reference)" if r.reference else r.method
            if r.seconds is None:
                out.append(f"| {name} | {r.note or 'n/a'} |" + " |" * len(keys))
                continue
            cells = [_num(r.metrics[k]) if k in r.metrics else "" for k in keys if k != "colabfast speed-up"]
            if best:
                cells.append(f"{mine.speed / r.speed:.1f}x" if mine else "")
            spread = f"{r.seconds:.2f} ({r.low:.2f}-{r.high:.2f})" if r.repeats > 1 else f"{r.seconds:.2f}"
            out.append(f"| {name} | {spread} | " + " | ".join(cells) + " |")
        out.append("")
        if mine and best:
            cost = ""
            if mine.metrics.get(CPU) and best.metrics.get(CPU):
                cost = f"; by CPU per image {best.metrics[CPU] / mine.metrics[CPU]:.2f}x"
            out.append(f"colabfast ({mine.method}) vs the best alternative ({best.method}): "
                       f"**{mine.speed / best.speed:.2f}x**{cost}\n")
        notes = [f"- {r.method}: {r.note}" for r in rows if r.note and r.seconds is not None]
        notes = [n for n in notes if n not in noted]  # each caveat once per report
        noted.update(notes)
        if notes:
            out.extend([*notes, ""])
    return "\n".join(out)


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """This machine as recorded in every report: platform, CPU, RAM, GPU, package versions, and
    :func:`colabfast.diagnosis.doctor.describe`'s text."""
    from colabfast.diagnosis.doctor import describe
    from colabfast.where import env

    return {
        "platform": env.platform(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpus": env.cpu_count(),
        "ram_bytes": env.ram_total(),
        "gpu": env.gpu(),
        "packages": {d: v for d in PACKAGES if (v := _version(d)) is not None},
        "describe": describe(),
    }


def machine_line(info: dict[str, Any]) -> str:
    """One line for headers, e.g. ``2 CPUs (Intel Xeon ...), 25.3 GB RAM, no GPU, colab, torch 2.14.1``."""
    gpu = info["gpu"]["name"] if info.get("gpu") else "no GPU"
    torch_version = info.get("packages", {}).get("torch", "?")
    return (f"{info['cpus']} CPUs ({info['cpu']}), {info['ram_bytes'] / 1e9:.1f} GB RAM, {gpu}, "
            f"{info['platform']}, torch {torch_version}")


def summary(results: Sequence[Result]) -> list[dict[str, Any]]:
    """Per scenario: colabfast's best row, the best alternative, the speed ratio between them and, where
    both rows carry CPU per image, the cost ratio (the alternative's CPU per image over colabfast's)."""
    out = []
    for scenario, rows in scenarios(results):
        mine, best = ours(rows), best_alternative(rows)
        costs = mine and best and mine.metrics.get(CPU) and best.metrics.get(CPU)
        out.append({"scenario": scenario, "colabfast": mine.method if mine else None,
                    "best_alternative": best.method if best else None,
                    "speedup_vs_best_alternative": mine.speed / best.speed if mine and best else None,
                    "cost_ratio_vs_best_alternative": best.metrics[CPU] / mine.metrics[CPU] if costs else None})
    return out


def to_json(results: Sequence[Result], path: str | Path, *, settings: Optional[dict] = None,
            command: Optional[str] = None, machine_info: Optional[dict] = None) -> Path:
    """Write every figure to ``path`` as JSON and return the path.

    Layout: ``{"schema", "created" (UTC, ISO 8601), "command" (default: this process's command
    line), "settings", "machine" (see
    :func:`machine`), "summary" (see :func:`summary`), "results": [every :class:`Result` field plus
    "speed" (images/s, else 1/seconds) and "vs_best_alternative" (its speed / the best alternative's)]}``.
    """
    rows = []
    for _, group in scenarios(results):
        best = best_alternative(group)
        for r in group:
            row = dataclasses.asdict(r)
            row["speed"] = r.speed
            row["vs_best_alternative"] = r.speed / best.speed if r.speed and best else None
            rows.append(row)
    doc = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else " ".join(sys.argv),
        "settings": settings or {},
        "machine": machine_info if machine_info is not None else machine(),
        "summary": summary(results),
        "results": rows,
    }
    path = Path(path)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def plot(results: Sequence[Result], path: str | Path, title: str = "colabfast bench") -> Path:
    """Draw one horizontal bar panel per scenario into a PNG at ``path`` and return the path.

    Bars show images/s where the scenario measures images (higher is better), else seconds (lower
    is better; a log scale when they span more than 50x). On each bar: its value and its speed as a
    multiple of the best alternative's (``3.2x``: 3.2 times as fast as the best alternative, the
    fastest grey bar). colabfast's bars are orange, the
    alternatives grey, references light blue; rows that did not run show their note instead of a bar,
    and scenarios where nothing ran are named under the title with the reason.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (``pip install matplotlib``, or
            ``pip install ".[bench]"`` from a clone).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display (CI, SSH, Colab's kernel all lack one)
    import matplotlib.pyplot as plt

    panels = [(s, rows) for s, rows in scenarios(results) if any(r.seconds is not None for r in rows)]
    not_run = [f"{s}: {rows[0].note}" for s, rows in scenarios(results) if all(r.seconds is None for r in rows)]
    legend = "Nx on a bar: its speed / the best alternative's (the fastest grey bar, 1.0x); orange: colabfast"
    title = "\n".join([title, legend, *(f"not run: {line}" for line in not_run)])
    heights = [0.9 + 0.32 * len(rows) for _, rows in panels] or [1.0]
    fig, axes = plt.subplots(len(heights), 1, figsize=(11, sum(heights) + 0.6 + 0.2 * len(not_run)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (scenario, rows) in zip(axes[:, 0], panels):
        rate = any("images/s" in r.metrics for r in rows)
        best = best_alternative(rows)
        values = [(r.metrics.get("images/s") if rate else r.seconds) if r.seconds is not None else 0.0 for r in rows]
        colours = [COLOURS["reference" if r.reference else "ours" if is_ours(r) else "alternative"] for r in rows]
        names = [r.method if len(r.method) <= 48 else r.method[:46] + "..." for r in rows]
        y = list(range(len(rows)))[::-1]
        ax.barh(y, values, color=colours)
        ax.set_yticks(y, names, fontsize=8)
        what = "images/s (higher is better)" if rate else "seconds (lower is better)"
        ax.set_title(f"{scenario}: {what}", fontsize=9, loc="left")
        top = max(values) or 1.0
        log = not rate and top / max(min(v for v in values if v > 0), 1e-9) > 50
        if log:
            ax.set_xscale("log")
        ax.set_xlim(right=top * (8 if log else 1.45))
        left = ax.get_xlim()[0]
        for yi, r, v in zip(y, rows, values):
            if r.seconds is None:
                text = f"not run: {r.note}" if r.note else "not run"
                ax.text(left, yi, " " + (text if len(text) <= 90 else text[:88] + "..."), va="center",
                        fontsize=7, color="#5f6368")
                continue
            label = f" {_num(v)}{' img/s' if rate else ' s'}"
            if best is not None and not r.reference:
                label += f"  {_ratio(r.speed / best.speed)}"
            ax.text(v, yi, label, va="center", fontsize=7, fontweight="bold" if is_ours(r) else "normal")
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.5 + 0.2 * len(not_run)) / fig.get_figheight()))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
