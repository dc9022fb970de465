"""Compile-only tests of the sm90 forward kernel (CPU, CUTE_DSL_ARCH=sm_90a): every switch value compiles.

The switch space is covered pairwise (every pair of values of any two switches appears in some compiled
config) rather than as the full product, to keep CI short. Plus: two configs give two compiled kernels
through the real interface path (kernels.interface.get_fwd_kernel -> kernels.compile_cache), and invalid
knob combinations fail with a one-line ConfigError.
"""
from __future__ import annotations

import dataclasses
import itertools
import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig, ConfigError  # noqa: E402

FOUR_WG = dict(tile_m=256, consumer_regs=112, producer_regs=24, pingpong=False)

pytestmark = pytest.mark.compile

FACTORS = {
    "hdims": [(64, 64), (128, 128), (256, 256), (192, 128)],
    "causal": [False, True],
    "dtype": ["bfloat16", "float16"],
    "rescale_threshold": [0.0, 8.0],
    "exp2_emu_fraction": [0.0, 0.25, 1.0],
    "pingpong": [True, False],
    # intra_wg_overlap with rescale_before_pv as one factor: rescale_before_pv needs the overlapped loop
    "main_loop": ["overlap", "overlap+rescale_before_pv", "serial"],
}
MAIN_LOOP = {"overlap": dict(intra_wg_overlap=True), "overlap+rescale_before_pv": dict(rescale_before_pv=True),
             "serial": dict(intra_wg_overlap=False)}


def pairwise_configs(factors: dict) -> list[dict]:
    """Greedy covering array of strength 2 (deterministic)."""
    names = list(factors)
    uncovered = {((a, va), (b, vb)) for a, b in itertools.combinations(names, 2)
                 for va in factors[a] for vb in factors[b]}
    candidates = [dict(zip(names, vals)) for vals in itertools.product(*(factors[n] for n in names))]
    rows = []
    while uncovered:
        def gain(c):
            return sum(((a, c[a]), (b, c[b])) in uncovered for a, b in itertools.combinations(names, 2))
        best = max(candidates, key=gain)
        rows.append(best)
        uncovered -= {((a, best[a]), (b, best[b])) for a, b in itertools.combinations(names, 2)}
    return rows


CONFIGS = pairwise_configs(FACTORS)


def test_pairwise_cover_is_small_and_complete():
    assert len(CONFIGS) <= 16
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        seen = {(c[a], c[b]) for c in CONFIGS}
        assert seen == set(itertools.product(FACTORS[a], FACTORS[b])), (a, b)


@pytest.mark.parametrize("row", CONFIGS, ids=lambda r: "-".join(f"{v}" for v in r.values()))
def test_compiles(row):
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel

    hdim, hdim_v = row["hdims"]
    cfg = AttnConfig(rescale_threshold=row["rescale_threshold"], exp2_emu_fraction=row["exp2_emu_fraction"],
                     pingpong=row["pingpong"], **MAIN_LOOP[row["main_loop"]]).resolve("sm90", hdim, row["causal"])
    kern = make_fwd_kernel(cfg, row["dtype"], hdim, hdim_v, row["causal"])
    assert (kern.intra_wg_overlap, kern.rescale_before_pv) == (cfg.intra_wg_overlap, cfg.rescale_before_pv)
    assert compile_fwd(kern, tvm_ffi=False) is not None
    # the compiled exp2 split is whole fragments of tile_n / 8 and is exposed
    n_frag = cfg.tile_n // 8
    assert kern.exp2_emu_fraction_compiled == round(row["exp2_emu_fraction"] * n_frag) / n_frag


@pytest.mark.parametrize("causal,overlap", [(True, False), (False, True)])
def test_three_consumer_warpgroups_compile(causal, overlap):
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel

    cfg = AttnConfig(tile_m=192, consumer_regs=160, producer_regs=32, intra_wg_overlap=overlap).resolve("sm90", 64, causal)
    kern = make_fwd_kernel(cfg, "bfloat16", 64, 64, causal)
    assert kern.num_consumer_wg == 3 and kern.num_threads == 512
    assert compile_fwd(kern, tvm_ffi=False) is not None


# four consumer warpgroups (tile_m=256, 112 registers each, no ping-pong; opt-in, slower than the default on an H100:
# README "Four consumer warpgroups"): the shapes that fit the registers without local memory
@pytest.mark.parametrize("causal,overlap,tile_n", [(False, True, 64), (True, True, 64), (False, False, 96)])
def test_four_consumer_warpgroups_compile_spill_free(causal, overlap, tile_n, tmp_path):
    from fwd_switch_checks import spill_free_sass
    from kernels.sm90.compile import make_fwd_kernel

    fields = dict(FOUR_WG, tile_n=tile_n, intra_wg_overlap=overlap, persistent=False)
    kern = make_fwd_kernel(AttnConfig(**fields).resolve("sm90", 64, causal), "bfloat16", 64, 64, causal)
    assert kern.num_consumer_wg == 4 and kern.num_threads == 640
    spill_free_sass(64, causal, str(tmp_path), **fields)


@pytest.mark.parametrize("extra,match", [(dict(pingpong=True), "pingpong"),
                                         (dict(persistent=True, persistent_dynamic=True), "persistent_dynamic")])
def test_four_consumer_warpgroups_refuse_overlapping_barriers(extra, match):
    from kernels.interface import get_fwd_kernel, resolve_config

    cfg = resolve_config(AttnConfig(**dict(FOUR_WG, tile_n=64, **extra)), 64, False)
    with pytest.raises(ConfigError, match=match) as ei:
        get_fwd_kernel(cfg, "bfloat16", 64, 64, False, tvm_ffi=False)
    assert "\n" not in str(ei.value)


def test_two_configs_two_kernels_through_interface():
    from kernels import compile_cache
    from kernels.interface import compiled_exp2_fraction, get_fwd_kernel, resolve_config

    compile_cache.clear()
    a = resolve_config(AttnConfig(rescale_threshold=0.0), 64, False)
    b = resolve_config(AttnConfig(rescale_threshold=8.0), 64, False)
    ka, ca = get_fwd_kernel(a, "bfloat16", 64, 64, False, tvm_ffi=False)
    kb, cb = get_fwd_kernel(b, "bfloat16", 64, 64, False, tvm_ffi=False)
    assert ca is not cb and (ka.tau, kb.tau) == (0.0, 8.0)
    assert get_fwd_kernel(a, "bfloat16", 64, 64, False, tvm_ffi=False)[1] is ca  # a hit, not a recompile
    recs = compile_cache.compile_records()
    assert len(recs) == 2 and sorted(r.hits for r in recs) == [0, 1]
    assert compiled_exp2_fraction(AttnConfig(exp2_emu_fraction=0.3), 128, False) == 0.3125  # 5 of 16 fragments


def test_rescale_before_pv_is_its_own_kernel_and_refused_without_overlap():
    from kernels import compile_cache
    from kernels.interface import get_fwd_kernel, resolve_config

    compile_cache.clear()
    off = resolve_config(AttnConfig(), 64, False)
    on = resolve_config(AttnConfig(rescale_before_pv=True), 64, False)
    k_off, c_off = get_fwd_kernel(off, "bfloat16", 64, 64, False, tvm_ffi=False)
    k_on, c_on = get_fwd_kernel(on, "bfloat16", 64, 64, False, tvm_ffi=False)
    assert c_on is not c_off and (k_off.rescale_before_pv, k_on.rescale_before_pv) == (False, True)
    # an explicit False is the default's kernel (its key): a hit, no compile
    assert get_fwd_kernel(resolve_config(AttnConfig(rescale_before_pv=False), 64, False), "bfloat16", 64, 64, False,
                          tvm_ffi=False)[1] is c_off
    assert len(compile_cache.compile_records()) == 2
    with pytest.raises(ConfigError, match="rescale_before_pv=True with intra_wg_overlap=False") as ei:
        AttnConfig(rescale_before_pv=True, intra_wg_overlap=False)
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize("kwargs,dtype,match", [
    (dict(rescale_threshold=16.0), "float16", "rescale_threshold"),
    (dict(tile_m=256), "bfloat16", "tile_m=256"),  # 4 consumer warpgroups with ping-pong (the default)
    (dict(tile_m=192), "bfloat16", "registers"),  # 3 consumer warpgroups cannot have 240 registers each
    (dict(num_stages=4, tile_n=128), "bfloat16", "shared memory"),
])
def test_invalid_combinations_fail_clearly(kwargs, dtype, match):
    from kernels.interface import get_fwd_kernel, resolve_config

    cfg = resolve_config(dataclasses.replace(AttnConfig(), **kwargs), 128, False)
    with pytest.raises(ConfigError, match=match) as ei:
        get_fwd_kernel(cfg, dtype, 128, 128, False, tvm_ffi=False)
    assert "\n" not in str(ei.value)
