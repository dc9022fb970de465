"""`python run.py tune`: the search space (no invalid candidate, every value pair covered), the winner rule (noise),
the tuned-defaults file (round trip, kernels/config.py override at import, malformed-file errors), a budget that
stops a run and a rerun that resumes it, the lean rows tune stores (what the winner rule reads kept, the rest folded;
the committed rows re-encoded), the final round (finalists, its jobs, the winner taken from it, resumed within the
budget), and the figure from fake rows. CPU only; no timing is faked into a file that the repository keeps."""
from __future__ import annotations

import io
import itertools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.config import AttnConfig, ConfigError, load_tuned, table_defaults
from kernels.tuning import pick_winner, speedup_stats, write_tuned

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:(?s).*validated against ConfigStore schema:UserWarning")


# ---- the search space -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hdim, causal", [(256, False), (128, True)])
def test_candidates_are_valid_distinct_and_cover_every_pair(hdim, causal):
    pytest.importorskip("cutlass")
    from experiments.tune_space import (candidates, default_point, kernel_id, pairs, valid_points, why_invalid)

    valid = valid_points("sm90", hdim, causal, "fwd")
    cands = candidates("sm90", hdim, causal, "fwd", valid)
    base = default_point("sm90", hdim, causal, "fwd")
    assert cands and len(cands) < len(valid)
    ids = [kernel_id(p, "sm90", hdim, causal, "fwd") for p in [base, *cands]]
    assert len(set(ids)) == len(ids)  # no candidate is the default's kernel or another candidate's
    for p in cands:
        assert why_invalid(p, "sm90", hdim, causal, "fwd") is None
        AttnConfig(**p).resolve("sm90", hdim, causal)
    goal = set().union(*(pairs(p) for p in valid))
    covered = set().union(*(pairs(p) for p in [base, *cands]))
    assert goal <= covered
    # the first candidates are the one-field neighbours of the default
    assert all(sum(p[k] != base[k] for k in ("tile_n", "num_stages", "exp2_emu_fraction", "pingpong")) <= 1
               for p in cands[:3])


def test_invalid_points_are_rejected_with_a_reason():
    pytest.importorskip("cutlass")
    from experiments.tune_space import default_point, why_invalid

    base = default_point("sm90", 256, False, "fwd")
    smem = why_invalid({**base, "tile_n": 256, "num_stages": 2}, "sm90", 256, False, "fwd")
    assert smem and ("shared memory" in smem or "registers" in smem)
    regs = why_invalid({**default_point("sm90", 64, False, "fwd"), "tile_n": 256}, "sm90", 64, False, "fwd")
    assert regs and "registers" in regs
    budget = why_invalid({**base, "consumer_regs": 248, "producer_regs": 24}, "sm90", 256, False, "fwd")
    assert budget and "504" in budget
    # 3 warpgroups launch at 168 registers per thread: 32 + 2 x 240 = 512 > 504 made setmaxnreg.inc wait forever
    # (an H200 tune of hd192 hung on it); 24 + 2 x 240 = 504 fits, as does 32 + 3 x 160 = 512 with 4 warpgroups
    assert "504" in (why_invalid({**base, "producer_regs": 32}, "sm90", 256, False, "fwd") or "")
    assert why_invalid(base, "sm90", 256, False, "fwd") is None
    assert why_invalid(default_point("sm90", 64, False, "fwd"), "sm90", 64, False, "fwd") is None


def test_backward_space_is_bwd_tile_m_with_128_only_at_hdim_64_and_80_only_at_hdim_128():
    pytest.importorskip("cutlass")
    from experiments.tune_space import candidates, valid_points

    assert sorted(p["bwd_tile_m"] for p in valid_points("sm90", 64, False, "bwd")) == [64, 128]
    assert sorted(p["bwd_tile_m"] for p in valid_points("sm90", 128, True, "bwd")) == [64, 80]
    d128 = table_defaults("sm90", 128, True, tuned=False)["bwd_tile_m"]
    assert [p["bwd_tile_m"] for p in candidates("sm90", 128, True, "bwd")] == [{64: 80, 80: 64}[d128]]
    d = table_defaults("sm90", 64, False, tuned=False)["bwd_tile_m"]
    assert [p["bwd_tile_m"] for p in candidates("sm90", 64, False, "bwd")] == [{64: 128, 128: 64}[d]]


def test_rescale_before_pv_is_searched_and_its_neighbour_comes_early():
    pytest.importorskip("cutlass")
    from experiments.tune_space import _changed, candidates, default_point, factors, kernel_id, valid_points

    for hdim, causal in ((192, False), (128, True)):
        base = default_point("sm90", hdim, causal, "fwd")
        assert base["rescale_before_pv"] is False  # the table default
        valid = valid_points("sm90", hdim, causal, "fwd")
        assert {p["rescale_before_pv"] for p in valid} == {False, True}
        cands = candidates("sm90", hdim, causal, "fwd", valid)
        on = {**base, "rescale_before_pv": True}
        fb = factors(base)
        n_ofat = next(i for i, p in enumerate(cands) if len(_changed(p, fb)) > 1)
        assert on in cands[:n_ofat]  # a one-field neighbour of the default: measured before the pair cover
        assert kernel_id(on, "sm90", hdim, causal, "fwd") != kernel_id(base, "sm90", hdim, causal, "fwd")
        assert any(p["rescale_before_pv"] and p["pingpong"] is False for p in cands)  # its pairs are covered too


# job keys computed by fa24bdf's code (before rescale_before_pv was searched) for the hd256 non-causal search at 8k
KEYS_BEFORE_THE_FIELD = {"tile_n=64": "e0541569bdc94bf23ce8c22bf598b2bcd13db799",
                         "pingpong=false": "ba32d18d41054abcedea1116a9ddfa543b675d06"}
HD256 = {"tile_m": 128, "tile_n": 80, "num_stages": 2, "consumer_regs": 240, "producer_regs": 24,
         "exp2_emu_fraction": 0.0, "pingpong": True}


def _target256(default: dict, cands: list[dict]) -> dict:
    return {"arch": "sm90", "hdim": 256, "causal": False, "direction": "fwd", "n_valid": 3, "default": default,
            "candidates": cands}


def _final_rows(t, jobs, rows, seqlens, samples: dict, status: dict | None = None) -> list[dict]:
    """Synthetic rows of the final round that tune plans from ``rows`` (one time_ratio row per finalist and job with
    ``samples[variant]``; ``status`` adds a fail row of that variant, e.g. {"default": "fail"})."""
    import experiments.tune as T
    from experiments.results import job_key

    fj = T.final_plan(t, jobs, rows, seqlens)
    assert fj, "the search rows give no final round"
    out = []
    for j in fj:
        assert j["tune"]["final"] is True and j["entries"][0]["variant"] == "default"
        for e in j["entries"][1:]:
            out.append({"job_key": job_key(j), "variant": e["variant"], "metric": "time_ratio", "status": "ok",
                        "samples": samples[e["variant"]], "gpu_name": "NVIDIA H200", "git_sha": "abc",
                        "tune": {"final": True}})
        for v, st in (status or {}).items():
            out.append({"job_key": job_key(j), "variant": v, "metric": "err_out", "status": st,
                        "reason": "err > bound"})
    return out


def test_jobs_of_the_search_before_rescale_before_pv_keep_their_keys(monkeypatch, request):
    import experiments.tune as T
    import kernels.config as C
    from experiments.results import job_key

    if C.TUNED.get(("sm90", 256, False), {}).get("rescale_before_pv") is not None:
        pytest.skip("the repository's tuned file sets rescale_before_pv at hd256: the baseline pins it")
    base = {**HD256, "rescale_before_pv": False}  # default_point holds the field at its table value
    cands = [{**base, "tile_n": 64}, {**base, "pingpong": False}, {**base, "rescale_before_pv": True}]
    t = _target256(base, cands)
    jobs = T.make_jobs(t, T.shapes_for(t, [8192], 32768, 2048), "fa4", {})
    keys = {j["entries"][1]["variant"]: job_key(j) for j in jobs}
    assert {k: keys[k] for k in KEYS_BEFORE_THE_FIELD} == KEYS_BEFORE_THE_FIELD
    assert all("rescale_before_pv" not in j["entries"][0]["config"] for j in jobs)
    assert jobs[2]["entries"][1] == {"backend": "fa4", "variant": "rescale_before_pv=true",
                                     "config": {**HD256, "rescale_before_pv": True}}
    # where conf/tuned/ sets it, the baseline keeps the table's False explicit (the search never runs its own output)
    monkeypatch.setattr(C, "TUNED", {("sm90", 256, False): {"rescale_before_pv": True}})
    C.resolve_cached.cache_clear()
    request.addfinalizer(C.resolve_cached.cache_clear)
    tuned = T.make_jobs(t, T.shapes_for(t, [8192], 32768, 2048), "fa4", {})
    assert all(j["entries"][0]["config"]["rescale_before_pv"] is False for j in tuned)
    assert tuned[0]["entries"][1]["config"]["rescale_before_pv"] is False
    assert "rescale_before_pv" not in tuned[2]["entries"][1]["config"]  # True is what leaving it out resolves to


def test_a_rescale_before_pv_winner_is_written_and_resolves(tmp_path, monkeypatch, request):
    import experiments.tune as T
    import kernels.config as C
    from experiments.results import job_key

    base = {**HD256, "rescale_before_pv": False}
    t = _target256(base, [{**base, "rescale_before_pv": True}])
    jobs = T.make_jobs(t, T.shapes_for(t, [8192], 32768, 2048), "fa4", {})
    rows = [{"job_key": job_key(jobs[0]), "variant": "rescale_before_pv=true", "metric": "time_ratio", "status": "ok",
             "samples": [1 / 1.05] * 10, "gpu_name": "NVIDIA H200", "git_sha": "abc"}]
    rows += _final_rows(t, jobs, rows, [8192], {"rescale_before_pv=true": [1 / 1.05] * 20})
    out = io.StringIO()
    T._report([(t, jobs)], rows, [8192], tmp_path / "rows.jsonl", "cuda", "fa4", {"tune": {"write": True}}, out,
              tmp_path / "tuned")
    got = load_tuned(tmp_path / "tuned" / "sm90.yaml")
    assert got == {("sm90", 256, False): {k: v for k, v in HD256.items() if k != "pingpong"} | {"rescale_before_pv": True}}
    monkeypatch.setattr(C, "TUNED", got)
    C.resolve_cached.cache_clear()
    request.addfinalizer(C.resolve_cached.cache_clear)
    assert AttnConfig().resolve("sm90", 256, False).rescale_before_pv is True
    assert AttnConfig().resolve("sm90", 256, True).rescale_before_pv is False
    assert AttnConfig(rescale_before_pv=False).resolve("sm90", 256, False).rescale_before_pv is False


# ---- the winner rule --------------------------------------------------------------------------------------------
def test_speedup_stats_and_the_noise_rule():
    clean = speedup_stats([1 / 1.03] * 8 + [1 / 1.01] * 2)  # t_cand / t_default per round
    assert clean["beats"] and clean["p20"] > 1 and abs(clean["median"] - 1.03) < 1e-9
    noisy = speedup_stats([1 / 1.10] * 6 + [1 / 0.9] * 4)  # faster in the median, slower in 4 rounds of 10
    assert noisy["median"] > 1 and not noisy["beats"]
    assert speedup_stats([]) is None and speedup_stats([0.0, None]) is None


def _cand(name, per_seqlen, ok=True, **cfg):
    return {"name": name, "ok": ok, "config": cfg, "stats": {s: speedup_stats(v) for s, v in per_seqlen.items()}}


def test_pick_winner_needs_every_seqlen_beyond_noise_and_correctness():
    fast, faster = [1 / 1.04] * 10, [1 / 1.08] * 10
    noisy = [1 / 1.2] * 6 + [1 / 0.8] * 4
    cands = [_cand("a", {8192: fast, 16384: fast}),
             _cand("b", {8192: faster, 16384: noisy}),  # noise at 16k: not a winner
             _cand("c", {8192: faster, 16384: faster}, ok=False),  # failed its check
             _cand("d", {8192: faster}),  # 16k missing
             _cand("e", {8192: [1 / 1.05] * 10, 16384: [1 / 1.05] * 10})]
    w = pick_winner(cands, [8192, 16384])
    assert w["name"] == "e" and abs(w["score"] - 1.05) < 1e-9
    assert pick_winner(cands[1:4], [8192, 16384]) is None
    assert pick_winner([_cand("slow", {8192: [1.02] * 10})], [8192]) is None


# ---- the tuned file ---------------------------------------------------------------------------------------------
ENTRY = {"hdim": 128, "causal": True, "direction": "fwd",
         "config": {"tile_m": 128, "tile_n": 176, "num_stages": 2, "consumer_regs": 240, "producer_regs": 24,
                    "exp2_emu_fraction": 0.0},
         "evidence": {"candidate": "tile_n=176", "speedup_p20": {8192: 1.01}}}


def test_yaml_round_trip_and_resolve_override(tmp_path, monkeypatch, request):
    import kernels.config as C

    p = write_tuned(tmp_path / "sm90.yaml", "sm90", [ENTRY, {**ENTRY, "direction": "bwd", "config": {"bwd_tile_m": 64},
                                                            "hdim": 64, "causal": False}])
    text = p.read_text()
    assert text.startswith("# Tuned defaults for sm90") and "evidence" in text
    got = load_tuned(p)
    assert got == {("sm90", 128, True): ENTRY["config"], ("sm90", 64, False): {"bwd_tile_m": 64}}
    monkeypatch.setattr(C, "TUNED", got)
    if hasattr(C, "resolve_cached"):  # nothing memoised under the patched table outlives this test
        C.resolve_cached.cache_clear()
        request.addfinalizer(C.resolve_cached.cache_clear)
    r = AttnConfig().resolve("sm90", 128, True)
    assert r.tile_n == 176 and AttnConfig().resolve("sm90", 128, False).tile_n == table_defaults("sm90", 128, False,
                                                                                                 tuned=False)["tile_n"]
    assert AttnConfig(tile_n=64).resolve("sm90", 128, True).tile_n == 64  # an explicit field still wins
    assert AttnConfig().resolve("sm90", 64, False).bwd_tile_m == 64
    assert table_defaults("sm90", 128, True)["tile_n"] == 176
    # a finished search with no winner removes its old entry; the other entry stays
    write_tuned(p, "sm90", [], replace=[(128, True, "fwd")])
    assert load_tuned(p) == {("sm90", 64, False): {"bwd_tile_m": 64}}


@pytest.mark.parametrize("text, needle", [
    ("arch: sm90\nentries:\n  - {hdim: 128, causal: false, direction: fwd, config: {tile_n: 100}}\n",
     "entries[0].config.tile_n"),
    ("arch: sm90\nentries:\n  - {hdim: 96, causal: false, direction: fwd, config: {tile_n: 128}}\n", "entries[0].hdim"),
    ("arch: sm90\nentries:\n  - {hdim: 128, causal: 1, direction: fwd, config: {tile_n: 128}}\n", "entries[0].causal"),
    ("arch: sm90\nentries:\n  - {hdim: 128, causal: false, direction: fwd, config: {bwd_tile_m: 64}}\n",
     "entries[0].config.bwd_tile_m"),
    ("arch: sm90\nentries:\n  - {hdim: 128, causal: false, direction: up, config: {tile_n: 128}}\n",
     "entries[0].direction"),
    ("arch: sm90\nentries:\n  - {hdim: 128, causal: false, direction: fwd, config: {tile_n: 128}, note: x}\n",
     "entries[0].note"),
    ("arch: sm100\nentries: []\n", "arch"),
    ("arch: sm90\nentries: {hdim: 128}\n", "entries"),
    ("arch: sm90\nentries: [\n", "(file)"),
    ("arch: sm90\nentries:\n  - {hdim: 128, causal: false, direction: fwd, config: {tile_n: 128}}\n"
     "  - {hdim: 128, causal: false, direction: fwd, config: {tile_n: 64}}\n", "entries[1]"),
])
def test_malformed_file_names_the_file_and_the_key(tmp_path, text, needle):
    p = tmp_path / "sm90.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_tuned(p)
    msg = str(e.value)
    assert str(p) in msg and needle in msg and "\n" not in msg


def _config_copy(tmp_path: Path, tuned_text: str | None) -> Path:
    """kernels/config.py in a scratch tree with its own conf/tuned/ (the repository's conf/tuned is never touched)."""
    (tmp_path / "kernels").mkdir(parents=True)
    (tmp_path / "kernels" / "__init__.py").write_text("")
    shutil.copy(ROOT / "kernels" / "config.py", tmp_path / "kernels" / "config.py")
    if tuned_text is not None:
        (tmp_path / "conf" / "tuned").mkdir(parents=True)
        (tmp_path / "conf" / "tuned" / "sm90.yaml").write_text(tuned_text)
    return tmp_path


def _resolve_in(tree: Path) -> subprocess.CompletedProcess:
    code = ("import kernels.config as c; r = c.AttnConfig().resolve('sm90', 128, True); "
            "print(r.tile_n, c.AttnConfig().resolve('sm90', 128, False).tile_n)")
    return subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)


def test_config_reads_the_tuned_file_at_import(tmp_path):
    import yaml

    table = table_defaults("sm90", 128, False, tuned=False)["tile_n"]
    none = _resolve_in(_config_copy(tmp_path / "a", None))
    assert none.returncode == 0 and none.stdout.split() == [str(table), str(table)]
    good = _resolve_in(_config_copy(tmp_path / "b", yaml.safe_dump({"arch": "sm90", "entries": [ENTRY]})))
    assert good.returncode == 0, good.stderr
    assert good.stdout.split() == ["176", str(table)]
    bad = _resolve_in(_config_copy(tmp_path / "c", "arch: sm90\nentries:\n  - {hdim: 128, causal: true, "
                                                   "direction: fwd, config: {num_stages: 9}}\n"))
    assert bad.returncode != 0
    last = bad.stderr.strip().splitlines()[-1]
    assert "ConfigError" in last and "sm90.yaml" in last and "entries[0].config.num_stages" in last


def test_repository_tuned_folder_has_no_made_up_winners():
    for p in (ROOT / "conf" / "tuned").glob("*.yaml"):
        for (arch, hdim, causal), cfg in load_tuned(p).items():
            assert cfg  # a committed file must come from `run.py tune` rows (evidence.rows names them)


# ---- the command: dry run, budget, resume -----------------------------------------------------------------------
def test_dry_run_lists_candidates_and_estimate(capsys):
    import run

    assert run.main(["tune", "hdim=256", "causal=false", "dry_run=true", "progress=false"]) == 0
    out = capsys.readouterr().out
    assert "candidates, fwd hdim 256 non-causal" in out and "estimated" in out and "budget" in out
    assert "1. " in out


@pytest.mark.parametrize("argv, needle", [
    (["tune", "hdim=96"], "hdim=96"), (["tune", "direction=up"], "direction"), (["tune", "budget=-1"], "budget"),
    (["tune", "arch=sm100"], "arch=sm100"), (["tune", "backend=sdpa_flash"], "backend"),
    (["tune", "direction=bwd", "hdim=256"], "hdim=256"), (["tune", "seqlens=[0]"], "seqlens"),
])
def test_bad_tune_arguments_are_one_line(capsys, argv, needle):
    import run

    with pytest.raises(SystemExit) as e:
        run.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err


def _model_cfg(tmp_path, budget):
    return {"cmd": "tune", "backend": {"name": "fa4_model", "config": None}, "arch": "sm90", "hdim": 256,
            "causal": False, "direction": "fwd", "seqlens": [64], "budget": budget, "dry_run": False,
            "tune": {"tokens": 64, "hidden": 256, "write": True}, "bench": {"warmup": 1, "repeats": 3, "flush_l2": False},
            "isolation": "inline", "job_timeout_s": 120, "results_dir": str(tmp_path)}


def test_budget_stops_cleanly_and_a_rerun_resumes(tmp_path, monkeypatch):
    import experiments.tune as T
    from experiments.results import read_rows

    real = T.candidates
    monkeypatch.setattr(T, "candidates", lambda *a, **k: real(*a, **k)[:3])
    monkeypatch.setattr(T, "TUNE_BENCH", dict(settle_s=0.0, min_rounds=3))
    ticks = itertools.count(0, 5)  # every reading of the budget clock is 5 s later: each job "takes" 5 s
    monkeypatch.setattr(T, "_clock", lambda: float(next(ticks)))
    tuned = tmp_path / "tuned"
    out = io.StringIO()
    assert T.run_tune(_model_cfg(tmp_path, 28), out=out, tuned_dir=tuned) == 0
    text = out.getvalue()
    assert "ran 2 jobs, 1 remain; rerun the same command to resume" in text
    assert "1 of 3 jobs remain" in text
    rows = read_rows(tmp_path / "tune" / "rows.jsonl")
    assert len({r["job_key"] for r in rows}) == 2
    ticks2 = itertools.count(0, 5)
    monkeypatch.setattr(T, "_clock", lambda: float(next(ticks2)))
    out = io.StringIO()
    assert T.run_tune(_model_cfg(tmp_path, 28), out=out, tuned_dir=tuned) == 0
    text = out.getvalue()
    assert "none remain" in text and "complete" in text
    rows = read_rows(tmp_path / "tune" / "rows.jsonl")
    keys = [r["job_key"] for r in rows if r.get("metric") == "time_ratio" and not r["tune"].get("final")]
    assert len(keys) == len(set(keys)) == 3  # each candidate once, nothing repeated
    final = [r for r in rows if r["tune"].get("final")]  # the model's finalists (if any) were re-timed in the budget
    assert len({r["job_key"] for r in final}) <= 1 and all(r["tune"]["lean"] for r in rows)
    assert all(r.get("gpu_name") is None and r["backend"] == "fa4_model" for r in rows)
    assert "not writing" in text and not tuned.exists()  # model timings never become tuned defaults
    out = io.StringIO()
    assert T.run_tune(_model_cfg(tmp_path, 28), out=out, tuned_dir=tuned) == 0
    assert "every job already has rows" in out.getvalue()


def test_a_complete_gpu_search_writes_its_winner(tmp_path):
    """_report on rows as a GPU run of fa4 leaves them (synthetic, in tmp only): the winner goes to the tuned file."""
    import experiments.tune as T
    from experiments.results import job_key

    t = {"arch": "sm90", "hdim": 256, "causal": False, "direction": "fwd", "n_valid": 3,
         "default": {"tile_m": 128, "tile_n": 80, "num_stages": 2, "consumer_regs": 240, "producer_regs": 24,
                     "exp2_emu_fraction": 0.0, "pingpong": True},
         "candidates": [{"tile_m": 128, "tile_n": 64, "num_stages": 2, "consumer_regs": 240, "producer_regs": 24,
                         "exp2_emu_fraction": 0.0, "pingpong": True},
                        {"tile_m": 128, "tile_n": 80, "num_stages": 2, "consumer_regs": 240, "producer_regs": 24,
                         "exp2_emu_fraction": 0.0, "pingpong": False}]}
    shapes = T.shapes_for(t, [8192], 32768, 2048)
    jobs = T.make_jobs(t, shapes, "fa4", {"warmup": 1, "repeats": 10, "flush_l2": True})
    samples = {0: [1 / 1.04] * 10, 1: [1 / 1.2] * 10}  # the pingpong-off candidate is faster but not a table field
    rows = []
    for i, j in enumerate(jobs):
        v = j["entries"][1]["variant"]
        rows += [{"job_key": job_key(j), "variant": v, "metric": "time_ratio", "status": "ok", "samples": samples[i],
                  "gpu_name": "NVIDIA H200", "git_sha": "abc"},
                 {"job_key": job_key(j), "variant": "default", "metric": "time_ms", "status": "ok"}]
    out = io.StringIO()
    T._report([(t, jobs)], rows, [8192], tmp_path / "rows.jsonl", "cuda", "fa4", {"tune": {"write": True}}, out,
              tmp_path / "tuned")
    assert "final round (the default + tile_n=64): 1 of 1 jobs remain" in out.getvalue()  # pingpong off: no finalist
    assert not (tmp_path / "tuned").exists()  # nothing written before the final round
    rows += _final_rows(t, jobs, rows, [8192], {"tile_n=64": [1 / 1.04] * 20})
    out = io.StringIO()
    T._report([(t, jobs)], rows, [8192], tmp_path / "rows.jsonl", "cuda", "fa4", {"tune": {"write": True}}, out,
              tmp_path / "tuned")
    got = load_tuned(tmp_path / "tuned" / "sm90.yaml")
    assert got == {("sm90", 256, False): {k: v for k, v in t["candidates"][0].items() if k != "pingpong"}}
    assert "winner tile_n=64" in out.getvalue()
    import yaml

    from kernels.config import table_context
    ev = yaml.safe_load((tmp_path / "tuned" / "sm90.yaml").read_text())["entries"][0]["evidence"]
    assert ev["table_context"] == table_context("sm90", 256, False, "fwd")  # what makes it stale once the table moves


# ---- the figure -------------------------------------------------------------------------------------------------
def test_tune_figure_from_fake_rows(tmp_path):
    pd = pytest.importorskip("pandas")
    from analysis.tune_figs import tune_figure, tune_speedups, winners

    rows = []
    for hdim, causal in ((64, False), (128, True)):
        for i, (v, r) in enumerate((("tile_n=64", 1 / 1.05), ("num_stages=3", 1.02), ("tile_n=176", 1 / 1.01))):
            for s in (8192, 16384):
                key = f"{hdim}{causal}{v}{s}"
                noisy = [r] * 7 + [r * 1.3] * 3 if v == "tile_n=176" else [r] * 10
                rows.append(dict(experiment="tune", metric="time_ratio", status="ok", variant=v, samples=noisy,
                                 job_key=key, mode="fwd", hdim=hdim, causal=causal, seqlen_q=s, config={"tile_n": 64},
                                 tune={"candidate": i}, gpu_name=None, time="2026-11-30T00:00:00+00:00", value=r))
    df = pd.DataFrame(rows)
    s = tune_speedups(df)
    assert len(s) == 12
    w = winners(s)
    assert list(w["winner"]) == ["tile_n=64", "tile_n=64"]
    out, msg = tune_figure(df, tmp_path)
    assert out is not None and out.exists() and out.stat().st_size > 10_000 and "2 panels" in msg
    assert tune_figure(pd.DataFrame(), tmp_path)[0] is None


def test_winners_of_no_rows_is_empty():
    pd = pytest.importorskip("pandas")
    from analysis.tune_figs import tune_speedups, winners

    assert winners(tune_speedups(pd.DataFrame())).empty


# ---- lean rows --------------------------------------------------------------------------------------------------
CFG = {"tile_m": 128, "tile_n": 64, "exp2_emu_fraction": 0.125, "rescale_threshold": 8.0}
META = {"experiment": "tune", "kind": "attn", "backend": "fa4", "mode": "fwd", "hdim": 256, "causal": False,
        "seqlen_q": 8192, "config": CFG, "resolved_config": CFG, "gpu_name": "NVIDIA H200", "job_key": "k1",
        "run_id": "r1", "power_w_after": 375.659123, "tune": {"arch": "sm90", "direction": "fwd", "candidate": 0}}


def _compare_rows(fail_lse: bool = False) -> list[dict]:
    """The rows experiments/compare_job.py writes for one tune job (two entries), stamped, with their metadata."""
    import random

    rnd = random.Random(0)
    t = {v: [1.3 + rnd.random() * 0.2 for _ in range(50)] for v in ("default", "tile_n=64")}
    rows = []
    for v in ("default", "tile_n=64"):
        m = dict(META, variant=v)
        rows += [dict(m, metric="first_call_s", value=2.31234567, status="ok"),
                 dict(m, metric="second_call_s", value=0.00123456789, status="ok"),
                 dict(m, metric="err_out", value=0.0074374675, bound=0.0653233528, pt_err=0.0189, atol=0.0275,
                      passed=True, status="ok", check_seed=35678),
                 dict(m, metric="err_lse", value=0.3 if fail_lse and v != "default" else 1e-6, bound=0.1,
                      passed=not (fail_lse and v != "default"), check_seed=35678,
                      status="fail" if fail_lse and v != "default" else "ok",
                      reason="err 0.3 > bound 0.1" if fail_lse and v != "default" else None)]
    for v in ("default", "tile_n=64"):
        rows.append(dict(META, variant=v, metric="time_ms", value=1.357919991016388, status="ok", p20=1.28182399,
                         times_ms=t[v], round_throttled=[True] * 50, flops=859098316800.0, n=50))
    samples = [a / b for a, b in zip(t["tile_n=64"], t["default"])]
    rows.append(dict(META, variant="tile_n=64", metric="time_ratio", value=sorted(samples)[25], status="ok",
                     samples=samples, n=50))
    return rows


def test_lean_rows_keep_what_the_winner_rule_reads_and_fold_the_rest():
    import json

    import experiments.tune as T

    raw = _compare_rows()
    lean = T.lean_rows(raw)
    assert [(r["metric"], r["variant"]) for r in lean] == [("time_ms", "default"), ("time_ms", "tile_n=64"),
                                                           ("time_ratio", "tile_n=64")]
    assert all("times_ms" not in r and r["tune"] == {**META["tune"], "lean": True} for r in lean)
    for r in lean[:2]:
        assert r["first_call_s"] == pytest.approx(2.31234567, rel=1e-5) and r["second_call_s"] > 0
        assert r["check"]["seed"] == 35678 and set(r["check"]) == {"seed", "err_out", "err_lse"}
        assert r["check"]["err_out"] == {"value": 0.00743747, "bound": 0.0653234}
        assert r["round_throttled"] == [True] * 50 and r["flops"] == 859098316800.0  # whole numbers stay exact
        assert r["config"] == CFG and r["power_w_after"] == 375.659
    ratio = raw[-1]
    assert lean[2]["samples"] == pytest.approx(ratio["samples"], rel=1e-5) and len(lean[2]["samples"]) == 50
    a, b = speedup_stats(ratio["samples"]), speedup_stats(lean[2]["samples"])
    assert all(abs(a[k] - b[k]) < 1e-5 for k in ("median", "p20", "p80")) and a["n"] == b["n"]
    size = lambda rows: len("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))  # noqa: E731
    assert size(lean) < size(raw) / 2
    # a failed check stays a whole row (the winner rule sees it), the rest still folds
    bad = T.lean_rows(_compare_rows(fail_lse=True))
    fail = [r for r in bad if r["status"] != "ok"]
    assert len(bad) == 4 and len(fail) == 1 and fail[0]["metric"] == "err_lse" and fail[0]["reason"]
    timed = {r["variant"]: r for r in bad if r["metric"] == "time_ms"}
    assert set(timed["tile_n=64"]["check"]) == {"seed", "err_out"} and len(timed["default"]["check"]) == 3
    # an entry without an ok time_ms row keeps its rows as they were
    untimed = [r for r in _compare_rows() if not (r["metric"] == "time_ms" and r["variant"] == "tile_n=64")]
    kept = T.lean_rows(untimed)
    assert {r["metric"] for r in kept if r["variant"] == "tile_n=64"} == {"first_call_s", "second_call_s", "err_out",
                                                                          "err_lse", "time_ratio"}


def _committed_tune_rows() -> list[dict]:
    from experiments.results import read_rows

    rows = read_rows(ROOT / "results" / "h200" / "tune" / "rows.jsonl")
    if not rows:
        pytest.skip("no committed tune rows")
    return rows


def test_lean_rows_of_the_committed_search_are_less_than_half_its_bytes():
    """The committed H200 rows (written before lean rows), each job re-encoded as tune writes it now: under half the
    compressed bytes, and every candidate's speedup statistics unchanged."""
    import gzip
    import json
    from collections import defaultdict

    import experiments.tune as T

    raw = [r for r in _committed_tune_rows() if not (r.get("tune") or {}).get("lean")]
    jobs = defaultdict(list)
    for r in raw:
        jobs[(r["job_key"], r.get("run_id"))].append(r)
    lean = [r for rs in jobs.values() for r in T.lean_rows(rs)]
    gz = lambda rows: len(gzip.compress("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode(),  # noqa
                                        9, mtime=0))
    assert gz(lean) < 0.5 * gz(raw)
    assert len(lean) < 0.3 * len(raw)
    assert not any("times_ms" in r for r in lean)
    assert not {r["metric"] for r in lean if r["status"] == "ok"} - {"time_ms", "time_ratio"}
    stats = lambda rows: {(r["job_key"], r["variant"]): speedup_stats(r["samples"]) for r in rows  # noqa: E731
                          if r["metric"] == "time_ratio" and r["status"] == "ok"}
    before, after = stats(raw), stats(lean)
    assert before.keys() == after.keys() and before
    for k, a in before.items():
        assert all(abs(a[q] - after[k][q]) < 1e-5 for q in ("median", "p20", "p80")) and a["beats"] == after[k]["beats"]


def test_committed_rows_still_draw():
    pd = pytest.importorskip("pandas")
    from analysis.tune_figs import tune_speedups, winners

    s = tune_speedups(pd.DataFrame(_committed_tune_rows()))
    assert not s.empty and "final" in s
    w = winners(s)
    assert len(w) >= 2 and set(w["round"]) <= {"search", "final"}
    no_final = {k for k, p in s.groupby(["mode", "hdim", "causal"]) if not p["final"].any()}
    assert all(r["round"] == "search" for _, r in w.iterrows() if (r["mode"], r["hdim"], r["causal"]) in no_final)


def test_a_prior_compile_time_is_read_from_lean_rows(tmp_path):
    import experiments.tune as T
    from experiments.results import ResultStore

    ResultStore(tmp_path / "h200" / "tune" / "rows.jsonl").append_job(T.lean_rows(_compare_rows()))
    got, src = T.prior_compile_s(tmp_path)
    assert got == pytest.approx(2.31234567, rel=1e-5) and "2 committed rows" in src


# ---- the final round --------------------------------------------------------------------------------------------
def test_finalists_are_correct_writable_and_faster_in_the_median_best_first():
    import experiments.tune as T

    f = lambda x: [1 / x] * 10  # noqa: E731
    noisy = [1 / 1.08] * 7 + [1 / 0.99] * 3  # median 1.08, p20 0.99
    res = [_cand("a", {8192: f(1.05), 16384: f(1.05)}),
           _cand("b", {8192: noisy, 16384: f(1.06)}),
           _cand("c", {8192: f(1.2), 16384: f(1.2)}, pingpong=False),  # not a table field
           _cand("d", {8192: f(1.2), 16384: f(1.2)}, ok=False),  # failed its check
           _cand("e", {8192: f(1.3), 16384: f(0.99)}),  # slower at 16k
           _cand("f", {8192: f(1.01), 16384: f(1.01)}),
           _cand("g", {8192: f(1.02), 16384: f(1.02)}),
           _cand("h", {8192: f(1.5)})]  # 16k missing
    names = lambda cs: [c["name"] for c in cs]  # noqa: E731
    assert speedup_stats(noisy)["p20"] < 1 < speedup_stats(noisy)["median"]
    assert names(T.finalists(res, [8192, 16384])) == ["b", "a", "g"]
    assert names(T.finalists(res, [8192, 16384], 1)) == ["b"] and T.finalists(res, [8192, 16384], 0) == []
    assert names(T.finalists(res, [8192], 5)) == ["h", "e", "b", "a", "g"]


def _search(seqlens, per_variant: dict) -> tuple[dict, list[dict], list[dict]]:
    """A hd256 search of three candidates (tile_n=64, rescale_before_pv=true, pingpong=false) and its rows, each
    candidate's time_ratio samples from ``per_variant[variant][seqlen]``."""
    import experiments.tune as T
    from experiments.results import job_key

    base = {**HD256, "rescale_before_pv": False}
    t = _target256(base, [{**base, "tile_n": 64}, {**base, "rescale_before_pv": True}, {**base, "pingpong": False}])
    jobs = T.make_jobs(t, T.shapes_for(t, seqlens, 32768, 2048), "fa4", {"warmup": 5, "repeats": 50})
    rows = []
    for j in jobs:
        v = j["entries"][1]["variant"]
        rows += [{"job_key": job_key(j), "variant": v, "metric": "time_ratio", "status": "ok",
                  "gpu_name": "NVIDIA H200", "git_sha": "abc", "samples": per_variant[v][j["shape"]["seqlen_q"]],
                  "tune": {"candidate": 0}},
                 {"job_key": job_key(j), "variant": "default", "metric": "time_ms", "status": "ok"}]
    return t, jobs, rows


TILE, PREPV, PPOFF = "tile_n=64", "rescale_before_pv=true", "pingpong=false"
# the H200's (192, 128) non-causal search in miniature: the tile beats the default in its own jobs (p20 > 1), the
# table tile with rescale_before_pv is as fast in the median but its 8k job's p20 is 0.997; pingpong off is faster
SEARCH = {TILE: {8192: [1 / 1.052] * 8 + [1 / 0.995] * 2, 16384: [1 / 1.055] * 10},
          PREPV: {8192: [1 / 1.053] * 7 + [1 / 0.997] * 3, 16384: [1 / 1.056] * 10},
          PPOFF: {8192: [1 / 1.2] * 10, 16384: [1 / 1.2] * 10}}


def test_final_round_jobs_follow_from_the_search_rows():
    import experiments.tune as T
    from experiments.results import job_key

    t, jobs, rows = _search([8192, 16384], SEARCH)
    assert T.final_plan(t, jobs, rows[:-2], [8192, 16384]) is None  # a search job without rows: not known yet
    fj = T.final_plan(t, jobs, rows, [8192, 16384])
    assert [j["shape"]["seqlen_q"] for j in fj] == [8192, 16384]
    by_variant = {j["entries"][1]["variant"]: j["entries"][1] for j in jobs}
    for j, s in zip(fj, jobs[:2]):
        assert j["tune"] == {"arch": "sm90", "direction": "fwd", "final": True}
        assert j["entries"] == [s["entries"][0], by_variant[PREPV], by_variant[TILE]]  # best median first
        assert j["bench"]["repeats"] == 100 and j["bench"]["min_rounds"] == 2 * T.TUNE_BENCH["min_rounds"]
        assert j["baseline"] == {"backend": "fa4", "variant": "default"} and j["shape"] == s["shape"]
    keys = [job_key(j) for j in fj]
    assert not set(keys) & {job_key(j) for j in jobs}
    assert keys == [job_key(j) for j in T.final_plan(t, jobs, list(reversed(rows)), [8192, 16384])]  # a rerun: same
    assert T.final_plan(t, jobs, rows, [8192, 16384], 0) == []
    assert T.final_plan(t, jobs, rows, [8192, 16384], 1)[0]["entries"][1:] == [by_variant[PREPV]]


def _report_text(t, jobs, rows, tmp_path, **tune) -> str:
    import experiments.tune as T

    out = io.StringIO()
    T._report([(t, jobs)], rows, [8192, 16384], tmp_path / "rows.jsonl", "cuda", "fa4",
              {"tune": {"write": True, **tune}}, out, tmp_path / "tuned")
    return out.getvalue()


def test_the_final_round_decides_the_winner(tmp_path):
    t, jobs, rows = _search([8192, 16384], SEARCH)
    # the search-only rule (finalists=0, the rule before the final round) takes the tile
    text = _report_text(t, jobs, rows, tmp_path / "a", finalists=0)
    assert "winner tile_n=64" in text
    assert load_tuned(tmp_path / "a" / "tuned" / "sm90.yaml")[("sm90", 256, False)]["tile_n"] == 64
    # with the final round nothing is written until it has rows
    text = _report_text(t, jobs, rows, tmp_path / "b")
    assert "final round (the default + rescale_before_pv=true, tile_n=64): 2 of 2 jobs remain" in text
    assert not (tmp_path / "b" / "tuned").exists()
    # timed together, the tile is 1.01x with p20 0.99 at 16k; rescale_before_pv beats the default at both lengths
    final = {PREPV: [1 / 1.012] * 16 + [1 / 1.003] * 4, TILE: [1 / 1.016] * 14 + [1 / 0.99] * 6}
    rows_f = rows + _final_rows(t, jobs, rows, [8192, 16384], final)
    text = _report_text(t, jobs, rows_f, tmp_path / "b")
    assert "winner rescale_before_pv=true (final round" in text and "final round: tile_n=64: s8192: 1.016x" in text
    got = load_tuned(tmp_path / "b" / "tuned" / "sm90.yaml")
    table = {k: v for k, v in HD256.items() if k != "pingpong"}
    assert got == {("sm90", 256, False): table | {"rescale_before_pv": True}}
    import yaml

    ev = yaml.safe_load((tmp_path / "b" / "tuned" / "sm90.yaml").read_text())["entries"][0]["evidence"]
    assert ev["candidate"] == PREPV and ev["rounds"] == {8192: 20, 16384: 20} and ev["candidates"] == 3
    assert ev["speedup_p20"][8192] > 1 and ev["final_round"]["entries"] == ["default", PREPV, TILE]
    assert ev["final_round"]["search_speedup_p20"][8192] < 1  # what the search alone had held against it


def test_a_final_round_without_a_winner_keeps_the_table_and_clears_an_old_entry(tmp_path):
    t, jobs, rows = _search([8192, 16384], SEARCH)
    write_tuned(tmp_path / "tuned" / "sm90.yaml", "sm90", [{**ENTRY, "hdim": 256, "causal": False}, ENTRY])
    final = {PREPV: [1 / 1.01] * 12 + [1 / 0.98] * 8, TILE: [1 / 1.0] * 20}
    text = _report_text(t, jobs, rows + _final_rows(t, jobs, rows, [8192, 16384], final), tmp_path)
    assert "no finalist beat the default beyond the noise in the final round" in text and "the default stays" in text
    assert list(load_tuned(tmp_path / "tuned" / "sm90.yaml")) == [("sm90", 128, True)]
    # no candidate faster in the median: no final round at all, the default stays
    slow = {v: {8192: [1.01] * 10, 16384: [1.01] * 10} for v in SEARCH}
    t2, jobs2, rows2 = _search([8192, 16384], slow)
    text = _report_text(t2, jobs2, rows2, tmp_path / "c")
    assert "no candidate was faster than the default in the median" in text
    assert load_tuned(tmp_path / "c" / "tuned" / "sm90.yaml") == {}


def test_a_failed_row_in_the_final_round_counts_against_its_own_candidate_or_all(tmp_path):
    t, jobs, rows = _search([8192, 16384], SEARCH)
    final = {PREPV: [1 / 1.05] * 20, TILE: [1 / 1.03] * 20}
    mine = rows + _final_rows(t, jobs, rows, [8192, 16384], final, status={PREPV: "fail"})
    text = _report_text(t, jobs, mine, tmp_path / "a")
    assert "winner tile_n=64 (final round" in text and "rescale_before_pv=true: fail" in text
    base = rows + _final_rows(t, jobs, rows, [8192, 16384], final, status={"default": "fail"})
    text = _report_text(t, jobs, base, tmp_path / "b")
    assert "the default stays" in text and "complete; winner" not in text


def test_final_round_resumes_within_the_budget(tmp_path, monkeypatch):
    """fa4_model on the CPU, two sequence lengths: the budget stops the run inside the final round, a rerun finishes
    it, a third has nothing to do; the rows are lean and the final ones tagged."""
    import experiments.tune as T
    from experiments.results import read_rows

    real = T.candidates
    monkeypatch.setattr(T, "candidates", lambda *a, **k: real(*a, **k)[:3])
    monkeypatch.setattr(T, "TUNE_BENCH", dict(settle_s=0.0, min_rounds=3))
    # the model's speedups are noise: the two correct candidates of the search order are the finalists here
    monkeypatch.setattr(T, "finalists", lambda res, seqlens, n=3: [c for c in res if c["ok"]][:min(n, 2)])
    cfg = {**_model_cfg(tmp_path, 112), "seqlens": [64, 96]}
    ticks = itertools.count(0, 5)  # three clock readings per job: each job starts 15 s after the last, "takes" 5 s
    monkeypatch.setattr(T, "_clock", lambda: float(next(ticks)))
    out = io.StringIO()
    assert T.run_tune(cfg, out=out, tuned_dir=tmp_path / "tuned") == 0
    text = out.getvalue()
    assert "then a final round of up to 2 jobs (the default + up to 3 finalists)" in text  # the plan counts it
    assert "tune: final round: 2 job(s)" in text and "ran 7 jobs, 1 remain; rerun the same command to resume" in text
    assert "1 of 2 jobs remain; the winner is written once it is done" in text
    rows = read_rows(tmp_path / "tune" / "rows.jsonl")
    final = [r for r in rows if r["tune"].get("final")]
    assert len({r["job_key"] for r in final}) == 1
    idx = T.search_index(T.targets(cfg)[0])
    assert [r["variant"] for r in final if r["metric"] == "time_ratio"] == list(idx)[:2]
    assert all(r["tune"]["candidate"] == idx.get(r["variant"]) for r in final)
    # lean rows: the timing rows carry the folded calls and checks, no per-round times, ratios keep their samples
    assert {r["metric"] for r in rows} == {"time_ms", "time_ratio"}
    assert all("times_ms" not in r and r["tune"]["lean"] for r in rows)
    assert all(r["first_call_s"] > 0 and "err_out" in r["check"] for r in rows if r["metric"] == "time_ms")
    assert all(len(r["samples"]) == r["n"] >= 3 for r in rows if r["metric"] == "time_ratio")
    ticks2 = itertools.count(0, 5)
    monkeypatch.setattr(T, "_clock", lambda: float(next(ticks2)))
    out = io.StringIO()
    assert T.run_tune(cfg, out=out, tuned_dir=tmp_path / "tuned") == 0
    text = out.getvalue()
    assert "[1/1]" in text and "final round: default +" in text and "none remain" in text and "complete" in text
    assert "final round (the default" in text.split("\n")[1]  # the plan line: the final round's jobs done / left
    assert len({r["job_key"] for r in read_rows(tmp_path / "tune" / "rows.jsonl") if r["tune"].get("final")}) == 2
    out = io.StringIO()
    assert T.run_tune(cfg, out=out, tuned_dir=tmp_path / "tuned") == 0
    assert "every job already has rows" in out.getvalue()


def test_tune_figure_draws_the_final_round_apart(tmp_path):
    pd = pytest.importorskip("pandas")
    from analysis.tune_figs import tune_figure, tune_speedups, winners

    rows = []
    finals = {"tile_n=64": [1 / 1.01] * 7 + [1.01] * 3, "num_stages=3": [1 / 1.03] * 10}  # p20 0.99 / 1.03
    for i, (v, search) in enumerate((("tile_n=64", 1 / 1.05), ("num_stages=3", 1 / 1.04))):
        for s in (8192, 16384):
            common = dict(experiment="tune", metric="time_ratio", status="ok", variant=v, mode="fwd", hdim=192,
                          causal=False, seqlen_q=s, config={"tile_n": 64}, gpu_name=None, time="2026-12-01T00:00:00")
            rows.append(dict(common, samples=[search] * 10, job_key=f"{v}{s}", tune={"candidate": i}, value=search))
            rows.append(dict(common, samples=finals[v], job_key=f"final{s}", value=1.0,
                             tune={"candidate": i, "final": True}))
    df = pd.DataFrame(rows)
    s = tune_speedups(df)
    assert len(s) == 8 and s["final"].sum() == 4
    w = winners(s)
    assert list(w["winner"]) == ["num_stages=3"] and list(w["round"]) == ["final"] and list(w["candidates"]) == [2]
    assert list(winners(s[~s["final"]])["winner"]) == ["tile_n=64"]  # the search alone would have taken the other
    # a fail row of the default in the final job counts against both finalists
    bad = pd.concat([df, pd.DataFrame([dict(rows[1], metric="err_out", status="fail", variant="default")])])
    assert winners(tune_speedups(bad))["winner"].isna().all()
    out, msg = tune_figure(df, tmp_path)
    assert out is not None and out.exists() and "4 points, 1 panels, 4 final-round points" in msg

