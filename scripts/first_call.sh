#!/usr/bin/env bash
# The first device call of a session, adapted to the card that came (sessions 52-60 asked for an H200 and mostly got an
# H100 or nothing): the session A/Bs and GPU tests still owed (scripts/sched_check.sh parts), in order, until DEADLINE
# seconds; on an H200 the part "small" among them re-times the committed rows still stale (scripts/h200_rerun.sh,
# RERUN=stale: the 8k-token small problems, fwd_small + bwd_small; the forward grid, its ablation and fwd_gemm were
# re-timed in session 60). Another card's rows may not enter results/h200/: there "small" is skipped. Logs under
# <out_dir>.
# Usage on the GPU host:  source .gpu/boot.sh && bash scripts/first_call.sh <out_dir> [parts, default "29 30 small 21 27"]
set -u
O=${1:?usage: scripts/first_call.sh <out_dir> [parts]}
PARTS=${2:-29 30 small 21 27}
DEADLINE=${DEADLINE:-560}
START=$SECONDS
export FA4LAB_GIT_SHA=${FA4LAB_GIT_SHA:-$(cat .gpu/sha 2>/dev/null)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "card: $GPU, git ${FA4LAB_GIT_SHA:-unknown}"
left() { echo $((DEADLINE - (SECONDS - START))); }
for p in $PARTS; do
  (( $(left) < 60 )) && { echo "part $p skipped: $(left) s left"; continue; }
  if [[ "$p" == small ]]; then
    [[ "$GPU" == *H200* ]] || { echo "part small skipped: not an H200"; continue; }
    RERUN=stale CAP=$(( $(left) / 2 - 10 )) bash scripts/h200_rerun.sh "$O/p" small 2>&1 | tail -n 4
    continue
  fi
  DEADLINE=$(left) bash scripts/sched_check.sh "$O/p$p" "$p" 2>&1 | tail -n 4
  grep -E "rc=|passed|failed" "$O/p$p/tests.log" 2>/dev/null | tail -n 3
  grep -vE "sdpa_cudnn|rc=" "$O/p$p/ab.log" 2>/dev/null | cut -c1-150
done
