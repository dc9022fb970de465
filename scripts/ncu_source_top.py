"""Where a kernel's warps stall, per SASS line and per opcode, from an Nsight Compute source-page export.

``ncu --import rep.ncu-rep --page source --csv --print-source sass > src.csv`` (every profiled kernel of the report,
one section each), then ``python scripts/ncu_source_top.py src.csv [--top 12] [--labels A B ...]``: per kernel, its
total warp-stall samples and executed instructions, the ``--top`` SASS lines by samples (share of the kernel's samples,
the line's largest stall reason) and the opcodes (first mnemonic, predicate stripped) by samples with their executed
instructions; ``--regions N``: the N runs of lines with one execution count that execute the most (what a warp issues
per steady-state loop iteration: session_ab/fwd192_ncu.txt's per-block counts); ``--by-count N``: the samples of lines
grouped by execution count relative to the loop's (a persistent kernel's per-tile lines apart from its per-block
ones: what the switch between tiles costs). A session script for kernel work,
like scripts/ncu_pipes.py.
"""
from __future__ import annotations

import argparse
import collections
import csv
import math
import sys

from ncu_pipes import number


def sections(path: str) -> list[tuple[str, list[dict]]]:
    """[(kernel name, [row dict, ...]), ...] of a source-page CSV export: each section is a "Kernel Name" line, a
    header line, then one line per SASS instruction."""
    out, name, header = [], None, None
    for row in csv.reader(open(path, newline="")):
        if not row:
            continue
        if row[0] == "Kernel Name":
            name, header = row[1], None
            out.append((name, []))
        elif header is None and name is not None:
            header = row
        elif header is not None:
            out[-1][1].append(dict(zip(header, row)))
    return out


def _num(v: str) -> float:
    """ncu_pipes.number, with 0 for a cell that holds no number ("-", empty)."""
    try:
        return number(v)
    except (ValueError, AttributeError):
        return 0.0


def opcode(source: str) -> str:
    """The mnemonic of a SASS line ("@!P0 BRA 0x..." -> "BRA", "HGMMA.64x128x16.F32.BF16 ..." -> "HGMMA")."""
    parts = source.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0].split(".")[0] if parts else "?"


def summary(rows: list[dict], top: int) -> list[str]:
    stalls = [k for k in (rows[0] if rows else {}) if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(_num(r["Warp Stall Sampling (All Samples)"]) for r in rows) or 1.0
    insts = sum(_num(r["Instructions Executed"]) for r in rows)
    lines = [f"  {len(rows)} SASS lines, {total:.0f} samples, {insts / 1e6:.2f}M instructions executed"]
    for r in sorted(rows, key=lambda r: -_num(r["Warp Stall Sampling (All Samples)"]))[:top]:
        s = _num(r["Warp Stall Sampling (All Samples)"])
        why = max(stalls, key=lambda k: _num(r[k])) if stalls else ""
        lines.append(f"  {100 * s / total:6.2f}%  {r['Source'].strip()[:64]:64s} {why}")
    by_op = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
    for r in rows:
        acc = by_op[opcode(r["Source"])]
        acc[0] += _num(r["Warp Stall Sampling (All Samples)"])
        acc[1] += _num(r["Instructions Executed"])
        for k in stalls:
            acc[2][k] += _num(r[k])
    lines.append("  by opcode: share of samples, instructions executed, top two stall reasons")
    for op, (s, n, why) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        reasons = ", ".join(f"{k[6:]} {100 * v / total:.1f}%" for k, v in why.most_common(2) if v)
        lines.append(f"  {100 * s / total:6.2f}%  {op:12s} {n / 1e6:8.3f}M  {reasons}")
    return lines


def hot_regions(rows: list[dict], n: int = 4) -> list[str]:
    """The ``n`` runs of consecutive SASS lines with one execution count that execute the most instructions (the
    steady-state loop's blocks): per run its execution count, lines, instructions and sample share. The lines of the
    runs executed within 1% of the largest count sum to the instructions a warp issues per loop iteration."""
    total = sum(_num(r["Warp Stall Sampling (All Samples)"]) for r in rows) or 1.0
    runs: list[list] = []  # [executions, lines, samples, opcode counter]
    for r in rows:
        n_exec = _num(r["Instructions Executed"])
        if not runs or runs[-1][0] != n_exec:
            runs.append([n_exec, 0, 0.0, collections.Counter()])
        runs[-1][1] += 1
        runs[-1][2] += _num(r["Warp Stall Sampling (All Samples)"])
        runs[-1][3][opcode(r["Source"])] += 1
    out = ["  hottest runs of equal execution count: executions x lines, samples, HGMMA / MUFU / FMUL / FFMA lines"]
    for n_exec, lines, s, ops in sorted(runs, key=lambda x: -x[0] * x[1])[:n]:
        out.append(f"  {n_exec / 1e3:9.1f}k x {lines:4d} = {n_exec * lines / 1e6:7.2f}M  {100 * s / total:5.1f}%  "
                   f"{ops['HGMMA']} / {ops['MUFU']} / {ops['FMUL']} / {ops['FFMA']}")
    top = max((x[0] for x in runs), default=0)
    out.append(f"  lines executed {top / 1e3:.1f}k times, within 1% (the innermost loop's iterations; a branch taken "
               f"nearly always included): {sum(x[1] for x in runs if x[0] >= 0.99 * top)}")
    return out


def by_frequency(rows: list[dict], n: int = 6) -> list[str]:
    """Stall samples by how often a line runs: the lines grouped by execution count relative to the most executed
    line's (the innermost loop), in classes a factor of 2 wide, the ``n`` with the most samples. A loop's lines sit
    near 1; a persistent kernel's per-tile lines (epilogue, next tile's first block) near 1 / (blocks per tile) --
    their samples share is what the switch between tiles costs in warp stalls."""
    total = sum(_num(r["Warp Stall Sampling (All Samples)"]) for r in rows) or 1.0
    top = max((_num(r["Instructions Executed"]) for r in rows), default=0.0) or 1.0
    classes = collections.defaultdict(lambda: [0, 0.0, 0.0])  # class -> [lines, samples, instructions]
    for r in rows:
        n_exec = _num(r["Instructions Executed"])
        k = math.floor(math.log2(top / n_exec)) if n_exec > 0 else None  # n_exec / top in (2^-(k+1), 2^-k]
        acc = classes[k]
        acc[0] += 1
        acc[1] += _num(r["Warp Stall Sampling (All Samples)"])
        acc[2] += n_exec
    out = ["  samples by execution count relative to the most executed line (classes of 2x): lines, samples, "
           "instructions"]
    for k, (lines, s, insts) in sorted(classes.items(), key=lambda kv: -kv[1][1])[:n]:
        where = "never run" if k is None else f"1/{2 ** k}-1/{2 ** (k + 1)}" if k else "1-1/2 (the loop)"
        out.append(f"  {where:>20s}  {lines:5d} lines  {100 * s / total:6.2f}%  {insts / 1e6:8.2f}M")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--labels", nargs="*", default=[])
    ap.add_argument("--regions", type=int, default=0, metavar="N",
                    help="also the N hottest runs of lines with one execution count (instructions per loop iteration)")
    ap.add_argument("--by-count", type=int, default=0, metavar="N",
                    help="also the samples of lines grouped by how often they run (N classes; per-tile vs per-block)")
    a = ap.parse_args(argv)
    secs = sections(a.csv)
    if not secs:
        raise SystemExit(f"{a.csv}: no 'Kernel Name' sections (is it `ncu --page source --csv` output?)")
    for i, (name, rows) in enumerate(secs):
        label = a.labels[i] if i < len(a.labels) else f"kernel {i}"
        print(f"== {label}: {name[:90]}")
        print("\n".join(summary(rows, a.top)))
        if a.regions:
            print("\n".join(hot_regions(rows, a.regions)))
        if a.by_count:
            print("\n".join(by_frequency(rows, a.by_count)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
