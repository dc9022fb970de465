"""GPU correctness of the sm90 forward's opt-in loop shapes ``causal_split`` and ``exp_in_branch`` (H100 / H200).

Both lay the same arithmetic out differently for ptxas (tests/test_fwd_loop_shape.py has the SASS), so each must pass
the accuracy bound of tests/test_fwd_gpu.py on its own and give the default kernel's out / lse up to one rounding (see
``bitwise``; they are bit for bit on most inputs), at every
head dim, causal both (causal_split: causal only; non-causal it compiles the default), alone and together, with and
without rescale_before_pv.
"""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT, run_case

pytestmark = pytest.mark.gpu

VARIANTS = [dict(causal_split=True), dict(exp_in_branch=True), dict(causal_split=True, exp_in_branch=True),
            dict(causal_split=True, exp_in_branch=True, rescale_before_pv=True)]


def _run(cfg, q, k, v, causal, hdim, hdim_v):
    """out / lse of ``cfg``, with speculative_exp off unless ``cfg`` sets it: the files that compare through here test
    the eager step's loop layouts, to which speculation (the hd 64 / 128 / (192, 128) default since session 52) yields;
    its own comparisons set it (tests/test_fwd_speculative_exp_gpu.py)."""
    import dataclasses

    from kernels.interface import attention_forward, resolve_config

    if cfg.speculative_exp is None:
        cfg = dataclasses.replace(cfg, speculative_exp=False)

    b, sq, h, _ = q.shape
    out = torch.full((b, sq, h, hdim_v), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    attention_forward(q, k, v, causal, hdim ** -0.5, resolve_config(cfg, hdim, causal), out=out, lse=lse)
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
@pytest.mark.parametrize("variant", VARIANTS, ids=["split", "exp_in_branch", "both", "both_prepv"])
def test_loop_shape_matches_the_default(variant, hdims, causal):
    hdim, hdim_v = hdims
    cfg = AttnConfig(**variant)
    base_cfg = AttnConfig(rescale_before_pv=variant.get("rescale_before_pv"))  # None: the default's
    shapes = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2)]
    for shape in shapes:
        run_case(cfg, hdim, hdim_v, torch.bfloat16, causal, shape, check_model=False)
    bitwise(cfg, base_cfg, hdim, hdim_v, causal, shapes)


def bitwise(cfg, base_cfg, hdim, hdim_v, causal, shapes, exact=False):
    """out / lse of ``cfg`` against those of ``base_cfg`` on fresh bf16 inputs of each (b, s_q, s_k, h): bit for bit
    when ``exact``, else equal up to one rounding. The loop shapes lay the same arithmetic out differently, and on the
    H200 (2026-12-01) 4-5 of these 32 cases per run differed on some inputs: with a multiply-add fused in one layout
    and not in the other, an exponential's argument can round differently (a P element one bf16 ulp apart)."""
    for b, sq, sk, h in shapes:
        q, k = (torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16) for s in (sq, sk))
        v = torch.randn(b, sk, h, hdim_v, device="cuda", dtype=torch.bfloat16)
        ref = _run(base_cfg, q, k, v, causal, hdim, hdim_v)
        got = _run(cfg, q, k, v, causal, hdim, hdim_v)
        torch.cuda.synchronize()
        exact_here = exact and keeps_first_maxima(q, k, hdim ** -0.5, [cfg, base_cfg], hdim, causal)
        same_up_to_rounding(got, ref, f"{cfg} against {base_cfg}: hdims ({hdim}, {hdim_v}) causal={causal} "
                            f"shape={(b, sq, sk, h)}", exact_here)


def keeps_first_maxima(q, k, scale, cfgs, hdim, causal, margin=0.5) -> bool:
    """Whether no row's maximum grows by more than tau - ``margin`` (log2 units) past the first key block the sm90
    forward visits (non-causal: the last, partial one) under each config's resolved tile_n: then every later block
    keeps its maxima and the loop layouts agree bit for bit. A first block of few keys (seqlen_k 4097 at tile_n 128: one
    key) lets ~1.6% of gaussian rows grow past tau 8 later; those rows rescale, and a rescaled row's sum may round
    differently between layouts (H100, session 65: the LSE of (1, 17, 4097, 2) one rounding apart, O bitwise)."""
    import math

    from kernels.interface import resolve_config

    if causal:
        return False
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * (scale * math.log2(math.e))
    sk = k.shape[1]
    for cfg in cfgs:
        r = resolve_config(cfg, hdim, causal)
        first = s[..., (sk - 1) // r.tile_n * r.tile_n:].amax(-1)
        if (s.amax(-1) - first).max().item() > r.rescale_threshold - margin:
            return False
    return True


def same_up_to_rounding(got, ref, what: str, exact: bool = False):
    """(out, lse) ``got`` against ``ref``: bit for bit when ``exact``, else within one rounding (few elements apart)."""
    if exact:
        assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1]), what
        return
    assert not got[0].isnan().any() and not got[1].isnan().any(), what
    torch.testing.assert_close(got[1], ref[1], rtol=1e-6, atol=1e-5, msg=lambda m: f"lse, {what}: {m}")
    torch.testing.assert_close(got[0], ref[0], rtol=2 ** -7, atol=1e-3, msg=lambda m: f"out, {what}: {m}")
    assert (got[0] != ref[0]).float().mean().item() < 1e-3, what  # a few elements, not a different result
