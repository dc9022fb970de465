"""Tests of experiments/numerics.py: job expansion, row fields, the findings the experiment exists to show
(tau skips rescales without changing the error; tau > 16 overflows fp16 P), the poly rows and finalize."""
import json

import pandas as pd
import pytest

from experiments.numerics import DEFAULT_PARAMS, NumericsError, expand, finalize, run
from experiments.results import job_key

SMALL = dict(batch=1, heads=1, seqlen=256, hdims=[64], poly_n=100_000)
ROW_FIELDS = {"experiment", "kind", "backend", "mode", "metric", "value", "status", "reason", "error_class"}
SHAPE_FIELDS = {"batch", "seqlen_q", "seqlen_k", "heads", "hdim", "hdim_v", "causal", "dtype"}


def _job(**kw):
    jobs = [j for j in expand({**SMALL, **{k: v for k, v in kw.items() if k in DEFAULT_PARAMS}})
            if j["kind"] == "numerics"]
    sel = {k: v for k, v in kw.items() if k not in DEFAULT_PARAMS}
    return [j for j in jobs if all(j[k] == v for k, v in sel.items())]


def _metrics(rows):
    return {r["metric"]: r["value"] for r in rows}


def test_expand_default_grid():
    jobs = expand({})
    poly = [j for j in jobs if j["kind"] == "poly"]
    num = [j for j in jobs if j["kind"] == "numerics"]
    assert sorted(j["degree"] for j in poly if j["coeffs"] == "ours_round") == [1, 2, 3, 4, 5]
    assert any(j["coeffs"] == "paper_floor" for j in poly) and all(j["n"] == 4_000_000 for j in poly)
    assert {j["tau"] for j in num} >= {0.0, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0}
    assert {j["exp2_fraction"] for j in num} == {0.0, 0.125, 0.25, 0.5, 1.0}
    assert {j["dtype"] for j in num} == {"bfloat16", "float16"}
    assert {j["dist"] for j in num} == {"gaussian", "late_max", "fp16_overflow"}
    assert {j["tau"] for j in num if j["dist"] != "fp16_overflow"} == {0.0, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0}
    assert len(num) == 3 * 2 * 7 * 5 + 2 * 2 * 5  # + the overflow taus for fp16_overflow
    keys = [job_key(j) for j in jobs]
    assert len(set(keys)) == len(keys)
    json.dumps(jobs)


def test_expand_errors_name_the_parameter():
    with pytest.raises(NumericsError, match="unknown numerics param"):
        expand({"tau": [1.0]})
    with pytest.raises(NumericsError, match="dtypes.*float32"):
        expand({"dtypes": ["float32"]})
    with pytest.raises(NumericsError, match="dists"):
        expand({"dists": ["uniform"]})
    with pytest.raises(NumericsError, match="kind"):
        run({"kind": "attn"})


def test_numerics_rows_have_the_interface_fields():
    (job,) = _job(dist="gaussian", dtype="bfloat16", tau=8.0, exp2_fraction=0.25)
    rows = run(job)
    for r in rows:
        assert ROW_FIELDS | SHAPE_FIELDS <= set(r), set(ROW_FIELDS | SHAPE_FIELDS) - set(r)
        assert r["backend"] == "fa4_model" and r["kind"] == "numerics" and r["mode"] == "fwd" and r["status"] == "ok"
        assert r["config"]["rescale_threshold"] == 8.0 and r["config"]["exp2_emu_fraction"] == 0.25
        assert len(r["config_hash"]) == 12
    m = _metrics(rows)
    assert {"out_max_abs_err", "out_pt_max_abs_err", "lse_max_abs_err", "lse_pt_max_abs_err", "within_rule",
            "skipped_share", "rescales_done", "rescales_skipped", "n_inf", "n_nan", "exp2_emulated_fraction"} <= set(m)
    assert m["within_rule"] == 1.0 and m["n_inf"] == 0 and m["n_nan"] == 0
    assert 0 < m["out_max_abs_err"] <= 2 * m["out_pt_max_abs_err"]
    assert m["exp2_emulated_fraction"] == 0.25
    assert "spec_redo_share" not in m  # speculative_exp: not with exp2 emulation
    json.dumps(rows)
    (job,) = _job(dist="late_max", dtype="bfloat16", tau=8.0, exp2_fraction=0.0, seqlen=1024)
    m = _metrics(run(job))
    assert 0.0 < m["spec_max_check_share"] < m["spec_redo_share"] <= 1.0  # the ramp: the second vote redoes fewer


def test_late_max_skips_more_with_larger_tau_and_error_stays_within_rule():
    shares = {}
    for tau in (0.0, 2.0, 16.0):
        (job,) = _job(dist="late_max", dtype="float16", tau=tau, exp2_fraction=0.5, seqlen=1024)
        m = _metrics(run(job))
        assert m["within_rule"] == 1.0
        shares[tau] = m["skipped_share"]
    assert shares[0.0] == 0.0 < shares[2.0] < shares[16.0]


def test_fp16_overflow_shows_when_tau_is_too_large():
    def m(dtype, tau):
        (job,) = _job(dist="fp16_overflow", dtype=dtype, tau=tau, exp2_fraction=0.0)
        return _metrics(run(job))

    safe, over, bf16 = m("float16", 8.0), m("float16", 24.0), m("bfloat16", 24.0)
    assert safe["n_inf"] + safe["n_nan"] == 0 and safe["within_rule"] == 1.0
    assert over["n_inf"] + over["n_nan"] > 0 and over["within_rule"] == 0.0
    assert bf16["n_inf"] + bf16["n_nan"] == 0 and bf16["within_rule"] == 1.0  # bf16 has fp32's exponent range


def test_poly_rows():
    job = [j for j in expand(SMALL) if j["kind"] == "poly" and j["degree"] == 3 and j["coeffs"] == "ours_round"][0]
    rows = run(job)
    m = _metrics(rows)
    assert rows[0]["kind"] == "poly" and rows[0]["backend"] == "fa4_model" and rows[0]["mode"] == "exp2"
    assert 5e-5 < m["max_rel_err_fp32"] < 1.2e-4 and m["bf16_1ulp_share"] == 1.0 and m["bf16_equal_share"] > 0.98


def test_finalize_writes_figure_and_tables(tmp_path):
    jobs = [j for j in expand({**SMALL, "taus": [0.0, 8.0], "overflow_taus": [24.0], "fractions": [0.0, 1.0],
                               "dists": ["gaussian", "fp16_overflow"], "poly_degrees": [3]})]
    rows = [r for j in jobs for r in run(j)]
    written = finalize(pd.DataFrame(rows), tmp_path)
    names = {p.split("/")[-1] for p in written}
    assert {"numerics.png", "numerics_summary.csv", "poly_table.csv", "poly_table.md"} <= names
    assert (tmp_path / "numerics.png").stat().st_size > 10_000
    summary = pd.read_csv(tmp_path / "numerics_summary.csv")
    assert len(summary) == len([j for j in jobs if j["kind"] == "numerics"])
