"""Roofline model of FA4-style attention: per-tile cycle counts per resource, and a TFLOP/s bound per config.

A tile is one (Q block of M rows) x (K/V block of N rows) step. For each GEMM we record its shape and
where each operand comes from (shared memory, tensor memory, registers); shared-memory traffic is the
bytes of the shared-memory operands, counted as many times as the hardware reads them, plus the
non-GEMM traffic a kernel does through shared memory (dS stores, the fp32 dQ staging). Resources:

  mma    tensor-core FLOPs / (dense BF16 FLOPs per clock per SM)
  smem   shared-memory bytes / (bytes per clock per SM)
  mufu   hardware exp2 (MUFU.EX2) count / (ex2 per clock per SM)
  fma    fp32 FFMA/FADD/FMUL per score element / (128 per clock per SM)
  alu    integer and other non-FMA ALU ops (FMNMX, F2FP packs, the polynomial's shift/add) / 64
  issue  all thread-instructions above / (4 schedulers x 32 lanes = 128 per clock per SM)

Operand rules:
  * Blackwell (tcgen05, 1-CTA): an MMA of 128 rows reads A (M x K) from shared memory unless it lives in
    tensor memory, and B (N x K) once per 128-row MMA. With 2-CTA MMA the CTA pair shares B: each CTA
    holds and reads half of it.
  * Hopper (wgmma): each consumer warpgroup issues its own m64 wgmma, so B is read once per 64-row
    warpgroup slice; A comes from shared memory (SS) or registers (RS). When a GEMM has fewer than 128
    rows its two warpgroups split N instead and each reads all of A. The forward's sources follow the compiled
    config: Q from registers with ``q_in_regs`` (its first k-blocks with ``q_regs_k``), P from shared memory with
    ``p_smem`` (stored there first: m x n bf16).
  * ``tma_fill`` (off by default, as in the paper's accounting; ``--tma-fill``): the bytes TMA writes into shared
    memory each step, which share the banks with the operand reads (forward: the K and V blocks; backward: Q and dO).
    It matters where the operand reads already come close: sm90 hd256's 128 x 80 tile reads 224 KB of operands in
    its 2560 tensor clocks (70% of 128 B/clk) and takes 80 KB of K / V besides (95% with them).

Forward (FA4 paper, B200, Table 1): S = Q K^T (SS) and O += P V (P from TMEM, V from smem). For a
128 x 128 x 128 tile this gives MMA 4MNd/8192 = 1024, smem 2(Md + Nd + Nd)/128 = 768 (= the paper's
3MNd/8192 for M = N = 128), exp MN/16 = 1024; two 128-row Q tiles (M = 256): 2048 / 1536 / 2048.

Backward (FA4 paper, Table 3; FA4's sm100 GEMM forms): S^T = K Q^T (SS), dP^T = V dO^T (SS),
dV += P^T dO (P^T from TMEM), dK += dS^T Q (dS^T from TMEM), dQ = dS K (SS); plus dS stored to smem
(bf16, M x N) and dQ staged in smem in fp32 (M x d, written by threads and read by the TMA reduce-add).
128 x 128 x 128, 1-CTA: MMA 2560, smem (8 + 1 + 4 tiles of 32 KiB) = 3328, exp 1024. 2-CTA halves each
GEMM's B operand: (5.5 + 5) tiles = 2688. This accounting is our reconstruction: it reproduces the
paper's totals from operand sources, but the paper's own per-term split was not available to check.
Tiles: the forward's from the resolved AttnConfig, the backward's from the kernel package (kernels/tiles.py:
the tiles our kernel runs; sm100 the paper's 128 x 128); the exp2 split is the fraction the kernel compiles
(whole register fragments). FLOPs: kernels/flops.py; GPU rates and peaks: kernels/hardware.py.

Switches: ``exp2_emu_fraction`` f moves f of the exps from MUFU to the polynomial (POLY_FMA_OPS fp32
ops: 3 FADD for the magic-add rounding and split + 3 FFMA Horner; POLY_ALU_OPS integer ops: shift and
add into the exponent; 8 instructions in all). ``rescale_threshold`` (tau) removes the O rescale
multiplies (dv per row per tile) for the share of tiles that skip it: tau = 0 rescales every tile;
for tau > 0 the share is data-dependent, so the caller passes the measured ``rescale_share`` (the
reference's stats), and without it the model gives the bound with every rescale skipped.
``pingpong`` / ``intra_wg_overlap``: with either, softmax overlaps the GEMMs and a tile costs the max
over resources; with neither, it costs max(mma, smem) + max(mufu, fma, alu, issue). ``two_cta``
(backward, Blackwell only) halves B traffic.

The kernel-level bound: (tiles with any unmasked element) x (cycles per tile) spread evenly over all
SMs at the GPU's clock, or the HBM time of reading Q, K, V (+dO) and writing O (+dQ, dK, dV) once,
whichever is longer. Tile-scheduling waves, launch and epilogue costs are not modelled (analysis/waves.py gives the
last partial round's idle share of the non-causal forward: 3.0% at every paper-grid cell from hd128 up on an H200).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

from kernels.flops import attention_flops
from kernels.hardware import GPU, GPUS, Source, get_gpu
from kernels.tiles import bwd_tile, compiled_config

BF16 = 2
F32 = 4

# The software exp2 (Cody-Waite + degree-3 Horner, magic-add rounding, no float->int conversion)
POLY_FMA_OPS = 6  # t = x + 1.5*2^23; n = t - 1.5*2^23; f = x - n; 3 x FFMA Horner
POLY_ALU_OPS = 2  # SHL of t's bits by 23; IADD into the polynomial's bits

# Non-exp softmax work per score element (thread-instructions)
FWD_FMA_PER_ELEM = 2.0  # FFMA s*scale - m*scale; FADD into the row sum
FWD_ALU_PER_ELEM = 1.5  # FMNMX for the row max; F2FP packs 2 elements to bf16 (0.5)
BWD_FMA_PER_ELEM = 3.0  # FFMA s*scale - lse; FADD dP - dPsum; FMUL by P
BWD_ALU_PER_ELEM = 1.0  # two F2FP packs (P and dS) at 0.5 each

RESOURCES = ("mma", "smem", "mufu", "fma", "alu", "issue")
MMA_SIDE = ("mma", "smem")
SOFTMAX_SIDE = ("mufu", "fma", "alu", "issue")

@dataclass(frozen=True)
class Gemm:
    """One GEMM of a tile step: C (m x n) += A (m x k) B (k x n), bf16 operands."""

    name: str
    m: int
    n: int
    k: int
    a_src: str  # "smem" | "tmem" | "reg"
    a_reads: float = 1.0  # how many times A is read from smem (if a_src == "smem")
    b_reads: float = 1.0  # how many times B is read from smem (per CTA; 0.5 = half with 2-CTA)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def smem_bytes(self) -> float:
        a = self.m * self.k * BF16 * self.a_reads if self.a_src == "smem" else 0.0
        return a + self.n * self.k * BF16 * self.b_reads


def _sm100_gemm(name, m, n, k, a_src, two_cta=False):
    # one tcgen05 MMA per 128 rows: B is read once per 128-row MMA; 2-CTA: each CTA reads half of B
    b_reads = max(1.0, m / 128) * (0.5 if two_cta else 1.0)
    return Gemm(name, m, n, k, a_src, 1.0, b_reads)


def _sm90_gemm(name, m, n, k, a_src, wgs=2):
    # each warpgroup issues its own m64 wgmma; with m >= 64*wgs the warpgroups split M (B read once
    # per 64-row slice), otherwise they split N and each reads all of A
    if m >= 64 * wgs and m % 64 == 0:
        return Gemm(name, m, n, k, a_src, 1.0, m / 64)
    return Gemm(name, m, n, k, a_src, float(wgs), math.ceil(m / 64))


def tile_gemms(arch: str, mode: str, m: int, n: int, d: int, dv: int, two_cta: bool = False, *,
               q_in_regs: bool = False, p_smem: bool = False, tma_fill: bool = False,
               q_regs_k: int = 0) -> tuple[list[Gemm], float]:
    """GEMMs of one tile step and the extra (non-GEMM) shared-memory bytes, for arch 'sm90'/'sm100'.

    sm90 forward operand sources (AttnConfig): ``q_in_regs`` S = Q K^T takes Q from registers (RS); ``q_regs_k`` only
    its first q_regs_k k-blocks (16 columns each; S = Q K^T as an RS and an SS part); ``p_smem`` O += P V reads P from
    shared memory (SS), after the threads stored it there (m x n bf16 more). ``tma_fill``: also count the
    bytes TMA writes into shared memory each step (forward: the K and V block; backward: the Q and dO block), which
    share the banks with the operand reads; off by default, as in the FA4 paper's accounting."""
    if two_cta and arch != "sm100":
        raise ValueError(f"two_cta=True: 2-CTA MMA is a Blackwell (sm100) feature; arch={arch!r}")
    if (q_in_regs or p_smem or q_regs_k) and (arch != "sm90" or mode != "fwd"):
        raise ValueError("q_in_regs / q_regs_k / p_smem: operand sources of the sm90 forward")
    if mode == "fwd":
        fill = n * (d + dv) * BF16 if tma_fill else 0.0
        if arch == "sm100":
            if m % 128:
                raise ValueError(f"tile_m={m}: Blackwell forward tiles are whole 128-row MMAs")
            return [_sm100_gemm("S=QK^T", m, n, d, "smem"), _sm100_gemm("O+=PV", m, dv, n, "tmem")], float(fill)
        kr = d if q_in_regs else min(16 * int(q_regs_k), d)  # Q's columns read from registers
        qk = [_sm90_gemm("S=QK^T", m, n, d, "reg" if q_in_regs else "smem")] if kr in (0, d) else [
            _sm90_gemm("S=QK^T (Q regs)", m, n, kr, "reg"), _sm90_gemm("S=QK^T (Q smem)", m, n, d - kr, "smem")]
        gemms = qk + [_sm90_gemm("O+=PV", m, dv, n, "smem" if p_smem else "reg")]
        return gemms, float(fill + (m * n * BF16 if p_smem else 0))
    if mode == "bwd":
        extra = m * n * BF16 + 2 * m * d * F32  # dS store; fp32 dQ staged: written, then read by TMA
        if tma_fill:
            extra += m * (d + dv) * BF16  # this step's Q and dO blocks
        if arch == "sm100":
            g = [
                _sm100_gemm("S^T=KQ^T", n, m, d, "smem", two_cta),
                _sm100_gemm("dP^T=VdO^T", n, m, dv, "smem", two_cta),
                _sm100_gemm("dV+=P^TdO", n, dv, m, "tmem", two_cta),
                _sm100_gemm("dK+=dS^TQ", n, d, m, "tmem", two_cta),
                _sm100_gemm("dQ=dSK", m, d, n, "smem", two_cta),
            ]
            return g, float(extra)
        g = [
            _sm90_gemm("S^T=KQ^T", n, m, d, "smem"),
            _sm90_gemm("dP^T=VdO^T", n, m, dv, "smem"),
            _sm90_gemm("dV+=P^TdO", n, dv, m, "reg"),
            _sm90_gemm("dK+=dS^TQ", n, d, m, "reg"),
            _sm90_gemm("dQ=dSK", m, d, n, "smem"),
        ]
        return g, float(extra)
    raise ValueError(f"mode={mode!r}: supported modes are 'fwd', 'bwd'")


@dataclass
class TileCost:
    """Cycles per resource for one tile step, and the tile's cost under the overlap rule."""

    cycles: dict
    flops: int
    overlap: bool
    gemms: list = field(default_factory=list)

    @property
    def total(self) -> float:
        if self.overlap:
            return max(self.cycles.values())
        return max(self.cycles[r] for r in MMA_SIDE) + max(self.cycles[r] for r in SOFTMAX_SIDE)

    @property
    def bound(self) -> str:
        if self.overlap:
            return max(self.cycles, key=self.cycles.get)
        a = max(MMA_SIDE, key=self.cycles.get)
        b = max(SOFTMAX_SIDE, key=self.cycles.get)
        return f"{a}+{b}"


def tile_cost(gpu: GPU, mode: str, m: int, n: int, d: int, dv: int | None = None, *,
              exp2_emu_fraction: float = 0.0, rescale_share: float = 1.0, overlap: bool = True,
              two_cta: bool = False, poly_cost_scale: float = 1.0, q_in_regs: bool = False, p_smem: bool = False,
              tma_fill: bool = False, q_regs_k: int = 0) -> TileCost:
    """Cycles per resource of one M x N tile (head dims d, dv) on ``gpu`` (operand sources and ``tma_fill``: as
    tile_gemms)."""
    dv = d if dv is None else dv
    f = float(exp2_emu_fraction)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"exp2_emu_fraction={f}: must be in [0, 1]")
    if not 0.0 <= rescale_share <= 1.0:
        raise ValueError(f"rescale_share={rescale_share}: must be in [0, 1]")
    arch = "sm100" if gpu.arch.startswith("sm10") else gpu.arch
    gemms, extra = tile_gemms(arch, mode, m, n, d, dv, two_cta, q_in_regs=q_in_regs, p_smem=p_smem,
                              tma_fill=tma_fill, q_regs_k=q_regs_k)
    elems = m * n
    if mode == "fwd":
        fma = FWD_FMA_PER_ELEM + rescale_share * dv / n
        alu = FWD_ALU_PER_ELEM
    else:
        fma, alu = BWD_FMA_PER_ELEM, BWD_ALU_PER_ELEM
    fma += f * POLY_FMA_OPS * poly_cost_scale
    alu += f * POLY_ALU_OPS * poly_cost_scale
    mufu = 1.0 - f
    flops = sum(g.flops for g in gemms)
    cycles = {
        "mma": flops / gpu.mma_flops_per_clk,
        "smem": (sum(g.smem_bytes for g in gemms) + extra) / gpu.smem_bytes_per_clk,
        "mufu": elems * mufu / gpu.mufu_ex2_per_clk,
        "fma": elems * fma / gpu.fma_per_clk,
        "alu": elems * alu / gpu.alu_per_clk,
        "issue": elems * (fma + alu + mufu) / gpu.issue_per_clk,
    }
    return TileCost(cycles=cycles, flops=flops, overlap=overlap, gemms=gemms)


# ---------------------------------------------------------------------------------------------------
# Calibration: measured per-SM rates from the microbenchmarks
# ---------------------------------------------------------------------------------------------------
MICROBENCH_PATHS = ("results/h200/microbench/rows.jsonl", "results/microbench/rows.jsonl")
MIN_CEILING_SHARE = 0.9  # a measured rate replaces the table's peak only if it reaches this share of it
# microbench metric -> GPU field it calibrates
CALIBRATES = {
    "mufu_ex2_per_clk_sm": "mufu_ex2_per_clk",
    "mma_bf16_flops_per_clk_sm": "mma_flops_per_clk",
    "smem_bytes_per_clk_sm": "smem_bytes_per_clk",
    "sm_clock_mhz": "clock_mhz",
}


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def load_calibration(paths=None) -> dict:
    """Measured values from microbenchmark rows: {metric: (value, method, gpu_name)}. Missing file: {}."""
    from analysis.load import read_rows, set_exists  # a set's archived rows (rows.jsonl.xz) count too

    out: dict = {}
    for p in paths or MICROBENCH_PATHS:
        p = Path(p)
        if not p.is_absolute():
            p = _repo_root() / p
        if not set_exists(p):
            continue
        for r in read_rows(p):
            if r.get("status", "ok") != "ok" or r.get("value") is None:
                continue
            out[r.get("metric")] = (float(r["value"]), r.get("method", ""), r.get("gpu_name", ""))
    return out


def calibrated_gpu(gpu: GPU, calib: dict | None) -> tuple[GPU, float, dict]:
    """Apply measured values (only to the GPU they were measured on). Returns the GPU, the polynomial
    cost scale (measured issue cost of one software exp2 / POLY ops), and {field: 'measured (...)' or
    'hardware table'} (kernels/hardware.py, whose sources say datasheet / paper / inferred)."""
    used = {f: "hardware table" for f in ("clock_mhz", "mma_flops_per_clk", "mufu_ex2_per_clk", "smem_bytes_per_clk")}
    used["poly_exp2"] = f"model ({POLY_FMA_OPS} fma + {POLY_ALU_OPS} alu ops)"
    if not calib:
        return gpu, 1.0, used
    same = [v for v in calib.values() if v[2] and _gpu_matches(gpu, v[2])]
    if not same:
        return gpu, 1.0, used
    vals = {}
    for metric, fld in CALIBRATES.items():
        if metric in calib and _gpu_matches(gpu, calib[metric][2]):
            value, table = calib[metric][0], getattr(gpu, fld)
            if fld != "clock_mhz" and table and value < MIN_CEILING_SHARE * table:
                # a bound must bound: a benchmark far below the documented peak (e.g. a GEMM at 66% of the tensor
                # rate, which our own attention forward exceeds) measured itself, not the hardware's ceiling
                used[fld] = (f"hardware table (measured {value:.4g} is below {MIN_CEILING_SHARE:.0%} of it: "
                             f"a lower bound, not a ceiling; {calib[metric][1]})")
                continue
            vals[fld] = value
            used[fld] = f"measured ({calib[metric][1]})"
    scale = 1.0
    if "poly_exp2_per_clk_sm" in calib and _gpu_matches(gpu, calib["poly_exp2_per_clk_sm"][2]):
        per_exp = gpu.issue_per_clk / calib["poly_exp2_per_clk_sm"][0]
        scale = per_exp / (POLY_FMA_OPS + POLY_ALU_OPS)
        used["poly_exp2"] = f"measured ({per_exp:.2f} issue slots per exp; {calib['poly_exp2_per_clk_sm'][1]})"
    if vals:
        gpu = gpu.with_values(vals, Source("measured", note="experiments.microbench"))
    return gpu, scale, used


def _gpu_matches(gpu: GPU, name: str) -> bool:
    n = str(name).lower()
    return gpu.name.split()[0].lower() in n


# ---------------------------------------------------------------------------------------------------
# Whole-problem prediction
# ---------------------------------------------------------------------------------------------------
def _get(shape, name, default=None):
    if shape is None:
        return default
    if isinstance(shape, dict):
        return shape.get(name, default)
    return getattr(shape, name, default)


def count_tiles(seqlen_q: int, seqlen_k: int, tile_m: int, tile_n: int, causal: bool) -> int:
    """Tiles with at least one unmasked element (causal aligned bottom-right, as FlashAttention)."""
    nb_m, nb_n = math.ceil(seqlen_q / tile_m), math.ceil(seqlen_k / tile_n)
    if not causal:
        return nb_m * nb_n
    total = 0
    for i in range(nb_m):
        last_row = min((i + 1) * tile_m, seqlen_q) - 1
        last_col = last_row + seqlen_k - seqlen_q  # highest key this block's last row sees
        if last_col < 0:
            continue
        total += min(nb_n, last_col // tile_n + 1)
    return total


@dataclass
class Prediction:
    gpu: str
    mode: str
    tflops: float  # predicted upper bound
    bound: str  # resource that binds (per tile), or "hbm"
    tile: tuple
    tile_cycles: dict
    tile_total: float
    values_used: dict
    config: dict

    def row(self) -> dict:
        return dict(gpu=self.gpu, mode=self.mode, tflops=round(self.tflops, 1), bound=self.bound,
                    tile=f"{self.tile[0]}x{self.tile[1]}",
                    **{f"cyc_{k}": round(v, 1) for k, v in self.tile_cycles.items()})


DEFAULT_SHAPE = dict(batch=4, seqlen_q=8192, seqlen_k=8192)  # 32k tokens; heads = 2048 / hdim


def predict(arch, hdim: int, causal: bool = False, config=None, shape=None, *, mode: str = "fwd",
            hdim_v: int | None = None, rescale_share: float | None = None, calib: dict | None = None,
            use_measured: bool = True, tma_fill: bool = False) -> Prediction:
    """Predicted TFLOP/s bound and binding resource for one (GPU, head dim, causal, config, shape).

    ``arch``: a GPU key ('h100', 'h200', 'b200', 'b300') or an arch ('sm90' -> H200, 'sm100' -> B200).
    ``config``: an AttnConfig, a dict of its fields, or None (per-arch defaults).
    ``shape``: a Shape, a dict with batch/seqlen_q/seqlen_k/heads (and hdim_v), or None (32k tokens).
    ``rescale_share``: share of tiles that rescale O (from the reference's stats); None: 1.0 when
    rescale_threshold == 0, else 0.0 (every rescale skipped: the bound).
    ``calib``: measured microbench values (default: read results/*microbench*/rows.jsonl).
    The sm90 forward's operand sources follow the compiled config (q_in_regs, q_regs_k, p_smem); ``tma_fill``: count
    the TMA writes into shared memory too (tile_gemms).
    """
    from kernels.config import AttnConfig

    gpu = get_gpu(arch)
    if mode not in ("fwd", "bwd"):
        raise ValueError(f"mode={mode!r}: supported modes are 'fwd', 'bwd'")
    if calib is None and use_measured:
        calib = load_calibration()
    gpu, poly_scale, used = calibrated_gpu(gpu, calib if use_measured else None)
    cfg_arch = "sm100" if gpu.arch.startswith("sm10") else "sm90"
    if config is None:
        cfg = AttnConfig()
    elif isinstance(config, dict):
        cfg = AttnConfig.from_dict(config)
    else:
        cfg = config
    cfg = cfg.resolve(cfg_arch, hdim, causal)
    hdim_v = int(_get(shape, "hdim_v", None) or hdim_v or hdim)
    if mode == "fwd":
        tm, tn = cfg.tile_m, cfg.tile_n
    else:
        tm, tn = bwd_tile(cfg_arch, hdim, causal, cfg)  # the kernel package's own tiles (kernels/tiles.py)
    if rescale_share is None:
        rescale_share = 1.0 if cfg.rescale_threshold == 0 else 0.0
    overlap = bool(cfg.pingpong or cfg.intra_wg_overlap)
    compiled = compiled_config(cfg, cfg_arch, hdim, causal, mode)
    frac = compiled["exp2_emu_fraction"]  # whole fragments
    run_two_cta = bool(mode == "bwd" and compiled.get("two_cta"))  # two_cta=None: the head dim's default (sm90 hd256)
    two_cta = run_two_cta and cfg_arch == "sm100"
    sm90_fwd = cfg_arch == "sm90" and mode == "fwd"
    tc = tile_cost(gpu, mode, tm, tn, hdim, hdim_v, exp2_emu_fraction=frac,
                   rescale_share=rescale_share, overlap=overlap, two_cta=two_cta, poly_cost_scale=poly_scale,
                   q_in_regs=sm90_fwd and bool(compiled.get("q_in_regs")),
                   p_smem=sm90_fwd and bool(compiled.get("p_smem")), tma_fill=tma_fill,
                   q_regs_k=int(compiled.get("q_regs_k") or 0) if sm90_fwd else 0)

    batch = int(_get(shape, "batch", DEFAULT_SHAPE["batch"]))
    sq = int(_get(shape, "seqlen_q", DEFAULT_SHAPE["seqlen_q"]))
    sk = int(_get(shape, "seqlen_k", sq))
    heads = int(_get(shape, "heads", max(1, 2048 // hdim)))
    tiles = count_tiles(sq, sk, tm, tn, causal) * batch * heads
    clock_hz = gpu.clock_mhz * 1e6
    t_compute = tiles * tc.total / (gpu.sms * clock_hz)
    io = (sq * (hdim + hdim_v) + sk * (hdim + hdim_v)) * BF16 * batch * heads  # Q,O + K,V
    if mode == "bwd":
        io = io * 2 + sq * hdim_v * BF16 * batch * heads  # + dQ, dK, dV written; dO read
    t_hbm = io / (gpu.hbm_tb_s * 1e12)
    flops = attention_flops(batch, heads, sq, sk, hdim, hdim_v, causal, mode)  # kernels/flops.py
    t = max(t_compute, t_hbm)
    bound = tc.bound if t_compute >= t_hbm else "hbm"
    if run_two_cta and not two_cta:
        used["two_cta"] = ("not modelled on sm90: its gain there (dQ global reductions halved, Q/dO multicast) "
                           "is outside the per-tile resources")
    if mode == "bwd" and cfg.deterministic:
        used["deterministic"] = "not modelled: the semaphore wait between dQ contributors is not a per-tile resource"
    cfg_d = cfg.to_dict()
    cfg_d["rescale_share"] = rescale_share
    return Prediction(gpu=gpu.name, mode=mode, tflops=flops / t / 1e12, bound=bound, tile=(tm, tn),
                      tile_cycles=tc.cycles, tile_total=tc.total, values_used=used, config=cfg_d)


# ---------------------------------------------------------------------------------------------------
# `python run.py roofline`
# ---------------------------------------------------------------------------------------------------
VARIANTS = {
    # name -> AttnConfig overrides; the first is the per-arch default, the rest switch one thing off/on
    "default": {},
    "tau=0": {"rescale_threshold": 0.0},
    "emu=0": {"exp2_emu_fraction": 0.0},
    "emu=0.5": {"exp2_emu_fraction": 0.5},
    "no-overlap": {"pingpong": False, "intra_wg_overlap": False},
    "fa3-like": {"rescale_threshold": 0.0, "exp2_emu_fraction": 0.0},
    "2cta": {"two_cta": True},
    "p_smem": {"p_smem": True},  # sm90 forward: P V reads P from shared memory (an SS wgmma)
}


def table(gpus=("h100", "h200", "b200", "b300"), hdims=(64, 128, 192, 256), modes=("fwd", "bwd"),
          causals=(False, True), variants=None, calib=None, use_measured=True, tma_fill=False) -> list[dict]:
    """Rows (gpu, mode, hdim, causal, variant, tflops, bound, tile cycles) for every combination the kernels
    have (a backward head dim without a kernel, kernels/tiles.py, has no row)."""
    from kernels.config import ConfigError

    variants = variants or list(VARIANTS)
    if calib is None and use_measured:
        calib = load_calibration()
    rows = []
    for g in gpus:
        for mode in modes:
            for hd in hdims:
                hv = 128 if hd == 192 else hd  # the paper's (192, 128)
                for c in causals:
                    for v in variants:
                        ov = VARIANTS[v]
                        if v == "2cta" and (mode != "bwd" or GPUS[g].arch != "sm100"):
                            continue
                        if v == "p_smem" and (mode != "fwd" or GPUS[g].arch != "sm90" or not _p_smem_fits(hd, hv, c)):
                            continue
                        try:
                            p = predict(g, hd, c, ov, dict(hdim_v=hv), mode=mode, calib=calib,
                                        use_measured=use_measured, tma_fill=tma_fill)
                        except ConfigError:  # no backward kernel for this head dim
                            continue
                        rows.append(dict(gpu=p.gpu, mode=mode, hdim=f"{hd}" if hv == hd else f"{hd}/{hv}",
                                         causal=c, variant=v, **{k: x for k, x in p.row().items()
                                                                 if k not in ("gpu", "mode")}))
    return rows


def _p_smem_fits(hdim: int, hdim_v: int, causal: bool) -> bool:
    """Whether the sm90 forward's default tile has room for sP beside Q and the K / V stages (the kernel's own rule,
    kernels.tiles.sm90_fwd_smem): hd 64 / 128 yes, (192, 128) and 256 no."""
    from kernels.config import AttnConfig
    from kernels.tiles import sm90_fwd_smem

    c = AttnConfig(p_smem=True).resolve("sm90", hdim, causal)
    smem, limit = sm90_fwd_smem(c.tile_m, c.tile_n, c.num_stages, hdim, hdim_v, elem=BF16, p_tiles=1)
    return smem <= limit


def _format(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    w = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(w[c]) for c in cols), "  ".join("-" * w[c] for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(w[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def _parse(args) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="run.py roofline", description=__doc__.splitlines()[0])
    p.add_argument("--gpu", nargs="*", default=["h100", "h200", "b200", "b300"])
    p.add_argument("--hdim", nargs="*", type=int, default=[64, 128, 192, 256])
    p.add_argument("--mode", nargs="*", default=["fwd", "bwd"])
    p.add_argument("--variant", nargs="*", default=list(VARIANTS))
    p.add_argument("--datasheet", action="store_true", help="use the hardware table only (ignore measured microbench values)")
    p.add_argument("--tma-fill", action="store_true", dest="tma_fill",
                   help="count the bytes TMA writes into shared memory each step (K / V blocks; backward Q / dO)")
    if args is None:
        return p.parse_args([])
    if isinstance(args, (list, tuple)):
        return p.parse_args(list(args))
    if isinstance(args, argparse.Namespace):
        return args
    # a mapping (e.g. a Hydra config): take the keys we know
    ns = p.parse_args([])
    try:
        items = dict(args).items()
    except (TypeError, ValueError):
        items = []
    for k, v in items:
        if hasattr(ns, k) and v is not None:
            if k in ("datasheet", "tma_fill"):
                setattr(ns, k, bool(v))
            else:
                setattr(ns, k, list(v) if hasattr(v, "__iter__") and not isinstance(v, str) else [v])
    return ns


def main(args=None) -> int:
    """`python run.py roofline [--gpu ...] [--hdim ...] [--mode ...] [--variant ...] [--datasheet]`: print the
    hardware table, the values used (measured vs hardware table) and the bound per config and GPU. Returns 0."""
    report(args)
    return 0


def report(args=None) -> list[dict]:
    """What ``main`` prints; returns the table rows."""
    ns = _parse(args)
    for g in ns.gpu:
        get_gpu(g)  # validates the name
    unknown = sorted(set(ns.variant) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"variant={unknown}: supported variants are {sorted(VARIANTS)}")
    calib = {} if ns.datasheet else load_calibration()
    hw = [r for g in ns.gpu for r in get_gpu(g).rows()]
    print("Hardware table (per SM per clock; sources in kernels/hardware.py):")
    print(_format([{k: r[k] for k in ("gpu", "field", "value", "source")} for r in hw]))
    print()
    for g in ns.gpu:
        _, _, used = calibrated_gpu(get_gpu(g), calib)
        print(f"{get_gpu(g).name}: values used: " + ", ".join(f"{k}={v}" for k, v in used.items()))
    print()
    rows = table(gpus=ns.gpu, hdims=ns.hdim, modes=ns.mode, variants=ns.variant, calib=calib,
                 use_measured=not ns.datasheet, tma_fill=ns.tma_fill)
    print("Predicted bound (TFLOP/s) per config; tau>0 assumes every rescale skipped (the bound)"
          + ("; shared memory counts the TMA writes:" if ns.tma_fill else ":"))
    print(_format(rows))
    return rows


if __name__ == "__main__":  # pragma: no cover
    import sys

    main(sys.argv[1:])
