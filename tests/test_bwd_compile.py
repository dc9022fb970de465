"""Compile-only tests of the sm90 backward (CUTE_DSL_ARCH=sm_90a, fake tensors, no GPU).

Switch combinations are covered pairwise (every pair of values of deterministic x exp2 fraction x causal x
hdim x dtype x two_cta appears in some row) to keep CI small; the wide head dims (256, (192, 128)) have their own
pairwise rows (one CTA; two_cta at hd256 is tested in tests/test_bwd_wide_two_cta.py, at (192, 128) a ConfigError).
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.compile

# (deterministic, exp2_emu_fraction, causal, hdim, dtype, two_cta): a pairwise covering array of six factors
PAIRWISE = [
    (False, 0.0, False, 64, "bfloat16", False),
    (True, 0.0, True, 128, "float16", True),
    (False, 0.5, True, 128, "bfloat16", True),
    (True, 0.5, False, 64, "float16", False),
    (False, 1.0, False, 128, "float16", False),
    (True, 1.0, True, 64, "bfloat16", True),
    (False, 0.5, False, 64, "bfloat16", True),
    (True, 1.0, True, 128, "float16", False),
]


def test_pairwise_array_covers_every_pair():
    import itertools

    for a, b in itertools.combinations(range(6), 2):
        seen = {(row[a], row[b]) for row in PAIRWISE}
        va = {row[a] for row in PAIRWISE}
        vb = {row[b] for row in PAIRWISE}
        assert seen == set(itertools.product(va, vb)), (a, b)


@pytest.mark.parametrize("det,frac,causal,hdim,dtype,two_cta", PAIRWISE)
def test_bwd_compiles(det, frac, causal, hdim, dtype, two_cta):
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    out = compile_backward(AttnConfig(deterministic=det, exp2_emu_fraction=frac, two_cta=two_cta), dtype, hdim,
                           causal)
    assert set(out) >= {"pre", "main", "post"}
    groups = out["tile_m"] // 8
    assert out["exp2_fraction_compiled"] == round(frac * groups) / groups


# the wide head dims (kernels/sm90/bwd_wide.py, one CTA): (deterministic, exp2_emu_fraction, causal,
# (hdim, hdim_v), dtype), pairwise over the first four factors with the dtype alternating
WIDE = [
    (False, 0.0, False, (256, 256), "bfloat16"),
    (True, 0.5, True, (256, 256), "float16"),
    (False, 1.0, True, (192, 128), "bfloat16"),
    (True, 0.0, True, (192, 128), "float16"),
    (True, 1.0, False, (256, 256), "bfloat16"),
    (False, 0.5, False, (192, 128), "float16"),
]


def test_wide_pairwise_array_covers_every_pair():
    import itertools

    for a, b in itertools.combinations(range(5), 2):
        if b == 4 and a != 3:
            continue  # the dtype alternates with the head dims only
        seen = {(row[a], row[b]) for row in WIDE}
        assert seen == set(itertools.product({r[a] for r in WIDE}, {r[b] for r in WIDE})), (a, b)


@pytest.mark.parametrize("det,frac,causal,hdims,dtype", WIDE, ids=lambda v: f"hd{v[0]}_{v[1]}" if isinstance(v, tuple) else None)
def test_bwd_wide_compiles(det, frac, causal, hdims, dtype):
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    hdim, hdim_v = hdims
    out = compile_backward(AttnConfig(deterministic=det, exp2_emu_fraction=frac), dtype, hdim, causal, hdim_v=hdim_v)
    assert set(out) >= {"pre", "main", "post"}
    if hdims == (192, 128):  # kernels/sm90/bwd_wide192.py: 64 x 128 tiles, S^T 64 x 64 per warpgroup (8 fragments)
        assert (out["tile_m"], out["tile_n"]) == (64, 128)
        groups = out["tile_m"] // 8
    else:  # hd256 default, deterministic too: 2-CTA pairs with 80-row K/V tiles (bwd_wide_two_cta80.py), S_w 64 x 40
        assert (out["tile_m"], out["tile_n"]) == (64, 80)
        groups = 40 // 8
    assert out["exp2_fraction_compiled"] == round(frac * groups) / groups


def test_wide_smem_and_stages():
    """hd256: two Q stages, one dO stage, dQ in two GEMMs per warpgroup through one 16 KB buffer each; (192, 128):
    two Q/dO stages, one dQ GEMM per warpgroup; both under 227 KB."""
    import cutlass

    from kernels.sm90.bwd_wide import FlashBwdWideSm90

    k256 = FlashBwdWideSm90(cutlass.BFloat16, 256, False, hdim_v=256)
    k192 = FlashBwdWideSm90(cutlass.BFloat16, 192, True, hdim_v=128)
    assert (k256.q_stages, k256.do_stages, k256.dq_pieces, k256.dq_stages) == (2, 1, 2, 1)
    assert (k192.q_stages, k192.do_stages, k192.dq_pieces, k192.dq_stages) == (2, 2, 1, 1)
    assert k256.dq_shape == (64, 64) and k192.dq_shape == (64, 96)
    assert k256.smem_bytes == 2 * 33024 + 33024 + 2 * 32768 + 2 * 8192 + 2 * 16384
    assert max(k256.smem_bytes, k192.smem_bytes) <= 227 * 1024 - 2048
    assert k192.atom_qk == 32 and k256.atom_qk == 64  # halves of the head dim start on a swizzle atom


def test_distinct_configs_distinct_kernels():
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    a = compile_backward(AttnConfig(deterministic=False, exp2_emu_fraction=0.0), "bfloat16", 64, False)
    b = compile_backward(AttnConfig(deterministic=True, exp2_emu_fraction=0.0), "bfloat16", 64, False)
    assert a["main"] is not b["main"]


@pytest.mark.parametrize("cfg,hdim,hdim_v,match", [
    (dict(two_cta=True, deterministic=True), 192, 128, "two_cta=True at hdim 192"),
    (dict(bwd_tile_m=128), 256, 256, "bwd_tile_m=128 at hdim 256"),
    (dict(bwd_tile_m=128), 128, 128, "bwd_tile_m=128 at hdim 128"),
    (dict(bwd_tile_m=80), 64, 64, "bwd_tile_m=80 at hdim 64"),
    (dict(bwd_tile_m=80), 256, 256, "bwd_tile_m=80 at hdim 256"),
    (dict(bwd_tile_m=80, two_cta=True), 128, 128, "bwd_tile_m=80 at hdim 128, two_cta=True"),
    (dict(), 192, 192, r"\(head_dim, head_dim_v\)=\(192, 192\)"),
    (dict(), 128, 64, r"\(head_dim, head_dim_v\)=\(128, 64\)"),
])
def test_unsupported_rejected(cfg, hdim, hdim_v, match):
    """Combinations the sm90 backward does not compile are ConfigErrors naming the field, before any compile."""
    from kernels import AttnConfig, ConfigError
    from kernels.sm90.backward import compile_backward

    with pytest.raises(ConfigError, match=match):
        compile_backward(AttnConfig(**cfg), "bfloat16", hdim, False, hdim_v=hdim_v)


def test_wide_kernel_rejects_two_cta_directly():
    import cutlass

    from kernels.sm90.bwd_wide import FlashBwdWideSm90

    with pytest.raises(ValueError, match="two_cta"):
        FlashBwdWideSm90(cutlass.BFloat16, 256, False, two_cta=True, hdim_v=256)


def test_window_softcap_defaults_are_the_plain_kernels():
    """window (-1, -1) and softcap 0 are the plain kernels (same cache entry); a non-causal right bound of 0 is causal."""
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    plain = compile_backward(AttnConfig(), "bfloat16", 64, False)
    assert compile_backward(AttnConfig(), "bfloat16", 64, False, window_left=-1, window_right=-1, softcap=0.0) is plain
    causal = compile_backward(AttnConfig(), "bfloat16", 64, True)
    assert compile_backward(AttnConfig(), "bfloat16", 64, False, window_right=0) is causal


@pytest.mark.parametrize("det,causal,dtype,window_left", [(False, False, "float16", -1), (True, True, "bfloat16", -1),
                                                          (False, True, "bfloat16", 100), (True, False, "float16", 100)])
def test_tile_m_80_compiles(det, causal, dtype, window_left):
    """bwd_tile_m=80 at hd128 (opt-in): plain, deterministic, fp16 and with a sliding window compile (the postprocess
    maps the transposed dQ^T chunks back); with a softcap the call runs 64-row tiles (80 spills there)."""
    from kernels import AttnConfig, ConfigError
    from kernels.sm90.backward import compile_backward

    out = compile_backward(AttnConfig(bwd_tile_m=80, deterministic=det, exp2_emu_fraction=0.5), dtype, 128, causal,
                           window_left=window_left)
    assert out["tile_m"] == 80 and out["tile_n"] == 128
    assert out["exp2_fraction_compiled"] == 0.5  # 10 fragments per thread, 5 emulated
    capped = compile_backward(AttnConfig(bwd_tile_m=80, deterministic=det), dtype, 128, causal,
                              window_left=window_left, softcap=30.0)
    assert capped["tile_m"] == 64


@pytest.mark.parametrize("hdims", [(64, 64), (128, 128), (192, 128)], ids=["64", "128", "192x128"])
def test_det_schedule_rotate_compiles(hdims):
    """det_schedule="rotate" (deterministic non-causal: rotated Q-tile walks, arrival-order dQ turns) compiles its own
    main kernel at hd 64, 128 (80-row tiles) and (192, 128); pre / post are the deterministic default's."""
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    hdim, hdim_v = hdims
    rot = compile_backward(AttnConfig(deterministic=True, det_schedule="rotate"), "bfloat16", hdim, False,
                           hdim_v=hdim_v)
    spt = compile_backward(AttnConfig(deterministic=True, det_schedule="spt"), "bfloat16", hdim, False, hdim_v=hdim_v)
    assert rot["main"] is not spt["main"]
    default = compile_backward(AttnConfig(deterministic=True), "bfloat16", hdim, False, hdim_v=hdim_v)
    if hdim == 64:  # hd64's non-causal deterministic default since 2026-12-04: lpt, 16 heads, two staging buffers
        rot = compile_backward(AttnConfig(deterministic=True, det_schedule="lpt", bwd_lpt_heads=16, bwd_dq_stages=2),
                               "bfloat16", hdim, False, hdim_v=hdim_v)
    assert default["main"] is rot["main"]  # rotate is the default elsewhere (2026-12-01)
    assert (rot["tile_m"], rot["tile_n"]) == (spt["tile_m"], spt["tile_n"])


def test_det_schedule_rotate_causal_is_spt():
    """Causal (and hd256, windows, two_cta, varlen: tests/test_det_schedule.py) "rotate" runs the "spt" kernel: the same
    cache key, so the same compiled object."""
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    rot = compile_backward(AttnConfig(deterministic=True, det_schedule="rotate"), "bfloat16", 64, True)
    spt = compile_backward(AttnConfig(deterministic=True), "bfloat16", 64, True)
    assert rot["main"] is spt["main"]


def test_schedule_candidate_fields():
    """bwd_lpt_heads / bwd_rotate_q (opt-in): left out of to_dict() (hash, cache key) at their defaults, dropped from the
    forward's compiled config, validated; the kernel takes lpt_heads only where it applies (causal, not deterministic,
    one CTA, not varlen: deterministic keeps the SPT grid its dQ turns need) and rotate_q only non-causal."""
    from kernels import AttnConfig, ConfigError
    from kernels.sm90.backward import _main_kernel, _cutlass_dtype
    from kernels.tiles import compiled_config

    assert AttnConfig().config_hash() == AttnConfig(bwd_rotate_q=False).config_hash()
    # bwd_lpt_heads None: DEFAULTS' (sm90 causal: hd64 1, hd128 4); an explicit value, 0 included, is its own config
    assert AttnConfig(bwd_lpt_heads=0).config_hash() != AttnConfig().config_hash()
    assert AttnConfig(bwd_lpt_heads=4).config_hash() != AttnConfig().config_hash()
    assert AttnConfig().resolve("sm90", 64, True).bwd_lpt_heads == 1
    assert AttnConfig().resolve("sm90", 128, True).bwd_lpt_heads == 4
    assert AttnConfig().resolve("sm90", 128, False).bwd_lpt_heads is None  # non-causal: left None (old hash, key)
    for field, value in (("bwd_lpt_heads", 4), ("bwd_rotate_q", True)):
        assert field not in compiled_config(AttnConfig(**{field: value}), "sm90", 128, True, "fwd")
        assert compiled_config(AttnConfig(**{field: value}), "sm90", 128, True, "bwd")[field] == value
    for bad in (dict(bwd_lpt_heads=-1), dict(bwd_lpt_heads=True), dict(bwd_lpt_heads=65), dict(bwd_rotate_q=1)):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            AttnConfig(**bad)
    dt = _cutlass_dtype("bfloat16")
    main = lambda cfg, causal, hd=64: _main_kernel(dt, cfg.resolve("sm90", hd, causal), hd, hd, causal)
    k = main(AttnConfig(bwd_lpt_heads=4, two_cta=False), True)
    assert (k.lpt_heads, k.spt) == (4, False)
    k = main(AttnConfig(bwd_lpt_heads=4, deterministic=True, two_cta=False), True)
    assert (k.lpt_heads, k.spt) == (0, True)
    assert main(AttnConfig(two_cta=False, bwd_lpt_heads=0), True).spt  # 0: shortest first (the default until 2026-12-01)
    k = main(AttnConfig(two_cta=False), True)
    assert (k.lpt_heads, k.spt) == (1, False)  # hd64 causal's default: longest first
    assert main(AttnConfig(bwd_rotate_q=True, two_cta=False), False, 128).m_rotate
    assert not main(AttnConfig(two_cta=False), False, 128).m_rotate
    assert not main(AttnConfig(bwd_rotate_q=True, two_cta=False), True, 128).m_rotate


def test_bwd_pdl_field():
    """bwd_pdl (on at hd 64 / 128): None is left out of to_dict() (old hashes and keys), an explicit value is its own
    config; resolve() fills True only where DEFAULTS says so; dropped from the forward's compiled config; validated. The main
    kernel takes it only as FlashBwdSm90 without varlen (the wide kernels and varlen launch without it), and the
    preprocess / postprocess follow the main kernel (_build)."""
    from kernels import AttnConfig, ConfigError
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel
    from kernels.tiles import compiled_config

    assert "bwd_pdl" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_pdl=True).config_hash() != AttnConfig().config_hash()
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            # on by default at hd 64 / 128 (DEFAULTS' pairs), filled only there
            assert AttnConfig().resolve("sm90", hd, causal).bwd_pdl is (True if hd in (64, 128) else None)
            assert AttnConfig(bwd_pdl=False).resolve("sm90", hd, causal).bwd_pdl is False
    assert "bwd_pdl" not in compiled_config(AttnConfig(bwd_pdl=True), "sm90", 128, False, "fwd")
    assert compiled_config(AttnConfig(bwd_pdl=True), "sm90", 128, False, "bwd")["bwd_pdl"] is True
    for bad in (1, 0, "yes"):
        with pytest.raises(ConfigError, match="bwd_pdl"):
            AttnConfig(bwd_pdl=bad)
    dt = _cutlass_dtype("bfloat16")
    main = lambda cfg, hd, hv=None, **kw: _main_kernel(dt, cfg.resolve("sm90", hd, False), hd, hv or hd, False, **kw)
    assert main(AttnConfig(bwd_pdl=True, two_cta=False), 128).pdl
    assert main(AttnConfig(bwd_pdl=True, two_cta=True), 64).pdl
    assert main(AttnConfig(two_cta=False), 128).pdl  # the hd128 default
    assert not main(AttnConfig(bwd_pdl=False, two_cta=False), 128).pdl
    assert main(AttnConfig(two_cta=False), 64).pdl  # the hd64 default (for bwd_stream_post)
    assert not main(AttnConfig(bwd_pdl=False, two_cta=False), 64).pdl
    assert not main(AttnConfig(bwd_pdl=True, two_cta=False), 128, varlen=True).pdl
    assert not main(AttnConfig(bwd_pdl=True, two_cta=False), 256).pdl  # FlashBwdWideSm90
    assert not main(AttnConfig(bwd_pdl=True, two_cta=False), 192, 128).pdl  # FlashBwd192Sm90


def test_bwd_dq_chunk_release_field():
    """bwd_dq_chunk_release (opt-in): None left out of to_dict(); not in the forward's compiled config; validated; the
    kernel takes it as FlashBwdSm90 only and ignores it when deterministic (its writer waits for every reduction)."""
    from kernels import AttnConfig, ConfigError
    from kernels.sm90.backward import _cutlass_dtype, _main_kernel
    from kernels.tiles import compiled_config

    assert "bwd_dq_chunk_release" not in AttnConfig().to_dict()
    assert AttnConfig(bwd_dq_chunk_release=True).config_hash() != AttnConfig().config_hash()
    assert AttnConfig().resolve("sm90", 128, False).bwd_dq_chunk_release is None
    assert "bwd_dq_chunk_release" not in compiled_config(AttnConfig(bwd_dq_chunk_release=True), "sm90", 128, False,
                                                         "fwd")
    with pytest.raises(ConfigError, match="bwd_dq_chunk_release"):
        AttnConfig(bwd_dq_chunk_release=1)
    dt = _cutlass_dtype("bfloat16")
    main = lambda cfg, hd, hv=None: _main_kernel(dt, cfg.resolve("sm90", hd, False), hd, hv or hd, False)
    assert main(AttnConfig(bwd_dq_chunk_release=True, two_cta=False), 128).dq_chunk_release
    assert main(AttnConfig(bwd_dq_chunk_release=True, two_cta=False), 64).dq_chunk_release
    assert not main(AttnConfig(two_cta=False), 128).dq_chunk_release
    assert not main(AttnConfig(bwd_dq_chunk_release=True, deterministic=True, two_cta=False), 128).dq_chunk_release
    assert not main(AttnConfig(bwd_dq_chunk_release=True, two_cta=False), 256).dq_chunk_release
