"""Torch-facing launcher of the sm90 backward: preprocess -> main kernel -> postprocess, compiled once per key.

``attention_backward(q, k, v, out, dout, lse, causal, softmax_scale, config) -> (dq, dk, dv)``; tensors are
(batch, seqlen, heads, head_dim) bf16/fp16 CUDA tensors, lse is (batch, heads, seqlen_q) fp32 natural log.
``compile_backward(...)`` builds the three kernels from fake tensors (no GPU needed) for tests / SASS checks.
"""
from __future__ import annotations

import math

from ..compile_cache import cache_key, get_or_compile
from ..config import AttnConfig, ConfigError

ARCH = "sm90"
# dQ reduction of the one-CTA kernel: False = red.global.add.v2.f32 from the MMA registers (GPU-verified
# path); True = shared memory + cp.reduce.async.bulk by a writer warp (FA4's scheme; compile/SASS-verified only).
DQ_VIA_SMEM_DEFAULT = False


def _cutlass_dtype(dtype_name: str):
    import cutlass

    return {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}[dtype_name]


def _check_supported(cfg: AttnConfig, hdim: int, hdim_v: int) -> None:
    from .bwd import BWD_TILES

    if hdim != hdim_v:
        raise ConfigError(f"head_dim_v={hdim_v}: the sm90 backward needs head_dim_v == head_dim ({hdim})")
    if hdim not in BWD_TILES:
        raise ConfigError(f"hdim={hdim}: the sm90 backward supports head dims {sorted(BWD_TILES)} "
                          "(256 does not fit: dK+dV accumulators need 256 registers per thread)")


def _build(cfg: AttnConfig, dtype_name: str, hdim: int, causal: bool, fake: bool = True, args=None,
           dq_via_smem: bool = DQ_VIA_SMEM_DEFAULT):
    """Compile (pre, main, post) for one key; with ``fake`` the arguments are symbolic (compile only)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    from .bwd import FlashBwdSm90
    from .bwd_post import FlashBwdPostSm90
    from .bwd_pre import FlashBwdPreSm90

    dt = _cutlass_dtype(dtype_name)
    main = FlashBwdSm90(dt, hdim, causal, deterministic=cfg.deterministic, two_cta=cfg.two_cta,
                        exp2_emu_fraction=cfg.exp2_emu_fraction, dq_via_smem=dq_via_smem)
    # AttnConfig's tile and register fields describe the forward; the backward keeps its own (BWD_TILES, 24/240).
    pre = FlashBwdPreSm90(dt, hdim, main.tile_m)
    post = FlashBwdPostSm90(dt, hdim, main.tile_m, blocked=main.dq_smem)
    if args is None:
        B, SQ, SK, H, SQP = (cute.sym_int32(symbol=s) for s in ("B", "SQ", "SK", "H", "SQP"))
        SQP = cute.sym_int32(divisibility=64, symbol="SQP")
        qkv = lambda s: make_fake_compact_tensor(dt, (B, s, H, hdim), stride_order=(3, 2, 1, 0), assumed_align=16)
        f32 = lambda shape: make_fake_compact_tensor(cutlass.Float32, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                                      assumed_align=16)
        q, o, do, dq = qkv(SQ), qkv(SQ), qkv(SQ), qkv(SQ)
        k, v, dk, dv = qkv(SK), qkv(SK), qkv(SK), qkv(SK)
        lse = make_fake_compact_tensor(cutlass.Float32, (B, H, SQ), stride_order=(2, 1, 0), assumed_align=4)
        lse2, dpsum = f32((B, H, SQP)), f32((B, H, SQP))
        dqacc = f32((B, H, SQP, hdim))
        sem = make_fake_compact_tensor(cutlass.Int32, (B, H, cute.sym_int32(symbol="NM")), stride_order=(2, 1, 0),
                                       assumed_align=4)
        stream = make_fake_stream()
    else:
        q, k, v, o, do, lse, lse2, dpsum, dqacc, dq, dk, dv, sem, stream = args
    scale = cutlass.Float32(1.0)
    c_pre = cute.compile(pre, o, do, lse, dpsum, lse2, dqacc, stream)
    c_main = cute.compile(main, q, k, v, do, lse2, dpsum, dqacc, dk, dv, sem, scale, stream)
    c_post = cute.compile(post, dqacc, dq, scale, stream)
    return dict(pre=c_pre, main=c_main, post=c_post, exp2_fraction_compiled=main.exp2_fraction_compiled,
                tile_m=main.tile_m, tile_n=main.tile_n)


def compile_backward(config: AttnConfig | None, dtype_name: str, hdim: int, causal: bool,
                     dq_via_smem: bool = DQ_VIA_SMEM_DEFAULT):
    """Compile the three backward kernels for symbolic shapes (CUTE_DSL_ARCH=sm_90a on a CPU host)."""
    cfg = (config or AttnConfig()).resolve(ARCH, hdim, causal)
    _check_supported(cfg, hdim, hdim)
    key = cache_key("bwd_fake", cfg, dtype_name, hdim, hdim, causal, ARCH, dq_via_smem=dq_via_smem)
    return get_or_compile(key, lambda: _build(cfg, dtype_name, hdim, causal, dq_via_smem=dq_via_smem))


def _to_cute(t, leading_dim: int, align: int = 16):
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t.detach(), assumed_align=align).mark_layout_dynamic(leading_dim=leading_dim)


def attention_backward(q, k, v, out, dout, lse, causal, softmax_scale, config, _dq_via_smem: bool | None = None):
    """Gradients (dq, dk, dv) of softmax(q k^T * scale [causal, bottom-right]) v with our sm90 kernels.

    ``_dq_via_smem`` (internal, for A/B tests; None = DQ_VIA_SMEM_DEFAULT): True makes the one-CTA kernel
    reduce dQ through shared memory and cp.reduce.async.bulk from a writer warp instead of red.global.add.
    """
    if _dq_via_smem is None:
        _dq_via_smem = DQ_VIA_SMEM_DEFAULT
    import torch
    import cuda.bindings.driver as cuda

    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
        if not t.is_cuda or t.dtype not in (torch.bfloat16, torch.float16) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D (batch, seqlen, heads, head_dim) bf16/fp16 CUDA tensor, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (q.shape[0], q.shape[2], q.shape[1]):
        raise ValueError(f"lse: expected fp32 (batch, heads, seqlen_q)={(q.shape[0], q.shape[2], q.shape[1])}, "
                         f"got {tuple(lse.shape)} {lse.dtype}")
    b, sq, h, d = q.shape
    sk = k.shape[1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    cfg = (config or AttnConfig()).resolve(ARCH, d, causal)
    _check_supported(cfg, d, v.shape[-1])
    dtype_name = str(q.dtype).replace("torch.", "")
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    lse = lse.contiguous()
    from .bwd import BWD_TILES

    tile_m, tile_n = BWD_TILES[d]
    sqp = (sq + tile_m - 1) // tile_m * tile_m
    n_m = sqp // tile_m * (2 if cfg.two_cta else 1)  # one dQ semaphore per (Q tile, CTA of the cluster)
    dev = q.device
    lse2 = torch.empty(b, h, sqp, device=dev, dtype=torch.float32)
    dpsum = torch.empty(b, h, sqp, device=dev, dtype=torch.float32)
    dqacc = torch.empty(b, h, sqp, d, device=dev, dtype=torch.float32)
    sem = torch.zeros(b, h, n_m, device=dev, dtype=torch.int32) if cfg.deterministic else \
        torch.empty(b, h, n_m, device=dev, dtype=torch.int32)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    cargs = [_to_cute(t, 3) for t in (q, k, v, out, dout)] + [_to_cute(lse, 2, 4), _to_cute(lse2, 2), _to_cute(dpsum, 2),
                                                              _to_cute(dqacc, 3), _to_cute(dq, 3), _to_cute(dk, 3),
                                                              _to_cute(dv, 3), _to_cute(sem, 2, 4)]
    key = cache_key("bwd", cfg, dtype_name, d, d, causal, ARCH, dq_via_smem=_dq_via_smem)
    kern = get_or_compile(key, lambda: _build(cfg, dtype_name, d, causal, fake=False, args=cargs + [stream],
                                              dq_via_smem=_dq_via_smem))
    import cutlass

    scale = cutlass.Float32(softmax_scale)
    q_, k_, v_, o_, do_, lse_, lse2_, dpsum_, dqacc_, dq_, dk_, dv_, sem_ = cargs
    kern["pre"](o_, do_, lse_, dpsum_, lse2_, dqacc_, stream)
    kern["main"](q_, k_, v_, do_, lse2_, dpsum_, dqacc_, dk_, dv_, sem_, scale, stream)
    kern["post"](dqacc_, dq_, scale, stream)
    return dq, dk, dv
