"""Persistent forward scheduling (AttnConfig.persistent), CPU only: the config field and its per-call default rule,
compiles of persistent kernels (a pairwise cover of head dims x causal x window / softcap x GQA), and the SASS: a tile
loop around the key-block loops and the O store, no local-memory spills. GPU numerics: tests/test_persistent_gpu.py.
"""
from __future__ import annotations

import dataclasses

import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import (DEFAULTS, AttnConfig, ConfigError, persistent_by_default,  # noqa: E402
                            persistent_max_seqlen)
from kernels.tiles import compiled_config  # noqa: E402


# ---- config: field, rule, keys --------------------------------------------------------------------------------------
def test_field_validates_and_stays_out_of_dicts_while_none():
    assert AttnConfig().persistent is None
    with pytest.raises(ConfigError, match="persistent"):
        AttnConfig(persistent=1)
    r = AttnConfig().resolve("sm90", 128, True)
    assert r.persistent is None and r.is_resolved  # decided per call, not by resolve()
    assert "persistent" not in r.to_dict()  # hashes / keys from before the field existed are unchanged
    assert AttnConfig(persistent=True).to_dict()["persistent"] is True
    assert AttnConfig(persistent=True).config_hash() != AttnConfig().config_hash()
    assert AttnConfig.from_dict(AttnConfig(persistent=False).to_dict()) == AttnConfig(persistent=False)
    # forward-only: one backward kernel either way
    assert (compiled_config(AttnConfig(persistent=True), "sm90", 128, True, mode="bwd")
            == compiled_config(AttnConfig(), "sm90", 128, True, mode="bwd"))


@pytest.mark.parametrize("hdim,causal,bound", [(64, False, 8192), (64, True, 16384), (128, False, 32768),
                                               (128, True, 32768), (192, False, 8192), (192, True, 16384),
                                               (256, False, 8192), (256, True, 32768)])
def test_default_rule_is_the_table(hdim, causal, bound):
    assert persistent_max_seqlen("sm90", hdim, causal) == bound
    assert persistent_max_seqlen("sm100", hdim, causal) == 0
    none = AttnConfig()
    if bound:
        assert persistent_by_default(none, "sm90", hdim, causal, 1)
        assert persistent_by_default(none, "sm90", hdim, causal, bound)
    assert not persistent_by_default(none, "sm90", hdim, causal, bound + 1)
    assert not persistent_by_default(none, "sm90", hdim, causal, 1, varlen=True)  # never picked for varlen
    assert persistent_by_default(AttnConfig(persistent=True), "sm90", hdim, causal, 1 << 20)
    assert not persistent_by_default(AttnConfig(persistent=False), "sm90", hdim, causal, 1)
    assert all(len(DEFAULTS[k]["persistent_max_seqlen"]) == 2 for k in DEFAULTS)


def test_forward_config_normalises_the_cache_key():
    from kernels.interface import forward_config, fwd_kernel_key, persistent_grid

    base = AttnConfig().resolve("sm90", 64, True)
    on = forward_config(base, 64, True, 1024)
    assert on.persistent is True
    off = forward_config(base, 64, True, 16385)
    forced_off = forward_config(AttnConfig(persistent=False).resolve("sm90", 64, True), 64, True, 512)
    assert off == forced_off == base  # persistent None: the key (and kernel) of before the field existed
    key = fwd_kernel_key(off, "bfloat16", 64, 64, True)
    assert "persistent" not in str(key) and fwd_kernel_key(on, "bfloat16", 64, 64, True) != key
    assert forward_config(AttnConfig(persistent=True).resolve("sm90", 256, False), 256, False, 1 << 16).persistent
    assert persistent_grid(132, 1000, 128, 4, 2) == 64 and persistent_grid(132, 16384, 128, 16, 1) == 132
    assert persistent_grid(3, 1, 128, 1, 1) == 1


def test_persistent_tile_replaces_the_table_tiles_only_when_the_length_decides():
    """DEFAULTS' persistent_tile runs where the sequence length makes a call persistent and the config holds the
    table's tile_m / register split: sm90 hd64 causal <= 1k 128-row tiles at 240 / 24 registers, 1025-16k the table's
    tiles, both on the greedy walk (persistent_greedy); hd128 causal <= 1k the greedy walk with exp_in_branch and
    causal_split (exp_in_branch alone spills in the persistent kernel: resolve() leaves it out for persistent=True,
    and so does a config made persistent with another tile), from 1025 tiles claimed at run time (persistent_dynamic;
    the greedy walk where the config turns that off); hd192 / 256 O through the last V stage, causal on the greedy
    walk. persistent=True, another tile or an hd64 / 128 non-causal call keep their own."""
    from kernels.config import persistent_tile_for
    from kernels.interface import forward_config

    base = AttnConfig().resolve("sm90", 64, True)
    assert (base.tile_m, base.consumer_regs, base.producer_regs) == (192, 160, 32)
    short = forward_config(base, 64, True, 1024)
    assert (short.tile_m, short.consumer_regs, short.producer_regs, short.persistent) == (128, 240, 24, True)
    assert short.persistent_greedy and not short.persistent_snake
    mid = forward_config(base, 64, True, 1025)
    assert (mid.tile_m, mid.persistent, mid.persistent_greedy) == (192, True, True)
    assert forward_config(base, 64, True, 16384).persistent_greedy
    assert forward_config(base, 64, True, 16385) == base  # past the bound: the table's one-tile kernel
    forced = AttnConfig(persistent=True).resolve("sm90", 64, True)
    got = forward_config(forced, 64, True, 1024)
    assert got.tile_m == 192 and not got.persistent_greedy  # forced persistent: the resolved config
    own = AttnConfig(consumer_regs=168, producer_regs=24).resolve("sm90", 64, True)
    assert forward_config(own, 64, True, 1024).tile_m == 192  # a register split of its own: kept
    nc = AttnConfig().resolve("sm90", 64, False)
    assert forward_config(nc, 64, False, 1024).tile_m == 192  # non-causal: no persistent_tile
    c128 = AttnConfig().resolve("sm90", 128, True)
    assert c128.exp_in_branch
    p128 = forward_config(c128, 128, True, 1024)
    assert p128.persistent and p128.persistent_greedy and p128.exp_in_branch and p128.causal_split
    assert p128.tile_m == 128
    for s_q in (1025, 4096, 32768):  # from 1025: tiles claimed at run time, the kernel persistent=True resolves to
        dyn = forward_config(c128, 128, True, s_q)
        assert dyn.persistent and dyn.persistent_dynamic and not dyn.persistent_greedy and dyn.tile_m == 128
        assert dyn.exp_in_branch is None and dyn.causal_split is None
        assert dyn == forward_config(AttnConfig(persistent=True, persistent_dynamic=True).resolve("sm90", 128, True),
                                     128, True, s_q)
        # dynamic turned off, or a static walk asked for: the entry's static fields (the greedy walk before it)
        for kw in (dict(persistent_dynamic=False), dict(persistent_greedy=True)):
            st = forward_config(AttnConfig(**kw).resolve("sm90", 128, True), 128, True, s_q)
            assert st.persistent and st.persistent_greedy and st.exp_in_branch and st.causal_split, kw
            assert not st.persistent_dynamic, kw
        snake128 = forward_config(AttnConfig(persistent_snake=True).resolve("sm90", 128, True), 128, True, s_q)
        assert snake128.persistent_snake and not snake128.persistent_greedy and not snake128.persistent_dynamic
    rr128 = forward_config(AttnConfig(persistent=True).resolve("sm90", 128, True), 128, True, 1024)
    assert rr128.exp_in_branch is None and not rr128.persistent_greedy  # forced: the resolved config, no exp_in_branch
    assert forward_config(c128, 128, True, 32769) == c128
    own128 = forward_config(AttnConfig(tile_m=64).resolve("sm90", 128, True), 128, True, 1024)
    assert own128.persistent and own128.tile_m == 64 and own128.exp_in_branch is None  # own tile: no exp_in_branch
    kept = forward_config(AttnConfig(exp_in_branch=False).resolve("sm90", 128, True), 128, True, 1024)
    assert kept.persistent and kept.exp_in_branch is False  # a value the config chose stays
    assert kept.persistent_greedy  # the entry's other fields still fill what the config left None
    off = forward_config(AttnConfig(persistent_greedy=False).resolve("sm90", 128, True), 128, True, 1024)
    assert off.persistent and off.persistent_greedy is False  # the greedy walk turned off: the round robin
    both_off = dict(persistent_greedy=False, persistent_dynamic=False)
    off = forward_config(AttnConfig(**both_off).resolve("sm90", 128, True), 128, True, 4096)
    assert off.persistent and off.persistent_greedy is False and off.persistent_dynamic is False  # the round robin
    # the entry's exp_in_branch only with its causal_split and without a window (the persistent kernel spills else)
    cs_off = forward_config(AttnConfig(causal_split=False).resolve("sm90", 128, True), 128, True, 1024)
    assert cs_off.persistent_greedy and not cs_off.exp_in_branch and cs_off.causal_split is False
    windowed = forward_config(c128, 128, True, 1024, 1, True)
    assert windowed.persistent_greedy and not windowed.exp_in_branch
    windowed = forward_config(c128, 128, True, 4096, 1, True)
    assert windowed.persistent_dynamic and not windowed.exp_in_branch
    # an explicit snake order stays (the kernel's snake would yield to a filled-in greedy walk)
    snake = forward_config(AttnConfig(persistent_snake=True).resolve("sm90", 64, True), 64, True, 2048)
    assert snake.persistent_snake and not snake.persistent_greedy
    for hdim in (192, 256):  # O through the last V stage (session 66) both ways, causal on the greedy walk
        r = AttnConfig().resolve("sm90", hdim, False)
        assert persistent_tile_for(r, "sm90", hdim, False, 1024) == dataclasses.replace(r, o_via_v_stage=True)
        assert not forward_config(r, hdim, False, 8193).persistent
        rc = AttnConfig().resolve("sm90", hdim, True)
        got = persistent_tile_for(rc, "sm90", hdim, True, 1024)
        assert got == dataclasses.replace(rc, persistent_greedy=True, o_via_v_stage=True)
        assert not forward_config(rc, hdim, True, 32769 if hdim == 256 else 16385).persistent  # 256: 32k since s. 68
    assert persistent_tile_for(AttnConfig().resolve("sm90", 128, False), "sm90", 128, False, 1024).persistent is None
    for hdim in (64, 128, 192, 256):  # every persistent_tile entry names fields of AttnConfig
        rules = DEFAULTS[("sm90", hdim)]["persistent_tile"][1]
        rules = rules if isinstance(rules, tuple) else ((1 << 30, rules),)
        rules += tuple((bound, fields["static"]) for bound, fields in rules if "static" in fields)
        assert all(hasattr(AttnConfig(), k) for _, fields in rules for k in fields if k != "static")


def test_persistent_snake_field_stays_out_of_dicts_while_off():
    assert "persistent_snake" not in AttnConfig().to_dict()
    assert "persistent_snake" not in AttnConfig(persistent_snake=False).to_dict()
    assert AttnConfig(persistent_snake=True).to_dict()["persistent_snake"] is True
    assert AttnConfig(persistent_snake=True).config_hash() != AttnConfig().config_hash()
    with pytest.raises(ConfigError):
        AttnConfig(persistent_snake=1)


def test_persistent_with_varlen_is_a_config_error():
    from kernels.validate import check_persistent_varlen

    with pytest.raises(ConfigError, match="persistent=True"):
        check_persistent_varlen(AttnConfig(persistent=True))
    check_persistent_varlen(AttnConfig())
    check_persistent_varlen(AttnConfig(persistent=False))
    pytest.importorskip("cutlass")
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    with pytest.raises(ValueError, match="varlen"):
        FlashFwdSm90(cutlass.BFloat16, 64, 64, False, tile_m=192, consumer_regs=160, producer_regs=32, varlen=True,
                     persistent=True)


# ---- compiles: pairwise over head dims x causal x window / softcap x GQA ------------------------------------------------
# (hdim, hdim_v, causal, window (left, right), softcap, qhead_per_kvhead); every pair of (head dim, feature),
# (head dim, causal), (head dim, GQA), (causal, feature), (causal, GQA), (feature, GQA) appears in some row
FEATURES = {"plain": ((-1, -1), 0.0), "window": ((96, -1), 0.0), "softcap": ((-1, -1), 30.0),
            "window_softcap": ((200, -1), 50.0)}
PAIRWISE = [
    (64, 64, False, "plain", 1), (64, 64, True, "window", 4), (64, 64, True, "softcap", 1),
    (64, 64, False, "window_softcap", 4),
    (128, 128, True, "plain", 4), (128, 128, False, "window", 1), (128, 128, False, "softcap", 4),
    (128, 128, True, "window_softcap", 1),
    (256, 256, True, "plain", 1), (256, 256, False, "window", 4), (256, 256, True, "softcap", 4),
    (256, 256, False, "window_softcap", 1),
    (192, 128, False, "plain", 4), (192, 128, True, "window_softcap", 1), (192, 128, False, "softcap", 1),
    (192, 128, True, "window", 4),
]


def test_pairwise_cover_is_complete():
    rows = [(f"hd{hd}", c, feat, g) for hd, _, c, feat, g in PAIRWISE]
    levels = [sorted({r[i] for r in rows}, key=str) for i in range(4)]
    assert levels[2] == sorted(FEATURES) and levels[3] == [1, 4] and len(levels[0]) == 4
    for i in range(4):
        for j in range(i + 1, 4):
            want = {(a, b) for a in levels[i] for b in levels[j]}
            assert want == {(r[i], r[j]) for r in rows}, (i, j)


def _sass_or_none(kern, workdir):
    from sass_cache import kernel_sass  # tests/sass_cache.py: one compile per kernel in the session

    return kernel_sass(kern, workdir)


@pytest.mark.compile
@pytest.mark.parametrize("hdim,hdim_v,causal,feat,group", PAIRWISE,
                         ids=[f"hd{r[0]}-{'causal' if r[2] else 'full'}-{r[3]}-g{r[4]}" for r in PAIRWISE])
def test_persistent_compiles(tmp_path, hdim, hdim_v, causal, feat, group):
    pytest.importorskip("cutlass")
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.validate import canonical_window

    window, cap = FEATURES[feat]
    c_causal, left, right = canonical_window(causal, window)
    cfg = AttnConfig(persistent=True).resolve("sm90", hdim, c_causal)
    kern = make_fwd_kernel(cfg, "bfloat16", hdim, hdim_v, c_causal, qhead_per_kvhead=group, window_left=left,
                           window_right=right, softcap=cap)
    # O in its own buffer where shared memory holds it: not at hd256, nor at (192, 128) with the table's 128-key tile
    # (Q 48 + K 2 x 48 + V 2 x 32 KB = 208 KB, a 32 KB O would pass the 227 KB); conf/tuned/'s non-causal 192 x 80
    # tile leaves room for it
    assert kern.persistent and kern.separate_o == (hdim != 256 and not (hdim == 192 and cfg.tile_n == 128))
    _sass_or_none(kern, str(tmp_path))


# ---- SASS: the tile loop, no spills ----------------------------------------------------------------------------------
_LABEL = re.compile(r"^(\.L_x_\d+):")
_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)(.*)")


def outer_loops(sass: str) -> list[list[str]]:
    """Opcodes of the outermost loops (a predicated backward BRA; .U.ANY retry idioms left out) that issue wgmma."""
    insns, labels = [], {}
    for line in sass.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = _INSN.search(line)
        if m:
            insns.append((m.group(1), m.group(2), m.group(3)))
    spans = []
    for i, (pred, op, rest) in enumerate(insns):
        t = re.search(r"\((\.L_x_\d+)\)", rest)
        if op == "BRA" and pred and t and labels.get(t.group(1), len(insns)) <= i:
            spans.append((labels[t.group(1)], i))
    gemm = [sp for sp in spans if any(op.startswith("HGMMA") for _, op, _ in insns[sp[0]:sp[1] + 1])]
    outer = [sp for sp in gemm if not any(o != sp and o[0] <= sp[0] and sp[1] <= o[1] for o in gemm)]
    return [[op for _, op, _ in insns[a:b + 1]] for a, b in sorted(set(outer))]


@pytest.mark.compile
@pytest.mark.parametrize("hdim,hdim_v", [(64, 64), (128, 128), (256, 256), (192, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_sass_has_a_tile_loop_and_no_spills(tmp_path, hdim, hdim_v, causal):
    """persistent=True: one loop issues the wgmmas AND the O store (UTMASTG) -- the tile loop around the key-block
    loops and the epilogue; no local memory (LDL / STL). The one-tile kernel has no loop around its O store."""
    pytest.importorskip("cutlass")
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, find_nvdisasm, opcode_counts

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip nvidia-cuda-nvdisasm)")
    cfg = AttnConfig(persistent=True).resolve("sm90", hdim, causal)
    if hdim == 64 and causal:  # the kernel the default runs at <= 1k: DEFAULTS' persistent_tile (128-row tiles)
        from kernels.interface import forward_config

        cfg = forward_config(AttnConfig().resolve("sm90", 64, True), 64, True, 1024)
        assert cfg.tile_m == 128 and cfg.persistent
    on = _sass_or_none(make_fwd_kernel(cfg, "bfloat16", hdim, hdim_v, causal), str(tmp_path / "on"))
    c = opcode_counts(on)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    tile_loops = [b for b in outer_loops(on) if any(op.startswith("UTMASTG") for op in b)]
    assert len(tile_loops) == 1
    assert sum(op.startswith("HGMMA") for op in tile_loops[0]) == count(c, "HGMMA")  # every wgmma inside it
    if hdim == 128:  # the one-tile kernel: no loop around the O store
        off = _sass_or_none(make_fwd_kernel(cfg.__class__(**{**cfg.to_dict(), "persistent": None}), "bfloat16",
                                            hdim, hdim_v, causal), str(tmp_path / "off"))
        assert not any(any(op.startswith("UTMASTG") for op in b) for b in outer_loops(off))


# ---- causal walk order: scheduler.snake_tile ------------------------------------------------------------------------
@pytest.mark.parametrize("num_tiles,grid", [(1024, 132), (1000, 7), (5, 8), (16, 4), (132, 132), (265, 132)])
def test_snake_tile_computes_every_tile_once(num_tiles, grid):
    """Every tile below num_tiles is computed by exactly one (CTA, step) of the persistent walk
    (the kernel's loop: CTA b takes steps t = b, b + grid, ... < num_tiles)."""
    pytest.importorskip("cutlass")
    from kernels.sm90.scheduler import snake_tile

    f = snake_tile.__wrapped__  # the Python function under cute.jit: plain ints in, plain ints out
    got = sorted(f(t, b, grid, num_tiles) for b in range(grid) for t in range(b, num_tiles, grid))
    assert got == list(range(num_tiles))


def test_snake_tile_balances_longest_first_tiles():
    """Causal 4k at 16k tokens, hd128, 132 SMs: 2048 tiles in longest-first order (32 m_blocks of 64 (head, batch)s,
    32 ... 1 K blocks); the plain round robin gives CTA 0 the longest tile of every round (272 K blocks against a mean
    of 256), the snake evens it out (258)."""
    pytest.importorskip("cutlass")
    from kernels.sm90.scheduler import snake_tile

    f, grid = snake_tile.__wrapped__, 132
    work = [32 - i // 64 for i in range(2048)]  # K blocks per tile, longest first

    def heaviest(order):
        return max(sum(work[order(t, b)] for t in range(b, len(work), grid)) for b in range(grid))
    plain = heaviest(lambda t, b: t)
    snake = heaviest(lambda t, b: f(t, b, grid, len(work)))
    assert plain == 272 and snake == 258


@pytest.mark.compile
def test_snake_kernel_has_no_spills_and_differs_from_the_plain_walk(tmp_path):
    """hd64 causal at 2k with persistent_snake (the default there until session 49, now the greedy walk; persistent,
    192-row tiles): no local memory, one tile
    loop around every wgmma and the O store; the snake is in the machine code (its SASS differs from the plain walk's,
    by a handful of integer instructions: same HGMMA count)."""
    pytest.importorskip("cutlass")
    from kernels.interface import forward_config
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, find_nvdisasm, opcode_counts

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip nvidia-cuda-nvdisasm)")
    cfg = forward_config(AttnConfig(persistent=True, persistent_snake=True).resolve("sm90", 64, True), 64, True, 2048)
    assert cfg.persistent and cfg.persistent_snake and cfg.tile_m == 192
    snake = _sass_or_none(make_fwd_kernel(cfg, "bfloat16", 64, 64, True), str(tmp_path / "snake"))
    plain_cfg = cfg.__class__(**{**cfg.to_dict(), "persistent_snake": None})
    plain = _sass_or_none(make_fwd_kernel(plain_cfg, "bfloat16", 64, 64, True), str(tmp_path / "plain"))
    c, p = opcode_counts(snake), opcode_counts(plain)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
    tile_loops = [b for b in outer_loops(snake) if any(op.startswith("UTMASTG") for op in b)]
    assert len(tile_loops) == 1 and sum(op.startswith("HGMMA") for op in tile_loops[0]) == count(c, "HGMMA")
    assert count(c, "HGMMA") == count(p, "HGMMA")
    assert snake != plain and sum(c.values()) > sum(p.values())
