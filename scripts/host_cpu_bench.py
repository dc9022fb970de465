"""CPU-only estimate of the Python host cost of our forward / backward call paths, for iterating without a GPU.

Everything CUDA-specific is patched out in this process only: tensors claim to be CUDA, the arch / SM-count / device
checks are constants, and the compile cache holds no-op kernels, so what is timed is our Python (checks, memoised
config and key lookups, allocations on the CPU allocator) and torch's autograd Function machinery, not launches. The
GPU host's numbers are 2-4x these and vary by machine: scripts/host_profile.py measures there.

Usage: python scripts/host_cpu_bench.py [--prof]   (from the repository root; --prof adds cProfile tables)
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _patch_cuda_away():
    import torch

    import kernels.compile_cache as cc
    import kernels.interface as iface
    import kernels.ops as ops
    from kernels.sm90 import backward as bwd

    torch.cuda.device = lambda d: contextlib.nullcontext()
    torch.cuda.current_device = lambda: 0
    torch.Tensor.is_cuda = property(lambda self: True)
    iface._check_arch = ops._check_arch = lambda dev: None
    iface._sm_count = bwd._sm_count = lambda index: 132
    ops.check_devices = lambda q, k, v, need_cuda=False: None

    def noop(*args):
        return None
    real = cc.get_or_compile

    def fake_get_or_compile(key, build):  # a no-op kernel under the key the call asks for, then the real lookup
        if key not in cc._CACHE:
            # the backward's entry: backward.py _build's fields at hd 64 / 128's defaults (one semaphore per 64-row
            # group, the streaming postprocess and its counters), so the call takes the default's argument path
            cc._CACHE[key] = (None, noop) if key[0] == "fwd" else {"pre": noop, "main": noop, "post": noop,
                                                                    "tile_n": 128, "sem_rows": 64, "stream_post": True,
                                                                    "stream_pre": True}
            cc._RECORDS[key] = cc.CompileRecord(key, 0.0)
        return real(key, build)
    iface.get_or_compile = bwd.get_or_compile = fake_get_or_compile


def calls(shape=(1, 128, 16, 128), causal=True) -> dict:
    import torch

    import kernels
    import kernels.interface as iface
    import kernels.ops as ops
    from kernels.sm90 import backward as bwd

    q, k, v = (torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(*shape, dtype=torch.bfloat16)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    cfg = ops._resolved("{}", shape[3], causal)  # the object the eager path resolves to
    scale = shape[3] ** -0.5
    out, lse = iface.attention_forward(qd, kd, vd, causal, scale, cfg)
    return {
        "attention_forward": lambda: iface.attention_forward(qd, kd, vd, causal, scale, cfg),
        "kernels.attention (autograd fwd)": lambda: kernels.attention(q, k, v, causal=causal),
        "attention_backward (checked)": lambda: bwd.attention_backward(qd, kd, vd, out, do, lse, causal, scale, cfg),
        "backward_trusted": lambda: bwd.backward_trusted(qd, kd, vd, out, do, lse, causal, scale, cfg),
        "ops._bwd_impl (op)": lambda: ops._bwd_impl(do, qd, kd, vd, out, lse, causal, scale, "{}"),
        "ops._bwd_eager (eager Function)": lambda: ops._bwd_eager(do, qd, kd, vd, out, lse, causal, scale, "{}"),
        "torch.empty (one small tensor)": lambda: torch.empty(shape[0], shape[2], shape[1]),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--prof", action="store_true")
    a = ap.parse_args()
    _patch_cuda_away()
    fns = calls()
    for name, fn in fns.items():
        for _ in range(100):
            fn()
        best = min(timeit.timeit(fn, number=a.n) for _ in range(3)) / a.n * 1e6
        print(f"{name:36s} {best:7.2f} us")
    if a.prof:
        for name in ("kernels.attention (autograd fwd)", "ops._bwd_eager (eager Function)"):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(5000):
                fns[name]()
            pr.disable()
            print(f"===== {name}")
            pstats.Stats(pr).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
