"""run.py errors: an unknown subcommand, experiment, backend, shape or launcher is one line naming the argument
and the supported values; so are an unknown backend or a bad variant inside an experiment."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:(?s).*validated against ConfigStore schema:UserWarning")


def _error_line(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        run.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err  # one line
    assert err.startswith("error: ")
    return err


def test_unknown_subcommand(capsys):
    err = _error_line(capsys, ["frobnicate"])
    assert err == "error: unknown subcommand 'frobnicate'; supported: sweep, bench, check, tune, roofline, figures"


def test_unknown_experiment(capsys):
    err = _error_line(capsys, ["sweep", "experiment=nope"])
    assert "experiment='nope' is unknown; supported:" in err
    for name in ("bwd_ablation", "bwd_peers", "fault_demo", "fwd_ablation", "fwd_peers", "numerics"):
        assert name in err
    err = _error_line(capsys, ["sweep", "experiment=fwd_peers,nope"])  # in a multirun list too
    assert "experiment='nope' is unknown" in err


def test_unknown_backend_shape_launcher(capsys):
    err = _error_line(capsys, ["bench", "backend=nope"])
    assert "backend='nope' is unknown; supported:" in err and "sdpa_flash" in err and "fa4_model" in err
    err = _error_line(capsys, ["check", "shape=huge"])
    assert "shape='huge' is unknown; supported:" in err and "paper" in err
    err = _error_line(capsys, ["sweep", "hydra/launcher=condor"])
    assert "hydra/launcher='condor' is unknown; supported: basic, submitit_local, submitit_slurm" in err


def test_unknown_backend_inside_experiment_via_cli(tmp_path):
    """Through the real CLI (Hydra composes, the sweep expands): exit 2, one line listing the known backends."""
    done = subprocess.run([sys.executable, str(ROOT / "run.py"), "sweep", "experiment=fwd_peers",
                           "experiment.backends=[fa4,nope]", f"results_dir={tmp_path}",
                           f"hydra.run.dir={tmp_path}/hydra"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("error: backend='nope': unknown; known backends: ")
    assert "sdpa_cudnn" in lines[0]


def test_bad_variant_via_cli(capsys, tmp_path):
    err = _error_line(capsys, ["sweep", "experiment=fwd_ablation", "experiment.configs=[{name: x, config: {tile_m: 7}}]",
                               f"results_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra"])
    assert err == "error: variant 'x': tile_m=7: must be None (per-arch default) or an int in [64, 256], a multiple of 64"


def test_help_and_missing_subcommand(capsys):
    assert run.main(["--help"]) == 0
    assert "usage: python run.py {sweep|bench|check|tune|roofline|figures}" in capsys.readouterr().out
    assert run.main([]) == 2


def test_delegate_that_is_missing(capsys, monkeypatch):
    monkeypatch.setitem(run.DELEGATES, "figures", "analysis.no_such_module:main")
    err = _error_line(capsys, ["figures"])
    assert err.startswith("error: figures: analysis.no_such_module:main is not available")
