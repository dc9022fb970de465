"""The round-robin compare job on the CPU: rows, per-round ratios, provenance of what was compiled, failures,
and a sweep of kind compare that resumes by job key."""
import pytest

from experiments.backends import register_backend
from experiments.backends.base import Backend
from experiments.compare_job import group_jobs, label, run
from experiments.results import read_rows

SHAPE = dict(batch=1, seqlen_q=64, seqlen_k=64, heads=2, hdim=64)


class Broken(Backend):
    cpu_capable = True

    def forward(self, q, k, v, causal, scale, cfg=None):
        raise RuntimeError("broken on purpose")


register_backend("test_broken", Broken)


def job(entries, modes=("fwd",), check=False, repeats=10, baseline=None):
    return {"kind": "compare", "experiment": "t", "shape": SHAPE, "modes": list(modes), "check": check,
            "bench": dict(warmup=1, repeats=repeats), "entries": entries,
            "baseline": baseline or {"backend": entries[0]["backend"], "variant": entries[0]["variant"]}}


E_FULL = {"backend": "fa4_model", "variant": "full", "config": {}}
E_TAU0 = {"backend": "fa4_model", "variant": "tau0", "config": {"rescale_threshold": 0.0}}
E_TAU8 = {"backend": "fa4_model", "variant": "rescale_threshold=8.0", "config": {"rescale_threshold": 8.0}}
E_REF = {"backend": "reference", "variant": "peer", "config": None}


def by(rows, **kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())]


def test_every_entry_timed_in_the_same_rounds_with_ratios_to_the_baseline():
    rows = run(job([E_FULL, E_TAU0, E_REF, {"backend": "fa4", "variant": "default", "config": None}],
                   modes=("fwd", "bwd"), check=True))
    for mode in ("fwd", "bwd"):
        timed = by(rows, metric="time_ms", mode=mode)
        assert {label(r) for r in timed} == {"fa4_model[full]", "fa4_model[tau0]", "reference"}
        # 10 rounds asked, 12 run: whole cycles of the balanced orders of 3 entries (6 orders)
        assert all(r["n"] == 12 and len(r["times_ms"]) == 12 and len(r["round_throttled"]) == 12 for r in timed)
        assert all(r["rr_entries"] == ["fa4_model[full]", "fa4_model[tau0]", "reference"] for r in timed)
        assert all(r["gpu_sampler"].startswith("unavailable") and r["throttled_share"] is None for r in timed)
        ratios = by(rows, metric="time_ratio", mode=mode)
        assert {label(r) for r in ratios} == {"fa4_model[tau0]", "reference"}  # the baseline has none
        for r in ratios:
            own = by(timed, backend=r["backend"], variant=r["variant"])[0]["times_ms"]
            base = by(timed, variant="full")[0]["times_ms"]
            per_round = sorted(a / b for a, b in zip(own, base))
            assert r["n"] == 12 and r["baseline"] == "fa4_model[full]"
            assert r["value"] == pytest.approx((per_round[5] + per_round[6]) / 2)  # median of per-round ratios
            assert r["p20"] <= r["value"] <= r["p80"]
        assert len(by(rows, metric="first_call_s", mode=mode)) == 3
        assert by(rows, variant="tau0", mode=mode, metric="err_" + ("out" if mode == "fwd" else "dq"))
    skip = by(rows, backend="fa4")
    assert len(skip) == 1 and skip[0]["status"] == "skip" and "CUDA" in skip[0]["reason"]


def test_variants_that_compile_one_kernel_share_a_compiled_hash():
    rows = run(job([E_FULL, E_TAU0, E_TAU8], modes=("fwd", "bwd")))
    h = {(r["variant"], r["mode"]): r["compiled_hash"] for r in by(rows, metric="time_ms")}
    assert h[("full", "fwd")] == h[("rescale_threshold=8.0", "fwd")] != h[("tau0", "fwd")]
    assert h[("full", "bwd")] == h[("tau0", "bwd")]  # tau is a forward switch: one backward kernel
    r = by(rows, metric="time_ratio", variant="tau0", mode="fwd")[0]
    assert r["baseline_compiled_hash"] == h[("full", "fwd")]
    assert by(rows, variant="tau0")[0]["resolved_config"]["rescale_threshold"] == 0.0


def test_a_failing_entry_is_a_fail_row_and_the_others_are_still_compared():
    rows = run(job([E_FULL, {"backend": "test_broken", "variant": "peer", "config": None}, E_REF]))
    fail = by(rows, backend="test_broken")
    assert len(fail) == 1 and fail[0]["status"] == "fail" and "broken on purpose" in fail[0]["reason"]
    assert {label(r) for r in by(rows, metric="time_ms")} == {"fa4_model[full]", "reference"}
    assert [label(r) for r in by(rows, metric="time_ratio")] == ["reference"]


def test_bad_jobs_raise_one_line_errors():
    with pytest.raises(ValueError, match="baseline='nope'"):
        run(job([E_FULL], baseline={"backend": "nope", "variant": None}))
    with pytest.raises(ValueError, match="not unique"):
        run(job([E_FULL, E_FULL]))
    with pytest.raises(ValueError, match="bench: unknown key"):
        run({**job([E_FULL]), "bench": {"repeat": 3}})


def test_stream_calls_write_rows_of_their_own():
    rows = run({**job([E_FULL, E_REF], repeats=2), "bench": dict(warmup=1, repeats=2, stream_calls=3)})
    timed, ratios = by(rows, metric="stream_time_ms"), by(rows, metric="stream_time_ratio")
    assert len(timed) == 2 and len(ratios) == 1 and not by(rows, metric="time_ms") and not by(rows, metric="time_ratio")
    assert all(r["timer"] == "perf_counter_stream" and r["stream_calls"] == 3 for r in timed)
    assert ratios[0]["baseline"] == "fa4_model[full]" and ratios[0]["value"] > 0
    from analysis.select import attn_times, ratio_rows
    import pandas as pd

    df = pd.DataFrame(rows).assign(gpu_name="fake")  # even as GPU rows, the per-call analysis reads none of them
    assert attn_times(df).empty and ratio_rows(df).empty
    from analysis.targets import stream_as_call_rows

    d = stream_as_call_rows(df)  # python -m analysis.targets --rows ... --stream: the same rows as per-call ones
    assert sorted(d["metric"]) == ["time_ms", "time_ms", "time_ratio"] and len(ratio_rows(d)) == 1


def test_attn_jobs_refuse_stream_calls():
    from experiments.attn_job import run as run_attn

    with pytest.raises(ValueError, match="stream_calls=2: back-to-back timing runs in compare jobs"):
        run_attn({"kind": "attn", "experiment": "t", "backend": "reference", "variant": "peer", "config": None,
                  "shape": SHAPE, "modes": ["fwd"], "check": False, "bench": {"stream_calls": 2}})


def test_group_jobs_makes_one_job_per_shape():
    per_backend = [{"kind": "compare", "experiment": "x", "shape": s, "modes": ["fwd"], "backend": b, "variant": v,
                    "config": None, "ab": {"variant": "full"}}
                   for s in (SHAPE, {**SHAPE, "causal": True}) for b, v in (("fa4", "full"), ("fa4", "tau0"),
                                                                           ("flex", "peer"))]
    jobs = group_jobs(per_backend, "full")
    assert len(jobs) == 2 and all(j["baseline"] == {"backend": "fa4", "variant": "full"} for j in jobs)
    assert [label(e) for e in jobs[0]["entries"]] == ["fa4[full]", "fa4[tau0]", "flex"]
    assert all("ab" not in j and "backend" not in j for j in jobs)


def test_a_compare_sweep_writes_rows_and_resumes(tmp_path):
    from test_sweep import composed

    from experiments.sweep import run_sweep

    cfg = composed("experiment=fwd_ablation", "shape=cpu", "isolation=inline", "progress=false", "bench=quick",
                   f"results_dir={tmp_path}", "experiment.backends=[fa4_model]", "experiment.peers=[reference]",
                   "experiment.sweep_fields=null", "experiment.check=false",
                   "experiment.configs=[{name: full, config: {}}, {name: tau0, config: {rescale_threshold: 0.0}}]",
                   "shape.grid.seqlens=[64]", "shape.grid.causal=[false]")
    out = []

    class W:
        def write(self, s):
            out.append(s)

        def flush(self):
            pass

    assert run_sweep(cfg, out=W()) == 0
    rows = read_rows(tmp_path / "fwd_ablation" / "rows.jsonl")
    ratios = by(rows, metric="time_ratio")
    assert {label(r) for r in ratios} == {"fa4_model[tau0]", "reference"} and all(r["n"] >= 10 for r in ratios)
    assert all(r.get("kernels_hash") and "git_sha" in r for r in rows)
    out.clear()
    assert run_sweep(cfg, out=W()) == 0
    assert "1 already done, running 0" in "".join(out)
