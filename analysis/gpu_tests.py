"""Which GPU tests have passed on a GPU, at which commit: ``python -m analysis.gpu_tests [--logs DIR] [--files]``.

The GPU tests (``-m gpu``, about 1800) want some 100 minutes of device time, more than a session has, so they run in
slices (``scripts/first_call.sh`` part ``gputests``, logs ``results/h200/session_ab/gputests_*.log``, ``pytest -v``).
This joins those logs with today's test ids: per GPU test file, how many of its tests passed in their latest run, how
many failed there, how many never ran, the oldest commit among those latest passes and how many commits have touched
``kernels/`` since it. A log's card and commit come from its first line (``# gputests: card NAME, git SHA``, written
by first_call.sh since session 78) or else from its row in the folder's README (``git SHA``, the card in bold).
``--files`` prints only the files to run next (never run or failing first, then the most kernel commits since),
space-separated, for ``GPU_TEST_FILES``.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "results" / "h200" / "session_ab"
OUTCOME = re.compile(r"^(tests/\S+?\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
HEADER = re.compile(r"^# gputests: card (?P<card>.+?), git (?P<sha>[0-9a-f]{7,40})\s*$")


@dataclass
class TestLog:
    """One pytest -v log of GPU tests: its outcomes by test id, the card and commit it ran on."""
    name: str
    card: str
    sha: str
    outcomes: dict = field(default_factory=dict)


def parse_log(text: str) -> dict:
    """Test id -> outcome of every ``-v`` line with one (a test cut by a deadline has none)."""
    out = {}
    for line in text.splitlines():
        m = OUTCOME.match(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def log_origin(name: str, first_line: str, readme: str) -> tuple[str, str]:
    """(card, git sha) of log ``name``: its header line, else the README table row whose first cell names it ('?'
    where neither)."""
    m = HEADER.match(first_line)
    if m:
        return m.group("card"), m.group("sha")
    for row in readme.splitlines():
        if row.startswith("|") and f"`{name}`" in row.split("|")[1]:
            sha = re.search(r"\bgit ([0-9a-f]{7,40})\b", row)
            card = re.search(r"\*\*(.+?)\*\*", row)
            return (card.group(1) if card else "?"), (sha.group(1) if sha else "?")
    return "?", "?"


def load_logs(folder: Path) -> list[TestLog]:
    """The folder's gputests*.log files, each with its card, commit and outcomes."""
    readme_path = folder / "README.md"
    readme = readme_path.read_text() if readme_path.exists() else ""
    logs = []
    for path in sorted(folder.glob("gputests*.log")):
        text = path.read_text(errors="replace")
        card, sha = log_origin(path.name, text.split("\n", 1)[0], readme)
        logs.append(TestLog(path.name, card, sha, parse_log(text)))
    return logs


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def commit_time(sha: str) -> int:
    """The commit's Unix time (-1 where git does not know it)."""
    try:
        return int(_git("show", "-s", "--format=%ct", sha))
    except (subprocess.CalledProcessError, ValueError, FileNotFoundError):
        return -1


def kernel_commits_since(sha: str) -> int | None:
    """Commits after ``sha`` (to HEAD) that touch kernels/ (None where git does not know ``sha``)."""
    try:
        return int(_git("rev-list", "--count", f"{sha}..HEAD", "--", "kernels"))
    except (subprocess.CalledProcessError, ValueError, FileNotFoundError):
        return None


def gpu_test_ids() -> list[str]:
    """Today's GPU test ids (``pytest --collect-only -m gpu``; no GPU needed)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                        "tests"], cwd=ROOT, capture_output=True, text=True)
    ids = [ln.strip() for ln in r.stdout.splitlines() if "::" in ln and ln.startswith("tests/")]
    if not ids:
        raise RuntimeError(f"no GPU test collected (pytest rc {r.returncode}): {r.stdout[-500:]}{r.stderr[-500:]}")
    return ids


def latest_outcomes(logs: list[TestLog], when=commit_time) -> dict:
    """Test id -> (outcome, log) of its run on the newest commit (by ``when``; later log names break ties)."""
    latest = {}
    for log in sorted(logs, key=lambda g: (when(g.sha), g.name)):
        for tid, outcome in log.outcomes.items():
            latest[tid] = (outcome, log)
    return latest


def file_table(ids: list[str], logs: list[TestLog], when=commit_time, since=kernel_commits_since) -> list[dict]:
    """One row per GPU test file: tests now, passed / failed / not run in their latest runs, the oldest commit among
    the passes and the kernel commits since it. Ids that no longer exist are left out."""
    times = {g.sha: when(g.sha) for g in logs}  # one git call per commit, not one per test
    when = times.__getitem__
    latest = latest_outcomes(logs, when)
    by_file: dict[str, list[str]] = {}
    for tid in ids:
        by_file.setdefault(tid.split("::", 1)[0], []).append(tid)
    rows = []
    for f, tids in sorted(by_file.items()):
        got = [latest[t] for t in tids if t in latest]
        passed = [lg for o, lg in got if o in ("PASSED", "SKIPPED", "XFAIL")]
        failed = sum(o in ("FAILED", "ERROR", "XPASS") for o, _ in got)
        oldest = min(passed, key=lambda lg: when(lg.sha), default=None)
        rows.append(dict(file=f, tests=len(tids), passed=len(passed), failed=failed, not_run=len(tids) - len(got),
                         oldest_sha=oldest.sha if oldest else "", card=oldest.card if oldest else "",
                         kernel_commits_since=since(oldest.sha) if oldest else None))
    return rows


def next_files(rows: list[dict]) -> list[str]:
    """Files to run next: with a failure or a test never run first, then the most kernel commits since (unknown
    counts as most); files whose every test passed on HEAD's kernels (0 commits since) are left out."""
    def key(r):
        open_ = r["failed"] > 0 or r["not_run"] > 0
        since = r["kernel_commits_since"]
        return (not open_, -(since if since is not None else 10**9), r["file"])
    return [r["file"] for r in sorted(rows, key=key)
            if r["failed"] or r["not_run"] or r["kernel_commits_since"] != 0]


def markdown(rows: list[dict]) -> str:
    lines = ["| file | tests | passed | failed | not run | oldest pass at | card | kernel commits since |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        since = "" if r["oldest_sha"] == "" else ("?" if r["kernel_commits_since"] is None
                                                  else str(r["kernel_commits_since"]))
        lines.append(f"| {r['file']} | {r['tests']} | {r['passed']} | {r['failed']} | {r['not_run']} | "
                     f"{r['oldest_sha'][:7]} | {r['card']} | {since} |")
    t = {k: sum(r[k] for r in rows) for k in ("tests", "passed", "failed", "not_run")}
    lines.append(f"| **all** | {t['tests']} | {t['passed']} | {t['failed']} | {t['not_run']} | | | |")
    return "\n".join(lines)


def main(args=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.gpu_tests", description=__doc__.splitlines()[0])
    p.add_argument("--logs", type=Path, default=LOGS, help="folder of gputests*.log files (and their README.md)")
    p.add_argument("--files", action="store_true", help="print only the files to run next, space-separated")
    a = p.parse_args(args)
    if not a.logs.is_dir():
        p.error(f"--logs {a.logs}: not a folder")
    rows = file_table(gpu_test_ids(), load_logs(a.logs))
    print(" ".join(next_files(rows)) if a.files else markdown(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
