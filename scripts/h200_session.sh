#!/usr/bin/env bash
# One H200 session, every GPU experiment in one command (the device lease is short). Rows go to the committed
# set results/h200/<experiment>/rows.jsonl, so a run RESUMES it: finished jobs are skipped, only missing ones
# run. Order: GPU tests (in parallel with the fault demo, which times nothing that matters), the calibration
# microbenchmarks, then the timed sweeps one after another (never two timed jobs at once). Each step has its own
# time cap; rows are flushed as produced and copied to <out_dir> after every step, so what a capped step
# measured comes back even if the whole command is cut short.
# Usage on the GPU host:  source .gpu/boot.sh && FA4LAB_GIT_SHA=<sha> bash scripts/h200_session.sh <out_dir> [bench]
#   bench: quick (default: 10 repeats) or default (50 repeats); FA4LAB_GIT_SHA: the commit, for a tree copied without
#   .git. The caps add up past one 10-minute device call: run the same command again and it resumes.
set -u
OUT=${1:?usage: scripts/h200_session.sh <out_dir> [bench]}
BENCH=${2:-quick}
R=results/h200
LOG=$OUT/all.log
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUTE_DSL_ARCH=sm_90a
# back: a set's archived rows (rows.jsonl.xz) ship with the tree and stay as they are; rows.jsonl holds the rows
# appended since, so the copy in <out_dir> is what goes back over results/h200/<experiment>/rows.jsonl.
back() { for e in "$@"; do [ -f "$R/$e/rows.jsonl" ] && cp "$R/$e/rows.jsonl" "$OUT/$e.jsonl"; done; }
step() { local cap=$1; shift; echo "=== $(date -u +%T) [cap ${cap}s] $*" | tee -a "$LOG"; timeout "$cap" "$@" >>"$LOG" 2>&1; echo "=== rc=$?" | tee -a "$LOG"; }
sweep() { local cap=$1 exp=$2; shift 2; step "$cap" python run.py sweep experiment="$exp" results_dir="$R" bench="$BENCH" "$@"; back "$exp"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version,temperature.gpu --format=csv >"$OUT/gpu.txt"

# 1. GPU tests (forward, backward, isolation) in parallel with the fault demo
T=$(mktemp -d)
( timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fwd_gpu.py >"$T/fwd.log" 2>&1 ) &
( timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_bwd_gpu.py >"$T/bwd.log" 2>&1 ) &
( timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_isolation.py >"$T/iso.log" 2>&1 ) &
sweep 150 fault_demo job_timeout_s=30
wait
for f in "$T"/*.log; do echo "--- $f" >>"$LOG"; tail -n 15 "$f" >>"$LOG"; done

# 2. calibration microbenchmarks (skipped when their rows are committed: delete them to re-measure)
[ -f "$R/microbench/rows.jsonl" ] || { step 60 python -m experiments.microbench --out "$R/microbench/rows.jsonl"; back microbench; }

# 3. the paper grid, forward then backward, with every peer (flex included)
sweep 240 fwd_peers
sweep 200 bwd_peers 'experiment.peers=[fa4_official,fa4_official_det,sdpa_cudnn,sdpa_flash,flex]' 'shape.grid.hdims=[64,128]'

# 4. ablations (hdim 128 grid by default; hdim 64 at 8k)
sweep 150 fwd_ablation
sweep 60 fwd_ablation 'shape.grid.hdims=[64]' 'shape.grid.seqlens=[8192]'
sweep 120 bwd_ablation job_timeout_s=60
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >>"$OUT/gpu.txt"
echo "=== done $(date -u +%T)" | tee -a "$LOG"
