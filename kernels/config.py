"""AttnConfig: every FA4 switch as one frozen, hashable, validated dataclass, plus per-arch defaults.

A config is *resolved* against (arch, hdim, causal): fields left as ``None`` take the value of the
defaults table below, or of the tuned-defaults file ``conf/tuned/<arch>.yaml`` where ``python run.py tune`` wrote a
measured winner for (hdim, causal) (read once, at import; no file = the table; a malformed file = a ConfigError
naming the file and the key). The resolved config is what kernels compile against and what results record.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

SUPPORTED_ARCHS = ("sm90", "sm100")
SUPPORTED_HDIMS = (64, 128, 192, 256)  # QK head dim; V head dim equals it except (192, 128)

# Per-arch defaults, keyed by (arch, hdim). Values are provisional until tuned on the hardware.
#   tile_m/tile_n : CTA tile of the forward (rows of Q, rows of K/V per step)
#   num_stages    : K/V shared-memory pipeline depth
#   exp2_emu_fraction : share of exponentials done on the FMA pipe, (non-causal, causal)
#   consumer_regs / producer_regs : setmaxnreg budgets per thread (Hopper warp specialisation)
#   persistent_max_seqlen : (non-causal, causal) longest seqlen_q at which AttnConfig.persistent=None runs the
#                   persistent forward (0 = never); not a config field: kernels/interface.py attention_forward applies it
#                   per call (kernels.config.persistent_by_default)
#   persistent_tile : (non-causal, causal) fields that a call made persistent BY THE SEQUENCE LENGTH runs instead of
#                   the resolved ones (None: none): a dict, or ((max_seqlen, dict), ...) where the first bound >= seqlen_q
#                   applies (none past the last); not a field: kernels/interface.py forward_config applies it when the
#                   config's tile_m / consumer_regs / producer_regs are the resolved defaults (pass persistent=True to
#                   keep the resolved config). H200 2026-12-01, hd64 causal 1k, 16k tokens, 8 rounds,
#                   outputs bitwise (results/h200/session_ab/fwd64_t128.jsonl): 128-row persistent / 192-row persistent
#                   1.094 (128-row one-tile-per-CTA 0.933); non-causal 1k 0.962, 2k 0.85-0.90: only hd64 causal <= 1k
#   two_cta       : whether AttnConfig.two_cta=None runs the 2-CTA backward at this head dim; not filled in by resolve():
#                   the sm90 backward applies it per call (kernels.config.two_cta_by_default; not with a window, softcap
#                   or varlen)
#   rescale_before_pv : the sm90 forward's O rescale issued between QK^T(j+1) and PV(j) (AttnConfig.rescale_before_pv);
#                   False everywhere (H200 2026-11-30, 16k tokens, one process, 10 rounds, outputs bitwise equal,
#                   on / off speed: (192, 128) 1.053 / 1.057 non-causal at 8k / 16k, 0.990 / 1.048 causal; hd128 16k
#                   1.012 non-causal, 0.978 causal): a per-(hdim, causal) winner belongs in conf/tuned/ (python run.py
#                   tune searches it); always False for sm100 (no such kernel: a correction warpgroup rescales there)
#   det           : (non-causal, causal) dicts of fields a deterministic config with det_schedule=None takes where they
#                   are None (its det_schedule: the dict's, else "rotate"); absent: ({}, {}). sm90 hd64 non-causal: lpt,
#                   16 heads, two dQ staging buffers (the entry's comment has the measurement)
#   bwd_lpt_heads : (non-causal, causal) AttnConfig.bwd_lpt_heads=None: the sm90 causal backward's grid longest K/V tile
#                   first, g heads interleaved (0 / absent: diagonal-most first). H200 2026-12-01, 16k tokens, 8-10
#                   rounds (results/h200/session_ab/bwd_lpt*.jsonl), speed vs shortest first at 1k / 2k / 4k / 8k / 16k:
#                   hd64 g=1 1.024 / 1.022 / 1.025 / 1.031 / 1.044 (g=4 1.004 / 1.016 / 1.034 / 1.040 / 1.041); hd128
#                   g=4 0.996 / 1.012 / 1.046 / 1.058 / 1.057 (g=1 1.003 / 1.006 / 1.011 / 1.022 / 1.068)
#   causal_split  : (non-causal, causal) AttnConfig.causal_split=None: the sm90 causal forward's diagonal and mask-free
#                   blocks in separate loops (absent: False); rescale_before_pv may be such a pair too
#   exp_in_branch : (non-causal, causal) AttnConfig.exp_in_branch=None: the sm90 forward's exponentials inside both arms
#                   of the tau decision (absent: False). H200 2026-12-01, speed vs off: hd128 causal 1.013 / 1.013 /
#                   1.022 (4k / 8k / 16k; 1.021 in a second 16k run); hd128 non-causal 16k 1.004, hd64 16k 1.004 /
#                   0.974 (non-causal / causal), hd256 1.000, (192, 128) causal 0.989-0.991: on at hd128 causal only
#   p_cvt_asm     : (non-causal, causal) AttnConfig.p_cvt_asm=None: the sm90 forward's P conversion as inline PTX, row
#                   sums pinned before the O-rescale branch, the K/V loop tested at its top (absent: off). H200 2026-12-01,
#                   16k tokens, 8 rounds, outputs bitwise equal (results/h200/session_ab/fwd_pcvt_all.jsonl), speed vs
#                   off at 8k / 16k: hd128 non-causal 1.017 / 1.026, hd64 1.007 / 1.005, (192, 128) 1.004 / 1.004,
#                   hd256 1.004 / 1.003 (causal 1.006 / 1.005); causal hd64 0.992 / 0.990, hd128 0.999 / 0.998,
#                   (192, 128) 0.998 / 0.998: off there (hd64 causal on since session 64, with p_before_vote and
#                   spec_warp_redo: 1.036-1.067 at 8k-32k, H100)
#   p_before_vote : (non-causal, causal) AttnConfig.p_before_vote=None: the sm90 forward's P V wait and P conversion
#                   before speculative_exp's vote (absent: off; resolve() fills it only where the call speculates)
#   spec_warp_redo : (non-causal, causal) AttnConfig.spec_warp_redo=None: speculative_exp's votes per warp, a warp's
#                   redo from the kept S (absent: off; resolve() fills it only where p_before_vote resolves on)
#   q_in_regs     : (non-causal, causal) AttnConfig.q_in_regs=None: the sm90 forward's QK^T with Q in registers (absent:
#                   off; resolve() fills it only on the table's 128 x 128 tile)
#   bwd_diag_align : (non-causal, causal) AttnConfig.bwd_diag_align=None: the sm90 causal 80-row backward walks Q tiles
#                   from each K/V tile's diagonal row (absent: off). H200 2026-12-01, 16k tokens, 10 rounds
#                   (results/h200/session_ab/bwd_diag.jsonl), speed vs off at hd128 causal 1k / 2k / 4k / 8k: 1.001 /
#                   1.017 / 1.018 / 1.009 (official / off: 1.080 / 1.051 / 1.008 / 0.991)
# O's path out of a persistent tile, as a persistent_tile entry may name it: from the accumulator registers in 16-byte
# stores (AttnConfig.o_direct + o_direct_wide). A caller who names any of O_PATH_FIELDS, the fields that say how O
# leaves, keeps the V-stage path (o_via_v_stage) in its place (persistent_tile_for): o_direct turns o_via_v_stage off.
# o_deferred says when O is stored, not how (until session 79 it was one of them and chose the V stage too).
O_DIRECT_WIDE = {"o_direct": True, "o_direct_wide": True}
O_PATH_FIELDS = ("o_direct", "o_direct_wide", "o_via_v_stage")

DEFAULTS: dict[tuple[str, int], dict] = {
    # sm90: 64 rows per consumer warpgroup (tile_m 192 = 3 warpgroups at 160 registers, 128 = 2 at 240).
    # exp2 split 0 on sm90: measured on the H200 (2026-11-29, b=2 s=8k bf16) every fraction > 0 was slower
    # (hd64: 515 -> 473 TFLOP/s at 1/4; hd128: 625 -> 591 at 1/8): each emulated exp2 costs ~9 FMA/ALU-pipe
    # instructions and pingpong already hides MUFU under the GEMMs. The switch stays for ablations.
    # bwd_tile_m: the backward's Q rows per step (its K/V tile is 128 rows, two MMA warpgroups); at hd128, 128 rows
    # do not fit the registers; hd256 runs the wide backward (kernels/sm90/bwd_wide.py, 2-CTA by default:
    # bwd_wide_two_cta.py) and (192, 128) kernels/sm90/bwd_wide192.py (64 x 128 tiles), both with 64-row Q tiles
    # persistent_max_seqlen: two H200 measurements (same process, interleaved, 10-12 rounds; 16k total tokens, hidden
    # 2048), persistent / one-tile speed. The old persistent kernel (aa63b90..a4ca8fc, on the split loop 12fc57e
    # reverted): 1.06-1.15x at 1k (hd 64/128, causal both), 1.02-1.05x at 2k except hd128 causal (0.99x), 0.74-0.92x
    # at 8k/16k causal. The current port (2026-11-30, results/h200/session_ab/fwd_persistent_port.jsonl): hd64 1k
    # 1.047x / 1.048x (non-causal / causal), hd64 2k 1.015x / 0.95x, hd128 1k 0.94x / 0.95x, hd128 2k 1.04x
    # non-causal (p20-p80 spreads up to +-8%; the hd128 causal 2k pair ran one kernel twice and read 0.94x: noise
    # ~+-7% at these short calls). Only hd64 <= 1k gained in both: the default runs it there. hd128 non-causal since
    # 2026-12-03 up to 16k: persistent / one-tile 1.110 / 1.057 / 1.027 / 1.012 / 1.006 at 1k / 2k / 4k / 8k / 16k,
    # 12 rounds, outputs bitwise (session_ab/fwd128_persistent_1k16k.jsonl, fwd128_persistent_2k8k.jsonl; 16k read
    # 1.007 in fwd_persistent_long.jsonl). Causal since 2026-12-03 (session_ab/fwd_pers_snake.jsonl,
    # fwd_pers_default16k.jsonl; 16k tokens, 12-16 rounds, outputs bitwise): hd128 <= 1k, plain round robin, 1.091-1.095x
    # the one-tile kernel (2k 1.001, 4k / 8k 0.93 / 0.89: one tile); hd64 1025-4096 with the table's 192-row tiles in
    # snake order (persistent_snake), 1.073-1.074 / 1.042-1.044x at 2k / 4k (8k 0.999: one tile). hd 192 / 256
    # measured 1.00 at 4k / 16k (hd256), so they stayed opt-in (AttnConfig(persistent=True)). Since session 49
    # (2026-12-05, archive_2026-12-05.tar.xz): causal persistent runs the greedy walk (AttnConfig.persistent_greedy,
    # through persistent_tile), which beats the one-tile kernel at every head dim up to 16k (hd128 32k too), and
    # hd128 non-causal runs persistent up to 32k with the split tail; the entries give the numbers.
    ("sm90", 64): dict(tile_m=192, tile_n=128, num_stages=2, exp2_emu=(0.0, 0.0), consumer_regs=160, producer_regs=32,
                       # non-causal persistent up to 8k since session 61 (H100 80GB HBM3, git 7fa1e98, 32k tokens, 10
                       # rounds, outputs bitwise; session_ab/sched_part29_30_21_h100.jsonl, part 21): persistent /
                       # one-tile 1.063 / 1.035 / 1.021 at 2k / 4k / 8k (H200 session 49: 1.020 at 4k); 16k 1.012
                       # (H200 session 49: 0.994) and 32k 1.007 [0.978, 1.017] stay one tile (session 62, H100, part 31:
                       # 1.061 / 1.034 / 1.021 again, 16k 1.012, 32k 1.007; sched_part31_h100.jsonl)
                       bwd_tile_m=128, persistent_max_seqlen=(8192, 16384), two_cta=False, rescale_before_pv=False,
                       # p_cvt_asm causal too since session 64 (with p_before_vote + spec_warp_redo below; alone it
                       # measured 0.990-0.992 there, H200 2026-12-01)
                       bwd_lpt_heads=(0, 1), p_cvt_asm=(True, True),
                       # the rescale vote on each lane's own maxima, the quad's max shuffles in the rescale arm
                       # (AttnConfig.lazy_row_max; outputs bitwise). H200 session 50 (archive_2026-12-05b,
                       # sched_lazy.jsonl), 32k tokens, 10 rounds: 1.039 non-causal 8k, 1.017 causal 4k
                       lazy_row_max=(True, True),
                       # AttnConfig.speculative_exp (kept blocks bitwise; a rescaled row's sum within a rounding).
                       # H100 session 52 (session_ab/fwd_spec_h100.jsonl.xz; no H200 lent), 32k tokens, 6-12
                       # rounds, speed vs the default of then: non-causal 1.012 / 1.012 / 1.013 at 2k / 8k / 16k,
                       # causal 1.028 / 1.032 at 4k / 16k
                       speculative_exp=(True, True),
                       # AttnConfig.p_before_vote (outputs bitwise on blocks that keep their maxima). H100 session 63
                       # (session_ab/p_before_vote_h100.jsonl; no H200 lent), 32k tokens, 8 rounds, speed vs the
                       # default of then: non-causal 1.007 / 1.044 / 1.044 at 8k (persistent) / 16k / 32k; causal 16k
                       # 0.946 (the causal loops' common path 326 -> 378 instructions in the CPU SASS; with p_cvt_asm
                       # 0.976, session 64). Causal too since session 64, with the two switches below
                       p_before_vote=(True, True),
                       # AttnConfig.spec_warp_redo (votes per warp, a warp's redo from the kept S; kept blocks bitwise).
                       # H100 session 64 (session_ab/spec_warp_redo_h100.jsonl; no H200 lent), 32k tokens, 6-8 rounds,
                       # speed vs the default of then: non-causal 1.048 / 1.066 / 1.034 / 1.032 at 4k / 8k (persistent)
                       # / 16k / 32k; causal with p_cvt_asm + p_before_vote 1.036 / 1.043 / 1.067 at 8k / 16k / 32k
                       # (the vote probe's bound at 16k: no_vote 1.035, fwd_probe_vote_pbv_h100.jsonl). hd128 non-causal
                       # 16k 0.947, hd256 causal 16k 1.000: not defaults there. H100 session 65 (sched_part41_h100.jsonl,
                       # 10-12 rounds, 0% throttled), this default over the one before it at the lengths session 64 did
                       # not time: causal 1.034 / 1.028 / 1.037 at 1k / 2k / 4k, non-causal 1.055 / 1.059 at 1k / 2k.
                       # hd128 non-causal 16k there: with Q from shared memory it gains 1.034 over that kernel, but the
                       # pair reads 0.982 of the default (Q in registers); (192, 128) 1.000 / 1.002 at 16k
                       spec_warp_redo=(True, True),
                       # PDL for the streaming postprocess (bwd_pdl alone measured 0.987-0.999 here; with the stream
                       # 1.03-1.055 at 8k tokens 1k / 2k; H200 2026-12-04, docs/DEFAULTS_HISTORY.md session 41)
                       bwd_pdl=(True, True), bwd_stream_post=(True, True),
                       # deterministic non-causal: lpt walks (16 heads interleaved) with two dQ staging buffers. H200
                       # 2026-12-04, one process, 6-10 rounds (session_ab/bwd64_det_dq2_*.jsonl), det / default at 1k /
                       # 2k / 4k / 16k: 0.961 / 0.958 / 0.953 / 0.941 against rotate's 0.956 / 0.939 / 0.927 / 0.910
                       # (rotate + 2 buffers 0.965 / 0.952 / 0.940 / 0.929); causal keeps spt (lpt16 + 2 buffers
                       # 0.79-0.93, spt + 2 buffers within +-0.007 of spt)
                       det=(dict(det_schedule="lpt", bwd_lpt_heads=16, bwd_dq_stages=2), {}),
                       # causal <= 1k: 128-row tiles (H200 s8k: 1.19x / 1.20x the speed of 64-row tiles); 1025-16k:
                       # the table's 192-row tiles; both on the greedy walk (AttnConfig.persistent_greedy; session 49,
                       # archive_2026-12-05: 1.007x the 128-row round robin at 1k, 1.027 / 1.021x the snake default at
                       # 2k / 4k, 1.030 / 1.015x the one-tile kernel at 8k / 16k; 32k 1.003 [0.997, 1.008]: one tile)
                       persistent_tile=(None, ((1024, dict(tile_m=128, consumer_regs=240, producer_regs=24,
                                                           persistent_greedy=True)),
                                               (16384, dict(persistent_greedy=True))))),
    # hd128 bwd_tile_m=80 (dQ^T per warpgroup): H200 2026-11-30, 16k tokens, same process, 10 rounds, speed vs 64-row
    # tiles: 1k 1.042 / 1.010 (non-causal / causal), 8k 1.075 / 1.063. two_cta, softcap and varlen have no 80-row
    # kernel: AttnConfig.resolve gives two_cta=True 64 rows, the backward runs softcap / varlen calls with 64 rows.
    ("sm90", 128): dict(tile_m=128, tile_n=128, num_stages=2, exp2_emu=(0.0, 0.0), consumer_regs=240, producer_regs=24,
                        bwd_tile_m=80, persistent_max_seqlen=(32768, 32768), two_cta=False, rescale_before_pv=False,
                        bwd_lpt_heads=(0, 4), exp_in_branch=(False, True), bwd_diag_align=(False, True),
                        p_cvt_asm=(True, False), bwd_det_two_writers=(True, True), pv_wait_mid=(True, False),
                        # H200 (session_ab/bwd_pdl_8k_32k.jsonl, archived bwd_pdl_dqrel.jsonl): 1.004-1.014 at 8k
                        # tokens (1k / 2k), 1.000-1.003 at 16k tokens, 0.999-1.000 at 32k tokens (4k / 16k)
                        bwd_pdl=(True, True),
                        # H200 2026-12-04 (docs/DEFAULTS_HISTORY.md, session 41): AttnConfig.bwd_stream_post
                        bwd_stream_post=(True, True),
                        # S = Q K^T with Q in registers (AttnConfig.q_in_regs). H200 2026-12-04, one process, 10-12
                        # rounds, outputs bitwise the default's; speed vs Q from shared memory, 32k tokens at 4k / 8k /
                        # 16k / 32k: non-causal 1.003 / 1.005 / 1.007 / 1.003, causal 1.003 / 1.004 / 1.006 / 1.007
                        # (p20 > 1 in 7 of 8; session_ab/fwd128_qrs_32ktok.jsonl); 16k tokens 1.002-1.007
                        # (fwd128_192_qrs.jsonl). (192, 128): 0.992-1.001, off.
                        q_in_regs=(True, True),
                        # AttnConfig.lazy_row_max (outputs bitwise). H200 session 50 (archive_2026-12-05b,
                        # sched_lazy.jsonl), 32k tokens, 10 rounds: 1.025 / 1.029 non-causal 8k / 16k, 1.012 causal 4k
                        lazy_row_max=(True, True),
                        # AttnConfig.speculative_exp (kept blocks bitwise; a rescaled row's sum within a rounding).
                        # H100 session 52 (session_ab/fwd_spec_h100.jsonl.xz; no H200 lent), 32k tokens, 6-12 rounds,
                        # speed vs the default of then: non-causal 1.047 / 1.031 / 1.032 at 2k / 8k / 16k, causal
                        # 1.007 / 1.032 / 1.044 at 1k / 4k / 16k (it takes over pv_wait_mid's and exp_in_branch's
                        # P V wait)
                        speculative_exp=(True, True),
                        # AttnConfig.p_before_vote. H100 session 63 (session_ab/p_before_vote_h100.jsonl), 32k tokens,
                        # 8 rounds, speed vs the default of then: non-causal 16k 1.018 (the split tail); causal 16k
                        # 0.940: off there. ((192, 128) non-causal 16k 1.001 and hd256 causal 16k 0.996: not defaults)
                        p_before_vote=(True, False),
                        # non-causal: the persistent kernel's partial last round cut over every SM where
                        # kernels.interface.split_tail_pays (AttnConfig.split_tail). H200 session 49 (archive_2026-12-05,
                        # sched_split_*.jsonl), 32k tokens, 10-12 rounds, speed vs the default of then: 1.011-1.013 /
                        # 1.018 / 1.026 at 8k / 16k / 32k (4k: 0.991-0.998, left out by the rule), 2.25 / 1.50 at
                        # 128 / 256 queries over 32k keys (512: 0.943-0.947, left out)
                        split_tail=(True, False),
                        # causal: persistent at every length on the greedy walk with exp_in_branch (spill-free with
                        # causal_split there). Session 49, speed vs the default of then (the round robin at 1k, one
                        # tile from 2k): 1.014 / 1.108 / 1.043 / 1.028 / 1.020 / 1.008 at 1k / 2k / 4k / 8k / 16k / 32k.
                        # From 2k the tiles are claimed at run time instead (AttnConfig.persistent_dynamic, without
                        # exp_in_branch / causal_split: the kernel AttnConfig(persistent=True, persistent_dynamic=True)
                        # runs; outputs bitwise the greedy walk's). H200 session 55 (session_ab/archive_2026-12-05d,
                        # fwd_dynamic.jsonl, sched_part18_dynamic.jsonl), 32k tokens, 8-12 rounds, speed vs the greedy
                        # walk: 1.010 / 1.018 / 1.023 / 1.018 / 1.012 at 2k / 4k / 8k / 16k / 32k (hd64 1.001-1.005,
                        # (192, 128) 1.008 and hd256 1.000 at 16k: not defaults there; non-causal 0.981-1.009 against
                        # the split tail: off)
                        persistent_tile=(None, ((1024, dict(persistent_greedy=True, exp_in_branch=True,
                                                            causal_split=True)),
                                                (32768, dict(persistent_dynamic=True, static=dict(
                                                    persistent_greedy=True, exp_in_branch=True,
                                                    causal_split=True)))))),
    # hd192 (only (192, 128) is supported): tile_n 128 (was 112, FA's choice for head_dim_v 192). H200 2026-11-30, same
    # process, 10 rounds (results/h200/session_ab/fwd192_tn128.jsonl): 128 / 112 speed 1.057 / 1.058 at 8k
    # (non-causal / causal), 1.071 / 1.084 at 16k; 0 spills in the SASS.
    # causal: causal_split (the mask-free loop converts P among the exponentials: 11 instructions after the last one
    # instead of 110). H200 2026-12-01, 16k tokens, one process, 8 rounds, outputs bitwise equal on those inputs
    # (results/h200/session_ab/fwd192c_splitpv.jsonl): with rescale_before_pv 1.012 / 1.015x the one-loop kernel at 8k
    # / 16k. rescale_before_pv off since 2026-12-03: its unconditional O rescale costs 66 FMUL per block in the
    # mask-free loop (session_ab/fwd192_ncu.txt); H200, one process, 12 rounds (session_ab/fwd192c_variants.jsonl):
    # 1.032 / 1.037 / 1.039x the kernel with it at 4k / 8k / 16k (paper grid: ours / official 1.02-1.03).
    ("sm90", 192): dict(tile_m=128, tile_n=128, num_stages=2, exp2_emu=(0.0, 0.0), consumer_regs=240, producer_regs=24,
                        bwd_tile_m=64, persistent_max_seqlen=(8192, 16384), two_cta=False, rescale_before_pv=False,
                        causal_split=(False, True), p_cvt_asm=(True, False), pv_wait_mid=(False, True),
                        bwd_det_two_writers=(True, True),
                        # AttnConfig.speculative_exp: H100 session 52 (session_ab/fwd_spec_h100.jsonl.xz), 32k tokens,
                        # 6-8 rounds, speed vs the default of then: non-causal 1.016 / 1.005 at 8k / 32k, causal 1.005
                        # at 8k (hd256: 1.001 non-causal with lazy_row_max, 1.004 causal at 8k; a default there since
                        # session 59)
                        speculative_exp=(True, True),
                        # non-causal: the split tail where kernels.interface.split_tail_pays (a call its length leaves
                        # one tile per CTA runs persistent for it). H200 session 49 (archive_2026-12-05,
                        # sched_split_decode_nc.jsonl), 32k tokens, split / one tile per CTA: 1.026 at 16k (4k 1.002:
                        # left out by the rule)
                        split_tail=(True, False),
                        # causal <= 16k: persistent on the greedy walk. Session 49 (archive_2026-12-05), speed vs one
                        # tile per CTA: 1.030 / 1.019 / 1.007 / 1.002 at 2k / 4k / 8k / 16k (the round robin 0.819 at 4k)
                        # Both with O through the last V stage (AttnConfig.o_via_v_stage), and non-causal <= 8k
                        # persistent for it: H100 session 66 (session_ab/session66_h100.log, session66_part47_h100.log;
                        # no H200 came), 32k tokens, 8 rounds, outputs bitwise the default's: non-causal persistent with
                        # it / one tile per CTA 1.020 / 1.016 at 4k / 8k (persistent alone 1.002 / 1.003); causal
                        # 1.003 at 16k
                        persistent_tile=(dict(o_via_v_stage=True),
                                         dict(persistent_greedy=True, o_via_v_stage=True))),
    # hd256 two_cta=True (the 2-CTA backward, kernels/sm90/bwd_wide_two_cta.py): H200 2026-11-30, same process, 10
    # rounds (results/h200/session_ab/bwd256_2cta.jsonl): 1.149-1.156x the one-CTA hd256 backward at 8k / 16k, causal
    # both (1.15-1.21x official FA4). Calls with a window / softcap, varlen calls run the one-CTA kernel
    # (two_cta_by_default). hd64 / 128 two_cta is slower: off there; (192, 128) has no 2-CTA mode.
    # bwd_two_cta_n80 (80-row K/V tiles per CTA, kernels/sm90/bwd_wide_two_cta80.py): H200 2026-12-02, one process,
    # 10 rounds (results/h200/session_ab/bwd256_two_cta_n80.jsonl): 1.026 / 1.056x the 64-row pairs at 1k (non-causal
    # / causal), 1.110 / 1.151 at 8k, 1.110 / 1.146 at 16k. Deterministic too since 2026-12-03 (dQ turns polled by
    # warp 1 instead of the exchange warp, the pairs' rotated walks): H200, one process, 10 rounds
    # (results/h200/session_ab/bwd256_n80_det.jsonl), det / default 0.944-0.976 non-causal, 0.931-0.956 causal at
    # 1k-16k, 1.04-1.10x the 64-row pairs' deterministic kernel. backward_config picks it for every 2-CTA call but
    # bwd_rotate_q.
    # causal persistent (the greedy walk) up to 32k since session 68: with O from registers in 16-byte stores it
    # ran 1.007 [p20-p80 1.006, 1.007] over one tile per CTA at causal 32k (H100, 14 rounds, 75% throttled; 1.007
    # [0.997, 1.026] in 8 rounds before; session_ab/fwd256c_long_h100_s68.jsonl), with the V stage 1.005 (session 66:
    # 1.003, the walk alone 1.005); outputs bitwise
    ("sm90", 256): dict(tile_m=128, tile_n=80, num_stages=2, exp2_emu=(0.0, 0.0), consumer_regs=240, producer_regs=24,
                        bwd_tile_m=64, persistent_max_seqlen=(8192, 32768), two_cta=True, rescale_before_pv=False,
                        p_cvt_asm=(True, True), bwd_two_cta_n80=True,
                        # lazy_row_max + speculative_exp, as at hd 64 / 128. H100 session 59 (no H200 lent;
                        # session_ab/fwd256_spec_h100.jsonl), 32k tokens, 10 rounds, speed vs the default of then:
                        # non-causal 1.007 / 1.001 (twice) at 4k / 8k, causal 1.006 (twice) / 1.001 at 4k / 16k; lazy
                        # alone 0.999-1.006, Q from registers for 2 / 4 of its k-blocks (q_regs_k) 0.999-1.003
                        lazy_row_max=(True, True), speculative_exp=(True, True),
                        # non-causal: the split tail where split_tail_pays, as at (192, 128). Session 49, split / one
                        # tile per CTA: 1.024 at 16k (4k 1.003: left out by the rule)
                        split_tail=(True, False),
                        # causal <= 16k: persistent on the greedy walk. Session 49 (archive_2026-12-05), speed vs one
                        # tile per CTA: 1.024 / 1.018 / 1.008 / 1.007 at 2k / 4k / 8k / 16k (the round robin 0.768 at 4k)
                        # Both with O through the last V stage (AttnConfig.o_via_v_stage), and non-causal <= 8k
                        # persistent for it: H100 session 66 (session_ab/session66_h100.log, session66_part47_h100.log;
                        # no H200 came), 32k tokens, 8 rounds, outputs bitwise the default's: non-causal persistent with
                        # it / one tile per CTA 1.052 / 1.028 / 1.015 / 1.005 at 1k / 2k / 4k / 8k (persistent alone
                        # 1.009 / 1.004 / 0.998 / 1.000; 16k on the split tail: 1.000 with it, left off); causal 1.006 /
                        # 1.007 / 1.003 / 1.002 at 2k / 4k / 8k / 16k; the 32k greedy walk 1.003 (g 1.005): 32k stayed
                        # one tile per CTA until session 68 (persistent_max_seqlen above).
                        # From 2049 tokens O leaves from registers in 16-byte stores instead (o_direct + o_direct_wide,
                        # no shared memory, no barrier across the warpgroups; a caller who names any O-path field gets
                        # the V-stage entry: O_PATH_FIELDS). H100 session 67 (session_ab/o_direct_wide_h100.jsonl, 6-10
                        # rounds, outputs bitwise), over the V stage: non-causal 1.005 / 1.006 at 4k / 8k (0.994 at 1k:
                        # left out), causal 1.005 / 1.003 / 1.003 at 4k / 8k / 16k. Session 68 (H100, part 51,
                        # session_ab/sched_part51_h100.jsonl, 8 rounds, GPU files at hd256 / (192, 128) 98 passed under
                        # it): 1.006 / 1.004 non-causal at 4k / 8k, causal 1.006 / 1.003 / 1.004 at 4k / 8k / 16k;
                        # 0.999 at 2k (not taken)
                        # Causal 2049-16384 tokens also with skip_diag_wg (a warpgroup whose rows all precede the
                        # tile's diagonal block skips it). H100 session 71 (session_ab/sched_part53_h100_s71.log, two
                        # processes, 10 rounds each, outputs bitwise; GPU file 9 passed twice): over the default of
                        # then 1.008 / 1.007 at 4k, 1.004 / 1.004 at 8k, 1.002 / 1.003 at 16k; 32k 1.001 [0.993,
                        # 1.002] (left out); 2k (the V stage) not measured
                        persistent_tile=(((2048, dict(o_via_v_stage=True)), (1 << 30, O_DIRECT_WIDE)),
                                         ((2048, dict(persistent_greedy=True, o_via_v_stage=True)),
                                          (16384, dict(persistent_greedy=True, skip_diag_wg=True, **O_DIRECT_WIDE)),
                                          (1 << 30, dict(persistent_greedy=True, **O_DIRECT_WIDE))))),
    # sm100 (Blackwell): the paper's 2 x 128-row Q tiles per CTA; compile-only here (no B200 to run on)
    ("sm100", 64): dict(tile_m=128, tile_n=128, num_stages=2, exp2_emu=(0.25, 0.25), consumer_regs=192, producer_regs=48, bwd_tile_m=128, persistent_max_seqlen=(0, 0), two_cta=False, rescale_before_pv=False),
    ("sm100", 128): dict(tile_m=128, tile_n=128, num_stages=2, exp2_emu=(0.25, 0.125), consumer_regs=192, producer_regs=48, bwd_tile_m=128, persistent_max_seqlen=(0, 0), two_cta=False, rescale_before_pv=False),
    ("sm100", 192): dict(tile_m=128, tile_n=128, num_stages=2, exp2_emu=(0.125, 0.125), consumer_regs=192, producer_regs=48, bwd_tile_m=128, persistent_max_seqlen=(0, 0), two_cta=False, rescale_before_pv=False),
    ("sm100", 256): dict(tile_m=128, tile_n=128, num_stages=1, exp2_emu=(0.0, 0.0), consumer_regs=192, producer_regs=48, bwd_tile_m=128, persistent_max_seqlen=(0, 0), two_cta=False, rescale_before_pv=False),
}

# deterministic backward dQ schedules (AttnConfig.det_schedule). "rotate" (the default since 2026-12-01, but hd64
# non-causal since 2026-12-04; H200: det / default 0.91-0.95 at hd 64 / 128 non-causal 1k-16k, against spt's
# 0.74-0.93; results/h200/session_ab/bwd_det_rotate):
# non-causal K/V tile n walks its Q tiles from tile n mod M, dQ turns in arrival order (kernels/sm90/bwd.py
# rotate_turn; hd256 in 2-CTA pairs: pair g from tile g mod M, turns over the pairs); causal runs "spt"; so do two_cta
# at hd 64 / 128, varlen, windows, and calls whose K/V tiles per head exceed the SM count (half of it for hd256 pairs;
# a head's CTAs must be co-resident: kernels/sm90/backward.py det_schedule_for_call). "lpt" (opt-in):
# hd 64 / 128 one-CTA calls launch the longest K/V tile first (max(8, bwd_lpt_heads) heads interleaved), walk Q
# tiles from the last one down (non-causal: ascending, naive's walks), dQ turns in K/V tile order (no residency
# bound); other calls as "rotate". H200 2026-12-01, 16k tokens, 10 rounds (results/h200/session_ab/bwd_det_lpt.jsonl),
# det / default at 1k / 2k / 8k: lpt hd64 0.76 / 0.72 / 0.85, hd128 0.87 / 0.85 / 0.86; spt 0.91 / 0.94 / 0.94, 0.92 /
# 0.90 / 0.85: not a default. Non-causal (2026-12-04, session_ab/bwd_det_lpt_nc_*.jsonl), g = 16 at 1k / 2k / 4k / 16k:
# hd64 0.947 / 0.949 / 0.938 / 0.932 against rotate's 0.955 / 0.942 / 0.927 / 0.919; with bwd_dq_stages=2 (2026-12-04,
# session_ab/bwd64_det_dq2_*.jsonl) 0.961 / 0.958 / 0.953 / 0.941 against 0.956 / 0.939 / 0.927 / 0.910: hd64
# non-causal's deterministic default since (DEFAULTS' ``det`` pair; det_schedule=None picks it)
DET_SCHEDULES = ("spt", "naive", "rotate", "lpt")
# None stays None through resolve(): decided per call (shapes; two_cta: head dims, window / softcap, varlen)
PER_CALL_FIELDS = ("persistent", "pack_gqa", "two_cta")
# fields added after configs were recorded: left out of to_dict() (so of config_hash and the compile cache key) while at
# this value, so every config, hash and key from before the field existed is unchanged
OMITTED_AT: dict[str, tuple] = {"cluster_m": (1,), "rescale_before_pv": (None, False), "bwd_lpt_heads": (None,),
                                "bwd_rotate_q": (False,), "causal_split": (None, False), "exp_in_branch": (None,),
                                "lpt_l2_mb": (None,),
                                "bwd_pdl": (None, False), "bwd_persistent": (None,), "bwd_dq_chunk_release": (None,),
                                "bwd_diag_align": (None,), "bwd_q_tail": (None,), "bwd_stream_post": (None,),
                                "bwd_dq_claim": (None,),
                                "bwd_det_two_writers": (None,), "bwd_det_diag_align": (None,), "bwd_dq_stages": (None,),
                                "bwd_two_cta_cta_release": (None, True),
                                "bwd_two_cta_dv_first": (None, False), "bwd_two_cta_n80": (None, False),
                                "p_cvt_asm": (None, False), "pv_wait_mid": (None, False),
                                "early_v_release": (None, False), "persistent_snake": (None, False),
                                "q_in_regs": (None, False), "split_tail": (None, False),
                                "persistent_greedy": (None, False), "lazy_row_max": (None, False),
                                "row_sum_mma": (None, False), "speculative_exp": (None, False),
                                "spec_redo_budget": (None,), "persistent_dynamic": (None, False),
                                "early_desc": (None, False), "skip_idle_wg": (None, False), "p_smem": (None, False),
                                "p_smem_early": (None, False), "q_regs_k": (None, 0), "qk_halves": (None, False),
                                "p_before_vote": (None, False), "o_direct": (None, False),
                                "spec_warp_redo": (None, False), "o_via_v_stage": (None, False),
                                "o_deferred": (None, False), "o_direct_wide": (None, False),
                                "skip_diag_wg": (None, False), "q_prefetch": (None, False)}
# switches that are None (the per-arch default, DEFAULTS' (non-causal, causal) pair or off) or a bool
OPTIONAL_BOOLS = ("causal_split", "exp_in_branch", "p_cvt_asm", "bwd_pdl", "bwd_persistent", "bwd_dq_chunk_release",
                  "bwd_diag_align", "bwd_q_tail", "bwd_stream_post", "bwd_dq_claim",
                  "pv_wait_mid", "bwd_det_two_writers", "bwd_det_diag_align", "early_v_release", "bwd_two_cta_cta_release",
                  "bwd_two_cta_dv_first", "bwd_two_cta_n80", "persistent_snake", "q_in_regs",
                  "split_tail", "persistent_greedy", "lazy_row_max", "row_sum_mma",
                  "speculative_exp", "persistent_dynamic", "early_desc", "skip_idle_wg", "p_smem", "p_smem_early",
                  "qk_halves", "p_before_vote", "o_direct", "spec_warp_redo", "o_via_v_stage", "o_deferred",
                  "o_direct_wide", "skip_diag_wg", "q_prefetch")
CLUSTER_M_VALUES = (1, 2)
# The finest exp2 split a kernel can compile: whole register fragments of a row. A forward row of tile_n columns has
# tile_n/8 fragments (16 at tile_n 128, the hd64 / hd128 default: sixteenths exact; 14 at 112, 10 at 80); a backward
# Q tile of bwd_tile_m rows has bwd_tile_m/8 (16 at 128 rows, 8 at 64). Any fraction in [0, 1] is accepted; it is
# rounded to whole fragments (quantized_exp2_fraction; kernels/sm90/exp2.py compiled_fraction reports the result).
EXP2_FRACTION_QUANTUM = 1.0 / 16.0


class ConfigError(ValueError):
    """An AttnConfig field (or an argument of the attention API) is out of range."""


@dataclass(frozen=True)
class AttnConfig:
    """All ablation switches of the FA4-style kernels. ``None`` means "the per-arch default"."""

    rescale_threshold: float = 8.0  # tau, log2 units; 0.0 = always rescale (FA2/FA3)
    exp2_emu_fraction: float | None = None  # share of exp2 done by the FMA polynomial, in [0, 1]
    pingpong: bool = True  # two consumer warpgroups alternate GEMMs and softmax (named barriers)
    intra_wg_overlap: bool = True  # a warpgroup's softmax(j) overlaps its own QK^T(j+1) / PV(j)
    deterministic: bool = False  # backward: dQ accumulated in a fixed order
    # backward: CTA pairs in a cluster of 2 share Q/dO and exchange dS. None = decided per call (two_cta_by_default):
    # on where DEFAULTS says so (sm90 hd256: 1.15x the one-CTA backward on the H200) and the call has no window,
    # softcap or varlen; True / False force it. Not filled in by resolve(); left out of to_dict() while None.
    two_cta: bool | None = None
    # deterministic backward: "rotate" (non-causal; else spt), "spt" (causal: shortest first), "naive", "lpt"; None =
    # DEFAULTS' ``det`` pair for deterministic configs (sm90 hd64 non-causal: "lpt" with bwd_lpt_heads=16 and
    # bwd_dq_stages=2), else "rotate" (resolve(); every other resolved config and its hash as before the None)
    det_schedule: str | None = None
    bwd_tile_m: int | None = None  # backward: Q rows per step (64 or 128; 80 at sm90 hdim 128); K/V rows per CTA stay 128
    # sm90 backward, causal, not deterministic (hd 64 / 128, one CTA, not varlen; elsewhere no effect): 0 = the grid
    # launches each head's diagonal-most K/V tile (least work) first; g >= 1 = longest first (K/V tile order, official
    # FA4's grid), the K/V tiles of g consecutive (batch, head)s interleaved. None = DEFAULTS' bwd_lpt_heads (sm90 causal:
    # hd64 1, hd128 4; resolve() fills only a nonzero value); left out of to_dict() while None.
    bwd_lpt_heads: int | None = None
    # sm90 backward, non-causal, not deterministic, no window: K/V tile n walks its Q tiles from tile n mod their count
    # (hd64 always does); True turns it on at hd128 too, and at hd256 (one CTA, or pair p from tile p mod the count in
    # 2-CTA clusters). Opt-in; left out of to_dict() while False.
    bwd_rotate_q: bool = False
    # sm90 backward (hd 64 / 128 FlashBwdSm90, not varlen; elsewhere no effect): programmatic dependent launch -- the
    # main kernel starts (K / V / Q loads) while the preprocess finishes and waits (griddepcontrol.wait) before it
    # reads LSE / dPsum / dQaccum; the postprocess likewise after the main kernel (kernels/sm90/bwd.py _set_pdl).
    # None = DEFAULTS' bwd_pdl (hd 64 / 128 both ways since 2026-12-04, hd64 for bwd_stream_post; absent: off;
    # resolve() fills only True, and not with bwd_persistent=True, which runs without PDL). Left out
    # of to_dict() while None or False.
    bwd_pdl: bool | None = None
    # sm90 backward (hd 64 / 128 FlashBwdSm90, one CTA, not deterministic, not varlen, no PDL; elsewhere no effect):
    # persistent main kernel -- grid min(SM count, K/V tiles), each CTA walks K/V tiles c, c + grid, ... in the launch
    # order, its pipelines carried from tile to tile, so the next tile's first Q / dO loads run under this tile's last
    # steps and epilogue and no CTA start (barrier init, descriptor prefetch) is paid per tile (kernels/sm90/bwd.py
    # _set_persistent). None = DEFAULTS' (absent: off). Left out of to_dict() while None. H200 2026-12-03, 16k tokens,
    # 8 rounds (results/h200/session_ab/bwd_persistent_ab.jsonl), speed vs the one-tile grid at 1k / 2k / 8k: non-causal
    # hd128 0.997 / 0.996 / 0.991, hd64 1.008 / 1.003 / 1.007; causal hd128 0.986 / 0.801 / 0.718, hd64 0.797 / 0.879 /
    # 0.955 (the static round robin balances unequal causal tiles worse than the hardware's block scheduler). Off.
    bwd_persistent: bool | None = None
    # sm90 backward (hd 64 / 128 FlashBwdSm90, not deterministic; elsewhere no effect): the dQ writer warp frees each MMA
    # warpgroup's staging chunk as soon as that chunk's bulk reduction has read it, instead of after every chunk of the
    # buffer has been (kernels/sm90/bwd.py dq_writer). None = DEFAULTS' (absent: off). Left out of to_dict() while None.
    bwd_dq_chunk_release: bool | None = None
    # sm90 backward, causal, 80-row Q tiles (hd128 FlashBwdSm90), not deterministic, one CTA, no window / varlen; elsewhere
    # no effect: K/V tile n walks 80-row Q tiles from its diagonal row (rounded down to 8) instead of from the 80-row
    # grid, so no CTA computes the fully masked rows above its diagonal; dQaccum chunk-major (kernels/sm90/bwd.py
    # _set_diag_align). None = DEFAULTS' (on at hd128 causal; absent: off). Left out of to_dict() while None.
    bwd_diag_align: bool | None = None
    # sm90 backward with bwd_diag_align's walks (hd128 causal, not deterministic); elsewhere no effect: each walk's last
    # Q tile multiplies only its 16-row blocks below seqlen_q (wgmma N = 16 .. 64 for S^T / dP^T / dQ^T, fewer k-blocks
    # for dV / dK) instead of all 80 rows; at 1k the rows past seqlen_q are 5.9% of the rows (kernels/sm90/bwd.py
    # _set_q_tail). None = DEFAULTS' (absent: off). Left out of to_dict() while None. H200 2026-12-04, 8k tokens, 16
    # rounds, outputs bitwise equal to the default's (results/h200/session_ab/bwd128c_qtail_8k.jsonl): speed vs off
    # 1.003 [0.999, 1.007] at 1k, 0.993 at 2k (official / ours 1.045 / 0.999): the rows it saves are not where the
    # 1k gap to official FA4 is; off.
    bwd_q_tail: bool | None = None
    # sm90 backward (hd 64 / 128, FlashBwdSm90) with bwd_pdl, not two_cta, persistent, varlen, q_tail or a window;
    # elsewhere no effect: the postprocess converts a dQ tile as soon as every K/V tile that visits it has counted its
    # completed reductions (the dQ writer's per-unit counts; deterministic: the dQ semaphores), on the SMs the main
    # grid's last CTAs leave, instead of after the whole main grid (kernels/sm90/bwd.py _set_stream_post, bwd_post.py
    # ``stream``). None = DEFAULTS' (hd 64 / 128 both ways since 2026-12-04; resolve() fills it only where the kernel
    # has it). Left out of to_dict() while None. H200 2026-12-04, one process, 8-12 rounds
    # (results/h200/session_ab/bwd_stream_default_8k.jsonl, _32k.jsonl), speed vs off: 8k tokens 1k / 2k 1.024-1.055
    # (hd 64 / 128, causal and not; deterministic 1.019-1.098); 32k tokens 4k 1.001-1.024, 16k 0.992-1.003 (power-capped)
    bwd_stream_post: bool | None = None
    # sm90 backward with bwd_stream_post (hd 64 / 128 FlashBwdSm90), causal or on rotated
    # Q walks (hd64 non-causal; hd128 with bwd_rotate_q); elsewhere no effect: the preprocess no longer zeroes dQaccum.
    # The first dQ writer to reach each dQ row unit claims it (an atomic CAS on a per-unit state next to the stream
    # counters) and stores its chunk there with a bulk copy instead of a reduce-add; later writers wait for the claim's
    # store to complete before they add (kernels/sm90/bwd.py _set_dq_claim). Deterministic kernels that stream (dQ
    # semaphores per Q tile): each tile's turn 0 stores. None = DEFAULTS' (absent: off). Left out of to_dict() while
    # None. H200 2026-12-04 (session_ab/bwd_dq_claim_*.jsonl), claim / default: 1.020-1.035 at 1k, 1.001-1.017 at 2k,
    # 0.985-1.003 at 4k, 0.963-0.988 at 16k (hd 64 / 128 causal, hd64 non-causal; 8k and 32k tokens): not a default.
    bwd_dq_claim: bool | None = None
    # sm90 backward, deterministic, (192, 128) (FlashBwd192Sm90) and hd 64 / 128 (FlashBwdSm90); elsewhere no effect:
    # two dQ writer warps take the Q tiles in turn, each hands the staging buffer back once its bulk reduction has READ
    # it and waits for the reduction to COMPLETE only before its semaphore release, so the MMA warps never wait for a
    # completion and two tiles' completions overlap (kernels/sm90/bwd.py dq_writer_pair). None = DEFAULTS' (on at
    # (192, 128) and hd128, filled only into deterministic configs; absent: off). hd128 non-causal since 2026-12-03,
    # where two writers also take the LSE preload (bwd.py lse_preload): H200, 16k tokens, 10 rounds, det / default at
    # 8k / 16k / 32k (session_ab/bwd128nc_det_2w_preload.jsonl) 0.966 / 0.951 / 0.932 against two writers without the
    # preload 0.932 / 0.926 / 0.912 and one writer 0.931 / 0.924 / 0.927. H200 2026-12-01, 16k tokens,
    # 10 rounds, det / default (two writers vs one): (192, 128) at 1k / 4k / 16k (session_ab/bwd192_det_2w.jsonl)
    # non-causal 0.923 / 0.898 / 0.905 vs 0.823 / 0.791 / 0.798, causal 0.973 / 0.982 / 0.979 vs 0.876 / 0.854 / 0.831;
    # hd 64 / 128 at 1k / 2k / 8k (session_ab/bwd_det_2w_sm90.jsonl): hd128 causal 0.970 / 0.948 / 0.915 vs 0.926 /
    # 0.906 / 0.855; hd128 non-causal 0.934 / 0.929 / 0.906 vs 0.904 / 0.918 / 0.940; hd64 causal 0.919 / 0.923 /
    # 0.946 vs 0.916 / 0.937 / 0.936; hd64 non-causal 0.881 / 0.877 / 0.893 vs 0.919 / 0.923 / 0.941 (off there).
    # Left out of to_dict() while None.
    bwd_det_two_writers: bool | None = None
    # sm90 one-CTA backward (FlashBwdSm90, hd 64 / 128); elsewhere no effect: the number of dQ staging buffers in shared
    # memory. None: two where the kernel's estimate leaves room (hd64 / hd128 64-row Q tiles), else one. 2 at hd64's
    # 128-row tiles: the dS mbarriers move in front of the LSE stages and the struct takes exactly 227 KB, so an MMA
    # warpgroup writes the next Q tile's dQ while the writer's bulk reduction still reads this one (kernels/sm90/bwd.py
    # _set_dq_stages); hd128's 80-row tiles have no room (the kernel raises). With bwd_persistent the hd64 causal kernel
    # spills (CPU SASS: 5 STL / 9 LDL; the persistent kernel alone 1 / 5). H200 2026-12-04 (session_ab/bwd64_det_dq2_*):
    # 0.996-1.006x the one-buffer kernel (not deterministic: not a default); deterministic +0.7-1.9% non-causal, on
    # there with det_schedule "lpt" (DEFAULTS' hd64 ``det`` pair). Left out of to_dict() while None.
    bwd_dq_stages: int | None = None
    # sm90 backward, deterministic, causal "spt" turns, hd128 80-row Q tiles (FlashBwdSm90), one CTA, no window / softcap /
    # varlen; elsewhere no effect: bwd_diag_align's walks (80-row Q tiles from each K/V tile's diagonal row, chunk-major
    # dQaccum) in the deterministic kernel, with one dQ semaphore per 8 Q rows instead of per Q tile (tiles of
    # different CTAs overlap): a tile's writer waits for its turn on each of its 10 row groups and releases all 10
    # (kernels/sm90/bwd_dq_writer.py det_diag_turn). None = DEFAULTS' (absent: off; filled only into deterministic
    # configs). Left out of to_dict() while None. H200 2026-12-04, 32k tokens, 12 rounds (session_ab/bwd128c_det_diag
    # .jsonl), det / default at 1k / 2k / 4k / 8k / 16k: 0.955 / 0.951 / 0.938 / 0.927 / 0.922 against the grid walk's
    # 0.980 / 0.955 / 0.926 / 0.923 / 0.926: off.
    bwd_det_diag_align: bool | None = None
    # sm90 backward, two_cta, hd 64 / 128 (FlashBwdSm90); elsewhere no effect. bwd_two_cta_cta_release: each CTA hands
    # the peer's dS buffer back with a CTA-scope remote arrive instead of a cluster-scope release, which compiled to a
    # MEMBAR.ALL.GPU in all 256 MMA threads per Q tile. bwd_two_cta_dv_first (hd128 only): the dV wgmma issued before
    # the dS exchange, as the one-CTA kernel does (docs/BWD_TWO_CTA.md: why two_cta loses at hd 64 / 128). H200
    # 2026-12-02, 16k tokens, 12 rounds (session_ab/bwd_two_cta_fast.jsonl), speed vs the fenced release: release
    # 1.05-1.09 at hd128, 1.09 at hd64 (same arithmetic; GPU tests bitwise with both switches), so on by default
    # (None = on, False = the cluster-scope release; left out of to_dict() while None or True: one kernel); dv_first
    # 0.91-0.99 of release alone, so off (None = off; left out of to_dict() while None or False).
    bwd_two_cta_cta_release: bool | None = None
    bwd_two_cta_dv_first: bool | None = None
    # sm90 backward, hd256 with two_cta: 80-row K/V tiles per CTA (kernels/sm90/bwd_wide_two_cta80.py: swapped dK / dV
    # / dQ GEMMs, dQ reduced from registers, deterministic turns polled by warp 1). None = the per-call default
    # (kernels/sm90/backward.py backward_config: on for 2-CTA calls without bwd_rotate_q, deterministic ones too,
    # DEFAULTS' bwd_two_cta_n80); False = the 64-row pairs; left out of to_dict() while None or False.
    bwd_two_cta_n80: bool | None = None
    # forward only: grid = min(SM count, tiles), each CTA walks tiles (kernels/sm90/fwd.py). None = decided per call by
    # the sequence length (DEFAULTS' persistent_max_seqlen; persistent_by_default), True / False force it. Not filled in
    # by resolve(), and left out of to_dict() (so of config_hash and the compile cache key) while None.
    persistent: bool | None = None
    # sm90 forward, persistent and causal (elsewhere no effect): the static round robin's odd full rounds run in reverse
    # CTA order (kernels/sm90/scheduler.py snake_tile), so the CTA that took one round's longest tile takes the next
    # round's shortest. None = off, except where a call is made persistent by its length and DEFAULTS' persistent_tile
    # turns it on (hd64 causal 2k-4k). Left out of to_dict() while None or False. H200 2026-12-03, causal, 16k tokens,
    # 12 rounds, outputs bitwise (results/h200/session_ab/fwd_pers_snake.jsonl), speed vs the one-tile kernel at 1k /
    # 2k / 4k / 8k: snake hd64 (192-row tiles) 0.936 / 1.073 / 1.044 / 0.999, plain round robin 0.968 / 1.037 / 0.997 /
    # 0.978; hd128 snake 1.006 / 0.908 / 0.837 / 0.806, plain 1.095 / 1.001 / 0.927 / 0.893.
    persistent_snake: bool | None = None
    # forward only: CTAs per thread-block cluster along the Q tiles (1 or 2). 2: the two CTAs of a cluster compute the
    # adjacent Q tiles 2i, 2i+1 of one (head, batch) and share every K/V tile load by TMA multicast (FA3's 2x1 cluster;
    # non-causal, not varlen, not persistent, no window: kernels/validate.py check_cluster). Opt-in (not in DEFAULTS);
    # left out of to_dict() at 1.
    cluster_m: int = 1
    # forward only, GQA / MQA: one CTA per K/V head computes a Q tile of (query position, head of the group) rows, so
    # each K/V tile is loaded once per group instead of once per Q head (kernels/sm90/fwd.py; not persistent, cluster
    # or varlen). No effect without grouped K/V. None = decided per call (pack_gqa_by_default: when the per-head Q tile
    # would be partly padding); True / False force it. Left out of to_dict() while None.
    pack_gqa: bool | None = None
    # sm90 forward: 64 rows per consumer warpgroup; 256 (four, 112 registers each at most, pingpong=False) is opt-in and
    # slower at hd64 on an H100 (README "Four consumer warpgroups")
    tile_m: int | None = None
    tile_n: int | None = None
    num_stages: int | None = None
    consumer_regs: int | None = None
    producer_regs: int | None = None
    # sm90 forward only, with intra_wg_overlap (FA3's RescaleOBeforeGemm): O is multiplied by a block's row factors in
    # the next step, between issuing the next QK^T and issuing that block's P V, instead of after its softmax (no
    # rescale branch after the exponentials; a rescale that tau skipped is a factor of 1.0: same output, bitwise).
    # None = the per-arch default (DEFAULTS / conf/tuned/: False unless tuned); left out of to_dict() while None or
    # False, so configs, hashes and compile keys from before the field existed are unchanged.
    rescale_before_pv: bool | None = None
    # sm90 forward, causal without a window, with intra_wg_overlap: the diagonal blocks after the first run in one loop
    # (masked) and the rest in another (mask-free), instead of one loop deciding per block; at hd128 / (192, 128) the
    # one-loop kernel compiles with its pipeline states and wgmma descriptors in vector registers (ptxas treats the
    # loop as divergent), the split one in uniform registers. None = DEFAULTS' causal_split (sm90 (192, 128) causal:
    # True; resolve() fills only True); left out of to_dict() while None or False.
    causal_split: bool | None = None
    # sm90 forward, tau > 0: each block's exponentials and row sums are computed inside both arms of the warp's
    # rescale decision (kernels/sm90/softmax.py), so ptxas keeps the wait for the in-flight P V GEMM after them (with
    # them after the decision, it hoists the wait above them: no softmax / P V overlap in a warpgroup). Same arithmetic
    # (the default's output up to the rounding of the row-sum update, FFMA or FMUL + FADD by layout: lse within an ulp;
    # tests/test_fwd_loop_shape_gpu.py). None = DEFAULTS' exp_in_branch (sm90 hd128 causal:
    # True; resolve() fills only True); left out of to_dict() while None.
    exp_in_branch: bool | None = None
    # sm90 forward, overlapped main loop (elsewhere no effect): P converted to 16 bits by inline PTX, the block's row
    # sums pinned before the rescale decision and the K/V loop's exit test kept at its top (kernels/sm90/fwd.py
    # steps_loop), so the conversions and sums run among the exponentials instead of after the O-rescale branch (LLVM
    # folds the plain conversion into the loop header). Same arithmetic. None = DEFAULTS' pair (on non-causal, and at
    # hd256 causal; absent: off). Left out of to_dict() while None.
    p_cvt_asm: bool | None = None
    # sm90 forward, causal: the L2 budget in MB that sizes the longest-first tile order's head groups (a group's K + V
    # fit in it: kernels/sm90/scheduler.py lpt_group_size). None = 32 (L2_BUDGET_BYTES); official FA4 sizes its L2
    # sections for 50. Host side only (the kernel takes the group size as an argument): same kernel, bitwise the same
    # output. Opt-in; left out of to_dict() while None.
    lpt_l2_mb: int | None = None
    # sm90 forward, overlapped main loop, tau > 0 (elsewhere no effect): the wait for the in-flight P V GEMM placed after
    # the first quarter of each block's exponentials (computed inside both arms of the warp's rescale decision, which
    # anchors the wait there for ptxas), the V stage released right after it, then the rest of the exponentials and the
    # row sums; P converted by inline PTX as p_cvt_asm does (p_cvt_asm's top-tested loop kept non-causal, counted loops
    # in the split causal kernel); exp_in_branch yields to it; at causal (no window) it implies causal_split (the
    # one-loop causal kernels compile divergent with it: pipeline state in vector registers). Official FA4's loop waits after 11 of its 66 exponentials and releases V there;
    # without this field ours waits before them all (split and non-causal loops) or after them all (exp_in_branch,
    # one-loop causal) and releases V after them all. Same arithmetic (the default's output up to the row-sum rounding).
    # None = DEFAULTS' (on at (192, 128) causal and hd128 non-causal; absent: off), left out of to_dict() while None or
    # False. H200 2026-12-01, 16k tokens, 8 rounds, outputs bitwise equal, speed vs off at 8k / 16k: (192, 128) causal
    # 1.003 / 1.002 (results/h200/session_ab/fwd_pv_wait_mid.jsonl); hd128 non-causal 1.004 / 1.009, of a bf16 GEMM
    # 0.925 / 0.927 against 0.921 / 0.915 (official 0.928 / 0.938; session_ab/fwd128nc_evr_mid.jsonl); hd64 8k 0.955
    # causal, 0.965 non-causal (off there). With pingpong off the non-causal default is not filled in (an explicit
    # True still compiles it), the causal one is: H200 2026-12-03, 16k tokens, 12 rounds, pingpong off with / without
    # it, speed vs the default: hd128 non-causal 0.805 / 0.965 at 1k, 0.747 / 0.990 at 8k
    # (results/h200/session_ab/fwd128nc_nopp_mid.jsonl); (192, 128) causal 0.997 / 0.951 at 4k, 1.000 / 0.956 at 8k
    # (session_ab/fwd192c_nopp_mid.jsonl).
    pv_wait_mid: bool | None = None
    # sm90 forward, overlapped main loop (elsewhere no effect): the wait for the in-flight P V GEMM and the release of
    # its V stage placed after the block's row maxima, before the tau decision and the exponentials (written after the
    # decision, ptxas schedules the release after 63-65 of the 66 exponentials; official FA4 releases V after 11). The
    # K release moves up with it (right after the S wait). Same instructions, same arithmetic (bitwise the default's
    # output). Yields to pv_wait_mid and exp_in_branch (kernels/sm90/fwd.py). None = DEFAULTS' (absent: off); left out of
    # to_dict() while None or False. H200 2026-12-01, hd128 non-causal, 8 rounds, outputs bitwise: 0.976 / 0.964 the
    # default's speed at 8k / 16k (results/h200/session_ab/fwd128nc_evr_mid.jsonl): opt-in, for ablations.
    early_v_release: bool | None = None
    # sm90 forward: S = Q K^T with Q in registers (the wgmma A operand, loaded from shared memory by ldmatrix once per
    # Q tile) instead of read from shared memory by every K/V block's GEMM, so that GEMM reads only K there. Same
    # products (kernels/sm90/fwd.py load_q_regs). None = DEFAULTS' (on at hd128 with the table's 128 x 128 tile: 1.002-
    # 1.007x on the H200; absent: off); left out of to_dict() while None or False. The Q fragment costs 32 registers per
    # thread at hd128 (48 at (192, 128), both without spills; hd64's 160-register 192-row tile and hd256 spill). A
    # windowed call with intra_wg_overlap=False keeps Q in shared memory (the kernel ignores the field there: 9 LDL /
    # STL at hd128 causal with a left window).
    q_in_regs: bool | None = None
    # sm90 persistent non-causal forward: the tiles of the last partial round (tiles mod grid) cut into K/V block pieces
    # spread over every CTA, each piece's O and LSE merged after the kernel (kernels/sm90/fwd_tail.py), instead of
    # running on (tiles mod grid) CTAs while the rest idle. Same products per piece; the merge rounds once more, so the
    # tail tiles' outputs are not bitwise the plain kernel's. Applies only where a call is non-causal, without a window,
    # runs persistent (or persistent=None leaves it to the call: then it runs persistent for the split), has a partial
    # round, or fewer tiles than SMs (then every tile is cut: a short query over a long K/V fills the GPU), and the cut
    # pays (kernels/interface.py split_tail_launch, split_tail_pays); elsewhere ignored. None = DEFAULTS' (absent:
    # off; on at hd128 non-causal since session 49); left out of to_dict() while None or False.
    split_tail: bool | None = None
    # sm90 forward, persistent and causal (elsewhere no effect): each CTA walks its own list of tiles, built on the host
    # by list scheduling of the longest-first order on a cost model (a tile's K/V blocks + 1), as the hardware hands
    # the one-tile grid's CTAs to SMs, instead of the static round robin (kernels/sm90/greedy_walk.py; the table is
    # cached per shape and device; build it outside a CUDA graph capture: the first call of a shape copies it to the
    # GPU). Same tiles, same products: outputs bitwise the round robin's. persistent_snake yields to it. None = off;
    # left out of to_dict() while None or False. DEFAULTS' persistent_tile sets it for causal calls (session 49).
    persistent_greedy: bool | None = None
    # sm90 forward, persistent (elsewhere no effect): tiles claimed at run time. Each CTA starts with tile c; its
    # producer warp claims the next one from an atomic counter (zeroed per call) once the current tile's loads are
    # issued and hands it to the consumer warpgroups through shared memory. The order is the static walk's numbering
    # (causal: longest first), so a CTA that runs fast takes more tiles, and the last ones end closer together than
    # in a static walk. The greedy walk, the snake and the split tail yield to it (kernels/interface.py drops them from
    # the call's config). Same tiles, same products: outputs bitwise the static kernel's. None = off, except where
    # DEFAULTS' persistent_tile sets it (hd128 causal 1025-32k without a softcap, session 55: 1.010-1.023x the greedy
    # walk on the H200); False keeps that entry's static walk. Left out of to_dict() while None or False.
    persistent_dynamic: bool | None = None
    # sm90 forward, overlapped loop (elsewhere no effect): the wgmma descriptors of a block's K and V stages computed
    # before its waits (the K stage's mbarrier, the warpgroups' GEMM turn), not after them. ptxas does not schedule
    # across the turn's bar.sync, so without it a dependent chain of about six uniform instructions (the shared
    # address to descriptor bits, plus the stage offset) stands between the turn and the first HGMMA. Same GEMMs,
    # same order: outputs bitwise the default's. None = off; left out of to_dict() while None or False.
    early_desc: bool | None = None
    # sm90 forward, overlapped loop, outside the split tail and the causal walks (elsewhere no effect; kernels/sm90/fwd.py
    # says why): a consumer warpgroup whose 64 rows of the Q tile all lie past seqlen_q (the last tile of a sequence:
    # at hd64's 192-row tiles a 4k / 16k sequence leaves two of the three idle, 8k / 32k one) keeps the tile's barrier
    # protocol -- every K / V stage waited for and released, its GEMM turns taken and passed on -- but issues no GEMM
    # and no softmax, so the others get the tensor cores and the MUFU pipe. Rows past seqlen_q are never stored:
    # outputs bitwise the default's. None = off; left out of to_dict() while None or False.
    skip_idle_wg: bool | None = None
    # sm90 forward, speculative_exp's steady state (the overlapped loop's mask-free blocks, no softcap, no q_regs_k, no
    # redo budget; elsewhere no effect): each block's S = Q K^T issued as two wgmma groups of tile_n/2 key columns, and
    # the exponentials of the first half run while the tensor cores compute the second (one wait between them), instead
    # of all of them after the whole block. Same products, same sums in the same order: outputs bitwise the default's.
    # None = off; left out of to_dict() while None or False.
    qk_halves: bool | None = None
    # sm90 forward, speculative_exp's steady state (not with p_smem or a redo budget; elsewhere no effect): the wait for
    # the previous block's P V, its V stage's release and this block's P conversion to 16 bits before the warpgroup's
    # vote instead of after it. ptxas does not move instructions across the vote's branch, so after it the 32-64
    # conversions run alone; before it they interleave with the MUFU exponentials. A redone block is converted again.
    # Same values: outputs bitwise the default's. None = off; left out of to_dict() while None or False.
    p_before_vote: bool | None = None
    # sm90 forward (not varlen, packed GQA or cluster_m=2: elsewhere no effect): O from the accumulator registers
    # straight to global memory (each thread its rows' 32-bit column pairs, rows past seqlen_q skipped) instead of
    # through shared memory and a TMA store, and Q's buffer released after the tile's last Q K^T instead of after the
    # O store. Where O shares Q's buffer (the persistent hd256 kernel) the producer can then load the next tile's Q
    # while the last block's softmax, P V and epilogue run. Same values: outputs bitwise the default's. H100 session 64
    # (session_ab/o_direct_h100.jsonl): 0.965-0.990 at hd256 (1.000 at causal 32k on the greedy walk): opt-in. None =
    # off; left out of to_dict() while None or False.
    o_direct: bool | None = None
    # sm90 persistent forward where O shares Q's buffer (hd256, (192, 128): no room for its own), overlapped loop, not
    # varlen, packed GQA, o_direct or skip_idle_wg (elsewhere no effect): O leaves through the last K/V block's V stage
    # instead of Q's buffer -- stmatrix into that stage in column chunks that fit it (hd256: two of 128 columns), each
    # read back as 16-byte row pieces and stored to global memory by every consumer thread (rows past seqlen_q
    # skipped) -- and that stage is released after the epilogue instead of after the last P V. Q's buffer is released
    # after the tile's last Q K^T, so the producer loads the next tile's Q under the last block and the epilogue, as it
    # does where O has its own buffer. Same values, so outputs are bitwise the kernel's without it (session 66, H100:
    # tests/test_fwd_o_via_v_stage_gpu.py passed). None = on where DEFAULTS' persistent_tile names it (hd256 / (192,
    # 128) calls persistent by their length; at hd256 up to 2k, or longer where the caller named an O-path field),
    # else off; left out of to_dict() while None or False.
    o_via_v_stage: bool | None = None
    # sm90 persistent forward on a static walk (the round robin or the greedy walk; not the split tail or tiles claimed
    # at run time) where O leaves through the last V stage (o_via_v_stage) or from registers (o_direct; overlapped
    # loop, no skip_idle_wg), elsewhere no effect: a tile's O store waits until the next tile's first Q K^T is issued,
    # and runs while it computes (the CTA's last tile's after the loop). The normalised O stays in registers meanwhile;
    # the V stage, where used, is released after that store. It says when O is stored, not how: naming it alone keeps
    # hd256's direct stores (persistent_tile_for). Aimed at the epilogue left exposed between tiles (session 66, H100:
    # fwd_probe free_o bounds it at 1.027 / 1.016 at hd256 causal 8k / 16k; with o_direct_wide's stores, session 67,
    # about 2% was left at 8k). Same values, so outputs are bitwise the kernel's without it (session 66, H100:
    # tests/test_fwd_o_deferred_gpu.py -k 'default or one_tile' 5 passed, V stage). Through the V stage measured
    # slower: 0.998 at hd256 causal 8k (H100, 6 rounds; session_ab/o_deferred_h100.jsonl); from registers (session 79,
    # CPU SASS only: no spills, the 16 STG.128 under the first Q K^T, skip_diag_wg kept) not yet run on a GPU
    # (scripts/sched_check.sh part 55). None = off; left out of to_dict() while None or False.
    o_deferred: bool | None = None
    # sm90 forward with o_direct (elsewhere no effect): its stores 16 bytes wide instead of 4. The 4 lanes of a quad
    # hold the same two rows, each 2 adjacent columns of every 8-column block; per run of 4 blocks they transpose those
    # column pairs (3 shuffles and 16 selects per 4 words) so each lane stores one block's 8 columns: 16 stores per row
    # pair at hd256 instead of 64, each writing 64 contiguous bytes of a row. Aimed at hd256's persistent epilogue,
    # where both warpgroups meet at a barrier before O goes through shared memory (o_via_v_stage) and o_direct, which
    # needs none, lost to its 4-byte stores (session 64, H100: 0.965-0.990). Same values: outputs bitwise o_direct's
    # (session 67, H100: tests/test_fwd_o_direct_wide_gpu.py 19 passed). Measured there (session_ab/
    # o_direct_wide_h100.jsonl, 6-8 rounds) over the default: hd256 causal 1.005 / 1.003 / 1.003 / 1.001 at 4k / 8k /
    # 16k / 32k (o_direct alone 0.971 at 8k), non-causal 0.994 / 1.005 / 1.006 at 1k / 4k / 8k; (192, 128) 0.994-1.002;
    # hd128 causal 8k 0.999. None = on with o_direct where DEFAULTS' persistent_tile names them (hd256 calls persistent
    # by their length from 2049 tokens: non-causal <= 8k, causal <= 32k), else off; left out of to_dict() while None
    # or False.
    o_direct_wide: bool | None = None
    # sm90 forward, causal, persistent, overlapped loop, no window, packed GQA or o_deferred (elsewhere no effect; in the
    # one-tile kernel the branch cost the K/V loops' common paths 99 / 54 instructions in the CPU SASS): a consumer
    # warpgroup whose 64 rows all lie before the first key of the tile's last K/V block (the diagonal block, visited
    # first) skips that block -- its K / V stages waited for and released, its GEMM turn taken and passed on, no GEMM
    # and no softmax -- and starts the tile at the block before. Every key of the skipped block is masked for those
    # rows, so out / lse should be the default's (tests/test_fwd_skip_diag_wg_gpu.py). Where tile_n does not divide
    # tile_m that is common: at hd256's 128 x 80 tiles the first warpgroup skips in 4 of every 5 Q tiles, half a block
    # of tensor work each, at most 0.8% / 0.4% / 0.2% of the K/V loop at 8k / 16k / 32k (session 68's count); none at
    # hd128's 128 x 128. H100 session 71: bitwise (GPU file 9 passed), 1.002-1.008 at hd256 causal 4k-16k, 1.001 at 32k;
    # hd64 causal 8k persistent 1.013 over persistent alone (still 0.985 of the one-tile default). None = on where
    # DEFAULTS' persistent_tile names it (hd256 causal 2049-16384 tokens, no window), else off; left out of to_dict()
    # while None or False.
    skip_diag_wg: bool | None = None
    # sm90 persistent forward on a static walk (the round robin or the greedy walk; not the split tail, tiles claimed at
    # run time or varlen), elsewhere no effect: once the producer warp has issued a tile's last K/V pair it prefetches
    # the next tile's Q tile into L2 (a TMA prefetch: no shared memory, no barrier), so the Q load that follows the
    # tile's last Q K^T (where Q's buffer is released early: o_direct, o_via_v_stage or O's own buffer) reads L2, not
    # HBM. Aimed at the switch between tiles, which shortens when O is stored under the next Q K^T (o_deferred); only
    # where the next Q's latency is exposed can it win. Loads nothing the kernel does not load anyway, so outputs are
    # bitwise the kernel's without it. Session 79, CPU SASS only (4 UTMAPF.L2 per tile at hd256, no spills); its GPU
    # file and A/Bs are scripts/sched_check.sh part 55. None = off; left out of to_dict() while None or False.
    q_prefetch: bool | None = None
    # sm90 forward, with p_before_vote (elsewhere no effect): speculative_exp's exponentials on a copy of the block's S,
    # so a block whose kept maxima fail runs the eager step on the kept S instead of a second Q K^T. The K stage is
    # released right after S, and the votes are over each warp (vote.any) instead of over the warpgroup (a named
    # barrier): a warp's redo issues no wgmma. Kept blocks: bitwise the default's output; a redone row within a
    # rounding. None = off; left out of to_dict() while None or False.
    spec_warp_redo: bool | None = None
    # sm90 forward: P V with P from shared memory (an SS wgmma; FA3's C++ kernel does so at hd64 non-causal with
    # 192 x 192 tiles). Each block's P goes to an sP tile (tile_m x tile_n, 16-bit) by stmatrix right after its
    # conversion, so its registers are free while the P V GEMM runs: room for a wider tile_n at 160 registers. Costs
    # tile_m * tile_n * 2 bytes of shared memory. Not with row_sum_mma. None = off; left out of to_dict() while None or
    # False.
    p_smem: bool | None = None
    # with p_smem, overlapped loop, num_stages >= 2 (elsewhere no effect): one sP tile per K/V stage, so a block's P is
    # converted and stored while the previous block's P V still reads the other tile, instead of after waiting for it
    # (speculative_exp: before the warpgroup's vote, whose barrier ptxas does not schedule across; again after a redo).
    # Costs num_stages sP tiles (hd64 192 x 128 and hd128 128 x 128 fit; hd64 192 x 192 does not). None = off.
    p_smem_early: bool | None = None
    # sm90 forward, overlapped or not: the first q_regs_k k-blocks (16 head-dim columns each) of Q held in registers
    # (loaded once per Q tile, as q_in_regs does for all of Q), the rest read from shared memory by each QK^T; Q in
    # registers in part where all of it does not fit (hd256: 64 registers per thread, the consumer at 212 of 240).
    # Each QK^T stays one wgmma group, its RS k-blocks first. An int in [0, hdim / 16); q_in_regs=True wins.
    # None or 0 = off (left out of to_dict()).
    q_regs_k: int | None = None
    # sm90 forward, rescale_threshold > 0 (elsewhere no effect): a block's rescale decision taken on each thread's own
    # row maxima (a row grows by more than tau iff one of its lanes' columns does: the warp's vote is the same), the
    # quad's max shuffles (2 SHFL + 2 FMNMX per row) run only in the rescale arm, which after the first blocks almost no
    # block takes (kernels/sm90/softmax.py online_softmax_step lazy_max). Same values, outputs bitwise the default's.
    # The bound it aims at: scripts/fwd_probe.py no_maxshfl, the kernel without those shuffles at all, 1.042 / 1.021x
    # at hd64 / hd128 non-causal 8k (H200, session 49, session_ab/fwd_probe_8k.jsonl); measured 1.039 / 1.025 there
    # (session 50). None = DEFAULTS' (hd 64 / 128 since session 50, not at tau 0; absent: off); left out of to_dict()
    # while None or False.
    lazy_row_max: bool | None = None
    # sm90 forward (elsewhere no effect): the row sums on the tensor cores instead of one FADD per P element -- every
    # P V GEMM is followed, in its wgmma group, by P times a ones tile in shared memory (m64n8), whose accumulator is
    # rescaled with O and holds whole-row sums (no quad reduction in the epilogue). The sums are those of P's 16-bit
    # values (the ones O is built from), so outputs differ from the default's in the last bits. The bound it aims at:
    # scripts/fwd_probe.py no_rowsum, 1.036 / 1.055x at hd64 / hd128 non-causal 8k (H200, session 49); it costs an
    # N = 8 GEMM per P V (1/16 more PV work at hd128). H200 session 50 (docs/DEFAULTS_HISTORY.md): slower everywhere,
    # 0.934-0.969 at hd128, 0.989-0.997 at hd64, 0.96 at hd256 / (192, 128), and the LSE off by up to 1.3e-3. None =
    # DEFAULTS' (absent: off); left out of to_dict() while None or False. Opt-in.
    row_sum_mma: bool | None = None
    # sm90 forward, overlapped main loop, rescale_threshold > 0 (elsewhere no effect): a later K/V block's P computed
    # first with the kept row maxima, with no row maximum taken at all (no FMNMX per element, no quad shuffles, no
    # dependency chain before the first exponential); the K stage is held until then. Only when some row's partial sum
    # in the warpgroup exceeds just under 2^tau (then a P might, and the eager vote might rescale), a row has no
    # maximum yet, or a sum is NaN, does the warpgroup (barrier.red.or) vote again on its largest P, and only if one
    # exceeds that limit too (or the row / NaN case) compute S again from that K stage and take the eager step
    # (kernels/sm90/fwd.py softmax_spec; how often each vote fires in the CPU model: results/cpu/spec_votes.md). A block
    # that keeps its maxima gets the eager step's P, sums and maxima bit for bit; a rescaled row's sum can differ by a
    # rounding, as between the other loop shapes. pv_wait_mid / exp_in_branch / early_v_release yield to it; causal
    # calls take causal_split with it (the diagonal blocks, where rows may still lack a maximum, by the eager step); off
    # with the exp2 polynomial (exp2_emu_fraction > 0: past x = 129 it returns -0.0, which no sum notices), with
    # row_sum_mma, in calls with a sliding window (the kernel's one loop of masked and mask-free blocks), and where
    # 2^tau < tile_n (tau < 7 at tile_n 128: ordinary blocks' partial sums would cross it;
    # resolve leaves the default out of such configs). None = DEFAULTS' (hd 64 / 128 / (192, 128) since session 52,
    # measured on an H100: 1.005-1.047x; absent: off); left out of to_dict() while None or False.
    speculative_exp: bool | None = None
    # sm90 forward with speculative_exp (elsewhere no effect; resolve drops it where the call does not speculate): the
    # second QK^Ts (redos) a consumer warpgroup may take in one Q tile before it runs the eager step for the rest of
    # that tile. On inputs whose row maxima keep climbing along the visit order most blocks redo (the late_max ramp:
    # the speculative default 0.845-0.862x the eager step on an H100, session 54); a budget bounds that cost at a few
    # QK^Ts per tile. An attention sink (key 0, visited last) costs one redo per tile. The count is warpgroup-uniform
    # (the votes are); the kernel tests it with a warp vote so the loop stays uniform. None = no budget (speculate on
    # every mask-free block, the behaviour before). Opt-in, not timed; left out of to_dict() while None.
    spec_redo_budget: int | None = None

    def __post_init__(self) -> None:
        self.validate()
        # the custom ops' ``config`` argument (kernels.ops.config_string), computed once here so that torch.compile
        # reads a plain str attribute instead of calling into the frozen dataclass (Dynamo <= 2.11 cannot)
        values = tuple(getattr(self, f.name) for f in _FIELDS)
        changed = {f.name: v for f, v in zip(_FIELDS, values) if v != f.default}
        object.__setattr__(self, "op_string", json.dumps(changed, sort_keys=True, separators=(",", ":")))
        # the dataclass hash of the field tuple, computed once: every call looks configs up in memoised tables
        object.__setattr__(self, "_hash", hash(values))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        # pickle / copy rebuild through the constructor, so that the cached hash is this process's (str hashes differ
        # between processes) and the validation runs again
        return (_rebuild_config, ({f.name: getattr(self, f.name) for f in _FIELDS},))

    # ---- validation -------------------------------------------------------------------------
    def validate(self) -> None:
        t = self.rescale_threshold
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not (0.0 <= float(t) <= 64.0):
            raise ConfigError(f"rescale_threshold={t!r}: must be a number in [0, 64] (log2 units; 0 = always rescale)")
        f = self.exp2_emu_fraction
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not (0.0 <= float(f) <= 1.0)):
            raise ConfigError(f"exp2_emu_fraction={f!r}: must be None (per-arch default) or a number in [0, 1]")
        if self.det_schedule is not None and self.det_schedule not in DET_SCHEDULES:
            raise ConfigError(f"det_schedule={self.det_schedule!r}: must be one of {DET_SCHEDULES} "
                              "(deterministic backward: causal shortest-processing-time first, K/V tile order, or "
                              "non-causal rotated Q-tile walks with arrival-order turns, or causal longest first "
                              "with descending walks)")
        for name in ("pingpong", "intra_wg_overlap", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be a bool")
        if self.two_cta is not None and not isinstance(self.two_cta, bool):
            raise ConfigError(f"two_cta={self.two_cta!r}: must be None (per head dim) or a bool")
        if self.rescale_before_pv is not None and not isinstance(self.rescale_before_pv, bool):
            raise ConfigError(f"rescale_before_pv={self.rescale_before_pv!r}: must be None (per-arch default) or a bool")
        if self.rescale_before_pv and not self.intra_wg_overlap:
            raise ConfigError("rescale_before_pv=True with intra_wg_overlap=False: it moves the O rescale of the "
                              "overlapped main loop; without the overlap O is already rescaled right before its P V -- "
                              "pass rescale_before_pv=False (or None)")
        if self.p_smem and self.row_sum_mma:
            raise ConfigError("p_smem=True with row_sum_mma=True: the row-sum GEMM (m64n8, P times ones) reads P from "
                              "registers; pass one of them")
        m = self.lpt_l2_mb
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or not (1 <= m <= 1024)):
            raise ConfigError(f"lpt_l2_mb={m!r}: must be None (32 MB) or an int in [1, 1024] (MB of L2 for one head "
                              "group of the causal forward's tile order)")
        if self.persistent is not None and not isinstance(self.persistent, bool):
            raise ConfigError(f"persistent={self.persistent!r}: must be None (by sequence length) or a bool")
        if self.bwd_tile_m is not None and (isinstance(self.bwd_tile_m, bool) or not isinstance(self.bwd_tile_m, int)
                                            or self.bwd_tile_m not in (64, 80, 128)):
            raise ConfigError(f"bwd_tile_m={self.bwd_tile_m!r}: must be None (per-arch default) or one of 64, 80, 128 "
                              "(80: sm90 hdim 128 only)")
        g = self.bwd_lpt_heads
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or not (0 <= g <= 64)):
            raise ConfigError(f"bwd_lpt_heads={g!r}: must be None (per-arch default) or an int in [0, 64] (0: causal grid shortest first; g: "
                              "longest first, g heads interleaved)")
        if not isinstance(self.bwd_rotate_q, bool):
            raise ConfigError(f"bwd_rotate_q={self.bwd_rotate_q!r}: must be a bool")
        b = self.spec_redo_budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or not (1 <= b <= 1024)):
            raise ConfigError(f"spec_redo_budget={b!r}: must be None (no budget) or an int in [1, 1024] (second QK^Ts "
                              "per Q tile and warpgroup before the tile runs the eager step)")
        q = self.q_regs_k
        if q is not None and (isinstance(q, bool) or not isinstance(q, int) or not 0 <= q < 16):
            raise ConfigError(f"q_regs_k={q!r}: must be None or an int in [0, hdim / 16) (k-blocks of 16 head-dim "
                              "columns of Q held in registers; q_in_regs=True holds all)")
        n = self.bwd_dq_stages
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n not in (1, 2)):
            raise ConfigError(f"bwd_dq_stages={n!r}: must be None (two where they fit) or 1 or 2")
        for name in OPTIONAL_BOOLS:
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be None (per-arch default) or a bool")
        c = self.cluster_m
        if isinstance(c, bool) or not isinstance(c, int) or c not in CLUSTER_M_VALUES:
            raise ConfigError(f"cluster_m={c!r}: must be 1 (no cluster) or 2 (2x1 cluster, K/V multicast; forward)")
        if c > 1 and self.persistent is True:
            raise ConfigError(f"cluster_m={c} with persistent=True: the persistent forward has no cluster; pass "
                              "persistent=None or False, or cluster_m=1")
        if self.pack_gqa is not None and not isinstance(self.pack_gqa, bool):
            raise ConfigError(f"pack_gqa={self.pack_gqa!r}: must be None (by sequence length) or a bool")
        if self.pack_gqa and (self.persistent is True or c > 1):
            what = "persistent=True" if self.persistent is True else f"cluster_m={c}"
            raise ConfigError(f"pack_gqa=True with {what}: the packed-GQA forward is one tile per CTA without a "
                              "cluster; pass pack_gqa=False")
        for name, lo, hi, mult in (("tile_m", 64, 256, 64), ("tile_n", 16, 256, 16), ("num_stages", 1, 4, 1),
                                   ("consumer_regs", 24, 256, 8), ("producer_regs", 24, 256, 8)):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not (lo <= v <= hi) or v % mult:
                raise ConfigError(f"{name}={v!r}: must be None (per-arch default) or an int in [{lo}, {hi}], a multiple of {mult}")

    # ---- resolution, identity ---------------------------------------------------------------
    def resolve(self, arch: str = "sm90", hdim: int = 128, causal: bool = False, *, tuned: bool = True) -> "AttnConfig":
        """Fill every ``None`` field from the defaults table for (arch, hdim, causal) (``tuned``: with the tuned file's
        entry over the table, as every call runs; False: the table alone)."""
        arch = normalize_arch(arch)
        key = (arch, int(hdim))
        if key not in DEFAULTS:
            raise ConfigError(f"hdim={hdim}: supported head dims are {SUPPORTED_HDIMS}")
        d = DEFAULTS[key]
        if self.rescale_before_pv and arch != "sm90":
            raise ConfigError(f"rescale_before_pv=True with arch={arch}: an sm90 (Hopper) forward switch (the O rescale "
                              "of the overlapped main loop); sm100 rescales O in a correction warpgroup -- pass "
                              "rescale_before_pv=None or False")
        for name in ("causal_split", "exp_in_branch", "p_cvt_asm", "pv_wait_mid", "early_v_release", "q_in_regs",
                     "split_tail", "lazy_row_max", "row_sum_mma", "speculative_exp", "spec_redo_budget",
                     "persistent_dynamic", "early_desc", "skip_idle_wg", "p_smem", "p_smem_early", "q_regs_k",
                     "qk_halves", "p_before_vote", "o_direct", "spec_warp_redo", "o_via_v_stage", "o_deferred",
                     "o_direct_wide", "skip_diag_wg", "q_prefetch"):
            if getattr(self, name) and arch != "sm90":
                raise ConfigError(f"{name}=True with arch={arch}: an sm90 (Hopper) forward switch (the shape of the "
                                  f"overlapped main loop's code); pass {name}="
                                  f"{'None' if name in ('spec_redo_budget', 'q_regs_k') else 'False'}")
        updates = {k: d[k] for k in ("tile_m", "tile_n", "num_stages", "consumer_regs", "producer_regs", "bwd_tile_m")
                   if getattr(self, k) is None}
        if self.rescale_before_pv is None:
            updates["rescale_before_pv"] = for_causal(d["rescale_before_pv"], causal)
        if self.exp2_emu_fraction is None:
            updates["exp2_emu_fraction"] = d["exp2_emu"][1 if causal else 0]
        # (non-causal, causal) pairs filled only where they change the kernel, so every other resolved config (its hash
        # and compile key) is the one from before these fields existed
        for name in ("bwd_lpt_heads", "exp_in_branch", "bwd_pdl", "bwd_persistent", "bwd_dq_chunk_release",
                     "causal_split", "bwd_diag_align", "bwd_q_tail", "bwd_stream_post", "bwd_dq_claim",
                     "p_cvt_asm", "pv_wait_mid", "early_v_release", "q_in_regs", "split_tail", "lazy_row_max",
                     "row_sum_mma", "speculative_exp", "p_before_vote", "spec_warp_redo"):
            v = d.get(name, (0, 0))[1 if causal else 0]
            if name == "lazy_row_max" and not self.rescale_threshold:
                continue  # no rescale vote at tau 0: the kernel is the default's, and so stay its config and hash
            if name == "exp_in_branch" and self.persistent is True:
                continue  # the persistent hd128 causal forward spills with it (43 LDL in the SASS): not a default there
            if name == "bwd_pdl" and self.bwd_persistent:
                continue  # the persistent backward has no PDL launch: an explicit bwd_persistent=True wins over the default
            if name == "bwd_stream_post" and (self.bwd_persistent or self.bwd_q_tail or self.two_cta is True
                                              or self.bwd_pdl is False):
                continue  # kernels without it (bwd.py _set_stream_post) keep their config and hash
            if getattr(self, name) is None and v:
                updates[name] = v
        if self.deterministic and self.bwd_det_two_writers is None and d.get("bwd_det_two_writers", (0, 0))[int(causal)]:
            updates["bwd_det_two_writers"] = True  # only deterministic kernels have it: other configs keep their hash
        if self.deterministic and self.bwd_det_diag_align is None and d.get("bwd_det_diag_align", (0, 0))[int(causal)]:
            updates["bwd_det_diag_align"] = True  # likewise
        if self.det_schedule is None:  # the deterministic default of (hdim, causal): its schedule and the fields with it
            det = dict(d.get("det", ({}, {}))[int(causal)]) if self.deterministic else {}
            updates["det_schedule"] = det.pop("det_schedule", "rotate")
            updates.update({k: v for k, v in det.items() if getattr(self, k) is None})
        if self.q_regs_k and self.q_regs_k >= int(hdim) // 16:
            raise ConfigError(f"q_regs_k={self.q_regs_k} at hdim={hdim}: Q has {int(hdim) // 16} k-blocks; hold fewer "
                              "in registers, or all with q_in_regs=True")
        entry = TUNED.get((arch, int(hdim), bool(causal)), {}) if tuned else {}  # conf/tuned/<arch>.yaml (run.py tune)
        updates.update({k: v for k, v in entry.items() if getattr(self, k) is None})
        if updates.get("rescale_before_pv") and not self.intra_wg_overlap:  # a default for the overlapped loop only
            updates["rescale_before_pv"] = False
        frac = self.exp2_emu_fraction if self.exp2_emu_fraction is not None else updates.get("exp2_emu_fraction", 0.0)
        if updates.get("q_in_regs") and not q_in_regs_fits(self.tile_m or updates.get("tile_m"),
                                                           self.tile_n or updates.get("tile_n"), frac):
            del updates["q_in_regs"]  # (the tile of the call, the tuned entry or the table: whichever resolves)
        if updates.get("speculative_exp") and not speculation_compiles(
                self.rescale_threshold, self.tile_n or updates.get("tile_n"), frac, self.intra_wg_overlap,
                self.row_sum_mma):
            del updates["speculative_exp"]  # a kernel that drops it (kernels/sm90/fwd.py) keeps its config and hash
        if updates.get("p_before_vote") and (not updates.get("speculative_exp", self.speculative_exp) or self.p_smem
                                             or self.spec_redo_budget or self.qk_halves):
            del updates["p_before_vote"]  # kernels without it (kernels/sm90/fwd.py) keep their config and hash
        if updates.get("spec_warp_redo") and not updates.get("p_before_vote", self.p_before_vote):
            del updates["spec_warp_redo"]  # (likewise: the kernel takes it only with p_before_vote)
        if updates.get("spec_warp_redo") and (self.consumer_regs or updates.get("consumer_regs")) < 160:
            # S and its copy live together: four consumer warpgroups at 112 registers spill (3 LDL, CPU SASS)
            del updates["spec_warp_redo"]
        if self.spec_redo_budget is not None and not updates.get("speculative_exp", self.speculative_exp):
            updates["spec_redo_budget"] = None  # no speculation, no budget: the config and hash of the call without it
        if updates.get("pv_wait_mid") and not self.pingpong and not causal:  # hd128 non-causal without pingpong:
            del updates["pv_wait_mid"]  # 0.75-0.80x the speed without it ((192, 128) causal: 1.05x with it)
        if updates.get("bwd_tile_m") == 80 and self.two_cta is True:  # a default of 80 rows: no 2-CTA kernel has them
            updates["bwd_tile_m"] = 64
        return dataclasses.replace(self, **updates) if updates else self

    @property
    def is_resolved(self) -> bool:
        # persistent=None is a resolved value: the forward decides it per call (persistent_by_default). So is
        # rescale_before_pv=None (OMITTED_AT holds None): a config rebuilt from a resolved config's to_dict(), which
        # leaves False out, reads None as False (same compile key, same kernel)
        return all(getattr(self, f.name) is not None for f in _FIELDS
                   if f.name not in PER_CALL_FIELDS and None not in OMITTED_AT.get(f.name, ()))

    def to_dict(self) -> dict:
        """Every field; a per-call field (persistent, pack_gqa, two_cta) only when set, cluster_m only when not 1 and
        rescale_before_pv only when True, so configs, hashes and compile cache keys from before those fields existed are
        unchanged (two_cta: the old default False is now an explicit ``two_cta=False``, whose hash is the old default's;
        the backward's keys always hold the bool it decided)."""
        return {f.name: getattr(self, f.name) for f in _FIELDS
                if not (f.name in PER_CALL_FIELDS and getattr(self, f.name) is None)
                and not (f.name in OMITTED_AT and _omitted(getattr(self, f.name), OMITTED_AT[f.name]))}

    def as_written(self) -> dict:
        """to_dict() plus every OMITTED_AT field set away from its field default (e.g. an explicit
        ``speculative_exp=False``, which to_dict() leaves out, so its hash is that of the default): the dict result
        rows record as their ``config``, from which AttnConfig(**d) rebuilds this config exactly (kernels/staleness.py
        resolves it again). config_hash() and the compile keys stay on to_dict()."""
        d = self.to_dict()
        for f in _FIELDS:
            v = getattr(self, f.name)
            if f.name in OMITTED_AT and f.name not in d and v is not None and not _omitted(v, (f.default,)):
                d[f.name] = v
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "AttnConfig":
        return cls(**dict(d or {}))

    def config_hash(self) -> str:
        """Stable 12-hex-digit hash of every field (same config -> same hash across processes)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _omitted(value, at: tuple) -> bool:
    """Whether ``value`` is one of OMITTED_AT's values of a field, compared with its type (False is not 0)."""
    return any(value is a if a is None or isinstance(a, bool) else (type(value) is type(a) and value == a) for a in at)


def _unknown_fields_error(names) -> ConfigError:
    """One line naming the unknown field(s) and listing every AttnConfig field."""
    known = [f.name for f in fields(AttnConfig)]
    bad = ", ".join(repr(n) for n in sorted(names))
    return ConfigError(f"unknown AttnConfig field{'s' if len(names) > 1 else ''} {bad}; fields: {', '.join(known)}")


def _init_checking_names(init):
    def __init__(self, *args, **kwargs):
        unknown = set(kwargs) - _FIELD_NAMES
        if unknown:
            raise _unknown_fields_error(unknown)
        init(self, *args, **kwargs)

    __init__.__doc__, __init__.__wrapped__ = init.__doc__, init
    return __init__


# the field list, read once: dataclasses.fields() walks the class's field table on every call, and the tune space
# builds some 10^5 configs (kernels/config.py's methods read these module names at call time)
_FIELDS = fields(AttnConfig)
_FIELD_NAMES = frozenset(f.name for f in _FIELDS)
AttnConfig.__init__ = _init_checking_names(AttnConfig.__init__)  # AttnConfig(bogus=1): a ConfigError with the list


def _rebuild_config(values: dict) -> "AttnConfig":
    return AttnConfig(**values)


def speculation_compiles(tau: float, tile_n: int, exp2_fraction: float, intra_wg_overlap: bool,
                         row_sum_mma) -> bool:
    """Whether the sm90 forward can speculate (AttnConfig.speculative_exp) with these fields: the overlapped loop,
    2^tau >= tile_n, no exp2 polynomial fragment (kernels/sm90/exp2.py emulated_fragments rounds the same way), no
    row_sum_mma. The kernel (kernels/sm90/fwd.py) asks this too, and also drops it in windowed calls; resolve leaves
    the default out of configs where this is False."""
    no_poly = int(round(float(exp2_fraction or 0.0) * (tile_n // 8))) <= 0
    return bool(intra_wg_overlap) and tau >= math.log2(tile_n) and no_poly and not row_sum_mma


@functools.lru_cache(maxsize=1024)
def resolve_cached(config: "AttnConfig | None", arch: str, hdim: int, causal: bool) -> "AttnConfig":
    """``(config or AttnConfig()).resolve(arch, hdim, causal)``, memoised for the per-call paths (a frozen
    AttnConfig is hashable). DEFAULTS is read once per input: code that edits DEFAULTS at run time must call
    ``resolve_cached.cache_clear()``."""
    return (config or AttnConfig()).resolve(arch, hdim, causal)


def normalize_arch(arch: str) -> str:
    """Accept 'sm90', 'sm_90', 'sm_90a', 'sm90a' (and the sm100 spellings); return 'sm90' / 'sm100'."""
    a = str(arch).lower().replace("_", "").rstrip("a")
    if a not in SUPPORTED_ARCHS:
        raise ConfigError(f"arch={arch!r}: supported archs are {SUPPORTED_ARCHS} (Hopper sm_90a, Blackwell sm_100a)")
    return a


def quantized_exp2_fraction(fraction: float, fragments_per_row: int) -> float:
    """The fraction a kernel actually compiles: whole fragments out of ``fragments_per_row``."""
    n = round(float(fraction) * fragments_per_row)
    return n / fragments_per_row


# ---- tuned defaults: conf/tuned/<arch>.yaml, written by `python run.py tune`, read here once at import -----------
# Format (kernels/tuning.py writes it):
#   arch: sm90
#   entries:
#     - {hdim: 128, causal: false, direction: fwd, config: {tile_m: 128, tile_n: 176, ...}, evidence: {...}}
# An entry overrides the table above for its (hdim, causal), only for the fields of its direction. No file: the table.
TUNED_FIELDS = {"fwd": ("tile_m", "tile_n", "num_stages", "consumer_regs", "producer_regs", "exp2_emu_fraction",
                        "rescale_before_pv", "q_in_regs", "p_smem", "p_smem_early", "q_regs_k"),
                "bwd": ("bwd_tile_m",)}
# fields that only one direction's kernels read (kernels/tiles.py compiled_config drops the other direction's)
BWD_ONLY_FIELDS = ("deterministic", "two_cta", "det_schedule", "bwd_tile_m", "bwd_lpt_heads", "bwd_rotate_q", "bwd_pdl",
                   "bwd_persistent", "bwd_dq_chunk_release", "bwd_diag_align", "bwd_q_tail", "bwd_stream_post",
                   "bwd_dq_claim",
                   "bwd_det_two_writers", "bwd_dq_stages", "bwd_det_diag_align", "bwd_two_cta_cta_release", "bwd_two_cta_dv_first", "bwd_two_cta_n80")
FWD_ONLY_FIELDS = ("tile_m", "tile_n", "num_stages", "consumer_regs", "producer_regs", "pingpong", "intra_wg_overlap",
                   "rescale_threshold", "persistent", "cluster_m", "pack_gqa", "rescale_before_pv", "causal_split",
                   "exp_in_branch", "p_cvt_asm", "lpt_l2_mb", "pv_wait_mid", "early_v_release", "persistent_snake",
                   "q_in_regs", "split_tail", "persistent_greedy", "lazy_row_max", "row_sum_mma",
                   "speculative_exp", "spec_redo_budget", "persistent_dynamic", "early_desc", "skip_idle_wg", "p_smem",
                   "p_smem_early", "q_regs_k", "qk_halves", "p_before_vote", "o_direct",
                   "spec_warp_redo", "o_via_v_stage", "o_deferred", "o_direct_wide", "skip_diag_wg", "q_prefetch")
TUNED_DIR = Path(__file__).resolve().parent.parent / "conf" / "tuned"
TUNED: dict[tuple[str, int, bool], dict] = {}  # (arch, hdim, causal) -> {field: value}
# entries not applied because the table under them changed since they were measured: (arch, hdim, causal, direction)
# -> {field: (then, now)} (table_context, stale_fields)
STALE_TUNED: dict[tuple[str, int, bool, str], dict] = {}
_ENTRY_KEYS = ("hdim", "causal", "direction", "config", "evidence")


class StaleTunedWarning(UserWarning):
    """A tuned entry was measured on top of table defaults that have changed since; it is not applied."""


def table_context(arch: str, hdim: int, causal: bool, direction: str) -> dict:
    """The table defaults a tuned ``direction`` entry for (arch, hdim, causal) runs on top of: the fields of the
    table-only resolved config that the direction's kernels read, without the entry's own (TUNED_FIELDS) and the
    per-call ones. `python run.py tune` records it in an entry's evidence; an entry whose recorded context differs
    from today's was measured against another kernel and is not applied (``STALE_TUNED``)."""
    d = AttnConfig().resolve(arch, hdim, causal, tuned=False).to_dict()
    drop = set(TUNED_FIELDS[direction]) | set(PER_CALL_FIELDS) | set(BWD_ONLY_FIELDS if direction == "fwd"
                                                                     else FWD_ONLY_FIELDS)
    return {k: v for k, v in sorted(d.items()) if k not in drop}


def stale_fields(recorded: dict, arch: str, hdim: int, causal: bool, direction: str) -> dict:
    """{field: (recorded value, today's value)} where an entry's recorded table context differs from today's (a
    field missing on one side reads None)."""
    now = table_context(arch, hdim, causal, direction)
    return {k: (recorded.get(k), now.get(k)) for k in sorted(set(recorded) | set(now)) if recorded.get(k) != now.get(k)}


def load_tuned(path: str | Path, stale: dict | None = None) -> dict[tuple[str, int, bool], dict]:
    """Read and check one tuned-defaults file; ``{(arch, hdim, causal): {field: value}}``. Any problem is a
    ConfigError that names the file and the key (``conf/tuned/sm90.yaml: entries[1].config.tile_n=...: ...``). An
    entry whose evidence records a ``table_context`` different from today's (table_context) is left out, and its
    changed fields go to ``stale`` (``{(arch, hdim, causal, direction): {field: (then, now)}}``) when given."""
    path = Path(path)
    arch = path.stem

    def bad(key: str, msg: str) -> ConfigError:
        return ConfigError(f"{path}: {key}: {msg} (delete the file to use the defaults table; `python run.py tune` "
                           "writes it)")

    try:
        import yaml
    except ImportError as e:
        raise bad("(file)", "reading tuned defaults needs PyYAML") from e
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise bad("(file)", f"not readable YAML ({str(e).splitlines()[0]})") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise bad("(top level)", f"expected a mapping with keys arch, entries; got {type(doc).__name__}")
    unknown = sorted(set(doc) - {"arch", "entries"})
    if unknown:
        raise bad(str(unknown[0]), "unknown key; keys: arch, entries")
    if doc.get("arch", arch) != arch:
        raise bad("arch", f"{doc.get('arch')!r} does not match the file name ({arch}.yaml)")
    try:
        arch = normalize_arch(arch)
    except ConfigError as e:
        raise bad("(file name)", str(e)) from None
    entries = doc.get("entries") or []
    if not isinstance(entries, list):
        raise bad("entries", f"expected a list of entries, got {type(entries).__name__}")
    out: dict[tuple[str, int, bool], dict] = {}
    seen = set()
    for i, e in enumerate(entries):
        at = f"entries[{i}]"
        if not isinstance(e, dict):
            raise bad(at, f"expected a mapping with keys {', '.join(_ENTRY_KEYS)}")
        unknown = sorted(set(e) - set(_ENTRY_KEYS))
        if unknown:
            raise bad(f"{at}.{unknown[0]}", f"unknown key; keys: {', '.join(_ENTRY_KEYS)}")
        hdim, causal, direction, config = e.get("hdim"), e.get("causal"), e.get("direction"), e.get("config")
        if isinstance(hdim, bool) or not isinstance(hdim, int) or (arch, hdim) not in DEFAULTS:
            raise bad(f"{at}.hdim", f"{hdim!r}: must be one of the table's head dims {SUPPORTED_HDIMS}")
        if not isinstance(causal, bool):
            raise bad(f"{at}.causal", f"{causal!r}: must be true or false")
        if direction not in TUNED_FIELDS:
            raise bad(f"{at}.direction", f"{direction!r}: must be one of {', '.join(TUNED_FIELDS)}")
        if (hdim, causal, direction) in seen:
            raise bad(at, f"a second entry for hdim={hdim} causal={causal} direction={direction}")
        seen.add((hdim, causal, direction))
        if not isinstance(config, dict) or not config:
            raise bad(f"{at}.config", f"expected a non-empty mapping of {', '.join(TUNED_FIELDS[direction])}")
        for k, v in config.items():
            if k not in TUNED_FIELDS[direction]:
                raise bad(f"{at}.config.{k}", f"not a tuned {direction} field; fields: {', '.join(TUNED_FIELDS[direction])}")
            try:
                AttnConfig(**{k: v})
            except ConfigError as x:
                raise bad(f"{at}.config.{k}", str(x)) from None
        if e.get("evidence") is not None and not isinstance(e["evidence"], dict):
            raise bad(f"{at}.evidence", "expected a mapping (what the rows measured) or nothing")
        recorded = (e.get("evidence") or {}).get("table_context")
        if recorded is not None and not isinstance(recorded, dict):
            raise bad(f"{at}.evidence.table_context", "expected a mapping of field: value (the table defaults the entry "
                                                      "was measured on)")
        if recorded is not None:  # entries written before 2026-12-03 have none: applied unchecked
            changed = stale_fields(recorded, arch, hdim, causal, direction)
            if changed:
                if stale is not None:
                    stale[(arch, hdim, causal, direction)] = changed
                continue
        merged = {**out.get((arch, hdim, causal), {}), **config}
        try:  # the combination with the table's other fields must be a valid config too
            AttnConfig(**merged).resolve(arch, hdim, causal)
        except ConfigError as x:
            raise bad(f"{at}.config", str(x)) from None
        out[(arch, hdim, causal)] = merged
    return out


def _load_tuned_dir(folder: Path = TUNED_DIR, stale: dict | None = None) -> dict[tuple[str, int, bool], dict]:
    """Every tuned file of ``folder``; stale entries go to ``stale`` and raise one StaleTunedWarning each."""
    import warnings

    out: dict[tuple[str, int, bool], dict] = {}
    for arch in SUPPORTED_ARCHS:
        p = Path(folder) / f"{arch}.yaml"
        if p.is_file():
            found: dict = {}
            out.update(load_tuned(p, found))
            for (a, h, c, direction), changed in found.items():
                diff = ", ".join(f"{k} {then!r} -> {now!r}" for k, (then, now) in changed.items())
                warnings.warn(f"{p}: the tuned {direction} entry for hdim={h} causal={c} was measured on other table "
                              f"defaults ({diff}) and is not applied; the table's values run. Re-run `python run.py "
                              f"tune arch={a} hdim={h} causal={str(c).lower()} direction={direction}` to re-measure it "
                              "(or delete the entry)",
                              StaleTunedWarning, stacklevel=2)
            if stale is not None:
                stale.update(found)
    return out


def q_in_regs_fits(tile_m: int, tile_n: int, exp2_fraction: float) -> bool:
    """Where ``q_in_regs`` is a default (resolve) and a tune candidate (experiments/tune_space.py): measured on the
    table's 128 x 128 tile; 192-row or wider tiles have no registers for Q, and with half the exponentials emulated
    the hd128 causal kernel spills 4 LDL / STL (CPU SASS)."""
    return int(tile_m) == 128 and int(tile_n) <= 128 and float(exp2_fraction) < 0.5


def for_causal(v, causal: bool):
    """A DEFAULTS value: one for both, or a (non-causal, causal) pair."""
    return v[1 if causal else 0] if isinstance(v, tuple) else v


def table_defaults(arch: str, hdim: int, causal: bool, tuned: bool = True) -> dict:
    """The resolved default of every table field for (arch, hdim, causal): the DEFAULTS row (exp2 fraction for this
    ``causal``), with the tuned file's entry over it unless ``tuned=False``."""
    arch = normalize_arch(arch)
    if (arch, int(hdim)) not in DEFAULTS:
        raise ConfigError(f"hdim={hdim}: supported head dims are {SUPPORTED_HDIMS}")
    d = dict(DEFAULTS[(arch, int(hdim))])
    d["exp2_emu_fraction"] = d.pop("exp2_emu")[1 if causal else 0]
    d["rescale_before_pv"] = for_causal(d["rescale_before_pv"], causal)  # the value resolve() fills
    d["q_in_regs"] = bool(for_causal(d.get("q_in_regs", False), causal))  # likewise (where the tile takes it, below)
    d["p_smem"] = bool(for_causal(d.get("p_smem", False), causal))  # off where the table does not set it
    d["p_smem_early"] = bool(for_causal(d.get("p_smem_early", False), causal))  # likewise
    d["q_regs_k"] = int(for_causal(d.get("q_regs_k", 0), causal))  # likewise (0: Q from shared memory)
    d.pop("persistent_max_seqlen")  # a per-call rule, not a field (persistent_by_default)
    d.pop("persistent_tile", None)  # a per-call rule too (persistent_tile_for)
    d.pop("two_cta")  # a per-call rule (two_cta_by_default), not filled in by resolve()
    if tuned:
        d.update(TUNED.get((arch, int(hdim), bool(causal)), {}))
    if d["q_in_regs"] and not q_in_regs_fits(d["tile_m"], d["tile_n"], d["exp2_emu_fraction"]):
        d["q_in_regs"] = False  # a tuned tile that does not take it (resolve drops the default there too)
    return d


def persistent_max_seqlen(arch: str, hdim: int, causal: bool) -> int:
    """The longest seqlen_q at which ``AttnConfig.persistent=None`` runs the persistent forward (0 = never)."""
    arch = normalize_arch(arch)
    if (arch, int(hdim)) not in DEFAULTS:
        raise ConfigError(f"hdim={hdim}: supported head dims are {SUPPORTED_HDIMS}")
    return int(DEFAULTS[(arch, int(hdim))]["persistent_max_seqlen"][1 if causal else 0])


def persistent_by_default(cfg: "AttnConfig | None", arch: str, hdim: int, causal: bool, seqlen_q: int,
                          varlen: bool = False) -> bool:
    """Whether the forward runs persistent: ``cfg.persistent`` when set, otherwise seqlen_q <= the table's bound for
    (arch, hdim, causal); never by default for varlen or with cluster_m > 1 (a forced True with varlen is
    kernels.validate's ConfigError, with cluster_m > 1 AttnConfig's)."""
    if cfg is not None and cfg.persistent is not None:
        return bool(cfg.persistent)
    if varlen or (cfg is not None and cfg.cluster_m > 1):  # the persistent forward has no cluster
        return False
    return 0 < int(seqlen_q) <= persistent_max_seqlen(arch, hdim, causal)


PERSISTENT_TILE_FIELDS = ("tile_m", "consumer_regs", "producer_regs")


def persistent_tile_for(cfg: "AttnConfig", arch: str, hdim: int, causal: bool, seqlen_q: int = 1,
                        windowed: bool = False, softcapped: bool = False) -> "AttnConfig":
    """A resolved config made persistent by the sequence length (``cfg.persistent`` None): DEFAULTS' persistent_tile
    for (arch, hdim, causal) and ``seqlen_q`` in place of the resolved fields it names, when ``cfg`` holds the table's
    tile_m / register split (a config that chose its own keeps them; so does ``persistent=True``, which forces the
    resolved config); and without DEFAULTS' exp_in_branch, as resolve() leaves it out for persistent=True (unless the
    entry names it). An entry's fields other than the tile's fill only fields the config left None (its o_direct +
    o_direct_wide only where the config left every O_PATH_FIELDS None, o_via_v_stage else); its exp_in_branch
    only where causal_split is on too and the call has no window (``windowed``): the persistent hd128 causal kernel
    spills with it otherwise (CPU SASS: 117 LDL with causal_split off, 100 with a left window); its persistent_greedy
    not over an explicit persistent_snake=True. An entry with ``static`` (fields) claims tiles at run time
    (persistent_dynamic) unless the config turned that off or asked for a static walk (persistent_greedy /
    persistent_snake=True), or the call has a softcap (``softcapped``: the claiming hd128 causal kernel spills 3
    registers with one, CPU SASS; none without, with a window or not): then ``static``'s fields are the entry."""
    arch = normalize_arch(arch)
    if cfg.persistent is not None:
        return cfg
    d = DEFAULTS.get((arch, int(hdim)), {})
    if cfg.exp_in_branch and d.get("exp_in_branch", (0, 0))[int(causal)]:
        # resolve()'s rule for persistent=True: the DEFAULTS exp_in_branch is not filled in (the persistent kernel
        # spills with it); a config made persistent by its length drops it likewise
        cfg = dataclasses.replace(cfg, exp_in_branch=None)
    tile = for_causal(d.get("persistent_tile", (None, None)), causal)
    if isinstance(tile, tuple):  # ((max_seqlen, fields), ...): the first bound >= seqlen_q
        tile = next((t for bound, t in tile if int(seqlen_q) <= bound), None)
    if not tile:
        return cfg
    if "static" in tile:  # a run-time claim's entry: its "static" fields where the caller chose a static walk
        static = cfg.persistent_dynamic is False or cfg.persistent_greedy or cfg.persistent_snake or softcapped
        tile = tile["static"] if static else {k: v for k, v in tile.items() if k != "static"}
    table = table_defaults(arch, hdim, causal)
    if any(getattr(cfg, k) != table[k] for k in PERSISTENT_TILE_FIELDS):
        return cfg
    if tile.get("o_direct") and any(getattr(cfg, k) is not None for k in O_PATH_FIELDS):
        # the caller chose how O leaves: the entry's direct stores give way to the V stage
        tile = {**{k: v for k, v in tile.items() if k not in O_DIRECT_WIDE}, "o_via_v_stage": True}
    # the tile fields replace the table's; the others (persistent_greedy, exp_in_branch, ...) fill only what the
    # config left None, so a switch the caller turned off stays off
    fill = {k: v for k, v in tile.items() if k in PERSISTENT_TILE_FIELDS or getattr(cfg, k) is None}
    if fill.get("exp_in_branch") and (windowed or not fill.get("causal_split", cfg.causal_split)):
        del fill["exp_in_branch"]
    if cfg.persistent_snake:
        fill.pop("persistent_greedy", None)
    if windowed:
        fill.pop("skip_diag_wg", None)  # the kernel takes it without a window only (one compile key, not two)
    return dataclasses.replace(cfg, **fill)


def call_config(cfg: "AttnConfig", arch: str, hdim: int, causal: bool, seqlen_q: int, group: int = 1,
                windowed: bool = False, softcapped: bool = False) -> "AttnConfig":
    """The resolved config ``cfg`` as the forward runs it for one call: ``persistent`` forced by cfg, or by seqlen_q
    when None (persistent_by_default, with DEFAULTS' persistent_tile: persistent_tile_for), normalised to True / None
    so that a non-persistent call's compile cache key (and kernel) is the one from before the field existed.
    ``pack_gqa`` likewise (pack_gqa_by_default): True for the packed kernel (never persistent: AttnConfig refuses
    persistent=True with it), else None (the plain kernel, its key). ``windowed`` / ``softcapped``: the call has a
    sliding window / a softcap (persistent_tile_for; result rows have no softcap). kernels/interface.py forward_config
    memoises it; kernels/tiles.py call_hash names it in result rows."""
    if pack_gqa_by_default(cfg, hdim, seqlen_q, group):
        return dataclasses.replace(cfg, pack_gqa=True, persistent=None)
    if cfg.pack_gqa is not None:
        cfg = dataclasses.replace(cfg, pack_gqa=None)
    want = True if persistent_by_default(cfg, arch, hdim, causal, seqlen_q) else None
    if want and cfg.persistent is None:  # persistent by the sequence length: DEFAULTS' persistent_tile, if any
        cfg = persistent_tile_for(cfg, arch, hdim, causal, seqlen_q, windowed, softcapped)
    return cfg if cfg.persistent is want else dataclasses.replace(cfg, persistent=want)


# head dims (hdim, hdim_v) whose sm90 backward has a 2-CTA kernel (kernels/sm90/bwd.py, bwd_wide_two_cta.py)
TWO_CTA_HDIMS = ((64, 64), (128, 128), (256, 256))


def two_cta_by_default(cfg: "AttnConfig | None", arch: str, hdim: int, hdim_v: int | None = None,
                       features: bool = False, varlen: bool = False) -> bool:
    """Whether the backward runs 2-CTA clusters: ``cfg.two_cta`` when set (a forced True that the call does not support
    stays kernels/sm90/backward.py's ConfigError), otherwise DEFAULTS[(arch, hdim)]["two_cta"] when the call allows
    it: no sliding window or softcap (``features``), not varlen, (hdim, hdim_v) in TWO_CTA_HDIMS."""
    if cfg is not None and cfg.two_cta is not None:
        return bool(cfg.two_cta)
    hdim_v = hdim if hdim_v is None else hdim_v
    if features or varlen or (int(hdim), int(hdim_v)) not in TWO_CTA_HDIMS:
        return False
    arch = normalize_arch(arch)
    if (arch, int(hdim)) not in DEFAULTS:
        raise ConfigError(f"hdim={hdim}: supported head dims are {SUPPORTED_HDIMS}")
    return bool(DEFAULTS[(arch, int(hdim))]["two_cta"])


def two_cta_n80_by_default(cfg: "AttnConfig", arch: str, hdim: int, hdim_v: int | None, two_cta: bool,
                           features: bool = False) -> bool:
    """Whether an sm90 backward call runs the 2-CTA pairs with 80-row K/V tiles (kernels/sm90/bwd_wide_two_cta80.py):
    ``cfg.bwd_two_cta_n80`` when set, otherwise DEFAULTS' ``bwd_two_cta_n80`` for 2-CTA calls (``two_cta`` decided)
    at (256, 256) that are not bwd_rotate_q, without window / softcap / varlen (``features``)."""
    if cfg.bwd_two_cta_n80 is not None:
        return bool(cfg.bwd_two_cta_n80)
    hdim_v = hdim if hdim_v is None else hdim_v
    if not two_cta or (int(hdim), int(hdim_v)) != (256, 256) or cfg.bwd_rotate_q or features:
        return False
    return bool(DEFAULTS.get((normalize_arch(arch), int(hdim)), {}).get("bwd_two_cta_n80", False))


# pack_gqa=None packs a GQA group's Q heads into one tile when the per-head Q tile would be partly padding, at the head
# dims whose packed kernel is GPU-tested. H200 (hd128, 32 Q / 4 K/V heads, seqlen_k 8k, batch 16, 10 rounds, one
# process; results/h200/session_ab/fwd_pack_gqa_sq.jsonl): packed / per-head 3.3-3.8x at seqlen_q 1-32, 1.83x at 64,
# 1.00-1.01x at 128 (= tile_m, no padding).
PACK_GQA_HDIMS = (64, 128, 256)


def pack_gqa_by_default(cfg: "AttnConfig", hdim: int, seqlen_q: int, group: int, varlen: bool = False) -> bool:
    """Whether the forward packs the Q heads of a K/V group (``cfg`` resolved): ``cfg.pack_gqa`` when set, otherwise
    group > 1 and 0 < seqlen_q < tile_m (the per-head Q tile would hold padding rows), tile_m a multiple of the group,
    hdim in PACK_GQA_HDIMS; never by default for varlen, with persistent=True or with cluster_m > 1."""
    if cfg.pack_gqa is not None:
        return bool(cfg.pack_gqa) and int(group) > 1
    if int(group) <= 1 or varlen or cfg.persistent is True or cfg.cluster_m > 1 or int(hdim) not in PACK_GQA_HDIMS:
        return False
    return 0 < int(seqlen_q) < int(cfg.tile_m) and int(cfg.tile_m) % int(group) == 0


TUNED.update(_load_tuned_dir(stale=STALE_TUNED))
