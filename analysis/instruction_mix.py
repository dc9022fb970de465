"""Static instruction mix of our compiled sm90 kernels (SASS opcode counts), the evidence behind what limits them.

`python -m analysis.instruction_mix [--out results/cpu/instruction_mix.csv]` compiles (CPU, CUTE_DSL_ARCH=sm_90a)
the forward at its default config and a few switch values, and the backward main kernel, then counts per kernel:
tensor-core ops (HGMMA), exponentials (MUFU.EX2), FMA-pipe work (FFMA/FADD/FMUL/FMNMX), spills (LDL/STL), global
reductions (RED/ATOM) and barriers. Counts are static (instructions in the binary, not executed ones).

Forward rows that only change ``exp2_emu_fraction`` also get the cost of one software exp2, against the row of the same
head dim at fraction 0: ``fp_per_emu_exp`` = extra FFMA + FADD + FMNMX per MUFU.EX2 removed (the polynomial's FMA-pipe
and clamp work; its exponent insert, one LEA or IMAD as ptxas picks, comes on top) and ``insns_per_emu_exp`` = extra
instructions of any kind per MUFU.EX2 removed (includes ptxas's re-balancing of integer bookkeeping).
"""
from __future__ import annotations

import argparse
import csv
import glob
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {"HGMMA": ("HGMMA",), "MUFU.EX2": ("MUFU.EX2",), "FFMA": ("FFMA",), "FADD": ("FADD",), "FMUL": ("FMUL",),
          "FMNMX": ("FMNMX",), "LDL(spill)": ("LDL",), "STL(spill)": ("STL",), "RED/ATOM": ("RED", "REDG", "ATOM", "ATOMG"),
          "BAR": ("BAR",), "SYNCS": ("SYNCS",), "UTMALDG": ("UTMALDG",), "VOTE": ("VOTE",), "F2I/FRND": ("F2I", "FRND"),
          "STSM": ("STSM",), "UBLKRED": ("UBLKRED",), "FFMA.SAT": ("FFMA.SAT",), "LEA": ("LEA",)}

# (label, kind, config kwargs, hdim (or (hdim, hdim_v)), causal)
CASES = [
    ("fwd hd64 default", "fwd", {}, 64, False),
    ("fwd hd64 exp2 1/16", "fwd", {"exp2_emu_fraction": 0.0625}, 64, False),
    ("fwd hd64 exp2 1/8", "fwd", {"exp2_emu_fraction": 0.125}, 64, False),
    ("fwd hd64 exp2 3/16", "fwd", {"exp2_emu_fraction": 0.1875}, 64, False),
    ("fwd hd64 exp2 1/4", "fwd", {"exp2_emu_fraction": 0.25}, 64, False),
    ("fwd hd64 exp2 1/2", "fwd", {"exp2_emu_fraction": 0.5}, 64, False),
    ("fwd hd64 exp2 1", "fwd", {"exp2_emu_fraction": 1.0}, 64, False),
    ("fwd hd128 default", "fwd", {}, 128, False),
    ("fwd hd128 tau0", "fwd", {"rescale_threshold": 0.0}, 128, False),
    ("fwd hd128 exp2 1/8", "fwd", {"exp2_emu_fraction": 0.125}, 128, False),
    ("bwd hd64 default (128-row tiles)", "bwd", {}, 64, False),
    ("bwd hd64 64-row tiles", "bwd", {"bwd_tile_m": 64}, 64, False),
    ("bwd hd64 deterministic (lpt, two dQ staging buffers)", "bwd", {"deterministic": True}, 64, False),
    ("bwd hd128 default", "bwd", {}, 128, False),
    ("bwd hd128 deterministic", "bwd", {"deterministic": True}, 128, False),
    ("bwd hd128 deterministic naive causal", "bwd", {"deterministic": True, "det_schedule": "naive"}, 128, True),
    ("bwd hd128 two_cta", "bwd", {"two_cta": True}, 128, False),
    ("bwd hd192x128 default", "bwd", {}, (192, 128), False),
    ("bwd hd256 default (two_cta with 80-row K/V tiles)", "bwd", {}, 256, False),
    ("bwd hd256 two_cta 64-row tiles", "bwd", {"two_cta": True, "bwd_two_cta_n80": False}, 256, False),
    ("bwd hd256 one CTA", "bwd", {"two_cta": False}, 256, False),
    ("bwd hd256 deterministic causal (80-row K/V tile pairs)", "bwd", {"deterministic": True}, 256, True),
    ("bwd hd256 deterministic rotate (80-row K/V tile pairs)", "bwd", {"deterministic": True}, 256, False),
    ("bwd hd256 deterministic causal 64-row pairs", "bwd", {"deterministic": True, "bwd_two_cta_n80": False}, 256, True),
]

_PROGRAM = """
import sys; sys.path.insert(0, {root!r})
from kernels import AttnConfig
cfg = AttnConfig(**{cfg!r})
if {kind!r} == "fwd":
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel
    r = cfg.resolve("sm90", {hdim}, {causal})
    compile_fwd(make_fwd_kernel(r, "bfloat16", {hdim}, {hdim_v}, {causal}), tvm_ffi=False, dump_dir={dump!r})
else:
    from kernels.sm90.backward import compile_backward
    compile_backward(cfg, "bfloat16", {hdim}, {causal}, hdim_v={hdim_v})
"""


def kernel_sass(kind: str, cfg: dict, hdim, causal: bool, dump: str) -> str:
    """Compile one kernel in a fresh process (the DSL dumps its cubin into ``dump``) and return its SASS (the backward:
    its main kernel, whichever class the head dim runs)."""
    from kernels.sm90.sass import disassemble

    hdim, hdim_v = hdim if isinstance(hdim, tuple) else (hdim, hdim)
    code = textwrap.dedent(_PROGRAM.format(root=str(ROOT), cfg=cfg, kind=kind, hdim=hdim, hdim_v=hdim_v, causal=causal,
                                           dump=dump))
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=dump, CUTE_DSL_NO_CACHE="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=900, capture_output=True)
    cubins = sorted(glob.glob(os.path.join(dump, "*.cubin")))
    if kind == "bwd":  # the main kernel: not the pre- / postprocess
        cubins = [c for c in cubins if "FlashBwd" in os.path.basename(c)
                  and not any(k in os.path.basename(c) for k in ("FlashBwdPreSm90", "FlashBwdPostSm90"))]
    if len(cubins) != 1:
        raise RuntimeError(f"expected one cubin for {kind} in {dump}, found {cubins}")
    return disassemble(cubins[0])


def mix(sass: str) -> dict:
    from kernels.sm90.sass import count, opcode_counts

    c = opcode_counts(sass)
    out = {g: sum(count(c, p) for p in prefixes) for g, prefixes in GROUPS.items()}
    out["total"] = sum(c.values())
    return out


def per_emulated_exp(row: dict, base: dict) -> dict:
    """Cost of one software exp2: the extra instructions of ``row`` over ``base`` (same kernel at exp2 fraction 0) per
    MUFU.EX2 removed. Empty when nothing was emulated."""
    saved = base["MUFU.EX2"] - row["MUFU.EX2"]
    if saved <= 0:
        return {"fp_per_emu_exp": "", "insns_per_emu_exp": ""}
    fp = sum(row[g] - base[g] for g in ("FFMA", "FADD", "FMNMX"))
    return {"fp_per_emu_exp": round(fp / saved, 3), "insns_per_emu_exp": round((row["total"] - base["total"]) / saved, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.instruction_mix", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="CSV to write (default: print only)")
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, kind, cfg, hdim, causal) in enumerate(CASES):
            dump = os.path.join(tmp, str(i))
            os.makedirs(dump)
            rows.append({"kernel": label, **mix(kernel_sass(kind, cfg, hdim, causal, dump))})
            base = next((r for r, c in zip(rows, CASES) if c[1:] == ("fwd", {}, hdim, causal)), None)
            only_exp2 = kind == "fwd" and set(cfg) == {"exp2_emu_fraction"}
            rows[-1].update(per_emulated_exp(rows[-1], base) if only_exp2 and base else
                            {"fp_per_emu_exp": "", "insns_per_emu_exp": ""})
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
