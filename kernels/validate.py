"""Input checks shared by the attention API, the reference model and the harness backends.

Every failure is one line naming the argument and what is supported.
"""
from __future__ import annotations

import torch

from .config import SUPPORTED_HDIMS, ConfigError

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_HDIM_PAIRS = tuple((d, d) for d in SUPPORTED_HDIMS if d != 192) + ((192, 128),)


class InputError(ValueError):
    """A tensor argument of the attention API has the wrong dtype, device, rank, shape or layout."""


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dtypes=SUPPORTED_DTYPES,
              hdim_pairs=SUPPORTED_HDIM_PAIRS, need_cuda: bool = False, devices: bool = True,
              gqa: bool = False) -> None:
    """Validate (batch, seqlen, heads, head_dim) tensors as flash_attn_func takes them.

    Order: type and rank, shapes (agreement, sizes >= 1), dtype, head dims, layout, then (``devices``) device.
    ``gqa``: k and v may have fewer heads than q (grouped-query / multi-query attention), one count for both that
    divides q's; otherwise q, k, v share the head count.
    """
    named = (("q", q), ("k", k), ("v", v))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name}: expected rank 4 (batch, seqlen, heads, head_dim), got rank {t.dim()} with shape {tuple(t.shape)}")
    # each attribute read once (this runs on every call of the attention API: host time per call)
    (qb, qs, qh, qd), (kb, ks, kh, kd), (vb, vs, vh, vd) = q.shape, k.shape, v.shape
    if qb != kb or kb != vb:
        raise InputError(f"batch: q, k, v must share batch, got {qb}, {kb}, {vb}")
    if ks != vs:
        raise InputError(f"seqlen_k: k and v must share seqlen, got {ks} and {vs}")
    if gqa:
        check_gqa_heads(qh, kh, vh)
    elif not (qh == kh == vh):
        raise InputError(f"heads: q, k, v must share the number of heads, got {qh}, {kh}, {vh}")
    if min(qs, ks) < 1 or qb < 1 or qh < 1:
        raise InputError(f"shape: batch, seqlen and heads must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    qt, kt, vt = q.dtype, k.dtype, v.dtype
    for name, dt in (("q", qt), ("k", kt), ("v", vt)):
        if dt not in dtypes:
            raise InputError(f"{name}: dtype {dt} is not supported; supported: {', '.join(str(d) for d in dtypes)}")
    if not (qt == kt == vt):
        raise InputError(f"q, k, v: must share one dtype, got {qt}, {kt}, {vt}")
    if qd != kd:
        raise InputError(f"head_dim: q and k must share head_dim, got {qd} and {kd}")
    if hdim_pairs is not None and (qd, vd) not in hdim_pairs:
        raise InputError(f"head_dim: (qk, v) = {(qd, vd)} is not supported; supported: {list(hdim_pairs)}")
    for name, t in named:
        if t.stride(-1) != 1:
            raise InputError(f"{name}: last dim (head_dim) must be contiguous (stride 1), got stride {t.stride(-1)}")
    if devices:
        check_devices(q, k, v, need_cuda=need_cuda)


def check_gqa_heads(heads_q: int, heads_k: int, heads_v: int) -> int:
    """The GQA group size heads_q // heads_kv; InputError unless k and v share a head count that divides q's."""
    if heads_k != heads_v:
        raise InputError(f"heads: k and v must share the number of heads, got {heads_k} and {heads_v}")
    if heads_k < 1 or heads_q < 1:
        raise InputError(f"heads: q and k/v need >= 1 head, got {heads_q} and {heads_k}")
    if heads_q % heads_k:
        raise InputError(f"heads: the K/V heads ({heads_k}) must divide the Q heads ({heads_q}) (grouped-query "
                         "attention: Q head i reads K/V head i // (heads_q / heads_kv))")
    return heads_q // heads_k


def check_devices(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, need_cuda: bool = False) -> None:
    """q, k, v on one device, a CUDA one when ``need_cuda`` (the kernels' only device)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if need_cuda and t.device.type != "cuda":
            raise InputError(f"{name}: device {t.device} is not supported; the kernels need a CUDA tensor")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v: must be on one device, got {q.device}, {k.device}, {v.device}")


def check_scale(softmax_scale) -> None:
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
                                      or not softmax_scale > 0):
        raise ConfigError(f"softmax_scale={softmax_scale!r}: must be None (1/sqrt(head_dim)) or a positive number")


def check_window(window_size) -> tuple[int, int]:
    """Validate ``window_size=(left, right)``: two ints >= -1 (-1 = unbounded on that side), or None = (-1, -1).

    Returns (left, right) as given (with causal the right bound is 0, as FlashAttention: see canonical_window)."""
    if window_size is None:
        return -1, -1
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) for w in window_size)):
        raise ConfigError(f"window_size={window_size!r}: must be a pair of ints (left, right), each >= -1 "
                          "(-1 = unbounded on that side)")
    left, right = (int(w) for w in window_size)
    if left < -1 or right < -1:
        raise ConfigError(f"window_size={tuple(window_size)!r}: each bound must be >= -1 (-1 = unbounded on that side)")
    return left, right


def canonical_window(causal: bool, window_size) -> tuple[bool, int, int]:
    """(causal, window_left, window_right) as the kernels take them, FlashAttention semantics: query i (bottom-right
    aligned) sees keys i + s_k - s_q - left .. i + s_k - s_q + right. With causal the right bound is the diagonal
    (right = 0, whatever was passed, as flash_attn does); a non-causal right bound of 0 is causal. The canonical
    form has window_right == -1 whenever causal, so (-1, -1), causal or not, is exactly the window-less kernel."""
    left, right = check_window(window_size)
    if right == 0:
        causal = True
    if causal:
        right = -1
    return bool(causal), left, right


def check_softcap(softcap) -> float:
    """``softcap``: a finite number >= 0 (0 = off); scores become softcap * tanh(scores / softcap)."""
    if (isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap >= 0
            or softcap == float("inf")):
        raise ConfigError(f"softcap={softcap!r}: must be a finite float >= 0 (0 = off; scores become "
                          "softcap * tanh(scores / softcap))")
    return float(softcap)


def check_persistent_varlen(cfg) -> None:
    """``AttnConfig(persistent=True)`` with a variable-length batch: a ConfigError (the varlen forward has one tile per
    CTA; ``persistent=None`` never picks the persistent kernel for varlen)."""
    if cfg is not None and cfg.persistent is True:
        raise ConfigError("persistent=True: the variable-length forward (attention_varlen) has no persistent kernel; "
                          "pass persistent=None or False")


def check_cluster(cfg, causal: bool, window_left: int = -1, window_right: int = -1, varlen: bool = False) -> None:
    """``AttnConfig(cluster_m=2)`` (2x1 cluster, K/V multicast between the CTAs of adjacent Q tiles) needs both Q tiles
    of a cluster to visit the same K/V blocks: a ConfigError with causal or a sliding window (their K/V ranges differ
    per Q tile), with a variable-length batch (one tile per CTA, sequences of their own) and with persistent=True
    (AttnConfig itself refuses that). Nothing to check at cluster_m=1 or config None."""
    if cfg is None or getattr(cfg, "cluster_m", 1) == 1:
        return
    c = cfg.cluster_m
    if causal:
        raise ConfigError(f"cluster_m={c} with causal=True: the two Q tiles of a cluster would need different K/V "
                          "ranges; the clustered forward is non-causal only (as FA3's) -- pass cluster_m=1")
    if int(window_left) != -1 or int(window_right) != -1:
        raise ConfigError(f"cluster_m={c} with window_size=({window_left}, {window_right}): a sliding window gives the "
                          "two Q tiles of a cluster different K/V ranges; pass cluster_m=1")
    if varlen:
        raise ConfigError(f"cluster_m={c}: the variable-length forward (attention_varlen) has no cluster; pass "
                          "cluster_m=1")
    if cfg.persistent is True:
        raise ConfigError(f"cluster_m={c} with persistent=True: the persistent forward has no cluster")
