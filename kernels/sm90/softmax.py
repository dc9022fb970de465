"""Online softmax of the sm90 forward kernel, on one thread's rows of a wgmma S accumulator.

Every statistic is kept per thread for its rows (a quad of 4 lanes shares a row; row maxima are
quad-reduced each block, row sums only at the end). Scale is folded into the log2 domain:
P = 2^(S * scale_log2 - m * scale_log2), one FFMA per element before MUFU.EX2; on the emulated fragments
that FFMA is the software exp2's first instruction (exp2_poly_affine: u = sat(S * a + b) with per-row b).

``rescale_threshold`` tau (log2 units, compile time): with tau > 0 a warp keeps its stale row maxima unless
some row of the warp would grow by more than tau (a vote over the warp, so the branch is warp-uniform);
only then are the maxima replaced and O / row sums rescaled. P is then bounded by 2^tau. tau == 0 compiles
the classic always-rescale path (no vote). The final normalisation uses the row sums that match the kept
maxima, so the output and LSE are exact either way.

Softcap (compile time, FlashAttention / Gemma semantics: scores softcap * tanh(q.k * scale / softcap)):
``apply_softcap`` turns S into tanh(S * scale / softcap) in place (one FMUL and one MUFU.TANH per element, before
the mask); the softmax then runs with scale_log2 = softcap * log2(e), so P, the row maxima and the LSE are those of
the capped scores.
"""
from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .exp2 import affine_args, exp2_mufu, exp2_poly_affine
from .layout import acc_as_a_operand, acc_rows_cols

LN2 = math.log(2.0)


def _add(a, b):
    return a + b


def _chains(n_cols: int) -> int:
    """Independent partials per row reduction (short dependency chains): 4, 2 or 1, whichever divides the columns."""
    return 4 if n_cols % 4 == 0 else (2 if n_cols % 2 == 0 else 1)


def _tree(vals: list, op):
    """Pairwise (tree) reduction of a Python list of DSL values (plain Python: unrolled at trace time)."""
    while len(vals) > 1:
        vals = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)] + ([vals[-1]] if len(vals) % 2 else [])
    return vals[0]


@cute.jit
def quad_allreduce_max(x: Float32) -> Float32:
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))


@cute.jit
def quad_allreduce_sum(x: Float32) -> Float32:
    x = x + cute.arch.shuffle_sync_bfly(x, offset=2)
    return x + cute.arch.shuffle_sync_bfly(x, offset=1)


@cute.jit
def _quad_max_if(lazy: cutlass.Constexpr[bool], new_max: cute.Tensor, n_rows: cutlass.Constexpr[int]) -> None:
    """lazy_max, in the rescale arm (warp-uniform): the thread's maxima (already >= the kept row maxima) reduced over
    the quad, as the eager path does before the decision; fmax is exact, so the order does not change the values."""
    if const_expr(lazy):
        for r in cutlass.range_constexpr(n_rows):
            new_max[r] = quad_allreduce_max(new_max[r])


@cute.jit
def _take_new_max(row_max: cute.Tensor, new_max: cute.Tensor, row_scale: cute.Tensor, scale_log2: Float32,
                  n_rows: cutlass.Constexpr[int]) -> None:
    """Adopt the new row maxima; row_scale = 2^((m_old - m_new) * scale_log2), the factor O and the row sum need."""
    for r in cutlass.range_constexpr(n_rows):
        m_old = row_max[r]
        m_new = new_max[r]
        m_new_s = Float32(0.0) if m_new == -Float32.inf else m_new * scale_log2
        row_scale[r] = exp2_mufu(m_old * scale_log2 - m_new_s)
        row_max[r] = m_new


@cute.jit
def online_softmax_step(
    acc_S: cute.Tensor,
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    row_scale: cute.Tensor,
    scale_log2: Float32,
    tau: cutlass.Constexpr[float],
    emu_frags: cutlass.Constexpr[tuple],
    poly: cutlass.Constexpr[tuple],
    is_first: cutlass.Constexpr[bool],
    exp_in_branch: cutlass.Constexpr[bool] = False,
    pin_sums: cutlass.Constexpr[bool] = False,
    head_cols: cutlass.Constexpr[int] = 0,
    m_scaled: cute.Tensor = None,
    pv_done=None,
    lazy_max: cutlass.Constexpr[bool] = False,
    sums: cutlass.Constexpr[bool] = True,
) -> Boolean:
    """Exponentiate acc_S in place (P, unnormalised) and update row_max / row_sum.

    Returns whether O must be rescaled by row_scale (always True when tau == 0 or on the first block,
    where O is still zero and nothing is rescaled).

    ``exp_in_branch`` (tau > 0, not the first block): the exponentials and row sums are computed inside each arm of the
    warp's rescale decision (two copies) instead of after it. Same arithmetic, same results; the point is the code's
    shape: the caller's wait for its in-flight P V GEMM follows the exponentials in the next basic block, where ptxas
    leaves it, instead of being hoisted by ptxas to the top of the block that holds them (which makes the warp wait for
    P V before its first exponential: no softmax / P V overlap within the warpgroup).

    ``head_cols`` > 0 (AttnConfig.pv_wait_mid; tau > 0, not the first block): only the first ``head_cols`` columns of
    every row are exponentiated here, inside both arms of the rescale decision (the rows' offsets max * scale_log2 go to
    ``m_scaled``); the caller then waits for its in-flight P V, releases the V stage and finishes the block with
    ``online_softmax_finish`` (the other columns, the row sums). ptxas keeps that wait at the top of the block after
    the arms, i.e. after the head exponentials (official FA4's SASS waits after 11 of its 66), not above all of them.

    ``pv_done`` (AttnConfig.early_v_release; not the first block, not with exp_in_branch / head_cols): a callable run once
    after the row maxima and before the rescale decision: the caller's wait for its in-flight P V GEMM and the release
    of that GEMM's V stage. ptxas keeps the wait where it is (a few instructions above its default place, the top of the
    block after the decision) and the release with it, before the block's exponentials; written after the decision, in
    the exponentials' block, the release is scheduled by ptxas after them (63 of 66), as the default's is.

    ``lazy_max`` (AttnConfig.lazy_row_max; tau > 0, not the first block): the rescale decision reads each thread's own
    maxima (a row grows by more than tau iff one of its lanes' columns does, so the warp's vote is the same), and the
    quad's shuffles run only in the rescale arm, where the new maxima are needed; the arm that keeps the maxima, nearly
    every block after the first few, has none. Same values, bitwise the same output.

    ``sums`` False (AttnConfig.row_sum_mma): no row sums here (no FADD per element); the caller's P V chain sums P's rows
    on the tensor cores instead (a wgmma against a ones tile), and row_sum is left untouched.
    """
    s = acc_rows_cols(acc_S)
    n_rows = cute.size(s, mode=[0])
    n_cols = cute.size(s, mode=[1])
    new_max = cute.make_rmem_tensor(row_max.layout, Float32)
    k = _chains(n_cols)
    lazy = lazy_max and not is_first and tau != 0.0  # new_max holds the thread's own maxima until the rescale arm
    for r in cutlass.range_constexpr(n_rows):
        m = _row_max(s, r, k)
        if const_expr(not lazy):
            m = quad_allreduce_max(m)
        if const_expr(not is_first):
            m = cute.arch.fmax(m, row_max[r])
        new_max[r] = m
    if const_expr(pv_done is not None):
        pv_done()
    do_rescale = Boolean(True)
    if const_expr(is_first):
        for r in cutlass.range_constexpr(n_rows):
            row_max[r] = new_max[r]
            row_scale[r] = Float32(1.0)
    elif const_expr(tau == 0.0):
        _take_new_max(row_max, new_max, row_scale, scale_log2, n_rows)
    else:
        grow = Boolean(False)
        for r in cutlass.range_constexpr(n_rows):
            grow = grow | ((new_max[r] - row_max[r]) * scale_log2 > Float32(tau))
        do_rescale = cute.arch.vote_any_sync(grow)
        if const_expr(head_cols > 0):
            if do_rescale:
                _quad_max_if(lazy, new_max, n_rows)
                _take_new_max(row_max, new_max, row_scale, scale_log2, n_rows)
                _exp_head(s, row_max, m_scaled, scale_log2, emu_frags, poly, head_cols)
            else:
                _exp_head(s, row_max, m_scaled, scale_log2, emu_frags, poly, head_cols)
            return do_rescale
        if const_expr(exp_in_branch):
            if do_rescale:
                _quad_max_if(lazy, new_max, n_rows)
                _take_new_max(row_max, new_max, row_scale, scale_log2, n_rows)
                _exp_rows(s, row_max, row_sum, row_scale, scale_log2, emu_frags, poly, k, 1 if sums else 0)
            else:
                _exp_rows(s, row_max, row_sum, row_scale, scale_log2, emu_frags, poly, k, 2 if sums else 0)
            return do_rescale
        if do_rescale:
            _quad_max_if(lazy, new_max, n_rows)
            _take_new_max(row_max, new_max, row_scale, scale_log2, n_rows)
    for r in cutlass.range_constexpr(n_rows):
        acc = _exp_row(s, r, row_max, scale_log2, emu_frags, poly, k, sums)
        if const_expr(sums):
            if const_expr(is_first):
                if const_expr(pin_sums):
                    acc = pin_f32(acc)
                row_sum[r] = acc
            else:
                _add_row_sum(row_sum, row_scale, r, acc, tau, do_rescale, pin_sums)
    return do_rescale


@cute.jit
def _add_row_sum(row_sum: cute.Tensor, row_scale: cute.Tensor, r: cutlass.Constexpr[int], acc: Float32,
                 tau: cutlass.Constexpr[float], do_rescale: Boolean, pin_sums: cutlass.Constexpr[bool]):
    """Row ``r``'s sum after a later block: row_sum * row_scale + acc when the warp rescaled (always at tau 0),
    row_sum + acc when it kept its maxima; ``pin_sums``: acc pinned first (pin_f32)."""
    if const_expr(pin_sums):
        acc = pin_f32(acc)
    if const_expr(tau == 0.0):
        row_sum[r] = row_sum[r] * row_scale[r] + acc
    else:
        if do_rescale:
            row_sum[r] = row_sum[r] * row_scale[r] + acc
        else:
            row_sum[r] = row_sum[r] + acc


@cute.jit
def _exp_row(s: cute.Tensor, r: cutlass.Constexpr[int], row_max: cute.Tensor, scale_log2: Float32,
             emu_frags: cutlass.Constexpr[tuple], poly: cutlass.Constexpr[tuple], k: cutlass.Constexpr[int],
             sums: cutlass.Constexpr[bool] = True, pin_max: cutlass.Constexpr[bool] = False):
    """Row ``r`` of ``s`` (the (rows, cols) view) to P = 2^(S * scale_log2 - row_max[r] * scale_log2) in place (the
    FMA-pipe polynomial on the ``emu_frags`` fragments, MUFU.EX2 elsewhere); returns the row's sum (k independent
    partials, tree-added; None without ``sums``). An empty row (max -inf) is offset by 0. ``pin_max``: the offset from
    a pinned copy of the maximum (pin_f32), so that LLVM does not share its multiply with a later rescale's
    m_old * scale_log2 - m_new_s, which it would then round as FMUL + FADD instead of the eager step's FFMA."""
    m = pin_f32(row_max[r]) if const_expr(pin_max) else row_max[r]
    m_s = Float32(0.0) if m == -Float32.inf else m * scale_log2
    _exp_cols(s, r, m_s, scale_log2, emu_frags, poly, 0, cute.size(s, mode=[1]))
    total = None
    if const_expr(sums):
        total = _row_sum(s, r, k)
    return total


@cute.jit
def _exp_cols(s: cute.Tensor, r: cutlass.Constexpr[int], m_s: Float32, scale_log2: Float32,
              emu_frags: cutlass.Constexpr[tuple], poly: cutlass.Constexpr[tuple], lo: cutlass.Constexpr[int],
              hi: cutlass.Constexpr[int]):
    """Columns lo .. hi-1 of row ``r`` of ``s`` to 2^(S * scale_log2 - m_s) in place (``m_s``: the row's offset, 0 for
    an empty row; the polynomial on the ``emu_frags`` fragments, MUFU.EX2 elsewhere)."""
    n_frag = cute.size(s, mode=[1]) // 2
    if const_expr(len(emu_frags) > 0):
        # the polynomial's first FFMA takes the scale and the row offset itself (and clamps with .sat)
        a, b = affine_args(scale_log2, m_s)
        for c in cutlass.range_constexpr(lo, hi):
            if const_expr((c // 2) % n_frag in emu_frags):
                s[r, c] = exp2_poly_affine(s[r, c], a, b, poly)
            else:
                s[r, c] = exp2_mufu(s[r, c] * scale_log2 - m_s)
    else:
        for c in cutlass.range_constexpr(lo, hi):
            s[r, c] = exp2_mufu(s[r, c] * scale_log2 - m_s)


@cute.jit
def _row_sum(s: cute.Tensor, r: cutlass.Constexpr[int], k: cutlass.Constexpr[int]):
    """Sum of row ``r`` of ``s``: k independent partials in column order, tree-added."""
    part = [s[r, j] for j in range(k)]
    for c in cutlass.range_constexpr(k, cute.size(s, mode=[1])):
        part[c % k] = part[c % k] + s[r, c]
    return _tree(part, _add)


def _sum_chains(s: cute.Tensor, r: cutlass.Constexpr[int], k: cutlass.Constexpr[int], lo: cutlass.Constexpr[int],
                hi: cutlass.Constexpr[int], part):
    """_row_sum's k partials of row ``r`` carried over columns lo .. hi-1 (``part`` None: started at lo, hi - lo >= k);
    the tree of the partials after the last column is _row_sum, bit for bit."""
    assert part is not None or hi - lo >= k, (lo, hi, k)
    if part is None:
        part, lo = [s[r, lo + j] for j in range(k)], lo + k
    else:
        part = list(part)
    for c in range(lo, hi):
        part[c % k] = part[c % k] + s[r, c]
    return part


@cute.jit
def _row_max(s: cute.Tensor, r: cutlass.Constexpr[int], k: cutlass.Constexpr[int]):
    """This thread's maximum of row ``r`` of ``s``: k independent partials in column order, tree-reduced."""
    part = [s[r, j] for j in range(k)]
    for c in cutlass.range_constexpr(k, cute.size(s, mode=[1])):
        part[c % k] = cute.arch.fmax(part[c % k], s[r, c])
    return _tree(part, cute.arch.fmax)


@cute.jit
def _exp_head(s: cute.Tensor, row_max: cute.Tensor, m_scaled: cute.Tensor, scale_log2: Float32,
              emu_frags: cutlass.Constexpr[tuple], poly: cutlass.Constexpr[tuple], head_cols: cutlass.Constexpr[int]):
    """pv_wait_mid, inside an arm of the rescale decision: every row's offset max * scale_log2 (0 for an empty row) into
    ``m_scaled``, and its first ``head_cols`` columns exponentiated."""
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        m_scaled[r] = Float32(0.0) if row_max[r] == -Float32.inf else row_max[r] * scale_log2
        _exp_cols(s, r, m_scaled[r], scale_log2, emu_frags, poly, 0, head_cols)


@cute.jit
def online_softmax_finish(acc_S: cute.Tensor, row_sum: cute.Tensor, row_scale: cute.Tensor, m_scaled: cute.Tensor,
                          scale_log2: Float32, do_rescale: Boolean, tau: cutlass.Constexpr[float],
                          emu_frags: cutlass.Constexpr[tuple], poly: cutlass.Constexpr[tuple],
                          head_cols: cutlass.Constexpr[int], pin_sums: cutlass.Constexpr[bool],
                          sums: cutlass.Constexpr[bool] = True):
    """pv_wait_mid, after the caller's wait for its P V: the columns of every row past ``head_cols`` exponentiated (the
    offsets ``online_softmax_step`` left in ``m_scaled``) and the row sums updated as the default does (same partials,
    same order: row_sum * row_scale + sum when the warp rescaled, row_sum + sum when it kept its maxima)."""
    s = acc_rows_cols(acc_S)
    n_cols = cute.size(s, mode=[1])
    k = _chains(n_cols)
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        _exp_cols(s, r, m_scaled[r], scale_log2, emu_frags, poly, head_cols, n_cols)
        if const_expr(sums):
            _add_row_sum(row_sum, row_scale, r, _row_sum(s, r, k), tau, do_rescale, pin_sums)


@cute.jit
def _exp_rows(s: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, row_scale: cute.Tensor, scale_log2: Float32,
              emu_frags: cutlass.Constexpr[tuple], poly: cutlass.Constexpr[tuple], k: cutlass.Constexpr[int],
              sum_mode: cutlass.Constexpr[int]):
    """exp_in_branch: P = 2^(S * scale_log2 - m * scale_log2) in place for the rows of ``s`` (the (rows, cols) view),
    and the row sums: sum_mode 1 row_sum * row_scale + sum (the maxima were just replaced), 2 row_sum + sum (kept),
    0 none (row_sum_mma)."""
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        acc = _exp_row(s, r, row_max, scale_log2, emu_frags, poly, k, sum_mode != 0)
        if const_expr(sum_mode == 1):
            row_sum[r] = row_sum[r] * row_scale[r] + acc
        elif const_expr(sum_mode == 2):
            row_sum[r] = row_sum[r] + acc


@cute.jit
def exp_kept_max(acc_S: cute.Tensor, row_max: cute.Tensor, scale_log2: Float32, emu_frags: cutlass.Constexpr[tuple],
                 poly: cutlass.Constexpr[tuple], partial: cute.Tensor, limit: cutlass.Constexpr[float],
                 pin: cutlass.Constexpr[bool] = False, mid=None) -> Boolean:
    """speculative_exp (tau > 0, a later block): P = 2^(S * scale_log2 - m * scale_log2) in place with the kept row
    maxima m -- the eager step's keep arm, the same arithmetic -- and each row's partial sum into ``partial`` (the
    same partials, the same order), with no maximum taken. Returns whether this thread saw a row whose partial sum
    exceeds ``limit`` (just under 2^tau: every P <= it, so no column grew by tau and the eager step would keep the
    maxima too), that has no maximum yet (-inf), or a NaN sum. ``pin``: the sums pinned (pin_f32) where they are
    computed; unpinned, the hd256 kernel computes them a second time after the vote (36 FADDs more on its common
    path; CPU SASS, session 51). ``mid(n)`` (qk_halves: S's second half still in flight): called with n = 1 between
    the exponentials of the first half of the columns and the rest (the wait for that half), the sums carried in the
    same order; with n = 0 instead if the first half holds a NaN (the block is redone)."""
    s = acc_rows_cols(acc_S)
    k = _chains(cute.size(s, mode=[1]))
    redo = Boolean(False)
    if const_expr(mid is not None):
        n, offsets, chains = cute.size(s, mode=[1]), [], []
        nan0 = Boolean(False)
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            m = pin_f32(row_max[r])
            offsets.append(Float32(0.0) if m == -Float32.inf else m * scale_log2)
            _exp_cols(s, r, offsets[r], scale_log2, emu_frags, poly, 0, n // 2)
            chains.append(_sum_chains(s, r, k, 0, n // 2, None))
            h0 = _tree(list(chains[r]), _add)
            nan0 = nan0 | (h0 != h0)
        # a branch on the first half's P, with a different wait in each arm: ptxas hoists a wait above independent
        # work inside a block (then the first half's exponentials wait for the second half of S too), and LLVM would
        # hoist two equal waits above the branch. A NaN among them (only from NaN inputs) redoes the block anyway.
        if cute.arch.vote_any_sync(nan0):
            mid(0)
            for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
                partial[r] = Float32(math.nan)
        else:
            mid(1)
            for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
                _exp_cols(s, r, offsets[r], scale_log2, emu_frags, poly, n // 2, n)
                partial[r] = _tree(_sum_chains(s, r, k, n // 2, n, chains[r]), _add)
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        if const_expr(mid is None):
            partial[r] = _exp_row(s, r, row_max, scale_log2, emu_frags, poly, k, True, True)
        if const_expr(pin):
            partial[r] = pin_f32(partial[r])
        redo = redo | (partial[r] > Float32(limit)) | (partial[r] != partial[r]) | (row_max[r] == -Float32.inf)
    return redo


@cute.jit
def p_exceeds(acc_S: cute.Tensor, row_max: cute.Tensor, partial: cute.Tensor,
              limit: cutlass.Constexpr[float]) -> Boolean:
    """speculative_exp's second look, after a partial sum of the warpgroup passed ``limit``: whether this thread holds
    a P (from exp_kept_max) above ``limit`` itself, a row with no maximum yet or a NaN sum. Sums over many columns
    pass the limit while every P stays below it (scores that climb by less than tau along the visit order); then the
    eager step too keeps every maximum, and the block needs no second QK^T."""
    s = acc_rows_cols(acc_S)
    k = _chains(cute.size(s, mode=[1]))
    over = Boolean(False)
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        over = (over | (_row_max(s, r, k) > Float32(limit)) | (partial[r] != partial[r])
                | (row_max[r] == -Float32.inf))
    return over


@cute.jit
def s_exceeds(acc_S: cute.Tensor, row_max: cute.Tensor, scale_log2: Float32, partial: cute.Tensor,
              limit: cutlass.Constexpr[float]) -> Boolean:
    """p_exceeds from the block's S instead of its P (AttnConfig.spec_warp_redo: P's fp32 values are gone by the vote):
    whether a row's largest S * scale_log2 - m * scale_log2, the exponent of its largest P, passes log2(limit) (the
    limit's margin covers the exponential's rounding), a row has no maximum yet, or a sum is NaN."""
    s = acc_rows_cols(acc_S)
    k = _chains(cute.size(s, mode=[1]))
    over = Boolean(False)
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        x = _row_max(s, r, k) * scale_log2 - row_max[r] * scale_log2
        over = over | (x > Float32(math.log2(limit))) | (partial[r] != partial[r]) | (row_max[r] == -Float32.inf)
    return over


@dsl_user_op
def warpgroup_any(pred: Boolean, bar_id, n_threads: int, *, loc=None, ip=None) -> Boolean:
    """Whether ``pred`` holds in any thread of the ``n_threads`` that meet at named barrier ``bar_id`` (an Int32,
    warp-uniform; barrier.cta.red.or: a barrier, so every one of them must call it)."""
    r = llvm.inline_asm(
        T.i32(), [Int32(pred).ir_value(loc=loc, ip=ip), Int32(bar_id).ir_value(loc=loc, ip=ip)],
        "{ .reg .pred p, q; setp.ne.u32 p, $1, 0; barrier.cta.red.or.pred q, $2, " + f"{n_threads}"
        + ", p; selp.u32 $0, 1, 0, q; }", "=r,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return Int32(r) != Int32(0)


@cute.jit
def rescale_o(acc_O: cute.Tensor, row_scale: cute.Tensor):
    o = acc_rows_cols(acc_O)
    for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
        for c in cutlass.range(cute.size(o, mode=[1]), unroll_full=True):
            o[r, c] = o[r, c] * row_scale[r]


@cute.jit
def finalize(row_max: cute.Tensor, row_sum: cute.Tensor, scale_log2: Float32, inv_sum: cute.Tensor, lse: cute.Tensor,
             quad: cutlass.Constexpr[bool] = True):
    """inv_sum = 1 / (quad-reduced row sum) (0 for empty rows); lse = natural-log LSE (-inf for empty rows).
    ``quad`` False: row_sum already holds whole rows (row_sum_mma: the tensor cores' sums)."""
    for r in cutlass.range_constexpr(cute.size(row_sum)):
        total = row_sum[r]
        if const_expr(quad):
            total = quad_allreduce_sum(row_sum[r])
        empty = (total == Float32(0.0)) | (total != total)
        inv_sum[r] = Float32(0.0) if empty else cute.arch.rcp_approx(total)
        m_s = Float32(0.0) if row_max[r] == -Float32.inf else row_max[r] * scale_log2
        lse[r] = -Float32.inf if empty else (m_s + cute.math.log2(total, fastmath=True)) * Float32(LN2)


@cute.jit
def apply_softcap(acc_S: cute.Tensor, softcap_mul: Float32):
    """acc_S <- tanh(acc_S * softcap_mul) in place (softcap_mul = softmax_scale / softcap; MUFU.TANH)."""
    s = acc_rows_cols(acc_S)
    for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
        for c in cutlass.range(cute.size(s, mode=[1]), unroll_full=True):
            s[r, c] = cute.math.tanh(s[r, c] * softcap_mul, fastmath=True)


@dsl_user_op
def cvt_pair_asm(lo: Float32, hi: Float32, bf16: cutlass.Constexpr[bool], *, loc=None, ip=None) -> Uint32:
    """One 32-bit word holding (lo, hi) rounded to bf16 (``bf16``) or fp16, lo in the low half: one F2FP, written as
    inline PTX so that LLVM sees an opaque value rather than a cast (see ``store_p_asm``)."""
    op = "cvt.rn.bf16x2.f32" if bf16 else "cvt.rn.f16x2.f32"
    return Uint32(
        llvm.inline_asm(
            T.i32(), [Float32(lo).ir_value(loc=loc, ip=ip), Float32(hi).ir_value(loc=loc, ip=ip)],
            f"{op} $0, $2, $1;", "=r,f,f",
            has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def pin_f32(x: Float32, *, loc=None, ip=None) -> Float32:
    """``x`` through an empty side-effecting inline PTX move: LLVM keeps the computation of ``x`` before this point
    (it cannot sink it into a later block); ptxas sees a plain register copy and schedules freely."""
    return Float32(
        llvm.inline_asm(
            T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=f,f",
            has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def store_p_asm(acc_S: cute.Tensor, tOrP: cute.Tensor, bf16: cutlass.Constexpr[bool]):
    """P (fp32 S accumulator, exponentiated) -> tOrP (the P V GEMM's 16-bit A fragment), word by word with
    ``cvt_pair_asm``: the same values as ``tOrP.store(acc_as_a_operand(acc_S).load().to(dtype))``.

    Why (AttnConfig.p_cvt_asm): LLVM folds a loop-carried phi of two identical casts (the conversion before the main
    loop and the one at the end of its body) into one cast after the phi, i.e. into the loop header, before the next
    QK^T issue; with tau > 0 the body ends with the O-rescale branch, so ptxas keeps all 32 conversions after it, after
    the last exponential. Opaque conversions are not folded: they stay where they are written, in the block of the
    exponentials, where ptxas interleaves them with the MUFU work."""
    src = acc_as_a_operand(acc_S)
    n = cute.size(tOrP)
    words = cute.make_tensor(cute.recast_ptr(tOrP.iterator, dtype=Uint32), cute.make_layout(cute.cosize(tOrP.layout) // 2))
    for i in cutlass.range_constexpr(0, n, 2):
        off = cute.crd2idx(i, tOrP.layout)
        assert off % 2 == 0 and cute.crd2idx(i + 1, tOrP.layout) == off + 1, "P fragment: value pairs not in one word"
        words[off // 2] = cvt_pair_asm(src[i], src[i + 1], bf16)
