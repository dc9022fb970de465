"""Compile time (FA4 paper Table 4) as its own experiment: every sample in a fresh process, caches off.

``expand(params)`` gives one job per (backend, head dim, causal, mode, sample); ``run(job)`` starts
``python -m experiments.compile_time '<job json>'`` with the CuTe DSL's in-memory and file caches off
(CUTE_DSL_NO_CACHE, CUTE_DSL_DISABLE_FILE_CACHING, a fresh CUTE_DSL_CACHE_DIR), flash_attn.cute's disk cache off
(FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=0) and fresh Triton / Inductor cache folders; our own compile cache
(kernels/compile_cache.py) lives in the process, so it starts empty. The child builds inputs, then times the
first call (compile + run, ``first_call_s``) and the second (cached path, ``second_call_s``), synchronised, and
for our kernels the compile itself (``compile_s``: the compile cache's build time of the kernels built by that call).
Rows carry the child's pid and the cache settings it saw; a child that fails or outlives ``timeout_s`` is a fail row.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PARAMS = dict(backends=["fa4", "fa4_official"], hdims=[128], causal=[False, True],
                      modes=["fwd", "bwd"], samples=3, seqlen=1024, hidden=2048, dtype="bfloat16", timeout_s=300,
                      imports=[])
CACHE_OFF = {"CUTE_DSL_NO_CACHE": "1", "CUTE_DSL_DISABLE_FILE_CACHING": "1",
             "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "0"}
FRESH_DIRS = ("CUTE_DSL_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
STDERR_LINES = 6


def expand(params: dict | None = None) -> list[dict]:
    """Jobs of kind "compile_time"; ``params`` override DEFAULT_PARAMS (unknown keys are an error)."""
    p = {**DEFAULT_PARAMS, **dict(params or {})}
    unknown = sorted(set(p) - set(DEFAULT_PARAMS))
    if unknown:
        raise ValueError(f"params: unknown key(s) {unknown}; known: {sorted(DEFAULT_PARAMS)}")
    if int(p["samples"]) < 1:
        raise ValueError(f"samples={p['samples']}: need at least 1 (Table 4 wants >= 3)")
    jobs = []
    for b in p["backends"]:
        for hd in p["hdims"]:
            d, dv = (int(hd), int(hd)) if isinstance(hd, int) else (int(hd[0]), int(hd[1]))
            for c in p["causal"]:
                for m in p["modes"]:
                    shape = dict(batch=1, seqlen_q=int(p["seqlen"]), seqlen_k=int(p["seqlen"]),
                                 heads=max(1, int(p["hidden"]) // d), hdim=d, hdim_v=dv, causal=bool(c),
                                 dtype=str(p["dtype"]))
                    for i in range(int(p["samples"])):
                        jobs.append({"kind": "compile_time", "backend": b, "variant": "default", "config": None,
                                     "shape": shape, "mode": m, "sample": i, "timeout_s": float(p["timeout_s"]),
                                     "imports": list(p["imports"])})
    return jobs


def _base_row(job: dict) -> dict:
    return dict(experiment=job.get("experiment"), kind="compile_time", backend=job["backend"],
                variant=job.get("variant"), mode=job["mode"], sample=job["sample"], **job["shape"], config=None)


def run(job: dict) -> list[dict]:
    """One sample in a fresh process; returns the child's rows (or a fail row)."""
    base = _base_row(job)
    with tempfile.TemporaryDirectory(prefix="fa4lab-compile-") as tmp:
        env = {**os.environ, **CACHE_OFF, **{k: str(Path(tmp) / k.lower()) for k in FRESH_DIRS}}
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), env.get("PYTHONPATH")) if x)
        try:
            p = subprocess.run([sys.executable, "-m", "experiments.compile_time", json.dumps(job)], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=float(job.get("timeout_s", 300)))
        except subprocess.TimeoutExpired:
            return [dict(base, metric="first_call_s", value=None, status="fail", error_class="timeout",
                         reason=f"compile-time child ran past timeout_s={job.get('timeout_s')}")]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    if p.returncode != 0 or not lines:
        tail = " | ".join(p.stderr.strip().splitlines()[-STDERR_LINES:])
        cls = "compile_error" if any(m in tail.lower() for m in ("mlir", "cutlass", "ptxas", "dsl")) else "crash"
        return [dict(base, metric="first_call_s", value=None, status="fail", error_class=cls,
                     reason=f"child exit {p.returncode}: {tail}"[:600])]
    return [dict(base, **r) for r in json.loads(lines[-1])]


def _child(job: dict) -> list[dict]:
    """Runs in the fresh process: the sample's rows (first/second call, compile seconds) or one skip/fail row."""
    import importlib

    import torch

    from experiments.attn_job import _timed_fn, _timed_inputs, classify_error, error_message
    from experiments.backends import get_backend
    from experiments.bench import time_first_call
    from experiments.shapes import Shape

    for m in job.get("imports") or ():
        importlib.import_module(m)
    seen = dict(pid=os.getpid(), **{f"env_{k}": os.environ.get(k) for k in (*CACHE_OFF, *FRESH_DIRS)})
    shape, mode = Shape.from_dict(job["shape"]), job["mode"]
    backend = get_backend(job["backend"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ok, why = backend.available()
    if ok and device == "cpu" and not backend.cpu_capable:
        ok, why = False, f"{backend.name}: does not run on CPU"
    if ok:
        ok, why = backend.supports(shape, None)
    if not ok:
        return [dict(metric="first_call_s", value=None, status="skip", reason=why, error_class=None, **seen)]
    try:
        fn = _timed_fn(backend, shape, None, mode, None, _timed_inputs(shape, mode, device, seed=0))
        from kernels import compile_cache

        built = {id(r) for r in compile_cache.compile_records()}  # the backward's setup may compile the forward
        first = time_first_call(fn, device)
        compile_s = sum(r.seconds for r in compile_cache.compile_records() if id(r) not in built) or None
        second = time_first_call(fn, device)
    except NotImplementedError as e:
        return [dict(metric="first_call_s", value=None, status="skip", reason=error_message(e), error_class=None,
                     **seen)]
    except Exception as e:  # noqa: BLE001 -- the parent records it
        return [dict(metric="first_call_s", value=None, status="fail", reason=error_message(e),
                     error_class=classify_error(e), **seen)]
    ok_row = dict(status="ok", reason=None, error_class=None, device=device, **seen)
    rows = [dict(ok_row, metric="first_call_s", value=first), dict(ok_row, metric="second_call_s", value=second)]
    if compile_s is not None:
        rows.append(dict(ok_row, metric="compile_s", value=compile_s))
    return rows


if __name__ == "__main__":  # the child: python -m experiments.compile_time '<job json>'
    print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
