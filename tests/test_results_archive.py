"""Archived result sets (rows.jsonl.xz beside rows.jsonl; a legacy rows.jsonl.gz is read and converted): round trip,
loader, a killed archive step, the committed sets, and the size of the tracked tree (each GPU run ships it)."""
from __future__ import annotations

import gzip
import io
import lzma
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.results import ResultStore, archive, archive_path, merge, prune, read_rows, superseded_jobs
from experiments.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
# each GPU run ships the tree plus the offline bundle (../shared/gpu: 55.2 MiB, measured 2026-12-05) under a 64 MiB
# cap; the brief's bound is 8 MiB, this keeps 1.3 MiB of it for untracked files that travel too
TREE_LIMIT = 7.5 * 2**20


def cpu_sweep(tmp_path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=[
            "experiment=fault_cpu", "shape=cpu", "isolation=inline", "progress=false", f"results_dir={tmp_path}",
            *overrides]), resolve=True)


def _jobs(n: int, tag: str = "j") -> list[list[dict]]:
    """n jobs of 1-3 rows each, with the value kinds real rows have (floats, None, nested dicts, unicode)."""
    out = []
    for i in range(n):
        rows = [{"job_key": f"{tag}{i}", "status": "ok" if i % 4 else "fail", "metric": f"m{k}", "value": i / 7 + k,
                 "config": {"rescale_threshold": 8.0, "pingpong": bool(i % 2)}, "reason": None,
                 "gpu_name": "NVIDIA H200", "note": "τ ≈ ½"} for k in range(1 + i % 3)]
        out.append(rows)
    return out


def _store(path: Path, jobs) -> ResultStore:
    store = ResultStore(path)
    for rows in jobs:
        store.append_job(rows)
    return store


def test_archive_round_trip_is_lossless_and_appends_continue(tmp_path):
    path = tmp_path / "exp" / "rows.jsonl"
    _store(path, _jobs(12))
    raw, rows = path.read_bytes(), read_rows(path)
    gz, moved = archive(path.parent)
    assert gz == archive_path(path) and gz.exists() and moved == len(rows)
    assert path.exists() and path.read_bytes() == b""  # live file kept, empty, for new rows
    assert lzma.decompress(gz.read_bytes()) == raw  # byte for byte
    assert read_rows(path) == rows and read_rows(gz) == rows
    # appends after archiving go to the live file; the set reads archive then live
    store = ResultStore(path)
    assert store.existing_keys() == {r["job_key"] for r in rows}
    new = _jobs(3, tag="n")
    for job in new:
        store.append_job(job)
    assert read_rows(path) == rows + read_rows(path)[len(rows):] and len(read_rows(path)) == len(rows) + 6
    assert lzma.decompress(gz.read_bytes()) == raw  # the archive is untouched by appends
    # a second archive step appends the live rows after the archived ones; equal rows give equal bytes
    both = read_rows(path)
    archive(path)
    assert read_rows(path) == both and path.read_bytes() == b""
    first = gz.read_bytes()
    archive(path)  # nothing new: a no-op
    assert gz.read_bytes() == first


def test_legacy_gzip_archive_is_read_then_rewritten_as_xz(tmp_path):
    """A set archived before 2026-12-01 (rows.jsonl.gz): readers, resume, retry and the loaders read it; the next
    archive step (or a dropped job) writes rows.jsonl.xz with the same rows, in order, and removes the .gz."""
    from analysis.load import load_results, read_rows as load_rows

    path = tmp_path / "exp" / "rows.jsonl"
    _store(path, _jobs(6))
    rows = read_rows(path)
    legacy = path.with_name("rows.jsonl.gz")
    legacy.write_bytes(gzip.compress(path.read_bytes()))
    path.write_bytes(b"")
    assert read_rows(path) == rows and load_rows(path) == rows and read_rows(legacy) == rows
    assert len(load_results(tmp_path)) == len(rows)
    store = ResultStore(path)
    assert store.existing_keys() == {r["job_key"] for r in rows}
    store.append_job(_jobs(1, tag="n")[0])
    both = read_rows(path)
    xz, moved = archive(legacy)  # named by its legacy archive
    assert moved == 1 and xz == archive_path(path) and xz.exists() and not legacy.exists()
    assert read_rows(path) == both and load_rows(path) == both and path.read_bytes() == b""
    # a legacy archive with no live rows is converted too, and drop_jobs rewrites it as .xz
    legacy.write_bytes(gzip.compress(lzma.decompress(xz.read_bytes())))
    xz.unlink()
    assert archive(path)[1] == 0 and xz.exists() and not legacy.exists() and read_rows(path) == both
    legacy.write_bytes(gzip.compress(lzma.decompress(xz.read_bytes())))
    xz.unlink()
    assert ResultStore(path).drop_jobs({rows[0]["job_key"]}) == 1
    assert not legacy.exists() and read_rows(path) == both[1:]


def test_killed_archive_step_leaves_no_duplicates(tmp_path):
    """Archive written, live file not yet emptied (killed in between): the next open drops the live copies."""
    path = tmp_path / "rows.jsonl"
    _store(path, _jobs(5))
    rows = read_rows(path)
    archive_path(path).write_bytes(lzma.compress(path.read_bytes()))
    store = ResultStore(path)
    assert path.read_bytes() == b"" and read_rows(path) == rows
    assert len(store.existing_keys()) == 5


def test_repair_counts_archived_rows_and_drops_torn_live_jobs(tmp_path):
    path = tmp_path / "rows.jsonl"
    _store(path, _jobs(4))
    archive(path)
    with open(path, "a") as f:  # a job killed mid-write after the archive step: one of its two rows, torn tail
        f.write(json.dumps({"job_key": "x", "status": "ok", "job_nrows": 2}) + "\n" + '{"job_key": "y", "st')
    store = ResultStore(path)
    assert not store.is_done("x") and len(store.existing_keys()) == 4 and path.read_bytes() == b""


def test_a_rerun_of_archived_jobs_appended_from_another_dir_stays_whole(tmp_path):
    """A job re-run into a fresh results dir (same job keys, another run_id) and appended to a set whose archive holds
    the first run: both runs stay, in the archive after archiving (the repair once counted rows per job key only, saw
    twice job_nrows and dropped the re-run)."""
    path = tmp_path / "rows.jsonl"
    first = [[dict(r, run_id="run1") for r in rows] for rows in _jobs(3)]
    _store(path, first)
    archive(path)
    other = tmp_path / "other" / "rows.jsonl"
    other.parent.mkdir()
    _store(other, [[dict(r, run_id="run2") for r in rows] for rows in _jobs(3)])
    with open(path, "a") as f:
        f.write(other.read_text())
    n_first = sum(len(rows) for rows in first)
    assert len(read_rows(path)) == 2 * n_first
    _, moved = archive(path)
    assert moved == n_first and len(read_rows(path)) == 2 * n_first and path.read_bytes() == b""
    assert {r["run_id"] for r in read_rows(path)} == {"run1", "run2"}


def test_drop_jobs_and_retry_reach_archived_rows(tmp_path):
    cfg = cpu_sweep(tmp_path, "experiment.backends=[reference,fault_compile]", "shape.grid.seqlens=[64]",
                    "shape.grid.causal=[false]")
    assert run_sweep(cfg, out=io.StringIO()) == 0
    path = tmp_path / "fault_cpu" / "rows.jsonl"
    before = read_rows(path)
    assert sorted(r["status"] for r in before) == ["fail", "ok"]
    archive(path)
    out = io.StringIO()
    run_sweep({**cfg, "retry_failed": True}, out=out)
    assert "removed 1 fail rows" in out.getvalue() and "running 1" in out.getvalue()
    after = read_rows(path)
    ok = [r for r in before if r["status"] == "ok"]
    assert after[:1] == ok and len(after) == 2  # the ok row stays archived, the fail row is redone once
    assert read_rows(archive_path(path)) == ok and len(read_rows(archive_path(path))) == 1


def test_resumed_sweep_skips_archived_jobs(tmp_path):
    cfg = cpu_sweep(tmp_path, "experiment.backends=[reference]")
    assert run_sweep(cfg, out=io.StringIO()) == 0
    path = tmp_path / "fault_cpu" / "rows.jsonl"
    rows = read_rows(path)
    assert len(rows) == 4
    archive(path.parent)
    out = io.StringIO()
    assert run_sweep(cfg, out=out) == 0
    assert "4 jobs, 4 already done, running 0" in out.getvalue()
    assert path.read_bytes() == b"" and read_rows(path) == rows  # nothing appended
    out = io.StringIO()  # a wider sweep runs only the new jobs, appending them to the live file
    assert run_sweep(cpu_sweep(tmp_path, "experiment.backends=[reference,fa4_model]"), out=out) == 0
    assert "8 jobs, 4 already done, running 4" in out.getvalue()
    assert read_rows(path)[:4] == rows and len(read_rows(path)) == 8
    assert {r["backend"] for r in read_rows(path)[4:]} == {"fa4_model"}
    assert "ok" in out.getvalue()


def test_loaders_read_archive_and_live(tmp_path, monkeypatch):
    from analysis.load import load_results
    from analysis.load import read_rows as load_rows
    from analysis.roofline import load_calibration
    from analysis.select import experiment_files, load_experiments

    root = tmp_path / "results"
    mixed = root / "h200" / "e1" / "rows.jsonl"  # archived rows and new live ones
    _store(mixed, _jobs(6, "a"))
    archive(mixed)
    _store(mixed, _jobs(2, "b"))
    only_gz = root / "cpu" / "e1" / "rows.jsonl"  # archived, its empty live file deleted
    _store(only_gz, _jobs(3, "c"))
    archive(only_gz)
    only_gz.unlink()
    plain = root / "h200" / "e2" / "rows.jsonl"  # never archived
    _store(plain, _jobs(2, "d"))
    expect = {p: read_rows(p) for p in (mixed, only_gz, plain)}
    assert [r["job_key"] for r in expect[mixed]][:1] == ["a0"] and expect[mixed][-1]["job_key"] == "b1"
    for p, rows in expect.items():
        assert load_rows(p) == rows
    df = load_results(root)
    assert len(df) == sum(map(len, expect.values()))
    assert set(df["source"]) == {str(p) for p in expect}  # a set is named by its rows.jsonl
    assert len(load_results(only_gz)) == len(expect[only_gz])  # a set given by its rows.jsonl, only archived
    assert experiment_files("e1", root, scratch=False) == sorted([mixed, only_gz])
    monkeypatch.setenv("FA4LAB_SCRATCH", "0")
    assert len(load_experiments("e1", "e2", root=root)) == len(df)
    # a scratch set with only an archive is found with --scratch
    scratch = root / "e1" / "rows.jsonl"
    _store(scratch, _jobs(1, "s"))
    archive(scratch)
    scratch.unlink()
    assert experiment_files("e1", root, scratch=True)[0] == scratch
    # the roofline calibration reads archived microbench rows
    mb = tmp_path / "mb" / "rows.jsonl"
    _store(mb, [[{"metric": "sm_clock_mhz", "value": 1755.0, "status": "ok", "method": "m", "gpu_name": "g"}]])
    archive(mb)
    assert load_calibration([mb]) == {"sm_clock_mhz": (1755.0, "m", "g")}


def test_archive_command_line(tmp_path):
    path = tmp_path / "h200" / "exp" / "rows.jsonl"
    _store(path, _jobs(4))
    rows = read_rows(path)
    done = subprocess.run([sys.executable, "-m", "experiments.results", "archive", str(path.parent)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "archived" in done.stdout and read_rows(path) == rows and path.read_bytes() == b""
    bad = subprocess.run([sys.executable, "-m", "experiments.results", "archive", str(tmp_path / "nope")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "no result set" in bad.stderr


def test_merge_replaces_the_retimed_jobs_of_archive_and_live(tmp_path):
    """A device call returns its copy of a set's live file: merge drops the old rows of each job it holds (archived
    or live), appends its complete jobs byte for byte, leaves a partial job out, and a second merge changes nothing."""
    path = tmp_path / "h200" / "exp" / "rows.jsonl"
    _store(path, _jobs(4))
    archive(path)
    _store(path, _jobs(2, tag="live"))
    before = read_rows(path)
    retimed = [dict(r, run_id="device", value=r["value"] + 100) for r in _jobs(4)[1]]  # job j1 re-timed
    partial = [dict(r, job_nrows=3) for r in _jobs(3, tag="torn")[2][:2]]  # 2 of a job's 3 rows
    device = tmp_path / "device_rows.jsonl"
    device.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in retimed + partial), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "experiments.results", "merge", str(path.parent), str(device)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{len(retimed)} rows replaced by {len(retimed)}" in done.stdout
    after = read_rows(path)
    kept = [r for r in before if r["job_key"] != "j1"]
    assert after[:len(kept)] == kept and after[len(kept):] == retimed
    assert not any(r["job_key"] == "j1" for r in read_rows(archive_path(path)))  # the archive lost the old rows
    assert not any(r["job_key"].startswith("torn") for r in after)
    assert merge(path.parent, device) == (0, 0) and read_rows(path) == after


def _rr_job(key: str, time: str, entries: tuple, run: str = "r", nrows: int | None = None, ratio: bool = True) -> list[dict]:
    """One job's rows: per entry a time_ms row (and a time_ratio row when ``ratio``: a round-robin job)."""
    rows = []
    for e in entries:
        rows.append(dict(job_key=key, run_id=run, time=time, experiment="x", mode="fwd", hdim=64, causal=False,
                         seqlen_q=1024, backend=e, metric="time_ms", status="ok", value=1.0))
        if ratio:
            rows.append(dict(rows[-1], metric="time_ratio"))
    return [dict(r, job_nrows=nrows or len(rows)) for r in rows]


def test_superseded_jobs_are_those_a_later_job_measured_again_entry_for_entry(tmp_path):
    old = _rr_job("old", "2026-11-30", ("fa4", "peer"))
    wider = _rr_job("wider", "2026-11-29", ("fa4", "flex"))  # an entry the later job lacks: kept
    sep = _rr_job("sep", "2026-11-28", ("fa4",), ratio=False)  # separately timed (pooled): kept
    twice = _rr_job("twice", "2026-11-30", ("fa4",)) + _rr_job("twice", "2026-12-09", ("fa4",), run="r2")  # newest run
    torn_later = _rr_job("torn", "2026-12-10", ("fa4", "peer", "flex"), nrows=99)  # incomplete: supersedes nothing
    new = _rr_job("new", "2026-12-06", ("fa4", "peer", "extra"))
    assert superseded_jobs(old + wider + sep + twice + torn_later + new) == {"old"}
    assert superseded_jobs(old + new + _rr_job("twice", "2026-11-30", ("fa4",))) == {"old", "twice"}
    path = tmp_path / "h200" / "exp" / "rows.jsonl"
    _store(path, [old, wider, sep, new])
    archive(path)
    _store(path, [twice])
    before = read_rows(path)
    assert prune(path.parent, dry_run=True) == (1, len(old)) and read_rows(path) == before
    done = subprocess.run([sys.executable, "-m", "experiments.results", "prune", str(path.parent)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"1 superseded jobs, {len(old)} rows dropped" in done.stdout
    assert read_rows(path) == [r for r in before if r["job_key"] != "old"]
    assert prune(path.parent) == (0, 0)


def _tracked() -> list[Path]:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / p for p in done.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def test_committed_archives_read_back():
    """Every committed archive is a whole set's rows: xz of complete JSON lines, each with a job key (no legacy
    gzip archive is committed: `archive` rewrites those as .xz)."""
    tracked = _tracked()
    assert not [p for p in tracked if p.name == "rows.jsonl.gz"]
    archives = [p for p in tracked if p.name == "rows.jsonl.xz"]
    assert archives
    for gz in archives:
        text = lzma.decompress(gz.read_bytes()).decode("utf-8")
        assert text.endswith("\n"), gz
        rows = [json.loads(line) for line in text.splitlines()]
        assert rows and all(r.get("job_key") for r in rows), gz


def test_tracked_tree_fits_the_gpu_transfer():
    """The tree ships with every GPU run next to the 55 MiB bundle under a 64 MiB cap: keep it under TREE_LIMIT."""
    files = _tracked()
    total = sum(p.stat().st_size for p in files)
    big = sorted(files, key=lambda p: -p.stat().st_size)[:5]
    assert total < TREE_LIMIT, (
        f"tracked tree is {total / 2**20:.2f} MiB (limit {TREE_LIMIT / 2**20:.0f} MiB); biggest: "
        + ", ".join(f"{p.relative_to(ROOT)} {p.stat().st_size // 1024} KiB" for p in big)
        + "; compress a grown result set with: python -m experiments.results archive results/<machine>/<experiment>")
