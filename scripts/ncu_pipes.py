"""Pipe utilization, issue rate and stall reasons from Nsight Compute raw CSV exports, one column per file.

``ncu --import rep.ncu-rep --page raw --csv > a.csv`` per report, then
``python scripts/ncu_pipes.py a.csv b.csv [--labels A B] [--all] [--out table.csv]``: the first profiled kernel of each
file (``--all``: every kernel of each file, in the report's order; then one label per kernel),
the metrics below (duration, tensor / MUFU (xu) / FMA / ALU pipe share of peak, issue-active share, the shared-memory
banks' read / write share of peak, the stall reasons per issued instruction; a metric the export lacks is nan). Used for the hd64 forward exp2 profile (README, issue 11.4).
"""
from __future__ import annotations

import argparse
import csv
import sys

METRICS = {
    "duration_us": "gpu__time_duration.sum",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "xu_pipe_pct (MUFU)": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "fma_pipe_pct": "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "alu_pipe_pct": "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "inst_per_cycle": "sm__inst_executed.avg.per_cycle_active",
    # shared memory: the L1 data banks (wgmma operand reads, TMA writes, ld/st.shared) and the whole L1TEX unit
    "smem_bank_reads_pct": "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed",
    "smem_bank_writes_pct": "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed",
    "l1tex_throughput_pct": "l1tex__throughput.avg.pct_of_peak_sustained_active",
}
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
STALLS = ("wait", "long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "dispatch_stall", "not_selected",
          "math_pipe_throttle", "gmma")


def kernels(path: str) -> list[dict]:
    """{metric: (value, unit)} of every kernel row of a raw CSV export (row 0 names, row 1 units)."""
    rows = list(csv.reader(open(path, newline="")))
    if len(rows) < 3:
        raise SystemExit(f"{path}: no kernel rows (is it `ncu --page raw --csv` output?)")
    names, units = rows[0], rows[1]
    return [{n: (v, u) for n, u, v in zip(names, units, vals)} for vals in rows[2:]]


def first_kernel(path: str) -> dict:
    """{metric: (value, unit)} of the first kernel row of a raw CSV export."""
    return kernels(path)[0]


def number(v: str) -> float:
    return float(v.replace(",", ""))


def table(paths: list[str], every: bool = False) -> list[tuple[str, list[float]]]:
    ks = [k for p in paths for k in kernels(p)] if every else [first_kernel(p) for p in paths]
    out = []
    for label, m in list(METRICS.items()) + [(f"stall_{s}", STALL.format(s)) for s in STALLS]:
        vals = []
        for k in ks:
            v, unit = k.get(m, ("nan", ""))
            x = number(v) if v not in ("", "n/a") else float("nan")
            vals.append(x * 1000 if label == "duration_us" and unit == "ms" else x)
        out.append((label, vals))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--labels", nargs="*")
    ap.add_argument("--out", default=None)
    ap.add_argument("--all", action="store_true", help="every kernel of each file (one label per kernel)")
    a = ap.parse_args(argv)
    t = table(a.csv, a.all)
    labels = a.labels or (a.csv if not a.all else [f"{p}#{i}" for p in a.csv for i in range(len(kernels(p)))])
    if len(labels) != len(t[0][1]):
        raise SystemExit(f"--labels: one per {'kernel' if a.all else 'CSV file'} ({len(t[0][1])})")
    w = csv.writer(open(a.out, "w", newline="") if a.out else sys.stdout)
    w.writerow(["metric", *labels])
    for name, vals in t:
        w.writerow([name, *(f"{v:.3f}" for v in vals)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
