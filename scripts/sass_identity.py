"""SASS identity of the sm90 kernels between a base revision and the working tree, compiled on the CPU (sm_90a).

    python scripts/sass_identity.py [--base-rev HEAD] [--jobs 2] [--only fwd|bwd]

Compiles the forward and the three backward kernels (pre, main, post) of a fixed list of configs -- head dims 64, 128,
256, (192, 128), causal both, defaults; forward without intra-warpgroup overlap / pingpong, persistent, and as a call
of 4k (1k) queries runs it (call_config: the persistent defaults); deterministic and two_cta backward (hd256: one CTA,
its default being two) -- once from
``git archive <base-rev> kernels conf/tuned`` and once from the working tree, disassembles every cubin (nvdisasm) and compares
the SASS text file by file. Exit status 1 if any differs or is missing. Used to show that a change which should
compile out (e.g. the GQA group at 1) leaves the existing kernels byte-identical.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def configs():
    out = []
    for hd, hv in ((64, 64), (128, 128), (256, 256), (192, 128)):
        for c in (False, True):
            out += [("fwd", hd, hv, c, ""), ("bwd", hd, hv, c, "")]
    for c in (False, True):
        out += [("fwd", 128, 128, c, "intra_wg_overlap=False"), ("fwd", 64, 64, c, "pingpong=False"),
                ("bwd", 128, 128, c, "deterministic=True"), ("bwd", 128, 128, c, "two_cta=True"),
                ("bwd", 64, 64, c, "two_cta=True"), ("bwd", 256, 256, c, "two_cta=False")]  # hd256: one CTA
    out.append(("bwd", 256, 256, True, "deterministic=True"))
    # the persistent forward (hd128 non-causal's default up to 16k; hd256: O in Q's buffer)
    out += [("fwd", 128, 128, False, "persistent=True"), ("fwd", 64, 64, True, "persistent=True"),
            ("fwd", 256, 256, False, "persistent=True")]
    # the causal forward as a call runs it (kernels.config.call_config: the persistent greedy walk with each head dim's
    # tile entry, hd64's 128-row tiles at <= 1k; hd128 non-causal's persistent split-tail kernel is persistent=True)
    out += [("fwd", hd, hv, True, "", 4096) for hd, hv in ((64, 64), (128, 128), (256, 256), (192, 128))]
    out.append(("fwd", 64, 64, True, "", 1024))
    return out


def dump(tree: str, out: str, cfg) -> str:
    from kernels.sm90.sass import disassemble

    kind, hd, hv, c, extra, *seqlen = cfg
    name = f"{kind}_{hd}_{hv}_{int(c)}_{extra.replace('=', '') or 'default'}" + "".join(f"_s{s}" for s in seqlen)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    if kind == "fwd":
        per_call = (f"from kernels.config import call_config\n"
                    f"cfg = call_config(cfg, 'sm90', {hd}, {c}, {seqlen[0]})\n") if seqlen else ""
        body = (f"from kernels.sm90.compile import compile_fwd, make_fwd_kernel\n"
                f"cfg = AttnConfig({extra}).resolve('sm90', {hd}, {c})\n" + per_call +
                f"compile_fwd(make_fwd_kernel(cfg, 'bfloat16', {hd}, {hv}, {c}), tvm_ffi=False, dump_dir={d!r})\n")
    else:
        body = (f"from kernels.sm90.backward import compile_backward\n"
                f"compile_backward(AttnConfig({extra}), 'bfloat16', {hd}, {c}, hdim_v={hv})\n")
    code = f"import sys; sys.path.insert(0, {tree!r})\nfrom kernels import AttnConfig\n" + body
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=d, CUTE_DSL_NO_CACHE="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=900, cwd=tempfile.gettempdir())
    for cub in sorted(glob.glob(os.path.join(d, "*.cubin"))):
        with open(cub[:-len(".cubin")] + ".sass", "w") as f:
            f.write(disassemble(cub))
    return name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-rev", default="HEAD")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="keep the dumps here (default: a temporary folder)")
    ap.add_argument("--only", choices=("fwd", "bwd"), default=None, help="compare only the forward or the backward")
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="sass_identity_")
    base = os.path.join(work, "base_tree")
    os.makedirs(base, exist_ok=True)
    # the base's conf/tuned/ too (kernels/config.py reads it beside the package), so both trees resolve their own defaults
    tuned = subprocess.run(["git", "-C", ROOT, "ls-tree", "-d", a.base_rev, "conf/tuned"], capture_output=True,
                           text=True).stdout.strip()
    paths = ["kernels"] + (["conf/tuned"] if tuned else [])
    arch = subprocess.run(["git", "-C", ROOT, "archive", a.base_rev, *paths], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", base], input=arch, check=True)
    cfgs = [c for c in configs() if a.only in (None, c[0])]
    with ThreadPoolExecutor(a.jobs) as ex:
        names = list(ex.map(lambda c: dump(base, os.path.join(work, "before"), c), cfgs))
        list(ex.map(lambda c: dump(ROOT, os.path.join(work, "after"), c), cfgs))
    n = bad = 0
    for name in names:
        for f in sorted(glob.glob(os.path.join(work, "before", name, "*.sass"))):
            g = os.path.join(work, "after", name, os.path.basename(f))
            n += 1
            if not os.path.exists(g) or open(f).read() != open(g).read():
                bad += 1
                print(f"DIFFERS {name}/{os.path.basename(f)[:60]}...")
    print(f"{len(cfgs)} configs, {n} SASS files compared, {bad} differ or missing (base {a.base_rev}, dumps in {work})")
    return int(bad > 0 or n == 0)


if __name__ == "__main__":
    sys.exit(main())
