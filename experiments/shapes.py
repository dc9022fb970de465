"""Attention problem shapes (`Shape`), fresh random inputs for them, and the paper's benchmark grid."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class ShapeError(ValueError):
    """A Shape field is out of range."""


@dataclass(frozen=True)
class Shape:
    """One attention problem. Tensors are laid out (batch, seqlen, heads, head_dim) as flash_attn_func takes them."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    hdim: int
    hdim_v: int | None = None  # None: same as hdim
    causal: bool = False
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.hdim_v is None:
            object.__setattr__(self, "hdim_v", self.hdim)
        for name in ("batch", "seqlen_q", "seqlen_k", "heads", "hdim", "hdim_v"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShapeError(f"{name}={v!r}: must be a positive int")
        if not isinstance(self.causal, bool):
            raise ShapeError(f"causal={self.causal!r}: must be a bool")
        if self.dtype not in DTYPES:
            raise ShapeError(f"dtype={self.dtype!r}: supported dtypes are {sorted(DTYPES)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen_q

    def label(self) -> str:
        """Short human-readable name, e.g. 'b4 sq8192 sk8192 h16 d128 causal bf16'."""
        d = f"d{self.hdim}" if self.hdim_v == self.hdim else f"d{self.hdim}/{self.hdim_v}"
        dt = {"bfloat16": "bf16", "float16": "fp16"}[self.dtype]
        return (f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.heads} {d}"
                f"{' causal' if self.causal else ''} {dt}")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "Shape":
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ShapeError(f"unknown Shape field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def replace(self, **kw) -> "Shape":
        return dataclasses.replace(self, **kw)


def _generator(device: torch.device, seed: int | None) -> torch.Generator:
    if seed is None:  # fresh inputs: a seed nobody chose
        seed = int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def randn(shape: tuple, dtype: torch.dtype, device, seed: int | None = None) -> torch.Tensor:
    """Standard normal tensor drawn on ``device`` (fresh random when ``seed`` is None)."""
    device = torch.device(device)
    return torch.randn(shape, generator=_generator(device, seed), device=device, dtype=torch.float32).to(dtype)


def make_inputs(shape: Shape, device="cpu", seed: int | None = None, requires_grad: bool = False):
    """Fresh random q, k, v for ``shape``: standard normal, (batch, seqlen, heads, head_dim), contiguous.

    ``seed=None`` draws a new seed each call (fresh inputs); an int makes them reproducible.
    """
    device = torch.device(device)
    g = _generator(device, seed)
    dt = shape.torch_dtype

    def one(s, d):
        t = torch.randn((shape.batch, s, shape.heads, d), generator=g, device=device, dtype=torch.float32).to(dt)
        return t.requires_grad_(requires_grad)

    return one(shape.seqlen_q, shape.hdim), one(shape.seqlen_k, shape.hdim), one(shape.seqlen_k, shape.hdim_v)


PAPER_HDIMS = ((64, 64), (128, 128), (256, 256), (192, 128))
PAPER_SEQLENS = (1024, 2048, 4096, 8192, 16384, 32768)


def paper_grid(hdims=PAPER_HDIMS, seqlens=PAPER_SEQLENS, causal=(False, True), dtype: str = "bfloat16",
               total_tokens: int = 32768, hidden: int = 2048) -> list[Shape]:
    """The FlashAttention papers' benchmark grid: batch = total_tokens // seqlen, heads = hidden // hdim.

    ``hdims`` holds ints (hdim_v = hdim) or (hdim, hdim_v) pairs; seqlen_q = seqlen_k.
    """
    out = []
    for hd in hdims:
        d, dv = (hd, hd) if isinstance(hd, int) else (int(hd[0]), int(hd[1]))
        for s in seqlens:
            if s > total_tokens:
                raise ShapeError(f"seqlen={s}: larger than total_tokens={total_tokens}")
            for c in ((causal,) if isinstance(causal, bool) else causal):
                out.append(Shape(batch=total_tokens // s, seqlen_q=s, seqlen_k=s, heads=max(1, hidden // d),
                                 hdim=d, hdim_v=dv, causal=bool(c), dtype=dtype))
    return out
