"""Run metadata: what machine and software produced a row (``static_metadata``; ``provenance``: git SHA, dirty
flag, a hash of the kernels/ tree) and the GPU's clocks, temperature and power around a measurement
(``gpu_state``, via NVML; experiments/timing/sampler.py samples it during a timing). Read-only: nothing here sets or
locks clocks. Everything degrades to None on a machine without a GPU, NVML or git.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import socket
import subprocess

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
STATE_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "temp_c", "power_w", "clocks_event_reasons")


def _pkg_version(*names: str) -> str | None:
    for n in names:
        try:
            return version(n)
        except PackageNotFoundError:
            continue
    return None


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


# ---- NVML --------------------------------------------------------------------------------------
_NVML = {"ok": None, "why": ""}


def _nvml():
    """The pynvml module, initialised once; None when NVML is unusable here (``nvml_unavailable()`` says why)."""
    if _NVML["ok"] is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _NVML["ok"] = pynvml
        except Exception as e:  # no driver, no GPU, no pynvml
            _NVML["ok"], _NVML["why"] = False, f"{type(e).__name__}: {e}"[:200]
    return _NVML["ok"] or None


def nvml_unavailable() -> str | None:
    """None when NVML can be read for the current CUDA device, else why not (one line)."""
    if _nvml() is None:
        return f"NVML not usable ({_NVML['why']})"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None if _nvml_handle() is not None else "no NVML handle for the CUDA device"


def _nvml_handle(device_index: int | None = None):
    """NVML handle of the torch CUDA device (matched by UUID, so CUDA_VISIBLE_DEVICES remapping is fine)."""
    nv = _nvml()
    if nv is None or not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device() if device_index is None else device_index
    if idx not in _HANDLES:  # looked up once per device: the sampler thread reads state every few ms
        try:
            uuid = str(torch.cuda.get_device_properties(idx).uuid)
            _HANDLES[idx] = nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        except Exception:
            try:
                _HANDLES[idx] = nv.nvmlDeviceGetHandleByIndex(idx)
            except Exception:
                return None
    return _HANDLES[idx]


_HANDLES: dict = {}


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:
        return None


def gpu_state(device_index: int | None = None) -> dict:
    """Current SM/memory clocks (MHz), temperature (C), power (W) and the clocks-event (throttle) reason
    bitmask of the GPU; all None without one."""
    state = dict.fromkeys(STATE_KEYS)
    h = _nvml_handle(device_index)
    if h is None:
        return state
    nv = _nvml()
    state["sm_clock_mhz"] = _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
    state["mem_clock_mhz"] = _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
    state["temp_c"] = _try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
    mw = _try(nv.nvmlDeviceGetPowerUsage, h)
    state["power_w"] = mw / 1000.0 if mw is not None else None
    reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    state["clocks_event_reasons"] = _try(reasons, h) if reasons else None
    return state


def gpu_state_fields(when: str, device_index: int | None = None) -> dict:
    """gpu_state() flattened for a row: keys '<key>_<when>' (when = 'before' | 'after')."""
    return {f"{k}_{when}": v for k, v in gpu_state(device_index).items()}


# ---- provenance ----------------------------------------------------------------------------------
def _in_own_repo() -> bool:
    """True when git sees this tree as its own repository (not a parent folder's, not none)."""
    top = _git("rev-parse", "--show-toplevel")
    return top is not None and Path(top).resolve() == REPO


def kernels_hash(repo: Path | None = None) -> str:
    """sha1 (12 hex) of every .py file under kernels/ of ``repo`` (default: this tree) (relative path and bytes): rows
    of an unchanged kernel package compare across commits, and a tree copied without .git still says which kernels it
    ran."""
    h = hashlib.sha1()
    root = (REPO if repo is None else Path(repo)) / "kernels"
    for f in sorted(root.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def provenance() -> dict:
    """git_sha (this repository's HEAD, else $FA4LAB_GIT_SHA, else None), git_sha_source ('repo' / 'env' / None),
    git_dirty (tracked files modified; None when not known: no repository of our own), kernels_hash.
    A modified tree whose HEAD is not $FA4LAB_GIT_SHA takes the variable's commit (source 'env', the HEAD kept as
    git_sha_repo): a working tree copied onto another host over an older .git (the GPU host's copies) is the commit
    the variable names, not an edited HEAD. A clean tree keeps its HEAD (a stale variable is ignored)."""
    sha = _git("rev-parse", "HEAD") if _in_own_repo() else None
    env = os.environ.get("FA4LAB_GIT_SHA") or None
    extra = {}
    if sha is not None:
        status = _git("status", "--porcelain", "--untracked-files=no")
        dirty, source = (None if status is None else bool(status)), "repo"
        if dirty and env and not sha.startswith(env):
            extra, sha, dirty, source = dict(git_sha_repo=sha), env, None, "env"
    else:
        sha, dirty, source = env, None, ("env" if env else None)
    return dict(git_sha=sha, git_sha_source=source, git_dirty=dirty, kernels_hash=kernels_hash(), **extra)


# ---- static ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _static() -> tuple:
    md = dict(gpu_name=None, sm_count=None, compute_capability=None, gpu_mem_gib=None, l2_mib=None,
              max_sm_clock_mhz=None, max_mem_clock_mhz=None, driver=None, cuda=torch.version.cuda,
              torch=torch.__version__, cutlass_dsl=_pkg_version("nvidia-cutlass-dsl"),
              flash_attn_4=_pkg_version("flash-attn-4", "flash_attn_4"),
              **provenance(), hostname=socket.gethostname(), python=platform.python_version())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        md.update(gpu_name=p.name, sm_count=p.multi_processor_count, compute_capability=f"{p.major}.{p.minor}",
                  gpu_mem_gib=round(p.total_memory / 2**30, 1),
                  l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1) or None)
    nv = _nvml()
    if nv is not None:
        md["driver"] = _try(nv.nvmlSystemGetDriverVersion)
        if isinstance(md["driver"], bytes):
            md["driver"] = md["driver"].decode()
        h = _nvml_handle()
        if h is not None:
            md["max_sm_clock_mhz"] = _try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
            md["max_mem_clock_mhz"] = _try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM)
    return tuple(md.items())


def static_metadata() -> dict:
    """Machine and software description, computed once per process (a fresh dict each call)."""
    return dict(_static())


if __name__ == "__main__":  # python -m experiments.metadata
    import json

    print(json.dumps({"static": static_metadata(), "gpu_state": gpu_state()}, indent=1, default=str))

