"""Steady-state main-loop instruction mix of the sm90 forward (CPU: CUTE_DSL_ARCH=sm_90a, nvdisasm), per exp2 fraction.

For each (head dim, causal, exp2_emu_fraction) it compiles the default forward with that fraction, takes its
steady-state K/V block loops (kernels.sm90.sass.steady_state_loops: innermost backward-branch loops holding HGMMA and
MUFU.EX2) and prints, per loop body (one K/V block of one consumer warp): instructions, HGMMA, MUFU.EX2, FMA-pipe
float ops (FFMA/FADD/FMUL), F2FP, FMNMX and LEA. Static counts of the loop body, which the warp issues once per K/V
block.

Usage: CUTE_DSL_ARCH=sm_90a python scripts/fwd_loop_mix.py [--hdim 64] [--fractions 0 0.0625 0.125 0.25]
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def mix(body: list) -> dict:
    body = [op for op, _ in body]
    c = collections.Counter(o.split(".")[0] for o in body)
    return {"insns": len(body), "HGMMA": sum(o.startswith("HGMMA") for o in body),
            "MUFU.EX2": sum(o.startswith("MUFU.EX2") for o in body),
            "FFMA/FADD/FMUL": c["FFMA"] + c["FADD"] + c["FMUL"], "F2FP": c["F2FP"], "FMNMX": c["FMNMX"], "LEA": c["LEA"]}


def main():
    from kernels import AttnConfig
    from kernels.sm90.sass import fwd_sass, steady_state_loops

    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=64)
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.0625, 0.125, 0.25])
    a = ap.parse_args()
    for causal in (False, True):
        for frac in a.fractions:
            cfg = AttnConfig(exp2_emu_fraction=frac).resolve("sm90", a.hdim, causal)
            sass = fwd_sass(cfg, "bfloat16", a.hdim, 128 if a.hdim == 192 else a.hdim, causal, tempfile.mkdtemp())
            for i, body in enumerate(steady_state_loops(sass)):
                m = mix(body)
                print(f"hd{a.hdim} causal={causal} exp2_emu_fraction={frac:.4f} loop{i}: "
                      + " ".join(f"{k} {v}" for k, v in m.items()), flush=True)


if __name__ == "__main__":
    main()
