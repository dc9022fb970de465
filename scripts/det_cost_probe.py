"""Probe (session 44): is the deterministic backward's cost the turns (CTAs waiting for each other) or its code?

``python scripts/det_cost_probe.py OUT.jsonl`` on the GPU host. hd64 non-causal, timed round-robin (L2 flushed) against
our default: (a) seqlen_k = 128, one K/V tile per head, so every Q tile has one contributor and no turn ever waits
(batch 8, 32 heads, seqlen_q 8192: 256 CTAs of 64 Q-tile steps); (b) the same Q tiles against 8k keys (batch 2: 64
contributors per Q tile). If the deterministic kernel costs as much in (a) as in (b), the cost is in its code, not in
the turns. Variants: our default, our deterministic default, its one-buffer (`bwd_dq_stages=1`) and rotate versions,
official FA4 and its deterministic mode. A session script; the committed benchmarks are the experiments.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = (("one_kv_tile", 8, 8192, 128), ("s8k", 2, 8192, 8192))  # (name, batch, seqlen_q, seqlen_k); 32 heads, hd64


def main(out_path: str) -> None:
    from bwd_ab import bwd_inputs, gpu_note, official_bwd, sampled_round_robin, speed_vs
    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward

    rows, hdim, heads = [], 64, 32
    for name, batch, sq, sk in SHAPES:
        q, k, v, do, out, lse, scale = bwd_inputs(batch, sq, sk, heads, hdim)
        cfgs = {"ours": None, "det": AttnConfig(deterministic=True),
                "det_dq1": AttnConfig(deterministic=True, bwd_dq_stages=1),
                "det_rot": AttnConfig(deterministic=True, det_schedule="rotate")}
        fns = {n: (lambda c=c: attention_backward(q, k, v, out, do, lse, False, scale, c)) for n, c in cfgs.items()}
        fns.update({n[4:]: f for n, f in official_bwd(q, k, v, out, do, lse, scale, False).items()})  # official(_det)
        times, gpu = sampled_round_robin(fns, 10)
        print(name, gpu_note(gpu), flush=True)
        for n, (ms, r, p20, med, p80) in speed_vs(times).items():
            print(f"{name} {n:13s} {ms:8.3f} ms speed/ours {med:.3f} [{p20:.3f}, {p80:.3f}]", flush=True)
            rows.append(dict(shape=name, hdim=hdim, heads=heads, batch=batch, seqlen_q=sq, seqlen_k=sk, causal=False,
                             variant=n, times_ms=times[n], speed_vs_ours=r, **gpu))
        with open(out_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "det_cost.jsonl")
