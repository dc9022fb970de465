"""Deliberately failing backends, for the fault-isolation tests and the ``fault_demo`` experiment.

Importing this module registers them (an experiment asks for it with ``imports: [experiments.fault_backends]``):

- ``fault_segv``: the process receives SIGSEGV (a segfault) inside ``forward``.
- ``fault_hang``: ``forward`` never returns (sleeps), as a deadlocked kernel would.
- ``fault_cuda``: a real GPU fault: a Triton kernel stores through an offset ~1 TiB past its buffer, then
  synchronizes, so the illegal memory access surfaces inside this job (needs CUDA and Triton).
- ``fault_compile``: a real CuTe DSL tracing error (a layout whose shape and stride disagree) raised from
  inside ``cute.compile`` (needs nvidia-cutlass-dsl; no GPU).

It also holds the ``smoke`` job runner (kind "smoke"): one forward of one backend on fresh inputs, wall time
recorded. The CPU tests and the CPU half of the fault demo use it, since it needs neither CUDA events nor the
correctness machinery of the "attn" runner.
"""
from __future__ import annotations

import os
import signal
import time

from experiments.backends import get_backend, register_backend
from experiments.backends.base import Backend

HANG_SLEEP_S = 3600.0
OOB_OFFSET_ELEMS = 1 << 38  # x 4 bytes = 1 TiB past the buffer: never mapped


class FaultSegvBackend(Backend):
    cpu_capable = True

    def forward(self, q, k, v, causal, scale, cfg=None):
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(5.0)  # the signal is delivered before this returns
        raise RuntimeError(f"{self.name}: SIGSEGV was not delivered")


class FaultHangBackend(Backend):
    cpu_capable = True

    def forward(self, q, k, v, causal, scale, cfg=None):
        while True:
            time.sleep(HANG_SLEEP_S)


class FaultCompileBackend(Backend):
    cpu_capable = True

    def _available(self):
        try:
            import cutlass.cute  # noqa: F401
        except ImportError as e:
            return False, f"{self.name}: needs nvidia-cutlass-dsl ({e})"
        return True, ""

    def forward(self, q, k, v, causal, scale, cfg=None):
        import cutlass
        import cutlass.cute as cute

        cute.compile(_bad_layout_program(), cutlass.Int32(1))
        raise RuntimeError(f"{self.name}: the bad kernel compiled")


def _bad_layout_program():
    """A @cute.jit function whose layout's shape and stride disagree in rank: the DSL rejects it while tracing."""
    import cutlass
    import cutlass.cute as cute

    def bad_layout(n):
        layout = cute.make_layout((4, 8), stride=(1,))
        cute.printf("{}", layout)

    bad_layout.__annotations__ = {"n": cutlass.Int32}  # resolved here, not by the DSL in this module's globals
    return cute.jit(bad_layout)


class FaultCudaBackend(Backend):
    def _available(self):
        import torch

        if not torch.cuda.is_available():
            return False, f"{self.name}: no CUDA device (this backend faults a GPU on purpose)"
        try:
            import triton  # noqa: F401
        except ImportError as e:
            return False, f"{self.name}: needs Triton ({e})"
        return True, ""

    def forward(self, q, k, v, causal, scale, cfg=None):
        import torch

        buf = torch.zeros(1024, device=q.device, dtype=torch.float32)
        _oob_store_kernel()[(1,)](buf, OOB_OFFSET_ELEMS, BLOCK=128)
        torch.cuda.synchronize()  # the illegal address surfaces here
        raise RuntimeError(f"{self.name}: the out-of-range store did not fault")


def _oob_store_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def oob_store(ptr, offset, BLOCK: tl.constexpr):
        idx = offset + tl.arange(0, BLOCK).to(tl.int64)
        tl.store(ptr + idx, tl.full([BLOCK], 1.0, tl.float32))

    return oob_store


FAULT_BACKENDS = {
    "fault_segv": FaultSegvBackend,
    "fault_hang": FaultHangBackend,
    "fault_cuda": FaultCudaBackend,
    "fault_compile": FaultCompileBackend,
}


def register() -> None:
    for name, cls in FAULT_BACKENDS.items():
        register_backend(name, cls)


register()


# ---- the "smoke" job kind -------------------------------------------------------------------
def run_smoke_job(job: dict) -> list[dict]:
    """One forward of ``job['backend']`` on fresh inputs of ``job['shape']``; one row (metric 'wall_ms')."""
    import torch

    from experiments.shapes import Shape, make_inputs

    shape = Shape.from_dict(job["shape"])
    backend = get_backend(job["backend"])
    base = {"experiment": job.get("experiment"), "kind": job.get("kind"), "backend": backend.name,
            "variant": job.get("variant"), "mode": "fwd", "metric": "wall_ms", "config": job.get("config"),
            **shape.to_dict()}
    ok, why = backend.available()
    if ok:
        ok, why = backend.supports(shape, None)
    if not ok:
        return [{**base, "value": None, "status": "skip", "reason": why, "error_class": None}]
    device = backend.default_device()
    q, k, v = make_inputs(shape, device=device)
    sleep_s = float(job.get("sleep_s") or 0.0)  # lets the resume test stretch a sweep out
    t0 = time.perf_counter()
    out, _ = backend.forward(q, k, v, shape.causal, None, None)
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    if sleep_s:
        time.sleep(sleep_s)
    if not torch.isfinite(out.float()).all():
        return [{**base, "value": ms, "status": "fail", "reason": "non-finite output", "error_class": "wrong_result"}]
    return [{**base, "value": ms, "status": "ok", "reason": "", "error_class": None}]
