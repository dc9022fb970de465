"""Probe (session 44): the deterministic "lpt" walk's head-group size g below the kernel's floor (bwd.py DET_LPT_HEADS
= 8), timed round-robin against our default and official FA4's deterministic mode.

``python scripts/det_lpt_g_probe.py OUT.jsonl`` on the GPU host. Hypothesis under test: at long lengths g heads' Q +
dO + dQaccum outgrow the 50 MB L2 (official FA4 sizes its deterministic head groups that way). The floor is lowered in
this process only (a g < 8 config is not reachable through AttnConfig otherwise); every g's dq / dk / dv is compared
bitwise with the first g's (the turns are K/V tile order for every g, so they must agree). Rows:
results/h200/session_ab/bwd_det_lpt_g.jsonl. A session script; the committed benchmarks are the experiments.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# (hdim, causal, seqlen, g values); 32k tokens, hidden 2048
CASES = ((64, False, 32768, (16, 8, 4, 2, 1)), (64, False, 16384, (16, 8, 4, 2)),
         (128, True, 32768, (16, 4, 2, 1)), (64, False, 8192, (16, 8, 4)))


def main(out_path: str) -> None:
    import torch

    import kernels.sm90.bwd as bwd
    from bwd_ab import bwd_inputs, gpu_note, official_bwd, sampled_round_robin, speed_vs
    from kernels import AttnConfig
    from kernels.sm90.backward import attention_backward

    bwd.DET_LPT_HEADS = 1
    rows = []
    for hdim, causal, s, gs in CASES:
        heads, batch = 2048 // hdim, max(1, 32768 // s)
        q, k, v, do, out, lse, scale = bwd_inputs(batch, s, s, heads, hdim, causal=causal)
        extra = dict(bwd_dq_stages=2) if hdim == 64 else {}
        cfgs = {"ours": None, "det": AttnConfig(deterministic=True)}
        for g in gs:
            cfgs[f"lpt{g}"] = AttnConfig(deterministic=True, det_schedule="lpt", bwd_lpt_heads=g, **extra)
        fns = {n: (lambda c=c: attention_backward(q, k, v, out, do, lse, causal, scale, c)) for n, c in cfgs.items()}
        official = official_bwd(q, k, v, out, do, lse, scale, causal)
        if official:
            fns["official_det"] = official["fa4_official_det"]
        ref = [t.clone() for t in fns[f"lpt{gs[0]}"]()[:3]]
        same = {n: all(torch.equal(a, b) for a, b in zip(ref, fns[n]()[:3])) for n in cfgs if n.startswith("lpt")}
        times, gpu = sampled_round_robin(fns, 8)
        tag = f"hd{hdim} s{s} causal={int(causal)}"
        print(tag, "bitwise vs", gs[0], same, gpu_note(gpu), flush=True)
        for n, (ms, r, p20, med, p80) in speed_vs(times).items():
            print(f"{tag} {n:14s} {ms:8.3f} ms speed/ours {med:.3f} [{p20:.3f}, {p80:.3f}]", flush=True)
            rows.append(dict(hdim=hdim, causal=causal, seqlen=s, batch=batch, variant=n, times_ms=times[n],
                             speed_vs_ours=r, bitwise_vs_g16=same.get(n), **gpu))
        with open(out_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "det_lpt_g.jsonl")
