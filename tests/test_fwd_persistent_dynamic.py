"""AttnConfig.persistent_dynamic (sm90 persistent forward, opt-in): tiles claimed at run time from an atomic counter by
the producer warp and handed to the consumer warpgroups through shared memory (kernels/sm90/fwd.py roles_persistent;
named barriers kernels/sm90/barriers.py FWD_TILE_EMPTY / FWD_TILE_FULL_WG1).

CPU tests: the field's rules, the call config (kernels.interface.dynamic_config: the static walks yield to it, a call
that does not run persistent drops it), the kernel switch, and the machine code (one global atomic add, the handoff
barriers with their thread counts, no local memory, uniform loops). GPU checks (bitwise the static kernel's outputs, many
tiles per CTA, CUDA graph replay): tests/test_fwd_persistent_dynamic_gpu.py.
"""
from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_rules():
    check_forward_field("persistent_dynamic")


def test_call_config_drops_the_static_walks_or_the_switch():
    from kernels.interface import dynamic_config

    cfg = AttnConfig(persistent=True, persistent_dynamic=True, persistent_greedy=True, persistent_snake=True,
                     split_tail=True).resolve("sm90", 128, True)
    got = dynamic_config(cfg)
    assert got.persistent_dynamic and got.persistent
    assert not got.persistent_greedy and not got.persistent_snake and not got.split_tail
    one = AttnConfig(persistent=False, persistent_dynamic=True).resolve("sm90", 128, False)
    assert dynamic_config(one).persistent_dynamic is None  # the one-tile kernel and its key


def test_kernel_switch():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    k = FlashFwdSm90(bf, 128, 128, True, persistent=True, persistent_dynamic=True, persistent_greedy=True)
    assert k.dynamic and not k.greedy and not k.snake
    k = FlashFwdSm90(bf, 128, 128, False, persistent=True, persistent_dynamic=True, split_tail=True)
    assert k.dynamic and not k.split_tail
    assert not FlashFwdSm90(bf, 128, 128, False, persistent_dynamic=True).dynamic  # one tile per CTA: nothing to claim


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal,seqlen,wgs", [(128, False, 16384, 2), (64, True, 1024, 3)],
                         ids=["hd128_nc", "hd64_causal_192row"])
def test_machine_code_claims_and_hands_over(hdim, causal, seqlen, wgs, tmp_path):
    """The dynamic kernel of a default call made persistent: one ATOMG add (the producer's claim), the empty barrier
    (id 8) over the producer warp and every consumer thread, one full barrier per consumer warpgroup (ids 9..) over the
    producer warp and that warpgroup; the static kernel has neither. No local memory, no R2UR in the K/V loops."""
    from kernels.config import call_config
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, opcode_counts, steady_state_loops
    from sass_cache import kernel_sass

    def sass_of(dynamic):
        # p_before_vote (the hd128 non-causal default since session 63) off: the dynamic kernel (opt-in non-causal)
        # was measured without it; with it ptxas keeps the K pipeline state in vector registers (3 R2UR per block)
        cfg = call_config(AttnConfig(persistent=True, persistent_dynamic=dynamic, p_before_vote=False).resolve(
            "sm90", hdim, causal), "sm90", hdim, causal, seqlen)
        from kernels.interface import dynamic_config

        cfg = dynamic_config(cfg) if dynamic else cfg
        return kernel_sass(make_fwd_kernel(cfg, "bfloat16", hdim, hdim, causal), str(tmp_path / str(dynamic)))

    static, dyn = sass_of(False), sass_of(True)
    atom = lambda s: len(re.findall(r"ATOMG\.E\.ADD", s))  # noqa: E731
    assert atom(static) == 0 and atom(dyn) == 1
    n_all = hex(32 + 128 * wgs)
    assert f"BAR.SYNC.DEFER_BLOCKING 0x8, {n_all}" in dyn and f"BAR.ARV 0x8, {n_all}" in dyn
    for w in range(wgs):
        assert f"BAR.ARV {hex(9 + w)}, 0xa0" in dyn  # the producer's arrive on warpgroup w's full barrier
    assert not re.search(r"BAR\.(SYNC\.DEFER_BLOCKING|ARV) 0x8,", static)
    c = opcode_counts(dyn)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    assert not any(o == "R2UR" for body in steady_state_loops(dyn) for o, _ in body)
