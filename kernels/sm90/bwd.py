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

dQ goes to a padded fp32 accumulator in global memory with red.global.add (``deterministic=False``) or,
with ``deterministic=True``, in a fixed order: an int32 semaphore per (batch, head, Q tile); the CTA whose
turn it is (acquire spin) adds its tile, fences and releases the next turn. For causal the turn order and the
grid order are shortest-processing-time first (the K/V tile on the diagonal with the fewest Q tiles goes
first). dK (times softmax_scale) and dV are written from registers at the end.

``two_cta=True`` is rejected here (see backward.py): the 2-CTA cluster variant is not built.
"""
from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from .bwd_exp2 import emulated_groups, exp2_poly

LOG2_E = math.log2(math.e)

# Backward tiles per head dim: (tile_m = Q rows per step, tile_n = K/V rows per CTA). Two MMA warpgroups
# each own 64 K/V rows. hdim 256 does not fit: dK+dV accumulators alone need 256 registers per thread.
BWD_TILES = {64: (64, 128), 128: (64, 128)}
NUM_STAGES = 2  # Q/dO (and dS) pipeline depth


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """Swap the first two modes of a shared-memory tensor (keeps the swizzle)."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


class FlashBwdSm90:
    """Main backward kernel. Plain-Python knobs in, compile-time constants inside."""

    def __init__(self, dtype, hdim: int, causal: bool, deterministic: bool = False,
                 exp2_emu_fraction: float = 0.0, consumer_regs: int = 240, producer_regs: int = 24):
        if hdim not in BWD_TILES:
            raise ValueError(f"hdim={hdim}: the sm90 backward supports head dims {sorted(BWD_TILES)}")
        self.dtype = dtype
        self.hdim = hdim
        self.causal = bool(causal)
        self.deterministic = bool(deterministic)
        self.tile_m, self.tile_n = BWD_TILES[hdim]
        self.num_mma_wg = 2
        assert self.tile_n == 64 * self.num_mma_wg
        self.num_threads = 128 * (self.num_mma_wg + 1)
        self.num_mma_threads = 128 * self.num_mma_wg
        self.stages = NUM_STAGES
        # exp2 emulation: a thread's S^T fragment holds tile_m/8 groups of 4 values (one per 8 columns)
        self.exp2_groups = self.tile_m // 8
        self.exp2_emu_groups = emulated_groups(exp2_emu_fraction, self.exp2_groups)
        self.exp2_fraction_compiled = self.exp2_emu_groups / self.exp2_groups
        self.consumer_regs = min(240, consumer_regs)
        self.producer_regs = producer_regs
        assert self.producer_regs + self.num_mma_wg * self.consumer_regs <= 512

    # ---------------------------------------------------------------------------------------------
    def _smem_layout(self, rows, cols, stages, major_cols):
        """Row-major (rows, cols, stages) tile of K-major swizzle atoms ``major_cols`` wide."""
        atom_kind = sm90_utils.get_smem_layout_atom(utils.LayoutEnum.ROW_MAJOR, self.dtype, major_cols)
        atom = warpgroup.make_smem_layout_atom(atom_kind, self.dtype)
        return cute.tile_to_shape(atom, (rows, cols, stages), order=(0, 1, 2))

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor,
                 mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor,
                 softmax_scale: Float32, stream: cuda.CUstream):
        # (b, s, h, d) -> (s, d, h, b); (b, h, s) -> (s, h, b); (b, h, s, d) -> (s, d, h, b)
        mQ, mK, mV, mdO, mdK, mdV = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))
                                     for t in (mQ, mK, mV, mdO, mdK, mdV)]
        mLSE, mdPsum, mSem = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[2, 1, 0]))
                              for t in (mLSE, mdPsum, mSem)]
        mdQaccum = cute.make_tensor(mdQaccum.iterator, cute.select(mdQaccum.layout, mode=[2, 3, 1, 0]))

        tm, tn, d = self.tile_m, self.tile_n, self.hdim
        self.sQ_layout = self._smem_layout(tm, d, self.stages, min(d, 64))
        self.sdO_layout = self._smem_layout(tm, d, self.stages, min(d, 64))
        self.sK_layout = self._smem_layout(tn, d, 1, min(64, d // 2))
        self.sV_layout = self._smem_layout(tn, d, 1, min(d, 64))
        self.sdS_layout = sm90_utils.make_smem_layout_a(
            utils.LayoutEnum.COL_MAJOR, (tm, 64, tn), self.dtype, self.stages)

        mma_S = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K,
            Float32, (1, 1, 1), (64, tm))
        mma_dKV = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN,
            Float32, (1, 1, 1), (64, d), warpgroup.OperandSource.RMEM)
        mma_dQ = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, warpgroup.OperandMajorMode.MN, warpgroup.OperandMajorMode.MN,
            Float32, (1, 1, 1), (tm, d // 2))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        one = lambda lay: cute.select(lay, mode=[0, 1])
        tma_Q, tQ = cpasync.make_tiled_tma_atom(g2s, mQ, one(self.sQ_layout), (tm, d))
        tma_dO, tdO = cpasync.make_tiled_tma_atom(g2s, mdO, one(self.sdO_layout), (tm, d))
        tma_K, tK = cpasync.make_tiled_tma_atom(g2s, mK, one(self.sK_layout), (tn, d))
        tma_V, tV = cpasync.make_tiled_tma_atom(g2s, mV, one(self.sV_layout), (tn, d))
        tma_LSE, tLSE = cpasync.make_tiled_tma_atom(g2s, mLSE, cute.make_layout(tm), (tm,))
        tma_dPsum, tdPsum = cpasync.make_tiled_tma_atom(g2s, mdPsum, cute.make_layout(tm), (tm,))

        self.bytes_q = tm * d * self.dtype.width // 8 + tm * 4
        self.bytes_kv = 2 * tn * d * self.dtype.width // 8

        st = self.stages

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, st * 2]
            mbar_do: cute.struct.MemRange[cutlass.Int64, st * 2]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, tm * st], 128]
            sdPsum: cute.struct.Align[cute.struct.MemRange[Float32, tm * st], 128]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(self.sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(self.sdO_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(self.sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(self.sV_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(self.sdS_layout)], 1024]

        self.shared_storage = SharedStorage

        num_n_blocks = cute.ceil_div(mK.shape[0], tn)
        grid = (num_n_blocks, cute.size(mQ.shape[2]), cute.size(mQ.shape[3]))
        self.kernel(tQ, tK, tV, tdO, tLSE, tdPsum, tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum,
                    mdQaccum, mdK, mdV, mSem, mma_S, mma_dKV, mma_dQ,
                    self.sQ_layout, self.sdO_layout, self.sK_layout, self.sV_layout, self.sdS_layout,
                    Float32(softmax_scale), Float32(softmax_scale * LOG2_E)).launch(
            grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ---------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
               mLSE: cute.Tensor, mdPsum: cute.Tensor,
               tma_Q: cute.CopyAtom, tma_K: cute.CopyAtom, tma_V: cute.CopyAtom, tma_dO: cute.CopyAtom,
               tma_LSE: cute.CopyAtom, tma_dPsum: cute.CopyAtom,
               mdQaccum: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor,
               mma_S: cute.TiledMma, mma_dKV: cute.TiledMma, mma_dQ: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               sdS_layout: cute.ComposedLayout, softmax_scale: Float32, scale_log2: Float32):
        tm, tn = self.tile_m, self.tile_n
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, head, batch = cute.arch.block_idx()
        num_n_blocks = cute.ceil_div(mK.shape[0], tn)
        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        # causal: shortest-processing-time first (the diagonal-most K/V tile has the fewest Q tiles)
        n_block = bidx
        if const_expr(self.causal):
            n_block = num_n_blocks - 1 - bidx
        m_block_max = cute.ceil_div(seqlen_q, tm)
        m_block_min = Int32(0)
        if const_expr(self.causal):
            first_row = n_block * tn - (seqlen_k - seqlen_q)
            if first_row < 0:
                first_row = Int32(0)
            m_block_min = first_row // tm

        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum):
                cpasync.prefetch_descriptor(atom)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        producer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads // 32)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=self.stages, producer_group=producer_group,
            consumer_group=consumer_group, tx_count=self.bytes_q, defer_sync=True)
        pipe_do = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_do.data_ptr(), num_stages=self.stages, producer_group=producer_group,
            consumer_group=consumer_group, tx_count=self.bytes_q, defer_sync=True)
        pipe_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_kv.data_ptr(), num_stages=1, producer_group=producer_group,
            consumer_group=consumer_group, tx_count=self.bytes_kv, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        sLSE = storage.sLSE.get_tensor(cute.make_layout((tm, self.stages)))
        sdPsum = storage.sdPsum.get_tensor(cute.make_layout((tm, self.stages)))

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.load(mQ, mK, mV, mdO, mLSE, mdPsum, tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum,
                          sQ, sK, sV, sdO, sLSE, sdPsum, pipe_q, pipe_do, pipe_kv,
                          n_block, head, batch, m_block_min, m_block_max)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.mma(mdQaccum, mdK, mdV, mSem, mma_S, mma_dKV, mma_dQ, sQ, sK, sV, sdO, sdS, sLSE, sdPsum,
                     pipe_q, pipe_do, pipe_kv, tidx - 128, n_block, head, batch, m_block_min, m_block_max,
                     num_n_blocks, seqlen_q, seqlen_k, softmax_scale, scale_log2)

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def load(self, mQ, mK, mV, mdO, mLSE, mdPsum, tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum,
             sQ, sK, sV, sdO, sLSE, sdPsum, pipe_q, pipe_do, pipe_kv,
             n_block, head, batch, m_block_min, m_block_max):
        tm, tn, d = self.tile_m, self.tile_n, self.hdim

        def part(atom, s, g):
            return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, cute.rank(s) - 1),
                                         cute.group_modes(g, 0, cute.rank(g) - 1))

        gK = cute.local_tile(mK[None, None, head, batch], (tn, d), (None, 0))
        gV = cute.local_tile(mV[None, None, head, batch], (tn, d), (None, 0))
        gQ = cute.local_tile(mQ[None, None, head, batch], (tm, d), (None, 0))
        gdO = cute.local_tile(mdO[None, None, head, batch], (tm, d), (None, 0))
        gLSE = cute.local_tile(mLSE[None, head, batch], (tm,), (None,))
        gdPsum = cute.local_tile(mdPsum[None, head, batch], (tm,), (None,))
        tKsK, tKgK = part(tma_K, sK, gK)
        tVsV, tVgV = part(tma_V, sV, gV)
        tQsQ, tQgQ = part(tma_Q, sQ, gQ)
        tdOsdO, tdOgdO = part(tma_dO, sdO, gdO)
        tLsL, tLgL = part(tma_LSE, sLSE, gLSE)
        tPsP, tPgP = part(tma_dPsum, sdPsum, gdPsum)

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_kv.producer_acquire(kv_state)
        bar = pipe_kv.producer_get_barrier(kv_state)
        cute.copy(tma_K, tKgK[None, n_block], tKsK[None, 0], tma_bar_ptr=bar)
        cute.copy(tma_V, tVgV[None, n_block], tVsV[None, 0], tma_bar_ptr=bar)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for m_block in cutlass.range(m_block_min, m_block_max, unroll=1):
            pipe_q.producer_acquire(q_state)
            bar = pipe_q.producer_get_barrier(q_state)
            cute.copy(tma_Q, tQgQ[None, m_block], tQsQ[None, q_state.index], tma_bar_ptr=bar)
            cute.copy(tma_LSE, tLgL[None, m_block], tLsL[None, q_state.index], tma_bar_ptr=bar)
            q_state.advance()
            pipe_do.producer_acquire(do_state)
            bar = pipe_do.producer_get_barrier(do_state)
            cute.copy(tma_dO, tdOgdO[None, m_block], tdOsdO[None, do_state.index], tma_bar_ptr=bar)
            cute.copy(tma_dPsum, tPgP[None, m_block], tPsP[None, do_state.index], tma_bar_ptr=bar)
            do_state.advance()

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def mma(self, mdQaccum, mdK, mdV, mSem, mma_S, mma_dKV, mma_dQ, sQ, sK, sV, sdO, sdS, sLSE, sdPsum,
            pipe_q, pipe_do, pipe_kv, tidx, n_block, head, batch, m_block_min, m_block_max,
            num_n_blocks, seqlen_q, seqlen_k, softmax_scale, scale_log2):
        tm, tn, d = self.tile_m, self.tile_n, self.hdim
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tid = tidx % 128

        # ---- S^T / dP^T = K_w Q^T / V_w dO^T ------------------------------------------------------
        thr_S = mma_S.get_slice(tid)
        sK_w = cute.local_tile(sK[None, None, 0], (64, d), (wg, 0))
        sV_w = cute.local_tile(sV[None, None, 0], (64, d), (wg, 0))
        tSrK = thr_S.make_fragment_A(thr_S.partition_A(sK_w))
        tSrV = thr_S.make_fragment_A(thr_S.partition_A(sV_w))
        tSrQ = thr_S.make_fragment_B(thr_S.partition_B(sQ))
        tSrdO = thr_S.make_fragment_B(thr_S.partition_B(sdO))
        acc_S = cute.make_rmem_tensor(thr_S.partition_shape_C((64, tm)), Float32)
        acc_dP = cute.make_rmem_tensor(thr_S.partition_shape_C((64, tm)), Float32)
        # coordinates (local K/V row, local Q row) of each accumulator element, LSE / dPsum broadcast
        tScS = thr_S.partition_C(cute.make_identity_tensor((64, tm)))
        bcast = cute.make_layout((64, tm, self.stages), stride=(0, 1, tm))
        tSsLSE = thr_S.partition_C(cute.make_tensor(sLSE.iterator, bcast))
        tSsdPsum = thr_S.partition_C(cute.make_tensor(sdPsum.iterator, bcast))
        sdSt = transpose_view(sdS)  # (tn, tm, stages)

        # ---- dV += P^T dO, dK += dS^T Q (A from registers) ----------------------------------------
        thr_KV = mma_dKV.get_slice(tid)
        tdVrdO = thr_KV.make_fragment_B(thr_KV.partition_B(transpose_view(sdO)))
        tdKrQ = thr_KV.make_fragment_B(thr_KV.partition_B(transpose_view(sQ)))
        rP = thr_KV.make_fragment_A(thr_KV.partition_shape_A((64, tm)))
        rdS = thr_KV.make_fragment_A(thr_KV.partition_shape_A((64, tm)))
        rP_acc = cute.make_tensor(rP.iterator, acc_S.layout)
        rdS_acc = cute.make_tensor(rdS.iterator, acc_S.layout)
        acc_dV = cute.make_rmem_tensor(thr_KV.partition_shape_C((64, d)), Float32)
        acc_dK = cute.make_rmem_tensor(thr_KV.partition_shape_C((64, d)), Float32)
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)

        # ---- dQ[:, half w] = dS K[:, half w] ---------------------------------------------------------
        thr_dQ = mma_dQ.get_slice(tid)
        tdQrdS = thr_dQ.make_fragment_A(thr_dQ.partition_A(sdS))
        sKt_w = cute.local_tile(transpose_view(sK)[None, None, 0], (d // 2, tn), (wg, 0))
        tdQrK = thr_dQ.make_fragment_B(thr_dQ.partition_B(sKt_w))
        acc_dQ = cute.make_rmem_tensor(thr_dQ.partition_shape_C((tm, d // 2)), Float32)
        gdQ_all = cute.local_tile(mdQaccum[None, None, head, batch], (tm, d // 2), (None, wg))
        tdQgdQ_all = thr_dQ.partition_C(gdQ_all)

        # epilogue partitions (made before the main loop: the loop mutates the tiled MMAs' accumulate flag)
        tcKV = thr_KV.partition_C(cute.make_identity_tensor((64, d)))
        gdK = thr_KV.partition_C(cute.local_tile(mdK[None, None, head, batch], (64, d), (n_block * 2 + wg, 0)))
        gdV = thr_KV.partition_C(cute.local_tile(mdV[None, None, head, batch], (64, d), (n_block * 2 + wg, 0)))

        pds_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_mma_threads)
        sem_bar = pipeline.NamedBarrier(barrier_id=2, num_threads=self.num_mma_threads)
        n_row0 = n_block * tn + wg * 64
        causal_off = seqlen_k - seqlen_q

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_kv.consumer_wait(kv_state)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)

        for m_block in cutlass.range(m_block_min, m_block_max, unroll=1):
            sidx = q_state.index
            pipe_q.consumer_wait(q_state)
            warpgroup.fence()
            self.gemm(mma_S, acc_S, tSrK, tSrQ[None, None, None, sidx], zero_init=True)
            warpgroup.commit_group()
            pipe_do.consumer_wait(do_state)
            self.gemm(mma_S, acc_dP, tSrV, tSrdO[None, None, None, sidx], zero_init=True)
            warpgroup.commit_group()

            # P^T = exp2(S^T * scale_log2 - LSE_log2), masked
            warpgroup.wait_group(1)
            m_row0 = m_block * tm
            tLSE = tSsLSE[None, None, None, sidx]
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                r, c = tScS[i]
                n_g = n_row0 + r
                x = acc_S[i] * scale_log2 - tLSE[i]
                masked = n_g >= seqlen_k
                if const_expr(self.causal):
                    masked = masked | (n_g > m_row0 + c + causal_off)
                p = Float32(0.0)
                if const_expr((i // 4) < self.exp2_emu_groups):
                    p = exp2_poly(x)
                else:
                    p = cute.math.exp2(x, fastmath=True)
                acc_S[i] = Float32(0.0) if masked else p
            rP_acc.store(acc_S.load().to(self.dtype))

            # dS^T = P^T * (dP^T - dPsum)
            warpgroup.wait_group(0)
            tdPsum = tSsdPsum[None, None, None, sidx]
            for i in cutlass.range_constexpr(cute.size(acc_dP)):
                acc_dP[i] = acc_S[i] * (acc_dP[i] - tdPsum[i])
            rdS_acc.store(acc_dP.load().to(self.dtype))

            # dV += P^T dO
            warpgroup.fence()
            self.gemm(mma_dKV, acc_dV, rP, tdVrdO[None, None, None, sidx], zero_init=False)
            warpgroup.commit_group()

            # dS^T -> shared memory (transposed store: dS as the A operand of dQ)
            tSsdS = thr_S.partition_C(cute.local_tile(sdSt[None, None, sidx], (64, tm), (wg, 0)))
            for i in cutlass.range_constexpr(cute.size(rdS_acc)):
                tSsdS[i] = rdS_acc[i]
            cute.arch.fence_view_async_shared()
            pds_bar.arrive_and_wait()

            # dK += dS^T Q ; dQ_w = dS K_w-half
            self.gemm(mma_dKV, acc_dK, rdS, tdKrQ[None, None, None, sidx], zero_init=False)
            warpgroup.commit_group()
            self.gemm(mma_dQ, acc_dQ, tdQrdS[None, None, None, sidx], tdQrK, zero_init=True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipe_q.consumer_release(q_state)
            pipe_do.consumer_release(do_state)
            q_state.advance()
            do_state.advance()

            # dQ accumulation in global memory
            tdQgdQ = tdQgdQ_all[None, None, None, m_block]
            sem_ptr = mSem.iterator + cute.crd2idx((m_block, head, batch), mSem.layout)
            if const_expr(self.deterministic):
                turn = n_block
                if const_expr(self.causal):
                    n_max = cute.ceil_div((m_block + 1) * tm + causal_off, tn)
                    if n_max > num_n_blocks:
                        n_max = num_n_blocks
                    turn = n_max - 1 - n_block
                if tidx == 0:
                    cur = cute.arch.load(sem_ptr, Int32, sem="acquire", scope="gpu")
                    while cur != turn:
                        cur = cute.arch.load(sem_ptr, Int32, sem="acquire", scope="gpu")
                sem_bar.arrive_and_wait()
            for i in cutlass.range_constexpr(cute.size(acc_dQ)):
                ptr = tdQgdQ.iterator + cute.crd2idx(i, tdQgdQ.layout)
                cute.arch.red(ptr, acc_dQ[i], op="add", dtype="f32", sem="relaxed", scope="gpu")
            if const_expr(self.deterministic):
                sem_bar.arrive_and_wait()
                if tidx == 0:
                    cute.arch.fence_acq_rel_gpu()
                    cute.arch.red(sem_ptr, Int32(1), op="add", dtype="s32", sem="release", scope="gpu")

        # ---- epilogue: dK * scale, dV -> input dtype, straight from registers --------------------------
        rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
        rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
        acc_dK.store(acc_dK.load() * softmax_scale)
        rdK.store(acc_dK.load().to(self.dtype))
        rdV.store(acc_dV.load().to(self.dtype))
        for i in cutlass.range_constexpr(cute.size(rdK)):
            r, c = tcKV[i]
            if n_row0 + r < seqlen_k:
                gdK[i] = rdK[i]
                gdV[i] = rdV[i]

    @cute.jit
    def gemm(self, tiled_mma, acc, tA, tB, zero_init: cutlass.Constexpr):
        for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            tiled_mma.set(warpgroup.Field.ACCUMULATE, (not zero_init) or k != 0)
            cute.gemm(tiled_mma, acc, tA[None, None, k], tB[None, None, k], acc)
