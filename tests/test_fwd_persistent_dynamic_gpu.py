"""GPU checks of persistent_dynamic (tiles claimed at run time; CPU tests: tests/test_fwd_persistent_dynamic.py): its
outputs against the static persistent kernel's (round robin, no greedy walk or split tail) on NaN-poisoned buffers, with
the SM count patched down (``kernels.interface._sm_count``) so that every CTA claims many tiles, at every head dim,
causal and not, odd lengths; and a CUDA graph capture replayed on new inputs (the counter's zeroing is captured too).
The per-tile arithmetic is the same code, so the outputs agree within one rounding (a tile skipped would leave NaN)."""
from __future__ import annotations

import pytest
import torch

from kernels.config import AttnConfig
from test_fwd_loop_shape_gpu import _run, same_up_to_rounding

pytestmark = pytest.mark.gpu

STATIC = dict(persistent=True, persistent_greedy=False, persistent_snake=False, split_tail=False)
SHAPES = [(2, 1000, 1000, 4), (1, 4097, 4097, 2), (2, 2048, 3000, 3), (1, 128, 8192, 16)]


def _inputs(b, sq, sk, h, d, dv, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + sq + 3 * sk)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, h, dv, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


@pytest.mark.parametrize("sms", [None, 5], ids=["all_sms", "5_ctas"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", [(64, 64), (128, 128), (256, 256), (192, 128)])
def test_dynamic_claims_give_the_static_outputs(hdims, causal, sms, monkeypatch):
    import kernels.interface as itf

    if sms is not None:
        monkeypatch.setattr(itf, "_sm_count", lambda index: sms)
    d, dv = hdims
    for b, sq, sk, h in SHAPES:
        if causal and sq != sk:
            continue
        q, k, v = _inputs(b, sq, sk, h, d, dv)
        ref = _run(AttnConfig(**STATIC), q, k, v, causal, d, dv)
        got = _run(AttnConfig(persistent=True, persistent_dynamic=True), q, k, v, causal, d, dv)
        torch.cuda.synchronize()
        same_up_to_rounding(got, ref, f"dynamic vs static d{hdims} causal={causal} sms={sms} shape={(b, sq, sk, h)}")


def test_dynamic_under_cuda_graph_replay():
    from kernels.interface import attention_forward, resolve_config

    cfg = resolve_config(AttnConfig(persistent=True, persistent_dynamic=True), 128, True)
    q, k, v = _inputs(2, 2048, 2048, 4, 128, 128)
    attention_forward(q, k, v, True, 128 ** -0.5, cfg)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = attention_forward(q, k, v, True, 128 ** -0.5, cfg)
    for seed in (1, 2):
        nq, nk, nv = _inputs(2, 2048, 2048, 4, 128, 128, seed=seed)
        q.copy_(nq), k.copy_(nk), v.copy_(nv)
        graph.replay()
        torch.cuda.synchronize()
        ref = _run(AttnConfig(**STATIC), nq, nk, nv, True, 128, 128)
        same_up_to_rounding((out, lse), ref, f"graph replay {seed}")
