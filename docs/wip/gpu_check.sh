#!/bin/bash
# The GPU checks of this folder's patches, for one device call each (see README.md's table for what each step asks).
#
# Usage on the GPU host, from the repository root, after `source .gpu/boot.sh`:
#   bash docs/wip/gpu_check.sh det  LOGDIR   # bwd_det_rotate_spread + bwd_det_relaxed_release: A/B (~9 min)
#   bash docs/wip/gpu_check.sh dettest LOGDIR  # the same two patches: bitwise / two-writer GPU tests (~4 min)
#   bash docs/wip/gpu_check.sh n80  LOGDIR   # bwd256_two_cta_n80: GPU tests, then A/B against the 64-row kernel
#   bash docs/wip/gpu_check.sh fwd192c LOGDIR  # no patch: (192, 128) causal forward with the tuned 3-warpgroup tile
#   bash docs/wip/gpu_check.sh fwdpers LOGDIR  # no patch: the persistent forward at 4k-16k, never timed there (~4 min)
#   bash docs/wip/gpu_check.sh pre  LOGDIR   # bwd_pre_rows: backward GPU tests, then A/B at short sequences (~5 min)
#   bash docs/wip/gpu_check.sh rot256 LOGDIR # bwd256_det_rotate: hd256 deterministic GPU tests, then A/B (~5 min)
#   bash docs/wip/gpu_check.sh probe LOGDIR  # no patch: per-CTA cost vs per-step time of the main kernels (~1 min)
#
# Needs BASE (default LOGDIR/base): a folder holding the kernels/ tree before the patches, made where git is, e.g.
#   mkdir -p .gpu_s/base && git archive HEAD kernels | tar -x -C .gpu_s/base
# then on the device: BASE=.gpu_s/base bash docs/wip/gpu_check.sh det $OUT/r
# Patches are applied with `patch -p1` (the device copy has no .git) and stay applied; each step's log is
# LOGDIR/<step>.log, the A/B rows LOGDIR/<step>.jsonl. Each group fits one device call (10 min); dettest and fwd192c
# can share one: `bash docs/wip/gpu_check.sh dettest L; bash docs/wip/gpu_check.sh fwd192c L`.
set -u
what=${1:?det, dettest, n80, pre, rot256, probe, fwd192c or fwdpers}
L=${2:?log folder}
mkdir -p "$L"
B=${BASE:-$L/base}
here=$(cd "$(dirname "$0")" && pwd)
# files a patch creates are removed first (a device tree keeps untracked files of an earlier call)
apply() { grep -A1 '^--- /dev/null' "$here/$1" | sed -n 's,^+++ b/,,p' | xargs -r rm -f
          patch -p1 --forward -s < "$here/$1" && echo "applied $1" || echo "PATCH FAILED: $1"; }
step() { local name=$1 limit=$2; shift 2; echo "== $name ($(date +%T))"; timeout "$limit" "$@" > "$L/$name.log" 2>&1;
         local rc=$?; echo "   rc $rc ($(date +%T))"; tail -n 3 "$L/$name.log"; return $rc; }
case $what in
  det)
    apply bwd_det_rotate_spread.patch
    apply bwd_det_relaxed_release.patch
    # the new turn order must not hang: one bitwise case first, 90 s at most
    step det_smoke 90 python -m pytest -q -x -p no:cacheprovider -m gpu \
      "tests/test_bwd_gpu.py::test_deterministic_bitwise[False-128-rotate]" || exit 1
    # ours_t64_det: 64-row Q tiles (hd128: M = 2N, so the spread starts put a Q tile's turns 2 steps apart)
    step det_ab 400 python scripts/bwd_ab.py --hdims 128 64 --causal 0 1 --seqlens 1024 8192 16384 --repeats 10 \
      --only ours ours_det ours_base_det ours_t64_det --base "$B" --out "$L/det_ab.jsonl"
    step det_ab192 120 python scripts/bwd_ab.py --hdims 192 --causal 0 --seqlens 1024 8192 16384 --repeats 10 \
      --only ours ours_det ours_base_det --base "$B" --out "$L/det_ab192.jsonl"
    ;;
  dettest)
    apply bwd_det_rotate_spread.patch
    apply bwd_det_relaxed_release.patch
    step det_tests 300 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_bwd_gpu.py \
      -k "deterministic_bitwise or det_schedule_rotate" tests/test_bwd_det_two_writers_gpu.py
    ;;
  n80)
    apply bwd256_two_cta_n80.patch
    # one small case first, with a short limit: a new kernel that hangs (a barrier or turn protocol wrong) costs 90 s
    step n80_smoke 90 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_bwd_two_cta_n80_gpu.py \
      -k "pair_edges and b1-sq150-sk160 and full" || exit 1
    step n80_tests 300 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_bwd_two_cta_n80_gpu.py
    step n80_ab 200 python scripts/bwd_ab.py --hdims 256 --causal 0 1 --seqlens 1024 8192 16384 --repeats 10 \
      --only ours ours_n80 ours_det ours_n80_det --out "$L/n80_ab.jsonl"
    ;;
  pre)
    apply bwd_pre_rows.patch
    step pre_tests 300 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_bwd_gpu.py -k "test_bwd_default"
    step pre_ab 200 python scripts/bwd_ab.py --hdims 128 64 --causal 0 1 --seqlens 1024 2048 8192 --repeats 10 \
      --only ours ours_base --base "$B" --out "$L/pre_ab.jsonl"
    ;;
  rot256)
    apply bwd256_det_rotate.patch
    step rot256_smoke 90 python -m pytest -q -x -p no:cacheprovider -m gpu \
      "tests/test_bwd_wide_two_cta_gpu.py::test_two_cta_hd256_switches[full-deterministic=True]" || exit 1
    step rot256_tests 300 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_bwd_wide_two_cta_gpu.py \
      tests/test_bwd_gpu.py -k "(deterministic or switches) and 256"
    step rot256_ab 200 python scripts/bwd_ab.py --hdims 256 --causal 0 --seqlens 1024 2048 4096 --repeats 10 \
      --only ours ours_det ours_base_det ours_1cta ours_rotq --base "$B" --out "$L/rot256_ab.jsonl"
    ;;
  probe)
    # is a persistent backward worth it? (scripts/bwd_cta_overhead.py: per-CTA cost and per-step time, ours and
    # official, from walks of 1..16 Q tiles at 1024-CTA grids)
    step probe128 120 python scripts/bwd_cta_overhead.py --hdim 128
    step probe64 120 python scripts/bwd_cta_overhead.py --hdim 64
    ;;
  fwdpers)
    # persistent=True was +4-5% at hd128 non-causal against a since-reverted loop (session_ab/fwd_loop_split_persistent)
    # and was only re-timed at 1k / 2k after the port; at 4k-16k against today's default it was never timed (0 spills
    # on CPU at hd 64 / 128 / 256, causal both)
    step fwdpers_ab 300 python scripts/fwd_ab.py --hdims 128 256 64 --causal 0 1 --seqlens 4096 16384 --repeats 10 \
      --base-rev '' --cfg pers=persistent:true --out "$L/fwdpers_ab.jsonl"
    ;;
  fwd192c)
    # the non-causal tuned tile (conf/tuned/sm90.yaml) at causal, on top of the causal default's causal_split +
    # rescale_before_pv (0 LDL / STL in the CPU SASS; with rescale_before_pv it spilled non-causal), and without it
    step fwd192c_ab 200 python scripts/fwd_ab.py --hdims 192 --causal 1 --seqlens 8192 16384 --repeats 10 --base-rev '' \
      --cfg w3=tile_m:192,tile_n:80,consumer_regs:160 w3nopv=tile_m:192,tile_n:80,consumer_regs:160,rescale_before_pv:false \
      --out "$L/fwd192c_ab.jsonl"
    ;;
  *) echo "unknown: $what (det, dettest, n80, pre, rot256, probe, fwd192c or fwdpers)"; exit 2 ;;
esac
