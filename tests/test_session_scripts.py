"""The session A/B scripts (scripts/bwd_ab.py, fwd_ab.py) sample the GPU while they time: every row carries the
throttled share and clocks of its rounds (CPU: the timer and NVML are stood in for)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import bwd_ab  # noqa: E402
from experiments.timing import sampler as sampler_mod  # noqa: E402


def test_sampled_round_robin_gives_the_rounds_gpu_state(monkeypatch):
    state = iter([0x4] + [0x0] * 1000)  # sw_power_cap, then none
    read = lambda: dict(sm_clock_mhz=1800.0, mem_clock_mhz=3200.0, power_w=600.0, temp_c=60.0,
                        clocks_event_reasons=next(state))
    real = sampler_mod.GpuSampler
    monkeypatch.setattr(sampler_mod, "GpuSampler", lambda: real(interval_s=10.0, read=read))

    def timer(fns, repeats, hold_us=0.0):
        return {k: [1.0] * repeats for k in fns}

    monkeypatch.setattr(bwd_ab, "round_robin", timer)
    times, gpu = bwd_ab.sampled_round_robin({"ours": None, "peer": None}, 3)
    assert times == {"ours": [1.0] * 3, "peer": [1.0] * 3}
    assert set(gpu) == set(bwd_ab.GPU_FIELDS)
    # one sample when the thread starts (power cap), one after the last call (none): half of them throttled
    assert gpu["gpu_samples"] == 2 and gpu["sm_clock_mhz_median"] == 1800.0
    assert gpu["throttled_share"] == 0.5 and gpu["throttle_reasons"] == "sw_power_cap"
    assert bwd_ab.gpu_note(gpu) == "  throttled 50% (sw_power_cap) sm 1800/1800 MHz"


def test_without_nvml_the_rows_say_not_sampled():
    gpu = dict.fromkeys(bwd_ab.GPU_FIELDS)
    assert bwd_ab.gpu_note(gpu) == ""


def test_cta_overhead_fit_recovers_the_model():
    """scripts/bwd_cta_overhead.py fits t = waves x (c + s x steps): exact on noiseless points; the main kernel's time
    per call is the longest kernel's (pre / post / memsets shorter), whatever the names."""
    from types import SimpleNamespace

    import bwd_cta_overhead as probe

    pts = [(steps, 7.75, 7.75 * (4.5 + 2.5 * steps)) for steps in (1, 2, 4, 8, 16)]
    c, s = probe.fit(pts)
    assert abs(c - 4.5) < 1e-9 and abs(s - 2.5) < 1e-9
    ev = lambda key, t: SimpleNamespace(key=key, device_time_total=t)
    events = [ev("kernel_cutlass_preFlashBwdPreSm90", 140.0), ev("kernel_cutlass_FlashBwdSm90", 7460.0),
              ev("kernel_cutlass_postFlashBwdPostSm90", 98.0), ev("Memset (Device)", 12.0), ev("cpu op", 0.0)]
    assert probe.longest_kernel_us(events, 20) == 373.0


def test_speed_vs_is_the_per_round_ratio_to_the_base():
    """bwd_ab.speed_vs: per round t_base / t_variant (> 1: the variant is faster), its p20 / median / p80, the median
    time; official_bwd gives no calls where flash_attn.cute is missing (this CPU machine)."""
    times = {"ours": [1.0, 2.0, 1.0, 1.0, 1.0], "x": [2.0, 2.0, 0.5, 1.0, 1.0]}
    s = bwd_ab.speed_vs(times)
    assert s["ours"][1] == [1.0] * 5 and s["ours"][3] == 1.0
    ms, r, p20, med, p80 = s["x"]
    assert ms == 1.0 and r == [0.5, 1.0, 2.0, 1.0, 1.0]
    assert (p20, med, p80) == (1.0, 1.0, 2.0)
    try:
        import flash_attn.cute  # noqa: F401
    except ImportError:
        assert bwd_ab.official_bwd(*[None] * 7, False) == {}


def test_official_loop_mix_counts_a_loop_body_and_its_pv_wait():
    import official_loop_mix

    body = [("HGMMA.64x128x16.F32.BF16", " R24, gdesc[UR8], RZ"), ("MUFU.EX2", " R1, R2"),
            ("FFMA", " R3, R4, R5, R6"), ("WARPGROUP.DEPBAR.LE", " gsb0, 0x1"), ("MUFU.EX2", " R7, R8"),
            ("WARPGROUP.DEPBAR.LE", " gsb0, 0x0"), ("MUFU.EX2", " R9, R10"), ("FMNMX", " R1, R2, R3, !PT"),
            ("SYNCS.ARRIVE.TRANS64.ART0", " RZ, [UR5+0x20], R11"), ("BRA", " `(.L_x_1)")]
    m = official_loop_mix.loop_mix(body)
    assert (m["insns"], m["HGMMA"], m["MUFU.EX2"], m["FFMA/FADD/FMUL"], m["FMNMX"], m["SYNCS"]) == (10, 1, 3, 1, 1, 1)
    assert m["wait0_at"] == 5 and m["ex2_before_wait0"] == 2  # the 0x1 wait (QK^T's) is not P V's
    assert official_loop_mix.loop_mix(body[:3])["wait0_at"] == -1


@pytest.mark.parametrize("script", ["sched_check.sh", "h200_rerun.sh", "first_call.sh"])
def test_session_shell_scripts_parse(script):
    import subprocess

    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)]).returncode == 0


def test_first_call_gputests_starts_at_the_named_file(tmp_path):
    """scripts/first_call.sh part gputests: GPU_TESTS_FROM starts the run at that file (forward files first); a name
    that is no GPU test file stops the part with a message instead of running every test (no CUDA: they skip)."""
    import os
    import subprocess

    def part(out, start):
        env = dict(os.environ, DEADLINE="200", GPU_TESTS_FROM=start, CUDA_VISIBLE_DEVICES="")  # tests skip
        return subprocess.run(["bash", "scripts/first_call.sh", str(out), "gputests"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=180).stdout

    last = "tests/test_window_softcap_gpu.py"
    assert f"last file reached: {last}" in part(tmp_path / "a", last)
    log = (tmp_path / "a" / "gputests.log").read_text()
    assert {line.split("::")[0] for line in log.splitlines() if "::" in line} == {last}
    out = part(tmp_path / "b", "tests/no_such_gpu.py")
    assert "no test file" in out and not (tmp_path / "b" / "gputests.log").exists()


@pytest.mark.compile
def test_fwd_probes_take_their_piece_out_of_the_kernel(tmp_path):
    """scripts/fwd_probe.py: each probe's copy of the hd64 forward lacks its piece in the SASS (no_rowsum: the row
    sums' FADDs, no_maxshfl: the quad shuffles, no_exp: every MUFU.EX2, no_softmax: all three, free_o: o_direct's
    stores but one), and the patches are undone after it."""
    import collections

    import fwd_probe
    from kernels import AttnConfig
    from kernels.sm90 import softmax
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.sm90.sass import count, kernel_sass, opcode_counts, steady_state_loops

    before = (softmax._row_sum, softmax.exp2_mufu, softmax.quad_allreduce_max)
    mixes = {}
    for probe in (None, "o_direct") + fwd_probe.PROBES:  # o_direct: free_o's kernel unpatched
        fields = fwd_probe.PROBE_FIELDS.get(probe, {"o_direct": True} if probe == "o_direct" else {})
        kern = make_fwd_kernel(AttnConfig(persistent=False, **fields).resolve("sm90", 64, False), "bfloat16", 64, 64,
                               False)
        with fwd_probe.patched(fwd_probe._probe_patches(probe) if probe not in (None, "o_direct") else []):
            sass = kernel_sass(kern, str(tmp_path / str(probe)))
        if sass is None:
            pytest.skip("nvdisasm not installed")
        loops = steady_state_loops(sass)
        counts = opcode_counts(sass)
        mixes[probe] = (collections.Counter(o.split(".")[0] for o, _ in loops[0]) if loops else None,
                        count(counts, "MUFU.EX2"), count(counts, "SHFL"), count(counts, "FADD"), count(counts, "STG"))
    assert (softmax._row_sum, softmax.exp2_mufu, softmax.quad_allreduce_max) == before
    base = mixes[None][0]
    assert mixes["no_rowsum"][0]["FADD"] < base["FADD"] - 40
    assert mixes["no_maxshfl"][0]["SHFL"] < base["SHFL"]
    assert mixes["no_exp"][1] == 0 and mixes[None][1] > 0
    # no_softmax: every piece at once (no MUFU.EX2 left, so no steady-state loop to take apart: whole-kernel counts)
    assert mixes["no_softmax"][1] == 0 and mixes["no_softmax"][2] < mixes[None][2]
    assert mixes["no_softmax"][3] < mixes[None][3] - 40
    # free_o: o_direct's epilogue with one O store per thread left (hd64: 3 STG in the kernel against 18)
    assert 0 < mixes["free_o"][4] < mixes["o_direct"][4] - 8


def test_split_profile_script_has_a_cli():
    """scripts/split_profile.py (a GPU session script) parses its arguments without a GPU."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "scripts" / "split_profile.py"), "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "--seqlen-k" in r.stdout


@pytest.mark.parametrize("kind", ["sink", "late_max"])
def test_fwd_ab_inputs_put_each_rows_maximum_at_key_0(kind):
    """fwd_ab --inputs: sink scores key 0 ~10 log2 units up for every query; late_max's ramp ends there (the key the
    kernels visit last, so rows rescale late); gaussian leaves the draw as it is."""
    import math

    import torch

    import fwd_ab

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 512, 2, 64, generator=g).bfloat16() for _ in range(2))
    q0, k0 = q.clone(), k.clone()
    fwd_ab.shape_scores("gaussian", q, k)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    fwd_ab.shape_scores(kind, q, k)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * math.log2(math.e) / 8.0  # log2 units
    top = s.argmax(-1)
    assert (top == 0).float().mean() > (0.95 if kind == "sink" else 0.8)
    assert (top < 128).float().mean() > 0.95  # late_max: the ramp's top, near key 0 (not spread over the keys)
    if kind == "sink":
        assert abs(s[..., 0].mean().item() - 10.0) < 0.3
    with pytest.raises(SystemExit):
        fwd_ab.shape_scores("uniform", q, k)


class _FakeNvml:
    """NVML stood in for: instant power missing on the first call (the 1 s average then), SM clock 1500 MHz."""
    NVML_FI_DEV_POWER_INSTANT, NVML_CLOCK_SM = 186, 0

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.calls = 0

    def nvmlDeviceGetFieldValues(self, h, ids):
        self.calls += 1
        f = type("F", (), {})()
        f.nvmlReturn = 1 if self.calls == 1 else 0
        f.value = type("V", (), {"uiVal": 400_000})()  # mW
        return [f]

    def nvmlDeviceGetPowerUsage(self, h):
        return 700_000

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1500


def test_energy_window_means_the_samples_inside_it():
    import energy_ab

    s = energy_ab.power_sampler(_FakeNvml(), None)
    s.samples = [dict(t=0.5, power_w=700.0, sm_clock_mhz=1500, power_source="average_1s"),
                 dict(t=1.0, power_w=400.0, sm_clock_mhz=1500, power_source="instant"),
                 dict(t=2.0, power_w=400.0, sm_clock_mhz=1400, power_source="instant"),
                 dict(t=3.5, power_w=100.0, sm_clock_mhz=1000, power_source="instant")]
    assert energy_ab.window_power(s, 0.9, 2.5) == dict(watts=400.0, sm_mhz=1450.0, samples=2, source="instant")
    assert energy_ab.window_power(s, 0.0, 3.5)["source"] == "average_1s,instant"
    assert energy_ab.window_power(None, 0.0, 1.0)["samples"] == 0
    nv = _FakeNvml()
    assert energy_ab.instant_watts(nv, None) == (700.0, "average_1s")  # the field missing: the 1 s average
    assert energy_ab.instant_watts(nv, None) == (400.0, "instant")
    assert s.read()["sm_clock_mhz"] == 1500  # the sampler's reader: watts, their source and the SM clock


def test_stream_gaps_per_call_figures():
    import stream_gaps

    # two calls of two kernels each: a 10 us gap inside each call, 30 us between the calls, one overlap counted 0
    spans = [(0.0, 100.0, "attn"), (110.0, 120.0, "memset"), (150.0, 250.0, "attn"), (245.0, 270.0, "memset")]
    st = stream_gaps.gap_stats(spans, calls=2)
    assert st["kernels_per_call"] == 2 and st["busy_us_per_call"] == (100 + 10 + 100 + 25) / 2
    assert st["span_us_per_call"] == 135.0 and st["gap_us_per_call"] == (10 + 30 + 0) / 2
    assert st["gap_us_median"] == 10.0 and st["kernel_names"] == ["attn", "memset"]


def test_stream_gaps_harness_segments():
    import stream_gaps

    # two timed calls: flush, spin, the call's kernels; the second call's two kernels, 10 us after its spin
    spans = [(0.0, 10.0, "fill_buf"), (10.0, 510.0, "spin_kernel"), (515.0, 600.0, "attn"), (620.0, 630.0, "fill_buf"),
             (630.0, 1130.0, "spin_kernel"), (1140.0, 1300.0, "attn"), (1300.0, 1310.0, "tail")]
    segs = stream_gaps.harness_segments(spans, spin="spin_kernel", flush="fill_buf")
    assert segs == [dict(kernel_us=85.0, lead_us=5.0, kernels=1), dict(kernel_us=170.0, lead_us=10.0, kernels=2)]
    assert stream_gaps.harness_segments(spans[:2], spin="spin_kernel", flush="fill_buf") == []  # a call that ran nothing


def test_stream_gaps_harness_rows_carry_the_gpu_state(tmp_path, monkeypatch, capsys):
    """scripts/stream_gaps.py --harness: every row and printed line carries the GPU sampler's fields for the rounds
    (the profiler, the cells and the GPU stood in for)."""
    import json

    import stream_gaps
    import torch

    stats = dict(rounds=12, event_us=1365.6, kernel_us=1362.8, lead_us=2.5, kernels_per_call=1.0)
    gpu = dict.fromkeys(bwd_ab.GPU_FIELDS) | dict(gpu_samples=4, sm_clock_mhz_min=1605.0, sm_clock_mhz_median=1755.0,
                                                  throttled_share=0.5, throttle_reasons="sw_power_cap")
    monkeypatch.setattr(stream_gaps, "paper_cells",
                        lambda *a: [(256, 256, 8192, True, 4, 8, {"ours": None, "fa4_official": None})])
    monkeypatch.setattr(stream_gaps, "harness_profile", lambda fns, rounds, hold: {n: dict(stats) for n in fns})
    monkeypatch.setattr(stream_gaps, "sampled", lambda run: (run(), gpu))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    out = tmp_path / "rows.jsonl"
    monkeypatch.setattr(sys, "argv", ["stream_gaps.py", "--harness", "--calls", "12", "--out", str(out)])
    stream_gaps.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["backend"] for r in rows] == ["ours", "fa4_official"]
    assert all(r["throttled_share"] == 0.5 and r["kernel_us"] == 1362.8 and r["hold_us"] == 500.0 for r in rows)
    assert capsys.readouterr().out.count("throttled 50% (sw_power_cap) sm 1605/1755 MHz") == 2


def test_energy_flush_time_is_taken_off_round_by_round():
    import energy_ab

    res = {"ours": [dict(s=1.2, calls=10), dict(s=1.4, calls=10)], "flush_only": [dict(s=0.5, calls=50),
                                                                                  dict(s=1.0, calls=50)]}
    energy_ab.subtract_flush(res)
    assert set(res) == {"ours"}
    assert [round(w["s"], 9) for w in res["ours"]] == [1.1, 1.2] and [w["s_raw"] for w in res["ours"]] == [1.2, 1.4]
    plain = {"ours": [dict(s=1.0, calls=4)]}
    energy_ab.subtract_flush(plain)
    assert plain == {"ours": [dict(s=1.0, calls=4)]}


def test_energy_rounds_follow_the_balanced_orders(monkeypatch):
    import contextlib

    import energy_ab
    from experiments.timing.roundrobin import balanced_orders

    seen = []

    def window(fn, calls, nv, h, sampler=None):
        if sampler is not None:
            seen.append(fn())
        return dict(s=0.001 * calls, calls=calls)

    monkeypatch.setattr(energy_ab, "measure_window", window)
    monkeypatch.setattr(energy_ab, "power_sampler", lambda nv, h: contextlib.nullcontext(object()))
    fns = {n: (lambda n=n: n) for n in "abc"}
    res = energy_ab.energy_rounds(fns, rounds=5, window_ms=10, nv=None, h=None)
    orders = balanced_orders(list("abc"))  # 6 orders for 3 variants: 5 rounds become one whole cycle
    assert seen == [n for o in orders for n in o] and all(len(v) == 6 for v in res.values())


def test_first_call_gputests_resumes_at_the_cut_test(tmp_path):
    """scripts/first_call.sh part gputests: a run cut inside a test (here the test kills its pytest, as the deadline's
    timeout does) prints that test as the next GPU_TESTS_FROM, and a run given it starts there, the tests before it
    left out; a test id the file lacks stops the part with a message. Run in a stand-in checkout with one GPU file."""
    import os
    import subprocess

    (tmp_path / "tests").mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    (tmp_path / "tests" / "test_cut_gpu.py").write_text(
        "import os, signal, pytest\n"
        "@pytest.mark.gpu\ndef test_a(): pass\n"
        "@pytest.mark.gpu\ndef test_b():\n    if os.environ.get('CUT_HERE'): os.kill(os.getpid(), signal.SIGTERM)\n"
        "@pytest.mark.gpu\ndef test_c(): pass\n")

    def part(out, start, **env):
        env = dict(os.environ, DEADLINE="200", GPU_TESTS_FROM=start, **env)
        return subprocess.run(["bash", str(ROOT / "scripts" / "first_call.sh"), str(out), "gputests"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=180).stdout

    first = part(tmp_path / "a", "", CUT_HERE="1")
    resume = [line.split("=", 1)[1] for line in first.splitlines() if line.startswith("resume: GPU_TESTS_FROM=")]
    assert "PASSED 1" in first and resume == ["tests/test_cut_gpu.py::test_b"], first
    second = part(tmp_path / "b", resume[0], FA4LAB_GIT_SHA="abc1234")
    assert "PASSED 2" in second and "resume:" not in second, second
    log = (tmp_path / "b" / "gputests.log").read_text()
    from analysis.gpu_tests import HEADER  # the first line names the card and commit for analysis.gpu_tests
    header = HEADER.match(log.split("\n", 1)[0])
    assert header and header.group("sha") == "abc1234", log[:200]
    assert "::test_a" not in log and "::test_b PASSED" in log and "::test_c PASSED" in log
    assert "no test" in part(tmp_path / "c", "tests/test_cut_gpu.py::test_z")
