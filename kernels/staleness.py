"""Rows measured on a kernel that today's configs no longer compile to: a default changed after they were timed.

A row of a backend that resolves AttnConfig records its ``config`` as written (``None``: the defaults) and the
``compiled_hash`` of what that config compiled to for the row's mode (kernels/tiles.py compiled_config). Resolving
the same config today (kernels/config.py DEFAULTS and conf/tuned) and hashing what it compiles to tells whether the
row still measures today's kernel config. Kernel *code* changes are not seen here (the row's git SHA says which code
ran); a changed default, a tuned entry and an exp2 quantum are. Used by ``python run.py sweep rerun=stale`` (time
again only the jobs with stale rows) and ``python -m analysis.audit`` (stale cells are a gap); here, below both
(DESIGN.md's layering), since it needs only kernels/ to answer.
"""
from __future__ import annotations

import functools

ARCH_OF_CC = {"9": "sm90", "10": "sm100"}  # compute capability major -> the arch our configs resolve for


@functools.lru_cache(maxsize=None)
def _hash_now(config_json: str, arch: str, hdim: int, causal: bool, mode: str) -> str | None:
    import json

    from kernels.config import AttnConfig, ConfigError
    from kernels.tiles import compiled_config, compiled_hash

    try:
        cfg = AttnConfig(**json.loads(config_json))
        return compiled_hash(compiled_config(cfg, arch, hdim, causal, mode))
    except (ConfigError, TypeError, ValueError):  # a field that no longer exists, a head dim without a kernel
        return None


def row_arch(row: dict) -> str:
    """The arch whose defaults a row's config resolved against: its GPU's, else sm90 (CPU rows: the model's)."""
    cc = str(row.get("compute_capability") or "")
    return ARCH_OF_CC.get(cc.split(".")[0], "sm90")


def is_stale(row: dict) -> bool:
    """Whether ``row`` recorded a compiled_hash that today's resolution of its config does not reproduce (rows
    without one -- peers, failures before compiling, rows older than the field -- are never stale), or a forward
    ``call_hash`` (rows from session 49 on) that today's per-call rules for its shape do not (kernels/tiles.py
    call_compiled_config). A forward row older than call_hash is stale where today's call runs the greedy walk (a
    default only since session 49, when call_hash came) or claims its tiles at run time (since session 55)."""
    import json

    recorded = row.get("compiled_hash")
    if not isinstance(recorded, str) or not recorded or row.get("mode") not in ("fwd", "bwd"):  # (NaN in a frame)
        return False
    try:
        hdim, causal = int(row["hdim"]), bool(row["causal"])
    except (KeyError, TypeError, ValueError):
        return False
    cfg = row.get("config") if isinstance(row.get("config"), dict) else {}
    cfg_json = json.dumps(cfg, sort_keys=True)
    if _hash_now(cfg_json, row_arch(row), hdim, causal, row["mode"]) != recorded:
        return True
    if row["mode"] != "fwd" or row.get("varlen"):
        return False
    try:
        seqlen_q, heads = int(row["seqlen_q"]), int(row["heads"])
        kv = row.get("heads_kv")  # absent, None or NaN (a frame's row) without GQA
        group = heads // (int(kv) if isinstance(kv, int) or (isinstance(kv, float) and kv == kv) else heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return False
    w = row.get("window")  # Shape.window: [left, right], else absent / None / NaN
    windowed = isinstance(w, (list, tuple)) and len(w) == 2
    now = _call_now(cfg_json, row_arch(row), hdim, causal, seqlen_q, group, windowed)
    if now is None:
        return False
    call = row.get("call_hash")  # forward rows from session 49 on: the per-call rules (persistent by length, ...)
    if isinstance(call, str) and call:
        return now[0] != call
    # an older row ran before the greedy walk was any call's default (session 49, with call_hash): stale where
    # today's call takes it (or the run-time claims that replaced it at hd128 causal)
    return now[1]


@functools.lru_cache(maxsize=None)
def _call_now(config_json: str, arch: str, hdim: int, causal: bool, seqlen_q: int, group: int,
              windowed: bool) -> tuple[str, bool] | None:
    """(call hash, whether the call runs the greedy walk or claims its tiles at run time) of today's per-call forward
    config; None if it no longer resolves."""
    import json

    from kernels.config import AttnConfig, ConfigError
    from kernels.tiles import call_compiled_config, compiled_hash

    try:
        d = call_compiled_config(AttnConfig(**json.loads(config_json)), arch, hdim, causal, seqlen_q, group, windowed)
    except (ConfigError, TypeError, ValueError):
        return None
    return compiled_hash(d), bool(d.get("persistent_greedy") or d.get("persistent_dynamic"))


def stale_job_keys(rows) -> set[str]:
    """Job keys whose latest run has at least one stale row. A job's runs are told apart by ``run_id`` (latest: the
    newest row ``time``, as analysis/select.py latest_round_robin_job draws them); the rows of a run it superseded
    (still in the set's archive) are not what the figures draw, so they do not make the job stale."""
    latest: dict[str, tuple[str, object]] = {}
    for r in rows:
        key = r.get("job_key")
        if key:
            t = str(r.get("time") or "")
            if key not in latest or t > latest[key][0]:
                latest[key] = (t, r.get("run_id"))
    return {r["job_key"] for r in rows
            if r.get("job_key") and r.get("run_id") == latest[r["job_key"]][1] and is_stale(r)}
