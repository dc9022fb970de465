"""The backend protocol every attention implementation plugs into, and the name -> backend registry.

A backend computes attention on (batch, seqlen, heads, head_dim) tensors and says, with a reason, whether it
can run here (``available``) and on a given problem (``supports``). ``forward`` returns ``(out, lse|None)``
with out at the input dtype and lse (batch, heads, seqlen_q) fp32 natural log; ``backward`` returns
``(dq, dk, dv)``. Causal masks are aligned bottom-right (query i sees keys j <= i + seqlen_k - seqlen_q).

Beyond dense multi-head attention a shape may need grouped K/V heads, a sliding window or a packed variable-length
batch (``Shape.features``: 'gqa', 'window', 'varlen'). A backend lists the ones it takes in ``features``; ``supports``
refuses a shape needing another, with the reason (a skip row). The harness passes them as keywords only when the
shape has them (``Shape.call_kwargs``): ``window_size=(left, right)`` (flash-attn semantics) and ``varlen=`` an
experiments.shapes.Varlen (cu_seqlens, max_seqlen); GQA is in the tensors (K/V with fewer heads). Packed inputs are
(total, heads, head_dim), out (total, heads, d_v) and lse (heads, total), as flash_attn_varlen_func.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch


class UnknownBackendError(ValueError):
    """A backend name that is not registered."""


class Backend:
    """Base class: subclasses set ``name`` and implement ``_available``, ``_supports`` and ``forward``.

    The default ``backward`` differentiates ``forward`` through torch.autograd, which is right for every
    backend whose forward is differentiable (all the ones registered here).
    """

    name: str = "?"
    cpu_capable: bool = False  # runs (and means the same thing) on a CPU tensor
    takes_out: bool = False  # implements forward_into (writes caller-allocated out / lse buffers)
    config_arch: str | None = None  # arch whose AttnConfig defaults this backend resolves against (None: no AttnConfig)
    features: frozenset = frozenset()  # of 'gqa', 'window', 'varlen': the shape features this backend takes
    feature_notes: dict = {}  # feature -> why this backend does not take it (the skip reason's tail)

    # ---- availability ------------------------------------------------------------------------
    def available(self) -> tuple[bool, str]:
        """(True, '') when the backend can run on this machine, else (False, why)."""
        try:
            return self._available()
        except Exception as e:  # an availability probe must never crash a sweep
            return False, f"{self.name}: availability probe failed: {type(e).__name__}: {first_line(e)}"

    def _available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, shape, cfg=None) -> tuple[bool, str]:
        """(True, '') when the backend handles ``shape`` (and ``cfg``), else (False, why). A shape feature (GQA,
        window, varlen) the backend does not list in ``features`` is refused here, before ``_supports``."""
        missing = [f for f in getattr(shape, "features", ()) if f not in self.features]
        if missing:
            f = missing[0]
            note = self.feature_notes.get(f, "not implemented in this backend")
            return False, f"{self.name}: does not take {FEATURE_NAMES[f]} ({describe_feature(shape, f)}): {note}"
        return self._supports(shape, cfg)

    def _supports(self, shape, cfg) -> tuple[bool, str]:
        return True, ""

    def default_device(self) -> str:
        return "cuda" if torch.cuda.is_available() else "cpu"

    # ---- compute -----------------------------------------------------------------------------
    def forward(self, q, k, v, causal: bool, scale: float | None, cfg=None, **features):
        """(out, lse | None). ``features``: ``window_size`` / ``varlen`` of a shape that has them (module docstring)."""
        raise NotImplementedError(f"{self.name}: forward")

    def forward_into(self, q, k, v, causal: bool, scale: float | None, cfg, out, lse, **features):
        """Forward writing into caller-allocated ``out`` (b, s_q, h, d_v) and ``lse`` (b, h, s_q) fp32 (packed:
        (total, h, d_v) and (h, total)); returns (out, lse). Only for ``takes_out`` backends (the check poisons these
        buffers with NaN first)."""
        raise NotImplementedError(f"{self.name}: does not take out= buffers")

    def backward_fn(self, q, k, v, causal: bool, scale: float | None, cfg=None, **features) -> Callable:
        """Run the forward once with autograd and return ``fn(dout) -> (dq, dk, dv)`` that runs only the
        backward (the graph is kept, so it can be called repeatedly for timing)."""
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            out, _ = self.forward(*leaves, causal, scale, cfg, **features)
        if not out.requires_grad:
            raise NotImplementedError(f"{self.name}: forward is not differentiable, no backward")

        def run(dout):
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)

        return run

    def backward(self, q, k, v, dout, causal: bool, scale: float | None, cfg=None, **features):
        """(dq, dk, dv) for upstream gradient ``dout`` (forward recomputed through autograd)."""
        return self.backward_fn(q, k, v, causal, scale, cfg, **features)(dout)

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


FEATURE_NAMES = {"gqa": "grouped K/V heads (GQA)", "window": "a sliding window",
                 "varlen": "packed variable-length batches"}


def describe_feature(shape, feature: str) -> str:
    if feature == "gqa":
        return f"heads {shape.heads}, heads_kv {shape.heads_kv}"
    if feature == "window":
        return f"window {list(shape.window)}"
    return f"varlen {shape.varlen if isinstance(shape.varlen, str) else list(shape.varlen)}"


def first_line(e: BaseException, n: int = 1, width: int = 300) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return " | ".join(lines[:n])[:width] if lines else type(e).__name__


def cuda_arch() -> tuple[int, int] | None:
    """(major, minor) compute capability of the current CUDA device, or None without one."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def need_cuda(name: str) -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, f"{name}: no CUDA device (this backend runs CUDA kernels only)"
    return True, ""


# ---- registry ------------------------------------------------------------------------------------
# name -> zero-argument factory. Iterating BACKENDS gives the registered names.
BACKENDS: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str, factory: Callable[[], Backend] | str) -> None:
    """Register ``factory`` (a callable, or 'module:attr' imported lazily) under ``name``; replaces any old one."""
    if isinstance(factory, str):
        mod, _, attr = factory.partition(":")

        def factory(mod=mod, attr=attr):  # noqa: F811
            return getattr(importlib.import_module(mod), attr)()

    BACKENDS[name] = factory
    _INSTANCES.pop(name, None)


def get_backend(name: str) -> Backend:
    """The backend registered as ``name`` (one instance per process)."""
    if name not in BACKENDS:
        raise UnknownBackendError(f"backend={name!r}: unknown; known backends: {', '.join(sorted(BACKENDS))}")
    if name not in _INSTANCES:
        b = BACKENDS[name]()
        b.name = name
        _INSTANCES[name] = b
    return _INSTANCES[name]
