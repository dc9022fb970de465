"""Plot plumbing shared by the figure modules: matplotlib setup, panel grids, legends outside the data, and saving
with the provenance line (analysis/select.py) under the figure."""
from __future__ import annotations

from pathlib import Path


def setup():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt, sns


def grid(plt, n: int, w: float = 5.5, h: float = 3.6, cols: int = 2):
    """Figure with n panels, ``cols`` per row; returns (fig, flat list of the n axes)."""
    cols = max(1, min(n, cols))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    flat = [a for r in axes for a in r]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


NOTE_IN = 0.3  # inches at the bottom for the provenance line


def legend_below(fig, handles, labels, ncol: int | None = None) -> float:
    """One legend for the figure, below every panel (never over data), above the provenance line; returns the
    bottom margin (figure fraction) that the legend and the line need."""
    if not labels:
        return 0.0
    ncol = ncol or min(len(labels), 4)
    h = fig.get_size_inches()[1]
    rows = -(-len(labels) // ncol)
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, NOTE_IN / h), ncol=ncol, fontsize=8,
               frameon=False)
    return (NOTE_IN + 0.1 + 0.2 * rows) / h


def save_png(plt, fig, out, note: str = "", bottom: float = 0.0) -> Path:
    """Write ``fig`` to ``out`` with ``note`` (GPU, date, samples, throttled share) as its last line; close it.
    ``bottom``: the margin ``legend_below`` returned (it holds the note's band too)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    h = fig.get_size_inches()[1]
    if note:
        fig.text(0.5, 0.08 / h, note, ha="center", va="bottom", fontsize=7, color="dimgray")
    fig.tight_layout(rect=(0, max(bottom, NOTE_IN / h if note else 0.0), 1, 1))
    write_png(fig, out, dpi=130)
    plt.close(fig)
    return out


def write_png(fig, out, dpi: int, **savefig_kw) -> Path:
    """``fig`` as a PNG of 256 colours (an adaptive palette, no dithering: the plots' lines, markers and text keep their
    colours; anti-aliased edges snap to the nearest of the 256), deflate-optimised: about 2.5x smaller than the RGB
    file (the committed figures travel with every GPU run)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png", **savefig_kw)
    rgb = Image.open(buf).convert("RGB")
    rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, format="PNG",
                                                                                            optimize=True)
    return Path(out)
