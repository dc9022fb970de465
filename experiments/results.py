"""Results store: one JSON object per line in ``results/<experiment>/rows.jsonl``, appended and flushed.

Every row carries the ``job_key`` of the job that produced it and ``job_nrows`` (how many rows that job
wrote, all in one ``write``). A job counts as done only when all its rows are present, so a sweep that is
killed at any point resumes by skipping exactly the finished jobs and never writes a row twice.

A set may also have an archive beside its live file: ``rows.jsonl.xz``, the xz of rows moved out of
``rows.jsonl`` byte for byte (``python -m experiments.results archive <set>``; about a third smaller than the gzip
archives ``rows.jsonl.gz`` of before 2026-12-01, which are still read, and rewritten as ``.xz`` by the next archive). A set's rows are the archive's
then the live file's: every reader here (``read_rows``, the store's resume and repair) reads both, appends go to
the live file only, and the archive changes only by ``archive`` and ``drop_jobs``.
"""
from __future__ import annotations

import contextlib
import fcntl
import gzip
import lzma
import hashlib
import json
import math
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

ARCHIVE_SUFFIX = ".xz"
LEGACY_SUFFIX = ".gz"  # archives written before 2026-12-01: read, and replaced by .xz when the archive is rewritten


def archive_path(path: str | os.PathLike) -> Path:
    """The archive beside a live rows file: ``rows.jsonl`` -> ``rows.jsonl.xz``."""
    return Path(str(path) + ARCHIVE_SUFFIX)


def legacy_archive(archive: Path) -> Path:
    """The gzip archive of the same set: ``rows.jsonl.xz`` -> ``rows.jsonl.gz``."""
    return archive.with_name(archive.name[: -len(ARCHIVE_SUFFIX)] + LEGACY_SUFFIX)


def has_archive(path: str | os.PathLike) -> bool:
    """Whether the set of the live file ``path`` has an archive (.xz, or a legacy .gz)."""
    a = archive_path(path)
    return a.exists() or legacy_archive(a).exists()


def live_path(path: str | os.PathLike) -> Path:
    """The live rows file of a set given by its folder, its ``rows.jsonl`` or its archive (.xz / .gz)."""
    p = Path(path)
    if p.is_dir():
        return p / "rows.jsonl"
    for suffix in (ARCHIVE_SUFFIX, LEGACY_SUFFIX):
        if p.name.endswith(".jsonl" + suffix):
            return p.with_name(p.name[: -len(suffix)])
    return p


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


def _lines(text: str) -> list[tuple[str, dict]]:
    """(line, row) for every complete, parsable line; reading stops at a torn tail (killed mid-write)."""
    out = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # torn tail
        if not line.strip():
            continue
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError:
            continue
    return out


def _archive_text(path: Path) -> str:
    """The rows text of an archive: ``path`` (.xz, or .gz named directly), else its legacy .gz, else ''."""
    if path.name.endswith(LEGACY_SUFFIX):
        return gzip.decompress(path.read_bytes()).decode("utf-8") if path.exists() else ""
    if path.exists():
        return lzma.decompress(path.read_bytes()).decode("utf-8")
    legacy = legacy_archive(path)
    return gzip.decompress(legacy.read_bytes()).decode("utf-8") if legacy.exists() else ""


def _live_text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def _write_archive(path: Path, text: str) -> None:
    """Write the .xz archive atomically (equal rows give equal bytes), then remove the set's legacy .gz archive,
    whose rows ``text`` already holds (the caller read them through ``_archive_text``)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    os.replace(tmp, path)
    legacy_archive(path).unlink(missing_ok=True)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """All complete rows of a set: its archive ``rows.jsonl.xz`` (or legacy .gz; if any), then its live
    ``rows.jsonl``; a torn last line (killed mid-write) is ignored. A path ending in .xz / .gz reads that archive
    only."""
    path = Path(path)
    if path.name.endswith((ARCHIVE_SUFFIX, LEGACY_SUFFIX)):
        return [r for _, r in _lines(_archive_text(path))]
    return [r for _, r in _lines(_archive_text(archive_path(path))) + _lines(_live_text(path))]


class ResultStore:
    """Append-only JSONL store of one experiment's rows, with the set of finished job keys.

    Several processes may share one store (a parallel Hydra multirun): every write and every rewrite holds an
    exclusive flock on the store's folder, and each job's rows are appended through a fresh file handle, so a
    rewrite by one process (repair, retry) never strands another's appends on a replaced file.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.archive_file = archive_path(self.path)
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
        """Drop a torn last line, live lines already in the archive (an archive step killed between writing the
        archive and emptying the live file) and rows of jobs whose run's rows are incomplete (killed mid-write).
        Only the live file is rewritten. Under the lock."""
        if not self.path.exists():
            return
        raw = self.path.read_text(encoding="utf-8")
        archived = _lines(_archive_text(self.archive_file))
        parsed = _lines(raw)
        seen = {line for line, _ in archived}
        live = [(line, r) for line, r in parsed if line not in seen]
        # a job is complete when its run wrote all its rows: counted per (job_key, run_id), so a deliberate re-run
        # of a job into a fresh results dir, appended to a set that already holds an earlier run, stays whole
        counts = Counter((r.get("job_key"), r.get("run_id")) for _, r in archived + live)
        keep = [(line, r) for line, r in live
                if r.get("job_nrows") is None or counts[(r.get("job_key"), r.get("run_id"))] == r["job_nrows"]]
        if len(keep) != len(parsed) or (raw and not raw.endswith("\n")):
            self._rewrite(keep)

    def _rewrite(self, lines: list[tuple[str, dict]]) -> None:
        """Replace the live file with these lines, byte for byte."""
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line for line, _ in lines), encoding="utf-8")
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
        """Remove every row of the given jobs, archived or live (used before retrying failed jobs); returns rows
        removed."""
        keys = set(keys)
        if not keys:
            return 0
        removed = 0
        with self._lock():
            archived = _lines(_archive_text(self.archive_file))
            keep = [(line, r) for line, r in archived if r.get("job_key") not in keys]
            if len(keep) != len(archived):
                _write_archive(self.archive_file, "".join(line for line, _ in keep))
                removed += len(archived) - len(keep)
            live = _lines(_live_text(self.path))
            keep = [(line, r) for line, r in live if r.get("job_key") not in keys]
            self._rewrite(keep)
            removed += len(live) - len(keep)
        for k in keys:
            self._status.pop(k, None)
        return removed

    # ---- archive ----------------------------------------------------------------------------
    def archive_live(self) -> int:
        """Move the live file's rows into the archive, byte for byte (appended after the rows already there), and
        leave the live file empty; returns the rows moved. The archive is written (atomically) before the live
        file is emptied; a kill in between leaves rows in both, which the next open drops from the live file."""
        with self._lock():
            self._repair()
            live = _live_text(self.path)
            legacy = legacy_archive(self.archive_file).exists()
            if not live and not legacy:
                return 0
            _write_archive(self.archive_file, _archive_text(self.archive_file) + live)  # a legacy .gz becomes .xz
            with open(self.path, "w", encoding="utf-8") as f:
                f.flush()
                os.fsync(f.fileno())
        return len(_lines(live))


def archive(path: str | os.PathLike) -> tuple[Path, int]:
    """Archive one set (its folder, rows.jsonl or its archive); returns (archive path, rows moved). A legacy .gz
    archive becomes .xz. Checks that the set reads back exactly the rows it had, in order, before returning."""
    live = live_path(path)
    if not live.exists() and not has_archive(live):
        raise FileNotFoundError(f"archive: no result set at {str(path)!r} (neither rows.jsonl nor rows.jsonl.xz)")
    store = ResultStore(live)
    before = read_rows(live)
    moved = store.archive_live()
    after = read_rows(live)
    if after != before:
        raise RuntimeError(f"archive: {live} reads back {len(after)} rows, not the {len(before)} it had")
    return store.archive_file, moved


def merge(path: str | os.PathLike, rows_file: str | os.PathLike) -> tuple[int, int]:
    """Bring rows timed elsewhere (a device call's copy of a set's live file) into the set: every job they hold is
    replaced -- its rows dropped from the archive and the live file -- and their lines appended to the live file
    byte for byte, in order. Only complete jobs are taken (a torn or partial job in ``rows_file`` is left out).
    Returns (rows removed, rows added)."""
    live = live_path(path)
    lines = _lines(Path(rows_file).read_text(encoding="utf-8"))
    counts = Counter((r.get("job_key"), r.get("run_id")) for _, r in lines)
    whole = [(line, r) for line, r in lines
             if r.get("job_nrows") is None or counts[(r.get("job_key"), r.get("run_id"))] == r["job_nrows"]]
    keys = {r["job_key"] for _, r in whole if r.get("job_key")}
    already = {line for line, _ in _lines(_live_text(live))}
    if whole and all(line in already for line, _ in whole):
        return 0, 0  # merged before: nothing to do (running it twice changes nothing)
    store = ResultStore(live)
    removed = store.drop_jobs(keys)
    with store._lock(), open(live, "a", encoding="utf-8") as f:
        f.write("".join(line for line, _ in whole))
    return removed, len(whole)


# what a row measured, for prune: its experiment, mode and shape, who was timed, what and how it ended
ROW_SIGNATURE = ("experiment", "mode", "hdim", "hdim_v", "causal", "seqlen_q", "seqlen_k", "batch", "heads", "heads_kv",
                 "window", "varlen", "dtype", "backend", "variant", "baseline", "baseline_variant", "metric", "status")


def superseded_jobs(rows: list[dict]) -> set[str]:
    """Round-robin jobs (with time_ratio rows) whose every row a later complete round-robin job measured again: one
    job with a newer last row ``time`` has each of the old job's row signatures (ROW_SIGNATURE: experiment, shape,
    entry, metric, status). The analysis draws each (experiment, shape) from its latest round-robin job
    (analysis/select.py latest_round_robin_job), so such a job's rows are history only (git keeps them). A key with
    several runs (a job re-timed into the set under its own key) counts only when every run of it is measured again
    by another job."""
    runs: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("job_key"):
            runs[(r["job_key"], r.get("run_id"))].append(r)
    sig = lambda r: json.dumps([r.get(k) for k in ROW_SIGNATURE], sort_keys=True, default=str)
    info, keep = [], set()
    for (key, _), rs in runs.items():
        if not any(r.get("metric") == "time_ratio" for r in rs):
            keep.add(key)  # not round-robin: separately timed jobs (compile_time's samples) are pooled, never replaced
            continue
        whole = all(r.get("job_nrows") in (None, len(rs)) for r in rs)
        info.append((key, max(str(r.get("time") or "") for r in rs), {sig(r) for r in rs}, whole))
    done: dict[str, list[bool]] = defaultdict(list)  # per job key, per run: measured again by a later job
    for key, t, sigs, _ in info:
        done[key].append(any(whole and k != key and t2 > t and sigs <= s for k, t2, s, whole in info))
    return {key for key, runs_done in done.items() if all(runs_done) and key not in keep}  # drop_jobs: every run


def prune(path: str | os.PathLike, dry_run: bool = False) -> tuple[int, int]:
    """Drop the superseded jobs of a set (``superseded_jobs``) from its archive and live file; returns (jobs, rows)
    dropped (or that would be, with ``dry_run``)."""
    live = live_path(path)
    rows = read_rows(live)
    keys = superseded_jobs(rows)
    if dry_run or not keys:
        return len(keys), sum(r.get("job_key") in keys for r in rows)
    return len(keys), ResultStore(live).drop_jobs(keys)


def main(argv=None) -> int:
    """``python -m experiments.results archive SET [SET ...]``: compress committed sets (see the module doc);
    ``python -m experiments.results merge SET ROWS``: bring a device call's rows of SET into it (see ``merge``)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m experiments.results",
                                description="maintenance of result sets (results/<machine>/<experiment>/)")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("archive", help="move a set's rows.jsonl into rows.jsonl.xz (lossless; readers, resume "
                                       "and appends keep working); leaves rows.jsonl empty for new rows")
    a.add_argument("sets", nargs="+", help="a set's folder or its rows.jsonl (e.g. results/h200/bwd_peers)")
    m = sub.add_parser("merge", help="replace the jobs in ROWS (a set's rows.jsonl copied back from a device call) "
                                     "with ROWS' rows: their old rows leave the archive and the live file")
    m.add_argument("set", help="the committed set, e.g. results/h200/fwd_peers")
    m.add_argument("rows", help="the rows file the device call returned")
    pr = sub.add_parser("prune", help="drop jobs that a later job of the set measured again entry for entry (the "
                                      "analysis draws only the later one; git history keeps the rows)")
    pr.add_argument("sets", nargs="+", help="a set's folder or its rows.jsonl")
    pr.add_argument("--dry-run", action="store_true", help="say what would be dropped, change nothing")
    ns = p.parse_args(argv)
    if ns.cmd == "prune":
        for s in ns.sets:
            jobs, n = prune(s, ns.dry_run)
            print(f"{live_path(s)}: {jobs} superseded jobs, {n} rows {'would be ' if ns.dry_run else ''}dropped")
        return 0
    if ns.cmd == "merge":
        removed, added = merge(ns.set, ns.rows)
        total = len(read_rows(live_path(ns.set)))
        print(f"{live_path(ns.set)}: {removed} rows replaced by {added} from {ns.rows} ({total} rows in the set)")
        return 0
    for s in ns.sets:
        live = live_path(s)
        size = live.stat().st_size if live.exists() else 0
        gz, moved = archive(s)
        print(f"{live}: {moved} rows ({size} bytes) archived -> {gz} ({gz.stat().st_size if gz.exists() else 0} "
              f"bytes, {len(read_rows(live))} rows in the set)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
