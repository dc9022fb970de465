"""The ``e2e_llama`` experiment: a training step of a random-initialised Llama-style model with each attention backend.

One job per head dim (kind "e2e_llama"). The model (experiments/llama_model.py: RMSNorm, RoPE, GQA, SwiGLU) is built
once from a seed and every backend runs on the same weights and tokens (only the attention function is swapped):
``sdpa`` (torch SDPA, default kernel choice, K/V repeated; the baseline), ``fa4lab`` (kernels.attention, grouped K/V natively
through kernels.integrations.gqa), ``fa4_official`` (flash_attn.cute, grouped K/V natively), and on a CPU
``fa4_model`` (the FA4 algorithm in PyTorch). A backend that cannot run here is a skip row with the reason.

Per backend, in this order: the first and second training step (wall seconds, compile included: ``first_call_s``,
``second_call_s``); the check; the peak memory of one step; then all backends timed round-robin in one process
(experiments/timing: one step of each per round, balanced orders, GPU sampled). A step is zero_grad, forward, fp32 cross
entropy on random next tokens, backward.

The check (DESIGN.md rule, on relative Frobenius errors): the same weights upcast to ``truth_dtype`` (fp32) with SDPA
give the truth; each backend's logits and every parameter's gradient are compared with it, and pass when
``err <= factor * err_sdpa + atol`` (err_sdpa: the baseline's error at the model dtype; gradients parameter by
parameter). Rows also give each backend's difference from the baseline run itself (``vs_baseline``).

Rows (mode ``train``, shape fields of the attention: batch, seqlen, heads, hdim, causal, dtype; model fields: layers,
hidden, kv_heads, ffn, vocab, n_params, tokens): ``first_call_s``, ``second_call_s``, ``err_logits`` (also loss,
err_loss), ``err_grads`` (value = the largest parameter error; worst_param, rule_ratio_max), ``peak_mem_gib`` (CUDA
only: max allocated during one step; base_mem_gib before it), ``time_ms`` (median step; per-round times_ms,
tokens_per_s, model TFLOP/s from LlamaSpec.train_step_flops, GPU sampler summary) and, except for the baseline,
``time_ratio`` (per round t_backend / t_baseline, > 1: the baseline is faster).

Presets: ``h200`` (8 layers, hidden 2048, GQA 4:1, head dims 64 and 128, seqlen 4k, 16k tokens, bf16) on a CUDA
machine; ``cpu`` (2 layers, hidden 256, 256 tokens) otherwise, which runs sdpa and fa4_model for real.
"""
from __future__ import annotations

import copy
import gc

import torch

from .attn_job import classify_error, error_message
from .bench import time_first_call
from .llama_model import LlamaModel, LlamaSpec, attention_fn, available, loss_fn
from .metadata import gpu_state_fields
from .timing.roundrobin import round_robin
from .timing.sampler import GpuSampler

EXPERIMENT = "e2e_llama"
KIND = "e2e_llama"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
PRESETS = {
    "h200": dict(layers=8, hidden=2048, head_dims=[64, 128], gqa=4, ffn=5632, vocab=32000, seqlen=4096, tokens=16384,
                 dtype="bfloat16", backends=["sdpa", "fa4lab", "fa4_official"], warmup=3, rounds=10, settle_s=2.0),
    "cpu": dict(layers=2, hidden=256, head_dims=[64], gqa=4, ffn=512, vocab=512, seqlen=128, tokens=256,
                dtype="bfloat16", backends=["sdpa", "fa4_model", "fa4lab", "fa4_official"], warmup=1, rounds=3,
                settle_s=0.0),
}
COMMON = dict(baseline="sdpa", check=True, truth_dtype="float32", factor=2.0, atol=2.0 ** -8, seed=0,
              attn_config=None, rope_theta=10000.0, flush_l2=False, device=None)
PARAM_KEYS = {"preset", *PRESETS["h200"], *COMMON}
GIB = float(1 << 30)


# ---- expansion ------------------------------------------------------------------------------------------------------
def resolve_params(params: dict | None = None, cuda: bool | None = None) -> dict:
    """The preset (``preset``: auto = h200 with CUDA, cpu without) with ``params`` on top; unknown keys are errors."""
    params = dict(params or {})
    unknown = sorted(set(params) - PARAM_KEYS)
    if unknown:
        raise ValueError(f"params: unknown key(s) {unknown}; known: {sorted(PARAM_KEYS)}")
    preset = params.pop("preset", "auto") or "auto"
    if preset == "auto":
        if cuda is None:
            from .isolation import cuda_available

            cuda = cuda_available()
        preset = "h200" if cuda else "cpu"
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r}: supported presets are auto, {', '.join(PRESETS)}")
    return {"preset": preset, **PRESETS[preset], **COMMON, **params}


def spec_for(p: dict, head_dim: int) -> LlamaSpec:
    hd = int(head_dim)
    if p["hidden"] % hd:
        raise ValueError(f"head_dims: {hd} does not divide hidden={p['hidden']}")
    heads = p["hidden"] // hd
    if heads % int(p["gqa"]):
        raise ValueError(f"gqa={p['gqa']}: must divide the {heads} query heads of head_dim {hd}")
    return LlamaSpec(layers=int(p["layers"]), hidden=int(p["hidden"]), heads=heads, kv_heads=heads // int(p["gqa"]),
                     head_dim=hd, ffn=int(p["ffn"]), vocab=int(p["vocab"]), rope_theta=float(p["rope_theta"]))


def expand(params: dict | None = None) -> list[dict]:
    """One job per head dim; checks every parameter (one-line ValueError)."""
    p = resolve_params(params)
    if p["dtype"] not in DTYPES or p["truth_dtype"] not in DTYPES:
        raise ValueError(f"dtype={p['dtype']!r}, truth_dtype={p['truth_dtype']!r}: supported: {', '.join(DTYPES)}")
    if int(p["tokens"]) % int(p["seqlen"]) or int(p["tokens"]) < int(p["seqlen"]):
        raise ValueError(f"tokens={p['tokens']}: must be a multiple of seqlen={p['seqlen']} (batch = tokens / seqlen)")
    from .llama_model import ATTENTION

    bad = [b for b in p["backends"] if b not in ATTENTION]
    if bad or not p["backends"]:
        raise ValueError(f"backends={list(p['backends'])}: known e2e attention backends: {', '.join(ATTENTION)}")
    if p["baseline"] not in p["backends"]:
        raise ValueError(f"baseline={p['baseline']!r}: must be one of backends {list(p['backends'])}")
    if int(p["rounds"]) < 1 or int(p["warmup"]) < 0:
        raise ValueError(f"rounds={p['rounds']}, warmup={p['warmup']}: need rounds >= 1 and warmup >= 0")
    jobs = []
    for hd in p["head_dims"]:
        spec = spec_for(p, hd)
        jobs.append(dict(kind=KIND, experiment=EXPERIMENT, preset=p["preset"], model=spec.to_dict(),
                         batch=int(p["tokens"]) // int(p["seqlen"]), seqlen=int(p["seqlen"]), dtype=p["dtype"],
                         backends=list(p["backends"]), baseline=p["baseline"], check=bool(p["check"]),
                         truth_dtype=p["truth_dtype"], factor=float(p["factor"]), atol=float(p["atol"]),
                         seed=int(p["seed"]), attn_config=p["attn_config"], device=p["device"],
                         bench=dict(warmup=int(p["warmup"]), rounds=int(p["rounds"]), settle_s=float(p["settle_s"]),
                                    flush_l2=bool(p["flush_l2"]))))
    return jobs


# ---- helpers --------------------------------------------------------------------------------------------------------
def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref|| (Frobenius, fp32); 0 when both are 0."""
    a, ref = a.float(), ref.float()
    den = float(torch.linalg.vector_norm(ref))
    num = float(torch.linalg.vector_norm(a - ref))
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def build(job: dict, device: str):
    """(model, tokens, targets) of the job: weights from ``seed`` at the job's dtype, random tokens."""
    spec = LlamaSpec(**job["model"])
    torch.manual_seed(int(job["seed"]))
    with torch.device(device):
        model = LlamaModel(spec)
    model = model.to(DTYPES[job["dtype"]])
    g = torch.Generator(device="cpu").manual_seed(int(job["seed"]) + 1)
    ids = torch.randint(0, spec.vocab, (int(job["batch"]), int(job["seqlen"]) + 1), generator=g).to(device)
    return model, ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def make_step(model, attn, tokens, targets):
    """One training step with ``attn``: zero_grad, forward, loss, backward; returns (logits, loss), detached."""

    def step():
        model.set_attention(attn)
        model.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = loss_fn(logits, targets)
        loss.backward()
        return logits.detach(), loss.detach()

    return step


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class _Rows:
    def __init__(self, job: dict, device: str):
        spec = LlamaSpec(**job["model"])
        self.base = dict(experiment=job.get("experiment") or EXPERIMENT, kind=KIND, variant="default", mode="train",
                         batch=job["batch"], seqlen_q=job["seqlen"], seqlen_k=job["seqlen"], heads=spec.heads,
                         hdim=spec.head_dim, hdim_v=spec.head_dim, causal=True, dtype=job["dtype"],
                         layers=spec.layers, hidden=spec.hidden, kv_heads=spec.kv_heads, ffn=spec.ffn,
                         vocab=spec.vocab, n_params=spec.n_params(), tokens=job["batch"] * job["seqlen"],
                         preset=job.get("preset"), device=device, baseline=job["baseline"])
        self.rows: list[dict] = []
        self.config = job.get("attn_config")

    def add(self, backend, metric, value, status="ok", reason=None, error_class=None, **extra):
        cfg = self.config if backend in ("fa4lab", "fa4_model") else None
        self.rows.append({**self.base, "backend": backend, "metric": metric, "value": value, "status": status,
                          "reason": reason, "error_class": error_class, "config": cfg, **extra})

    def fail(self, backend, metric, exc) -> str:
        cls = classify_error(exc)
        self.add(backend, metric, None, status="fail", reason=error_message(exc), error_class=cls)
        return cls


# ---- the job --------------------------------------------------------------------------------------------------------
def run(job: dict) -> list[dict]:
    """Run one e2e_llama job; a backend's failure is a row (a CUDA fault ends the job with the rows so far)."""
    if job.get("kind") != KIND:
        raise ValueError(f"kind={job.get('kind')!r}: e2e_llama runs jobs of kind {KIND!r}")
    device = job.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = _Rows(job, device)
    cfg = None
    if job.get("attn_config"):
        from kernels import AttnConfig

        cfg = AttnConfig.from_dict(job["attn_config"])
    baseline = job["baseline"]
    names = [baseline] + [b for b in job["backends"] if b != baseline]  # the baseline first: the check needs it
    live = {}
    for name in names:
        ok, why = available(name, device)
        if ok:
            try:
                live[name] = attention_fn(name, cfg if name in ("fa4lab", "fa4_model") else None)
            except ImportError as e:
                ok, why = False, f"{name}: {error_message(e)}"
        if not ok:
            rows.add(name, None, None, status="skip", reason=why)
    if not live:
        return rows.rows
    model, tokens, targets = build(job, device)
    steps = {n: make_step(model, a, tokens, targets) for n, a in live.items()}
    # 1. first / second step (compile included)
    for name in list(steps):
        before = gpu_state_fields("before")
        try:
            first = time_first_call(steps[name], device)
            second = time_first_call(steps[name], device)
        except Exception as e:  # noqa: BLE001 -- recorded as a row
            del steps[name]
            if rows.fail(name, "first_call_s", e) == "cuda_fault":
                return rows.rows
            continue
        state = {**before, **gpu_state_fields("after")}
        rows.add(name, "first_call_s", first, **state)
        rows.add(name, "second_call_s", second, **state)
    model.zero_grad(set_to_none=True)
    # 2. check against the truth (same weights at truth_dtype, SDPA)
    if job.get("check") and steps:
        if _check(job, model, tokens, targets, steps, rows, device) == "cuda_fault":
            return rows.rows
    # 3. peak memory of one step
    for name in list(steps):
        if torch.device(device).type != "cuda":
            rows.add(name, "peak_mem_gib", None, status="skip", reason="peak memory needs CUDA allocator statistics")
            continue
        try:
            model.zero_grad(set_to_none=True)
            _free(device)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            steps[name]()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        except Exception as e:  # noqa: BLE001
            del steps[name]
            if rows.fail(name, "peak_mem_gib", e) == "cuda_fault":
                return rows.rows
            continue
        rows.add(name, "peak_mem_gib", peak / GIB, base_mem_gib=base / GIB, step_mem_gib=(peak - base) / GIB)
    model.zero_grad(set_to_none=True)
    _free(device)
    # 4. round-robin timing
    if steps:
        _time(job, steps, rows, device, baseline)
    return rows.rows


def _check(job, model, tokens, targets, steps, rows, device) -> str | None:
    """err_logits / err_grads rows of every backend in ``steps`` (the baseline first); returns a failure's class."""
    from .llama_model import sdpa

    truth_model = copy.deepcopy(model).to(DTYPES[job["truth_dtype"]])
    try:
        t_logits, t_loss = make_step(truth_model, sdpa, tokens, targets)()
        t_grads = grads(truth_model)
    except Exception as e:  # noqa: BLE001 -- without a truth no backend is checked
        cls = classify_error(e)
        for name in steps:
            rows.add(name, "err_logits", None, status="fail", error_class=cls,
                     reason=f"truth run ({job['truth_dtype']} SDPA) failed: {error_message(e)}")
        return cls
    finally:
        del truth_model
        _free(device)
    base_name = job["baseline"]
    base = None  # (logits, loss, grads, err_logits, per-param errs) of the baseline
    factor, atol = float(job["factor"]), float(job["atol"])
    for name in list(steps):
        try:
            logits, loss = steps[name]()
            g = grads(model)
        except Exception as e:  # noqa: BLE001
            del steps[name]
            if rows.fail(name, "err_logits", e) == "cuda_fault":
                return "cuda_fault"
            continue
        e_logits = rel_err(logits, t_logits)
        e_loss = abs(float(loss) - float(t_loss)) / max(abs(float(t_loss)), 1e-30)
        e_params = {n: rel_err(g[n], t_grads[n]) for n in t_grads}
        if name == base_name:
            base = (logits, g, e_logits, e_params)
        if base is None:
            why = f"baseline {base_name} did not run: no bound"
            rows.add(name, "err_logits", e_logits, status="skip", reason=why, loss=float(loss), err_loss=e_loss)
            rows.add(name, "err_grads", max(e_params.values()), status="skip", reason=why)
            continue
        bound = factor * base[2] + atol
        ok = e_logits <= bound
        rows.add(name, "err_logits", e_logits, status="ok" if ok else "fail",
                 reason=None if ok else f"logits: rel err {e_logits:.3g} > {factor:g} x {base_name}'s {base[2]:.3g} + {atol:.3g}",
                 error_class=None if ok else "wrong_result", bound=bound, baseline_err=base[2],
                 vs_baseline=rel_err(logits, base[0]), loss=float(loss), truth_loss=float(t_loss), err_loss=e_loss,
                 truth_dtype=job["truth_dtype"])
        ratios = {n: e_params[n] / (factor * base[3][n] + atol) for n in e_params}
        worst = max(ratios, key=ratios.get)
        worst_err = max(e_params, key=e_params.get)
        ok = ratios[worst] <= 1.0
        rows.add(name, "err_grads", e_params[worst_err], status="ok" if ok else "fail",
                 reason=None if ok else (f"gradient of {worst}: rel err {e_params[worst]:.3g} > {factor:g} x "
                                         f"{base_name}'s {base[3][worst]:.3g} + {atol:.3g}"),
                 error_class=None if ok else "wrong_result", worst_param=worst_err, rule_ratio_max=ratios[worst],
                 rule_worst_param=worst, baseline_err=max(base[3].values()), n_params_checked=len(e_params),
                 vs_baseline=max(rel_err(g[n], base[1][n]) for n in g), truth_dtype=job["truth_dtype"])
        del logits, g
    del t_logits, t_grads, base
    model.zero_grad(set_to_none=True)
    _free(device)
    return None


def _time(job, steps, rows, device, baseline) -> None:
    b = job["bench"]
    spec = LlamaSpec(**job["model"])
    flops = spec.train_step_flops(int(job["batch"]), int(job["seqlen"]))
    tokens = int(job["batch"]) * int(job["seqlen"])
    before = gpu_state_fields("before")
    try:
        with GpuSampler() as sampler:
            rr = round_robin(steps, device=device, warmup=int(b["warmup"]), rounds=int(b["rounds"]),
                             min_rounds=int(b["rounds"]), flush_l2=bool(b.get("flush_l2", False)),
                             settle_s=float(b["settle_s"]) if torch.device(device).type == "cuda" else 0.0,
                             sampler=sampler)
    except Exception as e:  # noqa: BLE001 -- which backend raised is unknown: each timed one gets the fail row
        for name in steps:
            rows.fail(name, "time_ms", e)
        return
    state = {**before, **gpu_state_fields("after")}
    gpu = sampler.summary()
    common = dict(timer=rr.timer, rr_entries=rr.names, rr_baseline=baseline, round_throttled=rr.round_throttled,
                  **rr.settle, **gpu, **state)
    for name in rr.names:
        st = rr.stats(name)
        ms = st["median"]
        rows.add(name, "time_ms", ms, p20=st["p20"], p80=st["p80"], iqr=st["iqr"], min=st["min"], max=st["max"],
                 n=st["n"], times_ms=rr.times_ms[name], tokens_per_s=tokens / (ms * 1e-3) if ms > 0 else None,
                 flops=flops, tflops=flops / (ms * 1e-3) / 1e12 if ms > 0 else None, **common)
    if baseline in rr.names:
        for name in rr.names:
            if name != baseline:
                r = rr.ratio(name, baseline)
                rows.add(name, "time_ratio", r.pop("value"), **r, timer=rr.timer, rr_entries=rr.names,
                         throttled_share=gpu.get("throttled_share"), gpu_sampler=gpu.get("gpu_sampler"))
