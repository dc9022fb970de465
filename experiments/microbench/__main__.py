"""CLI: ``python -m experiments.microbench --out results/h200/microbench/rows.jsonl [--only exp2 gemm smem]``."""
from __future__ import annotations

import argparse
import sys

from experiments.microbench import BENCHES, run_all, summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.microbench", description=__doc__)
    p.add_argument("--out", default="results/h200/microbench/rows.jsonl", help="rows.jsonl to append to")
    p.add_argument("--only", nargs="*", choices=BENCHES, default=None, help="run only these benchmarks")
    p.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    a = p.parse_args(argv)
    rows = run_all(a.out, only=a.only, quick=a.quick)
    if rows:
        print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
