"""What a config compiles to, read from the kernel package itself: backward tiles and the effective exp2 split.

The roofline and the result rows ask here instead of keeping their own copies, so a change of tiles in the
kernels shows up everywhere. The backward's Q rows per step are the resolved ``AttnConfig.bwd_tile_m`` (per-arch
default in ``config.DEFAULTS``); its K/V rows and the head dims it supports come from ``BWD_TILES`` of the sm90
backward kernel (kernels/sm90/bwd.py), ``WIDE_BWD_TILES`` of the wide one (bwd_wide.py: 256) and ``WIDE192_BWD_TILES``
(bwd_wide192.py: (192, 128), 64 x 128 tiles; a softcap call runs bwd_wide.py's 64 x 64 ones, not modelled); these
need cutlass-dsl; without it every head dim of the defaults table
counts as supported and K/V rows are 128). sm100 has no backward kernel here: its tile is the FA4 paper's
(128 x 128), for the model only.
"""
from __future__ import annotations

from .config import (BWD_ONLY_FIELDS, FWD_ONLY_FIELDS, AttnConfig, ConfigError, normalize_arch,
                     quantized_exp2_fraction, two_cta_by_default, two_cta_n80_by_default)

SM100_BWD_TILE = (128, 128)  # FA4 paper (B200): 128 x 128 backward tiles; no sm100 kernel in this package
SM90_BWD_TILE_N = 128  # K/V rows per CTA when the kernel module cannot be imported (two 64-row MMA warpgroups)


def sm90_fwd_smem(tile_m: int, tile_n: int, num_stages: int, hdim: int, hdim_v: int, *, elem: int = 2,
                  row_sum_mma: bool = False, p_tiles: int = 0) -> tuple[int, int]:
    """(bytes, limit) of the sm90 forward's shared-memory tiles: Q, the K / V stages, row_sum_mma's ones tile and
    ``p_tiles`` sP tiles (p_smem: 1, p_smem_early: num_stages). The struct holds the mbarriers in its first KB (sQ is
    1024-aligned), then the tiles (KB multiples), then sO / the ones tile: the tiles alone keep a 2 KB margin under
    the 227 KB of sm_90a, the ones tile may use the second of those KB (hd256). The kernel's constructor refuses a
    tile over the limit (kernels/sm90/fwd.py); the roofline asks here where a switch fits."""
    smem = elem * (tile_m * hdim + num_stages * tile_n * (hdim + hdim_v) + p_tiles * tile_m * tile_n)
    limit = 227 * 1024 - 2048
    if row_sum_mma:
        smem, limit = smem + elem * 8 * tile_n, 227 * 1024 - 1024
    return smem, limit


def _sm90_bwd_table() -> dict | None:
    try:
        from .sm90.bwd import BWD_TILES
        from .sm90.bwd_wide import WIDE_BWD_TILES
        from .sm90.bwd_wide192 import WIDE192_BWD_TILES
    except ImportError:  # no cutlass-dsl here
        return None
    return {**BWD_TILES, **{hd: tile for (hd, _hd_v), tile in {**WIDE_BWD_TILES, **WIDE192_BWD_TILES}.items()}}


def bwd_tile(arch: str, hdim: int, causal: bool = False, cfg: AttnConfig | None = None) -> tuple[int, int]:
    """(tile_m = Q rows per step, tile_n = K/V rows per CTA) of the backward kernel for (arch, hdim, causal, cfg)."""
    arch = normalize_arch(arch)
    if arch == "sm100":
        return SM100_BWD_TILE
    table = _sm90_bwd_table()
    if table is not None and int(hdim) not in table:
        raise ConfigError(f"hdim={hdim}: the {arch} backward supports head dims {sorted(table)}")
    r = (cfg or AttnConfig()).resolve(arch, hdim, causal)
    tile_n = table[int(hdim)][1] if table is not None else SM90_BWD_TILE_N
    if two_cta_n80_by_default(r, arch, hdim, hdim, two_cta_by_default(r, arch, hdim, hdim)):
        tile_n = 80  # hd256 2-CTA pairs with 80-row K/V tiles (kernels/sm90/bwd_wide_two_cta80.py)
    return int(r.bwd_tile_m), int(tile_n)


def compiled_hash(compiled: dict) -> str:
    """12 hex digits identifying a ``compiled_config`` dict (the rows' ``compiled_hash``)."""
    import hashlib
    import json

    return hashlib.sha1(json.dumps(compiled, sort_keys=True).encode()).hexdigest()[:12]


def compiled_config(cfg: AttnConfig | None, arch: str, hdim: int, causal: bool, mode: str = "fwd") -> dict:
    """The resolved config as the ``mode`` kernel compiles it: the exp2 fraction rounded to whole register
    fragments (``exp2_emu_fraction``), and for the backward its own tiles (``tile_m``/``tile_n``; the config's tile
    and register fields describe the forward) and the effective ``two_cta`` (None decided as a call without window,
    softcap or varlen: kernels.config.two_cta_by_default). Two variants with equal dicts run one kernel."""
    if mode not in ("fwd", "bwd"):
        raise ValueError(f"mode={mode!r}: supported modes are 'fwd', 'bwd'")
    r = (cfg or AttnConfig()).resolve(arch, hdim, causal)
    if mode == "fwd":
        return _fwd_dict(r)
    d = r.to_dict()
    tm, tn = bwd_tile(arch, hdim, causal)
    tm = r.bwd_tile_m if normalize_arch(arch) == "sm90" else tm
    for k in (*FWD_ONLY_FIELDS, "bwd_tile_m"):  # bwd_tile_m -> tile_m
        d.pop(k, None)
    # two_cta=None: what the backward runs for a plain call at this head dim (2-CTA at sm90 hd256; hdim 192 is (192, 128))
    two_cta = two_cta_by_default(r, arch, hdim, 128 if int(hdim) == 192 else hdim)
    d.update(tile_m=tm, tile_n=tn, two_cta=two_cta,
             exp2_emu_fraction=quantized_exp2_fraction(r.exp2_emu_fraction, tm // 8))
    if two_cta_n80_by_default(r, arch, hdim, 128 if int(hdim) == 192 else hdim, two_cta):
        d["bwd_two_cta_n80"] = True  # only where it runs: every other config's dict is as before the field existed
    return d


def call_compiled_config(cfg: AttnConfig | None, arch: str, hdim: int, causal: bool, seqlen_q: int,
                         group: int = 1, windowed: bool = False) -> dict:
    """``compiled_config`` of the forward as one call of ``seqlen_q`` queries (``group`` Q heads per K/V head) runs it:
    with the per-call rules of kernels.config.call_config (persistent by the length, DEFAULTS' persistent_tile,
    pack_gqa; ``windowed``: a sliding window), which compiled_config alone does not see. Rows' ``call_hash`` (from
    session 49 on). Not in it: whether the split tail runs (kernels/interface.py split_tail_launch: the K/V length,
    batch, heads and SM count decide)."""
    from .config import call_config

    return _fwd_dict(call_config((cfg or AttnConfig()).resolve(arch, hdim, causal), arch, hdim, causal, seqlen_q,
                                 group, windowed))


def _fwd_dict(r: AttnConfig) -> dict:
    """A resolved config as the forward kernel compiles it: without the backward's fields, the exp2 fraction rounded
    to whole register fragments."""
    d = r.to_dict()
    for k in BWD_ONLY_FIELDS:
        d.pop(k, None)
    d["exp2_emu_fraction"] = quantized_exp2_fraction(r.exp2_emu_fraction, r.tile_n // 8)
    return d
