"""GPU tests of the persistent causal forward's greedy walk (AttnConfig(persistent=True, persistent_greedy=True);
kernels/sm90/greedy_walk.py): out and lse against the fp64 reference with NaN-poisoned outputs (tests/
test_persistent_gpu.py's rule), and bitwise equal to the round-robin persistent kernel's (same tiles, same products,
another order), with the SM count as is and patched down to 3 / 5 (``kernels.interface._sm_count``) so that CTAs walk
walks of different lengths; odd lengths, s_q != s_k, a left window, GQA. A non-causal call ignores the field (the
plain persistent kernel's compile key).

    python -m pytest -q tests/test_persistent_greedy_gpu.py
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _inputs(b, sq, sk, h, hkv, d, dv, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + sq + 7 * sk)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def _forward(cfg_kwargs, q, k, v, causal, window_left=-1):
    from kernels import AttnConfig
    from kernels.interface import attention_forward, resolve_config

    b, sq, h, _ = q.shape
    cfg = resolve_config(AttnConfig(**cfg_kwargs), q.shape[-1], causal)
    out = torch.full((b, sq, h, v.shape[-1]), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    attention_forward(q, k, v, causal, 1.0 / math.sqrt(q.shape[-1]), cfg, out=out, lse=lse, window_left=window_left)
    torch.cuda.synchronize()
    return out, lse


# (b, s_q, s_k, h, h_kv, d, dv, window_left)
CASES = [(2, 1000, 1000, 3, 3, 128, 128, -1), (1, 4097, 4097, 2, 2, 128, 128, -1), (2, 1500, 3000, 4, 2, 128, 128, -1),
         (3, 2000, 700, 2, 2, 64, 64, -1), (2, 2048, 2048, 4, 4, 64, 64, -1), (1, 3000, 3000, 2, 2, 128, 128, 512),
         (2, 1200, 1200, 2, 2, 256, 256, -1), (2, 1111, 1111, 3, 3, 192, 128, -1)]


@pytest.mark.parametrize("sms", [None, 3, 5])
@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}-s{c[1]}x{c[2]}-h{c[3]}/{c[4]}-d{c[5]}-w{c[7]}" for c in CASES])
def test_greedy_walk_equals_round_robin_and_reference(case, sms, monkeypatch):
    import kernels.interface as iface
    from test_persistent_gpu import _run

    b, sq, sk, h, hkv, d, dv, wl = case
    if sms is not None:
        monkeypatch.setattr(iface, "_sm_count", lambda index: sms)
    _run({"persistent": True, "persistent_greedy": True}, b, sq, sk, h, hkv, d, dv, True, window=(wl, -1))
    q, k, v = _inputs(b, sq, sk, h, hkv, d, dv)
    o_g, l_g = _forward({"persistent": True, "persistent_greedy": True}, q, k, v, True, wl)
    o_r, l_r = _forward({"persistent": True}, q, k, v, True, wl)
    assert torch.equal(o_g, o_r) and torch.equal(l_g, l_r), f"greedy walk != round robin {case} sms={sms}"


def test_non_causal_call_ignores_the_field():
    q, k, v = _inputs(2, 1000, 1000, 2, 2, 128, 128)
    o_g, l_g = _forward({"persistent": True, "persistent_greedy": True}, q, k, v, False)
    o_r, l_r = _forward({"persistent": True}, q, k, v, False)
    assert torch.equal(o_g, o_r) and torch.equal(l_g, l_r)


def test_capture_without_a_table_runs_the_round_robin():
    """A greedy call captured in a CUDA graph at a shape whose walk table was never built (its host-to-device copy
    cannot run in a capture) runs the round-robin kernel instead: the replay's outputs equal the eager greedy call's
    bit for bit, and capturing builds no table."""
    import kernels.interface as iface
    from kernels import AttnConfig
    from kernels.interface import attention_forward, resolve_config

    cfg = resolve_config(AttnConfig(persistent=True, persistent_greedy=True), 128, True)
    scale = 1.0 / math.sqrt(128)
    q, k, v = _inputs(1, 900, 900, 2, 2, 128, 128, seed=5)
    attention_forward(q[:, :, :1], k[:, :, :1], v[:, :, :1], True, scale, cfg)  # compiles both kernels outside
    attention_forward(q[:, :, :1], k[:, :, :1], v[:, :, :1], True, scale,
                      resolve_config(AttnConfig(persistent=True), 128, True))
    torch.cuda.synchronize()
    tables = len(iface._WALK_TABLES)
    out = torch.empty(1, 900, 2, 128, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 900, device="cuda", dtype=torch.float32)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_forward(q, k, v, True, scale, cfg, out=out, lse=lse)
    assert len(iface._WALK_TABLES) == tables
    graph.replay()
    torch.cuda.synchronize()
    o_e, l_e = _forward({"persistent": True, "persistent_greedy": True}, q, k, v, True)
    assert len(iface._WALK_TABLES) == tables + 1  # eager: the table is built
    assert torch.equal(out, o_e) and torch.equal(lse, l_e)
