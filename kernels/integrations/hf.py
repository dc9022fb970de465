"""fa4lab as a transformers attention implementation: ``register()`` then ``attn_implementation="fa4lab"``.

``register(name="fa4lab", config=None)`` adds ``fa4lab_attention_forward`` (bound to an optional ``AttnConfig``) to
transformers' ``AttentionInterface`` and, where transformers has one (``masking_utils.AttentionMaskInterface``,
transformers >= 4.53), gives the name SDPA's mask builder: transformers then passes no mask when the attention is
plainly causal (or plainly bidirectional) and a 4D boolean mask when tokens are masked out (padding, packed sequences,
a custom mask) or a sliding window cuts the keys. Without a registered mask builder transformers would pass no mask at
all for an unknown name and padding would be ignored silently.

The attention function receives (module, query, key, value, attention_mask, dropout, scaling, ...) with q/k/v laid out
(batch, heads, seqlen, head_dim); it transposes them to (batch, seqlen, heads, head_dim), calls
``kernels.attention(q, k, v, causal=..., softmax_scale=scaling, config=..., window_size=..., softcap=...)`` and
returns ``(out, None)`` with out (batch, seqlen, heads, head_dim), as transformers' flash-attention integration does.
What it honours:

* ``scaling`` (the model's softmax scale, e.g. Gemma2's ``query_pre_attn_scalar ** -0.5``; None = 1/sqrt(head_dim));
* causality: the ``is_causal`` keyword when given, else ``module.is_causal`` (default True); the causal mask is
  bottom-right aligned, so decoding with a KV cache (fewer queries than keys) is right without a mask;
* ``sliding_window`` (the keyword transformers passes, e.g. Mistral / Qwen2 / Gemma2's sliding layers; the window
  counts the current token): ``window_size=(sliding_window - 1, 0)`` causal, ``(sliding_window - 1, sliding_window -
  1)`` bidirectional, none when it covers every key -- as transformers' FlashAttention path (see ``window_for``);
  forward and backward;
* ``softcap`` (Gemma2's ``attn_logit_softcapping``; None or 0 = off): scores become softcap * tanh(scores / softcap);
  forward and backward;
* grouped-query attention (fewer K/V heads): K/V pass through ``kernels.integrations.gqa.kv_for_kernel`` unexpanded,
  the kernels take grouped K/V natively (issue 12.1; with ``gqa.NATIVE_GQA = False`` they are repeated instead);
* masks: None, a 2D (batch, kv_len) padding mask, or a 4D mask (bool, or additive float with 0 where allowed). A mask
  that equals the causal / sliding-window / full pattern (all-ones 2D) goes to ``kernels.attention`` (differentiable).
  A mask that is that pattern plus padding (``padding_from_mask``: left or right padding, a KV cache with left
  padding) is run by unpadding (forward and backward: attention_varlen's backward passed its H200 tests): the kept tokens are gathered into packed tensors, ``kernels.attention_varlen`` runs on them with
  cu_seqlens from the mask, and the output is scattered back with zeros on padding query rows (as transformers'
  ``_upad_input`` / ``_pad_input``); the 4D mask is checked to equal what the packed call computes on every kept
  row; padding query rows get zero output and no gradient. Any other mask (packed sequences, custom patterns, a per-head mask) raises ``ValueError``;
* fp32 q/k/v under autocast are cast to the autocast dtype and the output back; other fp32 inputs reach the kernels'
  own dtype check (bf16 / fp16).

Errors (ValueError, one line starting ``fa4lab attention:``): dropout > 0, attention sinks (``s_aux``), variable-length
keyword arguments (``cu_seq_lens_q``: padding-free packed batches), a mask that is not pattern + padding. ``output_attentions`` returns no weights (None), as the flash integrations do.

Reading a mask (the trivial / padding checks, the cu_seqlens maxima) costs device syncs per layer and a graph break
under torch.compile; it only runs when transformers materialised a mask.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

from ..validate import canonical_window
from .gqa import kv_for_kernel

NAME = "fa4lab"
# the parent package (``kernels`` or ``fa4lab.kernels``): its ``attention`` / ``attention_varlen`` are looked up at
# call time, so a test can stand in for the CUDA kernels with ``monkeypatch.setattr(kernels, "attention", ...)``
_KERNELS = importlib.import_module("..", __package__)
VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens_q", "cu_seqlens_k")


def _error(msg: str) -> ValueError:
    return ValueError(f"fa4lab attention: {msg}")


def window_for(sliding_window: int | None, sk: int, causal: bool) -> tuple[int, int]:
    """The kernels' ``window_size`` for transformers' ``sliding_window`` keyword (the total window, current token
    included) with ``sk`` keys: (-1, -1) without one or when it covers every key, else ``(sliding_window - 1, 0)``
    causal and ``(sliding_window - 1, sliding_window - 1)`` bidirectional.

    As transformers' own FlashAttention path (transformers 5.24, ``modeling_flash_attention_utils.
    _process_flash_attention_kwargs``: ``if ... sliding_window is not None and key_length > sliding_window:
    flash_kwargs["window_size"] = (sliding_window - 1, sliding_window - 1)``, the right bound clipped to the diagonal
    by ``causal``), and as its SDPA / eager masks: ``masking_utils.sliding_window_overlay`` keeps ``kv_idx > q_idx -
    sliding_window`` (causal: W - 1 keys back); the bidirectional overlay keeps ``|q_idx - kv_idx| <= config.
    sliding_window`` and ModernBERT passes ``sliding_window = config.sliding_window + 1`` for it."""
    if sliding_window is None:
        return (-1, -1)
    w = int(sliding_window)
    if w < 1:
        raise _error(f"sliding_window={sliding_window}: expected an int >= 1 (the window, current token included)")
    if sk <= w:
        return (-1, -1)
    return (w - 1, 0) if causal else (w - 1, w - 1)


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window_size) -> torch.Tensor:
    """Bool, broadcast of ``q_pos`` (query index + offset to the bottom-right diagonal) against ``k_pos``: whether the
    key is visible under the kernels' causal / window semantics (``kernels.validate.canonical_window``)."""
    causal, left, right = canonical_window(bool(causal), tuple(window_size))
    d = k_pos - q_pos  # key minus the query's diagonal
    ok = torch.ones(torch.broadcast_shapes(q_pos.shape, k_pos.shape), dtype=torch.bool, device=q_pos.device)
    if causal:
        ok = ok & (d <= 0)
    elif right >= 0:
        ok = ok & (d <= right)
    if left >= 0:
        ok = ok & (d >= -left)
    return ok


def _expected_pattern(sq: int, sk: int, causal: bool, device, window_size=(-1, -1)) -> torch.Tensor:
    """(sq, sk) bool: what the kernels compute without a mask (bottom-right causal / window, or every key)."""
    r = torch.arange(sq, device=device)[:, None] + (sk - sq)
    c = torch.arange(sk, device=device)[None, :]
    return _visible(r, c, causal, window_size)


def _allowed_4d(mask: torch.Tensor, sq: int, sk: int) -> torch.Tensor | None:
    """A 4D mask as bool (batch|1, heads|1, sq, sk) over its first ``sk`` columns (True = attend; an additive float
    mask attends where it is 0), or None when its shape cannot describe (sq, sk) attention."""
    if mask.shape[-2] != sq or mask.shape[-1] < sk:
        return None
    allowed = mask[..., :sk]
    return allowed if allowed.dtype == torch.bool else allowed == 0


def _check_rank(mask: torch.Tensor) -> None:
    if mask.dim() not in (2, 4):
        raise _error(f"attention_mask of rank {mask.dim()} (shape {tuple(mask.shape)}) is not supported; expected "
                     f"None, a 2D (batch, kv_len) padding mask or a 4D (batch, heads, q_len, kv_len) mask")


def mask_is_trivial(mask: torch.Tensor | None, sq: int, sk: int, causal: bool, window_size=(-1, -1)) -> bool:
    """Whether ``mask`` asks for nothing beyond what the kernels do anyway (causal / sliding window, or full).

    None: yes. 2D (batch, kv_len) padding mask (1/True = keep): yes when it keeps every token. 4D (batch|1, heads|1,
    sq, >= sk) bool (True = attend) or additive float (0 = attend): yes when, over its first ``sk`` columns, it equals
    the bottom-right causal pattern (``causal``) or all-attend (not ``causal``), cut to ``window_size``, for every
    batch and head."""
    if mask is None:
        return True
    _check_rank(mask)
    if mask.dim() == 2:
        return bool((mask != 0).all())
    allowed = _allowed_4d(mask, sq, sk)
    if allowed is None:
        return False
    return bool((allowed == _expected_pattern(sq, sk, causal, mask.device, window_size)).all())


def padding_from_mask(mask: torch.Tensor, batch: int, sq: int, sk: int, causal: bool, window_size=(-1, -1)):
    """``(q_valid (batch, sq), k_valid (batch, sk))`` bool when ``mask`` is the kernels' pattern (causal / window /
    full) plus padding, i.e. when attention over each sequence's kept tokens, packed (``attention_varlen``, the causal
    diagonal and window bottom-right aligned per sequence), gives every kept query row exactly the keys the mask
    gives it; None otherwise (packed sequences, custom patterns). Rows that are not kept (padding queries) are
    returned as zeros by the caller, as transformers' FlashAttention path does.

    2D (batch, kv_len == sk) padding mask (1/True = keep): FlashAttention's semantics (transformers'
    ``_upad_input``): the keys it keeps, and the queries at the last ``sq`` key positions (all of them when the
    attention is bidirectional without a window). 4D mask (see ``mask_is_trivial``): a key is kept when some row
    sees it; a query row is kept when its own key position (bottom-right: row i is key i + sk - sq) is kept (every
    row when bidirectional without a window); the mask is then checked against the packed semantics over the kept
    rows, and with a KV cache (sq < sk) the rows not kept must see no key (left padding)."""
    _check_rank(mask)
    every_row = not causal and tuple(window_size) == (-1, -1)
    if mask.dim() == 2:
        if mask.shape[0] not in (1, batch) or mask.shape[1] != sk:
            return None
        k_valid = (mask != 0).expand(batch, sk)
        if every_row:
            return torch.ones(batch, sq, dtype=torch.bool, device=mask.device), k_valid
        return (k_valid[:, sk - sq:], k_valid) if sq <= sk else None
    allowed = _allowed_4d(mask, sq, sk)
    if allowed is None or allowed.shape[0] not in (1, batch):
        return None
    if allowed.shape[1] > 1 and not bool((allowed == allowed[:, :1]).all()):
        return None  # a per-head mask
    allowed = allowed[:, 0].expand(batch, sq, sk)
    k_valid = allowed.any(dim=1)
    if every_row:
        q_valid = torch.ones(batch, sq, dtype=torch.bool, device=mask.device)
    elif sq <= sk:
        q_valid = k_valid[:, sk - sq:]
        if sq < sk and bool((allowed & ~q_valid[:, :, None]).any()):
            return None  # a dropped row sees keys: not left padding (e.g. a static cache's future slots)
    else:
        return None
    rq = q_valid.cumsum(1) - 1  # rank of each query / key among its sequence's kept ones
    rk = k_valid.cumsum(1) - 1
    shift = (k_valid.sum(1) - q_valid.sum(1))[:, None, None]  # bottom-right diagonal of the packed sequence
    want = _visible(rq[:, :, None] + shift, rk[:, None, :], causal, window_size) & k_valid[:, None, :]
    if not bool(((want == allowed) | ~q_valid[:, :, None]).all()):
        return None
    return q_valid, k_valid


def _check_kwargs(dropout, s_aux, kwargs: dict) -> None:
    if dropout:
        raise _error(f"dropout={dropout} is not supported (the kernels have no attention dropout); set the model's "
                     f"attention_dropout to 0 or call model.eval()")
    if s_aux is not None:
        raise _error("attention sinks (s_aux) are not supported")
    given = [k for k in VARLEN_KWARGS if kwargs.get(k) is not None]
    if given:
        raise _error(f"{given[0]} given: packed variable-length batches (padding-free, cu_seq_lens) are not supported "
                     f"yet (issue 12.2); pass a padded batch with its attention_mask, or equal-length sequences")


def _varlen_padded(fn, q, k, v, q_valid, k_valid, **kw) -> torch.Tensor:
    """Attention over the kept tokens of a padded batch: q (b, sq, h, d), k / v (b, sk, hk, d) gathered into packed
    (total, heads, dim) tensors, ``fn`` (``attention_varlen``) run on them, its rows scattered back into a (b, sq, h,
    dv) output that is zero on the rows not kept."""
    b, sq, h, _ = q.shape
    sk = k.shape[1]
    lq, lk = q_valid.sum(1, dtype=torch.int32), k_valid.sum(1, dtype=torch.int32)
    iq = q_valid.reshape(-1).nonzero().squeeze(1)
    ik = k_valid.reshape(-1).nonzero().squeeze(1)
    out = q.new_zeros(b * sq, h, v.shape[-1])
    if iq.numel() == 0:
        return out.view(b, sq, h, v.shape[-1])
    cu_q = torch.nn.functional.pad(lq.cumsum(0, dtype=torch.int32), (1, 0))
    cu_k = torch.nn.functional.pad(lk.cumsum(0, dtype=torch.int32), (1, 0))
    max_q, max_k = (int(m) for m in torch.stack([lq.max(), lk.max()]).tolist())  # one host sync
    qp = q.reshape(b * sq, h, -1)[iq]
    kp, vp = k.reshape(b * sk, k.shape[2], -1)[ik], v.reshape(b * sk, v.shape[2], -1)[ik]
    out[iq] = fn(qp, kp, vp, cu_q, cu_k, max_q, max_k, check_seqlens=False, **kw).to(out.dtype)
    return out.view(b, sq, h, v.shape[-1])


def make_attention_forward(config=None, attention: Callable | None = None,
                           attention_varlen: Callable | None = None) -> Callable:
    """The transformers attention function for ``config`` (an ``AttnConfig`` or None = the per-arch defaults).
    ``attention``: the kernel entry ``(q, k, v, causal=, softmax_scale=, config=, window_size=, softcap=)`` on (batch,
    seqlen, heads, dim) tensors (default: ``kernels.attention``, looked up at each call); ``attention_varlen``: the
    packed entry for padded batches (default: ``kernels.attention_varlen``)."""

    def fa4lab_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                 value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                 scaling: float | None = None, is_causal: bool | None = None,
                                 sliding_window: int | None = None, softcap: float | None = None,
                                 s_aux: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
        batch, sq, sk = query.shape[0], query.shape[2], key.shape[2]
        _check_kwargs(dropout, s_aux, kwargs)
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        window = window_for(sliding_window, sk, causal)
        cap = float(softcap) if softcap else 0.0  # None / 0: off (Gemma2: config.attn_logit_softcapping)
        padding = None
        if attention_mask is not None and not mask_is_trivial(attention_mask, sq, sk, causal, window):
            padding = padding_from_mask(attention_mask, batch, sq, sk, causal, window)
            if padding is None:
                raise _error("attention_mask is not the causal / sliding-window / full pattern plus padding (packed "
                             "sequences, a static KV cache's unfilled slots or a custom mask): not supported; use "
                             "attn_implementation='sdpa' or 'eager'")
        in_dtype = query.dtype
        if in_dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):
            dt = torch.get_autocast_dtype(query.device.type)
            query, key, value = query.to(dt), key.to(dt), value.to(dt)
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seqlen, heads, head_dim) views
        k, v = kv_for_kernel(k, v, q.shape[2])  # GQA: unexpanded (native), repeated only with NATIVE_GQA off
        kw = dict(causal=causal, softmax_scale=scaling, config=config)
        if window != (-1, -1) or cap:  # the window-less, softcap-less call stays the plain one
            kw.update(window_size=window, softcap=cap)
        if padding is None:
            fn = attention if attention is not None else _KERNELS.attention
            out = fn(q, k, v, **kw)
        else:
            fn = attention_varlen if attention_varlen is not None else _KERNELS.attention_varlen
            out = _varlen_padded(fn, q, k, v, *padding, **kw)
        return out.to(in_dtype).contiguous(), None

    fa4lab_attention_forward.fa4lab_config = config
    return fa4lab_attention_forward


fa4lab_attention_forward = make_attention_forward()


def register(name: str = NAME, config=None, attention: Callable | None = None,
             attention_varlen: Callable | None = None) -> str:
    """Register ``name`` (default "fa4lab") with transformers' AttentionInterface (and its mask builder, see the
    module docstring); returns the name to pass as ``attn_implementation``. Registering again replaces it."""
    try:
        from transformers import AttentionInterface
    except ImportError as e:
        if "from 'kernels'" in str(e):  # transformers >= 5.25 imports Hugging Face's `kernels`, which ours shadows
            raise ImportError("fa4lab attention: this transformers imports Hugging Face's `kernels` package, a "
                              "top-level module named like fa4lab's own `kernels`; use transformers < 5.25 (pyproject "
                              f"[dev] pins it): {e}") from e
        raise ImportError(f"fa4lab attention: transformers is not installed or has no AttentionInterface "
                          f"(needs transformers >= 4.48): {e}") from e
    custom = config is not None or attention is not None or attention_varlen is not None
    fn = make_attention_forward(config, attention, attention_varlen) if custom else fa4lab_attention_forward
    AttentionInterface.register(name, fn)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:  # older transformers: the model builds a 4D mask itself; mask_is_trivial reads it
        return name
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name


__all__ = ["NAME", "register", "make_attention_forward", "fa4lab_attention_forward", "mask_is_trivial",
           "padding_from_mask", "window_for"]
