"""Job runners: map a job's ``kind`` to the function that runs it, ``run(job) -> list[row]``.

Targets are "module:function" strings imported lazily, so the sweep driver stays light and a worker
process (experiments/isolation.py) can resolve the same table by name. An experiment may add kinds of
its own (``experiment.runners`` in its YAML); ``register_runner`` adds one from Python.
"""
from __future__ import annotations

import importlib
from typing import Callable

RUNNERS: dict[str, str] = {
    "attn": "experiments.attn_job:run",
    "compare": "experiments.compare_job:run",
    "compile_time": "experiments.compile_time:run",
    "e2e_llama": "experiments.e2e_llama:run",
    "numerics": "experiments.numerics:run",
    "poly": "experiments.numerics:run",
    "smoke": "experiments.fault_backends:run_smoke_job",
}


class RunnerError(ValueError):
    """Unknown job kind, or a runner target that cannot be imported."""


def register_runner(kind: str, target: str) -> None:
    """Map ``kind`` to ``target`` ("package.module:function")."""
    if ":" not in target:
        raise RunnerError(f"runner target={target!r}: expected 'package.module:function'")
    RUNNERS[kind] = target


def load_target(target: str) -> Callable:
    """Import "package.module:function" and return the function."""
    mod_name, _, fn_name = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and mod_name.startswith(e.name):
            raise RunnerError(f"runner {target!r}: module {mod_name!r} is not available ({e})") from e
        raise
    try:
        return getattr(mod, fn_name)
    except AttributeError as e:
        raise RunnerError(f"runner {target!r}: {mod_name} has no function {fn_name!r}") from e


def get_runner(kind: str, table: dict[str, str] | None = None) -> Callable:
    """The run function for ``kind`` (from ``table`` if given, else the module table)."""
    table = RUNNERS if table is None else table
    if kind not in table:
        raise RunnerError(f"job kind={kind!r} is unknown; supported kinds: {', '.join(sorted(table))}")
    return load_target(table[kind])
