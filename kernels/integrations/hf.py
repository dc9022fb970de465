"""fa4lab as a transformers attention implementation: ``register()`` then ``attn_implementation="fa4lab"``.

``register(name="fa4lab", config=None)`` adds ``fa4lab_attention_forward`` (bound to an optional ``AttnConfig``) to
transformers' ``AttentionInterface`` and, where transformers has one (``masking_utils.AttentionMaskInterface``,
transformers >= 4.53), gives the name SDPA's mask builder: transformers then passes no mask when the attention is
plainly causal (or plainly bidirectional) and a 4D boolean mask when tokens are masked out (padding, packed sequences,
a custom mask). Without a registered mask builder transformers would pass no mask at all for an unknown name and
padding would be ignored silently.

The attention function receives (module, query, key, value, attention_mask, dropout, scaling, ...) with q/k/v laid out
(batch, heads, seqlen, head_dim); it transposes them to (batch, seqlen, heads, head_dim), calls
``kernels.attention(q, k, v, causal=..., softmax_scale=scaling, config=...)`` and returns ``(out, None)`` with out
(batch, seqlen, heads, head_dim), as transformers' flash-attention integration does. What it honours:

* ``scaling`` (the model's softmax scale; None = 1/sqrt(head_dim));
* causality: the ``is_causal`` keyword when given, else ``module.is_causal`` (default True); the causal mask is
  bottom-right aligned, so decoding with a KV cache (fewer queries than keys) is right without a mask;
* grouped-query attention (fewer K/V heads): K/V pass through ``kernels.integrations.gqa.kv_for_kernel`` unexpanded,
  the kernels take grouped K/V natively (issue 12.1; with ``gqa.NATIVE_GQA = False`` they are repeated instead);
* masks: None, a 2D (batch, kv_len) mask of all ones, or a 4D mask (bool, or additive float with 0 where allowed)
  that equals the causal (or full) pattern are accepted; a mask that masks out anything else (padding, packed
  sequences, custom patterns) raises ``ValueError``: there is no padded / variable-length path yet (issue 12.2);
* fp32 q/k/v under autocast are cast to the autocast dtype and the output back; other fp32 inputs reach the kernels'
  own dtype check (bf16 / fp16).

Errors (ValueError, one line starting ``fa4lab attention:``): dropout > 0, softcap, attention sinks (``s_aux``), a
sliding window shorter than the keys, variable-length keyword arguments (``cu_seq_lens_q``), a non-trivial mask.
``output_attentions`` returns no weights (None), as the flash integrations do.

A non-trivial-mask check reads mask values (one device sync per layer, a graph break under torch.compile); it only
runs when transformers materialised a mask.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

from .gqa import kv_for_kernel

NAME = "fa4lab"
# the parent package (``kernels`` or ``fa4lab.kernels``): its ``attention`` is looked up at call time, so a test
# can stand in for the CUDA kernels with ``monkeypatch.setattr(kernels, "attention", ...)``
_KERNELS = importlib.import_module("..", __package__)
VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens_q", "cu_seqlens_k")


def _error(msg: str) -> ValueError:
    return ValueError(f"fa4lab attention: {msg}")


def _expected_pattern(sq: int, sk: int, causal: bool, device) -> torch.Tensor:
    """(sq, sk) bool: what the kernels compute without a mask (bottom-right causal, or every key)."""
    if not causal:
        return torch.ones(sq, sk, dtype=torch.bool, device=device)
    r = torch.arange(sq, device=device)[:, None]
    c = torch.arange(sk, device=device)[None, :]
    return c <= r + (sk - sq)


def mask_is_trivial(mask: torch.Tensor | None, sq: int, sk: int, causal: bool) -> bool:
    """Whether ``mask`` asks for nothing beyond what the kernels do anyway (causal or full attention).

    None: yes. 2D (batch, kv_len) padding mask (1/True = keep): yes when it keeps every token. 4D (batch|1, heads|1,
    sq, >= sk) bool (True = attend) or additive float (0 = attend): yes when, over its first ``sk`` columns, it equals
    the bottom-right causal pattern (``causal``) or all-attend (not ``causal``) for every batch and head."""
    if mask is None:
        return True
    if mask.dim() == 2:
        return bool((mask != 0).all())
    if mask.dim() != 4:
        raise _error(f"attention_mask of rank {mask.dim()} (shape {tuple(mask.shape)}) is not supported; expected None, "
                     f"a 2D (batch, kv_len) padding mask or a 4D (batch, heads, q_len, kv_len) mask")
    if mask.shape[-2] != sq or mask.shape[-1] < sk:
        return False
    allowed = mask[..., :sk]
    allowed = allowed if allowed.dtype == torch.bool else allowed == 0
    return bool((allowed == _expected_pattern(sq, sk, causal, mask.device)).all())


def _check_kwargs(dropout, softcap, sliding_window, s_aux, sk: int, kwargs: dict) -> None:
    if dropout:
        raise _error(f"dropout={dropout} is not supported (the kernels have no attention dropout); set the model's "
                     f"attention_dropout to 0 or call model.eval()")
    if softcap is not None:
        raise _error(f"softcap={softcap} is not supported yet (issue 12.3); use attn_implementation='eager'")
    if sliding_window is not None and sk > int(sliding_window):
        raise _error(f"sliding_window={sliding_window} with {sk} keys is not supported yet (issue 12.3); use "
                     f"attn_implementation='sdpa'")
    if s_aux is not None:
        raise _error("attention sinks (s_aux) are not supported")
    given = [k for k in VARLEN_KWARGS if kwargs.get(k) is not None]
    if given:
        raise _error(f"{given[0]} given: packed variable-length batches are not supported yet (issue 12.2: "
                     f"attention_varlen); pass equal-length unpadded sequences")


def make_attention_forward(config=None, attention: Callable | None = None) -> Callable:
    """The transformers attention function for ``config`` (an ``AttnConfig`` or None = the per-arch defaults).
    ``attention``: the kernel entry ``(q, k, v, causal=, softmax_scale=, config=)`` on (batch, seqlen, heads, dim)
    tensors (default: ``kernels.attention``, looked up at each call)."""

    def fa4lab_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                 value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                 scaling: float | None = None, is_causal: bool | None = None,
                                 sliding_window: int | None = None, softcap: float | None = None,
                                 s_aux: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
        sq, sk = query.shape[2], key.shape[2]
        _check_kwargs(dropout, softcap, sliding_window, s_aux, sk, kwargs)
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        if not mask_is_trivial(attention_mask, sq, sk, causal):
            raise _error("attention_mask masks out tokens (padding, packed sequences or a custom mask): there is no "
                         "padded / variable-length path yet (issue 12.2); pass unpadded sequences of equal length "
                         "(an all-ones attention_mask is fine) or use attn_implementation='sdpa'")
        in_dtype = query.dtype
        if in_dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):
            dt = torch.get_autocast_dtype(query.device.type)
            query, key, value = query.to(dt), key.to(dt), value.to(dt)
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seqlen, heads, head_dim) views
        k, v = kv_for_kernel(k, v, q.shape[2])  # GQA: unexpanded (native), repeated only with NATIVE_GQA off
        fn = attention if attention is not None else _KERNELS.attention
        out = fn(q, k, v, causal=causal, softmax_scale=scaling, config=config)
        return out.to(in_dtype).contiguous(), None

    fa4lab_attention_forward.fa4lab_config = config
    return fa4lab_attention_forward


fa4lab_attention_forward = make_attention_forward()


def register(name: str = NAME, config=None, attention: Callable | None = None) -> str:
    """Register ``name`` (default "fa4lab") with transformers' AttentionInterface (and its mask builder, see the
    module docstring); returns the name to pass as ``attn_implementation``. Registering again replaces it."""
    try:
        from transformers import AttentionInterface
    except ImportError as e:
        raise ImportError(f"fa4lab attention: transformers is not installed or has no AttentionInterface "
                          f"(needs transformers >= 4.48): {e}") from e
    fn = fa4lab_attention_forward if config is None and attention is None else make_attention_forward(config, attention)
    AttentionInterface.register(name, fn)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:  # older transformers: the model builds a 4D mask itself; mask_is_trivial reads it
        return name
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name


__all__ = ["NAME", "register", "make_attention_forward", "fa4lab_attention_forward", "mask_is_trivial"]
