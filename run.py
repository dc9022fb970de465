#!/usr/bin/env python
"""fa4lab entry point: ``python run.py <sweep|bench|check|tune|roofline|figures> [hydra overrides]``.

- ``sweep``    runs an experiment (conf/experiment/; ``experiment=<name>``), rows to results/<experiment>/.
               Without ``experiment=`` it runs ``numerics`` on a machine without CUDA, ``fwd_peers`` with CUDA.
               An override with a comma list (``key=a,b``) or a sweep function runs a Hydra multirun.
- ``bench`` / ``check``  time / check one backend (``backend=<name>``) on the shape(s) of ``shape=`` (default one).
- ``tune``     searches tile sizes, stages, register split, pingpong, exp2 fraction per (hdim, causal), each
               candidate timed round-robin against the default (experiments/tune.py); winners to conf/tuned/<arch>.yaml.
- ``roofline`` / ``figures``  hand the remaining arguments to analysis.roofline.main / analysis.figures.main.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CONF = ROOT / "conf"
SUBCOMMANDS = ("sweep", "bench", "check", "tune", "roofline", "figures")
DELEGATES = {"roofline": "analysis.roofline:main", "figures": "analysis.figures:main"}
CHECKED_GROUPS = ("experiment", "backend", "shape", "bench", "hydra/launcher")
HYDRA_LAUNCHERS = ("basic",)  # provided by Hydra itself; the submitit ones have files in conf/hydra/launcher/
HYDRA_VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun", "--shell-completion", "-sc")
HYDRA_INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
USAGE = f"usage: python run.py {{{'|'.join(SUBCOMMANDS)}}} [key=value ...]  (Hydra overrides; see README.md)"
COMMANDS = {"sweep": "run an experiment (experiment=<name>); rows to <results_dir>/<experiment>/rows.jsonl, resumable",
            "bench": "time one backend (backend=<name>) on the shape(s) of shape= (default: one mid-size shape)",
            "check": "check one backend against the fp32 reference (DESIGN.md rule) on the shape(s) of shape=",
            "tune": "search the kernel-shaping AttnConfig fields per (hdim, causal) against the default, within budget= "
                    "seconds (resumable); winners to conf/tuned/<arch>.yaml; dry_run=true lists the candidates",
            "roofline": "the roofline model (analysis/roofline.py; `python run.py roofline --help` for its flags)",
            "figures": "the figures (analysis/figures.py; `python run.py figures --help` for its flags)"}

# conf/hydra/launcher/submitit_*.yaml extend the plugin's schemas of the same name on purpose.
warnings.filterwarnings("ignore", message=r"(?s).*validated against ConfigStore schema")

_STATE = {"cmd": "sweep", "exit": 0}


def die(msg: str, code: int = 2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def group_options(group: str) -> list[str]:
    names = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    if group == "hydra/launcher":
        names = sorted(set(names) | set(HYDRA_LAUNCHERS))
    return names


def _choices(override) -> list[str] | None:
    """The literal value(s) of a parsed override, or None for sweep functions (glob, range...)."""
    from hydra.core.override_parser.types import ChoiceSweep

    if override.is_delete():
        return None
    v = override.value()
    if isinstance(v, ChoiceSweep):
        return [str(x) for x in v.list]
    if isinstance(v, (str, int, float)):
        return [str(v)]
    return None


def _default_experiment() -> tuple[str, str]:
    """(experiment, one-line note) that the `default` pointer resolves to on this machine."""
    import yaml

    pointer = yaml.safe_load((CONF / "experiment" / "default.yaml").read_text())["experiment"]["pointer"]
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        return pointer["cuda"], f"CUDA device found: running the `{pointer['cuda']}` experiment (GPU)"
    return pointer["cpu"], f"no CUDA device: running the CPU `{pointer['cpu']}` experiment (choose with experiment=<name>)"


def split_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """Hydra's own flags (with their values: ``--cfg job``, ``-cn x``, ``--info defaults``) vs overrides."""
    flags, overrides, i = [], [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            overrides.append(a)
        elif a in HYDRA_VALUE_FLAGS and i + 1 < len(args):
            flags += [a, args[i + 1]]
            i += 1
        elif a in ("--info", "-i") and i + 1 < len(args) and args[i + 1] in HYDRA_INFO_TOPICS:
            flags += [a, args[i + 1]]
            i += 1
        else:
            flags.append(a)
        i += 1
    return flags, overrides


def prepare(cmd: str, args: list[str]) -> list[str]:
    """Validate group choices, resolve the default experiment, add --multirun when an override sweeps."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    flags, overrides = split_flags(args)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        die(f"bad override: {str(e).splitlines()[0]}")
    sweeping = False
    exp_index = None
    for i, o in enumerate(parsed):
        sweeping = sweeping or o.is_sweep_override()
        key = o.key_or_group
        if key == "experiment":
            exp_index = i
        if key in CHECKED_GROUPS:
            known = group_options(key)
            for v in _choices(o) or []:
                if v not in known:
                    die(f"{key}={v!r} is unknown; supported: {', '.join(known)}")
    if cmd == "sweep":
        if exp_index is None or _choices(parsed[exp_index]) == ["default"]:
            name, note = _default_experiment()
            print(note, flush=True)
            ov = f"experiment={name}"
            if exp_index is None:
                overrides.append(ov)
            else:
                overrides[exp_index] = ov
    exclusive = {"-m", "--multirun", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}
    if sweeping and not (exclusive & set(flags)):
        flags.append("--multirun")
    if not ({"--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--help", "-h", "--hydra-help"} & set(flags)):
        from experiments.cli import precheck

        err = precheck(str(CONF), overrides + [f"cmd={cmd}"])
        if err:
            die(err)
    return flags + overrides + [f"cmd={cmd}"]


def delegate(cmd: str, args: list[str]) -> int:
    from experiments.runners import RunnerError, load_target

    try:
        fn = load_target(DELEGATES[cmd])
    except RunnerError as e:
        die(f"{cmd}: {DELEGATES[cmd]} is not available ({e})")
    return int(fn(args) or 0)


def _task(cfg) -> None:
    """Hydra task: one composed config (one job of a multirun)."""
    from omegaconf import OmegaConf

    from experiments.cli import check_errors
    from experiments.config_check import check_run_config
    from experiments.sweep import run_quick, run_sweep

    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        check_run_config(plain)  # again per job: a multirun's other values
        if plain["cmd"] == "tune":
            from experiments.tune import run_tune

            code = run_tune(plain)
        else:
            code = run_sweep(plain) if plain["cmd"] == "sweep" else run_quick(plain, plain["cmd"])
    except check_errors() as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    _STATE["exit"] = max(_STATE["exit"], code)
    if code == 130:  # Ctrl-C inside the sweep (already reported): stop a multirun too
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _STATE["exit"] = 0
    if not argv:
        print(f"{USAGE}\n`python run.py --help` lists the commands, experiments, backends, shapes and bench presets")
        return 2
    if argv[0] in ("-h", "--help", "help"):
        from experiments.cli import help_text

        print(help_text(str(CONF), USAGE, COMMANDS))
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in SUBCOMMANDS:
        die(f"unknown subcommand {cmd!r}; supported: {', '.join(SUBCOMMANDS)}")
    if cmd in DELEGATES:
        return delegate(cmd, rest)
    import hydra

    hydra_args = prepare(cmd, rest)
    entry = hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")(_task)
    sys.argv = [sys.argv[0], *hydra_args]
    try:
        entry()
    except KeyboardInterrupt:
        if _STATE["exit"] != 130:
            print("\ninterrupted; rerun the same command to resume (finished jobs are kept)", file=sys.stderr)
        return 130
    return _STATE["exit"]


if __name__ == "__main__":
    sys.exit(main())
