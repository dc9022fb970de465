"""The compile-time experiment (paper Table 4) on the CPU: one fresh process per sample with the caches off."""
import subprocess

import pytest

from experiments import compile_time as ct
from experiments.results import job_key


def test_expand_gives_three_samples_per_kernel_direction_and_head_dim():
    jobs = ct.expand({})
    assert len({job_key(j) for j in jobs}) == len(jobs)
    cells = {}
    for j in jobs:
        cells.setdefault((j["backend"], j["shape"]["hdim"], j["shape"]["causal"], j["mode"]), []).append(j["sample"])
    assert {b for b, *_ in cells} == {"fa4", "fa4_official"} and {m for *_, m in cells} == {"fwd", "bwd"}
    assert {c for _, _, c, _ in cells} == {False, True}
    assert all(sorted(s) == [0, 1, 2] for s in cells.values())
    with pytest.raises(ValueError, match="unknown key"):
        ct.expand({"sample": 3})


def test_each_sample_runs_in_a_fresh_process_with_caches_off():
    jobs = ct.expand(dict(backends=["fa4_model"], hdims=[64], causal=[False], modes=["bwd"], samples=3, seqlen=64,
                          hidden=128))
    rows = [r for j in jobs for r in ct.run({**j, "experiment": "compile_time"})]
    assert [r["metric"] for r in rows] == ["first_call_s", "second_call_s"] * 3
    assert all(r["status"] == "ok" and r["value"] > 0 and r["experiment"] == "compile_time" for r in rows)
    assert len({r["pid"] for r in rows}) == 3  # three processes
    for r in rows:
        assert all(r[f"env_{k}"] == v for k, v in ct.CACHE_OFF.items())
    assert len({r["env_CUTE_DSL_CACHE_DIR"] for r in rows}) == 3  # a fresh DSL cache folder per sample


def test_a_child_that_fails_or_hangs_is_a_fail_row(monkeypatch):
    job = ct.expand(dict(backends=["no_such_backend"], hdims=[64], causal=[False], modes=["fwd"], samples=1))[0]
    (r,) = ct.run(job)
    assert r["status"] == "fail" and r["error_class"] == "crash" and "no_such_backend" in r["reason"]

    def hang(*a, **kw):
        raise subprocess.TimeoutExpired(a[0], kw.get("timeout"))

    monkeypatch.setattr(ct.subprocess, "run", hang)
    (r,) = ct.run({**job, "timeout_s": 5})
    assert r["status"] == "fail" and r["error_class"] == "timeout" and "timeout_s=5" in r["reason"]


def test_the_experiment_is_a_sweep_config():
    from test_sweep import composed

    from experiments.sweep import expand_jobs

    jobs = expand_jobs(composed("experiment=compile_time"))
    assert jobs and all(j["kind"] == "compile_time" and j["experiment"] == "compile_time" for j in jobs)
