"""The CPU ``numerics`` experiment: accuracy of the FA4 algorithm model against an fp64 reference.

Kind "numerics": for each (dtype, score distribution, hdim, tau, exp2 fraction) the model
(kernels.reference.attention_model, backend 'fa4_model') runs on one fixed input and is compared with
attention_exact at fp64; rows give its out / lse errors, the same-dtype PyTorch errors
(attention_naive, the DESIGN.md rule's yardstick), the rule verdict, the share of skipped rescales,
the count of inf / NaN outputs and, at tau > 0 without exp2 emulation, the shares of blocks that
speculative_exp's first / second vote would compute again (spec_redo_share / spec_max_check_share). Score distributions:

* ``gaussian``       q, k, v ~ N(0, 1): typical scores, block maxima move little.
* ``late_max``       each row's max climbs steadily along the kernels' visit order (key blocks are
                     visited last-first, so the ramp rises toward key 0) and ends on a sink key at
                     position 0 that jumps a few log2 units more: many small rescales, one late jump.
* ``fp16_overflow``  gaussian scores plus 16 outlier keys visited last whose score exceeds the row's
                     running max by a per-row jump J rising from 0 to 24 log2 units along the query
                     positions (plus a little noise). A skipped rescale
                     (J <= tau) leaves P = 2^J un-normalised; fp16 overflows for J >= ~16, so tau > 16 is
                     unsafe for fp16 (bf16 has fp32's range). Extra taus (``overflow_taus``) show it.

Kind "poly": the FA4 paper's Table 2 -- the exp2 polynomial of each degree over 4M uniform inputs in
[0, 1): max relative error in fp32 and agreement with hardware-like exp2 after bf16 rounding.

``expand(params)`` -> jobs, ``run(job)`` -> rows, ``finalize(df, outdir)`` -> the PNG figure and tables.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from kernels.config import AttnConfig
from kernels.exp2_model import EXP2_POLY_COEFFS, PAPER_COEFFS_FLOOR, poly_accuracy
from kernels.reference import attention_exact, attention_model, attention_naive

EXPERIMENT = "numerics"
BACKEND = "fa4_model"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
DISTS = ("gaussian", "late_max", "fp16_overflow")
LOG2E = math.log2(math.e)

DEFAULT_PARAMS = dict(
    dtypes=["bfloat16", "float16"],
    dists=list(DISTS),
    taus=[0.0, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0],
    overflow_taus=[20.0, 24.0],  # added for dist fp16_overflow only: where fp16 P overflows
    fractions=[0.0, 0.125, 0.25, 0.5, 1.0],
    hdims=[128],  # [64, 128] doubles the run time (~2x a few minutes on 2 cores)
    batch=1,
    heads=2,
    seqlen=1024,
    causal=False,
    seed=0,
    poly_degrees=[1, 2, 3, 4, 5],
    poly_paper=True,  # also the paper's degree-3 coefficients with its floor range reduction
    poly_n=4_000_000,
)


class NumericsError(ValueError):
    """A numerics parameter or job field is out of range."""


def _check_list(name, values, allowed=None, kind=None):
    if not isinstance(values, (list, tuple)) or not values:
        raise NumericsError(f"{name}={values!r}: must be a non-empty list")
    for v in values:
        if allowed is not None and v not in allowed:
            raise NumericsError(f"{name}: {v!r} is not supported; supported: {list(allowed)}")
        if kind is not None and (isinstance(v, bool) or not isinstance(v, kind)):
            raise NumericsError(f"{name}: {v!r} must be a {kind.__name__ if isinstance(kind, type) else 'number'}")


def expand(params: dict | None = None) -> list[dict]:
    """Jobs of the experiment: poly rows first (fast), then one numerics job per grid point."""
    p = dict(DEFAULT_PARAMS)
    unknown = sorted(set(params or {}) - set(p))
    if unknown:
        raise NumericsError(f"unknown numerics param(s) {unknown}; known: {sorted(p)}")
    p.update(params or {})
    _check_list("dtypes", p["dtypes"], DTYPES)
    _check_list("dists", p["dists"], DISTS)
    _check_list("taus", p["taus"], kind=(int, float))
    _check_list("fractions", p["fractions"], kind=(int, float))
    _check_list("hdims", p["hdims"], kind=int)
    jobs = []
    for d in p["poly_degrees"] or []:
        if d not in EXP2_POLY_COEFFS:
            raise NumericsError(f"poly_degrees: {d!r} is not supported; supported: {sorted(EXP2_POLY_COEFFS)}")
        jobs.append(dict(kind="poly", experiment=EXPERIMENT, degree=int(d), coeffs="ours_round",
                         n=int(p["poly_n"]), seed=int(p["seed"])))
    if p["poly_paper"]:
        jobs.append(dict(kind="poly", experiment=EXPERIMENT, degree=3, coeffs="paper_floor",
                         n=int(p["poly_n"]), seed=int(p["seed"])))
    for dist in p["dists"]:
        taus = list(p["taus"]) + (list(p["overflow_taus"] or []) if dist == "fp16_overflow" else [])
        for dtype in p["dtypes"]:
            for hdim in p["hdims"]:
                for tau in taus:
                    for frac in p["fractions"]:
                        jobs.append(dict(kind="numerics", experiment=EXPERIMENT, dist=dist, dtype=dtype,
                                         hdim=int(hdim), tau=float(tau), exp2_fraction=float(frac),
                                         batch=int(p["batch"]), heads=int(p["heads"]), seqlen_q=int(p["seqlen"]),
                                         seqlen_k=int(p["seqlen"]), causal=bool(p["causal"]), seed=int(p["seed"])))
    return jobs


# ---- inputs ----------------------------------------------------------------------------------
def make_inputs(dist: str, dtype: torch.dtype, batch: int, seqlen_q: int, seqlen_k: int, heads: int, hdim: int,
                seed: int):
    """(q, k, v) of the named score distribution, (batch, seqlen, heads, hdim), rounded to ``dtype``."""
    if dist not in DISTS:
        raise NumericsError(f"dist={dist!r}: supported distributions are {list(DISTS)}")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads, hdim, generator=g)
    k = torch.randn(batch, seqlen_k, heads, hdim, generator=g)
    v = torch.randn(batch, seqlen_k, heads, hdim, generator=g)
    to_log2 = LOG2E / math.sqrt(hdim)  # one unit of q.k in log2 units of the softmax
    if dist == "late_max":
        # row amplitude a_i in [0.5, 1.5]; key j adds a_i * 12 * (1 - j/sk) log2 units (rising toward key 0,
        # which the kernels visit last), and key 0 (a sink) adds 6 more
        q[..., 0] = 0.5 + torch.rand(batch, seqlen_q, heads, generator=g)
        ramp = 12.0 * (1.0 - torch.arange(seqlen_k) / seqlen_k)
        ramp[0] += 6.0
        k[..., 0] = (ramp / to_log2)[None, :, None]
    elif dist == "fp16_overflow":
        n_out = min(16, seqlen_k)
        # J rises with the query position (neighbouring queries align alike with the outlier keys), so the
        # 16-row groups that vote on a rescale hold similar jumps
        pos = torch.arange(seqlen_q, dtype=torch.float32)[None, :, None] / max(1, seqlen_q - 1)
        jump = (24.0 * pos + 0.5 * torch.randn(batch, seqlen_q, heads, generator=g)).clamp(0.0, 24.0)
        base = 5.0  # ~ the running max of gaussian scores over the other keys, in log2 units
        amp = 8.0
        k[..., 0] = 0.0
        k[:, :n_out, :, 0] = amp
        q[..., 0] = (jump + base) / (amp * to_log2)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@functools.lru_cache(maxsize=4)
def _fixture(dist, dtype_name, batch, seqlen_q, seqlen_k, heads, hdim, causal, seed):
    """Inputs, fp64 reference and same-dtype PyTorch result, shared by the jobs of one grid column."""
    q, k, v = make_inputs(dist, DTYPES[dtype_name], batch, seqlen_q, seqlen_k, heads, hdim, seed)
    ref, ref_lse = attention_exact(q, k, v, causal, return_lse=True)
    pt, pt_lse = attention_naive(q, k, v, causal, return_lse=True)
    return q, k, v, ref, ref_lse, pt, pt_lse


def _max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref|; equal values (incl. equal infinities) count 0; a NaN or inf difference gives inf."""
    x, ref = x.double(), ref.double()
    d = torch.where(x == ref, torch.zeros_like(x), (x - ref).abs())
    d = torch.nan_to_num(d, nan=float("inf"))
    return float(d.max()) if d.numel() else 0.0


# ---- runners ---------------------------------------------------------------------------------
def run(job: dict) -> list[dict]:
    """Rows of one job (kind 'numerics' or 'poly')."""
    kind = job.get("kind")
    if kind == "poly":
        return _run_poly(job)
    if kind == "numerics":
        return _run_numerics(job)
    raise NumericsError(f"job kind={kind!r}: experiments.numerics runs kinds 'numerics' and 'poly'")


def _run_poly(job: dict) -> list[dict]:
    coeffs = job.get("coeffs", "ours_round")
    degree = int(job["degree"])
    if coeffs == "ours_round":
        r = poly_accuracy(EXP2_POLY_COEFFS[degree], n=int(job["n"]), reduction="round", seed=int(job["seed"]))
    elif coeffs == "paper_floor":
        if degree != 3:
            raise NumericsError(f"degree={degree}: the paper's coefficients are degree 3")
        r = poly_accuracy(PAPER_COEFFS_FLOOR, n=int(job["n"]), reduction="floor", seed=int(job["seed"]))
    else:
        raise NumericsError(f"coeffs={coeffs!r}: supported are 'ours_round', 'paper_floor'")
    base = dict(experiment=job.get("experiment", EXPERIMENT), kind="poly", backend=BACKEND, mode="exp2",
                status="ok", reason=None, error_class=None, degree=degree, coeffs=coeffs, n=int(job["n"]),
                input_range="[0,1)")
    return [dict(base, metric=m, value=float(r[m])) for m in
            ("max_rel_err_fp32", "max_rel_err_vs_hw", "bf16_equal_share", "bf16_1ulp_share", "bf16_max_ulp")]


def _run_numerics(job: dict) -> list[dict]:
    from .check import compare  # the DESIGN.md rule, shared with the backend checks

    dtype_name = job["dtype"]
    if dtype_name not in DTYPES:
        raise NumericsError(f"dtype={dtype_name!r}: supported dtypes are {sorted(DTYPES)}")
    dtype = DTYPES[dtype_name]
    b, sq, sk, h, d = (int(job[x]) for x in ("batch", "seqlen_q", "seqlen_k", "heads", "hdim"))
    causal = bool(job.get("causal", False))
    q, k, v, ref, ref_lse, pt, pt_lse = _fixture(job["dist"], dtype_name, b, sq, sk, h, d, causal, int(job["seed"]))
    cfg = AttnConfig(rescale_threshold=float(job["tau"]), exp2_emu_fraction=float(job["exp2_fraction"]))
    out, lse, st = attention_model(q, k, v, causal, config=cfg, return_lse=True, return_stats=True)
    n_inf, n_nan = int(torch.isinf(out).sum()), int(torch.isnan(out).sum())
    chk = compare("out", out, pt, ref, dtype)
    err = _max_err(out, ref)
    pt_err = _max_err(pt, ref)
    fin = torch.isfinite(out).all(dim=-1)
    mean_err = float((out.double() - ref).abs()[fin].mean()) if bool(fin.any()) else float("inf")
    metrics = dict(
        out_max_abs_err=err,
        out_pt_max_abs_err=pt_err,
        out_err_ratio=err / pt_err if pt_err > 0 else float("inf"),
        out_mean_abs_err=mean_err,
        lse_max_abs_err=_max_err(lse, ref_lse),
        lse_pt_max_abs_err=_max_err(pt_lse, ref_lse),
        within_rule=float(chk.passed and n_inf == 0),
        skipped_share=float(st["skipped_share"]),
        rescales_done=float(st["rescales_done"]),
        rescales_skipped=float(st["rescales_skipped"]),
        n_inf=float(n_inf),
        n_nan=float(n_nan),
        exp2_emulated_fraction=float(st["exp2_emulated_fraction"]),
    )
    # speculative_exp's votes on the same blocks (kernels/reference.py _SpecVotes; tau > 0, no exp2 emulation)
    metrics.update({m: float(st[m]) for m in ("spec_redo_share", "spec_max_check_share") if m in st})
    rcfg = AttnConfig.from_dict(st["config"])
    base = dict(experiment=job.get("experiment", EXPERIMENT), kind="numerics", backend=BACKEND, mode="fwd",
                status="ok", reason=None, error_class=None, batch=b, seqlen_q=sq, seqlen_k=sk, heads=h, hdim=d,
                hdim_v=d, causal=causal, dtype=dtype_name, dist=job["dist"], tau=float(job["tau"]),
                exp2_fraction=float(job["exp2_fraction"]), seed=int(job["seed"]), config=rcfg.to_dict(),
                config_hash=rcfg.config_hash(), rule_bound=chk.bound)
    return [dict(base, metric=m, value=float(v)) for m, v in metrics.items()]


# ---- finalize --------------------------------------------------------------------------------
def finalize(df, outdir) -> list[str]:
    """Write numerics.png (error vs tau per exp2 fraction and dtype; skipped-rescale share vs tau),
    numerics_summary.csv and poly_table.csv / .md under ``outdir``; returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    if "status" in df:
        df = df[df["status"] == "ok"]
    poly = df[df["kind"] == "poly"] if "kind" in df else df.iloc[0:0]
    if len(poly):
        tab = poly.pivot_table(index=["coeffs", "degree"], columns="metric", values="value", aggfunc="first")
        tab = tab.reset_index()
        p = outdir / "poly_table.csv"
        tab.to_csv(p, index=False)
        written.append(str(p))
        p = outdir / "poly_table.md"
        p.write_text(_markdown(tab) + "\n")
        written.append(str(p))
    num = df[df["kind"] == "numerics"] if "kind" in df else df.iloc[0:0]
    if not len(num):
        return written
    keys = ["dist", "dtype", "hdim", "tau", "exp2_fraction"]
    wide = num.pivot_table(index=keys, columns="metric", values="value", aggfunc="first", dropna=False).reset_index()
    wide = wide.dropna(subset=[c for c in ("skipped_share",) if c in wide])
    p = outdir / "numerics_summary.csv"
    wide.to_csv(p, index=False)
    written.append(str(p))

    dists = [x for x in DISTS if x in set(wide["dist"])]
    dtypes = [x for x in DTYPES if x in set(wide["dtype"])]
    ncol = len(dtypes) + 1
    fig, axes = plt.subplots(len(dists), ncol, figsize=(5.2 * ncol, 3.6 * len(dists)), squeeze=False)
    wide = wide.assign(frac=wide["exp2_fraction"].map(lambda f: f"{f:g}"), hd=wide["hdim"].map(lambda h: f"d{int(h)}"))
    palette = dict(zip(sorted(wide["frac"].unique(), key=float), sns.color_palette("viridis", wide["frac"].nunique())))
    for i, dist in enumerate(dists):
        for j, dt in enumerate(dtypes):
            ax = axes[i][j]
            sub = wide[(wide["dist"] == dist) & (wide["dtype"] == dt)]
            fin = sub[sub["out_max_abs_err"].map(lambda x: x is not None and math.isfinite(x))]
            if len(fin):
                sns.lineplot(data=fin, x="tau", y="out_max_abs_err", hue="frac", style="hd", palette=palette,
                             markers=True, dashes=True, ax=ax, legend=(i == 0 and j == 0))
            for hd, ls in zip(sorted(sub["hd"].unique()), (":", "-.")):
                ptv = sub[sub["hd"] == hd]["out_pt_max_abs_err"].dropna()
                if len(ptv):
                    ax.axhline(float(ptv.iloc[0]), color="grey", ls=ls, lw=1)
            bad = sub[sub["out_max_abs_err"].map(lambda x: x is None or not math.isfinite(x))]
            if len(bad):
                ymax = ax.get_ylim()[1] if len(fin) else 1.0
                ax.scatter(bad["tau"], [ymax] * len(bad), marker="x", color="red", zorder=5,
                           label="non-finite output")
                ax.text(0.02, 0.95, f"inf/NaN output at tau >= {bad['tau'].min():g}", transform=ax.transAxes,
                        color="red", va="top", fontsize=8)
            ax.set_yscale("log")
            ax.set_title(f"{dist}, {dt}: max|out - fp64|  (grey: PyTorch {dt})", fontsize=9)
            ax.set_xlabel("tau (log2 units)")
        ax = axes[i][ncol - 1]
        sub = wide[wide["dist"] == dist]
        sns.lineplot(data=sub, x="tau", y="skipped_share", hue="hd", style="dtype", markers=True, ax=ax,
                     errorbar=None)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{dist}: share of skipped rescales (per 16-row group, block)", fontsize=9)
        ax.set_xlabel("tau (log2 units)")
    fig.suptitle("FA4 algorithm model (kernels/reference.py) vs fp64: conditional rescale tau x exp2 emulation "
                 "fraction", fontsize=11)
    fig.tight_layout()
    import io

    from PIL import Image

    p, buf = outdir / "numerics.png", io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")  # saved with 256 colours, as analysis/style.py saves the figures (the
    rgb = Image.open(buf).convert("RGB")  # committed copy travels with every GPU run; experiments/ imports no analysis/)
    rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(p, optimize=True)
    plt.close(fig)
    written.append(str(p))
    return written


def _markdown(tab) -> str:
    cols = list(tab.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, r in tab.iterrows():
        lines.append("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)
