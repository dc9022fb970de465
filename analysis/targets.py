"""The open issues' speed targets checked cell by cell against the committed round-robin rows.

Each target is a speed ratio with a threshold over cells of the paper grid (``analysis.tables.paper_grid``): ours
against a peer timed in the same rounds (median over rounds of t_peer / t_ours), or one of our backward variants
against our default (1 / median of t_variant / t_default; hd256's two_cta target reads the one-CTA entry the other
way round, as two_cta is the default there; a target naming an ``experiment`` reads only that set, against its own
``baseline`` entry: bwd_ablation's is ``fa4[full]``). Only round-robin ratio rows count (the README tables' cells marked '†'
do not); a grid cell without them is "untimed", and a target with an untimed cell is not called met. A target's
cells are those of one total token count (batch x seqlen): the paper grid's 32k, or issue 9 / 11's small problems at
8k tokens (``conf/shape/small.yaml``), so rows of other shapes at the same sequence length never pool into a cell.

A cell whose rows were timed on a kernel config today's defaults no longer compile (kernels/staleness.py) is
counted in the "stale cells" column: its reading is of an older kernel.

``python -m analysis.targets`` prints the table (``--rows PATH ...``: of those rows alone, e.g. a set timed on another
card); ``python run.py figures`` writes it into the README's results block (analysis/readme.py), followed by one table
per card of ``results/other_cards.json`` (row files timed on another card, each card's read alone).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis.select import ratio_rows
from analysis.tables import paper_grid

ALL_HDIMS = ((64, 64), (128, 128), (192, 128), (256, 256))
SMALL_EXPERIMENTS = ("fwd_small", "bwd_small")  # the 8k-token small problems: sets of their own (conf/experiment/)
GEMM_EXPERIMENTS = ("fwd_gemm",)  # ours against a matmul timed in the same rounds (experiments/gemm_ref.py)
GEMM_ENTRY = "matmul_ref"
LONG = (4096, 32768)  # the issues' "paper grid, seqlen 4k-32k"


@dataclass(frozen=True)
class Target:
    """One issue target: ``entry`` (a peer backend, or our bwd variant when ``variant``) against our default in
    ``mode``, at least ``threshold`` in every grid cell of ``hdims`` x ``seqlens`` (inclusive range) x both causal."""
    issue: int
    what: str
    mode: str
    entry: str
    threshold: float
    hdims: tuple = ALL_HDIMS
    seqlens: tuple = LONG
    variant: bool = False
    default_is_entry: bool = False  # the variant is the default's opposite (one_cta where two_cta is the default)
    tokens: int | None = None  # total tokens (batch x seqlen) of the cells; None: the paper grid's
    causal: tuple | None = None  # the causal values of the cells; None: the grid's
    experiment: str | None = None  # only this experiment's rows (None: every set whose rows have ``baseline``)
    baseline: str = "fa4"  # the rows' baseline entry: our default ("fa4"), or bwd_ablation's "fa4[full]"


TARGETS = (
    Target(11, "fwd ours / official FA4 >= 1.05 at hd64", "fwd", "fa4_official", 1.05, ((64, 64),)),
    Target(11, "fwd ours / official FA4 >= 1.03 at hd128", "fwd", "fa4_official", 1.03, ((128, 128),)),
    Target(11, "fwd ours / official FA4 >= 1.03 at hd256", "fwd", "fa4_official", 1.03, ((256, 256),)),
    Target(11, "fwd ours / official FA4 >= 1.0 at (192, 128)", "fwd", "fa4_official", 1.0, ((192, 128),)),
    Target(11, "fwd ours / cuDNN >= 1.1 from 4k", "fwd", "sdpa_cudnn", 1.1),
    Target(11, "fwd ours / cuDNN >= 0.9 at 1k-2k", "fwd", "sdpa_cudnn", 0.9, seqlens=(1024, 2048)),
    # matmul_ref's ratio is normalised to equal FLOPs: ours TFLOP/s over a square bf16 matmul's in the same rounds
    Target(11, "fwd hd128 non-causal 16k >= 0.9 of the bf16 matmul (same rounds)", "fwd", GEMM_ENTRY, 0.9,
           ((128, 128),), (16384, 16384), causal=(False,)),
    Target(9, "bwd ours / official FA4 >= 1.0 at hd 64, 128, (192, 128)", "bwd", "fa4_official", 1.0,
           ALL_HDIMS[:3]),
    Target(9, "bwd ours / official FA4 >= 1.3 at hd256", "bwd", "fa4_official", 1.3, ((256, 256),)),
    Target(9, "bwd ours / cuDNN >= 1.1", "bwd", "sdpa_cudnn", 1.1),
    Target(9, "bwd deterministic / default >= 0.92", "bwd", "deterministic", 0.92, variant=True),
    # the same ratio where only our variants share the rounds (bwd_ablation, hd128 only): H200 2026-12-04, one session,
    # the 32k causal cell with the peers in the rounds read det / default 0.912-0.920, with ours alone 0.939-0.944
    # (results/h200/session_ab/bwd128c32k_det_context.jsonl.xz); README "Deterministic backward at 32k"
    Target(9, "bwd deterministic / default >= 0.92, our variants alone in the rounds (bwd_ablation)", "bwd",
           "deterministic", 0.92, ((128, 128),), variant=True, experiment="bwd_ablation", baseline="fa4[full]"),
    Target(9, "bwd two_cta / one CTA >= 1.05 at hd128, s >= 8k", "bwd", "two_cta", 1.05, ((128, 128),),
           (8192, 32768), variant=True),
    Target(9, "bwd two_cta / one CTA >= 1.3 at hd256", "bwd", "one_cta", 1.3, ((256, 256),), variant=True,
           default_is_entry=True),
    # the small problems at 8k total tokens (conf/shape/small.yaml: hd 64 / 128)
    Target(11, "fwd ours / cuDNN >= 0.9 at 1k-2k, 8k tokens", "fwd", "sdpa_cudnn", 0.9, ALL_HDIMS[:2],
           (1024, 2048), tokens=8192),
    Target(9, "bwd ours / official FA4 >= 1.0 at 1k-2k, 8k tokens", "bwd", "fa4_official", 1.0, ALL_HDIMS[:2],
           (1024, 2048), tokens=8192),
)


def _seq(s: int) -> str:
    return f"{s // 1024}k" if s >= 1024 else str(s)


def _cell(h: int, hv: int, c: bool, s: int) -> str:
    return f"{h if h == hv else f'{h}/{hv}'} {'c' if c else 'nc'} {_seq(s)}"


def _of_tokens(rr: pd.DataFrame, tokens: int | None) -> pd.DataFrame:
    """``rr``'s rows of shapes with ``tokens`` total tokens (batch x seqlen_q); all of them for None."""
    if tokens is None or "batch" not in rr:
        return rr
    return rr[pd.to_numeric(rr["batch"]) * pd.to_numeric(rr["seqlen_q"]) == int(tokens)]


def entry_ratio_rows(df: pd.DataFrame, mode: str, backend: str, variant: str | None = None,
                     tokens: int | None = None, baseline: str = "fa4", experiment: str | None = None) -> pd.DataFrame:
    """The round-robin ratio rows (t_entry / t_our_default per round; latest job per entry) of a peer ``backend``,
    or of our ``variant`` (backend "fa4") without the cells where it compiled the default's kernel (they say
    nothing about the variant); ``tokens``: only shapes of that many total tokens (batch x seqlen_q); ``baseline``:
    the rows' baseline entry; ``experiment``: that experiment's rows only. The README's tables read the same rows
    (every shape of the peers sets; the small problems are sets of their own)."""
    rr = ratio_rows(df)
    if rr.empty:
        return rr
    if experiment is not None:
        rr = rr[rr["experiment"] == experiment] if "experiment" in rr else rr.iloc[0:0]
    rr = _of_tokens(rr[(rr["backend"] == backend) & (rr["baseline"] == baseline) & (rr["mode"] == mode)], tokens)
    if variant is not None:
        from analysis.ablation_figs import kernel_ids

        rr = rr[rr["variant"] == variant]
        rr = rr[pd.Series(kernel_ids(rr), index=rr.index) != rr.get("baseline_compiled_hash")]
    return rr


def same_kernel_rows(df: pd.DataFrame, mode: str, baseline: str = "fa4", experiment: str | None = None) -> pd.DataFrame:
    """The ratio rows of an entry of ours that compiled our default's kernel, timed round-robin against the default
    (``baseline``) in the same job (an A/A pair: its per-round p20-p80 is the rounds' own noise)."""
    from analysis.ablation_figs import kernel_ids

    rr = ratio_rows(df)
    if rr.empty or not {"p20", "p80"} <= set(rr.columns):
        return pd.DataFrame()
    if experiment is not None:
        rr = rr[rr["experiment"] == experiment] if "experiment" in rr else rr.iloc[0:0]
    rr = rr[(rr["backend"] == "fa4") & (rr["baseline"] == baseline) & (rr["mode"] == mode)
            & rr["variant"].notna() & (rr["variant"] != "default")]
    return rr[pd.Series(kernel_ids(rr), index=rr.index) == rr.get("baseline_compiled_hash")]


def noise_bands(df: pd.DataFrame, mode: str, tokens: int | None = None, baseline: str = "fa4",
                experiment: str | None = None) -> dict[tuple, tuple[float, float]]:
    """{(hdim, hdim_v, causal, seqlen): (low, high)}: the A/A pair's p20-p80 speed ratio per cell (same_kernel_rows)."""
    rr = _of_tokens(same_kernel_rows(df, mode, baseline, experiment), tokens)
    if rr.empty:
        return {}
    return {(int(h), int(hv), bool(c), int(s)): (1 / pd.to_numeric(g["p80"]).max(), 1 / pd.to_numeric(g["p20"]).min())
            for (h, hv, c, s), g in rr.groupby(["hdim", "hdim_v", "causal", "seqlen_q"])}


def _cell_groups(df: pd.DataFrame, t: Target, grid: dict | None = None) -> dict[tuple, pd.DataFrame]:
    """{(hdim, hdim_v, causal, seqlen): the target's round-robin ratio rows in that cell}."""
    tokens = t.tokens or (grid or paper_grid())["total_tokens"]
    rr = entry_ratio_rows(df, t.mode, "fa4" if t.variant else t.entry, t.entry if t.variant else None, tokens,
                          t.baseline, t.experiment)
    if rr is None or rr.empty:
        return {}
    return {(int(h), int(hv), bool(c), int(s)): g for (h, hv, c, s), g in rr.groupby(["hdim", "hdim_v", "causal",
                                                                                       "seqlen_q"])}


def cell_values(df: pd.DataFrame, t: Target, grid: dict | None = None) -> dict[tuple, float]:
    """{(hdim, hdim_v, causal, seqlen): the target's ratio} for every cell with round-robin rows."""
    out = {}
    for k, g in _cell_groups(df, t, grid).items():
        med = float(pd.to_numeric(g["value"]).median())  # t_entry / t_ours_default
        out[k] = 1.0 / med if t.variant and not t.default_is_entry else med
    return out


def stale_jobs(df: pd.DataFrame) -> set[tuple]:
    """(job_key, run_id) of the jobs with a timed row of ours on a kernel config today's defaults no longer compile
    (kernels/staleness.py is_stale: a default changed after the job ran; analysis.audit counts the same rows)."""
    need = {"kind", "metric", "status", "job_key", "run_id"}
    if df is None or df.empty or not need <= set(df.columns):
        return set()
    from kernels.staleness import is_stale

    d = df[df["kind"].isin(["attn", "compare"]) & (df["metric"] == "time_ms") & (df["status"] == "ok")]
    return {(r["job_key"], r["run_id"]) for r in d.to_dict("records") if is_stale(r)}


def stale_cells(df: pd.DataFrame, t: Target, grid: dict | None = None, jobs: set | None = None) -> set[tuple]:
    """The target's cells whose ratio rows come from a stale job (stale_jobs): readings of a kernel that today's
    defaults no longer run, to be re-timed (``python run.py sweep experiment=<name> rerun=stale``)."""
    jobs = stale_jobs(df) if jobs is None else jobs
    out = set()
    for k, g in _cell_groups(df, t, grid).items():
        if "job_stale" in g and g["job_stale"].fillna(False).astype(bool).any():  # matmul_rows_only's mark
            out.add(k)
        elif jobs and {"job_key", "run_id"} <= set(g.columns) and any(j in jobs for j in zip(g["job_key"],
                                                                                                g["run_id"])):
            out.add(k)
    return out


def grid_cells(t: Target, grid: dict | None = None) -> list[tuple]:
    """The cells a target covers: the paper grid's lengths in its range, or for a target of another token count
    every power-of-two length in its range."""
    grid = grid or paper_grid()
    lo, hi = t.seqlens
    seqs = [int(s) for s in grid["seqlens"]]
    if t.tokens is not None:  # off the paper grid: every power-of-two length in the target's range
        seqs = [s for s in (1 << i for i in range(8, 16)) if s <= t.tokens]
    causal = grid["causal"] if t.causal is None else t.causal
    return [(h, hv, bool(c), s) for h, hv in t.hdims for c in causal for s in seqs if lo <= s <= hi]


def _below(v: float, threshold: float) -> str:
    """A value under its threshold, with a fourth digit where three would round it up to the threshold (1.0298 is
    not "1.030" under a 1.03 target)."""
    return f"{v:.3f}" if float(f"{v:.3f}") < threshold else f"{v:.4f}"


def evaluate(df: pd.DataFrame, targets=TARGETS, grid: dict | None = None) -> pd.DataFrame:
    """One row per target: cells met of those timed, the untimed grid cells, the worst cell, the cells below the
    threshold (with the A/A pair's p20-p80 band where the cell has one), the status: met / missed / "missed, in
    the noise" (every cell below lies inside its A/A band) / untimed cells, and the stale cells (stale_cells: timed
    on a kernel config today's defaults no longer compile; their reading says nothing about today's kernels)."""
    grid = grid or paper_grid()
    jobs = stale_jobs(df)
    rows = []
    for t in targets:
        vals = cell_values(df, t, grid)
        stale = stale_cells(df, t, grid, jobs)
        bands = noise_bands(df, t.mode, t.tokens or grid["total_tokens"], t.baseline, t.experiment)
        cells = grid_cells(t, grid)
        timed = {k: vals[k] for k in cells if k in vals}
        below = sorted((v, k) for k, v in timed.items() if v < t.threshold)  # strict: no rounding up
        worst = min(timed.items(), key=lambda kv: kv[1]) if timed else None
        noisy = below and all(k in bands and bands[k][0] <= v for v, k in below)
        status = ("missed, in the noise" if noisy else "missed") if below else (
            "untimed cells" if len(timed) < len(cells) else "met")
        rows.append({"issue": t.issue, "target": t.what,
                     "cells met": f"{len(timed) - len(below)} of {len(timed)}"
                                  + (f" ({len(cells) - len(timed)} untimed)" if len(timed) < len(cells) else ""),
                     "worst": f"{worst[1]:.3f} ({_cell(*worst[0])})" if worst else "",
                     "below": ", ".join(f"{_cell(*k)} {_below(v, t.threshold)}"
                                        + (f" [A/A {bands[k][0]:.3f}-{bands[k][1]:.3f}]" if k in bands else "")
                                        for v, k in below[:6])
                              + (f" +{len(below) - 6}" if len(below) > 6 else ""),
                     "status": status,
                     "stale cells": f"{len(stale & set(timed))} of {len(timed)}" if stale & set(timed) else ""})
    return pd.DataFrame(rows)


def load_extra_sets(root=None) -> pd.DataFrame:
    """The committed small-problem sets and, of the matmul sets, the matmul's rows alone: their peers' cells are the
    paper grid's, which fwd_peers times (one set per cell, not two jobs' medians averaged)."""
    from analysis.select import load_experiments

    return matmul_rows_only(load_experiments(*SMALL_EXPERIMENTS, *GEMM_EXPERIMENTS, root=root, scratch=False))


def matmul_rows_only(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the GEMM_EXPERIMENTS' rows of other backends than the matmul (load_extra_sets); the rows kept
    of a job whose dropped rows of ours were stale (stale_jobs) say so in ``job_stale``."""
    if df.empty or "experiment" not in df:
        return df
    gemm = df["experiment"].isin(GEMM_EXPERIMENTS)
    out = df[~gemm | (df["backend"] == GEMM_ENTRY)]
    jobs = stale_jobs(df[gemm])
    if jobs and {"job_key", "run_id"} <= set(out.columns):
        out = out.assign(job_stale=[j in jobs for j in zip(out["job_key"], out["run_id"])])
    return out


OTHER_CARDS = "other_cards.json"  # under the results root: {"cards": [{"card", "when", "rows": [paths]}]}


def one_card_rows(paths) -> pd.DataFrame:
    """The rows of ``paths`` (files or folders), with the small / matmul sets' rule of ``matmul_rows_only``; a
    ValueError when they hold no rows or rows of more than one GPU (DESIGN.md convention 6: cells never pool cards)."""
    from analysis.load import load_results

    df = load_results(*map(str, paths))
    if df.empty:
        raise ValueError(f"no rows in {' '.join(map(str, paths))}")
    gpus = sorted(df["gpu_name"].dropna().unique()) if "gpu_name" in df else []
    if len(gpus) > 1:
        raise ValueError(f"rows of {len(gpus)} GPUs ({', '.join(gpus)}): pass one card's rows")
    return matmul_rows_only(df)


def stream_as_call_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The back-to-back rows (``bench.stream_calls`` > 0: metrics stream_time_ms / stream_time_ratio) under the
    per-call metric names, the per-call rows dropped: the targets read off the back-to-back regime."""
    if "metric" not in df:
        return df.iloc[0:0]
    d = df[df["metric"].isin(["stream_time_ms", "stream_time_ratio"])].copy()
    d["metric"] = d["metric"].str.removeprefix("stream_")
    return d


def other_card_targets(root=None) -> list[tuple[dict, pd.DataFrame]]:
    """(entry, targets table) per card of ``<root>/other_cards.json`` (root: analysis.select.results_root()), each
    over that card's files alone, keeping the targets with a timed cell. A card whose rows name another GPU than
    its entry's ``card`` is a ValueError."""
    import json
    from pathlib import Path

    from analysis.select import results_root

    root = Path(root) if root is not None else results_root()
    path = root / OTHER_CARDS
    if not path.exists():
        return []
    out = []
    for entry in json.loads(path.read_text())["cards"]:
        df = one_card_rows([root / p for p in entry["rows"]])
        gpus = set(df["gpu_name"].dropna()) if "gpu_name" in df else set()
        if gpus != {entry["card"]}:
            raise ValueError(f"{path}: the rows of '{entry['card']}' name {sorted(gpus) or 'no GPU'}")
        tab = evaluate(df)
        timed = ~tab["cells met"].str.startswith("0 of 0")
        out.append((entry, tab[timed].reset_index(drop=True)))
    return out


def main(argv=None) -> int:
    """``python -m analysis.targets`` over the committed sets; ``--rows FILE_OR_DIR ...`` over those rows alone (e.g.
    a grid timed on another card: results/h200/session_ab/fwd_peers_grid_h100_s68.jsonl.xz)."""
    import argparse

    from analysis.select import ATTN_EXPERIMENTS, load_experiments
    from analysis.tables import markdown_table

    ap = argparse.ArgumentParser(prog="python -m analysis.targets", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", metavar="PATH",
                    help="rows.jsonl(.xz) files or folders of them to read instead of the committed sets")
    ap.add_argument("--stream", action="store_true",
                    help="with --rows: read the back-to-back rows (bench=stream: stream_time_ms / _ratio) instead")
    args = ap.parse_args(argv)
    if args.stream and not args.rows:
        ap.error("--stream reads --rows (the committed sets hold no back-to-back rows)")
    if args.rows:
        try:
            df = one_card_rows(args.rows)
        except (FileNotFoundError, ValueError) as e:
            ap.error(str(e))
        if args.stream:
            df = stream_as_call_rows(df)
        gpus = sorted(df["gpu_name"].dropna().unique()) if "gpu_name" in df else []
        print(f"rows: {len(df)} from {' '.join(args.rows)}" + (f" ({gpus[0]})" if gpus else ""))
        tab = evaluate(df)
    else:
        tab = evaluate(pd.concat([load_experiments(*ATTN_EXPERIMENTS, scratch=False), load_extra_sets()],
                                 ignore_index=True))
    print(markdown_table(tab))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
