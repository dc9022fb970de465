"""Compile-only tests of the sm90 backward (CUTE_DSL_ARCH=sm_90a, fake tensors, no GPU).

Switch combinations are covered pairwise (every pair of values of deterministic x exp2 fraction x causal x
hdim x dtype x two_cta appears in some row) to keep CI small.
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


def test_distinct_configs_distinct_kernels():
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    a = compile_backward(AttnConfig(deterministic=False, exp2_emu_fraction=0.0), "bfloat16", 64, False)
    b = compile_backward(AttnConfig(deterministic=True, exp2_emu_fraction=0.0), "bfloat16", 64, False)
    assert a["main"] is not b["main"]


def test_unsupported_rejected():
    from kernels import AttnConfig, ConfigError
    from kernels.sm90.backward import compile_backward

    with pytest.raises(ConfigError, match="hdim=256"):
        compile_backward(AttnConfig(), "bfloat16", 256, False)
