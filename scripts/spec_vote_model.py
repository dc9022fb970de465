"""How often ``speculative_exp`` would compute a block's S twice, from the FA4 algorithm model on the CPU.

    python scripts/spec_vote_model.py [--seqlen 2048] [--taus 4 8] [--out results/cpu/spec_votes.md]

The sm90 forward's speculative_exp (kernels/sm90/fwd.py softmax_spec) takes a later block's P with the kept row
maxima and votes over the warpgroup (64 rows): a partial row sum of a thread near 2^tau, a row with no maximum yet or
a NaN sends the warpgroup back to a second QK^T and the eager step. The second vote (softmax.p_exceeds) asks again
with each thread's largest P in place of its sums. kernels.reference.attention_model counts both votes on the same
blocks (_SpecVotes). Per (distribution, causal, head dim, tau), over the later blocks of every warpgroup (causal: the
mask-free ones; the kernel runs the diagonal blocks eagerly):

  rescale   blocks where the eager step rescales some row group of the warpgroup (a redo is needed)
  sum vote  blocks the first vote alone would redo; kept: of those, the ones that rescale nothing (a wasted QK^T)
  2 votes   blocks redone with the second vote (what the kernel does)
  bN        with AttnConfig.spec_redo_budget = N: the blocks redone (a second QK^T) / the blocks a warpgroup runs by
            the eager step after its tile spent the budget (no vote, no second QK^T)

Distributions: experiments.numerics.make_inputs' gaussian (q, k ~ N(0, 1): q.k * scale ~ N(0, 1)), late_max (a ramp
that rises along the visit order, many small rescales) and fp16_overflow (16 outlier keys visited last), plus
``gaussian_x2`` (q scaled by 2: logits of spread 2) and ``sink`` (gaussian, key 0 scored 10 log2 units above the rest:
the attention sink of trained LLMs, visited last). bf16 inputs, batch 1, 2 heads, the resolved default tiles. A model
of the vote, not a timing: what the redos cost is for the GPU A/B (scripts/sched_check.sh part 10).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DISTS = ("gaussian", "gaussian_x2", "sink", "late_max", "fp16_overflow")


def inputs(dist: str, seqlen: int, hdim: int, seed: int = 0):
    import torch

    from experiments.numerics import make_inputs

    base = {"gaussian_x2": "gaussian", "sink": "gaussian"}.get(dist, dist)
    q, k, v = make_inputs(base, torch.float32, 1, seqlen, seqlen, 2, hdim, seed)
    if dist == "gaussian_x2":
        q = q * 2.0
    elif dist == "sink":  # one coordinate: q 1 everywhere, key 0 alone scored 10 log2 units up (others ~N(0, 1/d))
        q[..., 0] = 1.0
        k[..., 0] = 0.0
        k[:, 0, :, 0] = 10.0 * math.sqrt(hdim) / math.log2(math.e)
    return q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)


def votes(dist: str, causal: bool, hdim: int, tau: float, seqlen: int) -> dict:
    from kernels.config import AttnConfig
    from kernels.reference import attention_model

    q, k, v = inputs(dist, seqlen, hdim)
    _, st = attention_model(q, k, v, causal, config=AttnConfig(rescale_threshold=tau), return_stats=True)
    return st


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--taus", type=float, nargs="+", default=[4.0, 8.0])
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    a = ap.parse_args(argv)
    lines = [f"speculative_exp votes, FA4 algorithm model (scripts/spec_vote_model.py), seqlen {a.seqlen}, bf16; "
             "shares of the speculated (warpgroup, K/V block) pairs: later blocks, causal ones mask-free", "",
             "| dist | causal | hdim | tau | blocks | rescale | sum vote | kept | 2 votes | b1 redo / eager | "
             "b2 redo / eager | b4 redo / eager |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for dist in DISTS:
        for causal in (False, True):
            for hdim in a.hdims:
                for tau in a.taus:
                    st = votes(dist, causal, hdim, tau, a.seqlen)
                    n = st["spec_blocks"]
                    need = st["spec_rescale_share"]
                    lines.append(f"| {dist} | {causal} | {hdim} | {tau:g} | {n} | {need:.3f} | "
                                 f"{st['spec_redo_share']:.3f} | {st['spec_kept_share']:.3f} | "
                                 f"{st['spec_max_check_share']:.3f} | " + " | ".join(
                                     f"{st[f'spec_budget{b}_qk2_share']:.3f} / {st[f'spec_budget{b}_eager_share']:.3f}"
                                     for b in (1, 2, 4)) + " |")
                    print(lines[-1], flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
