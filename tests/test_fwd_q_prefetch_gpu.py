"""GPU checks of AttnConfig.q_prefetch (the next tile's Q prefetched into L2 by the producer warp; CPU tests:
tests/test_fwd_q_prefetch.py). It loads nothing into shared memory, so every call must equal the kernel without it bit
for bit, into NaN-poisoned buffers: hd256 causal on the greedy walk (the default up to 32k; a CTA's last tile has no
next one) and on the round robin, with o_deferred (the candidate it goes with), hd128 non-causal persistent, ragged
lengths (rows past seqlen_q, CTAs with one tile and with several) and the calls that ignore it (the split tail)."""
from __future__ import annotations

import functools

import pytest

from test_fwd_o_direct_gpu import SHAPES
from test_fwd_o_direct_gpu import _same as same_as_without

pytestmark = pytest.mark.gpu

_same = functools.partial(same_as_without, switch="q_prefetch")


@pytest.mark.parametrize("extra", [{}, {"o_deferred": True}, {"persistent": True, "persistent_greedy": False}],
                         ids=["default", "o_deferred", "round_robin"])
def test_q_prefetch_hd256_causal(extra):
    _same(extra, 256, 256, True, SHAPES + [(1, 16384, 16384, 2)])


@pytest.mark.parametrize("hdims", [(128, 128), (192, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_q_prefetch_persistent(hdims, causal):
    _same({"persistent": True, "split_tail": False, "persistent_dynamic": False}, *hdims, causal, SHAPES)


def test_q_prefetch_ignored_on_the_split_tail():
    _same({"persistent": True, "split_tail": True}, 256, 256, False, [(1, 16384, 16384, 8)])
