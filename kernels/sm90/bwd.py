"""FlashAttention backward main kernel for Hopper (sm_90a) in the CuTe DSL: dK, dV and fp32 dQ accumulation.

One CTA per (K/V tile of ``tile_n`` rows, head, batch); it keeps K and V in shared memory and walks the Q
tiles (``tile_m`` rows) that can see its keys. Warp roles: warp 0 of warpgroup 0 is the TMA producer (Q + LSE
and dO + dPsum through two 2-stage ``PipelineTmaAsync`` mbarrier pipelines, K + V once), warpgroups 1 and 2
are the MMA warpgroups (``setmaxnreg`` 24 / 240). MMA warpgroup w owns K/V rows [64w, 64w+64) of the tile and
computes, per Q tile, with wgmma:

    S^T  = K_w Q^T      (SS)        P^T  = exp2(S^T * scale*log2e - LSE_log2)  (masked; software exp2 on a
    dP^T = V_w dO^T     (SS)                                                    compiled share of fragments)
    dS^T = P^T * (dP^T - dPsum)
    dV_w += P^T dO      (RS: P^T is the accumulator of S^T reused as the A operand from registers)
    dK_w += dS^T Q      (RS)
    dQ[:, half w] = dS K[:, half w]   (SS; dS^T is stored transposed to shared memory, both warpgroups read it)

``tile_m=80`` (hd128's default ``AttnConfig.bwd_tile_m`` since 2026-11-30, one CTA only; softcap / varlen calls run
64 rows; H200: 1.01-1.075x the speed of 64-row tiles, GPU tests passed): S^T / dP^T are 64 x 80 per warpgroup (wgmma N = 80), dV / dK RS over K = 80, and since M = 80 is no
wgmma shape dQ is computed transposed, dQ^T[d-half w] = K^T[d-half w] dS^T (64 head-dim rows x 80 Q rows, SS: A = K^T
head-dim contiguous, B = the dS^T tile with its Q rows contiguous, MN_SW32 atoms); its 40 fp32 values per thread go
to the writer warp in fragment order as usual (bwd_post's ``transposed`` maps them back). Shared memory allows one dQ
staging buffer (227 KB in all); the LSE / dPsum stages are padded to 96 floats (128-byte aligned TMA destinations).

dQ goes to a padded fp32 accumulator in global memory without the MMA warps issuing a global reduction: each
MMA warpgroup writes its fp32 fragment to shared memory (in fragment order, so dQaccum is stored tile-blocked
and the postprocess undoes the permutation) and warp 1, the dQ writer, issues one ``cp.reduce.async.bulk
.add.f32`` per warpgroup chunk (named barriers dQFull / dQEmpty hand the buffer over). On the H200 this was
1.16-1.29x faster than red.global.add.v2.f32 from the MMA registers (hd 64/128, s 8k, interleaved A/B).
With ``deterministic=True`` the writer warp adds in a fixed order: an int32 semaphore per (batch, head, Q tile); the
writer whose turn it is (acquire spin) issues its reductions, waits for them to complete, fences and releases the next
turn (red.release), so the MMA warps never spin. ``det_two_writers`` (AttnConfig.bwd_det_two_writers; the default at
hd128 and (192, 128)): warps 1 and 2 take the Q tiles in turn and free the staging buffer once the reductions have
READ it (dq_writer_pair), so the MMA warps never wait for a reduction's completion, and two tiles' completions overlap.
For causal, ``det_schedule="spt"`` orders the turns and the grid
shortest-processing-time first (the K/V tile on the diagonal, with the fewest Q tiles, goes first); ``"naive"`` keeps
K/V tile order for both (the paper's baseline schedule). ``"rotate"`` (the default since 2026-12-01;
non-causal, one CTA -- or hd256's 2-CTA pairs, as one contributor each --, no window / varlen; causal runs
``"spt"``): K/V tile n of N walks its M Q tiles from tile
floor(n M / N) (N <= M; else n mod M: rotate_start, m_rotate's walk) and each Q tile's turns follow that walk's arrival
order (rotate_turn), so CTAs in lockstep never wait for each other instead of each waiting one dQ add for the previous
K/V tile, and consecutive turns at a Q tile are M / N steps apart. ``"lpt"`` (hd64 non-causal's default with two
dQ staging buffers and 16 heads interleaved, since 2026-12-04; else opt-in; one CTA, no
window / varlen; elsewhere "rotate"'s rules): the grid launches the longest K/V tile first (``lpt_heads`` heads
interleaved, the non-deterministic causal grid), each causal K/V tile walks its Q tiles from the last one down to its
diagonal (m_block_at; non-causal ascending) and the turns go in K/V tile order, so a CTA only ever waits for CTAs
launched before it (_set_det_lpt).
At the end dK (times softmax_scale) and dV
go to shared memory (the K / V tiles' space, once both MMA warpgroups are past their last GEMM) and leave with one TMA
store each (H200, interleaved against official FA4: 1.16-1.26x at 1k, 1.02-1.06x at 8k over per-thread global stores).

``two_cta=True``: clusters of 2 CTAs own adjacent K/V tiles (2p, 2p+1) and walk the same Q tiles. Q, dO,
LSE and dPsum are loaded once per cluster: each CTA issues half of every tile with TMA multicast to both, and
the pipelines' empty barriers collect the consumer warps of both CTAs. CTA r computes dQ for rows
[32r, 32r+32) of each Q tile with the full reduction over both K/V tiles, as dQ^T = K^T dS^T (wgmma N = 32 or
16): it reads its own dS half from shared memory and receives the peer's half through distributed shared
memory (one cp.async.bulk shared::cta -> shared::cluster of 8 KB per Q tile, completing on an mbarrier of
the receiver, sent before the dV wgmma is issued; a second mbarrier hands the buffer back), and it keeps the peer's
K tile resident. Each dQ element is reduced into global memory once per cluster instead of once per CTA, through the
same writer warp as the one-CTA kernel: warpgroup w's 64 x dq_n fp32 dQ^T fragment is chunk 2r + w of the Q tile in
the tile-blocked dQaccum (the postprocess maps it back, ``transposed`` with ``dq_shape``), and with ``deterministic``
each CTA's rows have their own semaphore, turns counted over the pairs. Shared memory: 208 KB of tiles at hd 64
(128-row Q tiles) and hd 128 leave room for one 16 KB dQ staging buffer (two with hd64's 64-row tiles). CPU SASS: no
spills, 4 WARPGROUP.DEPBAR, no fp32 REDG from the MMA warps (hd 64 / 128, causal and deterministic both ways).

Sliding window and softcap (compile-time ``window_left`` / ``window_right`` / ``softcap``; at the defaults the code is
the plain kernel's, byte-identical SASS): a K/V tile walks only the Q tiles whose rows' windows reach its keys
(kernels/sm90/mask.py m_block_range_window, the transpose of the forward's key-block range; an empty range leaves dK /
dV zero), and S^T tiles that cross a bound or seqlen_k are masked element by element. With ``deterministic`` a Q tile's
dQ turns are counted among the K/V tiles that visit it (m_block_visitors, the exact inverse of the ranges). Softcap:
the scale argument becomes softmax_scale / softcap, t = tanh(S^T * that) (MUFU.TANH, recomputed),
P^T = exp2(t * softcap * log2e - LSE_log2) (the forward's), and dS^T = P^T (dP^T - dPsum) (1 - t^2), the cap's chain
rule; dK and dQ are scaled by softmax_scale as usual. two_cta supports neither. CPU SASS: no spills except hd 64 with a
softcap and 128-row Q tiles (bwd_tile_m=64 has none).

GQA / MQA: ``qhead_per_kvhead`` = g (compile-time; at 1 the code is the MHA kernel's, byte-identical SASS) -- the CTA of
Q head h loads K/V head h // g (the TMA coordinates; K/V are never repeated in memory) and writes dK / dV per Q head;
kernels/sm90/backward.py sums each group's g heads into (b, s_k, h_kv, d).
"""
from __future__ import annotations

import copy
import math
from typing import Any, NamedTuple

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from cutlass._mlir.dialects import llvm
from cutlass._mlir.dialects import nvvm as _nvvm
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.experimental.primitives.nvvm_wrapper import cp_async_bulk_shared_cluster_shared_cta

from ..config import DEFAULTS
from .barriers import Bar
from .bwd_pre import varlen_pad_offset
from .exp2 import compiled_fraction, emulated_fragments, exp2_poly
from .gemm import wgmma
from .mask import bwd_tile_needs_mask, m_block_range_window
# the dQ writer warp and the deterministic turns (bwd_dq_writer.py); the turn helpers and the bulk reduce are
# re-exported for bwd_wide192.py and the tests
from .bwd_dq_writer import (_BAR_DQ_EMPTY, _BAR_DQ_FULL, BwdDqWriter, bulk_reduce_add_f32, rotate_start,  # noqa: F401
                            rotate_turn, rotate_turn_at, rotate_turn_base, wait_for_turn)

_CLUSTER = _nvvm.MemScopeKind.CLUSTER





class BwdGmem(NamedTuple):
    """The kernel's global tensors, in its mode orders (``_kernel_views``; varlen: ``call_varlen``'s)."""
    mQ: Any
    mK: Any
    mV: Any
    mdO: Any
    mLSE: Any
    mdPsum: Any
    mdQaccum: Any = None
    mdK: Any = None
    mdV: Any = None
    mSem: Any = None


class BwdTma(NamedTuple):
    """TMA atoms: the producer's loads and the dK / dV stores."""
    tma_Q: Any
    tma_K: Any
    tma_V: Any
    tma_dO: Any
    tma_LSE: Any
    tma_dPsum: Any
    tma_dK: Any = None
    tma_dV: Any = None


class BwdMmas(NamedTuple):
    """Tiled MMAs: S^T / dP^T (SS), dK / dV (RS), dQ (or dQ^T)."""
    mma_S: Any
    mma_dKV: Any
    mma_dQ: Any


class BwdSmem(NamedTuple):
    """Shared-memory tensors: the loaded tiles and LSE / dPsum stages, dS^T, two_cta's peer K tile and received dS
    halves (sK / sdS otherwise), and the dK / dV staging views of the K / V tiles' space."""
    sQ: Any
    sdO: Any
    sK: Any
    sV: Any
    sLSE: Any
    sdPsum: Any
    sdS: Any = None
    sKp: Any = None
    sdSp: Any = None
    sdKs: Any = None
    sdVs: Any = None


class BwdPipes(NamedTuple):
    """The producer's TMA pipelines: Q + LSE, dO + dPsum, K + V (once)."""
    pipe_q: Any
    pipe_do: Any
    pipe_kv: Any


class BwdWork(NamedTuple):
    """One CTA's work: its K/V tile, head and batch, its Q-tile range, the number of K/V groups (two_cta: pairs) and its
    rank in the group, the sequence lengths, and (varlen) the sequence's first Q / K row and first padded Q tile."""
    n_block: Any
    head: Any
    batch: Any
    m_block_min: Any
    m_block_max: Any
    num_groups: Any
    rank: Any
    seqlen_q: Any
    seqlen_k: Any
    offset_q: Any = 0
    offset_k: Any = 0
    pad_tile: Any = 0
    m_rot: Any = 0  # m_rotate: the Q tile this CTA walks first, relative to m_block_min
    q_base: Any = 0  # diag_align: the first Q row of Q tile 0 of this CTA's walk (a multiple of 8)


class DsPtrs(NamedTuple):
    """Raw shared-memory pointers of the MMA warpgroups: dS^T stages, received dS halves (two_cta), dQ staging, and
    the dS exchange mbarriers (two_cta)."""
    sdS: Any
    sdSp: Any
    sdQ: Any
    mbar_dsfull: Any
    mbar_dsempty: Any


class MmaFrags(NamedTuple):
    """An MMA warpgroup's operand fragments, accumulators and per-CTA constants (built once by ``mma_fragments``)."""
    wg: Any  # MMA warpgroup index, thread in it, thread among the MMA threads
    tid: Any
    tidx: Any
    tSrK: Any  # S^T / dP^T = K_w Q^T / V_w dO^T: operands, accumulators, coordinates, LSE / dPsum broadcasts
    tSrV: Any
    tSrQ: Any
    tSrdO: Any
    acc_S: Any
    acc_dP: Any
    tScS: Any
    tSsLSE: Any
    tSsdPsum: Any
    st_atom: Any  # dS^T -> shared memory (stmatrix)
    thr_st: Any
    tSsdS_all: Any
    tdVrdO: Any  # dV += P^T dO, dK += dS^T Q (A from registers)
    tdKrQ: Any
    rP: Any
    rdS: Any
    rP_acc: Any
    rdS_acc: Any
    acc_dV: Any
    acc_dK: Any
    thr_dQ: Any  # dQ = dS K, dQ^T = K^T dS^T (80-row tiles), or two_cta's dQ^T over both K/V tiles
    tdQrK: Any
    tdQrdS: Any
    tdQrKp: Any
    acc_dQ: Any
    q0: Any  # two_cta: this warpgroup's first Q row of the tile
    pds_bar: Any  # named barrier of the MMA warpgroups
    n_row0: Any  # this warpgroup's first K/V row
    causal_off: Any  # seqlen_k - seqlen_q


class SOperands(NamedTuple):
    """``p_and_ds``'s operands for one Q tile: the S^T MMA, accumulators, A / B fragments (the stage's Q / dO), element
    coordinates, the stage's LSE / dPsum, and the A-operand views that receive P^T and dS^T."""
    mma_S: Any
    acc_S: Any
    acc_dP: Any
    tSrK: Any
    tSrV: Any
    tSrQ: Any
    tSrdO: Any
    tScS: Any
    tLSE: Any
    tdPsum: Any
    rP_acc: Any
    rdS_acc: Any


class TileRows(NamedTuple):
    """Where one S^T tile sits: the K/V tile, the warpgroup's first K/V and Q rows, seqlen_k, seqlen_k - seqlen_q, and
    the score scale (log2 units, or softmax_scale / softcap)."""
    n_block: Any
    n_row0: Any
    m_row0: Any
    seqlen_k: Any
    causal_off: Any
    scale_log2: Any


class DkdvDest(NamedTuple):
    """Where a CTA's dK / dV go: the staging tiles, the TMA store atoms, the global tensors and the tile's coordinates
    (varlen: the sequence's first K row)."""
    sdKs: Any
    sdVs: Any
    tma_dK: Any
    tma_dV: Any
    mdK: Any
    mdV: Any
    n_block: Any
    head: Any
    batch: Any
    offset_k: Any = 0


@dsl_user_op
def tid_x_volatile(*, loc=None, ip=None) -> Int32:
    """threadIdx.x through a volatile ``mov`` (has side effects), so LLVM neither merges it with the kernel's other reads
    of the thread index nor hoists it out of a loop: what is computed from it is computed where it is used."""
    return Int32(llvm.inline_asm(T.i32(), [], "mov.u32 $0, %tid.x;", "=r", has_side_effects=True,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


LOG2_E = math.log2(math.e)

# Backward tiles per head dim: (tile_m = Q rows per step, the default of AttnConfig.bwd_tile_m in
# kernels/config.py; tile_n = K/V rows per CTA). Two MMA warpgroups each own 64 K/V rows. hdim 256 and (192, 128)
# do not fit this layout (at hd256 dK+dV accumulators alone need 256 registers per thread): bwd_wide.py has them.
# (tile_m when the constructor is given none, K/V rows per CTA); the harness passes AttnConfig.bwd_tile_m (hd128's
# default there is 80, which two_cta / softcap / varlen do not have, so the constructor's fallback stays 64)
BWD_TILES = {64: (DEFAULTS[("sm90", 64)]["bwd_tile_m"], 128), 128: (64, 128)}
NUM_STAGES = 2  # Q/dO (and dS) pipeline depth
SMEM_BYTES = 227 * 1024  # dynamic shared memory per CTA on sm_90


# det_schedule="lpt": at least this many heads interleaved in the grid (FlashBwdSm90._set_det_lpt)
DET_LPT_HEADS = 8


def desc_block(m_iter, m_block_min, m_block_max):
    """det_schedule="lpt": the Q tile of loop step m_iter in a walk from the last tile down, m_block_max - 1 ...
    m_block_min (plain integer arithmetic: the same code on Python ints in tests/test_bwd_det_lpt.py)."""
    return m_block_max - 1 - (m_iter - m_block_min)


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """Swap the first two modes of a shared-memory tensor (keeps the swizzle)."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


class FlashBwdSm90(BwdDqWriter):
    """Main backward kernel. Plain-Python knobs in, compile-time constants inside.

    kernel -> cta_work, shared_setup, smem_tensors -> roles: load (load_tiles, load_kv), dq_writer (the BwdDqWriter
    mixin, bwd_dq_writer.py), and mma: mma_fragments once, then per Q tile m_block_step = p_and_ds (S^T, dP^T -> P^T,
    dS^T), ds_exchange (dV, dS^T to shared memory / the peer), dq_dk_one_cta or dq_dk_two_cta (dQ -> dq_to_writer,
    the dQ hand-off; dK), and at the end dkdv_epilogue. Arguments travel grouped in the NamedTuples above (BwdGmem,
    BwdTma, BwdSmem, BwdWork, ...)."""

    dq_transposed = False  # dQ^T = K^T dS^T per warpgroup (80-row Q tiles); FlashBwdWideSm90 keeps dQ = dS K
    varlen = False  # packed variable-length batches (call_varlen); FlashBwdWideSm90 has none
    ds_split = 0  # S^T values per thread exponentiated before the wait for dP^T (0: all of them; p_ds_plain)
    dq_defer = False  # the dQ hand-off's fence and arrive under the next tile's S^T GEMM (m_block_step)
    m_rotate = False  # each CTA walks its Q tiles from its own starting tile (m_block_at)
    persistent = False  # grid min(SM count, K/V tiles), each CTA walks several K/V tiles (_set_persistent)
    m_desc = False  # each CTA walks its Q tiles from the last one down (m_block_at; det_schedule="lpt")
    det_lpt = False  # deterministic causal: longest K/V tile first, descending walks, K/V tile order turns
    det_rotate = False  # deterministic dQ turns in the rotated walk's arrival order (det_schedule="rotate")
    ds_store_first = False  # dS^T stmatrix before the dV wgmma is issued (ds_exchange)
    lpt_heads = 0  # causal grid: 0 = diagonal-most K/V tile first (spt); g >= 1 = longest first, g heads interleaved
    pdl = False  # programmatic dependent launch against the preprocess (and of the postprocess): _set_pdl
    dq_chunk_release = False  # writer frees each dQ staging chunk once its own bulk read is done (dq_writer)
    diag_align = False  # causal 80-row Q tiles walked from the K/V tile's diagonal row, dQaccum chunk-major
    q_tail = False  # diag_align: each walk's last Q tile computed over its 16-row blocks below seqlen_q only
    stage_rows = 0  # Q rows of a shared-memory stage when they differ from tile_m (q_tail's _tail_kernel); 0: tile_m
    det_two_writers = False  # deterministic: two dQ writer warps take the Q tiles in turn (dq_writer_pair)
    two_cta_dv_first = False  # two_cta: dV issued before the dS^T stores, the barrier and the send (ds_exchange)
    ds_cta_release = False  # two_cta: the received dS half handed back with a CTA-scope remote arrive (no MEMBAR.GPU)
    stream_post = False  # the writer counts each dQ row unit's finished reductions; the postprocess streams (_set_stream_post)
    stream_pre = False  # the preprocess zeroes those counts (_set_stream_post)
    dq_claim = False  # the first writer per dQ unit stores, dQaccum not zeroed (_set_dq_claim)
    ds_mbar_first = False  # the dS mbarriers in front of the LSE stages (two_cta, or bwd_dq_stages=2: _set_dq_stages)
    dq_stages_set = False  # dq_stages given (AttnConfig.bwd_dq_stages): deterministic two-buffer early hand-back
    dq_turn0_store = False  # deterministic: each dQ tile's turn 0 stores, dQaccum not zeroed (_set_dq_claim)

    def __init__(self, dtype, hdim: int, causal: bool, deterministic: bool = False, two_cta: bool = False,
                 exp2_emu_fraction: float = 0.0, consumer_regs: int = 240, producer_regs: int = 24,
                 det_schedule: str = "spt", tile_m: int | None = None, hdim_v: int | None = None,
                 qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                 varlen: bool = False, lpt_heads: int = 0, rotate_q: bool = False, pdl: bool = False,
                 dq_chunk_release: bool = False, diag_align: bool = False, det_two_writers: bool = False,
                 ds_cta_release: bool = False, two_cta_dv_first: bool = False, persistent: bool = False,
                 q_tail: bool = False, stream_post: bool = False, dq_claim: bool = False,
                 dq_stages: int | None = None):
        self._set_gqa(qhead_per_kvhead)
        if varlen and two_cta:
            raise ValueError("varlen=True with two_cta=True: the variable-length backward has no 2-CTA mode")
        self.varlen = bool(varlen)
        if hdim not in BWD_TILES or hdim_v not in (None, hdim):
            raise ValueError(f"hdim={hdim}, hdim_v={hdim_v}: FlashBwdSm90 supports head dims {sorted(BWD_TILES)} "
                             "with hdim_v == hdim (bwd_wide.py has the wider ones)")
        self._set_schedule(dtype, causal, deterministic, det_schedule)
        self._set_features(window_left, window_right, softcap)
        if two_cta and (self.has_window or self.softcap > 0.0):
            raise ValueError("two_cta=True: not supported with a sliding window or softcap (use two_cta=False)")
        self.hdim = hdim
        self.hdim_v = hdim  # V / dO / dV head dim (load() reads it; FlashBwdWideSm90 sets it apart)
        self.two_cta = bool(two_cta)
        self.cluster = 2 if self.two_cta else 1
        self.tile_m, self.tile_n = BWD_TILES[hdim]
        if tile_m is not None:
            if tile_m not in (64, 80, 128):
                raise ValueError(f"bwd_tile_m={tile_m}: the sm90 backward supports 64 or 128 (80 at hdim 128)")
            if tile_m == 80 and (hdim != 128 or self.two_cta or self.softcap > 0.0):
                raise ValueError(f"bwd_tile_m=80: only at hdim 128 without two_cta or softcap (hdim={hdim}, "
                                 f"two_cta={two_cta}, softcap={softcap}; a softcap spills 41-54 LDL/STL)")
            self.tile_m = tile_m
        # one-CTA dQ = dS K per warpgroup: with 64-row Q tiles each warpgroup takes half of the head dim, with
        # 128-row tiles half of the rows (wgmma M is 64 per warpgroup); either way tile_m * hdim / 2 values.
        # 80-row tiles (hd128, opt-in): M = 80 is no wgmma shape, so each warpgroup computes dQ^T for its half of
        # the head dim, dQ^T[d-half w] = K^T[d-half w] dS^T (64 head-dim rows x 80 Q rows, N = 80; dq_transposed)
        self.dq_transposed = self.tile_m == 80
        if self.dq_transposed:
            self.dq_shape = (hdim // 2, self.tile_m)
        else:
            self.dq_shape = (self.tile_m, hdim // 2) if self.tile_m == 64 else (64, hdim)
        # 1: warpgroups split dQ by rows, 0: by columns (dQ^T: by head-dim rows, i.e. dQ columns)
        self.dq_split_rows = 0 if self.dq_transposed else int(self.dq_shape[0] < self.tile_m)
        # two_cta: dQ^T per warpgroup is (64 head-dim rows) x (dq_n Q rows); the CTA owns tile_m/2 Q rows
        self.dq_n = self.tile_m // 2 if hdim == 128 else self.tile_m // 4
        self.num_mma_wg = 2
        # dQ fragments staged in shared memory and bulk-reduced by the writer warp (both modes)
        self.dq_smem = True
        if self.two_cta:  # a warpgroup's dQ^T fragment: 64 x dq_n; chunk c = 2 * rank + w of a Q tile's 4
            self.dq_vals = 64 * self.dq_n // 128
        else:
            self.dq_vals = self.tile_m * (hdim // 2) // 128  # fp32 dQ values per MMA thread
        self.dq_chunk = 128 * self.dq_vals  # floats per warpgroup chunk
        self.stages = NUM_STAGES
        self.q_stages = self.do_stages = NUM_STAGES  # producer-side depths (FlashBwdWideSm90 sets them apart)
        # dQ staging buffers: two when shared memory allows (the struct as laid out today: struct_bytes), so an MMA
        # warpgroup never waits for the writer's bulk read of the previous Q tile's chunk (hd128 64-row tiles; hd64's
        # 128-row tiles need the dS mbarriers moved first: AttnConfig.bwd_dq_stages, _set_dq_stages)
        self.dq_stages = 2 if self.struct_bytes(2, False) <= SMEM_BYTES else 1
        if self.two_cta:
            # two_cta also keeps the peer's K tile and the received dS halves: with 208 KB of tiles (hd64 / 128-row
            # and hd128 / 64-row Q tiles) one 16 KB staging buffer fits (hd64: exactly 227 KB in all, hd128: 226 KB),
            # two would not; hd64 with 64-row tiles (128 KB of tiles) takes two. _host_setup asserts the total.
            tm, tn, st = self.tile_m, self.tile_n, NUM_STAGES
            tiles = (2 * st * tm * hdim + 3 * tn * hdim + st * tm * tn + st * (tm // 2) * tn) * dtype.width // 8
            header = -(-(128 + 2 * st * (-(-tm // 32) * 32) * 4) // 1024) * 1024  # mbarriers, LSE / dPsum stages
            stage_bytes = self.num_mma_wg * self.dq_chunk * 4
            self.dq_stages = 2 if header + tiles + 2 * stage_bytes <= SMEM_BYTES else 1
        assert self.tile_n == 64 * self.num_mma_wg
        self.num_threads = 128 * (self.num_mma_wg + 1)
        self.num_mma_threads = 128 * self.num_mma_wg
        self.dq_pieces = 1  # dQ GEMMs (and writer hand-offs) per warpgroup and Q tile
        self._set_exp2_regs(self.tile_m, exp2_emu_fraction, consumer_regs, producer_regs)
        # hd64 (one CTA): the exponents of every S^T value and the exponentials of the first half before the wait for
        # dP^T, the second half's exponentials fused with dS^T (p_ds_plain / p_part), so that the dS^T FADD / FMUL /
        # F2FP run on the FMA pipe between MUFU.EX2 instead of after the last one (ncu, H200 hd64 s8k: 40 MUFU.EX2 back
        # to back, then ~230 FMA-pipe instructions with MUFU idle). 0: every exponential before the wait.
        self.ds_split = self.tile_m // 4 if hdim == 64 and not self.two_cta else 0  # of tile_m / 2 values per thread
        # hd64 (one CTA): a tile's dQ hand-off ends (fence, arrive on dQFull) after the next tile's S^T GEMM is issued,
        # not before the wait for dK (m_block_step), so the tensor cores go from dK to the next S^T without the fence's
        # wait for the dQ stores in between (ncu, H200 hd64 s8k: FENCE.VIEW.ASYNC.S after the dQ stores ~250 cycles per
        # tile, dK already complete at the end-of-tile wait).
        self.dq_defer = False  # measured (H200 hd64): 2-3% slower than the fence before dK's wait
        # hd64 non-causal, non-deterministic (no window): K/V tile n walks its Q tiles starting at tile n mod their count,
        # wrapping around (m_block_at; loads, MMA and writer alike), so the CTAs of one head, which run side by side,
        # bulk-reduce into different dQ tiles instead of all into the same one at the same time (ncu, H200 hd64 s8k:
        # the MMA warps waited 5% of the stall samples, ~270 cycles per Q tile, for the single dQ staging buffer, i.e.
        # for the writer's previous bulk reduction to be read; the writer spent ~30% of its time waiting for those
        # reads). Deterministic mode keeps K/V tile order (its K/V-tile-order turns would chain the CTAs' rotations)
        # unless det_schedule="rotate" (_set_det_rotate: the rotation at every head dim, turns in arrival order).
        self._set_det_rotate(det_schedule)
        # ``rotate_q`` (AttnConfig.bwd_rotate_q, opt-in): the same walk at hd128 (non-causal, non-deterministic, one
        # CTA, no window), where the CTAs of a head otherwise start together on Q tile 0 and reduce into the same dQ tile
        self.m_rotate = ((hdim == 64 or rotate_q) and not self.two_cta and not causal and not deterministic
                         and not self.has_window) or self.det_rotate
        # hd64 (one CTA): dS^T goes to shared memory (stmatrix) before the dV GEMM is issued, not after it (ds_exchange),
        # so that the stores drain while dV is issued and the fence before the PdS barrier finds them done (ncu, H200
        # hd64 s8k, before C1: that fence, the barrier and the wait at it 11.6% of the stall samples, ~630 cycles of
        # MMA-warp time per Q tile between the dV and the dQ issue; official FA4 stores dS before its dV wgmma).
        self.ds_store_first = hdim == 64 and not self.two_cta
        self._set_lpt(lpt_heads)
        self._set_det_lpt(det_schedule, lpt_heads)
        self._set_pdl(pdl)
        # ``dq_chunk_release`` (AttnConfig.bwd_dq_chunk_release; opt-in): the dQ writer hands each MMA warpgroup its
        # staging chunk back as soon as the bulk reduction of that chunk (dq_stages hand-offs ago) has read it, not once
        # every chunk of the buffer has been read. With one staging buffer (hd128 80-row tiles) the default makes
        # warpgroup 0 wait, at the dQ-empty barrier before its dQ stores, for warpgroup 1's reduction to be read too
        # (SASS: DEPBAR.LE SB0, 0x0 before both arrives; official FA4's writer: DEPBAR.LE SB0, 0x1 -> arrive chunk 0,
        # DEPBAR.LE SB0, 0x0 -> arrive chunk 1). Not deterministic (its writer waits for all reductions each tile).
        self.dq_chunk_release = bool(dq_chunk_release) and not self.deterministic
        self._set_diag_align(diag_align)
        # ``det_two_writers`` (AttnConfig.bwd_det_two_writers; deterministic only): dq_writer_pair instead of
        # dq_writer. dq_writer hands the staging buffer of Q tile i + 1 back only after tile i's reductions have
        # COMPLETED, been fenced and released (one buffer at the default tiles: hd64 128 rows, hd128 80 rows, two_cta),
        # so the MMA warps, at their dQ store, wait for a completion; here they wait for a bulk READ only.
        self.det_two_writers = bool(det_two_writers) and self.deterministic
        # ``ds_cta_release`` (opt-in; two_cta only, ignored elsewhere): the received dS half is handed back to the peer
        # (its dsempty, dq_dk_two_cta) with the CTA-scope remote arrive of the pipelines' consumer_release
        # (mbarrier.arrive.shared::cluster, SYNCS.ARRIVE.TRANS64.RED) instead of mbarrier.arrive.release.cluster, which
        # ptxas compiles to MEMBAR.ALL.CTA + MEMBAR.ALL.GPU + ERRBAR in front of the arrive: a GPU-scope fence in every
        # MMA thread per Q tile, between the dQ wait and the dQ hand-off. The hand-back orders a READ (the dQ wgmma's,
        # complete at wait_group) before the peer's bulk-copy overwrite, the same write-after-read release as the TMA
        # pipelines' empty barriers. docs/BWD_TWO_CTA.md.
        self.ds_cta_release = bool(ds_cta_release) and self.two_cta
        # ``two_cta_dv_first`` (opt-in; two_cta at hd 128 only, ignored elsewhere): ds_exchange issues the dV wgmma
        # before the dsempty wait, the dS^T stmatrix, the fence, the PdS barrier and the send, as the one-CTA kernel does,
        # so the tensor cores run dV (a quarter of a tile's wgmma work) under them instead of idling. hd 64 (128-row Q
        # tiles) is left out: ptxas serialised every wgmma there (ds_send's docstring).
        self.two_cta_dv_first = bool(two_cta_dv_first) and self.two_cta and hdim == 128
        self._set_dq_stages(dq_stages)
        assert not self.det_two_writers or (self.dq_pieces == 1 and self.dq_stages in (1, 2))
        self._set_persistent(persistent)
        self._set_q_tail(q_tail)
        self._set_stream_post(stream_post)
        self._set_dq_claim(dq_claim)

    def _set_diag_align(self, diag_align: bool) -> None:
        """``diag_align`` (AttnConfig.bwd_diag_align; opt-in): with 80-row Q tiles against 128-row K/V tiles, the
        causal walk of K/V tile n starts at Q tile floor(128 n / 80), whose first 128 n mod 80 rows (0 / 48 / 16 / 64
        / 32) are above the diagonal: fully masked, computed by all five GEMMs for nothing; with the padded last tile
        the kernel computes 4960 Q rows x 128 keys per head at 1k where 4608 are needed (+7.6%; 2k +5.7%, 4k +4.5%,
        8k +1.9%, 16k +0.6%; 64-row tiles, official FA4's hd128 causal tile, need none). Here CTA n walks
        ceil((seqlen_q - r0) / 80) tiles from row r0 = max(0, 128 n - (seqlen_k - seqlen_q)) rounded down to 8 (so
        a tile is whole 8-row groups of dQaccum): the waste left is the last tile's rows past seqlen_q (zero-filled Q
        / dO, LSE +inf: P = 0, dS = 0), 4880 rows per head at 1k (+5.9%; 2k +2.9%, 4k +1.6%, 8k +0.8%).
        Tiles of different CTAs then overlap, so dQaccum is chunk-major: (warpgroup w, padded Q row, 64 head-dim
        columns) -- chunk w of a tile at row r is the 20 KB at (w * rows + r) * 64 floats, 8-row groups of 512 floats
        in the fragment order of the dQ^T accumulator (the same in every tile), which the postprocess reads back
        (bwd_post.py ``chunk_major``); backward.py pads the Q rows by one more tile (r0 + 80 k <= seqlen_q + 79).
        Only causal, one CTA, non-varlen, no window or softcap, dQ^T (80-row) tiles with tile_n not a multiple of
        tile_m; deterministic only with the "spt" turns (AttnConfig.bwd_det_diag_align): tiles of different CTAs
        overlap, so the dQ semaphores are per ``sem_rows`` = 8 Q rows (bwd_dq_writer.py det_diag_turn) instead of per
        Q tile. Elsewhere the value is ignored."""
        self.diag_align = (bool(diag_align) and self.causal and not self.two_cta
                           and (not self.deterministic or (self.spt and not self.det_lpt))
                           and not self.varlen and not self.has_window and self.softcap == 0.0 and self.dq_transposed
                           and self.tile_n % self.tile_m != 0 and not self.m_rotate and type(self) is FlashBwdSm90)

    def _set_q_tail(self, q_tail: bool) -> None:
        """``q_tail`` (AttnConfig.bwd_q_tail; opt-in): with diag_align, not deterministic, software exp2 off, not the
        persistent kernel (its walks share the tail code path, but that combination was never run on a GPU). Each
        walk's last Q tile ends at seqlen_q, so only its first r = seqlen_q - r0 rows (1 .. 80) are needed; at 1k
        the others are 5.9% of the rows the kernel multiplies (_set_diag_align). That tile runs as a 16 nq-row tile,
        nq = ceil(r / 16) (tail_step: one copy of the Q-tile step per nq < 5, each with its own fragments; S^T / dP^T /
        dQ^T with wgmma N = 16 nq, dV / dK over nq k-blocks), on the first 16 nq rows of the stage's Q / dO / dS^T
        tiles. The dQ staging rows it does not write keep the previous tile's values; the writer adds them to
        dQaccum rows >= seqlen_q (the padding, which the postprocess never reads). The copies sit in the Q-tile loop
        (peeled after it, the CPU SASS spilled 43 LDL / 50 STL); choosing the wgmma shape per GEMM inside one step, on
        a prefix of the N = 80 accumulator, serialised every wgmma of the kernel. Gradients bitwise equal to the
        default's on the H200; 1.003x at 1k, 0.993x at 2k (docs/DEFAULTS_HISTORY.md, session 39). Elsewhere the value
        is ignored."""
        self.q_tail = (bool(q_tail) and self.diag_align and not self.deterministic and not self.dq_defer
                       and not self.exp2_emu_frags and not self.persistent)

    def _set_stream_post(self, stream_post: bool) -> None:
        """``stream_post`` (AttnConfig.bwd_stream_post): with PDL, one CTA, not persistent, varlen or q_tail, no window.
        The postprocess (bwd_post.py ``stream``) converts each dQ tile as soon as every K/V tile that visits it has
        counted its reductions into the tile's row units (``sem_rows``: the Q tile, or 8 rows with diag_align, whose
        tiles of different CTAs overlap), instead of after this whole grid: its CTAs take the SMs this grid's last CTAs
        leave.

        Not deterministic: the counts live in the otherwise unused semaphore array, which the preprocess zeroes before
        it lets this grid launch (``stream_pre``). After the walk's last Q tile (and after its read wait: counting
        before it changed ptxas' schedule of the MMA warps' loop at hd128 non-causal) the dQ writer waits for its
        reduce-adds to complete (cp.async.bulk.wait_group 0, not .read), fences (fence.acq_rel.gpu) and adds 1 to each
        unit the walk covered below seqlen_q (relaxed red.add, lanes over the units). Counted tile by tile (a
        completion wait and a fence per Q tile) it measured the same on the H200 when done right after the next tile's
        reductions were issued, and up to 4% slower when done before them (docs/DEFAULTS_HISTORY.md, session 40); one
        fence per CTA is kept.

        Deterministic: the dQ semaphores already are those counts (det_release: completion, fence, +1 per unit after
        each turn; zeroed by the host before the preprocess), so this kernel and the preprocess are unchanged and only
        the postprocess streams. Elsewhere the value is ignored."""
        self.stream_post = (bool(stream_post) and self.pdl and not self.two_cta
                            and not self.persistent and not self.varlen and not self.q_tail and not self.has_window)
        # the preprocess zeroes the counters (deterministic: the host zeroes the semaphores, which the main kernel's
        # writer may already spin on before the preprocess ends)
        self.stream_pre = self.stream_post and not self.deterministic

    def struct_bytes(self, dq_stages: int, ds_mbar_first: bool) -> int:
        """Bytes of the one-CTA shared-memory struct (_shared_storage) with ``dq_stages`` dQ staging buffers: the
        mbarriers (with ``ds_mbar_first`` the two dS mbarrier arrays too) and the LSE / dPsum stages, padded to the
        first tile's 1024-byte alignment, the Q / dO / K / V / dS^T tiles, the staging buffers, then (without
        ``ds_mbar_first``) the dS mbarriers; the whole rounded up to 1024 bytes."""
        ds_mbar = 2 * self.stages * 8
        mbar = (2 * self.q_stages + 2 * self.do_stages + 2) * 8 + (ds_mbar if ds_mbar_first else 0)
        header = -(-mbar // 128) * 128 + 4 * self.lse_stride * (self.q_stages + self.do_stages)
        header = -(-header // 1024) * 1024
        eb = self.dtype.width // 8
        tiles = (self.q_stages * self.tile_m * self.hdim + self.do_stages * self.tile_m * self.hdim_v
                 + self.tile_n * (self.hdim + self.hdim_v) + self.stages * self.tile_m * self.tile_n) * eb
        size = header + tiles + dq_stages * self.num_mma_wg * self.dq_chunk * 4 + (0 if ds_mbar_first else ds_mbar)
        return -(-size // 1024) * 1024  # a struct's size is a multiple of its alignment (the tiles' 1024 bytes)

    def _set_dq_stages(self, dq_stages: int | None) -> None:
        """``dq_stages`` (AttnConfig.bwd_dq_stages; opt-in; one CTA): the number of dQ staging buffers instead of the
        rule above (two where the estimate leaves room). hd64's 128-row tiles take two only with the dS mbarriers
        moved in front of the LSE stages (``ds_mbar_first``): the struct is then exactly 227 KB (struct_bytes). Why:
        with one buffer an MMA warpgroup waits at its dQ store until the writer's bulk reduction of the previous Q
        tile has read it (H200 hd64 4k, Nsight Compute: that STS.128 held 3.6% of the default kernel's warp samples,
        7.8% of the deterministic one's). The deterministic one-writer kernel then also hands the next tile's buffer
        back once this tile's reductions are issued, not after their completion, fence and release (dq_writer's
        ``early``). ValueError where two do not fit; two_cta and the wide kernels keep theirs."""
        if dq_stages is None or self.two_cta or type(self) is not FlashBwdSm90:
            return
        if isinstance(dq_stages, bool) or not isinstance(dq_stages, int) or dq_stages not in (1, 2):
            raise ValueError(f"dq_stages={dq_stages!r}: 1 or 2 (None: two where they fit)")
        if dq_stages == 2 and self.dq_stages == 1:
            need = self.struct_bytes(2, True)
            if need > SMEM_BYTES:
                raise ValueError(f"bwd_dq_stages=2: the struct would take {need} bytes of shared memory, more than "
                                 f"{SMEM_BYTES} (hdim {self.hdim}, {self.tile_m}-row Q tiles)")
            self.ds_mbar_first = True
        self.dq_stages = dq_stages
        self.dq_stages_set = True

    def _set_dq_claim(self, dq_claim: bool) -> None:
        """``dq_claim`` (AttnConfig.bwd_dq_claim; opt-in): with stream_pre (the streaming postprocess's counters, not
        deterministic), one staging buffer and one hand-off per Q tile, causal or on rotated walks. The preprocess
        does not zero dQaccum: the first writer to reach each stream unit (``sem_rows`` rows) claims it (CAS on a
        state word after the counters; the host sizes the array twice) and bulk-stores its chunk there, the others
        reduce-add once the claimant's store has completed (dq_writer.claim_tile). Units no K/V tile visits are the
        causal rows without keys, which the streaming postprocess writes as zeros without reading dQaccum. The grid
        walks of hd128 non-causal start every CTA of a head on the same Q tile at once, so all but one would wait at
        every step: not there (bwd_rotate_q first). 8-row units need the 80-row dQ^T chunks, whose fragment order keeps
        each 8-row group contiguous (512 floats). Deterministic kernels that stream (their semaphores per Q tile, not
        bwd_det_diag_align's 8-row ones): ``dq_turn0_store``, each tile's turn 0 stores (turn0_op)."""
        units_ok = self.sem_rows == self.tile_m or (self.dq_transposed and self.dq_chunk // (self.tile_m // 8) == 512)
        self.dq_claim = (bool(dq_claim) and self.stream_pre and self.dq_stages == 1 and self.dq_pieces == 1
                         and not self.dq_chunk_release and (self.causal or self.m_rotate) and units_ok)
        # deterministic (streaming, one semaphore per Q tile): no claim needed, each tile's turn 0 comes first by
        # construction; it stores, the later turns add
        self.dq_turn0_store = (bool(dq_claim) and self.deterministic and self.stream_post and not self.det_diag)

    def _tail_kernel(self, nq: int) -> "FlashBwdSm90":
        """This kernel object with a 16 nq-row Q tile, for tracing q_tail's last-tile step (tail_step): its fragment
        builders and step then take the tile's size from it; the shared-memory stages (lse_stride) and the dQ staging
        buffer (dq_chunk) keep theirs."""
        k = copy.copy(self)
        k.tile_m = 16 * nq
        k.stage_rows = self.tile_m  # (the stages keep their layout: lse_stride)
        k.dq_shape = (self.dq_shape[0], 16 * nq)
        k.dq_vals = 16 * nq * (self.hdim // 2) // 128
        return k

    def _set_persistent(self, persistent: bool) -> None:
        """``persistent`` (AttnConfig.bwd_persistent; opt-in): launched through ``call_persistent`` with grid
        (num_ctas,) (the caller's min(SM count, K/V tiles)), CTA c walks the K/V tiles c, c + num_ctas, ... of the
        one-tile launch's order (blockIdx x fastest, then head, then batch; lpt_heads' regrouping applied to that
        rank), every role's
        pipeline states and the dQ hand-off count carried from tile to tile (roles_persistent): the producer loads the
        next tile's first Q / dO stages while the MMA warps finish this tile, and a CTA's setup (shared-memory
        barriers, descriptor prefetch, operand fragments) is paid once per SM instead of once per K/V tile. K / V (and
        the dK / dV staging that aliases them) are handed back to the producer only after the epilogue's TMA store has
        read them. This class only (hd 64 / 128), one CTA, not deterministic (its turns assume one K/V tile per CTA
        launch order), not varlen, no PDL; ignored elsewhere. Opt-in: on the H200 it measured 0.99-1.01x the one-tile
        grid non-causal and 0.72-0.99x causal (AttnConfig.bwd_persistent's comment), so a CTA's start is not where the
        short backward loses (its K / V load and dK / dV store cannot overlap: they share the shared memory)."""
        self.persistent = (bool(persistent) and type(self) is FlashBwdSm90
                           and not (self.two_cta or self.deterministic or self.varlen or self.pdl))

    def _set_pdl(self, pdl: bool) -> None:
        """``pdl`` (AttnConfig.bwd_pdl; opt-in, the plain launch, not varlen): programmatic dependent launch of this
        kernel after the preprocess (bwd_pre.py), and of the postprocess after it (bwd_post.py); backward.py launches
        all three with the programmaticStreamSerialization attribute. What may run early, and where each kernel waits:

        - The preprocess waits (griddepcontrol.wait) before any global access, then signals launch_dependents at once.
          So this kernel's CTAs start once every preprocess CTA has started -- after the kernel before the preprocess
          is complete and visible (each preprocess CTA waited for it before signalling). Q, K, V and dO come from
          before the preprocess: readable without a wait here.
        - This kernel reads what the preprocess writes: LSE (log2) and dPsum (TMA, producer warp) and the zeroed
          dQaccum (the writer warp's bulk reduce-adds). The producer warp issues K + V and the first Q tile, then
          executes griddepcontrol.wait (the preprocess grid complete, its writes visible to this grid), then the first
          LSE, dO and dPsum. Every later global access of pre's outputs is ordered after that wait: MMA warps consume
          LSE / dPsum only through the pipelines' mbarriers, and the writer warp's first dQ reduce-add needs a dQ
          computed from them. dK / dV (written at the end) and the deterministic semaphores (zeroed before the
          preprocess) are no output of the preprocess. A CTA with no Q tile still waits (after the producer loop):
          this grid then cannot complete before the preprocess has, which the postprocess relies on (rows of dQaccum
          no CTA reduces into keep the preprocess's zeros).
        - Every CTA signals launch_dependents at its start: the postprocess grid launches once the last CTA of this
          grid is resident, and its CTAs take only SMs this kernel has left (one CTA of this kernel fills an SM's
          registers). The postprocess waits (griddepcontrol.wait, before any global access) for this grid to complete
          (with stream_post, for each of its tile's row units to be counted instead: _set_stream_post).
        The value is ignored by varlen (call_varlen launches without the attribute) and by the subclasses (the wide
        kernels have their own launches)."""
        self.pdl = bool(pdl) and not self.varlen and type(self) is FlashBwdSm90

    @property
    def lse_stride(self) -> int:
        """Floats per LSE / dPsum stage in shared memory: tile_m (``stage_rows``, q_tail's shorter tile: the walk's)
        rounded up to 32, so that every stage (a TMA destination) starts 128-byte aligned (80-row tiles: 96; tile_m
        itself for 64 / 128)."""
        return -(-(self.stage_rows or self.tile_m) // 32) * 32

    def _set_schedule(self, dtype, causal, deterministic, det_schedule) -> None:
        """dtype, causal and the deterministic dQ schedule. Causal: the grid launches the diagonal-most K/V tile
        first and dQ turns go shortest-processing-time first, unless a deterministic run asks for the naive schedule
        (K/V tile order for the grid and the turns). Without determinism _set_lpt may then launch the longest K/V tile
        first instead (AttnConfig.bwd_lpt_heads; the hd 64 / 128 causal default since 2026-12-01)."""
        if det_schedule not in ("spt", "naive", "rotate", "lpt"):
            raise ValueError(f"det_schedule={det_schedule!r}: 'spt', 'naive', 'rotate' or 'lpt'")
        self.dtype = dtype
        self.causal = bool(causal)
        self.spt = self.causal and (det_schedule != "naive" or not deterministic)  # causal "rotate" runs SPT
        self.deterministic = bool(deterministic)

    def _set_lpt(self, lpt_heads: int) -> None:
        """``lpt_heads`` (AttnConfig.bwd_lpt_heads; opt-in): a causal, non-deterministic, one-CTA, non-varlen grid
        launches each head's K/V tiles longest first (K/V tile order: tile 0 walks every Q tile), as official FA4's
        non-deterministic grid does, instead of the diagonal-most tile first; with g > 1 the K/V tiles of g
        consecutive (batch, head)s are interleaved (launch rank r of a group: K/V tile r // g of its (r mod g)-th head).
        Why: with shortest-first, each head's longest CTAs start last, so the last head's leave a tail (list-scheduling
        model, 132 SMs, 16k tokens, CTA = Q tiles + 3: hd64 causal 1.037 / 1.027 / 1.001 of ideal at 8k (spt / g=1 /
        g=2 1.002), hd128 80-row 1.073 / 1.002 at 16k, 1.076 / 1.054 / 1.004 at 8k). Elsewhere (deterministic: the
        SPT turns need the SPT grid; two_cta, varlen, non-causal) the value is ignored."""
        if isinstance(lpt_heads, bool) or not isinstance(lpt_heads, int) or lpt_heads < 0:
            raise ValueError(f"lpt_heads={lpt_heads!r}: an int >= 0")
        if self.causal and not self.deterministic and not self.two_cta and not self.varlen and lpt_heads > 0:
            self.lpt_heads = lpt_heads
            self.spt = False

    def _set_det_lpt(self, det_schedule: str, lpt_heads: int) -> None:
        """det_schedule="lpt" (opt-in; after _set_lpt, two_cta / varlen / window known): a deterministic causal
        one-CTA kernel without a window launches its K/V tiles longest first (as the non-deterministic causal grid,
        g = max(``lpt_heads``, DET_LPT_HEADS) heads interleaved, launch_order), walks each K/V tile's Q tiles from
        the last one down to its diagonal tile (m_desc, m_block_at) and takes the dQ turns in K/V tile order (dq_turn
        without spt: turn = n_block; a Q tile's visitors are K/V tiles 0 .. k-1). A CTA then only waits for CTAs of
        its head launched before it (K/V tile n - 1 is launched g ranks before n), so no residency bound is needed
        (det_schedule_for_call keeps it at every length). The walks of a head meet each Q tile in launch order: CTA n
        reaches Q tile m at the same step as n - 1, launched g ranks later. In the first wave a head's CTAs start
        together and the turns space them by one dQ add each (the fill); later the launch spacing (g x the mean CTA
        time / SMs) covers it, hence g >= DET_LPT_HEADS (model: g = 1 loses 4-10% to the fill at 1k-4k, g = 8 / 16
        stay within 1-4% of the default). Why: SPT (the "spt" causal grid) launches each head's longest CTAs last and
        the last heads' leave a tail (list-scheduling model, 132 SMs, 16k tokens, hd128 80-row: 1.07 of ideal at
        4k-16k against 1.00 for the longest-first grid; /work/notes/bwd_s9.md). Elsewhere the value is ignored (spt /
        rotate's rules). Non-causal (every K/V tile walks all M Q tiles, ascending): the K/V tile order turns of
        "naive" with the g heads' tiles interleaved in the grid, so a head's CTA n starts g launch ranks after n - 1:
        only the first wave's CTAs wait for each other (as official FA4's deterministic non-causal grid groups heads;
        the rotated walk instead spaces a Q tile's turns by exactly one step, so every late hand-off adds up)."""
        self.det_lpt = (det_schedule == "lpt" and self.deterministic and not self.two_cta
                        and not self.has_window and not self.varlen and type(self) is FlashBwdSm90)
        if self.det_lpt:
            self.spt = False
            self.m_desc = self.causal  # non-causal walks are all equally long: ascending, as "naive"'s
            self.lpt_heads = max(int(lpt_heads), DET_LPT_HEADS)

    @cute.jit
    def launch_order(self, bidx: Int32, head: Int32, batch: Int32, dims=None):
        """(bidx, head, batch) of this CTA's work: its block index, or with ``lpt_heads`` g > 1 the launch rank (x
        fastest) regrouped so that g consecutive (batch, head)s' K/V tiles alternate (a last, smaller group takes what
        is left). ``dims``: the one-tile launch's grid (roles_persistent), else this launch's."""
        if const_expr(self.lpt_heads > 1):
            if const_expr(dims is None):
                nx, nh, nb = cute.arch.grid_dim()
            else:
                nx, nh, nb = dims
            g = self.lpt_heads
            rank = bidx + nx * (head + nh * batch)
            group = rank // (nx * g)
            first = group * g
            size = nh * nb - first
            if size > g:
                size = Int32(g)
            r = rank - group * (nx * g)
            lin = first + r % size
            bidx = r // size
            head = lin % nh
            batch = lin // nh
        return bidx, head, batch

    def _set_det_rotate(self, det_schedule: str, pairs: bool = False) -> None:
        """det_schedule="rotate" (after _set_schedule / _set_features, two_cta and varlen known): deterministic
        non-causal one-CTA kernels without a window walk rotated (m_rotate) with arrival-order dQ turns (rotate_turn),
        and ``pairs`` (hd256's 2-CTA kernels, bwd_wide_two_cta*.py) their pairs, one contributor each; everything else
        runs the "spt" schedule (causal SPT, K/V tile order otherwise). The turns assume that a head's CTAs are
        co-resident (a CTA waits for CTAs launched after it): backward.py det_schedule_for_call runs "spt" when a head
        has more K/V tiles than the GPU holds at once."""
        self.det_rotate = (det_schedule == "rotate" and self.deterministic and not self.causal
                           and (pairs or not self.two_cta) and not self.has_window and not self.varlen)

    def _set_features(self, window_left: int, window_right: int, softcap: float) -> None:
        """Sliding window and softcap (compile-time; the defaults -1, -1, 0.0 compile the plain kernel). Canonical
        bounds as the forward's: with causal the right bound is the diagonal (window_right -1 or 0 accepted)."""
        for name, w in (("window_left", window_left), ("window_right", window_right)):
            if isinstance(w, bool) or not isinstance(w, int) or w < -1:
                raise ValueError(f"{name}={w!r}: must be an int >= -1 (-1 = unbounded)")
        if self.causal and window_right not in (-1, 0):
            raise ValueError(f"window_right={window_right}: with causal the right bound is the diagonal (pass -1 or 0)")
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap >= 0.0 \
                or softcap == float("inf"):
            raise ValueError(f"softcap={softcap!r}: must be a finite float >= 0 (0 = off)")
        self.window_left = int(window_left)
        self.window_right = -1 if self.causal else int(window_right)
        self.has_window = self.window_left >= 0 or self.window_right >= 0
        self.right_bound = 0 if self.causal else self.window_right  # keys right of the diagonal a row sees; -1: all
        self.softcap = float(softcap)

    def _set_exp2_regs(self, s_cols: int, exp2_emu_fraction: float, consumer_regs: int, producer_regs: int) -> None:
        """exp2 emulation (the forward's polynomial, kernels/sm90/exp2.py): a thread's S^T accumulator of s_cols
        Q columns holds s_cols/8 fragments of 4 values (one per 8 Q rows); whole fragments go to the FMA pipe.
        Then the setmaxnreg split of the producer and MMA warpgroups."""
        self.s_cols = s_cols  # Q columns of a warpgroup's S^T tile
        self.exp2_groups = s_cols // 8
        self.exp2_emu_frags = emulated_fragments(self.exp2_groups, exp2_emu_fraction)
        self.exp2_fraction_compiled = compiled_fraction(self.exp2_groups, exp2_emu_fraction)
        self.consumer_regs = min(240, consumer_regs)
        self.producer_regs = producer_regs
        nwg = self.num_mma_wg + 1  # setmaxnreg moves registers only within the launch allocation (fwd.py's check)
        assert self.producer_regs + self.num_mma_wg * self.consumer_regs <= nwg * (65536 // (128 * nwg) // 8 * 8)

    def _set_gqa(self, qhead_per_kvhead: int) -> None:
        """GQA / MQA group size: the CTA of Q head h loads K/V head h // qhead_per_kvhead (a compile-time constant;
        at 1 the kernel is the MHA one). dK / dV are still written per Q head (the caller sums each group)."""
        if int(qhead_per_kvhead) != qhead_per_kvhead or qhead_per_kvhead < 1:
            raise ValueError(f"qhead_per_kvhead={qhead_per_kvhead}: must be an integer >= 1 (Q heads per K/V head)")
        self.qhead_per_kvhead = int(qhead_per_kvhead)

    # ---------------------------------------------------------------------------------------------
    def _smem_layout(self, rows, cols, stages, major_cols):
        """Row-major (rows, cols, stages) tile of K-major swizzle atoms ``major_cols`` wide."""
        atom_kind = sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, self.dtype, major_cols)
        atom = warpgroup.make_smem_layout_atom(atom_kind, self.dtype)
        return cute.tile_to_shape(atom, (rows, cols, stages), order=(0, 1, 2))

    @staticmethod
    def _kernel_views(mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem):
        """The kernel's mode orders: (b, s, h, d) -> (s, d, h, b); (b, h, s) -> (s, h, b); dQaccum (b, h, s, d) ->
        (s, d, h, b)."""
        mQ, mK, mV, mdO, mdK, mdV = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))
                                     for t in (mQ, mK, mV, mdO, mdK, mdV)]
        mLSE, mdPsum, mSem = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[2, 1, 0]))
                              for t in (mLSE, mdPsum, mSem)]
        mdQaccum = cute.make_tensor(mdQaccum.iterator, cute.select(mdQaccum.layout, mode=[2, 3, 1, 0]))
        return mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem

    def _tma_atoms(self, mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV, sdK_layout, sdV_layout):
        """TMA atoms: loads of Q, dO, K, V, LSE, dPsum into the self.s*_layout tiles (the Q-side ones multicast
        over the cluster when two_cta), stores of dK / dV from sdK_layout / sdV_layout tiles. Returns the
        kernel's arguments ((tQ, tK, tV, tdO, tLSE, tdPsum), (tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum),
        (tdK, tdV, tma_dK, tma_dV))."""
        tm, tn, d, dv, mc = self.tile_m, self.tile_n, self.hdim, self.hdim_v, self.cluster
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        # Q-side tiles: multicast to both CTAs of a cluster when two_cta (each CTA issues half of a tile)
        g2s_q = cpasync.CopyBulkTensorTileG2SMulticastOp() if self.two_cta else g2s
        one = lambda lay: cute.select(lay, mode=[0, 1])
        tma_Q, tQ = cpasync.make_tiled_tma_atom(g2s_q, mQ, one(self.sQ_layout), (tm, d), num_multicast=mc)
        tma_dO, tdO = cpasync.make_tiled_tma_atom(g2s_q, mdO, one(self.sdO_layout), (tm, dv), num_multicast=mc)
        tma_K, tK = cpasync.make_tiled_tma_atom(g2s, mK, one(self.sK_layout), (tn, d))
        tma_V, tV = cpasync.make_tiled_tma_atom(g2s, mV, one(self.sV_layout), (tn, dv))
        tma_LSE, tLSE = cpasync.make_tiled_tma_atom(g2s_q, mLSE, cute.make_layout(tm), (tm,), num_multicast=mc)
        tma_dPsum, tdPsum = cpasync.make_tiled_tma_atom(g2s_q, mdPsum, cute.make_layout(tm), (tm,),
                                                        num_multicast=mc)
        s2g = cpasync.CopyBulkTensorTileS2GOp()
        tma_dK, tdK = cpasync.make_tiled_tma_atom(s2g, mdK, one(sdK_layout), (tn, d))
        tma_dV, tdV = cpasync.make_tiled_tma_atom(s2g, mdV, one(sdV_layout), (tn, dv))
        return ((tQ, tK, tV, tdO, tLSE, tdPsum), (tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum),
                (tdK, tdV, tma_dK, tma_dV))

    def _shared_storage(self, ds_cosize, dq_cosize, p_cosize=None, kp_cosize=0, dsp_cosize=0):
        """The shared-memory struct: mbarriers, LSE / dPsum stages, the Q / dO / K / V tiles (self.s*_layout),
        dS^T, dQ staging. ``p_cosize`` given (FlashBwdWideSm90): a P^T tile before dS^T; None: the two_cta fields
        (the peer's K tile, the received dS half, the dS exchange mbarriers; empty unless two_cta)."""
        R, A = cute.struct.MemRange, cute.struct.Align
        tile = lambda n: A[R[self.dtype, n], 1024]
        tm, qst, dost = self.tile_m, self.q_stages, self.do_stages
        fields = dict(mbar_q=R[cutlass.Int64, qst * 2], mbar_do=R[cutlass.Int64, dost * 2], mbar_kv=R[cutlass.Int64, 2])
        # the dS exchange mbarriers next to the others (two_cta; bwd_dq_stages=2 at hd64): the struct then fits 227 KB
        if self.two_cta or self.ds_mbar_first:
            fields["mbar_dsfull"] = fields["mbar_dsempty"] = R[cutlass.Int64, self.stages]
        fields.update(
            sLSE=A[R[Float32, self.lse_stride * qst], 128], sdPsum=A[R[Float32, self.lse_stride * dost], 128],
            sQ=tile(cute.cosize(self.sQ_layout)), sdO=tile(cute.cosize(self.sdO_layout)),
            sK=tile(cute.cosize(self.sK_layout)), sV=tile(cute.cosize(self.sV_layout)))
        if p_cosize is not None:
            fields["sP"] = tile(p_cosize)
        fields["sdS"] = tile(ds_cosize)
        if p_cosize is None:
            fields["sKp"], fields["sdSp"] = tile(kp_cosize), tile(dsp_cosize)
        fields["sdQ"] = A[R[Float32, dq_cosize], 128]
        if p_cosize is None and not (self.two_cta or self.ds_mbar_first):
            fields["mbar_dsfull"] = fields["mbar_dsempty"] = R[cutlass.Int64, self.stages]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor,
                 mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor,
                 softmax_scale: Float32, stream: cuda.CUstream):
        mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem = self._kernel_views(
            mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem)
        mma_S, mma_dKV, mma_dQ, loads, atoms, (tdK, tdV, tma_dK, tma_dV) = self._host_setup(
            mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV)
        mc = self.cluster
        num_n_blocks = cute.ceil_div(mK.shape[0], self.tile_n)
        grid = (cute.ceil_div(num_n_blocks, mc) * mc, cute.size(mQ.shape[2]), cute.size(mQ.shape[3]))
        self.kernel(*loads, *atoms, mdQaccum, tdK, tdV, tma_dK, tma_dV, mSem, mma_S, mma_dKV, mma_dQ,
                    self.sQ_layout, self.sdO_layout, self.sK_layout, self.sV_layout, self.sdS_layout,
                    self.sdSp_layout, self.sdKV_layout, Float32(softmax_scale), self.score_scale(softmax_scale)).launch(
            grid=grid, block=[self.num_threads, 1, 1], cluster=[mc, 1, 1], stream=stream, min_blocks_per_mp=1,
            use_pdl=self.pdl)

    @cute.jit
    def call_persistent(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                        mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor,
                        mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor,
                        softmax_scale: Float32, num_ctas: Int32, stream: cuda.CUstream):
        """Persistent launch (``persistent=True``, _set_persistent): ``__call__``'s tensors, grid (num_ctas,); the
        caller passes min(SM count, K/V tiles x heads x batch) (kernels/sm90/backward.py)."""
        assert self.persistent, "call_persistent needs FlashBwdSm90(persistent=True)"
        mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem = self._kernel_views(
            mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem)
        mma_S, mma_dKV, mma_dQ, loads, atoms, (tdK, tdV, tma_dK, tma_dV) = self._host_setup(
            mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV)
        self.kernel(*loads, *atoms, mdQaccum, tdK, tdV, tma_dK, tma_dV, mSem, mma_S, mma_dKV, mma_dQ,
                    self.sQ_layout, self.sdO_layout, self.sK_layout, self.sV_layout, self.sdS_layout,
                    self.sdSp_layout, self.sdKV_layout, Float32(softmax_scale), self.score_scale(softmax_scale)).launch(
            grid=(num_ctas, 1, 1), block=[self.num_threads, 1, 1], cluster=[1, 1, 1], stream=stream,
            min_blocks_per_mp=1)

    @cute.jit
    def call_varlen(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                    mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor,
                    mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor, mCuSeqlensQ: cute.Tensor,
                    mCuSeqlensK: cute.Tensor, max_seqlen_k: Int32, softmax_scale: Float32, stream: cuda.CUstream):
        """Variable-length launch (``varlen=True``): packed mQ (total_q, h, d), mK / mV (total_k, h_kv, d), mdO
        (total_q, h, d), mdK / mdV (total_k, h, d) (per Q head); padded mLSE (log2) / mdPsum (h, total_q_pad),
        mdQaccum (h, total_q_pad, d), mSem (h, total_q_pad / tile_m) int32 (one per padded Q tile); mCuSeqlensQ / K
        int32 (b + 1,). Grid (ceil(max_seqlen_k / tile_n), h, b)."""
        assert self.varlen, "call_varlen needs FlashBwdSm90(varlen=True)"
        # (total, h, d) -> (total, d, h); (h, total_pad) -> (total_pad, h); dQaccum and semaphores stay (h, ...)
        mQ, mK, mV, mdO, mdK, mdV = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[0, 2, 1]))
                                     for t in (mQ, mK, mV, mdO, mdK, mdV)]
        mLSE, mdPsum = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0])) for t in (mLSE, mdPsum)]
        mma_S, mma_dKV, mma_dQ, loads, atoms, (_, _, tma_dK, tma_dV) = self._host_setup(
            mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV)
        grid = ((max_seqlen_k + self.tile_n - 1) // self.tile_n, mQ.shape[2], mCuSeqlensQ.shape[0] - 1)
        # dK / dV leave through row-predicated stores (dkdv_store_varlen): the kernel gets the tensors themselves
        self.kernel(*loads, *atoms, mdQaccum, mdK, mdV, tma_dK, tma_dV, mSem, mma_S, mma_dKV, mma_dQ,
                    self.sQ_layout, self.sdO_layout, self.sK_layout, self.sV_layout, self.sdS_layout,
                    self.sdSp_layout, self.sdKV_layout, Float32(softmax_scale), self.score_scale(softmax_scale),
                    mCuSeqlensQ, mCuSeqlensK).launch(
            grid=grid, block=[self.num_threads, 1, 1], cluster=[1, 1, 1], stream=stream, min_blocks_per_mp=1)

    def _host_setup(self, mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV):
        """Shared-memory layouts, tiled MMAs, TMA atoms and the shared storage struct (host side of a launch).
        Returns (mma_S, mma_dKV, mma_dQ, loads, atoms, (tdK, tdV, tma_dK, tma_dV))."""
        tm, tn, d = self.tile_m, self.tile_n, self.hdim
        self.sQ_layout = self._smem_layout(tm, d, self.stages, min(d, 64))
        self.sdO_layout = self._smem_layout(tm, d, self.stages, min(d, 64))
        self.sK_layout = self._smem_layout(tn, d, 1, min(64, d // 2))
        self.sV_layout = self._smem_layout(tn, d, 1, min(d, 64))
        if const_expr(not self.two_cta):
            self.sdS_layout = sm90_utils.make_smem_layout_a(
                LayoutEnum.COL_MAJOR, (tm, 64, tn), self.dtype, self.stages)
            self.sdSp_layout = self.sdS_layout
        else:
            # m-major atoms as wide as one warpgroup's dQ^T N slice, tiled along n first: each half of the
            # Q rows is then one contiguous 8 KB block, the unit sent to the peer CTA
            kind = (warpgroup.SmemLayoutAtomKind.MN_SW64 if self.dq_n == 32
                    else warpgroup.SmemLayoutAtomKind.MN_SW32)
            atom = warpgroup.make_smem_layout_atom(kind, self.dtype)
            self.sdS_layout = cute.tile_to_shape(atom, (tm, tn, self.stages), order=(1, 0, 2))
            self.sdSp_layout = cute.tile_to_shape(atom, (tm // 2, tn, self.stages), order=(1, 0, 2))

        mma_S = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K,
            Float32, (1, 1, 1), (64, tm))
        mma_dKV = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN,
            Float32, (1, 1, 1), (64, d), warpgroup.OperandSource.RMEM)
        if const_expr(not self.two_cta):
            mma_dQ = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, OperandMajorMode.MN, OperandMajorMode.MN,
                Float32, (1, 1, 1), self.dq_shape)
        else:  # dQ^T = K^T dS^T: A = K^T (head dim contiguous), B = dS^T (Q rows contiguous)
            mma_dQ = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, OperandMajorMode.MN, OperandMajorMode.MN,
                Float32, (1, 1, 1), (64, self.dq_n))

        # dK / dV leave through shared memory (the K / V tiles' space) with one TMA store each
        self.sdKV_layout = self._smem_layout(tn, d, 1, min(d, 64))
        loads, atoms, stores = self._tma_atoms(mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV, self.sdKV_layout,
                                               self.sdKV_layout)

        self.bytes_q = tm * d * self.dtype.width // 8 + tm * 4
        self.bytes_do = self.bytes_q
        self.bytes_kv = (3 if self.two_cta else 2) * tn * d * self.dtype.width // 8
        self.bytes_ds_half = (tm // 2) * tn * self.dtype.width // 8
        kp_cosize = cute.cosize(self.sK_layout) if const_expr(self.two_cta) else 0
        dsp_cosize = cute.cosize(self.sdSp_layout) if const_expr(self.two_cta) else 0
        dq_cosize = self.dq_stages * self.num_mma_wg * self.dq_chunk if const_expr(self.dq_smem) else 0

        self.shared_storage = self._shared_storage(cute.cosize(self.sdS_layout), dq_cosize, kp_cosize=kp_cosize,
                                                   dsp_cosize=dsp_cosize)
        size = self.shared_storage.size_in_bytes()
        assert size <= SMEM_BYTES, size
        if type(self) is FlashBwdSm90 and not self.two_cta:  # _set_dq_stages sizes the struct with struct_bytes
            assert size == self.struct_bytes(self.dq_stages, self.ds_mbar_first), (size, self.dq_stages)
        return mma_S, mma_dKV, mma_dQ, loads, atoms, stores

    def score_scale(self, softmax_scale):
        """The kernel's scale_log2 argument: softmax_scale * log2(e), or with a softcap the pre-tanh factor
        softmax_scale / softcap (the exp2 then scales tanh by the compile-time softcap * log2(e), as the forward)."""
        if const_expr(self.softcap > 0.0):
            return Float32(softmax_scale * (1.0 / self.softcap))
        return Float32(softmax_scale * LOG2_E)

    # ---------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
               mLSE: cute.Tensor, mdPsum: cute.Tensor,
               tma_Q: cute.CopyAtom, tma_K: cute.CopyAtom, tma_V: cute.CopyAtom, tma_dO: cute.CopyAtom,
               tma_LSE: cute.CopyAtom, tma_dPsum: cute.CopyAtom,
               mdQaccum: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, tma_dK: cute.CopyAtom,
               tma_dV: cute.CopyAtom, mSem: cute.Tensor,
               mma_S: cute.TiledMma, mma_dKV: cute.TiledMma, mma_dQ: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               sdS_layout: cute.ComposedLayout, sdSp_layout: cute.ComposedLayout, sdKV_layout: cute.ComposedLayout,
               softmax_scale: Float32, scale_log2: Float32, mCuSeqlensQ: cute.Tensor = None,
               mCuSeqlensK: cute.Tensor = None):
        """The launch (its parameters are the kernel's ABI): this CTA's work, shared memory and pipelines, then the
        warp roles; a varlen CTA whose K/V tile starts past its sequence leaves at once."""
        if const_expr(self.pdl):  # the postprocess may launch once every CTA has started (_set_pdl)
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, head, batch = cute.arch.block_idx()
        work = None
        if const_expr(not self.persistent):  # (persistent: each role takes its tiles' work, roles_persistent)
            if const_expr(self.lpt_heads > 1):
                bidx, head, batch = self.launch_order(bidx, head, batch)
            work = self.cta_work(mQ, mK, bidx, head, batch, mCuSeqlensQ, mCuSeqlensK)

        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum):
                cpasync.prefetch_descriptor(atom)

        storage, pipes = self.shared_setup(tidx)
        smem = self.smem_tensors(storage, sQ_layout, sdO_layout, sK_layout, sV_layout, sdS_layout, sdSp_layout,
                                 sdKV_layout)
        gm = BwdGmem(mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem)
        tma = BwdTma(tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum, tma_dK, tma_dV)
        mmas = BwdMmas(mma_S, mma_dKV, mma_dQ)
        if const_expr(self.persistent):
            self.roles_persistent(gm, tma, mmas, smem, storage, pipes, warp_idx, tidx, softmax_scale, scale_log2)
        elif const_expr(self.varlen):
            if bidx * self.tile_n < work.seqlen_k:  # the whole CTA leaves when its K/V tile starts past its sequence
                self.roles(gm, tma, mmas, smem, storage, pipes, work, warp_idx, tidx, softmax_scale, scale_log2)
        else:
            self.roles(gm, tma, mmas, smem, storage, pipes, work, warp_idx, tidx, softmax_scale, scale_log2)
        if const_expr(self.two_cta):
            # no CTA may leave while its peer can still multicast into it or arrive on its barriers
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def cta_work(self, mQ, mK, bidx, head, batch, mCuSeqlensQ, mCuSeqlensK) -> BwdWork:
        """This CTA's BwdWork: sequence lengths (varlen: from the cumulative lengths, with the sequence's offsets and
        first padded Q tile) and the tile schedule."""
        offset_q = 0  # varlen: the sequence's first row in the packed Q / dO and K / V / dK / dV, and its first
        offset_k = 0  # padded Q tile in LSE / dPsum / dQaccum / the semaphores
        pad_tile = 0
        if const_expr(self.varlen):
            offset_q = mCuSeqlensQ[batch]
            seqlen_q = mCuSeqlensQ[batch + 1] - offset_q
            offset_k = mCuSeqlensK[batch]
            seqlen_k = mCuSeqlensK[batch + 1] - offset_k
            pad_tile = varlen_pad_offset(offset_q, batch, self.tile_m) // self.tile_m
        else:
            seqlen_q = mQ.shape[0]
            seqlen_k = mK.shape[0]
        n_block, num_groups, rank, m_block_min, m_block_max = self.tile_schedule(bidx, seqlen_q, seqlen_k)
        q_base = 0
        if const_expr(self.diag_align):  # tiles from the diagonal row (_set_diag_align): tile m at q_base + m * tile_m
            q_base = n_block * self.tile_n - (seqlen_k - seqlen_q)
            if q_base < 0:
                q_base = Int32(0)
            q_base = q_base // 8 * 8
            m_block_min = Int32(0)
            m_block_max = Int32(0)
            if q_base < seqlen_q:
                m_block_max = (seqlen_q - q_base + self.tile_m - 1) // self.tile_m
        return self.with_m_rot(BwdWork(n_block, head, batch, m_block_min, m_block_max, num_groups, rank, seqlen_q,
                                       seqlen_k, offset_q, offset_k, pad_tile, Int32(0), q_base))

    @cute.jit
    def with_m_rot(self, work: BwdWork) -> BwdWork:
        """``work`` with its rotated walk's first Q tile (m_rotate; cta_work and the wide kernels, which build their
        BwdWork themselves): the K/V group index (two_cta: the pair, whose two CTAs walk together) modulo the Q-tile
        count; deterministic (det_rotate), rotate_start's spread starts, which the writer's arrival-order turns
        (bwd_dq_writer.py rotate_turn) assume."""
        if const_expr(not self.m_rotate):
            return work
        count = work.m_block_max - work.m_block_min
        group = work.n_block
        if const_expr(self.cluster > 1):
            group = work.n_block // self.cluster
        m_rot = Int32(0)
        if count > 1:
            if const_expr(self.det_rotate):
                m_rot = rotate_start(group, work.num_groups, count)
            else:
                m_rot = group % count
        return work._replace(m_rot=m_rot)

    @cute.jit
    def m_block_at(self, m_iter, work: BwdWork):
        """The Q tile of loop step m_iter (m_block_min <= m_iter < m_block_max): m_iter itself, or with m_rotate the
        step's tile counted from m_block_min + m_rot, wrapping around at m_block_max, or with m_desc the tiles from the
        last one down (desc_block)."""
        m_block = m_iter
        if const_expr(self.m_desc):
            m_block = desc_block(m_iter, work.m_block_min, work.m_block_max)
        if const_expr(self.m_rotate):
            m_block = m_iter + work.m_rot
            if m_block >= work.m_block_max:
                m_block = m_block - (work.m_block_max - work.m_block_min)
        return m_block

    @cute.jit
    def shared_setup(self, tidx):
        """Allocate the shared storage and the pipelines, init two_cta's dS exchange mbarriers, then sync the CTA
        (two_cta: the cluster) so that every barrier is initialised before use. Returns (storage, BwdPipes)."""
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        pipe_q, pipe_do, pipe_kv = self.make_pipelines(storage)
        if const_expr(self.two_cta):
            if tidx == 0:
                for i in cutlass.range_constexpr(self.stages):
                    cute.arch.mbarrier_init(storage.mbar_dsfull.data_ptr() + i, 1)
                    cute.arch.mbarrier_init(storage.mbar_dsempty.data_ptr() + i, self.num_mma_threads)
        cute.arch.mbarrier_init_fence()
        if const_expr(self.two_cta):
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        return storage, BwdPipes(pipe_q, pipe_do, pipe_kv)

    def smem_tensors(self, storage, sQ_layout, sdO_layout, sK_layout, sV_layout, sdS_layout, sdSp_layout,
                     sdKV_layout) -> BwdSmem:
        """The shared-memory tensors of the storage struct (BwdSmem). Without two_cta sKp / sdSp are sK / sdS; the dK /
        dV staging views alias sK / sV (read by no GEMM any more by the epilogue)."""
        sQ, sdO, sK, sV, sLSE, sdPsum = self.load_tensors(storage, sQ_layout, sdO_layout, sK_layout, sV_layout)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        sKp = sK
        sdSp = sdS
        if const_expr(self.two_cta):
            sKp = storage.sKp.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sdSp = storage.sdSp.get_tensor(sdSp_layout.outer, swizzle=sdSp_layout.inner)
        sdKs = storage.sK.get_tensor(sdKV_layout.outer, swizzle=sdKV_layout.inner)
        sdVs = storage.sV.get_tensor(sdKV_layout.outer, swizzle=sdKV_layout.inner)
        return BwdSmem(sQ, sdO, sK, sV, sLSE, sdPsum, sdS, sKp, sdSp, sdKs, sdVs)

    @cute.jit
    def roles(self, gm: BwdGmem, tma: BwdTma, mmas: BwdMmas, smem: BwdSmem, storage, pipes: BwdPipes, work: BwdWork,
              warp_idx, tidx, softmax_scale, scale_log2):
        """Warp roles: warp 0 loads, warp 1 writes dQ (det_two_writers: warps 1 and 2), warpgroups 1.. compute."""
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.load(gm, tma, smem, pipes, work)
            if const_expr(self.dq_smem):
                if const_expr(self.det_two_writers):  # warps 1 and 2 take the Q tiles in turn (dq_writer_pair)
                    if warp_idx == 1 or warp_idx == 2:
                        self.dq_writer_pair(gm.mdQaccum, gm.mSem, storage.sdQ.data_ptr(), work, warp_idx - 1)
                else:
                    if warp_idx == 1:
                        self.dq_writer(gm.mdQaccum, gm.mSem, storage.sdQ.data_ptr(), work)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            ptrs = DsPtrs(storage.sdS.data_ptr(), storage.sdSp.data_ptr(), storage.sdQ.data_ptr(),
                          storage.mbar_dsfull.data_ptr(), storage.mbar_dsempty.data_ptr())
            self.mma(gm, tma, mmas, smem, ptrs, pipes, work, tidx - 128, softmax_scale, scale_log2)

    @cute.jit
    def tile_work(self, t, gm: BwdGmem) -> BwdWork:
        """Persistent: the BwdWork of tile ``t`` of the one-tile launch's order (block x = K/V tile fastest, then head,
        then batch; lpt_heads regroups that rank as launch_order does)."""
        nx = cute.ceil_div(gm.mK.shape[0], self.tile_n)
        nh = gm.mQ.shape[2]
        nb = gm.mQ.shape[3]
        bidx = t % nx
        hb = t // nx
        head = hb % nh
        batch = hb // nh
        if const_expr(self.lpt_heads > 1):
            bidx, head, batch = self.launch_order(bidx, head, batch, (nx, nh, nb))
        return self.cta_work(gm.mQ, gm.mK, bidx, head, batch, None, None)

    @cute.jit
    def roles_persistent(self, gm: BwdGmem, tma: BwdTma, mmas: BwdMmas, smem: BwdSmem, storage, pipes: BwdPipes,
                         warp_idx, tidx, softmax_scale, scale_log2):
        """roles for ``persistent`` (_set_persistent): every role walks the tiles bx, bx + grid, ... itself, its
        pipeline states (producer, MMA) and dQ hand-off count (writer, MMA: ``step0``, the Q tiles of earlier tiles)
        carried from tile to tile."""
        num_tiles = cute.ceil_div(gm.mK.shape[0], self.tile_n) * gm.mQ.shape[2] * gm.mQ.shape[3]
        bx, _, _ = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
                do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.do_stages)
                for t in cutlass.range(bx, num_tiles, gx, unroll=1):
                    kv_state, q_state, do_state = self.load(gm, tma, smem, pipes, self.tile_work(t, gm),
                                                            (kv_state, q_state, do_state))
            if warp_idx == 1:
                step0 = Int32(0)
                for t in cutlass.range(bx, num_tiles, gx, unroll=1):
                    work = self.tile_work(t, gm)
                    self.dq_writer(gm.mdQaccum, gm.mSem, storage.sdQ.data_ptr(), work, step0)
                    step0 = step0 + (work.m_block_max - work.m_block_min)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            ptrs = DsPtrs(storage.sdS.data_ptr(), storage.sdSp.data_ptr(), storage.sdQ.data_ptr(),
                          storage.mbar_dsfull.data_ptr(), storage.mbar_dsempty.data_ptr())
            f = self.mma_fragments(mmas, smem, self.tile_work(bx, gm), tidx - 128)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            step0 = Int32(0)
            for t in cutlass.range(bx, num_tiles, gx, unroll=1):
                work = self.tile_work(t, gm)
                kv_state, q_state, do_state = self.mma_tile(gm, tma, mmas, smem, ptrs, pipes, work, f, softmax_scale,
                                                            scale_log2, (kv_state, q_state, do_state), step0)
                step0 = step0 + (work.m_block_max - work.m_block_min)

    @cute.jit
    def tile_schedule(self, bidx, seqlen_q, seqlen_k):
        """This CTA's K/V tile and Q-tile range: (n_block, num_groups, rank, m_block_min, m_block_max). A group is a
        two_cta pair of K/V tiles (else one tile), rank the CTA's place in it."""
        tm, tn, mc = self.tile_m, self.tile_n, self.cluster
        num_n_blocks = cute.ceil_div(seqlen_k, tn)
        rank = Int32(0)
        if const_expr(self.two_cta):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        # causal SPT: the diagonal-most K/V tile / pair (fewest Q tiles) is launched first
        num_groups = cute.ceil_div(num_n_blocks, mc)
        group = bidx // mc
        if const_expr(self.spt):
            group = num_groups - 1 - group
        n_block = group * mc + rank
        m_block_max = cute.ceil_div(seqlen_q, tm)
        m_block_min = Int32(0)
        if const_expr(self.has_window):
            # the Q tiles whose rows' windows reach this K/V tile (possibly none: dK / dV stay zero)
            lo, hi = m_block_range_window(n_block, tm, tn, seqlen_q, seqlen_k, self.causal, self.window_left,
                                          self.window_right)
            m_block_min, m_block_max = Int32(lo), Int32(hi)
        elif const_expr(self.causal):
            # both CTAs of a pair walk the Q tiles of the pair's first K/V tile (extra ones are masked)
            first_row = group * mc * tn - (seqlen_k - seqlen_q)
            if first_row < 0:
                first_row = Int32(0)
            m_block_min = first_row // tm
        return n_block, num_groups, rank, m_block_min, m_block_max

    def make_pipelines(self, storage):
        """The producer's TMA pipelines (pipe_q: Q + LSE, pipe_do: dO + dPsum, pipe_kv: K + V once), barriers
        initialised by the caller's sync. Q-side stages are freed by the consumer warps of every CTA that receives
        the multicast (the cluster)."""
        mc = self.cluster
        producer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads // 32)
        q_consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, mc * self.num_mma_threads // 32)
        q_layout = cute.make_layout((1, mc, 1, 1))
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=self.q_stages, producer_group=producer_group,
            consumer_group=q_consumers, tx_count=self.bytes_q, cta_layout_vmnk=q_layout, mcast_mode_mn=(0, 1),
            defer_sync=True)
        pipe_do = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_do.data_ptr(), num_stages=self.do_stages, producer_group=producer_group,
            consumer_group=q_consumers, tx_count=self.bytes_do, cta_layout_vmnk=q_layout, mcast_mode_mn=(0, 1),
            defer_sync=True)
        pipe_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_kv.data_ptr(), num_stages=1, producer_group=producer_group,
            consumer_group=consumer_group, tx_count=self.bytes_kv, defer_sync=True)
        return pipe_q, pipe_do, pipe_kv

    def load_tensors(self, storage, sQ_layout, sdO_layout, sK_layout, sV_layout):
        """Shared-memory tensors of what the producer loads: sQ, sdO, sK, sV, and the LSE / dPsum stages."""
        get = lambda mem, lay: mem.get_tensor(lay.outer, swizzle=lay.inner)
        return (get(storage.sQ, sQ_layout), get(storage.sdO, sdO_layout), get(storage.sK, sK_layout),
                get(storage.sV, sV_layout),
                storage.sLSE.get_tensor(cute.make_layout((self.tile_m, self.q_stages), stride=(1, self.lse_stride))),
                storage.sdPsum.get_tensor(cute.make_layout((self.tile_m, self.do_stages), stride=(1, self.lse_stride))))

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def load(self, gm: BwdGmem, tma: BwdTma, smem: BwdSmem, pipes: BwdPipes, work: BwdWork, states=None):
        """Producer warp: K / V once (load_kv), then per Q tile Q + LSE and dO + dPsum. Varlen: Q / dO / K / V tiles
        start at the sequence's first row (rows past its end are the next sequence's or TMA zero fill: masked by
        seqlen_k, or LSE +inf / dPsum 0 for Q rows), LSE / dPsum tiles at the sequence's padded tile slot.
        ``states`` (persistent): the producer states (kv, q, do) carried from the previous tile, returned advanced."""
        mc = self.cluster
        gK, gV, gQ, gdO, gLSE, gdPsum = self.load_tiles(gm, work)
        rank = work.rank
        tKsK, tKgK = self._tma_part(tma.tma_K, smem.sK, gK)
        tVsV, tVgV = self._tma_part(tma.tma_V, smem.sV, gV)
        tQsQ, tQgQ = self._tma_part(tma.tma_Q, smem.sQ, gQ, rank, mc)
        tdOsdO, tdOgdO = self._tma_part(tma.tma_dO, smem.sdO, gdO, rank, mc)
        tLsL, tLgL = self._tma_part(tma.tma_LSE, smem.sLSE, gLSE, rank, mc)
        tPsP, tPgP = self._tma_part(tma.tma_dPsum, smem.sdPsum, gdPsum, rank, mc)
        mask = {}
        if const_expr(self.two_cta):
            mask = dict(mcast_mask=cutlass.Int16((1 << mc) - 1))

        pipe_q, pipe_do = pipes.pipe_q, pipes.pipe_do
        kv_state = None
        if const_expr(states is None):
            self.load_kv(tma, pipes.pipe_kv, tKsK, tKgK, tVsV, tVgV, smem.sKp, gK, work.n_block)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
            do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.do_stages)
        else:
            kv_state, q_state, do_state = states
            self.load_kv(tma, pipes.pipe_kv, tKsK, tKgK, tVsV, tVgV, smem.sKp, gK, work.n_block, kv_state=kv_state)

        for m_iter in cutlass.range(work.m_block_min, work.m_block_max, unroll=1):
            m_block = self.m_block_at(m_iter, work)
            pipe_q.producer_acquire(q_state)
            bar = pipe_q.producer_get_barrier(q_state)
            lse_block = m_block
            if const_expr(self.varlen):
                lse_block = m_block + work.pad_tile
            cute.copy(tma.tma_Q, tQgQ[None, m_block], tQsQ[None, q_state.index], tma_bar_ptr=bar, **mask)
            if const_expr(self.pdl):
                if m_iter == work.m_block_min:  # K, V, the first Q in flight: now the preprocess's outputs (_set_pdl)
                    cute.arch.griddepcontrol_wait()
            cute.copy(tma.tma_LSE, tLgL[None, lse_block], tLsL[None, q_state.index], tma_bar_ptr=bar, **mask)
            q_state.advance()
            pipe_do.producer_acquire(do_state)
            bar = pipe_do.producer_get_barrier(do_state)
            cute.copy(tma.tma_dO, tdOgdO[None, m_block], tdOsdO[None, do_state.index], tma_bar_ptr=bar, **mask)
            cute.copy(tma.tma_dPsum, tPgP[None, lse_block], tPsP[None, do_state.index], tma_bar_ptr=bar, **mask)
            do_state.advance()
        if const_expr(self.pdl):  # no-op after the loop's wait; a CTA without Q tiles must wait too (_set_pdl)
            cute.arch.griddepcontrol_wait()
        if const_expr(states is not None):
            kv_state.advance()
        return kv_state, q_state, do_state

    @staticmethod
    def _tma_part(atom, s, g, crd=0, n=1):
        """TMA partition of a shared-memory tile s and its global tiles g (all modes but the last grouped)."""
        return cpasync.tma_partition(atom, crd, cute.make_layout(n), cute.group_modes(s, 0, cute.rank(s) - 1),
                                     cute.group_modes(g, 0, cute.rank(g) - 1))

    @cute.jit
    def load_tiles(self, gm: BwdGmem, work: BwdWork):
        """The producer's global tiles (gK, gV, gQ, gdO, gLSE, gdPsum), indexed by tile in the last mode: K / V of the
        head's K/V head (GQA), varlen ones from the sequence's first row (LSE / dPsum: padded, tile pad_tile + m)."""
        tm, tn, d, dv = self.tile_m, self.tile_n, self.hdim, self.hdim_v
        head, batch = work.head, work.batch
        head_kv = head
        if const_expr(self.qhead_per_kvhead > 1):  # GQA / MQA: the group's K/V head (compiles out at group 1)
            head_kv = head // self.qhead_per_kvhead
        if const_expr(self.varlen):
            offset_q, offset_k = work.offset_q, work.offset_k
            gK = cute.local_tile(cute.domain_offset((offset_k, 0), gm.mK[None, None, head_kv]), (tn, d), (None, 0))
            gV = cute.local_tile(cute.domain_offset((offset_k, 0), gm.mV[None, None, head_kv]), (tn, dv), (None, 0))
            gQ = cute.local_tile(cute.domain_offset((offset_q, 0), gm.mQ[None, None, head]), (tm, d), (None, 0))
            gdO = cute.local_tile(cute.domain_offset((offset_q, 0), gm.mdO[None, None, head]), (tm, dv), (None, 0))
            gLSE = cute.local_tile(gm.mLSE[None, head], (tm,), (None,))  # padded: tile pad_tile + m_block
            gdPsum = cute.local_tile(gm.mdPsum[None, head], (tm,), (None,))
        elif const_expr(self.diag_align):  # Q-side tiles from row q_base (_set_diag_align)
            q_base = work.q_base
            gK = cute.local_tile(gm.mK[None, None, head_kv, batch], (tn, d), (None, 0))
            gV = cute.local_tile(gm.mV[None, None, head_kv, batch], (tn, dv), (None, 0))
            gQ = cute.local_tile(cute.domain_offset((q_base, 0), gm.mQ[None, None, head, batch]), (tm, d), (None, 0))
            gdO = cute.local_tile(cute.domain_offset((q_base, 0), gm.mdO[None, None, head, batch]), (tm, dv),
                                  (None, 0))
            gLSE = cute.local_tile(cute.domain_offset((q_base,), gm.mLSE[None, head, batch]), (tm,), (None,))
            gdPsum = cute.local_tile(cute.domain_offset((q_base,), gm.mdPsum[None, head, batch]), (tm,), (None,))
        else:
            gK = cute.local_tile(gm.mK[None, None, head_kv, batch], (tn, d), (None, 0))
            gV = cute.local_tile(gm.mV[None, None, head_kv, batch], (tn, dv), (None, 0))
            gQ = cute.local_tile(gm.mQ[None, None, head, batch], (tm, d), (None, 0))
            gdO = cute.local_tile(gm.mdO[None, None, head, batch], (tm, dv), (None, 0))
            gLSE = cute.local_tile(gm.mLSE[None, head, batch], (tm,), (None,))
            gdPsum = cute.local_tile(gm.mdPsum[None, head, batch], (tm,), (None,))
        return gK, gV, gQ, gdO, gLSE, gdPsum

    @cute.jit
    def load_kv(self, tma: BwdTma, pipe_kv, tKsK, tKgK, tVsV, tVgV, sKp, gK, n_block, kv_state=None):
        """K and V of this CTA's tile once, on one barrier (two_cta: and the peer's K tile into sKp); persistent
        (``kv_state`` carried): once the MMA warps have released the previous tile's (its dK / dV store read them)."""
        if const_expr(kv_state is None):
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_kv.producer_acquire(kv_state)
        bar = pipe_kv.producer_get_barrier(kv_state)
        cute.copy(tma.tma_K, tKgK[None, n_block], tKsK[None, 0], tma_bar_ptr=bar)
        cute.copy(tma.tma_V, tVgV[None, n_block], tVsV[None, 0], tma_bar_ptr=bar)
        if const_expr(self.two_cta):
            tKpsKp, _ = self._tma_part(tma.tma_K, sKp, gK)
            cute.copy(tma.tma_K, tKgK[None, n_block ^ 1], tKpsKp[None, 0], tma_bar_ptr=bar)

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def mma(self, gm: BwdGmem, tma: BwdTma, mmas: BwdMmas, smem: BwdSmem, ptrs: DsPtrs, pipes: BwdPipes,
            work: BwdWork, tidx, softmax_scale, scale_log2):
        """MMA warpgroups: the operand fragments once (mma_fragments), wait for K / V, then one m_block_step per Q tile,
        then the dK / dV epilogue. ``tidx``: the thread among the MMA threads."""
        f = self.mma_fragments(mmas, smem, work, tidx)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipes.pipe_kv.consumer_wait(kv_state)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        self.mma_walk(gm, tma, mmas, smem, ptrs, pipes, work, f, q_state, do_state, softmax_scale, scale_log2)

    @cute.jit
    def mma_walk(self, gm: BwdGmem, tma: BwdTma, mmas: BwdMmas, smem: BwdSmem, ptrs: DsPtrs, pipes: BwdPipes,
                 work: BwdWork, f: MmaFrags, q_state, do_state, softmax_scale, scale_log2, step0=None):
        """One K/V tile's Q-tile steps (m_block_step) and its dK / dV epilogue; returns the advanced consumer states
        (``step0``: m_block_step's, persistent)."""
        for m_block in cutlass.range(work.m_block_min, work.m_block_max, unroll=1):
            if const_expr(self.q_tail):  # the last tile over its 16-row blocks below seqlen_q (_set_q_tail)
                blocks = self.tile_m // 16
                nq = blocks
                if m_block == work.m_block_max - 1:
                    nq = cutlass.min((work.seqlen_q - (m_block * self.tile_m + work.q_base) + 15) // 16, blocks)
                for v in cutlass.range_constexpr(1, blocks):
                    if nq == v:
                        self.tail_step(v, mmas, f, smem, ptrs, pipes, q_state, do_state, m_block, work, scale_log2,
                                       step0)
                if nq == blocks:
                    self.m_block_step(mmas, f, smem, ptrs, pipes, q_state, do_state, m_block, work, scale_log2, step0)
            else:
                self.m_block_step(mmas, f, smem, ptrs, pipes, q_state, do_state, m_block, work, scale_log2, step0)
            q_state.advance()
            do_state.advance()
        if const_expr(self.dq_defer):
            if work.m_block_min < work.m_block_max:  # the last tile's dQ
                self.dq_publish(f.wg)
        dest = DkdvDest(smem.sdKs, smem.sdVs, tma.tma_dK, tma.tma_dV, gm.mdK, gm.mdV, work.n_block, work.head,
                        work.batch, work.offset_k)
        self.dkdv_epilogue(f.acc_dK, f.acc_dV, mmas.mma_dKV, mmas.mma_dKV, dest, f.pds_bar, f.wg, f.tid, f.tidx,
                           softmax_scale, work.seqlen_k)
        return q_state, do_state

    @cute.jit
    def mma_tile(self, gm: BwdGmem, tma: BwdTma, mmas: BwdMmas, smem: BwdSmem, ptrs: DsPtrs, pipes: BwdPipes,
                 work: BwdWork, f: MmaFrags, softmax_scale, scale_log2, states, step0):
        """Persistent MMA warpgroups, one K/V tile: ``mma``'s loop and epilogue with the fragments of the CTA's first
        tile (``f``; this tile's first K/V row and dK / dV zeroed here), the consumer states ``states`` (kv, q, do)
        carried and returned, ``step0`` the dQ hand-offs before this tile; then K / V back to the producer once the
        epilogue's dK / dV store has read them (the staging aliases sK / sV)."""
        kv_state, q_state, do_state = states
        f = f._replace(n_row0=work.n_block * self.tile_n + f.wg * 64, causal_off=work.seqlen_k - work.seqlen_q)
        f.acc_dK.fill(0.0)
        f.acc_dV.fill(0.0)
        pipes.pipe_kv.consumer_wait(kv_state)
        q_state, do_state = self.mma_walk(gm, tma, mmas, smem, ptrs, pipes, work, f, q_state, do_state, softmax_scale,
                                          scale_log2, step0)
        f.pds_bar.arrive_and_wait()  # thread 0's store has read sK / sV (dkdv_store's wait)
        pipes.pipe_kv.consumer_release(kv_state)
        kv_state.advance()
        return kv_state, q_state, do_state

    @cute.jit
    def tail_step(self, nq: cutlass.Constexpr[int], mmas: BwdMmas, f: MmaFrags, smem: BwdSmem, ptrs: DsPtrs,
                  pipes: BwdPipes, q_state, do_state, m_block, work: BwdWork, scale_log2, step0=None):
        """q_tail: Q tile ``m_block`` (a walk's last) as a tile of its first 16 nq rows: the step of _tail_kernel(nq)
        on fragments of that size over the first rows of the stage's Q / dO / dS^T tiles; dK / dV accumulate into
        ``f``'s accumulators."""
        k = self._tail_kernel(nq)
        n, st = 16 * nq, self.stages
        smem_t = smem._replace(sQ=cute.local_tile(smem.sQ, (n, self.hdim, st), (0, 0, 0)),
                               sdO=cute.local_tile(smem.sdO, (n, self.hdim, st), (0, 0, 0)),
                               sdS=cute.local_tile(smem.sdS, (n, self.tile_n, st), (0, 0, 0)))
        mma_S = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K,
                                                  Float32, (1, 1, 1), (64, n))
        mma_dQ = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, OperandMajorMode.MN, OperandMajorMode.MN,
                                                   Float32, (1, 1, 1), k.dq_shape)
        tid = tid_x_volatile() % 128  # (read again here, as lse_views_fresh: kept from the setup, it spilled)
        s_frags = k.s_fragments(mma_S, smem_t, f.wg, tid)
        kv_frags = k.dkv_fragments(mmas.mma_dKV, mmas.mma_dKV, smem_t, s_frags["acc_S"], tid)
        kv_frags.update(acc_dV=f.acc_dV, acc_dK=f.acc_dK)
        dq_frags = k.dq_fragments(mma_dQ, smem_t, f.wg, tid, work.rank)
        f_t = f._replace(**s_frags, **kv_frags, **dq_frags)
        k.m_block_step(BwdMmas(mma_S, mmas.mma_dKV, mma_dQ), f_t, smem_t, ptrs, pipes, q_state, do_state, m_block,
                       work, scale_log2, step0, row_tile=self.tile_m)

    # ---- operand fragments of an MMA warpgroup (built once per CTA) -----------------------------------
    @cute.jit
    def mma_fragments(self, mmas: BwdMmas, smem: BwdSmem, work: BwdWork, tidx) -> MmaFrags:
        """This warpgroup's MmaFrags: S^T / dP^T, dK / dV and dQ operands and accumulators (dK / dV zeroed), the named
        barrier of the MMA warpgroups, its first K/V row and seqlen_k - seqlen_q."""
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tid = tidx % 128
        s_frags = self.s_fragments(mmas.mma_S, smem, wg, tid)
        kv_frags = self.dkv_fragments(mmas.mma_dKV, mmas.mma_dKV, smem, s_frags["acc_S"], tid)
        dq_frags = self.dq_fragments(mmas.mma_dQ, smem, wg, tid, work.rank)
        pds_bar = pipeline.NamedBarrier(barrier_id=int(Bar.BWD_PDS), num_threads=self.num_mma_threads)
        n_row0 = work.n_block * self.tile_n + wg * 64
        causal_off = work.seqlen_k - work.seqlen_q
        return MmaFrags(wg=wg, tid=tid, tidx=tidx, pds_bar=pds_bar, n_row0=n_row0, causal_off=causal_off, **s_frags,
                        **kv_frags, **dq_frags)

    def s_fragments(self, mma_S, smem: BwdSmem, wg, tid) -> dict:
        """S^T / dP^T = K_w Q^T / V_w dO^T: A fragments of this warpgroup's K / V rows, B fragments of every Q / dO
        stage, the accumulators, their (K/V row, Q row) coordinates, the LSE / dPsum stages broadcast to them, and the
        stmatrix partition of the dS^T stages."""
        tm, d = self.tile_m, self.hdim
        thr_S = mma_S.get_slice(tid)
        sK_w = cute.local_tile(smem.sK[None, None, 0], (64, d), (wg, 0))
        sV_w = cute.local_tile(smem.sV[None, None, 0], (64, d), (wg, 0))
        tSrK = thr_S.make_fragment_A(thr_S.partition_A(sK_w))
        tSrV = thr_S.make_fragment_A(thr_S.partition_A(sV_w))
        tSrQ = thr_S.make_fragment_B(thr_S.partition_B(smem.sQ))
        tSrdO = thr_S.make_fragment_B(thr_S.partition_B(smem.sdO))
        acc_S = cute.make_rmem_tensor(thr_S.partition_shape_C((64, tm)), Float32)
        acc_dP = cute.make_rmem_tensor(thr_S.partition_shape_C((64, tm)), Float32)
        # coordinates (local K/V row, local Q row) of each accumulator element, LSE / dPsum broadcast
        tScS = thr_S.partition_C(cute.make_identity_tensor((64, tm)))
        tSsLSE, tSsdPsum = self.lse_dpsum_views(thr_S, smem)
        sdSt = transpose_view(smem.sdS)  # (tn, tm, stages): Q rows contiguous, as the accumulator's columns
        # dS^T fragment -> shared memory with stmatrix (8x8 bf16 matrices, 4 per instruction)
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_st = cute.make_tiled_copy_C(st_atom, mma_S).get_slice(tid)
        tSsdS_all = thr_st.partition_D(cute.local_tile(sdSt, (64, tm, self.stages), (wg, 0, 0)))
        return dict(tSrK=tSrK, tSrV=tSrV, tSrQ=tSrQ, tSrdO=tSrdO, acc_S=acc_S, acc_dP=acc_dP, tScS=tScS,
                    tSsLSE=tSsLSE, tSsdPsum=tSsdPsum, st_atom=st_atom, thr_st=thr_st, tSsdS_all=tSsdS_all)

    def dkv_fragments(self, mma_dK, mma_dV, smem: BwdSmem, acc_S, tid) -> dict:
        """dV += P^T dO (64 x hdim_v), dK += dS^T Q (64 x hdim), both RS: B fragments of every dO / Q stage, the P^T /
        dS^T A fragments (and their views in the S^T accumulator's layout), and the dV / dK accumulators, zeroed. One
        tiled MMA for both here (``mma_dK is mma_dV``); FlashBwd192Sm90 passes two (its dK and dV widths differ)."""
        tm, d, dv = self.tile_m, self.hdim, self.hdim_v
        thr_dV = mma_dV.get_slice(tid)
        thr_dK = thr_dV if mma_dK is mma_dV else mma_dK.get_slice(tid)
        tdVrdO = thr_dV.make_fragment_B(thr_dV.partition_B(transpose_view(smem.sdO)))
        tdKrQ = thr_dK.make_fragment_B(thr_dK.partition_B(transpose_view(smem.sQ)))
        rP = thr_dV.make_fragment_A(thr_dV.partition_shape_A((64, tm)))
        rdS = thr_dK.make_fragment_A(thr_dK.partition_shape_A((64, tm)))
        rP_acc = cute.make_tensor(rP.iterator, acc_S.layout)
        rdS_acc = cute.make_tensor(rdS.iterator, acc_S.layout)
        acc_dV = cute.make_rmem_tensor(thr_dV.partition_shape_C((64, dv)), Float32)
        acc_dK = cute.make_rmem_tensor(thr_dK.partition_shape_C((64, d)), Float32)
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)
        return dict(tdVrdO=tdVrdO, tdKrQ=tdKrQ, rP=rP, rdS=rdS, rP_acc=rP_acc, rdS_acc=rdS_acc, acc_dV=acc_dV,
                    acc_dK=acc_dK)

    def dq_fragments(self, mma_dQ, smem: BwdSmem, wg, tid, rank) -> dict:
        """dQ operands and accumulator: dQ[:, half w] = dS K[:, half w] (64-row tiles) or dQ[rows w] = dS[rows w] K
        (128-row tiles); dQ^T[d-half w] = K^T[d-half w] dS^T (80-row tiles); two_cta: dQ^T[d-slice, own Q rows] =
        K^T dS^T (own tile) + Kp^T dSp^T (peer tile), q0 the warpgroup's first Q row (dS B fragments: per tile)."""
        tm, tn, d = self.tile_m, self.tile_n, self.hdim
        sK, sdS = smem.sK, smem.sdS
        tdQrdS = tdQrKp = q0 = None
        thr_dQ = mma_dQ.get_slice(tid)
        if const_expr(self.dq_transposed):
            # dQ^T[d-half w] = K^T[d-half w] dS^T (80-row tiles): A = K^T (head dim contiguous), B = dS^T as the
            # (Q rows, K/V rows) tile sdS itself (Q rows contiguous, MN-major)
            sKt_w = cute.local_tile(transpose_view(sK)[None, None, 0], (64, tn), (wg, 0))
            tdQrK = thr_dQ.make_fragment_A(thr_dQ.partition_A(sKt_w))
            tdQrdS = thr_dQ.make_fragment_B(thr_dQ.partition_B(sdS))
            acc_dQ = cute.make_rmem_tensor(thr_dQ.partition_shape_C(self.dq_shape), Float32)
        elif const_expr(not self.two_cta):
            # dQ[:, half w] = dS K[:, half w] (64-row tiles) or dQ[rows w] = dS[rows w] K (128-row tiles)
            dq_m, dq_n = self.dq_shape
            sdS_w = cute.local_tile(sdS, (dq_m, tn, self.stages), (wg * self.dq_split_rows, 0, 0))
            tdQrdS = thr_dQ.make_fragment_A(thr_dQ.partition_A(sdS_w))
            sKt_w = cute.local_tile(transpose_view(sK)[None, None, 0], (dq_n, tn), (wg * (1 - self.dq_split_rows), 0))
            tdQrK = thr_dQ.make_fragment_B(thr_dQ.partition_B(sKt_w))
            acc_dQ = cute.make_rmem_tensor(thr_dQ.partition_shape_C(self.dq_shape), Float32)
        else:
            # dQ^T[d-slice, own Q rows] = K^T dS^T (own tile) + Kp^T dSp^T (peer tile)
            d0 = wg * 64 if const_expr(d == 128) else 0
            q0 = rank * (tm // 2) + (0 if const_expr(d == 128) else wg * self.dq_n)
            sKt = cute.local_tile(transpose_view(sK)[None, None, 0], (64, tn), (d0 // 64, 0))
            sKpt = cute.local_tile(transpose_view(smem.sKp)[None, None, 0], (64, tn), (d0 // 64, 0))
            tdQrK = thr_dQ.make_fragment_A(thr_dQ.partition_A(sKt))
            tdQrKp = thr_dQ.make_fragment_A(thr_dQ.partition_A(sKpt))
            acc_dQ = cute.make_rmem_tensor(thr_dQ.partition_shape_C((64, self.dq_n)), Float32)
        return dict(thr_dQ=thr_dQ, tdQrK=tdQrK, tdQrdS=tdQrdS, tdQrKp=tdQrKp, acc_dQ=acc_dQ, q0=q0)

    # ---- stages of one Q tile (MMA warpgroups) --------------------------------------------------------
    @cute.jit
    def m_block_step(self, mmas: BwdMmas, f: MmaFrags, smem: BwdSmem, ptrs: DsPtrs, pipes: BwdPipes, q_state,
                     do_state, m_block, work: BwdWork, scale_log2, step0=None, row_tile: cutlass.Constexpr[int] = 0):
        """One Q tile: P^T and dS^T (p_and_ds), dV and the dS^T exchange (ds_exchange), then dQ (handed to the writer
        warp) and dK (dq_dk_one_cta / dq_dk_two_cta), which release the Q and dO stages. ``step0`` (persistent): the
        dQ hand-offs of the CTA's earlier K/V tiles, so the staging buffers alternate across tiles as the writer's."""
        sidx = q_state.index
        step = m_block - work.m_block_min
        it = step
        if const_expr(step0 is not None):
            it = step + step0
        if const_expr(self.m_rotate or self.m_desc):  # ``m_block`` is the loop step: its tile (m_block_at); ``it``
            m_block = self.m_block_at(m_block, work)  # stays the step
        m_row0 = m_block * (row_tile or self.tile_m)  # (row_tile: tail_step's, the walk's tile size)
        if const_expr(self.diag_align):
            m_row0 = m_row0 + work.q_base
        tLSE, tdPsum = f.tSsLSE[None, None, None, sidx], f.tSsdPsum[None, None, None, sidx]
        if const_expr(self.lse_fresh(cute.size(f.acc_S))):
            tLSE, tdPsum = self.lse_views_fresh(mmas.mma_S, smem, sidx)
        s_ops = SOperands(mmas.mma_S, f.acc_S, f.acc_dP, f.tSrK, f.tSrV, f.tSrQ[None, None, None, sidx],
                          f.tSrdO[None, None, None, sidx], f.tScS, tLSE, tdPsum, f.rP_acc, f.rdS_acc)
        rows = TileRows(work.n_block, f.n_row0, m_row0, work.seqlen_k, f.causal_off, scale_log2)
        if const_expr(self.dq_defer):
            # S^T first, then the end of the previous tile's dQ hand-off while it runs (dq_defer), then p_and_ds
            pipes.pipe_q.consumer_wait(q_state)
            wgmma(mmas.mma_S, f.acc_S, f.tSrK, s_ops.tSrQ, zero_init=True)
            if step > 0:
                self.dq_publish(f.wg)
        self.p_and_ds(s_ops, pipes, q_state, do_state, rows, self.dq_defer)
        self.ds_exchange(mmas.mma_dKV, f, ptrs, sidx, it, work.rank)
        if const_expr(not self.two_cta):
            self.dq_dk_one_cta(mmas, f, ptrs.sdQ, pipes, q_state, do_state, sidx, it)
        else:
            self.dq_dk_two_cta(mmas, f, smem, ptrs, pipes, q_state, do_state, sidx, it, work.rank)

    def lse_preload(self, n_values: int) -> bool:
        """Whether p_and_ds loads a Q tile's LSE values into registers while its S^T GEMM is issued (``n_values``: S^T
        accumulator values per thread). The Nsight Compute source profile (H200 hd128 s8k, 2026-12-02) showed the
        exponentials' FFMA after each LSE LDS.64 stalled on the load (~7% of the kernel's warp samples). H200 vs the
        late loads: hd128 non-causal 1.023 / 1.046 / 1.050x at 1k / 8k / 16k (session_ab/bwd128nc_preload_lse.jsonl),
        hd256 2-CTA 1.032 / 1.029x at 8k non-causal / causal (bwd256_preload_lse.jsonl). hd128 80-row tiles (20
        values; causal through lse_views_fresh: 1.014 / 1.032 / 1.034x at 1k / 8k / 16k, deterministic causal
        1.008 / 1.010 / 1.007x, session_ab/bwd128c_preload_fresh.jsonl) and the hd256 2-CTA kernel (8, not
        deterministic). hd128 deterministic non-causal with two dQ writers (the default since 2026-12-03, through
        lse_views_fresh): 1.036 / 1.027 / 1.022x two writers without it at 8k / 16k / 32k
        (session_ab/bwd128nc_det_2w_preload.jsonl; varlen keeps the late loads: not GPU-tested with it). Late loads:
        hd128's deterministic non-causal kernel with one writer (with the preload and lse_views_fresh 1.000 / 0.993 /
        0.988x: its MMA warps then wait at the dQ staging store for the writer's completion, fence and release
        instead), the opt-in rotated walk (bwd_rotate_q; not timed), the opt-in
        deterministic causal walks "lpt" and "naive" (5 LDL / 3 STL each even with lse_views_fresh), window / softcap
        kernels and the one-CTA hd256 kernel (varlen / two_cta=False)."""
        if self.has_window or self.softcap > 0.0:
            return False
        if self.hdim == 256:
            return self.two_cta and not self.deterministic
        return (self.hdim == 128 and not self.two_cta and n_values == 40
                and ((self.causal and self.spt and not self.det_lpt) or not (self.deterministic or self.m_rotate)
                     or (self.det_two_writers and not self.causal and not self.varlen)))

    def lse_fresh(self, n_values: int) -> bool:
        """Whether the Q-tile step rebuilds the LSE / dPsum views (lse_views_fresh): hd128's causal and deterministic
        kernels with the LSE preload, which spilled without it."""
        return self.lse_preload(n_values) and self.hdim == 128 and (self.causal or self.deterministic)

    @cute.jit
    def lse_views_fresh(self, mma_S, smem: BwdSmem, sidx):
        """Stage ``sidx``'s LSE / dPsum views (as s_fragments' tSsLSE / tSsdPsum) rebuilt in the Q-tile step from a
        volatile read of the thread index. With the views of the setup, ptxas kept their per-thread offset across the
        loop and, in the causal hd128 kernel with the LSE preload, spilled it (1 STL before the loop, 1 LDL per Q tile;
        CPU SASS); rebuilt here, it has none (nor do the deterministic and rotated-walk kernels with the preload, which
        spilled 3 LDL / 2 STL and 7 LDL with the setup's views)."""
        tLSE, tdPsum = self.lse_dpsum_views(mma_S.get_slice(tid_x_volatile() % 128), smem)
        return tLSE[None, None, None, sidx], tdPsum[None, None, None, sidx]

    def lse_dpsum_views(self, thr_S, smem: BwdSmem):
        """The LSE / dPsum stages broadcast over the K/V rows, partitioned as thread ``thr_S``'s S^T accumulator (one
        value per accumulator element: its Q row's)."""
        bcast = cute.make_layout((64, self.tile_m, self.stages), stride=(0, 1, self.lse_stride))
        return (thr_S.partition_C(cute.make_tensor(smem.sLSE.iterator, bcast)),
                thr_S.partition_C(cute.make_tensor(smem.sdPsum.iterator, bcast)))

    @cute.jit
    def ds_exchange(self, mma_dKV, f: MmaFrags, ptrs: DsPtrs, sidx, it, rank):
        """dS exchange: dV += P^T dO and dS^T into shared memory stage sidx, where both warpgroups (two_cta: and the
        peer CTA, which is sent its Q-row half) read it. One CTA issues dV first (ds_store_first: right after the
        stmatrix, before the fence and the barrier), two_cta after the send (ds_send)."""
        if const_expr(self.ds_store_first):  # stmatrix, dV, then the fence and the PdS barrier (ds_to_smem's tail)
            cute.copy(f.st_atom, f.thr_st.retile(f.rdS_acc), f.tSsdS_all[None, None, None, sidx])
            wgmma(mma_dKV, f.acc_dV, f.rP, f.tdVrdO[None, None, None, sidx], zero_init=False)  # dV += P^T dO
            cute.arch.fence_view_async_shared()
            f.pds_bar.arrive_and_wait()
        else:
            if const_expr(not self.two_cta or self.two_cta_dv_first):
                wgmma(mma_dKV, f.acc_dV, f.rP, f.tdVrdO[None, None, None, sidx], zero_init=False)  # dV += P^T dO
            self.ds_to_smem(f.st_atom, f.thr_st, f.rdS_acc, f.tSsdS_all[None, None, None, sidx], f.pds_bar,
                            ptrs.mbar_dsempty + sidx, it)
            if const_expr(self.two_cta):
                self.ds_send(ptrs.sdS, ptrs.sdSp, ptrs.mbar_dsfull, sidx, f.tidx, rank)
                if const_expr(not self.two_cta_dv_first):
                    wgmma(mma_dKV, f.acc_dV, f.rP, f.tdVrdO[None, None, None, sidx], zero_init=False)  # dV += P^T dO

    @cute.jit
    def p_and_ds(self, s: SOperands, pipes: BwdPipes, q_state, do_state, rows: TileRows,
                 s_issued: cutlass.Constexpr[bool] = False):
        """S^T = K_w Q^T and dP^T = V_w dO^T; P^T = exp2(S^T * scale_log2 - LSE_log2) (masked only on tiles that
        cross seqlen_k or the diagonal) and dS^T = P^T (dP^T - dPsum), both converted into their A fragments."""
        mma_S, acc_S, acc_dP, tLSE, tdPsum = s.mma_S, s.acc_S, s.acc_dP, s.tLSE, s.tdPsum
        if const_expr(not s_issued):  # (``s_issued``: the caller waited for Q and issued S^T)
            pipes.pipe_q.consumer_wait(q_state)
            wgmma(mma_S, acc_S, s.tSrK, s.tSrQ, zero_init=True)
        # LSE / dPsum into registers while the GEMMs run (loaded after a wait_group they sat on the S -> P -> dS
        # path); only where the registers allow (64-row Q tiles without window / softcap: 16 + 16 values; hd64's
        # 128-row tiles and hd128 causal + window + softcap spill) and where it was run on the GPU (hd128 one-CTA:
        # tests passed, H200 s8k non-causal 0.9% faster, otherwise within noise; not the wide kernels nor two_cta).
        # Not at 80-row tiles (20 + 20 values): LSE + dPsum spilled 21-24 LDL (CPU SASS); they preload LSE alone
        preload = const_expr(self.hdim == 128 and not self.two_cta and cute.size(acc_S) <= 32
                             and not (self.has_window or self.softcap > 0.0))
        # LSE alone, loaded while S^T is issued (lse_preload)
        preload_lse = const_expr(self.lse_preload(cute.size(acc_S)))
        rLSE, rdPsum = tLSE, tdPsum
        if const_expr(preload or preload_lse):
            rLSE = cute.make_rmem_tensor(acc_S.layout, Float32)
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                rLSE[i] = tLSE[i]
        pipes.pipe_do.consumer_wait(do_state)
        wgmma(mma_S, acc_dP, s.tSrV, s.tSrdO, zero_init=True, fence=False)
        if const_expr(preload):
            rdPsum = cute.make_rmem_tensor(acc_dP.layout, Float32)
            for i in cutlass.range_constexpr(cute.size(acc_dP)):
                rdPsum[i] = tdPsum[i]
        warpgroup.wait_group(1)
        if const_expr(self.has_window or self.softcap > 0.0):
            self.p_ds_features(acc_S, acc_dP, s.tScS, rLSE, rdPsum, s.rP_acc, s.rdS_acc, rows.n_row0, rows.m_row0,
                               rows.seqlen_k, rows.causal_off, rows.scale_log2)
        else:
            self.p_ds_plain(acc_S, acc_dP, s.tScS, rLSE, rdPsum, s.rP_acc, s.rdS_acc, rows.n_block, rows.n_row0,
                            rows.m_row0, rows.seqlen_k, rows.causal_off, rows.scale_log2)

    @cute.jit
    def p_ds_plain(self, acc_S, acc_dP, tScS, tLSE, tdPsum, rP_acc, rdS_acc, n_block, n_row0, m_row0, seqlen_k,
                   causal_off, scale_log2):
        """P^T and dS^T without window or softcap (the mask: seqlen_k and the causal diagonal)."""
        need_mask = (n_block + 1) * self.tile_n > seqlen_k
        if const_expr(self.causal):
            need_mask = need_mask | ((n_block + 1) * self.tile_n - 1 > m_row0 + causal_off)
        if const_expr(self.ds_split > 0):
            # one wait for dP^T between two uniform branches (one WARPGROUP.DEPBAR in the SASS, as the serial path);
            # each branch holds all of its half's work, ptxas schedules within a branch
            k, n = self.ds_split, cute.size(acc_S)
            if need_mask:
                self.p_part(acc_S, acc_dP, tScS, tLSE, tdPsum, rP_acc, rdS_acc, n_row0, m_row0, seqlen_k, causal_off,
                            scale_log2, 0, k, False, True)
            else:
                self.p_part(acc_S, acc_dP, tScS, tLSE, tdPsum, rP_acc, rdS_acc, n_row0, m_row0, seqlen_k, causal_off,
                            scale_log2, 0, k, False, False)
            warpgroup.wait_group(0)
            if need_mask:
                self.p_part(acc_S, acc_dP, tScS, tLSE, tdPsum, rP_acc, rdS_acc, n_row0, m_row0, seqlen_k, causal_off,
                            scale_log2, k, n, True, True)
            else:
                self.p_part(acc_S, acc_dP, tScS, tLSE, tdPsum, rP_acc, rdS_acc, n_row0, m_row0, seqlen_k, causal_off,
                            scale_log2, k, n, True, False)
        else:
            if need_mask:
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    r, c = tScS[i]
                    n_g = n_row0 + r
                    masked = n_g >= seqlen_k
                    if const_expr(self.causal):
                        masked = masked | (n_g > m_row0 + c + causal_off)
                    p = self.exp2_elem(acc_S[i] * scale_log2 - tLSE[i], i)
                    acc_S[i] = Float32(0.0) if masked else p
            else:
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    acc_S[i] = self.exp2_elem(acc_S[i] * scale_log2 - tLSE[i], i)
            rP_acc.store(acc_S.load().to(self.dtype))
            self.ds_from_p(acc_S, acc_dP, tdPsum, rdS_acc)

    @cute.jit
    def p_part(self, acc_S, acc_dP, tScS, tLSE, tdPsum, rP_acc, rdS_acc, n_row0, m_row0, seqlen_k, causal_off,
               scale_log2, lo: cutlass.Constexpr[int], hi: cutlass.Constexpr[int], with_ds: cutlass.Constexpr[bool],
               mask: cutlass.Constexpr[bool]):
        """P^T values [lo, hi) of the S^T accumulator, exp2(S^T * scale_log2 - LSE_log2) (0 where ``mask`` hides them:
        seqlen_k and the diagonal), into rP_acc as well. With ``with_ds`` (dP^T waited for, hi = all values): dS^T =
        P^T (dP^T - dPsum) of every value, the ones of [lo, hi) right after their P^T, each of [0, lo) next to one of
        them, so that ptxas can put the dS^T arithmetic between the MUFU.EX2 (ds_split). Per value the same operations
        as the serial path: bitwise equal results."""
        assert not with_ds or hi - lo >= lo, "p_part: the fused half must be at least as long as the first"
        if const_expr(not with_ds):  # the exponents of every value before the wait (the FMA pipe has room here)
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = acc_S[i] * scale_log2 - tLSE[i]
        for i in cutlass.range_constexpr(lo, hi):
            p = self.exp2_elem(acc_S[i], i)
            if const_expr(mask):
                r, c = tScS[i]
                n_g = n_row0 + r
                masked = n_g >= seqlen_k
                if const_expr(self.causal):
                    masked = masked | (n_g > m_row0 + c + causal_off)
                p = Float32(0.0) if masked else p
            acc_S[i] = p
            if const_expr(with_ds):
                acc_dP[i] = p * (acc_dP[i] - tdPsum[i])
                if const_expr(i - lo < lo):
                    j = i - lo
                    acc_dP[j] = acc_S[j] * (acc_dP[j] - tdPsum[j])
                    if const_expr(j % 4 == 3):
                        self.cvt_frag(acc_dP, rdS_acc, j - 3)
            if const_expr(i % 4 == 3):
                self.cvt_frag(acc_S, rP_acc, i - 3)
                if const_expr(with_ds):
                    self.cvt_frag(acc_dP, rdS_acc, i - 3)

    def cvt_frag(self, src, dst, i0: int):
        """Values [i0, i0 + 4) of an fp32 accumulator into the same places of its input-dtype view."""
        frag = cute.make_tensor(src.iterator + i0, cute.make_layout(4))
        cute.make_tensor(dst.iterator + i0, cute.make_layout(4)).store(frag.load().to(self.dtype))

    @cute.jit
    def p_ds_features(self, acc_S, acc_dP, tScS, tLSE, tdPsum, rP_acc, rdS_acc, n_row0, m_row0, seqlen_k,
                      causal_off, scale_log2):
        """P^T and dS^T with a sliding window and / or a softcap, while the dP GEMM runs (as the plain path). Window: a
        tile crossing a bound (or seqlen_k) is masked element by element (key n visible to query m iff
        m + off - left <= n <= m + off + right). Softcap: t = tanh(S * scale / softcap) (scale_log2 carries
        scale / softcap), P = exp2(t * softcap * log2(e) - LSE_log2) goes to rP_acc element by element, and acc_S keeps
        P (1 - t^2), the cap's chain rule: dS = P (1 - t^2) (dP - dPsum); t needs no registers of its own."""
        if const_expr(self.has_window):
            need_mask = bwd_tile_needs_mask(n_row0, n_row0 + 64, m_row0, m_row0 + self.s_cols - 1, seqlen_k,
                                            causal_off, self.causal, self.window_left, self.window_right)
        else:  # softcap only: the seqlen_k edge (and the causal diagonal) as the plain kernel
            need_mask = n_row0 + 64 > seqlen_k
            if const_expr(self.causal):
                need_mask = need_mask | (n_row0 + 63 > m_row0 + causal_off)
        if need_mask:
            self.p_features_loop(acc_S, rP_acc, tScS, tLSE, n_row0, m_row0, seqlen_k, causal_off, scale_log2, True)
        else:
            self.p_features_loop(acc_S, rP_acc, tScS, tLSE, n_row0, m_row0, seqlen_k, causal_off, scale_log2, False)
        if const_expr(self.softcap == 0.0):
            rP_acc.store(acc_S.load().to(self.dtype))
        self.ds_from_p(acc_S, acc_dP, tdPsum, rdS_acc)

    @cute.jit
    def ds_from_p(self, acc_S, acc_dP, tdPsum, rdS_acc):
        """Once dP^T is done: dS^T = acc_S (P, or P (1 - t^2) with a softcap) * (dP^T - dPsum), into its A fragment."""
        warpgroup.wait_group(0)
        for i in cutlass.range_constexpr(cute.size(acc_dP)):
            acc_dP[i] = acc_S[i] * (acc_dP[i] - tdPsum[i])
        rdS_acc.store(acc_dP.load().to(self.dtype))

    @cute.jit
    def p_features_loop(self, acc_S, rP_acc, tScS, tLSE, n_row0, m_row0, seqlen_k, causal_off, scale_log2,
                        mask: cutlass.Constexpr[bool]):
        """One pass over the S^T accumulator: P (masked to 0 when ``mask``) into acc_S, or with a softcap into rP_acc
        (the input dtype) and P (1 - t^2) into acc_S."""
        right, left = self.right_bound, self.window_left
        for i in cutlass.range_constexpr(cute.size(acc_S)):
            p = Float32(0.0)
            t = Float32(0.0)
            if const_expr(self.softcap > 0.0):
                t = cute.math.tanh(acc_S[i] * scale_log2, fastmath=True)
                p = self.exp2_elem(t * Float32(self.softcap * LOG2_E) - tLSE[i], i)
            else:
                p = self.exp2_elem(acc_S[i] * scale_log2 - tLSE[i], i)
            if const_expr(mask):
                r, c = tScS[i]
                n_g = n_row0 + r
                diag = m_row0 + c + causal_off  # the query's diagonal key
                masked = n_g >= seqlen_k
                if const_expr(right >= 0):
                    masked = masked | (n_g > diag + right)
                if const_expr(left >= 0):
                    masked = masked | (n_g < diag - left)
                p = Float32(0.0) if masked else p
            if const_expr(self.softcap > 0.0):
                rP_acc[i] = p.to(self.dtype)
                acc_S[i] = p - p * t * t
            else:
                acc_S[i] = p

    @cute.jit
    def ds_to_smem(self, st_atom, thr_st, rdS_acc, tSsdS, pds_bar, mbar_dsempty, it):
        """dS^T -> shared memory with stmatrix (dS is the A operand of dQ, or the B operand of dQ^T), then both
        warpgroups meet. two_cta: first wait until the peer has consumed what this stage sent two tiles ago."""
        if const_expr(self.two_cta):
            if it >= 2:
                cute.arch.mbarrier_wait(mbar_dsempty, ((it // 2) + 1) % 2)
        cute.copy(st_atom, thr_st.retile(rdS_acc), tSsdS)
        cute.arch.fence_view_async_shared()
        pds_bar.arrive_and_wait()

    @cute.jit
    def ds_send(self, sdS_raw, sdSp_raw, mbar_dsfull, sidx, tidx, rank):
        """two_cta: one thread sends the peer's Q-row half of this dS stage (tm/2 x tn elements, one contiguous block)
        into the peer's sdSp[sidx] (cp.async.bulk shared::cta -> shared::cluster, completing on the peer's
        mbar_dsfull). two_cta issues the dV wgmma only after ds_to_smem and this send: with dV in flight across them
        (the one-CTA order) ptxas serialised every wgmma of the kernel at hd64 (C7512 "insufficient register
        resources", 40 WARPGROUP.DEPBAR, 1-4 LDL/STL in the SASS), also with the send issued by a separate warp
        after a named barrier and the dsempty wait moved before dV (CPU SASS, tried and reverted)."""
        tm, tn = self.tile_m, self.tile_n
        peer = rank ^ 1
        if tidx == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(mbar_dsfull + sidx, self.bytes_ds_half)
            src = sdS_raw + (sidx * tm * tn + peer * (tm // 2 * tn))
            dst = cute.arch.map_dsmem_ptr(sdSp_raw + sidx * (tm // 2 * tn), peer)
            cp_async_bulk_shared_cluster_shared_cta(
                dst, src, cute.arch.map_dsmem_ptr(mbar_dsfull + sidx, peer), self.bytes_ds_half)

    @cute.jit
    def dq_dk_one_cta(self, mmas: BwdMmas, f: MmaFrags, sdQ_raw, pipes: BwdPipes, q_state, do_state, sidx, it):
        """dQ_w = dS K (this warpgroup's half) first, then dK += dS^T Q: dQ goes to the writer warp while dK runs.
        (Releasing dO between the two, after a wait for dV, made ptxas serialise every wgmma of the kernel: 32
        WARPGROUP.DEPBAR instead of 4, hd64 s1k 0.83 -> 0.99 ms on the H200.)"""
        tdQrdS = f.tdQrdS[None, None, None, sidx]
        tdKrQ = f.tdKrQ[None, None, None, sidx]
        if const_expr(self.dq_transposed):
            wgmma(mmas.mma_dQ, f.acc_dQ, f.tdQrK, tdQrdS, zero_init=True, fence=False)  # dQ^T = K^T dS^T
        else:
            wgmma(mmas.mma_dQ, f.acc_dQ, tdQrdS, f.tdQrK, zero_init=True, fence=False)
        wgmma(mmas.mma_dKV, f.acc_dK, f.rdS, tdKrQ, zero_init=False, fence=False)
        warpgroup.wait_group(1)
        pipes.pipe_do.consumer_release(do_state)
        self.dq_to_writer(f.acc_dQ, sdQ_raw, f.wg, f.tid, it)
        warpgroup.wait_group(0)
        pipes.pipe_q.consumer_release(q_state)

    @cute.jit
    def dq_dk_two_cta(self, mmas: BwdMmas, f: MmaFrags, smem: BwdSmem, ptrs: DsPtrs, pipes: BwdPipes, q_state,
                      do_state, sidx, it, rank):
        """dQ^T for this CTA's Q rows = K^T dS^T (own tile) + Kp^T dSp^T (the peer's tile, once its half has arrived),
        then dK += dS^T Q; dQ goes to the writer warp (chunk 2 * rank + wg of the Q tile in dQaccum) while dK runs, as
        in the one-CTA kernel."""
        tm, tn = self.tile_m, self.tile_n
        mma_dQ, thr_dQ, acc_dQ, q0 = mmas.mma_dQ, f.thr_dQ, f.acc_dQ, f.q0
        tdKrQ = f.tdKrQ[None, None, None, sidx]
        sdS_own = cute.local_tile(smem.sdS[None, None, sidx], (self.dq_n, tn), (q0 // self.dq_n, 0))
        tdQrdSo = thr_dQ.make_fragment_B(thr_dQ.partition_B(sdS_own))
        wgmma(mma_dQ, acc_dQ, f.tdQrK, tdQrdSo, zero_init=True, fence=False, commit=False)
        cute.arch.mbarrier_wait(ptrs.mbar_dsfull + sidx, (it // 2) % 2)
        sdS_peer = cute.local_tile(smem.sdSp[None, None, sidx], (self.dq_n, tn),
                                   ((q0 - rank * (tm // 2)) // self.dq_n, 0))
        tdQrdSp = thr_dQ.make_fragment_B(thr_dQ.partition_B(sdS_peer))
        wgmma(mma_dQ, acc_dQ, f.tdQrKp, tdQrdSp, zero_init=False, fence=False)
        wgmma(mmas.mma_dKV, f.acc_dK, f.rdS, tdKrQ, zero_init=False, fence=False)
        warpgroup.wait_group(1)  # dV and dQ done
        pipes.pipe_do.consumer_release(do_state)
        # hand sdSp[sidx] back to the peer
        if const_expr(self.ds_cta_release):  # CTA scope: no MEMBAR.ALL.GPU (__init__)
            cute.arch.mbarrier_arrive(ptrs.mbar_dsempty + sidx, rank ^ 1)
        else:
            cute.arch.mbarrier_arrive(ptrs.mbar_dsempty + sidx, rank ^ 1, scope=_CLUSTER)
        self.dq_to_writer(acc_dQ, ptrs.sdQ, f.wg, f.tid, it)
        warpgroup.wait_group(0)
        pipes.pipe_q.consumer_release(q_state)

    def dkdv_slice(self, s, cols, wg):
        """Warpgroup wg's part of a dK / dV staging tile: its 64 K/V rows (FlashBwdWideSm90: its head-dim half)."""
        return cute.local_tile(s[None, None, 0], (64, cols), (wg, 0))

    @cute.jit
    def dkdv_epilogue(self, acc_dK, acc_dV, mma_dK, mma_dV, dest: DkdvDest, pds_bar, wg, tid, tidx, softmax_scale,
                      seqlen_k):
        """dK * softmax_scale and dV in the input dtype: stmatrix into the K / V tiles' shared memory once both
        warpgroups are past their last GEMM, then one TMA store each (rows past seqlen_k are clipped). With
        seqlen_k given, the store is skipped for a tile wholly past it (a two_cta pair's second tile may be)."""
        tn = self.tile_n
        rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
        rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
        acc_dK.store(acc_dK.load() * softmax_scale)
        rdK.store(acc_dK.load().to(self.dtype))
        rdV.store(acc_dV.load().to(self.dtype))
        pds_bar.arrive_and_wait()  # every GEMM reading sK / sV has completed (each warpgroup waited on its own)
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_stK = cute.make_tiled_copy_C(st_atom, mma_dK).get_slice(tid)
        thr_stV = cute.make_tiled_copy_C(st_atom, mma_dV).get_slice(tid)
        cute.copy(st_atom, thr_stK.retile(rdK), thr_stK.partition_D(self.dkdv_slice(dest.sdKs, self.hdim, wg)))
        cute.copy(st_atom, thr_stV.retile(rdV), thr_stV.partition_D(self.dkdv_slice(dest.sdVs, self.hdim_v, wg)))
        cute.arch.fence_view_async_shared()
        pds_bar.arrive_and_wait()
        if const_expr(self.varlen):
            self.dkdv_store_varlen(dest, seqlen_k, tidx)
        elif tidx == 0:
            if const_expr(seqlen_k is None):
                self.dkdv_store(dest)
            else:
                if dest.n_block * tn < seqlen_k:
                    self.dkdv_store(dest)

    @cute.jit
    def dkdv_store_varlen(self, dest: DkdvDest, seqlen_k, tidx):
        """Varlen: every MMA thread copies 16-byte row pieces of the staged dK / dV tiles to the packed dK / dV, only
        rows inside the sequence (a TMA store clips at the packed tensor's end only: it would overwrite the next
        sequence's rows)."""
        tn = self.tile_n
        n_block, head, offset_k = dest.n_block, dest.head, dest.offset_k
        vec = 128 // self.dtype.width
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        row_limit = seqlen_k - n_block * tn
        for s_t, m_t, cols in ((dest.sdKs, dest.mdK, self.hdim), (dest.sdVs, dest.mdV, self.hdim_v)):
            per_row = cols // vec
            tiled = cute.make_tiled_copy_tv(
                atom, cute.make_ordered_layout((self.num_mma_threads // per_row, per_row), order=(1, 0)),
                cute.make_layout((1, vec)))
            thr = tiled.get_slice(tidx)
            g_t = cute.local_tile(cute.domain_offset((offset_k, 0), m_t[None, None, head]), (tn, cols), (n_block, 0))
            tsS = thr.partition_S(s_t[None, None, 0])
            tgD = thr.partition_D(g_t)
            tcS = thr.partition_S(cute.make_identity_tensor((tn, cols)))
            trS = cute.make_rmem_tensor_like(tsS)
            cute.copy(tiled, tsS, trS)
            for m in cutlass.range_constexpr(cute.size(tgD, mode=[1])):
                if tcS[0, m, 0][0] < row_limit:
                    cute.copy(tiled, trS[None, m, None], tgD[None, m, None])

    def dkdv_store(self, dest: DkdvDest):
        """One thread: TMA-store the staged dK / dV tiles of K/V tile dest.n_block and wait until they are read."""
        tn = self.tile_n
        n_block, head, batch = dest.n_block, dest.head, dest.batch
        gdK = cute.local_tile(dest.mdK[None, None, head, batch], (tn, self.hdim), (n_block, 0))
        gdV = cute.local_tile(dest.mdV[None, None, head, batch], (tn, self.hdim_v), (n_block, 0))
        for atom, s_t, g_t in ((dest.tma_dK, dest.sdKs, gdK), (dest.tma_dV, dest.sdVs, gdV)):
            ts, tg = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s_t[None, None, 0], 0, 2),
                                           cute.group_modes(g_t, 0, 2))
            cute.copy(atom, ts, tg)
        cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=True)
    @cute.jit
    def dq_to_writer(self, acc_dQ, sdQ_raw, wg, tid, it):
        """Hand warpgroup wg's fp32 dQ fragment to the writer warp through its staging buffer (fragment order).
        ``it``: the hand-off's index (Q tile index, times dq_pieces plus the piece when a warpgroup has several)."""
        buf = (it % self.dq_stages) * self.num_mma_wg * self.dq_chunk
        cute.arch.barrier(barrier_id=_BAR_DQ_EMPTY + wg, number_of_threads=160)
        sdQ_t = cute.make_tensor(sdQ_raw + (buf + wg * self.dq_chunk + tid * 4),
                                 cute.make_layout((4, self.dq_vals // 4), stride=(1, 512)))
        for i in cutlass.range_constexpr(self.dq_vals):
            sdQ_t[i] = acc_dQ[i]
        if const_expr(not self.dq_defer):  # (dq_defer: dq_publish under the next tile's S^T GEMM)
            self.dq_publish(wg)

    def dq_publish(self, wg):
        """The end of a dQ hand-off: the stores visible to the writer's bulk reduction (async proxy), then dQFull."""
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=_BAR_DQ_FULL + wg, number_of_threads=160)

    @cute.jit
    def exp2_elem(self, x: Float32, i: cutlass.Constexpr) -> Float32:
        """exp2 of accumulator element i: the FMA-pipe polynomial on the emulated fragments, else MUFU.EX2."""
        p = Float32(0.0)
        if const_expr((i // 4) in self.exp2_emu_frags):
            p = exp2_poly(x)
        else:
            p = cute.math.exp2(x, fastmath=True)
        return p
