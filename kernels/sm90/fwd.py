"""FlashAttention-4-style forward kernel for Hopper (sm_90a) in the CuTe DSL: ``FlashFwdSm90``.

How the FA4 switches map onto Hopper (every one a compile-time constant of this class):
a producer warp (warpgroup 0, register budget lowered with setmaxnreg) streams Q once and K/V blocks
through a ``num_stages``-deep shared-memory ring with TMA on mbarriers (PipelineTmaAsync); tile_m / 64
consumer warpgroups (2 for tile_m = 128, 3 for 192, 4 for 256 without pingpong; registers raised with
setmaxnreg) each own 64 rows of the Q tile and run QK^T as an SS wgmma and PV as an RS wgmma with P kept in registers, fp32 accumulators.
``pingpong`` orders the warpgroups' GEMM issue round-robin with named barriers so one warpgroup's softmax
(its MUFU work) runs under the others' GEMMs; off, they run unsynchronised. ``intra_wg_overlap`` issues QK^T(j+1) and PV(j) together and
runs softmax(j+1) while PV(j) is in flight. ``rescale_threshold`` (tau) keeps a warp's stale row maxima
until some row grows by more than tau (warp vote), skipping the O / row-sum rescale (the FA4 conditional
rescale; Hopper has no correction warpgroup, so the saving is the FMULs and the dependency on the
critical path). ``rescale_before_pv`` (with intra_wg_overlap; FA3's RescaleOBeforeGemm): O is multiplied by block
j+1's row factors in the next step, between issuing S(j+2) = Q K^T and issuing O += P(j+1) V(j+1), so the FMULs run
while the warp waits for its QK^T and the softmax, P and the row sums form one basic block (no rescale branch after
the exponentials); a rescale that tau skipped is a factor of 1.0 (exact: the output is bitwise the default's).
Two layouts of the same arithmetic for ptxas (equal to the default's output up to one rounding: on a rescaled block the
row-sum update row_sum * factor + sum compiles as one FFMA in some layouts and rows, FMUL + FADD in others, so lse can
differ by an ulp; tests/test_fwd_loop_shape_gpu.py): ``causal_split`` (causal, no window,
overlapped loop) runs a tile's diagonal blocks after the first in one loop and the mask-free ones in another, with no
per-block mask decision inside a loop (the one-loop kernel compiles at hd128 / (192, 128) causal as a divergent loop:
pipeline states and wgmma descriptors in vector registers); ``exp_in_branch`` (tau > 0) computes a block's
exponentials inside both arms of the warp's rescale decision, so the wait for the in-flight P V GEMM stays after them
(after the decision, ptxas hoists that wait above them and the softmax no longer overlaps P V within the warpgroup).
``pv_wait_mid`` (opt-in, tau > 0) computes the first quarter of a block's exponentials inside both arms of that decision,
so the wait for P V(j) and the release of V(j)'s stage come after them, with the rest of the block (and P, converted by
inline PTX) after the wait, as official FA4's SASS has it (wait after 11 of 66 exponentials); at causal it implies
causal_split. ``exp2_emu_fraction`` moves whole register fragments of every row's exponentials from
MUFU.EX2 to an FMA-pipe polynomial (kernels/sm90/exp2.py). ``q_in_regs`` (hd128's default) loads each Q tile into
registers once (ldmatrix, load_q_regs) and runs every QK^T with Q as the wgmma's register operand, so the K/V loop
reads only K for it from shared memory. Causal: only the K blocks a tile needs are
loaded, masking only on the diagonal blocks, and tiles are issued longest first (kernels/sm90/scheduler.py).
O goes registers -> shared memory (stmatrix) -> global with one TMA store, which clips rows past seqlen_q;
LSE (natural log, fp32, (batch, heads, seqlen_q)) is stored by the threads owning column 0.
GQA / MQA: ``qhead_per_kvhead`` (a compile-time constant, part of the compile cache key when > 1) Q heads share one K/V
head; the producer loads K/V head ``head // qhead_per_kvhead`` for Q head ``head`` (the TMA coordinates), so K/V are
never repeated in memory; at 1 the code is the MHA kernel's (byte-identical SASS). Each Q head's tile loads its K/V
blocks itself (the group's re-reads hit L2) unless ``pack_gqa``.
Packed GQA ``pack_gqa`` (compile-time, group > 1; one tile per CTA: not varlen, persistent or cluster): a CTA works for
one K/V head, and row r of its Q tile is query position m_block * tile_m / g + r // g of Q head kv_head * g + r % g
(g = qhead_per_kvhead, tile_m % g == 0), so every K/V tile is loaded once per group instead of once per Q head, and a
short query (decode-like seqlen_q) still fills the tile. Q, O and LSE are viewed as ((g, s_q), ..., h_kv, b) (the
group's heads are adjacent in memory): Q comes in and O goes out as one 5-D TMA box (head dim, g, tile_m / g positions,
1, 1) each, TMA zero-filling / clipping positions past seqlen_q; LSE rows are predicated on r < g * seqlen_q. The K/V
block range is the plain one for tiles of tile_m / g query positions (``tile_q``), and the causal / window masks take
each row's bounds from its position r // g (``apply_mask_packed``). Off, the code is the plain kernel's (byte-identical
SASS).
Sliding window ``window_left`` / ``window_right`` (compile-time; -1 = unbounded; with ``causal`` the right bound is the
diagonal): query i sees keys i + s_k - s_q - left .. i + s_k - s_q + right. The tile visits only the K/V blocks that
intersect its rows' windows (n_block_min .. n_block_max-1, both loops shortened) and masks only the blocks crossing
a bound (kernels/sm90/mask.py). ``softcap`` > 0 (compile-time): S becomes tanh(S * scale / softcap) (MUFU.TANH) before
the mask, and the softmax runs with scale_log2 = softcap * log2(e) (the kernel's scale argument then carries
scale / softcap). At the defaults (no window, softcap 0) the code is the plain kernel's (byte-identical SASS).
Known (CPU SASS, not yet timed): at hd 64 (3 consumer warpgroups at 160 registers) causal+softcap and right-only windows
spill ~25 registers to local memory; AttnConfig(tile_n=112) or AttnConfig(tile_m=128, consumer_regs=240, producer_regs=24)
compiles them without (which is faster is for the GPU to say).
Variable-length batches ``varlen`` (compile-time; launched through ``call_varlen``, kernels/varlen.py): packed
(total, h, d) tensors and int32 cu_seqlens; grid (ceil(max_seqlen_q / tile_m), h, batch), m_block reversed when causal
(longest tiles first); each CTA reads its sequence's start and length from cu_seqlens_q / cu_seqlens_k and leaves at
once when its tile starts past the sequence's end. The TMA loads start at the sequence's first row (domain_offset of the
packed TMA tensors): rows past its end are the next sequence's, hidden by the seqlen_k edge mask (keys) or never stored
(queries). O goes registers -> shared memory -> global with 16-byte row-predicated stores by all consumer threads (a TMA
store clips only at the packed tensor's end and would overwrite the next sequence); LSE is (h, total_q). Off, the code is
the plain kernel's (byte-identical SASS).
Persistent scheduling ``persistent`` (compile-time; launched through ``call_persistent`` with ``num_ctas`` = min(SM count,
tiles)): grid (num_ctas,), CTA c walks tiles c, c + num_ctas, ... of the one-tile kernel's order (causal: longest first
in L2 groups; kernels/sm90/scheduler.py tile_at), the pipelines' states carried from tile to tile, so the next tile's
K/V loads overlap this tile's epilogue. Where shared memory allows (all but hd256) O gets its own buffer: Q is released
after the tile's last QK^T (the next Q loads under the last PV and the epilogue) and the O store is waited for only
before the next epilogue writes the buffer (it runs under the next tile's main loop) and at exit; otherwise O shares
Q's buffer and the next Q waits for the O store to have read it, unless ``o_via_v_stage``: O then goes through the last
K/V block's V stage in column chunks (stmatrix, 16-byte pieces read back and stored by every consumer thread), that
stage is released after the epilogue, and Q after the tile's last QK^T as with its own buffer. The tile-independent
wgmma views are built once per CTA (consumer_fragments). Not with varlen. Off, the code is the plain kernel's
(byte-identical SASS). ``persistent_snake`` (causal): the odd full rounds of the round robin in reverse CTA order
(scheduler.snake_tile). ``persistent_greedy`` (causal; launched through ``call_persistent_walk``): CTA c walks row c
of a host-built table instead, the tiles that list scheduling of the longest-first order gives it
(kernels/sm90/greedy_walk.py). ``split_tail``
(compile-time; persistent non-causal, no window; launched through ``call_persistent_split``): the tiles of the last
partial round are cut into K/V block pieces over every CTA, computed first (steps t < 0 of the walk, ``step_tile``) with
their normalised O (fp32) and LSE stored to a workspace (``store_piece``), and merged after the kernel by
kernels/sm90/fwd_tail.py TailCombine. Off, the code is the plain kernel's (byte-identical SASS).
Thread-block cluster ``cluster_m`` = 2 (compile-time; FA3's 2x1 cluster, non-causal only): the CTAs of a cluster compute
the adjacent Q tiles 2i, 2i+1 of one (head, batch) -- grid x rounded up to even, launched with cluster (2, 1, 1) -- and
visit the same K/V blocks, so every K/V tile is loaded once per cluster: each CTA's producer issues the TMA for its half
of the tile's rows (rank r: rows r * tile_n/2 ..) with multicast mask 0b11, into the same stage of both CTAs' shared
memory, completing on both CTAs' "full" barriers (each expects the whole tile's bytes, as without a cluster). The K and
V "empty" barriers count 2 x (consumer warps) arrivals: every consumer warp releases a stage in both CTAs (lane r
arrives on rank r's barrier: PipelineTmaAsync with a (1, 2, 1, 1) CTA layout), so neither producer refills a stage
that the peer's consumers still read. Both CTAs keep one pipeline schedule (same blocks, same order), which is why causal
and sliding windows (different K/V ranges per Q tile), varlen and persistent are refused. Barriers are initialised
before a cluster barrier (the peer multicasts into them), and a cluster barrier at exit keeps a CTA alive while its
peer can still arrive on its barriers. With an odd m-block count the last cluster's second CTA has a tile past seqlen_q:
it loads (TMA zero-fills the Q rows), computes and releases like its peer but stores no O (the store is skipped) and no
LSE (row-predicated). At 1 the code is the plain kernel's (byte-identical SASS).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.memory
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Boolean, Float32, Int32, Uint32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warp, warpgroup
from cutlass.tensor_utils import LayoutEnum

from ..config import speculation_compiles
from ..tiles import sm90_fwd_smem
from . import exp2 as exp2_mod
from .barriers import FWD_SPEC_WG1, FWD_TILE_EMPTY, FWD_TILE_FULL_WG1, Bar
from .gemm import wgmma, wgmma_split_a
from .layout import acc_as_a_operand, acc_rows_cols, quad_transpose
from .mask import apply_mask, n_block_range, n_block_range_window
from .fwd_tail import TailCombine, tail_piece, tail_pieces
from .scheduler import snake_tile, tile_at, tile_coords
from .softmax import (apply_softcap, exp_kept_max, finalize, online_softmax_finish, online_softmax_step, p_exceeds,
                      rescale_o, s_exceeds, store_p_asm, warpgroup_any)

LOG2_E = math.log2(math.e)

# named barrier ids (0 is __syncthreads)
BAR_EPILOGUE = int(Bar.FWD_EPILOGUE)
BAR_SCHED_WG1 = int(Bar.FWD_SCHED_WG1)  # + consumer warpgroup index (0, 1, 2)
BAR_SPEC_WG1 = int(FWD_SPEC_WG1)  # + consumer warpgroup index: speculative_exp's vote


class ConsumerFrags(NamedTuple):
    """A consumer thread's tile-independent views (consumer_fragments): its warpgroup, its MMA slices and the wgmma
    shared-memory operand fragments of Q, K and V^T."""
    wg: Int32
    thr_mma_qk: object
    thr_mma_pv: object
    tSrQ: object
    tSrK: object
    tOrVt: object
    q_copy: object = None  # q_in_regs: (ldmatrix tiled copy, this thread's sQ partition, the register fragment)
    ones: object = None  # row_sum_mma: (its m64n8 tiled MMA, this thread's slice, the ones tile's B fragment)
    p_smem: object = None  # p_smem: (stmatrix atom, its thread slice, this thread's sP partition, the P V A fragment)
    q_part: object = None  # q_regs_k: (the RS tiled MMA of Q K^T, Q's register fragment of the first k-blocks)
    k_halves: object = None  # qk_halves: (Q K^T's tiled MMA of tile_n/2 columns, the two halves' K fragments)


class Tile(NamedTuple):
    """One tile's work: its coordinates, sequence lengths, K/V block range and masking bounds (tile_blocks) and, for
    varlen, the sequence's first row in the packed Q / O / LSE (offset_q) and K / V (offset_k)."""
    m_block: Int32
    head: Int32
    bidx: Int32
    seqlen_q: Int32
    seqlen_k: Int32
    n_block_min: object  # 0 unless a left window bound skips blocks
    n_block_max: Int32
    n_block_min_masked: Int32
    n_block_local_end: object
    offset_q: object = 0
    offset_k: object = 0


class TileRegs(NamedTuple):
    """A consumer tile's registers: the S accumulator's shape, the O accumulator, P as the PV GEMM's A operand, the
    S coordinates (for the masks) and the online softmax's row statistics."""
    acc_shape_S: object
    acc_O: object
    tOrP: object
    tScS: object
    row_max: object
    row_sum: object
    row_scale: object
    acc_L: object = None  # row_sum_mma: the m64n8 accumulator of P 1 (every column a row sum)
    spec_left: object = None  # spec_redo_budget: the tile's redos left (one Int32, the same in the whole warpgroup)
    rP: object = None  # p_smem: P's registers in the S accumulator's layout (tOrP is the same registers as an A view)


class BlockArgs(NamedTuple):
    """What the softmax of every K/V block of a tile reads besides S: the exp2 scale, the pre-tanh softcap factor
    (None without a softcap), the tile's first row, the sequence lengths and the mask bounds."""
    scale_log2: Float32
    softcap_mul: object
    m_base: Int32
    seqlen_q: Int32
    seqlen_k: Int32
    n_block_min_masked: Int32
    n_block_local_end: object


class DeferredO(NamedTuple):
    """o_deferred: the previous tile's O store, run in the next tile's first block (store_deferred): whether there is
    one (the CTA's first tile has none), that tile, its normalised O (registers kept from tile to tile) and what the
    store needs (O, the V stages' chunk view, the V pipeline, the consumer thread index, its slice of the P V MMA)."""
    pending: object
    tile: Tile
    rO: object
    mO: object
    sO: object
    pipe_v: object
    tidx: Int32
    thr_mma_pv: object


class FlashFwdSm90:
    """One compiled forward kernel per (dtype, head dims, causal, resolved AttnConfig)."""

    threads_per_wg = 128

    def __init__(self, dtype, hdim: int, hdim_v: int, causal: bool, *, tile_m: int = 128, tile_n: int = 128,
                 num_stages: int = 2, rescale_threshold: float = 8.0, exp2_emu_fraction: float = 0.0,
                 pingpong: bool = True, intra_wg_overlap: bool = True, consumer_regs: int = 240,
                 producer_regs: int = 24, qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1,
                 softcap: float = 0.0, varlen: bool = False, persistent: bool = False,
                 cluster_m: int = 1, pack_gqa: bool = False, rescale_before_pv: bool = False,
                 causal_split: bool = False, exp_in_branch: bool = False, p_cvt_asm: bool = False,
                 pv_wait_mid: bool = False, early_v_release: bool = False, persistent_snake: bool = False,
                 q_in_regs: bool = False, split_tail: bool = False, persistent_greedy: bool = False,
                 lazy_row_max: bool = False, row_sum_mma: bool = False, speculative_exp: bool = False,
                 spec_redo_budget: int = 0, trace_ctas: bool = False, persistent_dynamic: bool = False,
                 early_desc: bool = False, p_smem: bool = False, p_smem_early: bool = False, q_regs_k: int = 0,
                 skip_idle_wg: bool = False, qk_halves: bool = False, p_before_vote: bool = False,
                 o_direct: bool = False, spec_warp_redo: bool = False, o_via_v_stage: bool = False,
                 o_deferred: bool = False, o_direct_wide: bool = False, skip_diag_wg: bool = False,
                 q_prefetch: bool = False):
        if dtype not in (cutlass.BFloat16, cutlass.Float16):
            raise ValueError(f"dtype={dtype}: supported are cutlass.BFloat16, cutlass.Float16")
        if (hdim, hdim_v) not in ((64, 64), (128, 128), (256, 256), (192, 128)):
            raise ValueError(f"head dims ({hdim}, {hdim_v}): supported (64,64), (128,128), (256,256), (192,128)")
        if tile_m not in (128, 192, 256):
            raise ValueError(f"tile_m={tile_m}: the sm90 kernel uses 2, 3 or 4 consumer warpgroups x 64 rows "
                             "(128, 192 or 256)")
        if tile_m == 256 and (pingpong or persistent_dynamic):
            # named barriers (kernels/sm90/barriers.py): four ping-pong tokens would take ids 2-5, and id 5 is the
            # first of speculative_exp's votes (5-8 with four warpgroups); the fourth vote's id 8 is
            # persistent_dynamic's tile handoff (FWD_TILE_EMPTY)
            raise ValueError("tile_m=256 (4 consumer warpgroups) with pingpong or persistent_dynamic: their named "
                             "barriers would overlap; pass pingpong=False and no persistent_dynamic")
        self.num_consumer_wg = tile_m // 64
        if tile_n % 16 or not 16 <= tile_n <= 256:
            raise ValueError(f"tile_n={tile_n}: must be a multiple of 16 in [16, 256]")
        if not 1 <= num_stages <= 4:
            raise ValueError(f"num_stages={num_stages}: must be in [1, 4]")
        # setmaxnreg only moves registers within the CTA's launch allocation: (1 + consumers) x 128 threads at the
        # launch count, 64K / threads rounded down to 8 (168 for 384 threads, 128 for 512). A request beyond it makes
        # setmaxnreg.inc wait forever (H200, tune of hd192: producer 32 + 2 x 240 = 512 > 3 x 168 hung).
        nwg = self.num_consumer_wg + 1
        reg_pool = nwg * (65536 // (128 * nwg) // 8 * 8)
        if producer_regs + self.num_consumer_wg * consumer_regs > reg_pool or consumer_regs % 8 or producer_regs % 8:
            raise ValueError(f"registers (producer {producer_regs}, consumer {consumer_regs}): need multiples of 8 with "
                             f"producer + {self.num_consumer_wg} * consumer <= {reg_pool} per thread ({nwg} warpgroups "
                             f"at {reg_pool // nwg} registers each at launch) for tile_m={tile_m}; e.g. 24/240 for "
                             f"tile_m=128, 32/160 for tile_m=192")
        if dtype is cutlass.Float16 and rescale_threshold > 15.0:
            raise ValueError(f"rescale_threshold={rescale_threshold}: with fp16 P can reach 2^tau, so tau must be <= 15")
        if int(qhead_per_kvhead) != qhead_per_kvhead or qhead_per_kvhead < 1:
            raise ValueError(f"qhead_per_kvhead={qhead_per_kvhead}: must be an integer >= 1 (Q heads per K/V head)")
        for name, w in (("window_left", window_left), ("window_right", window_right)):
            if isinstance(w, bool) or int(w) != w or w < -1:
                raise ValueError(f"{name}={w!r}: must be an integer >= -1 (-1 = unbounded)")
        if causal and window_right not in (-1, 0):
            raise ValueError(f"window_right={window_right}: with causal the right bound is the diagonal (pass -1 or 0)")
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap >= 0.0 \
                or softcap == float("inf"):
            raise ValueError(f"softcap={softcap!r}: must be a finite float >= 0 (0 = off)")
        self.dtype = dtype
        self.hdim, self.hdim_v = hdim, hdim_v
        self.causal = causal
        self.window_left = int(window_left)
        self.window_right = -1 if causal else int(window_right)
        self.has_left = self.window_left >= 0  # blocks left of the window are skipped, the boundary ones masked
        self.has_window = self.has_left or self.window_right >= 0
        # a tile's first K/V block is a runtime value (n_block_min): a left window bound, or a split-tail piece
        self.runtime_n_min = self.has_left or bool(split_tail)
        self.softcap = float(softcap)
        self.varlen = bool(varlen)  # packed (total, h, d) tensors + cu_seqlens: launched through call_varlen
        if persistent and varlen:
            raise ValueError("persistent=True with varlen=True: the variable-length forward has one tile per CTA")
        self.persistent = bool(persistent)  # grid = num_ctas, tiles walked per CTA: launched through call_persistent
        if trace_ctas and not self.persistent:
            raise ValueError("trace_ctas=True needs persistent=True: it records each CTA of the persistent grid")
        # a measuring aid (scripts/cta_timeline.py), not a config switch: the persistent launchers take one more
        # argument, mTrace int64 (num_ctas, 4) = [start ns, end ns of consumer warpgroup 0, of warpgroup 1, SM id]
        # (%globaltimer at kernel entry and after each warpgroup's last tile); off, the code is the plain kernel's
        self.trace_ctas = bool(trace_ctas)
        # persistent: tiles claimed at run time (an atomic counter; the producer warp claims the next tile when it has
        # issued the current one's loads and hands it to the consumers through shared memory), in the static walk's
        # numbering (causal: longest first). The greedy walk, the snake and the split tail yield to it
        self.dynamic = self.persistent and bool(persistent_dynamic)
        if self.dynamic:
            persistent_greedy = persistent_snake = split_tail = False
        # causal: each CTA walks its host-built list of tiles (kernels/sm90/greedy_walk.py); snake yields to it
        self.greedy = self.persistent and causal and bool(persistent_greedy)
        self.snake = self.persistent and causal and bool(persistent_snake) and not self.greedy  # odd rounds reversed
        if split_tail:
            for bad, why in ((not self.persistent, "persistent=False"), (causal, "causal"),
                             (self.has_window, "a sliding window"), (self.varlen, "varlen")):
                if bad:
                    raise ValueError(f"split_tail=True with {why}: the split tail is the persistent non-causal "
                                     "forward's (every tile the same K/V blocks; kernels/sm90/fwd_tail.py)")
        # the last partial round's tiles cut into K/V block pieces over every CTA, merged by fwd_tail.TailCombine
        self.split_tail = bool(split_tail)
        if isinstance(cluster_m, bool) or cluster_m not in (1, 2):
            raise ValueError(f"cluster_m={cluster_m!r}: must be 1 or 2 (CTAs per cluster along the Q tiles)")
        if cluster_m > 1:
            for bad, why in ((causal, "causal"), (self.has_window, "a sliding window"), (self.varlen, "varlen"),
                             (self.persistent, "persistent")):
                if bad:
                    raise ValueError(f"cluster_m={cluster_m} with {why}: the two Q tiles of a cluster must visit the "
                                     "same K/V blocks, one tile per CTA (non-causal, no window, not varlen / persistent)")
        self.cluster_m = int(cluster_m)  # 2: K/V tiles multicast between the CTAs of adjacent Q tiles
        if pack_gqa:
            for bad, why in ((qhead_per_kvhead == 1, "qhead_per_kvhead=1 (no group to pack)"),
                             (self.varlen, "varlen"), (self.persistent, "persistent"),
                             (cluster_m > 1, f"cluster_m={cluster_m}"),
                             (tile_m % int(qhead_per_kvhead), f"tile_m={tile_m} not a multiple of the group "
                                                            f"{int(qhead_per_kvhead)}")):
                if bad:
                    raise ValueError(f"pack_gqa=True with {why}: the packed-GQA forward needs grouped K/V, one tile per "
                                     "CTA (not varlen / persistent / cluster) and tile_m a multiple of the group")
        self.pack_gqa = bool(pack_gqa)  # one CTA per K/V head: Q tile rows r = position * group + head in group
        # query positions per Q tile (packed: tile_m / group positions, each with the group's heads): the K/V block range
        self.tile_q = tile_m // int(qhead_per_kvhead) if self.pack_gqa else tile_m
        self.qhead_per_kvhead = int(qhead_per_kvhead)  # GQA group: Q head h reads K/V head h // qhead_per_kvhead
        self.tile_m, self.tile_n = tile_m, tile_n
        self.num_stages = num_stages
        self.tau = float(rescale_threshold)
        self.pingpong = pingpong
        self.intra_wg_overlap = intra_wg_overlap
        if rescale_before_pv and not intra_wg_overlap:
            raise ValueError("rescale_before_pv=True with intra_wg_overlap=False: without the overlap O is already "
                             "rescaled right before its P V; pass rescale_before_pv=False")
        self.rescale_before_pv = bool(rescale_before_pv)  # O rescaled between issuing QK^T(j+1) and PV(j)
        # overlapped loop, tau > 0: a later block's P first with the kept row maxima, no maxima at all; only when a row's
        # partial sum says one of its P may exceed 2^tau and a second vote on the P finds one that does (or a row has no
        # maximum yet) does the warpgroup compute S again from the K stage it still holds and take the eager step
        # (softmax_spec). It places its own P V wait, so pv_wait_mid / exp_in_branch / early_v_release yield to it; it
        # implies causal_split (below). Not:
        # with the exp2 polynomial (past x = 129 it returns -0.0, which no sum notices), with row_sum_mma (no sums in
        # the softmax), with 2^tau < tile_n (a thread's partial sum over its tile_n/4 columns would cross it on
        # ordinary blocks), or with a sliding window (one loop of masked and mask-free blocks, no causal_split to run
        # the masked ones by the eager step; hd64 causal + left window packed GQA spilled 1 LDL with it)
        self.speculative_exp = (bool(speculative_exp) and not self.has_window
                                and speculation_compiles(self.tau, tile_n, exp2_emu_fraction, intra_wg_overlap,
                                                         row_sum_mma))
        # speculative_exp: the redos a warpgroup may take in one Q tile before the tile's later blocks run the eager
        # step (0 = no budget). A per-tile counter (TileRegs.spec_left), tested by a warp vote in overlap_block
        self.spec_redo_budget = int(spec_redo_budget) if self.speculative_exp else 0
        pv_mid_asked = bool(pv_wait_mid)  # (its inline P conversion stays: p_inline_cvt below)
        if self.speculative_exp:
            pv_wait_mid = exp_in_branch = early_v_release = False
        # overlapped loop, tau > 0: the wait for the in-flight P V placed after the first quarter of a block's
        # exponentials (those computed inside both arms of the rescale decision), the V stage released right after it,
        # the rest of the block after both; P converted by inline PTX (p_inline_cvt); exp_in_branch yields to it;
        # implies causal_split (the one-loop causal kernels compile divergent)
        self.pv_wait_mid = bool(pv_wait_mid) and intra_wg_overlap and self.tau != 0.0
        # columns of each row exponentiated before that wait: a quarter, even (8 of 32 at tile_n 128, 4 of 20 at 80)
        self.pv_head_cols = max(2, tile_n // 16 // 2 * 2)
        # causal (no window), overlapped main loop: the diagonal blocks after the first and the mask-free blocks in two
        # loops (mainloop_overlap), no per-block mask decision inside a loop
        # (implied by pv_wait_mid: its one loop compiles divergent, wgmma descriptors in vector registers, 61 R2UR at
        # (192, 128); and by speculative_exp, whose diagonal loop runs the eager step: rows there may have no maximum
        # yet, which its vote would answer with a second QK^T; its one loop is divergent at hd256, 90 R2UR)
        self.causal_split = ((bool(causal_split) or self.pv_wait_mid or self.speculative_exp)
                             and causal and not self.has_window and intra_wg_overlap)
        # tau > 0: a block's exponentials inside the arms of the warp's rescale decision (softmax.online_softmax_step)
        self.exp_in_branch = bool(exp_in_branch) and self.tau != 0.0 and not self.pv_wait_mid
        # overlapped loop: P converted to 16 bits by inline PTX (softmax.store_p_asm), the block's row sums pinned before
        # the rescale decision, and the K/V loops written with their exit test at the top (steps_loop): the conversion
        # and the sums stay among the exponentials instead of after the O-rescale branch
        self.p_cvt_asm = bool(p_cvt_asm) and intra_wg_overlap
        # P by inline PTX (to_p) and pinned row sums: p_cvt_asm or pv_wait_mid
        self.p_inline_cvt = self.p_cvt_asm or self.pv_wait_mid or (self.speculative_exp and pv_mid_asked)
        # p_cvt_asm's top-tested K/V loops (steps_loop); split causal loops stay counted loops from hd128 up (and with
        # pv_wait_mid): top-tested, they compile divergent there (CPU SASS, session 51: hd128 / (192, 128) 32 / 43 R2UR
        # per loop, hd256 one tile per CTA 43, counted 0; hd64 both uniform, top-tested 16 instructions shorter);
        # non-causal counted loops compile divergent, so there it keeps p_cvt_asm's form
        self.top_tested_loop = self.p_cvt_asm and not (self.causal_split and (self.pv_wait_mid or hdim >= 128))
        # overlapped loop: the wait for the in-flight P V and the release of its V stage placed after the block's row
        # maxima, before its rescale decision (ptxas hoists the wait to about there anyway; the release otherwise
        # follows all the exponentials, official FA4's right after its wait); pv_wait_mid and exp_in_branch place the
        # wait themselves, so it yields to them
        self.early_v_release = (bool(early_v_release) and intra_wg_overlap and not self.pv_wait_mid
                                and not self.exp_in_branch)
        # S = Q K^T with Q from registers (wgmma A operand in registers, loaded from shared memory once per Q tile by
        # ldmatrix) instead of a shared-memory descriptor: every K/V block's QK^T then reads only K from shared memory
        # (a third less of that GEMM's operand traffic; the GPU runs at its power cap in long calls). Not with a window
        # in the non-overlapped loop: hd128 causal with a left window there spills 9 LDL / STL with Q in registers
        self.q_in_regs = bool(q_in_regs) and (intra_wg_overlap or not self.has_window)
        # the first q_regs_k k-blocks (16 head-dim columns each) of Q in registers, the rest read from shared memory:
        # Q in registers in part, where all of it does not fit (hd256: 64 registers per thread). Each QK^T is one wgmma
        # group, its RS k-blocks first (gemm.wgmma_split_a); a third less shared-memory traffic on those k-blocks
        # (the register part is a column slice of sQ: its width must divide the 64-column swizzle atom or be a multiple
        # of it that divides hdim; hd256: 1, 2, 4 or 8 k-blocks)
        w = 16 * int(q_regs_k) if not isinstance(q_regs_k, bool) and int(q_regs_k) == q_regs_k else -1
        if not self.q_in_regs and (not 0 <= w < hdim or (w and (hdim % w or (64 % w and w % 64)))):
            raise ValueError(f"q_regs_k={q_regs_k!r}: k-blocks of Q in registers, an int in [0, {hdim // 16}) whose "
                             f"16-column width divides 64 or is a multiple of 64 dividing {hdim} (q_in_regs=True "
                             "holds all of them)")
        self.q_regs_k = 0 if self.q_in_regs else int(q_regs_k)
        # tau > 0: the rescale decision on each thread's own row maxima, the quad's shuffles only in the rescale arm
        # (softmax.online_softmax_step lazy_max); bitwise the same output
        self.lazy_row_max = bool(lazy_row_max) and self.tau != 0.0
        # the row sums on the tensor cores: every P V GEMM is followed, in the same wgmma group, by P times a tile of
        # ones in shared memory (m64n8, B = ones (8, tile_n)); its accumulator, rescaled with O, holds whole-row sums, so
        # the softmax has no FADD per element and the epilogue no quad reduction. P's sums are then those of its 16-bit
        # values, the same ones O is built from.
        self.row_sum_mma = bool(row_sum_mma)
        # the K / V stages' wgmma descriptors before the block's waits (AttnConfig.early_desc): ptxas keeps the
        # descriptor arithmetic after the GEMM turn's bar.sync otherwise
        self.early_desc = bool(early_desc) and intra_wg_overlap
        # P V with P from shared memory (an SS wgmma, FA3's choice for hd64 non-causal 192 x 192 tiles): each block's P
        # is stored by stmatrix into an sP tile (tile_m, tile_n) right after its conversion, so its 16-bit registers
        # die there instead of living until the P V GEMM completes -- room for a wider tile_n. Each warp writes the 16
        # rows its own wgmma reads, so a proxy fence and a warp sync order the store before the GEMM; the store follows
        # the wait for the previous P V, which read the same tile. Not with row_sum_mma (its m64n8 GEMM reads P from
        # registers)
        if p_smem and row_sum_mma:
            raise ValueError("p_smem=True with row_sum_mma=True: the row-sum GEMM reads P from registers")
        self.p_smem = bool(p_smem)
        # p_smem, overlapped loop, two or more K/V stages: one sP tile per K/V stage (P of a block goes to its own V
        # stage's tile), so a block's P is converted and stored while the previous block's P V still reads the other
        # tile: the store waits for no GEMM. Costs num_stages sP tiles of shared memory
        self.p_smem_early = bool(p_smem_early) and self.p_smem and intra_wg_overlap and num_stages >= 2
        self.consumer_regs, self.producer_regs = consumer_regs, producer_regs
        # exp2 split: a thread's row holds tile_n/4 values in tile_n/8 fragments (pairs of adjacent columns)
        self.n_frag = tile_n // 8
        self.emu_frags = exp2_mod.emulated_fragments(self.n_frag, exp2_emu_fraction)
        self.exp2_emu_fraction_compiled = len(self.emu_frags) / self.n_frag
        self.poly = exp2_mod.POLY_COEFFS
        self.num_threads = self.threads_per_wg * (1 + self.num_consumer_wg)
        elem = dtype.width // 8
        p_tiles = (num_stages if self.p_smem_early else 1) if self.p_smem else 0
        smem, limit = sm90_fwd_smem(tile_m, tile_n, num_stages, hdim, hdim_v, elem=elem, row_sum_mma=self.row_sum_mma,
                                    p_tiles=p_tiles)
        if smem > limit:
            raise ValueError(f"shared memory {smem} B for tile_n={tile_n}, num_stages={num_stages}, hdim={hdim} "
                             "exceeds the 227 KB of sm_90a; lower tile_n or num_stages")
        # speculative_exp's steady state: S(j+1) = Q K^T as two wgmma groups of tile_n/2 key columns each, so the
        # exponentials of the first half run while the tensor cores still compute the second (AttnConfig.qk_halves).
        # Same products and sums, in the same order: bitwise the default's output. Not with q_regs_k (its split A), a
        # softcap (applied to the whole block first) or a redo budget; tile_n >= 32, so that a thread's half row holds
        # the row sum's 4 partial chains (softmax._sum_chains). (tile_n / 2, a multiple of 8, is a wgmma N.)
        self.qk_halves = (bool(qk_halves) and self.speculative_exp and self.spec_redo_budget == 0
                          and self.q_regs_k == 0 and self.softcap == 0.0 and tile_n >= 32)
        # speculative_exp's steady state: the wait for P V(j), V(j)'s release and P(j+1)'s 16-bit conversion before the
        # vote instead of after it (AttnConfig.p_before_vote): the vote's branch is a scheduling barrier for ptxas, so
        # after it the conversions run alone, before it they fill the MUFU exponentials' gaps. A redone block is
        # converted again after its eager step. Same values: bitwise the default's output on blocks that keep their
        # maxima (a redone row within a rounding, as speculative_exp's). Not with P from shared memory (its store has
        # its own place), a redo budget or qk_halves (not measured together)
        self.p_before_vote = (bool(p_before_vote) and self.speculative_exp and not self.p_smem
                              and self.spec_redo_budget == 0 and not self.qk_halves)
        # speculative_exp's redo per warp from the block's kept S (AttnConfig.spec_warp_redo): the exponentials of the
        # common path go to a copy, so a redo needs no second Q K^T (K released right after S) and no warpgroup-wide
        # vote (a warp's redo runs no wgmma). With p_before_vote (P made inside softmax_spec, from either copy)
        self.spec_warp_redo = bool(spec_warp_redo) and self.p_before_vote
        # O from the accumulator registers to global memory, no shared memory or TMA store (AttnConfig.o_direct); not
        # varlen (its stores stay inside the sequence: store_o_varlen), packed GQA (rows of another layout) or a cluster
        self.o_direct = bool(o_direct) and not varlen and not self.pack_gqa and cluster_m == 1
        # persistent, where shared memory allows (all but hd256): O in its own buffer (see the module docstring)
        self.separate_o = self.persistent and not self.o_direct and smem + elem * tile_m * hdim_v <= limit
        # Q's buffer released after the tile's last Q K^T (no O store reads it: its own buffer, or none)
        self.early_q_release = self.separate_o or self.o_direct
        # AttnConfig.o_direct_wide: o_direct's stores 16 bytes wide after a transpose within each quad of lanes
        self.o_direct_wide = bool(o_direct_wide) and self.o_direct
        # a warpgroup whose rows all lie past seqlen_q runs idle_loop (AttnConfig.skip_idle_wg): the overlapped loop only,
        # not in the split tail (its pieces go to a workspace the combine reads whole) nor on the causal walks (greedy /
        # claimed at run time: there the branch cost the mask-free loop's common path 8-42 instructions, CPU SASS at
        # hd 64 / 128 / 256 causal 8k). The idle warpgroup's O and row statistics are left as they are: its rows are
        # never stored (TMA clips them, the LSE store skips them)
        self.skip_idle_wg = (bool(skip_idle_wg) and intra_wg_overlap and not self.split_tail and not self.greedy
                             and not self.dynamic)
        # O through the last K/V block's V stage (AttnConfig.o_via_v_stage): persistent kernels where O would share
        # Q's buffer, in column chunks of the O tile that fit one V stage (whole 64-column swizzle atoms)
        chunks = 1
        while chunks < 8 and tile_m * hdim_v // chunks > tile_n * hdim_v:
            chunks *= 2
        self.o_chunks = chunks
        self.o_via_v_stage = (bool(o_via_v_stage) and self.persistent and not self.separate_o and intra_wg_overlap
                              and not varlen and not self.pack_gqa and not self.o_direct and not self.skip_idle_wg
                              and (hdim_v // chunks) % 64 == 0)
        self.early_q_release = self.early_q_release or self.o_via_v_stage
        # AttnConfig.o_deferred: a tile's O store (through the V stage, or o_direct's stores from registers) under the
        # next tile's first Q K^T; static walks only (each step's tile recomputed from the step index), not the split
        # tail (its pieces store no O); the overlapped loop (its first_block carries the store) and no idle warpgroup
        # (idle_loop runs no first block)
        deferrable = self.o_via_v_stage or (self.o_direct and self.persistent and intra_wg_overlap
                                            and not self.skip_idle_wg)
        self.o_deferred = bool(o_deferred) and deferrable and not self.split_tail and not self.dynamic
        self.tma_o_store = not (self.o_direct or self.o_via_v_stage)  # else O leaves through predicated stores
        # AttnConfig.skip_diag_wg: a warpgroup whose rows all precede the first key of the tile's last K/V block skips
        # it (diag_idle_step) and starts at the block before; causal without a window (no runtime n_block_min: the
        # tile visits blocks 0 .. n_block_max - 1), not packed GQA (rows are not positions there), not o_deferred
        # through the V stage (its store finds that stage from the first block's state, which the skip advances;
        # o_direct's deferred store needs no stage), nor with skip_idle_wg (one branch before the loop is enough).
        # Persistent kernels only: in the one-tile kernel the branch cost the K/V loops' common paths 99 / 54
        # instructions (CPU SASS, hd256 causal 8k; on the greedy walk none)
        self.skip_diag_wg = (bool(skip_diag_wg) and causal and self.persistent and intra_wg_overlap
                             and not self.has_window and not self.runtime_n_min and not self.pack_gqa
                             and not (self.o_deferred and self.o_via_v_stage) and not self.skip_idle_wg)
        # AttnConfig.q_prefetch: the producer warp prefetches the next tile's Q into L2 (a TMA prefetch, no shared
        # memory) once it has issued the tile's last K/V pair, so the Q load that follows the tile's last Q K^T reads
        # L2. Persistent static walks (the next tile is known), not the split tail (its pieces come first) or varlen
        self.q_prefetch = (bool(q_prefetch) and self.persistent and not self.dynamic and not self.split_tail
                           and not varlen)

    # ---- host-side construction -------------------------------------------------------------
    def _smem_layout(self, rows: int, cols: int, stages: int | None):
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, self.dtype, cols), self.dtype)
        shape = (rows, cols) if stages is None else (rows, cols, stages)
        return cute.tile_to_shape(atom, shape, order=(0, 1) if stages is None else (0, 1, 2))

    def _tiled_mmas(self):
        wg_layout = (self.num_consumer_wg, 1, 1)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
            wg_layout, (64, self.tile_n),
            *((warpgroup.OperandSource.RMEM,) if self.q_in_regs else ()))
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32,
            wg_layout, (64, self.hdim_v),
            warpgroup.OperandSource.SMEM if self.p_smem else warpgroup.OperandSource.RMEM)
        return mma_qk, mma_pv

    @cute.jit
    def _host_setup(self, mQ, mK, mV, mO, tma_o: cutlass.Constexpr[bool] = True):
        """Traced in the jit launchers: tiled MMAs, shared-memory layouts, TMA atoms (Q, K, V loads; O store when
        ``tma_o``) and the shared storage struct."""
        tiled_mma_qk, tiled_mma_pv = self._tiled_mmas()
        sQ_layout = self._smem_layout(self.tile_m, self.hdim, None)
        sK_layout = self._smem_layout(self.tile_n, self.hdim, self.num_stages)
        sV_layout = self._smem_layout(self.tile_n, self.hdim_v, self.num_stages)
        sO_layout = self._smem_layout(self.tile_m, self.hdim_v, None)

        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), mQ, sQ_layout, (self.tile_m, self.hdim))
        if const_expr(self.cluster_m > 1):  # each CTA issues 1 / cluster_m of a K/V tile, multicast to the cluster
            g2s_kv = cpasync.CopyBulkTensorTileG2SMulticastOp()
        else:
            g2s_kv = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(
            g2s_kv, mK, cute.select(sK_layout, mode=[0, 1]), (self.tile_n, self.hdim), self.cluster_m)
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(
            g2s_kv, mV, cute.select(sV_layout, mode=[0, 1]), (self.tile_n, self.hdim_v), self.cluster_m)
        tma_atom_O, tma_O = None, mO  # varlen: O leaves through a row-predicated store (store_o_varlen)
        if const_expr(tma_o):
            tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mO, sO_layout, (self.tile_m, self.hdim_v))
        self.bytes_Q = cute.size_in_bytes(self.dtype, sQ_layout)
        self.bytes_K = cute.size_in_bytes(self.dtype, cute.select(sK_layout, mode=[0, 1]))
        self.bytes_V = cute.size_in_bytes(self.dtype, cute.select(sV_layout, mode=[0, 1]))

        q_o_elems = max(cute.cosize(sQ_layout), cute.cosize(sO_layout))
        o_elems = cute.cosize(sO_layout)
        ones_elems = cute.cosize(self._ones_layout()) if const_expr(self.row_sum_mma) else 0
        p_elems = cute.cosize(self._p_layout()) if const_expr(self.p_smem) else 0

        SharedStorage = self._shared_storage(cute.cosize(sQ_layout), q_o_elems, cute.cosize(sK_layout),
                                             cute.cosize(sV_layout), o_elems, ones_elems, p_elems)

        return (tma_Q, tma_K, tma_V, tma_O, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O, sQ_layout, sK_layout,
                sV_layout, sO_layout, tiled_mma_qk, tiled_mma_pv, SharedStorage)

    def _shared_storage(self, q_elems: int, q_o_elems: int, k_elems: int, v_elems: int, o_elems: int,
                        ones_elems: int, p_elems: int = 0):
        """The shared storage struct: the Q / K / V pipelines' mbarriers, sQ, sK, sV, then sO (separate_o; else O
        reuses Q's buffer, sized for both), the row_sum_mma ones tile (``ones_elems`` > 0) and p_smem's P tile
        (``p_elems`` > 0)."""
        dt, stages = self.dtype, self.num_stages
        fields = {"mbar_Q": cute.struct.MemRange[cutlass.Int64, 2],
                  "mbar_K": cute.struct.MemRange[cutlass.Int64, stages * 2],
                  "mbar_V": cute.struct.MemRange[cutlass.Int64, stages * 2],
                  "sQ": cute.struct.Align[cute.struct.MemRange[dt, q_elems if self.separate_o else q_o_elems], 1024],
                  "sK": cute.struct.Align[cute.struct.MemRange[dt, k_elems], 1024],
                  "sV": cute.struct.Align[cute.struct.MemRange[dt, v_elems], 1024]}
        if self.separate_o:
            fields["sO"] = cute.struct.Align[cute.struct.MemRange[dt, o_elems], 1024]
        if ones_elems:
            fields["sOnes"] = cute.struct.Align[cute.struct.MemRange[dt, ones_elems], 1024]
        if p_elems:
            fields["sP"] = cute.struct.Align[cute.struct.MemRange[dt, p_elems], 1024]
        if self.dynamic:  # the next tile, from the producer warp to the consumers
            fields["sTileNext"] = cute.struct.Align[cute.struct.MemRange[Int32, 1], 16]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def _p_layout(self):
        """p_smem: the P tile (tile_m, tile_n), the A operand of the P V wgmma, K-major like sQ (p_smem_early: one per
        K/V stage, (tile_m, tile_n, stages))."""
        return self._smem_layout(self.tile_m, self.tile_n, self.num_stages if self.p_smem_early else None)

    def _tiled_mma_qk_rs(self):
        """q_regs_k: Q K^T's tiled MMA with A (Q) from registers, for the k-blocks held there."""
        return sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (self.num_consumer_wg, 1, 1), (64, self.tile_n), warpgroup.OperandSource.RMEM)

    def _tiled_mma_qk_half(self):
        """qk_halves: Q K^T's tiled MMA over tile_n/2 key columns (A as the full one's: its fragment serves both)."""
        return sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (self.num_consumer_wg, 1, 1), (64, self.tile_n // 2),
            *((warpgroup.OperandSource.RMEM,) if self.q_in_regs else ()))

    def _ones_layout(self):
        """row_sum_mma: the ones tile, the B operand (N 8, K tile_n) of the m64n8 row-sum wgmma, K-major like sK."""
        return self._smem_layout(8, self.tile_n, None)

    def _tiled_mma_ones(self):
        """row_sum_mma: O's tiled MMA with N = 8 (P from registers times the ones tile)."""
        return sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (self.num_consumer_wg, 1, 1), (64, 8), warpgroup.OperandSource.RMEM)

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 softmax_scale: Float32, hb_group: Int32, stream: cuda.CUstream):
        """mQ (b, s_q, h, d), mK (b, s_k, h_kv, d), mV (b, s_k, h_kv, dv), mO (b, s_q, h, dv), mLSE (b, h, s_q) fp32,
        h = h_kv * qhead_per_kvhead (the caller checks it)."""
        assert not self.persistent, "a persistent kernel is launched through call_persistent"
        # (b, s, h, d) -> (s, d, h, b); LSE (b, h, s) -> (s, h, b)
        mQ, mK, mV, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))
                          for t in (mQ, mK, mV, mO)]
        mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))
        if const_expr(self.pack_gqa):  # ((group, s), d, h_kv, b) / ((group, s), h_kv, b): a row per (position, head)
            mQ, mO, mLSE = [self.packed_view(t, mK.shape[2]) for t in (mQ, mO, mLSE)]
        (tma_Q, tma_K, tma_V, tma_O, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O, sQ_layout, sK_layout, sV_layout,
         sO_layout, tiled_mma_qk, tiled_mma_pv, SharedStorage) = self._host_setup(mQ, mK, mV, mO,
                                                                                  tma_o=self.tma_o_store)
        seqlen_q = mQ.shape[0]
        if const_expr(self.pack_gqa):
            seqlen_q = mQ.shape[0][1] * self.qhead_per_kvhead  # packed rows
        heads = mQ.shape[2]
        batch = mQ.shape[3]
        m_blocks = (seqlen_q + self.tile_m - 1) // self.tile_m
        if const_expr(self.causal):
            grid = (m_blocks * heads * batch, 1, 1)
        elif const_expr(self.cluster_m > 1):  # whole clusters: an odd m-block count gets one idle-storing CTA
            grid = ((m_blocks + self.cluster_m - 1) // self.cluster_m * self.cluster_m, heads, batch)
        else:
            grid = (m_blocks, heads, batch)
        scale_log2 = self.score_scale(softmax_scale)
        if const_expr(self.cluster_m > 1):
            self.kernel(
                tma_Q, tma_K, tma_V, tma_O, mLSE, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O,
                scale_log2, hb_group, sQ_layout, sK_layout, sV_layout, sO_layout, tiled_mma_qk, tiled_mma_pv,
                SharedStorage,
            ).launch(grid=grid, block=[self.num_threads, 1, 1], cluster=[self.cluster_m, 1, 1], stream=stream,
                     min_blocks_per_mp=1)
        else:
            self.kernel(
                tma_Q, tma_K, tma_V, tma_O, mLSE, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O,
                scale_log2, hb_group, sQ_layout, sK_layout, sV_layout, sO_layout, tiled_mma_qk, tiled_mma_pv,
                SharedStorage,
            ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    def packed_view(self, t: cute.Tensor, heads_kv):
        """Packed GQA: the (s, ..., h, b) view of Q / O (mode 1 the head dim) or LSE (s, h, b) as
        ((group, s), ..., h_kv, b): row r of a K/V head's Q tile is position r // group of Q head
        kv_head * group + r % group (the group's heads are adjacent in memory: TMA moves (d, group, positions) boxes)."""
        g = self.qhead_per_kvhead
        st = t.layout.stride
        hmode = cute.rank(t.layout) - 2  # the head mode (2 for Q / O, 1 for LSE)
        shape = ((g, t.shape[0]),) + tuple(t.shape[1:hmode]) + (heads_kv, t.shape[hmode + 1])
        stride = ((st[hmode], st[0]),) + tuple(st[1:hmode]) + (st[hmode] * g, st[hmode + 1])
        return cute.make_tensor(t.iterator, cute.make_layout(shape, stride=stride))

    def score_scale(self, softmax_scale):
        """The kernel's scale argument: softmax_scale * log2(e), or with a softcap the pre-tanh factor
        softmax_scale / softcap."""
        if const_expr(self.softcap > 0.0):
            return softmax_scale * Float32(1.0 / self.softcap)
        return softmax_scale * Float32(LOG2_E)

    @cute.jit
    def call_persistent(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                        softmax_scale: Float32, hb_group: Int32, num_ctas: Int32, stream: cuda.CUstream,
                        mTrace: cute.Tensor = None):
        """Persistent launch (``persistent=True``): the tensors as ``__call__`` takes them; grid (num_ctas,), num_ctas =
        min(SM count, tiles) (the caller computes it: kernels/interface.py). ``mTrace``: trace_ctas only."""
        assert self.persistent, "call_persistent needs FlashFwdSm90(persistent=True)"
        self.launch_persistent(mQ, mK, mV, mO, mLSE, softmax_scale, hb_group, num_ctas, stream, mTrace=mTrace)

    @cute.jit
    def call_persistent_walk(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                             mLSE: cute.Tensor, mWalk: cute.Tensor, softmax_scale: Float32, hb_group: Int32,
                             num_ctas: Int32, stream: cuda.CUstream, mTrace: cute.Tensor = None):
        """``call_persistent`` with the greedy walk (``persistent_greedy=True``, causal): mWalk int32 (num_ctas, 1 +
        longest walk), row c = [count, tiles...] in scheduler.tile_at's numbering (kernels/sm90/greedy_walk.py)."""
        assert self.greedy, "call_persistent_walk needs FlashFwdSm90(persistent=True, persistent_greedy=True), causal"
        self.launch_persistent(mQ, mK, mV, mO, mLSE, softmax_scale, hb_group, num_ctas, stream, mWalk=mWalk,
                               mTrace=mTrace)

    @cute.jit
    def call_persistent_dynamic(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                                mLSE: cute.Tensor, mCounter: cute.Tensor, softmax_scale: Float32, hb_group: Int32,
                                num_ctas: Int32, stream: cuda.CUstream, mTrace: cute.Tensor = None):
        """``call_persistent`` with tiles claimed at run time (``persistent_dynamic=True``): mCounter int32 (1,), zero
        at the launch (the caller zeroes it), counts the claims past each CTA's first tile."""
        assert self.dynamic, "call_persistent_dynamic needs FlashFwdSm90(persistent=True, persistent_dynamic=True)"
        self.launch_persistent(mQ, mK, mV, mO, mLSE, softmax_scale, hb_group, num_ctas, stream, mTrace=mTrace,
                               mCounter=mCounter)

    @cute.jit
    def call_persistent_split(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                              mLSE: cute.Tensor, mOacc: cute.Tensor, mLSEacc: cute.Tensor, softmax_scale: Float32,
                              hb_group: Int32, num_ctas: Int32, stream: cuda.CUstream, mTrace: cute.Tensor = None):
        """``call_persistent`` with the split tail (``split_tail=True``): mOacc (2 * num_ctas, tile_m, dv) and mLSEacc
        (2 * num_ctas, tile_m) fp32 hold the tail pieces (kernels/sm90/fwd_tail.py); the caller launches it only when
        the tiles leave a partial round (tiles % num_ctas > 0). Then fwd_tail.TailCombine on the same stream."""
        assert self.persistent and self.split_tail, "call_persistent_split needs FlashFwdSm90(split_tail=True)"
        mOacc = cute.make_tensor(mOacc.iterator, cute.select(mOacc.layout, mode=[1, 2, 0]))  # (tile_m, dv, slots)
        mLSEacc = cute.make_tensor(mLSEacc.iterator, cute.select(mLSEacc.layout, mode=[1, 0]))  # (tile_m, slots)
        mQ, mK, mO, mLSE = self.launch_persistent(mQ, mK, mV, mO, mLSE, softmax_scale, hb_group, num_ctas, stream,
                                                  mOacc, mLSEacc, mTrace=mTrace)
        num_tiles = (mQ.shape[0] + self.tile_m - 1) // self.tile_m * mQ.shape[2] * mQ.shape[3]
        n_tail = num_tiles % num_ctas
        n_blocks = (mK.shape[0] + self.tile_n - 1) // self.tile_n
        TailCombine(self.dtype, self.tile_m, self.hdim_v).launch(mOacc, mLSEacc, mO, mLSE, num_tiles - n_tail, n_tail,
                                                                 n_blocks, num_ctas, stream)

    @cute.jit
    def launch_persistent(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                          softmax_scale: Float32, hb_group: Int32, num_ctas: Int32, stream: cuda.CUstream,
                          mOacc: cute.Tensor = None, mLSEacc: cute.Tensor = None, mWalk: cute.Tensor = None,
                          mTrace: cute.Tensor = None, mCounter: cute.Tensor = None):
        """The persistent kernel's launch on grid (num_ctas,) (split_tail: with the pieces' workspace; greedy: with
        the walk table; trace_ctas: with the trace; dynamic: with the claim counter); returns the kernel's views of
        Q, K, O (s, d, h, b) and LSE (s, h, b)."""
        mQ, mK, mV, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))
                          for t in (mQ, mK, mV, mO)]
        mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))
        (tma_Q, tma_K, tma_V, tma_O, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O, sQ_layout, sK_layout, sV_layout,
         sO_layout, tiled_mma_qk, tiled_mma_pv, SharedStorage) = self._host_setup(mQ, mK, mV, mO,
                                                                                  tma_o=self.tma_o_store)
        scale_log2 = self.score_scale(softmax_scale)
        self.kernel(
            tma_Q, tma_K, tma_V, tma_O, mLSE, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O,
            scale_log2, hb_group, sQ_layout, sK_layout, sV_layout, sO_layout, tiled_mma_qk, tiled_mma_pv,
            SharedStorage, None, None, mOacc, mLSEacc, mWalk, mTrace, mCounter,
        ).launch(grid=(num_ctas, 1, 1), block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)
        return mQ, mK, mO, mLSE

    @cute.jit
    def call_varlen(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                    mCuSeqlensQ: cute.Tensor, mCuSeqlensK: cute.Tensor, max_seqlen_q: Int32, softmax_scale: Float32,
                    stream: cuda.CUstream):
        """Variable-length launch (``varlen=True``): packed mQ (total_q, h, d), mK (total_k, h_kv, d),
        mV (total_k, h_kv, dv), mO (total_q, h, dv), mLSE (h, total_q) fp32; mCuSeqlensQ / mCuSeqlensK int32 (b + 1,)
        sequence starts (the caller checks them). Grid (ceil(max_seqlen_q / tile_m), h, b)."""
        assert self.varlen, "call_varlen needs FlashFwdSm90(varlen=True)"
        # (total, h, d) -> (total, d, h); LSE (h, total) -> (total, h)
        mQ, mK, mV, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[0, 2, 1])) for t in (mQ, mK, mV, mO)]
        mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[1, 0]))
        (tma_Q, tma_K, tma_V, mO, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O, sQ_layout, sK_layout, sV_layout,
         sO_layout, tiled_mma_qk, tiled_mma_pv, SharedStorage) = self._host_setup(mQ, mK, mV, mO, tma_o=False)
        grid = ((max_seqlen_q + self.tile_m - 1) // self.tile_m, mQ.shape[2], mCuSeqlensQ.shape[0] - 1)
        scale_log2 = self.score_scale(softmax_scale)
        self.kernel(
            tma_Q, tma_K, tma_V, mO, mLSE, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O,
            scale_log2, Int32(1), sQ_layout, sK_layout, sV_layout, sO_layout, tiled_mma_qk, tiled_mma_pv,
            SharedStorage, mCuSeqlensQ, mCuSeqlensK,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=1)

    # ---- device code ----------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               tma_atom_Q: cute.CopyAtom, tma_atom_K: cute.CopyAtom, tma_atom_V: cute.CopyAtom,
               tma_atom_O: cute.CopyAtom, scale_log2: Float32, hb_group: Int32,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               sO_layout: cute.ComposedLayout, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
               SharedStorage: cutlass.Constexpr, mCuSeqlensQ: cute.Tensor = None, mCuSeqlensK: cute.Tensor = None,
               mOacc: cute.Tensor = None, mLSEacc: cute.Tensor = None, mWalk: cute.Tensor = None,
               mTrace: cute.Tensor = None, mCounter: cute.Tensor = None):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if const_expr(self.trace_ctas):  # the CTA's start and SM (its consumer warpgroups add their ends)
            if tidx == 0:
                bx_trace, _, _ = cute.arch.block_idx()
                mTrace[bx_trace, 0] = cute.arch.globaltimer()
                mTrace[bx_trace, 3] = cutlass.Int64(cute.arch.smid())
        if warp_idx == 0:
            if const_expr(self.varlen or not self.tma_o_store):  # no O descriptor: a predicated store
                for atom in (tma_atom_Q, tma_atom_K, tma_atom_V):
                    cpasync.prefetch_descriptor(atom)
            else:
                for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                    cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        if const_expr(self.row_sum_mma):
            self.fill_ones(storage, tidx)  # (made visible by the barrier in make_pipelines)
            # trace-time handle for consumer_fragments (this kernel's trace only)
            self._s_ones = storage.sOnes.get_tensor(self._ones_layout().outer, swizzle=self._ones_layout().inner)
        if const_expr(self.p_smem):  # trace-time handle for consumer_fragments, as above
            self._s_p = storage.sP.get_tensor(self._p_layout().outer, swizzle=self._p_layout().inner)
        pipe_q, pipe_k, pipe_v = self.make_pipelines(storage)
        sQ, sK, sV, sVt, sO = self.smem_tensors(storage, sQ_layout, sK_layout, sV_layout, sO_layout)

        if const_expr(self.persistent):
            self.roles_persistent(mQ, mK, mV, mO, mLSE, sQ, sK, sV, sVt, sO, tma_atom_Q, tma_atom_K, tma_atom_V,
                                  tma_atom_O, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2, hb_group,
                                  warp_idx, tidx, mOacc, mLSEacc, mWalk, mTrace, mCounter,
                                  storage.sTileNext.get_tensor(cute.make_layout(1)) if const_expr(self.dynamic)
                                  else None)
        else:
            tile = self.cta_tile(mQ, mK, hb_group, mCuSeqlensQ, mCuSeqlensK)
            if const_expr(self.varlen):
                # the whole CTA leaves when its tile starts past its sequence
                if tile.m_block * self.tile_m < tile.seqlen_q:
                    self.roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, sVt, sO, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O,
                               tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2, tile, warp_idx, tidx)
            else:
                self.roles(mQ, mK, mV, mO, mLSE, sQ, sK, sV, sVt, sO, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O,
                           tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2, tile, warp_idx, tidx)
                if const_expr(self.cluster_m > 1):
                    # no CTA leaves while its peer can still arrive on its empty barriers
                    cute.arch.cluster_arrive()
                    cute.arch.cluster_wait()

    @cute.jit
    def fill_ones(self, storage, tidx: Int32):
        """row_sum_mma: every thread writes its share of the ones tile, then fences it for the async proxy (wgmma
        reads shared memory through it); the CTA barrier that follows in make_pipelines publishes it."""
        n = cute.cosize(self._ones_layout())
        flat = storage.sOnes.get_tensor(cute.make_layout(n))
        for j in cutlass.range_constexpr((n + self.num_threads - 1) // self.num_threads):
            i = j * self.num_threads + tidx
            if i < n:
                flat[i] = self.dtype(1.0)
        cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def make_pipelines(self, storage):
        """The Q, K and V TMA pipelines on their mbarriers (cluster_m > 1: K/V stages released by the consumer warps of
        both CTAs, their full barriers expecting the whole multicast tile), initialised and made visible to the CTA
        (cluster: to the peer, which multicasts into them)."""
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_consumer_wg * 4)  # one arrive per warp
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_Q.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=self.bytes_Q, defer_sync=True)
        if const_expr(self.cluster_m > 1):
            # a K/V stage is free once the consumer warps of every CTA of the cluster released it (lane r of each
            # warp arrives on CTA r's barrier); the full barrier expects the whole tile (both CTAs' halves)
            kv_consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.cluster_m * self.num_consumer_wg * 4)
            kv_layout = cute.make_layout((1, self.cluster_m, 1, 1))
            pipe_k = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_K.data_ptr(), num_stages=self.num_stages, producer_group=producer,
                consumer_group=kv_consumers, tx_count=self.bytes_K, cta_layout_vmnk=kv_layout, mcast_mode_mn=(0, 1),
                defer_sync=True)
            pipe_v = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_V.data_ptr(), num_stages=self.num_stages, producer_group=producer,
                consumer_group=kv_consumers, tx_count=self.bytes_V, cta_layout_vmnk=kv_layout, mcast_mode_mn=(0, 1),
                defer_sync=True)
            cute.arch.mbarrier_init_fence()
            cute.arch.cluster_arrive_relaxed()  # the peer multicasts into / arrives on these barriers
            cute.arch.cluster_wait()
        else:
            pipe_k = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_K.data_ptr(), num_stages=self.num_stages, producer_group=producer,
                consumer_group=consumers, tx_count=self.bytes_K, defer_sync=True)
            pipe_v = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_V.data_ptr(), num_stages=self.num_stages, producer_group=producer,
                consumer_group=consumers, tx_count=self.bytes_V, defer_sync=True)
            cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()
        return pipe_q, pipe_k, pipe_v

    @cute.jit
    def smem_tensors(self, storage, sQ_layout, sK_layout, sV_layout, sO_layout):
        """sQ, sK, sV, the V^T view sVt (hdim_v, tile_n, stages) for the PV GEMM's B operand, and sO (its own buffer
        with separate_o, else Q's)."""
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        if const_expr(self.separate_o):
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        elif const_expr(self.o_via_v_stage):  # O's column chunk (tile_m, hdim_v / o_chunks) in each V stage
            chunk = self._smem_layout(self.tile_m, self.hdim_v // self.o_chunks, None)
            stages = cute.make_layout(self.num_stages, stride=self.tile_n * self.hdim_v)
            sO = storage.sV.get_tensor(cute.append(chunk.outer, stages), swizzle=chunk.inner)
        else:
            sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)  # O reuses Q's buffer
        # V^T view (hdim_v, tile_n, stages) for the PV GEMM's B operand
        sVt = cute.composition(sV, cute.make_ordered_layout((self.hdim_v, self.tile_n, self.num_stages), order=(1, 0, 2)))
        return sQ, sK, sV, sVt, sO

    @cute.jit
    def cta_tile(self, mQ, mK, hb_group: Int32, mCuSeqlensQ, mCuSeqlensK) -> Tile:
        """The one tile of a non-persistent CTA: varlen from the block index and cu_seqlens (causal: m_block reversed),
        else tile_coords of the (packed) Q rows; then its K/V block range (tile_blocks)."""
        offset_q = 0  # varlen: the sequence's first row in the packed Q / O / LSE and K / V
        offset_k = 0
        if const_expr(self.varlen):
            m_block, head, bidx = cute.arch.block_idx()
            if const_expr(self.causal):  # the tiles with the most K blocks first (the grid covers max_seqlen_q)
                m_block = cute.arch.grid_dim()[0] - 1 - m_block
            offset_q = mCuSeqlensQ[bidx]
            seqlen_q = mCuSeqlensQ[bidx + 1] - offset_q
            offset_k = mCuSeqlensK[bidx]
            seqlen_k = mCuSeqlensK[bidx + 1] - offset_k
        elif const_expr(self.pack_gqa):  # head: the K/V head; seqlen_q: positions (rows / group)
            seqlen_q = mQ.shape[0][1]
            seqlen_k = mK.shape[0]
            m_blocks = (seqlen_q * self.qhead_per_kvhead + self.tile_m - 1) // self.tile_m
            m_block, head, bidx = tile_coords(m_blocks, mQ.shape[2], mQ.shape[3], hb_group, self.causal)
        else:
            seqlen_q = mQ.shape[0]
            seqlen_k = mK.shape[0]
            m_blocks = (seqlen_q + self.tile_m - 1) // self.tile_m
            m_block, head, bidx = tile_coords(m_blocks, mQ.shape[2], mQ.shape[3], hb_group, self.causal)
        n_block_min, n_block_max, n_block_min_masked, n_block_local_end = self.tile_blocks(m_block, seqlen_q,
                                                                                          seqlen_k)
        return Tile(m_block, head, bidx, seqlen_q, seqlen_k, n_block_min, n_block_max, n_block_min_masked,
                    n_block_local_end, offset_q, offset_k)

    @cute.jit
    def roles(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, sVt, sO, tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O,
              tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2: Float32, tile: Tile, warp_idx: Int32,
              tidx: Int32):
        """Warp roles: warp 0 loads (warps 1-3 idle with few registers), the consumer warpgroups compute."""
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.load(mQ, mK, mV, sQ, sK, sV, tma_atom_Q, tma_atom_K, tma_atom_V, pipe_q, pipe_k, pipe_v,
                          tile.m_block, tile.head, tile.bidx, tile.n_block_max, tile.n_block_min, tile.offset_q,
                          tile.offset_k)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            ctidx = tidx - self.threads_per_wg
            frags = self.consumer_fragments(sQ, sK, sVt, tiled_mma_qk, tiled_mma_pv, ctidx)
            self.consume(mO, mLSE, sO, tma_atom_O, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2,
                         tile, ctidx, frags)

    @cute.jit
    def tile_blocks(self, m_block: Int32, seqlen_q: Int32, seqlen_k: Int32):
        """(n_block_min, n_block_max, n_block_min_masked, n_block_local_end) of a tile: the K/V blocks it visits
        (n_block_min > 0 only with a left window bound), the first that needs the right bound / seqlen_k mask, and
        the end of those that cross the left bound."""
        n_block_min = 0
        n_block_local_end = 0
        if const_expr(self.has_window):
            n_block_min, n_block_max, n_block_min_masked, n_block_local_end = n_block_range_window(
                m_block, self.tile_q, self.tile_n, seqlen_q, seqlen_k, self.causal, self.window_left,
                self.window_right)
        else:
            n_block_max, n_block_min_masked = n_block_range(m_block, self.tile_q, self.tile_n, seqlen_q, seqlen_k,
                                                            self.causal)
        return n_block_min, n_block_max, n_block_min_masked, n_block_local_end

    @cute.jit
    def roles_persistent(self, mQ, mK, mV, mO, mLSE, sQ, sK, sV, sVt, sO, tma_atom_Q, tma_atom_K, tma_atom_V,
                         tma_atom_O, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, scale_log2: Float32,
                         hb_group: Int32, warp_idx: Int32, tidx: Int32, mOacc=None, mLSEacc=None, mWalk=None,
                         mTrace=None, mCounter=None, sTileNext=None):
        """Persistent warp roles: the producer warp and the consumer warpgroups walk the same static round robin
        over the tiles (CTA c: tiles c, c + grid, ...), their pipeline states carried from tile to tile. split_tail:
        first the CTA's pieces of the last partial round's tiles (steps t < 0; kernels/sm90/fwd_tail.py), then the
        whole tiles of the full rounds. greedy: steps 0 .. mWalk[c, 0] - 1 of CTA c's row of the walk table."""
        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        heads = mQ.shape[2]
        batch = mQ.shape[3]
        m_blocks = (seqlen_q + self.tile_m - 1) // self.tile_m
        num_tiles = m_blocks * heads * batch
        bx, _, _ = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        n_full = num_tiles  # split_tail: the tiles of the full rounds; the rest are cut into pieces
        t_first = bx
        step = gx
        if const_expr(self.greedy):  # this CTA's row of the walk table: its count, then its tiles
            t_first = Int32(0)
            n_full = mWalk[bx, 0]
            step = Int32(1)
        if const_expr(self.split_tail):
            n_tail = num_tiles % gx
            n_full = num_tiles - n_tail
            t_first = bx - tail_pieces(bx, n_tail, (seqlen_k + self.tile_n - 1) // self.tile_n, gx) * gx
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
                if const_expr(self.dynamic):
                    # claim the next tile once this one's loads are issued, hand it over when the slot is free
                    tile = bx
                    lane = cute.arch.lane_idx()
                    while tile < num_tiles:
                        m_block, head, bidx, n_block_min, n_block_max, _, _, _ = self.step_tile(
                            tile, bx, gx, t_first, n_full, num_tiles, m_blocks, heads, batch, hb_group, seqlen_q,
                            seqlen_k)
                        state, q_state = self.load(mQ, mK, mV, sQ, sK, sV, tma_atom_Q, tma_atom_K, tma_atom_V, pipe_q,
                                                   pipe_k, pipe_v, m_block, head, bidx, n_block_max, n_block_min,
                                                   state=state, q_state=q_state)
                        nxt = Int32(0)
                        if lane == 0:
                            nxt = gx + cute.arch.atomic_add(mCounter.iterator, Int32(1))
                        nxt = cute.arch.shuffle_sync(nxt, 0)
                        cute.arch.barrier(barrier_id=FWD_TILE_EMPTY,
                                          number_of_threads=32 + self.num_consumer_wg * self.threads_per_wg)
                        if lane == 0:
                            sTileNext[0] = nxt
                        for w in cutlass.range_constexpr(self.num_consumer_wg):
                            cute.arch.barrier_arrive(barrier_id=FWD_TILE_FULL_WG1 + w,
                                                     number_of_threads=32 + self.threads_per_wg)
                        tile = nxt
                else:
                    for tile in cutlass.range(t_first, n_full, step, unroll=1):
                        m_block, head, bidx, n_block_min, n_block_max, _, _, _ = self.step_tile(
                            tile, bx, gx, t_first, n_full, num_tiles, m_blocks, heads, batch, hb_group, seqlen_q,
                            seqlen_k, mWalk)
                        next_q = None
                        if const_expr(self.q_prefetch):  # the next step's tile (the last step: its own, unused)
                            nxt = self.whole_tile(cutlass.min(tile + step, n_full - 1), bx, gx, t_first, n_full,
                                                  num_tiles, m_blocks, heads, batch, hb_group, seqlen_q, seqlen_k,
                                                  mWalk)
                            next_q = (nxt.m_block, nxt.head, nxt.bidx, tile + step < n_full)
                        state, q_state = self.load(mQ, mK, mV, sQ, sK, sV, tma_atom_Q, tma_atom_K, tma_atom_V, pipe_q,
                                                   pipe_k, pipe_v, m_block, head, bidx, n_block_max, n_block_min,
                                                   state=state, q_state=q_state, next_q=next_q)
                pipe_v.producer_tail(state)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            ctidx = tidx - self.threads_per_wg
            frags = self.consumer_fragments(sQ, sK, sVt, tiled_mma_qk, tiled_mma_pv, ctidx)
            if const_expr(self.pingpong):
                if frags.wg == 0:  # the first warpgroup starts with the GEMM token (once per CTA)
                    cute.arch.barrier_arrive(barrier_id=BAR_SCHED_WG1, number_of_threads=2 * self.threads_per_wg)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            if const_expr(self.dynamic):
                # each warpgroup reads the next tile from the producer warp; the slot starts free
                cute.arch.barrier_arrive(barrier_id=FWD_TILE_EMPTY,
                                         number_of_threads=32 + self.num_consumer_wg * self.threads_per_wg)
                t = bx
                while t < num_tiles:
                    tile = self.whole_tile(t, bx, gx, t_first, n_full, num_tiles, m_blocks, heads, batch, hb_group,
                                           seqlen_q, seqlen_k)
                    state, q_state = self.consume(mO, mLSE, sO, tma_atom_O, tiled_mma_qk, tiled_mma_pv, pipe_q,
                                                  pipe_k, pipe_v, scale_log2, tile, ctidx, frags, state, q_state)
                    cute.arch.barrier(barrier_id=FWD_TILE_FULL_WG1 + frags.wg,
                                      number_of_threads=32 + self.threads_per_wg)
                    nxt = sTileNext[0]
                    if nxt < num_tiles:  # (the producer waits for no read of the last claim)
                        cute.arch.barrier_arrive(barrier_id=FWD_TILE_EMPTY,
                                                 number_of_threads=32 + self.num_consumer_wg * self.threads_per_wg)
                    t = nxt
            else:
                rO_kept = None  # o_deferred: the previous tile's normalised O, from its end to the next first block
                if const_expr(self.o_deferred):
                    rO_kept = cute.make_rmem_tensor(
                        frags.thr_mma_pv.partition_shape_C((self.tile_m, self.hdim_v)), self.dtype)
                for t in cutlass.range(t_first, n_full, step, unroll=1):
                    m_block, head, bidx, n_block_min, n_block_max, n_block_min_masked, n_block_local_end, slot = \
                        self.step_tile(t, bx, gx, t_first, n_full, num_tiles, m_blocks, heads, batch, hb_group,
                                       seqlen_q, seqlen_k, mWalk)
                    tile = Tile(m_block, head, bidx, seqlen_q, seqlen_k, n_block_min, n_block_max, n_block_min_masked,
                                n_block_local_end)
                    deferred = None
                    if const_expr(self.o_deferred):  # the previous step's tile (the first step: its own, unused)
                        prev = self.whole_tile(cutlass.max(t - step, t_first), bx, gx, t_first, n_full, num_tiles,
                                               m_blocks, heads, batch, hb_group, seqlen_q, seqlen_k, mWalk)
                        deferred = DeferredO(t != t_first, prev, rO_kept, mO, sO, pipe_v, ctidx, frags.thr_mma_pv)
                    state, q_state = self.consume(mO, mLSE, sO, tma_atom_O, tiled_mma_qk, tiled_mma_pv, pipe_q,
                                                  pipe_k, pipe_v, scale_log2, tile, ctidx, frags, state, q_state,
                                                  mOacc, mLSEacc, slot, deferred)
                if const_expr(self.o_deferred):
                    if n_full > t_first:  # the CTA's last tile: its O after the loop
                        last = self.whole_tile(t_first + (n_full - 1 - t_first) // step * step, bx, gx, t_first,
                                               n_full, num_tiles, m_blocks, heads, batch, hb_group, seqlen_q, seqlen_k,
                                               mWalk)
                        self.store_deferred(DeferredO(True, last, rO_kept, mO, sO, pipe_v, ctidx, frags.thr_mma_pv),
                                            state)
            if const_expr(self.separate_o):
                if ctidx < 32:  # the last tile's O store must have read shared memory before the CTA exits
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
            if const_expr(self.trace_ctas):  # each consumer warpgroup's end (its last tile's O issued)
                if ctidx % self.threads_per_wg == 0:
                    mTrace[bx, 1 + ctidx // self.threads_per_wg] = cute.arch.globaltimer()

    @cute.jit
    def whole_tile(self, t: Int32, bx: Int32, gx: Int32, t_first: Int32, n_full: Int32, num_tiles: Int32,
                   m_blocks: Int32, heads: Int32, batch: Int32, hb_group: Int32, seqlen_q: Int32, seqlen_k: Int32,
                   mWalk=None) -> Tile:
        """The Tile of persistent step ``t`` of a walk without the split tail (step_tile without the slot)."""
        m_block, head, bidx, n_block_min, n_block_max, n_block_min_masked, n_block_local_end, _ = self.step_tile(
            t, bx, gx, t_first, n_full, num_tiles, m_blocks, heads, batch, hb_group, seqlen_q, seqlen_k, mWalk)
        return Tile(m_block, head, bidx, seqlen_q, seqlen_k, n_block_min, n_block_max, n_block_min_masked,
                    n_block_local_end)

    @cute.jit
    def step_tile(self, t: Int32, bx: Int32, gx: Int32, t_first: Int32, n_full: Int32, num_tiles: Int32,
                  m_blocks: Int32, heads: Int32, batch: Int32, hb_group: Int32, seqlen_q: Int32, seqlen_k: Int32,
                  mWalk=None):
        """Persistent step ``t``: (m_block, head, batch, n_block_min, n_block_max, n_block_min_masked,
        n_block_local_end, slot); slot -1 for a whole tile, else (split_tail, t < 0) the workspace slot of the CTA's
        piece (t - t_first) // gx of the tail (fwd_tail.tail_piece)."""
        slot = Int32(-1)
        if const_expr(self.split_tail):
            tile = t
            n_min = Int32(0)
            n_max = Int32(0)
            if t < 0:
                n_blocks = (seqlen_k + self.tile_n - 1) // self.tile_n
                k = (t - t_first) // gx
                i, lo, hi = tail_piece(bx, k, num_tiles - n_full, n_blocks, gx)
                tile = n_full + i
                n_min = lo
                n_max = hi
                slot = 2 * bx + k
            m_block, head, bidx = tile_at(tile, m_blocks, heads, batch, hb_group, self.causal)
            _, n_block_max, n_block_min_masked, n_block_local_end = self.tile_blocks(m_block, seqlen_q, seqlen_k)
            n_block_min = Int32(0)
            if t < 0:
                n_block_min = n_min
                n_block_max = n_max
        else:
            m_block, head, bidx = tile_at(self.walk_tile(t, bx, gx, num_tiles, mWalk), m_blocks, heads, batch,
                                          hb_group, self.causal)
            n_block_min, n_block_max, n_block_min_masked, n_block_local_end = self.tile_blocks(m_block, seqlen_q,
                                                                                              seqlen_k)
        return m_block, head, bidx, n_block_min, n_block_max, n_block_min_masked, n_block_local_end, slot

    def walk_tile(self, t, bx, gx, num_tiles, mWalk=None):
        """The tile number of persistent step ``t`` (CTA ``bx`` of ``gx``): ``t`` itself, with persistent_snake
        (causal) odd full rounds in reverse CTA order (scheduler.snake_tile), with persistent_greedy entry t of the
        CTA's walk (step t of 0 .. count - 1)."""
        if const_expr(self.greedy):
            return mWalk[bx, t + 1]
        if const_expr(self.snake):
            return snake_tile(t, bx, gx, num_tiles)
        return t

    @cute.jit
    def load(self, mQ, mK, mV, sQ, sK, sV, tma_atom_Q, tma_atom_K, tma_atom_V, pipe_q, pipe_k, pipe_v,
             m_block: Int32, head: Int32, bidx: Int32, n_block_max: Int32, n_block_min, offset_q=0, offset_k=0,
             state=None, q_state=None, next_q=None):
        """Producer warp: K[last], Q, then (K[n-1], V[n]) pairs, then V[first] -- the order the consumers use
        (first = n_block_min: 0 unless a left window bound skips blocks). Varlen: the TMA coordinates start at the
        sequence's first row (offset_q / offset_k); rows past the sequence's end are the next sequence's (or zero
        fill past the packed tensor's end): the seqlen_k edge mask hides the keys, the Q rows are never stored.
        Persistent: takes and returns the producer states (K/V, Q) and leaves the pipeline tail to the caller;
        q_prefetch: ``next_q`` = (m_block, head, batch, whether there is one) of the next tile, whose Q goes to L2 after
        the last pair."""
        head_kv = head
        # GQA / MQA: the group's K/V head (compiles out at group 1; packed GQA: ``head`` is the K/V head)
        if const_expr(self.qhead_per_kvhead > 1 and not self.pack_gqa):
            head_kv = head // self.qhead_per_kvhead
        if const_expr(self.varlen):
            gQ = cute.local_tile(cute.domain_offset((offset_q, 0), mQ[None, None, head]), (self.tile_m, self.hdim),
                                 (m_block, 0))
            gK = cute.local_tile(cute.domain_offset((offset_k, 0), mK[None, None, head_kv]), (self.tile_n, self.hdim),
                                 (None, 0))
            gV = cute.local_tile(cute.domain_offset((offset_k, 0), mV[None, None, head_kv]),
                                 (self.tile_n, self.hdim_v), (None, 0))
        else:
            gQ = cute.local_tile(mQ[None, None, head, bidx], (self.tile_m, self.hdim), (m_block, 0))
            gK = cute.local_tile(mK[None, None, head_kv, bidx], (self.tile_n, self.hdim), (None, 0))
            gV = cute.local_tile(mV[None, None, head_kv, bidx], (self.tile_n, self.hdim_v), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        kv_rank = 0  # this CTA's share of every K/V tile (cluster_m > 1: its rank in the cluster)
        kv_mcast = {}
        if const_expr(self.cluster_m > 1):
            kv_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            kv_mcast = dict(mcast_mask=cutlass.Int16((1 << self.cluster_m) - 1))
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, kv_rank, cute.make_layout(self.cluster_m),
                                           cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, kv_rank, cute.make_layout(self.cluster_m),
                                           cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        if const_expr(not self.persistent):
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)

        n_block = n_block_max - 1
        pipe_k.producer_acquire(state)
        cute.copy(tma_atom_K, tKgK[None, n_block], tKsK[None, state.index],
                  tma_bar_ptr=pipe_k.producer_get_barrier(state), **kv_mcast)
        pipe_q.producer_acquire(q_state)
        cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        n_pairs = n_block_max - 1
        if const_expr(self.runtime_n_min):
            n_pairs = n_block_max - 1 - n_block_min
        for i in cutlass.range(n_pairs, unroll=1):
            n_block = n_block_max - 1 - i
            state_v = state.clone()
            state.advance()
            pipe_k.producer_acquire(state)
            cute.copy(tma_atom_K, tKgK[None, n_block - 1], tKsK[None, state.index],
                      tma_bar_ptr=pipe_k.producer_get_barrier(state), **kv_mcast)
            pipe_v.producer_acquire(state_v)
            cute.copy(tma_atom_V, tVgV[None, n_block], tVsV[None, state_v.index],
                      tma_bar_ptr=pipe_v.producer_get_barrier(state_v), **kv_mcast)
        if const_expr(next_q is not None):
            self.prefetch_q(mQ, sQ, tma_atom_Q, next_q)
        pipe_v.producer_acquire(state)
        if const_expr(self.runtime_n_min):
            cute.copy(tma_atom_V, tVgV[None, n_block_min], tVsV[None, state.index],
                      tma_bar_ptr=pipe_v.producer_get_barrier(state))
        else:
            cute.copy(tma_atom_V, tVgV[None, 0], tVsV[None, state.index], tma_bar_ptr=pipe_v.producer_get_barrier(state),
                      **kv_mcast)
        state.advance()
        if const_expr(self.persistent):
            q_state.advance()  # the next tile's Q waits for this tile's release
            return state, q_state
        else:
            pipe_v.producer_tail(state)

    @cute.jit
    def prefetch_q(self, mQ, sQ, tma_atom_Q, next_q):
        """q_prefetch: a TMA prefetch of the next tile's Q tile into L2 (``next_q``: its m_block, head, batch and
        whether there is one)."""
        m_next, head_next, bidx_next, has_next = next_q
        if has_next:
            gQ = cute.local_tile(mQ[None, None, head_next, bidx_next], (self.tile_m, self.hdim), (m_next, 0))
            _, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 2),
                                            cute.group_modes(gQ, 0, 2))
            cute.prefetch(tma_atom_Q, tQgQ)

    # ---- consumer warpgroups --------------------------------------------------------------------
    @cute.jit
    def sched_sync(self, wg: Int32):
        if const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=BAR_SCHED_WG1 + wg, number_of_threads=2 * self.threads_per_wg)

    @cute.jit
    def sched_arrive(self, wg: Int32):
        if const_expr(self.pingpong):
            nxt = wg + 1
            if const_expr(self.num_consumer_wg == 2):
                nxt = 1 - wg
            else:
                nxt = 0 if wg == self.num_consumer_wg - 1 else wg + 1
            cute.arch.barrier_arrive(barrier_id=BAR_SCHED_WG1 + nxt, number_of_threads=2 * self.threads_per_wg)

    @cute.jit
    def softmax_block(self, acc_S, regs: TileRegs, args: BlockArgs, n_block: Int32, masked: cutlass.Constexpr[bool],
                      is_first: cutlass.Constexpr[bool], m_scaled=None, pv_done=None) -> Boolean:
        """Softcap, mask (``masked``) and online softmax step of one S block (``is_first``: no stale maximum, no
        rescale); returns whether O and the row sums must be rescaled. ``m_scaled`` (pv_wait_mid, later blocks): the
        step stops after the head columns, leaving the rows' offsets there for softmax.online_softmax_finish.
        ``pv_done`` (early_v_release, later blocks): called by the step after the row maxima, before its rescale
        decision and exponentials."""
        self.prepare_s(acc_S, regs, args, n_block, masked)
        head_cols = 0
        if const_expr(m_scaled is not None and not is_first):
            head_cols = self.pv_head_cols
        return online_softmax_step(acc_S, regs.row_max, regs.row_sum, regs.row_scale, args.scale_log2, self.tau,
                                   self.emu_frags, self.poly, is_first, self.exp_in_branch,
                                   self.p_inline_cvt and not is_first, head_cols, m_scaled, pv_done,
                                   self.lazy_row_max, not self.row_sum_mma)

    @cute.jit
    def prepare_s(self, acc_S, regs: TileRegs, args: BlockArgs, n_block: Int32, masked: cutlass.Constexpr[bool]):
        """Softcap, then the mask (``masked``) of one S block, in place."""
        if const_expr(self.softcap > 0.0):
            apply_softcap(acc_S, args.softcap_mul)  # before the mask: tanh(-inf) would be -1
        if const_expr(masked):
            n_base = n_block * self.tile_n
            if const_expr(self.pack_gqa and (self.causal or self.has_window)):  # bounds from the row's position
                self.apply_mask_packed(acc_S, regs.tScS, args.m_base, n_base, args.seqlen_q, args.seqlen_k)
            elif const_expr(self.has_window):
                apply_mask(acc_S, regs.tScS, args.m_base, n_base, args.seqlen_q, args.seqlen_k, self.causal,
                           self.window_left, self.window_right)
            else:
                apply_mask(acc_S, regs.tScS, args.m_base, n_base, args.seqlen_q, args.seqlen_k, self.causal)

    @cute.jit
    def apply_mask_packed(self, acc_S, tScS, m_base: Int32, n_base: Int32, seqlen_q: Int32, seqlen_k: Int32):
        """Packed GQA: ``apply_mask`` (kernels/sm90/mask.py) with each row's bounds taken from its query position
        (m_base + row) // group instead of the row index: causal / right bound col <= pos + s_k - s_q + right, left
        bound col >= pos + s_k - s_q - left, and the seqlen_k edge."""
        s = acc_rows_cols(acc_S)
        c = acc_rows_cols(tScS)
        g = self.qhead_per_kvhead
        col_limit_seq = seqlen_k - n_base
        right = 0 if self.causal else self.window_right
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            pos = (m_base + c[r, 0][0]) // g
            diag = pos + seqlen_k - seqlen_q - n_base  # the diagonal's column in this block
            col_limit = col_limit_seq
            if const_expr(right >= 0):
                col_limit = cutlass.min(col_limit_seq, diag + 1 + right)
            if const_expr(self.window_left < 0):
                for j in cutlass.range(cute.size(s, mode=[1]), unroll_full=True):
                    s[r, j] = -Float32.inf if c[0, j][1] >= col_limit else s[r, j]
            else:
                col_start = cutlass.max(diag - self.window_left, 0)
                width = cutlass.max(col_limit - col_start, 0).bitcast(cutlass.Uint32)
                for j in cutlass.range(cute.size(s, mode=[1]), unroll_full=True):
                    s[r, j] = -Float32.inf if (c[0, j][1] - col_start).bitcast(cutlass.Uint32) >= width else s[r, j]

    @cute.jit
    def softmax_later_block(self, acc_S, regs: TileRegs, args: BlockArgs, n_block: Int32, m_scaled=None,
                            pv_done=None) -> Boolean:
        """Softmax of a block after the first: the masked part of the loop (causal: on or past the diagonal blocks;
        with a window: past the right bound's first block or before the left bound's last) or the unmasked one."""
        do_rescale = Boolean(True)
        if const_expr(self.has_window):
            if self.window_needs_mask(args, n_block):
                do_rescale = self.softmax_block(acc_S, regs, args, n_block, True, False, m_scaled, pv_done)
            else:
                do_rescale = self.softmax_block(acc_S, regs, args, n_block, False, False, m_scaled, pv_done)
        elif const_expr(self.causal):
            if n_block >= args.n_block_min_masked:
                do_rescale = self.softmax_block(acc_S, regs, args, n_block, True, False, m_scaled, pv_done)
            else:
                do_rescale = self.softmax_block(acc_S, regs, args, n_block, False, False, m_scaled, pv_done)
        else:
            do_rescale = self.softmax_block(acc_S, regs, args, n_block, False, False, m_scaled, pv_done)
        return do_rescale

    @cute.jit
    def make_p(self, acc_S, regs: TileRegs, frags: ConsumerFrags, stage: Int32 = None):
        """P of a block in 16 bits (to_p); p_smem: then stored to sP for its P V (single tile: after the previous P V's
        wait; p_smem_early: the tile of the block's K/V ``stage``), fenced for the async proxy and warp-synced (each
        warp's wgmma reads the 16 rows the warp wrote)."""
        self.to_p(acc_S, regs.tOrP)
        if const_expr(self.p_smem):
            st_atom, thr_st, tPsP, _ = frags.p_smem
            if const_expr(self.p_smem_early):
                tPsP = tPsP[None, None, None, stage]
            cute.copy(st_atom, thr_st.retile(regs.rP), tPsP)
            cute.arch.fence_view_async_shared()
            cute.arch.sync_warp()

    @cute.jit
    def to_p(self, acc_S, tOrP):
        if const_expr(self.p_inline_cvt):
            store_p_asm(acc_S, tOrP, self.dtype == cutlass.BFloat16)
        else:
            tOrP.store(acc_as_a_operand(acc_S).load().to(self.dtype))

    @cute.jit
    def maybe_rescale(self, regs: TileRegs, row_scale, do_rescale: Boolean):
        if const_expr(self.tau == 0.0):
            self.rescale_acc(regs, row_scale)
        else:
            if do_rescale:
                self.rescale_acc(regs, row_scale)

    @cute.jit
    def rescale_acc(self, regs: TileRegs, row_scale):
        """O (and row_sum_mma's row-sum accumulator) times the rows' factors."""
        rescale_o(regs.acc_O, row_scale)
        if const_expr(self.row_sum_mma):
            rescale_o(regs.acc_L, row_scale)

    @cute.jit
    def defer_rescale(self, row_scale, do_rescale: Boolean):
        """rescale_before_pv: leave the factors for the next step's unconditional rescale of O -- a skipped rescale
        (tau > 0: row_scale holds an older block's factors) becomes 1.0 (a select, no branch)."""
        if const_expr(self.tau != 0.0):
            for r in cutlass.range_constexpr(cute.size(row_scale)):
                row_scale[r] = row_scale[r] if do_rescale else Float32(1.0)

    @cute.jit
    def consumer_fragments(self, sQ, sK, sVt, tiled_mma_qk, tiled_mma_pv, tidx: Int32) -> ConsumerFrags:
        """A consumer thread's tile-independent views (persistent: built once per CTA, outside the tile loop; else
        before consume): its warpgroup, MMA slices and the wgmma shared-memory operand fragments."""
        wg = cute.arch.make_warp_uniform(tidx // self.threads_per_wg)
        thr_mma_qk = tiled_mma_qk.get_slice(tidx)
        thr_mma_pv = tiled_mma_pv.get_slice(tidx)
        wg_mma_qk = tiled_mma_qk.get_slice(wg * self.threads_per_wg)
        wg_mma_pv = tiled_mma_pv.get_slice(wg * self.threads_per_wg)
        tSrK = wg_mma_qk.make_fragment_B(wg_mma_qk.partition_B(sK))
        tOrVt = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(sVt))
        q_copy, q_part = None, None
        if const_expr(self.q_regs_k > 0):  # the head of Q in registers (filled per tile by load_q_regs), the rest SS
            mma_rs = self._tiled_mma_qk_rs()
            kq = self.q_regs_k * 16
            tSrQr = mma_rs.make_fragment_A(mma_rs.get_slice(tidx).partition_shape_A((self.tile_m, kq)))
            copy_q = cute.make_tiled_copy_A(
                cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), mma_rs)
            thr_copy_q = copy_q.get_slice(tidx)
            q_copy = (copy_q, thr_copy_q.partition_S(cute.local_tile(sQ, (self.tile_m, kq), (0, 0))),
                      thr_copy_q.retile(tSrQr))
            q_part = (mma_rs, tSrQr)
        if const_expr(self.q_in_regs):  # Q's register fragment, filled per Q tile by load_q_regs
            tSrQ = tiled_mma_qk.make_fragment_A(thr_mma_qk.partition_shape_A((self.tile_m, self.hdim)))
            copy_q = cute.make_tiled_copy_A(
                cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), tiled_mma_qk)
            thr_copy_q = copy_q.get_slice(tidx)
            q_copy = (copy_q, thr_copy_q.partition_S(sQ), thr_copy_q.retile(tSrQ))
        else:
            tSrQ = wg_mma_qk.make_fragment_A(wg_mma_qk.partition_A(sQ))
        ones = None
        if const_expr(self.row_sum_mma):
            tiled_mma_l = self._tiled_mma_ones()
            sOnes = self._s_ones
            wg_mma_l = tiled_mma_l.get_slice(wg * self.threads_per_wg)
            ones = (tiled_mma_l, tiled_mma_l.get_slice(tidx), wg_mma_l.make_fragment_B(wg_mma_l.partition_B(sOnes)))
        p_smem = None
        if const_expr(self.p_smem):  # P's registers (the QK^T accumulator's layout) -> sP by stmatrix; sP -> P V
            sP = self._s_p
            st_atom = cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
            thr_st = cute.make_tiled_copy_C(st_atom, tiled_mma_qk).get_slice(tidx)
            p_smem = (st_atom, thr_st, thr_st.partition_D(sP), wg_mma_pv.make_fragment_A(wg_mma_pv.partition_A(sP)))
        k_halves = None
        if const_expr(self.qk_halves):  # K's two halves of tile_n/2 rows, each the B operand of a half-width Q K^T
            mma_h = self._tiled_mma_qk_half()
            wg_mma_h = mma_h.get_slice(wg * self.threads_per_wg)
            sK_h = cute.flat_divide(sK, (self.tile_n // 2,))  # (tile_n/2, 2, hdim, stages)
            k_halves = (mma_h, [wg_mma_h.make_fragment_B(wg_mma_h.partition_B(sK_h[None, h, None, None]))
                                for h in range(2)])
        return ConsumerFrags(wg, thr_mma_qk, thr_mma_pv, tSrQ, tSrK, tOrVt, q_copy, ones, p_smem, q_part, k_halves)

    @cute.jit
    def qk_gemm(self, tiled_mma_qk, acc_S, frags: ConsumerFrags, tSrK):
        """S = Q K^T on K stage slice ``tSrK`` as one wgmma group (q_regs_k: Q's first k-blocks from registers)."""
        if const_expr(self.q_regs_k > 0):
            wgmma_split_a(frags.q_part[0], tiled_mma_qk, acc_S, frags.q_part[1], frags.tSrQ, tSrK, True)
        else:
            wgmma(tiled_mma_qk, acc_S, frags.tSrQ, tSrK, True)

    @cute.jit
    def qk_gemm_halves(self, acc_S, frags: ConsumerFrags, stage: Int32):
        """qk_halves: S = Q K^T on K stage ``stage`` as two wgmma groups, key columns 0 .. tile_n/2 - 1 first. Each
        half's accumulator is a view of half of acc_S's registers: a wgmma m64nN fragment orders its values by 8-column
        chunk last, so the first tile_n/2 columns are its first half (layout.acc_rows_cols keeps that order)."""
        mma_h, tK = frags.k_halves
        shape_h = mma_h.get_slice(0).partition_shape_C((self.tile_m, self.tile_n // 2))
        n_half = cute.size(acc_S) // 2
        for h in cutlass.range_constexpr(2):
            acc_h = cute.make_tensor(acc_S.iterator + h * n_half, cute.make_layout(shape_h))
            wgmma(mma_h, acc_h, frags.tSrQ, tK[h][None, None, None, stage], True, fence=h == 0)

    @cute.jit
    def load_q_regs(self, frags: ConsumerFrags) -> None:
        """q_in_regs: this thread's share of the Q tile, shared memory -> its wgmma A fragment (ldmatrix), after the
        tile's Q wait; the first QK^T's wgmma.fence orders these register writes before the GEMM reads them."""
        copy_q, tCsQ, tCrQ = frags.q_copy  # (tCrQ: tSrQ's registers, retiled for the copy)
        cute.copy(copy_q, tCsQ, tCrQ)

    @cute.jit
    def consume(self, mO, mLSE, sO, tma_atom_O, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v,
                scale_log2: Float32, tile: Tile, tidx: Int32, frags: ConsumerFrags, state=None, q_state=None,
                mOacc=None, mLSEacc=None, slot=None, deferred=None):
        """One tile of the consumer warpgroups: the main loop over the tile's K/V blocks (mainloop_overlap or
        mainloop_serial), then the epilogue (normalise, LSE, O). Persistent: the consumer states in and out; the
        pingpong token is handed out once per CTA by the caller."""
        regs, args, n_iter = self.tile_regs(tiled_mma_pv, scale_log2, tile, frags)
        v_last = None  # o_via_v_stage: the last block's V stage state
        if const_expr(not self.persistent):
            if const_expr(self.pingpong):
                if frags.wg == 0:  # the first warpgroup starts with the GEMM token
                    cute.arch.barrier_arrive(barrier_id=BAR_SCHED_WG1, number_of_threads=2 * self.threads_per_wg)

            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_q.consumer_wait(q_state)
        if const_expr(self.q_in_regs or self.q_regs_k > 0):
            self.load_q_regs(frags)

        n_block_max = tile.n_block_max
        if const_expr(self.skip_diag_wg):
            # warpgroup w holds rows w * 64 .. w * 64 + 63 of the tile; bottom-right causal: key k is visible to row r
            # iff k <= r + seqlen_k - seqlen_q. All of the last block's keys masked for the warpgroup's last row (so
            # for every row of it) and a block left before it: skip it. The vote tells ptxas the branch is uniform
            last_row = args.m_base + frags.wg * 64 + 63 + tile.seqlen_k - tile.seqlen_q
            skip = (n_block_max - 1) * self.tile_n > last_row
            if cute.arch.vote_any_sync(skip & (n_iter > 1)):
                state = self.diag_idle_step(pipe_k, pipe_v, frags, state)
                n_block_max = n_block_max - 1
                n_iter = n_iter - 1
        if const_expr(self.skip_idle_wg):
            rows_q = tile.seqlen_q
            if const_expr(self.pack_gqa):  # rows of the packed ((group, s), ...) layout
                rows_q = tile.seqlen_q * self.qhead_per_kvhead
            # warpgroup w holds rows w * 64 .. w * 64 + 63 of the tile; the vote tells ptxas the branch is uniform
            if cute.arch.vote_any_sync(args.m_base + frags.wg * 64 >= rows_q):
                state = self.idle_loop(pipe_q, pipe_k, pipe_v, frags, n_iter, state, q_state)
            else:
                state = self.mainloop_overlap(tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, frags, regs, args,
                                              n_block_max, n_iter, state, q_state)
        elif const_expr(self.o_via_v_stage):
            state, v_last = self.mainloop_overlap(tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, frags, regs,
                                                  args, n_block_max, n_iter, state, q_state, deferred)
        elif const_expr(self.intra_wg_overlap):
            state = self.mainloop_overlap(tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, frags, regs, args,
                                          n_block_max, n_iter, state, q_state, deferred)
        else:
            state = self.mainloop_serial(tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, frags, regs, args,
                                         n_block_max, n_iter, state, q_state)

        rO, lse = self.normalize(regs, args.scale_log2)
        if const_expr(self.split_tail):
            if slot >= 0:  # a piece of a tail tile: normalised O (fp32) and LSE to its workspace slot
                self.store_piece(mOacc, mLSEacc, frags.thr_mma_pv, regs.acc_O, lse, slot)
            else:
                self.store_lse(mLSE, frags.thr_mma_pv, lse, tile, args.m_base)
                self.store_o(mO, sO, tma_atom_O, tiled_mma_pv, rO, tile, args.m_base, tidx, v_last)
        elif const_expr(self.o_deferred):  # O waits in registers for the next tile's first block (store_deferred)
            self.store_lse(mLSE, frags.thr_mma_pv, lse, tile, args.m_base)
            deferred.rO.store(rO.load())
        else:
            self.store_lse(mLSE, frags.thr_mma_pv, lse, tile, args.m_base)
            self.store_o(mO, sO, tma_atom_O, tiled_mma_pv, rO, tile, args.m_base, tidx, v_last)
        if const_expr(self.o_via_v_stage and not self.o_deferred):
            # the epilogue has read O back out of the stage (a piece: never wrote it); its generic-proxy accesses
            # ordered before the producer's next TMA write there
            cute.arch.fence_view_async_shared()
            pipe_v.consumer_release(v_last)
        if const_expr(not self.early_q_release):
            pipe_q.consumer_release(q_state)  # after the store has read sO (persistent: the next Q may land there)
        if const_expr(self.persistent):
            q_state.advance()
            return state, q_state

    @cute.jit
    def tile_regs(self, tiled_mma_pv, scale_log2: Float32, tile: Tile, frags: ConsumerFrags):
        """A tile's registers (TileRegs: S shape, O, P, S coordinates, row statistics), its softmax arguments
        (BlockArgs; with a softcap the scale argument is scale / softcap and the softmax scale softcap * log2(e)) and
        the number of K/V blocks it visits."""
        softcap_mul = None
        if const_expr(self.softcap > 0.0):  # the scale argument is scale / softcap; the softmax scale is softcap*log2e
            softcap_mul = scale_log2
            scale_log2 = Float32(self.softcap * LOG2_E)
        n_iter = tile.n_block_max  # K/V blocks this tile visits
        if const_expr(self.runtime_n_min):
            n_iter = tile.n_block_max - tile.n_block_min
        thr_mma_qk, thr_mma_pv = frags.thr_mma_qk, frags.thr_mma_pv
        acc_shape_S = thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((self.tile_m, self.hdim_v)), Float32)
        rP = None
        if const_expr(self.p_smem):  # the SS P V reads sP: P's registers only carry it from the conversion to stmatrix
            rP = cute.make_rmem_tensor(acc_shape_S, self.dtype)
            tOrP = acc_as_a_operand(rP)
        else:
            tOrP = tiled_mma_pv.make_fragment_A(thr_mma_pv.partition_shape_A((self.tile_m, self.tile_n)))
        tScS = thr_mma_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))

        n_rows = cute.size(acc_rows_cols(acc_O), mode=[0])
        row_max = cute.make_rmem_tensor(n_rows, Float32)
        row_sum = cute.make_rmem_tensor(n_rows, Float32)
        row_scale = cute.make_rmem_tensor(n_rows, Float32)
        m_base = tile.m_block * self.tile_m
        acc_L = None
        if const_expr(self.row_sum_mma):
            acc_L = cute.make_rmem_tensor(frags.ones[1].partition_shape_C((self.tile_m, 8)), Float32)
        spec_left = None
        if const_expr(self.spec_redo_budget > 0):
            spec_left = cute.make_rmem_tensor(1, Int32)
            spec_left[0] = Int32(self.spec_redo_budget)
        regs = TileRegs(acc_shape_S, acc_O, tOrP, tScS, row_max, row_sum, row_scale, acc_L, spec_left, rP)
        args = BlockArgs(scale_log2, softcap_mul, m_base, tile.seqlen_q, tile.seqlen_k, tile.n_block_min_masked,
                         tile.n_block_local_end)
        return regs, args, n_iter

    @cute.jit
    def mainloop_overlap(self, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, frags: ConsumerFrags,
                         regs: TileRegs, args: BlockArgs, n_block_max: Int32, n_iter: Int32, state, q_state,
                         deferred=None):
        """Main loop with intra-warpgroup overlap over the n_iter K/V blocks below n_block_max (last to first): the
        first block alone (first_block), then per block the steady state (overlap_block: S(j+1) and O += P(j) V(j)
        issued together), then the last block's PV (last_pv). Returns the consumer K/V state."""
        self.first_block(tiled_mma_qk, pipe_k, frags, regs, args, n_block_max - 1, state, deferred)
        regs.acc_O.fill(0.0)  # (rescale_before_pv: the first step scales these zeros by the first block's 1.0)
        if const_expr(self.row_sum_mma):
            regs.acc_L.fill(0.0)
        if const_expr(self.causal_split):
            # two loops, no mask decision inside either: the diagonal blocks after the first (masked), then the rest.
            # (With the decision inside one loop, ptxas compiles the loop as divergent at hd128 / (192, 128): pipeline
            # states and wgmma descriptors in vector registers, BSSY/BSYNC around every mbarrier wait.)
            n_masked = cutlass.min(cutlass.max(n_block_max - 1 - args.n_block_min_masked, 0), n_iter - 1)
            if const_expr(self.top_tested_loop):
                state = self.steps_loop(tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags, regs, args, n_block_max,
                                        Int32(0), n_masked, state, True)
                state = self.steps_loop(tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags, regs, args, n_block_max,
                                        n_masked, n_iter - 1, state, False)
            else:
                for i in cutlass.range(n_masked, unroll=1):
                    n_block = n_block_max - 2 - i
                    state_v = state.clone()
                    state.advance()
                    self.overlap_block(tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags, regs, args, n_block, state,
                                       state_v, True)
                for i in cutlass.range(n_masked, n_iter - 1, unroll=1):
                    n_block = n_block_max - 2 - i
                    state_v = state.clone()
                    state.advance()
                    self.overlap_block(tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags, regs, args, n_block, state,
                                       state_v, False)
        elif const_expr(self.top_tested_loop):
            state = self.steps_loop(tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags, regs, args, n_block_max,
                                    Int32(0), n_iter - 1, state, None)
        else:
            for i in cutlass.range(n_iter - 1, unroll=1):
                n_block = n_block_max - 2 - i
                state_v = state.clone()
                state.advance()
                self.overlap_block(tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags, regs, args, n_block, state,
                                   state_v)
        if const_expr(self.early_q_release):
            pipe_q.consumer_release(q_state)  # every QK^T of the tile is done (waited for in the last step)
        self.last_pv(tiled_mma_pv, pipe_v, frags, regs, state)
        if const_expr(self.o_via_v_stage):  # the last block's V stage: O leaves through it, released after that
            v_last = state.clone()
            state.advance()
            return state, v_last
        state.advance()
        return state

    @cute.jit
    def diag_idle_step(self, pipe_k, pipe_v, frags: ConsumerFrags, state):
        """skip_diag_wg, a warpgroup none of whose rows sees a key of the tile's first-visited (last-indexed) block: that
        block's barrier protocol -- K stage waited for and released, GEMM turn taken and passed on, V stage waited for
        and released -- with no GEMM and no softmax. Returns the consumer K/V state of the next block."""
        pipe_k.consumer_wait(state)
        self.sched_sync(frags.wg)
        self.sched_arrive(frags.wg)
        pipe_k.consumer_release(state)
        pipe_v.consumer_wait(state)
        pipe_v.consumer_release(state)
        state.advance()
        return state

    @cute.jit
    def idle_loop(self, pipe_q, pipe_k, pipe_v, frags: ConsumerFrags, n_iter: Int32, state, q_state):
        """skip_idle_wg, a warpgroup whose rows all lie past seqlen_q: the barrier protocol of mainloop_overlap over the
        tile's n_iter K/V blocks in its order (K stage waited for, GEMM turn taken and passed on, K released; per later
        block also the previous block's V stage), with no GEMM and no softmax. Returns the consumer K/V state."""
        pipe_k.consumer_wait(state)
        self.sched_sync(frags.wg)
        self.sched_arrive(frags.wg)
        pipe_k.consumer_release(state)
        for i in cutlass.range(n_iter - 1, unroll=1):
            state_v = state.clone()
            state.advance()
            pipe_k.consumer_wait(state)
            self.sched_sync(frags.wg)
            pipe_v.consumer_wait(state_v)
            self.sched_arrive(frags.wg)
            pipe_k.consumer_release(state)
            pipe_v.consumer_release(state_v)
        if const_expr(self.early_q_release):
            pipe_q.consumer_release(q_state)
        pipe_v.consumer_wait(state)
        pipe_v.consumer_release(state)
        state.advance()
        return state

    @cute.jit
    def steps_loop(self, tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags: ConsumerFrags, regs: TileRegs,
                   args: BlockArgs, n_block_max: Int32, lo: Int32, hi: Int32, state, masked: cutlass.Constexpr = None):
        """p_cvt_asm: overlap steps lo .. hi-1 (block n_block_max - 2 - i) as a loop whose exit test (a warp vote, which
        LLVM does not copy) stays at its top. A counted loop whose header holds only the test is rotated by LLVM (test
        at the bottom), and ptxas then keeps the pipeline states and wgmma descriptors in vector registers (the default
        loop escapes that only because LLVM folds the 32 P conversions into its header). Returns the K/V state."""
        i = lo
        while cute.arch.vote_any_sync(i < hi):
            n_block = n_block_max - 2 - i
            state_v = state.clone()
            state.advance()
            self.overlap_block(tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags, regs, args, n_block, state, state_v,
                               masked)
            i += 1
        return state

    @cute.jit
    def first_block(self, tiled_mma_qk, pipe_k, frags: ConsumerFrags, regs: TileRegs, args: BlockArgs,
                    n_block: Int32, state, deferred=None):
        """Overlap, first half: S = Q K^T of the tile's first (last-indexed) block, its masked softmax (no rescale,
        no stale maximum) and P. o_deferred: the previous tile's O store while that Q K^T runs."""
        tSrK = None
        if const_expr(self.early_desc):  # the stage's descriptor before the waits (ptxas keeps it after bar.sync)
            tSrK = frags.tSrK[None, None, None, state.index]
        pipe_k.consumer_wait(state)
        self.sched_sync(frags.wg)
        acc_S = cute.make_rmem_tensor(regs.acc_shape_S, Float32)
        if const_expr(not self.early_desc):
            tSrK = frags.tSrK[None, None, None, state.index]
        self.qk_gemm(tiled_mma_qk, acc_S, frags, tSrK)
        self.sched_arrive(frags.wg)
        if const_expr(deferred is not None):
            if deferred.pending:
                self.store_deferred(deferred, state)
        warpgroup.wait_group(0)
        pipe_k.consumer_release(state)
        self.softmax_block(acc_S, regs, args, n_block, True, True)
        self.make_p(acc_S, regs, frags, state.index)

    @cute.jit
    def overlap_block(self, tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags: ConsumerFrags, regs: TileRegs,
                      args: BlockArgs, n_block: Int32, state, state_v, masked: cutlass.Constexpr = None):
        """Overlap, steady state: issue S(j+1) = Q K^T (K stage ``state``) and O += P(j) V(j) (V stage ``state_v``)
        together, run softmax(j+1) while PV(j) is in flight, then P(j+1) and the conditional rescale of O."""
        tSrK, tOrVt = None, None
        if const_expr(self.early_desc):  # the stages' descriptors before the waits (ptxas keeps them after bar.sync)
            tSrK = frags.tSrK[None, None, None, state.index]
            tOrVt = frags.tOrVt[None, None, None, state_v.index]
        pipe_k.consumer_wait(state)
        self.sched_sync(frags.wg)
        acc_S = cute.make_rmem_tensor(regs.acc_shape_S, Float32)
        if const_expr(not self.early_desc):
            tSrK = frags.tSrK[None, None, None, state.index]
        # qk_halves where the block's S goes straight to the exponentials (no mask to apply to the whole block first)
        halves = self.qk_halves and (masked is False or (masked is None and not self.causal and not self.has_window))
        if const_expr(halves):
            self.qk_gemm_halves(acc_S, frags, state.index)
        else:
            self.qk_gemm(tiled_mma_qk, acc_S, frags, tSrK)
        if const_expr(self.rescale_before_pv):  # O (PV(j-1) done) by block j's factors, while S(j+1) is computed
            self.rescale_acc(regs, regs.row_scale)
        pipe_v.consumer_wait(state_v)
        self.pv_gemm(tiled_mma_pv, frags, regs, state_v.index, tOrVt)
        self.sched_arrive(frags.wg)
        warpgroup.wait_group(2 if halves else 1)  # (halves: S's first half; softmax_spec waits for the second)
        # S(j+1) by the kept maxima, releasing the K stage itself; not in causal_split's diagonal loop, whose blocks
        # are where a row can still lack a maximum (its vote would always redo them)
        if const_expr(self.speculative_exp and masked is not True):
            if const_expr(self.spec_redo_budget > 0):
                # the tile's budget spent: the eager step for its remaining blocks (the count is warpgroup-uniform;
                # the warp vote tells ptxas so, which keeps the wgmma descriptors uniform)
                do_rescale = Boolean(False)
                if cute.arch.vote_any_sync(regs.spec_left[0] > 0):
                    do_rescale = self.softmax_spec(tiled_mma_qk, pipe_k, frags, acc_S, regs, args, n_block, state,
                                                   masked, self.p_smem_early)
                else:
                    pipe_k.consumer_release(state)
                    do_rescale = self.softmax_eager_later(acc_S, regs, args, n_block, masked, None, None)
                    if const_expr(self.p_smem_early):  # into the other sP tile than the one P V(j) reads
                        self.make_p(acc_S, regs, frags, state.index)
            else:
                pv_first = None
                if const_expr(self.p_before_vote):
                    pv_first = functools.partial(self.wait_pv_release_v, pipe_v, state_v)
                if const_expr(self.spec_warp_redo):
                    self.prepare_later(acc_S, regs, args, n_block, masked)
                    do_rescale = self.softmax_spec_warp(pipe_k, frags, acc_S, regs, args, state, pv_first)
                else:
                    do_rescale = self.softmax_spec(tiled_mma_qk, pipe_k, frags, acc_S, regs, args, n_block, state,
                                                   masked, self.p_smem_early, halves, pv_first)
            if const_expr(not self.p_before_vote):
                warpgroup.wait_group(0)
                pipe_v.consumer_release(state_v)
            if const_expr(not self.p_smem_early and not self.p_before_vote):
                self.make_p(acc_S, regs, frags)
            if const_expr(self.rescale_before_pv):
                self.defer_rescale(regs.row_scale, do_rescale)
            else:
                self.maybe_rescale(regs, regs.row_scale, do_rescale)
            return
        pipe_k.consumer_release(state)
        m_scaled = None
        if const_expr(self.pv_wait_mid):  # the rows' exp2 offsets, from the head columns to the rest of the block
            m_scaled = cute.make_rmem_tensor(cute.size(regs.row_max), Float32)
        pv_done = None  # early_v_release: the softmax step waits for P V(j) and releases V(j) before its decision
        if const_expr(self.early_v_release):
            pv_done = functools.partial(self.wait_pv_release_v, pipe_v, state_v)
        do_rescale = self.softmax_eager_later(acc_S, regs, args, n_block, masked, m_scaled, pv_done)
        p_early = self.p_smem_early and not self.pv_wait_mid  # (pv_wait_mid: the softmax is done after the wait)
        if const_expr(p_early):  # into the other sP tile than the one P V(j) reads: before its wait
            self.make_p(acc_S, regs, frags, state.index)
        if const_expr(not self.early_v_release):
            warpgroup.wait_group(0)
            pipe_v.consumer_release(state_v)
        if const_expr(self.pv_wait_mid):  # P V(j) done, its V stage released: the rest of block j+1's softmax
            online_softmax_finish(acc_S, regs.row_sum, regs.row_scale, m_scaled, args.scale_log2, do_rescale, self.tau,
                                  self.emu_frags, self.poly, self.pv_head_cols, self.p_inline_cvt,
                                  not self.row_sum_mma)
        if const_expr(not p_early):
            self.make_p(acc_S, regs, frags, state.index)
        if const_expr(self.rescale_before_pv):
            self.defer_rescale(regs.row_scale, do_rescale)
        else:
            self.maybe_rescale(regs, regs.row_scale, do_rescale)

    @cute.jit
    def softmax_eager_later(self, acc_S, regs: TileRegs, args: BlockArgs, n_block: Int32,
                            masked: cutlass.Constexpr = None, m_scaled=None, pv_done=None) -> Boolean:
        """The eager softmax step of a later block: the mask decided per block (``masked`` None) or by the caller's
        loop (causal_split). Returns whether O needs the rescale."""
        do_rescale = None
        if const_expr(masked is None):
            do_rescale = self.softmax_later_block(acc_S, regs, args, n_block, m_scaled, pv_done)
        else:
            do_rescale = self.softmax_block(acc_S, regs, args, n_block, masked, False, m_scaled, pv_done)
        return do_rescale

    @cute.jit
    def pv_gemm(self, tiled_mma_pv, frags: ConsumerFrags, regs: TileRegs, stage: Int32, tOrVt=None):
        """O += P V on V stage ``stage`` (``tOrVt``: that stage's slice, taken by the caller) as one wgmma group
        (row_sum_mma: then, in the same group, L += P 1)."""
        if const_expr(tOrVt is None):
            tOrVt = frags.tOrVt[None, None, None, stage]
        if const_expr(self.p_smem):
            tOsP = frags.p_smem[3]
            if const_expr(self.p_smem_early):  # the tile of this block's P: its V stage's
                tOsP = tOsP[None, None, None, stage]
            wgmma(tiled_mma_pv, regs.acc_O, tOsP, tOrVt, False)
        elif const_expr(self.row_sum_mma):
            wgmma(tiled_mma_pv, regs.acc_O, regs.tOrP, tOrVt, False, commit=False)
            wgmma(frags.ones[0], regs.acc_L, regs.tOrP, frags.ones[2], False, fence=False)
        else:
            wgmma(tiled_mma_pv, regs.acc_O, regs.tOrP, tOrVt, False)

    @property
    def spec_limit(self) -> float:
        """speculative_exp's vote limit, just under 2^tau: margin 2^-6, since the eager vote rounds (S - m) * scale,
        not the FFMA's S * scale - m * scale (typical partial sums are far below it: P <= ~1 per column)."""
        return 2.0 ** self.tau * (1.0 - 2.0 ** -6)

    @cute.jit
    def softmax_spec(self, tiled_mma_qk, pipe_k, frags: ConsumerFrags, acc_S, regs: TileRegs, args: BlockArgs,
                     n_block: Int32, state, masked: cutlass.Constexpr = None,
                     store_p: cutlass.Constexpr[bool] = False, halves: cutlass.Constexpr[bool] = False,
                     pv_first=None) -> Boolean:
        """speculative_exp, a later block whose S is in acc_S and whose K stage ``state`` is still held: P with the
        kept maxima and the rows' partial sums (softmax.exp_kept_max). If no thread of the warpgroup saw a partial sum
        near 2^tau (a barrier.red over the warpgroup: its wgmma below is warpgroup-wide), or after one did, no thread
        holds a P near it (a second vote, softmax.p_exceeds: sums over many columns pass the limit with every P below
        it), the eager step would have kept every maximum too: release K, add the partials, no rescale. Else S again
        from the held K stage, K released, and the eager step (masked / lazy as configured). A kept block's P, sums
        and maxima are the eager step's bit for bit; a rescaled row's sum can differ by a rounding, as between the
        other loop shapes (ptxas contracts row_sum * scale + partial into one FFMA in some layouts, not in others).
        ``store_p`` (p_smem_early): P to its sP tile right after the exponentials, before the votes (ptxas does not
        move the conversions and stores across their barrier), and again after a redo. ``halves`` (qk_halves): S's
        second half still in flight; the exponentials of the first wait for it halfway. ``pv_first`` (p_before_vote):
        called after the exponentials, before the votes (waits for P V(j) and releases its V stage); P is then converted
        there, and again after a redo."""
        self.prepare_later(acc_S, regs, args, n_block, masked)
        partial = cute.make_rmem_tensor(cute.size(regs.row_max), Float32)
        limit = self.spec_limit
        # the sums pinned at hd256 only: elsewhere they stay put unpinned, and pinned cost (192, 128) causal 23
        # uniform-datapath instructions more on the common path
        redo = exp_kept_max(acc_S, regs.row_max, args.scale_log2, self.emu_frags, self.poly, partial, limit,
                            self.hdim >= 256, warpgroup.wait_group if halves else None)
        if const_expr(store_p):
            self.make_p(acc_S, regs, frags, state.index)
        if const_expr(pv_first is not None):
            pv_first()
            self.make_p(acc_S, regs, frags)
        redo = warpgroup_any(redo, BAR_SPEC_WG1 + frags.wg, self.threads_per_wg)
        if redo:  # a sum passed the limit: a second vote on the P themselves (p_exceeds), same barrier
            redo = warpgroup_any(p_exceeds(acc_S, regs.row_max, partial, limit), BAR_SPEC_WG1 + frags.wg,
                                 self.threads_per_wg)
        do_rescale = Boolean(False)
        if redo:
            if const_expr(halves):  # (the same register halves as the first issue: ptxas serializes every wgmma else)
                self.qk_gemm_halves(acc_S, frags, state.index)
            else:
                self.qk_gemm(tiled_mma_qk, acc_S, frags, frags.tSrK[None, None, None, state.index])
            warpgroup.wait_group(0)
            pipe_k.consumer_release(state)
            self.prepare_later(acc_S, regs, args, n_block, masked)
            do_rescale = online_softmax_step(acc_S, regs.row_max, regs.row_sum, regs.row_scale, args.scale_log2,
                                             self.tau, self.emu_frags, self.poly, False, False, self.p_inline_cvt, 0,
                                             None, None, self.lazy_row_max)
            if const_expr(store_p):
                self.make_p(acc_S, regs, frags, state.index)
            if const_expr(pv_first is not None):
                self.make_p(acc_S, regs, frags)
            if const_expr(self.spec_redo_budget > 0):
                regs.spec_left[0] = regs.spec_left[0] - 1
        else:
            pipe_k.consumer_release(state)
            for r in cutlass.range_constexpr(cute.size(partial)):
                regs.row_sum[r] = regs.row_sum[r] + partial[r]
        return do_rescale

    @cute.jit
    def softmax_spec_warp(self, pipe_k, frags: ConsumerFrags, acc_S, regs: TileRegs, args: BlockArgs, state,
                          pv_first) -> Boolean:
        """spec_warp_redo (with p_before_vote): softmax_spec on a copy of the block's S. K released at once; P with the
        kept maxima into the copy, then P V(j)'s wait, P's conversion, and the votes over the warp (vote.any). A warp
        whose vote fires runs the eager step on the kept S (no wgmma: the other warps of its warpgroup go on) and
        converts P again."""
        pipe_k.consumer_release(state)
        acc_P = cute.make_rmem_tensor(acc_S.layout, Float32)
        acc_P.store(acc_S.load())
        partial = cute.make_rmem_tensor(cute.size(regs.row_max), Float32)
        limit = self.spec_limit
        redo = exp_kept_max(acc_P, regs.row_max, args.scale_log2, self.emu_frags, self.poly, partial, limit,
                            self.hdim >= 256)
        pv_first()
        self.make_p(acc_P, regs, frags)
        redo = cute.arch.vote_any_sync(redo)
        if redo:
            redo = cute.arch.vote_any_sync(s_exceeds(acc_S, regs.row_max, args.scale_log2, partial, limit))
        do_rescale = Boolean(False)
        if redo:
            do_rescale = online_softmax_step(acc_S, regs.row_max, regs.row_sum, regs.row_scale, args.scale_log2,
                                             self.tau, self.emu_frags, self.poly, False, False, self.p_inline_cvt, 0,
                                             None, None, self.lazy_row_max)
            self.make_p(acc_S, regs, frags)
        else:
            for r in cutlass.range_constexpr(cute.size(partial)):
                regs.row_sum[r] = regs.row_sum[r] + partial[r]
        return do_rescale

    @cute.jit
    def window_needs_mask(self, args: BlockArgs, n_block: Int32) -> Boolean:
        """With a window, whether a later block needs the mask: past the right bound's first block or before the left
        bound's last."""
        need_mask = Boolean(False)
        if const_expr(self.causal or self.window_right >= 0):
            need_mask = need_mask | (n_block >= args.n_block_min_masked)
        if const_expr(self.has_left):
            need_mask = need_mask | (n_block < args.n_block_local_end)
        return need_mask

    @cute.jit
    def prepare_later(self, acc_S, regs: TileRegs, args: BlockArgs, n_block: Int32, masked: cutlass.Constexpr = None):
        """Softcap and mask of a block after the first: ``masked`` as the caller's loop says (causal_split), else the
        per-block decision of softmax_later_block."""
        if const_expr(masked is not None):
            self.prepare_s(acc_S, regs, args, n_block, masked)
        elif const_expr(self.has_window):
            if self.window_needs_mask(args, n_block):
                self.prepare_s(acc_S, regs, args, n_block, True)
            else:
                self.prepare_s(acc_S, regs, args, n_block, False)
        elif const_expr(self.causal):
            if n_block >= args.n_block_min_masked:
                self.prepare_s(acc_S, regs, args, n_block, True)
            else:
                self.prepare_s(acc_S, regs, args, n_block, False)
        else:
            self.prepare_s(acc_S, regs, args, n_block, False)

    @cute.jit
    def wait_pv_release_v(self, pipe_v, state_v):
        """early_v_release, called by the softmax step after the row maxima (before the rescale decision and the
        exponentials): wait for the in-flight P V GEMM, then release its V stage to the producer."""
        warpgroup.wait_group(0)
        pipe_v.consumer_release(state_v)

    @cute.jit
    def last_pv(self, tiled_mma_pv, pipe_v, frags: ConsumerFrags, regs: TileRegs, state):
        """Overlap, last half: O += P V of the tile's last block (the epilogue hand-off; rescale_before_pv: O is first
        scaled by that block's row factors)."""
        if const_expr(self.rescale_before_pv):
            self.rescale_acc(regs, regs.row_scale)
        pipe_v.consumer_wait(state)
        self.pv_gemm(tiled_mma_pv, frags, regs, state.index)
        warpgroup.wait_group(0)
        if const_expr(not self.o_via_v_stage):  # (o_via_v_stage: after the epilogue, which writes O there)
            pipe_v.consumer_release(state)

    @cute.jit
    def mainloop_serial(self, tiled_mma_qk, tiled_mma_pv, pipe_q, pipe_k, pipe_v, frags: ConsumerFrags,
                        regs: TileRegs, args: BlockArgs, n_block_max: Int32, n_iter: Int32, state, q_state):
        """Main loop without intra-warpgroup overlap over the n_iter K/V blocks below n_block_max (last to first,
        serial_block each; pingpong: a warpgroup's GEMM turn covers PV(j) and QK^T(j+1), its softmax runs outside
        it). Returns the consumer K/V state."""
        regs.acc_O.fill(0.0)
        if const_expr(self.row_sum_mma):
            regs.acc_L.fill(0.0)
        self.sched_sync(frags.wg)
        for i in cutlass.range(n_iter, unroll=1):
            n_block = n_block_max - 1 - i
            self.serial_block(tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags, regs, args, i, n_block, state)
            state.advance()
        self.sched_arrive(frags.wg)
        if const_expr(self.early_q_release):
            pipe_q.consumer_release(q_state)
        return state

    @cute.jit
    def serial_block(self, tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v, frags: ConsumerFrags, regs: TileRegs,
                     args: BlockArgs, i: Int32, n_block: Int32, state):
        """No overlap, one block: S = Q K^T, softmax (i == 0: masked, no rescale; else softmax_later_block and the
        conditional rescale of O), P, then O += P V, all on K/V stage ``state``."""
        pipe_k.consumer_wait(state)
        acc_S = cute.make_rmem_tensor(regs.acc_shape_S, Float32)
        self.qk_gemm(tiled_mma_qk, acc_S, frags, frags.tSrK[None, None, None, state.index])
        self.sched_arrive(frags.wg)
        warpgroup.wait_group(0)
        pipe_k.consumer_release(state)
        do_rescale = Boolean(True)
        if i == 0:
            self.softmax_block(acc_S, regs, args, n_block, True, True)
        else:
            do_rescale = self.softmax_later_block(acc_S, regs, args, n_block)
            self.maybe_rescale(regs, regs.row_scale, do_rescale)
        self.make_p(acc_S, regs, frags, state.index)
        pipe_v.consumer_wait(state)
        self.sched_sync(frags.wg)
        self.pv_gemm(tiled_mma_pv, frags, regs, state.index)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(state)

    # ---- epilogue: normalise, LSE, O via shared memory and one TMA store ----
    @cute.jit
    def normalize(self, regs: TileRegs, scale_log2: Float32):
        """O / row sum in the output dtype (rO) and the rows' LSE (natural log), from the final row statistics."""
        n_rows = cute.size(regs.row_max)
        inv_sum = cute.make_rmem_tensor(n_rows, Float32)
        lse = cute.make_rmem_tensor(n_rows, Float32)
        if const_expr(self.row_sum_mma):  # every column of a row of L holds that row's sum
            lrc = acc_rows_cols(regs.acc_L)
            for r in cutlass.range_constexpr(n_rows):
                regs.row_sum[r] = lrc[r, 0]
        finalize(regs.row_max, regs.row_sum, scale_log2, inv_sum, lse, not self.row_sum_mma)
        rescale_o(regs.acc_O, inv_sum)
        rO = cute.make_rmem_tensor(regs.acc_O.shape, self.dtype)
        rO.store(regs.acc_O.load().to(self.dtype))
        return rO, lse

    @cute.jit
    def store_lse(self, mLSE, thr_mma_pv, lse, tile: Tile, m_base: Int32):
        """LSE: the lane owning column 0 of each row writes it, for rows inside the sequence."""
        tOcO = acc_rows_cols(thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.hdim_v))))
        if tOcO[0, 0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(lse)):
                row = m_base + tOcO[r, 0][0]
                rows_q = tile.seqlen_q
                if const_expr(self.pack_gqa):  # row (position, head in group) of the packed ((group, s), h_kv, b)
                    rows_q = tile.seqlen_q * self.qhead_per_kvhead
                if row < rows_q:
                    if const_expr(self.varlen):  # packed (total_q, h)
                        mLSE[tile.offset_q + row, tile.head] = lse[r]
                    else:
                        mLSE[row, tile.head, tile.bidx] = lse[r]

    @cute.jit
    def store_piece(self, mOacc, mLSEacc, thr_mma_pv, acc_O, lse, slot: Int32):
        """split_tail: a tail piece's O (normalised by the piece's row sums, fp32, from the accumulator registers) and
        LSE into workspace slot ``slot`` (mOacc (tile_m, dv, slots), mLSEacc (tile_m, slots)); every row, the combine
        skips those past seqlen_q."""
        cute.autovec_copy(acc_O, thr_mma_pv.partition_C(mOacc[None, None, slot]))  # adjacent column pairs: 64-bit
        tOcO = acc_rows_cols(thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.hdim_v))))
        if tOcO[0, 0][1] == 0:
            for r in cutlass.range_constexpr(cute.size(lse)):
                mLSEacc[tOcO[r, 0][0], slot] = lse[r]

    @cute.jit
    def store_o(self, mO, sO, tma_atom_O, tiled_mma_pv, rO, tile: Tile, m_base: Int32, tidx: Int32, v_stage=None):
        """O registers -> shared memory (stmatrix, once every consumer is done reading sQ / the previous O store has
        read sO) -> global (store_o_tma, or store_o_varlen); o_direct: registers -> global (store_o_direct);
        o_via_v_stage: through the V stage of ``v_stage`` (store_o_v_stage)."""
        if const_expr(self.o_direct):
            self.store_o_regs(mO, tiled_mma_pv.get_slice(tidx), rO, tile, m_base)
        elif const_expr(self.o_via_v_stage):
            self.store_o_v_stage(mO, sO[None, None, v_stage.index], rO, tile, m_base, tidx)
        else:
            self.store_o_smem(mO, sO, tma_atom_O, tiled_mma_pv, rO, tile, m_base, tidx)

    @cute.jit
    def store_o_smem(self, mO, sO, tma_atom_O, tiled_mma_pv, rO, tile: Tile, m_base: Int32, tidx: Int32):
        """store_o through shared memory."""
        if const_expr(self.separate_o):
            if tidx < 32:  # the previous tile's O store must have read sO before it is written again
                cute.arch.cp_async_bulk_wait_group(0, read=True)
        # both warpgroups must be done reading sQ before O overwrites it (separate sO: the wait above is done)
        cute.arch.barrier(barrier_id=BAR_EPILOGUE, number_of_threads=self.num_consumer_wg * self.threads_per_wg)
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_st = cute.make_tiled_copy_C(st_atom, tiled_mma_pv).get_slice(tidx)
        cute.copy(st_atom, thr_st.retile(rO), thr_st.partition_D(sO))
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=BAR_EPILOGUE, number_of_threads=self.num_consumer_wg * self.threads_per_wg)
        if const_expr(self.varlen):
            self.store_o_varlen(mO, sO, tile.head, tile.m_block, tile.offset_q, tile.seqlen_q, tidx)
        else:
            if const_expr(self.cluster_m > 1):
                if m_base < tile.seqlen_q:  # a cluster's padding CTA (odd m-block count) stores nothing
                    if tidx < 32:
                        self.store_o_tma(mO, sO, tma_atom_O, tile.head, tile.bidx, tile.m_block)
            else:
                if tidx < 32:
                    self.store_o_tma(mO, sO, tma_atom_O, tile.head, tile.bidx, tile.m_block)

    @cute.jit
    def store_o_v_stage(self, mO, sO, rO, tile: Tile, m_base: Int32, tidx: Int32):
        """o_via_v_stage: O through ``sO`` (a column chunk of the O tile in the last block's V stage), one chunk at a
        time: stmatrix into it, then rows_to_global. Chunk c holds accumulator values c * n .. c * n + n - 1 of each
        thread (the wgmma C fragment's column blocks of 8 are its outermost mode), laid out as a tiled MMA over its
        columns."""
        n_threads = self.num_consumer_wg * self.threads_per_wg
        cols = self.hdim_v // self.o_chunks
        mma_c = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, Float32,
            (self.num_consumer_wg, 1, 1), (64, cols), warpgroup.OperandSource.RMEM)
        st_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_st = cute.make_tiled_copy_C(st_atom, mma_c).get_slice(tidx)
        rO_c = cute.make_rmem_tensor(mma_c.get_slice(tidx).partition_shape_C((self.tile_m, cols)), self.dtype)
        n_c = cute.size(rO_c)
        for c in cutlass.range_constexpr(self.o_chunks):
            for i in cutlass.range_constexpr(n_c):
                rO_c[i] = rO[c * n_c + i]
            # chunk 0: every warpgroup's last P V has read the stage; later chunks: the previous one has been read
            cute.arch.barrier(barrier_id=BAR_EPILOGUE, number_of_threads=n_threads)
            cute.copy(st_atom, thr_st.retile(rO_c), thr_st.partition_D(sO))
            cute.arch.barrier(barrier_id=BAR_EPILOGUE, number_of_threads=n_threads)
            gO = cute.local_tile(mO[None, None, tile.head, tile.bidx], (self.tile_m, cols), (tile.m_block, c))
            self.rows_to_global(sO, gO, cols, tile.seqlen_q - m_base, tidx)

    @cute.jit
    def store_deferred(self, deferred: DeferredO, state):
        """o_deferred: the previous tile's O through the V stage its last block used (the one before ``state``, the
        consumer state at the next tile's start, or after the CTA's last tile), then that stage released; o_direct:
        from the kept registers straight to global memory (no stage)."""
        tile = deferred.tile
        if const_expr(self.o_direct):
            self.store_o_regs(deferred.mO, deferred.thr_mma_pv, deferred.rO, tile, tile.m_block * self.tile_m)
        else:
            v_prev = state.clone()
            v_prev.reverse()
            self.store_o_v_stage(deferred.mO, deferred.sO[None, None, v_prev.index], deferred.rO, tile,
                                 tile.m_block * self.tile_m, deferred.tidx)
            cute.arch.fence_view_async_shared()  # the reads before the producer's next TMA write there
            deferred.pipe_v.consumer_release(v_prev)

    @cute.jit
    def store_o_regs(self, mO, thr_mma_pv, rO, tile: Tile, m_base: Int32):
        """o_direct: O from this thread's registers to global memory, 16 bytes per store with o_direct_wide."""
        if const_expr(self.o_direct_wide):
            self.store_o_wide(mO, thr_mma_pv, rO, tile, m_base)
        else:
            self.store_o_direct(mO, thr_mma_pv, rO, tile, m_base)

    @cute.jit
    def store_o_direct(self, mO, thr_mma_pv, rO, tile: Tile, m_base: Int32):
        """o_direct: each thread writes its rows of O from registers, in the accumulator's adjacent column pairs
        (32-bit stores), skipping rows past seqlen_q."""
        gO = cute.local_tile(mO[None, None, tile.head, tile.bidx], (self.tile_m, self.hdim_v), (tile.m_block, 0))
        tOgO = acc_rows_cols(thr_mma_pv.partition_C(gO))
        tOrO = acc_rows_cols(rO)
        tOcO = acc_rows_cols(thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.hdim_v))))
        for r in cutlass.range_constexpr(cute.size(tOrO, mode=[0])):
            if m_base + tOcO[r, 0][0] < tile.seqlen_q:
                for c in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
                    tOgO[r, c] = tOrO[r, c]

    @cute.jit
    def store_o_wide(self, mO, thr_mma_pv, rO, tile: Tile, m_base: Int32):
        """o_direct_wide: o_direct in 16-byte stores. The 4 lanes of a quad hold the same two rows, each 2 adjacent
        columns of every 8-column block; for each run of 4 blocks they transpose their 4 x 4 column pairs (32-bit
        words, layout.quad_transpose: 3 shuffles, 16 selects) so lane q holds block q's 8 columns, and store
        them as one 16-byte piece (4 x fewer stores, each writing 64 contiguous bytes per row). Every lane shuffles;
        only the stores skip rows past seqlen_q."""
        gO = cute.local_tile(mO[None, None, tile.head, tile.bidx], (self.tile_m, self.hdim_v), (tile.m_block, 0))
        tOrO = acc_rows_cols(rO)  # (rows, (pair element, 8-column block))
        tOcO = acc_rows_cols(thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.hdim_v))))
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        lane = cute.arch.lane_idx()
        q = lane % 4
        quad = lane - q
        odd = (q & 1) != 0
        high = (q & 2) != 0
        pair = cute.make_rmem_tensor((2,), self.dtype)
        pair32 = cute.recast_tensor(pair, Uint32)
        piece = cute.make_rmem_tensor((8,), self.dtype)
        piece32 = cute.recast_tensor(piece, Uint32)
        for r in cutlass.range_constexpr(cute.size(tOrO, mode=[0])):
            row = tOcO[r, 0][0]
            for g in cutlass.range_constexpr(self.hdim_v // 32):
                a = []
                for b in cutlass.range_constexpr(4):  # this lane's column pair of blocks 4g .. 4g + 3
                    pair[0] = tOrO[r, 2 * (4 * g + b)]
                    pair[1] = tOrO[r, 2 * (4 * g + b) + 1]
                    a.append(pair32[0])
                c = quad_transpose(a, q, odd, high, lambda v, src, k: cute.arch.shuffle_sync(v, quad + src))
                for p in cutlass.range_constexpr(4):
                    piece32[p] = c[p]
                if m_base + row < tile.seqlen_q:
                    cute.copy(atom, piece, cute.local_tile(gO[row, None], (8,), (4 * g + q,)))

    @cute.jit
    def store_o_tma(self, mO, sO, tma_atom_O, head: Int32, bidx: Int32, m_block: Int32):
        """The O tile, shared memory -> global, one TMA store by warp 0 of the consumers (clips rows past seqlen_q)."""
        gO = cute.local_tile(mO[None, None, head, bidx], (self.tile_m, self.hdim_v), (m_block, 0))
        tOsO, tOgO = cpasync.tma_partition(tma_atom_O, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2),
                                           cute.group_modes(gO, 0, 2))
        cute.copy(tma_atom_O, tOsO, tOgO)
        cute.arch.cp_async_bulk_commit_group()
        if const_expr(not self.separate_o):  # separate sO: waited for before the next epilogue / at exit
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def store_o_varlen(self, mO, sO, head: Int32, m_block: Int32, offset_q: Int32, seqlen_q: Int32, tidx: Int32):
        """Varlen epilogue: every consumer thread copies 16-byte row pieces of the O tile from shared memory to the
        packed O, only for rows inside the sequence (a TMA store clips at the packed tensor's end only, so it would
        overwrite the next sequence's rows)."""
        gO = cute.local_tile(cute.domain_offset((offset_q, 0), mO[None, None, head]), (self.tile_m, self.hdim_v),
                             (m_block, 0))
        self.rows_to_global(sO, gO, self.hdim_v, seqlen_q - m_block * self.tile_m, tidx)

    @cute.jit
    def rows_to_global(self, sO, gO, cols: cutlass.Constexpr[int], row_limit: Int32, tidx: Int32):
        """A (tile_m, ``cols``) tile from shared memory ``sO`` to global ``gO``: every consumer thread reads 16-byte
        row pieces and stores those of rows below ``row_limit``."""
        n_threads = self.num_consumer_wg * self.threads_per_wg
        vec = 128 // self.dtype.width
        per_row = cols // vec  # threads per row
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        tiled = cute.make_tiled_copy_tv(atom, cute.make_ordered_layout((n_threads // per_row, per_row), order=(1, 0)),
                                        cute.make_layout((1, vec)))
        thr = tiled.get_slice(tidx)
        tOsO = thr.partition_S(sO)
        tOgO = thr.partition_D(gO)
        tOcO = thr.partition_S(cute.make_identity_tensor((self.tile_m, cols)))
        tOrO = cute.make_rmem_tensor_like(tOsO)
        cute.copy(tiled, tOsO, tOrO)
        for m in cutlass.range_constexpr(cute.size(tOgO, mode=[1])):
            if tOcO[0, m, 0][0] < row_limit:
                cute.copy(tiled, tOrO[None, m, None], tOgO[None, m, None])

