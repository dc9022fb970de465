"""AttnConfig: validation with clear errors, resolution from the per-arch table, stable hashing."""
import dataclasses
import subprocess
import sys

import pytest

from kernels import DEFAULTS, AttnConfig, ConfigError
from kernels.config import normalize_arch, quantized_exp2_fraction


@pytest.mark.parametrize("kwargs, needle", [
    (dict(rescale_threshold=-1.0), "rescale_threshold"),
    (dict(rescale_threshold="8"), "rescale_threshold"),
    (dict(exp2_emu_fraction=1.5), "exp2_emu_fraction"),
    (dict(exp2_emu_fraction=True), "exp2_emu_fraction"),
    (dict(pingpong=1), "pingpong"),
    (dict(deterministic="yes"), "deterministic"),
    (dict(two_cta=1), r"two_cta=1: must be None \(per head dim\) or a bool"),
    (dict(two_cta="yes"), "two_cta"),
    (dict(tile_m=100), "tile_m"),
    (dict(tile_n=8), "tile_n"),
    (dict(num_stages=0), "num_stages"),
    (dict(consumer_regs=250), "consumer_regs"),
    (dict(det_schedule="sjf"), "det_schedule"),
    (dict(bwd_tile_m=96), "bwd_tile_m"),
    (dict(bwd_tile_m=72), "bwd_tile_m"),
    (dict(bwd_tile_m=80.0), "bwd_tile_m"),
    (dict(bwd_tile_m=256), "bwd_tile_m"),
])
def test_bad_fields_name_the_field(kwargs, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        AttnConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_unknown_field_and_arch_and_hdim():
    with pytest.raises(ConfigError, match="unknown AttnConfig field"):
        AttnConfig.from_dict({"tau": 4})
    with pytest.raises(ConfigError, match="arch"):
        normalize_arch("sm80")
    with pytest.raises(ConfigError, match="hdim"):
        AttnConfig().resolve("sm90", 96, False)


def test_resolve_fills_every_none_from_the_table():
    from kernels.config import table_defaults

    for (arch, hdim), row in DEFAULTS.items():
        for causal in (False, True):
            r = AttnConfig().resolve(arch, hdim, causal)
            d = table_defaults(arch, hdim, causal)  # the table, with conf/tuned/<arch>.yaml over it where it has an entry
            assert r.is_resolved
            assert r.tile_m == d["tile_m"] and r.tile_n == d["tile_n"]
            assert r.exp2_emu_fraction == d["exp2_emu_fraction"]
            assert table_defaults(arch, hdim, causal, tuned=False)["exp2_emu_fraction"] == row["exp2_emu"][int(causal)]
    explicit = AttnConfig(exp2_emu_fraction=0.5, tile_n=64).resolve("sm90", 128, False)
    assert explicit.exp2_emu_fraction == 0.5 and explicit.tile_n == 64
    assert normalize_arch("sm_90a") == normalize_arch("SM90") == "sm90"


def test_hash_stable_distinct_and_roundtrip():
    a, b = AttnConfig(), AttnConfig(rescale_threshold=0.0)
    assert a.config_hash() == AttnConfig().config_hash() != b.config_hash()
    assert AttnConfig.from_dict(b.to_dict()) == b
    assert len({AttnConfig(pingpong=p, two_cta=t).config_hash() for p in (False, True) for t in (False, True)}) == 4
    # same hash in a fresh interpreter (no per-process salt)
    code = "from kernels import AttnConfig; print(AttnConfig(rescale_threshold=0.0).config_hash())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == b.config_hash()


def test_quantized_fraction():
    assert quantized_exp2_fraction(0.3, 8) == 0.25
    assert quantized_exp2_fraction(1.0, 8) == 1.0
    assert quantized_exp2_fraction(0.0, 16) == 0.0


def test_backward_fields_resolve_and_reject_what_does_not_fit():
    from kernels.tiles import bwd_tile, compiled_config

    from kernels.config import table_defaults

    r = AttnConfig().resolve("sm90", 64, False)
    assert r.bwd_tile_m == table_defaults("sm90", 64, False)["bwd_tile_m"] and r.det_schedule == "rotate"
    assert AttnConfig(bwd_tile_m=128).resolve("sm90", 64, False).bwd_tile_m == 128
    assert compiled_config(AttnConfig(bwd_tile_m=128), "sm90", 64, False, mode="bwd")["tile_m"] == 128
    # forward-only fields do not make two backward kernels
    assert (compiled_config(AttnConfig(pingpong=False, tile_n=64), "sm90", 128, True, mode="bwd")
            == compiled_config(AttnConfig(), "sm90", 128, True, mode="bwd"))
    assert bwd_tile("sm90", 128)[0] == table_defaults("sm90", 128, False)["bwd_tile_m"]
    pytest.importorskip("cutlass")
    from kernels.sm90.backward import compile_backward

    with pytest.raises(ConfigError, match="bwd_tile_m=128 at hdim 128"):
        compile_backward(AttnConfig(bwd_tile_m=128), "bfloat16", 128, False)


def test_bwd_tile_m_80_only_at_hd128_one_cta():
    """bwd_tile_m=80 (dQ^T per warpgroup): hd128's default; the sm90 backward takes it at hdim 128 without two_cta
    and raises ConfigError at hdim 64 / 256 and with an explicit two_cta; a default two_cta config resolves to 64
    rows, and softcap / varlen calls run 64 rows (backward_config)."""
    from kernels.config import table_defaults

    assert AttnConfig(bwd_tile_m=80).resolve("sm90", 128, False).bwd_tile_m == 80
    assert all(table_defaults("sm90", 128, c)["bwd_tile_m"] == 80 for c in (False, True))
    assert all(table_defaults("sm90", d, c)["bwd_tile_m"] != 80 for d in (64, 256) for c in (False, True))
    for causal in (False, True):
        assert AttnConfig().resolve("sm90", 128, causal).bwd_tile_m == 80
        assert AttnConfig(deterministic=True).resolve("sm90", 128, causal).bwd_tile_m == 80
        assert AttnConfig(two_cta=True).resolve("sm90", 128, causal).bwd_tile_m == 64
    pytest.importorskip("cutlass")
    from kernels.sm90.backward import _check_supported, backward_config

    cfg = AttnConfig(two_cta=False).resolve("sm90", 128, False)
    assert backward_config(cfg) is cfg and backward_config(cfg, hdim=128) is cfg
    assert backward_config(AttnConfig().resolve("sm90", 128, False), hdim=128) == cfg  # two_cta None -> False here
    assert backward_config(cfg, softcap=True).bwd_tile_m == 64 and backward_config(cfg, varlen=True).bwd_tile_m == 64
    assert backward_config(cfg, softcap=True, varlen=True) == dataclasses.replace(cfg, bwd_tile_m=64)
    _check_supported(AttnConfig(two_cta=True).resolve("sm90", 128, False), 128, 128)
    from kernels.sm90.bwd import FlashBwdSm90

    _check_supported(AttnConfig(bwd_tile_m=80).resolve("sm90", 128, False), 128, 128)
    _check_supported(AttnConfig(bwd_tile_m=80, deterministic=True).resolve("sm90", 128, True), 128, 128)
    for hdim in (64, 256):
        with pytest.raises(ConfigError, match="bwd_tile_m=80"):
            _check_supported(AttnConfig(bwd_tile_m=80).resolve("sm90", hdim, False), hdim, hdim)
    with pytest.raises(ConfigError, match="bwd_tile_m=80"):
        _check_supported(AttnConfig(bwd_tile_m=80, two_cta=True).resolve("sm90", 128, False), 128, 128)
    import cutlass

    with pytest.raises(ValueError, match="bwd_tile_m=80"):
        FlashBwdSm90(cutlass.BFloat16, 128, False, two_cta=True, tile_m=80)
    k = FlashBwdSm90(cutlass.BFloat16, 128, False, tile_m=80)
    assert k.dq_transposed and k.dq_shape == (64, 80) and k.dq_vals == 40 and k.dq_stages == 1 and k.lse_stride == 96


def test_two_cta_default_rule():
    """two_cta=None: the backward runs 2-CTA where DEFAULTS says so (sm90 hd256 only) and the call allows it (no window
    / softcap, not varlen, (256, 256)); True / False force it; None stays None through resolve() and to_dict()."""
    from kernels.config import PER_CALL_FIELDS, table_defaults, two_cta_by_default

    assert AttnConfig().two_cta is None and "two_cta" in PER_CALL_FIELDS
    assert all("two_cta" in row for row in DEFAULTS.values())
    assert [k for k, row in DEFAULTS.items() if row["two_cta"]] == [("sm90", 256)]
    for causal in (False, True):
        r = AttnConfig().resolve("sm90", 256, causal)
        assert r.is_resolved and r.two_cta is None and "two_cta" not in r.to_dict()
        assert "two_cta" not in table_defaults("sm90", 256, causal)  # a per-call rule, not a field default
    d = AttnConfig()
    assert two_cta_by_default(d, "sm90", 256, 256) is True
    assert two_cta_by_default(None, "sm_90a", 256) is True
    assert two_cta_by_default(d, "sm90", 256, 256, features=True) is False  # window or softcap
    assert two_cta_by_default(d, "sm90", 256, 256, varlen=True) is False
    for hd, hv in ((64, 64), (128, 128), (192, 128)):
        assert two_cta_by_default(d, "sm90", hd, hv) is False
    assert two_cta_by_default(d, "sm100", 256, 256) is False
    assert two_cta_by_default(AttnConfig(two_cta=False), "sm90", 256, 256) is False
    assert two_cta_by_default(AttnConfig(two_cta=True), "sm90", 128, 128) is True
    assert two_cta_by_default(AttnConfig(two_cta=True), "sm90", 256, 256, features=True) is True  # backward's ConfigError
    # resolve()'s 80-row rule: only an explicit two_cta takes hd128's default 80 rows to 64
    assert AttnConfig().resolve("sm90", 128, False).bwd_tile_m == 80
    assert AttnConfig(two_cta=False).resolve("sm90", 128, False).bwd_tile_m == 80
    assert AttnConfig(two_cta=True).resolve("sm90", 128, False).bwd_tile_m == 64
    # hashes: None, False and True are three configs; an explicit False is in the op string, None is not
    assert len({AttnConfig(two_cta=t).config_hash() for t in (None, False, True)}) == 3
    assert AttnConfig(two_cta=False).to_dict()["two_cta"] is False and "two_cta" not in AttnConfig().op_string


def test_compiled_config_reports_the_effective_two_cta():
    """kernels/tiles.py compiled_config(mode='bwd'): the two_cta the backward runs (True at sm90 hd256 by default) and
    its tiles; unchanged dicts at hd64 / 128 / (192, 128) against an explicit two_cta=False; the forward has none."""
    from kernels.tiles import compiled_config

    for causal in (False, True):
        c = compiled_config(None, "sm90", 256, causal, "bwd")
        assert c["two_cta"] is True and c["tile_m"] == 64
        assert compiled_config(AttnConfig(two_cta=False), "sm90", 256, causal, "bwd")["two_cta"] is False
        assert compiled_config(AttnConfig(two_cta=True), "sm90", 256, causal, "bwd") == c
        for hd in (64, 128, 192):
            c = compiled_config(None, "sm90", hd, causal, "bwd")
            assert c["two_cta"] is False and c == compiled_config(AttnConfig(two_cta=False), "sm90", hd, causal, "bwd")
        assert "two_cta" not in compiled_config(None, "sm90", 256, causal, "fwd")
        assert compiled_config(None, "sm100", 256, causal, "bwd")["two_cta"] is False


# ---- rescale_before_pv (sm90 forward, tunable) ------------------------------------------------------------------
# config_hash() of these configs as the code of fa24bdf (before the field existed) computed them: the field must leave
# every existing config, hash, compile key and job key as it was while it is None (unset) or False
HASHES_BEFORE_THE_FIELD = {
    (): "e87b4552bc09", (("pingpong", False),): "e02239161430", (("rescale_threshold", 0.0),): "f377acd35e15",
    (("intra_wg_overlap", False),): "57753b3391f4", (("exp2_emu_fraction", 0.25),): "7c4605c382b4",
    (("deterministic", True),): "f145c3a45b1d", (("two_cta", False),): "d22c75b9b283",
    (("two_cta", True),): "6193509544f1", (("cluster_m", 2),): "5196322554f1", (("pack_gqa", True),): "bc12b76cdc9d",
    (("persistent", True),): "59a51842be2e", (("tile_n", 112),): "573a8b62f921",
    (("rescale_threshold", 0.0), ("exp2_emu_fraction", 0.0), ("pingpong", False)): "c18a2733c513",
}
# every table field explicit (what a tune job or a recorded resolved config holds): the H200 tune rows of hd192 record
# this resolved_config_hash, and fwd_kernel_key's repr hashed to 68a251a98b8a (sha1, 12 digits) at fa24bdf
EXPLICIT = dict(tile_m=128, tile_n=128, num_stages=2, consumer_regs=240, producer_regs=24, exp2_emu_fraction=0.0,
                bwd_tile_m=64, det_schedule="spt", p_cvt_asm=False, pv_wait_mid=False, bwd_pdl=False, q_in_regs=False,
                split_tail=False, lazy_row_max=False, speculative_exp=False)
# det_schedule / p_cvt_asm / pv_wait_mid / bwd_pdl / q_in_regs / split_tail / lazy_row_max / speculative_exp: the
# defaults of those rows
# ("rotate" since 2026-12-01; p_cvt_asm on non-causal since then; pv_wait_mid on at hd128 non-causal later that day;
# bwd_pdl at hd128 since 2026-12-04; q_in_regs at hd128 since session 45; split_tail at hd128 non-causal since session
# 49; lazy_row_max at hd 64 / 128 since session 50; speculative_exp at hd 64 / 128 / (192, 128) since session 52)


def test_rescale_before_pv_leaves_existing_hashes_and_keys_unchanged():
    import hashlib

    from kernels.compile_cache import cache_key
    from kernels.tiles import compiled_config

    for kv, h in HASHES_BEFORE_THE_FIELD.items():
        for extra in ({}, {"rescale_before_pv": None}, {"rescale_before_pv": False}):
            # det_schedule's default was "spt" when these hashes were recorded ("rotate" since 2026-12-01)
            cfg = AttnConfig(**dict(kv), **extra, det_schedule="spt")
            assert cfg.config_hash() == h, (kv, extra)
            assert "rescale_before_pv" not in cfg.to_dict()
    assert AttnConfig().op_string == "{}"
    r = AttnConfig(**EXPLICIT).resolve("sm90", 128, False)
    assert r.rescale_before_pv is False and r.is_resolved and r.config_hash() == "d5a9684cc4b1"
    assert AttnConfig(**EXPLICIT).resolve("sm100", 128, True).config_hash() == "d5a9684cc4b1"
    key = cache_key("fwd", r, "bfloat16", 128, 128, False, "sm90")
    assert hashlib.sha1(repr(key).encode()).hexdigest()[:12] == "68a251a98b8a"
    again = AttnConfig.from_dict(r.to_dict())  # a resolved config rebuilt from its dict (False left out): still resolved
    assert again.rescale_before_pv is None and again.is_resolved
    assert cache_key("fwd", again, "bfloat16", 128, 128, False, "sm90") == key
    for hd in (64, 128, 192, 256):
        for causal in (False, True):
            d = AttnConfig().resolve("sm90", hd, causal)
            # (192, 128) causal ran it from 2026-12-01 to 2026-12-03 (with causal_split); every default is off now
            assert d.rescale_before_pv is False and "rescale_before_pv" not in d.to_dict()
            for mode in ("fwd", "bwd") if hd != 192 else ("fwd",):
                assert "rescale_before_pv" not in compiled_config(None, "sm90", hd, causal, mode)
    # the backward ignores it: its compiled config (and so the backward rows' compiled_hash) is the default's
    on = AttnConfig(rescale_before_pv=True)
    assert compiled_config(on, "sm90", 128, False, "bwd") == compiled_config(None, "sm90", 128, False, "bwd")
    assert compiled_config(on, "sm90", 128, False, "fwd")["rescale_before_pv"] is True
    # an H200 tune row's config (a row of results/h200/tune, git f5449bc): its recorded config and resolved hashes
    row = dict(bwd_tile_m=None, consumer_regs=240, det_schedule="spt", deterministic=False, exp2_emu_fraction=0.0,
               intra_wg_overlap=True, num_stages=2, pingpong=True, producer_regs=24, rescale_threshold=8.0, tile_m=128,
               tile_n=128)
    assert AttnConfig(**row).config_hash() == "514d4d7f61ec"
    # that row's kernel (the one loop, O rescaled after the softmax) is no longer (192, 128) causal's default
    assert AttnConfig(**row).resolve("sm90", 192, True).config_hash() != "d5a9684cc4b1"
    old_default = AttnConfig(**row, rescale_before_pv=False, causal_split=False, pv_wait_mid=False,
                             speculative_exp=False)
    assert old_default.config_hash() == "514d4d7f61ec"
    assert old_default.resolve("sm90", 192, True).config_hash() == "d5a9684cc4b1"


def test_rescale_before_pv_on_is_its_own_config_and_kernel_key():
    from kernels.compile_cache import cache_key
    from kernels.tiles import compiled_config

    on = AttnConfig(rescale_before_pv=True)
    assert on.to_dict()["rescale_before_pv"] is True and on.op_string == '{"rescale_before_pv":true}'
    assert on.config_hash() not in HASHES_BEFORE_THE_FIELD.values()
    assert AttnConfig.from_dict(on.to_dict()) == on and AttnConfig.from_dict(AttnConfig().to_dict()) == AttnConfig()
    r_on, r_off = on.resolve("sm90", 192, False), AttnConfig().resolve("sm90", 192, False)
    assert r_on.rescale_before_pv is True and r_on.is_resolved
    assert dataclasses.replace(r_on, rescale_before_pv=False) == r_off
    assert (cache_key("fwd", r_on, "bfloat16", 192, 128, False, "sm90")
            != cache_key("fwd", r_off, "bfloat16", 192, 128, False, "sm90"))
    assert compiled_config(on, "sm90", 192, False)["rescale_before_pv"] is True
    assert AttnConfig(rescale_before_pv=True, pingpong=False).resolve("sm90", 128, True).rescale_before_pv is True


@pytest.mark.parametrize("kwargs, arch, needle", [
    (dict(rescale_before_pv=1), None, r"rescale_before_pv=1: must be None \(per-arch default\) or a bool"),
    (dict(rescale_before_pv="true"), None, "rescale_before_pv='true'"),
    (dict(rescale_before_pv=True, intra_wg_overlap=False), None,
     "rescale_before_pv=True with intra_wg_overlap=False"),
    (dict(rescale_before_pv=True), "sm100", "rescale_before_pv=True with arch=sm100"),
])
def test_rescale_before_pv_refused_where_it_cannot_apply(kwargs, arch, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        AttnConfig(**kwargs).resolve(arch or "sm90", 128, False)
    assert "\n" not in str(e.value)
    AttnConfig(rescale_before_pv=False, intra_wg_overlap=False).resolve("sm90", 128, False)
    AttnConfig(rescale_before_pv=False).resolve("sm100", 128, False)


def test_rescale_before_pv_is_a_table_field_a_tuned_true_applies(monkeypatch, request):
    """None takes the table's False or a tuned winner; an explicit value wins; a tuned True leaves a config without
    the intra-warpgroup overlap valid (False there)."""
    import kernels.config as C
    from kernels.config import TUNED_FIELDS, table_defaults

    assert "rescale_before_pv" in TUNED_FIELDS["fwd"] and "rescale_before_pv" not in TUNED_FIELDS["bwd"]
    assert all(row["rescale_before_pv"] is False for row in DEFAULTS.values())  # ((192, 128) causal: off since 12-03)
    for causal in (False, True):
        assert table_defaults("sm90", 192, causal, tuned=False)["rescale_before_pv"] is False
    monkeypatch.setattr(C, "TUNED", {("sm90", 192, False): {"rescale_before_pv": True}})
    C.resolve_cached.cache_clear()
    request.addfinalizer(C.resolve_cached.cache_clear)
    assert AttnConfig().resolve("sm90", 192, False).rescale_before_pv is True
    assert AttnConfig().resolve("sm90", 192, True).rescale_before_pv is False  # the table's, no tuned entry
    assert AttnConfig(rescale_before_pv=False).resolve("sm90", 192, False).rescale_before_pv is False
    assert AttnConfig(intra_wg_overlap=False).resolve("sm90", 192, False).rescale_before_pv is False


def test_pv_wait_mid_default_is_not_filled_in_with_pingpong_off():
    """hd128 non-causal's pv_wait_mid default ran 0.75-0.80x the default's speed with pingpong off (H200,
    session_ab/fwd128nc_nopp_mid.jsonl): resolve() leaves it off there; an explicit True is kept."""
    from kernels.tiles import compiled_config

    assert AttnConfig().resolve("sm90", 128, False).pv_wait_mid is True
    nopp = AttnConfig(pingpong=False).resolve("sm90", 128, False)
    assert nopp.pv_wait_mid is None and "pv_wait_mid" not in nopp.to_dict()
    assert "pv_wait_mid" not in compiled_config(AttnConfig(pingpong=False), "sm90", 128, False)
    assert AttnConfig(pingpong=False, pv_wait_mid=True).resolve("sm90", 128, False).pv_wait_mid is True
    # (192, 128) causal keeps it with pingpong off (1.05x there: session_ab/fwd192c_nopp_mid.jsonl)
    assert AttnConfig(pingpong=False).resolve("sm90", 192, True).pv_wait_mid is True
    assert AttnConfig(pingpong=False).resolve("sm90", 192, False).pv_wait_mid is None
