"""analysis.gpu_tests: the GPU test slices' logs joined with today's test ids (CPU only, no pytest collection)."""
from __future__ import annotations

import shutil

import pytest

from analysis import gpu_tests as gt

LOG_A = """============================= test session starts ==============================
collecting ... collected 6 items
tests/test_x_gpu.py::test_one[a-True] PASSED [  0%]
tests/test_x_gpu.py::test_one[b-False] FAILED [ 10%]
tests/test_x_gpu.py::test_two SKIPPED (needs two GPUs) [ 20%]
tests/test_y_gpu.py::test_three PASSED [ 30%]
tests/test_y_gpu.py::test_cut
"""
README = """| file | what | outcome |
| --- | --- | --- |
| `gputests_a.log` | session 1, **H100 80GB HBM3**, git aaaaaaa: part gputests | 3 passed |
A line of prose about `gputests_c.log`, git ddddddd, is no row.
| `other.jsonl` | session 1, **H200**, git ccccccc: mentions `gputests_b.log` later in the row | x |
"""


def _log(name, sha, outcomes, card="H100"):
    return gt.TestLog(name, card, sha, dict(outcomes))


def test_parse_log_keeps_outcomes_and_drops_the_cut_test():
    assert gt.parse_log(LOG_A) == {"tests/test_x_gpu.py::test_one[a-True]": "PASSED",
                                   "tests/test_x_gpu.py::test_one[b-False]": "FAILED",
                                   "tests/test_x_gpu.py::test_two": "SKIPPED",
                                   "tests/test_y_gpu.py::test_three": "PASSED"}


def test_log_origin_header_then_readme_row_then_unknown():
    assert gt.log_origin("gputests_a.log", "# gputests: card NVIDIA H200, git bbbbbbb", README) == ("NVIDIA H200",
                                                                                                    "bbbbbbb")
    assert gt.log_origin("gputests_a.log", "=== test session starts ===", README) == ("H100 80GB HBM3", "aaaaaaa")
    # a name further along a row (not its first cell) is not that log's row
    assert gt.log_origin("gputests_b.log", "=== test session starts ===", README) == ("?", "?")
    assert gt.log_origin("gputests_c.log", "=== test session starts ===", README) == ("?", "?")


def test_load_logs_reads_the_folder(tmp_path):
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "gputests_a.log").write_text(LOG_A)
    (tmp_path / "gputests_b.log").write_text("# gputests: card NVIDIA H200, git bbbbbbb\n"
                                             "tests/test_y_gpu.py::test_cut PASSED [ 99%]\n")
    (tmp_path / "notes.log").write_text("tests/test_z_gpu.py::test_q PASSED\n")  # not a gputests log
    logs = gt.load_logs(tmp_path)
    assert [(g.name, g.card, g.sha, len(g.outcomes)) for g in logs] == [
        ("gputests_a.log", "H100 80GB HBM3", "aaaaaaa", 4), ("gputests_b.log", "NVIDIA H200", "bbbbbbb", 1)]


TIMES = {"old": 1, "mid": 2, "new": 3}


def _table(ids, logs, since=None):
    since = since or {"old": 5, "mid": 2, "new": 0}
    return {r["file"]: r for r in gt.file_table(ids, logs, when=TIMES.get, since=since.get)}


def test_the_newest_commits_outcome_counts():
    f = "tests/test_f_gpu.py"
    ids = [f"{f}::t1", f"{f}::t2", f"{f}::t3"]
    logs = [_log("gputests_2.log", "new", {f"{f}::t1": "PASSED", f"{f}::t2": "FAILED"}),
            _log("gputests_1.log", "old", {f"{f}::t1": "FAILED", f"{f}::t2": "PASSED", f"{f}::t3": "PASSED"})]
    r = _table(ids, logs)[f]
    assert (r["tests"], r["passed"], r["failed"], r["not_run"]) == (3, 2, 1, 0)
    assert r["oldest_sha"] == "old" and r["kernel_commits_since"] == 5  # t3 passed only at the old commit


def test_not_run_gone_and_skipped():
    f, g = "tests/test_f_gpu.py", "tests/test_g_gpu.py"
    ids = [f"{f}::t1", f"{f}::t2", f"{g}::u1"]
    logs = [_log("gputests_1.log", "mid", {f"{f}::t1": "SKIPPED", f"{f}::gone": "FAILED"})]
    t = _table(ids, logs)
    assert (t[f]["passed"], t[f]["failed"], t[f]["not_run"], t[f]["oldest_sha"]) == (1, 0, 1, "mid")
    assert (t[g]["passed"], t[g]["not_run"], t[g]["oldest_sha"], t[g]["kernel_commits_since"]) == (0, 1, "", None)


def test_same_commit_later_log_name_wins():
    f = "tests/test_f_gpu.py"
    logs = [_log("gputests_b.log", "mid", {f"{f}::t1": "PASSED"}), _log("gputests_a.log", "mid", {f"{f}::t1": "FAILED"})]
    assert _table([f"{f}::t1"], logs)[f]["failed"] == 0


def test_next_files_open_first_then_stalest_and_current_files_left_out():
    rows = [dict(file="a", failed=0, not_run=0, kernel_commits_since=0),
            dict(file="b", failed=0, not_run=0, kernel_commits_since=7),
            dict(file="c", failed=0, not_run=3, kernel_commits_since=1),
            dict(file="d", failed=1, not_run=0, kernel_commits_since=0),
            dict(file="e", failed=0, not_run=0, kernel_commits_since=None),
            dict(file="f", failed=0, not_run=0, kernel_commits_since=2)]
    assert gt.next_files(rows) == ["c", "d", "e", "b", "f"]


def test_markdown_totals():
    rows = [dict(file="a", tests=3, passed=2, failed=1, not_run=0, oldest_sha="abcdef123", card="H100",
                 kernel_commits_since=4),
            dict(file="b", tests=2, passed=0, failed=0, not_run=2, oldest_sha="", card="", kernel_commits_since=None)]
    md = gt.markdown(rows)
    assert "| a | 3 | 2 | 1 | 0 | abcdef1 | H100 | 4 |" in md and "| b | 2 | 0 | 0 | 2 |  |  |  |" in md
    assert md.splitlines()[-1].startswith("| **all** | 5 | 2 | 1 | 2 |")


def test_main_on_the_committed_logs(monkeypatch, capsys):
    """The committed slices parse, each log's commit is known to git, and --files names files from the id list."""
    logs = gt.load_logs(gt.LOGS)
    assert logs and all(g.sha != "?" and g.card != "?" for g in logs), [(g.name, g.sha) for g in logs]
    if shutil.which("git") and gt._git("rev-parse", "--is-shallow-repository") == "false":
        assert all(gt.commit_time(g.sha) > 0 for g in logs), [(g.name, g.sha) for g in logs]
    ids = sorted({tid for g in logs for tid in g.outcomes}) + ["tests/test_never_run_gpu.py::t"]
    monkeypatch.setattr(gt, "gpu_test_ids", lambda: ids)
    assert gt.main([]) == 0
    assert "| tests/test_never_run_gpu.py | 1 | 0 | 0 | 1 |" in capsys.readouterr().out
    assert gt.main(["--files"]) == 0
    assert capsys.readouterr().out.split()[0] == "tests/test_never_run_gpu.py"
    with pytest.raises(SystemExit):
        gt.main(["--logs", "no/such/folder"])
