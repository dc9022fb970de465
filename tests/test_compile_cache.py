"""The compile cache keys on the whole config: two configs never share a compiled kernel."""
import pytest

from kernels import AttnConfig
from kernels import compile_cache as cc


def _key(cfg, **kw):
    args = dict(kind="fwd", cfg=cfg.resolve("sm90", 128, False), dtype="bfloat16", hdim=128, hdim_v=128, causal=False, arch="sm_90a")
    args.update(kw)
    return cc.cache_key(**args)


def test_every_field_changes_the_key():
    base = AttnConfig()
    variants = [AttnConfig(rescale_threshold=0.0), AttnConfig(exp2_emu_fraction=0.5), AttnConfig(pingpong=False),
                AttnConfig(intra_wg_overlap=False), AttnConfig(deterministic=True), AttnConfig(two_cta=True),
                AttnConfig(tile_n=64), AttnConfig(num_stages=3)]
    keys = {_key(base)} | {_key(v) for v in variants}
    assert len(keys) == 1 + len(variants)
    assert _key(base, causal=True) != _key(base)
    assert _key(base, dtype="float16") != _key(base)


def test_two_configs_two_builds_and_hits_counted():
    cc.clear()
    built = []
    k1, k2 = _key(AttnConfig()), _key(AttnConfig(rescale_threshold=0.0))
    a = cc.get_or_compile(k1, lambda: built.append(1) or "kernel-a")
    b = cc.get_or_compile(k2, lambda: built.append(2) or "kernel-b")
    a2 = cc.get_or_compile(k1, lambda: built.append(3) or "kernel-c")
    assert (a, b, a2) == ("kernel-a", "kernel-b", "kernel-a") and built == [1, 2]
    assert {r.hits for r in cc.compile_records()} == {0, 1}


def test_unresolved_config_rejected():
    with pytest.raises(ValueError, match="resolved"):
        cc.cache_key("fwd", AttnConfig(), "bfloat16", 128, 128, False, "sm90")


def test_per_call_memos_keep_configs_apart():
    """The per-call fast paths (memoised resolution and key) return one object per input and never merge
    configs that differ in any field (here only the backward's det_schedule / bwd_tile_m)."""
    from kernels import AttnConfig
    from kernels.compile_cache import cache_key
    from kernels.interface import resolve_config

    a = resolve_config(AttnConfig(deterministic=True), 64, True)
    assert resolve_config(AttnConfig(deterministic=True), 64, True) is a
    b = resolve_config(AttnConfig(deterministic=True, det_schedule="naive"), 64, True)
    c = resolve_config(AttnConfig(deterministic=True, bwd_tile_m=64), 64, True)
    keys = {cache_key("bwd", r, "bfloat16", 64, 64, True, "sm90") for r in (a, b, c)}
    assert len(keys) == 3
    assert cache_key("bwd", a, "bfloat16", 64, 64, True, "sm90") != cache_key("bwd", a, "float16", 64, 64, True, "sm90")
