"""CPU checks of test_fwd_loop_shape_gpu.keeps_first_maxima, the host-side rule that decides whether the GPU files'
``bitwise`` may compare two loop layouts bit for bit (no row rescales after the first key block the kernel visits)."""
from __future__ import annotations

import torch

from kernels.config import AttnConfig
from test_fwd_loop_shape_gpu import keeps_first_maxima


def _inputs(sk: int, hdim: int = 64):
    torch.manual_seed(0)
    q = torch.randn(1, 4, 1, hdim)
    k = torch.randn(1, sk, 1, hdim) * 0.01  # all scores near 0: no row grows by tau anywhere
    return q, k


def test_flat_scores_keep_their_maxima():
    q, k = _inputs(4097)
    assert keeps_first_maxima(q, k, 64 ** -0.5, [AttnConfig()], 64, causal=False)


def test_a_key_far_above_the_first_block_is_seen():
    q, k = _inputs(4097)
    # tile_n 128: the first visited block holds key 4096 alone; key 0 scores ~tau + 2 above it for row 0
    k[0, 0, 0] = q[0, 0, 0] / q[0, 0, 0].norm() ** 2 * (10.0 / (64 ** -0.5 * 1.4427))
    assert not keeps_first_maxima(q, k, 64 ** -0.5, [AttnConfig()], 64, causal=False)
    # the same key inside the first block (seqlen_k 128: one block) keeps the maxima
    q2, k2 = _inputs(128)
    k2[0, 0, 0] = k[0, 0, 0]
    assert keeps_first_maxima(q2, k2, 64 ** -0.5, [AttnConfig()], 64, causal=False)


def test_causal_never_claims_bitwise():
    q, k = _inputs(128)
    assert not keeps_first_maxima(q, k, 64 ** -0.5, [AttnConfig()], 64, causal=True)
