"""AttnConfig.row_sum_mma (sm90 forward; opt-in): the row sums on the tensor cores, a wgmma of P against a ones tile
after every P V GEMM, instead of one FADD per P element (kernels/sm90/fwd.py pv_gemm, softmax.py ``sums``).

CPU tests: the field (dict / hash while off, sm100 refuses it, forward-only) and the machine code of the K/V loop: the
per-element FADDs gone, tile_n/16 more HGMMAs (the m64n8 chain), no local memory, at every head dim, causal both.
The GPU checks (accuracy against fp32, every switch it touches) are in tests/test_fwd_row_sum_mma_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from fwd_switch_checks import check_forward_field, loop_ops  # noqa: E402
from kernels.config import AttnConfig  # noqa: E402
from kernels.sm90.sass import find_nvdisasm  # noqa: E402


def test_field_stays_out_of_dicts_while_off_and_is_forward_only():
    check_forward_field("row_sum_mma")
    assert "row_sum_mma" not in AttnConfig().resolve("sm90", 128, False).to_dict()  # not a default


def test_ones_tile_fits_the_shared_memory_of_every_head_dim():
    import cutlass

    from kernels.sm90.fwd import FlashFwdSm90

    for hdim, hdim_v in ((64, 64), (128, 128), (192, 128), (256, 256)):
        cfg = AttnConfig(row_sum_mma=True).resolve("sm90", hdim, False)
        k = FlashFwdSm90(cutlass.BFloat16, hdim, hdim_v, False, tile_m=cfg.tile_m, tile_n=cfg.tile_n,
                         num_stages=cfg.num_stages, consumer_regs=cfg.consumer_regs,
                         producer_regs=cfg.producer_regs, row_sum_mma=True)
        assert k.row_sum_mma
    with pytest.raises(ValueError, match="shared memory"):  # the margin it may use is one KB, not more
        FlashFwdSm90(cutlass.BFloat16, 256, 256, False, tile_n=96, row_sum_mma=True)


def _loop(hdim, causal, rsm, tmp_path):
    # the eager step's loop (row_sum_mma drops speculative_exp, the hd 64 / 128 / (192, 128) default since session 52)
    cfg = AttnConfig(row_sum_mma=rsm or None, speculative_exp=False).resolve("sm90", hdim, causal)
    ops = [o.split(".")[0] for o in loop_ops(cfg, hdim, causal, str(tmp_path / f"{hdim}{causal}{rsm}"))]
    return {op: ops.count(op) for op in ("FADD", "HGMMA", "MUFU")}, cfg.tile_n


@pytest.mark.compile
@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed")
@pytest.mark.parametrize("hdim,causal", [(64, False), (128, True), (256, True), (192, False)])
def test_row_sums_leave_the_fma_pipe_for_the_tensor_cores(hdim, causal, tmp_path):
    """The default's loop adds each P element into its row sum (one FADD per element, tile_n / 4 per row, 2 rows per
    thread and loop step); row_sum_mma's loop has at most 2 FADDs per row left, tile_n / 16 more HGMMAs, the same
    MUFU count."""
    (base, tile_n), (rsm, _) = _loop(hdim, causal, False, tmp_path), _loop(hdim, causal, True, tmp_path)
    assert base["FADD"] >= 2 * tile_n // 4, base
    assert rsm["FADD"] <= 4, rsm
    assert rsm["HGMMA"] == base["HGMMA"] + tile_n // 16
    assert rsm["MUFU"] == base["MUFU"]
