"""GPU correctness of the sm90 forward kernel (DESIGN.md rule 5), run on an H100/H200.

Each case: fresh random inputs, NaN-poisoned out / lse buffers, then
  max|out - ref| <= 2 * max|out_pt - ref| + atol      (ref: fp32 math, out_pt: plain PyTorch at the input dtype)
and the same bound against kernels.reference.attention_model (the FA4 algorithm with the same config), plus
the LSE against the fp32 LSE (fully masked rows: -inf in both). Covered: every exposed switch value, causal
both ways, head dims 64/128/256 and (192, 128), bf16 and fp16, odd lengths 1, 17, 1000, 4097, s_q != s_k in
both directions, batch and heads > 1.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from kernels.config import AttnConfig
from kernels.reference import attention_exact, attention_model, attention_naive

pytestmark = pytest.mark.gpu

HDIM_PAIRS = [(64, 64), (128, 128), (256, 256), (192, 128)]
DTYPES = [torch.bfloat16, torch.float16]
# (batch, seqlen_q, seqlen_k, heads)
SHAPES_DEFAULT = [(2, 1000, 1000, 3), (1, 17, 4097, 2), (2, 4097, 17, 1), (3, 1, 1, 2)]
SHAPES_SWITCH = [(2, 1000, 1000, 2), (1, 257, 777, 3)]
# every exposed switch value, each varied from the defaults (one factor at a time)
SWITCH_VALUES = [("rescale_threshold", 0.0), ("rescale_threshold", 2.0), ("rescale_threshold", 4.0),
                 ("rescale_threshold", 16.0), ("exp2_emu_fraction", 0.0), ("exp2_emu_fraction", 0.125),
                 ("exp2_emu_fraction", 0.375), ("exp2_emu_fraction", 0.5), ("exp2_emu_fraction", 1.0),
                 ("pingpong", False), ("intra_wg_overlap", False), ("num_stages", 1), ("num_stages", 3)]
# FA3-like baseline and both overlap switches off together
COMBOS = [dict(rescale_threshold=0.0, exp2_emu_fraction=0.0, pingpong=False),
          dict(pingpong=False, intra_wg_overlap=False)]


def _err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    d = torch.where(x == ref, torch.zeros_like(x), (x - ref).abs())
    return float(d.max()) if d.numel() else 0.0


def _bound(out_pt, ref, dtype) -> float:
    mag = ref[torch.isfinite(ref)].abs().max() if torch.isfinite(ref).any() else torch.tensor(0.0)
    return 2.0 * _err(out_pt, ref) + torch.finfo(dtype).eps * float(mag)


def run_case(cfg: AttnConfig, hdim: int, hdim_v: int, dtype, causal: bool, shape, check_model: bool = True):
    from kernels.interface import attention_forward, resolve_config

    b, sq, sk, h = shape
    dev = "cuda"
    q = torch.randn(b, sq, h, hdim, device=dev, dtype=dtype)
    k = torch.randn(b, sk, h, hdim, device=dev, dtype=dtype)
    v = torch.randn(b, sk, h, hdim_v, device=dev, dtype=dtype)
    scale = 1.0 / math.sqrt(hdim)
    rcfg = resolve_config(cfg, hdim, causal)
    out = torch.full((b, sq, h, hdim_v), float("nan"), device=dev, dtype=dtype)
    lse = torch.full((b, h, sq), float("nan"), device=dev, dtype=torch.float32)
    attention_forward(q, k, v, causal, scale, rcfg, out=out, lse=lse)
    torch.cuda.synchronize()
    ref, lse_ref = attention_exact(q, k, v, causal, scale, dtype=torch.float32, return_lse=True)
    out_pt, lse_pt = attention_naive(q, k, v, causal, scale, return_lse=True)
    tag = f"{cfg} hdim=({hdim},{hdim_v}) {dtype} causal={causal} shape={shape}"
    assert not torch.isnan(out).any(), f"NaN in out (unwritten?) {tag}"
    assert not torch.isnan(lse).any(), f"NaN in lse (unwritten?) {tag}"
    bound = _bound(out_pt, ref, dtype)
    err = _err(out, ref)
    assert err <= bound, f"out vs fp32: err {err:.3g} > bound {bound:.3g}; {tag}"
    lse_bound = 2.0 * _err(lse_pt, lse_ref) + 1e-3
    lse_err = _err(lse, lse_ref)
    assert lse_err <= lse_bound, f"lse vs fp32: err {lse_err:.3g} > bound {lse_bound:.3g}; {tag}"
    if check_model:
        out_m = attention_model(q, k, v, causal, scale, config=cfg)
        err_m = _err(out, out_m.float())
        assert err_m <= bound, f"out vs attention_model: err {err_m:.3g} > bound {bound:.3g}; {tag}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_default_config(hdims, dtype, causal):
    for i, shape in enumerate(SHAPES_DEFAULT):
        run_case(AttnConfig(), hdims[0], hdims[1], dtype, causal, shape, check_model=(i == 0))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("field,value", SWITCH_VALUES)
def test_switch_value(field, value, causal):
    hdim = 64 if field in ("exp2_emu_fraction", "num_stages") else 128
    cfg = dataclasses.replace(AttnConfig(), **{field: value})
    for shape in SHAPES_SWITCH:
        run_case(cfg, hdim, hdim, torch.bfloat16, causal, shape)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
def test_rescale_before_pv_is_bitwise_the_default(hdims, causal):
    """rescale_before_pv=True moves the O rescale between QK^T(j+1) and PV(j): the same arithmetic in another order,
    so out and lse must equal the default kernel's bit for bit (and pass the accuracy bound on their own)."""
    from kernels.interface import attention_forward, resolve_config

    hdim, hdim_v = hdims
    cfg = AttnConfig(rescale_before_pv=True)
    for shape in SHAPES_DEFAULT[:3]:
        run_case(cfg, hdim, hdim_v, torch.bfloat16, causal, shape, check_model=False)
        b, sq, sk, h = shape
        q, k = (torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16) for s in (sq, sk))
        v = torch.randn(b, sk, h, hdim_v, device="cuda", dtype=torch.bfloat16)
        outs = []
        for c in (AttnConfig(rescale_before_pv=False), cfg):
            out = torch.full((b, sq, h, hdim_v), float("nan"), device="cuda", dtype=torch.bfloat16)
            lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
            attention_forward(q, k, v, causal, hdim ** -0.5, resolve_config(c, hdim, causal), out=out, lse=lse)
            outs.append((out, lse))
        torch.cuda.synchronize()
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), \
            f"rescale_before_pv output differs from the default's: hdim {hdims} causal={causal} shape={shape}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("combo", COMBOS, ids=["fa3_like", "no_overlap_no_pingpong"])
def test_switch_combos(combo, causal):
    cfg = AttnConfig(**combo)
    run_case(cfg, 128, 128, torch.float16, causal, SHAPES_SWITCH[1])
    run_case(cfg, 64, 64, torch.bfloat16, causal, SHAPES_SWITCH[0])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("overlap", [True, False])
def test_three_consumer_warpgroups(overlap, causal):
    """tile_m = 192: three consumer warpgroups (pingpong cycles through all three), 160/32 registers."""
    cfg = AttnConfig(tile_m=192, consumer_regs=160, producer_regs=32, intra_wg_overlap=overlap)
    for shape in SHAPES_SWITCH:
        run_case(cfg, 64, 64, torch.bfloat16, causal, shape)
    run_case(cfg, 64, 64, torch.float16, causal, (2, 4097, 17, 1), check_model=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("overlap,tile_n", [(True, 64), (False, 96)])
def test_four_consumer_warpgroups(overlap, tile_n, causal):
    """tile_m = 256: four consumer warpgroups, 112/24 registers, no ping-pong (opt-in; the spill-free tiles)."""
    cfg = AttnConfig(tile_m=256, tile_n=tile_n, consumer_regs=112, producer_regs=24, pingpong=False,
                     intra_wg_overlap=overlap, persistent=False)
    for shape in SHAPES_SWITCH:
        run_case(cfg, 64, 64, torch.bfloat16, causal, shape)
    run_case(cfg, 64, 64, torch.float16, causal, (2, 4097, 17, 1), check_model=False)
    run_case(dataclasses.replace(cfg, persistent=True), 64, 64, torch.bfloat16, causal, SHAPES_SWITCH[0])


def test_two_configs_two_kernels():
    """The real path compiles a distinct kernel per config (no stale cubin across an ablation)."""
    from kernels.interface import get_fwd_kernel, resolve_config

    a = resolve_config(AttnConfig(rescale_threshold=0.0), 128, False)
    b = resolve_config(AttnConfig(rescale_threshold=8.0), 128, False)
    ka, ca = get_fwd_kernel(a, "bfloat16", 128, 128, False)
    kb, cb = get_fwd_kernel(b, "bfloat16", 128, 128, False)
    assert ca is not cb and ka.tau == 0.0 and kb.tau == 8.0
    assert get_fwd_kernel(a, "bfloat16", 128, 128, False)[1] is ca


def test_public_api_and_autograd_shape():
    import kernels

    q = torch.randn(1, 300, 2, 128, device="cuda", dtype=torch.bfloat16)
    out, lse = kernels.attention(q, q, q, causal=True, return_lse=True)
    assert out.shape == q.shape and lse.shape == (1, 2, 300) and lse.dtype == torch.float32
    ref = attention_exact(q, q, q, True, None, dtype=torch.float32)
    assert _err(out, ref) <= _bound(attention_naive(q, q, q, True), ref, torch.bfloat16)


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_through_kernels_attention(causal):
    """kernels.attention is differentiable: its backward (kernels.sm90.backward) meets the same rule for dq, dk, dv."""
    import kernels

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.bfloat16)
    grads = torch.autograd.grad(kernels.attention(q, k, v, causal=causal), (q, k, v), dout)
    ref = torch.autograd.grad(attention_exact(q, k, v, causal, None, dtype=torch.float32), (q, k, v), dout.float())
    pt = torch.autograd.grad(attention_naive(q, k, v, causal), (q, k, v), dout)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref, pt):
        assert not torch.isnan(g).any(), name
        assert _err(g, r) <= _bound(p, r, torch.bfloat16), f"{name}: err {_err(g, r):.3g} > {_bound(p, r, torch.bfloat16):.3g}"
