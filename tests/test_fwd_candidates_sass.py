"""SASS of the forward's issue-11 candidates (FlashFwdSm90 class attributes, off by default), compiled on the CPU
(sm_90a) at head dims (192, 128): no local-memory spills, the same GEMMs as the default, the tau vote kept; and
branchless_tau leaves no tau branch in the kernel (fewer branches than the default)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import count, find_nvdisasm, kernel_sass, opcode_counts  # noqa: E402

pytestmark = [pytest.mark.compile,
              pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip nvidia-cuda-nvdisasm)")]

_CACHE: dict = {}


def _counts(tmp_path_factory, causal: bool, **attrs):
    key = (causal, tuple(sorted(attrs.items())))
    if key not in _CACHE:
        from kernels.sm90.compile import make_fwd_kernel

        kern = make_fwd_kernel(AttnConfig().resolve("sm90", 192, causal), "bfloat16", 192, 128, causal)
        for name, val in attrs.items():
            assert hasattr(kern, name), name
            setattr(kern, name, val)
        _CACHE[key] = opcode_counts(kernel_sass(kern, str(tmp_path_factory.mktemp("cand"))))
    return _CACHE[key]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attrs", [dict(rescale_before_pv=True), dict(branchless_tau=True),
                                   dict(rescale_before_pv=True, branchless_tau=True)])
def test_candidate_sass(tmp_path_factory, causal, attrs):
    base = _counts(tmp_path_factory, causal)
    c = _counts(tmp_path_factory, causal, **attrs)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    assert count(c, "HGMMA") == count(base, "HGMMA") and count(c, "MUFU.EX2") == count(base, "MUFU.EX2")
    assert count(c, "VOTE") == count(base, "VOTE") > 0  # the tau decision is still a warp vote
    if attrs.get("branchless_tau"):
        assert count(c, "BRA") < count(base, "BRA")
