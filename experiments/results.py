"""Results store: one JSON object per line in ``results/<experiment>/rows.jsonl``, appended and flushed.

Every row carries the ``job_key`` of the job that produced it and ``job_nrows`` (how many rows that job
wrote, all in one ``write``). A job counts as done only when all its rows are present, so a sweep that is
killed at any point resumes by skipping exactly the finished jobs and never writes a row twice.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
from collections import Counter, defaultdict
from pathlib import Path


def job_key(job: dict) -> str:
    """Stable identity of a job: sha1 of its sorted JSON (12 hex digits are not enough across big sweeps)."""
    blob = json.dumps(job, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha1(blob.encode()).hexdigest()


def _jsonable(v):
    """Make a row value JSON-safe: NaN/inf become None, unknown objects their str()."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "item") and callable(v.item):  # numpy / torch scalars
        try:
            return _jsonable(v.item())
        except (TypeError, ValueError):
            pass
    return str(v)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """All complete rows of a rows.jsonl file; a torn last line (killed mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn tail
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


class ResultStore:
    """Append-only JSONL store of one experiment's rows, with the set of finished job keys.

    Several processes may share one store (a parallel Hydra multirun): every write and every rewrite holds an
    exclusive flock on the store's folder, and each job's rows are appended through a fresh file handle, so a
    rewrite by one process (repair, retry) never strands another's appends on a replaced file.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._status: dict[str, Counter] = defaultdict(Counter)
        with self._lock():
            self._repair()
            for r in read_rows(self.path):
                if r.get("job_key"):
                    self._status[r["job_key"]][r.get("status")] += 1

    @contextlib.contextmanager
    def _lock(self):
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _repair(self) -> None:
        """Drop a torn last line and rows of jobs whose rows are incomplete (killed mid-write). Under the lock."""
        if not self.path.exists():
            return
        raw = self.path.read_text(encoding="utf-8")
        rows = read_rows(self.path)
        counts = Counter(r.get("job_key") for r in rows)
        keep = [r for r in rows if r.get("job_nrows") is None or counts[r.get("job_key")] == r["job_nrows"]]
        if len(keep) != len(rows) or (raw and not raw.endswith("\n")):
            self._rewrite(keep)

    def _rewrite(self, rows: list[dict]) -> None:
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, self.path)

    # ---- queries ----------------------------------------------------------------------------
    def existing_keys(self) -> set[str]:
        """Job keys with rows in the store."""
        return set(self._status)

    def failed_keys(self) -> set[str]:
        """Job keys with at least one row of status 'fail'."""
        return {k for k, c in self._status.items() if c.get("fail")}

    def is_done(self, key: str) -> bool:
        return key in self._status

    # ---- writes -----------------------------------------------------------------------------
    def append(self, row: dict) -> None:
        """Append one row and flush it to disk."""
        self.append_job([row])

    def append_job(self, rows: list[dict]) -> None:
        """Append all rows of one job in a single write (so a kill never leaves half a job), flushed and synced."""
        if not rows:
            return
        n = len(rows)
        lines = []
        for r in rows:
            r = _jsonable(dict(r))
            r.setdefault("job_nrows", n)
            lines.append(json.dumps(r, sort_keys=True) + "\n")
        with self._lock(), open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
        for r in rows:
            if r.get("job_key"):
                self._status[r["job_key"]][r.get("status")] += 1

    def drop_jobs(self, keys: set[str]) -> int:
        """Remove every row of the given jobs (used before retrying failed jobs); returns rows removed."""
        keys = set(keys)
        if not keys:
            return 0
        with self._lock():
            rows = read_rows(self.path)
            keep = [r for r in rows if r.get("job_key") not in keys]
            self._rewrite(keep)
        for k in keys:
            self._status.pop(k, None)
        return len(rows) - len(keep)
