"""Calibration microbenchmarks for the roofline (analysis/roofline.py), run on the GPU host:

    python -m experiments.microbench --out results/h200/microbench/rows.jsonl

MUFU ex2 rate, the FMA-pipe polynomial exp2 rate, the two mixed at 1/8, 1/4, 3/8, 1/2 (Triton,
exp2_triton.py); dense bf16 tensor-core GEMM rate (Triton tl.dot -> wgmma, and cuBLAS for reference,
gemm_bench.py); shared-memory load bandwidth (CuTe DSL, smem_cute.py). Every row has metric, value,
unit and method, plus the GPU, the SM clock NVML reported during the run and software versions. Each
benchmark runs in its own try block: one failure is a row with status "fail", never a stop. Without
a CUDA device the module prints a skip and writes nothing.
"""
from __future__ import annotations

import time
import uuid

BENCHES = ("exp2", "gemm", "smem")


def run_all(out: str, only=None, quick: bool = False) -> list[dict]:
    """Run the benchmarks (``only``: a subset of BENCHES) and append their rows to ``out``."""
    from experiments.microbench.common import RowWriter, cuda_ok, gpu_facts

    ok, reason = cuda_ok()
    if not ok:
        print(f"microbench: skipped: {reason}; run it on the GPU host")
        return []
    only = tuple(only or BENCHES)
    unknown = sorted(set(only) - set(BENCHES))
    if unknown:
        raise ValueError(f"only={unknown}: supported benchmarks are {BENCHES}")
    facts = gpu_facts()
    common = dict(kind="microbench", experiment="microbench", run_id=uuid.uuid4().hex[:12],
                  time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **facts)
    w = RowWriter(out, common)
    t0 = time.perf_counter()
    for name in only:
        t = time.perf_counter()
        try:
            if name == "exp2":
                from experiments.microbench import exp2_triton

                exp2_triton.run(w, facts, iters=256 if quick else 1024)
            elif name == "gemm":
                from experiments.microbench import gemm_bench

                gemm_bench.run(w, facts, size=4096 if quick else 8192)
            elif name == "smem":
                from experiments.microbench import smem_cute

                smem_cute.run(w, facts, iters=512 if quick else 2048)
        except Exception as e:  # an import or setup failure of one benchmark: record it, go on
            w.add(metric=f"{name}_bench", value=None, unit=None, method=name, status="fail",
                  reason=f"{type(e).__name__}: {e}"[:500])
        print(f"microbench: {name} done in {time.perf_counter() - t:.1f} s")
    print(f"microbench: {len(w.rows)} rows -> {out} ({time.perf_counter() - t0:.1f} s)")
    return w.rows


def summary(rows: list[dict]) -> str:
    """One line per row: metric, fraction, value, unit, status."""
    lines = []
    for r in rows:
        v = r.get("value")
        vs = f"{v:.4g}" if isinstance(v, (int, float)) else str(v)
        fr = "" if r.get("fraction") is None else f" f={r['fraction']:.3g}"
        lines.append(f"{r.get('metric')}{fr}: {vs} {r.get('unit') or ''} [{r.get('status')}]"
                     + (f" {r.get('reason')}" if r.get("reason") else ""))
    return "\n".join(lines)
