"""scripts/cta_timeline.py and FlashFwdSm90's trace_ctas (per-CTA %globaltimer of the persistent forward): the stats of
a traced call on synthetic traces, the script's answer without a GPU, and the machine code (the trace reads the global
timer only when asked; persistent kernels only). The trace itself is read on the GPU host."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import cta_timeline  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_call_stats_of_a_synthetic_trace():
    # 4 CTAs start at 1000-1300 ns; the later warpgroup's end counts; one CTA ends about 39 us after the others
    trace = [[1000, 50_000, 51_000, 0], [1100, 50_500, 50_000, 1], [1300, 51_000, 50_900, 2],
             [1000, 90_000, 89_000, 3], [0, 0, 0, 0]]
    st = cta_timeline.call_stats(trace, 4)
    assert st["span_us"] == pytest.approx(89.0)
    assert st["end_spread_us"] == pytest.approx(39.5)
    assert st["start_spread_us"] == pytest.approx(0.3)
    assert st["end_offsets_us"] == pytest.approx([49.5, 50.0, 50.0, 89.0])
    # idle after each CTA's end up to the last end, over grid x span
    assert st["tail_idle_share"] == pytest.approx((39_000 + 39_500 + 39_000 + 0) / (4 * 89_000))


def test_balanced_trace_has_no_tail():
    st = cta_timeline.call_stats([[0 + 5, 100_005, 100_005, i] for i in range(8)], 8)
    assert st["end_spread_us"] == 0 and st["tail_idle_share"] == 0


def test_script_without_a_gpu_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert cta_timeline.main(["--reps", "1"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_trace_needs_a_persistent_kernel():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    with pytest.raises(ValueError, match="trace_ctas"):
        FlashFwdSm90(cutlass.BFloat16, 128, 128, False, trace_ctas=True)
    assert FlashFwdSm90(cutlass.BFloat16, 128, 128, False, persistent=True, trace_ctas=True).trace_ctas


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("causal", [False, True], ids=["split_tail", "dynamic"])
def test_traced_kernel_reads_the_global_timer_and_the_plain_one_does_not(causal, tmp_path):
    """The default 16k call (hd128: persistent with the split tail non-causal, tiles claimed at run time causal),
    compiled with and without the trace: only the traced one reads %globaltimer (and the SM id)."""
    from kernels.config import AttnConfig, call_config
    from kernels.sm90.compile import make_fwd_kernel
    from sass_cache import kernel_sass

    cfg = call_config(AttnConfig().resolve("sm90", 128, causal), "sm90", 128, causal, 16384)
    assert cfg.persistent and (cfg.persistent_dynamic if causal else cfg.split_tail)
    plain = kernel_sass(make_fwd_kernel(cfg, "bfloat16", 128, 128, causal), str(tmp_path / "plain"))
    traced = kernel_sass(make_fwd_kernel(cfg, "bfloat16", 128, 128, causal, trace_ctas=True), str(tmp_path / "tr"))
    assert "SR_GLOBALTIMER" not in plain and "SR_GLOBALTIMER" in traced
    assert "SR_VIRTUALSMID" in traced


def test_plot_of_synthetic_rows(tmp_path):
    rows = [dict(variant=name, hdim=128, seqlen=4096, batch=8, causal=False,
                 end_offsets_us=[100.0 + i * step for i in range(8)]) for name, step in (("pers", 5.0), ("dyn", 0.5))]
    out = tmp_path / "tl.png"
    cta_timeline.plot(rows, str(out))
    assert out.stat().st_size > 1000
