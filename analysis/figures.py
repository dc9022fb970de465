"""Figure and table functions for the notebooks (analysis/notebooks/*.py), and ``main()`` that runs them all.

Every function takes a DataFrame of result rows (docs/INTERFACES.md) and an output folder, writes one PNG
(or a Markdown/CSV table) and returns ``(path, message)``: ``path`` is None and ``message`` says
"no rows for ..." when the rows it needs are not there yet, so a notebook prints the message in place of
the figure. Attention rows: kind "attn", metric "time_ms" (with ``tflops``), mode fwd/bwd, ``backend``,
``variant`` (sweep config name; "peer" for the peers), shape fields, ``config``. Only rows measured on a
GPU (``gpu_name`` set) and with status "ok" are drawn; repeated measurements of one point are reduced to
their median.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
ATTN_EXPERIMENTS = ("fwd_peers", "fwd_ablation", "bwd_peers", "bwd_ablation")

# display names of the backends, in legend order (ours first, as the paper puts FA4 first)
BACKEND_LABELS = {
    "fa4": "ours (fa4lab)",
    "fa4_official": "FA4 official (sm90)",
    "fa4_official_det": "FA4 official, deterministic",
    "sdpa_cudnn": "cuDNN (SDPA)",
    "sdpa_flash": "FA2 (SDPA flash)",
    "sdpa_efficient": "xFormers-style (SDPA efficient)",
    "flex": "FlexAttention",
    "fa4_model": "FA4 model (PyTorch)",
    "reference": "reference",
}


# ---------------------------------------------------------------------------------------------------
# locations and loading
# ---------------------------------------------------------------------------------------------------
def results_root() -> Path:
    return Path(os.environ.get("FA4LAB_RESULTS", REPO / "results"))


def figures_dir() -> Path:
    return Path(os.environ.get("FA4LAB_FIGURES", results_root() / "figures"))


def experiment_files(name: str, root: Path | None = None) -> list[Path]:
    """results/<name>/rows.jsonl and results/<gpu>/<name>/rows.jsonl that exist."""
    root = Path(root or results_root())
    if not root.exists():
        return []
    out = [root / name / "rows.jsonl"] + sorted(root.glob(f"*/{name}/rows.jsonl"))
    seen, files = set(), []
    for p in out:
        if p.exists() and p not in seen:
            seen.add(p)
            files.append(p)
    return files


def _read_jsonl(paths) -> pd.DataFrame:
    import json

    rows = []
    for p in paths:
        for line in Path(p).read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            r["source"] = str(p)
            rows.append(r)
    return pd.DataFrame(rows)


def load_experiments(*names: str, root: Path | None = None) -> pd.DataFrame:
    """Rows of the named experiments (all result files found for each); empty DataFrame if none."""
    files = [f for n in names for f in experiment_files(n, root)]
    if not files:
        return pd.DataFrame()
    try:
        from analysis.load import load_results

        df = load_results(*files)
    except ImportError:
        df = _read_jsonl(files)
    return df


def attn_times(df: pd.DataFrame) -> pd.DataFrame:
    """Timed attention rows measured on a GPU: kind attn, metric time_ms, status ok, tflops present."""
    need = {"kind", "metric", "status"}
    if df is None or df.empty or not need <= set(df.columns):
        return pd.DataFrame()
    d = df[(df["kind"] == "attn") & (df["metric"] == "time_ms") & (df["status"] == "ok")].copy()
    if "gpu_name" in d:
        d = d[d["gpu_name"].notna()]
    if "tflops" not in d:
        return pd.DataFrame()
    d = d[pd.to_numeric(d["tflops"], errors="coerce").notna()]
    d["tflops"] = d["tflops"].astype(float)
    if "hdim_v" in d:
        d["hdim_v"] = d["hdim_v"].fillna(d["hdim"])
    else:
        d["hdim_v"] = d["hdim"]
    if "variant" not in d:
        d["variant"] = None
    if "series" not in d:  # rows already labelled (e.g. deterministic_series) keep their labels
        d["series"] = [series_label(b, v) for b, v in zip(d["backend"], d["variant"])]
    return d


def series_label(backend: str, variant) -> str:
    base = BACKEND_LABELS.get(backend, str(backend))
    if backend == "fa4" and variant not in (None, "default", "full", "peer", "cli") and not (
            isinstance(variant, float) and pd.isna(variant)):
        return f"{base} [{variant}]"
    return base


def _series_order(series) -> list[str]:
    labels = list(BACKEND_LABELS.values())
    def key(s):
        if s.startswith("ours"):
            return (0, s)
        return (1 + next((i for i, x in enumerate(labels) if s.startswith(x)), 99), s)

    return sorted(set(series), key=key)


def _gpu_title(d: pd.DataFrame) -> str:
    if "gpu_name" in d and d["gpu_name"].notna().any():
        return ", ".join(sorted(set(map(str, d["gpu_name"].dropna()))))
    return ""


def _median_points(d: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return d.groupby(keys, dropna=False, as_index=False)["tflops"].median()


# ---------------------------------------------------------------------------------------------------
# the paper's figures: TFLOP/s vs sequence length, one bar per series
# ---------------------------------------------------------------------------------------------------
def _grid(plt, n: int, w: float = 5.5, h: float = 3.6):
    """Figure with n panels, two per row; returns (fig, flat list of the n axes)."""
    cols = min(n, 2)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    flat = [a for r in axes for a in r]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def _setup():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt, sns


def tflops_vs_seqlen(df: pd.DataFrame, *, mode: str, hdim: int, hdim_v: int | None = None,
                     causal=(False, True), series=None, title: str, out: Path) -> tuple[Path | None, str]:
    """Grouped bars: x = sequence length, one bar per series, y = TFLOP/s; one panel per causal value."""
    hdim_v = hdim if hdim_v is None else hdim_v
    d = attn_times(df)
    what = f"{mode} hdim ({hdim}, {hdim_v}) causal in {list(causal)}"
    if d.empty:
        return None, f"no rows for {title} yet ({what}: no timed GPU attention rows)"
    d = d[(d["mode"] == mode) & (d["hdim"] == hdim) & (d["hdim_v"] == hdim_v) & (d["causal"].isin(causal))]
    if series is not None:
        d = d[d["series"].isin(series)]
    if d.empty:
        return None, f"no rows for {title} yet ({what})"
    pts = _median_points(d, ["causal", "seqlen_q", "series"])
    plt, sns = _setup()
    panels = [c for c in causal if (pts["causal"] == c).any()]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 3.8), squeeze=False)
    order = _series_order(pts["series"])
    for ax, c in zip(axes[0], panels):
        p = pts[pts["causal"] == c].copy()
        p["seqlen"] = p["seqlen_q"].map(lambda s: f"{int(s) // 1024}k" if s >= 1024 else str(int(s)))
        xorder = [f"{int(s) // 1024}k" if s >= 1024 else str(int(s)) for s in sorted(p["seqlen_q"].unique())]
        sns.barplot(data=p, x="seqlen", y="tflops", hue="series", hue_order=[o for o in order if o in set(p["series"])],
                    order=xorder, ax=ax)
        for cont in ax.containers:
            ax.bar_label(cont, fmt="%.0f", fontsize=6, padding=1)
        ax.set_title(f"{'causal' if c else 'non-causal'}, hdim {hdim}" + (f"/{hdim_v}" if hdim_v != hdim else ""))
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        handles, labels = ax.get_legend_handles_labels()
        ax.get_legend().remove()
    ncol = min(len(labels), 2 * len(panels))
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    nrows = -(-len(labels) // ncol)
    fig.suptitle(f"{title} ({_gpu_title(d)})")
    fig.tight_layout(rect=(0, 0.05 + 0.06 * nrows, 1, 1))
    out = _save_png(plt, fig, out)
    return out, f"wrote {out} ({len(d)} rows)"


PEER_SERIES = None  # all series (ours + every peer present)


def fig4(df, outdir):
    """Forward TFLOP/s vs seqlen, hdim 128, non-causal and causal (FA4 paper Fig. 4)."""
    return tflops_vs_seqlen(_only_variant(df, ("default", "peer")), mode="fwd", hdim=128,
                            title="Fig. 4: forward, hdim 128", out=Path(outdir) / "fig4_fwd_hd128.png")


def fig5(df, outdir):
    """Forward TFLOP/s vs seqlen, hdim (192, 128), causal (FA4 paper Fig. 5)."""
    return tflops_vs_seqlen(_only_variant(df, ("default", "peer")), mode="fwd", hdim=192, hdim_v=128, causal=(True,),
                            title="Fig. 5: forward, hdim (192, 128), causal", out=Path(outdir) / "fig5_fwd_hd192_128.png")


def fig6(df, outdir):
    """Backward TFLOP/s vs seqlen, hdim 128, non-causal and causal (FA4 paper Fig. 6)."""
    return tflops_vs_seqlen(_only_variant(df, ("default", "peer")), mode="bwd", hdim=128,
                            title="Fig. 6: backward, hdim 128", out=Path(outdir) / "fig6_bwd_hd128.png")


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
    ours = (d["backend"] == "fa4") & ~two
    d.loc[ours & ~det, "series"] = "ours, non-deterministic"
    d.loc[ours & det, "series"] = "ours, deterministic (semaphore, SPT order)"
    keep = (ours & d["variant"].isin(["full", "default", "deterministic"])) | d["backend"].isin(
        ["fa4_official", "fa4_official_det"])
    return d[keep]


def fig7(df, outdir):
    """Deterministic backward, hdim 128, non-causal (FA4 paper Fig. 7)."""
    return tflops_vs_seqlen(deterministic_series(df), mode="bwd", hdim=128, causal=(False,),
                            title="Fig. 7: deterministic backward, hdim 128, non-causal",
                            out=Path(outdir) / "fig7_bwd_det_noncausal.png")


def fig8(df, outdir):
    """Deterministic backward, hdim 128, causal: SPT-ordered semaphores (FA4 paper Fig. 8)."""
    return tflops_vs_seqlen(deterministic_series(df), mode="bwd", hdim=128, causal=(True,),
                            title="Fig. 8: deterministic backward, hdim 128, causal",
                            out=Path(outdir) / "fig8_bwd_det_causal.png")


def _only_variant(df: pd.DataFrame, variants) -> pd.DataFrame:
    if df is None or df.empty or "variant" not in df:
        return df
    return df[df["variant"].isin(variants) | df["variant"].isna()]


# ---------------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------------
def markdown_table(t: pd.DataFrame, floatfmt: str = "{:.4g}") -> str:
    cols = [str(c) for c in t.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in t.iterrows():
        cells = [floatfmt.format(v) if isinstance(v, float) else str(v) for v in r.tolist()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _save_png(plt, fig, out) -> Path:
    """Write ``fig`` to ``out`` (folders made as needed) and close it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def _write_table(t: pd.DataFrame, out: Path, title: str) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".csv").write_text(t.to_csv(index=False))
    out.with_suffix(".md").write_text(f"**{title}**\n\n{markdown_table(t)}\n")
    return out.with_suffix(".md")


POLY_METRICS = ("max_rel_err_fp32", "max_rel_err_vs_hw", "bf16_equal_share", "bf16_1ulp_share", "bf16_max_ulp")


def table2(df: pd.DataFrame, outdir) -> tuple[pd.DataFrame | None, str]:
    """Polynomial exp2 accuracy per degree (FA4 paper Table 2), from numerics rows of kind "poly"."""
    if df is None or df.empty or "kind" not in df:
        return None, "no rows for Table 2 yet (no numerics rows of kind 'poly')"
    d = df[(df["kind"] == "poly") & (df.get("status", "ok") == "ok")]
    if d.empty:
        return None, "no rows for Table 2 yet (no numerics rows of kind 'poly')"
    idx = [c for c in ("coeffs", "degree") if c in d]
    t = d.pivot_table(index=idx, columns="metric", values="value", aggfunc="median").reset_index()
    t = t[idx + [m for m in POLY_METRICS if m in t] + [m for m in t.columns if m not in POLY_METRICS and m not in idx]]
    path = _write_table(t, Path(outdir) / "table2_poly_accuracy", "Table 2: software exp2 accuracy per degree")
    return t, f"wrote {path}"


def table4(df: pd.DataFrame, outdir) -> tuple[pd.DataFrame | None, str]:
    """Compile time (first call, seconds) ours vs the official FA4, per mode / hdim / causal (FA4 paper Table 4),
    from rows with metric first_call_s, and the cached call (metric second_call_s) where recorded. A sweep's worker
    compiles each (mode, hdim, causal) kernel once and later shapes hit the in-process cache, so the compiling
    call is the slowest first call of the group (max); the cached call is the group's median second call."""
    if df is None or df.empty or not {"metric", "backend", "value"} <= set(df.columns):
        return None, "no rows for Table 4 yet (no first_call_s rows)"
    d = df[df["metric"].isin(["first_call_s", "second_call_s"]) & (df.get("status", "ok") == "ok")
           & df["backend"].isin(["fa4", "fa4_official"])]
    if "gpu_name" in d:
        d = d[d["gpu_name"].notna()]
    if d.empty or not (d["metric"] == "first_call_s").any():
        return None, "no rows for Table 4 yet (no first_call_s rows of fa4 / fa4_official on a GPU)"
    if "variant" in d:
        d = d[d["variant"].isin(["default", "full", "peer"]) | d["variant"].isna()]
    d = d.assign(hdim_v=d["hdim_v"].fillna(d["hdim"]) if "hdim_v" in d else d["hdim"])
    d = d.assign(head_dim=[f"{int(a)}" if a == b else f"{int(a)}/{int(b)}" for a, b in zip(d["hdim"], d["hdim_v"])])
    index, names = ["mode", "head_dim", "causal"], {"fa4": "ours", "fa4_official": "FA4 official"}
    first = d[d["metric"] == "first_call_s"].pivot_table(index=index, columns="backend", values="value", aggfunc="max")
    # A first call under 50 ms cannot hold a CuTe DSL compile (>= 1 s): that kernel was compiled earlier in the
    # process (the fa4 backend's availability probe did so before 2026-11-30), so the group has no compile time.
    t = first.where(first >= 0.05).rename(columns={k: f"{v} first call (s)" for k, v in names.items()})
    cached = d[d["metric"] == "second_call_s"]
    if not cached.empty:
        c = cached.pivot_table(index=index, columns="backend", values="value", aggfunc="median")
        t = t.join(c.rename(columns={k: f"{v} cached call (s)" for k, v in names.items()}))
    t = t.reset_index()
    if {"ours first call (s)", "FA4 official first call (s)"} <= set(t.columns):
        t["ratio (official / ours)"] = t["FA4 official first call (s)"] / t["ours first call (s)"]
    path = _write_table(t, Path(outdir) / "table4_compile_time", "Table 4: compile + first call time")
    return t, f"wrote {path}"


# ---------------------------------------------------------------------------------------------------
# roofline: predicted vs measured per config
# ---------------------------------------------------------------------------------------------------
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
    plt, sns = _setup()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    d = d.assign(case=[f"{m}, {'causal' if c else 'non-causal'}" for m, c in zip(d["mode"], d["causal"])])
    sns.scatterplot(data=d, x="predicted_tflops", y="tflops", hue="variant", style="case", ax=axes[0])
    lim = max(d["predicted_tflops"].max(), d["tflops"].max()) * 1.05
    axes[0].plot([0, lim], [0, lim], color="gray", lw=0.8, ls="--")
    axes[0].set(xlim=(0, lim), ylim=(0, lim), xlabel="roofline bound (TFLOP/s)", ylabel="measured (TFLOP/s)",
                title="measured vs predicted")
    axes[0].legend(fontsize=6)
    agg = d.groupby(["variant", "case"], as_index=False)["efficiency"].median()
    sns.barplot(data=agg, y="variant", x="efficiency", hue="case", ax=axes[1])
    axes[1].set(xlabel="measured / bound (median over shapes)", ylabel="", title="fraction of the bound reached")
    axes[1].legend(fontsize=6)
    fig.suptitle(f"Roofline: our kernel ({_gpu_title(d)})")
    fig.tight_layout()
    out = _save_png(plt, fig, Path(outdir) / "roofline_pred_vs_measured.png")
    return out, f"wrote {out} ({len(d)} rows)"


def roofline_bounds_figure(outdir, calib: dict | None = None, hdim: int = 128) -> tuple[Path, str]:
    """Model only: per-tile cycles per resource for each GPU and switch variant (forward and backward)."""
    from analysis import roofline as rl

    rows = rl.table(hdims=(hdim,), causals=(False,), calib=calib if calib is not None else rl.load_calibration())
    t = pd.DataFrame(rows)
    res = [c for c in t.columns if c.startswith("cyc_")]
    long = t.melt(id_vars=["gpu", "mode", "variant"], value_vars=res, var_name="resource", value_name="cycles")
    long["resource"] = long["resource"].str.replace("cyc_", "", regex=False)
    plt, sns = _setup()
    long = long[long["variant"].isin(["default", "fa3-like", "2cta"])]
    long = long.assign(panel=[f"{m}, {v}" for m, v in zip(long["mode"], long["variant"])])
    g = sns.catplot(data=long, kind="bar", x="resource", y="cycles", hue="gpu", col="panel", col_wrap=3,
                    height=2.6, aspect=1.5, sharey=False)
    g.figure.suptitle(f"Per-tile cycles per resource (hdim {hdim}, non-causal)", y=1.02)
    out = Path(outdir) / f"roofline_tile_cycles_hd{hdim}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    g.figure.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(g.figure)
    return out, f"wrote {out}"


# ---------------------------------------------------------------------------------------------------
# ablations: speedup per switch with its spread, and the waterfall
# ---------------------------------------------------------------------------------------------------
# ablation variant (switch off) -> the switch it removes; speedup of a switch = t(off) / t(full)
SWITCH_OFF = {"no_pingpong": "pingpong", "tau0": "tau (rescale_threshold)", "no_exp2_emu": "exp2 emulation",
              "two_cta": "2-CTA (on)", "deterministic": "deterministic (on)"}
WATERFALL = ("fa3_like", "fa3_like+pingpong", "fa3_like+pingpong+tau8", "full")


def resolved_hashes(d: pd.DataFrame) -> list:
    """Per row, the hash of the config the kernel compiled: the row's resolved_config_hash where recorded, else
    its config resolved with today's sm90 defaults table (rows measured before 2026-11-30 lack the field)."""
    from kernels import AttnConfig, ConfigError

    rec = d["resolved_config_hash"] if "resolved_config_hash" in d else pd.Series([None] * len(d), index=d.index)
    cfgs = d["config"] if "config" in d else pd.Series([None] * len(d), index=d.index)
    out = []
    for h, c, hd, causal in zip(rec, cfgs, d["hdim"], d["causal"]):
        if isinstance(h, str):
            out.append(h)
            continue
        try:
            out.append(AttnConfig.from_dict(c if isinstance(c, dict) else {}).resolve("sm90", int(hd), bool(causal)).config_hash())
        except (ConfigError, TypeError, ValueError):
            out.append(None)
    return out


SPEEDUP_KEYS = ["mode", "causal", "hdim", "hdim_v", "seqlen_q", "seqlen_k", "batch", "heads"]


def _median_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per (shape, mode, variant): r = t(full) / t(variant) from the medians of separately timed jobs, with the
    interval [p20_full / p80_variant, p80_full / p20_variant]."""
    d = attn_times(df)
    if d.empty or "variant" not in d:
        return pd.DataFrame()
    d = d[d["backend"] == "fa4"]
    for c in ("p20", "p80"):
        if c not in d:
            d[c] = d["value"]
    d = d.assign(resolved=resolved_hashes(d))
    agg = d.groupby(SPEEDUP_KEYS + ["variant"], as_index=False).agg(
        value=("value", "median"), p20=("p20", "median"), p80=("p80", "median"), resolved=("resolved", "first"))
    full = agg[agg["variant"] == "full"].set_index(SPEEDUP_KEYS)
    j = agg[agg["variant"] != "full"].set_index(SPEEDUP_KEYS).join(full.add_suffix("_full"), how="inner")
    # a variant that resolves to the full config's kernel (its switch is already off by default on this arch)
    # measures no switch: leave it out rather than plot run-to-run noise as a speedup
    j = j[j["resolved"].isna() | (j["resolved"] != j["resolved_full"])]
    return pd.DataFrame({"variant": j["variant"], "r": j["value_full"] / j["value"], "r_lo": j["p20_full"] / j["p80"],
                         "r_hi": j["p80_full"] / j["p20"], "basis": "medians"}).reset_index()


def _ab_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per (shape, mode, variant): r = the ab_ratio rows' median t(full) / t(variant) over interleaved pairs (GPU
    rows of fa4 against baseline 'full'; the median over repeated rows), interval [p20, p80] of the pair ratios."""
    need = {"kind", "metric", "status", "ab_baseline", "backend", "variant"}
    if df is None or df.empty or not need <= set(df.columns):
        return pd.DataFrame()
    d = df[(df["kind"] == "attn") & (df["metric"] == "ab_ratio") & (df["status"] == "ok") & (df["backend"] == "fa4")
           & (df["ab_baseline"] == "full") & pd.to_numeric(df["value"], errors="coerce").notna()].copy()
    if "gpu_name" in d:
        d = d[d["gpu_name"].notna()]
    if d.empty:
        return pd.DataFrame()
    d["hdim_v"] = d["hdim_v"].fillna(d["hdim"]) if "hdim_v" in d else d["hdim"]
    for c in ("p20", "p80"):
        d[c] = d[c].fillna(d["value"]) if c in d else d["value"]
    base = d.assign(resolved_config_hash=d.get("ab_resolved_config_hash"), config=d.get("ab_config"))
    d = d.assign(resolved=resolved_hashes(d), resolved_full=resolved_hashes(base))
    d = d[d["resolved"].isna() | (d["resolved"] != d["resolved_full"])]  # same kernel as full: no switch measured
    agg = d.groupby(SPEEDUP_KEYS + ["variant"], as_index=False).agg(
        r=("value", "median"), r_lo=("p20", "median"), r_hi=("p80", "median"))
    return agg.assign(basis="ab_ratio")


def switch_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per (mode, causal, shape, switch): the speedup of the switch with a spread interval [lo, hi] and its
    ``basis``. From the ``ab_ratio`` rows (ratio r = t(full) / t(variant), the variant timed interleaved with full
    in one job; interval = the pair ratios' p20/p80) where a cell has them, else from the medians of the
    separately timed jobs (r = t(full) / t(variant), interval [p20_full / p80_variant, p80_full / p20_variant]).
    A variant that switches something off: speedup = t(variant) / t(full) = 1 / r; one that turns it on (two_cta,
    deterministic): speedup = r; >1 means the switch makes the kernel faster."""
    ab, med = _ab_ratios(df), _median_ratios(df)
    if not ab.empty and not med.empty:  # a cell with A/B rows takes them; the medians fill the rest
        have = pd.MultiIndex.from_frame(ab[SPEEDUP_KEYS + ["variant"]])
        med = med[~pd.MultiIndex.from_frame(med[SPEEDUP_KEYS + ["variant"]]).isin(have)]
    parts = [x for x in (ab, med) if not x.empty]
    if not parts:
        return pd.DataFrame()
    r = pd.concat(parts, ignore_index=True)
    out = []
    for v, label in SWITCH_OFF.items():
        x = r[r["variant"] == v]
        if x.empty:
            continue
        if label.endswith("(on)"):  # the variant turns the switch on
            sp, lo, hi = x["r"], x["r_lo"], x["r_hi"]
        else:
            sp, lo, hi = 1 / x["r"], 1 / x["r_hi"], 1 / x["r_lo"]
        out.append(x[SPEEDUP_KEYS + ["variant", "basis"]].assign(switch=label, speedup=sp, lo=lo, hi=hi))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def ablation_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    """Speedup of each switch per sequence length (points with p20/p80 spread bars), fwd and bwd."""
    s = switch_speedups(df)
    if s.empty:
        return None, "no rows for the ablation speedups yet (need fa4 rows of variant 'full' and a switch-off variant)"
    plt, _ = _setup()
    # one panel per (mode, causal, head dim): switches at different head dims never share a point
    cases = sorted(set(zip(s["mode"], s["causal"], s["hdim"])), key=lambda k: (k[0] != "fwd", k[1], k[2]))
    fig, axes = _grid(plt, len(cases))
    for ax, (m, c, h) in zip(axes, cases):
        p = s[(s["mode"] == m) & (s["causal"] == c) & (s["hdim"] == h)]
        for i, (sw, q) in enumerate(p.groupby("switch")):
            q = q.sort_values("seqlen_q")
            x = [str(int(v)) for v in q["seqlen_q"]]
            ax.errorbar(x, q["speedup"], yerr=[q["speedup"] - q["lo"], q["hi"] - q["speedup"]], marker="o",
                        capsize=3, label=sw)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(title=f"{m}, hdim {int(h)}, {'causal' if c else 'non-causal'}", xlabel="sequence length",
               ylabel="speedup of the switch (x)")
        ax.legend(fontsize=7)
    how = {"ab_ratio": "interleaved A/B vs full", "medians": "medians of separate jobs"}
    fig.suptitle(f"Speedup per switch (t(without) / t(with); "
                 f"{', '.join(how[b] for b in sorted(set(s['basis'])))}; bars: p20/p80 spread)")
    fig.tight_layout()
    out = _save_png(plt, fig, Path(outdir) / "ablation_speedups.png")
    return out, f"wrote {out} ({len(s)} points)"


def waterfall_table(df: pd.DataFrame) -> pd.DataFrame:
    """TFLOP/s of the waterfall variants (FA3-like -> +pingpong -> +tau -> full), per (mode, causal),
    median over sequence lengths >= 4k (long sequences, where the kernel's steady state dominates)."""
    d = attn_times(df)
    if d.empty:
        return d
    d = d[(d["backend"] == "fa4") & d["variant"].isin(WATERFALL) & (d["seqlen_q"] >= 4096)]
    if d.empty:
        return d
    t = d.groupby(["mode", "causal", "variant"], as_index=False)["tflops"].median()
    t["step"] = t["variant"].map({v: i for i, v in enumerate(WATERFALL)})
    steps = t.groupby(["mode", "causal"])["step"].transform("size")
    return t[steps >= 2].sort_values(["mode", "causal", "step"])  # a waterfall needs two steps at least


def waterfall_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    t = waterfall_table(df)
    if t.empty:
        return None, "no rows for the waterfall yet (need fa4 rows of the fa3_like ... full variants, seqlen >= 4k)"
    plt, _ = _setup()
    cases = sorted(set(zip(t["mode"], t["causal"])), key=lambda mc: (mc[0] != "fwd", mc[1]))
    fig, axes = _grid(plt, len(cases))
    for ax, (m, c) in zip(axes, cases):
        p = t[(t["mode"] == m) & (t["causal"] == c)].sort_values("step")
        prev = 0.0
        for i, (_, r) in enumerate(p.iterrows()):
            delta = r["tflops"] - prev
            base = prev if i else 0.0
            color = "tab:gray" if i == 0 else ("tab:green" if delta >= 0 else "tab:red")
            ax.bar(i, delta if i else r["tflops"], bottom=base, color=color)
            ax.text(i, r["tflops"], f"{r['tflops']:.0f}" + (f"\n({delta:+.0f})" if i else ""), ha="center",
                    va="bottom", fontsize=7)
            prev = r["tflops"]
        ax.set_xticks(range(len(p)))
        ax.set_xticklabels([v.replace("fa3_like", "FA3-like").replace("+", "\n+") for v in p["variant"]], fontsize=7)
        ax.set(title=f"{m}, {'causal' if c else 'non-causal'}", ylabel="TFLOP/s (median, seqlen >= 4k)")
    fig.suptitle("Waterfall: from an FA3-like configuration to full FA4, one idea at a time")
    fig.tight_layout()
    out = _save_png(plt, fig, Path(outdir) / "ablation_waterfall.png")
    return out, f"wrote {out}"


def sweep_figure(df: pd.DataFrame, outdir, field: str = "rescale_threshold") -> tuple[Path | None, str]:
    """TFLOP/s vs one swept config field (variants '<field>=<value>'), one line per sequence length."""
    d = attn_times(df)
    if d.empty:
        return None, f"no rows for the {field} sweep yet"
    d = d[(d["backend"] == "fa4") & d["variant"].astype(str).str.startswith(f"{field}=")]
    if d.empty:
        return None, f"no rows for the {field} sweep yet (variants '{field}=...')"
    d = d.assign(x=d["variant"].str.split("=").str[1].astype(float))
    pts = d.groupby(["mode", "causal", "seqlen_q", "x"], as_index=False)["tflops"].median()
    plt, sns = _setup()
    g = sns.relplot(data=pts, x="x", y="tflops", hue="seqlen_q", col="causal", row="mode", kind="line", marker="o",
                    height=2.8, aspect=1.4, palette="viridis")
    g.set_axis_labels(field, "TFLOP/s")
    out = Path(outdir) / f"ablation_sweep_{field}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    g.figure.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(g.figure)
    return out, f"wrote {out}"


# ---------------------------------------------------------------------------------------------------
# numerics (CPU model of the algorithm: error and skipped rescales vs tau and the exp2 fraction)
# ---------------------------------------------------------------------------------------------------
def numerics_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    if df is None or df.empty or "kind" not in df:
        return None, "no rows for the numerics figure yet (results/numerics/rows.jsonl)"
    d = df[(df["kind"] == "numerics") & (df.get("status", "ok") == "ok")]
    if d.empty:
        return None, "no rows for the numerics figure yet (no rows of kind 'numerics')"
    keys = [k for k in ("dist", "dtype", "hdim", "tau", "exp2_fraction") if k in d]
    w = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="median").reset_index()
    need = {"out_err_ratio", "skipped_share"}
    if not need <= set(w.columns):
        return None, f"no rows for the numerics figure yet (metrics {sorted(need - set(w.columns))} missing)"
    plt, sns = _setup()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    hue = "exp2_fraction" if "exp2_fraction" in w else None
    style = "dtype" if "dtype" in w else None
    sns.lineplot(data=w, x="tau", y="out_err_ratio", hue=hue, style=style, marker="o", ax=axes[0], palette="viridis",
                 estimator="max", errorbar=None)
    axes[0].axhline(2.0, color="red", lw=0.8, ls="--", label="rule: 2x plain PyTorch")
    axes[0].set(ylabel="max|out - ref| / max|out_pt - ref|",
                title="error vs tau, worst case over inputs and head dims (fp64 reference)")
    axes[0].legend(fontsize=6)
    sns.lineplot(data=w, x="tau", y="skipped_share", hue="dist" if "dist" in w else None, marker="o", ax=axes[1])
    axes[1].set(ylabel="share of rescales skipped", title="rescales skipped vs tau")
    fig.tight_layout()
    out = _save_png(plt, fig, Path(outdir) / "numerics_tau_exp2.png")
    return out, f"wrote {out} ({len(d)} rows)"


# ---------------------------------------------------------------------------------------------------
# microbenchmarks (calibration): measured exp2 rates vs the roofline's model of the mix
# ---------------------------------------------------------------------------------------------------
def microbench_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    """exp2 throughput (exp/clk/SM) vs the emulated fraction: measured, and the model's prediction
    (min of MUFU and issue limits, with the measured MUFU and polynomial rates)."""
    if df is None or df.empty or "metric" not in df:
        return None, "no rows for the exp2 calibration yet (results/h200/microbench/rows.jsonl)"
    m = df[df["metric"].isin(["mufu_ex2_per_clk_sm", "poly_exp2_per_clk_sm",
                              "mix_exp2_per_clk_sm"]) & (df.get("status", "ok") == "ok") & df["value"].notna()]
    if m.empty:
        return None, "no rows for the exp2 calibration yet (no exp2 rows with a value)"
    m = m.assign(fraction=m["fraction"].astype(float)).groupby("fraction", as_index=False)["value"].median()
    mufu = m.loc[m["fraction"] == 0.0, "value"]
    poly = m.loc[m["fraction"] == 1.0, "value"]
    plt, _ = _setup()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
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
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = _save_png(plt, fig, Path(outdir) / "microbench_exp2_mix.png")
    return out, f"wrote {out}"


# ---------------------------------------------------------------------------------------------------
# run every notebook (python run.py figures)
# ---------------------------------------------------------------------------------------------------
NOTEBOOKS = ("roofline.py", "ablations.py", "numerics.py", "paper_figures.py")


def notebook_paths() -> list[Path]:
    return [REPO / "analysis" / "notebooks" / n for n in NOTEBOOKS]


def main(args=None) -> int:
    """`python run.py figures [--results DIR] [--out DIR]`: execute every notebook, write the figures and
    results/figures/index.md. Returns 0 (a notebook that fails raises after the others ran)."""
    import argparse

    p = argparse.ArgumentParser(prog="run.py figures", description="run every analysis notebook")
    p.add_argument("--results", default=None, help="results folder (default: $FA4LAB_RESULTS or results/)")
    p.add_argument("--out", default=None, help="figures folder (default: $FA4LAB_FIGURES or results/figures/)")
    ns = p.parse_args(list(args) if isinstance(args, (list, tuple)) else [])
    if ns.results:
        os.environ["FA4LAB_RESULTS"] = str(Path(ns.results).resolve())
    if ns.out:
        os.environ["FA4LAB_FIGURES"] = str(Path(ns.out).resolve())
    run_notebooks()
    return 0


def run_notebooks() -> list[str]:
    """Execute every notebook as a script (results from FA4LAB_RESULTS or results/, figures to
    FA4LAB_FIGURES or results/figures/), then write index.md listing the figures; returns the PNGs."""
    import runpy

    out = figures_dir()
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for nb in notebook_paths():
        print(f"== {nb.relative_to(REPO)}")
        try:
            runpy.run_path(str(nb), run_name="__main__")
        except Exception as e:  # one broken notebook must not hide the others' figures
            failed.append(f"{nb.name}: {type(e).__name__}: {e}")
            print(f"!! {nb.name} failed: {type(e).__name__}: {e}")
    pngs = sorted(p.name for p in out.glob("*.png"))
    tables = sorted(p.name for p in out.glob("*.md") if p.name != "index.md")
    lines = ["# Figures", "", "Generated by `python run.py figures` from the rows under results/.", ""]
    lines += [f"![{p}]({p})" for p in pngs] + [""] + [f"- [{t}]({t})" for t in tables]
    (out / "index.md").write_text("\n".join(lines) + "\n")
    print(f"figures: {len(pngs)} PNGs, {len(tables)} tables in {out}")
    if failed:
        raise RuntimeError("notebooks failed: " + "; ".join(failed))
    return [str(out / p) for p in pngs]


def show(result) -> None:
    """Print what a figure/table function did: the file it wrote (or 'no rows for X yet'), and a table."""
    obj, msg = result
    print(msg)
    if isinstance(obj, pd.DataFrame) and not obj.empty:
        print(markdown_table(obj))
