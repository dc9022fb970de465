"""Torch boundary of the CuTe DSL kernels: config resolution, compile cache, the forward launch, the arch check.

``attention_forward(q, k, v, causal, scale, cfg)`` fetches or compiles the forward kernel through
kernels.compile_cache (key: the whole resolved config + dtype, head dims, causal, arch) and runs it on validated
CUDA tensors; ``resolve_config`` resolves an AttnConfig for (sm90, head dim, causal); ``_check_arch`` rejects a
non-Hopper GPU. Sliding window and softcap (forward only so far) are compile-time constants of the kernel, part of the
key only when used. The public, differentiable ``attention(q, k, v, ...)`` is in kernels/ops.py: input checks, then the
torch.library op ``fa4lab::fwd`` (its backward, ``fa4lab::bwd``, calls ``kernels.sm90.backward.attention_backward``).
Persistent forward: ``cfg.persistent`` True / False forces it; None runs it when seqlen_q <= the per-(arch, hdim, causal)
bound of kernels.config.DEFAULTS (``persistent_by_default``); a persistent launch has min(SM count of the tensors'
device, tiles) CTAs (``_sm_count``, which tests may monkeypatch to force several tiles per CTA). ``cfg.split_tail``
(opt-in): a persistent non-causal call without a window whose tiles leave a partial round cuts that round's tiles into
K/V block pieces over every CTA and merges them after (kernels/sm90/fwd_tail.py; ``split_tail_launch`` drops it
elsewhere). ``cfg.persistent_greedy`` (opt-in, persistent causal calls; dropped elsewhere): the CTAs walk a host-built
table of tiles (kernels/sm90/greedy_walk.py, ``_greedy_walk_table`` caches it per shape and device).
``cfg.cluster_m`` = 2 (opt-in): the 2x1-cluster forward with K/V multicast, same launch arguments; non-causal without a
window only (kernels.validate.check_cluster, a ConfigError before anything compiles), never persistent.
``cfg.pack_gqa``: with grouped K/V (h_kv < h) the packed-GQA forward (one CTA per K/V head and tile of (position,
group head) rows, so each K/V tile is loaded once per group), same launch arguments, never persistent; None (the
default) packs when seqlen_q < tile_m (kernels.config.pack_gqa_by_default); otherwise, and with h_kv == h, the plain
kernel (``forward_config`` drops the field, so the key is the plain one).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading

import torch

from .compile_cache import cache_key, feature_extra, get_or_compile, gqa_extra
from .config import AttnConfig, ConfigError, call_config, resolve_cached
from .validate import InputError, check_cluster, check_gqa_heads

ARCH = "sm90"
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _check_arch(device: torch.device) -> None:
    major, minor = _capability(device.index if device.index is not None else torch.cuda.current_device())
    if major != 9:
        raise InputError(f"device: compute capability {major}.{minor} is not supported; the kernels need sm_90a (Hopper)")


@functools.lru_cache(maxsize=64)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=64)
def _sm_count(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index``: the persistent forward's grid is min(this, tiles). A test
    hook: monkeypatch ``kernels.interface._sm_count`` (e.g. ``lambda index: 3``) to make each CTA walk several tiles."""
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def persistent_grid(sms: int, s_q: int, tile_m: int, heads: int, batch: int) -> int:
    """CTAs of a persistent forward launch: one per SM (the kernel holds one CTA per SM), at most one per tile."""
    return max(1, min(int(sms), -(-int(s_q) // int(tile_m)) * int(heads) * int(batch)))


@functools.lru_cache(maxsize=1024)
def forward_config(cfg: AttnConfig, hdim: int, causal: bool, seqlen_q: int, group: int = 1,
                   windowed: bool = False, softcapped: bool = False) -> AttnConfig:
    """The config the forward compiles for this call (kernels.config.call_config on this arch; ``windowed`` /
    ``softcapped``: the call has a sliding window / a softcap). Memoised (a resolved
    config is hashable; uncached, a call that changes the config costs ~30-70 us of host time in dataclasses.replace):
    code that edits DEFAULTS / TUNED at run time calls ``cache_clear()``."""
    return call_config(cfg, ARCH, hdim, causal, seqlen_q, group, windowed, softcapped)


# K/V blocks (per CTA) that cutting the partial round must save to pay for the pieces and their merge: the H200 A/Bs
# of session 49 read a cost of about 50-75 us per call whatever the shape (about 35-50 blocks at hd128)
SPLIT_TAIL_MIN_SAVED_BLOCKS = 48


def split_tail_pays(sms: int, tail: int, n_blocks: int) -> bool:
    """Whether cutting a partial round of ``tail`` tiles (of ``n_blocks`` K/V blocks each) over ``sms`` CTAs saves at
    least SPLIT_TAIL_MIN_SAVED_BLOCKS blocks of the round's time (n_blocks x the idle share (sms - tail) / sms).
    H200, session_ab/sched_*.jsonl in archive_2026-12-05, split / plain: saving 62-248 blocks (hd128 8k-32k on the
    paper grid) 1.013-1.026; 99-128 (hd256 / (192, 128) 16k) 1.024-1.026; 132-194 (128 / 256 queries over 32k keys)
    1.50-2.25; 31 (hd128 4k) 0.991-0.998, 19-25 (hd256 / (192, 128) 4k) 1.002-1.003, 8 (512 queries over 32k keys:
    128 tiles on 132 SMs) 0.943-0.947. The GPU tests patch it to True to exercise the split at any shape."""
    return n_blocks * (sms - tail) >= SPLIT_TAIL_MIN_SAVED_BLOCKS * sms


@functools.lru_cache(maxsize=1024)
def split_tail_launch(cfg: AttnConfig, excluded: bool, sms: int, tiles: int, n_blocks: int,
                      by_length: bool = False) -> tuple[AttnConfig, int]:
    """(config, grid) of a call with ``cfg.split_tail`` True: the split tail on a grid of one CTA per SM where it
    applies -- not ``excluded`` (causal or a window), a persistent call, or one whose persistence the length decided
    (``by_length``: persistent=None; then made persistent for the split, unless packed GQA or a cluster), a partial
    round to cut (tiles mod SMs > 0; fewer tiles than SMs count: every tile is then cut, so a short query over a long
    K/V fills the GPU), at least 2 K/V blocks per tile, the tail's blocks times the grid within int32 (the kernels'
    schedule arithmetic: fwd_tail.tail_range), and ``split_tail_pays``; else split_tail=None (the plain kernel and its
    key; a persistent call on the persistent grid, persistent_grid). Memoised (``cache_clear()`` after patching
    split_tail_pays)."""
    tail = tiles % sms
    can = cfg.persistent or (by_length and not cfg.pack_gqa and cfg.cluster_m == 1)
    if (excluded or not can or tail == 0 or n_blocks < 2 or (tail * n_blocks + 1) * sms >= 2 ** 31
            or not split_tail_pays(sms, tail, n_blocks)):
        return dataclasses.replace(cfg, split_tail=None), max(1, min(sms, tiles))
    return (cfg if cfg.persistent else dataclasses.replace(cfg, persistent=True)), sms


@functools.lru_cache(maxsize=1024)
def dynamic_config(cfg: AttnConfig) -> AttnConfig:
    """A call's config with ``persistent_dynamic``: where the call runs persistent, without the static walks that yield
    to it (persistent_greedy, persistent_snake, split_tail: their kernels and keys are not compiled); elsewhere without
    it (the one-tile kernel and its key). Memoised."""
    if cfg.persistent:
        return dataclasses.replace(cfg, split_tail=None, persistent_greedy=None, persistent_snake=None)
    return dataclasses.replace(cfg, persistent_dynamic=None)


def resolve_config(config: AttnConfig | None, hdim: int, causal: bool) -> AttnConfig:
    if config is not None and not isinstance(config, AttnConfig):
        raise TypeError(f"config: expected kernels.AttnConfig or None, got {type(config).__name__}")
    return resolve_cached(config, ARCH, int(hdim), bool(causal))


@functools.lru_cache(maxsize=1024)
def fwd_kernel_key(cfg: AttnConfig, dtype: str, hdim: int, hdim_v: int, causal: bool, qhead_per_kvhead: int = 1,
                   window_left: int = -1, window_right: int = -1, softcap: float = 0.0) -> tuple:
    return cache_key("fwd", cfg, dtype, hdim, hdim_v, causal, ARCH, **gqa_extra(qhead_per_kvhead),
                     **feature_extra(window_left, window_right, softcap))


def get_fwd_kernel(cfg: AttnConfig, dtype: str, hdim: int, hdim_v: int, causal: bool, tvm_ffi: bool | None = None,
                   qhead_per_kvhead: int = 1, window_left: int = -1, window_right: int = -1, softcap: float = 0.0):
    """(kernel object, compiled callable) for a resolved config, compiled once per cache key. ``qhead_per_kvhead``:
    Q heads per K/V head (GQA group; 1 = MHA), a compile-time constant of the kernel and part of the key; so are the
    canonical window bounds (kernels.validate.canonical_window) and softcap when used."""
    key = fwd_kernel_key(cfg, dtype, hdim, hdim_v, causal, qhead_per_kvhead, window_left, window_right,
                         softcap) + (("tvm_ffi", tvm_ffi),)

    def build():
        from .sm90.compile import compile_fwd, make_fwd_kernel  # the CuTe DSL, imported on the first compile only

        try:
            kern = make_fwd_kernel(cfg, dtype, hdim, hdim_v, causal, qhead_per_kvhead, window_left=window_left,
                                   window_right=window_right, softcap=softcap)
        except ValueError as e:  # unsupported knob combination: a config error, one line
            raise ConfigError(str(e)) from None
        return kern, compile_fwd(kern, tvm_ffi=tvm_ffi)

    return get_or_compile(key, build)


def compiled_exp2_fraction(config: AttnConfig | None, hdim: int, causal: bool) -> float:
    """The exp2_emu_fraction the forward kernel actually compiles for this config (whole fragments)."""
    from .sm90.exp2 import compiled_fraction

    cfg = resolve_config(config, hdim, causal)
    return compiled_fraction(cfg.tile_n // 8, cfg.exp2_emu_fraction)


def attention_forward(q, k, v, causal: bool, softmax_scale: float, cfg: AttnConfig, out=None, lse=None,
                      window_left: int = -1, window_right: int = -1, softcap: float = 0.0):
    """Run the forward kernel on validated CUDA tensors; returns (out, lse).

    ``window_left`` / ``window_right`` / ``softcap``: the canonical sliding window and softcap (as
    kernels.validate.canonical_window returns them: with causal, window_right is -1 and the diagonal bounds the right).

    ``out`` / ``lse`` may be preallocated (contiguous (b, s_q, h, dv) at q's dtype / (b, h, s_q) fp32), e.g.
    NaN-poisoned by a test to prove every element is written. k / v may have h_kv heads dividing q's h (GQA / MQA):
    Q head i reads K/V head i // (h / h_kv), with no repeated K/V in memory.
    """
    b, s_q, h, d = q.shape
    s_k, d_v = k.shape[1], v.shape[3]
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
    group = check_gqa_heads(h, k.shape[2], v.shape[2])
    check_cluster(cfg, causal, window_left, window_right)
    by_length = cfg.persistent is None  # the length decides; with split_tail, also whether the split pays
    cfg = forward_config(cfg, d, causal, s_q, group, window_left >= 0 or window_right >= 0, softcap != 0.0)
    if cfg.persistent_dynamic:
        cfg = dynamic_config(cfg)
    dev = q.device
    index, current = dev.index, torch.cuda.current_device()
    grid = 0
    if cfg.persistent or cfg.split_tail:
        sms = _sm_count(current if index is None else index)
        grid = persistent_grid(sms, s_q, cfg.tile_m, h, b)
        if cfg.split_tail:  # where it does not apply, dropped (the plain kernel and its key)
            cfg, grid = split_tail_launch(cfg, causal or window_left >= 0 or window_right >= 0, sms,
                                          -(-s_q // cfg.tile_m) * h * b, -(-s_k // cfg.tile_n), by_length)
    persistent = bool(cfg.persistent)
    tile_heads = h // group if cfg.pack_gqa else h  # packed GQA: a tile per K/V head
    hb_group = _lpt_group(tile_heads, b, s_k, d, d_v, q.element_size(), cfg.lpt_l2_mb) if causal else 1
    walk_key = None
    if cfg.persistent_greedy and persistent and causal:
        walk_key = (str(dev), -(-s_q // cfg.tile_m), h * b, hb_group, cfg.tile_m, cfg.tile_n, s_q, s_k, grid,
                    window_left)
        if walk_key not in _WALK_TABLES and torch.cuda.is_current_stream_capturing():
            walk_key = None  # the table's host-to-device copy cannot run inside a CUDA graph capture: the round robin
    if cfg.persistent_greedy and walk_key is None:  # (same tiles, bitwise the same outputs); elsewhere the plain kernel
        cfg = dataclasses.replace(cfg, persistent_greedy=None)
    _, compiled = get_fwd_kernel(cfg, _DTYPE_NAMES[q.dtype], d, d_v, causal, qhead_per_kvhead=group,
                                 window_left=window_left, window_right=window_right, softcap=softcap)
    if out is None:
        out = torch.empty((b, s_q, h, d_v), dtype=q.dtype, device=dev)
    elif out.shape != (b, s_q, h, d_v) or out.dtype != q.dtype or not out.is_contiguous():
        raise InputError(f"out: expected a contiguous {(b, s_q, h, d_v)} {q.dtype} tensor, got {tuple(out.shape)} {out.dtype}")
    if lse is None:
        lse = torch.empty((b, h, s_q), dtype=torch.float32, device=dev)
    elif lse.shape != (b, h, s_q) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise InputError(f"lse: expected a contiguous {(b, h, s_q)} torch.float32 tensor, got {tuple(lse.shape)} {lse.dtype}")
    with contextlib.nullcontext() if index is None or index == current else torch.cuda.device(dev):
        if cfg.split_tail:  # the tail pieces' workspace: two slots per CTA (kernels/sm90/fwd_tail.py)
            o_acc = torch.empty((2 * grid, cfg.tile_m, d_v), dtype=torch.float32, device=dev)
            lse_acc = torch.empty((2 * grid, cfg.tile_m), dtype=torch.float32, device=dev)
            compiled(q, k, v, out, lse, o_acc, lse_acc, float(softmax_scale), hb_group, grid)
        elif cfg.persistent_dynamic:  # tiles claimed at run time from a counter, zero at the launch
            compiled(q, k, v, out, lse, torch.zeros(1, dtype=torch.int32, device=dev), float(softmax_scale), hb_group,
                     grid)
        elif cfg.persistent_greedy:  # each CTA's tiles (kernels/sm90/greedy_walk.py), cached per shape and device
            walk = _greedy_walk_table(dev, walk_key)
            compiled(q, k, v, out, lse, walk, float(softmax_scale), hb_group, grid)
        elif persistent:
            compiled(q, k, v, out, lse, float(softmax_scale), hb_group, grid)
        else:
            compiled(q, k, v, out, lse, float(softmax_scale), hb_group)
    return out, lse


_WALK_TABLES: dict = {}


def _greedy_walk_table(dev, key: tuple):
    """persistent_greedy's int32 walk table on ``dev`` (kernels/sm90/greedy_walk.py) for ``key`` = (device, m_blocks,
    pairs, hb_group, tile_m, tile_n, s_q, s_k, grid, window_left), built once per shape and device and kept for the
    process's life (4 bytes per tile, plus padding): a kernel still running on another stream, or a captured CUDA
    graph, may read it at any later time, so it is never freed. Not built inside a CUDA graph capture (the caller runs
    the round robin there)."""
    table = _WALK_TABLES.get(key)
    if table is None:
        from .sm90.greedy_walk import greedy_walks, walk_table

        table = _WALK_TABLES[key] = _to_device_outside_graph_pools(walk_table(greedy_walks(*key[1:])), dev)
    return table


def _to_device_outside_graph_pools(rows: list, dev) -> torch.Tensor:
    """``rows`` as an int32 tensor on ``dev``, allocated from the ordinary caching allocator even while this thread's
    allocations go to a CUDA graph pool: torch.compile(mode="reduce-overhead") warms up in its graphs' pool (per
    thread: torch._C._cuda_beginAllocateCurrentThreadToPool), where a tensor kept past the call fails cudagraph
    trees' check that every live allocation is an output (tests/test_ops_gpu.py). Built on a short-lived thread, which
    waits for its copy."""
    box = []

    def build():
        box.append(torch.tensor(rows, dtype=torch.int32).to(dev))
        torch.cuda.synchronize(dev)

    worker = threading.Thread(target=build, name="fa4lab-walk-table")
    worker.start()
    worker.join()
    if not box:
        raise RuntimeError("kernels.interface: building the greedy walk table on the device failed (see the thread's "
                           "traceback above)")
    return box[0]


@functools.lru_cache(maxsize=4096)
def _lpt_group(heads: int, batch: int, seqlen_k: int, hdim: int, hdim_v: int, elem_bytes: int,
               lpt_l2_mb: int | None) -> int:
    """The causal forward's (head, batch) pairs per L2 group (sm90.scheduler.lpt_group_size; AttnConfig.lpt_l2_mb,
    None = its L2_BUDGET_BYTES), memoised per call shape (the scheduler module imports the CuTe DSL)."""
    from .sm90.scheduler import L2_BUDGET_BYTES, lpt_group_size

    l2 = L2_BUDGET_BYTES if lpt_l2_mb is None else lpt_l2_mb << 20
    return int(lpt_group_size(heads, batch, seqlen_k, hdim, hdim_v, elem_bytes, l2))
