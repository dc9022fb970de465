"""Forward A/B on one GPU, one process, round-robin with an L2 flush: our variants vs an older commit of ours vs
official FA4 (and cuDNN with --cudnn).

``python scripts/fwd_ab.py [--base-rev REV] [--hdims 64 128 256] [--seqlens 4096 8192 16384] [--causal 0 1]
[--repeats 20] [--cfg NAME=field:value,field:value ...] [--base-cfg NAME=...] [--out rows.jsonl] [--batch B]
[--heads H] [--kv-heads H_KV] [--seqlen-k S_K] [--gemm N] [--inputs gaussian|sink|late_max]``

``--inputs`` (default gaussian: N(0, 1) q, k, v) shapes the scores where the rescale path matters (speculative_exp's
votes, the tau arm): ``sink`` scores key 0 10 log2 units above the mean for every query (the attention sink of trained
LLMs; the kernels visit it last, so each row's largest score arrives in its last block, ~5 log2 units above the
maximum kept until then), ``late_max`` is experiments/numerics.py's ramp (each row's maximum climbs along the visit
order). Rows record it as ``inputs``.

Per (hdim, causal, seqlen) at 16k total tokens and hidden 2048 (batch = 16384 / seqlen, heads = 2048 / hdim), bf16;
``--batch`` / ``--heads`` fix those instead, ``--kv-heads`` gives K/V fewer heads (GQA / MQA: Q head i reads K/V head
i // (heads / kv_heads)), ``--seqlen-k`` a K/V length of its own (default: seqlen, the query length). FLOPs count the
visible (query, key) pairs (kernels/flops.py). Packed GQA against the per-Q-head GQA kernel, e.g. ``--hdims 128
--batch 16 --heads 32 --kv-heads 4 --seqlens 128 512 2048 --cfg pack=pack_gqa:true``.
  ours             AttnConfig() of this working tree
  ours_base        AttnConfig() of the kernels/ package at ``--base-rev`` (git archive into a temp dir, imported as a
                   separate package, so both kernels run in this process; '' skips it)
  NAME (base)      every --base-cfg: AttnConfig fields of the --base-rev tree (e.g. its persistent kernel against
                   this tree's: --cfg pers=persistent:true --base-cfg pers_base=persistent:true)
  fa4_official     flash_attn.cute.flash_attn_func(..., return_lse=True) (as the sweep's backend; skipped when
                   flash-attn-4 is not installed)
  fa4_official_nolse  with --official-nolse: official without return_lse (its kernel without the LSE store; this
                   script's fa4_official until 2026-12-03)
  ours_alloc       with --official-nolse: ours through kernels.attention (its own output allocation, as the sweep)
  sdpa_cudnn       with --cudnn
  gemm             with --gemm N: a bf16 N x N x N torch.matmul (cuBLAS) timed in the same rounds; every variant's
                   row gains ``of_gemm`` (its TFLOP/s over the GEMM's, per round; median and [p20, p80]): issue 11's
                   "at >= 90% of the bf16 matmul throughput measured in the same run"
  NAME             every --cfg (AttnConfig fields of this tree, e.g. --cfg nopp=pingpong:false,intra_wg_overlap:false;
                   O rescaled before its P V: --cfg prepv=rescale_before_pv:true (bitwise the default's output: diff 0);
                   the 2x1-cluster forward with K/V multicast: --cfg cl2=cluster_m:2 --causal 0 -- a variant whose
                   config the call refuses, e.g. cluster_m:2 at causal=1, or pack_gqa:true with a group that does not
                   divide tile_m, is skipped with the reason printed)
Each variant's output is first checked against ``ours`` (max |diff| relative to max |out|; a variant over 0.02, or
with NaN in its output, is flagged BAD and its times are still printed). Then ``--repeats`` rounds (rounded up to whole cycles of
balanced orders: every variant follows every other equally often), the L2 flushed before every call; per
variant the median time, TFLOP/s, and the per-round speed ratios against ours and against fa4_official (median and
[p20, p80]). Rows of this tree's configs (ours and every --cfg) also carry the roofline model's bound for them
(model_tflops, model_bound: analysis/roofline.py predict with the TMA fill counted, on the hardware table's entry for
the device), printed after the times. A session script for kernel work; the committed benchmark is
``python run.py sweep experiment=...``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bwd_ab import gpu_note, sampled_round_robin  # noqa: E402  (one round-robin timer for the session scripts)
from kernels.flops import attention_flops  # noqa: E402

DEFAULT_BASE_REV = "HEAD"  # the last commit: an A/B of the working tree's uncommitted kernel edits


def load_base(rev: str):
    """(interface module, config module) of kernels/ at git revision ``rev`` (or in the folder ``rev``, which holds
    a kernels/ tree: for hosts without the repository's history), imported as package ``fa4lab_base`` (its
    __init__, which registers the torch ops, is not run)."""
    if Path(rev).is_dir():
        return _import_base(Path(rev).resolve())
    tmp = Path(tempfile.mkdtemp(prefix="fa4lab_base_"))
    paths = ["kernels"] + (["conf/tuned"] if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e",
                                                             f"{rev}:conf/tuned"], capture_output=True).returncode == 0
                           else [])
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *paths], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=arch, check=True)
    return _import_base(tmp)


def _import_base(tmp: Path):
    pkg = types.ModuleType("fa4lab_base")
    pkg.__path__ = [str(tmp / "kernels")]
    sys.modules["fa4lab_base"] = pkg
    return importlib.import_module("fa4lab_base.interface"), importlib.import_module("fa4lab_base.config")


def _parse_cfg(spec: str):
    name, _, body = spec.partition("=")
    kw = {}
    for item in filter(None, body.split(",")):
        k, _, v = item.partition(":")
        lv = v.lower()
        kw[k] = True if lv == "true" else False if lv == "false" else None if lv == "none" else (
            int(v) if v.lstrip("-").isdigit() else float(v))
    return name, kw


def gpu_key(device_name: str) -> str | None:
    """kernels.hardware's key of a CUDA device name ('NVIDIA H100 80GB HBM3' -> 'h100'), None when not listed."""
    from kernels.hardware import GPUS

    name = device_name.lower()
    hits = [k for k in GPUS if k in name]
    return max(hits, key=len) if hits else None


def model_bound(gpu: str | None, hdim: int, dv: int, causal: bool, fields: dict, shape: dict) -> dict:
    """The roofline model's bound for this tree's config ``fields`` (analysis/roofline.py predict, TMA fill counted):
    {model_tflops, model_bound}; {} where the model has no answer (no GPU key, a config it refuses)."""
    if gpu is None:
        return {}
    try:
        from analysis.roofline import predict

        p = predict(gpu, hdim, causal, dict(fields), dict(shape, hdim_v=dv), tma_fill=True)
    except Exception:  # noqa: BLE001 -- a session script: the timing matters more than the model
        return {}
    return dict(model_tflops=p.tflops, model_bound=p.bound)


def _variants(q, k, v, causal, scale, base, extra: dict, cudnn: bool, base_extra: dict | None = None,
              official_nolse: bool = False, softcap: float = 0.0):
    import torch

    import kernels

    from kernels import AttnConfig
    from kernels.config import ConfigError
    from kernels.interface import attention_forward, resolve_config
    from kernels.validate import check_cluster

    hdim, dv = q.shape[-1], v.shape[-1]
    b, s, h = q.shape[0], q.shape[1], q.shape[2]
    out = torch.empty(b, s, h, dv, device=q.device, dtype=q.dtype)
    lse = torch.empty(b, h, s, device=q.device, dtype=torch.float32)

    def ours(**kw):
        cfg = resolve_config(AttnConfig(**kw), hdim, causal)
        return lambda: attention_forward(q, k, v, causal, scale, cfg, out=out, lse=lse, softcap=softcap)[0]

    fns = {"ours": ours()}
    for name, kw in extra.items():
        try:
            check_cluster(AttnConfig(**kw), causal)
            fns[name] = ours(**kw)
            fns[name]()  # compiles; a config the kernel refuses (e.g. pack_gqa's tile_m % group) is a ConfigError
        except ConfigError as e:
            fns.pop(name, None)
            print(f"{name}: skipped at causal={int(causal)}: {e}", flush=True)
    if base is not None and softcap:
        print("--softcap: no ours_base (the base tree's call is made without one)", flush=True)
    elif base is not None:
        iface, cmod = base
        bcfg = iface.resolve_config(cmod.AttnConfig(), hdim, causal)
        fns["ours_base"] = lambda: iface.attention_forward(q, k, v, causal, scale, bcfg, out=out, lse=lse)[0]
        for name, kw in (base_extra or {}).items():  # --base-cfg: AttnConfig fields of the base tree
            c = iface.resolve_config(cmod.AttnConfig(**kw), hdim, causal)
            fns[name] = lambda c=c: iface.attention_forward(q, k, v, causal, scale, c, out=out, lse=lse)[0]
    try:
        from flash_attn.cute import flash_attn_func

        # return_lse=True: official writes LSE as ours always does, and as the sweep's backend calls it
        # (experiments/backends/fa4_official.py). Without it official compiles a kernel without the LSE store, which
        # ran 0.960x at (192, 128) non-causal 16k on the H200 (session_ab/fwd192nc_harness.jsonl); this script called
        # it that way until 2026-12-03.
        cap = {"softcap": softcap} if softcap else {}
        fns["fa4_official"] = lambda: flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True,
                                                      **cap)[0]
        if official_nolse:
            def official_nolse():
                r = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, **cap)
                return r[0] if isinstance(r, tuple) else r
            fns["fa4_official_nolse"] = official_nolse
            fns["ours_alloc"] = lambda: kernels.attention(q, k, v, causal=causal, softmax_scale=scale, softcap=softcap)
    except ImportError:
        print("flash_attn.cute not importable: no fa4_official", flush=True)
    if cudnn and softcap:
        print("--softcap: no sdpa_cudnn (SDPA has no softcap)", flush=True)
    elif cudnn:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        gqa = {"enable_gqa": True} if k.shape[2] != h else {}

        def cudnn_fwd():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale,
                                                                         **gqa).transpose(1, 2)
        fns["sdpa_cudnn"] = cudnn_fwd
    return fns, out


def check(fns: dict, out) -> dict:
    """max |out - out_ours| / max |out_ours| per variant (outputs cloned: ours' variants share one buffer; the output
    buffer is NaN-poisoned before each variant, so an unwritten tile shows as NaN)."""
    import torch

    ref = fns["ours"]().clone()
    torch.cuda.synchronize()
    scale = float(ref.float().abs().max()) or 1.0
    res = {}
    for name, fn in fns.items():
        out.fill_(float("nan"))  # ours' variants write this buffer
        o = fn().clone()
        torch.cuda.synchronize()
        res[name] = float((o.float() - ref.float()).abs().max()) / scale if not torch.isnan(o).any() else float("nan")
    return res


def _add_gemm(fns: dict, diffs: dict, n: int) -> float:
    """Add the ``gemm`` variant (bf16 n x n @ n x n into a preallocated output, cuBLAS); returns its FLOPs."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    x, y = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    fns["gemm"] = lambda: torch.matmul(x, y, out=c)
    diffs["gemm"] = float("nan")  # not an attention output
    return 2.0 * n ** 3


def shape_scores(kind: str, q, k) -> None:
    """``--inputs``: q / k (bf16, (b, s, h, d)) reshaped in place so the scores follow ``kind`` (gaussian: as drawn)."""
    import torch

    if kind == "gaussian":
        return
    d = q.shape[-1]
    to_log2 = math.log2(math.e) / math.sqrt(d)  # one unit of q.k in log2 units of the softmax
    if kind == "sink":  # q 1 in coordinate 0 everywhere, key 0 alone 10 log2 units up there
        q[..., 0] = 1.0
        k[..., 0] = 0.0
        k[:, 0, :, 0] = 10.0 / to_log2
    elif kind == "late_max":  # row amplitude in [0.5, 1.5] times a ramp of 12 log2 units toward key 0, + 6 at key 0
        s_k = k.shape[1]
        g = torch.Generator(device=q.device).manual_seed(1)
        q[..., 0] = 0.5 + torch.rand(q.shape[:3], device=q.device, generator=g)
        ramp = 12.0 * (1.0 - torch.arange(s_k, device=k.device) / s_k)
        ramp[0] += 6.0
        k[..., 0] = (ramp / to_log2)[None, :, None].to(k.dtype)
    else:
        raise SystemExit(f"--inputs {kind!r}: gaussian, sink or late_max")


def _ratio_stats(ref: list, t: list):
    ratios = sorted(a / x for a, x in zip(ref, t))  # speed of the variant relative to ref, per round
    return statistics.median(ratios), ratios[len(ratios) // 5], ratios[(4 * len(ratios)) // 5]


def main():
    import torch

    from experiments.metadata import provenance

    prov = provenance()  # git_sha (or $FA4LAB_GIT_SHA on a copy without .git), git_dirty, kernels_hash: on every row
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--inputs", default="gaussian", choices=("gaussian", "sink", "late_max"),
                    help="score distribution (speculative_exp's votes: sink / late_max rescale)")
    ap.add_argument("--base-rev", default=DEFAULT_BASE_REV, help="'' to skip ours_base")
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cfg", nargs="*", default=[], help="NAME=field:value,... extra variants of this tree")
    ap.add_argument("--base-cfg", nargs="*", default=[],
                    help="NAME=field:value,... extra variants of --base-rev's tree")
    ap.add_argument("--only", nargs="*", help="variant names to keep (ours is always kept)")
    ap.add_argument("--cudnn", action="store_true")
    ap.add_argument("--official-nolse", action="store_true",
                    help="also official FA4 without return_lse (no LSE store) and ours through kernels.attention")
    ap.add_argument("--hold-us", type=float, default=500.0,
                    help="GPU spin before each timed call, so only device time is timed (the sweeps' bench.hold_us)")
    ap.add_argument("--batch", type=int, default=None, help="batch (default 16384 // seqlen)")
    ap.add_argument("--heads", type=int, default=None, help="Q heads (default 2048 // hdim)")
    ap.add_argument("--kv-heads", type=int, default=None, help="K/V heads, dividing --heads (GQA / MQA; default: heads)")
    ap.add_argument("--seqlen-k", type=int, default=None, help="K/V length (default: the query length)")
    ap.add_argument("--gemm", type=int, default=0, metavar="N",
                    help="also time a bf16 N x N x N matmul in the same rounds (e.g. 8192); rows gain of_gemm")
    ap.add_argument("--softcap", type=float, default=0.0,
                    help="tanh softcap of the scores for ours and official (cuDNN and ours_base left out); rows gain "
                         "softcap")
    a = ap.parse_args()
    base = load_base(a.base_rev) if a.base_rev else None
    extra = dict(_parse_cfg(s) for s in a.cfg)
    base_extra = dict(_parse_cfg(s) for s in a.base_cfg)
    rows = []
    for s in a.seqlens:
        for hdim in a.hdims:
            for causal in map(bool, a.causal):
                dv = 128 if hdim == 192 else hdim
                heads = a.heads or 2048 // hdim
                batch = a.batch or max(1, 16384 // s)
                kv_heads = a.kv_heads or heads
                s_k = a.seqlen_k or s
                if heads % kv_heads:
                    raise SystemExit(f"--kv-heads {kv_heads} must divide the Q heads {heads}")
                g = torch.Generator(device="cuda").manual_seed(0)
                q = torch.randn(batch, s, heads, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                k = torch.randn(batch, s_k, kv_heads, hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                v = torch.randn(batch, s_k, kv_heads, dv, device="cuda", dtype=torch.bfloat16, generator=g)
                shape_scores(a.inputs, q, k)
                scale = 1.0 / math.sqrt(hdim)
                fns, out = _variants(q, k, v, causal, scale, base, extra, a.cudnn, base_extra, a.official_nolse,
                                     a.softcap)
                if a.only:
                    fns = {n: f for n, f in fns.items() if n in a.only or n == "ours"}
                diffs = check(fns, out)
                gemm_flops = _add_gemm(fns, diffs, a.gemm) if a.gemm else 0
                times, gpu = sampled_round_robin(fns, a.repeats, hold_us=a.hold_us)
                print(f"hd{hdim} s{s} causal={int(causal)} GPU during the rounds:{gpu_note(gpu) or ' not sampled'}")
                flops = attention_flops(batch, heads, s, s_k, hdim, dv, causal)
                off = times.get("fa4_official")
                for name, t in times.items():
                    med = statistics.median(t)
                    so = _ratio_stats(times["ours"], t)
                    sf = _ratio_stats(off, t) if off else (float("nan"),) * 3
                    fl = gemm_flops if name == "gemm" else flops
                    # throughput over the GEMM's, per round: (fl / t) / (gemm_flops / t_gemm)
                    og = tuple(x * fl / gemm_flops for x in _ratio_stats(times["gemm"], t)) if gemm_flops else None
                    row = dict(backend=name, hdim=hdim, hdim_v=dv, seqlen=s, seqlen_k=s_k, batch=batch, heads=heads,
                               kv_heads=kv_heads, causal=causal, inputs=a.inputs,
                               ms_median=med, tflops=fl / med / 1e9, speed_vs_ours=so[0], p20=so[1], p80=so[2],
                               speed_vs_official=sf[0], off_p20=sf[1], off_p80=sf[2], n=len(t),
                               rel_diff_vs_ours=diffs[name], gpu=torch.cuda.get_device_name(), hold_us=a.hold_us,
                               **(dict(of_gemm=og[0], gemm_p20=og[1], gemm_p80=og[2], gemm_n=a.gemm) if og else {}),
                               **(dict(softcap=a.softcap) if a.softcap else {}),
                               **gpu, **prov)
                    if name == "ours" or name in extra:  # this tree's configs: the roofline's bound beside the time
                        row.update(model_bound(gpu_key(row["gpu"]), hdim, dv, causal, extra.get(name, {}),
                                               dict(batch=batch, seqlen_q=s, seqlen_k=s_k, heads=heads)))
                    rows.append(row)
                    bad = "  BAD" if name != "gemm" and not diffs[name] <= 0.02 else ""
                    shape = f"s{s}" + (f" sk{s_k}" if s_k != s else "") + (f" b{batch} h{heads}/{kv_heads}"
                                                                         if kv_heads != heads else "")
                    print(f"hd{hdim} {shape} causal={int(causal)} {name:16s} {med:7.3f} ms {row['tflops']:6.1f} TFLOP/s"
                          f"  speed/ours {so[0]:.3f} [{so[1]:.3f}, {so[2]:.3f}]"
                          f"  speed/official {sf[0]:.3f} [{sf[1]:.3f}, {sf[2]:.3f}]  diff {diffs[name]:.2e}{bad}"
                          + (f"  of gemm {og[0]:.3f} [{og[1]:.3f}, {og[2]:.3f}]" if og else "")
                          + (f"  model {row['model_tflops']:.0f} ({row['model_bound']})" if "model_tflops" in row
                             else ""), flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
