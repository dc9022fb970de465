#!/usr/bin/env bash
# split_tail (kernels/sm90/fwd_tail.py) on the GPU host, one device call: its GPU tests, then round-robin A/Bs at the
# paper grid's 32k tokens (non-causal): ours (the default), pers (persistent=True), split (persistent + split_tail)
# and official FA4, hd128 at 4k / 8k / 16k / 32k, then hd256, (192, 128) and hd64 at 4k / 16k. Logs and rows under
# <out_dir> (rows as scripts/fwd_ab.py writes them). Written 2026-12-04 (session 47), when no GPU was lent.
# Usage on the GPU host:  source .gpu/boot.sh && bash scripts/split_tail_check.sh <out_dir>
set -u
O=${1:?usage: scripts/split_tail_check.sh <out_dir>}
mkdir -p "$O"
export PYTHONPATH=${PYTHONPATH:-}:$PWD:$PWD/tests CUTE_DSL_ARCH=sm_90a PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv >"$O/gpu.txt"
timeout 200 python -m pytest -q -x -p no:cacheprovider tests/test_fwd_split_tail_gpu.py >"$O/tests.log" 2>&1
echo "tests rc=$?" >>"$O/tests.log"
tail -n 5 "$O/tests.log"
ab() {  # hdim seqlen repeats cap
  timeout "$4" python scripts/fwd_ab.py --base-rev '' --hdims "$1" --causal 0 --seqlens "$2" --batch $((32768 / $2)) \
    --repeats "$3" --cfg pers=persistent:true split=persistent:true,split_tail:true --out "$O/ab.jsonl" >>"$O/ab.log" 2>&1
  echo "hd$1 s$2 rc=$?" >>"$O/ab.log"
}
for s in 4096 8192 16384 32768; do ab 128 $s 12 120; done
for hd in 256 192 64; do for s in 4096 16384; do ab $hd $s 10 90; done; done
grep -E "TFLOP|rc=" "$O/ab.log"
