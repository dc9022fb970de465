"""FlashAttention backward main kernel for Hopper (sm_90a), wide head dims: hdim 256 and (qk 192, v 128).

The narrow kernel (bwd.py) gives each MMA warpgroup 64 K/V rows and keeps its dK and dV for the whole head dim
in registers: at hdim 256 that is 256 fp32 registers per thread for the accumulators alone. Here a CTA owns a
K/V tile of 64 rows and the two MMA warpgroups split the *head dims* of dK and dV instead (FA3's hdim-256
recipe, with its 64 x 64 tiles): warpgroup w accumulates dK[:, half w] and dV[:, half w] (64 x d/2 each, 128
registers per thread at hd256). Per Q tile of 64 rows, warpgroup w computes, with wgmma:

    S^T  = K Q_w^T     (SS, 64 K/V rows x 32 Q rows: this warpgroup's half of the Q tile)
    dP^T = V dO_w^T    (SS)
    P^T, dS^T as in bwd.py (masked exp2 against LSE_log2, dS^T = P^T (dP^T - dPsum)), then both go to shared
    memory with stmatrix (warpgroup w writes Q columns [32w, 32w+32) of the 64 x 64 tiles) and the
    warpgroups meet: every later GEMM reads the whole P^T / dS^T tile, so dV and dK are SS GEMMs:
    dV[:, half w] += P^T dO[:, half w]    dK[:, half w] += dS^T Q[:, half w]    dQ[:, half w] = dS K[:, half w]

dQ leaves as in bwd.py: each warpgroup's fp32 fragment goes to its shared-memory chunk and the dQ writer warp
(warp 1) bulk-reduces it into the tile-blocked fp32 accumulator (``deterministic`` orders the writers with the
same semaphore turns and SPT/naive schedules). dK (times softmax_scale) and dV leave through the K / V tiles'
shared memory with one TMA store each. The producer warp, the writer warp, the tile schedule, the TMA atoms and
pipelines, the shared-memory struct and the dK / dV epilogue are bwd.py's (FlashBwdSm90's) methods.

Shared memory (bf16/fp16), the first plan that fits 227 KB of (Q stages, dO stages, dQ GEMMs per warpgroup, dQ
buffers): hd256: Q 2 x 32 KB, dO 1 x 32 KB, K + V 64 KB, P^T + dS^T 16 KB, and each warpgroup computes its dQ half
in two 64 x 64 GEMMs handed to the writer one after the other through one 16 KB buffer per warpgroup (32 KB):
209 KB. (192, 128): Q and dO 2 stages (80 KB), K + V 40 KB, P^T + dS^T 16 KB, dQ in one 64 x 96 GEMM per
warpgroup (48 KB): 185 KB. Registers per MMA thread (of 240): hd256 dK + dV accumulators 64 + 64, dQ 2 x 32,
S^T + dP^T 16 + 16; (192, 128): 48 + 32, 48, 16 + 16. P^T / dS^T have one buffer: a warpgroup waits at a named
barrier until the other has finished the previous Q tile's GEMMs before it overwrites them. At hd192 the Q and K
tiles use 32-wide (64-byte) swizzle atoms so that each warpgroup's 96-column half starts on an atom. two_cta at hd256
is FlashBwdWideTwoCtaSm90 (bwd_wide_two_cta.py: 2-CTA clusters, Q / dO multicast, dS exchanged over DSMEM, dQ split by
head-dim halves); (192, 128) has none (a ConfigError in backward.py). Sliding window and softcap: bwd.py's tile
schedule, P^T / dS^T recomputation and dQ turns (see its docstring), with this kernel's 64 x 32 S^T tiles per warpgroup.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from ..config import DEFAULTS
from .barriers import Bar
from .bwd import (SMEM_BYTES, BwdGmem, BwdPipes, BwdSmem, BwdTma, BwdWork, DkdvDest, FlashBwdSm90, SOperands, TileRows,
                  transpose_view)
from .gemm import wgmma

# (hdim, hdim_v) -> (tile_m = Q rows per step, the default of AttnConfig.bwd_tile_m; tile_n = K/V rows per CTA)
WIDE_BWD_TILES = {(256, 256): (DEFAULTS[("sm90", 256)]["bwd_tile_m"], 64),
                  (192, 128): (DEFAULTS[("sm90", 192)]["bwd_tile_m"], 64)}


class WideFrags(NamedTuple):
    """An MMA warpgroup's S^T / dP^T, P^T / dS^T staging and dV / dK operands (FlashBwdWideSm90.s_dkv_fragments)."""
    tSrK: Any
    tSrV: Any
    tSrQ: Any
    tSrdO: Any
    acc_S: Any
    acc_dP: Any
    tScS: Any
    tSsLSE: Any
    tSsdPsum: Any
    rP: Any
    rdS: Any
    st_atom: Any
    thr_st: Any
    tSsP: Any
    tSsdS: Any
    tdVrP: Any
    tdVrdO: Any
    tdKrdS: Any
    tdKrQ: Any


class FlashBwdWideSm90(FlashBwdSm90):
    """Main backward kernel for the wide head dims. Plain-Python knobs in, compile-time constants inside."""

    def __init__(self, dtype, hdim: int, causal: bool, deterministic: bool = False, two_cta: bool = False,
                 exp2_emu_fraction: float = 0.0, consumer_regs: int = 240, producer_regs: int = 24,
                 det_schedule: str = "spt", tile_m: int | None = None, hdim_v: int | None = None,
                 qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                 rotate_q: bool = False):
        self._set_gqa(qhead_per_kvhead)  # K/V head of a Q head: load() in bwd.py
        hdim_v = hdim if hdim_v is None else hdim_v
        if (hdim, hdim_v) not in WIDE_BWD_TILES:
            raise ValueError(f"(hdim, hdim_v)=({hdim}, {hdim_v}): FlashBwdWideSm90 supports {sorted(WIDE_BWD_TILES)}")
        if two_cta:
            raise ValueError(f"two_cta=True: FlashBwdWideSm90 is the one-CTA kernel (hdim {hdim}); the 2-CTA one is "
                             "FlashBwdWideTwoCtaSm90 (bwd_wide_two_cta.py, hdim 256)")
        self._set_schedule(dtype, causal, deterministic, det_schedule)
        self._set_features(window_left, window_right, softcap)  # sliding window / softcap: bwd.py's p_and_ds
        self.hdim, self.hdim_v = hdim, hdim_v
        self.two_cta = False
        self.cluster = 1
        # det_schedule "rotate" (deterministic, non-causal, no window): rotated walks (m_block_at, with_m_rot) and
        # arrival-order dQ turns, as the narrow kernels (FlashBwdWideTwoCtaSm90 sets its own)
        self._set_det_rotate(det_schedule)
        # ``rotate_q`` (AttnConfig.bwd_rotate_q, opt-in): the rotated walk without determinism (non-causal, no window),
        # so that a head's CTAs do not all reduce into the same dQ tile at once
        self.m_rotate = self.det_rotate or (rotate_q and not causal and not deterministic and not self.has_window)
        self.tile_m, self.tile_n = WIDE_BWD_TILES[(hdim, hdim_v)]
        if tile_m not in (None, self.tile_m):
            raise ValueError(f"bwd_tile_m={tile_m}: the hdim {hdim} backward supports {self.tile_m}")
        tm, tn = self.tile_m, self.tile_n
        self.num_mma_wg = 2
        self.num_threads = 128 * (self.num_mma_wg + 1)
        self.num_mma_threads = 128 * self.num_mma_wg
        self.half_m = tm // self.num_mma_wg  # Q rows of S^T / dP^T per warpgroup
        # swizzle atom width (elements) of the Q / K tiles: the dK / dQ GEMMs read half of the head dim as an
        # MN-major operand, which must start on an atom boundary (hd192: halves of 96 columns -> 32-wide atoms)
        self.atom_qk = 64 if (hdim // 2) % 64 == 0 else 32
        self.atom_v = 64 if (hdim_v // 2) % 64 == 0 else 32
        # shared-memory plan, the first that fits of (Q stages, dO stages, dQ GEMMs per warpgroup, dQ buffers):
        # dQ = dS K per warpgroup covers its half of the head dim in dq_pieces GEMMs, each handed to the writer
        # through a buffer of tm x hdim/(2*dq_pieces) fp32 (hd256: two pieces, so that Q gets two stages)
        eb = dtype.width // 8
        pds = 2 * tm * tn * eb  # P^T and dS^T, one buffer each
        kv = tn * (hdim + hdim_v) * eb
        q_stage, do_stage = tm * hdim * eb + tm * 4, tm * hdim_v * eb + tm * 4
        slack = 2048  # barriers and alignment
        for q_st, do_st, pieces, dq_st in ((2, 2, 1, 2), (2, 2, 1, 1), (2, 2, 2, 1), (2, 1, 2, 1), (1, 1, 1, 1)):
            smem = kv + pds + q_st * q_stage + do_st * do_stage + dq_st * tm * hdim * 4 // pieces
            if smem + slack <= SMEM_BYTES:
                break
        assert smem + slack <= SMEM_BYTES, smem
        self.smem_bytes = smem
        self.q_stages, self.do_stages, self.dq_pieces, self.dq_stages = q_st, do_st, pieces, dq_st
        self.dq_shape = (tm, hdim // (2 * pieces))
        self.dq_split_rows = 0
        self.dq_smem = True
        self.dq_vals = self.dq_shape[0] * self.dq_shape[1] // 128
        self.dq_chunk = 128 * self.dq_vals
        self._set_exp2_regs(self.half_m, exp2_emu_fraction, consumer_regs, producer_regs)  # S^T is 64 x half_m

    def wide_layouts_and_mmas(self) -> tuple:
        """Set the Q / dO / K / V / P^T-dS^T shared-memory layouts and return the tiled MMAs (S^T, dK, dV, dQ) of the
        wide kernel (also FlashBwdWideTwoCtaSm90's)."""
        tm, tn, d, dv = self.tile_m, self.tile_n, self.hdim, self.hdim_v
        self.sQ_layout = self._smem_layout(tm, d, self.q_stages, self.atom_qk)
        self.sdO_layout = self._smem_layout(tm, dv, self.do_stages, self.atom_v)
        self.sK_layout = self._smem_layout(tn, d, 1, self.atom_qk)
        self.sV_layout = self._smem_layout(tn, dv, 1, self.atom_v)
        # P^T / dS^T stored as (Q rows, K/V rows) with Q rows contiguous: dS is then dQ's M-major A operand, and
        # the transposed views are the K-major A operands of dV = P^T dO and dK = dS^T Q
        self.sPdS_layout = sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, (tm, 64, tn), self.dtype, 1)
        mma_S = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (64, self.half_m))
        mma_dK = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32, (1, 1, 1), (64, d // 2))
        mma_dV = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32, (1, 1, 1), (64, dv // 2))
        mma_dQ = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.MN, OperandMajorMode.MN, Float32, (1, 1, 1), self.dq_shape)
        return mma_S, mma_dK, mma_dV, mma_dQ

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor,
                 mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor,
                 softmax_scale: Float32, stream: cuda.CUstream):
        mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem = self._kernel_views(
            mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem)

        tm, tn, d, dv = self.tile_m, self.tile_n, self.hdim, self.hdim_v
        mma_S, mma_dK, mma_dV, mma_dQ = self.wide_layouts_and_mmas()

        # dK / dV leave through the K / V tiles' shared memory (same layouts) with one TMA store each
        loads, atoms, (tdK, tdV, tma_dK, tma_dV) = self._tma_atoms(mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV,
                                                                   self.sK_layout, self.sV_layout)

        eb = self.dtype.width // 8
        self.bytes_q = tm * d * eb + tm * 4
        self.bytes_do = tm * dv * eb + tm * 4
        self.bytes_kv = tn * (d + dv) * eb
        dq_cosize = self.dq_stages * self.num_mma_wg * self.dq_chunk

        self.shared_storage = self._shared_storage(cute.cosize(self.sPdS_layout), dq_cosize,
                                                   p_cosize=cute.cosize(self.sPdS_layout))

        num_n_blocks = cute.ceil_div(mK.shape[0], tn)
        grid = (num_n_blocks, cute.size(mQ.shape[2]), cute.size(mQ.shape[3]))
        self.kernel(*loads, *atoms, mdQaccum, tdK, tdV, tma_dK, tma_dV, mSem, mma_S, mma_dK, mma_dV, mma_dQ,
                    self.sQ_layout, self.sdO_layout, self.sK_layout, self.sV_layout, self.sPdS_layout,
                    Float32(softmax_scale), self.score_scale(softmax_scale)).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ---------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
               mLSE: cute.Tensor, mdPsum: cute.Tensor,
               tma_Q: cute.CopyAtom, tma_K: cute.CopyAtom, tma_V: cute.CopyAtom, tma_dO: cute.CopyAtom,
               tma_LSE: cute.CopyAtom, tma_dPsum: cute.CopyAtom,
               mdQaccum: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, tma_dK: cute.CopyAtom,
               tma_dV: cute.CopyAtom, mSem: cute.Tensor,
               mma_S: cute.TiledMma, mma_dK: cute.TiledMma, mma_dV: cute.TiledMma, mma_dQ: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, sPdS_layout: cute.ComposedLayout,
               softmax_scale: Float32, scale_log2: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, head, batch = cute.arch.block_idx()
        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        n_block, num_n_blocks, rank, m_block_min, m_block_max = self.tile_schedule(bidx, seqlen_q, seqlen_k)

        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        pipe_q, pipe_do, pipe_kv = self.make_pipelines(storage)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ, sdO, sK, sV, sLSE, sdPsum = self.load_tensors(storage, sQ_layout, sdO_layout, sK_layout, sV_layout)
        sP = storage.sP.get_tensor(sPdS_layout.outer, swizzle=sPdS_layout.inner)
        sdS = storage.sdS.get_tensor(sPdS_layout.outer, swizzle=sPdS_layout.inner)

        work = self.with_m_rot(BwdWork(n_block, head, batch, m_block_min, m_block_max, num_n_blocks, rank, seqlen_q,
                                       seqlen_k))
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.load(BwdGmem(mQ, mK, mV, mdO, mLSE, mdPsum),
                          BwdTma(tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum),
                          BwdSmem(sQ, sdO, sK, sV, sLSE, sdPsum, sKp=sK), BwdPipes(pipe_q, pipe_do, pipe_kv), work)
            if warp_idx == 1:
                self.dq_writer(mdQaccum, mSem, storage.sdQ.data_ptr(), work)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.mma_wide(mdK, mdV, tma_dK, tma_dV, mma_S, mma_dK, mma_dV, mma_dQ, sQ, sK, sV, sdO, sP, sdS,
                          sLSE, sdPsum, storage.sdQ.data_ptr(), pipe_q, pipe_do, pipe_kv, tidx - 128, n_block,
                          head, batch, m_block_min, m_block_max, seqlen_q, seqlen_k, softmax_scale, scale_log2, work)

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def mma_wide(self, mdK, mdV, tma_dK, tma_dV, mma_S, mma_dK, mma_dV, mma_dQ, sQ, sK, sV, sdO, sP, sdS,
                 sLSE, sdPsum, sdQ_raw, pipe_q, pipe_do, pipe_kv, tidx, n_block, head, batch, m_block_min,
                 m_block_max, seqlen_q, seqlen_k, softmax_scale, scale_log2, work):
        tm, tn, d, dv, hm = self.tile_m, self.tile_n, self.hdim, self.hdim_v, self.half_m
        qst, dost, pieces = self.q_stages, self.do_stages, self.dq_pieces
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tid = tidx % 128

        (tSrK, tSrV, tSrQ, tSrdO, acc_S, acc_dP, tScS, tSsLSE, tSsdPsum, rP, rdS, st_atom, thr_st, tSsP, tSsdS,
         tdVrP, tdVrdO, tdKrdS, tdKrQ) = self.s_dkv_fragments(mma_S, mma_dK, mma_dV, sQ, sK, sV, sdO, sP, sdS, sLSE,
                                                              sdPsum, wg, tid)
        # ---- dQ[:, half w] = dS K (SS, in dq_pieces) ----
        thr_dQ = mma_dQ.get_slice(tid)
        tdQrdS = thr_dQ.make_fragment_A(thr_dQ.partition_A(sdS[None, None, 0]))
        dq_n = self.dq_shape[1]  # head-dim columns per dQ GEMM: piece p of warpgroup w is chunk w * pieces + p
        tdQrK = [thr_dQ.make_fragment_B(thr_dQ.partition_B(
            cute.local_tile(transpose_view(sK)[None, None, 0], (dq_n, tn), (wg * pieces + p, 0))))
            for p in range(pieces)]
        acc_dV = cute.make_rmem_tensor(mma_dV.get_slice(tid).partition_shape_C((64, dv // 2)), Float32)
        acc_dK = cute.make_rmem_tensor(mma_dK.get_slice(tid).partition_shape_C((64, d // 2)), Float32)
        acc_dQ = [cute.make_rmem_tensor(thr_dQ.partition_shape_C(self.dq_shape), Float32) for _ in range(pieces)]
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)

        pds_bar = pipeline.NamedBarrier(barrier_id=int(Bar.BWD_PDS), num_threads=self.num_mma_threads)
        n_row0 = n_block * tn
        causal_off = seqlen_k - seqlen_q

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_kv.consumer_wait(kv_state)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, qst)
        do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, dost)

        for m_block in cutlass.range(m_block_min, m_block_max, unroll=1):
            qi = q_state.index
            di = do_state.index
            it = m_block - m_block_min
            if const_expr(self.m_rotate):  # ``m_block`` is the loop step: its tile (m_block_at); ``it`` stays the step
                m_block = self.m_block_at(m_block, work)
            m_row0 = m_block * tm + wg * hm  # this warpgroup's first Q row
            s_ops = SOperands(mma_S, acc_S, acc_dP, tSrK, tSrV, tSrQ[None, None, None, qi],
                              tSrdO[None, None, None, di], tScS, tSsLSE[None, None, None, qi],
                              tSsdPsum[None, None, None, di], rP, rdS)
            self.p_and_ds(s_ops, BwdPipes(pipe_q, pipe_do, pipe_kv), q_state, do_state,
                          TileRows(n_block, n_row0, m_row0, seqlen_k, causal_off, scale_log2))
            # one P^T / dS^T buffer: both warpgroups' GEMMs of the previous Q tile have finished reading it
            pds_bar.arrive_and_wait()
            cute.copy(st_atom, thr_st.retile(rP), tSsP)
            cute.copy(st_atom, thr_st.retile(rdS), tSsdS)
            cute.arch.fence_view_async_shared()
            pds_bar.arrive_and_wait()
            # one wgmma group each: dV, the dQ pieces, dK; each dQ piece goes to the writer as soon as it is done
            wgmma(mma_dV, acc_dV, tdVrP, tdVrdO[None, None, None, di], zero_init=False)
            for p in cutlass.range_constexpr(pieces):
                wgmma(mma_dQ, acc_dQ[p], tdQrdS, tdQrK[p], zero_init=True, fence=False)
            wgmma(mma_dK, acc_dK, tdKrdS, tdKrQ[None, None, None, qi], zero_init=False, fence=False)
            warpgroup.wait_group(pieces)
            pipe_do.consumer_release(do_state)
            for p in cutlass.range_constexpr(pieces):
                if const_expr(p > 0):
                    warpgroup.wait_group(pieces - p)
                self.dq_to_writer(acc_dQ[p], sdQ_raw, wg, tid, it * pieces + p)
            warpgroup.wait_group(0)
            pipe_q.consumer_release(q_state)
            q_state.advance()
            do_state.advance()

        dest = DkdvDest(sK, sV, tma_dK, tma_dV, mdK, mdV, n_block, head, batch)
        self.dkdv_epilogue(acc_dK, acc_dV, mma_dK, mma_dV, dest, pds_bar, wg, tid, tidx, softmax_scale, None)

    def s_dkv_fragments(self, mma_S, mma_dK, mma_dV, sQ, sK, sV, sdO, sP, sdS, sLSE, sdPsum, wg, tid) -> WideFrags:
        """Warpgroup wg's S^T / dP^T operands, accumulators, coordinates and LSE / dPsum broadcasts (all Q / dO
        stages), the stmatrix partitions of its Q columns of the P^T / dS^T tiles, and the dV / dK operands (the
        one-CTA kernel and FlashBwdWideTwoCtaSm90 share them)."""
        tm, d, dv, hm = self.tile_m, self.hdim, self.hdim_v, self.half_m
        qst, dost = self.q_stages, self.do_stages
        # ---- S^T / dP^T = K Q_w^T / V dO_w^T: all 64 K/V rows x this warpgroup's half of the Q rows ----------
        thr_S = mma_S.get_slice(tid)
        tSrK = thr_S.make_fragment_A(thr_S.partition_A(sK[None, None, 0]))
        tSrV = thr_S.make_fragment_A(thr_S.partition_A(sV[None, None, 0]))
        tSrQ = thr_S.make_fragment_B(thr_S.partition_B(cute.local_tile(sQ, (hm, d, qst), (wg, 0, 0))))
        tSrdO = thr_S.make_fragment_B(thr_S.partition_B(cute.local_tile(sdO, (hm, dv, dost), (wg, 0, 0))))
        acc_S = cute.make_rmem_tensor(thr_S.partition_shape_C((64, hm)), Float32)
        acc_dP = cute.make_rmem_tensor(thr_S.partition_shape_C((64, hm)), Float32)
        tScS = thr_S.partition_C(cute.make_identity_tensor((64, hm)))
        bcast = lambda n: cute.make_layout((64, hm, n), stride=(0, 1, tm))
        tSsLSE = thr_S.partition_C(cute.make_tensor(sLSE.iterator + wg * hm, bcast(qst)))
        tSsdPsum = thr_S.partition_C(cute.make_tensor(sdPsum.iterator + wg * hm, bcast(dost)))
        rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        rdS = cute.make_rmem_tensor_like(acc_dP, self.dtype)
        # P^T / dS^T fragments -> shared memory with stmatrix, this warpgroup's Q columns of the (tn, tm) tiles
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_st = cute.make_tiled_copy_C(st_atom, mma_S).get_slice(tid)
        sPt = transpose_view(sP)[None, None, 0]  # (tn, tm): Q rows contiguous
        sdSt = transpose_view(sdS)[None, None, 0]
        tSsP = thr_st.partition_D(cute.local_tile(sPt, (64, hm), (0, wg)))
        tSsdS = thr_st.partition_D(cute.local_tile(sdSt, (64, hm), (0, wg)))

        # ---- dV[:, half w] += P^T dO, dK[:, half w] += dS^T Q (SS) ----
        thr_dV = mma_dV.get_slice(tid)
        tdVrP = thr_dV.make_fragment_A(thr_dV.partition_A(sPt))
        tdVrdO = thr_dV.make_fragment_B(thr_dV.partition_B(
            cute.local_tile(transpose_view(sdO), (dv // 2, tm, dost), (wg, 0, 0))))
        thr_dK = mma_dK.get_slice(tid)
        tdKrdS = thr_dK.make_fragment_A(thr_dK.partition_A(sdSt))
        tdKrQ = thr_dK.make_fragment_B(thr_dK.partition_B(
            cute.local_tile(transpose_view(sQ), (d // 2, tm, qst), (wg, 0, 0))))
        return WideFrags(tSrK, tSrV, tSrQ, tSrdO, acc_S, acc_dP, tScS, tSsLSE, tSsdPsum, rP, rdS, st_atom, thr_st, tSsP,
                         tSsdS, tdVrP, tdVrdO, tdKrdS, tdKrQ)

    def dkdv_slice(self, s, cols, wg):
        """Warpgroup wg's part of a dK / dV staging tile (dkdv_epilogue in bwd.py): all K/V rows, its head-dim half."""
        return cute.local_tile(s[None, None, 0], (self.tile_n, cols // 2), (0, wg))
