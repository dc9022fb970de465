"""The sm90 forward's opt-in main-loop shapes ``causal_split`` and ``exp_in_branch`` (AttnConfig fields, default False).

Both change only how the overlapped main loop is laid out for ptxas; the arithmetic is the default's:
- ``causal_split``: a causal tile runs its diagonal blocks (after the first) in one loop and the mask-free blocks in
  another. The one-loop default at hd128 / (192, 128) causal compiles as a divergent loop (ptxas keeps pipeline states
  and wgmma descriptors in vector registers: ~110-140 R2UR, BSSY/BSYNC around the loop's mbarrier waits); split, it is
  uniform like the non-causal loop.
- ``exp_in_branch`` (tau > 0): the exponentials sit inside both arms of the warp's rescale decision, so the wait for
  the in-flight P V GEMM (WARPGROUP.DEPBAR.LE gsb0, 0x0) follows them; the default's non-causal loops (and split causal
  ones) wait for P V after 2 of 66 exponentials, i.e. before the softmax.
Config checks (no compile) and CPU-compiled SASS (CUTE_DSL_ARCH=sm_90a, nvdisasm): 0 LDL / STL, same GEMMs and TMA.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig, ConfigError  # noqa: E402
from kernels.sm90.sass import count, find_nvdisasm, opcode_counts, steady_state_loops  # noqa: E402
from sass_cache import fwd_sass  # noqa: E402  (tests/sass_cache.py: one compile per kernel in the session)

# the sm90 forward's loop-shape switches (None / bool, forward only, sm90 only)
FIELDS = ("causal_split", "exp_in_branch", "p_cvt_asm", "pv_wait_mid", "early_v_release")



# ---- config (no compile) --------------------------------------------------------------------------------------------
def test_causal_split_is_the_default_at_192_causal_only_and_leaves_other_hashes_unchanged():
    """DEFAULTS' causal_split (H200: with rescale_before_pv 1.012-1.015x at (192, 128) causal 8k / 16k; that field
    off there since 2026-12-03): resolve() fills True there and leaves None (left out of to_dict(), the hash from
    before the field) everywhere else."""
    name = "causal_split"
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            r = AttnConfig().resolve("sm90", hd, causal)
            if (hd, causal) == (192, True):
                assert r.causal_split is True and r.rescale_before_pv is False and r.to_dict()[name] is True
                off = AttnConfig(causal_split=False).resolve("sm90", hd, causal)
                assert off.causal_split is False and name not in off.to_dict() and off.config_hash() != r.config_hash()
                continue
            assert getattr(r, name) is None and name not in r.to_dict()
            assert AttnConfig(**{name: False}).resolve("sm90", hd, causal).config_hash() == r.config_hash()
    on = AttnConfig(**{name: True})
    assert on.to_dict()[name] is True and on.op_string == f'{{"{name}":true}}'
    assert AttnConfig().op_string == "{}"
    r_on = on.resolve("sm90", 128, True)
    assert r_on.config_hash() != AttnConfig().resolve("sm90", 128, True).config_hash()
    assert dataclasses.replace(r_on, **{name: None}) == AttnConfig().resolve("sm90", 128, True)
    assert AttnConfig().resolve("sm100", 192, True).causal_split is None


def test_exp_in_branch_is_the_default_at_hd128_causal_only():
    """DEFAULTS' exp_in_branch (H200: 1.013-1.022x at hd128 causal 4k-16k): resolve() fills True there and leaves None
    (left out of to_dict(), so the hash from before the field) everywhere else; an explicit False is its own config."""
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            r = AttnConfig().resolve("sm90", hd, causal)
            if (hd, causal) == (128, True):
                assert r.exp_in_branch is True and r.to_dict()["exp_in_branch"] is True
                assert AttnConfig(exp_in_branch=True).resolve("sm90", hd, causal) == r
                off = AttnConfig(exp_in_branch=False).resolve("sm90", hd, causal)
                assert off.exp_in_branch is False and off.config_hash() != r.config_hash()
            else:
                assert r.exp_in_branch is None and "exp_in_branch" not in r.to_dict()
    assert AttnConfig().op_string == "{}" and AttnConfig(exp_in_branch=True).op_string == '{"exp_in_branch":true}'
    assert AttnConfig().resolve("sm100", 128, True).exp_in_branch is None


@pytest.mark.parametrize("name", FIELDS)
def test_fields_refused_where_they_cannot_apply(name):
    for bad in (0, 1, "true"):
        with pytest.raises(ConfigError, match=f"{name}={bad!r}: must be None .per-arch default. or a bool"):
            AttnConfig(**{name: bad})
    for causal in (False, True):
        with pytest.raises(ConfigError, match=f"{name}=True with arch=sm100"):
            AttnConfig(**{name: True}).resolve("sm100", 128, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_fields_are_forward_only_in_the_backward_compiled_config(causal):
    from kernels.tiles import compiled_config

    cfg = AttnConfig(**{name: True for name in FIELDS})
    fwd = compiled_config(cfg, "sm90", 128, causal, "fwd")
    assert all(fwd[name] is True for name in FIELDS)
    bwd = compiled_config(cfg, "sm90", 128, causal, "bwd")
    assert not any(name in bwd for name in FIELDS)
    assert bwd == compiled_config(None, "sm90", 128, causal, "bwd")


def test_kernel_switches_apply_only_where_they_mean_something():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    bf = cutlass.BFloat16
    assert FlashFwdSm90(bf, 128, 128, True, causal_split=True).causal_split
    assert not FlashFwdSm90(bf, 128, 128, False, causal_split=True).causal_split  # nothing to split
    assert not FlashFwdSm90(bf, 128, 128, True, causal_split=True, window_left=64).causal_split
    assert not FlashFwdSm90(bf, 128, 128, True, causal_split=True, intra_wg_overlap=False).causal_split
    assert FlashFwdSm90(bf, 128, 128, False, exp_in_branch=True).exp_in_branch
    assert not FlashFwdSm90(bf, 128, 128, False, exp_in_branch=True, rescale_threshold=0.0).exp_in_branch  # no branch
    assert not FlashFwdSm90(bf, 128, 128, True).causal_split and not FlashFwdSm90(bf, 128, 128, True).exp_in_branch


# ---- SASS -------------------------------------------------------------------------------------------------------------
_CACHE: dict = {}


def _sass(tmp_path_factory, hdim, causal, **switches) -> str:
    """The forward's SASS with these switches over the defaults, speculative_exp off unless given: the loop-shape files
    test the eager step's loop layouts (pv_wait_mid, exp_in_branch, p_cvt_asm, ...), to which speculation, the hd 64 /
    128 / (192, 128) default since session 52, yields (its own loop: tests/test_fwd_speculative_exp.py)."""
    switches.setdefault("speculative_exp", False)
    key = (hdim, causal, tuple(sorted(switches.items())))
    if key not in _CACHE:
        cfg = AttnConfig(**switches).resolve("sm90", hdim, causal)
        _CACHE[key] = fwd_sass(cfg, "bfloat16", hdim, 128 if hdim == 192 else hdim, causal,
                               str(tmp_path_factory.mktemp("sass")))
    return _CACHE[key]


def _loops(sass: str):
    """The steady-state loops (kernels.sm90.sass.steady_state_loops): bodies of (opcode, operands)."""
    return steady_state_loops(sass)


def _ex2_before_pv_wait(body) -> int:
    """MUFU.EX2 instructions of a loop body before its wait for every wgmma (the in-flight P V)."""
    n = 0
    for op, rest in body:
        if op == "WARPGROUP.DEPBAR.LE" and rest.strip().endswith("0x0"):
            return n
        n += op == "MUFU.EX2"
    raise AssertionError("no WARPGROUP.DEPBAR.LE gsb0, 0x0 in the loop")


def _same_machinery(base: str, on: str):
    cb, co = opcode_counts(base), opcode_counts(on)
    assert count(co, "LDL") == 0 and count(co, "STL") == 0, {k: v for k, v in co.items() if k.startswith(("LDL", "STL"))}
    for op in ("HGMMA", "UTMALDG", "UTMASTG", "VOTE"):
        assert (count(co, op) > 0) == (count(cb, op) > 0), op
    assert count(co, "HGMMA") >= count(cb, "HGMMA")  # the same GEMMs (a split loop holds a second copy)


needs_nvdisasm = pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip nvidia-cuda-nvdisasm)")


@pytest.mark.compile
@needs_nvdisasm
@pytest.mark.parametrize("hdim", [128, 192, 256])
def test_causal_split_compiles_uniform_loops(tmp_path_factory, hdim):
    # (192, 128) causal's default pv_wait_mid implies the split; hd128's default q_in_regs (session 45) compiles the one
    # loop uniform as well (13 R2UR, 2 BSSY), so the divergent base is the kernel without it. hd256 (one tile per CTA,
    # the default past 16k): p_cvt_asm's top-tested loop is the divergent one; split, the loops are counted (session 51)
    mid = {192: {"pv_wait_mid": False}, 128: {"q_in_regs": False}}.get(hdim, {})
    base = _sass(tmp_path_factory, hdim, True, causal_split=False, **mid)  # the one loop ((192, 128)'s default: split)
    on = _sass(tmp_path_factory, hdim, True, causal_split=True, **mid)
    _same_machinery(base, on)
    assert base.count("R2UR") >= 60 and base.count("BSSY") >= 8, (base.count("R2UR"), base.count("BSSY"))
    assert on.count("R2UR") <= 20 and on.count("BSSY") <= 3, (on.count("R2UR"), on.count("BSSY"))
    loops = _loops(on)
    assert len(loops) == 2  # the diagonal blocks (masked) and the rest
    masked, free = sorted(loops, key=lambda b: sum(o == "FSEL" for o, _ in b), reverse=True)
    per_thread = (80 if hdim == 256 else 128) // 2  # S elements of a consumer thread: 2 rows x tile_n / 4 columns
    assert sum(o == "FSEL" for o, _ in masked) >= per_thread and sum(o == "FSEL" for o, _ in free) <= 8
    for body in loops:
        assert not any(o.startswith("R2UR") for o, _ in body)  # wgmma descriptors in uniform registers


@pytest.mark.compile
@needs_nvdisasm
@pytest.mark.parametrize("hdim,causal,switches", [
    (128, False, {"pv_wait_mid": False}), (192, False, {"rescale_before_pv": True}), (64, False, {}),
    (128, True, {"causal_split": True}),
    (192, True, {"causal_split": True, "rescale_before_pv": True, "pv_wait_mid": False})])
def test_exp_in_branch_waits_for_pv_after_the_exponentials(tmp_path_factory, hdim, causal, switches):
    base = _sass(tmp_path_factory, hdim, causal, exp_in_branch=False, **switches)  # off (hd128 causal's default: on)
    on = _sass(tmp_path_factory, hdim, causal, exp_in_branch=True, **switches)
    _same_machinery(base, on)
    n_exp = AttnConfig(**switches).resolve("sm90", hdim, causal).tile_n // 2  # exponentials per thread and block
    for body in _loops(base):
        assert _ex2_before_pv_wait(body) <= 8  # the default: P V waited for before the softmax
    for body in _loops(on):
        assert _ex2_before_pv_wait(body) >= 2 * n_exp  # both arms' exponentials come first
