"""Torch-facing launcher of the sm90 backward: preprocess -> main kernel -> postprocess, compiled once per key.

``attention_backward(q, k, v, out, dout, lse, causal, softmax_scale, config) -> (dq, dk, dv)``; tensors are
(batch, seqlen, heads, head_dim) bf16/fp16 CUDA tensors (v, out, dout and dv with head_dim_v), lse is
(batch, heads, seqlen_q) fp32 natural log. (head_dim, head_dim_v): (64, 64) and (128, 128) run FlashBwdSm90
(bwd.py), (256, 256) and (192, 128) FlashBwdWideSm90 (bwd_wide.py; hd256 with two_cta: FlashBwdWideTwoCtaSm90,
bwd_wide_two_cta.py).
``compile_backward(...)`` builds the three kernels from fake tensors (no GPU needed) for tests / SASS checks.

GQA / MQA (k, v with h_kv heads dividing q's h; group g = h / h_kv, a compile-time constant of the main kernel and part
of the cache key, absent from the key at g = 1 so the MHA kernels are the same objects): the preprocess (dPsum, LSE)
and the dQ postprocess run per Q head as before; the main kernel's CTA for Q head i loads K/V head i // g (no repeated
K/V in memory) and writes its dK / dV per Q head into a (b, s_k, h, d) scratch in the input dtype; one torch.sum over
each group's g heads (fp32 accumulation inside the reduction, one rounding at the end, a fixed order: deterministic)
gives (b, s_k, h_kv, d). The rounding of each per-head dK / dV to the input dtype before the sum is what the
repeat_interleave path (autograd summing the repeated heads' gradients) does too. (An fp32 bulk reduce-add epilogue,
FA3's choice, would save the scratch and the rounding; not done.)

Sliding window and softcap (``window_left`` / ``window_right`` / ``softcap``, canonical as kernels.validate.canonical_window
gives them; compile-time constants of the main kernel, in the cache key only when used, so the plain keys and kernels
are those of before): the main kernel visits only the Q tiles a K/V tile's keys are visible to, masks the tiles that
cross a bound, and applies the softcap's chain rule (bwd.py). two_cta=True does not support them (a ConfigError);
two_cta=None (the default) runs 2-CTA where the defaults table says so (hd256) only when the call has neither, and
never varlen (backward_config, kernels.config.two_cta_by_default).

``det_schedule="rotate"`` (deterministic; the default but at hd64 non-causal, which runs "lpt": AttnConfig.resolve)
runs where det_schedule_for_call says, else the "spt" kernel.

``bwd_pdl=True`` (opt-in; FlashBwdSm90 at hd 64 / 128, not varlen): the three kernels are launched with programmatic
dependent launch (the programmaticStreamSerialization attribute): the main kernel's CTAs start -- shared memory and
barrier setup, the K / V / first Q loads -- while the preprocess's last CTAs still run, and the postprocess launches
while the main kernel's last CTAs run; each waits (griddepcontrol.wait) before it touches what the previous one wrote.
Where each kernel signals and waits, and why that is enough: kernels/sm90/bwd.py FlashBwdSm90._set_pdl. The GQA sums
after the postprocess are ordinary launches. (The forward's single kernel could do the same against whatever kernel
precedes it in the stream -- barrier init, descriptor prefetch before a griddepcontrol.wait ahead of its first Q / K /
V load -- but gains only where that kernel signals launch_dependents early; not done.)
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

import torch

from ..compile_cache import cache_key, feature_extra, get_or_compile, gqa_extra
from ..config import AttnConfig, ConfigError, resolve_cached, two_cta_by_default, two_cta_n80_by_default
from ..validate import check_gqa_heads

ARCH = "sm90"
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _cutlass_dtype(dtype_name: str):
    import cutlass

    return {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}[dtype_name]


@functools.lru_cache(maxsize=256)
def _check_supported(cfg: AttnConfig, hdim: int, hdim_v: int, features: bool = False, softcap: bool = False) -> None:
    """ConfigError unless the backward compiles (head dims, switches) for a resolved config; memoised (per call).
    ``features``: a sliding window or softcap is used; ``softcap``: a softcap is."""
    from .bwd import BWD_TILES
    from .bwd_wide import WIDE_BWD_TILES
    from .bwd_wide_two_cta import TWO_CTA_WIDE_HDIMS

    supported = sorted({(d, d) for d in BWD_TILES} | set(WIDE_BWD_TILES))
    if (hdim, hdim_v) not in supported:
        raise ConfigError(f"(head_dim, head_dim_v)=({hdim}, {hdim_v}): the sm90 backward supports (head_dim, "
                          f"head_dim_v) in {supported}")
    if (hdim, hdim_v) in WIDE_BWD_TILES:
        tm = WIDE_BWD_TILES[(hdim, hdim_v)][0]
        if cfg.two_cta is True and (hdim, hdim_v) not in TWO_CTA_WIDE_HDIMS:
            raise ConfigError(f"two_cta=True at hdim {hdim} (head_dim_v {hdim_v}): the sm90 wide backward has a 2-CTA "
                              f"mode at (head_dim, head_dim_v) in {list(TWO_CTA_WIDE_HDIMS)} only (kernels/sm90/"
                              "bwd_wide_two_cta.py); use two_cta=False")
        if cfg.bwd_tile_m != tm:
            raise ConfigError(f"bwd_tile_m={cfg.bwd_tile_m} at hdim {hdim}: the sm90 backward supports {tm} there "
                              "(64 x 64 tiles, the warpgroups split the head dim)")
    if cfg.bwd_two_cta_n80 and ((hdim, hdim_v) != (256, 256) or cfg.two_cta is not True or features):
        raise ConfigError(f"bwd_two_cta_n80=True at (head_dim, head_dim_v)=({hdim}, {hdim_v}), two_cta={cfg.two_cta}, "
                          f"window/softcap={bool(features)}: the 80-row K/V tile backward exists at hdim 256 with "
                          "two_cta, without window or softcap (kernels/sm90/bwd_wide_two_cta80.py)")
    if cfg.bwd_two_cta_n80 and cfg.bwd_rotate_q:
        raise ConfigError("bwd_two_cta_n80=True with bwd_rotate_q=True: the 80-row K/V tile backward walks its Q tiles "
                          "in order; pass bwd_two_cta_n80=False for the rotated walks")
    if features and cfg.two_cta is True:
        raise ConfigError("two_cta=True with window_size/softcap: the sm90 backward's 2-CTA mode does not support a "
                          "sliding window or softcap; use two_cta=False")
    if cfg.bwd_tile_m == 80 and (hdim != 128 or cfg.two_cta is True):
        raise ConfigError(f"bwd_tile_m=80 at hdim {hdim}, two_cta={cfg.two_cta}: 80-row Q tiles (dQ^T = K^T dS^T per "
                          "warpgroup) exist only at hdim 128 without two_cta; use 64 or 128")
    if cfg.bwd_tile_m == 80 and softcap:
        raise ConfigError("bwd_tile_m=80 with softcap: the 80-row backward spills with a softcap (41-54 LDL/STL in the "
                          "SASS, serialised wgmma); use bwd_tile_m=64 (a sliding window alone works with 80)")
    if hdim == 128 and cfg.bwd_tile_m == 128:
        raise ConfigError("bwd_tile_m=128 at hdim 128: S, dP, dK and dV accumulators would need 256 registers per "
                          "thread (124 spills in the SASS); use 64")


def backward_config(cfg: AttnConfig, softcap: bool = False, varlen: bool = False, hdim: int | None = None,
                    hdim_v: int | None = None, features: bool = False) -> AttnConfig:
    """The config the backward runs for a resolved ``cfg`` at (hdim, hdim_v): ``two_cta=None`` replaced by the per-call
    decision (kernels.config.two_cta_by_default: on at hd256 without a window (``features``), softcap or varlen; a
    forced value stays), so that checks, kernel choice and cache keys see a bool; 80-row Q tiles (hd128's default) have
    no softcap or variable-length kernel, so those calls take 64-row tiles (an explicit ``bwd_tile_m=80`` too);
    ``bwd_two_cta_n80=None`` becomes True on hd256 2-CTA calls that are not bwd_rotate_q (80-row K/V tiles,
    DEFAULTS). ``hdim`` None: the config's bwd_tile_m is looked at only, two_cta None read as False."""
    updates = {}
    if cfg.two_cta is None:
        updates["two_cta"] = hdim is not None and two_cta_by_default(cfg, ARCH, hdim, hdim_v, features or softcap,
                                                                     varlen)
    if cfg.bwd_tile_m == 80 and (softcap or varlen):
        updates["bwd_tile_m"] = 64
    if (cfg.bwd_two_cta_n80 is None and hdim is not None
            and two_cta_n80_by_default(cfg, ARCH, hdim, hdim_v, updates.get("two_cta", cfg.two_cta) is True,
                                       features or softcap or varlen)):
        updates["bwd_two_cta_n80"] = True  # 80-row K/V tiles (DEFAULTS: faster, deterministic too)
    return dataclasses.replace(cfg, **updates) if updates else cfg


def det_schedule_for_call(cfg: AttnConfig, causal: bool, hdim: int, hdim_v: int, features: bool = False,
                          varlen: bool = False, seqlen_k: int | None = None, sm_count: int | None = None) -> AttnConfig:
    """``det_schedule="rotate"`` where the backward has it, else ``"spt"`` (the same kernel and cache key as spt's): the
    rotation runs deterministic, non-causal, one-CTA ((64, 64), (128, 128), (192, 128), (256, 256)) or at hd256 in
    2-CTA pairs, without a window, softcap or varlen, and -- given ``seqlen_k`` and ``sm_count`` -- only while a head's
    K/V tiles (CTAs) fit one per SM (2-CTA: half the SMs). Its dQ
    turns make a CTA wait for CTAs of its head launched after it (K/V tile n - 1 reaches tile n's first Q tile after n
    does), so all of a head's CTAs must be resident at once (tests/test_det_schedule.py: with fewer slots than K/V tiles
    the rotated order can deadlock, K/V tile order cannot). ``cfg``: after backward_config (two_cta a bool).
    ``det_schedule="lpt"`` (hd64 non-causal's default; else opt-in): deterministic one-CTA FlashBwdSm90 calls ((64, 64), (128, 128); causal or not; no
    window, softcap or varlen) keep it at every length (longest K/V tile first, g heads interleaved, causal Q-tile walks
    descending, K/V tile order turns: a CTA waits only for CTAs launched before it, bwd.py _set_det_lpt); every other
    call follows "rotate"'s rules."""
    if cfg.det_schedule not in ("rotate", "lpt"):
        return cfg
    from .bwd import BWD_TILES
    from .bwd_wide192 import WIDE192_BWD_TILES

    if cfg.det_schedule == "lpt":
        if (cfg.deterministic and not features and not varlen and cfg.two_cta is not True
                and hdim == hdim_v and hdim in BWD_TILES):
            return cfg
        cfg = dataclasses.replace(cfg, det_schedule="rotate")

    from .bwd_wide import WIDE_BWD_TILES

    tiles = {(d, d): t for d, t in BWD_TILES.items()} | dict(WIDE192_BWD_TILES)
    tiles[(256, 256)] = WIDE_BWD_TILES[(256, 256)]
    if cfg.bwd_two_cta_n80:  # 80-row K/V tiles per CTA (bwd_wide_two_cta80.py)
        from .bwd_wide_two_cta80 import TILE_N80

        tiles[(256, 256)] = (tiles[(256, 256)][0], TILE_N80)
    wide256 = (hdim, hdim_v) == (256, 256)  # one CTA or 2-CTA pairs (bwd_wide.py / bwd_wide_two_cta.py)
    rotate = (cfg.deterministic and not causal and not features and not varlen
              and (cfg.two_cta is not True or wide256) and (hdim, hdim_v) in tiles)
    if rotate and seqlen_k is not None and sm_count is not None:
        # 2-CTA pairs: at most half the SMs' worth of CTAs, so that the head's clusters are resident at once however
        # the GPU places 2-CTA clusters. 80-row pairs (H200, session_ab/bwd256_n80_det.jsonl), det / default rotated
        # at 1k / 2k / 4k (13 / 26 / 52 CTAs a head) 0.976 / 0.974 / 0.944, in K/V order 0.894 / 0.906 / 0.940; from
        # 8k (103 CTAs a head) this rule runs K/V order (0.947-0.953; rotated there was not timed)
        slots = sm_count // 2 if cfg.two_cta is True else sm_count
        rotate = -(-int(seqlen_k) // tiles[(hdim, hdim_v)][1]) <= slots
    return cfg if rotate else dataclasses.replace(cfg, det_schedule="spt")


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _main_kernel(dt, cfg: AttnConfig, hdim: int, hdim_v: int, causal: bool, qhead_per_kvhead: int = 1,
                 features: dict | None = None, varlen: bool = False):
    """FlashBwdSm90 (hdim 64 / 128), FlashBwd192Sm90 ((192, 128): 64 x 128 tiles) or FlashBwdWideSm90 (hdim 256,
    (192, 128) with a softcap) for a checked config; ``features``: window_left / window_right / softcap keyword arguments
    (only the non-default ones)."""
    from .bwd import FlashBwdSm90
    from .bwd_wide import WIDE_BWD_TILES, FlashBwdWideSm90
    from .bwd_wide192 import WIDE192_BWD_TILES, FlashBwd192Sm90

    cls = FlashBwdWideSm90 if (hdim, hdim_v) in WIDE_BWD_TILES else FlashBwdSm90
    if cls is FlashBwdWideSm90 and cfg.two_cta is True:  # hd256 in 2-CTA clusters
        from .bwd_wide_two_cta import FlashBwdWideTwoCtaSm90 as cls
        if cfg.bwd_two_cta_n80:  # 80-row K/V tiles (backward_config's 2-CTA default; _check_supported)
            from .bwd_wide_two_cta80 import FlashBwdWide80TwoCtaSm90 as cls
    kw = dict(hdim_v=hdim_v) if issubclass(cls, FlashBwdWideSm90) else {}
    if (hdim, hdim_v) in WIDE192_BWD_TILES and not (features or {}).get("softcap"):
        # (192, 128): 64 x 128 tiles, dK / dV split by K/V rows (bwd_wide192.py); a softcap stays on FlashBwdWideSm90
        cls, kw = FlashBwd192Sm90, dict(hdim_v=hdim_v)
    if qhead_per_kvhead != 1:
        kw["qhead_per_kvhead"] = qhead_per_kvhead
    if cls is FlashBwdSm90 and cfg.bwd_lpt_heads:  # causal grid longest first (opt-in; the kernel ignores it elsewhere)
        kw["lpt_heads"] = cfg.bwd_lpt_heads
    if cfg.bwd_rotate_q and (cls is FlashBwdSm90 or (issubclass(cls, FlashBwdWideSm90) and hdim == 256)):
        kw["rotate_q"] = True  # hd128 / hd256 non-causal rotated Q-tile walks (opt-in; hd64's default)
    if cls is FlashBwdSm90 and cfg.bwd_pdl and not varlen:  # programmatic dependent launch (opt-in; _build's launches)
        kw["pdl"] = True
    if cls is FlashBwdSm90 and cfg.bwd_persistent and not varlen:  # persistent grid (opt-in; bwd.py _set_persistent)
        kw["persistent"] = True
    if cls is FlashBwdSm90 and cfg.bwd_dq_chunk_release:  # dQ staging chunks freed one by one (opt-in; dq_writer)
        kw["dq_chunk_release"] = True
    if cls is FlashBwdSm90 and cfg.bwd_two_cta_cta_release is not False:  # two_cta: dS hand-back without MEMBAR.GPU
        kw["ds_cta_release"] = True  # (the default since 2026-12-02; False = the cluster-scope release; no-op off two_cta)
    if cls is FlashBwdSm90 and cfg.bwd_two_cta_dv_first:  # two_cta hd128: dV before the dS exchange (opt-in)
        kw["two_cta_dv_first"] = True
    # causal 80-row tiles from the diagonal (_set_diag_align): deterministic kernels by their own switch
    if cls is FlashBwdSm90 and (cfg.bwd_det_diag_align if cfg.deterministic else cfg.bwd_diag_align):
        kw["diag_align"] = True
        if cfg.bwd_q_tail:  # the last tile over its rows below seqlen_q (bwd.py _set_q_tail says where it applies)
            kw["q_tail"] = True
    if cls is FlashBwdSm90 and cfg.bwd_stream_post:  # dQ counted per row unit, streaming postprocess (opt-in)
        kw["stream_post"] = True  # (bwd.py _set_stream_post says where it applies)
    if cls is FlashBwdSm90 and cfg.bwd_dq_claim:  # first writer per dQ unit stores; no dQaccum zeroing (opt-in)
        kw["dq_claim"] = True  # (bwd.py _set_dq_claim says where it applies)
    if cls is FlashBwdSm90 and cfg.bwd_dq_stages is not None:  # dQ staging buffers (opt-in; bwd.py _set_dq_stages)
        kw["dq_stages"] = cfg.bwd_dq_stages
    if cls in (FlashBwdSm90, FlashBwd192Sm90) and cfg.bwd_det_two_writers:  # deterministic: two dQ writer warps
        kw["det_two_writers"] = True  # (bwd.py dq_writer_pair; DEFAULTS: (192, 128), hd128)
    kw.update(features or {})
    if varlen:
        kw["varlen"] = True
    return cls(dt, hdim, causal, deterministic=cfg.deterministic, two_cta=bool(cfg.two_cta),
               exp2_emu_fraction=cfg.exp2_emu_fraction, det_schedule=cfg.det_schedule, tile_m=cfg.bwd_tile_m, **kw)


def _post_layout(main) -> dict:
    """The postprocess's view of the main kernel's tile-blocked dQaccum: chunks per Q tile and their dQ (or dQ^T)
    fragment shape. two_cta: 4 chunks of dQ^T (64 head-dim rows x dq_n Q rows), 2 per CTA of the pair."""
    if hasattr(main, "post_layout"):  # hd256 two_cta: the one-CTA hd256 layout (bwd_wide_two_cta.py)
        return main.post_layout()
    if main.two_cta:
        return dict(chunks=main.cluster * main.num_mma_wg, transposed=True, dq_shape=(64, main.dq_n))
    if main.diag_align:  # chunk-major dQaccum (bwd.py _set_diag_align)
        return dict(chunks=main.num_mma_wg * main.dq_pieces, transposed=main.dq_transposed, chunk_major=True)
    return dict(chunks=main.num_mma_wg * main.dq_pieces, transposed=main.dq_transposed)


def _features(window_left: int, window_right: int, softcap: float) -> dict:
    """The main kernel's window / softcap keyword arguments, only the non-default ones."""
    out = {}
    if window_left != -1:
        out["window_left"] = int(window_left)
    if window_right != -1:
        out["window_right"] = int(window_right)
    if softcap != 0.0:
        out["softcap"] = float(softcap)
    return out


def _build(cfg: AttnConfig, dtype_name: str, hdim: int, causal: bool, tvm_ffi: bool = False,
           hdim_v: int | None = None, qhead_per_kvhead: int = 1, features: dict | None = None):
    """Compile (pre, main, post) for one key from symbolic-shape fake tensors (no GPU needed).

    With ``tvm_ffi`` (the GPU path) the compiled functions take torch tensors and run on the current CUDA
    stream, so a call costs a few microseconds of host time instead of a DLPack conversion per tensor.
    """
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    from .bwd_post import FlashBwdPostSm90
    from .bwd_pre import FlashBwdPreSm90

    hdim_v = hdim if hdim_v is None else hdim_v
    dt = _cutlass_dtype(dtype_name)
    main = _main_kernel(dt, cfg, hdim, hdim_v, causal, qhead_per_kvhead, features)
    # AttnConfig's tile_m/tile_n and register fields describe the forward; the backward's are bwd_tile_m x
    # tile_n (128 at hdim 64 / 128, 64 at the wide head dims), 24/240.
    # bwd_pdl: all three launched with programmatic dependent launch (main.pdl: where the main kernel has it)
    # bwd_dq_claim: no dQaccum zeroing (the main kernel's first writer per unit, or deterministic turn 0, stores)
    no_zero = getattr(main, "dq_claim", False) or getattr(main, "dq_turn0_store", False)
    pre = FlashBwdPreSm90(dt, hdim, main.tile_m, hdim_v=hdim_v, pdl=main.pdl, claim=no_zero)
    stream_kw = dict(stream=True, unit_rows=main.sem_rows, causal=causal, tile_n=main.tile_n) \
        if getattr(main, "stream_post", False) else {}
    post = FlashBwdPostSm90(dt, hdim, main.tile_m, blocked=main.dq_smem, pdl=main.pdl, **_post_layout(main),
                            **stream_kw)
    B, SQ, SK, H = (cute.sym_int32(symbol=s) for s in ("B", "SQ", "SK", "H"))
    HKV = H if qhead_per_kvhead == 1 else cute.sym_int32(symbol="HKV")  # GQA: K/V heads apart from Q's
    # padded seqlen_q: a multiple of tile_m (attention_backward pads to it); 80-row tiles promise 16
    SQP = cute.sym_int32(divisibility=64 if main.tile_m % 64 == 0 else 16, symbol="SQP")
    qkv = lambda s, d=hdim, h=H: make_fake_compact_tensor(dt, (B, s, h, d), stride_order=(3, 2, 1, 0), assumed_align=16)
    f32 = lambda shape: make_fake_compact_tensor(cutlass.Float32, shape, stride_order=tuple(range(len(shape) - 1, -1, -1)),
                                                  assumed_align=16)
    q, o, do, dq = qkv(SQ), qkv(SQ, hdim_v), qkv(SQ, hdim_v), qkv(SQ)
    k, v = qkv(SK, h=HKV), qkv(SK, hdim_v, h=HKV)
    dk, dv = qkv(SK), qkv(SK, hdim_v)  # per Q head (GQA: the scratch the host sums over each group)
    lse = make_fake_compact_tensor(cutlass.Float32, (B, H, SQ), stride_order=(2, 1, 0), assumed_align=4)
    lse2, dpsum = f32((B, H, SQP)), f32((B, H, SQP))
    dqacc = f32((B, H, SQP, hdim))
    sem = make_fake_compact_tensor(cutlass.Int32, (B, H, cute.sym_int32(symbol="NM")), stride_order=(2, 1, 0),
                                   assumed_align=4)
    stream = make_fake_stream(use_tvm_ffi_env_stream=tvm_ffi)
    opts = "--enable-tvm-ffi" if tvm_ffi else ""
    scale = cutlass.Float32(1.0)
    if main.stream_pre:  # bwd_stream_post: the preprocess zeroes the counters, the postprocess streams (bwd_post.py)
        c_pre = cute.compile(pre.call_stream, o, do, lse, dpsum, lse2, dqacc, sem, main.sem_rows, stream, options=opts)
    else:
        c_pre = cute.compile(pre, o, do, lse, dpsum, lse2, dqacc, stream, options=opts)
    if main.persistent:  # grid (num_ctas,): the caller passes min(SM count, K/V tiles x heads x batch)
        c_main = cute.compile(main.call_persistent, q, k, v, do, lse2, dpsum, dqacc, dk, dv, sem, scale,
                              cutlass.Int32(1), stream, options=opts)
    else:
        c_main = cute.compile(main, q, k, v, do, lse2, dpsum, dqacc, dk, dv, sem, scale, stream, options=opts)
    if stream_kw:
        c_post = cute.compile(post.call_stream, dqacc, dq, sem, cutlass.Int32(1), scale, stream, options=opts)
    else:
        c_post = cute.compile(post, dqacc, dq, scale, stream, options=opts)
    # q_pad_rows: Q rows padded beyond a multiple of tile_m (diag_align: one more tile, r0 + 80 k <= seqlen_q + 79)
    return dict(pre=c_pre, main=c_main, post=c_post, exp2_fraction_compiled=main.exp2_fraction_compiled,
                tile_m=main.tile_m, tile_n=main.tile_n, q_pad_rows=main.tile_m if main.diag_align else 0,
                persistent=main.persistent, sem_rows=main.sem_rows, stream_post=bool(stream_kw),
                stream_pre=main.stream_pre, dq_claim=getattr(main, "dq_claim", False))


def compile_backward(config: AttnConfig | None, dtype_name: str, hdim: int, causal: bool, hdim_v: int | None = None,
                     qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1, softcap: float = 0.0):
    """Compile the three backward kernels for symbolic shapes (CUTE_DSL_ARCH=sm_90a on a CPU host).
    ``qhead_per_kvhead``: the GQA group size (1 = MHA, the same key and kernels as without the argument).
    ``window_left`` / ``window_right`` / ``softcap``: sliding window and softcap (canonicalised here as the forward's:
    kernels.validate.canonical_window; the defaults give the plain key and kernels)."""
    hdim_v = hdim if hdim_v is None else hdim_v
    causal, window_left, window_right, softcap = _canonical(causal, window_left, window_right, softcap)
    feats = _features(window_left, window_right, softcap)
    cfg = backward_config((config or AttnConfig()).resolve(ARCH, hdim, causal), softcap != 0.0, hdim=hdim,
                          hdim_v=hdim_v, features=bool(feats))
    cfg = det_schedule_for_call(cfg, causal, hdim, hdim_v, bool(feats))
    _check_supported(cfg, hdim, hdim_v, bool(feats), softcap != 0.0)
    key = cache_key("bwd_fake", cfg, dtype_name, hdim, hdim_v, causal, ARCH, **gqa_extra(qhead_per_kvhead),
                    **feature_extra(window_left, window_right, softcap))
    return get_or_compile(key, lambda: _build(cfg, dtype_name, hdim, causal, hdim_v=hdim_v,
                                              qhead_per_kvhead=qhead_per_kvhead, features=feats))


def check_varlen_supported(cfg: AttnConfig, hdim: int, hdim_v: int) -> None:
    """ConfigError unless the varlen backward exists for a resolved config (on top of _check_supported): head dims
    64 / 128 (FlashBwdSm90), 64- or 128-row Q tiles (80 runs as 64: backward_config), no two_cta."""
    from .bwd import BWD_TILES

    cfg = backward_config(cfg, varlen=True, hdim=hdim, hdim_v=hdim_v)

    if hdim not in BWD_TILES or hdim_v != hdim:
        raise ConfigError(f"(head_dim, head_dim_v)=({hdim}, {hdim_v}) with varlen: the sm90 variable-length backward "
                          f"supports head dims {sorted(BWD_TILES)} (hdim_v == hdim; the wide kernels of hd 256 / "
                          "(192, 128) have no varlen mode)")
    if cfg.two_cta is True:
        raise ConfigError("two_cta=True with varlen: the sm90 variable-length backward has no 2-CTA mode; use "
                          "two_cta=False")
    if cfg.bwd_tile_m not in (64, 128):
        raise ConfigError(f"bwd_tile_m={cfg.bwd_tile_m} with varlen: the sm90 variable-length backward supports 64 or "
                          "128-row Q tiles")


def varlen_total_q_pad(total_q: int, batch: int, tile_m: int) -> int:
    """Rows of the varlen backward's padded LSE / dPsum / dQaccum buffers: (total_q + batch * tile_m) rounded up to
    tile_m, so every sequence's Q tiles get whole slots of their own (kernels/sm90/bwd_pre.py varlen_pad_offset)."""
    return (total_q + batch * tile_m + tile_m - 1) // tile_m * tile_m


def _build_varlen(cfg: AttnConfig, dtype_name: str, hdim: int, causal: bool, tvm_ffi: bool = False,
                  qhead_per_kvhead: int = 1, features: dict | None = None, dump_dir: str | None = None):
    """Compile the varlen (pre, main, post) kernels from symbolic-shape fake tensors (no GPU needed): packed q / k / v /
    out / dout / dq / dk / dv (total, heads, head_dim), lse (h, total_q), padded lse2 / dpsum (h, total_q_pad), dqacc
    (h, total_q_pad, d), semaphores (h, total_q_pad / tile_m), cu_seqlens int32 (b + 1,). ``dump_dir``: keep PTX and
    cubins there."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    from .bwd_post import FlashBwdPostSm90
    from .bwd_pre import FlashBwdPreSm90

    dt = _cutlass_dtype(dtype_name)
    main = _main_kernel(dt, cfg, hdim, hdim, causal, qhead_per_kvhead, features, varlen=True)
    pre = FlashBwdPreSm90(dt, hdim, main.tile_m, hdim_v=hdim, varlen=True)
    post = FlashBwdPostSm90(dt, hdim, main.tile_m, blocked=True, chunks=main.num_mma_wg * main.dq_pieces,
                            transposed=main.dq_transposed, varlen=True)
    TQ, TK, H, B1, NM = (cute.sym_int32(symbol=s) for s in ("TQ", "TK", "H", "B1", "NM"))
    HKV = H if qhead_per_kvhead == 1 else cute.sym_int32(symbol="HKV")
    TQP = cute.sym_int32(divisibility=64, symbol="TQP")  # a multiple of tile_m (64 or 128)
    packed = lambda t, h=H: make_fake_compact_tensor(dt, (t, h, hdim), stride_order=(2, 1, 0), assumed_align=16)
    q, o, do, dq, k, v, dk, dv = packed(TQ), packed(TQ), packed(TQ), packed(TQ), packed(TK, HKV), packed(TK, HKV), \
        packed(TK), packed(TK)
    lse = make_fake_compact_tensor(cutlass.Float32, (H, TQ), stride_order=(1, 0), assumed_align=4)
    lse2, dpsum = (make_fake_compact_tensor(cutlass.Float32, (H, TQP), stride_order=(1, 0), assumed_align=16)
                   for _ in range(2))
    dqacc = make_fake_compact_tensor(cutlass.Float32, (H, TQP, hdim), stride_order=(2, 1, 0), assumed_align=16)
    sem = make_fake_compact_tensor(cutlass.Int32, (H, NM), stride_order=(1, 0), assumed_align=4)
    cu_q, cu_k = (make_fake_compact_tensor(cutlass.Int32, (B1,), stride_order=(0,), assumed_align=4) for _ in range(2))
    stream = make_fake_stream(use_tvm_ffi_env_stream=tvm_ffi)
    opts = "--enable-tvm-ffi" if tvm_ffi else ""
    if dump_dir is not None:
        import os

        os.makedirs(dump_dir, exist_ok=True)
        opts += f" --keep-ptx --keep-cubin --dump-dir={dump_dir}"
    one, scale = cutlass.Int32(1), cutlass.Float32(1.0)
    c_pre = cute.compile(pre.call_varlen, o, do, lse, dpsum, lse2, dqacc, cu_q, one, stream, options=opts)
    c_main = cute.compile(main.call_varlen, q, k, v, do, lse2, dpsum, dqacc, dk, dv, sem, cu_q, cu_k, one, scale,
                          stream, options=opts)
    c_post = cute.compile(post.call_varlen, dqacc, dq, cu_q, one, scale, stream, options=opts)
    return dict(pre=c_pre, main=c_main, post=c_post, exp2_fraction_compiled=main.exp2_fraction_compiled,
                tile_m=main.tile_m, tile_n=main.tile_n)


def _varlen_key(kind: str, cfg: AttnConfig, dtype_name: str, hdim: int, causal: bool, group: int, window_left: int,
                window_right: int, softcap: float, **extra) -> tuple:
    return cache_key(kind, cfg, dtype_name, hdim, hdim, causal, ARCH, varlen=True, **gqa_extra(group),
                     **feature_extra(window_left, window_right, softcap), **extra)


def compile_backward_varlen(config: AttnConfig | None, dtype_name: str, hdim: int, causal: bool,
                            qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1,
                            softcap: float = 0.0, dump_dir: str | None = None):
    """Compile the three varlen backward kernels for symbolic shapes (CUTE_DSL_ARCH=sm_90a on a CPU host); with
    ``dump_dir`` uncached, keeping PTX / cubins there (for SASS checks)."""
    causal, window_left, window_right, softcap = _canonical(causal, window_left, window_right, softcap)
    feats = _features(window_left, window_right, softcap)
    cfg = backward_config((config or AttnConfig()).resolve(ARCH, hdim, causal), softcap != 0.0, varlen=True,
                          hdim=hdim, hdim_v=hdim, features=bool(feats))
    cfg = det_schedule_for_call(cfg, causal, hdim, hdim, varlen=True)
    _check_supported(cfg, hdim, hdim, bool(feats), softcap != 0.0)
    check_varlen_supported(cfg, hdim, hdim)
    build = lambda: _build_varlen(cfg, dtype_name, hdim, causal, qhead_per_kvhead=qhead_per_kvhead, features=feats,
                                  dump_dir=dump_dir)
    if dump_dir is not None:
        return build()
    return get_or_compile(_varlen_key("bwd_fake", cfg, dtype_name, hdim, causal, qhead_per_kvhead, window_left,
                                      window_right, softcap), build)


def attention_backward_varlen(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                              max_seqlen_k: int, causal: bool, softmax_scale: float, cfg: AttnConfig, dq=None, dk=None,
                              dv=None, window_left: int = -1, window_right: int = -1, softcap: float = 0.0):
    """Gradients (dq, dk, dv) of kernels.attention_varlen for packed q (total_q, h, d), k / v (total_k, h_kv, d), out /
    dout (total_q, h, d), lse (h, total_q) fp32 (natural log, the forward's), cu_seqlens int32 on q's device (checked
    by the caller), ``cfg`` a resolved AttnConfig. dq / dk / dv packed like q / k / v (may be preallocated, e.g.
    NaN-poisoned by a test). Scratch per call: padded LSE (log2) / dPsum (h, total_q_pad) and fp32 dQaccum (h,
    total_q_pad, d) where sequence b's Q tiles have slots from padded row varlen_pad_offset(cu_seqlens_q[b], b,
    tile_m); GQA: dK / dV per Q head (total_k, h, d) summed over each group as attention_backward does."""
    import torch

    total_q, h, d = q.shape
    total_k, h_kv = k.shape[0], k.shape[1]
    group = h // h_kv
    causal, window_left, window_right, softcap = _canonical(causal, window_left, window_right, softcap)
    feats = _features(window_left, window_right, softcap)
    cfg = backward_config(cfg, softcap != 0.0, varlen=True, hdim=d, hdim_v=v.shape[2], features=bool(feats))
    cfg = det_schedule_for_call(cfg, causal, d, v.shape[2], varlen=True)
    _check_supported(cfg, d, v.shape[2], bool(feats), softcap != 0.0)
    check_varlen_supported(cfg, d, v.shape[2])
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    lse = lse.contiguous()
    dq, dk, dv = (_grad_buffer(g, like, name) for g, like, name in ((dq, q, "dq"), (dk, k, "dk"), (dv, v, "dv")))
    if total_q == 0:  # no query rows: no gradient reaches K / V (a zero-size TMA box cannot be described)
        dk.zero_()
        dv.zero_()
        return dq, dk, dv
    if total_k == 0:  # no keys: every row's output is 0 whatever q is
        dq.zero_()
        return dq, dk, dv
    # max_seqlen_q == 0 (no Q rows in these sequences): no pre / post grid, the main kernel still writes dK = dV = 0;
    # max_seqlen_k == 0: no main grid, pre / post still write dQ = 0 (only the given sequences' rows are touched)
    run_q, run_k = max_seqlen_q > 0, max_seqlen_k > 0
    batch = cu_seqlens_q.shape[0] - 1
    tile_m = cfg.bwd_tile_m
    tqp = varlen_total_q_pad(total_q, batch, tile_m)
    dev = q.device
    lse2 = torch.empty(h, tqp, device=dev, dtype=torch.float32)
    dpsum = torch.empty(h, tqp, device=dev, dtype=torch.float32)
    dqacc = torch.empty(h, tqp, d, device=dev, dtype=torch.float32)
    sem = (torch.zeros if cfg.deterministic else torch.empty)(h, tqp // tile_m, device=dev, dtype=torch.int32)
    dtype_name = str(q.dtype).replace("torch.", "")
    key = _varlen_key("bwd", cfg, dtype_name, d, causal, group, window_left, window_right, softcap, tvm_ffi=True)
    kern = get_or_compile(key, lambda: _build_varlen(cfg, dtype_name, d, causal, tvm_ffi=True,
                                                     qhead_per_kvhead=group, features=feats))
    dk_h = dk if group == 1 else torch.empty(total_k, h, d, device=dev, dtype=k.dtype)
    dv_h = dv if group == 1 else torch.empty(total_k, h, d, device=dev, dtype=v.dtype)
    with torch.cuda.device(dev):
        if run_q:
            kern["pre"](out, dout, lse, dpsum, lse2, dqacc, cu_seqlens_q, int(max_seqlen_q))
        if run_k:
            kern["main"](q, k, v, dout, lse2, dpsum, dqacc, dk_h, dv_h, sem, cu_seqlens_q, cu_seqlens_k,
                         int(max_seqlen_k), float(softmax_scale))
        if run_q:
            kern["post"](dqacc, dq, cu_seqlens_q, int(max_seqlen_q), float(softmax_scale))
        if group > 1 and run_k:  # Q head i belongs to K/V head i // group
            torch.sum(dk_h.view(total_k, h_kv, group, d), dim=2, out=dk)
            torch.sum(dv_h.view(total_k, h_kv, group, d), dim=2, out=dv)
    return dq, dk, dv


def _canonical(causal, window_left: int, window_right: int, softcap: float):
    """(causal, window_left, window_right, softcap) canonical (validate.canonical_window / check_softcap): with causal
    the right bound is the diagonal (window_right -1); a non-causal right bound of 0 is causal."""
    from ..validate import canonical_window, check_softcap

    if window_left == -1 and window_right == -1 and softcap == 0.0:
        return bool(causal), -1, -1, 0.0
    causal, window_left, window_right = canonical_window(bool(causal), (window_left, window_right))
    return causal, window_left, window_right, check_softcap(softcap)


def _grad_buffer(g, like, name: str):
    """A preallocated gradient checked against the tensor it belongs to, or a fresh one."""
    import torch

    if g is None:
        return torch.empty_like(like)
    if g.shape != like.shape or g.dtype != like.dtype or g.device != like.device or not g.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous {tuple(like.shape)} {like.dtype} tensor on {like.device}, "
                         f"got {tuple(g.shape)} {g.dtype} on {g.device}")
    return g


@functools.lru_cache(maxsize=1024)
def _call_config(config: AttnConfig, dtype_name: str, d: int, dv_dim: int, causal: bool, group: int, window_left: int,
                 window_right: int, softcap: float, seqlen_k: int, sm_count: int) -> tuple[AttnConfig, tuple]:
    """(the config the backward runs, its compile cache key) for one call's canonical arguments, memoised: the
    per-call rules (backward_config, det_schedule_for_call, _check_supported: a ConfigError is raised, not cached) and
    the key cost ~130 us of host time per call uncached (dataclasses.replace validates every field). ``config``: an
    AttnConfig or None, resolved here (resolve_cached): code that edits DEFAULTS / TUNED at run time clears both
    caches."""
    feats = _features(window_left, window_right, softcap)
    cfg = backward_config(resolve_cached(config, ARCH, d, bool(causal)), softcap != 0.0, hdim=d, hdim_v=dv_dim,
                          features=bool(feats))
    if cfg.det_schedule in ("rotate", "lpt"):  # where the rotation / lpt run (rotate: a head's CTAs fit the SMs)
        cfg = det_schedule_for_call(cfg, causal, d, dv_dim, bool(feats), seqlen_k=seqlen_k, sm_count=sm_count)
    _check_supported(cfg, d, dv_dim, bool(feats), softcap != 0.0)
    key = cache_key("bwd", cfg, dtype_name, d, dv_dim, causal, ARCH, tvm_ffi=True, **gqa_extra(group),
                    **feature_extra(window_left, window_right, softcap))
    return cfg, key


def attention_backward(q, k, v, out, dout, lse, causal, softmax_scale, config, dq=None, dk=None, dv=None,
                       window_left: int = -1, window_right: int = -1, softcap: float = 0.0):
    """Gradients (dq, dk, dv) of softmax(q k^T * scale [causal, bottom-right]) v with our sm90 kernels; with a sliding
    window (``window_left`` / ``window_right``, -1 = unbounded) and / or ``softcap`` those of the forward that used
    them (scores softcap * tanh(q k^T * scale / softcap), keys outside the window masked).

    ``dq`` / ``dk`` / ``dv`` may be preallocated (contiguous, like q / k / v), e.g. NaN-poisoned by a test to
    prove the kernels write every element. k / v (and dk / dv) may have h_kv heads dividing q's h (GQA / MQA): see the
    module docstring.
    """
    check_backward_inputs(q, k, v, out, dout, lse)
    return backward_trusted(q, k, v, out, dout, lse, causal, softmax_scale, config, dq, dk, dv, window_left,
                            window_right, softcap)


def check_backward_inputs(q, k, v, out, dout, lse) -> None:
    """ValueError unless q / k / v / out / dout are 4-D bf16/fp16 CUDA tensors of matching shapes (k / v with a head
    count dividing q's) and lse is fp32 (batch, heads, seqlen_q)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
        if not t.is_cuda or t.dtype not in (torch.bfloat16, torch.float16) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D (batch, seqlen, heads, head_dim) bf16/fp16 CUDA tensor, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (q.shape[0], q.shape[2], q.shape[1]):
        raise ValueError(f"lse: expected fp32 (batch, heads, seqlen_q)={(q.shape[0], q.shape[2], q.shape[1])}, "
                         f"got {tuple(lse.shape)} {lse.dtype}")
    b, sq, h, d = q.shape
    sk, dv_dim = k.shape[1], v.shape[-1]
    h_kv = h // check_gqa_heads(h, k.shape[2], v.shape[2])
    for name, t, want in (("k", k, (b, sk, h_kv, d)), ("v", v, (b, sk, h_kv, dv_dim)), ("out", out, (b, sq, h, dv_dim)),
                          ("dout", dout, (b, sq, h, dv_dim))):
        if tuple(t.shape) != want:
            raise ValueError(f"{name}: expected shape {want} (q is {tuple(q.shape)}, v is {tuple(v.shape)}), "
                             f"got {tuple(t.shape)}")


def compiled_for_call(config, dtype_name: str, d: int, dv_dim: int, causal: bool, group: int, window_left: int,
                      window_right: int, softcap: float, seqlen_k: int, sm_count: int):
    """(the config the backward runs, its compile key, its compiled (pre, main, post) dict) for one call's canonical
    arguments (_call_config), compiled on first use (the C++ node, cpp_backward.py, only reads what this built)."""
    cfg, key = _call_config(config, dtype_name, d, dv_dim, causal, group, window_left, window_right, softcap, seqlen_k,
                            sm_count)
    kern = get_or_compile(key, lambda: _build(cfg, dtype_name, d, causal, tvm_ffi=True, hdim_v=dv_dim,
                                              qhead_per_kvhead=group,
                                              features=_features(window_left, window_right, softcap)))
    return cfg, key, kern


def sem_multiple(cfg: AttnConfig, kern: dict) -> int:
    """dQ semaphores per sem_rows Q rows: one per (Q tile, CTA of the cluster); deterministic diag_align: per
    sem_rows (8) Q rows (dq_claim: each unit's claim state after the counters, bwd.py _set_dq_claim)."""
    return 2 if cfg.two_cta is True or kern.get("dq_claim") else 1


def backward_trusted(q, k, v, out, dout, lse, causal, softmax_scale, config, dq=None, dk=None, dv=None,
                     window_left: int = -1, window_right: int = -1, softcap: float = 0.0):
    """``attention_backward`` without ``check_backward_inputs``: for callers whose tensors passed it already or come
    from our own forward (the eager autograd backward: q / k / v / out / lse saved by the forward, dout shaped and
    typed like out by autograd). Same arguments and results."""
    b, sq, h, d = q.shape
    sk, dv_dim = k.shape[1], v.shape[-1]
    group = h // k.shape[2]
    h_kv = h // group
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    if window_left != -1 or window_right != -1 or softcap != 0.0:
        causal, window_left, window_right, softcap = _canonical(causal, window_left, window_right, softcap)
    else:
        causal = bool(causal)
    dev = q.device
    index = dev.index
    current = torch.cuda.current_device()
    sms = _sm_count(current if index is None else index)
    dtype_name = _DTYPE_NAMES[q.dtype]
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and out.is_contiguous()
            and dout.is_contiguous() and lse.is_contiguous()):
        q, k, v, out, dout, lse = (t.contiguous() for t in (q, k, v, out, dout, lse))
    cfg, key, kern = compiled_for_call(config, dtype_name, d, dv_dim, causal, group, window_left, window_right,
                                       softcap, sk, sms)
    tile_m = cfg.bwd_tile_m
    sqp = (sq + tile_m - 1) // tile_m * tile_m + kern.get("q_pad_rows", 0)
    n_m = sqp // kern["sem_rows"] * sem_multiple(cfg, kern)
    lse2 = torch.empty(b, h, sqp, device=dev, dtype=torch.float32)
    dpsum = torch.empty(b, h, sqp, device=dev, dtype=torch.float32)
    dqacc = torch.empty(b, h, sqp, d, device=dev, dtype=torch.float32)
    sem = torch.zeros(b, h, n_m, device=dev, dtype=torch.int32) if cfg.deterministic else \
        torch.empty(b, h, n_m, device=dev, dtype=torch.int32)
    dq = torch.empty_like(q) if dq is None else _grad_buffer(dq, q, "dq")
    dk = torch.empty_like(k) if dk is None else _grad_buffer(dk, k, "dk")
    dv = torch.empty_like(v) if dv is None else _grad_buffer(dv, v, "dv")
    # GQA: the main kernel writes dK / dV per Q head into scratch, summed over each group below
    dk_h = dk if group == 1 else torch.empty(b, sk, h, d, device=dev, dtype=k.dtype)
    dv_h = dv if group == 1 else torch.empty(b, sk, h, dv_dim, device=dev, dtype=v.dtype)
    with contextlib.nullcontext() if index is None or index == current else torch.cuda.device(dev):
        # bwd_stream_post: the postprocess waits on the dQ completion counts, which the preprocess zeroes (deterministic:
        # the semaphores, zeroed above)
        pre_extra = (sem,) if kern.get("stream_pre") else ()
        post_extra = (sem, sk) if kern.get("stream_post") else ()
        kern["pre"](out, dout, lse, dpsum, lse2, dqacc, *pre_extra)
        if kern.get("persistent"):  # one CTA per SM at most, each walking K/V tiles (bwd.py _set_persistent)
            tiles = -(-sk // kern["tile_n"]) * h * b
            kern["main"](q, k, v, dout, lse2, dpsum, dqacc, dk_h, dv_h, sem, float(softmax_scale), min(sms, tiles))
        else:
            kern["main"](q, k, v, dout, lse2, dpsum, dqacc, dk_h, dv_h, sem, float(softmax_scale))
        kern["post"](dqacc, dq, *post_extra, float(softmax_scale))
        if group > 1:  # Q head i belongs to K/V head i // group: heads (j*group .. j*group+group-1) -> j
            torch.sum(dk_h.view(b, sk, h_kv, group, d), dim=3, out=dk)
            torch.sum(dv_h.view(b, sk, h_kv, group, dv_dim), dim=3, out=dv)
    return dq, dk, dv
