"""The search of ``python run.py tune``: every candidate against the default, per (direction, head dim, causal).

Rows are the tune set's ``time_ratio`` rows (experiments/tune.py: one compare job per candidate and sequence
length, candidate and default timed round-robin). A candidate's speedup per round is t_default / t_candidate; a
point is the median over rounds with a bar from p20 to p80; a candidate beats the default at a sequence length when
its p20 is above 1 (kernels/tuning.py, the rule that writes conf/tuned/<arch>.yaml), and the winner is starred.

Final round (rows with ``tune.final``): the default and the search's finalists re-timed together in one job per
sequence length. Its points are drawn apart (open black markers, right of the candidate's search points), never as
search candidates, and where a panel has them the winner is the final round's (the rule tune applies); a panel
without them (rows from before the final round) shows the search's winner by the same rule.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.select import provenance_note
from analysis.style import grid, legend_below, save_png, setup
from kernels.tuning import pick_winner, speedup_stats

PANEL = ["mode", "hdim", "causal"]


def _variant(v):
    return v if isinstance(v, str) else None


def tune_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (mode, hdim, causal, seqlen, candidate, final): median / p20 / p80 speedup over the default, n
    rounds, ``beats`` (p20 > 1), ``ok`` (no failed row of the candidate, the default or the job in its job), the
    search index, the config, and ``final`` (a final-round row: the default and the finalists timed together)."""
    need = {"experiment", "metric", "status", "variant", "samples", "job_key"}
    if df is None or df.empty or not need <= set(df.columns):
        return pd.DataFrame()
    d = df[df["experiment"] == "tune"]
    bad = set(zip(d.loc[d["status"] != "ok", "job_key"], map(_variant, d.loc[d["status"] != "ok", "variant"])))
    r = d[(d["metric"] == "time_ratio") & (d["status"] == "ok")]
    out = []
    for _, row in r.iterrows():
        st = speedup_stats(row["samples"] if isinstance(row["samples"], list) else None)
        if st is None:
            continue
        tune = row.get("tune") if isinstance(row.get("tune"), dict) else {}
        k = row["job_key"]
        ok = not ({(k, row["variant"]), (k, "default"), (k, None)} & bad)
        out.append(dict(mode=row["mode"], hdim=int(row["hdim"]), causal=bool(row["causal"]),
                        seqlen=int(row["seqlen_q"]), variant=row["variant"], candidate=tune.get("candidate"),
                        config=row.get("config"), ok=ok, final=bool(tune.get("final", False)),
                        gpu=row.get("gpu_name"), time=row.get("time"), **st))
    if not out:
        return pd.DataFrame()
    s = pd.DataFrame(out).sort_values("time")
    return s.drop_duplicates(PANEL + ["seqlen", "variant", "final"], keep="last").reset_index(drop=True)


def _pick(p: pd.DataFrame) -> dict | None:
    seqlens = sorted(set(p["seqlen"]))
    cands = []
    for v, q in p.groupby("variant"):
        cfg = q["config"].iloc[0] if isinstance(q["config"].iloc[0], dict) else {}
        cands.append(dict(name=v, config=cfg, ok=bool(q["ok"].all()),
                          stats={int(r.seqlen): dict(median=r.median, p20=r.p20, p80=r.p80, n=r.n, beats=r.beats)
                                 for r in q.itertuples()}))
    return pick_winner([c for c in cands if c["config"].get("pingpong", True) is True], seqlens)


def winners(s: pd.DataFrame) -> pd.DataFrame:
    """Per panel: the winner by the tuning rule (pingpong off cannot be a table default, so those candidates do not
    compete), or none; from the final round where the panel has one (``round`` "final"), else from the search over
    the sequence lengths present (``round`` "search"). ``candidates``: the search's."""
    if s is None or s.empty:
        return pd.DataFrame()
    if "final" not in s:
        s = s.assign(final=False)
    out = []
    for key, p in s.groupby(PANEL):
        fin = p[p["final"]]
        w = _pick(fin if not fin.empty else p[~p["final"]])
        out.append(dict(zip(PANEL, key), winner=w["name"] if w else None, score=w["score"] if w else None,
                        candidates=p.loc[~p["final"], "variant"].nunique(),
                        round="final" if not fin.empty else "search"))
    return pd.DataFrame(out)


def tune_figure(df: pd.DataFrame, outdir) -> tuple[Path | None, str]:
    """Speedup of every candidate over the default (x: candidates in search order), one panel per (direction, head
    dim, causal), one marker per sequence length; the winner starred; grey line at 1 (parity)."""
    everything = tune_speedups(df)
    if everything.empty:
        return None, "no rows for the tune search yet (python run.py tune on a GPU writes results/<gpu>/tune/)"
    w = winners(everything)
    s, f = everything[~everything["final"]], everything[everything["final"]]
    if s.empty:
        return None, "no rows for the tune search yet (only final-round rows)"
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
        fp = f[(f["mode"] == m) & (f["hdim"] == h) & (f["causal"] == c) & f["variant"].isin(list(x))]
        for k, (sl, q) in enumerate(fp.groupby("seqlen")):  # the final round: right of the search points, open
            xs = [x[v] + 0.3 + k * 0.1 for v in q["variant"]]
            line = ax.errorbar(xs, q["median"], yerr=[q["median"] - q["p20"], q["p80"] - q["median"]],
                               fmt=markers[k % len(markers)], ms=4, mfc="none", color="black", capsize=0, lw=0.7)
            handles.setdefault(f"final round, seqlen {sl} (default + finalists, one job)", line)
        row = w[(w["mode"] == m) & (w["hdim"] == h) & (w["causal"] == c)]
        win = row["winner"]
        if len(win) and pd.notna(win.iloc[0]) and win.iloc[0] in x:  # no winner: None, or NaN once pandas mixes it
            v = win.iloc[0]
            final = row["round"].iloc[0] == "final"
            src = fp if final else p
            star = ax.scatter([x[v] + (0.3 if final else 0.0)], [src[src["variant"] == v]["median"].max()], marker="*",
                              s=140, color="gold", edgecolor="black", zorder=6)
            handles.setdefault("winner (final round: p20 > 1 at every seqlen)" if final else
                               "winner (p20 > 1 at every seqlen)", star)
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
    more = f", {len(f)} final-round points" if len(f) else ""
    return out, f"wrote {out} ({len(s)} points, {len(cases)} panels{more})"
