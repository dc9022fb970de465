"""Steady-state main-loop instruction mix of our sm90 forward against official FA4's, both compiled on the CPU.

For each (head dim, causal) it compiles our default forward (one tile per CTA, as official runs) and official FA4's
sm90 forward (flash_attn.cute, in a child process under torch's FakeTensorMode with FLASH_ATTENTION_ARCH=sm_90a: the
CPU-only compile path its interface documents), disassembles both cubins and prints, per steady-state K/V loop
(kernels.sm90.sass.steady_state_loops), the counts of scripts/fwd_loop_mix.py plus the position of the PV wait
(WARPGROUP.DEPBAR.LE gsb0, 0x0), how many MUFU.EX2 come before it, and the loop's common path (kernels.sm90.sass
loop_common_paths: the shortest route through the body, every guarded branch on its cheaper side). Static counts of the loop body: what one
consumer warp issues per K/V block. Official FA4 is read, not copied: this only disassembles its compiled kernel.

Needs (CPU): nvidia-cutlass-dsl, nvidia-cuda-nvdisasm, and for the official side flash-attn-4, quack-kernels, triton,
einops, apache-tvm-ffi (``--ours-only`` without them).

Usage: python scripts/official_loop_mix.py [--hdims 64 128 192 256] [--causal 0 1] [--ours-only] [--spec] [--keep DIR]
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

_CHILD = r"""
import os, sys
import torch
import cutlass.cute as cute
hd, causal, out = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
hdv = 128 if hd == 192 else hd
keep = f" --keep-ptx --keep-cubin --dump-dir={out}"
real = cute.compile

class _Compile:
    def __init__(self, f):
        self.f = f
    def __getitem__(self, k):
        return _Compile(self.f[k])
    def __call__(self, *a, options="", **kw):
        return self.f(*a, options=options + keep, **kw)

cute.compile = _Compile(real)
from flash_attn.cute import interface
interface.cute.compile = cute.compile
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode(allow_non_fake_inputs=True):
    q = torch.empty(2, 8192, 2048 // hd, hd, dtype=torch.bfloat16, device="cuda")
    k = torch.empty(2, 8192, 2048 // hd, hd, dtype=torch.bfloat16, device="cuda")
    v = torch.empty(2, 8192, 2048 // hd, hdv, dtype=torch.bfloat16, device="cuda")
    interface._flash_attn_fwd(q, k, v, causal=causal, return_lse=True)
"""


def official_sass(hd: int, causal: bool, workdir: str) -> str:
    """Official FA4's sm90 forward for (hd, causal), bf16, return_lse=True (as our harness calls it), as SASS text."""
    from kernels.sm90.sass import disassemble

    os.makedirs(workdir, exist_ok=True)
    env = dict(os.environ, FLASH_ATTENTION_ARCH="sm_90a", CUTE_DSL_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132")
    r = subprocess.run([sys.executable, "-c", _CHILD, str(hd), str(int(causal)), workdir], env=env,
                       capture_output=True, text=True)
    cubins = sorted(glob.glob(os.path.join(workdir, "*FlashAttentionForwardSm90*.cubin")))
    if r.returncode != 0 or len(cubins) != 1:
        raise RuntimeError(f"official compile hd{hd} causal={causal} failed (rc {r.returncode}, cubins {cubins}):\n"
                           + r.stderr[-3000:])
    return disassemble(cubins[0])


def ours_sass(hd: int, causal: bool, workdir: str, **fields) -> str:
    from kernels import AttnConfig
    from kernels.sm90.sass import fwd_sass

    cfg = AttnConfig(persistent=False, **fields).resolve("sm90", hd, causal)
    return fwd_sass(cfg, "bfloat16", hd, 128 if hd == 192 else hd, causal, workdir)


def spec_sass(hd: int, causal: bool, workdir: str) -> str:
    """Ours with AttnConfig.speculative_exp on (the default at hd 64 / 128 / (192, 128) since session 52)."""
    return ours_sass(hd, causal, workdir, speculative_exp=True)


def eager_sass(hd: int, causal: bool, workdir: str) -> str:
    """Ours with AttnConfig.speculative_exp off (every block's row maxima first: the default before session 52)."""
    return ours_sass(hd, causal, workdir, speculative_exp=False)


def loop_mix(body: list) -> dict:
    """Counts of one loop body [(opcode, operands)], with the PV wait's index and the MUFU.EX2 issued before it."""
    ops = [o for o, _ in body]
    c = collections.Counter(o.split(".")[0] for o in ops)
    waits = [i for i, (o, r) in enumerate(body) if o.startswith("WARPGROUP.DEPBAR") and r.strip().endswith("0x0")]
    first_wait = waits[0] if waits else -1
    return {"insns": len(ops), "HGMMA": sum(o.startswith("HGMMA") for o in ops),
            "MUFU.EX2": sum(o.startswith("MUFU.EX2") for o in ops),
            "FFMA/FADD/FMUL": c["FFMA"] + c["FADD"] + c["FMUL"], "F2FP": c["F2FP"], "FMNMX": c["FMNMX"],
            "SYNCS": c["SYNCS"], "BAR": c["BAR"], "VOTE": c["VOTE"] + c["VOTEU"],
            "wait0_at": first_wait, "ex2_before_wait0": sum(o.startswith("MUFU.EX2") for o in ops[:max(first_wait, 0)])}


def main():
    from kernels.sm90.sass import loop_common_paths, steady_state_loops

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128, 192, 256])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--ours-only", action="store_true")
    ap.add_argument("--spec", action="store_true",
                    help="also ours with speculative_exp off and on (ours_eager, ours_spec)")
    ap.add_argument("--keep", default=None, help="keep the cubins and SASS here (default: a temp dir)")
    a = ap.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    base = a.keep or tempfile.mkdtemp(prefix="loopmix_")
    sides = ([("ours", ours_sass)] + ([("ours_eager", eager_sass), ("ours_spec", spec_sass)] if a.spec else [])
             + ([] if a.ours_only else [("official", official_sass)]))
    for hd in a.hdims:
        for causal in map(bool, a.causal):
            for name, fn in sides:
                d = os.path.join(base, f"{name}_{hd}_{int(causal)}")
                sass = fn(hd, causal, d)
                with open(os.path.join(d, "kernel.sass"), "w") as f:
                    f.write(sass)
                for i, (body, common) in enumerate(zip(steady_state_loops(sass), loop_common_paths(sass))):
                    m = dict(loop_mix(body), common=common)
                    print(f"hd{hd} causal={int(causal)} {name:10s} loop{i}: "
                          + " ".join(f"{k} {v}" for k, v in m.items()), flush=True)


if __name__ == "__main__":
    main()
