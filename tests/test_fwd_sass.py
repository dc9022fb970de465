"""SASS structure of the sm90 forward kernel, from cubins compiled on the CPU (CUTE_DSL_ARCH=sm_90a).

Checks that the mechanisms are really in the machine code: wgmma (HGMMA), TMA loads/stores (UTMALDG /
UTMASTG), the exp2 split (MUFU.EX2 count falls and FFMA count rises with exp2_emu_fraction; no F2I / FRND,
which would put the software exp2 back on the MUFU pipe), the tau decision (a warp vote only when tau > 0),
and no local-memory spills (LDL / STL) in the default configs.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import count, find_nvdisasm, fwd_sass, opcode_counts  # noqa: E402

pytestmark = [pytest.mark.compile,
              pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip nvidia-cuda-nvdisasm)")]

_CACHE: dict = {}


def sass_counts(tmp_path_factory, hdim=128, causal=False, dtype="bfloat16", **switches):
    key = (hdim, causal, dtype, tuple(sorted(switches.items())))
    if key not in _CACHE:
        cfg = AttnConfig(**switches).resolve("sm90", hdim, causal)
        hdim_v = 128 if hdim == 192 else hdim
        workdir = str(tmp_path_factory.mktemp("sass"))
        _CACHE[key] = opcode_counts(fwd_sass(cfg, dtype, hdim, hdim_v, causal, workdir))
    return _CACHE[key]


def test_wgmma_and_tma_present(tmp_path_factory):
    c = sass_counts(tmp_path_factory)
    assert count(c, "HGMMA") > 0
    assert count(c, "UTMALDG") > 0
    assert count(c, "UTMASTG") > 0


def test_exp2_split_moves_work_from_mufu_to_fma(tmp_path_factory):
    fracs = (0.0, 0.25, 1.0)
    cs = [sass_counts(tmp_path_factory, hdim=64, exp2_emu_fraction=f) for f in fracs]
    mufu = [count(c, "MUFU.EX2") for c in cs]
    ffma = [count(c, "FFMA") for c in cs]
    assert mufu[0] > mufu[1] > mufu[2], mufu
    assert ffma[0] < ffma[1] < ffma[2], ffma
    # fully emulated: the only EX2 left are the per-row rescale factors (a handful), not the 64 per block
    assert mufu[2] < mufu[0] / 8, mufu
    for c in cs:
        assert count(c, "F2I") == 0 and count(c, "FRND") == 0, "float->int conversion on the MUFU pipe"


def test_tau_decision_is_a_warp_vote(tmp_path_factory):
    on = sass_counts(tmp_path_factory, rescale_threshold=8.0)
    off = sass_counts(tmp_path_factory, rescale_threshold=0.0)
    assert count(on, "VOTE") > 0
    assert count(off, "VOTE") == 0
    assert on != off


@pytest.mark.parametrize("hdim,causal", [(64, False), (128, False), (128, True), (256, False)])
def test_no_spills_in_default_configs(tmp_path_factory, hdim, causal):
    c = sass_counts(tmp_path_factory, hdim=hdim, causal=causal)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0, {k: v for k, v in c.items() if k.startswith(("LDL", "STL"))}
