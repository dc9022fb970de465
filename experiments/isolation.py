"""Fault isolation for sweeps: run each job in a worker process with a watchdog, or inline.

``ProcessExecutor`` keeps one persistent worker (multiprocessing *spawn* context, so no CUDA state is
ever forked) and sends it one job at a time. A job past ``job_timeout_s`` gets its worker killed and a
fail row of class ``timeout``; a worker that dies (segfault, CUDA fault, exit) gives a fail row of class
``cuda_fault`` (or ``crash`` when nothing in its stderr points at CUDA) with the first lines of its stderr;
an exception inside the job comes back as a fail row (``compile_error``, ``cuda_fault`` or ``error``)
without killing the worker, except after a CUDA fault (raised, or recorded in a row by the runner), which
poisons the context: that worker is replaced.

``InlineExecutor`` runs jobs in the driver process (no fork/spawn cost): exceptions become fail rows,
a SIGALRM watchdog interrupts Python-level hangs, and a CUDA fault stops the sweep (a rerun resumes).

Both return the job's rows and never raise for a job's own failure.
"""
from __future__ import annotations

import faulthandler
import importlib
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

from experiments.runners import get_runner

MESSAGE_LINES = 12  # first lines of an error kept in a fail row
MESSAGE_CHARS = 2000
STARTUP_TIMEOUT_S = 300.0



class JobTimeout(Exception):
    """Raised (inline mode) when a job runs past its time budget."""


class WorkerSetupError(RuntimeError):
    """The worker process could not start (a plugin module failed to import)."""


class CudaContextPoisoned(RuntimeError):
    """Inline mode only: a CUDA fault poisoned this process's context; the sweep must stop. args[0]: the rows."""


# ---- classification, fail rows ---------------------------------------------------------------
def head(text: str, lines: int = MESSAGE_LINES, chars: int = MESSAGE_CHARS) -> str:
    """First non-empty lines of ``text``, capped in length."""
    out = [ln.rstrip() for ln in str(text).splitlines() if ln.strip()][:lines]
    return "\n".join(out)[:chars]


def mentions_cuda_fault(text: str) -> bool:
    """Whether a dead worker's stderr reads like a GPU fault (same markers as the attn runner's classifier)."""
    from experiments.attn_job import CUDA_FAULT_MARKERS

    t = str(text).lower()
    return any(m in t for m in CUDA_FAULT_MARKERS)


def classify_exception(exc: BaseException) -> str:
    """Error class of an exception that escaped a job: timeout, cuda_fault, compile_error, error, or the
    exception's own ``error_class`` attribute. Adds the watchdog's class to
    experiments.attn_job.classify_error (which also spots compile errors by the compiler frames they came from)."""
    if isinstance(exc, (JobTimeout, TimeoutError)):
        return "timeout"
    explicit = getattr(exc, "error_class", None)
    if isinstance(explicit, str) and explicit:
        return explicit
    from experiments.attn_job import classify_error

    return classify_error(exc)


def has_cuda_fault(rows: list[dict]) -> bool:
    """A runner that records a GPU fault as a row (instead of raising) leaves this process's context poisoned."""
    return any(isinstance(r, dict) and r.get("error_class") == "cuda_fault" for r in rows)


def exception_message(exc: BaseException) -> str:
    """'Type: message' followed by the innermost frames of the traceback."""
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    last = "".join(tb[-3:-1]) if len(tb) > 2 else ""
    return head(f"{type(exc).__name__}: {exc}\n{last}")


def failure_row(job: dict, error_class: str, message: str) -> dict:
    """The fail row of a job that produced no rows: what ran (backend, config, shape, modes) and what happened."""
    modes = job.get("modes") or []
    row = {
        "experiment": job.get("experiment"),
        "kind": job.get("kind"),
        "backend": job.get("backend"),
        "variant": job.get("variant"),
        "mode": "+".join(modes) if modes else job.get("mode"),
        "metric": None,
        "value": None,
        "status": "fail",
        "error_class": error_class,
        "reason": head(message),
        "config": job.get("config"),
    }
    shape = job.get("shape")
    if isinstance(shape, dict):
        for k, v in shape.items():
            row.setdefault(k, v)
    for k, v in job.items():  # kinds without a shape dict keep their parameters at the top level
        if k not in ("shape", "modes", "bench", "check") and (v is None or isinstance(v, (bool, int, float, str))):
            row.setdefault(k, v)
    return row


# ---- the job itself (runs in the worker, or inline) -----------------------------------------
def _cuda_sync() -> None:
    """Surface asynchronous CUDA errors inside the job that caused them (no-op without CUDA)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def execute(job: dict, runners: dict[str, str]) -> tuple[str, object]:
    """Run one job; returns ("rows", rows) or ("fail", (error_class, message))."""
    try:
        rows = get_runner(job.get("kind"), runners)(job)
        if not isinstance(rows, list):
            raise TypeError(f"runner for kind={job.get('kind')!r} returned {type(rows).__name__}, expected list[dict]")
        if not has_cuda_fault(rows):
            _cuda_sync()
        return "rows", rows
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 -- every failure of a job becomes a row
        return "fail", (classify_exception(e), exception_message(e))


def import_plugins(modules) -> None:
    for m in modules or ():
        importlib.import_module(m)


def collect_metadata() -> dict:
    """Static metadata of this process's machine (experiments.metadata), or a minimal stand-in."""
    try:
        from experiments.metadata import static_metadata
    except ModuleNotFoundError as e:
        if e.name not in ("experiments.metadata",):
            raise
        import platform
        return {"host": platform.node(), "python": platform.python_version(), "metadata": "experiments.metadata missing"}
    return static_metadata()


# ---- worker process --------------------------------------------------------------------------
def _watch_parent(ppid: int) -> None:
    while True:
        if os.getppid() != ppid:
            os._exit(3)
        time.sleep(1.0)


def _worker_main(conn, setup: dict) -> None:
    """Entry point of the worker process: set up, report metadata, then run jobs until told to stop."""
    log = open(setup["log_path"], "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    faulthandler.enable(file=sys.stderr, all_threads=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it stops the sweep and kills this worker
    threading.Thread(target=_watch_parent, args=(setup["ppid"],), daemon=True).start()
    try:
        import_plugins(setup.get("imports"))
        meta = collect_metadata()
    except BaseException as e:  # noqa: BLE001
        conn.send(("setup_error", exception_message(e)))
        return
    conn.send(("ready", meta))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        status, payload = execute(job, setup["runners"])
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send((status, payload))


class ProcessExecutor:
    """Runs jobs in a persistent spawned worker; restarts it after a crash, a timeout or a CUDA fault."""

    mode = "process"

    def __init__(self, runners: dict[str, str], imports=(), job_timeout_s: float = 600.0, log_dir: str | None = None):
        self.runners = dict(runners)
        self.imports = list(imports or ())
        self.job_timeout_s = float(job_timeout_s)
        self._ctx = mp.get_context("spawn")
        self._own_dir = log_dir is None
        self._dir = log_dir or tempfile.mkdtemp(prefix="fa4lab-worker-")
        self.log_path = os.path.join(self._dir, f"worker-{os.getpid()}.log")
        self.proc = None
        self.conn = None
        self.meta: dict = {}
        self.restarts = 0

    # worker lifecycle
    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        setup = {"runners": self.runners, "imports": self.imports, "log_path": self.log_path, "ppid": os.getpid()}
        self.proc = self._ctx.Process(target=_worker_main, args=(child, setup), name="fa4lab-worker")
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(STARTUP_TIMEOUT_S):
            self._kill()
            raise WorkerSetupError(f"worker did not start within {STARTUP_TIMEOUT_S:.0f} s; log: {self.log_path}")
        try:
            status, payload = parent.recv()
        except EOFError:
            code = self.proc.exitcode
            self._kill()
            raise WorkerSetupError(f"worker died while starting (exit {code}): {head(self._log_since(0), 6)}")
        if status != "ready":
            self._kill()
            raise WorkerSetupError(f"worker setup failed: {payload}")
        self.meta = payload

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(10)
        if self.conn is not None:
            self.conn.close()
        self.proc = None
        self.conn = None

    def _log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                f.seek(offset)
                return f.read(64 * 1024)
        except OSError:
            return ""

    def metadata(self) -> dict:
        if self.proc is None:
            self._start()
        return self.meta

    def run(self, job: dict) -> list[dict]:
        if self.proc is None or not self.proc.is_alive():
            self._kill()
            self._start()
        offset = self._log_size()
        self.conn.send(job)
        if not self.conn.poll(self.job_timeout_s):
            self._kill()
            self.restarts += 1
            out = head(self._log_since(offset), 4)
            msg = f"job exceeded job_timeout_s={self.job_timeout_s:g}; worker killed" + (f"\n{out}" if out else "")
            return [failure_row(job, "timeout", msg)]
        try:
            status, payload = self.conn.recv()
        except (EOFError, ConnectionError, OSError):
            self.proc.join(10)
            code = self.proc.exitcode
            self._kill()
            self.restarts += 1
            stderr = self._log_since(offset)
            why = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"exited with code {code}")
            cls = "cuda_fault" if mentions_cuda_fault(stderr) else "crash"
            return [failure_row(job, cls, f"worker {why}\n{head(stderr)}")]
        rows = payload if status == "rows" else [failure_row(job, *payload)]
        if has_cuda_fault(rows):  # the context is poisoned: later jobs get a fresh worker
            self._kill()
            self.restarts += 1
        return rows

    def abort(self) -> None:
        """Kill the worker now (Ctrl-C: its job is abandoned, nothing is recorded)."""
        self._kill()
        self.close()

    def close(self) -> None:
        if self.conn is not None and self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
                self.proc.join(5)
            except (OSError, ValueError):
                pass
        self._kill()
        if self._own_dir:
            shutil.rmtree(self._dir, ignore_errors=True)


class InlineExecutor:
    """Runs jobs in this process; a SIGALRM watchdog catches Python-level hangs (main thread only)."""

    mode = "inline"

    def __init__(self, runners: dict[str, str], imports=(), job_timeout_s: float = 600.0):
        self.runners = dict(runners)
        import_plugins(imports)
        self.job_timeout_s = float(job_timeout_s)
        self.meta: dict | None = None

    def metadata(self) -> dict:
        if self.meta is None:
            self.meta = collect_metadata()
        return self.meta

    def run(self, job: dict) -> list[dict]:
        use_alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
        if use_alarm:
            def _on_alarm(signum, frame):
                raise JobTimeout(f"job exceeded job_timeout_s={self.job_timeout_s:g}")
            old = signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.job_timeout_s)
        try:
            status, payload = execute(job, self.runners)
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        rows = payload if status == "rows" else [failure_row(job, *payload)]
        if has_cuda_fault(rows):
            raise CudaContextPoisoned(rows)
        return rows

    def close(self) -> None:
        pass


def make_executor(isolation: str, runners: dict[str, str], imports=(), job_timeout_s: float = 600.0):
    """``isolation`` is 'process', 'inline' or 'auto' (process when CUDA is available, inline otherwise)."""
    if isolation == "auto":
        isolation = "process" if cuda_available() else "inline"
    if isolation == "process":
        return ProcessExecutor(runners, imports, job_timeout_s)
    if isolation == "inline":
        return InlineExecutor(runners, imports, job_timeout_s)
    raise ValueError(f"isolation={isolation!r}: supported values are 'auto', 'process', 'inline'")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
