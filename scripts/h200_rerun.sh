#!/usr/bin/env bash
# Issue 10, point 7: re-run the paper grid with round-robin timing (kind: compare) into the committed H200 set
# results/h200/, one part per device command (each part is capped at 500 s of sweeping, so a command stays under
# 9 minutes). Rows are flushed per job and every sweep resumes: run the same part again until its sweep line says
# "running 0". Older separately timed rows stay in the files; analysis prefers the round-robin rows cell by cell.
# Usage on the GPU host:
#   source .gpu/boot.sh && FA4LAB_GIT_SHA=<commit> bash scripts/h200_rerun.sh <out_dir> <part>
# parts (rough time on one H200 with bench=quick: 10 rounds, settle <= 2 s per mode):
#   fwd128   fwd_peers, hdim 128, with flex           (12 shapes x 5 backends; flex compiles per shape: 5-9 min)
#   fwd      fwd_peers, hdim 64 / 256 / (192, 128)    (36 shapes x 4 backends: ~6-8 min)
#   bwd128   bwd_peers, hdim 128, with flex           (12 shapes x 6 backends: ~6-9 min)
#   bwd      bwd_peers, hdim 64 / 256 / (192, 128)    (36 shapes; ours only at 64: ~5-7 min)
#   bwd256   bwd_peers, hdim 256 alone                (12 shapes: ~3 min)
#   bwd6419  bwd_peers, hdim 64 and (192, 128)        (24 shapes: ~5-7 min)
#   bwd64nc  bwd_peers, hdim 64 non-causal alone (6 shapes: ~2-3 min)
#   bwd192   bwd_peers, hdim (192, 128) alone; SEQLENS='[16384,32768]' picks lengths (12 shapes: ~3 min)
#   bwdcell  bwd_peers at HDIMS= CAUSAL= SEQLENS= (Hydra lists, e.g. HDIMS='[128]' CAUSAL='[true]' SEQLENS='[32768]';
#            peers as bwd: a second sample of single cells)
#   fwdshort fwd_peers, hdim 64 / 128 causal at 1k / 2k / 4k (the persistent causal defaults; 6 shapes: ~2 min)
#   fwd192   fwd_peers, hdim (192, 128) alone         (12 shapes x 4 backends: ~2-3 min)
#   fwd64256 fwd_peers, hdim 64 and 256               (24 shapes x 4 backends: ~5-7 min)
#   fwd128nf / bwd128nf   fwd128 / bwd128 without flex (peers as the other parts; flex's rows stay as they were)
#   abl_fwd  fwd_ablation, hdim 128 + hdim 64 at 8k   (13 shapes x 19 entries, each checked: ~6-9 min)
#   abl_bwd  bwd_ablation, hdim 128                   (12 shapes x 8 entries: ~4-6 min)
#   compile  compile_time (fresh process per sample)  (24 samples x ~10-20 s: ~5-8 min)
#   verify   every GPU test file (bwd, fwd, torch.library ops, isolation), logs under <out_dir>   (~6-8 min)
#   bwd_ab   scripts/bwd_ab.py at 1k/2k/8k + host time per call (session A/B, not committed rows) (~4 min)
#   exp2ab   fwd_ablation at hd64 8k/16k non-causal: exp2 fractions 1/16..1/4 vs 0 (issue 11.4)   (~4-6 min)
#   gemm     fwd_gemm: hd128 non-causal 4k-32k with a bf16 matmul timed in the same rounds (4 shapes: ~1-2 min)
#   small    fwd_small + bwd_small: the 8k-token small problems, hd 64 / 128, 1k / 2k (8 shapes each: ~2-4 min)
set -u
OUT=${1:?usage: scripts/h200_rerun.sh <out_dir> <part>}
PART=${2:?part: fwd128 fwd fwd192 fwd64256 bwd128 bwd bwd256 bwd6419 bwd64nc bwdcell bwd192 fwdshort fwd128nf bwd128nf abl_fwd abl_bwd compile verify bwd_ab exp2ab small gemm}
R=${R:-results/h200}  # R=<dir>: a fresh results dir (two parts at once on a 2-GPU host)
# RERUN=1: time the part's finished jobs again (after a default changed: the job keys name configs as written);
# RERUN=stale: only those timed on a kernel config today's defaults no longer compile (kernels/staleness.py)
CAP=${CAP:-500}
mkdir -p "$OUT"
# the bundle's packages must be importable (source .gpu/boot.sh first; extend PYTHONPATH, never overwrite it: a call
# that did lost six minutes of device time to failing imports, session 50)
python -c "import cutlass, hydra" 2>/dev/null || { echo "cutlass / hydra not importable: source .gpu/boot.sh first" >&2; exit 3; }
export PYTHONUNBUFFERED=1 CUTE_DSL_ARCH=sm_90a
LOG=$OUT/$PART.log
# rows land in the committed H200 sets only from an H200: a call for an H200 may run on an H100 (sessions 52-56). The
# analysis reads every results/<machine>/<experiment> set together (analysis.select), so another card's rows go to a
# folder outside results/ (R=$OUT/sets), or into results/h200 with ANY_GPU=1 (their gpu_name says which card)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
if [[ "$R" == results/h200* && "$GPU" != *H200* && -z "${ANY_GPU:-}" ]]; then
  echo "this GPU is '$GPU', not an H200: set R=<a folder outside results/> or ANY_GPU=1" | tee -a "$LOG" >&2
  exit 4
fi
sweep() {
  local exp=$1; shift
  echo "=== $(date -u +%T) $exp $*" | tee -a "$LOG"
  timeout "$CAP" python run.py sweep experiment="$exp" results_dir="$R" bench=quick progress=false ${RERUN:+rerun=$([ "$RERUN" = stale ] && echo stale || echo true)} "$@" >>"$LOG" 2>&1
  echo "=== rc=$? $(date -u +%T)" | tee -a "$LOG"
  cp "$R/$exp/rows.jsonl" "$OUT/$exp.jsonl" 2>/dev/null  # the rows since the archive (rows.jsonl.xz stays as is)
  grep -E "^$exp: .* jobs" "$LOG" | tail -1
}
NOFLEX='experiment.peers=[fa4_official,sdpa_cudnn,sdpa_flash]'
BWD_NOFLEX='experiment.peers=[fa4_official,fa4_official_det,sdpa_cudnn,sdpa_flash]'  # + official's deterministic mode
case "$PART" in
  fwd128)  sweep fwd_peers 'shape.grid.hdims=[128]' ;;
  fwd)     sweep fwd_peers 'shape.grid.hdims=[64,256,[192,128]]' "$NOFLEX" ;;
  fwd192)  sweep fwd_peers 'shape.grid.hdims=[[192,128]]' "$NOFLEX" ;;
  fwd64256) sweep fwd_peers 'shape.grid.hdims=[64,256]' "$NOFLEX" ;;
  bwd128)  sweep bwd_peers 'shape.grid.hdims=[128]' 'experiment.peers=[fa4_official,fa4_official_det,sdpa_cudnn,sdpa_flash,flex]' ;;
  bwd)     sweep bwd_peers 'shape.grid.hdims=[64,256,[192,128]]' "$BWD_NOFLEX" ;;
  fwdshort) sweep fwd_peers 'shape.grid.hdims=[64,128]' 'shape.grid.causal=[true]' 'shape.grid.seqlens=[1024,2048,4096]' \
             "$NOFLEX" ;;
  fwd128nf) sweep fwd_peers 'shape.grid.hdims=[128]' "$NOFLEX" ;;
  bwd128nf) sweep bwd_peers 'shape.grid.hdims=[128]' "$BWD_NOFLEX" ;;
  bwd256)  sweep bwd_peers 'shape.grid.hdims=[256]' "$BWD_NOFLEX" ;;
  bwd6419) sweep bwd_peers 'shape.grid.hdims=[64,[192,128]]' "$BWD_NOFLEX" ;;
  bwd64nc) sweep bwd_peers 'shape.grid.hdims=[64]' 'shape.grid.causal=[false]' "$BWD_NOFLEX" ;;
  bwdcell) sweep bwd_peers "shape.grid.hdims=${HDIMS:?}" "shape.grid.causal=${CAUSAL:?}" "shape.grid.seqlens=${SEQLENS:?}" \
             "$BWD_NOFLEX" ;;
  bwd192)  sweep bwd_peers 'shape.grid.hdims=[[192,128]]' ${SEQLENS:+"shape.grid.seqlens=$SEQLENS"} "$BWD_NOFLEX" ;;
  small)   sweep fwd_small; sweep bwd_small ;;
  gemm)    sweep fwd_gemm ;;
  abl_fwd) CAP=260; sweep fwd_ablation; sweep fwd_ablation 'shape.grid.hdims=[64]' 'shape.grid.seqlens=[8192]' ;;
  abl_bwd) sweep bwd_ablation job_timeout_s=300 ;;
  compile) sweep compile_time ;;
  verify)  # every GPU test (backward, forward, the torch.library ops, isolation), logs to $OUT
           for t in test_bwd_gpu test_fwd_gpu test_ops_gpu test_isolation; do
             timeout 300 python -m pytest -q -p no:cacheprovider -m gpu "tests/$t.py" >"$OUT/$t.log" 2>&1
             echo "=== $t: $(tail -n 1 "$OUT/$t.log")" | tee -a "$LOG"; done ;;
  bwd_ab)  # our backward vs official FA4 / cuDNN at short sequences, and the host time per call
           timeout 400 python scripts/bwd_ab.py --seqlens 1024 2048 8192 --host --out "$OUT/bwd_ab.jsonl" >"$OUT/bwd_ab.log" 2>&1
           grep -E "^hd|^host" "$OUT/bwd_ab.log" | tee -a "$LOG" ;;
  exp2ab)  # issue 11.4: the clamp-free software exp2 at hd64, fractions 1/16..1/4 against 0, interleaved
           CAP=400; sweep fwd_ablation 'shape.grid.hdims=[64]' 'shape.grid.seqlens=[8192,16384]' 'shape.grid.causal=[false]' \
             'experiment.configs=[{name: full, config: {}}]' '~experiment.sweep_fields.rescale_threshold' \
             'experiment.sweep_fields.exp2_emu_fraction=[0.0625,0.125,0.1875,0.25]' ;;
  *) echo "unknown part $PART"; exit 2 ;;
esac
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv >>"$OUT/gpu.txt" 2>&1
