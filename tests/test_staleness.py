"""Rows timed on a kernel config that today's defaults no longer compile (kernels/staleness.py): the check
itself, `python run.py sweep rerun=stale` (only those jobs run again) and the audit's gap line. CPU only: the PyTorch
model backend (fa4_model) resolves AttnConfig like our kernel's backend and records the compiled_hash the check
reads."""
from __future__ import annotations

import io
import json

from kernels.config import AttnConfig
from kernels.tiles import compiled_config, compiled_hash

from test_sweep import composed


def _row(config=None, mode="fwd", hdim=128, causal=False, **kw) -> dict:
    c = compiled_config(AttnConfig(), "sm90", hdim, causal, mode) if config and "no_such_field" in config else \
        compiled_config(AttnConfig(**(config or {})), "sm90", hdim, causal, mode)
    return {**dict(job_key="k", mode=mode, hdim=hdim, causal=causal, config=config, compiled_hash=compiled_hash(c),
                   compute_capability="9.0"), **kw}


def test_a_row_is_stale_only_when_todays_resolution_compiles_something_else():
    from kernels.staleness import is_stale, stale_job_keys

    assert not is_stale(_row()) and not is_stale(_row({"pingpong": False}, "bwd", 64, True))
    old = _row(compiled_hash="0123456789ab")  # what an older default compiled to
    assert is_stale(old) and stale_job_keys([_row(), dict(old, job_key="old")]) == {"old"}
    # a job re-timed since: only its latest run counts (the superseded rows stay in the archive)
    runs = [dict(old, run_id="a", time="2026-12-01T00:00:00"), dict(_row(), run_id="b", time="2026-12-02T00:00:00")]
    assert stale_job_keys(runs) == set() and stale_job_keys(runs[::-1]) == set()
    assert stale_job_keys([dict(r, run_id=i, time=t) for r, i, t in ((_row(), "a", "1"), (old, "b", "2"))]) == {"k"}
    assert is_stale(_row({"no_such_field": 1}, compiled_hash="0123456789ab"))  # a field that no longer exists
    for none in (None, float("nan"), ""):  # peers, failures before compiling, rows older than the field
        assert not is_stale(dict(_row(), compiled_hash=none))
    assert not is_stale(dict(_row(), mode="check"))


def test_a_forward_row_is_stale_when_the_per_call_rules_changed():
    """call_hash (forward rows from session 49 on): the config as the call of the row's shape runs it (persistent by
    the length, DEFAULTS' persistent_tile). A row whose call ran the greedy walk where today's rule claims tiles
    at run time is stale though its compiled_hash (the resolved config) still matches; the same row with today's
    call_hash is not; one without call_hash (older rows) is stale where today's call runs either."""
    from kernels.staleness import is_stale
    from kernels.tiles import call_compiled_config

    shape = dict(seqlen_q=2048, heads=16, causal=True)
    now = compiled_hash(call_compiled_config(AttnConfig(), "sm90", 128, True, 2048))
    before = compiled_hash(call_compiled_config(AttnConfig(persistent_dynamic=False), "sm90", 128, True, 2048))
    assert now != before and "persistent_dynamic" in call_compiled_config(AttnConfig(), "sm90", 128, True, 2048)
    assert "persistent_greedy" in call_compiled_config(AttnConfig(persistent_dynamic=False), "sm90", 128, True, 2048)
    row = _row(**shape)
    assert not is_stale(dict(row, call_hash=now)) and is_stale(dict(row, call_hash=before))
    # without call_hash (rows before session 49): stale where today's call takes the greedy walk, not elsewhere
    assert is_stale(row) and not is_stale(_row(seqlen_q=2048, heads=16, causal=False))
    assert not is_stale(_row(config={"persistent": False}, seqlen_q=2048, heads=16, causal=True))
    assert not is_stale(_row(seqlen_q=65536, heads=16, causal=True))  # past the persistent bound: one tile per CTA
    assert not is_stale(dict(row, call_hash=before, mode="bwd", compiled_hash=_row(mode="bwd", **shape)["compiled_hash"]))
    gqa = dict(_row(hdim=128, causal=False, seqlen_q=1, heads=32, heads_kv=4))  # packed GQA at one query
    assert call_compiled_config(AttnConfig(), "sm90", 128, False, 1, 8)["pack_gqa"] is True
    assert not is_stale(dict(gqa, call_hash=compiled_hash(call_compiled_config(AttnConfig(), "sm90", 128, False, 1, 8))))
    assert is_stale(dict(gqa, call_hash=compiled_hash(call_compiled_config(AttnConfig(), "sm90", 128, False, 1, 1))))


def _model_sweep(tmp_path, monkeypatch, seqlens: str, causal: str):
    """A fwd_peers sweep of the PyTorch model backend (CPU) into tmp_path/st: (its config, its rows file)."""
    from experiments.sweep import run_sweep

    monkeypatch.chdir(tmp_path)
    cfg = composed("experiment=fwd_peers", "experiment.backends=[fa4_model]", "experiment.peers=[]", "shape=cpu",
                   f"shape.grid.seqlens={seqlens}", f"shape.grid.causal={causal}", "bench=quick", "isolation=inline",
                   "progress=false", "results_dir=st")
    assert run_sweep(cfg, out=io.StringIO()) == 0
    return cfg, tmp_path / "st" / "fwd_peers" / "rows.jsonl"


def test_rows_record_the_call_hash(tmp_path, monkeypatch):
    from experiments.results import read_rows
    from kernels.tiles import call_compiled_config

    _, path = _model_sweep(tmp_path, monkeypatch, "[64]", "[true]")
    rows = [r for r in read_rows(path) if r["status"] == "ok"]
    assert rows
    for r in rows:
        assert r["call_hash"] == compiled_hash(call_compiled_config(AttnConfig(), "sm90", r["hdim"], True, 64))


def test_rerun_stale_times_only_the_jobs_on_an_old_kernel_config(tmp_path, monkeypatch):
    from experiments.results import read_rows
    from experiments.sweep import run_sweep

    cfg, path = _model_sweep(tmp_path, monkeypatch, "[64,128]", "[false]")
    first = read_rows(path)
    assert first and all(isinstance(r.get("compiled_hash"), str) for r in first if r["status"] == "ok")
    out = io.StringIO()
    run_sweep({**cfg, "rerun": "stale"}, out=out)
    assert "rerun=stale: 0 of 2 finished jobs" in out.getvalue() and "running 0" in out.getvalue()
    # one job's rows as if timed before a default changed
    old_key = first[0]["job_key"]
    lines = [json.dumps(dict(r, compiled_hash="0123456789ab") if r["job_key"] == old_key else r) + "\n" for r in first]
    path.write_text("".join(lines))
    out = io.StringIO()
    run_sweep({**cfg, "rerun": "stale"}, out=out)
    assert "rerun=stale: 1 of 2 finished jobs" in out.getvalue() and "running 1" in out.getvalue()
    again = read_rows(path)
    assert sorted(r["job_key"] for r in again) == sorted(r["job_key"] for r in first)  # replaced, not duplicated
    assert all(r["compiled_hash"] != "0123456789ab" for r in again)


def test_rerun_accepts_stale_and_names_it_in_its_error():
    import pytest

    from experiments.config_check import RunConfigError, check_run_config

    check_run_config(composed("experiment=fault_cpu", "rerun=stale"))
    with pytest.raises(RunConfigError, match="must be true or false or stale"):
        check_run_config(composed("experiment=fault_cpu", "rerun=sometimes"))


def test_audit_names_the_stale_cells_and_the_command_that_re_times_them():
    import pandas as pd

    from analysis.audit import _stale_line

    fresh = dict(_row(), hdim_v=128, seqlen_q=4096, job_key="a")
    old = dict(_row(causal=True), hdim_v=128, seqlen_q=8192, job_key="b", compiled_hash="0123456789ab")
    ok, line = _stale_line("fwd_peers", pd.DataFrame([fresh]))
    assert ok and line.startswith("fwd_peers: 0 of 1 timed rows drawn on a kernel config")
    ok, line = _stale_line("fwd_peers", pd.DataFrame([fresh, old, dict(fresh, compiled_hash=float("nan"))]))
    assert not ok and "1 of 3 timed rows" in line and "fwd 128 s8192 causal" in line
    assert "python run.py sweep experiment=fwd_peers rerun=stale" in line
    assert _stale_line("x", pd.DataFrame())[0]


def test_a_switch_turned_off_is_recorded_so_its_rows_are_not_stale(tmp_path, monkeypatch):
    """to_dict() leaves an explicit speculative_exp=False out (its hash is the default's), so rows that recorded it
    read as the default config and came out stale (fwd_ablation's no_speculative_exp, session 60); rows record
    AttnConfig.as_written() now, and a sweep's rows of that variant are not stale."""
    from experiments.results import read_rows
    from experiments.sweep import run_sweep
    from kernels.staleness import is_stale

    off = AttnConfig(speculative_exp=False)
    assert "speculative_exp" not in off.to_dict() and off.as_written()["speculative_exp"] is False
    row = _row({"speculative_exp": False}, hdim=128, causal=False)
    assert not is_stale(row) and is_stale(dict(row, config=off.to_dict()))
    monkeypatch.chdir(tmp_path)
    cfg = composed("experiment=fwd_peers", "experiment.backends=[fa4_model]", "experiment.peers=[]", "shape=cpu",
                   "shape.grid.seqlens=[64]", "shape.grid.causal=[false]", "bench=quick", "isolation=inline",
                   "progress=false", "results_dir=st", "+experiment.configs=[{name: nospec, config: {speculative_exp: false}}]")
    assert run_sweep(cfg, out=io.StringIO()) == 0
    rows = [r for r in read_rows(tmp_path / "st" / "fwd_peers" / "rows.jsonl") if r.get("compiled_hash")]
    assert rows and all(r["config"]["speculative_exp"] is False and not is_stale(r) for r in rows)
