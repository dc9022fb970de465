"""The matmul reference of compare jobs (``gemm_ref: true``, experiments/gemm_ref.py) on the CPU: its size, its rows
timed in the same rounds as the attention entries, and its ratio normalised to the attention's FLOPs."""
import statistics

import pytest

from experiments import gemm_ref
from experiments.bench import attn_flops
from experiments.compare_job import run
from experiments.shapes import Shape

SHAPE = dict(batch=1, seqlen_q=128, seqlen_k=128, heads=2, hdim=64)
E_FULL = {"backend": "fa4_model", "variant": "full", "config": {}}
E_REF = {"backend": "reference", "variant": "peer", "config": None}


def test_gemm_size_is_the_nearest_cube_in_range():
    assert gemm_ref.gemm_size(2 * 1024 ** 3) == 1024
    assert gemm_ref.gemm_size(2 * 1000 ** 3) == 1024  # multiples of 128
    assert gemm_ref.gemm_size(2 * 900 ** 3) == 896
    assert gemm_ref.gemm_size(10.0) == 128 and gemm_ref.gemm_size(1e18) == 16384  # clamped
    assert gemm_ref.gemm_flops(256) == 2 * 256 ** 3
    with pytest.raises(ValueError, match="flops"):
        gemm_ref.gemm_size(0)


def test_scaled_ratio_scales_every_per_round_value():
    r = dict(value=2.0, p20=1.0, p80=3.0, min=0.5, max=4.0, n=3, samples=[1.0, 2.0, 3.0], value_unthrottled=None,
             n_unthrottled=0)
    s = gemm_ref.scaled_ratio(r, 0.5)
    assert (s["value"], s["p20"], s["p80"], s["min"], s["max"]) == (1.0, 0.5, 1.5, 0.25, 2.0)
    assert s["samples"] == [0.5, 1.0, 1.5] and s["n"] == 3 and s["value_unthrottled"] is None
    assert r["samples"] == [1.0, 2.0, 3.0]  # the input is left as it was


def test_gemm_timed_in_the_same_rounds_and_normalised_to_the_attention_flops():
    job = {"kind": "compare", "experiment": "t", "shape": SHAPE, "modes": ["fwd"], "check": False,
           "bench": dict(warmup=1, repeats=6), "entries": [E_FULL, E_REF], "gemm_ref": True,
           "baseline": {"backend": "fa4_model", "variant": "full"}}
    rows = run(job)
    timed = {r["backend"]: r for r in rows if r["metric"] == "time_ms"}
    assert set(timed) == {"fa4_model", "reference", gemm_ref.LABEL}
    g, base = timed[gemm_ref.LABEL], timed["fa4_model"]
    f_attn = attn_flops(Shape.from_dict(SHAPE), "fwd")
    n = gemm_ref.gemm_size(f_attn)
    assert g["gemm_n"] == n and g["flops"] == 2.0 * n ** 3 and base["flops"] == f_attn
    assert g["rr_entries"] == base["rr_entries"] and len(g["times_ms"]) == len(base["times_ms"])
    (ratio,) = [r for r in rows if r["metric"] == "time_ratio" and r["backend"] == gemm_ref.LABEL]
    want = statistics.median(a * f_attn / g["flops"] / b for a, b in zip(g["times_ms"], base["times_ms"]))
    assert ratio["flops_normalised"] is True and ratio["value"] == pytest.approx(want, rel=1e-9)
    # (ours TFLOP/s) / (matmul TFLOP/s) per round, read like a peer's ratio
    assert ratio["baseline"] == "fa4_model[full]" and ratio["status"] == "ok"
    (peer,) = [r for r in rows if r["metric"] == "time_ratio" and r["backend"] == "reference"]
    assert "flops_normalised" not in peer


def test_no_gemm_without_the_flag():
    job = {"kind": "compare", "experiment": "t", "shape": SHAPE, "modes": ["fwd"], "check": False,
           "bench": dict(warmup=1, repeats=2), "entries": [E_FULL, E_REF],
           "baseline": {"backend": "fa4_model", "variant": "full"}}
    assert not [r for r in run(job) if r["backend"] == gemm_ref.LABEL]
