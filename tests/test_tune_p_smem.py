"""`python run.py tune` searches p_smem (P V reading P from shared memory, opt-in since session 57): P leaves the
register floor, sP joins the kernel's shared-memory budget, so hd64's 192-row tiles reach key blocks up to 192 wide
only with it; its one-field neighbour comes early, the job keys of searches from before the field stay the same, and a
tuned entry with it resolves. CPU only (the kernel constructor's checks need cutlass-dsl, no compilation)."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig, table_defaults


def test_table_default_is_off():
    for hdim in (64, 128, 192, 256):
        for causal in (False, True):
            assert table_defaults("sm90", hdim, causal, tuned=False)["p_smem"] is False


def test_a_tuned_entry_with_it_resolves(monkeypatch):
    import kernels.config as C

    monkeypatch.setattr(C, "TUNED", {("sm90", 64, False): {"tile_n": 192, "p_smem": True}})
    r = AttnConfig().resolve("sm90", 64, False)
    assert r.tile_n == 192 and r.p_smem
    assert AttnConfig(p_smem=False).resolve("sm90", 64, False).p_smem is False  # an explicit field wins


def test_register_floor_leaves_p_out():
    from experiments.tune_space import register_floor

    p = {"tile_m": 192, "tile_n": 192, "q_in_regs": False}
    assert register_floor({**p, "p_smem": True}, 64) == register_floor(p, 64) - 48  # 64 x 192 bf16 / 128 threads


@pytest.mark.parametrize("causal", [False, True])
def test_space_reaches_wide_hd64_blocks_only_with_it(causal):
    pytest.importorskip("cutlass")
    from experiments.tune_space import _changed, candidates, default_point, factors, valid_points, why_invalid

    base = default_point("sm90", 64, causal, "fwd")
    assert base["p_smem"] is False and base["tile_m"] == 192 and base["consumer_regs"] == 160
    wide = {**base, "tile_n": 192}
    assert "registers" in (why_invalid(wide, "sm90", 64, causal, "fwd") or "")
    assert why_invalid({**wide, "p_smem": True}, "sm90", 64, causal, "fwd") is None
    # with three stages sP no longer fits beside K / V: the kernel's shared-memory check refuses it
    assert "shared memory" in (why_invalid({**wide, "p_smem": True, "num_stages": 3}, "sm90", 64, causal, "fwd")
                               or "")
    valid = valid_points("sm90", 64, causal, "fwd")
    assert {**wide, "p_smem": True} in valid
    cands = candidates("sm90", 64, causal, "fwd", valid)
    fb = factors(base)
    n_ofat = next(i for i, p in enumerate(cands) if len(_changed(p, fb)) > 1)
    assert {**base, "p_smem": True} in cands[:n_ofat]  # its one-field neighbour, before the pair cover
    assert any(p["p_smem"] and p["tile_n"] == 192 and p["tile_m"] == 192 for p in cands)  # the pair cover reaches it


def test_job_config_leaves_it_out_when_off():
    from experiments.tune_space import job_config

    point = {"tile_m": 192, "tile_n": 128, "p_smem": False}
    assert "p_smem" not in job_config(point, "sm90", 64, False)
    assert job_config({**point, "p_smem": True}, "sm90", 64, False)["p_smem"] is True
