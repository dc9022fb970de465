"""The paper's tables from our rows (Table 2: exp2 polynomial accuracy; Table 4: compile time from the
``compile_time`` experiment) and the coverage table (which cells of the paper grid have timed rows). Each returns
``(DataFrame | None, message)`` and writes a Markdown and a CSV file."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.select import attn_times, cell_flags, round_robin_rows


def markdown_table(t: pd.DataFrame, floatfmt: str = "{:.4g}") -> str:
    cols = [str(c) for c in t.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in t.iterrows():
        cells = ["" if isinstance(v, float) and pd.isna(v) else floatfmt.format(v) if isinstance(v, float) else str(v)
                 for v in r.tolist()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_table(t: pd.DataFrame, out: Path, title: str, note: str = "") -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".csv").write_text(t.to_csv(index=False))
    out.with_suffix(".md").write_text(f"**{title}**\n\n{markdown_table(t)}\n" + (f"\n{note}\n" if note else ""))
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
    path = write_table(t, Path(outdir) / "table2_poly_accuracy", "Table 2: software exp2 accuracy per degree")
    return t, f"wrote {path}"


TABLE4_NAMES = {"fa4": "ours", "fa4_official": "FA4 official"}


def table4(df: pd.DataFrame, outdir) -> tuple[pd.DataFrame | None, str]:
    """Compile time (FA4 paper Table 4) per mode / head dim / causal, ours vs the official FA4, from the
    ``compile_time`` experiment (each sample a fresh process, caches off): the median over samples of the first
    call (compile + run) and of the cached second call, and the number of samples. ``outdir`` None: no files."""
    need = {"kind", "metric", "backend", "value"}
    if df is None or df.empty or not need <= set(df.columns):
        return None, "no rows for Table 4 yet (run experiment=compile_time)"
    d = df[(df["kind"] == "compile_time") & (df.get("status", "ok") == "ok") & df["backend"].isin(list(TABLE4_NAMES))
           & df["metric"].isin(["first_call_s", "second_call_s"])]
    if "gpu_name" in d:
        d = d[d["gpu_name"].notna()]
    if d.empty:
        return None, "no rows for Table 4 yet (no compile_time rows of fa4 / fa4_official on a GPU)"
    d = d.assign(hdim_v=d["hdim_v"].fillna(d["hdim"]) if "hdim_v" in d else d["hdim"])
    d = d.assign(head_dim=[f"{int(a)}" if a == b else f"{int(a)}/{int(b)}" for a, b in zip(d["hdim"], d["hdim_v"])],
                 col=[f"{TABLE4_NAMES[b]} {'first' if m == 'first_call_s' else 'cached'} call (s)"
                      for b, m in zip(d["backend"], d["metric"])])
    index = ["mode", "head_dim", "causal"]
    t = d.pivot_table(index=index, columns="col", values="value", aggfunc="median")
    n = d[d["metric"] == "first_call_s"].pivot_table(index=index, columns="backend", values="value", aggfunc="count")
    t = t.join(n.rename(columns={b: f"{TABLE4_NAMES[b]} samples" for b in n.columns})).reset_index()
    if {"ours first call (s)", "FA4 official first call (s)"} <= set(t.columns):
        t["ratio (official / ours)"] = t["FA4 official first call (s)"] / t["ours first call (s)"]
    first = [f"{n} {c}" for c in ("first call (s)",) for n in TABLE4_NAMES.values()] + ["ratio (official / ours)"]
    first += [f"{n} {c}" for c in ("cached call (s)", "samples") for n in TABLE4_NAMES.values()]
    t = t[index + [c for c in first if c in t.columns] + [c for c in t.columns if c not in first + index]]
    t["causal"] = t["causal"].map(lambda c: "yes" if bool(c) else "no")
    if outdir is None:  # the table only (the README block)
        return t, "Table 4 (not written)"
    path = write_table(t, Path(outdir) / "table4_compile_time", "Table 4: compile time (median over fresh processes)",
                       "Each sample: a fresh process, CuTe DSL / flash_attn.cute / Triton caches off; first call = "
                       "compile + run, cached call = the second call (experiments/compile_time.py).")
    return t, f"wrote {path}"


PAPER_GRID = dict(hdims=[64, 128, 256, [192, 128]], seqlens=[1024, 2048, 4096, 8192, 16384, 32768],
                  causal=[False, True], total_tokens=32768)  # conf/shape/paper.yaml's grid when that file cannot be read


def paper_grid(path: Path | None = None) -> dict:
    """The paper grid (head dims, sequence lengths, causal) of conf/shape/paper.yaml, the cells every mode should
    have; the built-in PAPER_GRID when the file or PyYAML is missing."""
    path = Path(path) if path else Path(__file__).resolve().parents[1] / "conf" / "shape" / "paper.yaml"
    try:
        import yaml

        g = (yaml.safe_load(path.read_text()) or {}).get("grid") or {}
    except (OSError, ImportError, AttributeError):
        g = {}
    return {k: g.get(k, v) for k, v in PAPER_GRID.items()}


def _seq(s) -> str:
    return f"{int(s) // 1024}k" if s >= 1024 else str(int(s))


def _hd(h, hv) -> str:
    return f"{int(h)}" if int(h) == int(hv) else f"{int(h)}/{int(hv)}"


def coverage(df: pd.DataFrame, modes=("fwd", "bwd"), grid: dict | None = None) -> pd.DataFrame:
    """Which cells of the paper grid (``paper_grid()``, for each of ``modes``) have timed GPU rows: per (mode, head
    dim, causal) x sequence length, the backends timed there ('fa4 +3' = ours and three peers, '-' = no rows) and
    how ('rr': round-robin in one job, whose rows replace separately timed ones; 'sep': separate jobs), with the
    marks of ``select.cell_flags`` ('°' fewer than 10 rounds, '‡' a row without throttled share or git SHA). Cells
    outside the grid that have rows are added."""
    grid = grid or paper_grid()
    pairs = [(h, h) if isinstance(h, int) else tuple(h) for h in grid["hdims"]]
    seqs = sorted(int(s) for s in grid["seqlens"])
    d = attn_times(df)
    if not d.empty:
        d = d[d["variant"].isin(["default", "peer"]) | d["variant"].isna()]
    cells: dict[tuple, dict] = {(m, int(h), int(hv), bool(c)): {} for m in modes for h, hv in pairs
                                for c in grid["causal"]}
    for (mode, h, hv, c, s), cell in (d.groupby(["mode", "hdim", "hdim_v", "causal", "seqlen_q"]) if not d.empty
                                      else []):
        # round-robin rows (a compare job's, which list who was timed with them) win over separate jobs' rows
        rr = cell[round_robin_rows(cell)]
        used = rr if len(rr) else cell
        backs = set(used["backend"])
        ours = "fa4" if "fa4" in backs else "-"
        flags = cell_flags(used).replace("†", "")  # 'sep' says it already
        cells.setdefault((mode, int(h), int(hv), bool(c)), {})[int(s)] = \
            f"{ours} +{len(backs - {'fa4'})} {'rr' if len(rr) else 'sep'}{flags}"
        if int(s) not in seqs:
            seqs.append(int(s))
    order = {m: i for i, m in enumerate(modes)}
    grid_seqs = {int(s) for s in grid["seqlens"]}
    grid_rows = {(m, int(h), int(hv), bool(c)) for m in modes for h, hv in pairs for c in grid["causal"]}
    rows = []
    for key, got in sorted(cells.items(), key=lambda kv: (order.get(kv[0][0], 99), *kv[0][1:])):
        mode, h, hv, c = key
        # '-': a paper-grid cell without rows; '': outside the grid and without rows
        rows.append({"mode": mode, "head dim": _hd(h, hv), "causal": "yes" if c else "no",
                     **{_seq(s): got.get(s, "-" if key in grid_rows and s in grid_seqs else "")
                        for s in sorted(seqs)}})
    return pd.DataFrame(rows)


def coverage_summary(cov: pd.DataFrame) -> str:
    """'fwd: 24 of 48 cells timed (0 round-robin); bwd: ...' for a ``coverage`` table."""
    if cov is None or cov.empty:
        return ""
    seqs = [c for c in cov.columns if c not in ("mode", "head dim", "causal")]
    parts = []
    for mode, g in cov.groupby("mode", sort=False):
        vals = [v for c in seqs for v in g[c] if v != ""]  # '' = outside the grid, no rows
        timed = [v for v in vals if v != "-"]
        parts.append(f"{mode}: {len(timed)} of {len(vals)} cells timed "
                     f"({sum(' rr' in v for v in timed)} round-robin)")
    return "; ".join(parts)
