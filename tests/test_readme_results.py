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


def test_round_robin_table_inverts_for_our_variants():
    import pandas as pd

    from analysis.readme import round_robin_table

    rows = pd.DataFrame([dict(metric="time_ratio", status="ok", backend=b, variant=v, baseline="fa4", mode="bwd",
                              hdim=128, causal=False, seqlen_q=8192, value=x, n=10)
                         for b, v, x in (("sdpa_cudnn", "peer", 1.25), ("fa4", "deterministic", 1.25))])
    assert round_robin_table(rows, "bwd", "sdpa_cudnn").loc[0, "8k"] == "1.25"  # ours 1.25x faster than cuDNN
    assert round_robin_table(rows, "bwd", "fa4", "deterministic", invert=True).loc[0, "8k"] == "0.80"
    assert round_robin_table(rows, "fwd", "sdpa_cudnn").empty
