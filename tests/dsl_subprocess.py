"""``run(code, env, timeout)``: what ``subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=timeout)``
does for the SASS tests' CuTe DSL compile scripts, in a fresh fork of a process that has already imported the DSL and
``kernels`` (and the same compile asked twice in one session is compiled once).

The SASS tests compile in a subprocess so that ``CUTE_DSL_KEEP`` / ``CUTE_DSL_DUMP_DIR`` / ``CUTE_DSL_NO_CACHE`` (the DSL
reads them from its environment) put the cubins of exactly one compile into a directory of their own. A fresh interpreter
spends ~2.5 s of each ~4.5 s compile on starting Python and importing torch, the DSL and ``kernels``; here one worker
per environment does that once and forks a child per script: the child starts from the same imported, never-compiled
state (nothing compiled in the worker, so no compile cache, lru_cache or DSL state is inherited), runs the script with
``CUTE_DSL_DUMP_DIR`` pointing at the worker's scratch directory, and exits; the worker then moves what it wrote into
the script's ``CUTE_DSL_DUMP_DIR``. Same compiler, same inputs: the same cubins (checked: identical SASS). A script
that monkeypatches the kernels changes only its own child.

Scripts must not depend on running before ``kernels`` / ``cutlass`` are imported (none of the SASS tests' do); where
``os.fork`` is missing or the worker cannot start, ``run`` falls back to the plain subprocess.
Repeats: a script already run in this session with the same environment (its dump path aside) is not compiled again;
its files are copied (hard-linked) into the new dump directory.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_VOLATILE = ("CUTE_DSL_DUMP_DIR", "PYTEST_CURRENT_TEST")  # not part of a worker's / a repeat's key
_TAG = "@@dsl_subprocess@@ "

_WORKER = r"""
import atexit, json, os, shutil, sys, traceback
sys.path.insert(0, ROOT)
import cutlass, cutlass.cute  # noqa: E401,F401  (what every script imports: once, here)
import kernels, kernels.sm90.backward, kernels.sm90.bwd  # noqa: E401,F401
scratch = os.environ["CUTE_DSL_DUMP_DIR"]
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # stray prints of the worker never reach the reply channel
print(TAG + json.dumps({"ready": True}), file=reply, flush=True)
for line in sys.stdin:
    req = json.loads(line)
    dump = req["dump"]
    before = set(os.listdir(dump)) if dump and os.path.isdir(dump) else set()
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: a fresh process with the imports done
        rc = 1
        try:
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1); os.dup2(fd, 2); os.close(fd)
            os.chdir(req["cwd"])
            try:
                exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
                rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                rc = 1
            atexit._run_exitfuncs()
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    moved = []
    for f in sorted(os.listdir(scratch)):
        src = os.path.join(scratch, f)
        if dump:
            os.makedirs(dump, exist_ok=True)
            dst = os.path.join(dump, f)
            if os.path.isdir(dst) and not os.path.islink(dst):
                shutil.rmtree(dst)
            shutil.move(src, dst)
            moved.append(f)
        elif os.path.isdir(src):
            shutil.rmtree(src)
        else:
            os.remove(src)
    after = set(os.listdir(dump)) if dump and os.path.isdir(dump) else set()
    files = sorted(set(moved) | (after - before))
    print(TAG + json.dumps({"rc": rc, "files": files}), file=reply, flush=True)
"""


class _Worker:
    def __init__(self, env: dict):
        self.scratch = tempfile.mkdtemp(prefix="dsl_worker_")
        wenv = dict(env, CUTE_DSL_DUMP_DIR=self.scratch)
        code = f"ROOT = {ROOT!r}\nTAG = {_TAG!r}\n" + _WORKER
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=wenv, text=True, bufsize=1, start_new_session=True)
        msg = self._read(600)
        if not msg or not msg.get("ready"):
            self.close()
            raise RuntimeError("dsl_subprocess worker did not start")

    def _read(self, timeout: float):
        while True:
            r, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not r:
                raise subprocess.TimeoutExpired("dsl_subprocess worker", timeout)
            line = self.proc.stdout.readline()
            if not line:
                return None  # the worker died
            if line.startswith(_TAG):
                return json.loads(line[len(_TAG):])

    def run(self, code: str, dump: str | None, timeout: float):
        fd, log = tempfile.mkstemp(prefix="dsl_child_", suffix=".log")
        os.close(fd)
        try:
            self.proc.stdin.write(json.dumps({"code": code, "dump": dump, "log": log, "cwd": os.getcwd()}) + "\n")
            self.proc.stdin.flush()
            try:
                msg = self._read(timeout)
            except subprocess.TimeoutExpired:
                self.close()
                raise subprocess.TimeoutExpired([sys.executable, "-c", code], timeout)
            if msg is None:
                self.close()
                raise RuntimeError("dsl_subprocess worker died")
            with open(log, errors="replace") as f:
                output = f.read()
        finally:
            os.remove(log)
        return msg["rc"], msg["files"], output

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and a running child (its own session)
            except ProcessLookupError:
                pass
            self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)


_WORKERS: dict[tuple, _Worker] = {}
_DONE: dict[tuple, tuple[str, list[str]]] = {}  # (env key, script) -> (dump dir, files) of its first run
_FALLBACK = not hasattr(os, "fork") or sys.platform == "win32"


def _close_all():
    for w in _WORKERS.values():
        w.close()
    _WORKERS.clear()


atexit.register(_close_all)


def _copy_files(src: str, dst: str, files: list[str]) -> bool:
    if not all(os.path.exists(os.path.join(src, f)) for f in files):
        return False
    os.makedirs(dst, exist_ok=True)
    for f in files:
        s, d = os.path.join(src, f), os.path.join(dst, f)
        if os.path.isdir(s):
            shutil.copytree(s, d, dirs_exist_ok=True)
            continue
        try:
            if os.path.exists(d):
                os.remove(d)
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)
    return True


def run(code: str, env: dict, timeout: float = 600) -> None:
    """``subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=timeout)`` for a DSL compile script
    (see the module docstring): raises subprocess.CalledProcessError (with the script's output) when it fails."""
    global _FALLBACK
    dump = env.get("CUTE_DSL_DUMP_DIR")
    env_key = tuple(sorted((k, v) for k, v in env.items() if k not in _VOLATILE))
    key = (env_key, code.replace(dump, "\0DUMP\0") if dump else code)
    done = _DONE.get(key)
    if done is not None and dump and _copy_files(done[0], dump, done[1]):
        return
    if _FALLBACK:
        subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=timeout)
        return
    worker = _WORKERS.get(env_key)
    if worker is not None and not worker.alive():  # timed out or died: start another
        _WORKERS.pop(env_key).close()
        worker = None
    if worker is None:
        if len(_WORKERS) >= 3:  # environments come and go (monkeypatched tests): keep a few workers
            _WORKERS.pop(next(iter(_WORKERS))).close()
        try:
            worker = _WORKERS[env_key] = _Worker(env)
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            _FALLBACK = True
            subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=timeout)
            return
    rc, files, output = worker.run(code, dump, timeout)
    if output:
        sys.stderr.write(output)  # where the subprocess's output went: the test's captured stderr
    if rc != 0:
        raise subprocess.CalledProcessError(rc, [sys.executable, "-c", code], output=output)
    if dump:
        _DONE[key] = (dump, files)
