"""GPU correctness of AttnConfig.bwd_dq_claim (the preprocess does not zero dQaccum; the first dQ writer per unit
stores, the others add after its store: kernels/sm90/bwd.py _set_dq_claim): the DESIGN.md rule (tests/test_bwd_gpu.py
_run_case: fp64 reference, NaN-poisoned outputs) at hd 64 / 128, causal and not (hd128 non-causal with bwd_rotate_q),
odd lengths; and the gradients of the kernel with zeroing, call after call, with dQaccum's memory NaN-filled before
each call (a unit read or added to before its claimant's store landed would turn dQ into NaN or miss a share)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_bwd_gpu import _cfg, _run_case  # noqa: E402
from test_bwd_stream_post_gpu import SHAPES, interleaved_against, rows_without_keys  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = [(64, False, {}), (64, True, {}), (128, True, {}), (128, False, dict(bwd_rotate_q=True))]
IDS = ["64nc", "64c", "128c", "128nc_rotq"]


@pytest.mark.parametrize("hdim,causal,extra", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bwd_dq_claim(hdim, causal, extra, dtype):
    cfg = _cfg(bwd_dq_claim=True, **extra)
    for i, (b, sq, sk, h) in enumerate(SHAPES):
        if not (causal and sq > sk):
            _run_case(b, sq, sk, h, hdim, causal, dtype, cfg, seed=80 + i)


@pytest.mark.parametrize("hdim,causal,extra", CASES, ids=IDS)
def test_bwd_dq_claim_over_nan_memory(hdim, causal, extra):
    """interleaved_against the kernel with zeroing at seqlen 2048, dQaccum's memory NaN-filled before each call."""
    interleaved_against(hdim, causal, _cfg(bwd_dq_claim=False, **extra), _cfg(bwd_dq_claim=True, **extra), 2048, 15,
                        exact_dq=False, nan_memory=True)


@pytest.mark.parametrize("hdim", [64, 128])
def test_bwd_dq_claim_rows_without_keys(hdim):
    """Causal, seqlen_q > seqlen_k: the units of rows that see no key are claimed by nobody; the postprocess writes
    their zeros without reading the (NaN) dQaccum (rows_without_keys)."""
    rows_without_keys(hdim, (1, 1003, 300, 2), _cfg(bwd_dq_claim=False), _cfg(bwd_dq_claim=True), 16, nan_memory=True)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
@pytest.mark.parametrize("hdim,extra", [(64, {}), (128, {}), (128, dict(bwd_det_two_writers=False))],
                         ids=["64", "128", "128w1"])
def test_bwd_dq_turn0_store_deterministic(hdim, extra, causal):
    """Deterministic: each dQ tile's turn 0 stores (no zeroed dQaccum): every gradient bitwise equal (torch.equal)
    to the kernel with zeroing (interleaved_against at seqlen 1500, NaN memory); plus the DESIGN.md rule at odd
    shapes."""
    claim = _cfg(deterministic=True, bwd_dq_claim=True, **extra)
    interleaved_against(hdim, causal, _cfg(deterministic=True, bwd_dq_claim=False, **extra), claim, 1500, 17,
                        exact_dq=True, nan_memory=True)
    for j, (bb, sq, sk, hh) in enumerate(SHAPES[:6]):
        if not (causal and sq > sk):
            _run_case(bb, sq, sk, hh, hdim, causal, torch.bfloat16, claim, seed=95 + j)
