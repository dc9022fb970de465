#!/usr/bin/env bash
# One H200 session, every GPU experiment in one command (the device lease is short): backward GPU tests and
# the fault-isolation demo in parallel, then the calibration microbenchmarks, then the timed sweeps one after
# another (never two timed jobs at once). Each step has its own time cap; rows are flushed as produced, so a
# capped sweep keeps what it measured (rerunning the same command resumes it).
# Usage on the GPU host:  source .gpu/boot.sh && bash scripts/h200_session.sh <out_dir>
set -u
OUT=${1:?usage: scripts/h200_session.sh <out_dir>}
R=$OUT/res
LOG=$OUT/all.log
mkdir -p "$R"
export PYTHONUNBUFFERED=1 CUTE_DSL_ARCH=sm_90a
step() { local cap=$1; shift; echo "=== $(date -u +%T) [cap ${cap}s] $*" | tee -a "$LOG"; timeout "$cap" "$@" >>"$LOG" 2>&1; echo "=== rc=$?" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version,temperature.gpu --format=csv >"$OUT/gpu.txt"

# 1. correctness of the backward (its default path changed after its last GPU run) + the fault demo, in parallel
P="python -m pytest -q -p no:cacheprovider tests/test_bwd_gpu.py -k"
( timeout 150 $P "default or poisoned or autograd" >"$R/t1.log" 2>&1 ) &
( timeout 150 $P "switches" >"$R/t2.log" 2>&1 ) &
( timeout 150 $P "dq_paths or two_cta_odd or bitwise or reorders" >"$R/t3.log" 2>&1 ) &
step 150 python run.py sweep experiment=fault_demo results_dir="$R" job_timeout_s=30 bench=quick
wait
for f in "$R"/t?.log; do echo "--- $f" >>"$LOG"; tail -n 25 "$f" >>"$LOG"; done
rm -f "$R"/t?.log

# 2. calibration microbenchmarks
step 45 python -m experiments.microbench --out "$R/microbench/rows.jsonl"

# 3. forward against the peers (paper grid; flex left out of this short run: its per-shape compile is slow)
PEERS='experiment.peers=[fa4_official,sdpa_cudnn,sdpa_flash]'
step 80 python run.py sweep experiment=fwd_peers results_dir="$R" bench=quick "$PEERS" 'shape.grid.hdims=[128]'
step 45 python run.py sweep experiment=fwd_peers results_dir="$R" bench=quick "$PEERS" 'shape.grid.hdims=[64]' 'shape.grid.seqlens=[4096,8192,16384,32768]'

# 4. backward against the peers
step 70 python run.py sweep experiment=bwd_peers results_dir="$R" bench=quick 'experiment.peers=[fa4_official,fa4_official_det,sdpa_cudnn,sdpa_flash]' 'shape.grid.hdims=[128,64]' 'shape.grid.seqlens=[8192,2048,32768]'

# 5. ablations at seqlen 8k
step 55 python run.py sweep experiment=fwd_ablation results_dir="$R" bench=quick 'shape.grid.hdims=[64,128]' 'shape.grid.seqlens=[8192]' 'shape.grid.causal=[false]'
step 40 python run.py sweep experiment=bwd_ablation results_dir="$R" bench=quick job_timeout_s=40 'shape.grid.seqlens=[8192]'
step 25 python run.py sweep experiment=fwd_peers results_dir="$R" bench=quick "$PEERS" 'shape.grid.hdims=[256]' 'shape.grid.seqlens=[8192,16384]'
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >>"$OUT/gpu.txt"
echo "=== done $(date -u +%T)" | tee -a "$LOG"
