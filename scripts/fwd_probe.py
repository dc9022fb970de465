"""What a piece of the forward's softmax costs: the default kernel against copies compiled without that piece
(outputs wrong by design), timed round-robin on one GPU in one process.

``python scripts/fwd_probe.py [--hdims 64 128] [--seqlens 8192] [--causal 0] [--repeats 12] [--probes ...]
[--out rows.jsonl] [--calls]``

Each probe patches functions of kernels/sm90 while its copy of the kernel is traced (kernels/ itself has no switch
for it: a probe computes the wrong answer), compiles it apart from the compile cache, and runs it with the default
kernel's launch arguments (one tile per CTA; ``--calls``: through kernels.interface, with the call's own persistent,
walk and split rules; paper-grid shape: 32k tokens, hidden 2048, bf16):
  no_rowsum   a row's sum is its first P value: none of the 31-63 FADDs per row and block
  no_exp      P = the exponent itself (an FFMA, no MUFU.EX2): the softmax without the MUFU pipe
  no_maxshfl  the row maxima are not reduced across the quad (2 shuffles + FMNMX per row and block left out)
  warp_vote   speculative_exp's votes over the warp (vote.any) instead of the warpgroup (a named-barrier reduction):
              what a per-warp redo could win on the common path. Safe only where no vote fires (the gaussian inputs
              here: a thread's partial sums stay far below 2^tau); a fired vote would issue a wgmma in some warps only
  no_vote     no speculative vote at all (every block keeps its maxima; the redo code is dead)
  free_o      o_direct's epilogue (O from registers to global memory, Q released after the last Q K^T) with its
              stores taken out but one element per thread: what moving O out of Q's buffer could win at most, with
              the next tile's Q load under the last block (hd256's persistent kernels, where O shares Q's buffer;
              with --calls)
  no_softmax  all of no_rowsum, no_exp, no_maxshfl and no_vote at once: the loop's GEMMs, barriers and loads with
              only P = the scaled score (FFMA), its conversion and the masks left (spec_warp_redo's per-warp votes,
              hd64's default, stay): a ceiling on what any softmax could leave the loop at that shape under the
              power cap (e.g. hd256 causal 32k, where issue 11 asks for more than any rate measured on the H200)
The speed of a probe over the default is an upper bound of what a cheaper form of that piece could win (e.g. row sums
from the tensor core: no_rowsum). The default's output is checked against the fp32 math of torch first; the probes'
are not (they are wrong). A session script; nothing it prints is a result of the kernels.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def _probe_patches(name: str):
    """(module, attribute, replacement) triples of a probe (applied while its kernel is traced)."""
    import cutlass
    import cutlass.cute as cute

    from kernels.sm90 import fwd, softmax
    from kernels.sm90.layout import acc_rows_cols

    def first_value(s, r, k):
        return s[r, 0]

    def exponent_only(x, *, loc=None, ip=None):
        return x

    def no_shuffle(x):
        return x

    def warp_vote(pred, bar_id, n_threads, *, loc=None, ip=None):
        return cute.arch.vote_any_sync(pred)

    def no_vote(pred, bar_id, n_threads, *, loc=None, ip=None):
        return cutlass.Boolean(False)

    @cute.jit
    def first_element_of_o(self, mO, thr, rO, tile, m_base):  # store_o_direct's signature (thr: the P V MMA's slice)
        gO = cute.local_tile(mO[None, None, tile.head, tile.bidx], (self.tile_m, self.hdim_v), (tile.m_block, 0))
        tOgO = acc_rows_cols(thr.partition_C(gO))
        tOcO = acc_rows_cols(thr.partition_C(cute.make_identity_tensor((self.tile_m, self.hdim_v))))
        if m_base + tOcO[0, 0][0] < tile.seqlen_q:
            tOgO[0, 0] = acc_rows_cols(rO)[0, 0]

    return {"no_rowsum": [(softmax, "_row_sum", first_value)],
            "no_exp": [(softmax, "exp2_mufu", exponent_only)],
            "no_maxshfl": [(softmax, "quad_allreduce_max", no_shuffle)],
            "warp_vote": [(fwd, "warpgroup_any", warp_vote)],
            "no_vote": [(fwd, "warpgroup_any", no_vote)],
            "no_softmax": [(softmax, "_row_sum", first_value), (softmax, "exp2_mufu", exponent_only),
                           (softmax, "quad_allreduce_max", no_shuffle), (fwd, "warpgroup_any", no_vote)],
            "free_o": [(fwd.FlashFwdSm90, "store_o_direct", first_element_of_o)]}[name]


PROBES = ("no_rowsum", "no_exp", "no_maxshfl", "warp_vote", "no_vote", "no_softmax", "free_o")
# AttnConfig fields a probe's kernel adds to the default's (free_o: o_direct's epilogue, whose stores it takes out)
PROBE_FIELDS = {"free_o": dict(o_direct=True)}


@contextlib.contextmanager
def patched(triples):
    saved = [(m, a, getattr(m, a)) for m, a, _ in triples]
    try:
        for m, a, f in triples:
            setattr(m, a, f)
        yield
    finally:
        for m, a, f in saved:
            setattr(m, a, f)


def compile_variant(hdim: int, causal: bool, probe: str | None):
    """The default forward for (hdim, causal), one tile per CTA, compiled (with ``probe``'s patches while traced)."""
    from kernels import AttnConfig
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel

    cfg = AttnConfig(persistent=False, **PROBE_FIELDS.get(probe, {})).resolve("sm90", hdim, causal)
    kern = make_fwd_kernel(cfg, "bfloat16", hdim, 128 if hdim == 192 else hdim, causal)
    with patched(_probe_patches(probe) if probe else []):
        return compile_fwd(kern)


def call_variant(hdim: int, causal: bool, probe: str | None, q, k, v, out, lse, scale: float, **fields):
    """--calls: a closure that runs the default (with ``probe``'s fields) through kernels.interface, so with the call's
    own per-length rules (the persistent kernels, the greedy walk, the split tail), its kernels traced with ``probe``'s
    patches. A probe shares the default's compile-cache key, so each closure puts its own compiled kernels back into
    the cache before its call (a dict update: host time far below the kernels' milliseconds)."""
    from kernels import AttnConfig, compile_cache
    from kernels.interface import attention_forward, resolve_config

    cfg = resolve_config(AttnConfig(**fields, **PROBE_FIELDS.get(probe, {})), hdim, causal)
    saved = dict(compile_cache._CACHE)
    compile_cache._CACHE.clear()
    with patched(_probe_patches(probe) if probe else []):
        attention_forward(q, k, v, causal, scale, cfg, out=out, lse=lse)
    mine = dict(compile_cache._CACHE)
    compile_cache._CACHE.clear()
    compile_cache._CACHE.update(saved)

    def run():
        compile_cache._CACHE.update(mine)
        attention_forward(q, k, v, causal, scale, cfg, out=out, lse=lse)
    return run


def main(argv=None) -> int:
    import torch

    from bwd_ab import gpu_note, sampled_round_robin
    from kernels.flops import attention_flops

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[8192])
    ap.add_argument("--causal", type=int, nargs="+", default=[0])
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--probes", nargs="+", default=list(PROBES), choices=PROBES)
    ap.add_argument("--out", default=None)
    ap.add_argument("--persistent", action="store_true",
                    help="with --calls: persistent=True for the default and every probe (e.g. hd256 non-causal, whose "
                         "default is one tile per CTA)")
    ap.add_argument("--calls", action="store_true",
                    help="run every variant through kernels.interface (the call's own persistent / walk / split rules) "
                         "instead of one tile per CTA")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fwd_probe.py times kernels: it needs a CUDA GPU")
    for causal in map(bool, a.causal):
        for hdim in a.hdims:
            dv = 128 if hdim == 192 else hdim
            if not a.calls:
                fns_c = {"default": compile_variant(hdim, causal, None)}
                for p in a.probes:
                    fns_c[p] = compile_variant(hdim, causal, p)
            for s in a.seqlens:
                b, h = max(1, 32768 // s), 2048 // hdim
                g = torch.Generator(device="cuda").manual_seed(0)
                q = torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                k = torch.randn(b, s, h, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                v = torch.randn(b, s, h, dv, device="cuda", dtype=torch.bfloat16, generator=g)
                out = torch.empty(b, s, h, dv, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                scale = 1.0 / math.sqrt(hdim)
                if a.calls:
                    extra = {"persistent": True} if a.persistent else {}
                    fns = {n: call_variant(hdim, causal, None if n == "default" else n, q, k, v, out, lse, scale,
                                           **extra) for n in ["default"] + a.probes}
                else:
                    fns = {n: (lambda c=c: c(q, k, v, out, lse, scale, 1)) for n, c in fns_c.items()}
                fns["default"]()
                # the check on the first batch entry and head (fp32 attention of the whole call at 32k would need
                # tens of GB where the math backend runs)
                ref = torch.nn.functional.scaled_dot_product_attention(
                    *(t[:1, :, :1].transpose(1, 2).float() for t in (q, k, v)), is_causal=causal,
                    scale=scale).transpose(1, 2)
                err = (out[:1, :, :1].float() - ref).abs().max().item()
                times, gpu = sampled_round_robin(fns, a.repeats)
                flops = attention_flops(b, h, s, s, hdim, dv, causal)
                print(f"hd{hdim} s{s} causal={int(causal)} default max|out - fp32| {err:.2e};"
                      f"{gpu_note(gpu) or ' GPU not sampled'}", flush=True)
                base = times["default"]
                for name, t in times.items():
                    ratios = sorted(x / y for x, y in zip(base, t))
                    row = dict(probe=name, hdim=hdim, seqlen=s, batch=b, heads=h, causal=causal, calls=a.calls,
                               persistent=a.persistent,
                               ms_median=statistics.median(t), tflops=flops / statistics.median(t) / 1e9,
                               speed_vs_default=statistics.median(ratios), n=len(t), default_err=err, **gpu)
                    print(f"  {name:11s} {row['ms_median']:7.3f} ms {row['tflops']:6.1f} TFLOP/s "
                          f"speed/default {row['speed_vs_default']:.3f}", flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
