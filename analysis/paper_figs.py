"""The FA4 paper's throughput figures from our rows, numbered as in the paper: Fig. 4 forward (panels hdim 64 /
128 / 256 x non-causal / causal), Fig. 5 forward at hdim (192, 128), Fig. 6 backward, Fig. 7 deterministic
backward, causal, Fig. 8 deterministic backward, non-causal. Each function returns ``(path, message)``; path is
None and the message says "no rows for ..." when the rows are not there yet. Head dims are never pooled: one
panel each; y axes start at 0; the legend sits below the panels; the last line gives GPU, date, samples, throttling.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.select import attn_times, one_experiment_per_point, only_variant, provenance_note, series_order
from analysis.style import grid, legend_below, save_png, setup


def _seq(s) -> str:
    return f"{int(s) // 1024}k" if s >= 1024 else str(int(s))


def tflops_vs_seqlen(df: pd.DataFrame, *, mode: str, hdims, causal=(False, True), series=None, title: str,
                     out: Path) -> tuple[Path | None, str]:
    """Grouped bars: x = sequence length, one bar per series, y = TFLOP/s; one panel per (head dims, causal)."""
    d = attn_times(df)
    what = f"{mode}, hdim {list(hdims)}, causal in {list(causal)}"
    if d.empty:
        return None, f"no rows for {title} yet ({what}: no timed GPU attention rows)"
    pairs = [(h, h) if isinstance(h, int) else tuple(h) for h in hdims]
    keep = pd.Series(False, index=d.index)
    for h, hv in pairs:
        keep |= (d["hdim"] == h) & (d["hdim_v"] == hv)
    d = d[(d["mode"] == mode) & keep & d["causal"].isin(causal)]
    if series is not None:
        d = d[d["series"].isin(series)]
    if d.empty:
        return None, f"no rows for {title} yet ({what})"
    d = one_experiment_per_point(d, ["hdim", "hdim_v", "causal", "seqlen_q", "series"])
    pts = d.groupby(["hdim", "hdim_v", "causal", "seqlen_q", "series"], as_index=False)["tflops"].median()
    panels = [(h, hv, c) for h, hv in pairs for c in causal
              if ((pts["hdim"] == h) & (pts["hdim_v"] == hv) & (pts["causal"] == c)).any()]
    plt, sns = setup()
    ncols = len([c for c in causal])
    fig, axes = grid(plt, len(panels), w=6.2, h=3.6, cols=ncols)
    order = series_order(pts["series"])
    palette = dict(zip(order, sns.color_palette(n_colors=len(order))))  # one colour per series in every panel
    handles, labels = {}, {}
    for ax, (h, hv, c) in zip(axes, panels):
        p = pts[(pts["hdim"] == h) & (pts["hdim_v"] == hv) & (pts["causal"] == c)].assign(
            seqlen=lambda x: x["seqlen_q"].map(_seq))
        sns.barplot(data=p, x="seqlen", y="tflops", hue="series", hue_order=[o for o in order if o in set(p["series"])],
                    order=[_seq(s) for s in sorted(p["seqlen_q"].unique())], palette=palette, ax=ax)
        for cont in ax.containers:
            ax.bar_label(cont, fmt="%.0f", fontsize=6, padding=1)
        ax.set_title(f"{'causal' if c else 'non-causal'}, hdim {h}" + (f"/{hv}" if hv != h else ""))
        ax.set(xlabel="sequence length", ylabel="TFLOP/s")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)  # throughput from 0
        for hd, lb in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lb, hd)
        ax.get_legend().remove()
    labs = [s for s in order if s in handles]
    fig.suptitle(title)
    bottom = legend_below(fig, [handles[s] for s in labs], labs, ncol=min(len(labs), 2 * ncols))
    out = save_png(plt, fig, out, provenance_note(d), bottom)
    return out, f"wrote {out} ({len(d)} rows)"


def _peers_view(df):
    return only_variant(df, ("default", "peer"))


def fig4(df, outdir):
    """Forward TFLOP/s vs sequence length, hdim 64 / 128 / 256, non-causal and causal (FA4 paper Fig. 4)."""
    return tflops_vs_seqlen(_peers_view(df), mode="fwd", hdims=(64, 128, 256), title="Fig. 4: forward",
                            out=Path(outdir) / "fig4_fwd.png")


def fig5(df, outdir):
    """Forward TFLOP/s vs sequence length, hdim (192, 128) (FA4 paper Fig. 5)."""
    return tflops_vs_seqlen(_peers_view(df), mode="fwd", hdims=((192, 128),), title="Fig. 5: forward, hdim (192, 128)",
                            out=Path(outdir) / "fig5_fwd_hd192_128.png")


ALL_HDIMS = (64, 128, 256, (192, 128))  # a panel for each that has rows


def fig6(df, outdir):
    """Backward TFLOP/s vs sequence length, per head dim, non-causal and causal (FA4 paper Fig. 6)."""
    return tflops_vs_seqlen(_peers_view(df), mode="bwd", hdims=ALL_HDIMS, title="Fig. 6: backward",
                            out=Path(outdir) / "fig6_bwd.png")


def deterministic_series(df: pd.DataFrame) -> pd.DataFrame:
    """Rows for the deterministic-backward figures: ours non-deterministic and deterministic (the
    ``deterministic`` config field), and the official FA4's deterministic/non-deterministic backends."""
    d = attn_times(df)
    if d.empty:
        return d
    d = d[d["mode"] == "bwd"].copy()
    det = d.get("config.deterministic")
    if det is None:
        det = pd.Series([bool((c or {}).get("deterministic")) if isinstance(c, dict) else False
                         for c in d.get("config", [None] * len(d))], index=d.index)
    det = det.fillna(False).astype(bool)
    two = d.get("config.two_cta")
    two = two.fillna(False).astype(bool) if two is not None else pd.Series(False, index=d.index)
    sched = d.get("config.det_schedule")
    naive = (sched == "naive") if sched is not None else pd.Series(False, index=d.index)
    naive = naive | (d["variant"] == "deterministic_naive")
    ours = (d["backend"] == "fa4") & ~two
    d.loc[ours & ~det, "series"] = "ours"
    d.loc[ours & det & ~naive, "series"] = "ours, deterministic (SPT)"
    d.loc[ours & det & naive, "series"] = "ours, deterministic (naive order)"
    keep = (ours & d["variant"].isin(["full", "default", "deterministic", "deterministic_naive"])) | d["backend"].isin(
        ["fa4_official", "fa4_official_det"])
    return d[keep]


def fig7(df, outdir):
    """Deterministic backward, causal (FA4 paper Fig. 7: SPT-ordered semaphores against the naive order)."""
    return tflops_vs_seqlen(deterministic_series(df), mode="bwd", hdims=ALL_HDIMS, causal=(True,),
                            title="Fig. 7: deterministic backward, causal",
                            out=Path(outdir) / "fig7_bwd_det_causal.png")


def fig8(df, outdir):
    """Deterministic backward, non-causal (FA4 paper Fig. 8)."""
    return tflops_vs_seqlen(deterministic_series(df), mode="bwd", hdims=ALL_HDIMS, causal=(False,),
                            title="Fig. 8: deterministic backward, non-causal",
                            out=Path(outdir) / "fig8_bwd_det_noncausal.png")
