"""Tests of kernels/reference.py: the FA4 model against the fp64 reference (DESIGN.md rule), tau semantics,
rescale counting, masking, and the tile-by-tile backward (vs exact gradients and a float64 gradcheck)."""
import math
import zlib

import pytest
import torch

from kernels import AttnConfig, ConfigError, InputError
from kernels.exp2_model import quantized_fraction
from kernels.reference import attention_exact, attention_model, attention_naive

DTYPES = (torch.bfloat16, torch.float16)
LOG2E = math.log2(math.e)


def _inputs(b, sq, sk, h, d, dtype, seed, dv=None, requires_grad=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g).to(device, dtype)
    k = torch.randn(b, sk, h, d, generator=g).to(device, dtype)
    v = torch.randn(b, sk, h, dv or d, generator=g).to(device, dtype)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


def _late_max_inputs(b, sq, sk, h, d, dtype, seed, ramp=12.0):
    """Scores whose row max grows along the kernels' visit order (last key block first): a ramp toward key 0."""
    q, k, v = _inputs(b, sq, sk, h, d, torch.float32, seed)
    q[..., 0] = 1.0
    scale = 1.0 / math.sqrt(d)
    k[..., 0] += (ramp / (scale * LOG2E)) * torch.linspace(1.0, 0.0, sk)[None, :, None]
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _rule(x, x_pt, ref, dtype, ulps=1.0):
    """DESIGN.md rule: max|x-ref| <= 2*max|x_pt-ref| + atol (atol = ulps * eps(dtype) * max|ref|)."""
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(x), fin), "non-finite pattern differs from the reference"
    err = (x.double() - ref.double())[fin].abs().max().item()
    pt = (x_pt.double() - ref.double())[fin].abs().max().item()
    atol = ulps * torch.finfo(dtype).eps * ref.double()[fin].abs().max().item()
    assert err <= 2 * pt + atol, f"err {err:.3g} > 2*{pt:.3g} + {atol:.3g}"
    return err


CASES = [(256, 256), (200, 333), (333, 200), (77, 77)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", CASES)
def test_forward_matches_fp64_reference_every_tau_and_fraction(dtype, causal, sq, sk):
    seed = zlib.crc32(f"{dtype}{causal}{sq}{sk}".encode()) % 10_000
    q, k, v = _inputs(2, sq, sk, 2, 64, dtype, seed)
    ref, ref_lse = attention_exact(q, k, v, causal, return_lse=True)
    pt = attention_naive(q, k, v, causal)
    taus, fracs = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0), (0.0, 0.125, 0.25, 0.5, 1.0)
    # every tau (exact exp2), every fraction (tau 8), and the extreme corners
    combos = sorted({(t, 0.0) for t in taus} | {(8.0, f) for f in fracs} | {(0.0, 1.0), (16.0, 1.0), (2.0, 0.25)})
    for tau, frac in combos:
        cfg = AttnConfig(rescale_threshold=tau, exp2_emu_fraction=frac, tile_m=64, tile_n=64)
        out, lse = attention_model(q, k, v, causal, config=cfg, return_lse=True)
        assert out.dtype == dtype and out.shape == q.shape
        _rule(out, pt, ref, dtype)
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        fin = torch.isfinite(ref_lse)
        # lse is fp32 statistics: the only approximation left is the exp2 polynomial (~1e-4 relative per term)
        assert (lse.double() - ref_lse)[fin].abs().max().item() < 2e-4


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("hdim", [64, 128, 256])
def test_forward_default_config_per_hdim(dtype, hdim):
    q, k, v = _inputs(1, 300, 300, 2, hdim, dtype, hdim)
    ref = attention_exact(q, k, v, True)
    pt = attention_naive(q, k, v, True)
    out, stats = attention_model(q, k, v, True, return_stats=True)
    _rule(out, pt, ref, dtype)
    cfg = AttnConfig().resolve("sm90", hdim, True)
    assert stats["tile_n"] == cfg.tile_n and stats["rescale_threshold"] == cfg.rescale_threshold
    assert stats["exp2_emulated_fraction"] == quantized_fraction(cfg.tile_n, cfg.exp2_emu_fraction)


def _classic_online_softmax(q, k, v, causal, tile_n):
    """Independent FA2-style online softmax: same visit order (last key block first), rescale every block."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    s_log2 = 1.0 / math.sqrt(d) * LOG2E
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    m = torch.full((b, h, sq), float("-inf"))
    l = torch.zeros(b, h, sq)
    o = torch.zeros(b, h, sq, v.shape[-1])
    rows = torch.arange(sq)[:, None]
    for j in reversed(range(math.ceil(sk / tile_n))):
        cols = torch.arange(j * tile_n, min(sk, (j + 1) * tile_n))
        s = qf @ kf[:, :, cols].transpose(-1, -2) * s_log2
        if causal:
            s = s.masked_fill(cols[None, :] > rows + sk - sq, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.where(m_new == m, torch.ones_like(m), torch.exp2(m - m_new))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp2(s - m_safe[..., None])
        l = l * alpha + p.sum(-1)
        o = o * alpha[..., None] + p.to(q.dtype).float() @ vf[:, :, cols]
        m = m_new
    out = o / torch.where(l > 0, l, torch.ones_like(l))[..., None]
    return out.transpose(1, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal,sq,sk", [(False, 200, 333), (True, 333, 200), (True, 256, 256)])
def test_tau_zero_equals_classic_online_softmax(dtype, causal, sq, sk):
    q, k, v = _late_max_inputs(1, sq, sk, 2, 64, dtype, 3)
    cfg = AttnConfig(rescale_threshold=0.0, exp2_emu_fraction=0.0, tile_m=64, tile_n=64)
    out, stats = attention_model(q, k, v, causal, config=cfg, return_stats=True)
    classic = _classic_online_softmax(q, k, v, causal, 64)
    torch.testing.assert_close(out.float(), classic.to(dtype).float(), rtol=0, atol=torch.finfo(dtype).eps)
    assert stats["rescales_skipped"] == 0 and stats["rescales_done"] > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_tau_skips_rescales_and_keeps_the_output(dtype):
    q, k, v = _late_max_inputs(1, 512, 512, 2, 64, dtype, 5, ramp=12.0)
    ref = attention_exact(q, k, v)
    pt = attention_naive(q, k, v)
    shares = {}
    for tau in (0.0, 1.0, 4.0, 8.0, 16.0):
        cfg = AttnConfig(rescale_threshold=tau, exp2_emu_fraction=0.0, tile_m=128, tile_n=128)
        out, st = attention_model(q, k, v, config=cfg, return_stats=True)
        _rule(out, pt, ref, dtype)
        shares[tau] = st["skipped_share"]
        # per (batch, head, 16-row group, visited block after the first): 1 * 2 * 32 groups * 3 blocks
        assert st["rescales_done"] + st["rescales_skipped"] == 1 * 2 * 32 * 3
        if tau >= 4.0:  # the ramp climbs ~3 log2 units per 128-key block: tau >= 4 must skip some
            assert st["rescales_skipped"] > 0
    assert shares[0.0] == 0.0
    assert shares[1.0] <= shares[4.0] <= shares[8.0] <= shares[16.0]
    assert 0.0 < shares[4.0] < shares[8.0] < 1.0


def test_skips_on_gaussian_inputs_and_group_uniformity():
    q, k, v = _inputs(1, 512, 512, 2, 64, torch.bfloat16, 11)
    q = q * 2  # sharper rows: block maxima move by a few log2 units
    per_group = {}
    for group in (1, 16, 64):
        cfg = AttnConfig(rescale_threshold=1.0, exp2_emu_fraction=0.0, tile_m=128, tile_n=64)
        _, st = attention_model(q, k, v, config=cfg, return_stats=True, rescale_group=group)
        per_group[group] = st["skipped_share"]
        assert st["rescales_skipped"] > 0
    # a larger group rescales whenever any of its rows needs to: never skips a larger share
    assert per_group[1] >= per_group[16] >= per_group[64]
    assert per_group[1] > per_group[64]


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_fully_masked_rows_and_masked_entries(dtype):
    q, k, v = _inputs(1, 300, 130, 2, 64, dtype, 7)
    out, lse = attention_model(q, k, v, True, return_lse=True)
    dead = 300 - 130  # bottom-right causal: rows i < sq - sk see no key
    assert torch.all(out[:, :dead] == 0) and torch.all(torch.isneginf(lse[:, :, :dead]))
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, dead:]).all()
    # masked keys contribute exactly 0: huge values in keys a row cannot see change nothing for that row
    q2, k2, v2 = _inputs(1, 200, 200, 1, 64, dtype, 8)
    base = attention_model(q2, k2, v2, True)
    k3, v3 = k2.clone(), v2.clone()
    k3[:, 150:] = 30.0
    v3[:, 150:] = 1000.0
    moved = attention_model(q2, k3, v3, True)
    assert torch.equal(base[:, :150], moved[:, :150])


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal,sq,sk", [(False, 160, 160), (False, 97, 211), (True, 211, 97), (True, 128, 200)])
@pytest.mark.parametrize("tau,frac", [(0.0, 0.0), (8.0, 0.5), (4.0, 1.0)])
def test_backward_matches_exact_gradients(dtype, causal, sq, sk, tau, frac):
    q, k, v = _inputs(2, sq, sk, 2, 64, dtype, sq * 7 + sk, requires_grad=True)
    g = torch.Generator().manual_seed(1)
    do = torch.randn(q.shape, generator=g).to(dtype)
    ref = attention_exact(q, k, v, causal)
    g_ref = torch.autograd.grad(ref, (q, k, v), do.double())
    g_pt = torch.autograd.grad(attention_naive(q, k, v, causal), (q, k, v), do)
    cfg = AttnConfig(rescale_threshold=tau, exp2_emu_fraction=frac, tile_m=64, tile_n=64)
    g_m = torch.autograd.grad(attention_model(q, k, v, causal, config=cfg), (q, k, v), do)
    for name, a, p, r in zip(("dq", "dk", "dv"), g_m, g_pt, g_ref):
        assert a.dtype == dtype, name
        _rule(a, p, r, dtype)


def test_gradcheck_float64():
    cfg = AttnConfig(rescale_threshold=2.0, exp2_emu_fraction=0.0, tile_m=64, tile_n=16)
    g = torch.Generator().manual_seed(0)

    def mk(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(True)

    for causal, sq, sk in ((False, 5, 37), (True, 5, 37), (True, 6, 6)):
        q, k, v = mk(1, sq, 1, 8), mk(1, sk, 1, 8), mk(1, sk, 1, 4)
        assert torch.autograd.gradcheck(
            lambda q, k, v: attention_model(q, k, v, causal, config=cfg, return_lse=True), (q, k, v), fast_mode=True)
    # causal with seqlen_q > seqlen_k: fully masked rows (lse = -inf is not finite-differentiable; check out)
    q, k, v = mk(1, 9, 1, 8), mk(1, 5, 1, 8), mk(1, 5, 1, 8)
    assert torch.autograd.gradcheck(lambda q, k, v: attention_model(q, k, v, True, config=cfg), (q, k, v))


def test_lse_gradient_matches_exact():
    q, k, v = _inputs(1, 150, 190, 2, 64, torch.float32, 4, requires_grad=True)
    cfg = AttnConfig(rescale_threshold=8.0, exp2_emu_fraction=0.0, tile_m=64, tile_n=64)
    out, lse = attention_model(q, k, v, True, config=cfg, return_lse=True)
    w = torch.randn(lse.shape)
    g_m = torch.autograd.grad((lse * w).sum() + out.sum(), (q, k, v))
    out_r, lse_r = attention_exact(q, k, v, True, return_lse=True)
    g_r = torch.autograd.grad((lse_r * w.double()).sum() + out_r.sum(), (q, k, v))
    for a, r in zip(g_m, g_r):
        torch.testing.assert_close(a.double(), r.double(), rtol=1e-4, atol=1e-4)


def test_fp32_inputs_and_hdim_v():
    q, k, v = _inputs(1, 100, 140, 2, 192, torch.float32, 2, dv=128)
    out = attention_model(q, k, v, False, config=AttnConfig(exp2_emu_fraction=0.0))
    torch.testing.assert_close(out.double(), attention_exact(q, k, v, False), rtol=1e-5, atol=1e-5)


def test_errors_are_one_line_and_name_the_argument():
    q, k, v = _inputs(1, 16, 16, 1, 64, torch.bfloat16, 0)
    with pytest.raises(InputError, match="q: dtype"):
        attention_model(q.int(), k, v)
    with pytest.raises(InputError, match="rank"):
        attention_model(q[0], k, v)
    with pytest.raises(ConfigError, match="softmax_scale"):
        attention_model(q, k, v, softmax_scale=-1.0)
    with pytest.raises(ConfigError, match="rescale_group"):
        attention_model(q, k, v, rescale_group=7)
    with pytest.raises(ConfigError, match="block_order"):
        attention_model(q, k, v, block_order="random")
    with pytest.raises(ConfigError, match="config"):
        attention_model(q, k, v, config={"rescale_threshold": 1.0})


def test_block_order_forward_changes_stats_not_output():
    q, k, v = _late_max_inputs(1, 256, 512, 1, 64, torch.bfloat16, 9)
    cfg = AttnConfig(rescale_threshold=4.0, exp2_emu_fraction=0.0, tile_m=128, tile_n=128)
    o_r, s_r = attention_model(q, k, v, config=cfg, return_stats=True, block_order="reverse")
    o_f, s_f = attention_model(q, k, v, config=cfg, return_stats=True, block_order="forward")
    ref = attention_exact(q, k, v)
    _rule(o_r, attention_naive(q, k, v), ref, torch.bfloat16)
    _rule(o_f, attention_naive(q, k, v), ref, torch.bfloat16)
    # the ramp peaks at key 0: visited last in reverse order (rescales), first in forward order (no rescale)
    assert s_r["rescales_done"] > s_f["rescales_done"]


@pytest.mark.gpu
def test_model_on_cuda_matches_cpu():
    q, k, v = _inputs(1, 300, 300, 2, 128, torch.bfloat16, 1)
    cfg = AttnConfig(rescale_threshold=8.0, exp2_emu_fraction=0.25)
    out_cpu = attention_model(q, k, v, True, config=cfg)
    out_gpu = attention_model(q.cuda(), k.cuda(), v.cuda(), True, config=cfg)
    ref = attention_exact(q, k, v, True)
    _rule(out_gpu.cpu(), attention_naive(q, k, v, True), ref, torch.bfloat16)
    assert (out_gpu.cpu().float() - out_cpu.float()).abs().max() <= 2 * torch.finfo(torch.bfloat16).eps


# ---- speculative_exp's vote, modelled (kernels/reference.py _SpecVotes) ----------------------------------------------
def _two_block_scores(later: torch.Tensor):
    """q, k (fp32, 64 queries, 256 keys, hd64, softmax_scale ln 2: scores in log2 units = q.k) whose first visited
    block (keys 128-255) scores 0 everywhere and whose later block (keys 0-127) scores ``later`` (128,)."""
    q = torch.zeros(1, 64, 1, 64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 256, 1, 64)
    k[0, :128, 0, 0] = later
    return q, k, torch.randn(1, 256, 1, 64, generator=torch.Generator().manual_seed(0))


def _spec_stats(q, k, v, causal=False, scale=math.log(2.0), **cfg):
    _, st = attention_model(q, k, v, causal, softmax_scale=scale, return_stats=True,
                            config=AttnConfig(**({"rescale_threshold": 8.0} | cfg)))
    return st


def test_spec_votes_a_sum_that_passes_the_limit_without_any_large_p():
    """Every later score 3 log2 units up: each thread's 32 columns sum to 256 > 2^8 (1 - 2^-6), no P above 8; the eager
    step keeps the maxima (3 < tau): the sum vote redoes the block for nothing, the second vote does not."""
    st = _spec_stats(*_two_block_scores(torch.full((128,), 3.0)))
    assert st["spec_blocks"] == 1 and st["rescales_done"] == 0
    assert st["spec_redos"] == 1 and st["spec_redos_kept"] == 1 and st["spec_max_check_share"] == 0.0
    st = _spec_stats(*_two_block_scores(torch.full((128,), 2.9)))  # 32 * 2^2.9 = 239: under the limit
    assert st["spec_redos"] == 0


def test_spec_votes_a_jump_past_tau_in_both_votes():
    later = torch.zeros(128)
    later[77] = 9.0  # one P = 2^9 > 2^8: the eager step rescales, both votes redo
    st = _spec_stats(*_two_block_scores(later))
    assert st["rescales_done"] == 4  # the 4 row groups of 16
    assert (st["spec_redos"], st["spec_redos_kept"], st["spec_max_check_share"], st["spec_rescale_share"]) == (1, 0, 1.0,
                                                                                                                  1.0)
    later[77] = 7.5  # under tau: kept, though its P (181) is the sum's bulk; neither vote redoes
    assert _spec_stats(*_two_block_scores(later))["spec_redos"] == 0


def test_spec_votes_only_where_the_kernel_can_speculate():
    q, k, v = _inputs(1, 512, 512, 2, 64, torch.bfloat16, 11)
    st = _spec_stats(q, k, v, scale=None)  # gaussian scores: no later block nears 2^8
    assert st["spec_blocks"] == 2 * (3 + 3 + 2) * 3 and st["spec_redos"] == 0  # heads x warpgroups x later blocks
    for cfg in (dict(rescale_threshold=0.0), dict(exp2_emu_fraction=0.25)):
        assert "spec_blocks" not in _spec_stats(q, k, v, scale=None, **cfg)
    st = _spec_stats(q, k, v, causal=True, scale=None)
    assert st["spec_redos_kept"] <= st["spec_redos"] <= st["spec_blocks"]


def _ramp_scores(n_blocks: int, step: float):
    """q, k (fp32, 64 queries, hd64, softmax_scale ln 2: scores in log2 units = q.k) over n_blocks blocks of 128 keys,
    block j (visited n_blocks - 1 first, 0 last) scoring (n_blocks - 1 - j) * step everywhere: every later block's
    maximum is ``step`` above the kept one."""
    q = torch.zeros(1, 64, 1, 64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 128 * n_blocks, 1, 64)
    for j in range(n_blocks):
        k[0, 128 * j:128 * (j + 1), 0, 0] = (n_blocks - 1 - j) * step
    return q, k, torch.randn(1, 128 * n_blocks, 1, 64, generator=torch.Generator().manual_seed(0))


def test_spec_redo_budget_modelled():
    """A climb of 9 log2 units per block (past tau = 8): every one of the 5 later blocks takes a second QK^T
    unbudgeted; a budget of B redoes the first B of them and runs the rest by the eager step (one warpgroup, one tile:
    the counter never restarts)."""
    st = _spec_stats(*_ramp_scores(6, 9.0))
    assert st["spec_blocks"] == 5 and st["spec_max_check_share"] == 1.0
    for b in (1, 2, 4):
        assert st[f"spec_budget{b}_qk2_share"] == pytest.approx(b / 5)
        assert st[f"spec_budget{b}_eager_share"] == pytest.approx((5 - b) / 5)
    # 1 log2 unit a block (5 at most, under tau): from 3 units up a thread's 32 P sum past the limit (the sum vote,
    # 3 of 5 blocks), no P itself does (the second vote keeps them): no second QK^T, so no budget is spent
    st = _spec_stats(*_ramp_scores(6, 1.0))
    assert st["spec_redo_share"] == pytest.approx(3 / 5) and st["spec_max_check_share"] == 0.0
    assert all(st[f"spec_budget{b}_qk2_share"] == 0 and st[f"spec_budget{b}_eager_share"] == 0 for b in (1, 2, 4))
