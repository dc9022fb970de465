"""`python run.py tune` searches p_smem_early (one sP tile per K/V stage, with p_smem only) and q_regs_k (the first
1 / 2 / 4 k-blocks of Q in registers, without q_in_regs only), both opt-in since session 57: off in the table, their
one-field neighbours come before the pair cover, the job keys of searches from before them stay the same, and a tuned
entry with them resolves. CPU only (the kernel constructor's checks need cutlass-dsl, no compilation)."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig, table_defaults


def test_table_defaults_are_off():
    for hdim in (64, 128, 192, 256):
        for causal in (False, True):
            d = table_defaults("sm90", hdim, causal, tuned=False)
            assert d["p_smem_early"] is False and d["q_regs_k"] == 0


def test_a_tuned_entry_with_them_resolves(monkeypatch):
    import kernels.config as C

    monkeypatch.setattr(C, "TUNED", {("sm90", 256, True): {"q_regs_k": 4},
                                     ("sm90", 64, False): {"p_smem": True, "p_smem_early": True}})
    assert AttnConfig().resolve("sm90", 256, True).q_regs_k == 4
    assert AttnConfig(q_regs_k=2).resolve("sm90", 256, True).q_regs_k == 2  # an explicit field wins
    r = AttnConfig().resolve("sm90", 64, False)
    assert r.p_smem and r.p_smem_early


def test_register_floor_counts_q_k_blocks():
    from experiments.tune_space import register_floor

    p = {"tile_m": 128, "tile_n": 80, "q_in_regs": False, "p_smem": False}
    assert register_floor({**p, "q_regs_k": 4}, 256) == register_floor(p, 256) + 16  # 64 x 64 bf16 / 128 threads
    assert register_floor({**p, "q_in_regs": True}, 256) == register_floor(p, 256) + 64  # all 16 k-blocks


def test_raw_points_pair_them_only_where_they_mean_something():
    from experiments.tune_space import _raw_points

    pts = list(_raw_points("fwd"))
    assert not any(p["p_smem_early"] and not p["p_smem"] for p in pts)
    assert not any(p["q_regs_k"] and p["q_in_regs"] for p in pts)
    assert {p["q_regs_k"] for p in pts} == {0, 1, 2, 4}


@pytest.mark.parametrize("causal", [False, True])
def test_hd256_space_has_q_regs_k_and_its_neighbour_comes_early(causal):
    pytest.importorskip("cutlass")
    from experiments.tune_space import _changed, candidates, default_point, factors, valid_points, why_invalid

    base = default_point("sm90", 256, causal, "fwd")
    assert base["q_regs_k"] == 0 and base["q_in_regs"] is False
    for k in (1, 2, 4):
        assert why_invalid({**base, "q_regs_k": k}, "sm90", 256, causal, "fwd") is None
    valid = valid_points("sm90", 256, causal, "fwd")
    assert {**base, "q_regs_k": 4} in valid
    cands = candidates("sm90", 256, causal, "fwd", valid)
    n_ofat = next(i for i, p in enumerate(cands) if len(_changed(p, factors(base))) > 1)
    for k in (1, 2, 4):
        assert {**base, "q_regs_k": k} in cands[:n_ofat]  # one-field neighbours, before the pair cover


def test_hd64_p_smem_early_fits_128_wide_blocks_not_192():
    pytest.importorskip("cutlass")
    from experiments.tune_space import default_point, valid_points, why_invalid

    base = {**default_point("sm90", 64, False, "fwd"), "p_smem": True}
    assert why_invalid({**base, "p_smem_early": True}, "sm90", 64, False, "fwd") is None
    # one sP tile per K/V stage beside two 192-wide K / V stages: the kernel's shared-memory check refuses it
    wide = {**base, "tile_n": 192, "p_smem_early": True}
    assert "shared memory" in (why_invalid(wide, "sm90", 64, False, "fwd") or "")
    valid = valid_points("sm90", 64, False, "fwd")
    assert {**base, "p_smem_early": True} in valid and wide not in valid


def test_job_config_leaves_them_out_at_their_defaults():
    from experiments.tune_space import job_config

    point = {"tile_m": 128, "tile_n": 80, "p_smem": False, "p_smem_early": False, "q_regs_k": 0}
    got = job_config(point, "sm90", 256, False)
    assert "p_smem_early" not in got and "q_regs_k" not in got
    assert job_config({**point, "q_regs_k": 1}, "sm90", 256, False)["q_regs_k"] == 1
    assert job_config({**point, "p_smem": True, "p_smem_early": True}, "sm90", 256, False)["p_smem_early"] is True
