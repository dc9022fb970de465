"""Roofline figures: measured TFLOP/s of our kernel against the model's bound (analysis/roofline.py), the model's
per-tile cycles per resource, and the exp2 calibration microbenchmark against the model of the MUFU/FMA mix."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.select import attn_times, gpu_title, provenance_note
from analysis.style import legend_below, save_png, setup, write_png


def roofline_points(df: pd.DataFrame, calib: dict | None = None) -> pd.DataFrame:
    """Our timed rows with the roofline's predicted bound for the same GPU, config, shape and mode."""
    from analysis import roofline as rl

    d = attn_times(df)
    if d.empty:
        return d
    d = d[d["backend"] == "fa4"]
    if d.empty:
        return d
    calib = rl.load_calibration() if calib is None else calib
    preds, bounds = [], []
    for _, r in d.iterrows():
        gpu = _gpu_key(r.get("gpu_name"))
        try:
            cfg = r.get("config") if isinstance(r.get("config"), dict) else None
            cfg = {k: v for k, v in (cfg or {}).items() if v is not None} or None
            p = rl.predict(gpu, int(r["hdim"]), bool(r["causal"]), cfg, r.to_dict(), mode=r["mode"], calib=calib)
            preds.append(p.tflops)
            bounds.append(p.bound)
        except Exception as e:  # a config the model cannot place: keep the row, say why
            preds.append(float("nan"))
            bounds.append(f"n/a: {type(e).__name__}")
    d = d.assign(predicted_tflops=preds, bound=bounds)
    d["efficiency"] = d["tflops"] / d["predicted_tflops"]
    return d


def _gpu_key(name) -> str:
    n = str(name or "").lower()
    for k in ("h100", "h200", "b200", "b300"):
        if k in n:
            return k
    return "h200"


def roofline_figure(df: pd.DataFrame, outdir, calib: dict | None = None) -> tuple[Path | None, str]:
    """Measured vs predicted TFLOP/s of our kernel, one point per (config variant, shape, mode)."""
    d = roofline_points(df, calib)
    if d.empty:
        return None, "no rows for the roofline comparison yet (no timed GPU rows of backend fa4)"
    d = d[d["predicted_tflops"].notna()]
    if d.empty:
        return None, "no rows for the roofline comparison yet (no row the model could place)"
    plt, sns = setup()
    d = d.assign(case=[f"{m}, {'causal' if c else 'non-causal'}" for m, c in zip(d["mode"], d["causal"])],
                 head_dim=[f"{int(a)}" if a == b else f"{int(a)}/{int(b)}" for a, b in zip(d["hdim"], d["hdim_v"])])
    hds = sorted(set(zip(d["hdim"], d["hdim_v"])))
    cases = sorted(set(d["case"]))
    colors = dict(zip(cases, sns.color_palette(n_colors=len(cases))))
    # one scatter panel and one "fraction of the bound" panel per head dim: head dims are never pooled
    fig, axes = plt.subplots(2, len(hds), figsize=(4.6 * len(hds), 8.4), squeeze=False)
    lim = max(d["predicted_tflops"].max(), d["tflops"].max()) * 1.05
    handles = {}
    for k, (h, hv) in enumerate(hds):
        q = d[(d["hdim"] == h) & (d["hdim_v"] == hv)]
        hd = q["head_dim"].iloc[0]
        ax = axes[0][k]
        for case, g in q.groupby("case"):
            handles.setdefault(case, ax.scatter(g["predicted_tflops"], g["tflops"], s=14, color=colors[case]))
        ax.plot([0, lim], [0, lim], color="gray", lw=0.8, ls="--")
        ax.set(xlim=(0, lim), ylim=(0, lim), xlabel="roofline bound (TFLOP/s)", ylabel="measured (TFLOP/s)",
               title=f"hdim {hd}: measured vs bound (dashed: equal)")
        agg = q.groupby(["variant", "case"], as_index=False)["efficiency"].median()
        sns.barplot(data=agg, y="variant", x="efficiency", hue="case", palette=colors, ax=axes[1][k],
                    hue_order=[c for c in cases if c in set(agg["case"])])
        axes[1][k].set(xlim=(0, 1), xlabel="measured / bound (median over seqlens)", ylabel="",
                       title=f"hdim {hd}: fraction of the bound reached")
        axes[1][k].tick_params(axis="y", labelsize=6)
        if axes[1][k].get_legend() is not None:
            axes[1][k].get_legend().remove()
    fig.suptitle(f"Roofline: our kernel ({gpu_title(d)})")
    bottom = legend_below(fig, [handles[c] for c in cases if c in handles], [c for c in cases if c in handles])
    out = save_png(plt, fig, Path(outdir) / "roofline_pred_vs_measured.png", provenance_note(d), bottom)
    return out, f"wrote {out} ({len(d)} rows)"


def roofline_bounds_figure(outdir, calib: dict | None = None, hdim: int = 128) -> tuple[Path, str]:
    """Model only: per-tile cycles per resource for each GPU and switch variant (forward and backward)."""
    from analysis import roofline as rl

    rows = rl.table(hdims=(hdim,), causals=(False,), calib=calib if calib is not None else rl.load_calibration())
    t = pd.DataFrame(rows)
    res = [c for c in t.columns if c.startswith("cyc_")]
    long = t.melt(id_vars=["gpu", "mode", "variant"], value_vars=res, var_name="resource", value_name="cycles")
    long["resource"] = long["resource"].str.replace("cyc_", "", regex=False)
    plt, sns = setup()
    long = long[long["variant"].isin(["default", "fa3-like", "2cta"])]
    long = long.assign(panel=[f"{m}, {v}" for m, v in zip(long["mode"], long["variant"])])
    g = sns.catplot(data=long, kind="bar", x="resource", y="cycles", hue="gpu", col="panel", col_wrap=3,
                    height=2.6, aspect=1.5, sharey=False)
    g.figure.suptitle(f"Per-tile cycles per resource (hdim {hdim}, non-causal)", y=1.02)
    out = Path(outdir) / f"roofline_tile_cycles_hd{hdim}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_png(g.figure, out, dpi=120, bbox_inches="tight")
    plt.close(g.figure)
    return out, f"wrote {out}"


def microbench_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    """exp2 throughput (exp/clk/SM) vs the emulated fraction: measured, and the model's prediction
    (min of MUFU and issue limits, with the measured MUFU and polynomial rates)."""
    if df is None or df.empty or "metric" not in df:
        return None, "no rows for the exp2 calibration yet (results/h200/microbench/rows.jsonl)"
    m = df[df["metric"].isin(["mufu_ex2_per_clk_sm", "poly_exp2_per_clk_sm",
                              "mix_exp2_per_clk_sm"]) & (df.get("status", "ok") == "ok") & df["value"].notna()]
    if m.empty:
        return None, "no rows for the exp2 calibration yet (no exp2 rows with a value)"
    m_rows = m
    m = m.assign(fraction=m["fraction"].astype(float)).groupby("fraction", as_index=False)["value"].median()
    mufu = m.loc[m["fraction"] == 0.0, "value"]
    poly = m.loc[m["fraction"] == 1.0, "value"]
    plt, _ = setup()
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    ax.plot(m["fraction"], m["value"], "o-", label="measured")
    if len(mufu) and len(poly):
        # per exp: MUFU takes 1/mufu of a cycle, the polynomial 1/poly of the issue-bound cycle; the two
        # pipes overlap, so rate(f) = 1 / max((1-f)/mufu, f/poly + (1-f)/issue_mufu_share)
        import numpy as np

        f = np.linspace(0, 1, 41)
        mu, po = float(mufu.iloc[0]), float(poly.iloc[0])
        issue = 128.0
        model = 1.0 / np.maximum((1 - f) / mu, f / po + (1 - f) * 2 / issue)
        ax.plot(f, model, "--", label="model: max(MUFU, issue) with measured rates")
    ax.set(xlabel="share of exp2 on the FMA pipe", ylabel="exp2 per clock per SM", title="exp2 throughput mix")
    ax.set_ylim(0, ax.get_ylim()[1])
    handles, labels = ax.get_legend_handles_labels()
    bottom = legend_below(fig, handles, labels, ncol=1)
    out = save_png(plt, fig, Path(outdir) / "microbench_exp2_mix.png", provenance_note(m_rows), bottom)
    return out, f"wrote {out}"
