"""GPU tests of the split tail (AttnConfig(split_tail=True), kernels/sm90/fwd_tail.py): out and lse against the fp64
reference by test_persistent_gpu's rule, out / lse NaN-poisoned; the tiles of the full rounds bitwise the plain
persistent kernel's (the split changes only the last partial round's tiles); the SM count patched down
(``kernels.interface._sm_count``) so that pieces span two tiles and CTAs walk many rounds; split_tail_pays patched to
True (the split at every shape), except in the test of the default.

    python -m pytest -q tests/test_fwd_split_tail_gpu.py
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

import kernels.interface as _itf  # noqa: E402

_REAL_PAYS = _itf.split_tail_pays

from test_persistent_gpu import _run  # noqa: E402  (reference check, NaN-poisoned out / lse)


@pytest.fixture(autouse=True)
def _split_always_pays(monkeypatch):
    """These tests check the split's mechanics at small shapes, where kernels.interface.split_tail_pays (the policy:
    tests/test_fwd_split_tail.py) would run the plain kernel: it answers True here."""
    import kernels.interface as itf

    monkeypatch.setattr(itf, "split_tail_pays", lambda sms, tail, n_blocks: True)
    itf.split_tail_launch.cache_clear()
    yield
    itf.split_tail_launch.cache_clear()

CASES = [  # b, sq, sk, h, hkv, d, dv
    (2, 1000, 1000, 9, 9, 128, 128),
    (1, 4096, 4096, 16, 16, 128, 128),
    (2, 1000, 1500, 9, 3, 128, 128),
    (2, 1000, 777, 24, 24, 64, 64),
    (1, 2048, 2048, 11, 11, 192, 128),
    (2, 1000, 1000, 9, 9, 256, 256),
    (1, 128, 4096, 8, 8, 128, 128),  # fewer tiles than SMs: every tile cut (a short query over a long K/V)
    (1, 128, 256, 4, 4, 128, 128),  # 8 blocks in all: on 132 SMs most CTAs get no piece and no tile
]


def _ids(c):
    return "b{}_sq{}_sk{}_h{}-{}_d{}-{}".format(*c)


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("sms", [None, 5])
def test_split_tail_matches_reference(case, sms, monkeypatch):
    import kernels.interface as itf

    if sms is not None:
        monkeypatch.setattr(itf, "_sm_count", lambda index: sms)
    b, sq, sk, h, hkv, d, dv = case
    _run(dict(persistent=True, split_tail=True), b, sq, sk, h, hkv, d, dv, False)


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("sms", [None, 5])
def test_split_tail_full_rounds_bitwise(case, sms, monkeypatch):
    """Rows of the full rounds' tiles equal the plain persistent kernel's bit for bit; the tail's within 2^-6 of the
    largest output (the merge rounds once more)."""
    import kernels.interface as itf
    from kernels import AttnConfig
    from kernels.interface import attention_forward, resolve_config, split_tail_launch

    if sms is not None:
        monkeypatch.setattr(itf, "_sm_count", lambda index: sms)
    b, sq, sk, h, hkv, d, dv = case
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = 1.0 / math.sqrt(d)
    outs = {}
    for split in (False, True):
        cfg = resolve_config(AttnConfig(persistent=True, split_tail=split), d, False)
        outs[split] = attention_forward(q, k, v, False, scale, cfg)
    torch.cuda.synchronize()
    cfg = resolve_config(AttnConfig(persistent=True), d, False)
    m_blocks = -(-sq // cfg.tile_m)
    tiles = m_blocks * h * b
    split_cfg, grid = split_tail_launch(resolve_config(AttnConfig(persistent=True, split_tail=True), d, False), False,
                                       itf._sm_count(0), tiles, -(-sk // cfg.tile_n))
    assert split_cfg.split_tail, "the case must leave a partial round"
    n_full = tiles - tiles % grid
    full = torch.zeros(b, h, sq, dtype=torch.bool, device="cuda")
    for t in range(n_full):  # non-causal tile order: m_block fastest, then head, then batch
        hb, m = divmod(t, m_blocks)
        bi, hi = divmod(hb, h)
        full[bi, hi, m * cfg.tile_m:(m + 1) * cfg.tile_m] = True
    (o0, l0), (o1, l1) = outs[False], outs[True]
    fo = full.permute(0, 2, 1)  # (b, s, h)
    assert torch.equal(o0[fo], o1[fo]) and torch.equal(l0[full], l1[full])
    tail = ~fo
    assert tail.any()
    diff = (o0[tail].float() - o1[tail].float()).abs().max().item()
    assert diff <= 2 ** -6 * o0[tail].float().abs().max().item() + 1e-3  # one more rounding than the plain kernel
    assert (l0[~full] - l1[~full]).abs().max().item() < 1e-4


@pytest.mark.parametrize("variant", [dict(dtype="float16"), dict(cap=30.0), dict(pingpong=False),
                                     dict(intra_wg_overlap=False)], ids=["fp16", "softcap", "no_pingpong", "no_overlap"])
def test_split_tail_with_the_other_switches(variant, monkeypatch):
    """The split tail under fp16, a softcap, pingpong off and the serial main loop (intra_wg_overlap=False): the
    reference check with the SM count at 5 (pieces span two tiles) and as is."""
    import kernels.interface as itf

    kw = dict(variant)
    dtype = torch.float16 if kw.pop("dtype", None) == "float16" else torch.bfloat16
    cap = kw.pop("cap", 0.0)
    for sms in (5, None):
        if sms is not None:
            monkeypatch.setattr(itf, "_sm_count", lambda index: sms)
        else:
            monkeypatch.undo()
        _run(dict(persistent=True, split_tail=True, **kw), 2, 1000, 1000, 9, 9, 128, 128, False, cap=cap, dtype=dtype)


def test_split_tail_default_at_a_decode_shape(monkeypatch):
    """hd128 non-causal runs the split tail by default where it pays (DEFAULTS' split_tail with persistent_max_seqlen,
    kernels.interface.split_tail_pays unpatched): 128 queries over 8192 keys, 8 heads (8 tiles, 64 blocks each) on
    the GPU's own SM count, against the reference; then split_tail=True at hd256 / (192, 128), where the length
    leaves the call one tile per CTA: persistent for the split."""
    import kernels.interface as itf
    from kernels import AttnConfig
    from kernels.interface import forward_config, resolve_config

    monkeypatch.setattr(itf, "split_tail_pays", _REAL_PAYS)
    itf.split_tail_launch.cache_clear()
    cfg = forward_config(resolve_config(AttnConfig(), 128, False), 128, False, 128)
    assert cfg.persistent and cfg.split_tail
    sms = itf._sm_count(0)
    assert itf.split_tail_launch(cfg, False, sms, 8, 64)[0].split_tail, "the shape must pay on this GPU"
    _run(dict(), 1, 128, 8192, 8, 8, 128, 128, False)
    # split_tail=True with persistent=None at head dims the length leaves one tile per CTA: persistent for the split
    for d, dv in ((256, 256), (192, 128)):
        c = resolve_config(AttnConfig(split_tail=True), d, False)
        assert itf.split_tail_launch(c, False, sms, 8, -(-8192 // c.tile_n), True)[0].persistent
        _run(dict(split_tail=True), 1, 128, 8192, 8, 8, d, dv, False)
