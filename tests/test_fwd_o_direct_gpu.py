"""GPU checks of AttnConfig.o_direct (sm90 forward: O from the accumulator registers straight to global memory, rows
past seqlen_q skipped, and Q's buffer released after the tile's last Q K^T; CPU tests: tests/test_fwd_o_direct.py).
Only the store changes, so every call must equal the default's bit for bit, into NaN-poisoned buffers (a row left
unwritten stays NaN): every head dim, causal or not, one tile per CTA and persistent (hd256's persistent kernel is
where O shared Q's buffer), ragged lengths (a tile's rows past seqlen_q), the split tail, a window and a softcap, and
the calls that ignore it (packed GQA, varlen)."""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_gpu import HDIM_PAIRS, SHAPES_DEFAULT

pytestmark = pytest.mark.gpu

SHAPES = SHAPES_DEFAULT[:3] + [(1, 4096, 4096, 2), (2, 8192, 8192, 2)]


def _run(cfg, q, k, v, causal, **kw):
    from kernels.interface import attention_forward, resolve_config

    b, sq, h, hdim = q.shape
    out = torch.full((b, sq, h, v.shape[3]), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    attention_forward(q, k, v, causal, hdim ** -0.5, resolve_config(cfg, hdim, causal), out=out, lse=lse, **kw)
    return out, lse


def _same(extra, hdim, hdim_v, causal, shapes, h_kv=None, switch="o_direct", **kw):
    """Calls with ``switch`` on equal those with it off bit for bit (tests/test_fwd_o_via_v_stage_gpu.py too; off by
    hand: o_via_v_stage is a default of the persistent hd256 / (192, 128) calls)."""
    for b, sq, sk, h in shapes:
        q = torch.randn(b, sq, h, hdim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, h_kv or h, hdim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, h_kv or h, hdim_v, device="cuda", dtype=torch.bfloat16)
        ref = _run(AttnConfig(**{switch: False}, **extra), q, k, v, causal, **kw)
        got = _run(AttnConfig(**{switch: True}, **extra), q, k, v, causal, **kw)
        torch.cuda.synchronize()
        what = (extra, hdim, causal, (b, sq, sk, h), kw)
        assert not ref[0].isnan().any(), what
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), what


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", HDIM_PAIRS)
@pytest.mark.parametrize("extra", [{}, {"persistent": True}, {"persistent": False}],
                         ids=["default", "persistent", "one_tile"])
def test_o_direct_is_bitwise_the_default(extra, hdims, causal):
    _same(extra, *hdims, causal, SHAPES)


@pytest.mark.parametrize("hdim", [128, 256])
def test_o_direct_split_tail(hdim):
    """Non-causal 16k: the split tail (whole tiles stored directly, tail pieces to the workspace as before)."""
    _same({"persistent": True, "split_tail": True}, hdim, hdim, False, [(1, 16384, 16384, 2048 // hdim)])


@pytest.mark.parametrize("causal", [False, True])
def test_o_direct_window_softcap_gqa(causal):
    _same({}, 128, 128, causal, SHAPES[:4], window_left=300, window_right=-1 if causal else 200)
    _same({}, 256, 256, causal, SHAPES[:4], softcap=30.0)
    _same({"pack_gqa": True}, 128, 128, causal, [(2, 1000, 1000, 8)], h_kv=2)  # packed: o_direct ignored
    _same({}, 64, 64, causal, [(2, 1000, 1000, 8)], h_kv=2)


def test_o_direct_varlen_is_ignored():
    from kernels.varlen import attention_varlen

    torch.manual_seed(0)
    lens = torch.tensor([0, 300, 1600, 1617, 4000], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(4000, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        ref = attention_varlen(q, k, v, lens, lens, 2383, 2383, causal=causal, config=AttnConfig())
        got = attention_varlen(q, k, v, lens, lens, 2383, 2383, causal=causal, config=AttnConfig(o_direct=True))
        assert torch.equal(got, ref), causal
