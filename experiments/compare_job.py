"""Runner for jobs of kind "compare": every backend and variant of one shape checked, then timed round-robin in
one process on the same inputs (experiments/timing/roundrobin.py), ratios to a baseline taken per round.

A job (``group_jobs`` makes them from the sweep's per-backend jobs, one per shape)::

    {"kind": "compare", "experiment": str, "shape": Shape dict, "modes": [...], "check": bool,
     "bench": {"warmup", "repeats", "flush_l2", "max_time_s", "hold_us", optional "settle_s", "min_rounds",
               "stream_calls"},
     "entries": [{"backend", "variant", "config"}, ...], "baseline": {"backend", "variant"},
     optional "device", "softmax_scale", "seed", "gemm_ref"}

Per mode the inputs are made once. Each entry's first call (compile included) and second call are timed
(``first_call_s`` / ``second_call_s`` rows), then the entry is checked (``err_*`` rows, as attn jobs); an entry that
is unavailable, unsupported or lacks the mode is a skip row, one that raises a fail row (a CUDA fault ends the job).
The rest are timed together: ``repeats`` rounds (at least ``min_rounds``, default 10, when ``max_time_s`` cuts the
run short), after ``warmup`` passes and a settle step of up to ``settle_s`` seconds (default 2 with CUDA, 0 without)
while the GPU sampler runs. Rows: per entry a ``time_ms`` row (value = median over rounds; ``times_ms`` = the
per-round times, p20/p80/iqr/min/max/n, flops, tflops, peak, the sampler summary with ``throttled_share``, the
settle fields, ``round_throttled``, ``rr_entries`` = who was timed together), and per entry other than the baseline a
``time_ratio`` row: per round r = t_entry / t_baseline (> 1: the baseline is faster), value = median r, p20/p80,
min/max, n, ``samples``, ``value_unthrottled`` / ``n_unthrottled`` (rounds with no throttled sample), ``baseline``.
``gemm_ref: true``: a square matmul of about the attention's FLOPs is timed in the same rounds as one more entry
(backend ``matmul_ref``; its ratio row normalised to equal FLOPs: experiments/gemm_ref.py).
``bench.stream_calls`` N > 0 (conf/bench/stream.yaml) times each entry's turn in a round as N calls back to back
(experiments.bench.StreamTimer: no flush between them) and writes ``stream_time_ms`` / ``stream_time_ratio`` rows
(with ``stream_calls``) instead, which the analysis of the per-call rows never reads.
"""
from __future__ import annotations

import json

import torch

from .attn_job import (MODES, _Rows, _peak, _timed_fn, _timed_inputs, classify_error, error_message)
from .backends import get_backend
from .bench import StreamTimer, attn_flops, time_first_call, tflops
from . import gemm_ref
from .check import check_backend, check_fits, fit_check_shape, slice_shape
from .metadata import gpu_state_fields
from .shapes import Shape
from .timing.roundrobin import round_robin
from .timing.sampler import GpuSampler

DEFAULT_BENCH = dict(warmup=5, repeats=30, flush_l2=True, max_time_s=None, settle_s=None, min_rounds=10, hold_us=0.0,
                     stream_calls=0)
ENTRY_KEYS = ("backend", "variant", "config")


def label(entry: dict) -> str:
    """'fa4', 'fa4[tau0]', 'sdpa_cudnn': the backend, and the variant where it names one."""
    v = entry.get("variant")
    return entry["backend"] if v in (None, "default", "peer") else f"{entry['backend']}[{v}]"


def group_jobs(jobs: list[dict], baseline_variant: str | None = None) -> list[dict]:
    """One compare job per shape from per-backend jobs (the sweep's product expansion), entries in their order.
    The baseline is the first job's backend with ``baseline_variant`` (default: the first job's variant)."""
    out: dict[str, dict] = {}
    for j in jobs:
        key = json.dumps(j["shape"], sort_keys=True)
        if key not in out:
            common = {k: v for k, v in j.items() if k not in (*ENTRY_KEYS, "ab")}
            out[key] = {**common, "kind": "compare", "entries": [],
                        "baseline": {"backend": j["backend"], "variant": baseline_variant or j.get("variant")}}
        out[key]["entries"].append({k: j.get(k) for k in ENTRY_KEYS})
    return list(out.values())


def _parse(job: dict):
    if job.get("kind") != "compare":
        raise ValueError(f"kind={job.get('kind')!r}: compare_job runs jobs of kind 'compare'")
    entries = list(job.get("entries") or [])
    if not entries or any(not isinstance(e, dict) or "backend" not in e for e in entries):
        raise ValueError("entries: a 'compare' job needs a list of {backend, variant, config}")
    labels = [label(e) for e in entries]
    if len(set(labels)) != len(labels):
        raise ValueError(f"entries: labels {labels} are not unique")
    base = label(job.get("baseline") or entries[0])
    if base not in labels:
        raise ValueError(f"baseline={base!r}: not one of the entries {labels}")
    modes = list(job.get("modes") or ["fwd"])
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"modes={modes}: unknown mode(s) {bad}; supported: {list(MODES)}")
    bench = dict(job.get("bench") or {})
    unknown = sorted(set(bench) - set(DEFAULT_BENCH))
    if unknown:
        raise ValueError(f"bench: unknown key(s) {unknown}; known: {sorted(DEFAULT_BENCH)}")
    return Shape.from_dict(job["shape"]), entries, labels, base, modes, {**DEFAULT_BENCH, **bench}


class _Entry:
    def __init__(self, job, entry, shape, device):
        from kernels import AttnConfig

        self.label, self.variant = label(entry), entry.get("variant")
        self.cfg = AttnConfig.from_dict(entry["config"]) if entry.get("config") is not None else None
        self.backend = get_backend(entry["backend"])
        self.rows = _Rows(job, shape, self.cfg, device, self.backend.config_arch, backend=entry["backend"],
                          variant=self.variant)

    def usable(self, shape, device, modes) -> bool:
        """Adds the skip row and returns False when the backend cannot run here or on this shape."""
        ok, why = self.backend.available()
        if ok and torch.device(device).type == "cpu" and not self.backend.cpu_capable:
            ok, why = False, f"{self.backend.name}: does not run on CPU"
        if ok:
            ok, why = self.backend.supports(shape, self.cfg)
        if not ok:
            self.rows.add("+".join(modes), None, None, status="skip", reason=why)
        return ok


class _GemmEntry:
    """The ``gemm_ref`` entry: a matmul sized per mode to the attention's FLOPs (experiments/gemm_ref.py)."""
    variant = None

    def __init__(self, job, shape, device):
        self.label = gemm_ref.LABEL
        self.rows = _Rows(job, shape, None, device, None, backend=gemm_ref.LABEL)
        self.n: dict[str, int] = {}

    def add_fn(self, mode, shape, device, fns, seed) -> str | None:
        """Put the matmul of ``mode``'s size into ``fns`` (a fail row instead if it cannot be made)."""
        before = gpu_state_fields("before")
        try:
            n = gemm_ref.gemm_size(attn_flops(shape, mode))
            fns[self.label] = gemm_ref.gemm_fn(n, shape.torch_dtype, device, seed or 0)
        except Exception as x:  # noqa: BLE001 -- recorded as a row
            fns.pop(self.label, None)
            return self.rows.fail(mode, x, state=before)
        self.n[mode] = n
        return None

    def flops(self, mode) -> float:
        return gemm_ref.gemm_flops(self.n[mode])


def run(job: dict) -> list[dict]:
    """Run one "compare" job; a backend's failure is a row (a bad job description raises)."""
    shape, specs, labels, base, modes, bench = _parse(job)
    device = job.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
    entries = [_Entry(job, e, shape, device) for e in specs]
    live = [e for e in entries if e.usable(shape, device, modes)]
    gemm = _GemmEntry(job, shape, device) if job.get("gemm_ref") else None
    if gemm is not None:
        entries.append(gemm)
    scale, seed = job.get("softmax_scale"), job.get("seed")
    check_shape = fit_check_shape(shape, device) if job.get("check") else None
    settle_s = bench["settle_s"] if bench["settle_s"] is not None else (2.0 if device.startswith("cuda") else 0.0)
    rows = lambda: [r for e in entries for r in e.rows.rows]  # noqa: E731
    for mode in modes:
        inputs = _timed_inputs(shape, mode, device, seed)  # made once: every entry runs on these
        fns = {}
        for e in live:
            before = gpu_state_fields("before")
            try:
                fn = _timed_fn(e.backend, shape, e.cfg, mode, scale, inputs)
                first = time_first_call(fn, device)
                second = time_first_call(fn, device)
            except NotImplementedError as x:
                e.rows.add(mode, None, None, status="skip", reason=error_message(x), state=before)
                continue
            except Exception as x:  # noqa: BLE001 -- recorded as a row
                if e.rows.fail(mode, x, state=before) == "cuda_fault":
                    return rows()
                continue
            state = {**before, **gpu_state_fields("after")}
            e.rows.add(mode, "first_call_s", first, state=state)
            e.rows.add(mode, "second_call_s", second, state=state)
            fns[e.label] = fn
            if job.get("check") and _check(e, mode, shape, check_shape, device, seed, scale) == "cuda_fault":
                return rows()
        if gemm is not None and fns and gemm.add_fn(mode, shape, device, fns, seed) == "cuda_fault":
            return rows()
        if fns and bench is not None and _time(job, entries, fns, base, mode, shape, device, bench, settle_s) == "cuda_fault":
            return rows()
    return rows()


def _check(e: _Entry, mode, shape, check_shape, device, seed, scale) -> str | None:
    if check_shape is None:
        why = check_fits(slice_shape(shape), device)[1]
        e.rows.add(mode, "check", None, status="skip", reason=f"check skipped: one (batch, head) slice: {why}")
        return None
    before = gpu_state_fields("before")
    try:
        res = check_backend(e.backend, check_shape, e.cfg, device=device, seed=seed, modes=(mode,), scale=scale)
    except NotImplementedError as x:
        e.rows.add(mode, None, None, status="skip", reason=error_message(x), state=before)
        return None
    except Exception as x:  # noqa: BLE001
        return e.rows.fail(mode, x, state=before)
    state = {**before, **gpu_state_fields("after")}
    for r in res.rows():
        e.rows.add(r.pop("mode"), r.pop("metric"), r.pop("value"), r.pop("status"), r.pop("reason"),
                   r.pop("error_class"), state=state, check_seed=res.seed, check_batch=check_shape.batch,
                   check_heads=check_shape.heads, **r)
    return None


def _time(job, entries, fns, base, mode, shape, device, bench, settle_s) -> str | None:
    """Time ``fns`` round-robin; add the time_ms and time_ratio rows (or fail rows). Returns a failure's class."""
    timed = [e for e in entries if e.label in fns]
    before = gpu_state_fields("before")
    stream = int(bench["stream_calls"])
    # back-to-back timing (bench.stream_calls > 0) writes metrics of their own, so the analysis of the harness's
    # per-call timer (time_ms / time_ratio) never pools the two regimes
    t_metric, r_metric = ("stream_time_ms", "stream_time_ratio") if stream else ("time_ms", "time_ratio")
    try:
        with GpuSampler() as sampler:
            rr = round_robin(fns, device=device, warmup=int(bench["warmup"]), rounds=int(bench["repeats"]),
                             min_rounds=int(bench["min_rounds"]), flush_l2=bool(bench["flush_l2"]),
                             max_time_s=bench["max_time_s"], settle_s=float(settle_s), sampler=sampler,
                             hold_us=float(bench["hold_us"]),
                             timer=StreamTimer(device, stream, float(bench["hold_us"])) if stream else None)
    except Exception as x:  # noqa: BLE001 -- which entry raised is unknown: every timed entry gets the fail row
        cls = classify_error(x)
        for e in timed:
            e.rows.fail(mode, x, state=before, metric=t_metric, rr_entries=list(fns))
        return cls
    state = {**before, **gpu_state_fields("after")}
    gpu = sampler.summary()
    flops, peak = attn_flops(shape, mode), _peak(shape)
    common = dict(timer=rr.timer, flush_l2=rr.flush_l2, hold_us=float(bench["hold_us"]), rr_entries=rr.names, rr_baseline=base,
                  **(dict(stream_calls=stream) if stream else {}),
                  round_throttled=rr.round_throttled, **rr.settle, **gpu)
    for e in timed:
        st = rr.stats(e.label)
        f = e.flops(mode) if isinstance(e, _GemmEntry) else flops
        tf = tflops(f, st["median"])
        extra = dict(gemm_n=e.n[mode], gemm_dtype=shape.dtype) if isinstance(e, _GemmEntry) else {}
        e.rows.add(mode, t_metric, st["median"], state=state, p20=st["p20"], p80=st["p80"], iqr=st["iqr"],
                   min=st["min"], max=st["max"], n=st["n"], times_ms=rr.times_ms[e.label], flops=f, tflops=tf,
                   peak_tflops=peak, frac_of_peak=(tf / peak) if peak else None, **extra, **common)
    if base not in fns:
        return None
    b = next(e for e in timed if e.label == base)
    ident = dict(baseline=base, baseline_backend=b.backend.name, baseline_variant=b.variant,
                 baseline_config_hash=b.rows.base["config_hash"],
                 baseline_compiled_hash=b.rows.compiled(mode).get("compiled_hash"))
    for e in timed:
        if e.label != base:
            r = rr.ratio(e.label, base)
            if isinstance(e, _GemmEntry):  # normalised to the attention's FLOPs: median r = ours / matmul TFLOP/s
                r = dict(gemm_ref.scaled_ratio(r, flops / e.flops(mode)), flops_normalised=True, gemm_n=e.n[mode])
            e.rows.add(mode, r_metric, r.pop("value"), state=state, **r, **ident, timer=rr.timer,
                       rr_entries=rr.names, throttled_share=gpu.get("throttled_share"), gpu_sampler=gpu["gpu_sampler"])
    return None
