"""fa4lab: FlashAttention-4-style attention kernels (CuTe DSL), importable from anywhere once installed.

``from fa4lab import attention, AttnConfig`` is the public API of the repository's ``kernels/`` folder, which
the installed distribution carries as ``fa4lab.kernels`` (so it never shadows the unrelated ``kernels``
package on PyPI). The harness (``run.py``, ``experiments/``, ``analysis/``) runs from the repository root.
"""
from __future__ import annotations

import sys
from pathlib import Path


def _reuse_repo_kernels() -> None:
    """If this process already imported the repository's ``kernels`` (run from the repo root), make
    ``fa4lab.kernels`` that same module, so ``fa4lab.AttnConfig is kernels.AttnConfig``."""
    mod = sys.modules.get("kernels")
    ours = Path(__file__).resolve().parent.parent / "kernels" / "__init__.py"
    if mod is None or Path(getattr(mod, "__file__", "") or "").resolve() != ours:
        return
    for name, m in list(sys.modules.items()):
        if name == "kernels" or name.startswith("kernels."):
            sys.modules.setdefault("fa4lab." + name, m)
    globals()["kernels"] = mod


_reuse_repo_kernels()

from .kernels import DEFAULTS, AttnConfig, ConfigError, InputError, attention, attention_varlen  # noqa: E402
from .kernels.reference import attention_exact, attention_model, attention_naive  # noqa: E402

__all__ = ["attention", "attention_varlen", "AttnConfig", "ConfigError", "InputError", "DEFAULTS",
           "attention_model", "attention_exact", "attention_naive"]
