"""The sweep driver: expand an experiment into jobs, skip finished ones, run the rest, write and summarise rows.

An experiment (conf/experiment/*.yaml) either names an ``expand`` hook ("module:function", called with its
``params``) or is a product: for each shape of the ``shape`` grid, for each named AttnConfig variant (``configs``
and the one-field ``sweep_fields``), for each of ``backends``, one job; each of ``peers`` (backends that take
no AttnConfig) runs once per shape. With ``ab_baseline: <variant name>``, each job of another variant of
``backends`` also carries ``ab = {"variant": <name>, "config": <its config>}``: the job then times the variant
against that baseline interleaved and records the ratio (experiments/attn_job.py, metric ``ab_ratio``). With
``kind: compare`` the same product becomes one job per shape that times every backend and variant round-robin
(experiments/compare_job.py; ``ab_baseline`` names the baseline variant, else the first). Jobs go
through an executor (experiments/isolation.py) and their rows are appended to
``<results_dir>/<experiment>/rows.jsonl`` with metadata, the job key and the time.
"""
from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
import uuid
from collections import Counter
from pathlib import Path

from experiments.isolation import CudaContextPoisoned, failure_row, import_plugins, make_executor
from experiments.results import ResultStore, has_archive, job_key, read_rows
from experiments.runners import RUNNERS, get_runner, load_target

PRODUCT_KINDS = ("attn", "smoke", "compare")  # kinds the built-in product expansion makes


class SweepError(ValueError):
    """A sweep that cannot start: unknown backend, bad variant list, bad shape grid. One line, no traceback."""


# ---- expansion -------------------------------------------------------------------------------
def expand_shapes(shape_cfg: dict) -> list[dict]:
    """Shape dicts of a shape-group config: ``grid`` (experiments.shapes.paper_grid kwargs) and/or ``shapes``."""
    from experiments.shapes import Shape, ShapeError, paper_grid

    shape_cfg = dict(shape_cfg or {})
    unknown = sorted(set(shape_cfg) - {"grid", "shapes"})
    if unknown or not shape_cfg:
        raise SweepError(f"shape config keys {unknown or '(none)'}: supported keys are 'grid' and 'shapes'")
    out = []
    try:
        if shape_cfg.get("grid"):
            out += [s.to_dict() for s in paper_grid(**shape_cfg["grid"])]
        for d in shape_cfg.get("shapes") or []:
            out.append(Shape.from_dict(d).to_dict())
    except (ShapeError, TypeError) as e:
        raise SweepError(f"shape: {e}") from e
    return out


def _clean_config(config):
    """A variant's AttnConfig dict without null fields (null = the per-arch default); None stays None."""
    if config is None:
        return None
    return {k: v for k, v in dict(config).items() if v is not None}


def expand_variants(exp: dict) -> list[tuple[str, dict | None]]:
    """(name, config) pairs: the named ``configs`` then ``sweep_fields`` variants '<field>=<value>'."""
    out = []
    for c in exp.get("configs") or [{"name": "default", "config": None}]:
        if not isinstance(c, dict) or "name" not in c:
            raise SweepError(f"experiment.configs entry {c!r}: expected {{name: ..., config: {{field: value}}}}")
        out.append((str(c["name"]), _clean_config(c.get("config"))))
    for field, values in (exp.get("sweep_fields") or {}).items():
        for v in values:
            out.append((f"{field}={v}", {field: v}))
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SweepError(f"experiment.configs: variant names {dup} appear twice; names must be unique")
    from kernels.config import AttnConfig, ConfigError

    for name, config in out:
        if config is not None:
            try:
                AttnConfig.from_dict(config)
            except (ConfigError, TypeError) as e:
                raise SweepError(f"variant {name!r}: {e}") from e
    return out


def _ab_baseline(exp: dict, variants: list[tuple[str, dict | None]]) -> dict | None:
    """``{"variant", "config"}`` of the experiment's ``ab_baseline`` variant (None without one)."""
    base = exp.get("ab_baseline")
    if base is None:
        return None
    configs = dict(variants)
    if str(base) not in configs:
        raise SweepError(f"experiment.ab_baseline={base!r}: not a variant of this experiment; "
                         f"variants: {', '.join(configs)}")
    return {"variant": str(base), "config": configs[str(base)]}


def _check_backends(names: list[str]) -> None:
    from experiments.backends import BACKENDS

    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise SweepError(f"backend={unknown[0]!r}: unknown; known backends: {', '.join(sorted(BACKENDS))}")


def _unique(seq) -> list:
    return list(dict.fromkeys(seq))


def expand_jobs(cfg: dict) -> list[dict]:
    """All jobs of the experiment in ``cfg`` (a plain dict of the composed config), in run order."""
    exp = cfg["experiment"]
    name, kind = exp["name"], exp.get("kind", "attn")
    import_plugins(exp.get("imports"))
    if exp.get("expand"):
        if exp.get("ab_baseline") is not None:
            raise SweepError(f"experiment {name!r}: ab_baseline applies to product experiments (backends x "
                             f"configs), not to an 'expand' hook")
        try:
            jobs = load_target(exp["expand"])(dict(exp.get("params") or {}))
        except (ValueError, TypeError) as e:  # a bad parameter: one line, as for the built-in expansion
            raise SweepError(f"experiment {name!r}: {str(e).splitlines()[0]}") from e
        return [{**j, "experiment": j.get("experiment") or name} for j in jobs]
    if kind not in PRODUCT_KINDS:
        raise SweepError(f"experiment {name!r}: kind={kind!r} needs an 'expand' hook; "
                         f"built-in expansion supports kinds {PRODUCT_KINDS}")
    backends, peers = _unique(exp.get("backends") or []), _unique(exp.get("peers") or [])
    if not backends and not peers:
        raise SweepError(f"experiment {name!r}: lists no backends (experiment.backends / experiment.peers)")
    _check_backends(backends + peers)
    variants = expand_variants(exp)
    ab = _ab_baseline(exp, variants)
    common = {"kind": kind, "experiment": name, "modes": list(exp.get("modes") or ["fwd"]),
              "check": bool(exp.get("check", True)),
              "bench": dict(cfg.get("bench") or {}) if exp.get("timed", True) else None,
              **dict(exp.get("job_params") or {})}
    jobs = []
    for shape in expand_shapes(cfg["shape"]):
        for vname, config in variants:
            for b in backends:
                job = {**common, "backend": b, "variant": vname, "config": config, "shape": shape}
                if ab is not None and vname != ab["variant"]:
                    job["ab"] = ab  # part of the job key: a rerun with a new baseline measures again
                jobs.append(job)
        for b in peers:
            jobs.append({**common, "backend": b, "variant": "peer", "config": None, "shape": shape})
    if kind == "compare":  # one job per shape times them all round-robin (experiments/compare_job.py)
        from experiments.compare_job import group_jobs

        return group_jobs(jobs, ab["variant"] if ab else None)
    return jobs


# ---- rows, summary ---------------------------------------------------------------------------
def stamp(row: dict, job: dict, key: str, meta: dict, run_id: str, isolation: str) -> dict:
    """A runner's row plus what the sweep knows: job identity, variant, metadata, time."""
    out = dict(row)
    for k in ("experiment", "kind", "backend", "variant"):
        if out.get(k) is None and job.get(k) is not None:
            out[k] = job[k]
    out["job_key"] = key
    out.setdefault("status", "ok")
    out.setdefault("error_class", None)
    for k, v in meta.items():
        out.setdefault(k, v)
    out["run_id"] = run_id
    out["isolation"] = isolation
    out["time"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return out


def _shape_label(r) -> str:
    """Compact shape of a row or shape dict for the summary tables, e.g. 'd128 s2048 causal'; GQA, a window and a
    packed batch add Shape.label's pieces ('h32/8', 'w1024,0', 'varlen:random'), so reach shapes stand apart."""
    from experiments.shapes import label_pieces

    s = r.get("seqlen_q")
    p = label_pieces(r)
    if "hdim" not in p and s is None:
        return "-"
    gqa = [p["heads"]] if "/" in p.get("heads", "") else []
    return " ".join([p.get("hdim", "d?"), f"s{s}", *(["causal"] if r.get("causal") else []), *gqa,
                     *(p[k] for k in ("window", "varlen") if k in p)])


def _table(index: list[str], columns: list[str], cell, corner: str = "") -> str:
    """Plain-text table: ``cell(i, c)`` gives the text of each cell."""
    grid = [[corner, *columns]] + [[i, *(cell(i, c) for c in columns)] for i in index]
    widths = [max(len(str(r[k])) for r in grid) for k in range(len(grid[0]))]
    return "\n".join("  ".join(str(v).rjust(w) if k else str(v).ljust(w) for k, (v, w) in enumerate(zip(r, widths)))
                     for r in grid)


def _job_label(r: dict) -> str:
    return f"{r.get('backend')} [{r.get('variant')}] {_shape_label(r)}"


def _reasons(rows: list[dict], max_jobs: int = 3) -> list[str]:
    """Each distinct (status/error_class, reason) once, in full, with how many jobs gave it and which."""
    groups: dict[tuple, dict[str, str]] = {}
    for r in rows:
        key = (r.get("error_class") or r.get("status"), str(r.get("reason") or "(no reason recorded)"))
        groups.setdefault(key, {}).setdefault(str(r.get("job_key")), _job_label(r))
    out = []
    for i, ((cls, reason), jobs) in enumerate(groups.items(), 1):
        labels = list(jobs.values())
        more = f", +{len(labels) - max_jobs} more" if len(labels) > max_jobs else ""
        out.append(f"  [{i}] {cls}, {len(labels)} job{'s' * (len(labels) != 1)}: {'; '.join(labels[:max_jobs])}{more}")
        out += [f"      {line}" for line in reason.splitlines() or [""]]
    return out


def summarize(rows: list[dict]) -> str:
    """Rows by backend x status, failures by error class, median TFLOP/s per shape x backend (timed rows)."""
    if not rows:
        return "no rows"
    by = Counter((str(r.get("backend")), str(r.get("status"))) for r in rows)
    backends = sorted({b for b, _ in by})
    statuses = [s for s in ("ok", "skip", "fail") if any(st == s for _, st in by)]
    statuses += sorted({st for _, st in by} - set(statuses))
    parts = ["rows by backend and status:", _table(backends, statuses, lambda b, st: by[(b, st)], "backend")]
    fails = [r for r in rows if r.get("status") == "fail"]
    if fails:
        classes = Counter(str(r.get("error_class")) for r in fails)
        parts += ["failures by error_class:", _table(sorted(classes), ["rows"], lambda c, _: classes[c], "class")]
        parts += ["failure reasons (each in full, once):", *_reasons(fails)]
    if rows and all(r.get("status") == "skip" for r in rows):
        parts += ["every row is a skip; reasons:", *_reasons(rows)]
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.get("metric") in ("time_ms", "stream_time_ms") and r.get("status") == "ok" and r.get("tflops") is not None:
            v = r.get("variant")
            who = r.get("backend") if v in (None, "default", "peer") else f"{r.get('backend')}[{v}]"
            cells.setdefault((f"{_shape_label(r)} {r.get('mode')}", str(who)), []).append(float(r["tflops"]))
    if cells:
        shapes, whos = list(dict.fromkeys(k[0] for k in cells)), sorted({k[1] for k in cells})

        def med(a, b):
            xs = cells.get((a, b) if a in shapes else (b, a))
            return f"{statistics.median(xs):.1f}" if xs else "-"

        if len(whos) > len(shapes):  # keep the longer list down the page
            parts += ["median TFLOP/s (backend x shape):", _table(whos, shapes, med, "backend")]
        else:
            parts += ["median TFLOP/s (shape x backend):", _table(shapes, whos, med, "shape")]
    return "\n".join(parts)


# ---- the sweep -------------------------------------------------------------------------------
def results_root(cfg: dict) -> Path:
    """``results_dir`` resolved against the directory the command was started from (never Hydra's run dir)."""
    base = os.getcwd()
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.utils import get_original_cwd

        if HydraConfig.initialized():
            base = get_original_cwd()
    except ImportError:
        pass
    p = Path(cfg.get("results_dir") or "results")
    return p if p.is_absolute() else Path(base) / p


def _progress(items, enabled: bool, desc: str):
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(items, desc=desc, unit="job", dynamic_ncols=True)
        except ImportError:
            pass
    return items


def _redo(rerun, keyed, store, path, name, out) -> set:
    """The finished jobs to time again: all of them (rerun=true, e.g. after a default changed: the job dict, so its
    key, names the config as written, not what it resolves to), those with rows on a kernel config that today's
    defaults no longer compile (rerun=stale, kernels/staleness.py), or none."""
    done = {k for k, _ in keyed if store.is_done(k)}
    if rerun == "stale":
        from kernels.staleness import stale_job_keys

        redo = stale_job_keys(read_rows(path)) & done
        print(f"{name}: rerun=stale: {len(redo)} of {len(done)} finished jobs were timed on a kernel config that "
              f"today's defaults no longer compile" + ("; timing them again (old rows replaced as new ones are "
                                                       "written)" if redo else ""), file=out)
        return redo
    if rerun and done:
        print(f"{name}: rerun=true: timing {len(done)} finished jobs again (each job's old rows are replaced when "
              f"its new ones are written)", file=out)
    return done if rerun else set()


def run_sweep(cfg: dict, out=sys.stdout) -> int:
    """Run the experiment in ``cfg``; returns the exit code: 0, 1 (stopped by a CUDA fault, or fail_on_error and a
    failure), 130 (Ctrl-C: the finished jobs are kept, a rerun resumes)."""
    exp = cfg["experiment"]
    name = exp["name"]
    if exp.get("pointer"):
        raise SweepError(f"experiment={name!r} is a pointer ({dict(exp['pointer'])}); run.py resolves it, "
                         f"or pass experiment=<one of them>")
    jobs = expand_jobs(cfg)
    keyed = list({job_key(j): j for j in jobs}.items())  # identical jobs run once
    path = results_root(cfg) / name / "rows.jsonl"
    store = ResultStore(path)
    retry = bool(cfg.get("retry_failed", False))
    if retry:
        dropped = store.drop_jobs(store.failed_keys() & {k for k, _ in keyed})
        if dropped:
            print(f"{name}: retry_failed=true: removed {dropped} fail rows to rerun their jobs", file=out)
    rerun = machine_skips(path, {k for k, _ in keyed})
    if rerun:
        dropped = store.drop_jobs(rerun)
        print(f"{name}: {len(rerun)} jobs were skipped on a machine without CUDA; this one has CUDA: running them "
              f"again ({dropped} skip rows replaced)", file=out)
    redo = _redo(cfg.get("rerun", False), keyed, store, path, name, out)
    todo = [(k, j) for k, j in keyed if k in redo or not store.is_done(k)]
    runners = {**RUNNERS, **dict(exp.get("runners") or {})}
    for kind in sorted({j.get("kind") for _, j in todo}):
        get_runner(kind, runners)  # fail fast, in one line, on a kind nobody runs or a runner that is missing
    isolation = str(cfg.get("isolation", "auto"))
    timeout = float(cfg.get("job_timeout_s", 600))
    executor = make_executor(isolation, runners, exp.get("imports") or (), timeout) if todo else None
    mode = executor.mode if executor else isolation
    print(f"{name}: {len(keyed)} jobs, {len(keyed) - len(todo)} already done, running {len(todo)} "
          f"(isolation={mode}, job_timeout_s={timeout:g}) -> {path}", file=out, flush=True)
    run_id = uuid.uuid4().hex[:12]
    counts: Counter = Counter()
    stopped, finished = None, 0
    try:
        meta = executor.metadata() if executor else {}
        bar = _progress(todo, bool(cfg.get("progress", True)), name)
        for key, job in bar:
            try:
                rows = executor.run(job)
            except CudaContextPoisoned as e:
                rows, stopped = e.args[0], "a CUDA fault poisoned this process (isolation=inline)"
            if not rows:
                rows = [failure_row(job, "error", f"runner for kind={job.get('kind')!r} returned no rows")]
            if key in redo:
                store.drop_jobs({key})
            store.append_job([stamp(r, job, key, meta, run_id, mode) for r in rows])
            finished += 1
            counts.update(r.get("status") or "?" for r in rows)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix({k: counts[k] for k in ("ok", "skip", "fail") if counts[k]}, refresh=False)
            if stopped:
                break
    except KeyboardInterrupt:  # Ctrl-C: finished jobs are on disk; the interrupted one left no row
        stopped = "interrupted"
    finally:
        if executor:
            getattr(executor, "abort", executor.close)() if stopped == "interrupted" else executor.close()
    if stopped == "interrupted":
        print(f"\n{name}: interrupted after {finished} of {len(todo)} jobs; rerun the same command to resume",
              file=out, flush=True)
        return 130
    keys = {k for k, _ in keyed}
    rows = [r for r in read_rows(path) if r.get("job_key") in keys]
    print(summarize(rows), file=out)
    if rows and all(r.get("status") == "skip" for r in rows):
        print(f"{name}: nothing ran here. {_runs_here()}", file=out)
    if stopped:
        print(f"{name}: stopped early: {stopped}; rerun to resume (isolation=process survives faults)", file=out)
    if exp.get("finalize") and rows:
        _finalize(exp["finalize"], rows, path.parent, out)
    n_fail = sum(r.get("status") == "fail" for r in rows)
    if n_fail:
        print(f"{name}: {n_fail} fail rows (fail_on_error={bool(cfg.get('fail_on_error', False))})", file=out)
    if stopped or (n_fail and cfg.get("fail_on_error", False)):
        return 1
    return 0


def machine_skips(path: Path, keys: set[str]) -> set[str]:
    """Jobs whose skip rows were recorded without a GPU (``gpu_name`` null), when this machine has CUDA."""
    from experiments.isolation import cuda_available

    if not (Path(path).exists() or has_archive(path)) or not cuda_available():
        return set()
    return {r["job_key"] for r in read_rows(path)
            if r.get("job_key") in keys and r.get("status") == "skip" and r.get("gpu_name") is None}


def _runs_here() -> str:
    from experiments.here import runs_here_line

    return runs_here_line(str(Path(__file__).resolve().parents[1] / "conf")) + " (python run.py --help lists them)"


def _finalize(target: str, rows: list[dict], outdir: Path, out) -> None:
    import pandas as pd

    written = load_target(target)(pd.DataFrame(rows), outdir)  # experiments never import analysis
    if written:
        print(f"finalize: wrote {written}", file=out)


# ---- bench / check: one backend, the shape(s) of the shape group ----------------------------
def run_quick(cfg: dict, cmd: str, out=sys.stdout) -> int:
    """``bench`` (time) or ``check`` (correctness) of ``cfg.backend`` on each shape of ``cfg.shape``: a progress line
    per shape, then the rows as a table whose reasons are printed in full once below it."""
    import time

    from experiments.backends import get_backend

    bname = cfg["backend"]["name"]
    _check_backends([bname])
    ok, why = get_backend(bname).available()
    if not ok:
        print(f"{cmd} {bname}: not available here ({why}); every row will be a skip. {_runs_here()}", file=out)
    runners = {**RUNNERS}
    get_runner("attn", runners)
    shapes = expand_shapes(cfg["shape"])
    executor = make_executor(str(cfg.get("isolation", "auto")), runners, (), float(cfg.get("job_timeout_s", 600)))
    rows = []
    try:
        for n, shape in enumerate(shapes, 1):
            job = {"kind": "attn", "experiment": cmd, "backend": bname, "variant": "cli",
                   "config": _clean_config(cfg["backend"].get("config")), "shape": shape,
                   "modes": list(cfg.get("modes") or ["fwd"]), "check": cmd == "check",
                   "bench": dict(cfg.get("bench") or {}) if cmd == "bench" else None}
            label = f"[{n}/{len(shapes)}] {cmd} {bname} {_shape_label(shape)} b{shape['batch']} h{shape['heads']}"
            if cfg.get("progress", True):
                print(f"{label} ...", end="", file=out, flush=True)
            t0 = time.perf_counter()
            new = executor.run(job)
            rows += [{**r, "job_key": f"shape{n}"} for r in new]
            if cfg.get("progress", True):
                st = Counter(r.get("status") for r in new)
                print(f" {time.perf_counter() - t0:.1f} s ({', '.join(f'{v} {k}' for k, v in st.items())})",
                      file=out, flush=True)
    except KeyboardInterrupt:
        print(f"\n{cmd} {bname}: interrupted after {len({r['job_key'] for r in rows})} of {len(shapes)} shapes",
              file=out, flush=True)
        getattr(executor, "abort", executor.close)()
        return 130
    finally:
        executor.close()
    reasons = list(dict.fromkeys(str(r["reason"]) for r in rows if r.get("reason")))
    cols = ["mode", "metric", "value", "tflops", "status", "error_class", "reason"]

    def cell(i, c):
        v = rows[int(i.split(":")[0])].get(c)
        if c == "reason":
            return f"[{reasons.index(str(v)) + 1}]" if v else ""
        return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    labels = [f"{k}: {_shape_label(r)}" for k, r in enumerate(rows)]
    text = f"{cmd} {bname}:\n" + (_table(labels, cols, cell, "#: shape") if rows else "no rows")
    if reasons:
        text += "\nreasons:\n" + "\n".join(f"  [{i}] " + r.replace("\n", "\n      ") for i, r in enumerate(reasons, 1))
    print(text, file=out)
    return 1 if any(r.get("status") == "fail" for r in rows) else 0
