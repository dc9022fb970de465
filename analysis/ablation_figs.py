"""Ablation statistics and figures: the speedup of each switch with its spread, the waterfall from an FA3-like
configuration to full FA4, and the one-field sweeps (tau, exp2 fraction).

A switch's speedup comes, per cell, from the best basis present: ``round_robin`` (time_ratio rows of compare jobs:
the variant and ``full`` timed in the same rounds), ``ab_ratio`` (older A/B rows), else ``medians`` of separately
timed jobs. Variants whose kernel is the full config's (same compiled or resolved hash) measure no switch: they are
left out of the speedups, merged into one waterfall step, and their spread against ``full`` is drawn as the noise
band. Head dims are never pooled: one panel each.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.select import attn_times, provenance_note, ratio_rows
from analysis.style import grid, legend_below, save_png, setup

# ablation variant (switch off) -> the switch it removes; speedup of a switch = t(off) / t(full)
SWITCH_OFF = {"no_pingpong": "pingpong", "tau0": "tau (rescale_threshold)", "no_exp2_emu": "exp2 emulation",
              "no_intra_wg_overlap": "intra-warpgroup overlap", "no_speculative_exp": "speculative exponentials",
              "two_cta": "2-CTA (on)",
              "deterministic": "deterministic (on)", "rescale_before_pv": "rescale O before PV (on)"}
WATERFALL = ("fa3_like", "fa3_like+pingpong", "fa3_like+pingpong+tau8", "full")
BASIS_ORDER = ("round_robin", "ab_ratio", "medians")
BASIS_LABEL = {"round_robin": "round-robin", "ab_ratio": "A/B pairs", "medians": "separate jobs"}
MIN_HALF_SPAN = 0.1  # a speedup axis spans at least 0.9x..1.1x, so run-to-run noise never fills a panel


def kernel_ids(d: pd.DataFrame) -> list:
    """Per row, what identifies its compiled kernel: compiled_hash where recorded, else the resolved config hash."""
    none = pd.Series([None] * len(d), index=d.index)
    comp, rec, cfg = (d[c] if c in d else none for c in ("compiled_hash", "resolved_config_hash", "config"))
    return [c if isinstance(c, str) else r if isinstance(h, str) or isinstance(g, dict) else None
            for c, h, g, r in zip(comp, rec, cfg, resolved_hashes(d))]  # no hash and no config: unknown


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


def _rr_ratios(df: pd.DataFrame, noise: bool = False) -> pd.DataFrame:
    """Per (shape, mode, variant): r = t(full) / t(variant) from time_ratio rows (t_variant / t_full per round, fa4
    against baseline fa4[full], GPU rows), interval from the per-round p20/p80. ``noise``: instead, the rows of
    variants that compile the full config's kernel (their spread is the measurement's noise)."""
    d = ratio_rows(df)  # GPU time_ratio rows, each shape from its latest compare job
    if d.empty:
        return pd.DataFrame()
    d = d[(d["backend"] == "fa4") & (d["baseline"] == "fa4[full]")]
    if d.empty:
        return pd.DataFrame()
    same = pd.Series(kernel_ids(d), index=d.index) == d.get("baseline_compiled_hash")
    d = d[same] if noise else d[~same]
    if d.empty:
        return pd.DataFrame()
    agg = d.groupby(SPEEDUP_KEYS + ["variant"], as_index=False).agg(
        value=("value", "median"), p20=("p20", "median"), p80=("p80", "median"))
    # stored: t_variant / t_full; here r = t_full / t_variant as the other bases
    return pd.DataFrame({**{k: agg[k] for k in SPEEDUP_KEYS + ["variant"]}, "r": 1 / agg["value"],
                         "r_lo": 1 / agg["p80"], "r_hi": 1 / agg["p20"], "basis": "round_robin"})


def noise_band(df: pd.DataFrame) -> pd.DataFrame:
    """Per (mode, causal, hdim): the spread [lo, hi] of ratios between variants that compile one and the same kernel
    as full, timed in the same rounds (p20/p80 over their rounds): a speedup inside it is not a measured effect."""
    n = _rr_ratios(df, noise=True)
    if n.empty:
        return n
    return n.groupby(["mode", "causal", "hdim"], as_index=False).agg(lo=("r_lo", "min"), hi=("r_hi", "max"))


def switch_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per (mode, causal, shape, switch): the speedup of the switch with a spread interval [lo, hi] and its
    ``basis`` (round_robin, else ab_ratio, else medians of separate jobs; see the module docstring). A variant that
    switches something off: speedup = t(variant) / t(full) = 1 / r; one that turns it on (two_cta, deterministic):
    speedup = r; > 1 means the switch makes the kernel faster."""
    parts, have = [], None
    for part in (_rr_ratios(df), _ab_ratios(df), _median_ratios(df)):
        if part.empty:
            continue
        idx = pd.MultiIndex.from_frame(part[SPEEDUP_KEYS + ["variant"]])
        if have is not None:
            part = part[~idx.isin(have)]
            idx = pd.MultiIndex.from_frame(part[SPEEDUP_KEYS + ["variant"]])
        have = idx if have is None else have.append(idx)
        parts.append(part)
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
    """Speedup of each switch per sequence length (points with p20/p80 spread bars; grey: the noise band of
    identical kernels timed in the same rounds), one panel per (mode, causal, head dim)."""
    s = switch_speedups(df)
    if s.empty:
        return None, "no rows for the ablation speedups yet (need fa4 rows of variant 'full' and a switch-off variant)"
    band = noise_band(df)
    plt, sns = setup()
    cases = sorted(set(zip(s["mode"], s["causal"], s["hdim"])), key=lambda k: (k[0] != "fwd", k[1], k[2]))
    fig, axes = grid(plt, len(cases))
    switches = [x for x in SWITCH_OFF.values() if x in set(s["switch"])]
    colors = dict(zip(switches, sns.color_palette(n_colors=len(switches))))  # one colour per switch in every panel
    handles = {}
    for ax, (m, c, h) in zip(axes, cases):
        p = s[(s["mode"] == m) & (s["causal"] == c) & (s["hdim"] == h)]
        b = band[(band["mode"] == m) & (band["causal"] == c) & (band["hdim"] == h)] if not band.empty else band
        if not b.empty:
            ax.axhspan(float(b["lo"].min()), float(b["hi"].max()), color="lightgray", alpha=0.6, zorder=0)
            handles.setdefault("noise: identical kernels, same rounds (p20/p80)",
                               plt.Rectangle((0, 0), 1, 1, color="lightgray"))
        for sw, q in p.groupby("switch"):
            q = q.sort_values("seqlen_q")
            x = [str(int(v)) for v in q["seqlen_q"]]
            line = ax.errorbar(x, q["speedup"], yerr=[q["speedup"] - q["lo"], q["hi"] - q["speedup"]], marker="o",
                               capsize=3, label=sw, color=colors[sw])
            handles.setdefault(sw, line)
        ax.axhline(1.0, color="gray", lw=0.8)
        if b.empty:  # no identical-kernel pair timed in the same rounds: say so, and keep run-to-run noise small
            ax.text(0.01, 0.02, "no noise band here (no identical kernels timed in the same rounds)",
                    transform=ax.transAxes, fontsize=6, color="dimgray")
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 1 - MIN_HALF_SPAN), max(hi, 1 + MIN_HALF_SPAN))  # never a +-1% axis
        bases = ", ".join(BASIS_LABEL[x] for x in BASIS_ORDER if x in set(p["basis"]))
        ax.set(title=f"{m}, hdim {int(h)}, {'causal' if c else 'non-causal'} ({bases})", xlabel="sequence length",
               ylabel="speedup of the switch (x)")
    how = {"round_robin": "round-robin vs full", "ab_ratio": "interleaved A/B vs full",
           "medians": "medians of separate jobs"}
    fig.suptitle(f"Speedup per switch (t(without) / t(with); {', '.join(how[b] for b in sorted(set(s['basis'])))}; "
                 f"bars: p20/p80)")
    labels = [x for x in [*switches, *handles] if x in handles]
    labels = list(dict.fromkeys(labels))
    bottom = legend_below(fig, [handles[x] for x in labels], labels, ncol=3)
    out = save_png(plt, fig, Path(outdir) / "ablation_speedups.png", provenance_note(attn_times(df)), bottom)
    return out, f"wrote {out} ({len(s)} points)"


def waterfall_table(df: pd.DataFrame) -> pd.DataFrame:
    """TFLOP/s of the waterfall variants (FA3-like -> +pingpong -> +tau -> full), per (mode, causal, head dim),
    median over sequence lengths >= 4k. A step that compiles the same kernel as the step before is merged into it
    (its label joins the previous one with ' = '): it adds nothing but noise."""
    d = attn_times(df)
    if d.empty:
        return d
    d = d[(d["backend"] == "fa4") & d["variant"].isin(WATERFALL) & (d["seqlen_q"] >= 4096)]
    if d.empty:
        return d
    d = d.assign(kernel=kernel_ids(d))
    t = d.groupby(["mode", "causal", "hdim", "variant"], as_index=False).agg(
        tflops=("tflops", "median"), kernel=("kernel", "first"))
    t["step"] = t["variant"].map({v: i for i, v in enumerate(WATERFALL)})
    out = []
    for _, g in t.sort_values("step").groupby(["mode", "causal", "hdim"], sort=True):
        rows = []
        for _, r in g.iterrows():
            if rows and r["kernel"] is not None and r["kernel"] == rows[-1]["kernel"]:
                rows[-1]["variant"] = f"{rows[-1]['variant']} = {r['variant']}"
                continue
            rows.append(r.to_dict())
        if len(rows) >= 2:  # a waterfall needs two steps at least
            out += rows
    return pd.DataFrame(out)


def waterfall_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    t = waterfall_table(df)
    if t.empty:
        return None, "no rows for the waterfall yet (need fa4 rows of the fa3_like ... full variants, seqlen >= 4k)"
    plt, _ = setup()
    cases = sorted(set(zip(t["mode"], t["causal"], t["hdim"])), key=lambda k: (k[0] != "fwd", k[1], k[2]))
    fig, axes = grid(plt, len(cases))
    for ax, (m, c, h) in zip(axes, cases):
        p = t[(t["mode"] == m) & (t["causal"] == c) & (t["hdim"] == h)].sort_values("step")
        prev = 0.0
        for i, (_, r) in enumerate(p.iterrows()):
            delta = r["tflops"] - prev
            color = "tab:gray" if i == 0 else ("tab:green" if delta >= 0 else "tab:red")
            ax.bar(i, delta if i else r["tflops"], bottom=prev if i else 0.0, color=color)
            ax.text(i, r["tflops"], f"{r['tflops']:.0f}" + (f"\n({delta:+.0f})" if i else ""), ha="center",
                    va="bottom", fontsize=7)
            prev = r["tflops"]
        ax.set_xticks(range(len(p)))
        ax.set_xticklabels([v.replace("fa3_like", "FA3-like").replace("+", "\n+").replace(" = ", "\n= ")
                            for v in p["variant"]], fontsize=6)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
        ax.set(title=f"{m}, hdim {int(h)}, {'causal' if c else 'non-causal'}", ylabel="TFLOP/s (median, seqlen >= 4k)")
    fig.suptitle("Waterfall: from an FA3-like configuration to full FA4, one idea at a time "
                 "('a = b': one compiled kernel)")
    out = save_png(plt, fig, Path(outdir) / "ablation_waterfall.png", provenance_note(attn_times(df)))
    return out, f"wrote {out}"


def sweep_figure(df: pd.DataFrame, outdir, field: str = "rescale_threshold") -> tuple[Path | None, str]:
    """TFLOP/s vs one swept config field (variants '<field>=<value>'), one line per sequence length, one panel per
    (mode, head dim, causal); y from 0."""
    d = attn_times(df)
    if d.empty:
        return None, f"no rows for the {field} sweep yet"
    d = d[(d["backend"] == "fa4") & d["variant"].astype(str).str.startswith(f"{field}=")]
    if d.empty:
        return None, f"no rows for the {field} sweep yet (variants '{field}=...')"
    d = d.assign(x=d["variant"].str.split("=").str[1].astype(float))
    pts = d.groupby(["mode", "hdim", "causal", "seqlen_q", "x"], as_index=False)["tflops"].median()
    cases = sorted(set(zip(pts["mode"], pts["hdim"], pts["causal"])), key=lambda k: (k[0] != "fwd", k[1], k[2]))
    plt, _ = setup()
    fig, axes = grid(plt, len(cases), w=4.6, h=3.2)
    handles = {}
    for ax, (m, h, c) in zip(axes, cases):
        p = pts[(pts["mode"] == m) & (pts["hdim"] == h) & (pts["causal"] == c)]
        for s, q in p.groupby("seqlen_q"):
            (line,) = ax.plot(q["x"], q["tflops"], marker="o", label=f"seqlen {int(s)}")
            handles.setdefault(f"seqlen {int(s)}", line)
        ax.set_ylim(0, max(p["tflops"]) * 1.1)
        ax.set(title=f"{m}, hdim {int(h)}, {'causal' if c else 'non-causal'}", xlabel=field, ylabel="TFLOP/s")
    fig.suptitle(f"Sweep of {field} (full config otherwise)")
    bottom = legend_below(fig, list(handles.values()), list(handles))
    out = save_png(plt, fig, Path(outdir) / f"ablation_sweep_{field}.png", provenance_note(d), bottom)
    return out, f"wrote {out}"
