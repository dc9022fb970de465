"""Relabel rows whose git_sha names the wrong commit: rows written on a host whose copy of the working tree sat over
an older .git (the GPU host's copies before experiments/metadata.py preferred $FA4LAB_GIT_SHA for a modified tree)
name that old HEAD with ``git_dirty: true``, while their ``kernels_hash`` says which kernels ran.

``python -m experiments.relabel SET [SET ...]`` (a set's folder, e.g. results/h200/bwd_peers): for every row with
git_dirty true whose kernels_hash is not that of kernels/ at its git_sha, git_sha becomes the earliest commit (of this
repository's history) whose kernels/ has the row's kernels_hash; the old value is kept as ``git_sha_repo``,
``git_sha_source`` becomes 'kernels_hash' and git_dirty None. Rows with no such commit are left as they are. Both the
archive and the live file are rewritten in place, rows in their order."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from experiments import metadata
from experiments.results import _archive_text, _lines, _write_archive, live_path


def _git(*args: str, repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def kernels_hash_at(commit: str, repo: Path) -> str | None:
    """metadata.kernels_hash() of kernels/ at ``commit`` (None: no such commit or no kernels/ there)."""
    arch = subprocess.run(["git", "-C", str(repo), "archive", commit, "kernels"], capture_output=True)
    if arch.returncode != 0:
        return None
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["tar", "-x", "-C", d], input=arch.stdout, check=True)
        return metadata.kernels_hash(Path(d))


def commits_by_kernels_hash(repo: Path) -> dict[str, str]:
    """kernels_hash -> the earliest commit (full sha) whose kernels/ has it, over the whole history."""
    out, trees = {}, set()
    for c in _git("rev-list", "--reverse", "--all", repo=repo).split():
        t = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{c}:kernels"], capture_output=True, text=True)
        if t.returncode != 0 or t.stdout in trees:
            continue
        trees.add(t.stdout)
        k = kernels_hash_at(c, repo)
        if k is not None:
            out.setdefault(k, c)
    return out


def relabel_rows(rows: list[dict], repo: Path, by_hash: dict[str, str], at: dict) -> int:
    """Fix rows in place (see the module doc); ``at`` caches kernels_hash_at. Returns rows changed."""
    n = 0
    for r in rows:
        sha, k = r.get("git_sha"), r.get("kernels_hash")
        if r.get("git_dirty") is not True or not sha or not k:
            continue
        if sha not in at:
            at[sha] = kernels_hash_at(sha, repo)
        if at[sha] == k or k not in by_hash:
            continue
        r.update(git_sha=by_hash[k], git_sha_source="kernels_hash", git_dirty=None, git_sha_repo=sha)
        n += 1
    return n


def relabel_set(folder: str | Path, repo: Path, by_hash: dict[str, str], at: dict) -> int:
    live = live_path(folder)
    n = 0
    for path, read, write in ((live.with_name(live.name + ".xz"), _archive_text, _write_archive),
                              (live, lambda p: p.read_text() if p.exists() else "", lambda p, t: p.write_text(t))):
        rows = [r for _, r in _lines(read(path))]
        changed = relabel_rows(rows, repo, by_hash, at)
        if changed:
            write(path, "".join(json.dumps(r) + "\n" for r in rows))
        n += changed
    return n


def main(argv=None) -> int:
    sets = (argv if argv is not None else sys.argv[1:])
    if not sets:
        print(__doc__)
        return 2
    repo = metadata.REPO
    by_hash, at = commits_by_kernels_hash(repo), {}
    for s in sets:
        print(f"{s}: {relabel_set(s, repo, by_hash, at)} rows relabelled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
