"""FLOP formulas (incl. bottom-right causal with seqlen_q != seqlen_k), timing statistics, the CPU timing
path, interleaved A/B ratios, the peak table and metadata on a CPU machine."""
import time

import pytest
import torch

from experiments import bench
from experiments.bench import attn_flops, compare_ab, quantile, summarize, time_fn, tflops, visible_pairs
from kernels.flops import attended_pairs, attention_flops
from experiments.metadata import STATE_KEYS, gpu_state, gpu_state_fields, static_metadata
from kernels.hardware import GPUS, gpu_for_device, peak_tflops
from experiments.shapes import Shape, paper_grid


def brute_pairs(sq, sk, causal):
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    return int(((j <= i + sk - sq) if causal else torch.ones(sq, sk, dtype=torch.bool)).sum())


@pytest.mark.parametrize("sq,sk", [(1, 1), (7, 7), (128, 128), (5, 17), (17, 5), (100, 1000), (1000, 100), (1, 9)])
@pytest.mark.parametrize("causal", [False, True])
def test_visible_pairs_matches_the_mask(sq, sk, causal):
    assert visible_pairs(sq, sk, causal) == brute_pairs(sq, sk, causal)


def brute_window_pairs(sq, sk, causal, left, right):
    """Nested loops over flash-attn's window definition (bottom-right aligned; -1 = unbounded; causal: right 0)."""
    n = 0
    for i in range(sq):
        d = i + sk - sq
        for j in range(sk):
            n += (left < 0 or j >= d - left) and (j <= d if causal else right < 0 or j <= d + right)
    return n


@pytest.mark.parametrize("sq,sk", [(1, 1), (9, 9), (5, 17), (17, 5), (1, 9), (9, 1), (33, 20), (20, 33)])
@pytest.mark.parametrize("causal", [False, True])
def test_attended_pairs_match_a_brute_force_mask(sq, sk, causal):
    for left in (-1, 0, 1, 3, 7, 40):
        for right in (-1, 0, 1, 4, 40):
            want = brute_window_pairs(sq, sk, causal, left, right)
            assert attended_pairs(sq, sk, causal, (left, right)) == want, (sq, sk, causal, left, right)
    assert attended_pairs(sq, sk, causal) == attended_pairs(sq, sk, causal, (-1, -1)) == visible_pairs(sq, sk, causal)


def test_attended_pairs_at_scale_and_its_flops():
    i = torch.arange(3000)[:, None]
    j = torch.arange(8192)[None, :]
    d = i + 8192 - 3000
    mask = (j >= d - 1024) & (j <= d + 100)
    assert attended_pairs(3000, 8192, False, (1024, 100)) == int(mask.sum())
    assert attention_flops(2, 8, 3000, 8192, 128, 64, False, "bwd", window=(1024, 100)) == \
        2.5 * 2 * 8 * 2 * int(mask.sum()) * (128 + 64)
    with pytest.raises(ValueError, match="window="):
        attended_pairs(4, 4, False, (-2, 0))


def test_forward_flops_formula():
    s = Shape(4, 2048, 2048, 16, 128)
    assert attn_flops(s) == 4 * 4 * 16 * 2048 * 2048 * 128
    c = s.replace(causal=True)  # exactly (s + 1) / 2 keys per row on average: "causal halves it"
    assert attn_flops(c) == 4 * 4 * 16 * 2048 * (2048 + 1) / 2 * 128
    r = Shape(1, 1000, 3000, 2, 64, causal=True)  # seqlen_q < seqlen_k: rows see 2001..3000 keys
    assert attn_flops(r) == 4 * 2 * 1000 * ((2001 + 3000) / 2) * 64
    m = Shape(1, 256, 256, 2, 192, 128)  # QK^T at 192, PV at 128
    assert attn_flops(m) == 2 * 2 * 256 * 256 * (192 + 128)


def test_backward_is_2p5x_forward():
    s = Shape(2, 512, 512, 4, 64, causal=True)
    assert attn_flops(s, "bwd") == 2.5 * attn_flops(s, "fwd")
    assert attn_flops(s, "fwd_bwd") == 3.5 * attn_flops(s, "fwd")
    with pytest.raises(ValueError, match="mode="):
        attn_flops(s, "fwdd")


def test_tflops():
    assert tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert tflops(1e12, 0.5) == pytest.approx(2000.0)


def test_paper_grid():
    g = paper_grid()
    assert len(g) == 4 * 6 * 2
    for s in g:
        assert s.batch * s.seqlen_q == 32768
        assert s.heads == 2048 // s.hdim
    assert {(s.hdim, s.hdim_v) for s in g} == {(64, 64), (128, 128), (256, 256), (192, 128)}


def test_quantile_and_summary():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(xs, 0.5) == 3.0 and quantile(xs, 0.0) == 1.0 and quantile(xs, 1.0) == 5.0
    assert quantile(xs, 0.25) == 2.0
    t = summarize(xs, 0.1, "perf_counter", False)
    assert (t.median_ms, t.min_ms, t.max_ms, t.n, t.iqr_ms) == (3.0, 1.0, 5.0, 5, 2.0)
    assert t.p20_ms == pytest.approx(1.8) and t.p80_ms == pytest.approx(4.2)
    with pytest.raises(ValueError):
        summarize([], 0.0, "perf_counter", False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU timing path")
def test_cpu_timing_path():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.004)

    t = time_fn(fn, device="cpu", warmup=2, repeats=6, flush_l2=True)
    assert t.timer == "perf_counter" and t.flush_l2 is False  # no L2 to flush on the CPU path
    assert t.n == 6 and len(calls) == 1 + 1 + 2 + 6  # first, second (cached), warm-up, timed
    assert t.min_ms >= 4.0 and t.first_call_s >= 0.004 and t.second_call_s >= 0.004
    assert t.p20_ms <= t.median_ms <= t.p80_ms
    d = t.to_dict()
    assert "times_ms" not in d and len(t.to_dict(with_samples=True)["times_ms"]) == 6


def test_max_time_budget_stops_early():
    t = time_fn(lambda: time.sleep(0.01), device="cpu", warmup=0, repeats=1000, max_time_s=0.05)
    assert 3 <= t.n < 50


def test_bad_repeats():
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, repeats=0)


def test_ab_interleaved_ratio():
    r = compare_ab(lambda: time.sleep(0.008), lambda: time.sleep(0.002), device="cpu", warmup=1, repeats=8)
    assert r.n_pairs == 8 and r.a.n == 8 and r.b.n == 8
    assert r.ratio > 1.5  # A takes ~4x as long as B; loose for a loaded CI machine
    assert r.ratio_min <= r.ratio_p20 <= r.ratio <= r.ratio_p80 <= r.ratio_max


def test_l2_flusher_is_noop_on_cpu():
    f = bench.L2Flusher("cpu")
    assert f.buf is None and f.l2_bytes is None
    f()


def test_peak_table_has_sources_and_dense_rates():
    assert set(GPUS) == {"h100", "h200", "b200", "b300"}
    for g in GPUS.values():
        assert all(len(g.sources[f].label()) > 3 for f in ("sms", "clock_mhz", "mma_flops_per_clk", "hbm_tb_s"))
        assert 500 < g.peak_tflops < 4000  # dense: sparse figures (1979, 4500) would be the doubled ones
        assert g.hbm_tb_s > 3
    assert GPUS["h200"].peak_tflops == pytest.approx(989.4, rel=1e-3)
    assert GPUS["h100"].sms == 132


def test_peak_lookup_by_device_name():
    assert gpu_for_device("NVIDIA H200").name == "H200"
    assert gpu_for_device("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert gpu_for_device("NVIDIA H100 PCIe") is None
    assert gpu_for_device("NVIDIA B200").name == "B200"
    assert gpu_for_device(None) is None and gpu_for_device("NVIDIA A100-SXM4-80GB") is None
    assert peak_tflops("NVIDIA H200", "float16") == pytest.approx(989.4, rel=1e-3)


def test_static_metadata_cached_and_complete():
    a, b = static_metadata(), static_metadata()
    assert a == b and a is not b
    for key in ("gpu_name", "sm_count", "driver", "cuda", "torch", "cutlass_dsl", "flash_attn_4", "git_sha",
                "git_dirty", "hostname", "python"):
        assert key in a
    assert a["torch"] == torch.__version__
    assert a["git_sha"] is None or len(a["git_sha"]) == 40


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_gpu_state_is_none_without_gpu():
    assert gpu_state() == dict.fromkeys(STATE_KEYS)
    assert gpu_state_fields("before") == {f"{k}_before": None for k in STATE_KEYS}
    assert static_metadata()["gpu_name"] is None


def test_first_call_holds_the_compile_second_call_does_not():
    """A function that 'compiles' (sleeps) only on its first call: first_call_s sees it, second_call_s does not."""
    state = {"compiled": False}

    def fn():
        if not state["compiled"]:
            time.sleep(0.2)
            state["compiled"] = True

    t = time_fn(fn, device="cpu", warmup=0, repeats=3)
    assert t.first_call_s >= 0.2 > t.second_call_s


def _fake_cuda(monkeypatch, log: list, elapsed_ms: float = 0.0):
    """experiments.bench on a faked CUDA device: flushes, spins (('sleep', cycles)) and events go to ``log``."""
    import torch

    from experiments import bench

    class FakeEvent:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            log.append("event")

        def elapsed_time(self, other):
            return elapsed_ms

    monkeypatch.setattr(bench, "_is_cuda", lambda device: True)
    monkeypatch.setattr(bench, "_sync", lambda device: None)
    monkeypatch.setattr(bench, "L2Flusher", lambda device: (lambda: log.append("flush")))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))


def test_hold_queues_a_gpu_spin_between_the_flush_and_the_start_event(monkeypatch):
    """CallTimer(hold_us=...): flush, then the spin, then the start event, the call, the end event (CUDA faked)."""
    from experiments import bench

    assert bench.CallTimer("cpu", flush_l2=True, hold_us=500).hold_us == 0.0  # nothing to hold on the CPU
    log = []
    _fake_cuda(monkeypatch, log)
    timer = bench.CallTimer("cuda", flush_l2=True, hold_us=500)
    assert timer.run(lambda: log.append("call")) is None
    assert log == ["flush", ("sleep", 500 * bench.HOLD_CYCLES_PER_US), "event", "call", "event"]
    log.clear()
    bench.CallTimer("cuda", flush_l2=True).run(lambda: log.append("call"))  # default: no spin
    assert log == ["flush", "event", "call", "event"]
    with pytest.raises(ValueError, match="hold_us"):
        bench.CallTimer("cuda", flush_l2=True, hold_us=-1)


def test_stream_timer_times_calls_back_to_back_per_turn(monkeypatch):
    """StreamTimer: one spin, the start event, ``calls`` calls, the end event; no flush; the time per call."""
    from experiments import bench

    n = []
    cpu = bench.StreamTimer("cpu", calls=4)
    assert cpu.run(lambda: n.append(1)) >= 0 and len(n) == 4 and cpu.name == "perf_counter_stream"
    with pytest.raises(ValueError, match="calls=0"):
        bench.StreamTimer("cpu", calls=0)
    log = []
    _fake_cuda(monkeypatch, log, elapsed_ms=12.0)
    timer = bench.StreamTimer("cuda", calls=3, hold_us=500)
    assert timer.flush is None and timer.name == "cuda_events_stream"
    assert timer.run(lambda: log.append("call")) is None
    assert log == [("sleep", 500 * bench.HOLD_CYCLES_PER_US), "event", "call", "call", "call", "event"]
    assert timer.collect() == [4.0]  # 12 ms over 3 calls
