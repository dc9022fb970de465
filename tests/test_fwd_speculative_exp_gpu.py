"""GPU checks of speculative_exp (sm90 forward, the hd 64 / 128 / (192, 128) default since session 52, hd256 since
session 59; CPU SASS: tests/test_fwd_speculative_exp.py): a later block's P with the kept maxima, S again and the eager
step only when the warpgroup's votes say a row may have grown by tau. Every comparison is against the eager step
(test_fwd_loop_shape_gpu _run runs configs that leave the field unset with it off). A block that keeps its maxima gets
the eager step's P, sums and maxima bit for bit, so non-causal calls on gaussian inputs (no later block rescales at tau
8) must equal the eager kernel's exactly; where rows rescale (causal diagonal blocks, the rare arm's inputs: keys near
the start of the sequence, which the loop visits last, scaled up) ptxas may contract a row sum's update differently from
the default's loop, so those compare within one rounding, as the other loop shapes do
(tests/test_fwd_loop_shape_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT
from test_fwd_loop_shape_gpu import _run, bitwise, same_up_to_rounding

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 2)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_speculative_exp_is_bitwise_the_default(hdims, causal):
    bitwise(AttnConfig(speculative_exp=True), AttnConfig(), *hdims, causal, SHAPES, exact=not causal)


@pytest.mark.parametrize("hdim,extra", [(128, {"lazy_row_max": False}), (128, {"rescale_before_pv": True}),
                                         (128, {"persistent": True}),
                                         (128, {"persistent": True, "persistent_greedy": True, "causal_split": True}),
                                         (128, {"rescale_threshold": 12.0}), (128, {"pingpong": False}),
                                         (64, {"persistent": True}), (64, {"lazy_row_max": False})],
                         ids=["eager", "prepv", "persistent", "greedy_split", "tau12", "no_pingpong", "hd64_persistent",
                              "hd64_eager"])
@pytest.mark.parametrize("causal", [False, True])
def test_speculative_exp_with_the_other_switches(hdim, extra, causal):
    bitwise(AttnConfig(speculative_exp=True, **extra), AttnConfig(**extra), hdim, hdim, causal, SHAPES[:4],
            exact=not causal)


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [{}, {"spec_redo_budget": 1}, {"spec_redo_budget": 2, "persistent": True}],
                         ids=["unbudgeted", "budget1", "budget2_persistent"])
def test_speculative_exp_rare_arm(hdim, causal, extra):
    """Keys 0..1023 scaled by 4 (and one by 40, past any exp2 range of the kept maxima): the loop meets them last, after
    maxima taken from the other keys, so the partial sums blow past 2^tau and the warpgroups compute S again. With a
    redo budget the tiles that spend it run their remaining blocks by the eager step (persistent: the budget starts
    again at every tile a CTA walks)."""
    q, k, v = rare_arm_inputs(hdim)
    ref = _run(AttnConfig(), q, k, v, causal, hdim, hdim)
    got = _run(AttnConfig(speculative_exp=True, **extra), q, k, v, causal, hdim, hdim)
    torch.cuda.synchronize()
    assert torch.isfinite(got[0]).all()
    same_up_to_rounding(got, ref, f"rare arm hd{hdim} causal={causal} {extra}")


def rare_arm_inputs(hdim: int, b: int = 2, s: int = 4096, h: int = 2):
    """bf16 q, k, v whose keys 0..1023 (visited last) are scaled by 4 and key 7 by 40: the votes fire."""
    q = torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16)
    k[:, :1024] *= 4
    k[:, 7] *= 10
    v = torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16)
    return q, k, v


def redo_and_nan_match(cfg, base_cfg, hdim: int, causal: bool):
    """``cfg`` against ``base_cfg`` on the rare arm's inputs (the votes fire), then the same with one query row NaN (NaN
    sums: the block is redone): the same NaNs, and the finite values within a rounding."""
    q, k, v = rare_arm_inputs(hdim)
    for nan_row in (False, True):
        if nan_row:
            q[0, 1000, 0, 3] = float("nan")
        ref = _run(base_cfg, q, k, v, causal, hdim, hdim)
        got = _run(cfg, q, k, v, causal, hdim, hdim)
        torch.cuda.synchronize()
        for g, r in zip(got, ref):
            assert torch.equal(g.isnan(), r.isnan()), (hdim, causal, nan_row)
        assert got[0].isnan().any() == nan_row
        finite = [t.nan_to_num() for t in got], [t.nan_to_num() for t in ref]
        same_up_to_rounding(*finite, f"redo hd{hdim} causal={causal} nan_row={nan_row}")


@pytest.mark.parametrize("hdims", [(64, 64), (128, 128), (192, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_spec_redo_budget_where_nothing_redoes_is_bitwise_the_default(hdims, causal):
    """Gaussian inputs at tau 8: no vote fires, the budget is never spent, so the output is the eager step's bit for bit
    (non-causal; causal within a rounding, as for speculative_exp alone)."""
    bitwise(AttnConfig(speculative_exp=True, spec_redo_budget=2), AttnConfig(), *hdims, causal, SHAPES[:4],
            exact=not causal)


@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_spec_redo_budget_on_a_ramp_of_maxima(hdim, causal):
    """Every row's maximum climbs along the visit order (scripts/fwd_ab.py --inputs late_max: a ramp of 12 log2 units
    toward key 0, which the loop meets last): most blocks redo, so each tile spends its budget early and runs the rest
    by the eager step; the output is the eager kernel's within one rounding."""
    b, s, h = 2, 4096, 2
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(b, s, h, hdim, device="cuda", generator=g)
    k = torch.randn(b, s, h, hdim, device="cuda", generator=g)
    v = torch.randn(b, s, h, hdim, device="cuda", generator=g)
    q[..., 0] = 1.0
    k[..., 0] = (12.0 * (1.0 - torch.arange(s, device="cuda") / s))[None, :, None] * hdim ** 0.5 / 1.4426950408889634
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    from kernels.reference import attention_model

    _, st = attention_model(q, k, v, causal, return_stats=True)
    assert st["spec_max_check_share"] > 0.1, st  # the unbudgeted loop would take a second QK^T on a tenth of its blocks
    ref = _run(AttnConfig(), q, k, v, causal, hdim, hdim)
    got = _run(AttnConfig(speculative_exp=True, spec_redo_budget=1), q, k, v, causal, hdim, hdim)
    torch.cuda.synchronize()
    same_up_to_rounding(got, ref, f"ramp hd{hdim} causal={causal}")


def _sums_past_the_limit(b, s, h, hdim, device):
    """Scores of spread ~0.4 log2 units, keys 0..1023 (visited last) 6 up: their P are ~64 each, every thread's 32
    columns sum to ~2000 > 2^8, and no score grows by tau = 8: the first vote redoes, the second (on the P) does not."""
    g = torch.Generator(device=device).manual_seed(5)
    q = torch.randn(b, s, h, hdim, device=device, generator=g) * 0.25
    q[..., 0] = 1.0
    k = torch.randn(b, s, h, hdim, device=device, generator=g)
    k[..., 0] = 0.0
    k[:, :1024, :, 0] = 6.0 * hdim ** 0.5 / 1.4426950408889634
    v = torch.randn(b, s, h, hdim, device=device, generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_speculative_exp_second_vote_keeps_the_block(hdim, causal):
    """The second vote's arm (sums past the limit, no P past it): no second QK^T, the partial sums kept. The model
    (kernels.reference.attention_model's _SpecVotes) confirms the inputs take that arm."""
    from kernels.reference import attention_model

    q, k, v = _sums_past_the_limit(2, 4096, 2, hdim, "cuda")
    _, st = attention_model(q, k, v, causal, return_stats=True)
    assert st["spec_redos_kept"] > st["spec_redos"] // 2 > 0  # (causal: a few rows with no maximum yet rescale)
    ref = _run(AttnConfig(), q, k, v, causal, hdim, hdim)
    got = _run(AttnConfig(speculative_exp=True), q, k, v, causal, hdim, hdim)
    torch.cuda.synchronize()
    same_up_to_rounding(got, ref, f"second vote hd{hdim} causal={causal}", exact=not causal)  # nc: nothing rescales
