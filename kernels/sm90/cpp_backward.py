"""The eager backward of ``kernels.attention`` as a C++ autograd node (kernels/csrc/bwd_node.cpp), on by default.

Autograd runs the backward of CUDA tensors on its device thread. With a Python node (kernels/ops.py's autograd
Function) that thread takes the GIL and runs our Python launcher; on the H200 that was where our fixed cost per
forward+backward call exceeded cuDNN's (README, "Host time per call"). Here the forward runs as before and ``attach``
returns its output through a C++ node whose backward allocates the scratch and calls the three compiled kernels
through TVM FFI's C ABI, with no Python on that thread. The kernels, their order and arguments are
backward.py ``backward_trusted``'s (tests/test_cpp_backward.py, and bit for bit on the GPU).

It takes the eager calls it covers: CUDA tensors (GQA, windows and softcap too: a window / softcap is in the compiled
kernels, the calls' arguments are the same), q / k / v contiguous, a gradient wanted, a backward the kernels accept,
and one already compiled for the call's key: the first call of a key keeps the Python node, whose first backward
compiles the kernels as before (so first-call and compile times mean what they did, and a forward alone compiles no
backward). ``FA4LAB_CPP_BWD=0`` keeps the Python node everywhere. The extension is built on first use with
torch.utils.cpp_extension (a C++ compiler and ninja; under a minute, cached by torch); a build or load failure
leaves the Python node in place and says why once (``status()``). H200 (2026-12-04, scripts/host_profile.py, two machines, 9
and 11 rounds): forward+backward of 1 x 128 x 16 x 128 causal, ours / cuDNN per round 0.75 / 0.87 enqueue and 0.80 /
0.85 wall with this node, 1.19 / 1.03 and 1.11 / 1.08 with the Python node in the same rounds.
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parents[1] / "csrc" / "bwd_node.cpp"
ENV = "FA4LAB_CPP_BWD"

_lock = threading.Lock()
_ext = None  # the loaded extension module
_why_not: str | None = None  # why it could not be loaded (once set, not retried)
_plans: dict = {}  # (compile key, device index) -> plan id
_keep: list = []  # the compiled functions whose handles a plan holds (kept alive with it)


force: bool | None = None  # scripts / tests: True / False overrides the environment variable


def enabled() -> bool:
    return force if force is not None else os.environ.get(ENV, "1") != "0"


def load_extension():
    """The built module (torch.utils.cpp_extension.load of kernels/csrc/bwd_node.cpp), without any TVM FFI API set."""
    from torch.utils.cpp_extension import load

    return load(name="fa4lab_bwd_node", sources=[str(CSRC)], extra_cflags=["-O2"], verbose=False)


def _tvm_ffi_api() -> tuple[int, int, int, int]:
    """Addresses of TVMFFIFunctionCall, TVMFFIEnvSetStream, TVMFFIErrorMoveFromRaised, TVMFFIObjectDecRef in the
    libtvm_ffi that the tvm_ffi package (the kernels' runtime) loaded."""
    import tvm_ffi.libinfo as info

    lib = ctypes.CDLL(info.find_libtvm_ffi())
    return tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in
                 ("TVMFFIFunctionCall", "TVMFFIEnvSetStream", "TVMFFIErrorMoveFromRaised", "TVMFFIObjectDecRef"))


def extension():
    """The extension with the real TVM FFI entry points, or None (``status()`` says why)."""
    global _ext, _why_not
    if _ext is not None or _why_not is not None:
        return _ext
    with _lock:
        if _ext is None and _why_not is None:
            try:
                ext = load_extension()
                ext.set_api(*_tvm_ffi_api())
                _ext = ext
            except Exception as e:  # no compiler, no tvm_ffi, a build error: the Python node stays
                _why_not = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
                warnings.warn(f"the C++ backward node is unavailable ({_why_not}); the Python autograd node runs "
                              f"({ENV}=0 chooses it without trying)", RuntimeWarning, stacklevel=3)
    return _ext


def status() -> str:
    return "loaded" if _ext is not None else (f"unavailable: {_why_not}" if _why_not else "not loaded")


def handle(fn) -> int:
    """The TVM FFI function handle of a compiled kernel (a tvm_ffi.Function, or the DSL's kwargs wrapper of one)."""
    h = fn.__chandle__() if hasattr(fn, "__chandle__") else fn.__tvm_ffi_object__().__chandle__()
    if not h:
        raise RuntimeError("a compiled backward kernel without a TVM FFI handle (compiled without --enable-tvm-ffi?)")
    return int(h)


def plan_fields(cfg, kern: dict, sm_count: int) -> dict:
    """The plan of one compiled backward: what backward_trusted reads from (cfg, kern) to size and launch it."""
    from .backward import sem_multiple

    return dict(tile_m=int(cfg.bwd_tile_m), q_pad_rows=int(kern.get("q_pad_rows", 0)), sem_rows=int(kern["sem_rows"]),
                sem_mult=int(sem_multiple(cfg, kern)), tile_n=int(kern["tile_n"]),
                ctas=int(sm_count) if kern.get("persistent") else 0, zero_sem=bool(cfg.deterministic),
                stream_pre=bool(kern.get("stream_pre")), stream_post=bool(kern.get("stream_post")))


def _register(ext, kern: dict, fields: dict) -> int:
    f = fields
    pid = ext.register_plan(handle(kern["pre"]), handle(kern["main"]), handle(kern["post"]), f["tile_m"],
                            f["q_pad_rows"], f["sem_rows"], f["sem_mult"], f["tile_n"], f["ctas"], f["zero_sem"],
                            f["stream_pre"], f["stream_post"])
    _keep.append((kern["pre"], kern["main"], kern["post"]))
    return pid


def covers(q, k, v) -> bool:
    """Whether an eager call can take the C++ node (see the module docstring)."""
    return (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            and q.is_contiguous() and k.is_contiguous() and v.is_contiguous())


def attention(q, k, v, causal: bool, scale: float, config, features: tuple = ()) -> tuple | None:
    """(out, lse) with out's grad_fn the C++ node, or None (then the caller runs the Python node): the extension is
    unavailable, or the call's backward is not compiled yet. ``config``: the resolved AttnConfig of the call
    (kernels/ops.py _resolved); ``features``: kernels/ops.py's (window_left, window_right, softcap), or ()."""
    ext = extension()
    if ext is None:
        return None
    from ..compile_cache import cached
    from ..config import ConfigError
    from ..interface import attention_forward
    from .backward import _DTYPE_NAMES, _call_config, _canonical, _sm_count

    d = q.shape[3]
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    sms = _sm_count(index)
    b_causal, wl, wr, cap = _canonical(causal, *features) if features else (bool(causal), -1, -1, 0.0)
    try:
        cfg, key = _call_config(config, _DTYPE_NAMES[q.dtype], d, v.shape[-1], b_causal, q.shape[2] // k.shape[2], wl,
                                wr, cap, k.shape[1], sms)  # backward_trusted's key for this call
    except ConfigError:  # a backward the kernels refuse: the Python node's backward raises it, as it did
        return None
    kern = cached(key)
    if kern is None:  # the Python node's first backward compiles it; later calls of this key come here
        return None
    pid = _plans.get((key, index))
    if pid is None:
        with _lock:
            pid = _plans.get((key, index))
            if pid is None:
                pid = _plans[(key, index)] = _register(ext, kern, plan_fields(cfg, kern, sms))
    with torch.no_grad():  # kernels/ops.py _fwd_impl's call
        kw = dict(window_left=features[0], window_right=features[1], softcap=features[2]) if features else {}
        out, lse = attention_forward(q, k, v, causal, scale, config, **kw)
    return ext.attach(q, k, v, out, lse, pid, float(scale)), lse
