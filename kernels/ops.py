"""The attention kernels as torch.library custom ops, so ``torch.compile(model, fullgraph=True)`` traces through them.

``fa4lab::fwd(Tensor q, Tensor k, Tensor v, bool causal, float softmax_scale, str config, int window_left=-1,
int window_right=-1, float softcap=0.) -> (Tensor out, Tensor lse)``
``fa4lab::bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float softmax_scale,
str config, int window_left=-1, int window_right=-1, float softcap=0.) -> (Tensor dq, Tensor dk, Tensor dv)``

``fa4lab::varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q,
SymInt max_seqlen_k, bool causal, float softmax_scale, str config, int window_left=-1, int window_right=-1,
float softcap=0.) -> (Tensor out, Tensor lse)``
``fa4lab::varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q,
Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, float softmax_scale, str config,
int window_left=-1, int window_right=-1, float softcap=0.) -> (Tensor dq, Tensor dk, Tensor dv)``

The varlen pair (packed sequences, ``kernels.attention_varlen``) is registered by kernels/varlen.py through
``register_pair`` (its schemas are here): out (total_q, h, d_v), lse (h, total_q) fp32, dq / dk / dv like q / k / v;
cu_seqlens are not differentiable; max_seqlen are SymInt, so a max_seqlen that changes between calls becomes a dynamic
size under torch.compile (one graph) instead of a recompile per value.

The window and softcap arguments are canonical (kernels.validate.canonical_window: with causal, window_right is -1)
and are passed only when used, so a plain call traces to the same graph as before. The backward supports them too
(issue 12.3; GPU tests passed on the H200): the autograd backward of a forward that used them
calls fa4lab::bwd with the same window / softcap (kernels/sm90/backward.py); two_cta=True with either is a ConfigError.

All four run on CUDA only (the CuTe DSL kernels of kernels.interface / kernels.varlen / kernels.sm90.backward), have
fake (meta) implementations with the shapes, dtypes and strides of the real outputs (out (b, s_q, h, d_v) at q's dtype
and lse (b, h, s_q) fp32, dq/dk/dv like q/k/v -- with GQA / MQA dk/dv have K/V's h_kv heads; all contiguous), and the
forwards' autograd is registered (``_Autograd``: setup_context saves q, k, v, out, lse [, cu_seqlens]; backward calls
the bwd op; lse is not differentiable; no double backward).

An AttnConfig crosses the op boundary as ``config_string(cfg)``: the JSON of the fields that differ from
``AttnConfig()`` ("{}" for the defaults or None), computed once when the config is built (``AttnConfig.op_string``), so equal
configs give equal strings and no call encodes anything. Inside the op the string is decoded (memoised) and resolved
for (sm90, head dim, causal) by ``resolve_cached``. Under torch.compile Dynamo reads that str attribute as a graph
constant and guards on it, so another config traces again, never reusing a stale string. Build configs outside the compiled region (Dynamo cannot
trace AttnConfig's constructor: a config built inside a fullgraph region is an error).

``attention(q, k, v, ...)`` is the public entry (``kernels.attention``; ``kernels.attention_varlen`` likewise for
varlen): input checks in the documented order, then the op when traced by torch.compile, or in eager mode the same
implementations under a plain autograd.Function (``_eager_function``; the custom-op dispatch costs ~20 us of host time
per call).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math

import torch
from torch import Tensor

from .config import AttnConfig, ConfigError, resolve_cached
from .interface import ARCH, _check_arch, attention_forward
from .sm90 import cpp_backward
from .sm90.backward import attention_backward, backward_trusted
from .validate import (InputError, canonical_window, check_cluster, check_devices, check_qkv, check_scale,
                       check_softcap)

NAMESPACE = "fa4lab"
_FEATURES = "int window_left=-1, int window_right=-1, float softcap=0."
FWD_SCHEMA = (f"(Tensor q, Tensor k, Tensor v, bool causal, float softmax_scale, str config, {_FEATURES}) -> "
              "(Tensor out, Tensor lse)")
BWD_SCHEMA = ("(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float softmax_scale, "
              f"str config, {_FEATURES}) -> (Tensor dq, Tensor dk, Tensor dv)")
# variable length (kernels/varlen.py registers these two): cu_seqlens are not differentiable; max_seqlen are SymInt so
# that torch.compile treats a changing max_seqlen as a dynamic size (one graph) instead of recompiling for each value
_VARLEN = "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k"
VARLEN_FWD_SCHEMA = (f"(Tensor q, Tensor k, Tensor v, {_VARLEN}, bool causal, float softmax_scale, str config, "
                     f"{_FEATURES}) -> (Tensor out, Tensor lse)")
VARLEN_BWD_SCHEMA = (f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_VARLEN}, bool causal, "
                     f"float softmax_scale, str config, {_FEATURES}) -> (Tensor dq, Tensor dk, Tensor dv)")


def _uses_features(window_left: int, window_right: int, softcap: float) -> bool:
    return window_left != -1 or window_right != -1 or softcap != 0.0


def config_string(config: AttnConfig | None) -> str:
    """The op's ``config`` argument for an AttnConfig (or None): JSON of its non-default fields, computed once when
    the config was built (``AttnConfig.op_string``)."""
    if config is None:
        return "{}"
    if not isinstance(config, AttnConfig):
        raise TypeError(f"config: expected kernels.AttnConfig or None, got {type(config).__name__}")
    return config.op_string


@functools.lru_cache(maxsize=1024)
def config_from_string(config: str) -> AttnConfig:
    """Inverse of ``config_string`` (memoised): the AttnConfig the op runs with, before resolution."""
    try:
        fields = json.loads(config) if config else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"config={config!r}: not the JSON of AttnConfig fields ({e.msg})") from None
    if not isinstance(fields, dict):
        raise ConfigError(f"config={config!r}: expected a JSON object of AttnConfig fields")
    return AttnConfig(**fields)


def _resolved(config: str, hdim: int, causal: bool) -> AttnConfig:
    return resolve_cached(config_from_string(config), ARCH, int(hdim), bool(causal))


# ---- the ops -------------------------------------------------------------------------------------------------------
def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float, config: str, window_left: int = -1,
              window_right: int = -1, softcap: float = 0.0) -> tuple[Tensor, Tensor]:
    _check_arch(q.device)
    if _uses_features(window_left, window_right, softcap):
        return attention_forward(q, k, v, causal, softmax_scale, _resolved(config, q.shape[3], causal),
                                 window_left=window_left, window_right=window_right, softcap=softcap)
    return attention_forward(q, k, v, causal, softmax_scale, _resolved(config, q.shape[3], causal))


def _fwd_fake(q, k, v, causal, softmax_scale, config, window_left=-1, window_right=-1, softcap=0.0):
    b, s_q, h, _ = q.shape
    return q.new_empty((b, s_q, h, v.shape[3])), q.new_empty((b, h, s_q), dtype=torch.float32)


def _bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
              softmax_scale: float, config: str, window_left: int = -1, window_right: int = -1,
              softcap: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    if _uses_features(window_left, window_right, softcap):
        return attention_backward(q, k, v, out, dout, lse, causal, softmax_scale, _resolved(config, q.shape[3], causal),
                                  window_left=window_left, window_right=window_right, softcap=softcap)
    return attention_backward(q, k, v, out, dout, lse, causal, softmax_scale, _resolved(config, q.shape[3], causal))


def _bwd_eager(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
               softmax_scale: float, config: str, window_left: int = -1, window_right: int = -1,
               softcap: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    """``_bwd_impl`` for the eager autograd Function, without the backward's input checks: q / k / v / out / lse are
    what our forward checked and saved, and autograd gives dout out's shape, dtype and device."""
    return backward_trusted(q, k, v, out, dout, lse, causal, softmax_scale, _resolved(config, q.shape[3], causal),
                            window_left=window_left, window_right=window_right, softcap=softcap)


def _grads_fake(dout, q, k, v, *rest):
    """Fake backward of both directions' ops: dq / dk / dv contiguous like q / k / v (GQA: dk / dv with K/V's heads)."""
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


class _Autograd:
    """setup_context / backward shared by the forward ops and the eager autograd.Functions. The forward's first
    ``n_tensors`` inputs are tensors (q, k, v [, cu_seqlens_q, cu_seqlens_k]), the rest plain arguments (for varlen
    max_seqlen_q / max_seqlen_k first, then causal, softmax_scale, config and the window / softcap when passed); the
    backward ``bwd`` takes (dout, q, k, v, out, lse, *the other tensors, *the plain arguments). Only q / k / v get a
    gradient; lse is not differentiable; no double backward."""

    def __init__(self, n_tensors: int, bwd):
        self.n_tensors, self.bwd = n_tensors, bwd

    def setup_context(self, ctx, inputs, output):
        n = self.n_tensors
        out, lse = output
        ctx.save_for_backward(*inputs[:3], out, lse, *inputs[3:n])
        ctx.args = tuple(inputs[n:])  # the window / softcap only when the forward got them (a plain call keeps the
        ctx.mark_non_differentiable(lse)  # bwd op's short form)

    def backward(self, ctx, dout, dlse):
        if dout is None:  # eager Function without materialized grads: nothing flowed into out
            return (None,) * (self.n_tensors + len(ctx.args))
        dq, dk, dv = self.bwd(dout, *ctx.saved_tensors, *ctx.args)
        return (dq, dk, dv) + (None,) * (self.n_tensors - 3 + len(ctx.args))


def _eager_function(name: str, fwd_impl, bwd_impl, n_tensors: int, materialize_grads: bool = False) -> type:
    """Eager calls: the ops' own implementations under a plain autograd.Function, without the dispatcher's custom-op
    layer (about 20 us less host time per forward and per backward; the GPU-tested path of earlier sessions).
    ``materialize_grads`` False (the default): the never-used gradient of lse reaches backward as None instead of a
    zeros tensor that autograd would allocate and fill (a kernel launch) on every backward."""
    grad = _Autograd(n_tensors, bwd_impl)

    def forward(ctx, *inputs):
        output = fwd_impl(*inputs)
        grad.setup_context(ctx, inputs, output)
        ctx.set_materialize_grads(materialize_grads)
        return output

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward), "backward":
                                                   staticmethod(grad.backward), "__doc__": _eager_function.__doc__})


def _defined(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
        return True
    except (AttributeError, RuntimeError):
        return False


def register_pair(fwd_name: str, fwd_impl, fwd_fake, fwd_schema: str, bwd_name: str, bwd_impl, bwd_schema: str,
                  n_tensors: int):
    """Define ``fa4lab::<fwd_name>`` / ``fa4lab::<bwd_name>`` once per process (CUDA kernels, fake kernels, the
    forward's autograd through the backward op) and return their default overloads. ``kernels.ops`` and
    ``fa4lab.kernels.ops`` may both be imported: the second finds them defined and uses them (the config crosses as a
    string, so the class identity does not matter)."""
    ns = getattr(torch.ops, NAMESPACE)
    if not _defined(bwd_name):
        bwd = torch.library.custom_op(f"{NAMESPACE}::{bwd_name}", bwd_impl, mutates_args=(), device_types="cuda",
                                      schema=bwd_schema)
        bwd.register_fake(_grads_fake)
    bwd_op_ = getattr(ns, bwd_name).default
    if not _defined(fwd_name):
        fwd = torch.library.custom_op(f"{NAMESPACE}::{fwd_name}", fwd_impl, mutates_args=(), device_types="cuda",
                                      schema=fwd_schema)
        fwd.register_fake(fwd_fake)
        grad = _Autograd(n_tensors, bwd_op_)
        fwd.register_autograd(grad.backward, setup_context=grad.setup_context)
    return getattr(ns, fwd_name).default, bwd_op_


fwd_op, bwd_op = register_pair("fwd", _fwd_impl, _fwd_fake, FWD_SCHEMA, "bwd", _bwd_impl, BWD_SCHEMA, 3)
_EagerAttention = _eager_function("_EagerAttention", _fwd_impl, _bwd_eager, 3)


# ---- the public entry ----------------------------------------------------------------------------------------------
def attention(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False, window_size=(-1, -1),
              softcap=0.0):
    """Checks in order: shapes, dtype, head dim, layout (check_qkv), scale, causal, window_size, softcap, config, then
    device; the arch (sm_90a) is checked when the kernel runs. k / v may have fewer heads than q (GQA / MQA: h_kv
    dividing h_q, Q head i reads K/V head i // (h_q / h_kv), no repeated K/V; their gradients have K/V's shape).
    ``window_size=(left, right)``: sliding window, FlashAttention semantics -- query i sees keys
    i + s_k - s_q - left .. i + s_k - s_q + right (bottom-right aligned), -1 = unbounded on that side, with causal the
    right bound is 0. ``softcap`` > 0: scores become softcap * tanh(q.k * softmax_scale / softcap). Both are
    differentiable (the backward kernels take them too). Then
    ``fa4lab::fwd`` when traced (its backward is fa4lab::bwd), or the same implementations eagerly."""
    check_qkv(q, k, v, devices=False, gqa=True)
    check_scale(softmax_scale)
    if not isinstance(causal, bool):
        raise InputError(f"causal={causal!r}: must be a bool")
    features = ()
    if window_size != (-1, -1) or softcap != 0.0:  # the plain path passes nothing extra (the same graph as before)
        causal, left, right = canonical_window(causal, window_size)
        cap = check_softcap(softcap)
        if _uses_features(left, right, cap):
            features = (left, right, cap)
    cstr = config_string(config)
    if config is not None and config.cluster_m != 1:  # non-causal, no window only (kernels.validate.check_cluster)
        check_cluster(config, *canonical_window(causal, window_size))
    check_devices(q, k, v, need_cuda=True)
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[3])
    if type(q) is torch.Tensor and q.is_cuda and not torch.compiler.is_compiling():  # eager, real GPU tensors:
        # no custom-op dispatch layer (fake tensors, tensor subclasses and tracing take the op)
        got = None
        if cpp_backward.enabled() and cpp_backward.covers(q, k, v):  # the C++ node (FA4LAB_CPP_BWD=0: off)
            _check_arch(q.device)
            got = cpp_backward.attention(q, k, v, causal, scale, _resolved(cstr, q.shape[3], causal), features)
        out, lse = got if got is not None else _EagerAttention.apply(q, k, v, causal, scale, cstr, *features)
    else:  # traced (fake kernels, registered autograd), or another device's registered kernel
        out, lse = fwd_op(q, k, v, causal, scale, cstr, *features)
    return (out, lse) if return_lse else out
