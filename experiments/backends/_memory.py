"""Memory budget for backends that materialise the full score matrix (the exact reference, the FA4 model)."""
from __future__ import annotations

import os

import torch

# Share of the device's memory one score-matrix materialisation may take (the rest: inputs, grads, copies).
SCORE_MEMORY_SHARE = 0.25
# Copies of the (b, h, s_q, s_k) matrix alive at once in the plain-math path (scores, probabilities, grads).
LIVE_COPIES = 4


def device_memory_bytes(device: str) -> int | None:
    try:
        if str(device).startswith("cuda") and torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def score_elements(shape) -> int:
    """Elements of the score matrices one call materialises: (b, h, s_q, s_k), or per packed sequence of a varlen
    shape, summed (its sequences are computed one at a time, but autograd keeps every one's graph)."""
    seqlens = getattr(shape, "seqlens", None)
    if seqlens:
        return shape.heads * sum(s * s for s in seqlens)
    return shape.batch * shape.heads * shape.seqlen_q * shape.seqlen_k


def score_matrix_fits(shape, elem_bytes: int, device: str) -> tuple[bool, str]:
    need = score_elements(shape) * elem_bytes * LIVE_COPIES
    have = device_memory_bytes(device)
    if have is not None and need > SCORE_MEMORY_SHARE * have:
        return False, (f"score matrices need ~{need / 2**30:.1f} GiB, over {SCORE_MEMORY_SHARE:.0%} of the "
                       f"{have / 2**30:.0f} GiB on {device}")
    return True, ""
