"""The README's results block is what `python run.py figures` makes from the committed rows (no hand-typed numbers)."""
from pathlib import Path

from analysis.readme import BEGIN, END, results_block
from analysis.select import ATTN_EXPERIMENTS, load_experiments

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_block_matches_the_committed_rows(monkeypatch):
    monkeypatch.setenv("FA4LAB_SCRATCH", "0")
    monkeypatch.setenv("FA4LAB_RESULTS", str(ROOT / "results"))
    text = (ROOT / "README.md").read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == results_block(load_experiments(*ATTN_EXPERIMENTS)), "rerun: python run.py figures"
