"""FlashAttention backward main kernel for Hopper (sm_90a), head dims (qk 192, v 128): 64 x 128 tiles.

bwd_wide.py runs (192, 128) with 64 x 64 tiles in which the two MMA warpgroups split the head dims of dK / dV:
every S^T / dP^T GEMM is then 64 K/V rows x 32 Q rows (wgmma N = 32: shared-memory bound, 1.5 bytes of operand per
flop), P^T and dS^T both go through shared memory, and every 64 K/V rows re-read Q / dO and bulk-reduce a 64 x 192
fp32 dQ tile. This kernel keeps bwd.py's layout instead (FlashBwdSm90, which it subclasses): a CTA owns 128 K/V
rows, MMA warpgroup w owns rows [64w, 64w+64) of them and keeps dK_w (64 x 192) and dV_w (64 x 128) in registers.
Per Q tile of 64 rows, warpgroup w runs, in this order:

    S^T  = K_w Q^T      (SS, 64 x 64, K = 192); wait
    P^T  = exp2(S^T * scale*log2e - LSE_log2)  (masked as bwd.py) -> bf16 / fp16 A fragment
    dP^T = V_w dO^T     (SS, 64 x 64, K = 128)  and  dV_w += P^T dO  (RS, 64 x 128, K = 64); wait
    dS^T = P^T (dP^T - dPsum) -> A fragment;  dK_w += dS^T Q  (RS, 64 x 192, K = 64)
    dS^T -> shared memory (stmatrix; both warpgroups meet at a named barrier); wait (dK)
    dQ[:, half w] = dS K[:, half w]   (SS, 64 x 96, K = 128); wait; fp32 chunk -> the dQ staging buffer, whose
    fence + dQFull arrive for the writer warp follow the next tile's S^T issue (bwd.py's hd64 dq_defer)

Shared memory per Q tile (both warpgroups, wgmma operands read once per GEMM): S^T 96 KB + dP^T 64 KB + the B operands
of dV / dK 32 + 48 KB + dQ 80 KB = 320 KB, plus 16 KB of dS^T stores, 96 KB of dQ staging (stores and the writer's
bulk read) and 40 KB of Q / dO TMA writes: 472 KB, 3690 clocks at 128 B per clock, for 13.6 Mflop = 3330 clocks of
tensor work (4096 flop per clock): 1.11 clocks of shared memory per clock of tensor work. The 64 x 64 kernel moves
384 KB per 6.8 Mflop (1.85), official FA4's 64 x 96 tiles (S non-swapped, dK^T / dV^T swapped, all SS) 464 KB per
10.2 Mflop (1.45). Global traffic per flop halves against 64 x 64: each Q / dO tile load (40 KB) and dQ reduction
(48 KB) serves 128 K/V rows instead of 64.

Shared memory allocated (bf16 / fp16): Q 2 stages x 24 KB, dO 2 x 16 KB, K 48 KB, V 32 KB, dS^T one stage of 16 KB,
dQ staging one buffer of 2 x 24 KB: 224 KB of tiles, + 1 KB of LSE / dPsum stages and the mbarriers, of 227 KB (a
second dS^T stage does not fit). With one dS^T buffer a warpgroup meets the other at the named barrier before it
overwrites it: the other has then finished its dQ GEMM of the previous Q tile (each waits for its own before the
hand-off). K's tile uses 32-wide (64-byte) swizzle atoms so that each warpgroup's 96-column half of it, an MN-major B
operand of dQ, starts on an atom.

Registers per MMA thread (of 240): dK_w 96 + dV_w 64 fp32 accumulators stay; around them S^T 32 (then P^T 16 as
bf16), dP^T 32 with P^T 16, dS^T 16, dQ 48, never more than 48-64 at once. S^T and dP^T are not in flight together
(with 64 fp32 of them next to the 160, ptxas spilled and serialised every wgmma: C7512): the other warpgroup's GEMMs
cover this one's exp2. dS^T multiplies the P^T fragment in the input dtype, the one the dV GEMM reads (bf16:
unpacked word by word with a shift / mask; element by element ptxas kept both copies and spilled). dQ is issued after dV and dK have completed, so that the P^T /
dS^T fragments are dead by then; waiting for dP^T only (dV still in flight) serialised every wgmma, and so did
releasing the dO stage right after dV in the deterministic causal kernel. CPU SASS (every variant below): no LDL /
STL, 4 WARPGROUP.DEPBAR, HGMMA 64x64x16 x 20, 64x128x16 x 4 and 64x192x16 x 4 (A from registers), 64x96x16 x 8.

Everything else is FlashBwdSm90's: the producer warp (Q + LSE, dO + dPsum in 2-stage TMA pipelines, K + V once), the
dQ writer warp (bulk reduce-add of each warpgroup's 64 x 96 fp32 chunk: the same tile-blocked dQaccum layout as the
64 x 64 kernel, so bwd_post is unchanged; ``deterministic`` with SPT / naive turns over the 128-row K/V tiles, or
non-causal ``det_schedule="rotate"``: bwd.py's rotated walks with arrival-order turns; ``det_two_writers`` (default)
(AttnConfig.bwd_det_two_writers): two writer warps, the buffer freed after the bulk read, bwd.py dq_writer_pair), the
tile schedule, causal / seqlen_k / sliding-window masking (the window's tile ranges and element masks), GQA (K/V head
h // g) and the dK / dV epilogue (TMA stores from the K / V tiles' space). Not here: softcap (P^T and P^T (1 - t^2) both
kept as 16-bit fragments for dS^T, 16 registers more than the plain path, spilled 59-83 LDL and serialised every wgmma
in two tries; backward.py runs bwd_wide.py's 64 x 64 kernel for it), two_cta and varlen (ConfigErrors, as before).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from ..config import DEFAULTS
from .barriers import Bar
from .bwd import (SMEM_BYTES, BwdGmem, BwdSmem, BwdTma, BwdWork, DkdvDest, FlashBwdSm90, MmaFrags,
                  TileRows, bulk_reduce_add_f32, transpose_view, wait_for_turn)
from .gemm import wgmma

# (hdim, hdim_v) -> (tile_m = Q rows per step, the default of AttnConfig.bwd_tile_m; tile_n = K/V rows per CTA)
WIDE192_BWD_TILES = {(192, 128): (DEFAULTS[("sm90", 192)]["bwd_tile_m"], 128)}


class Bwd192Mmas(NamedTuple):
    """Tiled MMAs: S^T / dP^T (SS), dK (RS, the base class's mma_dKV), dQ (SS), dV (RS)."""
    mma_S: Any
    mma_dKV: Any
    mma_dQ: Any
    mma_dV: Any


class FlashBwd192Sm90(FlashBwdSm90):
    """Main backward kernel for (hdim 192, hdim_v 128) with 64 x 128 tiles. Plain-Python knobs in, compile-time
    constants inside."""

    def __init__(self, dtype, hdim: int, causal: bool, deterministic: bool = False, two_cta: bool = False,
                 exp2_emu_fraction: float = 0.0, consumer_regs: int = 240, producer_regs: int = 24,
                 det_schedule: str = "spt", tile_m: int | None = None, hdim_v: int | None = None,
                 qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                 det_two_writers: bool = False):
        self._set_gqa(qhead_per_kvhead)
        hdim_v = hdim if hdim_v is None else hdim_v
        if (hdim, hdim_v) not in WIDE192_BWD_TILES:
            raise ValueError(f"(hdim, hdim_v)=({hdim}, {hdim_v}): FlashBwd192Sm90 supports {sorted(WIDE192_BWD_TILES)}")
        if two_cta:
            raise ValueError("two_cta=True: FlashBwd192Sm90 has no 2-CTA mode")
        self._set_schedule(dtype, causal, deterministic, det_schedule)
        self._set_features(window_left, window_right, softcap)
        if self.softcap > 0.0:
            raise ValueError(f"softcap={softcap}: FlashBwd192Sm90 has no softcap (see the module docstring); "
                             "backward.py runs FlashBwdWideSm90 for it")
        self.varlen = False
        self.hdim, self.hdim_v = hdim, hdim_v
        self.two_cta = False
        self.cluster = 1
        self._set_det_rotate(det_schedule)  # "rotate": rotated walks (m_block_at) and arrival-order dQ turns
        self.m_rotate = self.det_rotate
        # AttnConfig.bwd_det_two_writers (a default here): two dQ writer warps, Q tiles in turn (bwd.py dq_writer_pair)
        self.det_two_writers = bool(det_two_writers) and self.deterministic
        self.tile_m, self.tile_n = WIDE192_BWD_TILES[(hdim, hdim_v)]
        if tile_m not in (None, self.tile_m):
            raise ValueError(f"bwd_tile_m={tile_m}: the (192, 128) backward supports {self.tile_m}")
        tm, tn = self.tile_m, self.tile_n
        self.num_mma_wg = 2
        assert tn == 64 * self.num_mma_wg
        self.num_threads = 128 * (self.num_mma_wg + 1)
        self.num_mma_threads = 128 * self.num_mma_wg
        self.stages = self.q_stages = self.do_stages = 2  # Q / dO pipeline depths
        self.ds_stages = 1  # dS^T buffers (shared memory allows one; see the module docstring)
        # dQ[:, half w] = dS K[:, half w]: one 64 x 96 GEMM per warpgroup, one staging buffer
        self.dq_transposed = False
        self.dq_shape = (tm, hdim // 2)
        self.dq_split_rows = 0
        self.dq_n = hdim // 2
        self.dq_pieces = 1
        self.dq_smem = True
        self.dq_vals = self.dq_shape[0] * self.dq_shape[1] // 128
        self.dq_chunk = 128 * self.dq_vals
        self.dq_stages = 1
        eb = dtype.width // 8
        self.smem_bytes = (self.q_stages * tm * hdim + self.do_stages * tm * hdim_v + tn * (hdim + hdim_v)
                           + self.ds_stages * tm * tn) * eb + self.dq_stages * tm * hdim * 4 \
            + (self.q_stages + self.do_stages) * self.lse_stride * 4
        assert self.smem_bytes + 1024 <= SMEM_BYTES, self.smem_bytes
        self._set_exp2_regs(tm, exp2_emu_fraction, consumer_regs, producer_regs)  # S^T is 64 x tile_m per warpgroup

    # ---------------------------------------------------------------------------------------------
    def _host_setup192(self, mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV):
        """Shared-memory layouts, tiled MMAs, TMA atoms and the shared storage struct. Returns (Bwd192Mmas, loads,
        atoms, (tdK, tdV, tma_dK, tma_dV))."""
        tm, tn, d, dv = self.tile_m, self.tile_n, self.hdim, self.hdim_v
        self.sQ_layout = self._smem_layout(tm, d, self.q_stages, 64)
        self.sdO_layout = self._smem_layout(tm, dv, self.do_stages, 64)
        # 32-wide atoms: each warpgroup's 96 head-dim columns (dQ's MN-major B operand) start on an atom
        self.sK_layout = self._smem_layout(tn, d, 1, 32)
        self.sV_layout = self._smem_layout(tn, dv, 1, 64)
        # dS stored as (Q rows, K/V rows) with Q rows contiguous: dQ's M-major A operand; stmatrix writes dS^T into it
        self.sdS_layout = sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, (tm, 64, tn), self.dtype, self.ds_stages)

        mma_S = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (64, tm))
        mma_dK = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32, (1, 1, 1), (64, d),
            warpgroup.OperandSource.RMEM)
        mma_dV = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32, (1, 1, 1), (64, dv),
            warpgroup.OperandSource.RMEM)
        mma_dQ = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.MN, OperandMajorMode.MN, Float32, (1, 1, 1), self.dq_shape)

        # dK / dV leave through the K / V tiles' shared memory (same layouts) with one TMA store each
        loads, atoms, stores = self._tma_atoms(mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV, self.sK_layout,
                                               self.sV_layout)
        eb = self.dtype.width // 8
        self.bytes_q = tm * d * eb + tm * 4
        self.bytes_do = tm * dv * eb + tm * 4
        self.bytes_kv = tn * (d + dv) * eb
        dq_cosize = self.dq_stages * self.num_mma_wg * self.dq_chunk
        self.shared_storage = self._shared_storage(cute.cosize(self.sdS_layout), dq_cosize)
        assert self.shared_storage.size_in_bytes() <= SMEM_BYTES, self.shared_storage.size_in_bytes()
        return Bwd192Mmas(mma_S, mma_dK, mma_dQ, mma_dV), loads, atoms, stores

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor,
                 mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor,
                 softmax_scale: Float32, stream: cuda.CUstream):
        mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem = self._kernel_views(
            mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem)
        mmas, loads, atoms, (tdK, tdV, tma_dK, tma_dV) = self._host_setup192(mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV)
        num_n_blocks = cute.ceil_div(mK.shape[0], self.tile_n)
        grid = (num_n_blocks, cute.size(mQ.shape[2]), cute.size(mQ.shape[3]))
        self.kernel(*loads, *atoms, mdQaccum, tdK, tdV, tma_dK, tma_dV, mSem, mmas.mma_S, mmas.mma_dKV,
                    mmas.mma_dQ, mmas.mma_dV, self.sQ_layout, self.sdO_layout, self.sK_layout, self.sV_layout,
                    self.sdS_layout, Float32(softmax_scale), self.score_scale(softmax_scale)).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ---------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
               mLSE: cute.Tensor, mdPsum: cute.Tensor,
               tma_Q: cute.CopyAtom, tma_K: cute.CopyAtom, tma_V: cute.CopyAtom, tma_dO: cute.CopyAtom,
               tma_LSE: cute.CopyAtom, tma_dPsum: cute.CopyAtom,
               mdQaccum: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, tma_dK: cute.CopyAtom,
               tma_dV: cute.CopyAtom, mSem: cute.Tensor,
               mma_S: cute.TiledMma, mma_dK: cute.TiledMma, mma_dQ: cute.TiledMma, mma_dV: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, sdS_layout: cute.ComposedLayout,
               softmax_scale: Float32, scale_log2: Float32):
        """The launch: this CTA's work, shared memory and pipelines, then bwd.py's warp roles (roles)."""
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, head, batch = cute.arch.block_idx()
        work = self.cta_work(mQ, mK, bidx, head, batch, None, None)
        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum):
                cpasync.prefetch_descriptor(atom)
        storage, pipes = self.shared_setup(tidx)
        sQ, sdO, sK, sV, sLSE, sdPsum = self.load_tensors(storage, sQ_layout, sdO_layout, sK_layout, sV_layout)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        # dK / dV are staged in the K / V tiles' space (their own layouts) for the TMA stores
        smem = BwdSmem(sQ, sdO, sK, sV, sLSE, sdPsum, sdS, sK, sdS, sK, sV)
        gm = BwdGmem(mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem)
        tma = BwdTma(tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum, tma_dK, tma_dV)
        self.roles(gm, tma, Bwd192Mmas(mma_S, mma_dK, mma_dQ, mma_dV), smem, storage, pipes, work, warp_idx, tidx,
                   softmax_scale, scale_log2)

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def mma(self, gm: BwdGmem, tma: BwdTma, mmas: Bwd192Mmas, smem: BwdSmem, ptrs, pipes, work: BwdWork, tidx,
            softmax_scale, scale_log2):
        """MMA warpgroups: fragments once, wait for K / V, one m_block_step per Q tile, then the dK / dV epilogue."""
        f = self.mma_fragments(mmas, smem, work, tidx)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipes.pipe_kv.consumer_wait(kv_state)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.do_stages)
        for m_block in cutlass.range(work.m_block_min, work.m_block_max, unroll=1):
            self.m_block_step(mmas, f, smem, ptrs, pipes, q_state, do_state, m_block, work, scale_log2)
            q_state.advance()
            do_state.advance()
        if work.m_block_min < work.m_block_max:  # the last tile's dQ hand-off
            self.dq_publish192(f.wg)
        dest = DkdvDest(smem.sdKs, smem.sdVs, tma.tma_dK, tma.tma_dV, gm.mdK, gm.mdV, work.n_block, work.head,
                        work.batch)
        self.dkdv_epilogue(f.acc_dK, f.acc_dV, mmas.mma_dKV, mmas.mma_dV, dest, f.pds_bar, f.wg, f.tid, f.tidx,
                           softmax_scale, None)

    @cute.jit
    def mma_fragments(self, mmas: Bwd192Mmas, smem: BwdSmem, work: BwdWork, tidx) -> MmaFrags:
        """This warpgroup's MmaFrags (bwd.py's, with dV's own 64 x 128 RS MMA and one dS^T stage)."""
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tid = tidx % 128
        s_frags = self.s_fragments(mmas.mma_S, smem, wg, tid)
        kv_frags = self.dkv_fragments(mmas.mma_dKV, mmas.mma_dV, smem, s_frags["acc_S"], tid)  # bwd.py's, two MMAs
        dq_frags = self.dq_fragments192(mmas.mma_dQ, smem, wg, tid)
        pds_bar = pipeline.NamedBarrier(barrier_id=int(Bar.BWD_PDS), num_threads=self.num_mma_threads)
        n_row0 = work.n_block * self.tile_n + wg * 64
        causal_off = work.seqlen_k - work.seqlen_q
        return MmaFrags(wg=wg, tid=tid, tidx=tidx, pds_bar=pds_bar, n_row0=n_row0, causal_off=causal_off, **s_frags,
                        **kv_frags, **dq_frags)

    def s_fragments(self, mma_S, smem: BwdSmem, wg, tid) -> dict:
        """S^T / dP^T = K_w Q^T / V_w dO^T operands (every Q / dO stage), accumulators, coordinates, LSE / dPsum
        broadcasts, and the stmatrix partition of this warpgroup's rows of the (one) dS^T stage."""
        tm, d, dv = self.tile_m, self.hdim, self.hdim_v
        thr_S = mma_S.get_slice(tid)
        tSrK = thr_S.make_fragment_A(thr_S.partition_A(cute.local_tile(smem.sK[None, None, 0], (64, d), (wg, 0))))
        tSrV = thr_S.make_fragment_A(thr_S.partition_A(cute.local_tile(smem.sV[None, None, 0], (64, dv), (wg, 0))))
        tSrQ = thr_S.make_fragment_B(thr_S.partition_B(smem.sQ))
        tSrdO = thr_S.make_fragment_B(thr_S.partition_B(smem.sdO))
        acc_S = cute.make_rmem_tensor(thr_S.partition_shape_C((64, tm)), Float32)
        acc_dP = cute.make_rmem_tensor(thr_S.partition_shape_C((64, tm)), Float32)
        tScS = thr_S.partition_C(cute.make_identity_tensor((64, tm)))
        tSsLSE = thr_S.partition_C(cute.make_tensor(
            smem.sLSE.iterator, cute.make_layout((64, tm, self.q_stages), stride=(0, 1, self.lse_stride))))
        tSsdPsum = thr_S.partition_C(cute.make_tensor(
            smem.sdPsum.iterator, cute.make_layout((64, tm, self.do_stages), stride=(0, 1, self.lse_stride))))
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_st = cute.make_tiled_copy_C(st_atom, mma_S).get_slice(tid)
        sdSt = transpose_view(smem.sdS)  # (tn, tm, 1): Q rows contiguous, as the accumulator's columns
        tSsdS_all = thr_st.partition_D(cute.local_tile(sdSt, (64, tm, self.ds_stages), (wg, 0, 0)))
        return dict(tSrK=tSrK, tSrV=tSrV, tSrQ=tSrQ, tSrdO=tSrdO, acc_S=acc_S, acc_dP=acc_dP, tScS=tScS,
                    tSsLSE=tSsLSE, tSsdPsum=tSsdPsum, st_atom=st_atom, thr_st=thr_st, tSsdS_all=tSsdS_all)

    def dq_fragments192(self, mma_dQ, smem: BwdSmem, wg, tid) -> dict:
        """dQ[:, half w] = dS K[:, half w]: A = the dS stage (M-major), B = K^T's head-dim half w (MN-major)."""
        tn = self.tile_n
        dq_m, dq_n = self.dq_shape
        thr_dQ = mma_dQ.get_slice(tid)
        tdQrdS = thr_dQ.make_fragment_A(thr_dQ.partition_A(smem.sdS))
        sKt_w = cute.local_tile(transpose_view(smem.sK)[None, None, 0], (dq_n, tn), (wg, 0))
        tdQrK = thr_dQ.make_fragment_B(thr_dQ.partition_B(sKt_w))
        acc_dQ = cute.make_rmem_tensor(thr_dQ.partition_shape_C(self.dq_shape), Float32)
        return dict(thr_dQ=thr_dQ, tdQrK=tdQrK, tdQrdS=tdQrdS, tdQrKp=None, acc_dQ=acc_dQ, q0=None)

    # ---- one Q tile ---------------------------------------------------------------------------------------
    @cute.jit
    def m_block_step(self, mmas: Bwd192Mmas, f: MmaFrags, smem: BwdSmem, ptrs, pipes, q_state, do_state, m_block,
                     work: BwdWork, scale_log2):
        """S^T, then P^T (masked exp2) into its bf16 A fragment; dP^T and dV += P^T dO; dS^T = P^T (dP^T - dPsum) and
        dK += dS^T Q while dS^T goes to shared memory; once dV and dK have completed (the P^T / dS^T registers dead,
        the dO / Q stages released) dQ = dS K, handed to the writer warp. S^T and dP^T are not in flight together
        (their 64 fp32 registers next to dK_w + dV_w's 160 spilled): the other warpgroup's GEMMs cover the exp2."""
        qi = q_state.index
        di = do_state.index
        it = m_block - work.m_block_min
        if const_expr(self.m_rotate):  # ``m_block`` is the loop step: its tile (m_block_at); ``it`` stays the step
            m_block = self.m_block_at(m_block, work)
        rows = TileRows(work.n_block, f.n_row0, m_block * self.tile_m, work.seqlen_k, f.causal_off, scale_log2)
        acc_S, acc_dP = f.acc_S, f.acc_dP
        pipes.pipe_q.consumer_wait(q_state)
        wgmma(mmas.mma_S, acc_S, f.tSrK, f.tSrQ[None, None, None, qi], zero_init=True)
        if it > 0:  # the previous tile's dQ hand-off ends under this S^T GEMM
            self.dq_publish192(f.wg)
        warpgroup.wait_group(0)
        self.p_to_regs(acc_S, f.tScS, f.tSsLSE[None, None, None, qi], f.rP_acc, rows)
        pipes.pipe_do.consumer_wait(do_state)
        wgmma(mmas.mma_S, acc_dP, f.tSrV, f.tSrdO[None, None, None, di], zero_init=True)  # fenced: P^T written
        wgmma(mmas.mma_dV, f.acc_dV, f.rP, f.tdVrdO[None, None, None, di], zero_init=False, fence=False)
        warpgroup.wait_group(0)  # dP^T and dV done (with dV still in flight ptxas serialised every wgmma: C7512)
        tdPsum = f.tSsdPsum[None, None, None, di]
        rPf = self.unpack_to_f32(f.rP_acc)
        for i in cutlass.range_constexpr(cute.size(acc_dP)):
            acc_dP[i] = rPf[i] * (acc_dP[i] - tdPsum[i])
        f.rdS_acc.store(acc_dP.load().to(self.dtype))
        wgmma(mmas.mma_dKV, f.acc_dK, f.rdS, f.tdKrQ[None, None, None, qi], zero_init=False)  # dK += dS^T Q
        # one dS^T buffer: both warpgroups' dQ GEMMs of the previous Q tile have completed before it is overwritten
        if it > 0:
            f.pds_bar.arrive_and_wait()
        cute.copy(f.st_atom, f.thr_st.retile(f.rdS_acc), f.tSsdS_all[None, None, None, 0])
        cute.arch.fence_view_async_shared()
        f.pds_bar.arrive_and_wait()
        warpgroup.wait_group(0)  # dK done: the dS^T registers free, the Q stage too
        # (releasing dO above, right after dV, made ptxas serialise every wgmma of the deterministic causal kernel)
        pipes.pipe_do.consumer_release(do_state)
        pipes.pipe_q.consumer_release(q_state)
        wgmma(mmas.mma_dQ, f.acc_dQ, f.tdQrdS[None, None, None, 0], f.tdQrK, zero_init=True)
        warpgroup.wait_group(0)
        self.dq_store192(f.acc_dQ, ptrs.sdQ, f.wg, f.tid)

    @cute.jit
    def dq_store192(self, acc_dQ, sdQ_raw, wg, tid):
        """The first part of warpgroup wg's dQ hand-off to the writer warp (bwd.py's dq_to_writer, one staging
        buffer): wait until the writer has read the previous chunk (dQEmpty), store the fp32 fragment in fragment order.
        The fence and the dQFull arrive (dq_publish192) follow once the next Q tile's S^T GEMM is issued (or after the
        last tile), so that the fence's wait for the stores does not sit between dQ and the next S^T on the tensor
        cores (the hd64 kernel's dq_defer, bwd.py)."""
        cute.arch.barrier(barrier_id=int(Bar.BWD_DQ_EMPTY) + wg, number_of_threads=160)
        sdQ_t = cute.make_tensor(sdQ_raw + (wg * self.dq_chunk + tid * 4),
                                 cute.make_layout((4, self.dq_vals // 4), stride=(1, 512)))
        for i in cutlass.range_constexpr(self.dq_vals):
            sdQ_t[i] = acc_dQ[i]

    def dq_publish192(self, wg):
        """The end of a dQ hand-off: the stores visible to the writer's bulk reduction (async proxy), then dQFull."""
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=int(Bar.BWD_DQ_FULL) + wg, number_of_threads=160)

    @cute.jit
    def p_to_regs(self, acc_S, tScS, tLSE, rP_acc, rows: TileRows):
        """P^T = exp2(S^T * scale_log2 - LSE_log2), masked as bwd.py's p_and_ds masks it (seqlen_k, the causal
        diagonal, a sliding window: only on tiles that cross one), into its bf16 / fp16 A fragment rP_acc."""
        n_row0, m_row0, seqlen_k, causal_off = rows.n_row0, rows.m_row0, rows.seqlen_k, rows.causal_off
        if const_expr(self.has_window):
            need_mask = self.window_tile_needs_mask(n_row0, m_row0, seqlen_k, causal_off)
            if need_mask:
                self.p_features_loop(acc_S, rP_acc, tScS, tLSE, n_row0, m_row0, seqlen_k, causal_off, rows.scale_log2,
                                     True)
            else:
                self.p_features_loop(acc_S, rP_acc, tScS, tLSE, n_row0, m_row0, seqlen_k, causal_off, rows.scale_log2,
                                     False)
        else:
            need_mask = (rows.n_block + 1) * self.tile_n > seqlen_k
            if const_expr(self.causal):
                need_mask = need_mask | ((rows.n_block + 1) * self.tile_n - 1 > m_row0 + causal_off)
            if need_mask:
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    r, c = tScS[i]
                    n_g = n_row0 + r
                    masked = n_g >= seqlen_k
                    if const_expr(self.causal):
                        masked = masked | (n_g > m_row0 + c + causal_off)
                    p = self.exp2_elem(acc_S[i] * rows.scale_log2 - tLSE[i], i)
                    acc_S[i] = Float32(0.0) if masked else p
            else:
                for i in cutlass.range_constexpr(cute.size(acc_S)):
                    acc_S[i] = self.exp2_elem(acc_S[i] * rows.scale_log2 - tLSE[i], i)
        rP_acc.store(acc_S.load().to(self.dtype))

    @cute.jit
    def window_tile_needs_mask(self, n_row0, m_row0, seqlen_k, causal_off):
        """Whether this warpgroup's 64 x tile_m S^T tile crosses a window bound or seqlen_k (bwd.py's rule)."""
        from .mask import bwd_tile_needs_mask

        return bwd_tile_needs_mask(n_row0, n_row0 + 64, m_row0, m_row0 + self.s_cols - 1, seqlen_k, causal_off,
                                   self.causal, self.window_left, self.window_right)

    @cute.jit
    def unpack_to_f32(self, r16):
        """The fp32 values of a packed 16-bit fragment, word by word (bf16: a shift / mask of the word's bits; fp16:
        a conversion of each half), so that the packed words stay the only copy in registers."""
        n = cute.size(r16)
        words = cute.make_tensor(cute.recast_ptr(r16.iterator, dtype=cutlass.Uint32), cute.make_layout(n // 2))
        bits = cute.make_rmem_tensor(cute.make_layout(n), cutlass.Uint32)
        out = cute.make_tensor(cute.recast_ptr(bits.iterator, dtype=Float32), cute.make_layout(n))
        if const_expr(self.dtype == cutlass.BFloat16):
            for j in cutlass.range_constexpr(n // 2):
                w = words[j]
                bits[2 * j] = w << cutlass.Uint32(16)
                bits[2 * j + 1] = w & cutlass.Uint32(0xFFFF0000)
        else:
            for i in cutlass.range_constexpr(n):
                out[i] = r16[i].to(Float32)
        return out
