"""Hydra composition: every experiment composes, the three launchers resolve to their classes, comma lists
become a multirun (and one really runs through the basic launcher)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.plugins.launcher import Launcher
from hydra.utils import get_class

import run
from experiments.results import read_rows

ROOT = Path(__file__).resolve().parents[1]
# conf/hydra/launcher/submitit_*.yaml deliberately extend the plugin's schemas of the same name
pytestmark = pytest.mark.filterwarnings("ignore:(?s).*validated against ConfigStore schema:UserWarning")
LAUNCHERS = {
    "basic": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "submitit_local": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
}


def _compose(*overrides, hydra_cfg=False):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_launchers_compose_and_resolve(launcher):
    cfg = _compose(f"hydra/launcher={launcher}", "experiment=fwd_peers", hydra_cfg=True)
    target = cfg.hydra.launcher._target_
    assert target == LAUNCHERS[launcher]
    assert issubclass(get_class(target), Launcher)  # the plugin is installed and importable
    if launcher.startswith("submitit"):
        assert cfg.hydra.launcher.gpus_per_node == 1 and cfg.hydra.launcher.timeout_min >= 60
    assert cfg.hydra.job.chdir is False


def test_launcher_choices_are_known_to_run_py():
    assert set(run.group_options("hydra/launcher")) == set(LAUNCHERS)


@pytest.mark.parametrize("name", [n for n in run.group_options("experiment") if n != "default"])
def test_every_experiment_composes(name):
    cfg = _compose(f"experiment={name}")
    assert cfg.experiment.name == name
    from experiments.runners import RUNNERS

    assert cfg.experiment.kind in RUNNERS  # a kind some runner runs


def test_fwd_peers_composes_with_paper_grid():
    cfg = _compose("experiment=fwd_peers")
    assert cfg.shape.grid.total_tokens == 32768 and cfg.shape.grid.hidden == 2048
    assert list(cfg.experiment.modes) == ["fwd"] and "fa4" in cfg.experiment.backends


def test_comma_list_becomes_multirun(capsys):
    args = run.prepare("sweep", ["experiment=fwd_ablation", "shape=small,hdim128"])
    assert "--multirun" in args and "cmd=sweep" in args
    assert "--multirun" not in run.prepare("sweep", ["experiment=fwd_ablation", "experiment.modes=[fwd,bwd]"])
    assert "--multirun" in run.prepare("sweep", ["experiment=numerics", "job_timeout_s=range(10,30,10)"])


def test_default_experiment_resolves_on_this_machine(capsys):
    import torch

    args = run.prepare("sweep", [])
    line = capsys.readouterr().out.strip()
    if torch.cuda.is_available():
        assert "experiment=fwd_peers" in args and "fwd_peers" in line
    else:
        assert "experiment=numerics" in args
        assert line == "no CUDA device: running the CPU `numerics` experiment (choose with experiment=<name>)"
    assert "experiment=bwd_peers" in run.prepare("sweep", ["experiment=bwd_peers"])


def test_multirun_through_run_py(tmp_path):
    """`key=a,b` on the command line runs one Hydra job per value; both write rows to the same store."""
    args = [sys.executable, str(ROOT / "run.py"), "sweep", "experiment=fault_cpu", "shape=cpu",
            "shape.grid.seqlens=[64]", "experiment.backends=[reference]", "experiment.job_params.sleep_s=0,0.01",
            "isolation=inline", "progress=false", f"results_dir={tmp_path}", f"hydra.sweep.dir={tmp_path}/multirun"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "#0 : " in done.stdout + done.stderr and "#1 : " in done.stdout + done.stderr  # Hydra's job lines
    rows = read_rows(tmp_path / "fault_cpu" / "rows.jsonl")
    assert len(rows) == 4 and len({r["job_key"] for r in rows}) == 4  # 2 shapes x 2 sleep values


def test_submitit_local_multirun_runs(tmp_path):
    """The submitit_local launcher really runs the jobs (in their own processes); SLURM is only composed."""
    args = [sys.executable, str(ROOT / "run.py"), "sweep", "experiment=fault_cpu", "shape=cpu",
            "shape.grid.seqlens=[64]", "experiment.backends=[reference]", "experiment.job_params.sleep_s=0,0.01",
            "isolation=inline", "progress=false", "hydra/launcher=submitit_local", "hydra.launcher.gpus_per_node=0",
            f"results_dir={tmp_path}", f"hydra.sweep.dir={tmp_path}/multirun"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Submitit 'local' sweep output dir" in done.stdout + done.stderr
    rows = read_rows(tmp_path / "fault_cpu" / "rows.jsonl")
    assert len(rows) == 4 and len({r["job_key"] for r in rows}) == 4


def test_hydra_flags_keep_their_values():
    assert run.split_flags(["--cfg", "job", "shape=small", "-p", "shape", "--info", "defaults", "-m", "x=1"]) == (
        ["--cfg", "job", "-p", "shape", "--info", "defaults", "-m"], ["shape=small", "x=1"])
    args = run.prepare("sweep", ["experiment=fwd_ablation", "shape=small,cpu", "--cfg", "job"])
    assert "--multirun" not in args and args[:2] == ["--cfg", "job"]


@pytest.mark.parametrize("name", ["fa4", "fa4_model"])
def test_backend_config_lists_every_attnconfig_field(name):
    """`backend.config.<field>=...` works for every switch without a `+` (and a new field is not forgotten)."""
    import dataclasses

    from kernels.config import AttnConfig

    cfg = _compose(f"backend={name}")
    assert set(cfg.backend.config) == {f.name for f in dataclasses.fields(AttnConfig)}
    assert all(v is None for v in cfg.backend.config.values())  # null = the per-arch default
