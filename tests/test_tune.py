"""`python run.py tune`: the search space (no invalid candidate, every value pair covered), the winner rule (noise),
the tuned-defaults file (round trip, kernels/config.py override at import, malformed-file errors), a budget that
stops a run and a rerun that resumes it, and the figure from fake rows. CPU only; no timing is faked into a file
that the repository keeps."""
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
    from experiments.tune_space import candidates, default_point, factors, kernel_id, valid_points

    for hdim, causal in ((192, False), (128, True)):
        base = default_point("sm90", hdim, causal, "fwd")
        assert base["rescale_before_pv"] is False  # the table default
        valid = valid_points("sm90", hdim, causal, "fwd")
        assert {p["rescale_before_pv"] for p in valid} == {False, True}
        cands = candidates("sm90", hdim, causal, "fwd", valid)
        on = {**base, "rescale_before_pv": True}
        fb = factors(base)
        n_ofat = next(i for i, p in enumerate(cands) if sum(v != fb[k] for k, v in factors(p).items()) > 1)
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
    keys = [r["job_key"] for r in rows if r.get("metric") == "time_ratio"]
    assert len(keys) == len(set(keys)) == 3  # each candidate once, nothing repeated
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
    got = load_tuned(tmp_path / "tuned" / "sm90.yaml")
    assert got == {("sm90", 256, False): {k: v for k, v in t["candidates"][0].items() if k != "pingpong"}}
    assert "winner tile_n=64" in out.getvalue()


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
