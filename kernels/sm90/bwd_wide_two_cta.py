"""FlashAttention backward for Hopper (sm_90a), hdim 256 with ``two_cta=True``: the wide kernel (bwd_wide.py) in
clusters of two CTAs that share every Q-side load and split the dQ reduction.

Why. The one-CTA hd256 kernel (64 x 64 tiles) moves, per Q tile of 64 rows and per CTA, 64 KB of Q + dO (+ LSE /
dPsum) in from L2 and 64 KB of fp32 dQ (64 x 256 x 4 B) out as bulk reductions into dQaccum, for 5 x 2 x 64 x 64 x 256 =
10.5 MFLOP of wgmma: 12.5 bytes of L2 traffic per KFLOP. Official FA4's open PR #2889 measured that with the dQ
reductions compiled out its one-CTA kernel would run at 747 instead of 471 TFLOP/s (its 2-CTA DSMEM exchange then gave
530 on the H200). A cluster halves both streams.

Scheme. CTAs 2p and 2p+1 of a cluster own K/V tiles 2p, 2p+1 (64 rows each) and walk the same Q tiles (causal: the
pair's first tile's range, extra tiles masked, as bwd.py's two_cta).
- Q, dO, LSE, dPsum: each CTA issues half of every tile with TMA multicast to both (bwd.py's ``load``; the pipelines'
  empty barriers count the consumer warps of both CTAs): 32 + 32 KB issued per CTA and Q tile instead of 64 + 64.
- S^T, dP^T, P^T, dS^T, dV and dK: exactly the one-CTA wide kernel's (each warpgroup 64 K/V rows x 32 Q rows for S^T /
  dP^T, its head-dim half of dK / dV over all 64 Q rows, SS GEMMs from the P^T / dS^T tiles in shared memory).
- dQ: CTA r owns head-dim columns [128 r, 128 r + 128) of every Q tile with the full reduction over the pair's 128 keys,
  dQ[:, half r] = dS_own K_own[:, half r] + dS_peer K_peer[:, half r]; warpgroup w takes columns 128 r + 64 w .. +64,
  one 64 x 64 accumulator (32 fp32 registers, half the one-CTA kernel's 2 x 32) over K = 64 + 64. dS_peer is the
  peer's whole 64 x 64 dS tile (8 KB), received once per Q tile over distributed shared memory: after both warpgroups
  have stored dS^T, warp 2 (the exchange warp, idle in the one-CTA kernel) sends the CTA's own tile with one
  ``cp.async.bulk.shared::cluster.shared::cta`` into the peer's receive buffer, completing on the peer's mbarrier
  (dsfull), and once the MMA warpgroups' dQ GEMM has read the received tile it hands it back with one remote arrival
  on the sender's dsempty (it also releases the dO stage for them: ``exchange``). K_peer[:, half r] (16 KB) is loaded
  once from global memory next to K and V. Each dQ element is reduced into dQaccum once per pair instead of once per
  CTA: 32 KB of bulk reductions per CTA and Q tile instead of 64 KB, for 8 KB of DSMEM traffic.
- dQ leaves through bwd.py's writer warp: each warpgroup's 64 x 64 fp32 fragment goes to it in two halves of 16 values
  per thread (8 KB, columns 0-31 then 32-63 of its slice) through one 8 KB buffer per warpgroup; half h of warpgroup w
  of CTA r lands at chunk 2r + w (+ 8 KB h) of the Q tile's slot, so dQaccum holds the one-CTA hd256 layout (four
  64 x 64 chunks in fragment order, the same postprocess) and the writer's slots are bwd.py's two_cta ones (m_block * 2
  + r, four 8 KB hand-offs of a CTA per tile; ``deterministic`` gives each CTA's half its own semaphore, turns counted
  over the pairs).

Shared memory (bf16/fp16; 227 KB = 232,448 bytes per CTA). The one-CTA plan is Q 2 x 32 KB, dO 1 x 32 KB, K + V 64 KB,
P^T + dS^T 16 KB, dQ staging 2 x 16 KB = 209 KB (+ LSE / dPsum and barriers); the cluster adds K_peer half 16 KB + the
received dS tile 8 KB = 24 KB, which would make 233 KB. The dQ staging halves instead (2 x 8 KB: a warpgroup's second
hand-off waits for the writer's bulk read of the first, under the dK GEMM), so: Q 66,048 (2 stages with LSE) + dO
33,024 + K + V 65,536 + K_peer 16,384 + P^T + dS^T 16,384 + dS_peer 8,192 + dQ 16,384 = 221,952 bytes (217 KB) + the
mbarriers. The second Q stage stays (official FA4's move to a 2-stage 64 x 48 hd256 config, PR #2888, went from 302 to
373 TFLOP/s); a second dQ buffer per warpgroup (+16 KB) or dS exchange stage (+16 KB with its source) do not fit. The
single dS exchange buffer means a CTA writes dS^T of Q tile i only after the peer has read tile i-1's (its dQ GEMM of
tile i-1 finished half a tile earlier). Registers per MMA thread (of 240): dK + dV 64 + 64, dQ 32, S^T + dP^T 16 + 16,
P^T / dS^T in the input dtype 8 + 8.

Not here: (192, 128) (its 96-column dQ halves do not split into 64-column warpgroup slices of the 32-wide swizzle
atoms), sliding window, softcap, varlen (ConfigErrors in backward.py).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, const_expr
from cutlass._mlir.dialects import nvvm as _nvvm
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.experimental.primitives.nvvm_wrapper import cp_async_bulk_shared_cluster_shared_cta
from cutlass.tensor_utils import LayoutEnum

from .barriers import Bar
from .bwd import SMEM_BYTES, BwdGmem, BwdPipes, BwdSmem, BwdWork, DkdvDest, DsPtrs, SOperands, TileRows, transpose_view
from .bwd_wide import FlashBwdWideSm90
from .gemm import wgmma

_CLUSTER = _nvvm.MemScopeKind.CLUSTER

# (hdim, hdim_v) with a 2-CTA wide backward
TWO_CTA_WIDE_HDIMS = ((256, 256),)


class TwoCtaTma(NamedTuple):
    """The producer's TMA atoms (bwd.py's BwdTma loads) plus the peer K half: its atom and this CTA's global tiles of
    it (K tiles of the K/V head, head-dim columns [hdim/2 rank, ...), indexed by K/V tile)."""
    tma_Q: Any
    tma_K: Any
    tma_V: Any
    tma_dO: Any
    tma_LSE: Any
    tma_dPsum: Any
    tma_Kp: Any
    gKp: Any


class FlashBwdWideTwoCtaSm90(FlashBwdWideSm90):
    """hd256 backward main kernel in 2-CTA clusters (module docstring). Plain-Python knobs in, compile-time
    constants inside; the producer, writer warp, tile schedule, pipelines, P^T / dS^T computation and dK / dV
    epilogue are FlashBwdSm90's / FlashBwdWideSm90's."""

    dq_turn_warp = False  # warp 1 grants and releases the deterministic dQ turns (bwd_wide_two_cta80's dq_turns)
    has_writer = True  # warp 1 bulk-reduces dQ from the staging buffer (bwd_wide_two_cta80: the MMA warps reduce it)

    def __init__(self, dtype, hdim: int, causal: bool, deterministic: bool = False, two_cta: bool = True,
                 exp2_emu_fraction: float = 0.0, consumer_regs: int = 240, producer_regs: int = 24,
                 det_schedule: str = "spt", tile_m: int | None = None, hdim_v: int | None = None,
                 qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                 rotate_q: bool = False):
        hdim_v = hdim if hdim_v is None else hdim_v
        if not two_cta:
            raise ValueError("two_cta=False: FlashBwdWideTwoCtaSm90 is the 2-CTA kernel (FlashBwdWideSm90 is the "
                             "one-CTA one)")
        if (hdim, hdim_v) not in TWO_CTA_WIDE_HDIMS:
            raise ValueError(f"two_cta=True at (hdim, hdim_v)=({hdim}, {hdim_v}): the wide 2-CTA backward supports "
                             f"{list(TWO_CTA_WIDE_HDIMS)}")
        super().__init__(dtype, hdim, causal, deterministic, False, exp2_emu_fraction, consumer_regs, producer_regs,
                         det_schedule, tile_m, hdim_v, qhead_per_kvhead, window_left, window_right, softcap)
        if self.has_window or self.softcap > 0.0:
            raise ValueError("two_cta=True: not supported with a sliding window or softcap (use two_cta=False)")
        self.two_cta = True
        self.cluster = 2
        # det_schedule "rotate" (deterministic, non-causal): each pair walks its Q tiles from rotate_start(pair, pairs, M),
        # dQ turns in arrival order over the pairs (bwd_dq_writer.py det_rotate_base / det_turn)
        self._set_det_rotate(det_schedule, pairs=True)
        # rotate_q (AttnConfig.bwd_rotate_q, opt-in): the pairs' rotated walks without determinism
        self.m_rotate = self.det_rotate or (rotate_q and not self.causal and not self.deterministic)
        self.stages = 1  # dS exchange buffers (bwd.py's shared_setup initialises this many dsfull / dsempty)
        tm, tn, d, dv = self.tile_m, self.tile_n, hdim, hdim_v
        assert tm == 64 and tn == 64 and self.atom_qk == 64
        # dQ: warpgroup w of CTA r computes columns [d/2 r + d/4 w, +d/4) over both K/V tiles (64 x 64, K = 128) and
        # hands it to the writer in two halves (dq_pieces hand-offs of dq_vals values per thread) through one buffer
        self.q_stages, self.do_stages = 2, 1
        self.dq_shape = (tm, d // 4)
        self.dq_pieces = 2
        self.dq_stages = 1
        self.dq_vals = tm * (d // 4) // 128 // self.dq_pieces
        self.dq_chunk = 128 * self.dq_vals
        eb = dtype.width // 8
        q_stage, do_stage = tm * d * eb + tm * 4, tm * dv * eb + tm * 4
        self.smem_bytes = (self.q_stages * q_stage + self.do_stages * do_stage + tn * (d + dv) * eb  # Q, dO, K + V
                           + tn * (d // 2) * eb  # the peer's K tile, this CTA's head-dim half
                           + 3 * tm * tn * eb  # P^T, dS^T, the peer's dS
                           + self.dq_stages * self.num_mma_wg * self.dq_chunk * 4)  # dQ staging
        assert self.smem_bytes + 2048 <= SMEM_BYTES, self.smem_bytes

    def post_layout(self) -> dict:
        """The postprocess's view of dQaccum: the one-CTA hd256 layout (four 64 x 64 chunks per Q tile)."""
        return dict(chunks=self.num_mma_wg * self.cluster, transposed=False)

    def _two_cta_storage(self, pds_cosize, kp_cosize):
        """Shared memory: mbarriers (Q / dO stages, K + V + K_peer, the dS exchange), LSE / dPsum stages, the Q / dO /
        K / V / K_peer tiles, P^T, dS^T, the received dS tile, dQ staging."""
        R, A = cute.struct.MemRange, cute.struct.Align
        tile = lambda n: A[R[self.dtype, n], 1024]
        qst, dost = self.q_stages, self.do_stages
        fields = dict(mbar_q=R[cutlass.Int64, qst * 2], mbar_do=R[cutlass.Int64, dost * 2],
                      mbar_kv=R[cutlass.Int64, 2], mbar_dsfull=R[cutlass.Int64, self.stages],
                      mbar_dsempty=R[cutlass.Int64, self.stages],
                      sLSE=A[R[Float32, self.lse_stride * qst], 128], sdPsum=A[R[Float32, self.lse_stride * dost], 128],
                      sQ=tile(cute.cosize(self.sQ_layout)), sdO=tile(cute.cosize(self.sdO_layout)),
                      sK=tile(cute.cosize(self.sK_layout)), sV=tile(cute.cosize(self.sV_layout)), sKp=tile(kp_cosize),
                      sP=tile(pds_cosize), sdS=tile(pds_cosize), sdSp=tile(pds_cosize),
                      sdQ=A[R[Float32, self.dq_stages * self.num_mma_wg * self.dq_chunk], 128])
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQaccum: cute.Tensor,
                 mdK: cute.Tensor, mdV: cute.Tensor, mSem: cute.Tensor,
                 softmax_scale: Float32, stream: cuda.CUstream):
        mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem = self._kernel_views(
            mQ, mK, mV, mdO, mLSE, mdPsum, mdQaccum, mdK, mdV, mSem)

        tm, tn, d, dv = self.tile_m, self.tile_n, self.hdim, self.hdim_v
        mc = self.cluster
        # bwd_wide.py's layouts and MMAs; the received dS tile has the layout of the sent one (sPdS_layout), so the
        # 8 KB go over byte for byte; plus the peer's K half
        mma_S, mma_dK, mma_dV, mma_dQ = self.wide_layouts_and_mmas()
        self.sKp_layout = self._smem_layout(tn, d // 2, 1, self.atom_qk)

        # Q / dO / LSE / dPsum multicast (self.two_cta); dK / dV stores from the K / V tiles' shared memory
        loads, atoms, (tdK, tdV, tma_dK, tma_dV) = self._tma_atoms(mQ, mK, mV, mdO, mLSE, mdPsum, mdK, mdV,
                                                                   self.sK_layout, self.sV_layout)
        tma_Kp, tKp = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mK,
                                                  cute.select(self.sKp_layout, mode=[0, 1]), (tn, d // 2))

        eb = self.dtype.width // 8
        self.bytes_q = tm * d * eb + tm * 4
        self.bytes_do = tm * dv * eb + tm * 4
        self.bytes_kv = tn * (d + dv) * eb + tn * (d // 2) * eb  # K, V and the peer K half on one barrier
        self.bytes_ds = tm * tn * eb
        self.shared_storage = self._two_cta_storage(cute.cosize(self.sPdS_layout), cute.cosize(self.sKp_layout))
        assert self.shared_storage.size_in_bytes() <= SMEM_BYTES, self.shared_storage.size_in_bytes()

        num_n_blocks = cute.ceil_div(mK.shape[0], tn)
        grid = (cute.ceil_div(num_n_blocks, mc) * mc, cute.size(mQ.shape[2]), cute.size(mQ.shape[3]))
        self.kernel(*loads, *atoms, tKp, tma_Kp, mdQaccum, tdK, tdV, tma_dK, tma_dV, mSem, mma_S, mma_dK, mma_dV,
                    mma_dQ, self.sQ_layout, self.sdO_layout, self.sK_layout, self.sV_layout, self.sKp_layout,
                    self.sPdS_layout, Float32(softmax_scale), self.score_scale(softmax_scale)).launch(
            grid=grid, block=[self.num_threads, 1, 1], cluster=[mc, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ---------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
               mLSE: cute.Tensor, mdPsum: cute.Tensor,
               tma_Q: cute.CopyAtom, tma_K: cute.CopyAtom, tma_V: cute.CopyAtom, tma_dO: cute.CopyAtom,
               tma_LSE: cute.CopyAtom, tma_dPsum: cute.CopyAtom, mKp: cute.Tensor, tma_Kp: cute.CopyAtom,
               mdQaccum: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, tma_dK: cute.CopyAtom,
               tma_dV: cute.CopyAtom, mSem: cute.Tensor,
               mma_S: cute.TiledMma, mma_dK: cute.TiledMma, mma_dV: cute.TiledMma, mma_dQ: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, sKp_layout: cute.ComposedLayout,
               sPdS_layout: cute.ComposedLayout, softmax_scale: Float32, scale_log2: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        bidx, head, batch = cute.arch.block_idx()
        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        n_block, num_groups, rank, m_block_min, m_block_max = self.tile_schedule(bidx, seqlen_q, seqlen_k)

        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum, tma_Kp):
                cpasync.prefetch_descriptor(atom)

        # mbarriers (the dS exchange ones too) initialised, then the cluster meets
        storage, pipes = self.shared_setup(tidx)
        sQ, sdO, sK, sV, sLSE, sdPsum = self.load_tensors(storage, sQ_layout, sdO_layout, sK_layout, sV_layout)
        get = lambda mem, lay: mem.get_tensor(lay.outer, swizzle=lay.inner)
        sKp = get(storage.sKp, sKp_layout)
        sP, sdS, sdSp = get(storage.sP, sPdS_layout), get(storage.sdS, sPdS_layout), get(storage.sdSp, sPdS_layout)
        smem = BwdSmem(sQ, sdO, sK, sV, sLSE, sdPsum, sdS=sdS, sKp=sKp, sdSp=sdSp, sdKs=sK, sdVs=sV)

        work = self.with_m_rot(BwdWork(n_block, head, batch, m_block_min, m_block_max, num_groups, rank, seqlen_q,
                                       seqlen_k))
        sdQ_ptr = None
        if const_expr(self.has_writer):
            sdQ_ptr = storage.sdQ.data_ptr()
        ptrs = DsPtrs(storage.sdS.data_ptr(), storage.sdSp.data_ptr(), sdQ_ptr, storage.mbar_dsfull.data_ptr(),
                      storage.mbar_dsempty.data_ptr())
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                head_kv = head
                if const_expr(self.qhead_per_kvhead > 1):
                    head_kv = head // self.qhead_per_kvhead
                gKp = cute.local_tile(mKp[None, None, head_kv, batch], (self.tile_n, self.hdim // 2), (None, rank))
                self.load(BwdGmem(mQ, mK, mV, mdO, mLSE, mdPsum),
                          TwoCtaTma(tma_Q, tma_K, tma_V, tma_dO, tma_LSE, tma_dPsum, tma_Kp, gKp), smem, pipes, work)
            if const_expr(self.has_writer):
                if warp_idx == 1:
                    self.dq_writer(mdQaccum, mSem, sdQ_ptr, work)
            if const_expr(self.dq_turn_warp):
                if warp_idx == 1:
                    self.dq_turns(mSem, work)
            if warp_idx == 2:
                self.exchange(pipes.pipe_do, ptrs, work)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.mma_pair(mdQaccum, mdK, mdV, tma_dK, tma_dV, mma_S, mma_dK, mma_dV, mma_dQ, smem, sP, ptrs, pipes,
                          work, tidx - 128, softmax_scale, scale_log2)
        # no CTA may leave while its peer can still multicast into it, send it dS or arrive on its barriers
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

    @cute.jit
    def mma_pair(self, mdQaccum, mdK, mdV, tma_dK, tma_dV, mma_S, mma_dK, mma_dV, mma_dQ, smem: BwdSmem, sP,
                 ptrs: DsPtrs, pipes: BwdPipes, work: BwdWork, tidx, softmax_scale, scale_log2):
        """The MMA warpgroups' role (mma_two_cta: dQ leaves through the writer warp; FlashBwdWide80TwoCtaSm90 overrides
        it with its own loop, which reduces dQ into ``mdQaccum`` itself)."""
        self.mma_two_cta(mdK, mdV, tma_dK, tma_dV, mma_S, mma_dK, mma_dV, mma_dQ, smem, sP, ptrs, pipes, work, tidx,
                         softmax_scale, scale_log2)

    @cute.jit
    def load_kv(self, tma: TwoCtaTma, pipe_kv, tKsK, tKgK, tVsV, tVgV, sKp, gK, n_block):
        """K and V of this CTA's tile, and this CTA's head-dim half of the peer's K tile, once, on one barrier (a peer
        tile past seqlen_k arrives as TMA zero fill; its dS is masked to zero anyway)."""
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipe_kv.producer_acquire(kv_state)
        bar = pipe_kv.producer_get_barrier(kv_state)
        cute.copy(tma.tma_K, tKgK[None, n_block], tKsK[None, 0], tma_bar_ptr=bar)
        cute.copy(tma.tma_V, tVgV[None, n_block], tVsV[None, 0], tma_bar_ptr=bar)
        tKpsKp, tKpgKp = self._tma_part(tma.tma_Kp, sKp, tma.gKp)
        cute.copy(tma.tma_Kp, tKpgKp[None, n_block ^ 1], tKpsKp[None, 0], tma_bar_ptr=bar)

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def mma_two_cta(self, mdK, mdV, tma_dK, tma_dV, mma_S, mma_dK, mma_dV, mma_dQ, smem: BwdSmem, sP, ptrs: DsPtrs,
                    pipes: BwdPipes, work: BwdWork, tidx, softmax_scale, scale_log2):
        """MMA warpgroups: per Q tile S^T / dP^T -> P^T / dS^T (bwd.py's p_and_ds), both to shared memory (the exchange
        warp then sends dS to the peer, and hands back the dO stage and the peer's dS once dV and dQ are done), dV, dQ
        over the own and the peer's dS / K (dq_two_cta; halves to the writer warp), dK; then the dK / dV epilogue."""
        tm, tn, d, dv, hm = self.tile_m, self.tile_n, self.hdim, self.hdim_v, self.half_m
        qst, dost = self.q_stages, self.do_stages
        n_block, rank = work.n_block, work.rank
        wg = cute.arch.make_warp_uniform(tidx // 128)
        tid = tidx % 128
        sQ, sK, sV, sdO, sdS, sKp, sdSp = smem.sQ, smem.sK, smem.sV, smem.sdO, smem.sdS, smem.sKp, smem.sdSp

        (tSrK, tSrV, tSrQ, tSrdO, acc_S, acc_dP, tScS, tSsLSE, tSsdPsum, rP, rdS, st_atom, thr_st, tSsP, tSsdS,
         tdVrP, tdVrdO, tdKrdS, tdKrQ) = self.s_dkv_fragments(mma_S, mma_dK, mma_dV, sQ, sK, sV, sdO, sP, sdS,
                                                              smem.sLSE, smem.sdPsum, wg, tid)
        # ---- dQ[:, d/2 rank + d/4 w .. +d/4] = dS K_own[:, ..] + dS_peer K_peer[:, ..] (SS, MN-major A and B) ----
        thr_dQ = mma_dQ.get_slice(tid)
        dq_n = self.dq_shape[1]
        tdQrdS = thr_dQ.make_fragment_A(thr_dQ.partition_A(sdS[None, None, 0]))
        tdQrdSp = thr_dQ.make_fragment_A(thr_dQ.partition_A(sdSp[None, None, 0]))
        tdQrK = thr_dQ.make_fragment_B(thr_dQ.partition_B(
            cute.local_tile(transpose_view(sK)[None, None, 0], (dq_n, tn), (rank * self.num_mma_wg + wg, 0))))
        tdQrKp = thr_dQ.make_fragment_B(thr_dQ.partition_B(
            cute.local_tile(transpose_view(sKp)[None, None, 0], (dq_n, tn), (wg, 0))))
        acc_dV = cute.make_rmem_tensor(mma_dV.get_slice(tid).partition_shape_C((64, dv // 2)), Float32)
        acc_dK = cute.make_rmem_tensor(mma_dK.get_slice(tid).partition_shape_C((64, d // 2)), Float32)
        acc_dQ = cute.make_rmem_tensor(thr_dQ.partition_shape_C(self.dq_shape), Float32)
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)

        pds_bar = pipeline.NamedBarrier(barrier_id=int(Bar.BWD_PDS), num_threads=self.num_mma_threads)
        n_row0 = n_block * tn
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
            m_row0 = m_block * tm + wg * hm  # this warpgroup's first Q row
            s_ops = SOperands(mma_S, acc_S, acc_dP, tSrK, tSrV, tSrQ[None, None, None, qi],
                              tSrdO[None, None, None, di], tScS, tSsLSE[None, None, None, qi],
                              tSsdPsum[None, None, None, di], rP, rdS)
            self.p_and_ds(s_ops, pipes, q_state, do_state,
                          TileRows(n_block, n_row0, m_row0, work.seqlen_k, causal_off, scale_log2))
            # the peer has read the dS tile sent for the previous Q tile: sdS (that copy's source) and the peer's
            # receive buffer are free; both warpgroups' GEMMs of the previous tile have finished reading sP / sdS
            if it > 0:
                cute.arch.mbarrier_wait(ptrs.mbar_dsempty, (it - 1) % 2)
            pds_bar.arrive_and_wait()
            cute.copy(st_atom, thr_st.retile(rP), tSsP)
            cute.copy(st_atom, thr_st.retile(rdS), tSsdS)
            cute.arch.fence_view_async_shared()
            pds_bar.arrive_and_wait()
            cute.arch.barrier_arrive(barrier_id=int(Bar.BWD_DS_SEND), number_of_threads=self.num_mma_threads + 32)
            wgmma(mma_dV, acc_dV, tdVrP, tdVrdO[None, None, None, di], zero_init=False)  # dV += P^T dO
            self.dq_two_cta(mma_dQ, acc_dQ, tdQrdS, tdQrK, tdQrdSp, tdQrKp, ptrs, it)
            wgmma(mma_dK, acc_dK, tdKrdS, tdKrQ[None, None, None, qi], zero_init=False, fence=False)  # dK += dS^T Q
            warpgroup.wait_group(1)  # dV and dQ done: the exchange warp hands back the dO stage and the peer's dS
            cute.arch.barrier_arrive(barrier_id=int(Bar.BWD_DS_READ), number_of_threads=self.num_mma_threads + 32)
            for h in cutlass.range_constexpr(self.dq_pieces):
                self.dq_half_to_writer(acc_dQ, h, ptrs.sdQ, wg, tid)
            warpgroup.wait_group(0)
            pipes.pipe_q.consumer_release(q_state)
            q_state.advance()
            do_state.advance()

        dest = DkdvDest(sK, sV, tma_dK, tma_dV, mdK, mdV, n_block, work.head, work.batch)
        # the pair's second K/V tile may lie wholly past seqlen_k: no store then
        self.dkdv_epilogue(acc_dK, acc_dV, mma_dK, mma_dV, dest, pds_bar, wg, tid, tidx, softmax_scale, work.seqlen_k)

    @cute.jit
    def exchange(self, pipe_do, ptrs: DsPtrs, work: BwdWork):
        """Warp 2, the pair's bookkeeping, per Q tile: once both MMA warpgroups have stored and fenced dS^T (named
        barrier BWD_DS_SEND), one lane expects the peer's dS tile on this CTA's dsfull and sends this CTA's tile into
        the peer's receive buffer (one bulk copy shared::cta -> shared::cluster, completing on the peer's dsfull); once
        their dV and dQ GEMMs are done (BWD_DS_READ), it hands back the dO stage to both CTAs' producers (the arrivals
        of the 8 MMA warps, as their consumer_release would) and the received dS tile to the peer (its dsempty, the
        256 MMA threads' count). In the MMA warps these branches (the send in ``if tidx == 0`` or elect_one, the
        lane-predicated multicast release, the remote arrivals) tipped ptxas into serialising every wgmma of the kernel
        in some configs (causal bf16: 48 WARPGROUP.DEPBAR instead of 4, C7520 "compiler-inserted WG.AR in divergent
        path"; CPU SASS)."""
        peer = work.rank ^ 1
        lane = cute.arch.lane_idx()
        mma_warps = self.num_mma_threads // 32
        do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.do_stages)
        for m_block in cutlass.range(work.m_block_min, work.m_block_max, unroll=1):
            cute.arch.barrier(barrier_id=int(Bar.BWD_DS_SEND), number_of_threads=self.num_mma_threads + 32)
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(ptrs.mbar_dsfull, self.bytes_ds)
                cp_async_bulk_shared_cluster_shared_cta(cute.arch.map_dsmem_ptr(ptrs.sdSp, peer), ptrs.sdS,
                                                        cute.arch.map_dsmem_ptr(ptrs.mbar_dsfull, peer), self.bytes_ds)
            cute.arch.barrier(barrier_id=int(Bar.BWD_DS_READ), number_of_threads=self.num_mma_threads + 32)
            if lane < self.cluster:  # lane c: CTA c's empty barrier of this dO stage
                cute.arch.mbarrier_arrive(pipe_do.consumer_get_barrier(do_state), lane, mma_warps)
            if lane == self.cluster:
                cute.arch.mbarrier_arrive(ptrs.mbar_dsempty, peer, self.num_mma_threads, scope=_CLUSTER)
            do_state.advance()

    @cute.jit
    def dq_two_cta(self, mma_dQ, acc_dQ, tdQrdS, tdQrK, tdQrdSp, tdQrKp, ptrs: DsPtrs, it):
        """dQ slice = dS K_own (issued at once) + dS_peer K_peer (issued once the peer's tile has arrived), one wgmma
        group."""
        wgmma(mma_dQ, acc_dQ, tdQrdS, tdQrK, zero_init=True, fence=False, commit=False)
        cute.arch.mbarrier_wait(ptrs.mbar_dsfull, it % 2)
        wgmma(mma_dQ, acc_dQ, tdQrdSp, tdQrKp, zero_init=False, fence=False)

    @cute.jit
    def dq_half_to_writer(self, acc_dQ, h: cutlass.Constexpr[int], sdQ_raw, wg, tid):
        """Values [h dq_vals, (h + 1) dq_vals) of warpgroup wg's dQ fragment (columns 32h .. 32h + 31 of its slice) to
        the writer warp through its one buffer, in fragment order: the two halves make the one-CTA kernel's 64 x 64
        chunk."""
        cute.arch.barrier(barrier_id=int(Bar.BWD_DQ_EMPTY) + wg, number_of_threads=160)
        sdQ_t = cute.make_tensor(sdQ_raw + (wg * self.dq_chunk + tid * 4),
                                 cute.make_layout((4, self.dq_vals // 4), stride=(1, 512)))
        for i in cutlass.range_constexpr(self.dq_vals):
            sdQ_t[i] = acc_dQ[h * self.dq_vals + i]
        cute.arch.fence_view_async_shared()
        cute.arch.barrier_arrive(barrier_id=int(Bar.BWD_DQ_FULL) + wg, number_of_threads=160)
