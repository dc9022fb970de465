#!/usr/bin/env bash
# Two parts of scripts/h200_rerun.sh at once on a 2-GPU host, one part per GPU, each into its own fresh results dir
# (R=<out>/<part>/rows), so neither appends to the other's rows files. Merge the returned <exp>.jsonl files into
# results/h200/<exp>/rows.jsonl afterwards.
# Usage on the GPU host:  source .gpu/boot.sh && FA4LAB_GIT_SHA=<commit> bash scripts/h200_pair.sh <out_dir> <part0> <part1>
set -u
OUT=${1:?usage: scripts/h200_pair.sh <out_dir> <part0> <part1>}
P0=${2:?part for GPU 0}; P1=${3:?part for GPU 1}
mkdir -p "$OUT/$P0" "$OUT/$P1"
nvidia-smi -L
CUDA_VISIBLE_DEVICES=0 R="/tmp/rows_$P0" bash scripts/h200_rerun.sh "$OUT/$P0" "$P0" &
CUDA_VISIBLE_DEVICES=1 R="/tmp/rows_$P1" bash scripts/h200_rerun.sh "$OUT/$P1" "$P1" &
wait
