"""The benchmarks' one plotting helper: each script draws the figures of its
table into ``docs/img/NAME.png`` (matplotlib, headless Agg backend).

``bars`` draws one horizontal bar per reader (a share of a limit, or any
value); ``groups`` draws a few bars per row (zerobatch and the others side
by side, per operation); ``lines`` draws series against a shared x axis (log
scales allowed).
Every figure carries the machine and the date in its footer, as the tables do.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on a build machine
import matplotlib.pyplot as plt

__all__ = ["IMAGES", "bars", "footer", "groups", "lines", "scratch_images"]

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "img"
"""Where the figures go (committed, shown in BENCHMARKS.md and the README)."""


def scratch_images() -> Path:
    """Send this process's figures to a temporary folder instead (smoke runs:
    ``--quick`` must not replace the committed figures); returns it."""
    global IMAGES
    IMAGES = Path(tempfile.mkdtemp(prefix="zerobatch-figures-"))
    return IMAGES

_OURS = "#1f6feb"  # zerobatch's bars
_LIMIT = "#57606a"  # the limit's bar and line
_OTHER = "#d0883a"  # everyone else


def footer() -> str:
    """Machine and date, as the tables print them."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()[0]
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    return f"nproc={os.cpu_count()}, RAM {ram:.0f} GiB, load {load:.1f}, {today}"


def _save(figure: plt.Figure, name: str) -> Path:
    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / f"{name}.png"
    figure.text(0.99, -0.02, footer(), ha="right", va="top", fontsize=7, color=_LIMIT)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    print(f"figure: {path}")
    return path


def bars(
    name: str, values: Mapping[str, float], *, title: str, xlabel: str,
    limit: float | None = None, limit_label: str = "limit", log: bool = False,
    labels: Mapping[str, str] | None = None,
) -> Path:
    """One horizontal bar per entry of ``values`` (top to bottom in order),
    zerobatch's entries (names starting with "zerobatch") in blue, a dashed
    line at ``limit``; each bar labelled with ``labels[name]`` or its value.
    Writes ``docs/img/{name}.png`` and returns its path."""
    names = list(values)
    height = 0.9 + 0.38 * len(names)
    figure, axes = plt.subplots(figsize=(8.5, height))
    colors = [_OURS if n.startswith("zerobatch") else _LIMIT if n.startswith("np.") or
              "limit" in n else _OTHER for n in names]
    positions = range(len(names))[::-1]
    axes.barh(list(positions), [values[n] for n in names], color=colors, height=0.7)
    axes.set_yticks(list(positions), names, fontsize=8)
    for y, n in zip(positions, names, strict=True):
        text = labels[n] if labels and n in labels else f"{values[n]:.3g}"
        axes.text(values[n], y, f" {text}", va="center", fontsize=8)
    if limit is not None:
        axes.axvline(limit, color=_LIMIT, linestyle="--", linewidth=1)
        axes.text(limit, len(names) - 0.35, f" {limit_label}", fontsize=8, color=_LIMIT,
                  va="bottom")
        axes.set_ylim(-0.6, len(names) + 0.1)
    if log:
        axes.set_xscale("log")
    axes.set_xlabel(xlabel)
    axes.set_title(title, fontsize=10)
    axes.margins(x=0.18)
    return _save(figure, name)


def groups(
    name: str, rows: Mapping[str, Mapping[str, float]], *, title: str, xlabel: str,
    log: bool = False, fmt: str = "{:.3g}",
) -> Path:
    """Per row of ``rows`` (top to bottom), one horizontal bar per series
    (``rows[row][series]``; a series a row lacks leaves no bar), zerobatch's
    series in blue, each bar labelled with its value (``fmt``). Writes
    ``docs/img/{name}.png`` and returns its path."""
    labels = list(rows)
    series = list(dict.fromkeys(key for row in rows.values() for key in row))
    height = 0.9 + (0.22 * len(series) + 0.2) * len(labels)
    figure, axes = plt.subplots(figsize=(8.5, height))
    others = iter(["#d0883a", "#8250df", "#2da44e", "#cf222e", "#57606a"])
    ours = iter([_OURS, "#79b8ff", "#0a3069", "#54aeff"])  # zerobatch's series: blues
    colors = {key: next(ours) if key.startswith("zerobatch") else next(others) for key in series}
    step = 0.8 / len(series)
    for k, key in enumerate(series):
        ys, xs = [], []
        for y, label in zip(range(len(labels))[::-1], labels, strict=True):
            if key in rows[label]:
                ys.append(y + 0.4 - step * (k + 0.5))
                xs.append(rows[label][key])
        axes.barh(ys, xs, height=step * 0.9, color=colors[key], label=key)
        for y, x in zip(ys, xs, strict=True):
            axes.text(x, y, " " + fmt.format(x), va="center", fontsize=7)
    axes.set_yticks(list(range(len(labels))[::-1]), labels, fontsize=8)
    if log:
        axes.set_xscale("log")
    axes.set_xlabel(xlabel)
    axes.set_title(title, fontsize=10)
    axes.margins(x=0.15)
    axes.legend(fontsize=8, loc="best")
    return _save(figure, name)


def lines(
    name: str, x: Sequence[float], series: Mapping[str, Sequence[float]], *, title: str,
    xlabel: str, ylabel: str, logx: bool = True, logy: bool = False,
) -> Path:
    """Each entry of ``series`` as a line with markers over ``x`` (a value of
    NaN leaves a gap), zerobatch's in blue. Writes ``docs/img/{name}.png``."""
    figure, axes = plt.subplots(figsize=(7.5, 4.2))
    others = iter(["#d0883a", "#8250df", "#2da44e", "#cf222e", "#57606a"])
    ours = iter([_OURS, "#79b8ff", "#0a3069", "#54aeff"])  # zerobatch's series: blues
    for label, ys in series.items():
        color = next(ours) if label.startswith("zerobatch") else next(others)
        axes.plot(list(x)[:len(ys)], list(ys), marker="o", label=label, color=color)
    if logx:
        axes.set_xscale("log")
    if logy:
        axes.set_yscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize=8)
    return _save(figure, name)
