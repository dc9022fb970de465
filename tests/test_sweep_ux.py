"""Issue 13.3-13.4: failure reasons in full once, Ctrl-C stops cleanly and resumes, machine skips rerun where CUDA
now is, --help lists every choice, all-skip sweeps and bench/check say what would run here and show progress."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import run
from experiments import sweep
from experiments.results import ResultStore, read_rows
from experiments.sweep import run_quick, run_sweep, summarize

ROOT = Path(__file__).resolve().parents[1]
CALLS: list = []
pytestmark = pytest.mark.filterwarnings("ignore:(?s).*validated against ConfigStore schema:UserWarning")


def composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def cpu_sweep(tmp_path, *overrides: str) -> dict:
    return composed("experiment=fault_cpu", "shape=cpu", "isolation=inline", "progress=false",
                    f"results_dir={tmp_path}", "experiment.backends=[reference]", *overrides)


def interrupting_runner(job: dict) -> list[dict]:
    """Runs like the smoke runner, but the second call is a Ctrl-C."""
    from experiments.fault_backends import run_smoke_job

    CALLS.append(job["shape"]["seqlen_q"])
    if len(CALLS) == 2:
        raise KeyboardInterrupt
    return run_smoke_job(job)


def test_failure_reasons_in_full_once():
    reason = "ValueError: " + "x" * 400 + "\nsecond line of the message"
    rows = [{"job_key": str(i), "backend": "flex", "variant": "peer", "status": "fail", "error_class": "error",
             "reason": reason, "hdim": 64, "seqlen_q": 64 * (i + 1)} for i in range(5)]
    rows.append({"job_key": "t", "backend": "fa4", "variant": "default", "status": "fail", "error_class": "timeout",
                 "reason": "job exceeded job_timeout_s=600", "hdim": 128, "seqlen_q": 1024})
    text = summarize(rows)
    assert text.count(reason.splitlines()[0]) == 1 and "      second line of the message" in text
    assert "[1] error, 5 jobs: flex [peer] d64 s64; flex [peer] d64 s128; flex [peer] d64 s192, +2 more" in text
    assert "[2] timeout, 1 job: fa4 [default] d128 s1024" in text


def test_ctrl_c_stops_cleanly_and_a_rerun_resumes(tmp_path):
    CALLS.clear()
    cfg = cpu_sweep(tmp_path, "+experiment.runners.smoke=test_sweep_ux:interrupting_runner")
    out = io.StringIO()
    assert run_sweep(cfg, out=out) == 130
    assert "fault_cpu: interrupted after 1 of 4 jobs; rerun the same command to resume" in out.getvalue()
    path = tmp_path / "fault_cpu" / "rows.jsonl"
    assert len(read_rows(path)) == 1  # the interrupted job left no row
    out = io.StringIO()
    assert run_sweep(cfg, out=out) == 0
    assert "1 already done, running 3" in out.getvalue()
    assert len(read_rows(path)) == 4 and all(r["status"] == "ok" for r in read_rows(path))


@pytest.mark.slow
def test_ctrl_c_in_a_real_sweep_has_no_traceback(tmp_path):
    """SIGINT to the whole process group (what a terminal sends) while a worker runs a job."""
    cmd = [sys.executable, str(ROOT / "run.py"), "sweep", "experiment=fault_cpu", "isolation=process",
           "experiment.backends=[reference,fault_hang]", "experiment.job_params.sleep_s=0", "progress=false",
           "job_timeout_s=60", f"results_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra"]
    # a terminal's Ctrl-C reaches a sweep whose SIGINT is at its default; a test run from the background of a
    # non-interactive shell inherits SIGINT ignored, which the sweep would inherit too (and then never see it)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    path = tmp_path / "fault_cpu" / "rows.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (path.exists() and read_rows(path)):
        time.sleep(0.2)
    time.sleep(1.0)  # the worker is now inside fault_hang's job
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "interrupted after 1 of 8 jobs; rerun the same command to resume" in out
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert len(read_rows(path)) == 1


def test_machine_skips_rerun_where_cuda_now_is(tmp_path, monkeypatch):
    cfg = cpu_sweep(tmp_path)
    assert run_sweep(cfg, out=io.StringIO()) == 0
    path = tmp_path / "fault_cpu" / "rows.jsonl"
    rows = read_rows(path)
    # as if the first two jobs had been skipped on a CPU-only machine, the others on a GPU host
    for i, r in enumerate(rows):
        r.update(status="skip", reason="reference: no CUDA device", gpu_name=None if i < 2 else "NVIDIA H200")
    path.unlink()
    for r in rows:
        ResultStore(path).append_job([r])
    assert sweep.machine_skips(path, {r["job_key"] for r in rows}) == set()  # no CUDA here: nothing to rerun
    monkeypatch.setattr("experiments.isolation.cuda_available", lambda: True)
    out = io.StringIO()
    assert run_sweep(cfg, out=out) == 0
    assert "2 jobs were skipped on a machine without CUDA; this one has CUDA: running them again" in out.getvalue()
    after = {r["job_key"]: r for r in read_rows(path)}
    assert len(after) == 4
    assert [after[r["job_key"]]["status"] for r in rows] == ["ok", "ok", "skip", "skip"]


def test_help_lists_every_choice(capsys):
    assert run.main(["--help"]) == 0
    text = capsys.readouterr().out
    for group in ("experiment", "backend", "shape", "bench"):
        for p in (ROOT / "conf" / group).glob("*.yaml"):
            line = next((ln for ln in text.splitlines() if ln.strip().startswith(p.stem + " ")), None)
            assert line is not None and len(line.split(None, 1)[1]) > 20, (group, p.stem)
    for cmd in run.SUBCOMMANDS:
        assert f"\n  {cmd} " in text
    assert "[needs CUDA]" in [ln for ln in text.splitlines() if ln.strip().startswith("fa4 ")][0]
    assert "[CPU ok]" in [ln for ln in text.splitlines() if ln.strip().startswith("reference ")][0]
    assert "backends that run here:" in text.splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_all_skip_sweep_and_bench_say_what_runs_here(tmp_path):
    out = io.StringIO()
    assert run_sweep(cpu_sweep(tmp_path, "experiment.backends=[fa4]", "shape.grid.seqlens=[64]"), out=out) == 0
    text = out.getvalue()
    assert "every row is a skip; reasons:" in text and "fa4: no CUDA device" in text
    assert "nothing ran here. this machine has no CUDA device: backends that run here: fa4_model, reference" in text
    out = io.StringIO()
    assert run_quick(composed("cmd=bench", "shape=cpu", "isolation=inline", "backend=fa4"), "bench", out=out) == 0
    text = out.getvalue()
    assert text.startswith("bench fa4: not available here (fa4: no CUDA device")
    assert "[1/4] bench fa4 d64 s64 b4 h2 ..." in text and "[4/4] bench fa4 d64 s128 causal b2 h2 ..." in text
    assert text.count("fa4: no CUDA device (this backend runs CUDA kernels only)") == 2  # the header, the reasons
    assert "\nreasons:\n  [1] fa4: no CUDA device" in text


def test_shape_label_shows_gqa_window_and_varlen():
    from experiments.shapes import Shape

    plain = Shape(4, 2048, 2048, 16, 128, causal=True)
    assert sweep._shape_label(plain.to_dict()) == "d128 s2048 causal"  # plain shapes read as before
    assert sweep._shape_label({"hdim": 192, "hdim_v": 128, "seqlen_q": 1024}) == "d192/128 s1024"
    assert sweep._shape_label({"backend": "x"}) == "-"
    reach = Shape(1, 16384, 16384, 32, 128, causal=True, heads_kv=8, window=(1024, 0))
    assert sweep._shape_label(reach.to_dict()) == "d128 s16384 causal h32/8 w1024,0"
    vl = Shape(8, 2048, 2048, 16, 128, causal=True, varlen="random")
    assert sweep._shape_label(vl.to_dict()) == "d128 s2048 causal varlen:random"
    assert sweep._shape_label(vl.replace(varlen=[1000, 3096] + [2048] * 6).to_dict()).endswith(" varlen[8]")
    # the pieces are Shape.label's, and a table's NaN cells (pandas) count as unset
    assert "h32/8 d128 causal w1024,0" in reach.label()
    assert sweep._shape_label({**plain.to_dict(), "heads_kv": float("nan"), "window": float("nan")}) == \
        "d128 s2048 causal"
    rows = [{**s.to_dict(), "backend": "reference", "status": "ok", "metric": "time_ms", "mode": "fwd", "tflops": 1.0}
            for s in (plain, plain.replace(window=(256, 0)))]
    text = summarize(rows)  # a reach shape gets its own line of the TFLOP/s table
    assert "d128 s2048 causal fwd " in text and "d128 s2048 causal w256,0 fwd " in text
