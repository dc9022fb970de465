"""tests/dsl_subprocess.py (the SASS tests' compile subprocesses as forks of a warm worker) does what a fresh
``python -c`` does: the same files with the same SASS, a failing script is a CalledProcessError, a monkeypatch stays in
its own script, and a repeat is a copy of the first run's files."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import dsl_subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(dump):
    return dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=str(dump),
                CUTE_DSL_NO_CACHE="1")


def _code(prelude=""):
    return textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from kernels import AttnConfig
        from kernels.sm90.backward import compile_backward
    """) + prelude + 'compile_backward(AttnConfig(deterministic=True), "bfloat16", 64, False)\n'


def _sass_of(dump):
    from kernels.sm90.sass import disassemble, find_nvdisasm

    files = sorted(os.listdir(dump))
    if find_nvdisasm() is None:
        return files, None
    return files, [disassemble(str(dump / f)) for f in files if f.endswith(".cubin")]


@pytest.mark.compile
def test_fork_gives_what_a_fresh_process_gives(tmp_path):
    fresh, fork, again = (tmp_path / n for n in ("fresh", "fork", "again"))
    for d in (fresh, fork, again):
        d.mkdir()
    subprocess.run([sys.executable, "-c", _code()], check=True, env=_env(fresh), timeout=600)
    dsl_subprocess.run(_code(), _env(fork), timeout=600)
    files, sass = _sass_of(fresh)
    assert len([f for f in files if f.endswith(".cubin")]) == 3  # pre, main, post
    assert _sass_of(fork) == (files, sass)
    dsl_subprocess.run(_code(), _env(again), timeout=600)  # a repeat: the first run's files
    assert _sass_of(again) == (files, sass)


def test_a_scripts_monkeypatch_stays_in_its_own_child(tmp_path):
    leak = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        import kernels.sm90.bwd as bwd
        assert getattr(bwd.FlashBwdSm90, "_patched_by_a_script", None) is None, "state leaked from an earlier script"
        bwd.FlashBwdSm90._patched_by_a_script = True
    """)
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        dsl_subprocess.run(leak + f"# run {i}\n", _env(d), timeout=600)  # (distinct scripts: no repeat)


def test_failures_and_exit_codes_are_called_process_errors(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as ei:
        dsl_subprocess.run("raise ValueError('boom')", _env(tmp_path), timeout=600)
    assert ei.value.returncode == 1 and "ValueError: boom" in ei.value.output
    with pytest.raises(subprocess.CalledProcessError) as ei:
        dsl_subprocess.run("import sys; sys.exit(3)", _env(tmp_path), timeout=600)
    assert ei.value.returncode == 3
    dsl_subprocess.run("print('fine')", _env(tmp_path), timeout=600)
