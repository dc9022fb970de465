"""GPU checks of AttnConfig.bwd_det_diag_align (deterministic hd128 causal backward, 80-row Q tiles walked from each
K/V tile's diagonal row, one dQ semaphore per 8 Q rows; kernels/sm90/bwd_dq_writer.py det_diag_turn). Accuracy by the
DESIGN.md rule (tests/test_bwd_gpu.py's _run_case: fp64 reference, NaN-poisoned outputs) with one and two dQ writers,
bf16 / fp16, odd lengths (first rows rounded down to 8, groups straddling seqlen_q), seqlen_q != seqlen_k, one row;
bitwise over 20 repeats (a many-wave 4k call included); and equality with the kernels it combines: dQ with the
grid-walk deterministic kernel (the same per-tile partial products added in the same K/V order), dK / dV with the
non-deterministic aligned kernel (the same Q tiles per K/V tile, accumulated in the same order)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_bwd_det_two_writers_gpu import _inputs  # noqa: E402
from test_bwd_gpu import _cfg, _run_case  # noqa: E402

pytestmark = pytest.mark.gpu

ON = dict(deterministic=True, bwd_det_diag_align=True)
# (batch, seqlen_q, seqlen_k, heads); causal with seqlen_q > seqlen_k leaves rows with no key (NaN reference): none here
SHAPES = [(2, 1024, 1024, 3), (2, 1000, 1000, 2), (3, 333, 397, 5), (1, 17, 129, 3), (3, 1, 1, 2), (2, 128, 128, 2),
          (1, 300, 1003, 2), (2, 2048, 2048, 2), (1, 4097, 4097, 1)]


@pytest.mark.parametrize("writers", [True, False], ids=["two_writers", "one_writer"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bwd_det_diag_align_accuracy(writers, dtype):
    cfg = _cfg(bwd_det_two_writers=writers, **ON)
    for i, (b, sq, sk, h) in enumerate(SHAPES):
        _run_case(b, sq, sk, h, 128, True, dtype, cfg, seed=60 + i)


BITWISE = [(2, 1024, 1024, 8), (2, 1000, 1337, 4), (2, 1001, 1001, 3), (4, 4096, 4096, 10)]


@pytest.mark.parametrize("b,sq,sk,h", BITWISE)
def test_bwd_det_diag_align_bitwise(b, sq, sk, h):
    """Bitwise over 20 repeats (two writers, the hd128 default, and one); dQ bitwise equal to the grid-walk
    deterministic kernel's, dK / dV to the non-deterministic aligned kernel's."""
    from kernels.sm90.backward import attention_backward

    q, k, v, out, do, lse, scale = _inputs(b, sq, sk, h, True, seed=23, d=(128, 128))
    for writers in (True, False):
        cfg = _cfg(bwd_det_two_writers=writers, **ON)
        first = attention_backward(q, k, v, out, do, lse, True, scale, cfg)
        assert all(torch.isfinite(x).all() for x in first)
        n_diff = sum(int(not all(torch.equal(a, c) for a, c in zip(first, attention_backward(
            q, k, v, out, do, lse, True, scale, cfg)))) for _ in range(20))
        assert n_diff == 0, f"bwd_det_diag_align (two writers {writers}) differed in {n_diff}/20 repeats"
        grid = attention_backward(q, k, v, out, do, lse, True, scale, _cfg(deterministic=True))
        assert torch.equal(first[0], grid[0]), "dq differs from the grid-walk deterministic kernel"
        aligned = attention_backward(q, k, v, out, do, lse, True, scale, _cfg(bwd_diag_align=True))
        for name, x, r in zip(("dk", "dv"), first[1:], aligned[1:]):
            assert torch.equal(x, r), f"{name} differs from the non-deterministic aligned kernel"
