"""scripts/ncu_source_top.py on a synthetic Nsight Compute source-page CSV (a "Kernel Name" line, a header, one line
per SASS instruction; one section per kernel)."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import ncu_source_top  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_wait",
          "stall_barrier", "stall_wait (Not Issued)"]


def _write(path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "ours"])
        w.writerow(HEADER)
        w.writerow(["0x0", "      HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24", "30", "1,000", "25", "5", "99"])
        w.writerow(["0x10", "@!P0  BRA 0x7f00", "60", "500", "0", "60", "0"])
        w.writerow(["0x20", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24, gsb0", "10", "1,000", "10", "0", "0"])
        w.writerow(["Kernel Name", "official"])
        w.writerow(HEADER)
        w.writerow(["0x0", "MUFU.EX2 R1, R1", "4", "64", "4", "0", "0"])


def test_sections_and_opcodes(tmp_path):
    p = tmp_path / "src.csv"
    _write(p)
    secs = ncu_source_top.sections(str(p))
    assert [name for name, _ in secs] == ["ours", "official"] and [len(rows) for _, rows in secs] == [3, 1]
    assert ncu_source_top.opcode("@!P0  BRA 0x7f00") == "BRA"
    assert ncu_source_top.opcode("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24") == "HGMMA"
    lines = ncu_source_top.summary(secs[0][1], top=2)
    assert lines[0].strip() == "3 SASS lines, 100 samples, 0.00M instructions executed"
    assert "60.00%  @!P0  BRA 0x7f00" in lines[1] and lines[1].endswith("stall_barrier")  # the largest stall
    assert "30.00%  HGMMA" in lines[2] and lines[2].endswith("stall_wait")
    by_op = [ln for ln in lines if "HGMMA  " in ln and "M  " in ln]  # both HGMMA lines summed, Not Issued left out
    assert by_op and "40.00%" in by_op[0] and "0.002M" in by_op[0] and "wait 35.0%" in by_op[0]


def test_cli_labels_and_bad_file(tmp_path, capsys):
    p = tmp_path / "src.csv"
    _write(p)
    assert ncu_source_top.main([str(p), "--labels", "A", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "== A: ours" in out and "== kernel 1: official" in out
    bad = tmp_path / "raw.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="no 'Kernel Name' sections"):
        ncu_source_top.main([str(bad)])


def test_hot_regions_count_a_loop_iteration(tmp_path):
    """Runs of one execution count, the hottest first; the loop's lines = those within 1% of the top count."""
    rows = [dict(Source=src, **{"Instructions Executed": str(n), "Warp Stall Sampling (All Samples)": "1"})
            for src, n in [("MOV R1, R2", 10), ("HGMMA.64x128x16 R24", 1000), ("FMUL R1, R1, R2", 1000),
                           ("MUFU.EX2 R1, R1", 995), ("MUFU.EX2 R2, R2", 995), ("EXIT", 10)]]
    out = ncu_source_top.hot_regions(rows, 2)
    assert "1.0k x    2 =    0.00M" in out[1] and out[1].endswith("1 / 0 / 1 / 0")  # HGMMA + FMUL, 1000 each
    assert "1.0k x    2" in out[2] and out[2].endswith("0 / 2 / 0 / 0")  # the two MUFU at 995
    assert out[-1].endswith(": 4")  # 2 + 2 lines: the 995 run is within 1% of 1000; the 10-count lines are not


def test_by_frequency_parts_per_tile_lines_from_the_loop():
    """Lines grouped by execution count relative to the most executed line, classes of 2x, the most samples first:
    a persistent kernel's per-tile lines (here 1/100 of the loop's count) apart from the loop's."""
    rows = [dict(Source=src, **{"Instructions Executed": str(n), "Warp Stall Sampling (All Samples)": str(s)})
            for src, n, s in [("HGMMA.64x80x16 R24", 10000, 50), ("MUFU.EX2 R1, R1", 9000, 20),
                              ("STG.E.128 [R2], R4", 100, 25), ("SYNCS.PHASECHK", 100, 5), ("EXIT", 0, 0)]]
    out = ncu_source_top.by_frequency(rows, 3)
    assert "1-1/2 (the loop)" in out[1] and "2 lines" in out[1] and "70.00%" in out[1]
    assert "1/64-1/128" in out[2] and "2 lines" in out[2] and "30.00%" in out[2]  # 100 / 10000 = 1/100
    assert "never run" in out[3] and "0.00%" in out[3]
    assert len(out) == 4
