"""hd256 backward for Hopper (sm_90a) in 2-CTA clusters with 80-row K/V tiles (``bwd_two_cta_n80``; the non-deterministic default).

Why. bwd_wide_two_cta.py (64 x 64 tiles) moves, per Q tile and CTA, 32 + 32 KB of multicast Q / dO in and 32 KB of fp32
dQ reductions out for 64 K/V rows of work; with 80 K/V rows per CTA the same traffic serves 25% more wgmma work.
Official FA4's open PR #2889 used 64 x 80 tiles in its 2-CTA hd256 backward (H200: 530 TFLOP/s, against 471 for its
one-CTA 64 x 80 kernel and 373 for the released 64 x 48 one). 80 K/V rows do not split into the 64-row M of a wgmma,
so the orientation of every GEMM changes against the 64 x 64 kernel (our own scheme below; facts from the PR: the
tile, the swapped dK / dV / dQ GEMMs, dQ reduced from registers, 2 Q stages and 1 dO stage):

- S_w = Q K_w^T, dP_w = dO V_w^T (SS): warpgroup w computes all 64 Q rows x its 40 K/V rows [40 w, 40 w + 40) (20 + 20
  fp32 per thread; LSE / dPsum are per accumulator row, 2 values per thread). P_w = exp2(S_w scale_log2 - LSE_log2)
  (masked on tiles crossing seqlen_k or the diagonal), dS_w = P_w (dP_w - dPsum), stored with transposing stmatrix into
  the (64 Q x 80 K/V) P and dS tiles, Q rows contiguous (the layout of the 64 x 64 kernel's P^T / dS^T tiles).
- dV^T[half w] += dO^T[half w] P and dK^T[half w] += Q^T[half w] dS (SS, M = 128 head-dim rows in two wgmma atoms,
  N = 80 K/V rows, K = 64 Q rows): 80 + 80 fp32 per thread, the head-dim half w of dK / dV over all 80 K/V rows.
- dQ^T for head-dim rows [128 r + 64 w, +64) of CTA r = K_own^T dS_own^T + K_peer^T dS_peer^T (SS, M = 64, N = 64 Q
  rows, K = 80 + 80): 32 fp32 per thread; the peer's dS tile (10 KB) arrives over DSMEM as in bwd_wide_two_cta.py (its
  exchange warp, dsfull / dsempty, the dO stage released by the exchange warp), the peer's K half (80 x 128) is loaded
  once next to K and V. Each thread adds its 32 values into dQaccum with 8 ``red.global.add.v4.f32`` (16 bytes each, a
  warp's 32 lanes 512 contiguous bytes) in the postprocess's transposed fragment order (chunk 2 r + w of the Q tile:
  dq_shape (64, 64)); no writer warp, no staging buffer. (Issue 9.1 asks that MMA warps issue no global reductions;
  at 80 rows the writer's staging does not fit, so this kernel is the exception, to be kept only if it measures faster.)

Shared memory (bf16 / fp16): Q 2 x (32 KB + LSE), dO 32 KB + dPsum, K + V 80 KB, K_peer half 20 KB, P + dS + received dS
3 x 10 KB = 226 KB + mbarriers, of 227 KB: no room for dQ staging. Registers per MMA thread (of 240): dK^T + dV^T 160,
S + dP 40 (dead before dQ's 32 are live).

``deterministic``: the same reductions, in turn: each CTA of a pair owns a semaphore per Q tile (turns over the pairs:
dq_slot, det_turn; causal spt, non-causal det_schedule "rotate" with the pairs' rotated walks and arrival-order turns
as in the 64-row kernel, else K/V order). Warp 1 (no writer here) polls the next Q tile's turn while the MMA warps
compute it, lets them through a named barrier to their reductions, then fences and releases (dq_turns).

Status (H200, 2026-12-02, one process, 10 rounds; results/h200/session_ab/bwd256_two_cta_n80.jsonl): 1.03 / 1.06x the
64-row pair kernel at 1k (non-causal / causal), 1.11 / 1.15x at 8k and 16k; tests/test_bwd_two_cta_n80_gpu.py passed.
Deterministic (H200, 2026-12-03, 10 rounds; results/h200/session_ab/bwd256_n80_det.jsonl): det / default 0.944-0.976
non-causal, 0.931-0.956 causal at 1k-16k, 1.04-1.10x the 64-row pairs' deterministic kernel (the exchange warp polling
the turns, as before, read 0.74-0.83), so it is the deterministic default too (backward_config). Not here: (192, 128), window, softcap, varlen (ConfigErrors upstream).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import LayoutEnum

from .barriers import Bar
from .bwd import SMEM_BYTES, BwdSmem, BwdWork, DkdvDest, DsPtrs, transpose_view
from .bwd_wide import FlashBwdWideSm90
from .bwd_dq_writer import wait_for_turn
from .bwd_wide_two_cta import FlashBwdWideTwoCtaSm90
from .gemm import wgmma

TILE_N80 = 80  # K/V rows per CTA
_HALF_N = TILE_N80 // 2  # K/V rows of a warpgroup's S / dP tile
# deterministic dQ turns between warp 1 (dq_turns) and the MMA warps: the writer warp's dQ barriers, free here (no writer)
_BAR_TURN = int(Bar.BWD_DQ_FULL)
_BAR_TURN_DONE = int(Bar.BWD_DQ_EMPTY)


@dsl_user_op
def red_add_v4_f32(gptr: cute.Pointer, a: Float32, b: Float32, c: Float32, d: Float32, *, loc=None, ip=None) -> None:
    """red.global.add.v4.f32: add 4 consecutive fp32 (16-byte aligned) into global memory, relaxed, GPU scope."""
    llvm.inline_asm(
        None,
        [gptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)]
        + [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
        "red.relaxed.gpu.global.add.v4.f32 [$0], {$1, $2, $3, $4};",
        "l,f,f,f,f",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


class FlashBwdWide80TwoCtaSm90(FlashBwdWideTwoCtaSm90):
    """hd256 2-CTA backward main kernel with 80-row K/V tiles (module docstring). The kernel entry, the producer (load,
    load_kv), the exchange warp, the tile schedule and the pipelines are FlashBwdWideTwoCtaSm90's / FlashBwdSm90's;
    here the shared-memory plan, the GEMMs and the MMA warpgroups' loop (mma_pair), without a writer warp."""

    has_writer = False  # the MMA warps reduce dQ into dQaccum themselves (dq_reduce)

    def __init__(self, dtype, hdim: int, causal: bool, deterministic: bool = False, two_cta: bool = True,
                 exp2_emu_fraction: float = 0.0, consumer_regs: int = 240, producer_regs: int = 24,
                 det_schedule: str = "spt", tile_m: int | None = None, hdim_v: int | None = None,
                 qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1, softcap: float = 0.0):
        hdim_v = hdim if hdim_v is None else hdim_v
        if not two_cta or (hdim, hdim_v) != (256, 256):
            raise ValueError("FlashBwdWide80TwoCtaSm90: hdim 256 with two_cta=True only")
        FlashBwdWideSm90.__init__(self, dtype, hdim, causal, deterministic, False, exp2_emu_fraction, consumer_regs,
                                  producer_regs, det_schedule, tile_m, hdim_v, qhead_per_kvhead, window_left,
                                  window_right, softcap)
        if self.has_window or self.softcap > 0.0:
            raise ValueError("bwd_two_cta_n80: not supported with a sliding window or softcap")
        self.two_cta = True
        self.cluster = 2
        self.stages = 1  # dS exchange buffers (shared_setup)
        self.dq_turn_warp = self.deterministic  # warp 1 grants the dQ turns (dq_turns)
        # det_schedule "rotate" (deterministic, non-causal): the pairs' rotated walks (with_m_rot, m_block_at) and
        # arrival-order turns, as FlashBwdWideTwoCtaSm90's; no rotate_q without determinism (backward.py ConfigError)
        self._set_det_rotate(det_schedule, pairs=True)
        self.m_rotate = self.det_rotate
        self.tile_n = TILE_N80
        tm, tn, d, dv = self.tile_m, self.tile_n, hdim, hdim_v
        assert tm == 64 and self.atom_qk == 64
        self.q_stages, self.do_stages = 2, 1
        self.dq_shape = (64, tm)  # dQ^T per warpgroup: head-dim rows x Q rows
        self.dq_vals = self.dq_shape[0] * self.dq_shape[1] // 128
        self.dq_chunk = 128 * self.dq_vals
        self.dq_pieces, self.dq_stages = 1, 0
        eb = dtype.width // 8
        q_stage, do_stage = tm * d * eb + tm * 4, tm * dv * eb + tm * 4
        self.smem_bytes = (self.q_stages * q_stage + self.do_stages * do_stage + tn * (d + dv) * eb
                           + tn * (d // 2) * eb + 3 * tm * tn * eb)
        assert self.smem_bytes + 256 <= SMEM_BYTES, self.smem_bytes  # the struct's own check is in __call__
        self._set_exp2_regs(_HALF_N, exp2_emu_fraction, consumer_regs, producer_regs)  # S_w: 64 x 40 per warpgroup

    def post_layout(self) -> dict:
        """The postprocess's view of dQaccum: per Q tile 4 chunks of dQ^T (64 head-dim rows x 64 Q rows), chunk c =
        head-dim rows [64 c, 64 c + 64) (CTA r's warpgroup w: c = 2 r + w)."""
        return dict(chunks=self.num_mma_wg * self.cluster, transposed=True, dq_shape=self.dq_shape)

    def wide_layouts_and_mmas(self) -> tuple:
        """Shared-memory layouts (Q, dO, K, V, P / dS as (Q rows, K/V rows) with Q rows contiguous) and the tiled MMAs
        (S / dP, dK^T / dV^T, dQ^T)."""
        tm, tn, d, dv = self.tile_m, self.tile_n, self.hdim, self.hdim_v
        self.sQ_layout = self._smem_layout(tm, d, self.q_stages, self.atom_qk)
        self.sdO_layout = self._smem_layout(tm, dv, self.do_stages, self.atom_v)
        self.sK_layout = self._smem_layout(tn, d, 1, self.atom_qk)
        self.sV_layout = self._smem_layout(tn, dv, 1, self.atom_v)
        self.sPdS_layout = sm90_utils.make_smem_layout_a(LayoutEnum.COL_MAJOR, (tm, 64, tn), self.dtype, 1)
        K, MN = OperandMajorMode.K, OperandMajorMode.MN
        mma_S = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, K, K, Float32, (1, 1, 1), (64, _HALF_N))
        mma_dKV = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, MN, K, Float32, (1, 1, 1), (64, tn))
        mma_dQ = sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, MN, MN, Float32, (1, 1, 1), self.dq_shape)
        return mma_S, mma_dKV, mma_dKV, mma_dQ

    def _two_cta_storage(self, pds_cosize, kp_cosize):
        """Shared memory: mbarriers, LSE / dPsum stages, the Q / dO / K / V / K_peer tiles, P, dS, the received dS."""
        R, A = cute.struct.MemRange, cute.struct.Align
        tile = lambda n: A[R[self.dtype, n], 1024]
        qst, dost = self.q_stages, self.do_stages
        fields = dict(mbar_q=R[cutlass.Int64, qst * 2], mbar_do=R[cutlass.Int64, dost * 2],
                      mbar_kv=R[cutlass.Int64, 2], mbar_dsfull=R[cutlass.Int64, self.stages],
                      mbar_dsempty=R[cutlass.Int64, self.stages],
                      sLSE=A[R[Float32, self.lse_stride * qst], 128], sdPsum=A[R[Float32, self.lse_stride * dost], 128],
                      sQ=tile(cute.cosize(self.sQ_layout)), sdO=tile(cute.cosize(self.sdO_layout)),
                      sK=tile(cute.cosize(self.sK_layout)), sV=tile(cute.cosize(self.sV_layout)), sKp=tile(kp_cosize),
                      sP=tile(pds_cosize), sdS=tile(pds_cosize), sdSp=tile(pds_cosize))
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def mma_pair(self, mdQaccum, mdK, mdV, tma_dK, tma_dV, mma_S, mma_dKV, mma_dV, mma_dQ, smem: BwdSmem, sP,
                 ptrs: DsPtrs, pipes, work: BwdWork, tidx, softmax_scale, scale_log2):
        """MMA warpgroups: per Q tile S_w / dP_w -> P_w / dS_w into the shared P / dS tiles, dV^T, dQ^T over the own and
        the peer's dS / K (reduced from registers), dK^T; then the dK / dV epilogue."""
        tm, tn, d, dv = self.tile_m, self.tile_n, self.hdim, self.hdim_v
        qst, dost = self.q_stages, self.do_stages
        n_block, rank = work.n_block, work.rank
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tid = tidx % 128
        sQ, sK, sV, sdO, sdS, sKp, sdSp = smem.sQ, smem.sK, smem.sV, smem.sdO, smem.sdS, smem.sKp, smem.sdSp

        # ---- S_w = Q K_w^T, dP_w = dO V_w^T ----
        thr_S = mma_S.get_slice(tid)
        tSrQ = thr_S.make_fragment_A(thr_S.partition_A(sQ))
        tSrdO = thr_S.make_fragment_A(thr_S.partition_A(sdO))
        tSrK = thr_S.make_fragment_B(thr_S.partition_B(cute.local_tile(sK[None, None, 0], (_HALF_N, d), (wg, 0))))
        tSrV = thr_S.make_fragment_B(thr_S.partition_B(cute.local_tile(sV[None, None, 0], (_HALF_N, dv), (wg, 0))))
        acc_S = cute.make_rmem_tensor(thr_S.partition_shape_C((tm, _HALF_N)), Float32)
        acc_dP = cute.make_rmem_tensor(thr_S.partition_shape_C((tm, _HALF_N)), Float32)
        tScS = thr_S.partition_C(cute.make_identity_tensor((tm, _HALF_N)))  # (Q row, K/V column of this warpgroup)
        bcast = lambda n: cute.make_layout((tm, _HALF_N, n), stride=(1, 0, self.lse_stride))
        tSsLSE = thr_S.partition_C(cute.make_tensor(smem.sLSE.iterator, bcast(qst)))
        tSsdPsum = thr_S.partition_C(cute.make_tensor(smem.sdPsum.iterator, bcast(dost)))
        rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        rdS = cute.make_rmem_tensor_like(acc_dP, self.dtype)
        # P_w / dS_w -> the (Q rows, K/V rows) tiles, Q rows contiguous: transposing stmatrix, two 8 x 8 matrices per
        # instruction (40 columns are 2.5 groups of four: x4 went through local memory, CPU SASS)
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=2), self.dtype)
        thr_st = cute.make_tiled_copy_C(st_atom, mma_S).get_slice(tid)
        tSsP = thr_st.partition_D(cute.local_tile(sP[None, None, 0], (tm, _HALF_N), (0, wg)))
        tSsdS = thr_st.partition_D(cute.local_tile(sdS[None, None, 0], (tm, _HALF_N), (0, wg)))

        # ---- dV^T[half w] += dO^T[half w] P, dK^T[half w] += Q^T[half w] dS (M = head dim, N = K/V rows) ----
        thr_dKV = mma_dKV.get_slice(tid)
        tdVrdO = thr_dKV.make_fragment_A(thr_dKV.partition_A(
            cute.local_tile(transpose_view(sdO), (dv // 2, tm, dost), (wg, 0, 0))))
        tdVrP = thr_dKV.make_fragment_B(thr_dKV.partition_B(transpose_view(sP)[None, None, 0]))
        tdKrQ = thr_dKV.make_fragment_A(thr_dKV.partition_A(
            cute.local_tile(transpose_view(sQ), (d // 2, tm, qst), (wg, 0, 0))))
        tdKrdS = thr_dKV.make_fragment_B(thr_dKV.partition_B(transpose_view(sdS)[None, None, 0]))
        acc_dV = cute.make_rmem_tensor(thr_dKV.partition_shape_C((dv // 2, tn)), Float32)
        acc_dK = cute.make_rmem_tensor(thr_dKV.partition_shape_C((d // 2, tn)), Float32)
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)

        # ---- dQ^T[64 rows of CTA rank, warpgroup w] = K^T dS^T + K_peer^T dS_peer^T ----
        thr_dQ = mma_dQ.get_slice(tid)
        dq_m = self.dq_shape[0]
        tdQrK = thr_dQ.make_fragment_A(thr_dQ.partition_A(
            cute.local_tile(transpose_view(sK)[None, None, 0], (dq_m, tn), (rank * self.num_mma_wg + wg, 0))))
        tdQrKp = thr_dQ.make_fragment_A(thr_dQ.partition_A(
            cute.local_tile(transpose_view(sKp)[None, None, 0], (dq_m, tn), (wg, 0))))
        tdQrdS = thr_dQ.make_fragment_B(thr_dQ.partition_B(sdS[None, None, 0]))
        tdQrdSp = thr_dQ.make_fragment_B(thr_dQ.partition_B(sdSp[None, None, 0]))
        acc_dQ = cute.make_rmem_tensor(thr_dQ.partition_shape_C(self.dq_shape), Float32)
        mdQ2 = mdQaccum[None, None, work.head, work.batch]  # (padded Q rows, d), chunks back to back

        pds_bar = pipeline.NamedBarrier(barrier_id=int(Bar.BWD_PDS), num_threads=self.num_mma_threads)
        n_row0 = n_block * tn + wg * _HALF_N  # this warpgroup's first K/V row
        causal_off = work.seqlen_k - work.seqlen_q

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipes.pipe_kv.consumer_wait(kv_state)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, qst)
        do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, dost)

        for m_block in cutlass.range(work.m_block_min, work.m_block_max, unroll=1):
            qi = q_state.index
            di = do_state.index
            it = m_block - work.m_block_min
            if const_expr(self.m_rotate):  # ``m_block`` is the loop step: its tile (m_block_at); ``it`` stays the step
                m_block = self.m_block_at(m_block, work)
            pipes.pipe_q.consumer_wait(q_state)
            wgmma(mma_S, acc_S, tSrQ[None, None, None, qi], tSrK, zero_init=True)
            pipes.pipe_do.consumer_wait(do_state)
            wgmma(mma_S, acc_dP, tSrdO[None, None, None, di], tSrV, zero_init=True, fence=False)
            warpgroup.wait_group(1)
            self.p_rows(acc_S, tScS, tSsLSE[None, None, None, qi], n_block, n_row0, m_block * tm, work.seqlen_k,
                        causal_off, scale_log2)
            rP.store(acc_S.load().to(self.dtype))
            self.ds_from_p(acc_S, acc_dP, tSsdPsum[None, None, None, di], rdS)
            # the peer has read the dS tile sent for the previous Q tile, and both warpgroups' GEMMs of the previous
            # tile have finished reading sP / sdS (the waits after the exponentials, which they overlap)
            if it > 0:
                cute.arch.mbarrier_wait(ptrs.mbar_dsempty, (it - 1) % 2)
            pds_bar.arrive_and_wait()
            cute.copy(st_atom, thr_st.retile(rP), tSsP)
            cute.copy(st_atom, thr_st.retile(rdS), tSsdS)
            cute.arch.fence_view_async_shared()
            pds_bar.arrive_and_wait()
            cute.arch.barrier_arrive(barrier_id=int(Bar.BWD_DS_SEND), number_of_threads=self.num_mma_threads + 32)
            wgmma(mma_dKV, acc_dV, tdVrdO[None, None, None, di], tdVrP, zero_init=False)  # dV^T += dO^T P
            wgmma(mma_dQ, acc_dQ, tdQrK, tdQrdS, zero_init=True, fence=False, commit=False)
            cute.arch.mbarrier_wait(ptrs.mbar_dsfull, it % 2)
            wgmma(mma_dQ, acc_dQ, tdQrKp, tdQrdSp, zero_init=False, fence=False)
            wgmma(mma_dKV, acc_dK, tdKrQ[None, None, None, qi], tdKrdS, zero_init=False, fence=False)  # dK^T += Q^T dS
            warpgroup.wait_group(1)  # dV and dQ done: the exchange warp hands back the dO stage and the peer's dS
            cute.arch.barrier_arrive(barrier_id=int(Bar.BWD_DS_READ), number_of_threads=self.num_mma_threads + 32)
            if const_expr(self.deterministic):  # this CTA's turn on the Q tile's dQ (warp 1 polled it: dq_turns)
                cute.arch.barrier(barrier_id=_BAR_TURN, number_of_threads=self.num_mma_threads + 32)
            self.dq_reduce(acc_dQ, mdQ2, m_block * self.cluster + rank, wg, tid)
            if const_expr(self.deterministic):  # reductions issued: warp 1 releases the turn
                cute.arch.barrier_arrive(barrier_id=_BAR_TURN_DONE, number_of_threads=self.num_mma_threads + 32)
            warpgroup.wait_group(0)
            pipes.pipe_q.consumer_release(q_state)
            q_state.advance()
            do_state.advance()

        dest = DkdvDest(sK, sV, tma_dK, tma_dV, mdK, mdV, n_block, work.head, work.batch)
        self.dkdv_epilogue_t(acc_dK, acc_dV, mma_dKV, dest, pds_bar, wg, tid, tidx, softmax_scale, work.seqlen_k)

    @cute.jit
    def p_rows(self, acc_S, tScS, tLSE, n_block, n_row0, m_row0, seqlen_k, causal_off, scale_log2):
        """P_w = exp2(S_w scale_log2 - LSE_log2) in place, 0 past seqlen_k and right of the diagonal (the mask only on
        tiles that cross either)."""
        need_mask = (n_block + 1) * self.tile_n > seqlen_k
        if const_expr(self.causal):
            need_mask = need_mask | ((n_block + 1) * self.tile_n - 1 > m_row0 + causal_off)
        if need_mask:
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                q, c = tScS[i]
                n_g = n_row0 + c
                masked = n_g >= seqlen_k
                if const_expr(self.causal):
                    masked = masked | (n_g > m_row0 + q + causal_off)
                p = self.exp2_elem(acc_S[i] * scale_log2 - tLSE[i], i)
                acc_S[i] = Float32(0.0) if masked else p
        else:
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = self.exp2_elem(acc_S[i] * scale_log2 - tLSE[i], i)

    @cute.jit
    def dq_reduce(self, acc_dQ, mdQ2, acc_block, wg, tid):
        """This warpgroup's dQ^T fragment added into chunk 2 rank + wg of Q tile slot acc_block / 2 (acc_block = m_block
        * 2 + rank) in fragment order: value i of thread tid at tid * 4 + (i // 4) * 512 + i % 4, 8 16-byte reductions."""
        base = mdQ2.iterator + ((acc_block * self.num_mma_wg + wg) * self.dq_chunk + tid * 4)
        for j in cutlass.range_constexpr(self.dq_vals // 4):
            red_add_v4_f32(base + j * 512, acc_dQ[4 * j], acc_dQ[4 * j + 1], acc_dQ[4 * j + 2], acc_dQ[4 * j + 3])

    @cute.jit
    def dq_turns(self, mSem, work: BwdWork):
        """deterministic, warp 1: per Q tile of the walk, lane 0 polls this CTA's turn on the tile's semaphore (its own
        per CTA of the pair, turns over the pairs: dq_slot / det_turn) while the MMA warps compute the tile, lets them
        through to their reductions (named barrier _BAR_TURN) and once they have issued them (_BAR_TURN_DONE, a
        release by each arriving thread) fences and adds 1 (release, GPU scope): FA3's barrier-then-one-thread-fence-
        and-increment. The MMA warps wait on a named barrier, never on global memory, and the exchange warp's hand-backs
        to the peer never wait for a turn."""
        lane = cute.arch.lane_idx()
        rot = self.det_rotate_base(work)
        causal_off = work.seqlen_k - work.seqlen_q
        for m_iter in cutlass.range(work.m_block_min, work.m_block_max, unroll=1):
            m_block = self.m_block_at(m_iter, work)
            _, sem_ptr = self.dq_slot(mSem, work, m_block)
            turn = self.det_turn(work, m_block, rot, causal_off)
            if lane == 0:
                wait_for_turn(sem_ptr, turn)
            cute.arch.sync_warp()
            cute.arch.barrier_arrive(barrier_id=_BAR_TURN, number_of_threads=self.num_mma_threads + 32)
            cute.arch.barrier(barrier_id=_BAR_TURN_DONE, number_of_threads=self.num_mma_threads + 32)
            if lane == 0:
                cute.arch.fence_acq_rel_gpu()
                cute.arch.red(sem_ptr, Int32(1), op="add", dtype="s32", sem="release", scope="gpu")
            cute.arch.sync_warp()

    @cute.jit
    def dkdv_epilogue_t(self, acc_dK, acc_dV, mma_dKV, dest: DkdvDest, pds_bar, wg, tid, tidx, softmax_scale,
                        seqlen_k):
        """dK^T * softmax_scale and dV^T in the input dtype, stored transposed (stmatrix .trans) into the K / V tiles'
        shared memory (head-dim half w, all K/V rows) once both warpgroups are past their last GEMM, then one TMA store
        each (skipped for a tile wholly past seqlen_k)."""
        d, dv, tn = self.hdim, self.hdim_v, self.tile_n
        rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
        rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
        acc_dK.store(acc_dK.load() * softmax_scale)
        rdK.store(acc_dK.load().to(self.dtype))
        rdV.store(acc_dV.load().to(self.dtype))
        pds_bar.arrive_and_wait()
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        thr_st = cute.make_tiled_copy_C(st_atom, mma_dKV).get_slice(tid)
        sdKt = cute.local_tile(transpose_view(dest.sdKs)[None, None, 0], (d // 2, tn), (wg, 0))
        sdVt = cute.local_tile(transpose_view(dest.sdVs)[None, None, 0], (dv // 2, tn), (wg, 0))
        cute.copy(st_atom, thr_st.retile(rdK), thr_st.partition_D(sdKt))
        cute.copy(st_atom, thr_st.retile(rdV), thr_st.partition_D(sdVt))
        cute.arch.fence_view_async_shared()
        pds_bar.arrive_and_wait()
        if tidx == 0:
            if dest.n_block * tn < seqlen_k:
                self.dkdv_store(dest)
