"""Shared checks of the sm90 forward's opt-in switches (tests/test_fwd_<switch>.py): the AttnConfig field's rules and
the K/V loop of a compiled kernel."""
from __future__ import annotations

import pytest


def check_forward_field(name: str) -> None:
    """An sm90 forward switch: out of to_dict() while None / False, in the hash when True, a bool only, refused on
    sm100, and no change to the backward's compiled config."""
    from kernels.config import AttnConfig, ConfigError
    from kernels.tiles import compiled_config

    assert name not in AttnConfig().to_dict()
    assert name not in AttnConfig(**{name: False}).to_dict()
    assert AttnConfig(**{name: True}).config_hash() != AttnConfig().config_hash()
    with pytest.raises(ConfigError):
        AttnConfig(**{name: 1})
    with pytest.raises(ConfigError, match=name):
        AttnConfig(**{name: True}).resolve("sm100", 128, False)
    assert (compiled_config(AttnConfig(**{name: True}), "sm90", 128, True, mode="bwd")
            == compiled_config(AttnConfig(), "sm90", 128, True, mode="bwd"))


def spill_free_sass(hdim: int, causal: bool, workdir: str, seqlen: int = 8192, **fields) -> str:
    """SASS of the sm90 forward that a call of ``seqlen`` queries runs with AttnConfig(**fields) (bf16; hdim 192 with
    hdim_v 128), after checking it has no local memory."""
    from kernels.config import AttnConfig
    from kernels.interface import forward_config
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, opcode_counts
    from sass_cache import kernel_sass

    cfg = forward_config(AttnConfig(**fields).resolve("sm90", hdim, causal), hdim, causal, seqlen)
    sass = kernel_sass(make_fwd_kernel(cfg, "bfloat16", hdim, 128 if hdim == 192 else hdim, causal), workdir)
    c = opcode_counts(sass)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0, fields
    return sass


def loop_ops(cfg, hdim: int, causal: bool, workdir: str, all_loops: bool = False) -> list:
    """The opcodes of the mask-free K/V loop (causal: the last) of the sm90 forward compiled from the resolved ``cfg``
    (bf16; hdim 192 with hdim_v 128), after checking the kernel has no local memory; ``all_loops``: a list of every
    steady-state loop's opcodes instead."""
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, opcode_counts, steady_state_loops
    from sass_cache import kernel_sass

    sass = kernel_sass(make_fwd_kernel(cfg, "bfloat16", hdim, 128 if hdim == 192 else hdim, causal), workdir)
    c = opcode_counts(sass)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    loops = [[o for o, _ in body] for body in steady_state_loops(sass)]
    return loops if all_loops else loops[-1]
