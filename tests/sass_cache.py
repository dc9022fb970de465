"""``kernel_sass`` / ``fwd_sass`` of kernels.sm90.sass, memoised for the test session on the kernel object's state.

Several SASS test files compile the same forward kernel (the hd128 default, say, is compiled by test_fwd_sass.py,
test_persistent.py, test_fwd_pv_wait_mid.py, test_fwd_cluster.py ...). The key here is the kernel's class and its whole
``vars()`` (every attribute its constructor derived from the config, the dtype, head dims, causal, the group, window and
softcap); the code a kernel object compiles to is a function of those, so two objects with equal state give the same
cubin and the second compile is skipped. A kernel with an attribute that is not a plain value (number, string, bool,
None, type, tuple of those) is compiled every time. The first call's ``workdir`` keeps the PTX / cubin; a repeat
returns the SASS text without writing there.
"""
from __future__ import annotations

_PLAIN = (bool, int, float, str, type(None))
_SASS: dict = {}


def _canon(v):
    if isinstance(v, _PLAIN):
        return (type(v).__name__, repr(v))  # True vs 1, 0.0 vs -0.0 stay apart
    if isinstance(v, type):
        return ("type", v)
    if isinstance(v, tuple):
        items = tuple(_canon(x) for x in v)
        return None if None in items else ("tuple", items)
    return None


def state_key(kern):
    """Hashable (class, attributes) key of a kernel object, or None when an attribute is not a plain value."""
    items = []
    for name, v in sorted(vars(kern).items()):
        c = _canon(v)
        if c is None:
            return None
        items.append((name, c))
    return (type(kern), tuple(items))


def kernel_sass(kern, workdir: str):
    """kernels.sm90.sass.kernel_sass(kern, workdir), compiled once per kernel state in this session."""
    from kernels.sm90.sass import kernel_sass as compile_and_disassemble

    key = state_key(kern)
    if key is None:
        return compile_and_disassemble(kern, workdir)
    if key not in _SASS:
        _SASS[key] = compile_and_disassemble(kern, workdir)
    return _SASS[key]


def fwd_sass(cfg, dtype: str, hdim: int, hdim_v: int, causal: bool, workdir: str) -> str:
    """kernels.sm90.sass.fwd_sass through the memoised kernel_sass."""
    from kernels.sm90.compile import make_fwd_kernel

    sass = kernel_sass(make_fwd_kernel(cfg, dtype, hdim, hdim_v, causal), workdir)
    if sass is None:
        raise RuntimeError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    return sass
