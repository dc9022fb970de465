"""The README's results block is what `python run.py figures` makes from the committed rows (no hand-typed numbers)."""
from pathlib import Path

from analysis.readme import BEGIN, END, current_block

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_block_matches_the_committed_rows(monkeypatch):
    monkeypatch.setenv("FA4LAB_SCRATCH", "0")
    monkeypatch.setenv("FA4LAB_RESULTS", str(ROOT / "results"))
    text = (ROOT / "README.md").read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == current_block(ROOT / "results"), "rerun: python run.py figures"


def test_round_robin_table_inverts_for_our_variants():
    import pandas as pd

    from analysis.readme import round_robin_table

    rows = pd.DataFrame([dict(metric="time_ratio", status="ok", backend=b, variant=v, baseline="fa4", mode="bwd",
                              hdim=128, causal=False, seqlen_q=8192, value=x, n=10,
                              throttled_share=0.1, git_sha="abc")
                         for b, v, x in (("sdpa_cudnn", "peer", 1.25), ("fa4", "deterministic", 1.25))])
    assert round_robin_table(rows, "bwd", "sdpa_cudnn").loc[0, "8k"] == "1.25"  # ours 1.25x faster than cuDNN
    assert round_robin_table(rows, "bwd", "fa4", "deterministic", invert=True).loc[0, "8k"] == "0.80"
    assert round_robin_table(rows, "fwd", "sdpa_cudnn").empty


def test_variant_cells_that_compiled_the_default_kernel_are_left_out():
    """hd256's default is the 2-CTA kernel: its two_cta variant is the default's kernel timed against itself."""
    import pandas as pd

    from analysis.readme import round_robin_table

    rows = pd.DataFrame([dict(metric="time_ratio", status="ok", backend="fa4", variant=v, baseline="fa4", mode="bwd",
                              hdim=h, hdim_v=h, causal=False, seqlen_q=8192, value=x, n=10, compiled_hash=k,
                              baseline_compiled_hash=b, throttled_share=0.1, git_sha="abc")
                         for v, h, x, k, b in (("two_cta", 256, 1.0, "A", "A"), ("two_cta", 128, 1.25, "T", "B"),
                                               ("one_cta", 256, 1.15, "O", "A"))])
    two = round_robin_table(rows, "bwd", "fa4", "two_cta", invert=True)
    assert list(two["hdim"]) == ["128"] and two.loc[0, "8k"] == "0.80"
    assert round_robin_table(rows, "bwd", "fa4", "one_cta", invert=True).loc[0, "8k"] == "0.87"


def test_the_block_has_table4_when_compile_time_rows_exist():
    import pandas as pd

    from analysis.readme import results_block

    rows = [dict(kind="compile_time", experiment="compile_time", status="ok", backend=b, metric=m, value=v, mode="fwd",
                 hdim=128, hdim_v=128, causal=False, gpu_name="NVIDIA H200", sample=i)
            for i in range(3) for b, m, v in (("fa4", "first_call_s", 2.0), ("fa4_official", "first_call_s", 5.0),
                                              ("fa4", "second_call_s", 0.001), ("fa4_official", "second_call_s", 0.002))]
    block = results_block(pd.DataFrame(rows))
    assert "Compile time (paper Table 4; median over fresh processes" in block
    assert ("| mode | head_dim | causal | ours first call (s) | FA4 official first call (s) | ratio (official / ours) | "
            "ours cached call (s) | FA4 official cached call (s) | ours samples | FA4 official samples |") in block
    assert "| fwd | 128 | no | 2 | 5 | 2.5 | 0.001 | 0.002 | 3 | 3 |" in block
    assert "no rows yet (experiment compile_time)" in results_block(pd.DataFrame())


def test_flags_mark_what_a_reviewer_cannot_take_as_is():
    import pandas as pd

    from analysis.select import cell_flags

    ok = dict(kind="attn", rr_entries=["fa4", "fa4_official"], n=10, throttled_share=0.2, git_sha="abc")
    assert cell_flags(pd.DataFrame([ok])) == ""
    assert cell_flags(pd.DataFrame([dict(ok, n=9)])) == "°"
    assert cell_flags(pd.DataFrame([ok, dict(ok, throttled_share=None)])) == "‡"
    assert cell_flags(pd.DataFrame([dict(ok, git_sha=None)])) == "‡"
    assert cell_flags(pd.DataFrame([dict(ok, rr_entries=None, throttled_share=None, git_sha=None)])) == "†‡"


def test_switch_table_from_round_robin_ablation_rows():
    import pandas as pd

    from analysis.readme import results_block, switch_table

    base = dict(metric="time_ratio", status="ok", backend="fa4", baseline="fa4[full]", mode="fwd", hdim=128, hdim_v=128,
                causal=False, seqlen_q=8192, seqlen_k=8192, batch=4, heads=16, n=10, throttled_share=0.1, git_sha="abc",
                gpu_name="NVIDIA H200", experiment="fwd_ablation", kind="attn", baseline_compiled_hash="FULL",
                job_key="j", run_id="r", time="2026-11-30T12:00:00+00:00")
    rows = [dict(base, variant="no_pingpong", value=1.25, p20=1.2, p80=1.3, compiled_hash="A"),  # t_off / t_full
            dict(base, variant="two_cta", mode="bwd", value=0.8, p20=0.78, p80=0.82, compiled_hash="B"),  # on: 1 / r
            dict(base, variant="no_exp2_emu", value=0.9, p20=0.8, p80=1.0, compiled_hash="FULL")]  # same kernel
    t, used = switch_table(pd.DataFrame(rows))
    t = t.set_index(["mode", "switch"])
    assert t.loc[("fwd", "pingpong"), "8k"] == "1.25" and t.loc[("bwd", "2-CTA (on)"), "8k"] == "1.25"
    assert "exp2 emulation" not in t.index.get_level_values("switch")  # compiles full's kernel: no switch measured
    assert t.loc[("fwd", "pingpong"), "noise"] == "0.80-1.00"  # the identical kernel's p20/p80, as a speedup
    assert t.loc[("bwd", "2-CTA (on)"), "noise"] == "not measured"
    assert "Ablations, speedup of each switch" in results_block(pd.DataFrame(rows))


def test_same_kernel_table_gives_the_a_a_pairs_spread_only():
    import pandas as pd

    from analysis.readme import results_block, same_kernel_table

    base = dict(metric="time_ratio", status="ok", backend="fa4", baseline="fa4", mode="bwd", hdim=128, hdim_v=128,
                causal=False, seqlen_q=8192, seqlen_k=8192, batch=4, heads=16, n=10, throttled_share=0.1, git_sha="abc",
                gpu_name="NVIDIA H200", experiment="bwd_peers", kind="attn", baseline_compiled_hash="DEF",
                job_key="j", run_id="r", time="2026-12-03T12:00:00+00:00")
    rows = [dict(base, variant="one_cta", value=1.0, p20=0.95, p80=1.04, compiled_hash="DEF"),  # the default's kernel
            dict(base, variant="deterministic", value=1.05, p20=1.02, p80=1.08, compiled_hash="DET"),  # another one
            dict(base, variant="default", value=1.0, p20=1.0, p80=1.0, compiled_hash="DEF")]  # the baseline itself
    t, used = same_kernel_table(pd.DataFrame(rows), "bwd")
    assert list(used["variant"]) == ["one_cta"]
    assert t.set_index(["hdim", "causal"]).loc[("128", "no"), "8k"] == "0.96-1.05"  # speed: 1 / (0.95-1.04)
    assert "the rounds' noise" in results_block(pd.DataFrame(rows))
    t, used = same_kernel_table(pd.DataFrame(rows[1:]), "bwd")
    assert t.empty and used.empty
