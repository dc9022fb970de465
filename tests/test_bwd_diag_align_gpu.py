"""GPU correctness of AttnConfig.bwd_diag_align (hd128 causal, 80-row Q tiles walked from each K/V tile's diagonal
row, chunk-major dQaccum; kernels/sm90/bwd.py _set_diag_align) by the DESIGN.md rule (tests/test_bwd_gpu.py's
_run_case: fp64 reference, NaN-poisoned outputs). Lengths where 128 n - (seqlen_k - seqlen_q) is not a multiple of 8
(the rounding), where the last tile ends up to 79 rows past seqlen_q (the extra padded tile), seqlen_q < seqlen_k,
one row, and a length past 4096; with the grid orders and PDL it may be combined with. The hd128 causal default
since 2026-12-01 (DEFAULTS' pair)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_bwd_gpu import _cfg, _run_case  # noqa: E402

pytestmark = pytest.mark.gpu

SWITCHES = [dict(bwd_diag_align=True), dict(bwd_diag_align=True, bwd_lpt_heads=0),
            dict(bwd_diag_align=True, bwd_lpt_heads=1), dict(bwd_diag_align=True, bwd_pdl=True)]
# (batch, seqlen_q, seqlen_k, heads); causal with seqlen_q > seqlen_k leaves rows with no key (NaN reference): none here
SHAPES = [(2, 1024, 1024, 3), (2, 1000, 1000, 2), (3, 333, 397, 5), (1, 17, 129, 3), (3, 1, 1, 2), (2, 128, 128, 2),
          (1, 300, 1003, 2), (2, 2048, 2048, 2), (1, 4097, 4097, 1)]


def _sid(d):
    return "-".join(f"{k}={v}" for k, v in d.items())


@pytest.mark.parametrize("switch", SWITCHES, ids=_sid)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bwd_diag_align(switch, dtype):
    cfg = _cfg(**switch)
    for i, (b, sq, sk, h) in enumerate(SHAPES):
        _run_case(b, sq, sk, h, 128, True, dtype, cfg, seed=40 + i)


def test_bwd_diag_align_matches_the_grid_walk():
    """The same inputs through the 80-row-grid kernel (bwd_diag_align=False) and the aligned one (the default): dK / dV / dQ agree to the fp32 accumulation
    order (the aligned walk computes the same nonzero terms, in other tiles)."""
    from kernels.sm90.backward import attention_backward
    import math

    g = torch.Generator(device="cuda").manual_seed(7)
    b, s, h, d = 2, 1024, 4, 128
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    out = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    lse = torch.randn(b, h, s, device="cuda", dtype=torch.float32, generator=g) + 6.0
    scale = 1.0 / math.sqrt(d)
    ref = attention_backward(q, k, v, out, do, lse, True, scale, _cfg(bwd_diag_align=False))
    got = attention_backward(q, k, v, out, do, lse, True, scale, _cfg(bwd_diag_align=True))
    torch.cuda.synchronize()
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert torch.isfinite(x).all(), name
        tol = 1e-2 * r.float().abs().max().item() + 1e-3
        assert (x.float() - r.float()).abs().max().item() <= tol, name
