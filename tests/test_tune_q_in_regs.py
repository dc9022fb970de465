"""`python run.py tune` searches q_in_regs (the hd128 forward's default): only where the tile takes Q in registers
(kernels/config.py q_in_regs_fits), with the Q fragment in the register floor, its one-field neighbour early, the
job keys of searches from before the field unchanged, and a tuned tile that cannot take it resolving without it.
CPU only (the kernel constructor's checks need cutlass-dsl, no compilation)."""
from __future__ import annotations

import pytest

from kernels.config import AttnConfig, q_in_regs_fits, table_defaults


def test_fits_rule_and_table_defaults():
    assert q_in_regs_fits(128, 128, 0.0) and q_in_regs_fits(128, 64, 0.25)
    assert not q_in_regs_fits(192, 128, 0.0) and not q_in_regs_fits(128, 144, 0.0)
    assert not q_in_regs_fits(128, 128, 0.5)
    assert table_defaults("sm90", 128, False, tuned=False)["q_in_regs"] is True
    assert table_defaults("sm90", 128, True, tuned=False)["q_in_regs"] is True
    for hdim in (64, 192, 256):
        assert table_defaults("sm90", hdim, False, tuned=False)["q_in_regs"] is False


def test_a_tuned_tile_that_cannot_take_q_resolves_without_it(monkeypatch):
    import kernels.config as C

    monkeypatch.setattr(C, "TUNED", {("sm90", 128, False): {"tile_n": 144}})
    r = AttnConfig().resolve("sm90", 128, False)
    assert r.tile_n == 144 and not r.q_in_regs  # the rule reads the tuned tile, not the table's
    assert table_defaults("sm90", 128, False)["q_in_regs"] is False
    monkeypatch.setattr(C, "TUNED", {("sm90", 128, False): {"q_in_regs": False}})
    assert AttnConfig().resolve("sm90", 128, False).q_in_regs is False
    assert AttnConfig(q_in_regs=True).resolve("sm90", 128, False).q_in_regs is True  # an explicit field wins


@pytest.mark.parametrize("hdim, causal", [(128, False), (128, True), (64, False)])
def test_space_has_q_in_regs_only_where_it_fits(hdim, causal):
    pytest.importorskip("cutlass")
    from experiments.tune_space import _changed, candidates, default_point, factors, valid_points, why_invalid

    base = default_point("sm90", hdim, causal, "fwd")
    assert base["q_in_regs"] is (hdim == 128)
    valid = valid_points("sm90", hdim, causal, "fwd")
    on = [p for p in valid if p["q_in_regs"]]
    assert on and all(q_in_regs_fits(p["tile_m"], p["tile_n"], p["exp2_emu_fraction"]) for p in on)
    assert any(not p["q_in_regs"] and p["tile_m"] == 128 and p["tile_n"] <= 128 for p in valid)
    wide = {**base, "q_in_regs": True, "tile_m": 192, "consumer_regs": 160, "producer_regs": 32}
    assert "q_in_regs" in (why_invalid(wide, "sm90", hdim, causal, "fwd") or "")
    cands = candidates("sm90", hdim, causal, "fwd", valid)
    fb = factors(base)
    n_ofat = next(i for i, p in enumerate(cands) if len(_changed(p, fb)) > 1)
    if hdim == 128:
        assert {**base, "q_in_regs": False} in cands[:n_ofat]  # its one-field neighbour, before the pair cover
        # a wider tile is still a one-field neighbour: it runs without Q in registers
        assert any(p["tile_n"] > 128 and not p["q_in_regs"] for p in cands[:n_ofat])
    else:  # hd64's 192-row default cannot take Q: the 128-row candidates with it come in the pair cover
        assert why_invalid({**base, "q_in_regs": True}, "sm90", hdim, causal, "fwd")
        assert any(p["q_in_regs"] for p in cands[n_ofat:])


def test_register_floor_counts_the_q_fragment():
    from experiments.tune_space import register_floor

    p = {"tile_m": 128, "tile_n": 128, "q_in_regs": False}
    assert register_floor({**p, "q_in_regs": True}, 128) == register_floor(p, 128) + 32  # 64 x 128 bf16 / 128 threads
    assert register_floor({**p, "q_in_regs": True}, 64) == register_floor(p, 64) + 16


def test_job_configs_leave_out_the_value_it_resolves_to():
    from experiments.tune_space import job_config

    point = {"tile_m": 128, "tile_n": 128, "num_stages": 2, "consumer_regs": 240, "producer_regs": 24,
             "exp2_emu_fraction": 0.0, "pingpong": True, "rescale_before_pv": False}
    # hd128: on by default, so q_in_regs=True is left out and False is written; hd64: the reverse
    assert "q_in_regs" not in job_config({**point, "q_in_regs": True}, "sm90", 128, False)
    assert job_config({**point, "q_in_regs": False}, "sm90", 128, False)["q_in_regs"] is False
    assert "q_in_regs" not in job_config({**point, "q_in_regs": False}, "sm90", 64, False)
    assert job_config({**point, "q_in_regs": True}, "sm90", 64, False)["q_in_regs"] is True
    # a tile that cannot take it resolves without it, so False there is left out at hd128 too
    assert "q_in_regs" not in job_config({**point, "tile_n": 144, "q_in_regs": False}, "sm90", 128, False)
