"""Sweep driver: experiment expansion, rows with metadata, resume, retry, exit codes, summary, finalize hook."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.results import ResultStore, job_key, read_rows
from experiments.sweep import SweepError, expand_jobs, expand_shapes, expand_variants, run_sweep, summarize

ROOT = Path(__file__).resolve().parents[1]
FINALIZED: list = []


def composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def cpu_sweep(tmp_path, *overrides: str) -> dict:
    """A CPU sweep of the `smoke` kind on the tiny shape grid, rows under tmp_path, run inline."""
    return composed("experiment=fault_cpu", "shape=cpu", "isolation=inline", "progress=false",
                    f"results_dir={tmp_path}", *overrides)


def test_paper_grid_and_fwd_peers_expansion():
    cfg = composed("experiment=fwd_peers")
    shapes = expand_shapes(cfg["shape"])
    assert len(shapes) == 4 * 6 * 2
    assert {(s["hdim"], s["hdim_v"]) for s in shapes} == {(64, 64), (128, 128), (256, 256), (192, 128)}
    assert {s["seqlen_q"] for s in shapes} == {1024, 2048, 4096, 8192, 16384, 32768}
    assert all(s["batch"] * s["seqlen_q"] == 32768 and s["heads"] == 2048 // s["hdim"] for s in shapes)
    jobs = expand_jobs(cfg)
    assert len(jobs) == len(shapes)  # kind compare: one job per shape times fa4 and the 4 peers round-robin
    assert len({job_key(j) for j in jobs}) == len(jobs)
    j = jobs[0]
    assert j["kind"] == "compare" and j["modes"] == ["fwd"] and j["check"] is True
    assert set(j["bench"]) >= {"repeats", "warmup", "flush_l2"}
    assert [e["backend"] for e in j["entries"]] == ["fa4", "fa4_official", "sdpa_cudnn", "sdpa_flash", "flex"]
    assert j["baseline"] == {"backend": "fa4", "variant": "default"}


def test_fwd_ablation_variants():
    from kernels.config import AttnConfig

    cfg = composed("experiment=fwd_ablation")
    variants = dict(expand_variants(cfg["experiment"]))
    for name in ("full", "no_pingpong", "tau0", "no_exp2_emu", "no_speculative_exp", "fa3_like", "fa3_like+pingpong",
                 "fa3_like+pingpong+tau8"):
        assert name in variants
    assert variants["no_speculative_exp"] == {"speculative_exp": False}
    assert variants["fa3_like"] == {"rescale_threshold": 0.0, "exp2_emu_fraction": 0.0, "pingpong": False}
    taus = sorted(v["rescale_threshold"] for n, v in variants.items() if n.startswith("rescale_threshold="))
    assert taus == [0.0, 2.0, 4.0, 8.0, 16.0]
    fracs = sorted(v["exp2_emu_fraction"] for n, v in variants.items() if n.startswith("exp2_emu_fraction="))
    assert fracs == [0.0, 0.125, 0.25, 0.375, 0.5]
    for v in variants.values():
        AttnConfig.from_dict(v)  # every variant is a valid config
    jobs = expand_jobs(cfg)
    assert len(jobs) == 12  # one round-robin job per shape of the hdim 128 grid
    for j in jobs:
        assert [e["variant"] for e in j["entries"] if e["backend"] == "fa4"] == list(variants)
        assert [e["config"] for e in j["entries"] if e["backend"] == "fa4_official"] == [None]


def test_bwd_ablation_variants():
    variants = dict(expand_variants(composed("experiment=bwd_ablation")["experiment"]))
    assert variants["deterministic"] == {"deterministic": True} and variants["two_cta"] == {"two_cta": True}
    assert "deterministic+two_cta" in variants and "exp2_emu_fraction=0.25" in variants


def test_ablations_are_one_round_robin_job_per_shape_with_the_ab_baseline():
    for name in ("fwd_ablation", "bwd_ablation"):
        cfg = composed(f"experiment={name}")
        assert cfg["experiment"]["ab_baseline"] == "full"
        jobs = expand_jobs(cfg)
        assert len(jobs) == len(expand_shapes(cfg["shape"])) and all(j["kind"] == "compare" for j in jobs)
        variants = [e["variant"] for e in jobs[0]["entries"] if e["backend"] == "fa4"]
        assert variants == [n for n, _ in expand_variants(cfg["experiment"])]
        assert jobs[0]["baseline"] == {"backend": "fa4", "variant": "full"}
        assert all("ab" not in j and "ab" not in e for j in jobs for e in j["entries"])
    cfg = composed("experiment=fwd_ablation", "experiment.ab_baseline=no_pingpong")
    assert expand_jobs(cfg)[0]["baseline"] == {"backend": "fa4", "variant": "no_pingpong"}
    with pytest.raises(SweepError, match=r"ab_baseline='nope': not a variant of this experiment; variants: full"):
        expand_jobs(composed("experiment=fwd_ablation", "experiment.ab_baseline=nope"))


def test_ab_baseline_of_attn_jobs_rides_on_the_other_variants_only():
    """kind=attn keeps the older scheme: a job per variant, each timed A/B against the baseline (ab_ratio rows)."""
    cfg = composed("experiment=fwd_ablation", "experiment.kind=attn")
    jobs = expand_jobs(cfg)
    ours = [j for j in jobs if j["backend"] == "fa4"]
    assert {j["variant"] for j in ours if "ab" not in j} == {"full"}  # the baseline is never timed against itself
    others = [j for j in ours if j["variant"] != "full"]
    assert others and all(j["ab"] == {"variant": "full", "config": {}} for j in others)
    assert all("ab" not in j for j in jobs if j["backend"] != "fa4")  # peers take no AttnConfig
    assert len({job_key(j) for j in jobs}) == len(jobs)
    plain = expand_jobs(composed("experiment=fwd_ablation", "experiment.kind=attn", "experiment.ab_baseline=null"))
    assert all("ab" not in j for j in plain)


def test_bad_variant_and_duplicate_names_are_one_line_errors():
    exp = {"configs": [{"name": "x", "config": {"tile_m": 7}}]}
    with pytest.raises(SweepError, match=r"variant 'x': tile_m=7"):
        expand_variants(exp)
    exp = {"configs": [{"name": "a", "config": {}}, {"name": "a", "config": {"pingpong": False}}]}
    with pytest.raises(SweepError, match="appear twice"):
        expand_variants(exp)


def test_unknown_backend_in_experiment_lists_known_ones():
    cfg = composed("experiment=fwd_peers", "experiment.backends=[fa4,nope]")
    with pytest.raises(SweepError, match=r"backend='nope': unknown; known backends: .*fa4_model.*sdpa_flash"):
        expand_jobs(cfg)


def test_sweep_writes_rows_with_metadata_and_resumes(tmp_path):
    cfg = cpu_sweep(tmp_path, "experiment.backends=[reference]")
    out = io.StringIO()
    assert run_sweep(cfg, out=out) == 0
    rows = read_rows(tmp_path / "fault_cpu" / "rows.jsonl")
    assert len(rows) == 4  # 4 shapes x 1 backend
    for r in rows:
        assert r["status"] == "ok" and r["backend"] == "reference" and r["metric"] == "wall_ms" and r["value"] > 0
        for k in ("job_key", "experiment", "time", "git_sha", "torch", "hostname", "seqlen_q", "hdim", "causal",
                  "run_id", "variant"):
            assert k in r, k
    assert len({r["job_key"] for r in rows}) == 4
    out2 = io.StringIO()
    assert run_sweep(cfg, out=out2) == 0
    assert "4 already done, running 0" in out2.getvalue()
    assert read_rows(tmp_path / "fault_cpu" / "rows.jsonl") == rows  # nothing appended


def test_failures_retry_and_fail_on_error(tmp_path):
    cfg = cpu_sweep(tmp_path, "experiment.backends=[reference,fault_compile]", "shape.grid.seqlens=[64]",
                    "shape.grid.causal=[false]")
    out = io.StringIO()
    assert run_sweep(cfg, out=out) == 0  # failures alone do not fail the sweep
    text = out.getvalue()
    assert "failures by error_class" in text and "compile_error" in text
    path = tmp_path / "fault_cpu" / "rows.jsonl"
    rows = read_rows(path)
    fail = [r for r in rows if r["status"] == "fail"]
    assert len(rows) == 2 and len(fail) == 1
    f = fail[0]
    assert f["backend"] == "fault_compile" and f["error_class"] == "compile_error"
    assert "shape and stride must be congruent" in f["reason"]
    assert f["seqlen_q"] == 64 and f["hdim"] == 64 and "config" in f
    # a plain rerun skips the failed job; fail_on_error turns its presence into a non-zero exit
    assert run_sweep({**cfg, "fail_on_error": True}, out=io.StringIO()) == 1
    assert len(read_rows(path)) == 2
    # retry_failed reruns it and replaces its old row (no duplicates)
    out = io.StringIO()
    run_sweep({**cfg, "retry_failed": True}, out=out)
    assert "running 1" in out.getvalue()
    rows2 = read_rows(path)
    assert len(rows2) == 2 and sorted(r["job_key"] for r in rows2) == sorted(r["job_key"] for r in rows)
    assert {r["run_id"] for r in rows2 if r["status"] == "fail"} != {f["run_id"]}


def test_rerun_times_finished_jobs_again_and_replaces_their_rows(tmp_path, monkeypatch):
    """rerun=true (e.g. after a default changed, which the job key cannot see): every job runs again, each job's
    old rows are replaced by its new ones (no duplicates); a plain rerun then skips them all."""
    monkeypatch.chdir(tmp_path)
    cfg = cpu_sweep("rr", "experiment.backends=[reference]", "shape.grid.seqlens=[64,128]", "shape.grid.causal=[false]")
    run_sweep(cfg, out=io.StringIO())
    path = tmp_path / "rr" / "fault_cpu" / "rows.jsonl"
    first = read_rows(path)
    assert len(first) == 2
    out = io.StringIO()
    run_sweep({**cfg, "rerun": True}, out=out)
    assert "rerun=true: timing 2 finished jobs again" in out.getvalue() and "running 2" in out.getvalue()
    again = read_rows(path)
    assert len(again) == 2 and sorted(r["job_key"] for r in again) == sorted(r["job_key"] for r in first)
    assert {r["run_id"] for r in again}.isdisjoint({r["run_id"] for r in first})
    out = io.StringIO()
    run_sweep(cfg, out=out)
    assert "2 already done, running 0" in out.getvalue()


def test_results_dir_is_relative_to_the_launch_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = cpu_sweep("rel_results", "experiment.backends=[reference]", "shape.grid.seqlens=[64]",
                    "shape.grid.causal=[false]")
    run_sweep(cfg, out=io.StringIO())
    assert len(read_rows(tmp_path / "rel_results" / "fault_cpu" / "rows.jsonl")) == 1


def test_summary_counts_and_median_tflops():
    rows = [
        {"job_key": "a", "backend": "fa4", "variant": "default", "status": "ok", "metric": "time_ms", "value": 2.0, "tflops": 300.0,
         "mode": "fwd", "hdim": 128, "hdim_v": 128, "seqlen_q": 4096, "causal": False, "error_class": None},
        {"job_key": "b", "backend": "fa4", "variant": "default", "status": "ok", "metric": "time_ms", "value": 1.2, "tflops": 500.0,
         "mode": "fwd", "hdim": 128, "hdim_v": 128, "seqlen_q": 4096, "causal": False, "error_class": None},
        {"job_key": "c", "backend": "flex", "variant": "peer", "status": "fail", "metric": None, "value": None,
         "mode": "fwd", "hdim": 128, "hdim_v": 128, "seqlen_q": 4096, "causal": True, "error_class": "timeout",
         "reason": "job exceeded job_timeout_s=600"},
    ]
    text = summarize(rows)
    assert "median TFLOP/s" in text and "400.0" in text  # median of 300 and 500
    assert "timeout" in text and "job exceeded" in text


def fake_expand(params: dict) -> list[dict]:
    return [{"kind": "smoke", "backend": "reference", "shape": {"batch": 1, "seqlen_q": n, "seqlen_k": n, "heads": 1,
             "hdim": 64, "hdim_v": 64, "causal": False, "dtype": "bfloat16"}} for n in params["seqlens"]]


def fake_finalize(df, outdir):
    FINALIZED.append((len(df), Path(outdir)))
    return str(Path(outdir) / "figure.png")


def test_expand_and_finalize_hooks(tmp_path):
    FINALIZED.clear()
    cfg = cpu_sweep(tmp_path, "+experiment.expand=test_sweep:fake_expand", "+experiment.finalize=test_sweep:fake_finalize",
                    "+experiment.params.seqlens=[32,64]")
    out = io.StringIO()
    run_sweep(cfg, out=out)
    assert FINALIZED == [(2, tmp_path / "fault_cpu")]
    assert "finalize: wrote" in out.getvalue()
    assert {r["experiment"] for r in read_rows(tmp_path / "fault_cpu" / "rows.jsonl")} == {"fault_cpu"}


def test_store_repairs_torn_and_partial_jobs(tmp_path):
    path = tmp_path / "rows.jsonl"
    good = [{"job_key": "a", "status": "ok", "job_nrows": 1}]
    partial = [{"job_key": "b", "status": "ok", "job_nrows": 2}]  # the second row of job b never made it
    path.write_text("".join(json.dumps(r) + "\n" for r in good + partial) + '{"job_key": "c", "sta')
    store = ResultStore(path)
    assert store.existing_keys() == {"a"}
    store.append_job([{"job_key": "b", "status": "ok"}, {"job_key": "b", "status": "fail"}])
    assert store.failed_keys() == {"b"} and store.is_done("b") and not store.is_done("c")
    rows = read_rows(path)
    assert [r["job_key"] for r in rows] == ["a", "b", "b"] and all(r["job_nrows"] in (1, 2) for r in rows)
    assert path.read_text().endswith("\n")


def test_load_results_flattens_config(tmp_path):
    from analysis.load import load_results

    for exp, cfg in (("e1", {"pingpong": False, "rescale_threshold": 4.0}), ("e2", None)):
        ResultStore(tmp_path / exp / "rows.jsonl").append(
            {"job_key": exp, "experiment": exp, "status": "ok", "config": cfg, "value": 1.0})
    df = load_results(tmp_path)
    assert len(df) == 2 and set(df["experiment"]) == {"e1", "e2"}
    row = df[df["experiment"] == "e1"].iloc[0]
    assert bool(row["config.pingpong"]) is False and row["config.rescale_threshold"] == 4.0
    with pytest.raises(FileNotFoundError, match="neither a rows.jsonl file nor a folder"):
        load_results(tmp_path / "missing")
    assert os.path.basename(df["source"].iloc[0]) == "rows.jsonl"


SHIPPED = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml") if p.stem != "default")


def test_shipped_experiments_found():
    assert {"numerics", "fwd_peers", "bwd_peers", "fwd_ablation", "bwd_ablation", "compile_time"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_experiment_expands(name):
    """Backend names, variants and shapes of every shipped experiment are valid (nothing runs)."""
    jobs = expand_jobs(composed(f"experiment={name}"))
    assert jobs and all(j["experiment"] == name and j["kind"] for j in jobs)
    assert len({job_key(j) for j in jobs}) == len(jobs)


def test_concurrent_writers_lose_nothing(tmp_path):
    """Two processes appending to one store while one of them rewrites it (a retry): every row survives."""
    import multiprocessing as mp

    path = tmp_path / "rows.jsonl"
    ResultStore(path).append_job([{"job_key": "old-fail", "status": "fail"}])
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(path), tag, 200)) for tag in ("p", "q")]
    for p in procs:
        p.start()
    store = ResultStore(path)
    while any(p.is_alive() for p in procs):  # rewrite the file over and over while they append
        store.drop_jobs({"old-fail"})
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = read_rows(path)
    keys = [r["job_key"] for r in rows]
    assert sorted(keys) == sorted(f"{t}{i}" for t in "pq" for i in range(200))


def _append_many(path: str, tag: str, n: int) -> None:
    store = ResultStore(path)
    for i in range(n):
        store.append_job([{"job_key": f"{tag}{i}", "status": "ok"}])


def test_readme_documents_ab_baseline():
    text = (ROOT / "README.md").read_text()
    table_on = text.index("| `fwd_ablation` |")
    near = text[table_on:text.index("## Sweeps: resume")]  # the experiment table and the paragraph below it
    assert "ab_baseline" in near and "time_ratio" in near and "round-robin" in near
