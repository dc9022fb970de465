"""The backward's dQ writer warp (FlashBwdSm90's warp 1): it takes each MMA warpgroup's fp32 dQ chunk from shared
memory and bulk-reduces it into dQaccum, in semaphore order when deterministic; the deterministic turns (naive,
shortest-processing-time first, the rotated walks' arrival order) and where each chunk goes. A mixin of FlashBwdSm90
(kernels/sm90/bwd.py), which holds the configuration these methods read (dq_stages, dq_chunk, deterministic, ...);
``work`` is bwd.py's BwdWork.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

from .barriers import Bar
from .mask import m_block_visitors

_BAR_DQ_FULL = int(Bar.BWD_DQ_FULL)  # + w: MMA warpgroup w -> writer warp (chunk w written)
_BAR_DQ_EMPTY = int(Bar.BWD_DQ_EMPTY)  # + w: writer warp -> MMA warpgroup w (chunk w free again)
_BAR_DQ_TOKEN = int(Bar.BWD_DQ_TOKEN)  # + h: det_two_writers: writer warp h -> the other one (dq_writer_pair)


def _bulk_smem_to_gmem(ptx: str, doc: str):
    """A DSL op issuing ``ptx`` [gmem], [smem], nbytes (one bulk-group async copy of nbytes from shared memory)."""

    @dsl_user_op
    def op(gptr: cute.Pointer, sptr: cute.Pointer, nbytes: int, *, loc=None, ip=None) -> None:
        llvm.inline_asm(
            None,
            [gptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip), sptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip),
             Int32(nbytes).ir_value(loc=loc, ip=ip)],
            ptx + " [$0], [$1], $2;",
            "l,r,r",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )

    op.__doc__ = doc
    return op


bulk_reduce_add_f32 = _bulk_smem_to_gmem(
    "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32",
    "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32: add nbytes of fp32 from smem into gmem.")
bulk_store_f32 = _bulk_smem_to_gmem(
    "cp.async.bulk.global.shared::cta.bulk_group",
    "cp.async.bulk.global.shared::cta.bulk_group: copy nbytes from smem over gmem (dq_claim's first writer).")


@cute.jit
def wait_for_turn(sem_ptr: cute.Pointer, turn: Int32) -> None:
    """Spin (acquire loads, GPU scope) until the dQ tile's semaphore reaches this contributor's turn."""
    cur = cute.arch.load(sem_ptr, Int32, sem="acquire", scope="gpu")
    while cur != turn:
        cur = cute.arch.load(sem_ptr, Int32, sem="acquire", scope="gpu")


def rotate_start(n, n_tiles, m_tiles):
    """det_schedule="rotate": the Q tile (relative to m_block_min) that K/V tile n of N walks first among M. N <= M:
    floor(n M / N), so that the walks reach each Q tile M / N steps apart (hd128: 80-row Q tiles under 128-key tiles,
    1.6 steps; (192, 128): 2) and a dQ turn hand-off (bulk-reduce completion, fence, release, the next CTA's acquire)
    has that long before the next CTA needs it; N > M: n mod M (ties broken by n). Integer arithmetic without a
    branch: the same code runs on Python ints (tests/test_det_schedule.py) and on Int32 in the kernel."""
    spread = _imin(_imax(m_tiles - n_tiles + 1, 0), 1)  # 1 when N <= M
    return spread * (n * m_tiles // n_tiles) + (1 - spread) * (n % m_tiles)


def rotate_turn_base(n, a, n_tiles, m_tiles):
    """det_schedule="rotate": the per-CTA part of rotate_turn, (q, rem, base, spread, n) for rotate_turn_at.
    N > M (starts a = n mod M): q, rem = divmod(N, M) and base = n // M - C(a + 1), where C(x) = q * x + min(x, rem)
    counts the contributors n' in [0, N) with n' mod M < x. N <= M (``spread``, starts floor(n M / N), distinct and
    increasing in n): rotate_turn_at needs only n."""
    q = n_tiles // m_tiles
    rem = n_tiles - q * m_tiles
    spread = _imin(_imax(m_tiles - n_tiles + 1, 0), 1)
    return q, rem, n // m_tiles - q * (a + 1) - _imin(a + 1, rem), spread, n


def rotate_turn_at(r, a, n_tiles, m_tiles, q, rem, base, spread, n):
    """det_schedule="rotate": contributor n's turn on Q tile r (relative to m_block_min) given rotate_turn_base.
    K/V tile n (start a = rotate_start) reaches tile r at step s_n = (r - a) mod M; its turn is the number of
    contributors n' with (s_n', n') < (s_n, n). Starts n mod M (N > M): those with a residue a' in a+1 .. a+s_n
    (mod M), C(r + 1) - C(a + 1) plus N if that range wraps past M - 1 (r < a), and the n // M of its own residue below
    it (in ``base``). Starts floor(n' M / N) (N <= M): the starts in a+1 .. r (a <= r) or a+1 .. M-1 and 0 .. r
    (r < a), i.e. S(r) - (n + 1) (+ N when r < a) with S(r) = ceil((r + 1) N / M) starts <= r.
    ``min(max(a - r, 0), 1)`` is 1 exactly when r < a."""
    wrap = n_tiles * _imin(_imax(a - r, 0), 1)
    by_residue = base + q * (r + 1) + _imin(r + 1, rem)
    by_spread = ((r + 1) * n_tiles + m_tiles - 1) // m_tiles - (n + 1)
    return spread * by_spread + (1 - spread) * by_residue + wrap


def rotate_turn(n, r, n_tiles, m_tiles):
    """Arrival rank of K/V tile n (of N = n_tiles) at Q tile r (of M = m_tiles) when tile n walks from
    rotate_start(n), ties (equal starts, N > M) broken by n': a permutation of 0..N-1 over n at each r
    (tests/test_det_schedule.py)."""
    a = rotate_start(n, n_tiles, m_tiles)
    return rotate_turn_at(r, a, n_tiles, m_tiles, *rotate_turn_base(n, a, n_tiles, m_tiles))


def det_diag_turn(n, group, tile_n, causal_off, n_tiles):
    """Deterministic diag_align (causal "spt" turns per 8-row group): K/V tile n's turn on the dQ rows
    [8 group, 8 group + 8). Tile n walks from row q_base(n) = floor8(max(0, n tile_n - causal_off)), so the tiles
    that add into the group are those with q_base(n') <= 8 group, i.e. n' < C = ceil((8 group + 8 + causal_off) /
    tile_n) (at most n_tiles); they take their turns from the diagonal-most (least work, launched first) down:
    turn = C - 1 - n. Python ints (tests/test_bwd_det_diag_align.py) or Int32 (only where 8 group + 8 + causal_off
    > n tile_n >= 0: the groups tile n visits)."""
    count = _imin((group * 8 + 8 + causal_off + tile_n - 1) // tile_n, n_tiles)
    return count - 1 - n


def stream_unit_count(r0, unit_rows: int, causal: bool, causal_off, tile_n: int, n_tiles):
    """stream_post: how many K/V tiles reduce into the dQ rows [r0, r0 + unit_rows) (a unit whose rows start below
    seqlen_q), i.e. the count the postprocess waits for. Every K/V tile walks every Q tile (non-causal), or causal
    (bottom-right) tile n's walk starts at the unit holding row max(0, n tile_n - causal_off), whole tiles or 8-row
    groups, and runs to seqlen_q: n counts iff n tile_n - causal_off < r0 + unit_rows. Python ints
    (tests/test_bwd_stream_post.py) or Int32 (bwd_post.py)."""
    if not causal:
        return n_tiles
    return _imin(_imax((r0 + unit_rows + causal_off + tile_n - 1) // tile_n, 0), n_tiles)


def _imin(x, y):
    """min of two integers: Python's on ints, cutlass.min on the kernel's Int32 values."""
    if isinstance(x, int) and isinstance(y, int):
        return min(x, y)
    return cutlass.min(x, y)


def _imax(x, y):
    """max of two integers: Python's on ints, cutlass.max on the kernel's Int32 values."""
    if isinstance(x, int) and isinstance(y, int):
        return max(x, y)
    return cutlass.max(x, y)


class BwdDqWriter:
    """dQ writer warp and deterministic turns, mixed into FlashBwdSm90."""

    # ---------------------------------------------------------------------------------------------
    @cute.jit
    def dq_writer(self, mdQaccum, mSem, sdQ_raw, work, step0=None):
        """Warp 1: bulk-reduce each warpgroup's fp32 dQ chunk into dQaccum (in semaphore order if deterministic).
        Varlen: dQaccum (h, total_q_pad, d) and the semaphores (h, total_q_pad / tile_m) at the sequence's padded Q
        tiles (pad_tile + m_block). two_cta: CTA ``rank`` of the pair owns half of each Q tile's rows, its own slot
        (m_block * 2 + rank: chunks 2 * rank + w of the tile) and semaphore; its turns are counted over the pairs.
        ``step0`` (persistent, one call per K/V tile): the hand-offs of the CTA's earlier tiles, for the staging buffer
        index."""
        lane = cute.arch.lane_idx()
        mdQ2 = self.dq_accum_rows(mdQaccum, work)
        causal_off = work.seqlen_k - work.seqlen_q
        rot = self.det_rotate_base(work)
        # deterministic: each step's turn is computed during the previous step's reductions (rotate_turn_at divides),
        # not between the previous release and this step's acquire
        turn = Int32(0)
        if const_expr(self.deterministic):
            turn = self.det_turn(work, self.m_block_at(work.m_block_min, work), rot, causal_off)
        # deterministic with two staging buffers: the next Q tile's buffer (that of the tile before this one, whose
        # reductions completed before this tile's turn) is handed back as soon as this tile's reductions are issued,
        # so the MMA warps store the next tile's dQ while this one's complete, are fenced and released
        # (AttnConfig.bwd_dq_stages given: _set_dq_stages; the 64-row tiles' two buffers by the rule keep the old order)
        early = self.dq_stages_set and self.deterministic and self.dq_stages == 2 and self.dq_pieces == 1
        # lpt turns with that early hand-back: each tile's semaphore is released one tile later, once the next tile's
        # reductions are issued, so its completion wait runs while the MMA warps compute instead of before the next
        # turn (deferred_release's docstring says why no CTA can wait forever)
        defer = self.deferred_release()
        prev_m = Int32(0)
        for m_iter in cutlass.range(work.m_block_min, work.m_block_max, unroll=1):
            m_block = self.m_block_at(m_iter, work)
            acc_block, sem_ptr = self.dq_slot(mSem, work, m_block)
            for p in cutlass.range_constexpr(self.dq_pieces):
                # hand-off slot of this piece: dq_pieces per Q tile, dq_stages buffers
                step = m_iter - work.m_block_min
                if const_expr(step0 is not None):
                    step = step + step0
                buf = ((step * self.dq_pieces + p) % self.dq_stages) * self.num_mma_wg * self.dq_chunk
                for w in cutlass.range_constexpr(self.num_mma_wg):
                    if const_expr(not self.deterministic or p > 0):
                        # this buffer's previous chunks (dq_stages hand-offs ago) have been read; dq_chunk_release:
                        # only chunk w (committed num_mma_wg - 1 - w groups before the later hand-offs' ones)
                        pending = self.num_mma_wg * (self.dq_stages - 1)
                        if const_expr(self.dq_chunk_release):
                            pending += self.num_mma_wg - 1 - w
                        cute.arch.cp_async_bulk_wait_group(pending, read=True)
                    cute.arch.sync_warp()
                    if const_expr(early):
                        if m_iter == work.m_block_min:  # (later tiles: handed back early, below)
                            cute.arch.barrier_arrive(barrier_id=_BAR_DQ_EMPTY + w, number_of_threads=160)
                    else:
                        cute.arch.barrier_arrive(barrier_id=_BAR_DQ_EMPTY + w, number_of_threads=160)
                if const_expr(self.deterministic and p == 0):
                    self.det_wait(sem_ptr, turn, work, m_block)
                if const_expr(self.dq_claim):  # first writer per unit stores, the others add after it (_set_dq_claim)
                    self.claim_tile(mdQ2, mSem, sdQ_raw + buf, work, acc_block, m_block)
                else:
                    for w in cutlass.range_constexpr(self.num_mma_wg):
                        cute.arch.barrier(barrier_id=_BAR_DQ_FULL + w, number_of_threads=160)
                        if lane == 0:  # (elect.sync here, straight-line SASS, measured ~3% slower at hd64 on the H200)
                            if const_expr(self.dq_turn0_store):  # deterministic: turn 0 stores (_set_dq_claim)
                                self.turn0_op(self.dq_chunk_gptr(mdQ2, work, acc_block, m_block, w, p),
                                              sdQ_raw + (buf + w * self.dq_chunk), turn)
                            else:
                                bulk_reduce_add_f32(self.dq_chunk_gptr(mdQ2, work, acc_block, m_block, w, p),
                                                    sdQ_raw + (buf + w * self.dq_chunk), self.dq_chunk * 4)
                            cute.arch.cp_async_bulk_commit_group()
                if const_expr(early):
                    if m_iter + 1 < work.m_block_max:
                        if const_expr(defer):  # the buffer handed back is the previous tile's: its reductions read it
                            if lane == 0:
                                cute.arch.cp_async_bulk_wait_group(self.num_mma_wg, read=True)
                        cute.arch.sync_warp()
                        for w in cutlass.range_constexpr(self.num_mma_wg):
                            cute.arch.barrier_arrive(barrier_id=_BAR_DQ_EMPTY + w, number_of_threads=160)
            if const_expr(self.deterministic):
                if m_iter + 1 < work.m_block_max:
                    turn = self.det_turn(work, self.m_block_at(m_iter + 1, work), rot, causal_off)
                if const_expr(defer):
                    if m_iter > work.m_block_min:  # the previous tile: every group but this tile's complete
                        if lane == 0:
                            cute.arch.cp_async_bulk_wait_group(self.num_mma_wg, read=False)
                            cute.arch.fence_acq_rel_gpu()
                            self.det_release(self.dq_slot(mSem, work, prev_m)[1], work, prev_m)
                    prev_m = m_block
                else:
                    if lane == 0:
                        cute.arch.cp_async_bulk_wait_group(0, read=False)
                        cute.arch.fence_acq_rel_gpu()
                        self.det_release(sem_ptr, work, m_block)
                cute.arch.sync_warp()
        if const_expr(defer):  # the walk's last tile
            if work.m_block_min < work.m_block_max:
                if lane == 0:
                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                    cute.arch.fence_acq_rel_gpu()
                    self.det_release(self.dq_slot(mSem, work, prev_m)[1], work, prev_m)
                cute.arch.sync_warp()
        cute.arch.cp_async_bulk_wait_group(0, read=True)
        if const_expr(self.stream_pre):  # (deterministic: det_release has counted)
            # the walk's reductions complete: count its units (_set_stream_post). After the read wait above: counting
            # before it changed how ptxas scheduled the MMA warps' loop at hd128 non-causal (497 -> 491 instructions)
            if work.m_block_min < work.m_block_max:
                if const_expr(self.dq_claim):  # (claim_ops: any lane may have issued a unit's reduce-add)
                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                else:
                    if lane == 0:
                        cute.arch.cp_async_bulk_wait_group(0, read=False)
                cute.arch.sync_warp()
                cute.arch.fence_acq_rel_gpu()
                self.stream_count(mSem, work)

    @cute.jit
    def dq_writer_pair(self, mdQaccum, mSem, sdQ_raw, work, half):
        """``det_two_writers`` (deterministic only): writer warp ``half`` (warp 1 + half) takes the loop steps
        m_block_min + half, + 2, ... (dq_writer's turns, dQaccum slots, semaphores and bulk reductions, varlen and
        two_cta included; the MMA warps' hand-off unchanged). Per step: its turn (acquire spin, while the other writer
        may still be on the previous step), the other writer's token (it has passed the previous step's dQFull, so the
        two never share a dQFull generation, and has seen its reductions READ the staging buffer), dQFull and the bulk
        reduce-adds, then as soon as they have READ the buffer: dQEmpty for the next step and this writer's token;
        only then the wait for the reductions to COMPLETE, the fence and the semaphore release.

        dq_writer frees the buffer of step i + 1 only after step i's release, so the MMA warps, at their dQ store,
        wait for a completion (one staging buffer at the default tiles; with two, dq_writer's det loop still arrives
        on dQEmpty only at the top of the next step); here they wait for a read, and the completions of two
        consecutive steps overlap (one per writer). Buffers: with dq_stages == 2 step i uses buffer i mod 2, i.e.
        writer h always buffer h; the buffer of step i + 1 was last read by step i - 1 (one buffer: by step i),
        before the token (or this writer's own wait) that precedes the dQEmpty arrive.

        Bitwise the same dQaccum as dq_writer, by construction: the MMA warps store the same fp32 fragments in the
        same fragment order, every (Q tile, chunk) is reduced by one bulk reduce-add of the same bytes to the same
        address, and a CTA issues a tile's reduction only on its turn and releases the turn only after the
        reduction has completed and been fenced, as before; so each dQaccum element receives the same fp32 adds in
        the same (turn) order. The two writers of a CTA touch different Q tiles (different addresses), so their
        overlap orders nothing that the adds depend on. Deadlock-free where dq_writer is: between a step's
        reductions and its release a writer only arrives on barriers (never blocks), a release never waits on
        anything but its own completion, and every other wait of the single-writer order is kept or weakened
        (dQEmpty after the read instead of after the release; a turn no longer after the CTA's previous release)."""
        m_block_min, m_block_max = work.m_block_min, work.m_block_max
        lane = cute.arch.lane_idx()
        mdQ2 = self.dq_accum_rows(mdQaccum, work)
        causal_off = work.seqlen_k - work.seqlen_q
        rot = self.det_rotate_base(work)
        buf = 0  # one staging buffer; two: step i in buffer i mod 2, writer h's steps all in buffer h
        if const_expr(self.dq_stages > 1):
            buf = half * (self.num_mma_wg * self.dq_chunk)
        if half == 0:
            if m_block_min < m_block_max:  # the first hand-off's buffer
                for w in cutlass.range_constexpr(self.num_mma_wg):
                    cute.arch.barrier_arrive(barrier_id=_BAR_DQ_EMPTY + w, number_of_threads=160)
        # each step's turn is computed during this writer's previous step's reductions (rotate_turn_at divides)
        turn = self.det_turn(work, self.m_block_at(m_block_min + half, work), rot, causal_off)
        for m_iter in cutlass.range(m_block_min + half, m_block_max, 2, unroll=1):
            m_block = self.m_block_at(m_iter, work)
            acc_block, sem_ptr = self.dq_slot(mSem, work, m_block)
            self.det_wait(sem_ptr, turn, work, m_block)
            if m_iter > m_block_min:  # the other writer has passed the previous step's dQFull
                if half == 0:
                    cute.arch.barrier(barrier_id=_BAR_DQ_TOKEN + 1, number_of_threads=64)
                else:
                    cute.arch.barrier(barrier_id=_BAR_DQ_TOKEN, number_of_threads=64)
            for w in cutlass.range_constexpr(self.num_mma_wg):
                cute.arch.barrier(barrier_id=_BAR_DQ_FULL + w, number_of_threads=160)
                if lane == 0:
                    if const_expr(self.dq_turn0_store):  # turn 0 stores (_set_dq_claim)
                        self.turn0_op(self.dq_chunk_gptr(mdQ2, work, acc_block, m_block, w, 0),
                                      sdQ_raw + (buf + w * self.dq_chunk), turn)
                    else:
                        bulk_reduce_add_f32(self.dq_chunk_gptr(mdQ2, work, acc_block, m_block, w, 0),
                                            sdQ_raw + (buf + w * self.dq_chunk), self.dq_chunk * 4)
                    cute.arch.cp_async_bulk_commit_group()
            if lane == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.sync_warp()
            if m_iter + 1 < m_block_max:  # the buffer to the MMA warps, the token to the other writer
                for w in cutlass.range_constexpr(self.num_mma_wg):
                    cute.arch.barrier_arrive(barrier_id=_BAR_DQ_EMPTY + w, number_of_threads=160)
                if half == 0:
                    cute.arch.barrier_arrive(barrier_id=_BAR_DQ_TOKEN, number_of_threads=64)
                else:
                    cute.arch.barrier_arrive(barrier_id=_BAR_DQ_TOKEN + 1, number_of_threads=64)
            if m_iter + 2 < m_block_max:
                turn = self.det_turn(work, self.m_block_at(m_iter + 2, work), rot, causal_off)
            if lane == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=False)
                cute.arch.fence_acq_rel_gpu()
                self.det_release(sem_ptr, work, m_block)
            cute.arch.sync_warp()

    def deferred_release(self) -> bool:
        """Deterministic "lpt" turns (K/V tile order) with the two-buffer early hand-back (dq_writer's ``early``), one
        writer, no turn-0 store: the writer releases tile m's semaphore after issuing tile m + 1's reductions (their
        commit groups stay in flight; a wait for all but them completes tile m's), and the last tile's after the walk.
        Why: with the release right after each completion, the writer sat in every tile's completion wait, fence and
        release before the next turn (H200 hd64, one K/V tile per head so that no turn waits: the deterministic kernel
        0.958x the default, official FA4's 0.975x its own; session_ab/bwd64_det_cost_one_kv_tile.jsonl). Same turns,
        so the same sums in the same order: dQ bitwise as before (H200: bitwise equal to the previous kernel on seven
        shapes, 17 to 8k rows, s_q != s_k, fp16, causal lpt; 1.006x / 1.008x its speed at hd64 non-causal 8k / 16k,
        p20-p80 1.000-1.010 / 0.996-1.027: session_ab/bwd64_det_deferred_release.jsonl). So the writer's completion
        wait was a small part of the deterministic cost. No CTA waits forever: CTA n's turn on a tile needs
        CTA n - 1's release of it, which now needs n - 1's turn on its next tile, i.e. n - 2's release, ..., down to
        K/V tile 0, which never waits; lpt launches n - 1 before n. A CTA then trails its predecessor by one tile
        instead of one hand-off (a fill paid once per head, in the first wave)."""
        return (self.deterministic and self.det_lpt and self.dq_stages_set and self.dq_stages == 2
                and self.dq_pieces == 1 and not self.dq_turn0_store and not self.det_diag and not self.det_two_writers)

    @cute.jit
    def det_wait(self, sem_ptr, turn: Int32, work, m_block: Int32) -> None:
        """Spin until it is this CTA's turn on Q tile ``m_block``'s dQ (then the whole warp goes on): lane 0 on the
        tile's semaphore; deterministic diag_align, lane i < tile_m / 8 on the semaphore of the tile's 8-row group i
        (``turn``: that lane's, det_turn), the groups at or past seqlen_q skipped (their rows are padding: no turns)."""
        lane = cute.arch.lane_idx()
        if const_expr(self.det_diag):
            if lane < self.tile_m // 8:
                if work.q_base + m_block * self.tile_m + lane * 8 < work.seqlen_q:
                    wait_for_turn(sem_ptr + lane, turn)
        else:
            if lane == 0:
                wait_for_turn(sem_ptr, turn)
        cute.arch.sync_warp()

    @cute.jit
    def det_release(self, sem_ptr, work, m_block: Int32) -> None:
        """The next turn on Q tile ``m_block``'s dQ (one thread, after its reductions completed and a GPU-scope fence:
        the fence and these relaxed adds make a release, one MEMBAR.GPU; red.release would add one per add): its
        semaphore, or with det_diag each of its 8-row groups' before seqlen_q."""
        if const_expr(self.det_diag):
            row0 = work.q_base + m_block * self.tile_m
            for i in cutlass.range_constexpr(self.tile_m // 8):
                if row0 + i * 8 < work.seqlen_q:
                    cute.arch.red(sem_ptr + i, Int32(1), op="add", dtype="s32", sem="relaxed", scope="gpu")
        else:
            cute.arch.red(sem_ptr, Int32(1), op="add", dtype="s32", sem="relaxed", scope="gpu")

    @cute.jit
    def stream_count(self, mSem, work) -> None:
        """stream_post (the writer warp, after the walk's reductions completed and a GPU-scope fence): add 1 to the
        count of each ``sem_rows`` unit the walk covers below seqlen_q (relaxed adds, lanes over the units; the fence
        makes them a release for the postprocess's acquire loads). The walk's Q tiles (in whatever order m_block_at
        takes them) are the contiguous range m_block_min .. m_block_max - 1, from row q_base (diag_align)."""
        lane = cute.arch.lane_idx()
        base = mSem.iterator + cute.crd2idx((0, work.head, work.batch), mSem.layout)
        u0, u1 = work.m_block_min, work.m_block_max
        if const_expr(self.sem_rows == 8):
            u0 = (work.q_base + work.m_block_min * self.tile_m) // 8
            u1 = (cutlass.min(work.q_base + work.m_block_max * self.tile_m, work.seqlen_q) + 7) // 8
        for u in cutlass.range(u0 + lane, u1, 32, unroll=1):
            cute.arch.red(base + u, Int32(1), op="add", dtype="s32", sem="relaxed", scope="gpu")

    @cute.jit
    def claim_tile(self, mdQ2, mSem, sbuf, work, acc_block: Int32, m_block: Int32) -> None:
        """dq_claim (FlashBwdSm90._set_dq_claim): this Q tile's dQ chunks (staging buffer ``sbuf``) into dQaccum, which
        the preprocess did not zero. Lane u < units claims unit u of the tile (atomic CAS 0 -> 1 on its state, after
        the stream counters in mSem); the claimed units get bulk stores, and once those have completed, a GPU-scope
        fence and state 2 release them. Only then (holding no claim, so no two writers can wait on each other) the
        lanes of the other units spin (acquire loads) until their claimants' state is 2, and their units get bulk
        reduce-adds. A chunk whose units all go one way is one bulk op from lane 0; else one op per unit (its
        ``slab``: 8 rows, contiguous in the fragment order of dQ^T chunks). Every lane commits a group after each
        chunk, so the top of the next step's read wait counts the same groups in every lane."""
        lane = cute.arch.lane_idx()
        units = self.tile_m // self.sem_rows
        full = (1 << units) - 1
        base = mSem.iterator + cute.crd2idx((0, work.head, work.batch), mSem.layout)
        u0 = m_block
        if const_expr(self.sem_rows == 8):
            u0 = (work.q_base + m_block * self.tile_m) // 8
        state = base + (mSem.shape[0] // 2 + u0 + lane)
        mine = Int32(0)  # 1: this lane's unit claimed by this CTA
        if lane < units:
            if cute.arch.atomic_cas(state, cmp=Int32(0), val=Int32(1), sem="relaxed", scope="gpu") == Int32(0):
                mine = Int32(1)
        mask = cute.arch.vote_ballot_sync(mine == Int32(1))
        if mask != 0:
            for w in cutlass.range_constexpr(self.num_mma_wg):
                cute.arch.barrier(barrier_id=_BAR_DQ_FULL + w, number_of_threads=160)
                self.claim_ops(mdQ2, sbuf, work, acc_block, m_block, w, mask, mine, True)
            cute.arch.cp_async_bulk_wait_group(0, read=False)
            cute.arch.fence_acq_rel_gpu()
            if mine == Int32(1):
                cute.arch.store(state, Int32(2), sem="relaxed", scope="gpu")
        if mask != full:
            if lane < units:
                if mine == Int32(0):
                    cur = cute.arch.load(state, Int32, sem="acquire", scope="gpu")
                    while cur != Int32(2):
                        cur = cute.arch.load(state, Int32, sem="acquire", scope="gpu")
            cute.arch.sync_warp()
            for w in cutlass.range_constexpr(self.num_mma_wg):
                if mask == 0:
                    cute.arch.barrier(barrier_id=_BAR_DQ_FULL + w, number_of_threads=160)
                self.claim_ops(mdQ2, sbuf, work, acc_block, m_block, w, full - mask, Int32(1) - mine, False)

    @cute.jit
    def turn0_op(self, gptr, sptr, turn: Int32) -> None:
        """dq_turn0_store (deterministic): one dQ chunk's bulk op, a store on the tile's turn 0 (its first
        contributor, before any other by the turns; the preprocess did not zero dQaccum), else a reduce-add."""
        if turn == 0:
            bulk_store_f32(gptr, sptr, self.dq_chunk * 4)
        else:
            bulk_reduce_add_f32(gptr, sptr, self.dq_chunk * 4)

    @cute.jit
    def claim_ops(self, mdQ2, sbuf, work, acc_block: Int32, m_block: Int32, w: cutlass.Constexpr[int], sel, lane_sel,
                  store: cutlass.Constexpr[bool]) -> None:
        """claim_tile's bulk ops of chunk w for the units in bitmask ``sel`` (``lane_sel``: this lane's unit is in
        it): stores or reduce-adds, the whole chunk from lane 0 when ``sel`` holds every unit, else one per unit;
        then every lane commits its group."""
        lane = cute.arch.lane_idx()
        units = self.tile_m // self.sem_rows
        slab = self.dq_chunk // units
        gptr = self.dq_chunk_gptr(mdQ2, work, acc_block, m_block, w, 0)
        sptr = sbuf + w * self.dq_chunk
        if sel == (1 << units) - 1:
            if lane == 0:
                if const_expr(store):
                    bulk_store_f32(gptr, sptr, self.dq_chunk * 4)
                else:
                    bulk_reduce_add_f32(gptr, sptr, self.dq_chunk * 4)
        else:
            if lane < units:
                if lane_sel == Int32(1):
                    if const_expr(store):
                        bulk_store_f32(gptr + lane * slab, sptr + lane * slab, slab * 4)
                    else:
                        bulk_reduce_add_f32(gptr + lane * slab, sptr + lane * slab, slab * 4)
        cute.arch.cp_async_bulk_commit_group()

    @property
    def det_diag(self) -> bool:
        """Deterministic with diag_align: one dQ semaphore per 8 Q rows (FlashBwdSm90._set_diag_align)."""
        return self.diag_align and self.deterministic

    @property
    def sem_rows(self) -> int:
        """Q rows per dQ semaphore (or stream_post counter): a Q tile's, or 8 where the tiles of different CTAs overlap
        (diag_align: det_diag, stream_post)."""
        return 8 if self.diag_align and (self.deterministic or self.stream_post) else self.tile_m

    def dq_accum_rows(self, mdQaccum, work):
        """This CTA's (head, batch) of dQaccum as one contiguous (padded Q rows, d) tensor (chunks back to back);
        varlen: the head's (total_q padded, d)."""
        if const_expr(self.varlen):
            return mdQaccum[work.head, None, None]
        return mdQaccum[None, None, work.head, work.batch]

    def dq_slot(self, mSem, work, m_block):
        """(acc_block, sem_ptr): Q tile ``m_block``'s slot in dQaccum and its semaphore (varlen: the sequence's padded
        tile; two_cta: the pair's tile m_block * 2 + rank, the CTA's rows)."""
        acc_block = m_block
        if const_expr(self.varlen):
            acc_block = m_block + work.pad_tile
            sem_ptr = mSem.iterator + cute.crd2idx((work.head, acc_block), mSem.layout)
        elif const_expr(self.two_cta):
            acc_block = m_block * self.cluster + work.rank
            sem_ptr = mSem.iterator + cute.crd2idx((acc_block, work.head, work.batch), mSem.layout)
        elif const_expr(self.det_diag):  # the tile's first 8-row group (its rows start at a multiple of 8)
            group = (work.q_base + m_block * self.tile_m) // 8
            sem_ptr = mSem.iterator + cute.crd2idx((group, work.head, work.batch), mSem.layout)
        else:
            sem_ptr = mSem.iterator + cute.crd2idx((m_block, work.head, work.batch), mSem.layout)
        return acc_block, sem_ptr

    def dq_chunk_gptr(self, mdQ2, work, acc_block, m_block, w: int, p: int):
        """Where chunk w * dq_pieces + p of a Q tile goes in dQaccum: columns [(w * dq_pieces + p) * dq_n, ...) of
        slot ``acc_block``; diag_align: chunk-major, chunk w of the tile at Q row q_base + m_block * tile_m."""
        if const_expr(self.diag_align):
            return mdQ2.iterator + (w * mdQ2.shape[0] + work.q_base + m_block * self.tile_m) * self.dq_shape[0]
        return mdQ2.iterator + ((acc_block * self.num_mma_wg + w) * self.dq_pieces + p) * self.dq_chunk

    def det_rotate_base(self, work):
        """det_rotate: this CTA's (M, q, rem, base) of rotate_turn (M >= 1 guards the divisions); else None."""
        if const_expr(not self.det_rotate):
            return None
        m_tiles = cutlass.max(work.m_block_max - work.m_block_min, Int32(1))
        group = work.n_block
        if const_expr(self.cluster > 1):  # two_cta (hd256): the pair walks and takes turns as one contributor
            group = work.n_block // self.cluster
        return (m_tiles, *rotate_turn_base(group, work.m_rot, work.num_groups, m_tiles))

    @cute.jit
    def det_turn(self, work, m_block: Int32, rot, causal_off: Int32) -> Int32:
        """This CTA's turn on Q tile ``m_block``'s dQ semaphore (deterministic): two_cta, the pair n_block // 2 (turns
        over the pairs); det_rotate, the arrival order of the rotated walks (``rot``: det_rotate_base); else
        dq_turn."""
        n_block, num_groups, mc, tn = work.n_block, work.num_groups, self.cluster, self.tile_n
        if const_expr(self.det_rotate):  # (two_cta at hd256 too: ``rot`` is the pair's)
            turn = rotate_turn_at(m_block - work.m_block_min, work.m_rot, num_groups, *rot)
        elif const_expr(self.det_diag):
            turn = det_diag_turn(n_block, (work.q_base + m_block * self.tile_m) // 8 + cute.arch.lane_idx(), tn,
                                 causal_off, num_groups)
        elif const_expr(self.two_cta):
            turn = self.dq_turn(n_block // mc, m_block, mc * tn, causal_off, num_groups)
        else:
            turn = self.dq_turn(n_block, m_block, tn, causal_off, num_groups)
        return turn

    @cute.jit
    def dq_turn(self, idx: Int32, m_block: Int32, cols_per_group: cutlass.Constexpr[int], causal_off: Int32,
                num_groups: Int32) -> Int32:
        """This contributor's turn on a dQ tile: its K/V group index (naive), or for causal shortest-processing-
        time first, the reverse over the groups that see this Q tile (the diagonal-most, least-work group first)."""
        turn = idx
        if const_expr(self.has_window):
            # the K/V tiles n_lo .. n_hi-1 visit this Q tile (m_block_visitors inverts their m_block ranges exactly)
            n_lo, n_hi = m_block_visitors(m_block, self.tile_m, cols_per_group, causal_off, num_groups, self.causal,
                                          self.window_left, self.window_right)
            turn = idx - n_lo
            if const_expr(self.spt):
                turn = n_hi - 1 - idx
        elif const_expr(self.spt):
            g_max = cute.ceil_div((m_block + 1) * self.tile_m + causal_off, cols_per_group)
            if g_max > num_groups:
                g_max = num_groups
            turn = g_max - 1 - idx
        return turn
