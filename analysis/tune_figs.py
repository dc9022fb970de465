"""The search of ``python run.py tune``: every candidate against the default, per (direction, head dim, causal).

Rows are the tune set's ``time_ratio`` rows (experiments/tune.py: one compare job per candidate and sequence
length, candidate and default timed round-robin). A candidate's speedup per round is t_default / t_candidate; a
point is the median over rounds with a bar from p20 to p80; a candidate beats the default at a sequence length when
its p20 is above 1 (kernels/tuning.py, the rule that writes conf/tuned/<arch>.yaml), and the winner is starred.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.select import provenance_note
from analysis.style import grid, legend_below, save_png, setup
from kernels.tuning import pick_winner, speedup_stats

PANEL = ["mode", "hdim", "causal"]


def tune_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (mode, hdim, causal, seqlen, candidate): median / p20 / p80 speedup over the default, n rounds,
    ``beats`` (p20 > 1), ``ok`` (no failed row in the candidate's jobs), the search index and the config."""
    need = {"experiment", "metric", "status", "variant", "samples", "job_key"}
    if df is None or df.empty or not need <= set(df.columns):
        return pd.DataFrame()
    d = df[df["experiment"] == "tune"]
    bad_jobs = set(d.loc[d["status"] != "ok", "job_key"])
    r = d[(d["metric"] == "time_ratio") & (d["status"] == "ok")]
    out = []
    for _, row in r.iterrows():
        st = speedup_stats(row["samples"] if isinstance(row["samples"], list) else None)
        if st is None:
            continue
        tune = row.get("tune") if isinstance(row.get("tune"), dict) else {}
        out.append(dict(mode=row["mode"], hdim=int(row["hdim"]), causal=bool(row["causal"]),
                        seqlen=int(row["seqlen_q"]), variant=row["variant"], candidate=tune.get("candidate"),
                        config=row.get("config"), ok=row["job_key"] not in bad_jobs,
                        gpu=row.get("gpu_name"), time=row.get("time"), **st))
    if not out:
        return pd.DataFrame()
    s = pd.DataFrame(out).sort_values("time")
    return s.drop_duplicates(PANEL + ["seqlen", "variant"], keep="last").reset_index(drop=True)


def winners(s: pd.DataFrame) -> pd.DataFrame:
    """Per panel: the winner by the tuning rule over the sequence lengths present (pingpong off cannot be a table
    default, so those candidates do not compete), or none."""
    if s is None or s.empty:
        return pd.DataFrame()
    out = []
    for key, p in s.groupby(PANEL):
        seqlens = sorted(set(p["seqlen"]))
        cands = []
        for v, q in p.groupby("variant"):
            cfg = q["config"].iloc[0] if isinstance(q["config"].iloc[0], dict) else {}
            cands.append(dict(name=v, config=cfg, ok=bool(q["ok"].all()),
                              stats={int(r.seqlen): dict(median=r.median, p20=r.p20, p80=r.p80, n=r.n, beats=r.beats)
                                     for r in q.itertuples()}))
        w = pick_winner([c for c in cands if c["config"].get("pingpong", True) is True], seqlens)
        out.append(dict(zip(PANEL, key), winner=w["name"] if w else None, score=w["score"] if w else None,
                        candidates=len(cands)))
    return pd.DataFrame(out)


def tune_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    """Speedup of every candidate over the default (x: candidates in search order), one panel per (direction, head
    dim, causal), one marker per sequence length; the winner starred; grey line at 1 (parity)."""
    s = tune_speedups(df)
    if s.empty:
        return None, "no rows for the tune search yet (python run.py tune on a GPU writes results/<gpu>/tune/)"
    w = winners(s)
    plt, _ = setup()
    cases = sorted(set(zip(s["mode"], s["hdim"], s["causal"])), key=lambda k: (k[0] != "fwd", k[1], k[2]))
    fig, axes = grid(plt, len(cases), w=7.0, h=3.4)
    handles = {}
    markers = "osD^v"
    for ax, (m, h, c) in zip(axes, cases):
        p = s[(s["mode"] == m) & (s["hdim"] == h) & (s["causal"] == c)]
        order = (p.sort_values(["candidate", "variant"]).drop_duplicates("variant")["variant"].tolist())
        x = {v: i for i, v in enumerate(order)}
        for k, (sl, q) in enumerate(p.groupby("seqlen")):
            xs = [x[v] + (k - 0.5) * 0.2 for v in q["variant"]]
            line = ax.errorbar(xs, q["median"], yerr=[q["median"] - q["p20"], q["p80"] - q["median"]],
                               fmt=markers[k % len(markers)], ms=3, capsize=0, lw=0.7, label=f"seqlen {sl}")
            handles.setdefault(f"seqlen {sl}", line)
            bad = q[~q["ok"]]
            if not bad.empty:
                pts = ax.scatter([x[v] for v in bad["variant"]], bad["median"], marker="x", color="red", zorder=5)
                handles.setdefault("failed check or a fail row", pts)
        win = w[(w["mode"] == m) & (w["hdim"] == h) & (w["causal"] == c)]["winner"]
        if len(win) and pd.notna(win.iloc[0]):  # no winner: None, or NaN once pandas mixes it with names
            v = win.iloc[0]
            star = ax.scatter([x[v]], [p[p["variant"] == v]["median"].max()], marker="*", s=140, color="gold",
                              edgecolor="black", zorder=6)
            handles.setdefault("winner (p20 > 1 at every seqlen)", star)
        ax.axhline(1.0, color="gray", lw=0.8)
        if p["p80"].max() / max(p["p20"].min(), 1e-9) > 4:  # wide spreads (e.g. a CPU run): ratios on a log axis
            ax.set_yscale("log")
        ax.set(title=f"{m}, hdim {h}, {'causal' if c else 'non-causal'}: {len(order)} candidates",
               xlabel="candidate (search order; the x tick is its index)", ylabel="speedup over the default (x)")
        ax.set_xticks(range(len(order)))
        ax.set_xticklabels([str(i + 1) for i in range(len(order))], fontsize=5)
    fig.suptitle("tune: every candidate vs the default, round-robin in one process\n(median speedup over rounds, "
                 "bar p20-p80)", fontsize=9)
    bottom = legend_below(fig, list(handles.values()), list(handles), ncol=4)
    note = provenance_note(df[df["metric"] == "time_ratio"]) if "metric" in df else ""
    out = save_png(plt, fig, Path(outdir) / "tune_search.png", note, bottom)
    return out, f"wrote {out} ({len(s)} points, {len(cases)} panels)"
