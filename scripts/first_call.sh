#!/usr/bin/env bash
# The first device call of a session, adapted to the card that came (sessions 52-62 asked for an H200 and mostly got an
# H100 or nothing): the session A/Bs and GPU tests still owed (scripts/sched_check.sh parts), in order, until DEADLINE
# seconds; on an H200 the part "stale" among them re-times the committed rows still stale (scripts/h200_rerun.sh,
# RERUN=stale, parts fwd64256, fwd128nf, abl_fwd and small: hd64 non-causal 2k-8k since session 61 made persistent its
# default there, hd 64 / 128 non-causal since session 63 made p_before_vote theirs, and the 8k-token small problems,
# fwd_small + bwd_small). Another card's rows may not enter results/h200/: there "stale" is skipped. Logs under <out_dir>.
# Parts in H200_ONLY (default "stale 36": sched_check part 36, hd64 non-causal persistent at 16k / 32k) run only on an
# H200 and are skipped elsewhere; parts 45 (o_via_v_stage: its GPU tests and A/Bs), 44 (hd256's ceilings: fwd_probe
# no_softmax and free_o) and 43 (hd128 spec_warp_redo with part of Q in registers, then the forward GPU files still
# owed, in parallel) run on any card, and need about two calls; on an H200 the stale rows then want one more
# (scripts/first_call.sh <out_dir> "stale 36"). Keep DEADLINE under ~540: the bundle's
# boot comes before it, inside the call's 600 s (session 65's first call, DEADLINE 560, hit that limit).
# Usage on the GPU host:  source .gpu/boot.sh && bash scripts/first_call.sh <out_dir> [parts, default "48 stale 36"]
# (parts 40 / 41 / 42 ran in session 65 on an H100; owed: parts 45, 44 and 43 on any card, the stale rows (hd64 since
# session 64's default, hd 64 / 128 non-causal since 63's) and part 36 on an H200)
set -u
O=${1:?usage: scripts/first_call.sh <out_dir> [parts]}
PARTS=${2:-48 stale 36}
H200_ONLY=" ${H200_ONLY:-stale 36} "
DEADLINE=${DEADLINE:-540}
START=$SECONDS
export FA4LAB_GIT_SHA=${FA4LAB_GIT_SHA:-$(cat .gpu/sha 2>/dev/null)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "card: $GPU, git ${FA4LAB_GIT_SHA:-unknown}"
left() { echo $((DEADLINE - (SECONDS - START))); }
for p in $PARTS; do
  (( $(left) < 60 )) && { echo "part $p skipped: $(left) s left"; continue; }
  if [[ "$H200_ONLY" == *" $p "* && "$GPU" != *H200* ]]; then echo "part $p skipped: not an H200"; continue; fi
  if [[ "$p" == stale ]]; then
    for r in fwd64256 fwd128nf abl_fwd small; do
      (( $(left) < 60 )) && { echo "rerun $r skipped: $(left) s left"; continue; }
      RERUN=stale CAP=$(( $(left) / 2 - 10 )) bash scripts/h200_rerun.sh "$O/p" "$r" 2>&1 | tail -n 4
    done
    continue
  fi
  DEADLINE=$(left) bash scripts/sched_check.sh "$O/p$p" "$p" 2>&1 | tail -n 4
  grep -E "rc=|passed|failed" "$O/p$p/tests.log" 2>/dev/null | tail -n 3
  grep -vE "sdpa_cudnn|rc=" "$O/p$p/ab.log" 2>/dev/null | cut -c1-150
done
# the device returns at most 8 files from $OUT: the parts' folders travel back as one archive
(cd "$O" && d=$(ls -d p*/ 2>/dev/null) && [[ -n "$d" ]] && tar czf logs.tgz $d && rm -rf $d)
