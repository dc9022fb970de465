"""Where the host time of a tiny attention call goes (GPU host): each piece of our forward / backward path timed
alone, against cuDNN (SDPA) and official FA4 on the same tensors.

Two numbers per piece, both microseconds per call over ``n`` calls (median of ``reps`` repetitions):
- ``enqueue``: the Python loop's time while the GPU is held busy by a spin kernel queued first, so nothing waits for
  the GPU: pure host cost (Python, allocations, launches);
- ``wall``: the same loop from an idle GPU to a synchronize: what a training step pays when the GPU keeps up.

Pieces are timed round-robin (one repetition of each in turn, ``reps`` rounds).

Usage: python scripts/host_profile.py [--n 100] [--reps 5] [--only TEXT] [--json out.json] [--trace] [--profile]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time_once(fn, n: int) -> tuple[float, float]:
    """(enqueue, wall) microseconds per call of one repetition (see the module docstring)."""
    import torch

    torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU spin: the loop below never waits on the GPU
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    enq = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return enq, (time.perf_counter() - t0) / n * 1e6


def time_round_robin(fns: dict, n: int, reps: int) -> dict:
    """Median (enqueue, wall) per piece over ``reps`` rounds, each round timing every piece once in turn, so that
    the host's drift between rounds reaches all pieces alike (ratios within a round are what to compare)."""
    import torch

    for fn in fns.values():
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    got = {name: ([], []) for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            e, w = _time_once(fn, n)
            got[name][0].append(e)
            got[name][1].append(w)
    return {name: {"enqueue_us": statistics.median(e), "wall_us": statistics.median(w), "enqueue_rounds": e,
                   "wall_rounds": w} for name, (e, w) in got.items()}


def _ours_ffi_functions() -> list:
    """The raw TVM FFI functions behind every compiled kernel of ours in this process."""
    import kernels.compile_cache as cc

    out = []
    for entry in cc._CACHE.values():
        objs = entry.values() if isinstance(entry, dict) else (entry if isinstance(entry, tuple) else (entry,))
        out += [o.__tvm_ffi_object__() for o in objs if hasattr(o, "__tvm_ffi_object__")]
    return [f for f in out if f is not None]


def keep_gil(fn):
    """``fn`` with TVM FFI told to keep the GIL during our kernel launches (it releases it by default)."""
    fs = []

    def run():
        if not fs:  # once, after the pieces' first calls compiled the kernels (outside the timed loops)
            fs.extend(_ours_ffi_functions())
        for f in fs:
            f.release_gil = False
        try:
            return fn()
        finally:
            for f in fs:
                f.release_gil = True
    return run


def pieces(shape=(1, 128, 16, 128), causal=True) -> dict:
    """name -> zero-argument callable, every piece on the same bf16 tensors."""
    import torch

    import kernels
    import kernels.compile_cache
    from kernels.interface import attention_forward, resolve_config
    from kernels.sm90 import backward as bwd

    b, s, h, d = shape
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    out = out.detach()
    scale = d ** -0.5
    cfg = resolve_config(None, d, causal)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    bwd.attention_backward(qd, kd, vd, out, do, lse, causal, scale, None)  # compile
    key = next(key for key in kernels.compile_cache._CACHE if key[0] == "bwd")
    kern = kernels.compile_cache._CACHE[key]
    sqp = (s + cfg.bwd_tile_m - 1) // cfg.bwd_tile_m * cfg.bwd_tile_m + kern.get("q_pad_rows", 0)
    lse2 = torch.empty(b, h, sqp, device="cuda")
    dpsum = torch.empty(b, h, sqp, device="cuda")
    dqacc = torch.empty(b, h, sqp, d, device="cuda")
    sem = torch.empty(b, h, sqp // cfg.bwd_tile_m, device="cuda", dtype=torch.int32)
    dq, dk, dv = (torch.empty_like(t) for t in (qd, kd, vd))
    p = {
        "torch.empty (1 small tensor)": lambda: torch.empty(b, h, sqp, device="cuda"),
        "bwd pre kernel call": lambda: kern["pre"](out, do, lse, dpsum, lse2, dqacc),
        "bwd main kernel call": lambda: kern["main"](qd, kd, vd, do, lse2, dpsum, dqacc, dk, dv, sem, scale),
        "bwd post kernel call": lambda: kern["post"](dqacc, dq, scale),
        "bwd main kernel call, raw TVM FFI function": (lambda raw: lambda: raw(
            qd, kd, vd, do, lse2, dpsum, dqacc, dk, dv, sem, scale))(kern["main"].__tvm_ffi_object__()),
        "backward_trusted": lambda: bwd.backward_trusted(qd, kd, vd, out, do, lse, causal, scale, cfg),
        "attention_forward": lambda: attention_forward(qd, kd, vd, causal, scale, cfg),
        "attention_backward": lambda: bwd.attention_backward(qd, kd, vd, out, do, lse, causal, scale, None),
        "ours fwd (autograd)": lambda: kernels.attention(q, k, v, causal=causal),
        "ours fwd+bwd": lambda: kernels.attention(q, k, v, causal=causal).backward(do),
    }
    from kernels import ops

    old_fn = ops._eager_function("_MaterializingAttention", ops._fwd_impl, ops._bwd_impl, 3, materialize_grads=True)
    p["ours fwd+bwd, lse grad materialized (before)"] = lambda: old_fn.apply(q, k, v, causal, scale, "{}")[0].backward(do)
    o_keep = kernels.attention(q, k, v, causal=causal)
    p["ours bwd only (autograd.grad)"] = lambda: torch.autograd.grad(o_keep, (q, k, v), do, retain_graph=True)
    p["ours _bwd_impl"] = lambda: ops._bwd_impl(do, qd, kd, vd, out, lse, causal, scale, "{}")

    class Ident(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g
    p["engine: identity Function fwd+bwd"] = lambda: Ident.apply(q).backward(do)
    p["engine: view_as fwd+bwd (C++ node)"] = lambda: q.view_as(q).backward(do)
    p["ours fwd + autograd.grad (fresh graph)"] = lambda: torch.autograd.grad(
        kernels.attention(q, k, v, causal=causal), (q, k, v), do)

    def reset_then(fn):
        def run():
            q.grad = k.grad = v.grad = None
            return fn()
        return run
    p["ours fwd+bwd, .grad reset first"] = reset_then(lambda: kernels.attention(q, k, v, causal=causal).backward(do))

    def keep_output(fwd):  # the output (so its autograd graph) alive until the next call: freed on this thread then
        kept = []

        def run():
            o = fwd()
            o.backward(do)
            kept[:] = [o]
        return run
    p["ours fwd+bwd, output kept to the next call"] = keep_output(lambda: kernels.attention(q, k, v, causal=causal))

    def standin_fwd(q_, k_, v_, causal_, scale_, config_):
        return q_.view_as(q_), lse
    standin = ops._eager_function("_StandIn", standin_fwd, lambda dout, *a: (dout, dout, dout), 3)
    p["engine: our Function, no kernels, fwd+bwd"] = lambda: standin.apply(q, k, v, causal, scale, "{}")[0].backward(do)
    p["engine: our Function, no kernels, fwd"] = lambda: standin.apply(q, k, v, causal, scale, "{}")

    def single_thread(fn):  # the backward on the calling thread instead of autograd's CUDA device thread
        def run():
            with torch.autograd.set_multithreading_enabled(False):
                return fn()
        return run

    def gc_off(fn):
        import gc

        def run():
            gc.disable()
            try:
                return fn()
            finally:
                gc.enable()
        return run
    ours_fb = p["ours fwd+bwd"]
    from kernels.sm90 import cpp_backward

    def cpp_node(fn, on: bool):  # the eager backward as the C++ autograd node (the default) or the Python one
        def run():
            cpp_backward.force = on
            try:
                return fn()
            finally:
                cpp_backward.force = None
        return run
    p["ours fwd+bwd, C++ backward node"] = cpp_node(ours_fb, True)
    p["ours fwd+bwd, Python backward node"] = cpp_node(ours_fb, False)
    p["ours fwd, C++ backward node (autograd)"] = cpp_node(p["ours fwd (autograd)"], True)
    p["ours fwd, Python backward node (autograd)"] = cpp_node(p["ours fwd (autograd)"], False)
    kernels.attention(q, k, v, causal=causal).backward(do)  # the backward compiled: the C++ node takes the calls
    for on, name in ((True, "C++"), (False, "Python")):
        cpp_backward.force = on
        o_node = kernels.attention(q, k, v, causal=causal)
        cpp_backward.force = None
        print(f"{name} backward node piece: grad_fn {o_node.grad_fn.name()}", flush=True)
        p[f"ours bwd only (autograd.grad), {name} backward node"] = (lambda o: lambda: torch.autograd.grad(
            o, (q, k, v), do, retain_graph=True))(o_node)
    p["ours fwd+bwd, autograd single-threaded"] = single_thread(ours_fb)
    # where autograd's device thread costs ours more than cuDNN (run 8): the same pieces on the calling thread
    for name in ("engine: our Function, no kernels, fwd+bwd", "engine: identity Function fwd+bwd",
                 "engine: view_as fwd+bwd (C++ node)", "ours bwd only (autograd.grad)"):
        p[name + ", single-threaded"] = single_thread(p[name])
    p["ours backward_trusted, on a Python worker thread"] = on_worker_thread(p["backward_trusted"])
    p["no-op, on a Python worker thread"] = on_worker_thread(lambda: None)
    p["ours fwd+bwd, gc disabled"] = gc_off(ours_fb)
    p["ours fwd+bwd, TVM FFI keeps the GIL"] = keep_gil(ours_fb)
    p["ours fwd+bwd, keeps the GIL, single-threaded"] = keep_gil(single_thread(ours_fb))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
    p["cudnn fwd"] = cudnn
    p["cudnn fwd+bwd"] = lambda: cudnn().backward(do)
    p["cudnn fwd+bwd, output kept to the next call"] = keep_output(cudnn)
    o_cudnn = cudnn()
    p["cudnn fwd+bwd, autograd single-threaded"] = single_thread(p["cudnn fwd+bwd"])
    p["cudnn bwd only (autograd.grad)"] = lambda: torch.autograd.grad(o_cudnn, (q, k, v), do, retain_graph=True)
    p["cudnn bwd only (autograd.grad), single-threaded"] = single_thread(p["cudnn bwd only (autograd.grad)"])
    try:
        from flash_attn.cute import flash_attn_func

        def official():
            o = flash_attn_func(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o
        p["official fwd"] = official
        p["official fwd+bwd"] = lambda: official().backward(do)
    except ImportError:
        pass
    return p


def on_worker_thread(fn):
    """``fn`` run on one long-lived Python thread (handed over and waited for through two queues), as autograd runs a
    Python backward on its device thread: with the no-op piece, what a call costs off the main thread."""
    import queue
    import threading

    todo, done = queue.SimpleQueue(), queue.SimpleQueue()

    def loop():
        while True:
            f = todo.get()
            done.put(f())

    threading.Thread(target=loop, daemon=True).start()

    def run():
        todo.put(fn)
        return done.get()
    return run


def dlpack_status() -> dict:
    """How TVM FFI converts torch tensors here (the per-tensor cost of each kernel call depends on it)."""
    import torch

    st = {"torch": torch.__version__, "torch_has_c_dlpack_exchange_api": hasattr(torch.Tensor, "__c_dlpack_exchange_api__")}
    try:
        import tvm_ffi

        st["tvm_ffi"] = getattr(tvm_ffi, "__version__", "?")
    except ImportError as e:
        st["tvm_ffi"] = f"missing ({e})"
    try:
        import torch_c_dlpack_ext  # noqa: F401

        st["torch_c_dlpack_ext"] = "imported"
    except Exception as e:  # noqa: BLE001 -- any failure to load the addon is the finding
        st["torch_c_dlpack_ext"] = f"not loaded ({type(e).__name__}: {e})"
    return st


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, help="run only the pieces whose name contains this text (a|b: either)")
    ap.add_argument("--profile", action="store_true", help="cProfile of our forward+backward, top 30 by own time")
    ap.add_argument("--trace", action="store_true", help="torch.profiler tables of ours and cuDNN's forward+backward")
    a = ap.parse_args()
    st = dlpack_status()
    print(json.dumps(st), flush=True)
    res = {"dlpack": st, "pieces": {}}
    fns = {name: fn for name, fn in pieces().items() if not a.only or any(t in name for t in a.only.split("|"))}
    res["pieces"] = time_round_robin(fns, a.n, a.reps)
    from kernels.sm90 import cpp_backward

    res["cpp_backward_node"] = cpp_backward.status()
    print(f"C++ backward node: {res['cpp_backward_node']}", flush=True)
    for name, r in res["pieces"].items():
        print(f"{name:48s} enqueue {r['enqueue_us']:8.1f} us   wall {r['wall_us']:8.1f} us", flush=True)
    if a.profile:
        import cProfile
        import pstats

        import torch

        fn = pieces()["ours fwd+bwd"]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.n):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    if a.trace:  # torch.profiler: CPU time per op inside the autograd engine, ours vs cuDNN
        import torch
        from torch.profiler import ProfilerActivity, profile

        ps = pieces()
        for name in ("ours fwd+bwd", "cudnn fwd+bwd"):
            fn = ps[name]
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            print(f"--- trace: {name} (20 calls)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
