"""One check of a composed run config (``python run.py sweep|bench|check``) before any job runs.

``check_run_config(cfg)`` raises ``RunConfigError`` with one line naming the key, the bad value and what is
allowed: top-level switches (isolation, timeouts, flags, modes), the ``bench`` timing parameters, the shape
grid, the backend and its AttnConfig, and for ``sweep`` the experiment's expansion (every job's modes too).
"""
from __future__ import annotations

ISOLATIONS = ("auto", "process", "inline")
COMMANDS = ("sweep", "bench", "check", "tune")
FLAGS = ("retry_failed", "rerun", "fail_on_error", "progress")


class RunConfigError(ValueError):
    """A composed run config value that no job could run with. One line, no traceback."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _need(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise RunConfigError(f"{key}={value!r}: {allowed}")


def check_modes(key: str, modes) -> None:
    from experiments.attn_job import MODES

    ok = isinstance(modes, (list, tuple)) and len(modes) > 0 and all(m in MODES for m in modes)
    _need(ok, key, modes, f"must be a non-empty list of {', '.join(MODES)} (e.g. {key}=[fwd,bwd])")


def check_bench(key: str, bench) -> None:
    """The timing parameters of experiments/bench.py (``bench`` group; None = untimed)."""
    from experiments.attn_job import DEFAULT_BENCH

    if bench is None:
        return
    _need(isinstance(bench, dict), key, bench, f"must be a mapping of {', '.join(DEFAULT_BENCH)}")
    for k in bench:
        _need(k in DEFAULT_BENCH, f"{key}.{k}", bench[k], f"unknown key; {key} keys: {', '.join(DEFAULT_BENCH)}")
    b = {**DEFAULT_BENCH, **bench}
    _need(_is_int(b["repeats"]) and b["repeats"] >= 1, f"{key}.repeats", b["repeats"], "must be an int >= 1")
    _need(_is_int(b["warmup"]) and b["warmup"] >= 0, f"{key}.warmup", b["warmup"], "must be an int >= 0")
    _need(isinstance(b["flush_l2"], bool), f"{key}.flush_l2", b["flush_l2"], "must be true or false")
    _need(b["max_time_s"] is None or (_is_num(b["max_time_s"]) and b["max_time_s"] > 0), f"{key}.max_time_s",
          b["max_time_s"], "must be null (no cap) or a number > 0")
    _need(_is_num(b["hold_us"]) and b["hold_us"] >= 0, f"{key}.hold_us", b["hold_us"],
          "must be a number >= 0 (microseconds of GPU spin before each timed call; 0 = none)")
    _need(_is_int(b["stream_calls"]) and b["stream_calls"] >= 0, f"{key}.stream_calls", b["stream_calls"],
          "must be an int >= 0 (calls timed back to back per turn, compare experiments; 0 = one call per turn)")


def check_grid(grid: dict) -> None:
    """``shape.grid`` (experiments.shapes.paper_grid's arguments): every size a positive int."""
    from experiments.shapes import DTYPES

    for k in ("total_tokens", "hidden"):
        if k in grid:
            _need(_is_int(grid[k]) and grid[k] >= 1, f"shape.grid.{k}", grid[k], "must be an int >= 1")
    if "seqlens" in grid:
        s = grid["seqlens"]
        _need(isinstance(s, list) and s and all(_is_int(x) and x >= 1 for x in s), "shape.grid.seqlens", s,
              "must be a non-empty list of ints >= 1")
    if "hdims" in grid:
        h = grid["hdims"]
        one = lambda x: _is_int(x) and x >= 1  # noqa: E731
        ok = isinstance(h, list) and h and all(one(x) or (isinstance(x, list) and len(x) == 2 and all(map(one, x)))
                                              for x in h)
        _need(ok, "shape.grid.hdims", h, "must be a non-empty list of head dims (ints >= 1) or [qk, v] pairs")
    if "causal" in grid:
        c = grid["causal"]
        _need(isinstance(c, bool) or (isinstance(c, list) and c and all(isinstance(x, bool) for x in c)),
              "shape.grid.causal", c, "must be true, false or a list of them")
    if "dtype" in grid:
        _need(grid["dtype"] in DTYPES, "shape.grid.dtype", grid["dtype"], f"supported: {', '.join(DTYPES)}")


def check_shape(shape_cfg) -> int:
    """The ``shape`` group; returns the number of shapes."""
    from experiments.sweep import SweepError, expand_shapes

    if isinstance(shape_cfg, dict) and isinstance(shape_cfg.get("grid"), dict):
        check_grid(shape_cfg["grid"])
    try:
        return len(expand_shapes(shape_cfg))
    except SweepError as e:
        raise RunConfigError(str(e)) from None


def check_backend(backend) -> None:
    """``backend`` (bench / check): a registered name and, when given, valid AttnConfig fields."""
    from experiments.backends import BACKENDS
    from kernels.config import AttnConfig, ConfigError

    _need(isinstance(backend, dict) and "name" in backend, "backend", backend, "must be a backend config (backend=<name>)")
    name = backend["name"]
    _need(name in BACKENDS, "backend", name, f"unknown; known backends: {', '.join(sorted(BACKENDS))}")
    config = backend.get("config")
    if config is None:
        return
    _need(isinstance(config, dict), "backend.config", config, "must be a mapping of AttnConfig fields or null")
    try:
        AttnConfig.from_dict({k: v for k, v in config.items() if v is not None})
    except ConfigError as e:
        raise RunConfigError(f"backend.config: {e}") from None


def check_top(cfg: dict) -> None:
    cmd = cfg.get("cmd", "sweep")
    _need(cmd in COMMANDS, "cmd", cmd, f"supported: {', '.join(COMMANDS)}")
    _need(cfg.get("isolation", "auto") in ISOLATIONS, "isolation", cfg.get("isolation"),
          f"supported: {', '.join(ISOLATIONS)}")
    t = cfg.get("job_timeout_s", 600)
    _need(_is_num(t) and t > 0, "job_timeout_s", t, "must be a number of seconds > 0")
    for k in FLAGS:
        if k in cfg and not (k == "rerun" and cfg[k] == "stale"):
            _need(isinstance(cfg[k], bool), k, cfg[k], "must be true or false" + (" or stale" if k == "rerun" else ""))
    rd = cfg.get("results_dir", "results")
    _need(isinstance(rd, str) and rd.strip() != "", "results_dir", rd, "must be a folder path")
    check_modes("modes", cfg.get("modes", ["fwd"]))
    check_bench("bench", cfg.get("bench"))


def check_run_config(cfg: dict) -> None:
    """Raise RunConfigError (one line) unless every job of this command could start with ``cfg``."""
    check_top(cfg)
    if cfg.get("cmd") == "tune":
        from experiments.tune import TuneError, check_args

        check_backend(cfg.get("backend"))
        try:
            check_args(cfg)
        except TuneError as e:
            raise RunConfigError(str(e)) from None
        return
    if cfg.get("cmd", "sweep") != "sweep":
        check_backend(cfg.get("backend"))
        check_shape(cfg.get("shape"))
        return
    from experiments.sweep import PRODUCT_KINDS, expand_jobs

    exp = cfg.get("experiment") or {}
    if exp.get("kind", "attn") in PRODUCT_KINDS and not exp.get("expand"):
        check_shape(cfg.get("shape"))
        check_modes("experiment.modes", exp.get("modes") or ["fwd"])
    if exp.get("pointer"):
        return  # run_sweep says how a pointer resolves
    for job in expand_jobs(cfg):  # backends, variants, ab baseline, expand-hook parameters
        if job.get("kind") in ("attn", "compare"):
            check_modes("experiment.modes", job.get("modes") or ["fwd"])
