#!/usr/bin/env bash
# Parts of scripts/h200_rerun.sh on a 2-GPU host: GPU 0 runs the parts of list 0 one after the other, GPU 1 those of
# list 1 at the same time. Each GPU's sweeps write to their own fresh results dir (R=/tmp/rows_gpu<i>), so neither
# appends to the other's rows files; each part's logs and rows go to <out_dir>/gpu<i>/ (<exp>.jsonl per experiment).
# Merge the returned <exp>.jsonl files into results/h200/<exp>/rows.jsonl afterwards.
# Usage on the GPU host:
#   source .gpu/boot.sh && FA4LAB_GIT_SHA=<commit> bash scripts/h200_pair.sh <out_dir> <parts0> <parts1>
# e.g. scripts/h200_pair.sh out bwd128,abl_bwd bwd,abl_fwd
set -u
OUT=${1:?usage: scripts/h200_pair.sh <out_dir> <parts for GPU 0, comma-separated> <parts for GPU 1>}
L0=${2:?parts for GPU 0}; L1=${3:?parts for GPU 1}
nvidia-smi -L
lane() {  # lane <gpu> <comma-separated parts>
  local gpu=$1 part
  mkdir -p "$OUT/gpu$gpu"
  for part in ${2//,/ }; do
    CUDA_VISIBLE_DEVICES=$gpu R="/tmp/rows_gpu$gpu" bash scripts/h200_rerun.sh "$OUT/gpu$gpu" "$part"
  done
}
lane 0 "$L0" &
lane 1 "$L1" &
wait
