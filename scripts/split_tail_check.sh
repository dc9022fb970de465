#!/usr/bin/env bash
# split_tail (kernels/sm90/fwd_tail.py) on the GPU host, in two device calls of at most 10 minutes each.
# Part 1: its GPU tests, then round-robin A/Bs at the paper grid's 32k tokens (non-causal): ours (the default), pers
#   (persistent=True), split (persistent + split_tail), official FA4 and cuDNN, hd128 at 4k / 8k / 16k / 32k (16k
#   also times a bf16 8192^3 matmul: the issue-11 "of GEMM" target).
# Part 2: hd256, (192, 128) and hd64 at 4k / 16k, and a decode-like call (hd128, 512 queries over 32k keys, batch 2:
#   128 tiles, fewer than the SMs, so every tile is cut).
# Every step gets min(its cap, the time left before DEADLINE seconds, default 570) so the call returns its logs.
# Logs and rows under <out_dir> (rows as scripts/fwd_ab.py writes them). Written 2026-12-04 (sessions 47-48), when no
# GPU was lent. Usage on the GPU host:  source .gpu/boot.sh && bash scripts/split_tail_check.sh <out_dir> [1|2]
set -u
O=${1:?usage: scripts/split_tail_check.sh <out_dir> [1|2]}
PART=${2:-1}
DEADLINE=${DEADLINE:-570}
START=$SECONDS
mkdir -p "$O"
export PYTHONPATH=${PYTHONPATH:-}:$PWD:$PWD/tests CUTE_DSL_ARCH=sm_90a PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv >"$O/gpu_part$PART.txt"
cap() {  # min(cap, seconds left before the deadline minus 10); 0 when none are left
  local left=$((DEADLINE - (SECONDS - START) - 10))
  ((left < 0)) && left=0
  echo $(($1 < left ? $1 : left))
}
ab() {  # hdim seqlen repeats cap [extra fwd_ab args]
  local hd=$1 s=$2 r=$3 c
  c=$(cap "$4")
  shift 4
  if ((c < 30)); then echo "hd$hd s$s skipped: no time left" >>"$O/ab.log"; return; fi
  timeout "$c" python scripts/fwd_ab.py --base-rev '' --hdims "$hd" --causal 0 --seqlens "$s" --cudnn \
    --repeats "$r" --cfg pers=persistent:true split=persistent:true,split_tail:true --out "$O/ab.jsonl" "$@" \
    >>"$O/ab.log" 2>&1
  echo "hd$hd s$s $* rc=$?" >>"$O/ab.log"
}
if [ "$PART" = 1 ]; then
  timeout "$(cap 180)" python -m pytest -q -x -p no:cacheprovider tests/test_fwd_split_tail_gpu.py >"$O/tests.log" 2>&1
  echo "tests rc=$?" >>"$O/tests.log"
  tail -n 5 "$O/tests.log"
  ab 128 4096 12 90 --batch 8
  ab 128 16384 12 100 --batch 2 --gemm 8192
  ab 128 8192 12 90 --batch 4
  ab 128 32768 10 100 --batch 1
else
  ab 128 512 12 80 --batch 2 --seqlen-k 32768
  for hd in 256 192 64; do for s in 4096 16384; do ab $hd $s 10 75 --batch $((32768 / s)); done; done
fi
grep -E "TFLOP|rc=|skipped" "$O/ab.log"
