"""Sliding window ``window_size=(left, right)`` and ``softcap`` (issue 12.3), forward, on the CPU.

- the canonical form of the window (kernels.validate.canonical_window) and the argument checks of the references;
- the reference (kernels.reference.attention_exact / attention_naive) against an element-by-element loop;
- the forward kernel's block range (kernels.sm90.mask.window_block_range, the very function the kernel traces):
  every visible (row, key) lies in a visited block, the block before the first visited one holds no visible key,
  and every block the kernel leaves unmasked is fully visible for all of the tile's rows;
- the compile cache key (window / softcap only when used) and the kernel's argument checks;
- compile of window / softcap forward configs at every head dim (pairwise, not the full product), and their SASS:
  MUFU.TANH in the softcap kernels, none in the others.
Backward (kernels/sm90/bwd.py, bwd_wide.py):
- its Q-tile range per K/V tile (kernels.sm90.mask.m_block_range_window) covers every visible (row, key), the K/V tiles
  counted as a Q tile's visitors (m_block_visitors, the deterministic dQ turns) are exactly those whose range holds it,
  and every S^T tile that bwd_tile_needs_mask leaves unmasked is fully visible (the three warpgroup tile geometries);
- the cache key (window / softcap only when used), argument checks, two_cta's ConfigError;
- compile of window / softcap backward configs at every head dim (pairwise over head dims x causal x window kind x
  softcap x deterministic), and the SASS of two of them (MUFU.TANH with a softcap, none without, no spills).
The GPU side (forward output, backward gradients vs the fp64 reference) is tests/test_window_softcap_gpu.py.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig, ConfigError  # noqa: E402
from kernels.reference import attention_exact, attention_naive, window_mask  # noqa: E402
from kernels.sm90.mask import (bwd_tile_needs_mask, m_block_range_window, m_block_visitors,  # noqa: E402
                               window_block_range)
from kernels.validate import canonical_window, check_softcap, check_window  # noqa: E402


# ---- canonical window and argument checks ---------------------------------------------------------------------------
def test_canonical_window():
    assert canonical_window(False, (-1, -1)) == (False, -1, -1)
    assert canonical_window(True, (-1, -1)) == (True, -1, -1)
    assert canonical_window(True, (128, 128)) == (True, 128, -1)  # causal: right bound is the diagonal (as FA)
    assert canonical_window(True, (128, 0)) == (True, 128, -1)
    assert canonical_window(False, (-1, 0)) == (True, -1, -1)  # right 0 = causal
    assert canonical_window(False, (5, 0)) == (True, 5, -1)
    assert canonical_window(False, (0, 7)) == (False, 0, 7)
    assert canonical_window(False, None) == (False, -1, -1)
    assert canonical_window(False, [3, 4]) == (False, 3, 4)


@pytest.mark.parametrize("bad", [(1,), (1, 2, 3), (1.5, 2), (-2, 0), (0, -3), "ab", (True, 1), 7, (None, 1)])
def test_window_errors_one_line(bad):
    with pytest.raises(ConfigError, match=r"^window_size=") as e:
        check_window(bad)
    assert "\n" not in str(e.value)
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(ConfigError, match=r"^window_size="):
        attention_exact(q, q, q, window_size=bad)


@pytest.mark.parametrize("bad", [-0.5, -1, float("inf"), float("nan"), "1", True, None, (30.0,)])
def test_softcap_errors_one_line(bad):
    with pytest.raises(ConfigError, match=r"^softcap=") as e:
        check_softcap(bad)
    assert "\n" not in str(e.value)
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(ConfigError, match=r"^softcap="):
        attention_naive(q, q, q, softcap=bad)


def test_softcap_accepts_numbers():
    assert check_softcap(0) == 0.0 and check_softcap(30) == 30.0 and check_softcap(50.5) == 50.5


# ---- the reference against an element-by-element loop -----------------------------------------------------------------
def _loop_attention(q, k, v, causal, scale, window, softcap):
    """Literal definition at fp64, one (batch, head, query) at a time: out, lse (natural log, -inf if no key)."""
    b, sq, h, _ = q.shape
    sk, dv = k.shape[1], v.shape[3]
    left, right = window
    if causal:
        right = 0
    out = torch.zeros(b, sq, h, dv, dtype=torch.float64)
    lse = torch.full((b, h, sq), float("-inf"), dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(sq):
                c = i + sk - sq  # bottom-right aligned diagonal
                keys = [j for j in range(sk) if (left < 0 or j >= c - left) and (right < 0 or j <= c + right)]
                if not keys:
                    continue
                s = torch.stack([(q[bi, i, hi].double() @ k[bi, j, hi].double()) * scale for j in keys])
                if softcap > 0:
                    s = softcap * torch.tanh(s / softcap)
                p = torch.softmax(s, dim=0)
                out[bi, i, hi] = (p[:, None] * v[bi, keys, hi].double()).sum(0)
                lse[bi, hi, i] = torch.logsumexp(s, dim=0)
    return out, lse


CASES = [  # (sq, sk, causal, window, softcap)
    (13, 13, False, (3, 2), 0.0), (13, 13, True, (4, -1), 0.0), (7, 19, False, (2, 5), 30.0),
    (19, 7, False, (1, 0), 0.0), (19, 7, True, (2, 9), 5.0), (11, 23, False, (-1, 3), 0.0), (11, 23, False, (6, -1), 2.0),
    (23, 11, False, (0, 0), 0.0), (16, 16, False, (-1, -1), 1.5), (5, 40, True, (-1, -1), 0.5), (9, 9, False, (0, 20), 0.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"sq{c[0]}-sk{c[1]}-c{int(c[2])}-w{c[3][0]}_{c[3][1]}-cap{c[4]}")
def test_reference_matches_loop(case):
    sq, sk, causal, window, softcap = case
    g = torch.Generator().manual_seed(sq * 31 + sk)
    q, k = (torch.randn(2, s, 2, 16, generator=g) * 2 for s in (sq, sk))  # * 2: scores beyond the softcap's knee
    v = torch.randn(2, sk, 2, 8, generator=g)
    scale = 0.7
    want, want_lse = _loop_attention(q, k, v, causal, scale, window, softcap)
    out, lse = attention_exact(q, k, v, causal=causal, softmax_scale=scale, return_lse=True, window_size=window,
                               softcap=softcap)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, want_lse, rtol=1e-10, atol=1e-10)
    out32, lse32 = attention_naive(q, k, v, causal=causal, softmax_scale=scale, return_lse=True, window_size=window,
                                   softcap=softcap)
    torch.testing.assert_close(out32.double(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse32.double(), want_lse, rtol=1e-4, atol=1e-5)


def test_reference_window_gradient_is_finite_and_softcap_bounds_scores():
    q, k, v = (torch.randn(1, 30, 2, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = attention_exact(q, k, v, window_size=(0, 0), softcap=1.0)  # every row sees exactly its diagonal key
    torch.testing.assert_close(out, v.detach(), rtol=0, atol=1e-12)
    attention_exact(q, k, v, causal=True, window_size=(4, 4), softcap=3.0).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    _, lse = attention_exact(q, k, v * 0, softmax_scale=100.0, softcap=2.0, return_lse=True)
    assert (lse.detach() <= 2.0 + math.log(30) + 1e-9).all()  # capped scores: lse <= cap + log(s_k)


def test_window_mask_shapes_and_rows_without_keys():
    m = window_mask(6, 3, False, (0, 0))  # s_q > s_k: the first rows' diagonals lie left of key 0
    assert m.shape == (6, 3) and m[:3].sum() == 0 and m[3:].diagonal().all()
    assert window_mask(4, 4, False, (-1, -1)) is None
    q = torch.randn(1, 6, 1, 8)
    k = torch.randn(1, 3, 1, 8)
    out, lse = attention_exact(q, k, k, window_size=(0, 0), return_lse=True)
    assert (out[:, :3] == 0).all() and torch.isinf(lse[..., :3]).all() and torch.isfinite(lse[..., 3:]).all()


# ---- the kernel's block range ---------------------------------------------------------------------------------------
def _check_block_range(sq, sk, tile_m, tile_n, causal, left, right):
    ok = window_mask(sq, sk, causal, (left, right))
    ok = torch.ones(sq, sk, dtype=torch.bool) if ok is None else ok
    c_causal, c_left, c_right = canonical_window(causal, (left, right))
    for m_block in range((sq + tile_m - 1) // tile_m):
        n_min, n_max, n_masked, n_local_end = window_block_range(m_block, tile_m, tile_n, sq, sk, c_causal, c_left,
                                                                 c_right)
        assert 0 <= n_min < n_max <= max(1, (sk + tile_n - 1) // tile_n)
        rows = ok[m_block * tile_m:min(sq, (m_block + 1) * tile_m)]
        cols = rows.any(dim=0).nonzero().flatten()
        if len(cols):  # every visible key is in a visited block; the block before the first visited one has none
            assert n_min * tile_n <= int(cols.min()) and int(cols.max()) < n_max * tile_n
            assert n_min == int(cols.min()) // tile_n
        for n in range(n_min, n_max):
            c0, c1 = n * tile_n, min(sk, (n + 1) * tile_n)
            unmasked = n_local_end <= n < n_masked and n != n_max - 1  # the first block visited is always masked
            if unmasked:
                assert c1 - c0 == tile_n and rows[:, c0:c1].all(), (m_block, n, n_min, n_max, n_masked, n_local_end)


@pytest.mark.parametrize("tiles", [(128, 128), (192, 128), (128, 80), (128, 112)])
def test_block_range_covers_the_window(tiles):
    tile_m, tile_n = tiles
    for sq, sk in ((1000, 1000), (300, 1111), (1111, 300), (129, 257), (1, 700), (700, 1)):
        for causal in (False, True):
            for left, right in ((-1, -1), (0, 0), (100, 50), (127, 0), (128, -1), (-1, 200), (513, 7), (5, 1000)):
                _check_block_range(sq, sk, tile_m, tile_n, causal, left, right)


# ---- compile cache key and kernel arguments -------------------------------------------------------------------------
def test_cache_key_window_and_softcap_only_when_used():
    from kernels.interface import fwd_kernel_key

    cfg = AttnConfig().resolve("sm90", 128, False)
    plain = fwd_kernel_key(cfg, "bfloat16", 128, 128, False)
    assert fwd_kernel_key(cfg, "bfloat16", 128, 128, False, 1, -1, -1, 0.0) == plain
    assert plain[-1] == ()  # no extras: the key of before
    keys = {plain, fwd_kernel_key(cfg, "bfloat16", 128, 128, False, 1, 64, -1, 0.0),
            fwd_kernel_key(cfg, "bfloat16", 128, 128, False, 1, -1, 64, 0.0),
            fwd_kernel_key(cfg, "bfloat16", 128, 128, False, 1, 64, 64, 0.0),
            fwd_kernel_key(cfg, "bfloat16", 128, 128, False, 1, -1, -1, 30.0),
            fwd_kernel_key(cfg, "bfloat16", 128, 128, False, 1, -1, -1, 50.0),
            fwd_kernel_key(cfg, "bfloat16", 128, 128, False, 1, 64, 64, 30.0)}
    assert len(keys) == 7


def test_kernel_argument_errors():
    from kernels.sm90.compile import make_fwd_kernel

    cfg = AttnConfig().resolve("sm90", 128, True)
    for kw, msg in ((dict(window_left=-2), "window_left=-2"), (dict(window_right=1.5), "window_right=1.5"),
                    (dict(window_right=3), "with causal the right bound"), (dict(softcap=-1.0), "softcap=-1.0"),
                    (dict(softcap=float("inf")), "softcap=inf")):
        with pytest.raises(ValueError, match=msg):
            make_fwd_kernel(cfg, "bfloat16", 128, 128, True, **kw)
    k = make_fwd_kernel(cfg, "bfloat16", 128, 128, True, window_left=64, window_right=0, softcap=30)
    assert (k.window_left, k.window_right, k.has_left, k.has_window, k.softcap) == (64, -1, True, True, 30.0)
    k = make_fwd_kernel(cfg, "bfloat16", 128, 128, True)
    assert (k.has_window, k.softcap) == (False, 0.0)


# ---- compile and SASS -----------------------------------------------------------------------------------------------
# pairwise (strength-2 covering array, not the full product) over head dims x causal x window kind x softcap x dtype;
# combinations that are the plain kernel (no window after canonicalisation, no softcap) are left out
WINDOWS = {"left": (100, -1), "right": (-1, 64), "both": (64, 32), "none": (-1, -1)}
FACTORS = {"hdims": [(64, 64), (128, 128), (256, 256), (192, 128)], "causal": [False, True],
           "window": list(WINDOWS), "softcap": [0.0, 30.0], "dtype": ["bfloat16", "float16"]}


def _valid(row) -> bool:
    causal, left, right = canonical_window(row["causal"], WINDOWS[row["window"]])
    return left >= 0 or right >= 0 or row["softcap"] > 0


def _pairwise(factors: dict) -> list[dict]:
    """Greedy strength-2 cover of the valid rows (deterministic): every pair of values that some valid row holds."""
    import itertools

    names = list(factors)
    rows_all = [dict(zip(names, vals)) for vals in itertools.product(*factors.values())]
    rows_all = [r for r in rows_all if _valid(r)]
    pairs = lambda r: {((a, r[a]), (b, r[b])) for a, b in itertools.combinations(names, 2)}
    uncovered = set().union(*(pairs(r) for r in rows_all))
    out = []
    while uncovered:
        best = max(rows_all, key=lambda r: len(pairs(r) & uncovered))
        out.append(best)
        uncovered -= pairs(best)
    return out


COMPILE_CASES = [(r["hdims"][0], r["hdims"][1], r["causal"], WINDOWS[r["window"]], r["softcap"], r["dtype"], {})
                 for r in _pairwise(FACTORS)] + [
    (128, 128, True, (64, -1), 30.0, "bfloat16", dict(intra_wg_overlap=False)),  # the non-overlapped loop
    (64, 64, False, (16, 16), 0.0, "bfloat16", dict(pingpong=False)),
    (64, 64, True, (100, -1), 0.0, "bfloat16", {}),  # Mistral-like causal + left window at hd 64: no spills
]


def test_compile_cases_are_pairwise_complete():
    import itertools

    rows = _pairwise(FACTORS)
    assert len(rows) <= 20
    names = list(FACTORS)
    valid = [dict(zip(names, v)) for v in itertools.product(*FACTORS.values())]
    valid = [r for r in valid if _valid(r)]
    for a, b in itertools.combinations(names, 2):
        assert {(r[a], r[b]) for r in rows} == {(r[a], r[b]) for r in valid}, (a, b)


def _sass(tmp_path_factory, hd, hv, causal, window, softcap, dtype, switches):
    from kernels.sm90.compile import make_fwd_kernel
    from sass_cache import kernel_sass  # tests/sass_cache.py: one compile per kernel in the session

    c_causal, left, right = canonical_window(causal, window)
    cfg = AttnConfig(**switches).resolve("sm90", hd, c_causal)
    kern = make_fwd_kernel(cfg, dtype, hd, hv, c_causal, window_left=left, window_right=right, softcap=softcap)
    return kernel_sass(kern, str(tmp_path_factory.mktemp("wsc")))  # None without nvdisasm (after the compile)


@pytest.mark.compile
@pytest.mark.parametrize("case", COMPILE_CASES,
                         ids=lambda c: f"d{c[0]}-c{int(c[2])}-w{c[3][0]}_{c[3][1]}-cap{c[4]:g}-{c[5]}"
                                       + "".join(f"-{k}" for k in c[6]))
def test_compile_window_softcap(tmp_path_factory, case):
    from kernels.sm90.sass import count, opcode_counts

    hd, hv, causal, window, softcap, dtype, switches = case
    sass = _sass(tmp_path_factory, hd, hv, causal, window, softcap, dtype, switches)
    if sass is None:
        pytest.skip("compiled; nvdisasm not installed for the SASS checks")
    c = opcode_counts(sass)
    assert count(c, "HGMMA") > 0 and count(c, "UTMALDG") > 0
    if softcap > 0:  # one tanh per score element of a block (tile_n / 4 per row, 2 rows per thread), on MUFU
        assert count(c, "MUFU.TANH") > 0
    else:
        assert count(c, "MUFU.TANH") == 0
    c_causal, left, right = canonical_window(causal, window)
    if hd >= 128 or left >= 0:  # no local-memory spills (hd 64 runs 3 consumer warpgroups at 160 registers: with a
        # left bound the one-compare mask keeps it spill-free; causal+softcap / right-only windows there spill a little,
        # see kernels/sm90/fwd.py)
        assert count(c, "LDL") == 0 and count(c, "STL") == 0


@pytest.mark.compile
def test_default_kernels_have_no_tanh(tmp_path_factory):
    from kernels.sm90.sass import count, opcode_counts

    sass = _sass(tmp_path_factory, 128, 128, True, (-1, -1), 0.0, "bfloat16", {})
    if sass is None:
        pytest.skip("nvdisasm not installed")
    assert count(opcode_counts(sass), "MUFU.TANH") == 0


@pytest.mark.compile
def test_window_and_softcap_compile_their_own_kernels():
    """Through the interface's compile cache: a window / softcap kernel is another compiled object than the plain one
    (no stale cubin), and the same window again is a cache hit."""
    from kernels.interface import get_fwd_kernel

    cfg = AttnConfig().resolve("sm90", 128, True)
    plain = get_fwd_kernel(cfg, "bfloat16", 128, 128, True, tvm_ffi=False)
    win = get_fwd_kernel(cfg, "bfloat16", 128, 128, True, tvm_ffi=False, window_left=64)
    cap = get_fwd_kernel(cfg, "bfloat16", 128, 128, True, tvm_ffi=False, softcap=30.0)
    assert len({id(plain[1]), id(win[1]), id(cap[1])}) == 3
    assert (win[0].window_left, cap[0].softcap, plain[0].has_window, plain[0].softcap) == (64, 30.0, False, 0.0)
    assert get_fwd_kernel(cfg, "bfloat16", 128, 128, True, tvm_ffi=False, window_left=64)[1] is win[1]


# ---- backward: block ranges, dQ turns, masks -------------------------------------------------------------------------
# (tile_m, tile_n, K/V rows per warpgroup, Q columns per warpgroup): bwd.py hd64 (128-row Q tiles) and hd128, bwd_wide.py
BWD_GEOMETRIES = [(128, 128, 64, 128), (64, 128, 64, 64), (64, 64, 64, 32)]


def _check_bwd_ranges(sq, sk, geometry, causal, left, right):
    tile_m, tile_n, kv_rows, q_cols = geometry
    ok = window_mask(sq, sk, causal, (left, right))
    ok = torch.ones(sq, sk, dtype=torch.bool) if ok is None else ok
    c_causal, c_left, c_right = canonical_window(causal, (left, right))
    n_blocks, m_blocks = -(-sk // tile_n), -(-sq // tile_m)
    off = sk - sq
    visits = set()
    for n in range(n_blocks):
        lo, hi = m_block_range_window(n, tile_m, tile_n, sq, sk, c_causal, c_left, c_right)
        assert 0 <= lo <= hi <= m_blocks, (n, lo, hi)
        rows = ok[:, n * tile_n:(n + 1) * tile_n].any(dim=1).nonzero().flatten()
        if len(rows):  # every row that sees one of the tile's keys is in a visited Q tile
            assert lo <= int(rows.min()) // tile_m and int(rows.max()) // tile_m < hi, (n, lo, hi)
        for m in range(lo, hi):
            visits.add((n, m))
            for w_n in range(tile_n // kv_rows):  # each warpgroup's S^T tile: unmasked only if fully visible
                for w_m in range(tile_m // q_cols):
                    n0, m0 = n * tile_n + w_n * kv_rows, m * tile_m + w_m * q_cols
                    need = bwd_tile_needs_mask(n0, n0 + kv_rows, m0, m0 + q_cols - 1, sk, off, c_causal, c_left,
                                               c_right)
                    if not need:
                        assert n0 + kv_rows <= sk and ok[m0:min(sq, m0 + q_cols), n0:n0 + kv_rows].all(), (n, m, w_n, w_m)
    for m in range(m_blocks):  # the deterministic turns: exactly the K/V tiles that visit Q tile m, contiguous
        n_lo, n_hi = m_block_visitors(m, tile_m, tile_n, off, n_blocks, c_causal, c_left, c_right)
        assert {n for n, mm in visits if mm == m} == set(range(n_lo, n_hi)), (m, n_lo, n_hi)


@pytest.mark.parametrize("geometry", BWD_GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_bwd_block_ranges_and_masks(geometry):
    for sq, sk in ((1000, 1000), (300, 1111), (1111, 300), (129, 257), (1, 700), (700, 1), (64, 64)):
        for causal in (False, True):
            for left, right in ((-1, -1), (0, 0), (100, 50), (127, 0), (128, -1), (-1, 200), (513, 7), (5, 1000),
                                (0, -1), (-1, 0)):
                _check_bwd_ranges(sq, sk, geometry, causal, left, right)


def test_bwd_empty_ranges_exist():
    """A left bound with s_k > s_q leaves the first K/V tiles unseen: their range is empty (dK / dV written as 0)."""
    lo, hi = m_block_range_window(0, 64, 128, 100, 2000, False, 10, -1)
    assert lo == hi == 0
    assert m_block_visitors(0, 64, 128, 1900, 16, False, 10, -1)[0] > 0


def test_bwd_cache_key_and_kernel_arguments():
    import cutlass

    from kernels.compile_cache import cache_key, feature_extra
    from kernels.sm90.backward import _canonical, _features
    from kernels.sm90.bwd import FlashBwdSm90
    from kernels.sm90.bwd_wide import FlashBwdWideSm90

    assert _features(-1, -1, 0.0) == {} and feature_extra(-1, -1, 0.0) == {}
    assert _features(64, -1, 30.0) == {"window_left": 64, "softcap": 30.0}
    assert _canonical(False, -1, 0, 0.0) == (True, -1, -1, 0.0)  # right 0 = causal: the plain causal kernel
    assert _canonical(True, 32, 0, 0.0) == (True, 32, -1, 0.0)
    cfg = AttnConfig().resolve("sm90", 128, False)
    plain = cache_key("bwd", cfg, "bfloat16", 128, 128, False, "sm90")
    assert cache_key("bwd", cfg, "bfloat16", 128, 128, False, "sm90", **feature_extra(-1, -1, 0.0)) == plain
    assert cache_key("bwd", cfg, "bfloat16", 128, 128, False, "sm90", **feature_extra(64, -1, 0.0)) != plain
    for kw, msg in ((dict(window_left=-2), "window_left=-2"), (dict(window_right=3), "with causal the right bound"),
                    (dict(softcap=-1.0), "softcap=-1.0"), (dict(softcap=float("inf")), "softcap=inf"),
                    (dict(window_left=8, two_cta=True), "two_cta=True: not supported with a sliding window")):
        with pytest.raises(ValueError, match=msg):
            FlashBwdSm90(cutlass.BFloat16, 128, True, **kw)
    k = FlashBwdSm90(cutlass.BFloat16, 128, True, window_left=64, window_right=0, softcap=30)
    assert (k.window_left, k.window_right, k.right_bound, k.has_window, k.softcap) == (64, -1, 0, True, 30.0)
    k = FlashBwdWideSm90(cutlass.BFloat16, 256, False, hdim_v=256, window_right=16)
    assert (k.window_left, k.right_bound, k.has_window, k.softcap, k.s_cols) == (-1, 16, True, 0.0, 32)
    k = FlashBwdSm90(cutlass.BFloat16, 64, False)
    assert (k.has_window, k.softcap) == (False, 0.0)


def test_bwd_two_cta_with_features_is_a_config_error():
    from kernels.sm90.backward import compile_backward

    with pytest.raises(ConfigError, match="two_cta=True with window_size/softcap"):
        compile_backward(AttnConfig(two_cta=True), "bfloat16", 128, True, window_left=64)
    with pytest.raises(ConfigError, match="two_cta=True with window_size/softcap"):
        compile_backward(AttnConfig(two_cta=True), "bfloat16", 64, False, softcap=30.0)


BWD_FACTORS = {"hdims": [(64, 64), (128, 128), (256, 256), (192, 128)], "causal": [False, True],
               "window": list(WINDOWS), "softcap": [0.0, 30.0], "deterministic": [False, True]}
BWD_COMPILE_CASES = [(r["hdims"], r["causal"], WINDOWS[r["window"]], r["softcap"], r["deterministic"])
                     for r in _pairwise(BWD_FACTORS)]


def test_bwd_compile_cases_are_pairwise_complete():
    import itertools

    rows = _pairwise(BWD_FACTORS)
    assert len(rows) <= 20
    names = list(BWD_FACTORS)
    valid = [dict(zip(names, v)) for v in itertools.product(*BWD_FACTORS.values())]
    valid = [r for r in valid if _valid(r)]
    for a, b in itertools.combinations(names, 2):
        assert {(r[a], r[b]) for r in rows} == {(r[a], r[b]) for r in valid}, (a, b)


@pytest.mark.compile
@pytest.mark.parametrize("case", BWD_COMPILE_CASES,
                         ids=lambda c: f"d{c[0][0]}x{c[0][1]}-c{int(c[1])}-w{c[2][0]}_{c[2][1]}-cap{c[3]:g}-det{int(c[4])}")
def test_bwd_compile_window_softcap(case):
    from kernels.sm90.backward import compile_backward

    (hd, hv), causal, (left, right), softcap, det = case
    plain = compile_backward(AttnConfig(deterministic=det), "bfloat16", hd, causal, hdim_v=hv)
    out = compile_backward(AttnConfig(deterministic=det), "bfloat16", hd, causal, hdim_v=hv, window_left=left,
                           window_right=right, softcap=softcap)
    assert set(out) >= {"pre", "main", "post"}
    assert out["main"] is not plain["main"]  # its own kernel, never the plain one's cubin


def _bwd_sass(tmp_path, hd, hv, causal, left, right, softcap):
    import glob
    import textwrap

    import dsl_subprocess  # tests/dsl_subprocess.py

    from kernels.sm90.sass import disassemble, find_nvdisasm

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {root!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
        compile_backward(AttnConfig(), 'bfloat16', {hd}, {causal}, hdim_v={hv}, window_left={left},
                         window_right={right}, softcap={softcap})
    """)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_NO_CACHE="1")
    dsl_subprocess.run(code, env, timeout=600)  # a fork of a warm worker: tests/dsl_subprocess.py
    if find_nvdisasm() is None:
        return None
    cubins = [c for c in glob.glob(str(tmp_path / "*.cubin")) if "FlashBwdSm90" in c or "FlashBwdWideSm90" in c]
    assert len(cubins) == 1, cubins
    return disassemble(cubins[0])


@pytest.mark.compile
@pytest.mark.parametrize("case", [(128, 128, True, 100, -1, 30.0), (256, 256, False, 64, 32, 0.0)],
                         ids=lambda c: f"d{c[0]}-c{int(c[2])}-w{c[3]}_{c[4]}-cap{c[5]:g}")
def test_bwd_sass_window_softcap(tmp_path, case):
    """MUFU.TANH only with a softcap; no local-memory spills (hd 64's 128-row Q tiles with a softcap do spill:
    see the README's window / softcap section; bwd_tile_m=64 does not)."""
    from kernels.sm90.sass import count, opcode_counts

    hd, hv, causal, left, right, softcap = case
    sass = _bwd_sass(tmp_path, hd, hv, causal, left, right, softcap)
    if sass is None:
        pytest.skip("compiled; nvdisasm not installed for the SASS checks")
    c = opcode_counts(sass)
    assert count(c, "HGMMA") > 0
    assert (count(c, "MUFU.TANH") > 0) == (softcap > 0)
    assert count(c, "LDL") == 0 and count(c, "STL") == 0
