"""Tuned entries that outlive their table (kernels/config.py table_context / STALE_TUNED): an entry records the table
defaults it was measured on top of; once they change, the entry is not applied, a StaleTunedWarning names the changed
fields and `python run.py tune` says which search re-measures it. CPU only."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest
import yaml

import kernels.config as C
from kernels.config import AttnConfig, load_tuned, table_context, table_defaults
from kernels.tuning import write_tuned

from test_tune import ENTRY, _config_copy


def test_table_context_leaves_out_the_entry_fields_and_the_other_direction():
    fwd = table_context("sm90", 128, False, "fwd")
    assert not set(fwd) & set(C.TUNED_FIELDS["fwd"]) and not set(fwd) & set(C.BWD_ONLY_FIELDS)
    assert fwd["p_cvt_asm"] is True and fwd["pv_wait_mid"] is True  # hd128 non-causal's loop-shape defaults
    bwd = table_context("sm90", 128, True, "bwd")
    assert not set(bwd) & set(C.TUNED_FIELDS["bwd"]) and not set(bwd) & set(C.FWD_ONLY_FIELDS)
    assert bwd["exp2_emu_fraction"] == 0.0  # held at the table's value by a backward search
    assert table_context("sm90", 128, True, "fwd") != fwd  # causal has its own loop-shape defaults


def test_every_field_belongs_to_one_direction_or_both():
    names = {f.name for f in C.fields(AttnConfig)}
    assert not set(C.FWD_ONLY_FIELDS) & set(C.BWD_ONLY_FIELDS)
    assert set(C.FWD_ONLY_FIELDS) | set(C.BWD_ONLY_FIELDS) <= names
    assert names - set(C.FWD_ONLY_FIELDS) - set(C.BWD_ONLY_FIELDS) == {"exp2_emu_fraction"}  # read by both


def _entry(context: dict) -> dict:
    return {**ENTRY, "evidence": {**ENTRY["evidence"], "table_context": context}}


def test_an_entry_on_todays_table_applies_and_one_on_another_is_left_out(tmp_path):
    now = table_context("sm90", 128, True, "fwd")
    p = write_tuned(tmp_path / "sm90.yaml", "sm90", [_entry(now)])
    stale: dict = {}
    assert load_tuned(p, stale) == {("sm90", 128, True): ENTRY["config"]} and stale == {}
    then = {**now, "p_cvt_asm": not now.get("p_cvt_asm", False)}  # measured before a loop-shape default flipped
    p.write_text(yaml.safe_dump({"arch": "sm90", "entries": [_entry(then)]}))
    assert load_tuned(p, stale) == {}
    assert stale == {("sm90", 128, True, "fwd"): {"p_cvt_asm": (then["p_cvt_asm"], now.get("p_cvt_asm"))}}
    # an entry without a recorded context (written before 2026-12-03) is applied unchecked
    p.write_text(yaml.safe_dump({"arch": "sm90", "entries": [ENTRY]}))
    assert load_tuned(p) == {("sm90", 128, True): ENTRY["config"]}


def test_a_malformed_table_context_names_the_key(tmp_path):
    p = tmp_path / "sm90.yaml"
    p.write_text(yaml.safe_dump({"arch": "sm90", "entries": [_entry(["p_cvt_asm"])]}))
    with pytest.raises(C.ConfigError, match=r"entries\[0\]\.evidence\.table_context"):
        load_tuned(p)


def test_import_warns_and_runs_the_table_for_a_stale_entry(tmp_path):
    then = {**table_context("sm90", 128, True, "fwd"), "rescale_threshold": 4.0}
    tree = _config_copy(tmp_path, yaml.safe_dump({"arch": "sm90", "entries": [_entry(then)]}))
    code = ("import kernels.config as c; print(c.AttnConfig().resolve('sm90', 128, True).tile_n); "
            "print(sorted(c.STALE_TUNED))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == [str(table_defaults("sm90", 128, True, tuned=False)["tile_n"]),
                                        "[('sm90', 128, True, 'fwd')]"]
    assert "StaleTunedWarning" in r.stderr and "rescale_threshold 4.0 -> 8.0" in r.stderr
    assert "python run.py tune arch=sm90 hdim=128 causal=true direction=fwd" in r.stderr


def test_tune_names_the_stale_entries_and_whether_it_re_measures_them(monkeypatch):
    import experiments.tune as T

    monkeypatch.setattr(C, "STALE_TUNED", {("sm90", 192, False, "fwd"): {"p_cvt_asm": (None, True)}})
    out = io.StringIO()
    T._print_stale([{"arch": "sm90", "hdim": 192, "causal": False, "direction": "fwd"}], out)
    assert "stale tuned entry sm90 fwd hdim 192 non-causal" in out.getvalue()
    assert "p_cvt_asm None -> True" in out.getvalue() and "this run re-measures it" in out.getvalue()
    out = io.StringIO()
    T._print_stale([], out)
    assert "`python run.py tune arch=sm90 hdim=192 causal=false direction=fwd` re-measures it" in out.getvalue()


def test_audit_reports_stale_tuned_entries(monkeypatch):
    from analysis.audit import _tuned_line

    assert _tuned_line() == (True, "tuned defaults: no stale entry (conf/tuned/)")  # the repository's file
    monkeypatch.setattr(C, "STALE_TUNED", {("sm90", 192, False, "fwd"): {"p_cvt_asm": (None, True)}})
    ok, line = _tuned_line()
    assert not ok and "1 stale entry not applied (sm90 fwd hdim 192; re-measure: python run.py tune)" in line
