"""Provenance fields of every row: git SHA (repository or FA4LAB_GIT_SHA), git_dirty only when known, and a hash
of the kernels/ tree."""
import shutil
import subprocess

import pytest

from experiments import metadata


def tree(root, text="x = 1\n"):
    (root / "kernels" / "sm90").mkdir(parents=True)
    (root / "kernels" / "a.py").write_text(text)
    (root / "kernels" / "sm90" / "b.py").write_text("y = 2\n")
    return root


def git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(root), "PATH": "/usr/bin:/bin"})


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git")


def test_copy_without_git_takes_the_sha_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(metadata, "REPO", tree(tmp_path / "copy"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git must not find a repository above tmp_path
    monkeypatch.delenv("FA4LAB_GIT_SHA", raising=False)
    p = metadata.provenance()
    assert p["git_sha"] is None and p["git_sha_source"] is None and p["git_dirty"] is None
    monkeypatch.setenv("FA4LAB_GIT_SHA", "abc123")
    p = metadata.provenance()
    assert (p["git_sha"], p["git_sha_source"], p["git_dirty"]) == ("abc123", "env", None)


@needs_git
def test_a_parent_repository_is_not_ours(tmp_path, monkeypatch):
    """The 2026-11-29 rows: a copy inside some other (empty) repository read git_dirty=False; now it is unknown."""
    git(tmp_path, "init", "-q")
    monkeypatch.setattr(metadata, "REPO", tree(tmp_path / "copy"))
    monkeypatch.setenv("FA4LAB_GIT_SHA", "abc123")
    p = metadata.provenance()
    assert (p["git_sha"], p["git_sha_source"], p["git_dirty"]) == ("abc123", "env", None)


@needs_git
def test_own_repository_gives_head_and_dirty(tmp_path, monkeypatch):
    root = tree(tmp_path / "repo")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "c")
    monkeypatch.setattr(metadata, "REPO", root.resolve())
    monkeypatch.setenv("FA4LAB_GIT_SHA", "ignored-when-the-repository-answers")
    p = metadata.provenance()
    assert len(p["git_sha"]) == 40 and p["git_sha_source"] == "repo" and p["git_dirty"] is False
    (root / "kernels" / "a.py").write_text("x = 2\n")
    monkeypatch.delenv("FA4LAB_GIT_SHA")
    assert metadata.provenance()["git_dirty"] is True and "git_sha_repo" not in metadata.provenance()


@needs_git
def test_modified_copy_over_an_older_git_takes_the_variables_commit(tmp_path, monkeypatch):
    """The GPU host's copies: the working tree of commit B over a .git whose HEAD is an older commit A (tracked files
    modified against A). With FA4LAB_GIT_SHA=B the row names B (source 'env', A kept as git_sha_repo); a clean tree
    at A, or a variable naming A itself, keeps A."""
    root = tree(tmp_path / "repo")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "c")
    monkeypatch.setattr(metadata, "REPO", root.resolve())
    head = metadata.provenance()["git_sha"]
    monkeypatch.setenv("FA4LAB_GIT_SHA", "b" * 7)
    assert metadata.provenance()["git_sha"] == head  # clean: the variable is stale, HEAD wins
    (root / "kernels" / "a.py").write_text("x = 2\n")
    p = metadata.provenance()
    assert (p["git_sha"], p["git_sha_source"], p["git_dirty"], p["git_sha_repo"]) == ("b" * 7, "env", None, head)
    monkeypatch.setenv("FA4LAB_GIT_SHA", head[:7])
    p = metadata.provenance()
    assert (p["git_sha"], p["git_sha_source"], p["git_dirty"]) == (head, "repo", True)


def test_kernels_hash_follows_the_kernel_sources_only(tmp_path, monkeypatch):
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    (b / "README.md").write_text("not a kernel")
    (b / "kernels" / "__pycache__").mkdir()
    (b / "kernels" / "__pycache__" / "a.cpython-311.py").write_text("junk")
    hashes = []
    for root in (a, b):
        monkeypatch.setattr(metadata, "REPO", root)
        hashes.append(metadata.kernels_hash())
    assert hashes[0] == hashes[1] and len(hashes[0]) == 12
    (b / "kernels" / "sm90" / "b.py").write_text("y = 3\n")
    assert metadata.kernels_hash() != hashes[0]


def test_static_metadata_carries_the_provenance_fields():
    md = metadata.static_metadata()
    for k in ("git_sha", "git_sha_source", "git_dirty", "kernels_hash"):
        assert k in md
    assert md["kernels_hash"] and (md["git_dirty"] is None or md["git_sha_source"] == "repo")


@needs_git
def test_relabel_names_the_commit_whose_kernels_ran(tmp_path, monkeypatch):
    """experiments.relabel: a row that names commit A with git_dirty true but carries kernels_hash of commit B gets B
    (git_sha_repo A, source 'kernels_hash'); a row whose kernels match its commit, or whose kernels are in no commit,
    is left alone."""
    import json

    from experiments import relabel
    from experiments.results import read_rows

    root = tree(tmp_path / "repo")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "a")
    a = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    ka = metadata.kernels_hash(root)
    (root / "kernels" / "a.py").write_text("x = 2\n")
    git(root, "commit", "-q", "-am", "b")
    b = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    kb = metadata.kernels_hash(root)
    assert ka != kb
    rows = [dict(i=0, git_sha=a, git_dirty=True, kernels_hash=kb), dict(i=1, git_sha=a, git_dirty=True, kernels_hash=ka),
            dict(i=2, git_sha=a, git_dirty=True, kernels_hash="f" * 12), dict(i=3, git_sha=a, git_dirty=False,
                                                                               kernels_hash=kb)]
    s = tmp_path / "set"
    s.mkdir()
    (s / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(metadata, "REPO", root.resolve())
    assert relabel.main([str(s)]) == 0
    got = read_rows(s / "rows.jsonl")
    assert [r["git_sha"] for r in got] == [b, a, a, a]
    assert got[0]["git_sha_repo"] == a and got[0]["git_sha_source"] == "kernels_hash" and got[0]["git_dirty"] is None
    assert all("git_sha_repo" not in r for r in got[1:])
