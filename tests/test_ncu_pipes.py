"""scripts/ncu_pipes.py on a synthetic Nsight Compute raw CSV (names row, units row, one row per kernel)."""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import ncu_pipes  # noqa: E402


def _write(path, duration, unit, xu):
    names = ["Kernel Name", ncu_pipes.METRICS["duration_us"], ncu_pipes.METRICS["xu_pipe_pct (MUFU)"],
             ncu_pipes.STALL.format("wait")]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerows([names, ["", unit, "%", "inst"], ["k0", duration, xu, "1,234.5"], ["k1", "9", "9", "9"]])


def test_first_kernel_units_and_missing(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    _write(a, "1.5", "ms", "61.2")
    _write(b, "1400", "us", "51.0")
    t = dict(ncu_pipes.table([str(a), str(b)]))
    assert t["duration_us"] == [1500.0, 1400.0]  # ms converted, the second kernel row ignored
    assert t["xu_pipe_pct (MUFU)"] == [61.2, 51.0]
    assert t["stall_wait"] == [1234.5, 1234.5]  # thousands separator
    assert all(math.isnan(x) for x in t["tensor_pipe_pct"])  # not in the export


def test_cli_writes_labels(tmp_path):
    a = tmp_path / "a.csv"
    _write(a, "2", "ms", "10")
    out = tmp_path / "t.csv"
    assert ncu_pipes.main([str(a), "--labels", "f0", "--out", str(out)]) == 0
    rows = list(csv.reader(open(out)))
    assert rows[0] == ["metric", "f0"] and ["duration_us", "2000.000"] in rows
    with pytest.raises(SystemExit):
        ncu_pipes.main([str(a), "--labels", "x", "y"])
    empty = tmp_path / "e.csv"
    empty.write_text("a\nb\n")
    with pytest.raises(SystemExit):
        ncu_pipes.main([str(empty)])
