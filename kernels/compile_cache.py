"""In-process cache of compiled CuTe DSL kernels, keyed on everything that changes the generated code.

The key is the whole resolved AttnConfig plus kernel kind, dtype, head dims, causal and arch (and the GQA group size
when > 1, the sliding window and softcap when used); sequence lengths, batch, heads and the softmax scale stay dynamic. A stale cubin reused across an ablation is the classic
bug this module exists to prevent: two configs that differ in any field get two compiled kernels.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .config import AttnConfig, normalize_arch


@dataclass
class CompileRecord:
    key: tuple
    seconds: float  # wall time of the first (compiling) call
    hits: int = 0


_CACHE: dict[tuple, Any] = {}
_RECORDS: dict[tuple, CompileRecord] = {}
_LOCK = threading.Lock()


def cache_key(kind: str, cfg: AttnConfig, dtype: str, hdim: int, hdim_v: int, causal: bool, arch: str, **extra) -> tuple:
    """Hashable key: kernel kind, every field of the resolved config, dtype, head dims, causal, arch, extras."""
    if not cfg.is_resolved:
        raise ValueError("cache_key: pass a resolved AttnConfig (cfg.resolve(arch, hdim, causal))")
    return _key(kind, cfg, str(dtype), int(hdim), int(hdim_v), bool(causal), str(arch), tuple(sorted(extra.items())))


def gqa_extra(qhead_per_kvhead: int) -> dict:
    """``cache_key`` extras for a GQA / MQA group size (Q heads per K/V head, a compile-time constant of the kernels):
    none at 1, so a group-1 key, and the kernel it names, is exactly the MHA one."""
    return {} if int(qhead_per_kvhead) == 1 else {"qhead_per_kvhead": int(qhead_per_kvhead)}


def feature_extra(window_left: int = -1, window_right: int = -1, softcap: float = 0.0) -> dict:
    """``cache_key`` extras for the sliding window and the softcap (compile-time constants of the forward kernel):
    none at the defaults (-1, -1, 0.0), so a window-less key, and the kernel it names, is the plain one."""
    out = {}
    if int(window_left) != -1 or int(window_right) != -1:
        out["window"] = (int(window_left), int(window_right))
    if float(softcap) != 0.0:
        out["softcap"] = float(softcap)
    return out


@functools.lru_cache(maxsize=1024)
def _key(kind, cfg, dtype, hdim, hdim_v, causal, arch, extra) -> tuple:
    # memoised: the key is built on every attention call, and a frozen AttnConfig is hashable
    return (kind, tuple(sorted(cfg.to_dict().items())), dtype, hdim, hdim_v, causal, normalize_arch(arch), extra)


def get_or_compile(key: tuple, build: Callable[[], Any]) -> Any:
    """Return the compiled object for ``key``, calling ``build()`` (and timing it) only on a miss."""
    with _LOCK:
        if key in _CACHE:
            _RECORDS[key].hits += 1
            return _CACHE[key]
    t0 = time.perf_counter()
    compiled = build()
    seconds = time.perf_counter() - t0
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = compiled
            _RECORDS[key] = CompileRecord(key=key, seconds=seconds)
        return _CACHE[key]


def cached(key: tuple) -> Any:
    """The compiled object for ``key`` if it was built already, else None (nothing is compiled; no hit counted)."""
    with _LOCK:
        return _CACHE.get(key)


def compile_records() -> list[CompileRecord]:
    with _LOCK:
        return list(_RECORDS.values())


def clear() -> None:
    with _LOCK:
        _CACHE.clear()
        _RECORDS.clear()
