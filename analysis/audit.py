"""Issue 10's "done when", checked against the committed rows: ``python -m analysis.audit [--results DIR] [--strict]``.

For every attention experiment, the rows the figures and README tables draw (analysis/select.py: round-robin rows of
each shape's latest compare job win over separately timed ones) are checked for what a reviewer needs: timed
round-robin, at least MIN_ROUNDS rounds, a throttled share and a git SHA, and ours' rows on the kernel configs that
today's defaults compile (kernels/staleness.py: a row timed before a default changed is stale; `python run.py
sweep experiment=<name> rerun=stale` times those jobs again); the paper grid's cells without rows are listed per mode;
compile_time must have >= 3 samples of ours and the official FA4 per (mode, head dim, causal); no tuned entry may be
stale (kernels.config.STALE_TUNED).
Prints one line per finding ('ok' or 'GAP'); ``--strict`` makes any GAP exit 1.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from analysis.select import (ATTN_EXPERIMENTS, MIN_ROUNDS, attn_times, load_experiments, ratio_rows,
                             round_robin_rows)
from analysis.tables import coverage

MIN_COMPILE_SAMPLES = 3


def _hd(h, hv) -> str:
    return f"{int(h)}" if int(h) == int(hv) else f"{int(h)}/{int(hv)}"


def row_gaps(d: pd.DataFrame) -> dict:
    """Counts of the rows in ``d`` that are not round-robin, have < MIN_ROUNDS rounds, lack a throttled share,
    lack a git SHA."""
    if d is None or d.empty:
        return dict(rows=0, separate=0, few_rounds=0, no_throttled_share=0, no_git_sha=0)
    n = pd.to_numeric(d["n"], errors="coerce") if "n" in d else pd.Series(float("nan"), index=d.index)
    return dict(rows=len(d), separate=int((~round_robin_rows(d)).sum()), few_rounds=int((n.fillna(0) < MIN_ROUNDS).sum()),
                no_throttled_share=int(d["throttled_share"].isna().sum()) if "throttled_share" in d else len(d),
                no_git_sha=int(d["git_sha"].isna().sum()) if "git_sha" in d else len(d))


def _cells(d: pd.DataFrame, mask) -> str:
    """'fwd 128 s1024 causal, ...' for the rows under ``mask`` (at most 6, then a count)."""
    x = d[mask].drop_duplicates(["mode", "hdim", "hdim_v", "causal", "seqlen_q"])
    names = [f"{m} {_hd(h, hv)} s{int(s)}{' causal' if c else ''}"
             for m, h, hv, c, s in zip(x["mode"], x["hdim"], x["hdim_v"], x["causal"], x["seqlen_q"])]
    return ", ".join(names[:6]) + (f" (+{len(names) - 6} more)" if len(names) > 6 else "")


def _stale_line(exp: str, d: pd.DataFrame) -> tuple[bool, str]:
    """(ok, line): how many of the timed rows drawn were measured on a kernel config that today's defaults no longer
    compile (their cells, and the command that re-times them)."""
    from kernels.staleness import is_stale

    if d is None or d.empty or "compiled_hash" not in d:
        return True, f"{exp}: no rows with a compiled kernel config to check"
    stale = pd.Series([is_stale(r) for r in d.to_dict("records")], index=d.index)
    line = f"{exp}: {int(stale.sum())} of {len(d)} timed rows drawn on a kernel config today's defaults no longer compile"
    if stale.any():
        line += f" [{_cells(d, stale)}; re-time: python run.py sweep experiment={exp} rerun=stale]"
    return not stale.any(), line


def _tuned_line() -> tuple[bool, str]:
    """(ok, line): the tuned entries kernels/config.py left out because the table under them changed (STALE_TUNED)."""
    from kernels.config import STALE_TUNED

    if not STALE_TUNED:
        return True, "tuned defaults: no stale entry (conf/tuned/)"
    names = [f"{a} {d} hdim {h}{' causal' if c else ''}" for a, h, c, d in sorted(STALE_TUNED)]
    return False, (f"tuned defaults: {len(names)} stale entr{'y' if len(names) == 1 else 'ies'} not applied "
                   f"({', '.join(names)}; re-measure: python run.py tune)")


def audit(root: Path | None = None) -> list[tuple[bool, str]]:
    """[(ok, line), ...] for the committed sets under ``root`` (default: $FA4LAB_RESULTS or results/)."""
    out: list[tuple[bool, str]] = []
    for exp in ATTN_EXPERIMENTS:
        df = load_experiments(exp, root=root, scratch=False)
        for what, d in (("timed rows drawn", attn_times(df)), ("ratio rows used", ratio_rows(df))):
            g = row_gaps(d)
            if not g["rows"]:
                out.append((False, f"{exp}: no {what}" + ("" if what.startswith("timed") or not len(attn_times(df))
                                                          else " (its timed rows are not round-robin)")))
                continue
            bad = {k: v for k, v in g.items() if k != "rows" and v}
            line = f"{exp}: {g['rows']} {what}" + ("" if not bad else ": " + ", ".join(f"{v} {k}" for k, v in bad.items()))
            if bad.get("separate"):
                line += f" [separately timed cells: {_cells(d, ~round_robin_rows(d))}]"
            out.append((not bad, line))
        out.append(_stale_line(exp, attn_times(df)))
    cov = coverage(load_experiments(*ATTN_EXPERIMENTS, root=root, scratch=False))
    seqs = [c for c in cov.columns if c not in ("mode", "head dim", "causal")]
    for mode, g in cov.groupby("mode", sort=False):
        missing = [f"{r['head dim']}{' causal' if r['causal'] == 'yes' else ''} {s}" for _, r in g.iterrows()
                   for s in seqs if r[s] == "-"]
        not_ours = [f"{r['head dim']}{' causal' if r['causal'] == 'yes' else ''} {s}" for _, r in g.iterrows()
                    for s in seqs if r[s].startswith("- ")]
        sep = sum(" sep" in r[s] for _, r in g.iterrows() for s in seqs)
        ok = not missing and not not_ours and not sep
        cells = sum(r[s] != "" for _, r in g.iterrows() for s in seqs)  # '' = outside the grid, no rows
        line = f"coverage {mode}: {cells - len(missing)} of {cells} cells timed (the paper grid and any other with rows)"
        if sep:
            line += f", {sep} only separately timed"
        if missing:
            line += f"; no rows: {', '.join(missing[:8])}" + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else "")
        if not_ours:
            line += f"; without ours: {', '.join(not_ours[:8])}"
        out.append((ok, line))
    out.append(_tuned_line())
    ct = load_experiments("compile_time", root=root, scratch=False)
    if ct.empty or "kind" not in ct:
        out.append((False, "compile_time: no rows yet (experiment=compile_time)"))
    else:
        d = ct[(ct["kind"] == "compile_time") & (ct["status"] == "ok") & (ct["metric"] == "first_call_s")
               & ct["backend"].isin(["fa4", "fa4_official"])]
        if "gpu_name" in d:
            d = d[d["gpu_name"].notna()]
        d = d.assign(hdim_v=d["hdim_v"].fillna(d["hdim"]) if "hdim_v" in d else d["hdim"])
        n = d.groupby(["mode", "hdim", "hdim_v", "causal", "backend"]).size().unstack("backend")
        for b in ("fa4", "fa4_official"):
            if b not in n:
                n[b] = 0
        n = n.fillna(0)
        few = [f"{m} {_hd(h, hv)}{' causal' if c else ''} ({int(r['fa4'])}/{int(r['fa4_official'])})"
               for (m, h, hv, c), r in n.iterrows() if min(r["fa4"], r["fa4_official"]) < MIN_COMPILE_SAMPLES]
        line = f"compile_time: {len(n)} cells"
        if few:
            line += f"; < {MIN_COMPILE_SAMPLES} samples of ours/official: {', '.join(few)}"
        out.append((bool(len(n)) and not few, line))
    return out


def main(args=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.audit", description=__doc__.splitlines()[0])
    p.add_argument("--results", default=None, help="results folder (default: $FA4LAB_RESULTS or results/)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check finds a gap")
    ns = p.parse_args(args)
    lines = audit(Path(ns.results) if ns.results else None)
    for ok, line in lines:
        print(("ok   " if ok else "GAP  ") + line)
    gaps = sum(not ok for ok, _ in lines)
    print(f"{gaps} gap(s)")
    return 1 if (ns.strict and gaps) else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
