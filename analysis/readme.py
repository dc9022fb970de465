"""The README's generated results block: which cells have rows (coverage) and ours / official FA4 per cell, made
from the committed rows by ``python run.py figures`` and written between the README's markers, so no number in it
is typed by hand (tests/test_readme_results.py checks that the README matches the rows)."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from analysis.select import REPO, attn_times
from analysis.tables import coverage, markdown_table

BEGIN, END = "<!-- results:begin (python run.py figures writes this block) -->", "<!-- results:end -->"


def _seq(s) -> str:
    return f"{int(s) // 1024}k" if s >= 1024 else str(int(s))


def ours_vs_official(df: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Per (head dim, causal) x seqlen: speed of ours / speed of the official FA4. Round-robin cells: the median over
    rounds of t_official / t_ours (time_ratio rows, baseline fa4); other cells: the ratio of separately timed medians,
    marked '†'."""
    out: dict[tuple, dict] = {}
    if df is not None and not df.empty and {"metric", "baseline"} <= set(df.columns):
        rr = df[(df["metric"] == "time_ratio") & (df["status"] == "ok") & (df["backend"] == "fa4_official")
                & (df["baseline"] == "fa4") & (df["mode"] == mode)]
        for (hd, c, s), g in rr.groupby(["hdim", "causal", "seqlen_q"]):
            out.setdefault((int(hd), bool(c)), {})[_seq(s)] = f"{g['value'].median():.2f} (n={int(g['n'].min())})"
    t = attn_times(df)
    if not t.empty:
        t = t[(t["mode"] == mode) & (t["kind"] != "compare") & t["variant"].isin(["default", "peer"])]
        med = t.groupby(["hdim", "causal", "seqlen_q", "backend"])["value"].median().unstack("backend")
        if {"fa4", "fa4_official"} <= set(med.columns):
            for (hd, c, s), r in med.dropna(subset=["fa4", "fa4_official"]).iterrows():
                out.setdefault((int(hd), bool(c)), {}).setdefault(_seq(s), f"{r['fa4_official'] / r['fa4']:.2f}†")
    rows = [{"hdim": hd, "causal": "yes" if c else "no", **cells} for (hd, c), cells in sorted(out.items())]
    tab = pd.DataFrame(rows)
    if tab.empty:
        return tab
    seqs = sorted([c for c in tab.columns if c not in ("hdim", "causal")], key=lambda x: int(x.rstrip("k")))
    return tab[["hdim", "causal", *seqs]].fillna("")


def round_robin_table(df: pd.DataFrame, mode: str, backend: str, variant: str | None = None,
                      invert: bool = False) -> pd.DataFrame:
    """Per (head dim, causal) x seqlen, from round-robin time_ratio rows (baseline: our default): the median over
    rounds of t_entry / t_ours (a peer: speed of ours / speed of the peer), or its inverse (``invert``: speed of one of
    our variants / speed of our default)."""
    if df is None or df.empty or not {"metric", "baseline"} <= set(df.columns):
        return pd.DataFrame()
    rr = df[(df["metric"] == "time_ratio") & (df["status"] == "ok") & (df["backend"] == backend)
            & (df["baseline"] == "fa4") & (df["mode"] == mode)]
    if variant is not None:
        rr = rr[rr["variant"] == variant]
    out: dict[tuple, dict] = {}
    for (hd, c, s), g in rr.groupby(["hdim", "causal", "seqlen_q"]):
        v = g["value"].median()
        out.setdefault((int(hd), bool(c)), {})[_seq(s)] = f"{(1 / v if invert else v):.2f}"
    tab = pd.DataFrame([{"hdim": hd, "causal": "yes" if c else "no", **cells} for (hd, c), cells in sorted(out.items())])
    if tab.empty:
        return tab
    seqs = sorted([c for c in tab.columns if c not in ("hdim", "causal")], key=lambda x: int(x.rstrip("k")))
    return tab[["hdim", "causal", *seqs]].fillna("")


BWD_EXTRA = (("sdpa_cudnn", None, False, "Backward, ours / cuDNN (round-robin, speed ratio; > 1: ours faster):"),
             ("fa4", "deterministic", True, "Backward, our deterministic / our default (round-robin, speed ratio):"),
             ("fa4", "two_cta", True, "Backward, our two_cta / our default (round-robin, speed ratio):"))


def results_block(df: pd.DataFrame) -> str:
    """The Markdown between the README's markers, from the rows of the peer experiments (committed sets)."""
    parts = [BEGIN, ""]
    for mode, name in (("fwd", "Forward"), ("bwd", "Backward")):
        t = ours_vs_official(df, mode)
        parts += [f"{name}, ours / official FA4 (speed ratio; > 1: ours faster):", "",
                  markdown_table(t) if not t.empty else "(no rows yet)", ""]
    for backend, variant, invert, caption in BWD_EXTRA:
        t = round_robin_table(df, "bwd", backend, variant, invert)
        if not t.empty:
            parts += [caption, "", markdown_table(t), ""]
    parts += ["† separately timed jobs (before round-robin timing): read within ±6% as parity. "
              "(n=...) = rounds of a round-robin job.", "",
              "Coverage (timed cells; 'fa4 +k rr' = ours and k peers timed round-robin in one job, 'sep' = separate "
              "jobs):", ""]
    cov = coverage(df)
    parts += [markdown_table(cov) if not cov.empty else "(no timed rows yet)", "", END]
    return "\n".join(parts)


def update_readme(block: str, path: Path | None = None) -> bool:
    """Replace the README's block between the markers with ``block``; False when the markers are missing."""
    path = Path(path or REPO / "README.md")
    text = path.read_text(encoding="utf-8")
    pat = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pat.search(text):
        return False
    path.write_text(pat.sub(lambda _: block, text), encoding="utf-8")
    return True
