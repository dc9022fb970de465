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
"""
from __future__ import annotations

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
    unknown = sorted(set(t) - {"tokens", "hidden", "write"})
    if unknown:
        raise TuneError(f"tune.{unknown[0]}: unknown key; keys: tokens, hidden, write")
    for k in ("tokens", "hidden"):
        v = t.get(k, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TuneError(f"tune.{k}={v!r}: must be an int >= 1")
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


# ---- budget ----------------------------------------------------------------------------------------------------
def prior_compile_s(results_root: Path) -> tuple[float, str]:
    """Median first-call seconds (compile included) of our kernel in the committed rows, else a guess; and where
    the number comes from."""
    vals = []
    for f in sorted({p.parent / "rows.jsonl" for p in Path(results_root).glob("*/*/rows.jsonl*")}):
        vals += [float(r["value"]) for r in read_rows(f) if r.get("backend") == "fa4" and r.get("status") == "ok"
                 and r.get("metric") == "first_call_s" and isinstance(r.get("value"), (int, float)) and r["value"] > 0.3]
    if vals:
        return float(statistics.median(vals)), f"median first call (compile) of fa4 in {len(vals)} committed rows"
    return COMPILE_S, "a guess (no committed first-call rows)"


def job_estimate_s(job: dict, device: str, compile_s: float) -> float:
    """A priori seconds of one job: the candidate's compile (first sequence length), the checks, warm-up, settle and
    rounds of two entries at an assumed throughput."""
    from experiments.bench import attn_flops
    from experiments.shapes import Shape

    call_s = attn_flops(Shape.from_dict(job["shape"]), job["modes"][0]) / (MODEL_TFLOPS[device] * 1e12)
    b = job["bench"]
    calls = 2 * (int(b.get("warmup", 10)) + int(b.get("repeats", 50)) + 4)  # + first/second calls
    return compile_s + 1.0 + float(b.get("settle_s", 0.0)) + calls * call_s


# ---- winners -------------------------------------------------------------------------------------------------
def candidate_results(rows: list[dict], jobs: list[dict], t: dict) -> list[dict]:
    """Per candidate of search ``t``: ``{"name", "config", "ok", "stats": {seqlen: speedup_stats}, "done"}`` from the
    rows of the planned jobs (rows of other jobs, e.g. against an older default, are not used)."""
    from kernels.tuning import speedup_stats

    keys = {job_key(j): j for j in jobs}
    by_key: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("job_key") in keys:
            by_key.setdefault(r["job_key"], []).append(r)
    out = {}
    for k, j in keys.items():
        cand = j["entries"][1]
        c = out.setdefault(cand["variant"], {"name": cand["variant"], "config": cand["config"], "ok": True,
                                             "stats": {}, "done": 0, "jobs": 0, "reasons": []})
        c["jobs"] += 1
        rs = by_key.get(k)
        if not rs:
            continue
        c["done"] += 1
        mine = [r for r in rs if r.get("variant") == cand["variant"]]
        bad = [r for r in rs if r.get("status") != "ok"]
        if bad:
            c["ok"] = False
            c["reasons"] += sorted({f"{r.get('variant')}: {r.get('status')} {r.get('reason') or ''}".strip() for r in bad})
        ratio = next((r for r in mine if r.get("metric") == "time_ratio" and r.get("status") == "ok"), None)
        if ratio is not None:
            c["stats"][j["shape"]["seqlen_q"]] = speedup_stats(ratio.get("samples"))
    return list(out.values())


def winner_entry(t: dict, results: list[dict], seqlens, rows_path: Path, rows: list[dict]) -> dict | None:
    """The tuned-file entry of search ``t`` (None: the default stays). Only candidates the defaults table can carry
    compete: pingpong is an AttnConfig field default, not a table field."""
    from kernels.tuning import pick_winner

    table_ok = [c for c in results if c["config"].get("pingpong", True) is True]
    w = pick_winner(table_ok, seqlens)
    if w is None:
        return None
    gpus = sorted({str(r.get("gpu_name")) for r in rows if r.get("gpu_name")})
    shas = sorted({str(r.get("git_sha")) for r in rows if r.get("git_sha")})
    return {"hdim": t["hdim"], "causal": t["causal"], "direction": t["direction"],
            "config": {k: w["config"][k] for k in fields_of(t["direction"])  # a plan saved before a field existed
                       if k != "pingpong" and k in w["config"]},                # lacks it: the default stays
            "evidence": {"candidate": w["name"], "table_default": {k: v for k, v in t["default"].items() if k != "pingpong"},
                         "speedup_median": {int(s): round(w["stats"][s]["median"], 4) for s in seqlens},
                         "speedup_p20": {int(s): round(w["stats"][s]["p20"], 4) for s in seqlens},
                         "rounds": {int(s): w["stats"][s]["n"] for s in seqlens},
                         "candidates": len(results), "rows": _repo_relative(rows_path), "gpu": ", ".join(gpus) or None,
                         "git_sha": ", ".join(shas[:3]) or None}}


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
    device = "cuda" if cuda_available() else "cpu"
    results_root = Path(results_root or default_root(cfg))
    searches = targets(cfg)
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
    done = {r.get("job_key") for r in read_rows(path)}
    compile_s, compile_src = prior_compile_s(results_root) if backend == "fa4" else (0.0, "the model compiles nothing")
    est_device = "cuda" if backend == "fa4" else device  # the plan of a kernel search is a GPU plan
    _print_plan(plans, done, est_device, compile_s, compile_src, budget, seqlens, path, out)
    if dry or no_gpu:
        if cfg.get("verbose_candidates", True):
            _print_candidates(plans, out)
        return 0
    code = _run_jobs(cfg, keyed, path, budget, device, compile_s, out)
    rows = read_rows(path)
    _report(plans, rows, seqlens, path, device, backend, cfg, out, tuned_dir)
    return code


def _print_plan(plans, done, device, compile_s, compile_src, budget, seqlens, path, out) -> None:
    total_est, todo = 0.0, 0
    print(f"tune: {len(plans)} search(es), sequence lengths {seqlens}, rows -> {path}", file=out)
    for t, jobs in plans:
        left = [j for j in jobs if job_key(j) not in done]
        est = sum(job_estimate_s(j, device, 0.0) for j in left)
        est += compile_s * len({j["entries"][1]["variant"] for j in left})  # one compile per candidate
        total_est += est
        todo += len(left)
        print(f"  {t['direction']} hdim {t['hdim']} {'causal' if t['causal'] else 'non-causal'}: {t['n_valid']} valid "
              f"combinations, {len(t['candidates'])} candidates vs the default {_point(t['default'])}; "
              f"{len(jobs) - len(left)}/{len(jobs)} jobs done, ~{_fmt_s(est)} left", file=out)
    where = (f"a GPU at an assumed {MODEL_TFLOPS['cuda']:.0f} TFLOP/s" if device == "cuda" else
             f"this CPU at an assumed {MODEL_TFLOPS['cpu'] * 1000:.0f} GFLOP/s")
    print(f"tune: {todo} jobs to run, estimated {_fmt_s(total_est + (STARTUP_S if todo else 0))} on {where} "
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


def _run_jobs(cfg, keyed, path: Path, budget: float, device: str, compile_s: float, out) -> int:
    """Run the jobs without rows, in order, while the budget allows. 0, or 130 on Ctrl-C."""
    import uuid

    from experiments.isolation import CudaContextPoisoned, failure_row, make_executor
    from experiments.runners import RUNNERS
    from experiments.sweep import stamp

    store = ResultStore(path)
    todo = [(k, j, i) for k, j, i in keyed if not store.is_done(k)]
    if not todo:
        print("tune: every job already has rows", file=out)
        return 0
    executor = make_executor(str(cfg.get("isolation", "auto")), dict(RUNNERS), (), float(cfg.get("job_timeout_s", 600)))
    run_id, t0, spent, ran = uuid.uuid4().hex[:12], _clock(), [], 0
    last_target, code = None, 0
    try:
        meta = executor.metadata()
        for n, (key, job, index) in enumerate(todo):
            target = (job["shape"]["hdim"], job["shape"]["causal"], job["entries"][1]["variant"])
            est = (statistics.median(spent) if spent else
                   job_estimate_s(job, device, compile_s if target != last_target else 0.0))
            elapsed = _clock() - t0
            if elapsed + est > budget:
                print(f"tune: budget of {_fmt_s(budget)} spent ({_fmt_s(elapsed)} used, next job ~{_fmt_s(est)}): "
                      f"ran {ran} jobs, {len(todo) - n} remain; rerun the same command to resume"
                      + ("" if ran else " (or give a larger budget=)"), file=out, flush=True)
                break
            t1 = _clock()
            try:
                rows = executor.run(job)
            except CudaContextPoisoned as e:
                rows = e.args[0]
            if not rows:
                rows = [failure_row(job, "error", "compare runner returned no rows")]
            tune = {**job["tune"], "candidate": index}  # position in the search order, on the rows only
            store.append_job([{**stamp(r, job, key, meta, run_id, executor.mode), "tune": tune} for r in rows])
            ran += 1
            spent.append(_clock() - t1)
            last_target = target
            st = sorted({r.get("status") for r in rows})
            print(f"[{n + 1}/{len(todo)}] hd{job['shape']['hdim']} {'causal' if job['shape']['causal'] else 'non-causal'} "
                  f"s{job['shape']['seqlen_q']} {job['entries'][1]['variant']}: {spent[-1]:.1f} s ({', '.join(st)})"
                  f"{_ratio_text(rows, job)}", file=out, flush=True)
        else:
            print(f"tune: ran {ran} jobs in {_fmt_s(_clock() - t0)}; none remain", file=out)
    except KeyboardInterrupt:
        print(f"\ntune: interrupted after {ran} of {len(todo)} jobs; rerun the same command to resume", file=out)
        code = 130
    finally:
        getattr(executor, "abort", executor.close)() if code == 130 else executor.close()
    return code


def _ratio_text(rows, job) -> str:
    from kernels.tuning import speedup_stats

    r = next((r for r in rows if r.get("metric") == "time_ratio" and r.get("status") == "ok"), None)
    s = speedup_stats(r.get("samples")) if r else None
    if not s:
        return ""
    return f"; speedup over the default {s['median']:.3f} (p20 {s['p20']:.3f}, {s['n']} rounds)"


def _stat_text(seqlen, st: dict) -> str:
    return f"s{seqlen}: {st['median']:.3f}x, p20 {st['p20']:.3f}"


def _report(plans, rows, seqlens, path, device, backend, cfg, out, tuned_dir) -> None:
    from kernels.tuning import tuned_path, write_tuned

    writable = device == "cuda" and backend == "fa4" and bool((cfg.get("tune") or {}).get("write", True))
    entries, clear = {}, {}
    for t, jobs in plans:
        res = candidate_results(rows, jobs, t)
        left = sum(c["jobs"] - c["done"] for c in res)
        label = f"{t['direction']} hdim {t['hdim']} {'causal' if t['causal'] else 'non-causal'}"
        ent = winner_entry(t, res, seqlens, path, [r for r in rows if r.get("job_key") in {job_key(j) for j in jobs}])
        fastest = max((c for c in res if c["stats"] and len(c["stats"]) == len(seqlens) and all(c["stats"].values())),
                      key=lambda c: sum(math.log(s["median"]) for s in c["stats"].values()), default=None)
        if fastest:
            per = ", ".join(_stat_text(s, fastest["stats"][s]) for s in seqlens)
            print(f"tune: {label}: fastest measured {fastest['name']} ({per})", file=out)
        if left:
            print(f"tune: {label}: {left} of {sum(c['jobs'] for c in res)} jobs remain; the winner is written once the "
                  f"search is complete", file=out)
            continue
        if ent is None:
            print(f"tune: {label}: complete; no candidate beat the default beyond the noise (p20 of per-round "
                  f"speedups > 1 at every sequence length): the default stays", file=out)
            clear.setdefault(t["arch"], []).append((t["hdim"], t["causal"], t["direction"]))
            continue
        print(f"tune: {label}: complete; winner {ent['evidence']['candidate']} "
              f"(median speedup {ent['evidence']['speedup_median']}, p20 {ent['evidence']['speedup_p20']})", file=out)
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
