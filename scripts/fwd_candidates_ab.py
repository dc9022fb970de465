"""Forward A/B of kernel-class candidates that are not AttnConfig fields (issue 11): class attributes of FlashFwdSm90
set on the kernel object before it is compiled, timed against ours (the default) and official FA4 in one process,
round-robin with an L2 flush (scripts/fwd_ab.py's timer and its check against ours).

``python scripts/fwd_candidates_ab.py [--hdims 192 128] [--seqlens 4096 8192 16384] [--causal 0 1] [--repeats 20]
[--cand NAME=attr:value,...] [--cfg NAME=field:value,...] [--out rows.jsonl]``

  ours          AttnConfig() of this tree (through kernels.interface, as fwd_ab.py)
  fa4_official  flash_attn.cute.flash_attn_func (skipped when flash-attn-4 is not installed)
  NAME          every --cand: the default config's kernel with FlashFwdSm90 attributes set, e.g.
                --cand prepv=rescale_before_pv:true nobr=branchless_tau:true both=rescale_before_pv:true,branchless_tau:true
                (an attribute may be combined with AttnConfig fields by prefixing them cfg., e.g.
                --cand nobr_nopp=branchless_tau:true,cfg.pingpong:false)
  NAME          every --cfg: an AttnConfig variant through kernels.interface, exactly as fwd_ab.py's --cfg
Each candidate is compiled here (its own kernel object: the compile cache of kernels.interface is keyed on the
AttnConfig and would hand back the default's cubin). Every variant's output is checked against ours (the candidates
of issue 11 are meant to be bitwise identical: diff 0).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bwd_ab import gpu_note, sampled_round_robin  # noqa: E402
from fwd_ab import _parse_cfg, _ratio_stats, check  # noqa: E402
from kernels.flops import attention_flops  # noqa: E402


def _split(kw: dict):
    """(kernel attributes, AttnConfig fields) of one --cand spec."""
    attrs = {k: v for k, v in kw.items() if not k.startswith("cfg.")}
    fields = {k[len("cfg."):]: v for k, v in kw.items() if k.startswith("cfg.")}
    return attrs, fields


def _candidate(q, k, v, causal, scale, out, lse, attrs: dict, fields: dict):
    from kernels import AttnConfig
    from kernels.interface import forward_config, resolve_config
    from kernels.sm90.compile import compile_fwd, make_fwd_kernel
    from kernels.sm90.scheduler import lpt_group_size

    hdim, dv = q.shape[-1], v.shape[-1]
    cfg = forward_config(resolve_config(AttnConfig(**fields), hdim, causal), hdim, causal, q.shape[1])  # as ours
    if cfg.persistent or cfg.pack_gqa:
        raise SystemExit("fwd_candidates_ab: persistent / packed-GQA configs are not supported here")
    kern = make_fwd_kernel(cfg, {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}[str(q.dtype)], hdim, dv,
                           causal)
    for name, val in attrs.items():
        if not hasattr(kern, name):
            raise SystemExit(f"FlashFwdSm90 has no attribute {name!r}")
        setattr(kern, name, val)
    compiled = compile_fwd(kern, tvm_ffi=True)
    b, s_k, h = q.shape[0], k.shape[1], q.shape[2]
    hb_group = lpt_group_size(h, b, s_k, hdim, dv, q.element_size()) if causal else 1

    def run():
        compiled(q, k, v, out, lse, float(scale), int(hb_group))
        return out
    return run


def main():
    import torch

    from kernels import AttnConfig
    from kernels.interface import attention_forward, resolve_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--hdims", type=int, nargs="+", default=[192, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cand", nargs="*", default=[], help="NAME=attr:value,... (cfg.FIELD:value for AttnConfig)")
    ap.add_argument("--cfg", nargs="*", default=[], help="NAME=field:value,... AttnConfig variants")
    a = ap.parse_args()
    cands = dict(_parse_cfg(s) for s in a.cand)
    cfgs = dict(_parse_cfg(s) for s in a.cfg)
    for s in a.seqlens:
        for hdim in a.hdims:
            for causal in map(bool, a.causal):
                dv = 128 if hdim == 192 else hdim
                heads, batch = 2048 // hdim, max(1, 16384 // s)
                g = torch.Generator(device="cuda").manual_seed(0)
                q = torch.randn(batch, s, heads, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                k = torch.randn(batch, s, heads, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                v = torch.randn(batch, s, heads, dv, device="cuda", dtype=torch.bfloat16, generator=g)
                scale = 1.0 / math.sqrt(hdim)
                out = torch.empty(batch, s, heads, dv, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(batch, heads, s, device="cuda", dtype=torch.float32)

                def ours(**kw):
                    cfg = resolve_config(AttnConfig(**kw), hdim, causal)
                    return lambda: attention_forward(q, k, v, causal, scale, cfg, out=out, lse=lse)[0]

                fns = {"ours": ours()}
                for name, kw in cfgs.items():
                    fns[name] = ours(**kw)
                for name, kw in cands.items():
                    fns[name] = _candidate(q, k, v, causal, scale, out, lse, *_split(kw))
                try:
                    from flash_attn.cute import flash_attn_func

                    def official():
                        r = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal)
                        return r[0] if isinstance(r, tuple) else r
                    fns["fa4_official"] = official
                except ImportError:
                    print("flash_attn.cute not importable: no fa4_official", flush=True)
                diffs = check(fns, out)
                times, gpu = sampled_round_robin(fns, a.repeats)
                print(f"hd{hdim} s{s} causal={int(causal)} GPU during the rounds:{gpu_note(gpu) or ' not sampled'}")
                flops = attention_flops(batch, heads, s, s, hdim, dv, causal)
                off = times.get("fa4_official")
                for name, t in times.items():
                    med = statistics.median(t)
                    so = _ratio_stats(times["ours"], t)
                    sf = _ratio_stats(off, t) if off else (float("nan"),) * 3
                    row = dict(backend=name, spec=cands.get(name) or cfgs.get(name) or {}, hdim=hdim, hdim_v=dv,
                               seqlen=s, batch=batch, heads=heads, causal=causal, ms_median=med,
                               tflops=flops / med / 1e9, speed_vs_ours=so[0], p20=so[1], p80=so[2],
                               speed_vs_official=sf[0], off_p20=sf[1], off_p80=sf[2], n=len(t),
                               rel_diff_vs_ours=diffs[name], gpu=torch.cuda.get_device_name(), **gpu)
                    bad = "  BAD" if not diffs[name] <= 0.02 else ""
                    print(f"hd{hdim} s{s} causal={int(causal)} {name:16s} {med:7.3f} ms {row['tflops']:6.1f} TFLOP/s"
                          f"  speed/ours {so[0]:.3f} [{so[1]:.3f}, {so[2]:.3f}]"
                          f"  speed/official {sf[0]:.3f} [{sf[1]:.3f}, {sf[2]:.3f}]  diff {diffs[name]:.2e}{bad}",
                          flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(row, default=str) + "\n")


if __name__ == "__main__":
    main()
