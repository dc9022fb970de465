#!/usr/bin/env bash
# The first device call of a session, adapted to the card that came (sessions 52-75 asked for an H200 and mostly got an
# H100 or nothing): the session A/Bs and GPU tests still owed (scripts/sched_check.sh parts), in order, until DEADLINE
# seconds. On an H200 the part "stale" re-times the committed rows still stale (scripts/h200_rerun.sh, RERUN=stale,
# the parts in STALE_PARTS, default "small gemm": the 8k-token small problems, fwd_small + bwd_small, and the hd128
# non-causal matmul reference, fwd_gemm; session 76 re-timed fwd, fwd128nf and abl_fwd and ran parts 51 and 36 on an
# H200). Another card's rows may not enter results/h200/: there "stale" is skipped (H200_ONLY, default "stale 51 36":
# part 51, hd256's session-68 O default against the V stage, and part 36, hd64 non-causal persistent at 16k / 32k, run
# only on an H200 and only when named). Parts 49 (o_deferred) and 53 (skip_diag_wg) run on any card when named.
# Logs under <out_dir>; the parts' folders come back as one archive, logs.tgz (the device returns 8 files).
# Keep DEADLINE under ~540: the bundle's boot comes before it, inside the call's 600 s (session 65's first call,
# DEADLINE 560, hit that limit).
# Part "gaps" (any card; in the default order last, so on an H200 it runs only if time is left, elsewhere it is the call's
# work): scripts/stream_gaps.py --harness at hd256 causal 8k / 32k, spin 500 then 5000 us: whether the harness's
# per-call time at the cell issue 11 misses is the call's kernels or the GPU idling (session 74, H100: the kernels).
# Part "gputests" (any card, named only): the GPU test files (forward first) in one pytest run until the deadline,
# $O/gputests.log (first line: the card and commit, for analysis/gpu_tests.py); GPU_TESTS_FROM=<file> starts at
# that file, <file>::<test id> at that test (the "resume:" line a run cut by its deadline prints), GPU_TEST_FILES names
# other files (`python -m analysis.gpu_tests --files`: those not yet passed on today's kernels).
# Parts 55 / 54 (any card; session 79, CPU only then): o_deferred from registers and q_prefetch, their A/Bs at hd256
# causal 8k-32k and GPU files, then Nsight Compute's source page of hd256 causal 16k (ours, o_deferred alone and with
# q_prefetch, official FA4).
# Usage on the GPU host:
#   source .gpu/boot.sh && bash scripts/first_call.sh <out_dir> [parts, default "stale 55 54 gaps"]
set -u
O=${1:?usage: scripts/first_call.sh <out_dir> [parts]}
PARTS=${2:-stale 55 54 gaps}
H200_ONLY=" ${H200_ONLY:-stale 51 36} "
DEADLINE=${DEADLINE:-540}
START=$SECONDS
export FA4LAB_GIT_SHA=${FA4LAB_GIT_SHA:-$(cat .gpu/sha 2>/dev/null)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "card: $GPU, git ${FA4LAB_GIT_SHA:-unknown}"
mkdir -p "$O"
left() { echo $((DEADLINE - (SECONDS - START))); }
for p in $PARTS; do
  (( $(left) < 60 )) && { echo "part $p skipped: $(left) s left"; continue; }
  if [[ "$H200_ONLY" == *" $p "* && "$GPU" != *H200* ]]; then echo "part $p skipped: not an H200"; continue; fi
  if [[ "$p" == stale ]]; then
    for r in ${STALE_PARTS:-small gemm}; do
      (( $(left) < 60 )) && { echo "rerun $r skipped: $(left) s left"; continue; }
      RERUN=stale CAP=$(( $(left) / 2 - 10 )) bash scripts/h200_rerun.sh "$O/p" "$r" 2>&1 | tail -n 4
    done
    continue
  fi
  if [[ "$p" == gaps ]]; then
    for h in 500 5000; do
      (( $(left) < 60 )) && { echo "gaps $h skipped: $(left) s left"; continue; }
      log="$O/gaps_$h.log"
      CUTE_DSL_ARCH=${CUTE_DSL_ARCH:-sm_90a} PYTHONUNBUFFERED=1 timeout $(( $(left) - 10 )) \
        python scripts/stream_gaps.py --harness --hold-us $h --hdims 256 --causal 1 --seqlens 8192 32768 --calls 12 \
        --out "$O/harness_gaps.jsonl" > "$log" 2>&1
      echo "gaps $h rc=$?"
      if grep -qE "^hd" "$log"; then grep -E "^hd" "$log" | cut -c1-160; else tail -n 3 "$log"; fi
    done
    continue
  fi
  if [[ "$p" == gputests ]]; then
    # the GPU test files at this commit, forward first, in one pytest process until the deadline; -v lines per test
    # GPU_TESTS_FROM=<file> or <file>::<test id> (the "resume:" line a cut run prints): the tests before it are left out
    all=$( (ls tests/test_fwd*_gpu.py; ls tests/test_*_gpu.py tests/test_e2e_llama.py) | awk '!s[$0]++')
    from=${GPU_TESTS_FROM:-}; first=${from%%::*}; skip=()
    [[ -n "$from" ]] && all=$(echo "$all" | awk -v f="$first" '$0 == f {on = 1} on')
    files=${GPU_TEST_FILES:-$all}
    [[ -z "$files" ]] && { echo "gputests: no test file (GPU_TESTS_FROM=$from is not one)"; continue; }
    if [[ "$from" == *::* ]]; then
      ids=$(python -m pytest --collect-only -q -m gpu -p no:cacheprovider --rootdir=. "$first" 2>/dev/null |
              grep -F "$first::")
      echo "$ids" | grep -qxF -- "$from" || { echo "gputests: no test $from"; continue; }
      while IFS= read -r t; do [[ "$t" == "$from" ]] && break; skip+=(--deselect "$t"); done <<< "$ids"
      echo "gputests: resuming at $from ($(( ${#skip[@]} / 2 )) tests of $first left out)"
    fi
    # the header analysis/gpu_tests.py reads the log's card and commit from
    echo "# gputests: card ${GPU:-none}, git ${FA4LAB_GIT_SHA:-unknown}" > "$O/gputests.log"
    CUTE_DSL_ARCH=${CUTE_DSL_ARCH:-sm_90a} timeout $(( $(left) - 10 )) python -m pytest -m gpu -v -p no:cacheprovider \
      --rootdir=. "${skip[@]}" $files >> "$O/gputests.log" 2>&1
    echo "gputests rc=$? (124: cut by the deadline)"
    for w in PASSED FAILED ERROR SKIPPED; do echo "$w $(grep -cE "::.* $w" "$O/gputests.log")"; done
    grep -E "::.* (FAILED|ERROR)" "$O/gputests.log" | cut -c1-160 | head -n 20
    echo "last file reached: $(grep -oE '^tests/[a-z0-9_]+\.py' "$O/gputests.log" | tail -n 1)"
    # the test the deadline cut (its -v line has no outcome): the next call's GPU_TESTS_FROM
    cut=$(grep -E '^[^ ]+\.py::' "$O/gputests.log" | tail -n 1 | grep -vE ' (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)')
    [[ -n "$cut" ]] && echo "resume: GPU_TESTS_FROM=$(echo "$cut" | awk '{print $1}')"
    continue
  fi
  DEADLINE=$(left) bash scripts/sched_check.sh "$O/p$p" "$p" 2>&1 | tail -n 4
  grep -E "rc=|passed|failed" "$O/p$p/tests.log" 2>/dev/null | tail -n 3
  grep -vE "sdpa_cudnn|rc=" "$O/p$p/ab.log" 2>/dev/null | cut -c1-150
done
# the device returns at most 8 files from $OUT: the parts' folders travel back as one archive
(cd "$O" && d=$(ls -d p*/ 2>/dev/null) && [[ -n "$d" ]] && tar czf logs.tgz $d && rm -rf $d)
