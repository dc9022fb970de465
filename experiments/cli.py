"""What run.py does before Hydra runs a job: compose the config once and check it (one error line, exit 2).

``precheck(conf_dir, overrides)`` composes ``conf/config.yaml`` with the command line's overrides (a sweep
override at its first value), turns a Hydra composition error into one line that lists the keys that do
exist, and runs experiments.config_check on the result. It returns the error line, or None when all is well.
"""
from __future__ import annotations

import re


def check_errors() -> tuple[type, ...]:
    """Exception types that mean "this config cannot run" (one line each, no traceback)."""
    from experiments.backends import UnknownBackendError
    from experiments.config_check import RunConfigError
    from experiments.isolation import WorkerSetupError
    from experiments.runners import RunnerError
    from experiments.shapes import ShapeError
    from experiments.sweep import SweepError
    from experiments.tune import TuneError
    from kernels.config import ConfigError

    return (RunConfigError, SweepError, UnknownBackendError, ConfigError, RunnerError, WorkerSetupError, ShapeError,
            TuneError)


def first_values(overrides: list[str]) -> list[str] | None:
    """The overrides with each sweep (``key=a,b``) at its first value; None if a sweep is not a plain list."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    out = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if not o.is_sweep_override():
            out.append(o.input_line)
            continue
        v = o.value()
        if not isinstance(v, ChoiceSweep) or not v.list or not isinstance(v.list[0], (str, int, float, bool)):
            return None
        first = v.list[0]
        out.append(f"{o.get_key_element()}={str(first).lower() if isinstance(first, bool) else first}")
    return out


def _compose(conf_dir: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _unknown_key_line(conf_dir: str, overrides: list[str], bad_override: str, full_key: str) -> str:
    """``<key>: unknown key; keys of <parent>: ...`` from a config composed without the bad override."""
    parent, _, name = full_key.rpartition(".")
    line = f"{full_key}: unknown key"
    try:
        from omegaconf import OmegaConf

        rest = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != bad_override]
        node = _compose(conf_dir, rest)
        node = OmegaConf.select(node, parent) if parent else node
    except Exception:  # another bad override: the line without the list
        return line + f" (+{bad_override}=<value> adds a new key)"
    if node is None:
        line += f"; {parent} is null with these choices"
        if parent == "backend.config":
            line += " (this backend takes no AttnConfig)"
    elif hasattr(node, "keys"):
        line += f"; keys of {parent or 'the top level'}: {', '.join(str(k) for k in node.keys())}"
    return line if parent == "backend.config" else line + f" (+{bad_override}=<value> adds a new key)"


def hydra_error_line(conf_dir: str, overrides: list[str], e: Exception) -> str:
    """One line for a Hydra composition error."""
    cause = str(e.__cause__ or "")
    key = re.search(r"full_key: (\S+)", cause)
    over = re.search(r"Could not override '([^']+)'", str(e))
    if key and over and "not in struct" in cause:
        return _unknown_key_line(conf_dir, overrides, over.group(1), key.group(1))
    return "; ".join(ln.strip() for ln in str(e).splitlines() if ln.strip() and "provider=" not in ln)


def precheck(conf_dir: str, overrides: list[str]) -> str | None:
    """Compose and check; the one-line error (without the ``error:`` prefix) or None."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from experiments.config_check import check_run_config

    plain = first_values(overrides)
    if plain is None:
        return None  # range()/glob() sweeps: each job is checked when it starts
    try:
        cfg = _compose(conf_dir, plain)
    except HydraException as e:
        return hydra_error_line(conf_dir, plain, e)
    try:
        check_run_config(OmegaConf.to_container(cfg, resolve=True))
    except check_errors() as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


# ---- --help -------------------------------------------------------------------------------------
def blurb(path) -> str:
    """The first sentence of a conf YAML's leading comment (its one-line description)."""
    from pathlib import Path

    text = ""
    for line in Path(path).read_text().splitlines():
        if not line.startswith("#"):
            break
        part = line.lstrip("# ").rstrip()
        if not part or part.startswith("@package"):
            continue
        text = f"{text} {part}".strip()
        if part.endswith((".", ":")) or ". " in part:
            break
    head, dot, _ = text.partition(". ")
    return (head + dot).strip().rstrip(":")


def help_text(conf_dir: str, usage: str, commands: dict[str, str]) -> str:
    """``python run.py --help``: commands, then every choice of experiment/backend/shape/bench with a line each."""
    from pathlib import Path

    from experiments.here import backends_here, experiments_here, runs_here_line

    def rows(items):
        width = max(len(k) for k, _ in items)
        return [f"  {k.ljust(width)}  {v}" for k, v in items]

    backends = backends_here()
    avail = {n for n, _, ok in backends if ok and Path(conf_dir, "backend", f"{n}.yaml").exists()}
    runnable = experiments_here(conf_dir, avail)
    group = lambda g: sorted(Path(conf_dir, g).glob("*.yaml"))  # noqa: E731
    exps = [(p.stem, blurb(p) + ("" if runnable.get(p.stem, True) else "  [nothing runs here: needs CUDA]"))
            for p in group("experiment")]
    bks = [(p.stem, blurb(p) + ("  [needs CUDA]" if dict((n, c) for n, c, _ in backends).get(p.stem) else "  [CPU ok]"))
           for p in group("backend")]
    out = [usage, "", "commands:", *rows(list(commands.items())),
           "", "experiment=<name>  (sweep; default: numerics without CUDA, fwd_peers with CUDA)", *rows(exps),
           "", "backend=<name>  (bench, check; default fa4)", *rows(bks),
           "", "shape=<name>  (the shapes a run uses; each experiment picks its own default)",
           *rows([(p.stem, blurb(p)) for p in group("shape")]),
           "", "bench=<name>  (timing parameters; default: default)", *rows([(p.stem, blurb(p)) for p in group("bench")]),
           "", "other keys: results_dir=<folder>  isolation=auto|process|inline  job_timeout_s=<s>  retry_failed=true  rerun=true|stale  "
               "fail_on_error=true  progress=false  modes=[fwd,bwd]",
           "Hydra: key=a,b runs a multirun; hydra/launcher=basic|submitit_local|submitit_slurm; see README.md", "",
           runs_here_line(conf_dir)]
    return "\n".join(out)
