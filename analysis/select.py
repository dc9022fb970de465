"""Where result rows live and which of them a figure draws: committed sets by default, scratch runs on request.

Committed sets are ``results/<machine>/<experiment>/rows.jsonl`` (h200, cpu; with their archived rows in
``rows.jsonl.xz`` beside it); a plain sweep writes a scratch set
``results/<experiment>/rows.jsonl`` (git-ignored). Figures read only the committed sets unless scratch runs are
asked for (``python run.py figures --scratch``, which sets FA4LAB_SCRATCH=1 for the notebooks and says so on every
figure). ``attn_times`` selects timed GPU attention rows; ``provenance_note`` is the line each figure carries
(GPU, dates, rounds, throttled share, sources).
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


def results_root() -> Path:
    return Path(os.environ.get("FA4LAB_RESULTS", REPO / "results"))


def figures_dir() -> Path:
    return Path(os.environ.get("FA4LAB_FIGURES", results_root() / "figures"))


def with_scratch() -> bool:
    """Whether figures also read scratch runs (results/<experiment>/), set by ``run.py figures --scratch``."""
    return os.environ.get("FA4LAB_SCRATCH", "") not in ("", "0")


def experiment_files(name: str, root: Path | None = None, scratch: bool | None = None) -> list[Path]:
    """The committed sets' results/<machine>/<name>/rows.jsonl, plus the scratch results/<name>/rows.jsonl when
    ``scratch`` (default: ``with_scratch()``); a set whose rows are all archived (rows.jsonl.xz) is named by its
    rows.jsonl too, and analysis.load reads both files."""
    root = Path(root or results_root())
    scratch = with_scratch() if scratch is None else scratch
    if not root.exists():
        return []
    from analysis.load import set_exists, set_path

    found = {set_path(p) for p in [*root.glob(f"*/{name}/rows.jsonl"), *root.glob(f"*/{name}/rows.jsonl.xz"),
                                   *root.glob(f"*/{name}/rows.jsonl.gz")]}
    out = sorted(p for p in found if p.parent.parent.name != name)
    if scratch and set_exists(root / name / "rows.jsonl"):
        out.insert(0, root / name / "rows.jsonl")
    return out


def load_experiments(*names: str, root: Path | None = None, scratch: bool | None = None) -> pd.DataFrame:
    """Rows of the named experiments (every result file found for each); an empty DataFrame if none."""
    from analysis.load import load_results

    files = [f for n in names for f in experiment_files(n, root, scratch)]
    return load_results(*files) if files else pd.DataFrame()


def attn_times(df: pd.DataFrame) -> pd.DataFrame:
    """Timed attention rows measured on a GPU: kind attn, metric time_ms, status ok, tflops present."""
    need = {"kind", "metric", "status"}
    if df is None or df.empty or not need <= set(df.columns):
        return pd.DataFrame()
    d = df[df["kind"].isin(["attn", "compare"]) & (df["metric"] == "time_ms") & (df["status"] == "ok")].copy()
    if "gpu_name" in d:
        d = d[d["gpu_name"].notna()]
    if "tflops" not in d:
        return pd.DataFrame()
    d = d[pd.to_numeric(d["tflops"], errors="coerce").notna()]
    d["tflops"] = d["tflops"].astype(float)
    d["hdim_v"] = d["hdim_v"].fillna(d["hdim"]) if "hdim_v" in d else d["hdim"]
    if "variant" not in d:
        d["variant"] = None
    d = prefer_round_robin(latest_round_robin_job(d))
    if "series" not in d:  # rows already labelled (e.g. deterministic_series) keep their labels
        d["series"] = [series_label(b, v) for b, v in zip(d["backend"], d["variant"])]
    return d


CELL = ["mode", "hdim", "hdim_v", "causal", "seqlen_q", "seqlen_k", "batch", "heads", "backend", "variant"]
SHAPE = ["mode", "hdim", "hdim_v", "causal", "seqlen_q", "seqlen_k", "batch", "heads"]


def ratio_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The per-round ratio rows of round-robin jobs measured on a GPU (metric time_ratio, status ok), ``hdim_v``
    filled, each (experiment, shape, entry) from the latest compare job that timed that entry (``latest_round_robin_job``
    per entry: a ratio row holds ours and the entry timed in the same rounds, so a re-run that left a peer out keeps
    that peer's ratio from the job before)."""
    need = {"metric", "status", "backend", "baseline", "value"}
    if df is None or df.empty or not need <= set(df.columns):
        return pd.DataFrame()
    d = df[(df["metric"] == "time_ratio") & (df["status"] == "ok")
           & pd.to_numeric(df["value"], errors="coerce").notna()].copy()
    if "gpu_name" in d:
        d = d[d["gpu_name"].notna()]
    if d.empty:
        return d
    d["hdim_v"] = d["hdim_v"].fillna(d["hdim"]) if "hdim_v" in d else d["hdim"]
    if "variant" not in d:
        d["variant"] = None
    return latest_round_robin_job(d, per_entry=True)


def latest_round_robin_job(d: pd.DataFrame, per_entry: bool = False) -> pd.DataFrame:
    """Per (experiment, shape), keep the round-robin rows of its latest compare job only (a job: one ``job_key`` and
    ``run_id``; latest: the newest row ``time``), so a re-run replaces an older round-robin run of the same cells
    instead of being pooled with it (the kernel may have changed in between). ``per_entry``: per (experiment, shape,
    backend, variant, baseline) instead (ratio rows). Other rows are kept as they are."""
    if d is None or d.empty or "time" not in d:
        return d
    is_rr = round_robin_rows(d).to_numpy()
    if not is_rr.any():
        return d
    none = pd.Series([""] * len(d), index=d.index)

    def key(c: str) -> pd.Series:  # str of every value, NaN / None too (the str dtype keeps NaN through astype(str))
        return d[c].astype(object).map(str) if c in d else none

    job = key("job_key") + "/" + key("run_id")
    shape = key("experiment")
    for c in SHAPE + (["backend", "variant", "baseline", "baseline_variant"] if per_entry else []):
        shape = shape + "|" + key(c)
    t = pd.to_datetime(d["time"], errors="coerce", utc=True)
    rr = pd.DataFrame({"shape": shape, "job": job, "t": t})[is_rr]
    newest = rr.groupby(["shape", "job"])["t"].max().reset_index().sort_values("t", na_position="first")
    keep_job = newest.groupby("shape")["job"].last()  # the shape's latest job
    keep = ~is_rr | (job.to_numpy() == shape.map(keep_job).to_numpy())
    return d[keep]


def round_robin_rows(d: pd.DataFrame) -> pd.Series:
    """Rows timed round-robin in one job: a compare job's rows name who was timed with them (``rr_entries``;
    their kind is the attention job's, 'attn'); 'compare' as the kind and any time_ratio row count too."""
    mask = d["kind"] == "compare" if "kind" in d else pd.Series(False, index=d.index)
    if "metric" in d:  # a per-round ratio exists only for entries timed in the same rounds
        mask = mask | (d["metric"] == "time_ratio")
    if "rr_entries" in d:
        mask = mask | d["rr_entries"].notna()
    return mask


def prefer_round_robin(d: pd.DataFrame) -> pd.DataFrame:
    """Drop the separately timed rows of a shape that has a round-robin job in the same experiment (even of a
    backend that job did not time: a figure's bars for one shape come from one job, never from two), and those of a
    (shape, backend, variant) timed round-robin in any experiment."""
    if d.empty:
        return d
    is_rr = round_robin_rows(d).to_numpy()
    if not is_rr.any():
        return d
    cell = pd.MultiIndex.from_frame(d[CELL].astype(str))
    exp = d["experiment"].astype(str) if "experiment" in d else pd.Series("", index=d.index)
    shape = pd.MultiIndex.from_frame(pd.concat([exp.rename("experiment"), d[SHAPE].astype(str)], axis=1))
    rr_cells, rr_shapes = set(cell[is_rr]), set(shape[is_rr])
    return d[[r or (c not in rr_cells and s not in rr_shapes) for c, s, r in zip(cell, shape, is_rr)]]


MIN_ROUNDS = 10  # issue 10: a committed ratio is a within-job round-robin ratio over at least this many rounds
FLAG_NOTES = {"†": "separately timed jobs, no per-round ratio (read within ±6% as parity)",
              "°": f"fewer than {MIN_ROUNDS} rounds",
              "‡": "a row without its throttled share or git SHA"}


def cell_flags(rows: pd.DataFrame) -> str:
    """The marks a table cell made from ``rows`` carries (FLAG_NOTES): '†' not timed round-robin, '°' fewer than
    MIN_ROUNDS rounds, '‡' some row lacks ``throttled_share`` or ``git_sha``; '' for a cell a reviewer can take as is."""
    if rows is None or rows.empty:
        return ""
    out = ""
    if not round_robin_rows(rows).all():
        out += "†"
    elif "n" not in rows or pd.to_numeric(rows["n"], errors="coerce").fillna(0).min() < MIN_ROUNDS:
        out += "°"
    for c in ("throttled_share", "git_sha"):
        if c not in rows or rows[c].isna().any():
            return out + "‡"
    return out


def flag_legend(text: str) -> str:
    """'† ...; ‡ ...': the notes of the marks that occur in ``text`` (empty when none does)."""
    return "; ".join(f"{m} {n}" for m, n in FLAG_NOTES.items() if m in text)


def one_experiment_per_point(d: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per point (``keys``, e.g. shape and series), the rows of one experiment only: the peers experiments first
    (ATTN_EXPERIMENTS order), so a bar never pools two jobs (e.g. the official FA4 timed in fwd_peers and again as a
    peer of fwd_ablation at the same shape)."""
    if d is None or d.empty or "experiment" not in d:
        return d
    rank = d["experiment"].map({e: i for i, e in enumerate(ATTN_EXPERIMENTS)}).fillna(len(ATTN_EXPERIMENTS))
    best = rank.groupby([d[k].astype(str) for k in keys]).transform("min")
    return d[rank == best]


def series_label(backend: str, variant) -> str:
    base = BACKEND_LABELS.get(backend, str(backend))
    if backend == "fa4" and variant not in (None, "default", "full", "peer", "cli") and not (
            isinstance(variant, float) and pd.isna(variant)):
        return f"{base} [{variant}]"
    return base


def series_order(series) -> list[str]:
    labels = list(BACKEND_LABELS.values())

    def key(s):
        if s.startswith("ours"):
            return (0, s)
        return (1 + next((i for i, x in enumerate(labels) if s.startswith(x)), 99), s)

    return sorted(set(series), key=key)


def only_variant(df: pd.DataFrame, variants) -> pd.DataFrame:
    if df is None or df.empty or "variant" not in df:
        return df
    return df[df["variant"].isin(variants) | df["variant"].isna()]


def gpu_title(d: pd.DataFrame) -> str:
    if "gpu_name" in d and d["gpu_name"].notna().any():
        return ", ".join(sorted(set(map(str, d["gpu_name"].dropna()))))
    return ""


def provenance_note(d: pd.DataFrame) -> str:
    """'NVIDIA H200; 2026-11-29; 10 samples per point (round-robin); throttled: 37% of GPU samples; committed sets' --
    the line under every figure (what is unknown for the rows is said so: throttling, git SHA)."""
    if d is None or d.empty:
        return ""
    parts = [gpu_title(d) or "no GPU"]
    if "time" in d and d["time"].notna().any():
        days = sorted({str(t)[:10] for t in d["time"].dropna()})
        parts.append(days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}")
    if "n" in d and pd.to_numeric(d["n"], errors="coerce").notna().any():
        n = pd.to_numeric(d["n"], errors="coerce").dropna()
        rr = round_robin_rows(d)
        how = "round-robin" if rr.all() else ("separately timed jobs" if not rr.any() else "mixed methods")
        parts.append(f"{int(n.min())}-{int(n.max())} samples per point ({how})" if n.min() != n.max()
                     else f"{int(n.min())} samples per point ({how})")
    share = pd.to_numeric(d["throttled_share"], errors="coerce") if "throttled_share" in d else pd.Series(dtype=float)
    parts.append(f"throttled: {share.mean():.0%} of GPU samples" if share.notna().any()
                 else "throttling not recorded")
    if share.notna().any() and share.isna().any():
        parts[-1] += f" ({int(share.isna().sum())} of {len(d)} rows without it)"
    sha = d["git_sha"].notna() if "git_sha" in d else pd.Series(False, index=d.index)
    if not sha.all():
        parts.append("no git SHA" if not sha.any() else f"git SHA missing on {int((~sha).sum())} of {len(d)} rows")
    parts.append("includes scratch runs" if with_scratch() else "committed sets")
    return "; ".join(parts)
