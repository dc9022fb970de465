"""Attention problem shapes (`Shape`), fresh random inputs for them, and the paper's benchmark grid.

Besides the dense (batch, seqlen, heads, head_dim) problem a Shape can ask for three things the kernels and the peers
take (issue 12): grouped K/V heads (``heads_kv``), a sliding window (``window``, flash-attn's ``window_size``) and a
packed variable-length batch (``varlen``). Each is None by default, and a None field is left out of ``to_dict()``, so
a shape without them serialises, hashes into job keys and labels exactly as before they existed.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
FEATURE_FIELDS = ("heads_kv", "window", "varlen")  # left out of to_dict() while None
VARLEN_SPECS = "'random' or 'random:<seed>' (seeded split), or a list of batch per-sequence lengths"
_MASK64 = (1 << 64) - 1


class ShapeError(ValueError):
    """A Shape field is out of range."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _splitmix64(x: int) -> int:
    """One step of SplitMix64: a fixed integer hash, so a seeded split is the same on every machine and version."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def random_seqlens(batch: int, total: int, seed: int = 0) -> tuple[int, ...]:
    """``batch`` sequence lengths >= 1 summing to ``total``: weights uniform in [0.25, 1.75) from SplitMix64(seed, i),
    lengths proportional to them (floor), the rounding remainder added to the last one. Pure integer arithmetic."""
    if batch < 1 or total < batch:
        raise ShapeError(f"varlen: cannot split {total} tokens into {batch} sequences of >= 1 token")
    w = [250_000 + _splitmix64((seed << 20) ^ i) % 1_500_000 for i in range(batch)]
    s = sum(w)
    lens = [max(1, total * wi // s) for wi in w[:-1]]
    while sum(lens) > total - 1:  # only when the max(1, .) floors pushed the sum up (tiny totals)
        j = lens.index(max(lens))
        lens[j] -= 1
    return tuple(lens) + (total - sum(lens),)


def _unset(v) -> bool:
    """None, or the NaN a table (pandas) leaves in a missing cell."""
    return v is None or (isinstance(v, float) and v != v)


def label_pieces(d: dict) -> dict[str, str]:
    """The pieces of ``Shape.label`` from a shape's fields (a ``Shape.to_dict()`` or a result row; None / NaN / absent
    fields give no piece): 'hdim' ('d128', 'd192/128'), 'heads' ('h16', 'h32/8' with heads_kv), 'window' ('w1024,0'),
    'varlen' ('varlen:random', 'varlen[8]' for listed lengths), 'dtype' ('bf16', 'fp16')."""
    out = {}
    d_qk, d_v, h, h_kv = (d.get(k) for k in ("hdim", "hdim_v", "heads", "heads_kv"))
    if not _unset(d_qk):
        out["hdim"] = f"d{d_qk}" if _unset(d_v) or d_v == d_qk else f"d{d_qk}/{d_v}"
    if not _unset(h):
        out["heads"] = f"h{h}" if _unset(h_kv) or h_kv == h else f"h{h}/{h_kv}"
    w, vl = d.get("window"), d.get("varlen")
    if not _unset(w):
        out["window"] = f"w{w[0]},{w[1]}"
    if isinstance(vl, str):
        out["varlen"] = f"varlen:{vl}"
    elif not _unset(vl):
        out["varlen"] = f"varlen[{len(vl)}]"
    if d.get("dtype") in DTYPES:
        out["dtype"] = {"bfloat16": "bf16", "float16": "fp16"}[d["dtype"]]
    return out


@dataclass(frozen=True)
class Shape:
    """One attention problem. Tensors are laid out (batch, seqlen, heads, head_dim) as flash_attn_func takes them.

    ``heads_kv``: K/V heads (GQA / MQA; must divide ``heads``; None or == heads: plain multi-head, stored as None).
    ``window``: [left, right] sliding window, flash-attn's ``window_size`` (query i sees keys i + s_k - s_q - left ..
    i + s_k - s_q + right, -1 = unbounded on that side); with causal the right bound is the diagonal (0; -1 is read
    as 0), a right bound > 0 is an error; without causal a right bound of 0 is an error (that is causal: say so);
    [-1, -1] (or [-1, 0] with causal) is no window and stored as None.
    ``varlen``: the batch is packed, flash_attn_varlen_func style: q (total, heads, hdim), k / v (total, heads_kv,
    hdim[_v]), int32 cu_seqlens (batch + 1 entries), the same sequences for q and k (seqlen_q == seqlen_k), total =
    batch * seqlen_q tokens (seqlen_q is the mean length). ``'random'`` / ``'random:<seed>'``: ``random_seqlens``
    (seed 0 by default); a list: the ``batch`` lengths themselves, summing to batch * seqlen_q.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    hdim: int
    hdim_v: int | None = None  # None: same as hdim
    causal: bool = False
    dtype: str = "bfloat16"
    heads_kv: int | None = None  # None: same as heads
    window: tuple[int, int] | None = None
    varlen: str | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.hdim_v is None:
            object.__setattr__(self, "hdim_v", self.hdim)
        for name in ("batch", "seqlen_q", "seqlen_k", "heads", "hdim", "hdim_v"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ShapeError(f"{name}={v!r}: must be a positive int")
        if not isinstance(self.causal, bool):
            raise ShapeError(f"causal={self.causal!r}: must be a bool")
        if self.dtype not in DTYPES:
            raise ShapeError(f"dtype={self.dtype!r}: supported dtypes are {sorted(DTYPES)}")
        self._check_heads_kv()
        self._check_window()
        self._check_varlen()

    def _check_heads_kv(self) -> None:
        hk = self.heads_kv
        if hk is None:
            return
        if not _is_int(hk) or hk < 1:
            raise ShapeError(f"heads_kv={hk!r}: must be None (= heads) or a positive int dividing heads={self.heads}")
        if self.heads % hk:
            raise ShapeError(f"heads_kv={hk}: must divide heads={self.heads} (grouped-query attention: Q head i reads "
                             f"K/V head i // (heads / heads_kv))")
        if hk == self.heads:
            object.__setattr__(self, "heads_kv", None)

    def _check_window(self) -> None:
        w = self.window
        if w is None:
            return
        if not isinstance(w, (list, tuple)) or len(w) != 2 or not all(_is_int(x) for x in w):
            raise ShapeError(f"window={w!r}: must be None or [left, right], two ints >= -1 (-1 = unbounded on that "
                             "side; flash-attn's window_size)")
        left, right = int(w[0]), int(w[1])
        if left < -1 or right < -1:
            raise ShapeError(f"window={list(w)}: each bound must be >= -1 (-1 = unbounded on that side)")
        if self.causal:
            if right > 0:
                raise ShapeError(f"window={list(w)} with causal=True: causal bounds the right side at the diagonal; "
                                 "the right bound must be 0 (or -1)")
            right = 0
        elif right == 0:
            raise ShapeError(f"window={list(w)} with causal=False: a right bound of 0 is causal attention; set "
                             "causal: true (window [left, 0])")
        none = left == -1 and (right == -1 or self.causal)
        object.__setattr__(self, "window", None if none else (left, right))

    def _check_varlen(self) -> None:
        spec = self.varlen
        object.__setattr__(self, "_seqlens", None)
        if spec is None:
            return
        if self.seqlen_q != self.seqlen_k:
            raise ShapeError(f"varlen={spec!r}: needs seqlen_q == seqlen_k (q and k hold the same packed sequences), "
                             f"got {self.seqlen_q} and {self.seqlen_k}")
        total = self.batch * self.seqlen_q
        if isinstance(spec, str):
            name, _, seed = spec.partition(":")
            if name != "random" or (seed and not seed.isdigit()):
                raise ShapeError(f"varlen={spec!r}: supported are {VARLEN_SPECS}")
            lens = random_seqlens(self.batch, total, int(seed or 0))
        elif isinstance(spec, (list, tuple)):
            if not spec or not all(_is_int(x) and x >= 1 for x in spec):
                raise ShapeError(f"varlen={list(spec)!r}: per-sequence lengths must be ints >= 1")
            if len(spec) != self.batch:
                raise ShapeError(f"varlen: {len(spec)} lengths for batch={self.batch}; give one per sequence")
            if sum(spec) != total:
                raise ShapeError(f"varlen: the lengths sum to {sum(spec)}; must be batch * seqlen_q = {total} "
                                 f"(seqlen_q is the mean length)")
            lens = tuple(int(x) for x in spec)
            object.__setattr__(self, "varlen", lens)
        else:
            raise ShapeError(f"varlen={spec!r}: supported are None, {VARLEN_SPECS}")
        object.__setattr__(self, "_seqlens", lens)

    # ---- derived -----------------------------------------------------------------------------------------------
    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen_q

    @property
    def kv_heads(self) -> int:
        """K/V heads: ``heads_kv``, or ``heads`` without GQA."""
        return self.heads_kv or self.heads

    @property
    def window_size(self) -> tuple[int, int]:
        """flash-attn's ``window_size`` (left, right); (-1, -1) without a window."""
        return self.window or (-1, -1)

    @property
    def seqlens(self) -> tuple[int, ...] | None:
        """Per-sequence lengths of a varlen shape (None otherwise)."""
        return self._seqlens

    @property
    def features(self) -> tuple[str, ...]:
        """What a backend must take beyond dense multi-head attention: a subset of ('gqa', 'window', 'varlen')."""
        return tuple(n for n, on in (("gqa", self.heads_kv is not None), ("window", self.window is not None),
                                     ("varlen", self.varlen is not None)) if on)

    def q_shape(self) -> tuple[int, ...]:
        return self._rows(self.heads, self.hdim, self.seqlen_q)

    def k_shape(self) -> tuple[int, ...]:
        return self._rows(self.kv_heads, self.hdim, self.seqlen_k)

    def v_shape(self) -> tuple[int, ...]:
        return self._rows(self.kv_heads, self.hdim_v, self.seqlen_k)

    def out_shape(self) -> tuple[int, ...]:
        """(batch, seqlen_q, heads, hdim_v), or (total, heads, hdim_v) packed."""
        return self._rows(self.heads, self.hdim_v, self.seqlen_q)

    def lse_shape(self) -> tuple[int, ...]:
        """(batch, heads, seqlen_q), or (heads, total) packed (flash_attn_varlen_func's)."""
        return (self.heads, self.tokens) if self.varlen is not None else (self.batch, self.heads, self.seqlen_q)

    def _rows(self, heads: int, d: int, s: int) -> tuple[int, ...]:
        return (self.tokens, heads, d) if self.varlen is not None else (self.batch, s, heads, d)

    def attended_pairs(self) -> int:
        """(query, key) pairs attended over the whole batch (every head alike): kernels.flops.attended_pairs (causal,
        window, s_q != s_k) per sequence, each packed sequence (varlen) on its own."""
        from kernels.flops import attended_pairs

        if self.varlen is None:
            return self.batch * attended_pairs(self.seqlen_q, self.seqlen_k, self.causal, self.window)
        return sum(attended_pairs(s, s, self.causal, self.window) for s in self.seqlens)

    def call_kwargs(self, device=None) -> dict:
        """Keyword arguments a backend's forward / backward takes for this shape beyond (q, k, v, causal, scale, cfg):
        ``window_size`` with a window, ``varlen`` (a Varlen) for a packed batch; {} for a dense shape."""
        kw = {}
        if self.window is not None:
            kw["window_size"] = self.window
        if self.varlen is not None:
            kw["varlen"] = Varlen.of(self.seqlens, device)
        return kw

    def label(self) -> str:
        """Short human-readable name, e.g. 'b4 sq8192 sk8192 h16 d128 causal bf16'; GQA, window and varlen add
        'h32/8', ' w1024,0' and ' varlen:random' (or ' varlen[n]' for listed lengths). Pieces: ``label_pieces``."""
        p = label_pieces(self.to_dict())
        extra = "".join(f" {p[k]}" for k in ("window", "varlen") if k in p)
        return (f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} {p['heads']} {p['hdim']}"
                f"{' causal' if self.causal else ''}{extra} {p['dtype']}")

    def to_dict(self) -> dict:
        """Every field, JSON-ready (lists, not tuples); heads_kv / window / varlen only when set (not None), so a
        shape without them gives the dict (and job key) it gave before those fields existed."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in FEATURE_FIELDS:
                if v is None:
                    continue
                v = list(v) if isinstance(v, tuple) else v
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Shape":
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ShapeError(f"unknown Shape field(s) {unknown}; known: {sorted(known)}")
        for name in ("window", "varlen"):  # YAML / JSON lists (OmegaConf ListConfig too) -> tuples
            if d.get(name) is not None and not isinstance(d[name], (str, tuple)) and hasattr(d[name], "__iter__"):
                d[name] = tuple(d[name])
        return cls(**d)

    def replace(self, **kw) -> "Shape":
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True)
class Varlen:
    """A packed batch's sequence boundaries, as flash_attn_varlen_func takes them (the same for q and k):
    ``cu_seqlens`` int32 (batch + 1,) on the inputs' device, ``max_seqlen`` the longest sequence."""

    cu_seqlens: torch.Tensor
    max_seqlen: int
    seqlens: tuple[int, ...]

    @classmethod
    def of(cls, seqlens, device=None) -> "Varlen":
        seqlens = tuple(int(s) for s in seqlens)
        cu = [0]
        for s in seqlens:
            cu.append(cu[-1] + s)
        t = torch.tensor(cu, dtype=torch.int32, device=torch.device(device) if device is not None else None)
        return cls(t, max(seqlens), seqlens)

    def bounds(self) -> list[tuple[int, int]]:
        """(start, end) rows of each sequence in the packed tensors."""
        out, a = [], 0
        for s in self.seqlens:
            out.append((a, a + s))
            a += s
        return out


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
    """Fresh random q, k, v for ``shape``: standard normal, contiguous; (batch, seqlen, heads, head_dim) with
    ``kv_heads`` heads in k / v, or packed (total, heads, head_dim) for varlen (``shape.call_kwargs(device)`` gives
    the cu_seqlens).

    ``seed=None`` draws a new seed each call (fresh inputs); an int makes them reproducible.
    """
    device = torch.device(device)
    g = _generator(device, seed)
    dt = shape.torch_dtype

    def one(size):
        t = torch.randn(size, generator=g, device=device, dtype=torch.float32).to(dt)
        return t.requires_grad_(requires_grad)

    return one(shape.q_shape()), one(shape.k_shape()), one(shape.v_shape())


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
