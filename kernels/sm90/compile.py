"""Compile the sm90 forward kernel from fake tensors (no GPU, no torch storage needed).

Sequence lengths, batch and heads are symbolic, so one compiled kernel serves every shape of a
(dtype, head dims, causal, config) key; the compiled function takes torch tensors through TVM FFI:
``compiled(q, k, v, out, lse, softmax_scale, hb_group)`` on the current CUDA stream. GQA / MQA: ``qhead_per_kvhead``
> 1 compiles a kernel whose K/V have their own (symbolic) head count, h_q / qhead_per_kvhead; at 1 K/V share Q's head
symbol, as before (the same kernel, the same SASS). Sliding window ``window_left`` / ``window_right`` and ``softcap`` are
compile-time constants too; at their defaults (-1, -1, 0.0) the kernel is the plain one. A persistent config
(``cfg.persistent`` True) compiles ``call_persistent``: ``compiled(q, k, v, out, lse, softmax_scale, hb_group, num_ctas)``
with num_ctas = min(SM count, tiles), the grid (kernels/interface.py computes it). ``cfg.cluster_m`` = 2 compiles the
2x1-cluster kernel (K/V multicast; same arguments; the kernel rounds its grid up to whole clusters). ``cfg.pack_gqa``
with ``qhead_per_kvhead`` > 1 compiles the packed-GQA kernel (one CTA per K/V head and tile of (position, head) rows; same
arguments); with a group of 1 the plain kernel. ``cfg.rescale_before_pv`` compiles the overlapped main loop with O
rescaled between issuing the next QK^T and this block's P V (same arguments; False: the default kernel, its key).
``cfg.split_tail`` (persistent, non-causal) compiles ``call_persistent_split``: ``compiled(q, k, v, out, lse, o_acc,
lse_acc, softmax_scale, hb_group, num_ctas)`` with the tail pieces' fp32 workspace (kernels/sm90/fwd_tail.py).
``cfg.persistent_greedy`` (persistent, causal) compiles ``call_persistent_walk``: ``compiled(q, k, v, out, lse, walk,
softmax_scale, hb_group, num_ctas)`` with the int32 walk table (kernels/sm90/greedy_walk.py).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from ..config import AttnConfig
from .fwd import FlashFwdSm90

DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}


def make_fwd_kernel(cfg: AttnConfig, dtype: str, hdim: int, hdim_v: int, causal: bool,
                    qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1,
                    softcap: float = 0.0, varlen: bool = False, trace_ctas: bool = False) -> FlashFwdSm90:
    """The kernel object for a resolved config (plain Python; nothing compiled yet); ``varlen``: the packed
    variable-length kernel (kernels/varlen.py; its callers reject persistent and cluster_m=2 first; pack_gqa with a
    group > 1 is the kernel class's ValueError). ``trace_ctas``: the persistent kernel with the per-CTA trace
    (scripts/cta_timeline.py; compile_fwd adds its argument)."""
    if not cfg.is_resolved:
        raise ValueError("make_fwd_kernel: pass a resolved AttnConfig (cfg.resolve('sm90', hdim, causal))")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: supported are {sorted(DTYPES)}")
    return FlashFwdSm90(
        DTYPES[dtype], hdim, hdim_v, causal, tile_m=cfg.tile_m, tile_n=cfg.tile_n, num_stages=cfg.num_stages,
        rescale_threshold=float(cfg.rescale_threshold), exp2_emu_fraction=float(cfg.exp2_emu_fraction),
        pingpong=cfg.pingpong, intra_wg_overlap=cfg.intra_wg_overlap, consumer_regs=cfg.consumer_regs,
        producer_regs=cfg.producer_regs, qhead_per_kvhead=qhead_per_kvhead, window_left=window_left,
        window_right=window_right, softcap=softcap, persistent=bool(cfg.persistent), cluster_m=cfg.cluster_m,
        varlen=varlen, pack_gqa=bool(getattr(cfg, "pack_gqa", False)) and int(qhead_per_kvhead) > 1,
        rescale_before_pv=bool(cfg.rescale_before_pv), causal_split=bool(cfg.causal_split),
        exp_in_branch=bool(cfg.exp_in_branch), p_cvt_asm=bool(cfg.p_cvt_asm), pv_wait_mid=bool(cfg.pv_wait_mid),
        early_v_release=bool(cfg.early_v_release), persistent_snake=bool(cfg.persistent_snake),
        q_in_regs=bool(cfg.q_in_regs),
        # only where it applies (kernels/interface.py split_tail_launch normalises the call's config the same way)
        split_tail=bool(cfg.split_tail) and bool(cfg.persistent) and not causal and not varlen and window_left < 0
        and window_right < 0,
        persistent_greedy=bool(cfg.persistent_greedy) and bool(cfg.persistent) and causal and not varlen,
        lazy_row_max=bool(cfg.lazy_row_max), row_sum_mma=bool(cfg.row_sum_mma),
        speculative_exp=bool(cfg.speculative_exp), spec_redo_budget=int(cfg.spec_redo_budget or 0),
        trace_ctas=trace_ctas, persistent_dynamic=bool(cfg.persistent_dynamic) and bool(cfg.persistent) and not varlen,
        early_desc=bool(cfg.early_desc), skip_idle_wg=bool(cfg.skip_idle_wg), p_smem=bool(cfg.p_smem),
        p_smem_early=bool(cfg.p_smem_early), q_regs_k=int(cfg.q_regs_k or 0), qk_halves=bool(cfg.qk_halves),
        p_before_vote=bool(cfg.p_before_vote), o_direct=bool(cfg.o_direct),
        spec_warp_redo=bool(cfg.spec_warp_redo), o_via_v_stage=bool(cfg.o_via_v_stage),
        o_deferred=bool(cfg.o_deferred), o_direct_wide=bool(cfg.o_direct_wide),
        skip_diag_wg=bool(cfg.skip_diag_wg), q_prefetch=bool(cfg.q_prefetch))


def tvm_ffi_available() -> bool:
    try:
        import tvm_ffi  # noqa: F401
    except Exception:
        return False
    return True


def compile_fwd(kernel: FlashFwdSm90, tvm_ffi: bool | None = None, dump_dir: str | None = None):
    """cute.compile the kernel against symbolic-shape fake tensors; returns the compiled callable.

    With TVM FFI (the GPU path) the result takes torch tensors directly; without it (CPU-only CI)
    the compile still runs the whole DSL -> PTX -> cubin pipeline for the same device code.
    ``dump_dir``: keep the PTX and cubin there (use one directory per configuration).
    """
    if tvm_ffi is None:
        tvm_ffi = tvm_ffi_available()
    dt = kernel.dtype
    b, sq, sk, h = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()

    def fake(dtype, shape, align=16, div=8):
        stride = tuple(cute.sym_int64(divisibility=div) for _ in shape[:-1]) + (1,)
        return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

    q = fake(dt, (b, sq, h, kernel.hdim))
    h_kv = h if kernel.qhead_per_kvhead == 1 else cute.sym_int()  # GQA: K/V heads apart from Q's
    k = fake(dt, (b, sk, h_kv, kernel.hdim))
    v = fake(dt, (b, sk, h_kv, kernel.hdim_v))
    o = fake(dt, (b, sq, h, kernel.hdim_v))
    lse = fake(cutlass.Float32, (b, h, sq), align=4, div=1)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=tvm_ffi)
    options = "--enable-tvm-ffi" if tvm_ffi else ""
    if dump_dir is not None:
        import os

        os.makedirs(dump_dir, exist_ok=True)
        options += f" --keep-ptx --keep-cubin --dump-dir={dump_dir}"
    # trace_ctas: the persistent launchers' last argument, int64 (num_ctas, 4)
    trace = (fake(cutlass.Int64, (cute.sym_int(), 4), align=8, div=1),) if getattr(kernel, "trace_ctas", False) else ()
    if getattr(kernel, "dynamic", False):  # the claim counter int32 (1,), then the grid
        counter = fake(cutlass.Int32, (1,), align=4, div=1)
        return cute.compile(kernel.call_persistent_dynamic, q, k, v, o, lse, counter, cutlass.Float32(1.0),
                            cutlass.Int32(1), cutlass.Int32(1), stream, *trace, options=options)
    if kernel.split_tail:  # the tail pieces' workspace (2 * num_ctas slots of fp32 O and LSE), then the grid
        slots = cute.sym_int()
        oacc = fake(cutlass.Float32, (slots, kernel.tile_m, kernel.hdim_v))
        lseacc = fake(cutlass.Float32, (slots, kernel.tile_m), align=4, div=1)
        return cute.compile(kernel.call_persistent_split, q, k, v, o, lse, oacc, lseacc, cutlass.Float32(1.0),
                            cutlass.Int32(1), cutlass.Int32(1), stream, *trace, options=options)
    if kernel.greedy:  # the walk table (num_ctas, 1 + longest walk) int32, then the grid
        walk = fake(cutlass.Int32, (cute.sym_int(), cute.sym_int()), align=4, div=1)
        return cute.compile(kernel.call_persistent_walk, q, k, v, o, lse, walk, cutlass.Float32(1.0),
                            cutlass.Int32(1), cutlass.Int32(1), stream, *trace, options=options)
    if kernel.persistent:  # one more argument: the grid (num_ctas)
        return cute.compile(kernel.call_persistent, q, k, v, o, lse, cutlass.Float32(1.0), cutlass.Int32(1),
                            cutlass.Int32(1), stream, *trace, options=options)
    return cute.compile(kernel, q, k, v, o, lse, cutlass.Float32(1.0), cutlass.Int32(1), stream, options=options)
