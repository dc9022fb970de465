"""The "attn" job runner on CPU: rows for check + timing, skip rows with reasons, fail rows with error classes."""
import time

import pytest
import torch

from experiments.attn_job import classify_error, run
from experiments.backends import BACKENDS, UnknownBackendError, get_backend, register_backend
from experiments.backends.base import Backend
from experiments.metadata import STATE_KEYS
from experiments.results import job_key

SHAPE = dict(batch=1, seqlen_q=64, seqlen_k=128, heads=2, hdim=64, hdim_v=64, causal=True, dtype="bfloat16")
FAST = dict(warmup=0, repeats=3, flush_l2=True)
REQUIRED = ("experiment", "job_key", "kind", "backend", "mode", "metric", "value", "status", "reason", "error_class",
            "config", "config_hash", *SHAPE)


def job(backend, **kw):
    j = dict(kind="attn", experiment="test", backend=backend, config=None, shape=SHAPE, modes=["fwd", "bwd"],
             check=True, bench=FAST)
    j.update(kw)
    return j


class Raising(Backend):
    cpu_capable = True

    def __init__(self, exc):
        self.exc = exc

    def forward(self, q, k, v, causal, scale, cfg=None):
        raise self.exc


class Shifted(Backend):
    cpu_capable = True

    def forward(self, q, k, v, causal, scale, cfg=None):
        out, lse = get_backend("reference").forward(q, k, v, causal, scale, cfg)
        return out + 0.25, lse


@pytest.fixture
def fake():
    added = []

    def add(name, factory):
        register_backend(name, factory)
        added.append(name)
        return name

    yield add
    for n in added:
        BACKENDS.pop(n, None)


def test_fa4_model_job_rows():
    j = job("fa4_model", config={"rescale_threshold": 4.0})
    rows = run(j)
    for r in rows:
        for key in REQUIRED:
            assert key in r, key
        for k in STATE_KEYS:
            assert f"{k}_before" in r and f"{k}_after" in r
        assert r["job_key"] == job_key(j) and r["kind"] == "attn" and r["backend"] == "fa4_model"
        assert r["config"]["rescale_threshold"] == 4.0 and len(r["config_hash"]) == 12
        assert r["status"] == "ok", r
    by = {(r["mode"], r["metric"]): r for r in rows}
    for m in ("err_out", "err_lse"):
        assert by[("fwd", m)]["passed"] is True
    for m in ("err_dq", "err_dk", "err_dv"):
        assert by[("bwd", m)]["passed"] is True
    for mode in ("fwd", "bwd"):
        t = by[(mode, "time_ms")]
        assert t["timer"] == ("cuda_events" if torch.cuda.is_available() else "perf_counter")
        assert t["n"] == 3 and t["min"] <= t["value"] <= t["max"] and t["p20"] <= t["p80"]
        assert t["tflops"] > 0 and t["flops"] > 0
        assert by[(mode, "first_call_s")]["value"] > 0 and by[(mode, "second_call_s")]["value"] > 0
    assert by[("bwd", "time_ms")]["flops"] == 2.5 * by[("fwd", "time_ms")]["flops"]
    assert ("fwd", "model_rescales_skipped") in by  # the model's counters ride along


def test_no_bench_gives_only_check_rows():
    rows = run(job("reference", bench=None, modes=["fwd"]))
    assert {r["metric"] for r in rows} == {"err_out", "err_lse"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-machine skip reasons")
@pytest.mark.parametrize("name", ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex", "fa4_official", "fa4"])
def test_unavailable_backend_is_one_skip_row(name):
    rows = run(job(name))
    assert len(rows) == 1
    r = rows[0]
    assert r["status"] == "skip" and "no CUDA device" in r["reason"] and r["error_class"] is None
    assert r["mode"] == "fwd+bwd" and r["value"] is None and r["backend"] == name


def test_unsupported_shape_is_one_skip_row():
    big = dict(SHAPE, batch=64, seqlen_q=65536, seqlen_k=65536, heads=64)
    rows = run(job("reference", shape=big))
    assert len(rows) == 1 and rows[0]["status"] == "skip" and "GiB" in rows[0]["reason"]


def test_cpu_incapable_backend_skips_on_cpu(fake):
    class GpuOnly(Backend):
        def forward(self, q, k, v, causal, scale, cfg=None):
            raise AssertionError("must not run")

    name = fake("_gpu_only", GpuOnly)
    rows = run(job(name, device="cpu"))
    assert len(rows) == 1 and rows[0]["status"] == "skip" and "CPU" in rows[0]["reason"]


def test_wrong_result_rows(fake):
    name = fake("_shifted", Shifted)
    rows = run(job(name, modes=["fwd"]))
    by = {r["metric"]: r for r in rows}
    assert by["err_out"]["status"] == "fail" and by["err_out"]["error_class"] == "wrong_result"
    assert by["err_lse"]["status"] == "ok"
    assert by["time_ms"]["status"] == "ok"  # still timed; the failed check row says it is wrong


def test_cuda_fault_stops_the_job(fake):
    name = fake("_fault", lambda: Raising(RuntimeError(
        "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported")))
    rows = run(job(name))
    assert len(rows) == 1  # the fwd timing hit it; nothing (no check, no bwd) runs after a fault
    r = rows[0]
    assert r["status"] == "fail" and r["error_class"] == "cuda_fault"
    assert r["reason"].startswith("RuntimeError: CUDA error: an illegal memory access")


def test_plain_error_continues_with_next_mode(fake):
    name = fake("_err", lambda: Raising(ValueError("bad thing")))
    rows = run(job(name, check=False))
    assert [(r["mode"], r["status"], r["error_class"]) for r in rows] == [("fwd", "fail", "error"),
                                                                          ("bwd", "fail", "error")]
    assert rows[0]["reason"] == "ValueError: bad thing"
    rows = run(job(name, check=True))  # a failed timing still gets its check (which fails the same way)
    assert [(r["mode"], r["status"]) for r in rows] == [("fwd", "fail")] * 2 + [("bwd", "fail")] * 2


def test_classify_error():
    assert classify_error(RuntimeError("CUDA error: misaligned address")) == "cuda_fault"
    assert classify_error(ValueError("shape mismatch")) == "error"
    assert classify_error(torch.OutOfMemoryError("CUDA out of memory")) == "error"
    try:
        try:
            raise RuntimeError("ptxas fatal: Unresolved extern function")
        except RuntimeError as inner:
            raise ValueError("kernel build failed") from inner
    except ValueError as e:
        assert classify_error(e) == "compile_error"  # found in the cause chain


def test_classify_real_cute_dsl_error():
    common = pytest.importorskip("cutlass.base_dsl.common")
    assert classify_error(common.DSLRuntimeError("layout shape and stride disagree")) == "compile_error"


def test_bad_jobs_raise_clear_errors():
    with pytest.raises(UnknownBackendError, match="known backends"):
        run(job("nope"))
    with pytest.raises(ValueError, match="modes="):
        run(job("reference", modes=["fwd", "sideways"]))
    with pytest.raises(ValueError, match="bench: unknown"):
        run(job("reference", bench=dict(repeats=3, warmpu=1)))
    with pytest.raises(ValueError, match="kind="):
        run(job("reference", kind="numerics"))


def test_check_skipped_when_reference_does_not_fit_but_timing_runs(fake, monkeypatch):
    import experiments.attn_job as aj

    monkeypatch.setattr(aj, "fit_check_shape", lambda shape, device: None)
    monkeypatch.setattr(aj, "check_fits", lambda shape, device: (False, "score matrices need ~999 GiB"))
    rows = run(job("reference", modes=["fwd"]))
    by = {r["metric"]: r for r in rows}
    assert by["check"]["status"] == "skip" and "999 GiB" in by["check"]["reason"]
    assert by["time_ms"]["status"] == "ok"


def test_check_shape_shrinks_batch_then_heads(monkeypatch):
    import experiments.check as ck
    from experiments.shapes import Shape

    budget = 3  # (batch * heads) slices that "fit"
    monkeypatch.setattr(ck, "check_fits", lambda s, d: (s.batch * s.heads <= budget, "too big"))
    s = ck.fit_check_shape(Shape(8, 64, 64, 4, 64), "cpu")
    assert (s.batch, s.heads, s.seqlen_q) == (1, 2, 64)
    budget = 0
    assert ck.fit_check_shape(Shape(8, 64, 64, 4, 64), "cpu") is None


def test_check_rows_record_the_checked_slice():
    rows = run(job("reference", modes=["fwd"], bench=None))
    assert {(r["check_batch"], r["check_heads"]) for r in rows} == {(1, 2)}


def test_missing_mode_is_a_skip_not_a_failure(fake):
    class ForwardOnly(Backend):
        cpu_capable = True

        def forward(self, q, k, v, causal, scale, cfg=None):
            return get_backend("reference").forward(q, k, v, causal, scale, cfg)

        def backward_fn(self, *a, **kw):
            raise NotImplementedError("backward kernel not built yet")

        def backward(self, *a, **kw):
            raise NotImplementedError("backward kernel not built yet")

    name = fake("_fwd_only", ForwardOnly)
    for check in (True, False):
        rows = run(job(name, check=check))
        bwd = [r for r in rows if r["mode"] == "bwd"]
        assert len(bwd) == 1 and bwd[0]["status"] == "skip" and "not built yet" in bwd[0]["reason"]
        assert {r["status"] for r in rows if r["mode"] == "fwd"} == {"ok"}


def test_value_error_raised_inside_the_dsl_compiler_is_a_compile_error():
    """cute.compile of a bad layout raises a plain ValueError from cutlass frames: still a compile error."""
    from experiments.fault_backends import FaultCompileBackend

    try:
        FaultCompileBackend().forward(None, None, None, False, None, None)
    except Exception as e:  # noqa: BLE001 - any exception type; the class comes from where it was raised
        assert classify_error(e) == "compile_error", repr(e)
    else:
        raise AssertionError("the bad layout compiled")


class Sleepy(Backend):
    """Forward sleeps 6 ms without ping-pong, 2 ms with it; raises for a config with two_cta (a failing baseline)."""
    cpu_capable = True
    config_arch = "sm90"

    def forward(self, q, k, v, causal, scale, cfg=None):
        if cfg is not None and cfg.two_cta:
            raise ValueError("two_cta: not on this backend")
        time.sleep(0.006 if cfg is not None and cfg.pingpong is False else 0.002)
        return q, None


def test_ab_ratio_rows_on_the_model():
    from kernels import AttnConfig

    j = job("fa4_model", config={"rescale_threshold": 0.0}, check=False, ab={"variant": "full", "config": {}})
    rows = run(j)
    by = {(r["mode"], r["metric"]): r for r in rows}
    for mode in ("fwd", "bwd"):
        assert by[(mode, "time_ms")]["status"] == "ok"  # the variant's own timing is still there
        r = by[(mode, "ab_ratio")]
        assert r["status"] == "ok" and r["job_key"] == job_key(j) and r["ab_baseline"] == "full"
        assert r["n_pairs"] == FAST["repeats"] and r["min"] <= r["p20"] <= r["value"] <= r["p80"] <= r["max"]
        assert 0 < r["min"] and r["baseline_ms"] > 0 and r["variant_ms"] > 0
        assert r["config"]["rescale_threshold"] == 0.0 and r["ab_config_hash"] == AttnConfig().config_hash()
        assert r["ab_resolved_config_hash"] != r["resolved_config_hash"]  # tau 0 vs the default tau 8
    assert not [r for r in run(dict(j, bench=None)) if r["metric"] == "ab_ratio"]  # untimed: no A/B either
    with pytest.raises(ValueError, match="ab="):
        run(dict(j, ab={"config": {}}))


def test_ab_ratio_is_t_baseline_over_t_variant(fake):
    name = fake("_sleepy", Sleepy)
    rows = run(job(name, modes=["fwd"], check=False, config={"pingpong": False}, ab={"variant": "full", "config": {}}))
    r = {x["metric"]: x for x in rows}["ab_ratio"]
    assert 0.15 < r["value"] < 0.6, r  # variant 6 ms, baseline 2 ms: ratio ~ 1/3 (< 1: the variant is slower)
    assert r["variant_ms"] > r["baseline_ms"]


def test_ab_failure_is_a_fail_row_and_keeps_the_variant_rows(fake):
    name = fake("_sleepy", Sleepy)
    rows = run(job(name, modes=["fwd"], check=False, config={}, ab={"variant": "two_cta", "config": {"two_cta": True}}))
    by = {r["metric"]: r for r in rows}
    assert by["time_ms"]["status"] == "ok"
    f = by["ab_ratio"]
    assert f["status"] == "fail" and f["error_class"] == "error" and f["value"] is None
    assert f["ab_baseline"] == "two_cta" and "two_cta: not on this backend" in f["reason"]
