"""The search space of ``python run.py tune``: the valid combinations of the AttnConfig fields that shape a kernel,
and the order in which a time budget visits them.

Forward (sm90): tile_m (2 or 3 consumer warpgroups of 64 rows; 4, tile_m=256, is not searched: it needs pingpong
off and 112 registers, and ran 0.88-0.94x the default at hd64 on an H100, README "Four consumer warpgroups"), tile_n,
num_stages, the register split (producer_regs, consumer_regs), pingpong, exp2_emu_fraction, rescale_before_pv,
q_in_regs (only where kernels/config.py q_in_regs_fits: 128-row tiles at most 128 wide, exp2 fraction under 1/2), p_smem (P V reads P from
shared memory: P leaves the register floor, sP joins the kernel's shared-memory budget, so hd64's 192-row tiles reach
192-wide key blocks), p_smem_early (with p_smem only: one sP tile per K/V stage, P stored before the wait for the
previous P V) and q_regs_k (without q_in_regs only: the first 1 / 2 / 4 k-blocks of Q in registers, for head dims
where all of Q does not fit). Backward: bwd_tile_m. (``cluster_m`` is not
searched: an opt-in forward switch for non-causal calls only, A/B it with backend.config.cluster_m=2; ``persistent``
is not searched either: its default is a per-call rule on seqlen_q,
DEFAULTS' persistent_max_seqlen, which one tuned value per (hdim, causal) cannot express -- A/B it with
backend.config.persistent=true/false at the sequence lengths in question.) A combination is *valid* when AttnConfig accepts it, the
kernel class's constructor accepts it (its shared-memory and register-budget asserts; no compilation), and the live
accumulators of a consumer thread fit its register budget (a lower bound, below): near that bound a kernel may still
spill, which its timing then shows. Combinations that compile to the same kernel as another (the exp2 fraction is
rounded to whole register fragments) are kept once. A field searched since after the first tune rows were recorded
(LATE_FIELDS: rescale_before_pv, q_in_regs, p_smem, p_smem_early, q_regs_k) is left out of a job's config where it has the value that leaving it out resolves to
(job_config), so the jobs, job keys and rows of the searches from before it are unchanged.

Order: first every one-field change of the default (each field at each of its valid values, the others at the
default), then a greedy all-pairs cover: candidates added one at a time, each covering the most value pairs (two
fields at two values) not yet covered, until every pair that any valid combination has is covered by some candidate
or the default. A budget that stops early has measured the one-field neighbourhood first. A neighbour whose new
tile cannot take the default's Q in registers (q_in_regs_fits) runs without it and still counts as a one-field
change.
"""
from __future__ import annotations

import functools
import heapq
import itertools

from kernels.config import AttnConfig, ConfigError, TUNED_FIELDS, normalize_arch, q_in_regs_fits, table_defaults
from kernels.tiles import compiled_config

FWD_HDIMS = {64: 64, 128: 128, 192: 128, 256: 256}  # QK head dim -> V head dim of the shapes tuned
BWD_HDIMS = (64, 128)
DIRECTIONS = ("fwd", "bwd")

# sm90 forward values. The register split is one factor, a level whose (producer_regs, consumer_regs) depends on
# tile_m (2 or 3 consumer warpgroups share 512 registers per thread with the producer): 0 = FA3's split, 1 = the
# other small producer budget, 2 = a larger producer budget.
REG_SPLITS = {128: ((24, 240), (32, 240), (56, 224)), 192: ((32, 160), (24, 160), (56, 152))}
SM90_FWD_VALUES = {
    "tile_m": (128, 192),
    "tile_n": tuple(range(64, 257, 16)),
    "num_stages": (1, 2, 3, 4),
    "reg_split": (0, 1, 2),
    "pingpong": (True, False),
    "exp2_emu_fraction": (0.0, 0.125, 0.25, 0.5),
    "rescale_before_pv": (False, True),
    "q_in_regs": (False, True),
    "p_smem": (False, True),
    "p_smem_early": (False, True),
    "q_regs_k": (0, 1, 2, 4),  # (8, hd256's widest, spills: 12 LDL / 8 STL on the CPU)
}
SM90_BWD_VALUES = {"bwd_tile_m": (64, 80, 128)}  # 80: hd128 only (dQ^T; kernels/sm90/bwd.py)
# searched fields added after tune rows existed: left out of a job's config at the value they resolve to when left out
LATE_FIELDS = ("rescale_before_pv", "q_in_regs", "p_smem", "p_smem_early", "q_regs_k")
REG_RESERVE = 16  # registers per consumer thread beyond the accumulators: row max/sum, indices, addresses (minimum)


class TuneSpaceError(ValueError):
    """A search that cannot be set up (arch without a kernel, head dim without a kernel)."""


def hdims_for(direction: str) -> tuple[int, ...]:
    return tuple(FWD_HDIMS) if direction == "fwd" else BWD_HDIMS


def check_target(arch: str, hdim: int, direction: str) -> str:
    """The normalised arch; TuneSpaceError for a target with no kernel to time."""
    arch = normalize_arch(arch)
    if arch != "sm90":
        raise TuneSpaceError(f"arch={arch}: tune times kernels, and this package has sm90 kernels only "
                             "(sm100 is a model/compile target here)")
    if direction not in DIRECTIONS:
        raise TuneSpaceError(f"direction={direction!r}: supported: {', '.join(DIRECTIONS)}")
    if int(hdim) not in hdims_for(direction):
        raise TuneSpaceError(f"hdim={hdim}: the sm90 {direction} kernel is tuned at head dims {list(hdims_for(direction))}")
    return arch


# ---- one candidate: a dict of the direction's fields (+ pingpong for the forward) --------------------------------
def fields_of(direction: str) -> tuple[str, ...]:
    return TUNED_FIELDS[direction] + (("pingpong",) if direction == "fwd" else ())


def default_point(arch: str, hdim: int, causal: bool, direction: str) -> dict:
    """The table default (kernels/config.py DEFAULTS, without conf/tuned/) as a point of the space."""
    d = table_defaults(arch, hdim, causal, tuned=False)
    return {k: (AttnConfig().pingpong if k == "pingpong" else d[k]) for k in fields_of(direction)}


def _kernel_check(point: dict, hdim: int, causal: bool, direction: str) -> str | None:
    """The kernel constructor's own asserts (no compilation); None when accepted or cutlass-dsl is absent."""
    try:
        import cutlass
    except ImportError:
        return None
    if direction == "fwd":
        from kernels.sm90.fwd import FlashFwdSm90

        try:
            FlashFwdSm90(cutlass.BFloat16, hdim, FWD_HDIMS[hdim], causal, tile_m=point["tile_m"],
                         tile_n=point["tile_n"], num_stages=point["num_stages"],
                         exp2_emu_fraction=point["exp2_emu_fraction"], pingpong=point["pingpong"],
                         consumer_regs=point["consumer_regs"], producer_regs=point["producer_regs"],
                         rescale_before_pv=bool(point.get("rescale_before_pv", False)),
                         q_in_regs=bool(point.get("q_in_regs", False)), p_smem=bool(point.get("p_smem", False)),
                         p_smem_early=bool(point.get("p_smem_early", False)), q_regs_k=int(point.get("q_regs_k", 0)))
        except (ValueError, AssertionError) as e:
            return str(e).splitlines()[0]
        return None
    from kernels.sm90.backward import _check_supported
    from kernels.sm90.bwd import FlashBwdSm90

    try:
        cfg = AttnConfig(**point).resolve("sm90", hdim, causal)
        _check_supported(cfg, hdim, hdim)
        FlashBwdSm90(cutlass.BFloat16, hdim, causal, tile_m=point["bwd_tile_m"])
    except (ValueError, AssertionError) as e:
        return str(e).splitlines()[0]
    return None


def register_floor(point: dict, hdim: int) -> int:
    """Registers a consumer thread needs at least: its O accumulator (64 rows x hdim_v fp32 over 128 threads), S of
    the next block (64 x tile_n fp32) and P of the current one (bf16, held while PV(j) runs beside softmax(j+1); not
    with p_smem, where the GEMM reads P from shared memory); with q_in_regs also its Q fragment (64 rows x hdim bf16),
    with q_regs_k the first q_regs_k k-blocks of it (64 rows x 16 columns bf16 each: 4 registers)."""
    dv, tn = FWD_HDIMS[hdim], point["tile_n"]
    p = 0 if point.get("p_smem") else tn // 4
    return dv // 2 + tn // 2 + p + _q_regs(point, hdim) + REG_RESERVE


def _q_regs(point: dict, hdim: int) -> int:
    """Registers per consumer thread that hold Q: all of it with q_in_regs, q_regs_k k-blocks of 16 columns else."""
    return hdim // 4 if point.get("q_in_regs") else 4 * int(point.get("q_regs_k") or 0)


def why_invalid(point: dict, arch: str, hdim: int, causal: bool, direction: str) -> str | None:
    """None for a valid point, else the first reason it is not."""
    try:
        AttnConfig(**point).resolve(arch, hdim, causal)
    except (ConfigError, TypeError) as e:
        return str(e)
    if direction == "fwd":
        why = _register_reason(point, hdim)
        if why:
            return why
    return _kernel_check(point, hdim, causal, direction)


def _register_reason(point: dict, hdim: int) -> str | None:
    """why_invalid's forward register checks (Q in registers, the accumulator floor): arithmetic on the point alone."""
    if point.get("q_in_regs") and not q_in_regs_fits(point["tile_m"], point["tile_n"], point["exp2_emu_fraction"]):
        return ("q_in_regs: Q stays in registers only on 128-row tiles at most 128 wide with an exp2 fraction under "
                "1/2 (kernels/config.py q_in_regs_fits)")
    need = register_floor(point, hdim)
    if need > point["consumer_regs"]:
        return (f"registers: the accumulators need >= {need} per consumer thread (O {FWD_HDIMS[hdim] // 2}, "
                f"S {point['tile_n'] // 2}, P {0 if point.get('p_smem') else point['tile_n'] // 4}, "
                f"{f'Q {_q_regs(point, hdim)}, ' if _q_regs(point, hdim) else ''}+{REG_RESERVE}); budget {point['consumer_regs']}")
    return None


def _raw_points(direction: str):
    if direction == "bwd":
        for v in SM90_BWD_VALUES["bwd_tile_m"]:
            yield {"bwd_tile_m": v}
        return
    V = SM90_FWD_VALUES
    for tm, tn, st, lv, pp, ex, rb, qr, ps, pe, qk in itertools.product(
            V["tile_m"], V["tile_n"], V["num_stages"], V["reg_split"], V["pingpong"], V["exp2_emu_fraction"],
            V["rescale_before_pv"], V["q_in_regs"], V["p_smem"], V["p_smem_early"], V["q_regs_k"]):
        if (pe and not ps) or (qk and qr):  # p_smem_early needs p_smem; q_regs_k holds part of what q_in_regs holds
            continue
        pr, cr = REG_SPLITS[tm][lv]
        yield {"tile_m": tm, "tile_n": tn, "num_stages": st, "consumer_regs": cr, "producer_regs": pr,
               "exp2_emu_fraction": ex, "pingpong": pp, "rescale_before_pv": rb, "q_in_regs": qr, "p_smem": ps,
               "p_smem_early": pe, "q_regs_k": qk}


def kernel_id(point: dict, arch: str, hdim: int, causal: bool, direction: str) -> str:
    """What the point compiles to (exp2 fraction as compiled), as a stable string: equal ids = one kernel."""
    return _kernel_id(tuple(sorted(point.items())), arch, hdim, causal, direction)


@functools.lru_cache(maxsize=None)
def _kernel_id(items: tuple, arch: str, hdim: int, causal: bool, direction: str) -> str:
    cc = compiled_config(AttnConfig(**dict(items)), arch, hdim, causal, mode=direction)
    return repr(sorted(cc.items()))


def valid_points(arch: str, hdim: int, causal: bool, direction: str) -> list[dict]:
    """Every valid point of the space, one per compiled kernel (the first of each in enumeration order)."""
    arch = check_target(arch, hdim, direction)
    return [dict(items) for items in _valid_points(arch, int(hdim), bool(causal), direction)]


@functools.lru_cache(maxsize=None)
def _valid_points(arch: str, hdim: int, causal: bool, direction: str) -> tuple:
    """valid_points, once per process: each point's checks are pure functions of it and the defaults table (a point
    sets every tuned field, so conf/tuned/ does not enter)."""
    out, seen = [], set()
    for p in _raw_points(direction):
        if direction == "fwd" and _register_reason(p, hdim):  # the cheap part of why_invalid first
            continue
        if why_invalid(p, arch, hdim, causal, direction) is not None:
            continue
        kid = kernel_id(p, arch, hdim, causal, direction)
        if kid not in seen:
            seen.add(kid)
            out.append(tuple(p.items()))
    return tuple(out)


def job_config(point: dict, arch: str, hdim: int, causal: bool) -> dict:
    """The config a tune job runs for ``point``: the point without its LATE_FIELDS that have the value they resolve to
    when left out (the defaults table or conf/tuned/ at (arch, hdim, causal)). A point of the search from before such
    a field existed gives that search's config and job key; where the tuned file sets the field, the value stays
    explicit, so the table default is what runs as the baseline."""
    late = [k for k in LATE_FIELDS if k in point]
    if not late:
        return dict(point)
    implicit = AttnConfig(**{k: v for k, v in point.items() if k not in LATE_FIELDS}).resolve(arch, hdim, causal)
    return {k: v for k, v in point.items() if not (k in late and v == (getattr(implicit, k) or False))}


def reg_split(point: dict):
    """The register-split level of a forward point (None for a split that is not one of REG_SPLITS)."""
    splits = REG_SPLITS.get(point["tile_m"], ())
    pc = (point["producer_regs"], point["consumer_regs"])
    return splits.index(pc) if pc in splits else pc


def factors(point: dict) -> dict:
    """The point as pairwise factors: the register split is one factor, its level (the two fields are coupled)."""
    f = {k: v for k, v in point.items() if k not in ("consumer_regs", "producer_regs")}
    if "consumer_regs" in point:
        f["reg_split"] = reg_split(point)
    return f


def pairs(point: dict) -> set:
    f = sorted(factors(point).items())
    if len(f) == 1:
        return {(f[0], f[0])}
    return {(a, b) for a, b in itertools.combinations(f, 2)}


def candidates(arch: str, hdim: int, causal: bool, direction: str, valid: list[dict] | None = None) -> list[dict]:
    """The search order: one-field changes of the default, then the greedy all-pairs cover; the default itself and
    points that compile to the default's kernel are left out (they are the baseline)."""
    arch = check_target(arch, hdim, direction)
    valid = valid_points(arch, hdim, causal, direction) if valid is None else valid
    base = default_point(arch, hdim, causal, direction)
    base_id = kernel_id(base, arch, hdim, causal, direction)
    pool = [p for p in valid if kernel_id(p, arch, hdim, causal, direction) != base_id]
    fb = factors(base)
    ofat = [p for p in pool if len(_changed(p, fb)) == 1]
    order = sorted(ofat, key=lambda p: [list(factors(p)).index(k) for k in _changed(p, fb)])
    covered = pairs(base).union(*(pairs(p) for p in order)) if order else set(pairs(base))
    goal = set().union(*(pairs(p) for p in valid)) if valid else set()
    rest = [p for p in pool if p not in order]
    return order + [rest[i] for i in greedy_cover([pairs(p) for p in rest], covered, goal)]


def greedy_cover(sets: list[set], covered: set, goal: set) -> list[int]:
    """Indices into ``sets``, picked one at a time, each the set with the most elements not yet covered (the first
    among equals), until ``goal`` is covered or no set adds any. Lazy: a set's gain only shrinks as the cover grows,
    so a heap of stale gains, each recomputed when it comes to the top, picks what a full rescan would."""
    covered, picked = set(covered), []
    heap = [(-len(s - covered), i) for i, s in enumerate(sets)]
    heapq.heapify(heap)
    while heap and not goal <= covered:
        stale, i = heapq.heappop(heap)
        gain = len(sets[i] - covered)
        if gain < -stale:
            heapq.heappush(heap, (-gain, i))
            continue
        if gain == 0:
            break
        picked.append(i)
        covered |= sets[i]
    return picked


def _changed(point: dict, fb: dict) -> list:
    """The factors where ``point`` differs from the default's factors ``fb``; q_in_regs does not count where the
    default's is on and the point's tile cannot take it (the neighbour runs without it: q_in_regs_fits)."""
    f = factors(point)
    forced = ("q_in_regs" in f and fb.get("q_in_regs") and not f["q_in_regs"]
              and not q_in_regs_fits(point["tile_m"], point["tile_n"], point["exp2_emu_fraction"]))
    return [k for k, v in f.items() if v != fb.get(k) and not (forced and k == "q_in_regs")]


def variant_name(point: dict, base: dict) -> str:
    """'tile_n=176,num_stages=3': the fields where the point differs from the default ('default' when none)."""
    diff = [f"{k}={_fmt(v)}" for k, v in point.items() if base.get(k) != v]
    return ",".join(diff) or "default"


def _fmt(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
