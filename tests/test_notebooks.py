"""Every notebook (analysis/notebooks/*.py, jupytext percent format) executes on the CPU as a plain script
against the committed results; ``analysis.figures.main`` (python run.py figures) runs them all and, given
rows, writes the figures. Figures go to a temporary folder, never into the repository."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import ablation_figs as A, numerics_figs as N, paper_figs as P, roofline_figs as R
from analysis import figures as F
from analysis import select as S, tables as T

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = F.notebook_paths()


def test_every_notebook_is_listed():
    on_disk = sorted(p.name for p in (ROOT / "analysis" / "notebooks").glob("*.py"))
    assert on_disk == sorted(F.NOTEBOOKS)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_jupytext_percent(nb):
    jupytext = pytest.importorskip("jupytext")
    book = jupytext.read(nb, fmt="py:percent")
    kinds = [c.cell_type for c in book.cells]
    assert kinds.count("markdown") >= 1 and kinds.count("code") >= 2


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_on_committed_results(nb, tmp_path):
    env = dict(os.environ, FA4LAB_FIGURES=str(tmp_path), MPLBACKEND="Agg")
    env.pop("FA4LAB_RESULTS", None)
    r = subprocess.run([sys.executable, str(nb)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    # each figure/table call either wrote a file or said why not
    assert "wrote " in out or "no rows for" in out, out[-2000:]
    for line in out.splitlines():
        if line.startswith("wrote "):
            assert Path(line.split()[1]).exists()


def test_figures_main_with_rows(tmp_path, monkeypatch):
    """End to end on a synthetic results tree (a test of the plumbing, not a result)."""
    monkeypatch.setenv("FA4LAB_SCRATCH", "0")  # F.main sets it: setenv first so monkeypatch restores it afterwards
    sys.path.insert(0, str(Path(__file__).parent))
    from test_figures import synthetic

    df = synthetic()
    res = tmp_path / "results"
    groups = {"h200/fwd_peers": (df["kind"] == "attn") & (df["mode"] == "fwd") & df["variant"].isin(["default", "peer"]),
              "h200/fwd_ablation": (df["kind"] == "attn") & (df["mode"] == "fwd") & ~df["variant"].isin(["default", "peer"]),
              "h200/bwd_peers": (df["kind"] == "attn") & (df["mode"] == "bwd") & df["variant"].isin(["default", "peer"]),
              "h200/bwd_ablation": (df["kind"] == "attn") & (df["mode"] == "bwd") & ~df["variant"].isin(["default", "peer"]),
              "cpu/numerics": df["kind"].isin(["numerics", "poly"]),
              "h200/compile_time": df["kind"] == "compile_time",
              "h200/microbench": df["kind"] == "microbench",
              "fwd_peers": df["kind"] == "compile_time"}  # a scratch run: not drawn without --scratch
    for sub, mask in groups.items():
        p = res / sub / "rows.jsonl"
        p.parent.mkdir(parents=True)
        rows = df[mask].drop(columns=[c for c in df.columns if c.startswith("config.")]).to_dict("records")
        p.write_text("".join(json.dumps({k: v for k, v in r.items() if v == v}) + "\n" for r in rows))
    figs = tmp_path / "figs"
    # the run.py entry: returns an exit code, takes --results / --out and sets FA4LAB_* for the notebooks;
    # setting them here first makes monkeypatch restore the environment afterwards
    monkeypatch.setenv("FA4LAB_RESULTS", "unset")
    monkeypatch.setenv("FA4LAB_FIGURES", "unset")
    assert F.main(["--results", str(res), "--out", str(figs)]) == 0
    names = {p.name for p in figs.glob("*.png")}
    assert {"fig4_fwd.png", "fig5_fwd_hd192_128.png", "fig6_bwd.png", "fig7_bwd_det_causal.png",
            "fig8_bwd_det_noncausal.png", "ablation_speedups.png", "ablation_waterfall.png", "numerics_tau_exp2.png",
            "microbench_exp2_mix.png", "roofline_pred_vs_measured.png", "roofline_tile_cycles_hd128.png"} <= names
    assert (figs / "table2_poly_accuracy.md").exists() and (figs / "table4_compile_time.md").exists()
    assert "from the committed sets" in (figs / "index.md").read_text()
    (figs / "stale.png").write_text("from an older run")
    assert F.main(["--results", str(res), "--out", str(figs), "--scratch"]) == 0
    assert "scratch runs" in (figs / "index.md").read_text() and not (figs / "stale.png").exists()
    index = (figs / "index.md").read_text()
    assert "![fig4_fwd.png](fig4_fwd.png)" in index
