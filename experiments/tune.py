"""``python run.py tune``: search the kernel-shaping AttnConfig fields for each (head dim, causal), each candidate
timed round-robin against the default on the same inputs, and write the winners to ``conf/tuned/<arch>.yaml``.

The candidates (experiments/tune_space.py) are timed by the compare runner (experiments/compare_job.py): one job per
(candidate, sequence length) with two entries, the table default (kernels/config.py DEFAULTS, without conf/tuned/,
so the search does not move under its own output) and the candidate, both with every searched field explicit, so
the job key says exactly what ran. Rows go to ``results/<gpu>/tune/rows.jsonl`` (e.g. results/h200/tune) on a GPU,
to the scratch ``<results_dir>/tune/rows.jsonl`` otherwise; a rerun skips the jobs whose rows are there. The time
``budget`` (seconds) bounds a run: a job starts only if the time spent plus the expected time of the job fits; the
run then stops cleanly, says how many jobs remain, and the same command resumes. Once every job of a (hdim, causal,
direction) search has rows, its winner (kernels/tuning.py: correct, p20 of per-round speedups > 1 at every
sequence length, highest geometric-mean speedup) is written to the tuned file; a finished search without a winner
removes that search's old entry. Only GPU rows of our kernel (backend fa4) are ever written; ``backend=fa4_model``
times the FA4 algorithm model in PyTorch (CPU ok) through the same machinery, and its "winner" is printed, never
written. Without CUDA and with backend fa4, or with ``dry_run=true``, nothing is timed: the valid candidates and the
budget estimate are listed.

Final round: a search whose jobs all have rows has its finalists re-timed together: the table default and up to
``tune.finalists`` (3) candidates -- correct, writable (pingpong on), faster than the default in the median at every
sequence length, highest geometric-mean median speedup first -- in one compare job per sequence length with
FINAL_ROUNDS x the search's rounds, rows tagged ``tune.final``. The winner is picked from the final round only (the
same rule: p20 of its per-round speedups vs the default > 1 at every sequence length, then the highest geometric
mean); without a finalist, or without a final-round winner, the default stays. Searching many candidates one job
each picks up the luck of each job's minutes (clocks under the power cap move by percents); the finalists share
their jobs' minutes. The final jobs follow from the search's rows, so a rerun recomputes them and skips those with
rows (resumable), and they run inside the same ``budget`` as the search jobs (their a-priori size is scaled by
what the jobs of this run took). ``+tune.finalists=0`` keeps the search-only rule.

Lean rows: the compare runner's rows (shared with the sweeps, unchanged) repeat ~2 KB of config and metadata on
each of ~11 rows per job; ``lean_rows`` folds each entry's first/second-call and check rows into its ``time_ms``
row, leaves out the per-round ``times_ms`` array (the ``time_ratio`` rows keep their per-round ``samples``, which
the winner rule and analysis/tune_figs.py read) and keeps 6 significant digits of non-integral floats: about 3 rows
per search job instead of 11 (failed / skipped rows stay whole). Rows written before it (results/h200/tune) read
the same.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

from experiments.results import ResultStore, job_key, read_rows
from experiments.tune_space import (FWD_HDIMS, TuneSpaceError, candidates, check_target, default_point, fields_of,
                                    hdims_for, job_config, valid_points, variant_name)

EXPERIMENT = "tune"
BACKENDS = ("fa4", "fa4_model")
TUNE_BENCH = dict(settle_s=1.0, min_rounds=10)  # compare-job timing on top of the bench group (rounds = repeats)
STARTUP_S = 30.0  # a priori: worker start + cutlass-dsl import (not measured on this machine)
COMPILE_S = 2.5  # a priori forward compile when the committed rows give none
MODEL_TFLOPS = {"cuda": 450.0, "cpu": 0.02}  # a priori throughput for the time of one call before any row
FINALISTS = 3  # candidates re-timed with the default in the final round (tune.finalists; 0 = no final round)
FINAL_ROUNDS = 2  # the final round's rounds (and min_rounds): this many times the search's
COMPARE_REPEATS = 30  # experiments/compare_job.py DEFAULT_BENCH's repeats (a job whose bench leaves them out)
FOLDED = ("first_call_s", "second_call_s")  # ok rows folded into their entry's time_ms row (and err_* rows: check)
LEAN_DROP = ("times_ms",)  # per-round times left out of tune's time_ms rows (time_ratio keeps its samples)
DIGITS = 6  # significant digits of non-integral floats in tune's rows (event timers resolve ~1e-3 of a 1 ms call)


_clock = time.perf_counter  # the budget's clock (a test substitutes its own)


class TuneError(ValueError):
    """A tune run that cannot start (bad arch / hdim / direction / backend / budget). One line."""


# ---- what to search ------------------------------------------------------------------------------------------------
def _as_list(v, name, allowed):
    vals = allowed if v is None else (list(v) if isinstance(v, (list, tuple)) else [v])
    for x in vals:
        if x not in allowed or isinstance(x, bool) != isinstance(allowed[0], bool):
            raise TuneError(f"{name}={x!r}: supported: {', '.join(map(str, allowed))} (or null for all)")
    return list(dict.fromkeys(vals))


def resolve_arch(arch) -> str:
    if arch in (None, "auto"):
        from experiments.isolation import cuda_available

        if cuda_available():
            import torch

            major, minor = torch.cuda.get_device_capability()
            return f"sm{major}{minor}"
        return "sm90"
    return str(arch)


def check_args(cfg: dict) -> None:
    """Every argument of the tune command, cheaply (no enumeration); TuneError names the first bad one."""
    backend = (cfg.get("backend") or {}).get("name", "fa4")
    if backend not in BACKENDS:
        raise TuneError(f"backend={backend!r}: tune times our kernel (fa4) or its PyTorch model (fa4_model)")
    if any(v is not None for v in ((cfg.get("backend") or {}).get("config") or {}).values()):
        raise TuneError("backend.config: tune searches from the defaults; leave backend.config.* null")
    direction = cfg.get("direction", "fwd")
    if direction not in ("fwd", "bwd"):
        raise TuneError(f"direction={direction!r}: supported: fwd, bwd")
    arch = resolve_arch(cfg.get("arch"))
    hdims = _as_list(cfg.get("hdim"), "hdim", list(hdims_for(direction)))
    _as_list(cfg.get("causal"), "causal", [False, True])
    try:
        for h in hdims:
            check_target(arch, h, direction)
    except (TuneSpaceError, ValueError) as e:
        raise TuneError(str(e)) from None
    budget = cfg.get("budget", 480)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
        raise TuneError(f"budget={budget!r}: must be a number of seconds > 0")
    seqlens = cfg.get("seqlens", [8192, 16384])
    if not isinstance(seqlens, (list, tuple)) or not seqlens or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in seqlens):
        raise TuneError(f"seqlens={seqlens!r}: must be a non-empty list of positive ints (e.g. seqlens=[8192,16384])")
    if not isinstance(cfg.get("dry_run", False), bool):
        raise TuneError(f"dry_run={cfg.get('dry_run')!r}: must be true or false")
    t = dict(cfg.get("tune") or {})
    unknown = sorted(set(t) - {"tokens", "hidden", "write", "finalists"})
    if unknown:
        raise TuneError(f"tune.{unknown[0]}: unknown key; keys: tokens, hidden, write, finalists")
    for k in ("tokens", "hidden"):
        v = t.get(k, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TuneError(f"tune.{k}={v!r}: must be an int >= 1")
    v = t.get("finalists", FINALISTS)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TuneError(f"tune.finalists={v!r}: must be an int >= 0 (0: no final round, the search picks the winner)")
    if not isinstance(t.get("write", True), bool):
        raise TuneError(f"tune.write={t.get('write')!r}: must be true or false")


def targets(cfg: dict) -> list[dict]:
    """The searches of this run: one per (hdim, causal) with its default point and ordered candidates."""
    direction = cfg.get("direction", "fwd")
    arch = resolve_arch(cfg.get("arch"))
    hdims = _as_list(cfg.get("hdim"), "hdim", list(hdims_for(direction)))
    causals = _as_list(cfg.get("causal"), "causal", [False, True])
    out = []
    for h in hdims:
        for c in causals:
            try:
                a = check_target(arch, h, direction)
                valid = valid_points(a, h, c, direction)
                cands = candidates(a, h, c, direction, valid)
            except TuneSpaceError as e:
                raise TuneError(str(e)) from None
            out.append(dict(arch=a, hdim=h, causal=c, direction=direction, n_valid=len(valid),
                            default=default_point(a, h, c, direction), candidates=cands))
    return out


def shapes_for(t: dict, seqlens, tokens: int, hidden: int) -> list[dict]:
    from experiments.shapes import Shape

    out = []
    for s in seqlens:
        if not isinstance(s, int) or isinstance(s, bool) or s < 1:
            raise TuneError(f"seqlens={list(seqlens)}: must be a list of positive ints")
        out.append(Shape(batch=max(1, tokens // s), seqlen_q=s, seqlen_k=s, heads=max(1, hidden // t["hdim"]),
                         hdim=t["hdim"], hdim_v=FWD_HDIMS[t["hdim"]], causal=t["causal"]).to_dict())
    return out


def _fixed(t: dict) -> dict:
    """Fields held at the table default in every job of a search (the backward's exp2 split: one table field for
    both directions, tuned by the forward search)."""
    if t["direction"] == "bwd":
        from kernels.config import table_defaults

        return {"exp2_emu_fraction": table_defaults(t["arch"], t["hdim"], t["causal"], tuned=False)["exp2_emu_fraction"]}
    return {}


def make_jobs(t: dict, shapes: list[dict], backend: str, bench: dict) -> list[dict]:
    """Compare jobs of one search, candidate-major (every sequence length of a candidate, then the next)."""
    fixed = _fixed(t)
    where = (t["arch"], t["hdim"], t["causal"])
    base = job_config({**t["default"], **fixed}, *where)
    jobs = []
    for p in t["candidates"]:  # the search index is not in the job (its key survives a reordered space)
        name = variant_name(p, t["default"])
        for shape in shapes:
            jobs.append({"kind": "compare", "experiment": EXPERIMENT, "shape": shape, "modes": [t["direction"]],
                         "check": True, "bench": {**bench, **TUNE_BENCH},
                         "entries": [{"backend": backend, "variant": "default", "config": base},
                                     {"backend": backend, "variant": name, "config": job_config({**p, **fixed}, *where)}],
                         "baseline": {"backend": backend, "variant": "default"},
                         "tune": {"arch": t["arch"], "direction": t["direction"]}})
    return jobs


def finalists(results: list[dict], seqlens, n: int = FINALISTS) -> list[dict]:
    """The final round's candidates of a complete search: correct, writable (pingpong on: not a table field), faster
    than the default in the median at every sequence length; the ``n`` with the highest geometric mean of median
    speedups (ties: search order). p20 > 1 is not required here: one job's p20 is what the final round re-measures."""
    def score(c):
        return sum(math.log(c["stats"][s]["median"]) for s in seqlens) / len(seqlens)

    ok = [c for c in results if c["ok"] and c["config"].get("pingpong", True) is True
          and all(c["stats"].get(s) and c["stats"][s]["median"] > 1.0 for s in seqlens)]
    return sorted(ok, key=score, reverse=True)[:max(0, int(n))]


def final_jobs(t: dict, jobs: list[dict], finals: list[dict]) -> list[dict]:
    """The final round of search ``t`` (its search ``jobs``): per sequence length one compare job of the default
    and the ``finals`` (in their order), FINAL_ROUNDS x the search's rounds, tagged ``tune.final``. [] without
    finalists."""
    if not finals:
        return []
    out, seen = [], set()
    for j in jobs:
        shape = json.dumps(j["shape"], sort_keys=True)
        if shape in seen:
            continue
        seen.add(shape)
        b = dict(j["bench"])
        b["repeats"] = FINAL_ROUNDS * int(b.get("repeats", COMPARE_REPEATS))
        b["min_rounds"] = FINAL_ROUNDS * int(b.get("min_rounds", 10))
        base = j["entries"][0]
        out.append({**j, "bench": b, "tune": {**j["tune"], "final": True},
                    "entries": [base] + [{"backend": base["backend"], "variant": c["name"], "config": c["config"]}
                                         for c in finals]})
    return out


def final_plan(t: dict, jobs: list[dict], rows: list[dict], seqlens, n: int = FINALISTS) -> list[dict] | None:
    """The final-round jobs of search ``t`` from its rows; None while a search job has no rows (the finalists are
    not known yet); [] when the round is off (n = 0) or no candidate qualifies."""
    res = candidate_results(rows, jobs, t)
    if any(c["done"] < c["jobs"] for c in res):
        return None
    return final_jobs(t, jobs, finalists(res, seqlens, n)) if n > 0 else []


def search_index(t: dict) -> dict:
    """Variant name -> position in the search order (what a row's ``tune.candidate`` says)."""
    return {variant_name(p, t["default"]): i for i, p in enumerate(t["candidates"])}


# ---- lean rows -------------------------------------------------------------------------------------------------
def _round(v):
    if isinstance(v, float) and math.isfinite(v) and not v.is_integer():
        return float(f"{v:.{DIGITS}g}")
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


def lean_rows(rows: list[dict]) -> list[dict]:
    """The rows of one tune compare job as tune stores them (the module doc): per (entry, mode) with an ok
    ``time_ms`` row, its ok ``first_call_s`` / ``second_call_s`` rows become fields of that row and its ok
    ``err_*`` rows its ``check`` field (``{"seed", "err_out": {"value", "bound"}, ...}``; passed = value <= bound);
    ``times_ms`` is left out; non-integral floats of the top level, of lists (``samples``) and of ``check`` keep
    DIGITS significant digits (configs and metadata dicts are not touched). Every other row (not ok, or of an entry
    that was not timed) stays, rounded alike. Each row's ``tune`` gets ``lean: true``."""
    timed = {}
    for r in rows:
        if r.get("metric") == "time_ms" and r.get("status") == "ok":
            timed.setdefault((r.get("variant"), r.get("mode")), (r, {k: v for k, v in r.items() if k not in LEAN_DROP}))
    out = []
    for r in rows:
        m = r.get("metric")
        orig, lean = timed.get((r.get("variant"), r.get("mode")), (None, None))
        if r is orig:
            out.append(lean)
        elif lean is not None and r.get("status") == "ok" and m in FOLDED:
            lean[m] = r.get("value")
        elif lean is not None and r.get("status") == "ok" and str(m).startswith("err_"):
            check = lean.setdefault("check", {"seed": r.get("check_seed")})
            check[m] = {"value": _round(r.get("value")), "bound": _round(r.get("bound"))}
        else:
            out.append(dict(r))
    for r in out:
        for k, v in r.items():
            if k != "check" and not isinstance(v, dict):
                r[k] = _round(v)
        r["tune"] = {**(r.get("tune") or {}), "lean": True}
    return out


# ---- budget ----------------------------------------------------------------------------------------------------
def prior_compile_s(results_root: Path) -> tuple[float, str]:
    """Median first-call seconds (compile included) of our kernel in the committed rows, else a guess; and where
    the number comes from."""
    vals = []
    for f in sorted({p.parent / "rows.jsonl" for p in Path(results_root).glob("*/*/rows.jsonl*")}):
        for r in read_rows(f):
            if r.get("backend") != "fa4" or r.get("status") != "ok":
                continue
            v = (r.get("value") if r.get("metric") == "first_call_s" else  # tune's lean rows: a time_ms field
                 r.get("first_call_s") if r.get("metric") == "time_ms" else None)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0.3:
                vals.append(float(v))
    if vals:
        return float(statistics.median(vals)), f"median first call (compile) of fa4 in {len(vals)} committed rows"
    return COMPILE_S, "a guess (no committed first-call rows)"


def job_estimate_s(job: dict, device: str, compile_s: float) -> float:
    """A priori seconds of one job: ``compile_s`` (the caller's: the new kernels' compiles), the checks, warm-up,
    settle and rounds of its entries (two in a search job) at an assumed throughput."""
    from experiments.bench import attn_flops
    from experiments.shapes import Shape

    call_s = attn_flops(Shape.from_dict(job["shape"]), job["modes"][0]) / (MODEL_TFLOPS[device] * 1e12)
    b = job["bench"]
    calls = len(job["entries"]) * (int(b.get("warmup", 10)) + int(b.get("repeats", 50)) + 4)  # + first/second
    return compile_s + 1.0 + float(b.get("settle_s", 0.0)) + calls * call_s


# ---- winners -------------------------------------------------------------------------------------------------
def candidate_results(rows: list[dict], jobs: list[dict], t: dict) -> list[dict]:
    """Per candidate of search ``t``: ``{"name", "config", "ok", "stats": {seqlen: speedup_stats}, "done", "jobs",
    "reasons"}`` from the rows of the planned ``jobs`` (rows of other jobs, e.g. against an older default, are not
    used). A job may time several candidates against its first entry, the default (the final round): a row that is
    not ok counts against every candidate of its job but those of another candidate's own rows."""
    from kernels.tuning import speedup_stats

    keys = {job_key(j): j for j in jobs}
    by_key: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("job_key") in keys:
            by_key.setdefault(r["job_key"], []).append(r)
    out = {}
    for k, j in keys.items():
        cands = j["entries"][1:]
        for cand in cands:
            c = out.setdefault(cand["variant"], {"name": cand["variant"], "config": cand["config"], "ok": True,
                                                 "stats": {}, "done": 0, "jobs": 0, "reasons": []})
            c["jobs"] += 1
            rs = by_key.get(k)
            if not rs:
                continue
            c["done"] += 1
            others = {e["variant"] for e in cands} - {cand["variant"]}
            bad = [r for r in rs if r.get("status") != "ok" and r.get("variant") not in others]
            if bad:
                c["ok"] = False
                c["reasons"] += sorted({f"{r.get('variant')}: {r.get('status')} {r.get('reason') or ''}".strip()
                                        for r in bad})
            ratio = next((r for r in rs if r.get("variant") == cand["variant"] and r.get("metric") == "time_ratio"
                          and r.get("status") == "ok"), None)
            if ratio is not None:
                c["stats"][j["shape"]["seqlen_q"]] = speedup_stats(ratio.get("samples"))
    return list(out.values())


def _per_seqlen(c: dict, seqlens, key: str, nd: int = 4) -> dict:
    return {int(s): (round(c["stats"][s][key], nd) if isinstance(c["stats"][s][key], float) else c["stats"][s][key])
            for s in seqlens if c["stats"].get(s)}


def winner_entry(t: dict, results: list[dict], seqlens, rows_path: Path, rows: list[dict],
                 search: list[dict] | None = None) -> dict | None:
    """The tuned-file entry of search ``t`` (None: the default stays). Only candidates the defaults table can carry
    compete: pingpong is an AttnConfig field default, not a table field. ``results`` are the candidates of the round
    that decides: the final round when ``search`` (the search's results) is given, else the search."""
    from kernels.config import table_context
    from kernels.tuning import pick_winner

    table_ok = [c for c in results if c["config"].get("pingpong", True) is True]
    w = pick_winner(table_ok, seqlens)
    if w is None:
        return None
    gpus = sorted({str(r.get("gpu_name")) for r in rows if r.get("gpu_name")})
    shas = sorted({str(r.get("git_sha")) for r in rows if r.get("git_sha")})
    evidence = {"candidate": w["name"], "table_default": {k: v for k, v in t["default"].items() if k != "pingpong"},
                "speedup_median": _per_seqlen(w, seqlens, "median"), "speedup_p20": _per_seqlen(w, seqlens, "p20"),
                "rounds": _per_seqlen(w, seqlens, "n"), "candidates": len(search if search is not None else results)}
    if search is not None:
        s = next((c for c in search if c["name"] == w["name"]), None)
        evidence["final_round"] = {"entries": ["default"] + [c["name"] for c in results]}
        if s is not None:
            evidence["final_round"].update(search_speedup_median=_per_seqlen(s, seqlens, "median"),
                                           search_speedup_p20=_per_seqlen(s, seqlens, "p20"))
    evidence.update(rows=_repo_relative(rows_path), gpu=", ".join(gpus) or None, git_sha=", ".join(shas[:3]) or None,
                    # the table defaults under the entry: kernels/config.py skips it once they change (STALE_TUNED)
                    table_context=table_context(t["arch"], t["hdim"], t["causal"], t["direction"]))
    return {"hdim": t["hdim"], "causal": t["causal"], "direction": t["direction"],
            "config": {k: w["config"][k] for k in fields_of(t["direction"])  # a plan saved before a field existed
                       if k != "pingpong" and k in w["config"]},                # lacks it: the default stays
            "evidence": evidence}


def _repo_relative(path: Path) -> str:
    """``path`` relative to the repository root when it lies inside it (the tuned file is committed), else as is."""
    root = Path(__file__).resolve().parent.parent
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return str(path)


# ---- the command ---------------------------------------------------------------------------------------------
def _rows_path(cfg: dict, device: str, backend: str, results_root: Path) -> Path:
    if device == "cuda" and backend == "fa4":
        import torch

        from kernels.hardware import GPUS, gpu_for_device

        name = torch.cuda.get_device_name()
        g = gpu_for_device(name)
        machine = next((k for k, v in GPUS.items() if v is g), None) or "".join(
            ch for ch in name.lower().replace("nvidia", "") if ch.isalnum())
        return results_root / machine / EXPERIMENT / "rows.jsonl"
    return results_root / EXPERIMENT / "rows.jsonl"


def _fmt_s(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _n_final(cfg: dict) -> int:
    return int((cfg.get("tune") or {}).get("finalists", FINALISTS))


def run_tune(cfg: dict, out=None, results_root: Path | None = None, tuned_dir: Path | None = None) -> int:
    """The ``tune`` command on a composed config (plain dict). Returns 0 or 130 (Ctrl-C); bad arguments raise
    TuneError (run.py: one line, exit 2)."""
    out = out or sys.stdout  # looked up per call (a captured or replaced stdout)
    from experiments.isolation import cuda_available
    from experiments.sweep import results_root as default_root

    check_args(cfg)
    backend = (cfg.get("backend") or {}).get("name", "fa4")
    budget = float(cfg.get("budget", 480))
    seqlens = list(cfg.get("seqlens") or [8192, 16384])
    tcfg = dict(cfg.get("tune") or {})
    tokens, hidden = int(tcfg.get("tokens", 32768)), int(tcfg.get("hidden", 2048))
    n_final = _n_final(cfg)
    device = "cuda" if cuda_available() else "cpu"
    results_root = Path(results_root or default_root(cfg))
    searches = targets(cfg)
    _print_stale(searches, out)
    bench = {k: v for k, v in dict(cfg.get("bench") or {}).items() if k in ("warmup", "repeats", "flush_l2")}
    plans = [(t, make_jobs(t, shapes_for(t, seqlens, tokens, hidden), backend, bench)) for t in searches]
    path = _rows_path(cfg, device, backend, results_root)
    keyed = [(job_key(j), j, i // len(seqlens)) for t, jobs in plans for i, j in enumerate(jobs)]
    dry = bool(cfg.get("dry_run", False))
    no_gpu = device == "cpu" and backend == "fa4"
    if no_gpu:
        print("tune: no CUDA device here: timings need a GPU (our kernel runs on sm_90a). Listing the valid "
              "candidates and the budget estimate instead (dry run); backend=fa4_model times the PyTorch model of "
              "the algorithm on this CPU through the same machinery (not kernel timings).", file=out)
    rows = read_rows(path)
    done = {r.get("job_key") for r in rows}
    finals = [final_plan(t, jobs, rows, seqlens, n_final) for t, jobs in plans]
    compile_s, compile_src = prior_compile_s(results_root) if backend == "fa4" else (0.0, "the model compiles nothing")
    est_device = "cuda" if backend == "fa4" else device  # the plan of a kernel search is a GPU plan
    _print_plan(plans, finals, n_final, done, est_device, compile_s, compile_src, budget, seqlens, path, out)
    if dry or no_gpu:
        if cfg.get("verbose_candidates", True):
            _print_candidates(plans, out)
        return 0

    def final_round() -> list:  # after the search jobs of this run: the final jobs of every complete search
        now = read_rows(path)
        out_ = []
        for t, jobs in plans:
            index = search_index(t)
            out_ += [(job_key(j), j, index) for j in (final_plan(t, jobs, now, seqlens, n_final) or [])]
        return out_

    code = _run_jobs(cfg, keyed, path, budget, device, compile_s, out, more=final_round)
    rows = read_rows(path)
    _report(plans, rows, seqlens, path, device, backend, cfg, out, tuned_dir)
    return code


def _print_stale(searches, out) -> None:
    """The tuned entries that kernels/config.py left out (STALE_TUNED: their table defaults changed since they were
    measured), and whether this run's searches re-measure them."""
    from kernels.config import STALE_TUNED

    searched = {(t["arch"], t["hdim"], t["causal"], t["direction"]) for t in searches}
    for (arch, h, c, d), changed in sorted(STALE_TUNED.items()):
        diff = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
        todo = ("this run re-measures it" if (arch, h, c, d) in searched else
                f"`python run.py tune arch={arch} hdim={h} causal={str(c).lower()} direction={d}` re-measures it")
        print(f"tune: stale tuned entry {arch} {d} hdim {h} {'causal' if c else 'non-causal'} (not applied; the table "
              f"changed: {diff}); {todo}", file=out)


def _print_plan(plans, finals, n_final, done, device, compile_s, compile_src, budget, seqlens, path, out) -> None:
    total_est, todo, todo_final = 0.0, 0, 0
    print(f"tune: {len(plans)} search(es), sequence lengths {seqlens}, rows -> {path}", file=out)
    for (t, jobs), fin in zip(plans, finals):
        left = [j for j in jobs if job_key(j) not in done]
        est = sum(job_estimate_s(j, device, 0.0) for j in left)
        est += compile_s * len({j["entries"][1]["variant"] for j in left})  # one compile per candidate
        if fin is None:  # finalists not known yet: the most the final round can take
            k = min(n_final, sum(p.get("pingpong", True) is True for p in t["candidates"]))
            ghost = [{"name": f"#{i}", "config": {}} for i in range(k)]
            fleft = final_jobs(t, jobs, ghost)
            final_txt = (f"then a final round of up to {len(fleft)} jobs (the default + up to {k} finalists)"
                         if fleft else "no final round")
        else:
            fleft = [j for j in fin if job_key(j) not in done]
            final_txt = (f"final round (the default + {', '.join(e['variant'] for e in fin[0]['entries'][1:])}): "
                         f"{len(fin) - len(fleft)}/{len(fin)} jobs done" if fin else
                         "no final round" + ("" if n_final == 0 else " (no candidate faster than the default in the "
                                                                      "median at every sequence length)"))
        fest = sum(job_estimate_s(j, device, 0.0) for j in fleft)
        fest += compile_s * (len(fleft[0]["entries"]) - 1 if fleft else 0)  # its kernels, compiled by this worker
        total_est += est + fest
        todo += len(left) + len(fleft)
        todo_final += len(fleft)
        print(f"  {t['direction']} hdim {t['hdim']} {'causal' if t['causal'] else 'non-causal'}: {t['n_valid']} valid "
              f"combinations, {len(t['candidates'])} candidates vs the default {_point(t['default'])}; "
              f"{len(jobs) - len(left)}/{len(jobs)} jobs done, ~{_fmt_s(est)} left; {final_txt}"
              + (f", ~{_fmt_s(fest)}" if fleft else ""), file=out)
    where = (f"a GPU at an assumed {MODEL_TFLOPS['cuda']:.0f} TFLOP/s" if device == "cuda" else
             f"this CPU at an assumed {MODEL_TFLOPS['cpu'] * 1000:.0f} GFLOP/s")
    print(f"tune: {todo} jobs to run" + (f" ({todo_final} of them in final rounds)" if todo_final else "")
          + f", estimated {_fmt_s(total_est + (STARTUP_S if todo else 0))} on {where} "
          f"(+ compile {compile_s:.1f} s per candidate: {compile_src}; {STARTUP_S:.0f} s worker start); budget {_fmt_s(float(budget))} per run"
          + (f": about {math.ceil((total_est + STARTUP_S) / float(budget))} run(s) of this command" if todo else ""),
          file=out)


def _point(p: dict) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in p.items()) + "}"


def _print_candidates(plans, out) -> None:
    for t, _ in plans:
        print(f"candidates, {t['direction']} hdim {t['hdim']} {'causal' if t['causal'] else 'non-causal'} "
              f"(search order):", file=out)
        for i, p in enumerate(t["candidates"], 1):
            print(f"  {i:3d}. {variant_name(p, t['default'])}", file=out)
        if not t["candidates"]:
            print("  (none: the default is the only valid combination)", file=out)


def _job_label(job) -> str:
    cands = [e["variant"] for e in job["entries"][1:]]
    return f"final round: default + {', '.join(cands)}" if job["tune"].get("final") else cands[0]


def _run_jobs(cfg, keyed, path: Path, budget: float, device: str, compile_s: float, out, more=None) -> int:
    """Run the jobs without rows, in order, while the budget allows; then, if none is left, the jobs ``more()``
    returns (the final rounds, which follow from the rows just written), on the same worker and budget. A job's
    expected time is its a-priori estimate scaled by the median measured / a-priori ratio of this run's jobs (a
    final job, with more entries and rounds, expects more). 0, or 130 on Ctrl-C."""
    import uuid

    from experiments.isolation import CudaContextPoisoned, failure_row, make_executor
    from experiments.runners import RUNNERS
    from experiments.sweep import stamp

    store = ResultStore(path)
    todo = [(k, j, i) for k, j, i in keyed if not store.is_done(k)]
    phase_more = more
    if not todo and phase_more is not None:
        todo, phase_more = [(k, j, i) for k, j, i in phase_more() if not store.is_done(k)], None
    if not todo:
        print("tune: every job already has rows", file=out)
        return 0
    executor = make_executor(str(cfg.get("isolation", "auto")), dict(RUNNERS), (), float(cfg.get("job_timeout_s", 600)))
    run_id, t0, scale, ran = uuid.uuid4().hex[:12], _clock(), [], 0
    last_target, code, stopped = None, 0, False
    try:
        meta = executor.metadata()
        while todo:
            for n, (key, job, index) in enumerate(todo):
                target = (job["shape"]["hdim"], job["shape"]["causal"], tuple(e["variant"] for e in job["entries"][1:]))
                new = len(job["entries"]) - 1 if target != last_target else 0  # kernels this job compiles first
                prior = job_estimate_s(job, device, compile_s * new)
                est = prior * statistics.median(scale) if scale else prior
                elapsed = _clock() - t0
                if elapsed + est > budget:
                    print(f"tune: budget of {_fmt_s(budget)} spent ({_fmt_s(elapsed)} used, next job ~{_fmt_s(est)}): "
                          f"ran {ran} jobs, {len(todo) - n} remain; rerun the same command to resume"
                          + ("" if ran else " (or give a larger budget=)")
                          + (" (a final round follows the search)" if phase_more is not None else ""),
                          file=out, flush=True)
                    stopped = True
                    break
                t1 = _clock()
                try:
                    rows = executor.run(job)
                except CudaContextPoisoned as e:
                    rows = e.args[0]
                if not rows:
                    rows = [failure_row(job, "error", "compare runner returned no rows")]
                stamped = []
                for r in rows:  # the position in the search order, on the rows only (not in the job key)
                    cand = index.get(r.get("variant")) if isinstance(index, dict) else index
                    stamped.append({**stamp(r, job, key, meta, run_id, executor.mode), "tune": {**job["tune"],
                                                                                                "candidate": cand}})
                store.append_job(lean_rows(stamped))
                ran += 1
                took = _clock() - t1
                scale.append(took / max(prior, 1e-9))
                last_target = target
                st = sorted({r.get("status") for r in rows})
                sh = job["shape"]
                print(f"[{n + 1}/{len(todo)}] hd{sh['hdim']} {'causal' if sh['causal'] else 'non-causal'} s{sh['seqlen_q']}"
                      f" {_job_label(job)}: {took:.1f} s ({', '.join(st)})"
                      f"{_ratio_text(rows, job)}", file=out, flush=True)
            if stopped or phase_more is None:
                break
            todo, phase_more = [(k, j, i) for k, j, i in phase_more() if not store.is_done(k)], None
            if todo:
                print(f"tune: final round: {len(todo)} job(s) (the default and each search's finalists, timed "
                      f"together, {FINAL_ROUNDS}x the rounds)", file=out, flush=True)
        if not stopped:
            print(f"tune: ran {ran} jobs in {_fmt_s(_clock() - t0)}; none remain", file=out)
    except KeyboardInterrupt:
        print(f"\ntune: interrupted after {ran} jobs; rerun the same command to resume", file=out)
        code = 130
    finally:
        getattr(executor, "abort", executor.close)() if code == 130 else executor.close()
    return code


def _ratio_text(rows, job) -> str:
    from kernels.tuning import speedup_stats

    parts = []
    for e in job["entries"][1:]:
        r = next((r for r in rows if r.get("metric") == "time_ratio" and r.get("status") == "ok"
                  and r.get("variant") == e["variant"]), None)
        s = speedup_stats(r.get("samples")) if r else None
        if s:
            parts.append((e["variant"], s))
    if not parts:
        return ""
    if len(job["entries"]) == 2:
        s = parts[0][1]
        return f"; speedup over the default {s['median']:.3f} (p20 {s['p20']:.3f}, {s['n']} rounds)"
    return "; speedups over the default: " + ", ".join(f"{v} {s['median']:.3f} (p20 {s['p20']:.3f})"
                                                       for v, s in parts) + f", {parts[0][1]['n']} rounds"


def _stat_text(seqlen, st: dict) -> str:
    return f"s{seqlen}: {st['median']:.3f}x, p20 {st['p20']:.3f}"


def _report(plans, rows, seqlens, path, device, backend, cfg, out, tuned_dir) -> None:
    """Per search: the fastest candidate measured, then the decision: search incomplete (nothing written); complete
    without a finalist (the default stays); final round incomplete (nothing written); the final round's winner, or
    none (the default stays). With ``tune.finalists=0`` the search's own winner decides, as before the final round."""
    from kernels.tuning import tuned_path, write_tuned

    writable = device == "cuda" and backend == "fa4" and bool((cfg.get("tune") or {}).get("write", True))
    n_final = _n_final(cfg)
    entries, clear = {}, {}
    for t, jobs in plans:
        res = candidate_results(rows, jobs, t)
        left = sum(c["jobs"] - c["done"] for c in res)
        label = f"{t['direction']} hdim {t['hdim']} {'causal' if t['causal'] else 'non-causal'}"
        fastest = max((c for c in res if c["stats"] and len(c["stats"]) == len(seqlens) and all(c["stats"].values())),
                      key=lambda c: sum(math.log(s["median"]) for s in c["stats"].values()), default=None)
        if fastest:
            per = ", ".join(_stat_text(s, fastest["stats"][s]) for s in seqlens)
            print(f"tune: {label}: fastest measured {fastest['name']} ({per})", file=out)
        if left:
            print(f"tune: {label}: {left} of {sum(c['jobs'] for c in res)} jobs remain; the winner is written once the "
                  f"search is complete", file=out)
            continue
        keys = {job_key(j) for j in jobs}
        if n_final == 0:
            ent = winner_entry(t, res, seqlens, path, [r for r in rows if r.get("job_key") in keys])
            why = ("no candidate beat the default beyond the noise (p20 of per-round speedups > 1 at every sequence "
                   "length)")
        else:
            fin = finalists(res, seqlens, n_final)
            if not fin:
                print(f"tune: {label}: complete; no candidate was faster than the default in the median at every "
                      f"sequence length (no final round): the default stays", file=out)
                clear.setdefault(t["arch"], []).append((t["hdim"], t["causal"], t["direction"]))
                continue
            fjobs = final_jobs(t, jobs, fin)
            fres = candidate_results(rows, fjobs, t)
            fleft = len({job_key(j) for j in fjobs} - {r.get("job_key") for r in rows})
            if fleft:
                names = ", ".join(c["name"] for c in fin)
                print(f"tune: {label}: search complete; final round (the default + {names}): {fleft} of {len(fjobs)} "
                      f"jobs remain; the winner is written once it is done", file=out)
                continue
            for c in fres:
                per = ", ".join(_stat_text(s, c["stats"][s]) for s in seqlens if c["stats"].get(s))
                print(f"tune: {label}: final round: {c['name']}: {per or 'no speedup measured'}"
                      + ("" if c["ok"] else f" (failed: {'; '.join(c['reasons'][:2])})"), file=out)
            keys |= {job_key(j) for j in fjobs}
            ent = winner_entry(t, fres, seqlens, path, [r for r in rows if r.get("job_key") in keys], search=res)
            why = ("no finalist beat the default beyond the noise in the final round (p20 of per-round speedups > 1 "
                   "at every sequence length)")
        if ent is None:
            print(f"tune: {label}: complete; {why}: the default stays", file=out)
            clear.setdefault(t["arch"], []).append((t["hdim"], t["causal"], t["direction"]))
            continue
        print(f"tune: {label}: complete; winner {ent['evidence']['candidate']} "
              f"({'final round ' if n_final else ''}median speedup {ent['evidence']['speedup_median']}, "
              f"p20 {ent['evidence']['speedup_p20']})", file=out)
        if t["direction"] == "fwd" and ent["config"].get("exp2_emu_fraction") != t["default"].get("exp2_emu_fraction"):
            print("      note: exp2_emu_fraction is one table field for both directions; this forward winner sets the "
                  "backward's default fraction too", file=out)
        entries.setdefault(t["arch"], []).append(ent)
    for arch in sorted(set(entries) | set(clear)):
        p = tuned_path(arch, tuned_dir)
        if not writable:
            why = ("these are timings of the PyTorch model, not of the kernel" if backend != "fa4" else
                   "tune.write=false" if device == "cuda" else "no GPU")
            print(f"tune: not writing {p} ({why})", file=out)
            continue
        write_tuned(p, arch, entries.get(arch, []), replace=clear.get(arch, []))
        print(f"tune: wrote {p} ({len(entries.get(arch, []))} winner(s)); kernels/config.py reads it at the next "
              f"import", file=out)
