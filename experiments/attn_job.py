"""Runner for jobs of kind "attn": check and time one backend on one shape (and config), return rows.

A job::

    {"kind": "attn", "experiment": str, "backend": str, "config": dict | None, "shape": Shape dict,
     "modes": ["fwd", "bwd"], "check": bool, "bench": {"warmup", "repeats", "flush_l2", "max_time_s"} | None,
     optional "device", "softmax_scale", "seed", "ab": {"variant": str, "config": dict | None}}

Per mode the timing runs first (so ``first_call_s``, compile + first call in wall seconds, is this job's
first call of the backend), then the check. Rows (docs/INTERFACES.md), per mode: a ``first_call_s`` row; a
``time_ms`` row (value = median; p20/p80/iqr/min/max/n, flops, tflops, peak_tflops, frac_of_peak, timer);
with ``check``, the ``err_<tensor>`` rows of experiments.check, run on the job's shape with batch (then
heads) halved until the reference's full score matrices fit in memory (check_batch / check_heads say what
was checked; a ``check`` skip row when not even one slice fits; timing always uses the full shape). A mode
the backend does not implement (NotImplementedError) is a skip row for that mode. An unavailable or
unsupported backend gives one skip row with the reason; an exception gives a fail row with its error_class
and the first lines of its message. Rows carry the GPU's clocks/temperature/power before and after the
measurement they report (None without a GPU); timed rows add the GPU sampler's summary of the timing
(experiments/timing/sampler.py: clock/power/temperature statistics, ``throttled_share``), and every row of a
backend with an AttnConfig its ``compiled_config`` / ``compiled_hash`` for the row's mode (kernels/tiles.py).

With ``ab`` (a baseline variant, set by the sweep's ``ab_baseline``) and ``bench``, each mode's timing is
followed by an interleaved A/B run on the same inputs (experiments.bench.compare_ab, A = the baseline config,
B = this job's config) and an ``ab_ratio`` row: value = median over pairs of t_baseline / t_variant (> 1: the
variant is faster), p20/p80/min/max/n_pairs of the ratio, baseline_ms/variant_ms (medians of the interleaved
run), ab_baseline (its name), ab_config, ab_config_hash, ab_resolved_config_hash. A failure of this step is a
fail row with metric ``ab_ratio``; the variant's own rows stay.
"""
from __future__ import annotations

import os
import traceback

import torch

from .backends import get_backend
from .bench import attn_flops, compare_ab, tflops, time_fn
from .check import check_backend, check_fits, fit_check_shape, slice_shape
from .metadata import STATE_KEYS, gpu_state_fields
from .shapes import Shape, make_inputs, randn
from .timing.sampler import GpuSampler

MODES = ("fwd", "bwd")
DEFAULT_BENCH = dict(warmup=5, repeats=30, flush_l2=True, max_time_s=None, hold_us=0.0, stream_calls=0)
MESSAGE_LINES = 3
MESSAGE_CHARS = 600

# substrings (lower case) of an exception chain's text that mean the GPU faulted; the CUDA context is
# unusable afterwards, so the job stops at the first one
CUDA_FAULT_MARKERS = ("illegal memory access", "illegal address", "illegal instruction", "misaligned address",
                      "unspecified launch failure", "device-side assert", "launch failed", "cuda error",
                      "cuda_error_", "cudaerror", "hardware exception", "uncorrectable ecc")
COMPILE_MARKERS = ("ptxas", "nvvm", "mlir", "cute dsl", "cutedsl", "cutlass dsl")


def _chain(exc: BaseException) -> list[BaseException]:
    out, seen = [], set()
    e = exc
    while e is not None and id(e) not in seen:
        out.append(e)
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return out


def classify_error(exc: BaseException) -> str:
    """'cuda_fault' for a GPU fault, 'compile_error' for a CuTe DSL / CUTLASS compilation failure, else 'error'."""
    chain = _chain(exc)
    if any(isinstance(e, torch.OutOfMemoryError) for e in chain):
        return "error"
    text = " ".join(f"{type(e).__module__}.{type(e).__name__}: {e}" for e in chain).lower()
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and any(isinstance(e, accel) for e in chain):
        return "cuda_fault"
    if any("cudaruntimeerror" in type(e).__name__.lower() for e in chain) or any(m in text for m in CUDA_FAULT_MARKERS):
        return "cuda_fault"
    from_dsl = any(type(e).__module__.split(".")[0] in ("cutlass", "_mlir", "mlir") or
                   type(e).__name__.startswith("DSL") for e in chain)
    if from_dsl or any(m in text for m in COMPILE_MARKERS) or _raised_in_compiler(chain):
        return "compile_error"
    return "error"


# A plain ValueError/TypeError raised inside a compiler's own frames (CuTe DSL tracing, Triton, Inductor) is a
# compile error too: e.g. cute.compile of a layout whose shape and stride disagree raises ValueError.
COMPILE_FRAMES = (f"{os.sep}cutlass{os.sep}", f"{os.sep}triton{os.sep}compiler{os.sep}",
                  f"{os.sep}torch{os.sep}_inductor{os.sep}", f"kernels{os.sep}compile_cache.py")


def _raised_in_compiler(chain: list[BaseException]) -> bool:
    return any(marker in fr.filename for e in chain for fr in traceback.extract_tb(e.__traceback__)
               for marker in COMPILE_FRAMES)


def error_message(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    msg = " | ".join(lines[:MESSAGE_LINES])
    return f"{type(exc).__name__}: {msg}"[:MESSAGE_CHARS]


def _job_key(job: dict) -> str:
    from .results import job_key

    return job_key(job)


def _no_state() -> dict:
    return {f"{k}_{w}": None for w in ("before", "after") for k in STATE_KEYS}


def _resolved(cfg, shape: Shape, arch: str | None):
    """The config as the backend will resolve it for ``arch`` (None without one, or for an unsupported hdim)."""
    from kernels import AttnConfig, ConfigError

    if arch is None:
        return None
    try:
        return (cfg or AttnConfig()).resolve(arch, shape.hdim, shape.causal)
    except ConfigError:  # unsupported head dim: supports() turns it into a skip row with the reason
        return None


class _Rows:
    """Builds rows that share the job's identity fields."""

    def __init__(self, job: dict, shape: Shape, cfg, device: str, config_arch: str | None = None, backend=None,
                 variant=None):
        # resolved_config: what the backend compiles / models once per-arch defaults fill the None fields, so two
        # variants that resolve to one kernel (e.g. a switch already off by default) are recognisable as such
        resolved = _resolved(cfg, shape, config_arch)
        self.base = dict(experiment=job.get("experiment"), job_key=_job_key(job), kind="attn",
                         backend=backend or job["backend"], **shape.to_dict(), config=cfg.as_written() if cfg else None,
                         config_hash=cfg.config_hash() if cfg else None,
                         resolved_config=resolved.to_dict() if resolved else None,
                         resolved_config_hash=resolved.config_hash() if resolved else None, device=device)
        if variant is not None:
            self.base["variant"] = variant
        self.rows: list[dict] = []
        self._cfg, self._shape, self._arch, self._compiled = cfg, shape, config_arch if resolved else None, {}

    def compiled(self, mode) -> dict:
        """compiled_config / compiled_hash of ``mode``'s kernel (kernels/tiles.py: the exp2 fraction rounded to whole
        fragments, the backward's own tiles), so variants that compile one kernel are seen as one; {} without one."""
        if self._arch is None or mode not in MODES:
            return {}
        if mode not in self._compiled:
            from kernels.tiles import compiled_config, compiled_hash

            try:
                c = compiled_config(self._cfg, self._arch, self._shape.hdim, self._shape.causal, mode)
            except ValueError:  # no kernel for this head dim in this mode: supports() says so in a skip row
                self._compiled[mode] = {}
            else:
                self._compiled[mode] = dict(compiled_config=c, compiled_hash=compiled_hash(c))
                if mode == "fwd" and not self._shape.varlen:  # the per-call rules too (persistent, its tile, ...)
                    from kernels.tiles import call_compiled_config

                    group = self._shape.heads // (self._shape.heads_kv or self._shape.heads)
                    self._compiled[mode]["call_hash"] = compiled_hash(call_compiled_config(
                        self._cfg, self._arch, self._shape.hdim, self._shape.causal, self._shape.seqlen_q, group,
                        self._shape.window is not None))
        return self._compiled[mode]

    def add(self, mode, metric, value, status="ok", reason=None, error_class=None, state=None, **extra) -> dict:
        row = dict(self.base, mode=mode, metric=metric, value=value, status=status, reason=reason,
                   error_class=error_class, **self.compiled(mode))
        row.update(state if state is not None else _no_state())
        row.update(extra)
        self.rows.append(row)
        return row

    def fail(self, mode, exc: BaseException, state=None, metric=None, **extra) -> str:
        cls = classify_error(exc)
        self.add(mode, metric, None, status="fail", reason=error_message(exc), error_class=cls, state=state, **extra)
        return cls


def _parse(job: dict):
    if job.get("kind", "attn") != "attn":
        raise ValueError(f"kind={job.get('kind')!r}: attn_job runs jobs of kind 'attn'")
    if "backend" not in job or "shape" not in job:
        raise ValueError("job: an 'attn' job needs 'backend' and 'shape'")
    shape = Shape.from_dict(job["shape"])
    cfg = None
    if job.get("config") is not None:
        from kernels import AttnConfig

        cfg = AttnConfig.from_dict(job["config"])
    modes = list(job.get("modes") or ["fwd"])
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"modes={modes}: unknown mode(s) {bad}; supported: {list(MODES)}")
    bench = job.get("bench", DEFAULT_BENCH)
    if bench is not None:
        unknown = sorted(set(bench) - set(DEFAULT_BENCH))
        if unknown:
            raise ValueError(f"bench: unknown key(s) {unknown}; known: {sorted(DEFAULT_BENCH)}")
        bench = {**DEFAULT_BENCH, **bench}
        if bench["stream_calls"]:
            raise ValueError(f"bench.stream_calls={bench['stream_calls']}: back-to-back timing runs in compare jobs "
                             "(an experiment of kind: compare, e.g. fwd_peers); 0 here")
    ab = job.get("ab")
    if ab is not None:
        if not isinstance(ab, dict) or "variant" not in ab or set(ab) - {"variant", "config"}:
            raise ValueError(f"ab={ab!r}: expected {{'variant': <baseline name>, 'config': <AttnConfig dict or None>}}")
        from kernels import AttnConfig

        ab = {"variant": str(ab["variant"]),
              "config": None if ab.get("config") is None else AttnConfig.from_dict(ab["config"])}
    return shape, cfg, modes, bench, ab


def run(job: dict) -> list[dict]:
    """Run one "attn" job; never raises for a backend failure (a bad job description does raise)."""
    shape, cfg, modes, bench, ab = _parse(job)
    backend = get_backend(job["backend"])  # unknown name: one-line error listing the known ones
    device = job.get("device") or backend.default_device()
    rows = _Rows(job, shape, cfg, device, backend.config_arch)
    mode_label = "+".join(modes)

    ok, why = backend.available()
    if ok and torch.device(device).type == "cpu" and not backend.cpu_capable:
        ok, why = False, f"{backend.name}: does not run on CPU"
    if not ok:
        rows.add(mode_label, None, None, status="skip", reason=why)
        return rows.rows
    ok, why = backend.supports(shape, cfg)
    if not ok:
        rows.add(mode_label, None, None, status="skip", reason=why)
        return rows.rows

    scale = job.get("softmax_scale")
    check_shape = fit_check_shape(shape, device) if job.get("check") else None
    peak = _peak(shape)
    for mode in modes:
        # timing first, so first_call_s is this job's first call of the backend (compile included)
        if bench is not None:
            before = gpu_state_fields("before")
            try:
                inputs = _timed_inputs(shape, mode, device, job.get("seed"))
                fn = _timed_fn(backend, shape, cfg, mode, scale, inputs)
                with GpuSampler() as sampler:  # GPU state during the timing, not only before/after
                    t = time_fn(fn, device=device, warmup=int(bench["warmup"]), repeats=int(bench["repeats"]),
                                flush_l2=bool(bench["flush_l2"]), max_time_s=bench["max_time_s"],
                                hold_us=float(bench["hold_us"]))
            except NotImplementedError as e:  # the backend lacks this mode: a skip, and nothing to check
                rows.add(mode, None, None, status="skip", reason=error_message(e), state=before)
                continue
            except Exception as e:  # noqa: BLE001 -- recorded as a row
                if rows.fail(mode, e, state=before) == "cuda_fault":
                    return rows.rows
            else:
                state = {**before, **gpu_state_fields("after")}
                flops = attn_flops(shape, mode)
                tf = tflops(flops, t.median_ms)
                rows.add(mode, "first_call_s", t.first_call_s, state=state, timer=t.timer)
                rows.add(mode, "second_call_s", t.second_call_s, state=state, timer=t.timer)
                rows.add(mode, "time_ms", t.median_ms, state=state, p20=t.p20_ms, p80=t.p80_ms, iqr=t.iqr_ms,
                         min=t.min_ms, max=t.max_ms, n=t.n, timer=t.timer, flush_l2=t.flush_l2, flops=flops,
                         tflops=tf, peak_tflops=peak, frac_of_peak=(tf / peak) if peak else None,
                         **sampler.summary())
                stats = getattr(backend, "last_stats", None)
                if mode == "fwd" and stats:
                    for key, val in stats.items():
                        if isinstance(val, (int, float)) and not isinstance(val, bool):
                            rows.add(mode, f"model_{key}", val, state=state)
                if ab is not None and _ab_row(rows, backend, shape, ab, mode, scale, inputs, fn, device,
                                              bench) == "cuda_fault":
                    return rows.rows
        if not job.get("check"):
            continue
        if check_shape is None:
            why = check_fits(slice_shape(shape), device)[1]
            rows.add(mode, "check", None, status="skip", reason=f"check skipped: one (batch, head) slice: {why}")
            continue
        before = gpu_state_fields("before")
        try:
            res = check_backend(backend, check_shape, cfg, device=device, seed=job.get("seed"), modes=(mode,),
                                scale=scale)
        except NotImplementedError as e:
            rows.add(mode, None, None, status="skip", reason=error_message(e), state=before)
            continue
        except Exception as e:  # noqa: BLE001 -- recorded as a row
            if rows.fail(mode, e, state=before) == "cuda_fault":
                return rows.rows
            continue
        state = {**before, **gpu_state_fields("after")}
        for r in res.rows():
            rows.add(r.pop("mode"), r.pop("metric"), r.pop("value"), r.pop("status"), r.pop("reason"),
                     r.pop("error_class"), state=state, check_seed=res.seed, check_batch=check_shape.batch,
                     check_heads=check_shape.heads, **r)
    return rows.rows


def _peak(shape: Shape) -> float | None:
    """Dense tensor-core peak (TFLOP/s) of this GPU at the shape's dtype, from the one peak table."""
    if not torch.cuda.is_available():
        return None
    from kernels.hardware import peak_tflops

    return peak_tflops(torch.cuda.get_device_name(), shape.dtype)


def _timed_inputs(shape: Shape, mode: str, device, seed):
    """q, k, v (and dout for bwd) of one timed mode, made once, outside the timing."""
    q, k, v = make_inputs(shape, device, seed)
    dout = randn(shape.out_shape(), shape.torch_dtype, device) if mode == "bwd" else None
    return q, k, v, dout


def _timed_fn(backend, shape: Shape, cfg, mode: str, scale, inputs):
    """The zero-argument callable that one timed repeat runs on ``inputs`` (from _timed_inputs); a shape's window /
    varlen reach the backend as keywords (Shape.call_kwargs, built here, outside the timing)."""
    q, k, v, dout = inputs
    kw = shape.call_kwargs(q.device)
    if mode == "fwd":
        def fwd():
            with torch.no_grad():
                return backend.forward(q, k, v, shape.causal, scale, cfg, **kw)

        return fwd
    bwd = backend.backward_fn(q, k, v, shape.causal, scale, cfg, **kw)
    return lambda: bwd(dout)


def _ab_row(rows: _Rows, backend, shape: Shape, ab: dict, mode: str, scale, inputs, fn_variant, device,
            bench: dict) -> str | None:
    """Time the baseline config (A) and this job's config (B) interleaved on the same inputs; add the ``ab_ratio``
    row (value = median t_A / t_B), or a skip/fail row with that metric. Returns the error class of a failure."""
    base_cfg = ab["config"]
    resolved = _resolved(base_cfg, shape, backend.config_arch)
    ident = dict(ab_baseline=ab["variant"], ab_config=base_cfg.as_written() if base_cfg else None,
                 ab_config_hash=base_cfg.config_hash() if base_cfg else None,
                 ab_resolved_config_hash=resolved.config_hash() if resolved else None)
    before = gpu_state_fields("before")
    ok, why = backend.supports(shape, base_cfg)
    if not ok:
        rows.add(mode, "ab_ratio", None, status="skip", reason=f"ab baseline {ab['variant']!r}: {why}", state=before,
                 **ident)
        return None
    try:
        fn_base = _timed_fn(backend, shape, base_cfg, mode, scale, inputs)
        r = compare_ab(fn_base, fn_variant, device=device, warmup=int(bench["warmup"]),
                       repeats=int(bench["repeats"]), flush_l2=bool(bench["flush_l2"]), max_time_s=bench["max_time_s"],
                       hold_us=float(bench["hold_us"]))
    except NotImplementedError as e:  # the baseline config lacks this mode
        rows.add(mode, "ab_ratio", None, status="skip", reason=f"ab baseline {ab['variant']!r}: {error_message(e)}",
                 state=before, **ident)
        return None
    except Exception as e:  # noqa: BLE001 -- recorded as a row; the variant's own rows stay
        return rows.fail(mode, e, state=before, metric="ab_ratio", **ident)
    rows.add(mode, "ab_ratio", r.ratio, state={**before, **gpu_state_fields("after")}, p20=r.ratio_p20,
             p80=r.ratio_p80, min=r.ratio_min, max=r.ratio_max, n_pairs=r.n_pairs, baseline_ms=r.a.median_ms,
             variant_ms=r.b.median_ms, timer=r.a.timer, flush_l2=r.a.flush_l2, **ident)
    return None
