"""A Llama-style decoder in plain PyTorch (no transformers) whose attention is a swappable function.

RMSNorm, rotary position embeddings (rotate-half form, as Llama), grouped-query attention, SwiGLU MLP, untied
embedding and LM head, no biases. Tensors inside the attention are laid out (batch, seqlen, heads, head_dim), as
``kernels.attention`` and ``flash_attn_func`` take them; the attention function gets K/V with ``kv_heads`` heads
(unexpanded) and is always causal:

    attn(q, k, v, scale) -> out    # q (b, s, heads, d), k/v (b, s, kv_heads, d), out (b, s, heads, d)

``ATTENTION`` maps the backend names of the ``e2e_llama`` experiment to such functions (``attention_fn(name)``);
each says how it treats grouped K/V. ``LlamaSpec`` holds the sizes and the FLOP count of a training step.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaSpec:
    layers: int = 8
    hidden: int = 2048
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 64
    ffn: int = 5632
    vocab: int = 32000
    rope_theta: float = 10000.0
    eps: float = 1e-5

    def __post_init__(self):
        for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{k}={v!r}: must be an int >= 1")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads}: must divide heads={self.heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim}: rotary embeddings need an even head_dim")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def layer_matmul_params(self) -> int:
        h, d = self.hidden, self.head_dim
        return h * self.heads * d * 2 + h * self.kv_heads * d * 2 + 3 * h * self.ffn

    def n_params(self) -> int:
        """Every parameter: embedding, layers (projections and two norms), final norm, LM head."""
        return 2 * self.vocab * self.hidden + self.layers * (self.layer_matmul_params() + 2 * self.hidden) + self.hidden

    def train_step_flops(self, batch: int, seqlen: int) -> float:
        """Matmul FLOPs of one forward + backward: 6 x tokens x (projection, MLP and LM-head weights) plus the causal
        attention (kernels.flops.attention_flops, forward + 2.5x backward) of every layer."""
        from kernels.flops import attention_flops

        tokens = batch * seqlen
        dense = 6.0 * tokens * (self.layers * self.layer_matmul_params() + self.hidden * self.vocab)
        attn = attention_flops(batch, self.heads, seqlen, seqlen, self.head_dim, self.head_dim, True, "fwd_bwd")
        return dense + self.layers * attn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_tables(seqlen: int, head_dim: int, theta: float, device, dtype):
    """cos, sin of shape (seqlen, 1, head_dim) (rotate-half layout: each frequency twice)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seqlen, device=device, dtype=torch.float32), inv)
    emb = torch.cat((ang, ang), dim=-1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x (b, s, h, d) rotated by position: x cos + rotate_half(x) sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, spec: LlamaSpec):
        super().__init__()
        self.spec = spec
        h, d = spec.hidden, spec.head_dim
        self.q_proj = nn.Linear(h, spec.heads * d, bias=False)
        self.k_proj = nn.Linear(h, spec.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, spec.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(spec.heads * d, h, bias=False)
        self.scale = d ** -0.5
        self.attn: Callable | None = None

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        d = self.spec.head_dim
        q = apply_rope(self.q_proj(x).view(b, s, self.spec.heads, d), cos, sin)
        k = apply_rope(self.k_proj(x).view(b, s, self.spec.kv_heads, d), cos, sin)
        v = self.v_proj(x).view(b, s, self.spec.kv_heads, d)
        if self.attn is None:
            raise RuntimeError("LlamaModel: no attention function set (model.set_attention(fn))")
        o = self.attn(q, k, v, self.scale)
        return self.o_proj(o.reshape(b, s, self.spec.heads * d))


class MLP(nn.Module):
    def __init__(self, spec: LlamaSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden, spec.ffn, bias=False)
        self.up_proj = nn.Linear(spec.hidden, spec.ffn, bias=False)
        self.down_proj = nn.Linear(spec.ffn, spec.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, spec: LlamaSpec):
        super().__init__()
        self.input_norm = RMSNorm(spec.hidden, spec.eps)
        self.attn = Attention(spec)
        self.post_attn_norm = RMSNorm(spec.hidden, spec.eps)
        self.mlp = MLP(spec)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attn_norm(x))


class LlamaModel(nn.Module):
    """tokens (b, s) int64 -> logits (b, s, vocab) at the parameters' dtype."""

    def __init__(self, spec: LlamaSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleList(Block(spec) for _ in range(spec.layers))
        self.norm = RMSNorm(spec.hidden, spec.eps)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Llama-style random init: N(0, std) for embedding and projections (output projections scaled by
        1/sqrt(2 layers)), ones for the norms."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                out = name.endswith(("o_proj.weight", "down_proj.weight"))
                p.normal_(0.0, std / math.sqrt(2 * self.spec.layers) if out else std)

    def set_attention(self, fn: Callable) -> None:
        for blk in self.layers:
            blk.attn.attn = fn

    def forward(self, tokens):
        x = self.embed(tokens)
        cos, sin = rope_tables(tokens.shape[1], self.spec.head_dim, self.spec.rope_theta, x.device, x.dtype)
        for blk in self.layers:
            x = blk(x, cos, sin)
        return self.lm_head(self.norm(x))


def loss_fn(logits, targets):
    """Mean next-token cross entropy, in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# ---- attention backends ---------------------------------------------------------------------------------------------
def _sdpa(q, k, v, scale, gqa: bool):
    if not gqa and k.shape[2] != q.shape[2]:
        g = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    kw = {"enable_gqa": True} if gqa else {}
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         scale=scale, **kw)
    return out.transpose(1, 2)


def sdpa(q, k, v, scale):
    """torch SDPA, default kernel choice, K/V repeated to the Q heads."""
    return _sdpa(q, k, v, scale, gqa=False)


def sdpa_gqa(q, k, v, scale):
    """torch SDPA with ``enable_gqa=True`` (K/V unexpanded; the kernel choice may differ from ``sdpa``'s)."""
    return _sdpa(q, k, v, scale, gqa=True)


def fa4lab(config=None) -> Callable:
    """Our kernels (``kernels.attention``), K/V through kernels.integrations.gqa (native GQA: passed unexpanded)."""
    import kernels
    from kernels.integrations.gqa import kv_for_kernel

    def attn(q, k, v, scale):
        k, v = kv_for_kernel(k, v, q.shape[2])
        return kernels.attention(q, k, v, causal=True, softmax_scale=scale, config=config)

    return attn


def fa4_model(config=None) -> Callable:
    """The FA4 algorithm in plain PyTorch (kernels.reference.attention_model; CPU or GPU), K/V repeated to the Q heads
    (the reference model takes no grouped K/V)."""
    from kernels.integrations.gqa import kv_for_kernel
    from kernels.reference import attention_model

    def attn(q, k, v, scale):
        k, v = kv_for_kernel(k, v, q.shape[2], native=False)
        return attention_model(q, k, v, causal=True, softmax_scale=scale, config=config)

    return attn


def fa4_official(config=None) -> Callable:
    """Official FA4 (flash_attn.cute.flash_attn_func), grouped K/V passed natively."""
    from flash_attn.cute import flash_attn_func

    def attn(q, k, v, scale):
        res = flash_attn_func(q, k, v, softmax_scale=scale, causal=True)
        return res[0] if isinstance(res, tuple) else res

    return attn


# name -> (factory(config) -> attn, needs CUDA, harness backend whose available() says whether it runs here)
ATTENTION: dict[str, tuple[Callable, bool, str | None]] = {
    "sdpa": (lambda config=None: sdpa, False, None),
    "sdpa_gqa": (lambda config=None: sdpa_gqa, False, None),
    "fa4lab": (fa4lab, True, "fa4"),
    "fa4_official": (fa4_official, True, "fa4_official"),
    "fa4_model": (fa4_model, False, None),
}


def available(name: str, device: str) -> tuple[bool, str]:
    """(True, '') when backend ``name`` runs on ``device`` here, else (False, why)."""
    if name not in ATTENTION:
        return False, f"{name}: unknown e2e attention backend; known: {', '.join(ATTENTION)}"
    _, needs_cuda, harness = ATTENTION[name]
    if needs_cuda and torch.device(device).type != "cuda":
        return False, f"{name}: needs a CUDA GPU (this run is on {device})"
    if harness is not None:
        from experiments.backends import get_backend

        return get_backend(harness).available()
    return True, ""


def attention_fn(name: str, config=None) -> Callable:
    if name not in ATTENTION:
        raise ValueError(f"attention backend {name!r}: unknown; known: {', '.join(ATTENTION)}")
    return ATTENTION[name][0](config)
