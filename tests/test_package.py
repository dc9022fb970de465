"""Issue 13.1: the installed distribution is the `fa4lab` package (kernels/ as fa4lab.kernels), importable from
any directory, and it installs no top-level `kernels` that would shadow the unrelated PyPI package."""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib.util, sys, torch
import fa4lab
from fa4lab import attention, AttnConfig, ConfigError, InputError, attention_model, attention_exact
print("FILE", fa4lab.kernels.__file__)
spec = importlib.util.find_spec("kernels")
print("TOPLEVEL", spec.origin if spec else None)
try:
    AttnConfig(bogus=1)
except ConfigError as e:
    print("ERR", e)
q = torch.randn(1, 64, 2, 64, dtype=torch.float64)
print("MODEL", float((attention_model(q.bfloat16(), q.bfloat16(), q.bfloat16()).double()
                       - attention_exact(q, q, q)).abs().max()))
"""


def _probe(cwd: Path, env_extra: dict | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(env_extra or {})
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def _check(out: dict[str, str], where: Path) -> None:
    assert Path(out["FILE"]).resolve().is_relative_to(where.resolve()), out["FILE"]
    assert out["TOPLEVEL"] == "None" or not Path(out["TOPLEVEL"]).resolve().is_relative_to(ROOT), out["TOPLEVEL"]
    assert out["ERR"].startswith("unknown AttnConfig field 'bogus'; fields: rescale_threshold")
    assert float(out["MODEL"]) < 0.05


def _setuptools_ok() -> bool:
    try:
        import setuptools

        return int(setuptools.__version__.split(".")[0]) >= 68
    except ImportError:
        return False


@pytest.mark.slow
def test_pip_install_target_imports_from_anywhere(tmp_path):
    """`pip install .` (into a target folder): fa4lab and fa4lab.kernels come from there, not from the repo."""
    src, target = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "fa4lab", "kernels"):  # a copy: the build leaves the repo alone
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
           "--target", str(target), str(src)]
    if _setuptools_ok():
        cmd.insert(5, "--no-build-isolation")  # offline-friendly: the installed setuptools builds it
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) == ["fa4lab"]
    assert (target / "fa4lab" / "kernels" / "sm90" / "fwd.py").is_file()
    work = tmp_path / "elsewhere"
    work.mkdir()
    _check(_probe(work, {"PYTHONPATH": str(target)}), target)


def test_installed_package_imports_outside_the_repo(tmp_path):
    """The environment's install (`pip install -e .` in CI) serves `import fa4lab` from any directory."""
    try:
        importlib.metadata.distribution("fa4lab")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fa4lab is not installed in this environment (pip install -e .)")
    _check(_probe(tmp_path), ROOT / "kernels")


def test_repo_kernels_and_fa4lab_share_classes():
    """Imported in the repository after the harness's `kernels`, fa4lab reuses it: one AttnConfig class."""
    code = "import kernels, fa4lab; assert fa4lab.AttnConfig is kernels.AttnConfig; print('same')"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-2000:]


def test_every_kernels_subpackage_is_packaged():
    """`pip install .` ships only the listed packages: each folder of kernels/ with an __init__.py must be listed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"fa4lab.kernels" + "".join("." + part for part in p.parent.relative_to(ROOT / "kernels").parts)
             for p in (ROOT / "kernels").rglob("__init__.py")}
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"
