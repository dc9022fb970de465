"""Resume: a sweep killed with SIGKILL mid-way and rerun ends with every job's rows exactly once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from experiments.results import read_rows

ROOT = Path(__file__).resolve().parents[1]


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_kill_midway_then_rerun_has_no_duplicates(tmp_path):
    # 4 shapes x 2 backends = 8 jobs of ~0.4 s each, in a worker process (the GPU default)
    args = [sys.executable, str(ROOT / "run.py"), "sweep", "experiment=fault_cpu", "shape=cpu",
            "experiment.backends=[reference,fa4_model]", "experiment.job_params.sleep_s=0.4",
            "isolation=process", "progress=false", f"results_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra"]
    path = tmp_path / "fault_cpu" / "rows.jsonl"
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the killed driver's worker log folder stays in tmp_path
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while len(read_rows(path)) < 3:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "sweep too slow to produce 3 rows"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: its worker must notice and exit by itself
        proc.wait(10)
        deadline = time.time() + 15
        while _alive(proc.pid) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(proc.pid), "the worker outlived its killed driver"
    finally:
        if _alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    partial = read_rows(path)
    assert 3 <= len(partial) < 8
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"8 jobs, {len(partial)} already done, running {8 - len(partial)}" in done.stdout
    rows = read_rows(path)
    keys = [r["job_key"] for r in rows]
    assert len(rows) == 8 and len(set(keys)) == 8
    assert rows[: len(partial)] == partial  # rows already written are kept as they were
    assert {r["backend"] for r in rows} == {"reference", "fa4_model"} and all(r["status"] == "ok" for r in rows)
