"""The numerics figure of the FA4 algorithm model (CPU rows of experiments/numerics.py): worst error ratio against
the fp64 reference vs tau per exp2 fraction, one panel per (dtype, head dim), and the share of skipped rescales.
An output with NaN or inf values is a failure and is drawn as one (a red cross on the panel's top edge), never
dropped from the worst case."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from analysis.style import grid, legend_below, save_png, setup

RULE = 2.0  # DESIGN.md convention 5: max|out - ref| <= 2 x max|out_pt - ref| (+ atol)


def numerics_worst(df: pd.DataFrame) -> pd.DataFrame:
    """Per (dtype, hdim, tau, exp2_fraction): the worst finite error ratio over score distributions and repeats
    (``ratio``) and whether any of them produced a NaN/inf output or a non-finite error (``failed``, ``n_failed``)."""
    d = df[(df["kind"] == "numerics") & (df.get("status", "ok") == "ok")]
    keys = [k for k in ("dist", "dtype", "hdim", "tau", "exp2_fraction", "job_key") if k in d]
    w = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="max").reset_index()
    if "out_err_ratio" not in w:
        return pd.DataFrame()
    bad = pd.Series(False, index=w.index)
    for m in ("n_nan", "n_inf"):
        if m in w:
            bad |= w[m].fillna(0) > 0
    ratio = pd.to_numeric(w["out_err_ratio"], errors="coerce")
    bad |= ~ratio.map(lambda x: x is not None and math.isfinite(x))
    w = w.assign(ratio=ratio.where(~bad), failed=bad)
    g = [k for k in ("dtype", "hdim", "tau", "exp2_fraction") if k in w]
    return w.groupby(g, as_index=False).agg(ratio=("ratio", "max"), failed=("failed", "any"),
                                            n_failed=("failed", "sum"))


def numerics_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    if df is None or df.empty or "kind" not in df:
        return None, "no rows for the numerics figure yet (results/cpu/numerics/rows.jsonl)"
    d = df[(df["kind"] == "numerics") & (df.get("status", "ok") == "ok")]
    if d.empty:
        return None, "no rows for the numerics figure yet (no rows of kind 'numerics')"
    if not {"out_err_ratio", "skipped_share"} <= set(d["metric"]):
        return None, "no rows for the numerics figure yet (metrics out_err_ratio / skipped_share missing)"
    w = numerics_worst(df)
    plt, sns = setup()
    cases = sorted(set(zip(w["dtype"], w["hdim"])))
    fig, axes = grid(plt, len(cases) + 1, w=5.0, h=3.6, cols=len(cases) + 1)
    fracs = sorted(w["exp2_fraction"].unique())
    colors = dict(zip(fracs, sns.color_palette("viridis", len(fracs))))
    handles = {}
    for ax, (dt, hd) in zip(axes, cases):
        p = w[(w["dtype"] == dt) & (w["hdim"] == hd)]
        for f, q in p.groupby("exp2_fraction"):
            q = q.sort_values("tau")
            (line,) = ax.plot(q["tau"], q["ratio"], marker="o", color=colors[f], label=f"exp2 fraction {f:g}")
            handles.setdefault(f"exp2 fraction {f:g}", line)
        ax.axhline(RULE, color="red", lw=0.8, ls="--")
        handles.setdefault("rule: 2x plain PyTorch", ax.get_lines()[-1])
        ax.set_yscale("log")
        fails = p[p["failed"]]
        if len(fails):
            top = ax.get_ylim()[1]
            pts = ax.scatter(fails["tau"], [top] * len(fails), marker="X", s=60, color="red", zorder=5, clip_on=False)
            handles.setdefault("NaN/inf output: fails the rule", pts)
            ax.text(0.02, 0.9, f"NaN/inf output at tau >= {fails['tau'].min():g} "
                               f"({int(fails['n_failed'].sum())} cases)", transform=ax.transAxes, color="red", fontsize=7)
        ax.set(xlabel="tau (log2 units)", ylabel="max|out - ref| / max|out_pt - ref|",
               title=f"{dt}, hdim {int(hd)}: worst case over inputs (fp64 ref)")
    skip = d[d["metric"] == "skipped_share"].pivot_table(index=["dist", "dtype", "tau"], values="value",
                                                          aggfunc="median").reset_index()
    sns.lineplot(data=skip, x="tau", y="value", hue="dist", style="dtype", marker="o", ax=axes[-1], errorbar=None)
    axes[-1].set(ylabel="share of rescales skipped", title="rescales skipped vs tau", ylim=(-0.02, 1.02))
    axes[-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)  # beside the data
    hds = ", ".join(str(int(h)) for h in sorted(w["hdim"].unique()))
    fig.suptitle(f"FA4 algorithm model vs fp64 (head dim {hds}); a NaN/inf output counts as a failure")
    bottom = legend_below(fig, list(handles.values()), list(handles))
    note = f"CPU model (kernels/reference.py); {len(d)} rows; {int(w['n_failed'].sum())} cases with NaN/inf output"
    out = save_png(plt, fig, Path(outdir) / "numerics_tau_exp2.png", note, bottom)
    return out, f"wrote {out} ({len(d)} rows; {int(w['n_failed'].sum())} NaN/inf cases drawn as failures)"
