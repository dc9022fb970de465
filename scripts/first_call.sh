#!/usr/bin/env bash
# The first device call of a session, adapted to the card that came (sessions 52-59 asked for an H200 and mostly got an
# H100 or nothing): on an H200 it re-times the stale committed forward rows (scripts/h200_rerun.sh, RERUN=stale: hd128,
# then hd 64 / 256 / (192, 128)); on any other card, whose rows may not enter results/h200/, the session A/Bs and GPU
# tests still owed (scripts/sched_check.sh parts, in order, until DEADLINE seconds). Logs under <out_dir>.
# Usage on the GPU host:  source .gpu/boot.sh && bash scripts/first_call.sh <out_dir> [sched parts, default "29 21 27"]
set -u
O=${1:?usage: scripts/first_call.sh <out_dir> [parts]}
PARTS=${2:-29 21 27}
DEADLINE=${DEADLINE:-560}
START=$SECONDS
export FA4LAB_GIT_SHA=${FA4LAB_GIT_SHA:-$(cat .gpu/sha 2>/dev/null)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "card: $GPU, git ${FA4LAB_GIT_SHA:-unknown}"
left() { echo $((DEADLINE - (SECONDS - START))); }
if [[ "$GPU" == *H200* ]]; then
  RERUN=stale CAP=$(( $(left) / 2 )) bash scripts/h200_rerun.sh "$O/p" fwd128nf 2>&1 | tail -n 4
  RERUN=stale CAP=$(( $(left) - 20 )) bash scripts/h200_rerun.sh "$O/p" fwd 2>&1 | tail -n 4
else
  for p in $PARTS; do
    (( $(left) < 60 )) && { echo "part $p skipped: $(left) s left"; continue; }
    DEADLINE=$(left) bash scripts/sched_check.sh "$O/p$p" "$p" 2>&1 | tail -n 4
    grep -E "rc=|passed|failed" "$O/p$p/tests.log" 2>/dev/null | tail -n 3
    grep -vE "sdpa_cudnn|rc=" "$O/p$p/ab.log" 2>/dev/null | cut -c1-150
  done
fi
