"""Variable-length (packed) batches, forward: ``attention_varlen`` (issue 12.2).

The sequences of a batch are packed back to back, flash_attn_varlen_func style: q (total_q, heads, head_dim),
k / v (total_k, heads_kv, head_dim[_v]); ``cu_seqlens_q`` / ``cu_seqlens_k`` (int32, batch + 1 entries, non-decreasing,
starting at 0, ending at total_q / total_k) mark where each sequence starts; sequence b is rows
cu_seqlens[b] .. cu_seqlens[b+1]-1, and it attends only to its own keys (causal: bottom-right aligned per sequence).
Output (total_q, heads, head_dim_v); LSE (heads, total_q) fp32, natural log, -inf for rows that see no key.

The kernel is the sm90 forward (kernels/sm90/fwd.py) compiled with ``varlen=True`` (its own compile cache entry: the
key is the plain forward's plus ``varlen``); grid (ceil(max_seqlen_q / tile_m), heads, batch), CTAs past their
sequence's end exit at once; O leaves through a row-predicated store so no sequence overwrites another.

Checks (each a one-line InputError / ConfigError, both ValueError, or TypeError for a wrong type): tensor ranks, dtypes,
head dims, GQA heads; cu_seqlens int32, 1-D, >= 2 entries, the same batch for q and k; max_seqlen ints >= 0. The
VALUE checks (first entry 0, non-decreasing, last == total tokens, max_seqlen >= the longest sequence) need the
cu_seqlens on the host: with ``check_seqlens=True`` (the default) they run on a host copy -- free when the cu_seqlens
are CPU tensors (they are then copied to the GPU), one device-to-host sync when they are CUDA tensors. Pass
``check_seqlens=False`` to skip that sync (e.g. in a CUDA graph); the values are then trusted, and wrong ones give
wrong results or out-of-bounds accesses.

torch.compile: ``attention_varlen`` runs through the torch.library ops ``fa4lab::varlen_fwd`` / ``fa4lab::varlen_bwd``
(registered below, schemas and shared helpers in kernels/ops.py) when traced, so ``torch.compile(fullgraph=True)``
traces it (fake kernels, registered autograd); eager calls on CUDA tensors take the same implementations under a plain
autograd.Function (``_VarlenFwd``), as ``kernels.attention`` does. Under tracing the cu_seqlens VALUE checks are skipped
(they read the values on the host); max_seqlen may be a SymInt there.

Backward (autograd): kernels/sm90/backward.py attention_backward_varlen -- the sm90 backward's preprocess, main and
postprocess kernels compiled with ``varlen=True`` (their own cache entries). The main kernel's grid is
(ceil(max_seqlen_k / tile_n), heads, batch); a CTA whose K/V tile starts past its sequence's keys leaves at once. Q / dO
/ K / V TMA tiles start at the sequence's first row; LSE (log2) / dPsum / fp32 dQaccum (and the deterministic mode's
semaphores) live in padded per-call buffers where sequence b's Q tiles own whole tile slots from padded row
(cu_seqlens_q[b] + b * tile_m) rounded down to tile_m, so no TMA load or bulk reduction crosses into another
sequence's rows; dK / dV (and dQ in the postprocess) leave through row-predicated 16-byte stores. Head dims 64 / 128,
bwd_tile_m 64 / 128 (hd128's default 80 runs as 64 here), GQA, sliding window, softcap and deterministic mode; two_cta
and the wide head dims (256, (192, 128)) are ConfigErrors raised by the backward (check_varlen_backward tells beforehand). Compiled and
SASS-checked on the CPU. On the H200 (2026-11-30, the sm90 backward files of 7cf331e) tests/test_varlen_gpu.py: 17 of
18 passed; test_varlen_matches_the_padded_kernel failed (39 values more than one bf16 ulp from the padded forward), and
it failed the same way with this file and kernels/ops.py as they were before the varlen ops.
"""
from __future__ import annotations

import math
import numbers

import torch

from .compile_cache import cache_key, feature_extra, get_or_compile, gqa_extra
from .config import AttnConfig, ConfigError
from .ops import (VARLEN_BWD_SCHEMA, VARLEN_FWD_SCHEMA, _eager_function, _resolved, _uses_features, config_string,
                  register_pair)
from .validate import (SUPPORTED_DTYPES, SUPPORTED_HDIM_PAIRS, InputError, canonical_window, check_cluster,
                       check_devices, check_gqa_heads, check_persistent_varlen, check_scale, check_softcap)

MAX_GRID_YZ = 65535  # heads and batch are the grid's y and z


# ---- compile --------------------------------------------------------------------------------------------------------
def make_varlen_fwd_kernel(cfg: AttnConfig, dtype: str, hdim: int, hdim_v: int, causal: bool, qhead_per_kvhead: int = 1,
                           window_left: int = -1, window_right: int = -1, softcap: float = 0.0):
    """The varlen forward kernel object (FlashFwdSm90(varlen=True)) for a resolved config; nothing compiled yet."""
    from .sm90.compile import make_fwd_kernel

    return make_fwd_kernel(cfg, dtype, hdim, hdim_v, causal, qhead_per_kvhead, window_left, window_right, softcap,
                           varlen=True)


def compile_varlen_fwd(kernel, tvm_ffi: bool | None = None, dump_dir: str | None = None):
    """cute.compile ``kernel.call_varlen`` against symbolic-shape fake tensors (total tokens, heads, batch symbolic).

    With TVM FFI the result is called ``compiled(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, scale)``
    on the current CUDA stream. ``dump_dir``: keep PTX and cubin there."""
    import cutlass
    import cutlass.cute as cute

    from .sm90.compile import tvm_ffi_available

    if not kernel.varlen:
        raise ValueError("compile_varlen_fwd: the kernel was built without varlen=True")
    if tvm_ffi is None:
        tvm_ffi = tvm_ffi_available()
    dt = kernel.dtype
    tq, tk, h, b1 = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()

    def fake(dtype, shape, align=16, div=8):
        stride = tuple(cute.sym_int64(divisibility=div) for _ in shape[:-1]) + (1,)
        return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

    h_kv = h if kernel.qhead_per_kvhead == 1 else cute.sym_int()
    q = fake(dt, (tq, h, kernel.hdim))
    k = fake(dt, (tk, h_kv, kernel.hdim))
    v = fake(dt, (tk, h_kv, kernel.hdim_v))
    o = fake(dt, (tq, h, kernel.hdim_v))
    lse = fake(cutlass.Float32, (h, tq), align=4, div=1)
    cu_q = cute.runtime.make_fake_tensor(cutlass.Int32, (b1,), stride=(1,), assumed_align=4)
    cu_k = cute.runtime.make_fake_tensor(cutlass.Int32, (b1,), stride=(1,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=tvm_ffi)
    options = "--enable-tvm-ffi" if tvm_ffi else ""
    if dump_dir is not None:
        import os

        os.makedirs(dump_dir, exist_ok=True)
        options += f" --keep-ptx --keep-cubin --dump-dir={dump_dir}"
    return cute.compile(kernel.call_varlen, q, k, v, o, lse, cu_q, cu_k, cutlass.Int32(1), cutlass.Float32(1.0), stream,
                        options=options)


def varlen_kernel_key(cfg: AttnConfig, dtype: str, hdim: int, hdim_v: int, causal: bool, qhead_per_kvhead: int = 1,
                      window_left: int = -1, window_right: int = -1, softcap: float = 0.0) -> tuple:
    """The compile cache key: the plain forward's key plus ``varlen=True``."""
    from .interface import ARCH

    return cache_key("fwd", cfg, dtype, hdim, hdim_v, causal, ARCH, varlen=True, **gqa_extra(qhead_per_kvhead),
                     **feature_extra(window_left, window_right, softcap))


def get_varlen_fwd_kernel(cfg: AttnConfig, dtype: str, hdim: int, hdim_v: int, causal: bool, tvm_ffi: bool | None = None,
                          qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1,
                          softcap: float = 0.0):
    """(kernel object, compiled callable) for a resolved config, compiled once per key."""
    key = varlen_kernel_key(cfg, dtype, hdim, hdim_v, causal, qhead_per_kvhead, window_left, window_right,
                            softcap) + (("tvm_ffi", tvm_ffi),)

    def build():
        try:
            kern = make_varlen_fwd_kernel(cfg, dtype, hdim, hdim_v, causal, qhead_per_kvhead, window_left,
                                          window_right, softcap)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return kern, compile_varlen_fwd(kern, tvm_ffi=tvm_ffi)

    return get_or_compile(key, build)


# ---- checks ---------------------------------------------------------------------------------------------------------
def check_varlen_backward(cfg: AttnConfig, hdim: int, hdim_v: int) -> None:
    """ConfigError unless the varlen backward exists for this resolved config (head dims 64 / 128, no two_cta,
    bwd_tile_m 64 / 128)."""
    from .sm90.backward import check_varlen_supported

    check_varlen_supported(cfg, hdim, hdim_v)


def check_varlen_qkv(q, k, v) -> int:
    """Packed (total, heads, head_dim) q, k, v; returns the GQA group (heads_q // heads_kv)."""
    named = (("q", q), ("k", k), ("v", v))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise InputError(f"{name}: expected rank 3 (total_tokens, heads, head_dim) for varlen, got rank {t.dim()} "
                             f"with shape {tuple(t.shape)}")
    if k.shape[0] != v.shape[0]:
        raise InputError(f"total_k: k and v must share total tokens, got {k.shape[0]} and {v.shape[0]}")
    group = check_gqa_heads(q.shape[1], k.shape[1], v.shape[1])
    for name, t in named:
        if t.dtype not in SUPPORTED_DTYPES:
            raise InputError(f"{name}: dtype {t.dtype} is not supported; supported: "
                             f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v: must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[2] != k.shape[2]:
        raise InputError(f"head_dim: q and k must share head_dim, got {q.shape[2]} and {k.shape[2]}")
    pair = (q.shape[2], v.shape[2])
    if pair not in SUPPORTED_HDIM_PAIRS:
        raise InputError(f"head_dim: (qk, v) = {pair} is not supported; supported: {list(SUPPORTED_HDIM_PAIRS)}")
    for name, t in named:
        if t.shape[0] >= 2 ** 31:
            raise InputError(f"{name}: {t.shape[0]} tokens; at most 2^31 - 1 (int32 cu_seqlens)")
    return group


def check_cu_seqlens(cu_seqlens_q, cu_seqlens_k) -> int:
    """Type, rank and length of the two cu_seqlens (no values read); returns the batch size."""
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected an int32 torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise TypeError(f"{name}: dtype {t.dtype}; expected torch.int32 (cumulative sequence starts)")
        if t.dim() != 1:
            raise InputError(f"{name}: expected a 1-D tensor of batch + 1 entries, got shape {tuple(t.shape)}")
        if t.shape[0] < 2:
            raise InputError(f"{name}: {t.shape[0]} entries; needs batch + 1 >= 2 (0, end of sequence 0, ...)")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise InputError(f"cu_seqlens_q / cu_seqlens_k: batch mismatch, {cu_seqlens_q.shape[0] - 1} sequences in q and "
                         f"{cu_seqlens_k.shape[0] - 1} in k ({cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]} entries)")
    batch = cu_seqlens_q.shape[0] - 1
    if batch > MAX_GRID_YZ:
        raise InputError(f"cu_seqlens_q: batch {batch} > {MAX_GRID_YZ} (the launch grid's z dimension)")
    return batch


def check_max_seqlen(name: str, value):
    """A Python int in [0, 2^31); under torch.compile a SymInt passes too and is returned as is (no specialisation)."""
    if isinstance(value, torch.SymInt):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected a Python int, got {type(value).__name__}")
    if value < 0 or value >= 2 ** 31:
        raise InputError(f"{name}={value}: must be in [0, 2^31)")
    return int(value)


def check_cu_seqlens_values(name: str, cu: torch.Tensor, total: int, max_seqlen: int, max_name: str) -> None:
    """The values (on a host copy): starts at 0, non-decreasing, ends at ``total``, longest sequence <= max_seqlen."""
    vals = cu.tolist()
    if vals[0] != 0:
        raise InputError(f"{name}: first entry is {vals[0]}; must be 0")
    steps = [b - a for a, b in zip(vals[:-1], vals[1:])]
    bad = [i for i, s in enumerate(steps) if s < 0]
    if bad:
        i = bad[0]
        raise InputError(f"{name}: entries must be non-decreasing, got {vals[i]} then {vals[i + 1]} at index {i}")
    if vals[-1] != total:
        raise InputError(f"{name}: last entry is {vals[-1]}; must equal the total tokens {total}")
    longest = max(steps)
    if longest > max_seqlen:
        raise InputError(f"{max_name}={max_seqlen} is smaller than the longest sequence ({longest}, sequence "
                         f"{steps.index(longest)} of {name})")


# ---- forward --------------------------------------------------------------------------------------------------------
def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, causal: bool, softmax_scale: float,
                   cfg: AttnConfig, out=None, lse=None, window_left: int = -1, window_right: int = -1,
                   softcap: float = 0.0):
    """Run the varlen kernel on validated CUDA tensors (cu_seqlens int32 on q's device); returns (out, lse).

    ``out`` (total_q, h, dv) at q's dtype / ``lse`` (h, total_q) fp32 may be preallocated (contiguous), e.g.
    NaN-poisoned by a test to prove every valid element is written and nothing else."""
    from .interface import _DTYPE_NAMES

    total_q, h, d = q.shape
    total_k, d_v = k.shape[0], v.shape[2]
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
    cu_seqlens_q, cu_seqlens_k = (t.contiguous() for t in (cu_seqlens_q, cu_seqlens_k))
    group = check_gqa_heads(h, k.shape[1], v.shape[1])
    if out is None:
        out = torch.empty((total_q, h, d_v), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((h, total_q), dtype=torch.float32, device=q.device)
    if out.shape != (total_q, h, d_v) or out.dtype != q.dtype or not out.is_contiguous():
        raise InputError(f"out: expected a contiguous {(total_q, h, d_v)} {q.dtype} tensor, got {tuple(out.shape)} "
                         f"{out.dtype}")
    if lse.shape != (h, total_q) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise InputError(f"lse: expected a contiguous {(h, total_q)} torch.float32 tensor, got {tuple(lse.shape)} "
                         f"{lse.dtype}")
    if total_q == 0 or max_seqlen_q == 0:
        return out, lse  # no query rows: nothing to compute (a zero-size TMA box or grid cannot launch)
    if total_k == 0:  # no keys anywhere: every row sees none
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    _, compiled = get_varlen_fwd_kernel(cfg, _DTYPE_NAMES[q.dtype], d, d_v, causal, qhead_per_kvhead=group,
                                        window_left=window_left, window_right=window_right, softcap=softcap)
    with torch.cuda.device(q.device):
        compiled(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), float(softmax_scale))
    return out, lse


# ---- the ops (schemas in kernels/ops.py): fa4lab::varlen_fwd / fa4lab::varlen_bwd ---------------------------------
def _varlen_fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                     softmax_scale: float, config: str, window_left: int = -1, window_right: int = -1,
                     softcap: float = 0.0):
    from .interface import _check_arch

    _check_arch(q.device)
    return varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal, softmax_scale,
                          _resolved(config, q.shape[2], causal), window_left=window_left, window_right=window_right,
                          softcap=softcap)


def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, config,
                     window_left=-1, window_right=-1, softcap=0.0):
    """out (total_q, h, d_v) at q's dtype, lse (h, total_q) fp32, both contiguous (varlen_forward's buffers)."""
    total_q, h, _ = q.shape
    return q.new_empty((total_q, h, v.shape[2])), q.new_empty((h, total_q), dtype=torch.float32)


def _varlen_bwd_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                     causal: bool, softmax_scale: float, config: str, window_left: int = -1, window_right: int = -1,
                     softcap: float = 0.0):
    from .sm90.backward import attention_backward_varlen

    return attention_backward_varlen(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     causal, softmax_scale, _resolved(config, q.shape[2], causal),
                                     window_left=window_left, window_right=window_right, softcap=softcap)


varlen_fwd_op, varlen_bwd_op = register_pair("varlen_fwd", _varlen_fwd_impl, _varlen_fwd_fake, VARLEN_FWD_SCHEMA,
                                             "varlen_bwd", _varlen_bwd_impl, VARLEN_BWD_SCHEMA, n_tensors=5)
_VarlenFwd = _eager_function("_VarlenFwd", _varlen_fwd_impl, _varlen_bwd_impl, n_tensors=5)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                     softmax_scale=None, config=None, return_lse=False, window_size=(-1, -1), softcap=0.0,
                     check_seqlens=True):
    """Attention over a packed batch of variable-length sequences (flash_attn_varlen_func's layout).

    q (total_q, heads, head_dim), k / v (total_k, heads_kv, head_dim / head_dim_v) (heads_kv divides heads: GQA);
    cu_seqlens_q / cu_seqlens_k int32 (batch + 1,); max_seqlen_q / max_seqlen_k Python ints >= the longest sequence
    (max_seqlen_q sizes the grid). ``causal`` is bottom-right aligned per sequence; ``window_size`` / ``softcap`` as in
    ``kernels.attention``. Returns out (total_q, heads, head_dim_v) [, lse (heads, total_q) fp32]. ``check_seqlens``:
    check the cu_seqlens values and max_seqlen on a host copy (one device-to-host sync for CUDA cu_seqlens; CPU ones
    are checked for free and copied to q's device); False trusts them (no sync). Under torch.compile the value checks
    are skipped whatever ``check_seqlens`` says (they cannot be traced): the values are trusted, as with False; the
    other checks run at trace time. Differentiable (dq / dk / dv packed like q / k / v): head dims 64 / 128 without
    two_cta (80-row Q tiles run as 64); other configs raise a ConfigError in the backward (kernels.varlen.check_varlen_backward
    tells beforehand). The arch (sm_90a) and the config's resolution are checked when the kernel runs. Then
    ``fa4lab::varlen_fwd`` when traced (its backward is fa4lab::varlen_bwd), or the same implementations eagerly."""
    group = check_varlen_qkv(q, k, v)  # noqa: F841 (GQA heads checked; the kernel reads the group from the shapes)
    check_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    max_seqlen_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = check_max_seqlen("max_seqlen_k", max_seqlen_k)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    check_scale(softmax_scale)
    softcap = check_softcap(softcap)
    causal, window_left, window_right = canonical_window(causal, window_size)
    cstr = config_string(config)  # TypeError for anything but an AttnConfig or None
    check_persistent_varlen(config)
    check_cluster(config, causal, window_left, window_right, varlen=True)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise InputError(f"{name}: last dim (head_dim) must be contiguous (stride 1), got stride {t.stride(-1)}")
    if check_seqlens and not torch.compiler.is_compiling():  # reads values: not traceable (see the docstring)
        check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q.cpu(), q.shape[0], max_seqlen_q, "max_seqlen_q")
        check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k.cpu(), k.shape[0], max_seqlen_k, "max_seqlen_k")
    check_devices(q, k, v, need_cuda=True)
    cus = []
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if t.device.type == "cpu":
            t = t.to(q.device, non_blocking=True)
        elif t.device != q.device:
            raise InputError(f"{name}: on {t.device}, q on {q.device}; pass it on q's device or on the CPU")
        cus.append(t)
    features = (window_left, window_right, softcap) if _uses_features(window_left, window_right, softcap) else ()
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[2])
    args = (q, k, v, cus[0], cus[1], max_seqlen_q, max_seqlen_k, causal, scale, cstr, *features)
    if type(q) is torch.Tensor and q.is_cuda and not torch.compiler.is_compiling():  # eager, real GPU tensors:
        out, lse = _VarlenFwd.apply(*args)  # no custom-op dispatch layer (as kernels.ops.attention)
    else:  # traced (fake kernels, registered autograd), or another device's registered kernel
        out, lse = varlen_fwd_op(*args)
    return (out, lse) if return_lse else out
