"""What can run on this machine: which backends are available (and which need CUDA), which experiments have jobs
that run here. Used by ``python run.py --help`` and by a sweep whose rows are all skips."""
from __future__ import annotations


def backends_here() -> list[tuple[str, bool, bool]]:
    """(name, needs CUDA, available on this machine) for every registered backend."""
    from experiments.backends import BACKENDS, get_backend

    out = []
    for name in sorted(BACKENDS):
        b = get_backend(name)
        out.append((name, not b.cpu_capable, b.available()[0]))
    return out


def experiments_here(conf_dir: str, available: set[str]) -> dict[str, bool]:
    """Experiment name -> whether at least one of its jobs can run here (an expand hook, or a backend here)."""
    from pathlib import Path

    import yaml

    out = {}
    for p in sorted(Path(conf_dir, "experiment").glob("*.yaml")):
        exp = (yaml.safe_load(p.read_text()) or {}).get("experiment") or {}
        if exp.get("pointer"):
            continue
        names = set(exp.get("backends") or []) | set(exp.get("peers") or [])
        if exp.get("expand"):  # the hook's jobs say which backends they need (None: no backend, e.g. numerics)
            try:
                from experiments.runners import load_target

                names = {j.get("backend") for j in load_target(exp["expand"])(dict(exp.get("params") or {}))}
            except Exception:  # noqa: BLE001 -- a broken hook shows up when it runs, not in --help
                names = {None}
        out[p.stem] = None in names or bool(names & available)
    return out


def runs_here_line(conf_dir: str) -> str:
    """One line: what can run on this machine (CUDA or not)."""
    from experiments.isolation import cuda_available

    from pathlib import Path

    named = {p.stem for p in Path(conf_dir, "backend").glob("*.yaml")}  # the user-facing ones (not test fakes)
    avail = {n for n, _, ok in backends_here() if ok and n in named}
    exps = [e for e, ok in experiments_here(conf_dir, avail).items() if ok]
    where = "this machine has CUDA" if cuda_available() else "this machine has no CUDA device"
    return (f"{where}: backends that run here: {', '.join(sorted(avail)) or 'none'}; "
            f"experiments with jobs that run here: {', '.join(exps) or 'none'}")
