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
    assert metadata.provenance()["git_dirty"] is True


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
