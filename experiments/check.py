"""Correctness check of a backend (DESIGN.md convention 5).

Against kernels.reference.attention_exact at fp64 (CPU) or fp32 (GPU) on the same inputs, a tensor passes
when ``max|x - ref| <= 2 * max|x_pt - ref| + atol``, where ``x_pt`` is plain PyTorch math at the input dtype
(kernels.reference.attention_naive: the error any honest bf16/fp16 implementation is allowed) and ``atol``
a rounding floor of ``atol_ulps`` units of the input dtype at the tensor's largest magnitude. Checked: out,
lse (when the backend returns it) and dq, dk, dv (backward with a fresh random dO). Inputs are fresh random
every call. Outputs are poisoned with NaN before the run: the out / lse buffers themselves for backends
that take them (``takes_out``: ours), else the CUDA caching allocator's free memory (so an output the
backend leaves partly unwritten shows NaN, not zeros); any NaN in a result fails.

Shapes with grouped K/V heads, a sliding window or a packed variable-length batch are checked against references
that honour them (experiments/backends/_features.py: K/V heads repeated for their Q heads, the window mask, one
sequence at a time), so dK / dV are the group sums and a packed batch's out / lse are flash_attn_varlen_func's.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from .backends import Backend, get_backend
from .shapes import Shape, make_inputs, randn

ATOL_ULPS = 1.0


@dataclass
class TensorCheck:
    name: str  # out, lse, dq, dk, dv
    err: float  # max |x - ref|
    pt_err: float  # max |x_pt - ref|
    atol: float
    bound: float  # 2 * pt_err + atol
    passed: bool
    note: str = ""


@dataclass
class CheckResult:
    backend: str
    shape: dict
    seed: int | None
    ref_dtype: str
    tensors: dict[str, TensorCheck] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.tensors) and all(t.passed for t in self.tensors.values())

    def failures(self) -> list[str]:
        return [f"{t.name}: err {t.err:.3g} > bound {t.bound:.3g}" + (f" ({t.note})" if t.note else "")
                for t in self.tensors.values() if not t.passed]

    def rows(self) -> list[dict]:
        """One row per checked tensor: metric err_<name>, value err, with pt_err/bound/atol/passed."""
        out = []
        for t in self.tensors.values():
            out.append(dict(metric=f"err_{t.name}", mode="bwd" if t.name.startswith("d") else "fwd", value=t.err,
                            pt_err=t.pt_err, bound=t.bound, atol=t.atol, passed=t.passed,
                            status="ok" if t.passed else "fail",
                            error_class=None if t.passed else "wrong_result",
                            reason=None if t.passed else f"err {t.err:.3g} > bound {t.bound:.3g}"
                            + (f" ({t.note})" if t.note else ""),
                            ref_dtype=self.ref_dtype))
        return out

    def to_dict(self) -> dict:
        return dict(backend=self.backend, shape=self.shape, seed=self.seed, ref_dtype=self.ref_dtype,
                    passed=self.passed, tensors={k: asdict(v) for k, v in self.tensors.items()})


def _max_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    same = x == ref  # equal infinities (fully masked rows' lse) count as exact
    diff = torch.where(same, torch.zeros_like(x), (x - ref).abs())
    if diff.numel() == 0:
        return 0.0
    return float(diff.max())


def _magnitude(ref: torch.Tensor) -> float:
    r = ref.double()
    r = r[torch.isfinite(r)]
    return float(r.abs().max()) if r.numel() else 0.0


def compare(name: str, x: torch.Tensor | None, x_pt: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
            atol_ulps: float = ATOL_ULPS) -> TensorCheck:
    """Apply the rule to one tensor. ``dtype``: the input dtype that sets the rounding floor."""
    atol = atol_ulps * torch.finfo(dtype).eps * _magnitude(ref)
    pt_err = _max_err(x_pt, ref)
    bound = 2.0 * pt_err + atol
    if x is None:
        return TensorCheck(name, float("nan"), pt_err, atol, bound, False, "backend returned None")
    if tuple(x.shape) != tuple(ref.shape):
        return TensorCheck(name, float("nan"), pt_err, atol, bound, False,
                           f"shape {tuple(x.shape)} != expected {tuple(ref.shape)}")
    n_nan = int(torch.isnan(x).sum())
    err = _max_err(x, ref)
    if n_nan:
        return TensorCheck(name, float("nan"), pt_err, atol, bound, False, f"{n_nan} NaN values (unwritten output?)")
    return TensorCheck(name, err, pt_err, atol, bound, bool(err <= bound))


def poison_allocator(nbytes: int, device) -> None:
    """Fill ``nbytes`` of free caching-allocator memory with NaN so a kernel that leaves part of a freshly
    allocated output unwritten shows NaN rather than zeros (CUDA only; no-op elsewhere)."""
    device = torch.device(device)
    if device.type != "cuda" or nbytes <= 0:
        return
    buf = torch.full((nbytes // 2 + 1,), float("nan"), dtype=torch.float16, device=device)
    del buf


class _NoTF32:
    """fp32 matmuls at full fp32 precision while the reference is computed (TF32 would be ~1e-3 off)."""

    def __enter__(self):
        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def default_ref_dtype(device) -> torch.dtype:
    """fp64 on CPU (cheap there), fp32 on a GPU (fp64 matmuls are slow and fp32 is what DESIGN.md asks)."""
    return torch.float64 if torch.device(device).type == "cpu" else torch.float32


def check_fits(shape: Shape, device) -> tuple[bool, str]:
    """Whether the check's full score matrices (reference + same-dtype copies) fit in memory on ``device``."""
    from .backends._memory import score_matrix_fits

    return score_matrix_fits(shape, torch.finfo(default_ref_dtype(device)).bits // 8, str(device))


def fit_check_shape(shape: Shape, device) -> Shape | None:
    """``shape`` with batch, then heads, halved until the check's score matrices fit (every (batch, head)
    slice is an independent problem, so the full sequence lengths are still checked); None if even one
    slice does not fit. A packed (varlen) batch keeps its sequences (only heads are halved); with GQA the K/V heads
    are halved with the Q heads (the group size stays) until one is left."""
    s = shape
    while not check_fits(s, device)[0]:
        if s.batch > 1 and s.varlen is None:
            s = s.replace(batch=s.batch // 2)
        elif s.heads > 1:
            s = _halve_heads(s)
        else:
            return None
    return s


def _halve_heads(s: Shape) -> Shape:
    hk = s.kv_heads
    if hk > 1 and hk % 2 == 0:
        return s.replace(heads=s.heads // 2, heads_kv=hk // 2)
    if hk > 1:  # odd K/V heads: keep one K/V head and its group
        return s.replace(heads=s.heads // hk, heads_kv=1)
    return s.replace(heads=s.heads // 2, heads_kv=s.heads_kv and 1)  # MQA stays MQA (1 == heads reads as None)


def slice_shape(shape: Shape) -> Shape:
    """The smallest problem fit_check_shape would try: one (batch, head) slice (the whole packed batch, one head,
    for varlen; its one K/V head with GQA)."""
    s = shape if shape.varlen is not None else shape.replace(batch=1)
    return s.replace(heads=1, heads_kv=None)


def check_backend(backend: Backend | str, shape: Shape, cfg=None, device=None, seed: int | None = None,
                  modes=("fwd", "bwd"), scale: float | None = None, ref_dtype: torch.dtype | None = None,
                  atol_ulps: float = ATOL_ULPS) -> CheckResult:
    """Check ``backend`` on fresh random inputs of ``shape``; returns per-tensor err / pt_err / bound / passed."""
    b = get_backend(backend) if isinstance(backend, str) else backend
    device = torch.device(device or b.default_device())
    if ref_dtype is None:
        ref_dtype = default_ref_dtype(device)
    if seed is None:  # fresh inputs, but record the seed so a failure can be replayed
        seed = int(torch.randint(0, 2**62, (1,)).item())
    res = CheckResult(backend=b.name, shape=shape.to_dict(), seed=seed, ref_dtype=str(ref_dtype).replace("torch.", ""))
    dt = shape.torch_dtype
    q, k, v = make_inputs(shape, device, seed)
    kw = shape.call_kwargs(device)  # window_size / varlen of a shape that has them
    want_bwd = "bwd" in modes

    # reference and same-dtype PyTorch, with grads
    def leaves(dtype):
        return [t.detach().to(dtype).requires_grad_(want_bwd) for t in (q, k, v)]

    qr, kr, vr = leaves(ref_dtype)
    qp, kp, vp = leaves(dt)
    from .backends._features import reference_attention

    with torch.enable_grad(), _NoTF32():
        out_ref, lse_ref = reference_attention(qr, kr, vr, shape.causal, scale, dtype=ref_dtype, **kw)
        out_pt, lse_pt = reference_attention(qp, kp, vp, shape.causal, scale, naive=True, **kw)

    if "fwd" in modes or not want_bwd:
        with torch.no_grad():
            if b.takes_out:  # the backend writes our buffers: poison them
                out = torch.full(shape.out_shape(), float("nan"), dtype=dt, device=device)
                lse = torch.full(shape.lse_shape(), float("nan"), dtype=torch.float32, device=device)
                out, lse = b.forward_into(q, k, v, shape.causal, scale, cfg, out, lse, **kw)
            else:
                poison_allocator(math.prod(shape.out_shape()) * q.element_size(), device)
                out, lse = b.forward(q, k, v, shape.causal, scale, cfg, **kw)
        res.tensors["out"] = compare("out", out, out_pt.detach(), out_ref.detach(), dt, atol_ulps)
        if lse is not None:
            res.tensors["lse"] = compare("lse", lse, lse_pt.detach(), lse_ref.detach(), dt, atol_ulps)

    if want_bwd:
        dout = randn(out_ref.shape, dt, device, seed=seed + 1)
        with _NoTF32():
            g_ref = torch.autograd.grad(out_ref, (qr, kr, vr), dout.to(ref_dtype))
        g_pt = torch.autograd.grad(out_pt, (qp, kp, vp), dout)
        poison_allocator(3 * q.numel() * q.element_size(), device)
        grads = b.backward(q, k, v, dout, shape.causal, scale, cfg, **kw)
        for name, g, gp, gr in zip(("dq", "dk", "dv"), grads, g_pt, g_ref):
            res.tensors[name] = compare(name, g, gp, gr, dt, atol_ulps)
    return res
