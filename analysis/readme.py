"""The README's generated results block: ours against the official FA4 and the other peers per cell, our backward
variants, compile time (paper Table 4), and which cells of the paper grid have rows (coverage), made from the committed
rows by ``python run.py figures`` and written between the README's markers, so no number in it is typed by hand
(tests/test_readme_results.py checks that the README matches the rows).

Each cell's number comes from the best rows it has: the round-robin ratio rows of its latest compare job (median over
rounds of the per-round ratio), else the ratio of separately timed medians, marked '†'; '°' marks fewer than 10 rounds,
'‡' a row without its throttled share or git SHA (analysis/select.py ``cell_flags``)."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from analysis.select import (ATTN_EXPERIMENTS, REPO, attn_times, cell_flags, flag_legend, load_experiments,
                             ratio_rows, round_robin_rows)
from analysis.tables import coverage, coverage_summary, markdown_table, table4
from analysis.targets import entry_ratio_rows, evaluate, load_extra_sets, other_card_targets, same_kernel_rows

BEGIN, END = "<!-- results:begin (python run.py figures writes this block) -->", "<!-- results:end -->"
README_EXPERIMENTS = (*ATTN_EXPERIMENTS, "compile_time")


def _seq(s) -> str:
    return f"{int(s) // 1024}k" if s >= 1024 else str(int(s))


def _hd(h, hv) -> str:
    return f"{int(h)}" if int(h) == int(hv) else f"{int(h)}/{int(hv)}"


def _pivot(cells: dict) -> pd.DataFrame:
    """{(hdim, hdim_v, causal): {seqlen: text}} -> one row per (head dim, causal), one column per seqlen."""
    rows = [{"hdim": _hd(h, hv), "causal": "yes" if c else "no", **{_seq(s): v for s, v in sorted(got.items())}}
            for (h, hv, c), got in sorted(cells.items())]
    tab = pd.DataFrame(rows)
    if tab.empty:
        return tab
    seqs = sorted([c for c in tab.columns if c not in ("hdim", "causal")], key=lambda x: int(x.rstrip("k")))
    return tab[["hdim", "causal", *seqs]].fillna("")


def _key(h, hv, c):
    return int(h), int(hv), bool(c)


def ours_vs_official(df: pd.DataFrame, mode: str, peer: str = "fa4_official") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (head dim, causal) x seqlen: speed of ours / speed of ``peer``, and the rows behind the numbers.
    Round-robin cells: the median over rounds of t_peer / t_ours (time_ratio rows against our default, latest job);
    other cells: the ratio of separately timed medians, marked '†'; marks of ``cell_flags``."""
    cells: dict[tuple, dict] = {}
    used = []
    rr = entry_ratio_rows(df, mode, peer)
    if not rr.empty:
        for (h, hv, c, s), g in rr.groupby(["hdim", "hdim_v", "causal", "seqlen_q"]):
            cells.setdefault(_key(h, hv, c), {})[int(s)] = f"{g['value'].median():.2f}{cell_flags(g)}"
            used.append(g)
    t = attn_times(df)
    if not t.empty:
        t = t[(t["mode"] == mode) & ~round_robin_rows(t) & t["variant"].isin(["default", "peer"])
              & t["backend"].isin(["fa4", peer])]
        for (h, hv, c, s), g in t.groupby(["hdim", "hdim_v", "causal", "seqlen_q"]):
            med = g.groupby("backend")["value"].median()
            if {"fa4", peer} <= set(med.index) and int(s) not in cells.get(_key(h, hv, c), {}):
                cells.setdefault(_key(h, hv, c), {})[int(s)] = f"{med[peer] / med['fa4']:.2f}{cell_flags(g)}"
                used.append(g)
    return _pivot(cells), (pd.concat(used) if used else pd.DataFrame())


def round_robin_table(df: pd.DataFrame, mode: str, backend: str, variant: str | None = None,
                      invert: bool = False) -> pd.DataFrame:
    """Per (head dim, causal) x seqlen, from round-robin time_ratio rows (baseline: our default; latest job): the
    median over rounds of t_entry / t_ours (a peer: speed of ours / speed of the peer), or its inverse (``invert``:
    speed of one of our variants / speed of our default); marks of ``cell_flags``."""
    return _round_robin(df, mode, backend, variant, invert)[0]


def _round_robin(df, mode, backend, variant=None, invert=False) -> tuple[pd.DataFrame, pd.DataFrame]:
    rr = entry_ratio_rows(df, mode, backend, variant)
    if rr.empty:
        return pd.DataFrame(), rr
    cells: dict[tuple, dict] = {}
    for (h, hv, c, s), g in rr.groupby(["hdim", "hdim_v", "causal", "seqlen_q"]):
        v = g["value"].median()
        cells.setdefault(_key(h, hv, c), {})[int(s)] = f"{(1 / v if invert else v):.2f}{cell_flags(g)}"
    return _pivot(cells), rr


def same_kernel_table(df: pd.DataFrame, mode: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rounds' own noise per cell: for an entry of ours that compiled our default's kernel (e.g. one_cta where
    two_cta is off), timed round-robin against the default in the same job, the p20-p80 range of the per-round
    speed ratio (entry / default; an A/A pair, so 1.00 by construction up to noise). Returns the table and its rows."""
    rr = same_kernel_rows(df, mode)
    if rr.empty:
        return pd.DataFrame(), rr
    cells: dict[tuple, dict] = {}
    for (h, hv, c, s), g in rr.groupby(["hdim", "hdim_v", "causal", "seqlen_q"]):
        lo, hi = 1 / pd.to_numeric(g["p80"]).max(), 1 / pd.to_numeric(g["p20"]).min()  # t ratios -> speed
        cells.setdefault(_key(h, hv, c), {})[int(s)] = f"{lo:.2f}-{hi:.2f}{cell_flags(g)}"
    return _pivot(cells), rr


def switch_table(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (mode, head dim, causal, switch) x seqlen: the speedup the switch gives (> 1: faster with it), the median
    over rounds of the per-round ratio of the variant without it (or, for two_cta / deterministic, with it) against
    our full config, timed round-robin in one job (ablation experiments); variants that compile the full config's
    kernel are left out, and their spread over rounds (p20/p80 of t_same / t_full, as a speedup) is the row's
    ``noise`` column: a speedup inside it is no measured effect. Returns the table and the rows behind it."""
    from analysis.ablation_figs import SWITCH_OFF, kernel_ids, noise_band

    rr = ratio_rows(df)
    if rr.empty:
        return pd.DataFrame(), rr
    rr = rr[(rr["backend"] == "fa4") & (rr["baseline"] == "fa4[full]") & rr["variant"].isin(list(SWITCH_OFF))]
    if rr.empty:
        return pd.DataFrame(), rr
    rr = rr[pd.Series(kernel_ids(rr), index=rr.index) != rr.get("baseline_compiled_hash")]
    band = noise_band(df)
    out: dict[tuple, dict] = {}
    for (m, h, hv, c, v, s), g in rr.groupby(["mode", "hdim", "hdim_v", "causal", "variant", "seqlen_q"]):
        label = SWITCH_OFF[v]
        med = g["value"].median()  # t_variant / t_full
        sp = 1 / med if label.endswith("(on)") else med
        out.setdefault((m != "fwd", int(h), int(hv), bool(c), label, m), {})[int(s)] = f"{sp:.2f}{cell_flags(g)}"
    rows = []
    for (_, h, hv, c, label, m), cells in sorted(out.items()):
        b = band[(band["mode"] == m) & (band["hdim"] == h) & (band["causal"] == c)] if not band.empty else band
        rows.append({"mode": m, "hdim": _hd(h, hv), "causal": "yes" if c else "no", "switch": label,
                     **{_seq(x): t for x, t in sorted(cells.items())},
                     "noise": _noise(b, label.endswith("(on)"))})
    tab = pd.DataFrame(rows)
    seqs = sorted([x for x in tab.columns if x not in ("mode", "hdim", "causal", "switch", "noise")],
                  key=lambda x: int(x.rstrip("k")))
    return tab[["mode", "hdim", "causal", "switch", *seqs, "noise"]].fillna(""), rr


def _noise(band: pd.DataFrame, on: bool) -> str:
    """The noise band (r = t_full / t_same, p20/p80) as the switch's speedup: r for a variant that turns a switch on,
    1 / r for one that turns it off."""
    if band is None or band.empty:
        return "not measured"
    lo, hi = float(band["lo"].min()), float(band["hi"].max())
    return f"{lo:.2f}-{hi:.2f}" if on else f"{1 / hi:.2f}-{1 / lo:.2f}"


def provenance_line(rows: pd.DataFrame) -> str:
    """'rounds per cell 10; throttled: median 28% of GPU samples (0-100%); git 1a2b3c4 (2026-11-30)' for the rows
    behind a table; what is missing is said so."""
    if rows is None or rows.empty:
        return ""
    parts = []
    n = pd.to_numeric(rows["n"], errors="coerce").dropna() if "n" in rows else pd.Series(dtype=float)
    if len(n):
        parts.append(f"rounds per cell {int(n.min())}" + (f"-{int(n.max())}" if n.max() != n.min() else ""))
    sh = pd.to_numeric(rows["throttled_share"], errors="coerce") if "throttled_share" in rows else None
    if sh is not None and sh.notna().any():
        parts.append(f"throttled: median {sh.median():.0%} of GPU samples ({sh.min():.0%}-{sh.max():.0%})"
                     + (f", {int(sh.isna().sum())} rows without it" if sh.isna().any() else ""))
    else:
        parts.append("throttling not recorded")
    sha = rows["git_sha"].dropna().astype(str) if "git_sha" in rows else pd.Series(dtype=str)
    shas = sorted({x[:7] for x in sha})
    if shas:
        parts.append("git " + ", ".join(shas[:3]) + (f" (+{len(shas) - 3})" if len(shas) > 3 else "")
                     + (f", {len(rows) - len(sha)} rows without one" if len(sha) < len(rows) else ""))
    else:
        parts.append("no git SHA")
    if "time" in rows and rows["time"].notna().any():
        days = sorted({str(t)[:10] for t in rows["time"].dropna()})
        parts.append(days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}")
    return "; ".join(parts)


PEERS = (("fa4_official", "official FA4"), ("sdpa_cudnn", "cuDNN"), ("flex", "FlexAttention"))
BWD_VARIANTS = (("deterministic", "Backward, our deterministic / our default (round-robin, speed ratio):"),
                ("two_cta", "Backward, our two_cta / our default (round-robin, speed ratio; head dims where two_cta "
                            "is not the default):"),
                ("one_cta", "Backward, our one-CTA kernel / our default (round-robin, speed ratio; head dims where "
                            "two_cta is the default):"))


def _section(parts: list, caption: str, tab: pd.DataFrame, rows: pd.DataFrame, marks: list) -> None:
    if tab.empty:
        return
    text = markdown_table(tab)
    marks.append(text)
    parts += [caption, "", text, ""]
    line = provenance_line(rows)
    if line:
        parts += [f"({line})", ""]


def results_block(df: pd.DataFrame, small: pd.DataFrame | None = None, other: list | None = None) -> str:
    """The Markdown between the README's markers, from the rows of the peer experiments and compile_time (``small``:
    the rows of the small-problem sets and fwd_gemm's matmul, targets.load_extra_sets; read by the issue-targets
    table only; ``other``: targets.other_card_targets, one more targets table per card)."""
    parts, marks = [BEGIN, ""], []
    for mode, name in (("fwd", "Forward"), ("bwd", "Backward")):
        t, rows = ours_vs_official(df, mode)
        if t.empty:
            parts += [f"{name}, ours / official FA4: (no rows yet)", ""]
        _section(parts, f"{name}, ours / official FA4 (speed ratio; > 1: ours faster):", t, rows, marks)
        for peer, pname in PEERS[1:]:
            t, rows = _round_robin(df, mode, peer)
            _section(parts, f"{name}, ours / {pname} (round-robin, speed ratio; > 1: ours faster):", t, rows, marks)
    for variant, caption in BWD_VARIANTS:
        t, rows = _round_robin(df, "bwd", "fa4", variant, invert=True)
        _section(parts, caption, t, rows, marks)
    t, rows = same_kernel_table(df, "bwd")
    _section(parts, "Backward, the rounds' noise: an entry compiling our default's kernel / our default, p20-p80 of "
                    "the per-round speed ratio (an A/A pair in the same rounds as the tables above; a ratio inside "
                    "its cell's range is no measured difference):", t, rows, marks)
    t, rows = switch_table(df)
    _section(parts, "Ablations, speedup of each switch (round-robin against our full config in one job, median over "
                    "rounds; > 1: faster with the switch; noise: the same spread of kernels identical to the full "
                    "config, timed in the same rounds):", t, rows, marks)
    sets = [x for x in (df, small) if x is not None and not x.empty]
    tt = evaluate(pd.concat(sets)) if sets else pd.DataFrame()
    if not tt.empty:
        parts += ["Issue targets, cell by cell (analysis/targets.py, `python -m analysis.targets`: the open issues' speed "
                  "targets against the round-robin cells above, seqlen 4k-32k unless named; strict, no rounding up; "
                  "'below' gives each cell under the threshold with the A/A band of the noise table where the cell "
                  "has one, and 'missed, in the noise' means every such cell lies inside its band; 'stale cells' are "
                  "those timed on a kernel config today's defaults no longer compile, a reading of an older kernel: "
                  "re-time them with `python run.py sweep experiment=<name> rerun=stale`):", "", markdown_table(tt), ""]
    for entry, tab in other or []:
        if not tab.empty:
            parts += [f"Issue targets on another card, {entry['card']} ({entry['when']}; its rows alone, listed in "
                      f"`results/other_cards.json`: {', '.join(f'`{p}`' for p in entry['rows'])}), the targets with "
                      "timed cells:", "", markdown_table(tab), ""]
    t4, _ = table4(df, None) if df is not None and not df.empty else (None, "")
    if t4 is not None and not t4.empty:
        text = markdown_table(t4, floatfmt="{:.3g}")
        parts += ["Compile time (paper Table 4; median over fresh processes, caches off; experiment compile_time):",
                  "", text, ""]
        c = df[df["kind"] == "compile_time"]
        gpu = ", ".join(sorted(set(map(str, c["gpu_name"].dropna())))) if "gpu_name" in c else ""
        line = provenance_line(c.drop(columns=["n", "throttled_share"], errors="ignore"))
        parts += [f"({gpu}; {line.replace('throttling not recorded; ', '')})" if gpu else f"({line})", ""]
    else:
        parts += ["Compile time (paper Table 4): no rows yet (experiment compile_time).", ""]
    legend = flag_legend("\n".join(marks))
    if legend:
        parts += [f"Marks: {legend}.", ""]
    cov = coverage(df)
    parts += ["Coverage of the paper grid (timed cells; 'fa4 +k rr' = ours and k peers timed round-robin in one job, "
              "'sep' = separate jobs, '-' = no rows; marks as above): " + coverage_summary(cov) + ".", "",
              markdown_table(cov), "", END]
    return "\n".join(parts)


def current_block(root: Path | None = None) -> str:
    """The block for the committed sets under ``root`` (default: $FA4LAB_RESULTS or results/), committed sets only."""
    return results_block(load_experiments(*README_EXPERIMENTS, root=root, scratch=False),
                         load_extra_sets(root), other_card_targets(root))


def update_readme(block: str, path: Path | None = None) -> bool:
    """Replace the README's block between the markers with ``block``; False when the markers are missing."""
    path = Path(path or REPO / "README.md")
    text = path.read_text(encoding="utf-8")
    pat = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pat.search(text):
        return False
    path.write_text(pat.sub(lambda _: block, text), encoding="utf-8")
    return True
