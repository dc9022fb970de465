"""The FA4 attention algorithm as a plain-PyTorch model (CPU or GPU), plus exact and naive references.

* ``attention_exact``  -- plain math at fp64 (or fp32): the oracle for error measurements.
* ``attention_naive``  -- plain PyTorch at the input dtype: the "same-dtype PyTorch" error of the
  DESIGN.md correctness rule.
* ``attention_model``  -- the FA4 forward tile by tile, as the kernels do it, and its FA backward:
  - scores in the log2 domain: s2 = (q.k) * softmax_scale * log2(e), fp32 accumulation;
  - key blocks of ``tile_n`` columns visited in the kernels' order (last block first, as the
    FlashAttention kernels do; causal rows tiles skip blocks right of their diagonal);
  - online softmax with the rescale threshold tau: the running max stays stale unless a row's block
    max exceeds it by more than tau; the decision is uniform over a group of ``rescale_group`` rows
    (16 = the rows of a Hopper warp in a wgmma tile): if any row of the group needs it, the whole group
    takes the new max and rescales O and its row sums; otherwise nothing is rescaled;
  - P = exp2(s2 - m) through ``exp2_split`` (the configured, fragment-quantised share of each row
    on the FMA-pipe polynomial, the rest on the MUFU stand-in), row sums from fp32 P, P rounded
    to the input dtype before the P.V product (fp32 accumulation);
  - final normalisation O / l and lse = (m + log2 l) * ln 2 use the accumulated statistics, so the
    result does not depend on tau (up to rounding); fully masked rows give out 0 and lse -inf.
  Rows are vectorised (every row tile at once, in memory-bounded chunks); per-row state makes this
  identical to looping over row tiles. Backward recomputes P from the LSE with the same exp2 split.

Layout as flash_attn_func: q (batch, seqlen_q, heads, hdim), k/v (batch, seqlen_k, heads, hdim[_v]).
Causal masks are bottom-right aligned: query i sees keys j <= i + seqlen_k - seqlen_q.
``attention_exact`` and ``attention_naive`` also take FlashAttention's sliding window ``window_size=(left, right)``
(query i sees keys i + s_k - s_q - left .. i + s_k - s_q + right, -1 = unbounded, causal sets right to 0) and
``softcap`` (scores softcap * tanh(q.k * scale / softcap), applied before the mask); the tile model does not (yet).
"""
from __future__ import annotations

import math

import torch

from .config import DEFAULTS, SUPPORTED_HDIMS, AttnConfig, ConfigError
from .exp2_model import FRAGMENT_COLS, emulated_columns, exp2_split, quantized_fraction
from .validate import canonical_window, check_qkv, check_scale, check_softcap

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
MODEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
BLOCK_ORDERS = ("reverse", "forward")
_CHUNK_ELEMS = 1 << 24  # rows per chunk are chosen so batch*heads*rows*tile_n stays below this


def _scale(softmax_scale, hdim: int) -> float:
    check_scale(softmax_scale)
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(hdim)


def _causal_mask(sq: int, sk: int, row0: int, row1: int, col0: int, col1: int, device) -> torch.Tensor:
    """True where (row, col) is visible under the bottom-right causal mask."""
    r = torch.arange(row0, row1, device=device)[:, None]
    c = torch.arange(col0, col1, device=device)[None, :]
    return c <= r + (sk - sq)


def window_mask(sq: int, sk: int, causal: bool, window_size=(-1, -1), device=None) -> torch.Tensor | None:
    """(sq, sk) bool, True where query i may see key j under causal and the sliding window (FlashAttention
    semantics, bottom-right aligned: i + sk - sq - left <= j <= i + sk - sq + right; -1 = unbounded; causal: right 0).
    None when nothing is masked by construction (not causal, no window)."""
    causal, left, right = canonical_window(bool(causal), window_size)
    if not causal and left < 0 and right < 0:
        return None
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    diag = i + (sk - sq)
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if causal:
        ok = ok & (j <= diag)
    elif right >= 0:
        ok = ok & (j <= diag + right)
    if left >= 0:
        ok = ok & (j >= diag - left)
    return ok


def _scores(qf, kf, scale: float, sq: int, sk: int, causal: bool, window_size, softcap: float):
    """Scaled scores (b, h, sq, sk) with the softcap and the causal / window mask applied (-inf)."""
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if softcap > 0.0:
        s = torch.tanh(s / softcap) * softcap
    ok = window_mask(sq, sk, causal, window_size, s.device)
    if ok is not None:
        s = s.masked_fill(~ok, float("-inf"))
    return s


# ---------------------------------------------------------------------------------------------
# references
# ---------------------------------------------------------------------------------------------
def attention_exact(q, k, v, causal=False, softmax_scale=None, dtype=torch.float64, return_lse=False,
                    window_size=(-1, -1), softcap=0.0):
    """Plain softmax attention computed at ``dtype`` (fp64 default); out in ``dtype``, lse natural log.

    ``window_size`` / ``softcap``: FlashAttention's sliding window and logit softcap (see the module docstring).
    Differentiable; fully masked rows give out 0 and lse -inf with finite (zero) gradients.
    """
    check_qkv(q, k, v, dtypes=MODEL_DTYPES, hdim_pairs=None)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype={dtype}: attention_exact computes at torch.float32 or torch.float64")
    scale = _scale(softmax_scale, q.shape[-1])
    softcap = check_softcap(softcap)
    qf, kf, vf = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    s = _scores(qf, kf, scale, sq, sk, causal, window_size, softcap)
    m = s.detach().amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(dim=-1, keepdim=True)
    alive = l > 0
    p = e / torch.where(alive, l, torch.ones_like(l))
    out = torch.matmul(p, vf).transpose(1, 2)
    if not return_lse:
        return out
    lse = torch.where(alive, m + torch.log(torch.where(alive, l, torch.ones_like(l))),
                      torch.full_like(l, float("-inf"))).squeeze(-1)
    return out, lse


def attention_naive(q, k, v, causal=False, softmax_scale=None, return_lse=False, window_size=(-1, -1), softcap=0.0):
    """Plain PyTorch attention at the input dtype (scores, softmax and P.V all at q.dtype).

    This is ``out_pt`` of the DESIGN.md correctness rule. lse (fp32) is logsumexp at the input dtype.
    ``window_size`` / ``softcap`` as attention_exact.
    """
    check_qkv(q, k, v, dtypes=MODEL_DTYPES, hdim_pairs=None)
    scale = _scale(softmax_scale, q.shape[-1])
    softcap = check_softcap(softcap)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    s = _scores(qt, kt, scale, sq, sk, causal, window_size, softcap)
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # fully masked rows
    out = torch.matmul(p.to(v.dtype), vt).transpose(1, 2)
    if not return_lse:
        return out
    return out, torch.logsumexp(s, dim=-1).float()


# ---------------------------------------------------------------------------------------------
# the FA4 model
# ---------------------------------------------------------------------------------------------
def resolve_model_config(config: AttnConfig | None, hdim: int, causal: bool, arch: str = "sm90") -> AttnConfig:
    """Resolve ``config`` for the model; head dims outside the kernels' table borrow the nearest row's defaults."""
    if config is None:
        config = AttnConfig()
    if not isinstance(config, AttnConfig):
        raise ConfigError(f"config: expected kernels.AttnConfig or None, got {type(config).__name__}")
    table_hdim = hdim if hdim in SUPPORTED_HDIMS else min(SUPPORTED_HDIMS, key=lambda d: (abs(d - hdim), d))
    return config.resolve(arch, table_hdim, causal)


def _n_block_max(sq: int, sk: int, tile_m: int, tile_n: int, causal: bool) -> list[int]:
    """Per row tile, one past the last key block the kernel visits (0 = tile visits nothing)."""
    nk = math.ceil(sk / tile_n)
    out = []
    for mt in range(math.ceil(sq / tile_m)):
        if causal:
            last_row = min((mt + 1) * tile_m, sq) - 1
            end = last_row + sk - sq + 1  # keys [0, end) visible to the tile's last row
            out.append(max(0, min(nk, math.ceil(end / tile_n))))
        else:
            out.append(nk)
    return out


class _SpecVotes:
    """Counters of the sm90 forward's ``speculative_exp`` vote (kernels/sm90/fwd.py softmax_spec), modelled on the
    same blocks: a later block's P is taken with the kept maxima, each thread's partial row sums (its quad column
    class: columns c with (c // 2) % 4 equal, tile_n / 4 of them) tested against 2^tau (1 - 2^-6); a warpgroup (64
    rows) redoes the block when any of its threads sees a sum above that, a NaN, or a row with no maximum yet.
    A redo is *kept* (the eager step it falls back to rescales no row group of the warpgroup: the QK^T spent again for
    nothing) or not. Causal tiles run their diagonal blocks eagerly (no vote; the kernel's causal_split, which
    speculative_exp implies) and are counted only on their mask-free blocks. ``max_check`` counts the redos that the
    second vote, on the largest P in place of the sums, still takes (the kernel's). Only for tau > 0 without the exp2
    polynomial, as the kernel; also where 2^tau < tile_n, which the kernel refuses (ordinary blocks' sums pass the
    limit: the counts show it); fp32 sums, so near the limit a count can differ from the kernel's by a block."""

    WG_ROWS = 64
    # AttnConfig.spec_redo_budget values modelled alongside (the votes do not change the maxima or sums, so one pass
    # serves every budget): per budget, the blocks that take a second QK^T and the blocks run by the eager step once a
    # warpgroup's tile has spent its budget
    BUDGETS = (1, 2, 4)

    def __init__(self, tau: float, tile_n: int, group: int):
        self.limit = 2.0 ** tau * (1.0 - 2.0 ** -6)
        self.tile_n, self.group = tile_n, group
        self.blocks = self.rescale = self.redos = self.kept = self.max_check = 0
        self.budget_qk2 = dict.fromkeys(self.BUDGETS, 0)
        self.budget_eager = dict.fromkeys(self.BUDGETS, 0)
        self.left = {}

    def start_chunk(self) -> None:
        """A new chunk of Q tiles: every warpgroup's budget starts again (the kernel's counter is per tile)."""
        self.left = {}

    def block(self, s2, m, need, counted_g, ngroups: int, rows: int, eager_rows=None):
        """One key block of a row chunk: s2 (b, h, rows, cols) log2 scores (masked -inf), m the maxima kept before
        it, need the eager step's per-row rescale wish, counted_g (ngroups,) groups for which it is a later block,
        eager_rows (rows,) rows whose kernel step here is the eager one, no vote (causal: the tile's diagonal blocks,
        which the kernel's causal_split loop runs eagerly)."""
        b, h, _, cols = s2.shape
        finite = torch.isfinite(m)
        p = torch.exp2(s2 - torch.where(finite, m, torch.zeros_like(m))[..., None])
        p = torch.nn.functional.pad(p, (0, self.tile_n - cols))
        part = p.view(b, h, rows, self.tile_n // 8, 4, 2).sum(dim=(-3, -1))  # (b, h, rows, 4): a row's 4 threads
        row_redo = (part > self.limit).any(-1) | part.isnan().any(-1) | ~finite
        row_big = (p > self.limit).any(-1) | p.isnan().any(-1) | ~finite
        per_wg = self.WG_ROWS // self.group
        nwg = -(-ngroups // per_wg)
        pad = nwg * self.WG_ROWS - rows

        def by_wg(x):
            return torch.nn.functional.pad(x, (0, pad)).view(b, h, nwg, self.WG_ROWS).any(-1)

        counted = torch.nn.functional.pad(counted_g, (0, nwg * per_wg - ngroups)).view(nwg, per_wg).any(-1)
        if eager_rows is not None:
            counted = counted & ~torch.nn.functional.pad(eager_rows, (0, pad)).view(nwg, self.WG_ROWS).any(-1)
        redo = by_wg(row_redo) & counted
        self.blocks += int(counted.sum()) * b * h
        need_wg = by_wg(need)
        self.rescale += int((need_wg & counted).sum())
        self.redos += int(redo.sum())
        self.kept += int((redo & ~need_wg).sum())
        taken = redo & by_wg(row_big)  # the second QK^T the kernel takes
        self.max_check += int(taken.sum())
        for n in self.BUDGETS:
            left = self.left.setdefault(n, torch.full(taken.shape, n, dtype=torch.int32, device=taken.device))
            active = left > 0
            self.budget_qk2[n] += int((taken & active).sum())
            self.budget_eager[n] += int((counted & ~active).sum())
            left -= (taken & active).int()

    def stats(self) -> dict:
        share = (lambda n: n / self.blocks if self.blocks else 0.0)
        return dict(spec_blocks=self.blocks, spec_redos=self.redos, spec_redos_kept=self.kept,
                    spec_rescale_share=share(self.rescale), spec_redo_share=share(self.redos),
                    spec_kept_share=share(self.kept), spec_max_check_share=share(self.max_check),
                    **{f"spec_budget{n}_qk2_share": share(self.budget_qk2[n]) for n in self.BUDGETS},
                    **{f"spec_budget{n}_eager_share": share(self.budget_eager[n]) for n in self.BUDGETS})


def _model_forward(q, k, v, causal, scale, tile_m, tile_n, tau, fraction, group, fragment, order, stats):
    b, sq, h, d = q.shape
    sk, dv = k.shape[1], v.shape[-1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale_log2 = scale * LOG2E
    qf, kf, vf = (t.transpose(1, 2).to(acc) for t in (q, k, v))  # (b, h, s, d)
    out = torch.zeros(b, h, sq, dv, dtype=acc, device=q.device)
    lse_dtype = torch.float64 if acc == torch.float64 else torch.float32  # fp64 only for fp64 inputs (gradcheck)
    lse = torch.full((b, h, sq), float("-inf"), dtype=lse_dtype, device=q.device)
    nmax = _n_block_max(sq, sk, tile_m, tile_n, causal)
    emu_cols = emulated_columns(tile_n, fraction, fragment).to(q.device)
    done = skipped = 0
    emu_elems = valid_elems = 0
    spec = (_SpecVotes(tau, tile_n, group) if stats is not None and tau > 0 and fraction == 0.0
            and tile_m % _SpecVotes.WG_ROWS == 0 and _SpecVotes.WG_ROWS % group == 0 else None)
    tiles_per_chunk = max(1, _CHUNK_ELEMS // max(1, b * h * tile_m * tile_n))
    n_mt = len(nmax)
    for mt0 in range(0, n_mt, tiles_per_chunk):
        mt1 = min(n_mt, mt0 + tiles_per_chunk)
        r0, r1 = mt0 * tile_m, min(sq, mt1 * tile_m)
        rows = r1 - r0
        tile_nmax = torch.tensor(nmax[mt0:mt1], device=q.device)
        row_tile = (torch.arange(r0, r1, device=q.device) // tile_m) - mt0
        ngroups = math.ceil(rows / group)
        grp_tile = (torch.arange(ngroups, device=q.device) * group + r0) // tile_m - mt0
        qc = qf[:, :, r0:r1]
        m = torch.full((b, h, rows), float("-inf"), dtype=acc, device=q.device)
        l = torch.zeros((b, h, rows), dtype=acc, device=q.device)
        o = torch.zeros((b, h, rows, dv), dtype=acc, device=q.device)
        first = torch.ones(ngroups, dtype=torch.bool, device=q.device)  # group has not seen a block yet
        if spec is not None:
            spec.start_chunk()
        blocks = range(max(nmax[mt0:mt1]) if rows else 0)
        for j in (reversed(blocks) if order == "reverse" else blocks):
            c0, c1 = j * tile_n, min(sk, (j + 1) * tile_n)
            visited_g = j < tile_nmax[grp_tile]  # (ngroups,) the kernel processes block j for this group
            s2 = torch.matmul(qc, kf[:, :, c0:c1].transpose(-1, -2)) * scale_log2
            valid = (j < tile_nmax[row_tile])[:, None].expand(rows, c1 - c0)
            if causal:
                valid = valid & _causal_mask(sq, sk, r0, r1, c0, c1, q.device)
            all_valid = bool(valid.all())
            if not all_valid:
                s2 = s2.masked_fill(~valid, float("-inf"))
            bm = s2.amax(dim=-1)
            if tau > 0:
                need = bm > m + tau  # -inf > -inf is False: an all-masked block never asks for a rescale
            else:  # tau = 0: FA2/FA3 behaviour, rescale on every block (the factor is 1 where the max did not move)
                need = torch.ones_like(bm, dtype=torch.bool)
            pad = ngroups * group - rows
            need_g = torch.nn.functional.pad(need, (0, pad)).view(b, h, ngroups, group).any(dim=-1)
            counted = visited_g & ~first
            if spec is not None:
                eager_rows = None
                if causal:  # a tile's diagonal blocks (any masked entry): the kernel's eager loop
                    tile_masked = torch.zeros(mt1 - mt0, dtype=torch.int32, device=q.device).index_add_(
                        0, row_tile, (~valid).any(-1).int()) > 0
                    eager_rows = tile_masked[row_tile]
                spec.block(s2, m, need, counted, grp_tile.numel(), rows, eager_rows)
            done += int((need_g & counted).sum())
            skipped += int((~need_g & counted).sum())  # per (batch, head, group, block)
            first = first & ~visited_g
            upd = need_g.repeat_interleave(group, dim=-1)[..., :rows]
            m_new = torch.where(upd, torch.maximum(m, bm), m)
            corr = torch.where(m_new == m, torch.ones_like(m), torch.exp2(m - m_new))
            o = o * corr[..., None]
            l = l * corr
            m = m_new
            m_use = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            x = s2 - m_use[..., None]
            if acc == torch.float64 and fraction == 0.0:
                p = torch.exp2(x)
            else:
                p = exp2_split(x, fraction, fragment, tile_cols=tile_n).to(acc)
            l = l + p.sum(dim=-1)
            p_in = p.to(q.dtype).to(acc)  # P rounded to the input dtype before the PV product
            o = o + torch.matmul(p_in, vf[:, :, c0:c1])
            if all_valid:
                valid_elems += rows * (c1 - c0) * b * h
                emu_elems += rows * int(emu_cols[: c1 - c0].sum()) * b * h
            else:
                valid_elems += int(valid.sum()) * b * h
                emu_elems += int((valid & emu_cols[: c1 - c0]).sum()) * b * h
        alive = l > 0
        out[:, :, r0:r1] = o * (1.0 / torch.where(alive, l, torch.ones_like(l)))[..., None]
        lse[:, :, r0:r1] = torch.where(alive, (m + torch.log2(torch.where(alive, l, torch.ones_like(l)))) * LN2,
                                       torch.full_like(l, float("-inf"))).to(lse_dtype)
    if stats is not None:
        stats.update(rescales_done=done, rescales_skipped=skipped,
                     skipped_share=(skipped / (done + skipped)) if done + skipped else 0.0,
                     exp2_emulated_fraction=quantized_fraction(tile_n, fraction, fragment),
                     exp2_emulated_share=(emu_elems / valid_elems) if valid_elems else 0.0,
                     exp2_requested_fraction=float(fraction), tile_m=tile_m, tile_n=tile_n,
                     rescale_threshold=float(tau), rescale_group=group, block_order=order)
        stats.update(spec.stats() if spec is not None else {})
    return out.transpose(1, 2).to(q.dtype), lse


def _model_backward(q, k, v, out, lse, dout, dlse, causal, scale, tile_m, tile_n, fraction, fragment):
    b, sq, h, d = q.shape
    sk = k.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale_log2 = scale * LOG2E
    qf, kf, vf = (t.transpose(1, 2).to(acc) for t in (q, k, v))
    of, dof = out.transpose(1, 2).to(acc), dout.transpose(1, 2).to(acc)
    lse2 = lse.to(acc) * LOG2E
    lse2 = torch.where(torch.isinf(lse2), torch.zeros_like(lse2), lse2)
    dpsum = (dof * of).sum(dim=-1)  # D = rowsum(dO * O), the FA preprocess
    if dlse is not None:
        dpsum = dpsum - dlse.to(acc)  # d lse / d s = P: folds into dS = P * (dP - D + dlse)
    dq = torch.zeros_like(qf)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    nmax = _n_block_max(sq, sk, tile_m, tile_n, causal)
    row_tile = torch.arange(sq, device=q.device) // tile_m
    tile_nmax = torch.tensor(nmax, device=q.device)
    for j in range(max(nmax) if nmax else 0):
        c0, c1 = j * tile_n, min(sk, (j + 1) * tile_n)
        kj, vj = kf[:, :, c0:c1], vf[:, :, c0:c1]
        s2 = torch.matmul(qf, kj.transpose(-1, -2)) * scale_log2
        valid = (j < tile_nmax[row_tile])[:, None].expand(sq, c1 - c0)
        if causal:
            valid = valid & _causal_mask(sq, sk, 0, sq, c0, c1, q.device)
        x = (s2 - lse2[..., None]).masked_fill(~valid, float("-inf"))
        if acc == torch.float64 and fraction == 0.0:
            p = torch.exp2(x)
        else:
            p = exp2_split(x, fraction, fragment, tile_cols=tile_n).to(acc)
        dv[:, :, c0:c1] += torch.matmul(p.to(q.dtype).to(acc).transpose(-1, -2), dof)
        dp = torch.matmul(dof, vj.transpose(-1, -2))
        ds = p * (dp - dpsum[..., None])
        ds_in = ds.to(q.dtype).to(acc)  # dS rounded to the input dtype for the dQ / dK products
        dq += torch.matmul(ds_in, kj)
        dk[:, :, c0:c1] += torch.matmul(ds_in.transpose(-1, -2), qf)
    dq, dk, dv = dq * scale, dk * scale, dv
    return (dq.transpose(1, 2).to(q.dtype), dk.transpose(1, 2).to(k.dtype), dv.transpose(1, 2).to(v.dtype))


class _FA4Model(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, tile_m, tile_n, tau, fraction, group, fragment, order, stats):
        out, lse = _model_forward(q, k, v, causal, scale, tile_m, tile_n, tau, fraction, group, fragment, order, stats)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.params = (causal, scale, tile_m, tile_n, fraction, fragment)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, tile_m, tile_n, fraction, fragment = ctx.params
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = _model_backward(q, k, v, out, lse, dout, dlse, causal, scale, tile_m, tile_n, fraction, fragment)
        return (dq, dk, dv) + (None,) * 10


def attention_model(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False, return_stats=False,
                    *, arch="sm90", rescale_group=16, fragment=FRAGMENT_COLS, block_order="reverse"):
    """The FA4 algorithm tile by tile in plain PyTorch (see the module docstring); differentiable.

    ``config`` (AttnConfig or None) is resolved for (arch, hdim, causal): tile_m, tile_n,
    rescale_threshold (tau) and exp2_emu_fraction are honoured. Returns ``out`` (input dtype),
    then ``lse`` (batch, heads, seqlen_q) fp32 natural log if ``return_lse``, then a stats dict if
    ``return_stats``: rescales_done / rescales_skipped (per batch, head, row group and visited key
    block after the group's first), skipped_share, exp2_emulated_fraction (the quantised fraction of
    a full tile row), exp2_emulated_share (of the unmasked exponentials actually computed), and with tau > 0 and
    no exp2 emulation the speculative_exp vote's counters (_SpecVotes: spec_blocks, spec_redos, spec_redos_kept,
    spec_rescale_share, spec_redo_share, spec_kept_share, spec_max_check_share, and per spec_redo_budget B in
    _SpecVotes.BUDGETS spec_budget{B}_qk2_share / spec_budget{B}_eager_share; whatever the config's speculative_exp).
    """
    check_qkv(q, k, v, dtypes=MODEL_DTYPES, hdim_pairs=None)
    scale = _scale(softmax_scale, q.shape[-1])
    cfg = resolve_model_config(config, q.shape[-1], bool(causal), arch)
    if not isinstance(rescale_group, int) or rescale_group < 1 or cfg.tile_m % rescale_group:
        raise ConfigError(f"rescale_group={rescale_group!r}: must be a positive int dividing tile_m={cfg.tile_m}")
    if block_order not in BLOCK_ORDERS:
        raise ConfigError(f"block_order={block_order!r}: supported are {BLOCK_ORDERS}")
    stats = {} if return_stats else None
    out, lse = _FA4Model.apply(q, k, v, bool(causal), scale, cfg.tile_m, cfg.tile_n, float(cfg.rescale_threshold),
                               float(cfg.exp2_emu_fraction), rescale_group, fragment, block_order, stats)
    res = (out,)
    if return_lse:
        res += (lse,)
    if return_stats:
        stats["config"] = cfg.to_dict()
        res += (stats,)
    return res[0] if len(res) == 1 else res


__all__ = ["attention_exact", "attention_naive", "attention_model", "resolve_model_config", "window_mask", "DEFAULTS"]
