"""GPU checks of AttnConfig.o_deferred (a tile's O store under the next tile's first Q K^T, through the last V stage
or, with o_direct, from the kept registers; CPU tests: tests/test_fwd_o_deferred.py). Only when O is stored changes,
so every call must equal the kernel without it bit for bit, into NaN-poisoned buffers (a tile left unstored stays
NaN, the CTA's last one included): hd256 and (192, 128), both store paths, causal (the greedy walk, the default up to
32k) and not (persistent, the default up to 8k), ragged lengths (rows past seqlen_q, CTAs with one tile and with
several), the round robin, a window and a softcap."""
from __future__ import annotations

import functools

import pytest

from test_fwd_o_direct_gpu import SHAPES
from test_fwd_o_direct_gpu import _same as same_as_without

pytestmark = pytest.mark.gpu

_same = functools.partial(same_as_without, switch="o_deferred")


# O's path, named (else each head dim's default where persistent: hd256 direct from 2049 tokens, (192, 128) V stage)
PATHS = {"v_stage": {"o_via_v_stage": True}, "direct": {"o_direct": True, "o_direct_wide": True}}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdims", [(256, 256), (192, 128)])
def test_o_deferred_is_bitwise_the_default(hdims, causal, path):
    _same({"split_tail": False, **PATHS[path]}, *hdims, causal, SHAPES)


@pytest.mark.parametrize("path", list(PATHS))
def test_o_deferred_round_robin(path):
    """hd256 causal on the static round robin (the greedy walk turned off): each CTA's tiles c, c + grid, ..."""
    _same({"persistent": True, "persistent_greedy": False, **PATHS[path]}, 256, 256, True, SHAPES)


@pytest.mark.parametrize("path", list(PATHS))
def test_o_deferred_one_tile_per_cta(path):
    """More CTAs than tiles: every CTA stores its only tile after the loop."""
    _same({"split_tail": False, "persistent": True, **PATHS[path]}, 256, 256, False,
          [(1, 300, 300, 1), (1, 128, 4000, 2)])


def test_o_deferred_hd256_causal_default_lengths():
    """hd256 causal 16k / 32k, the cells issue 11 measures: the default (direct stores; skip_diag_wg at 16k)."""
    _same({}, 256, 256, True, [(1, 16384, 16384, 2), (1, 32768, 32768, 1)])


@pytest.mark.parametrize("causal", [False, True])
def test_o_deferred_window_softcap(causal):
    _same({"split_tail": False}, 256, 256, causal, SHAPES[:4], window_left=300, window_right=-1 if causal else 200)
    _same({"split_tail": False}, 256, 256, causal, SHAPES[:4], softcap=30.0)
