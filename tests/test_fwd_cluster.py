"""2x1 thread-block cluster forward (AttnConfig.cluster_m=2), CPU only: the config field (left out of dicts, hashes and
keys at 1; forward-only), the invalid combinations (causal, window, varlen, persistent) as ConfigErrors, compiles of a
pairwise cover of head dims x pingpong x intra-warpgroup overlap x GQA, and the SASS: K/V loads as TMA multicast,
cluster barriers, remote mbarrier arrives (the peer's empty barriers), no local-memory spills. GPU numerics:
tests/test_fwd_cluster_gpu.py.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels.config import AttnConfig, ConfigError, persistent_by_default  # noqa: E402
from kernels.tiles import compiled_config  # noqa: E402


# ---- config: field, hashes, keys ------------------------------------------------------------------------------------
def test_field_validates_and_stays_out_of_dicts_at_one():
    base = AttnConfig()
    assert base.cluster_m == 1 and "cluster_m" not in base.to_dict()
    r = base.resolve("sm90", 128, False)
    assert "cluster_m" not in r.to_dict() and r.is_resolved
    assert AttnConfig(cluster_m=1).config_hash() == base.config_hash() and base.op_string == "{}"
    two = AttnConfig(cluster_m=2)
    assert two.to_dict()["cluster_m"] == 2 and two.config_hash() != base.config_hash()
    assert AttnConfig.from_dict(two.to_dict()) == two
    assert AttnConfig.from_dict(base.to_dict()) == base
    for bad in (0, 3, 4, True, 2.0, "2"):
        with pytest.raises(ConfigError, match="cluster_m"):
            AttnConfig(cluster_m=bad)
    with pytest.raises(ConfigError, match="persistent"):
        AttnConfig(cluster_m=2, persistent=True)
    AttnConfig(cluster_m=2, persistent=False)
    # forward-only: one backward kernel either way; the forward's compiled config carries it
    assert (compiled_config(two, "sm90", 128, False, mode="bwd")
            == compiled_config(AttnConfig(), "sm90", 128, False, mode="bwd"))
    assert compiled_config(two, "sm90", 128, False)["cluster_m"] == 2
    assert "cluster_m" not in compiled_config(AttnConfig(), "sm90", 128, False)


def test_not_a_default_and_never_persistent_by_default():
    from kernels.config import DEFAULTS
    from kernels.interface import forward_config, fwd_kernel_key

    assert all("cluster_m" not in row for row in DEFAULTS.values())  # opt-in
    two = AttnConfig(cluster_m=2).resolve("sm90", 64, False)
    assert persistent_by_default(AttnConfig(), "sm90", 64, False, 512)  # the hd64 short-seqlen rule...
    assert not persistent_by_default(two, "sm90", 64, False, 512)  # ...does not apply to a cluster config
    assert forward_config(two, 64, False, 512).persistent is None
    base = AttnConfig().resolve("sm90", 128, False)
    key = fwd_kernel_key(base, "bfloat16", 128, 128, False)
    assert "cluster_m" not in str(key)  # the key of before the field existed
    assert fwd_kernel_key(AttnConfig(cluster_m=2).resolve("sm90", 128, False), "bfloat16", 128, 128, False) != key


def test_invalid_combinations_are_config_errors():
    from kernels.validate import check_cluster

    two = AttnConfig(cluster_m=2)
    check_cluster(two, False)
    check_cluster(AttnConfig(), True, 10, 10, varlen=True)  # nothing to check at 1
    check_cluster(None, True)
    with pytest.raises(ConfigError, match="causal"):
        check_cluster(two, True)
    with pytest.raises(ConfigError, match="window"):
        check_cluster(two, False, 128, -1)
    with pytest.raises(ConfigError, match="varlen"):
        check_cluster(two, False, varlen=True)


def test_api_refuses_invalid_combinations_before_the_device():
    torch = pytest.importorskip("torch")
    from kernels.ops import attention

    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    two = AttnConfig(cluster_m=2)
    with pytest.raises(ConfigError, match="causal"):
        attention(q, q, q, causal=True, config=two)
    with pytest.raises(ConfigError, match="causal"):  # (W, 0) is causal
        attention(q, q, q, config=two, window_size=(4, 0))
    with pytest.raises(ConfigError, match="window"):
        attention(q, q, q, config=two, window_size=(4, 4))


def test_varlen_refuses_a_cluster():
    torch = pytest.importorskip("torch")
    from kernels.varlen import attention_varlen

    q = torch.randn(16, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 7, 16], dtype=torch.int32)
    with pytest.raises(ConfigError, match="cluster_m"):
        attention_varlen(q, q, q, cu, cu, 9, 9, config=AttnConfig(cluster_m=2))


def test_kernel_refuses_invalid_combinations():
    cutlass = pytest.importorskip("cutlass")
    from kernels.sm90.fwd import FlashFwdSm90

    kw = dict(tile_m=128, tile_n=128, consumer_regs=240, producer_regs=24, cluster_m=2)
    assert FlashFwdSm90(cutlass.BFloat16, 128, 128, False, **kw).cluster_m == 2
    for extra, causal, what in (({}, True, "causal"), ({"window_left": 64}, False, "window"),
                                ({"varlen": True}, False, "varlen"), ({"persistent": True}, False, "persistent")):
        with pytest.raises(ValueError, match=what):
            FlashFwdSm90(cutlass.BFloat16, 128, 128, causal, **kw, **extra)
    with pytest.raises(ValueError, match="cluster_m"):
        FlashFwdSm90(cutlass.BFloat16, 128, 128, False, **{**kw, "cluster_m": 3})


# ---- compiles + SASS: pairwise over head dims x pingpong x intra_wg_overlap x GQA ------------------------------------
# (hdim, hdim_v, pingpong, intra_wg_overlap, qhead_per_kvhead): every pair of (pingpong, overlap), (pingpong, GQA),
# (overlap, GQA) appears, and every head dim
PAIRWISE = [
    (64, 64, True, True, 1), (64, 64, False, False, 2), (128, 128, False, True, 2), (128, 128, True, False, 1),
    (256, 256, True, True, 2), (192, 128, False, True, 1),
]


def test_pairwise_cover_is_complete():
    rows = [r[2:] for r in PAIRWISE]
    levels = [sorted({r[i] for r in rows}) for i in range(3)]
    for i in range(3):
        for j in range(i + 1, 3):
            assert {(a, b) for a in levels[i] for b in levels[j]} == {(r[i], r[j]) for r in rows}, (i, j)
    assert {r[:2] for r in PAIRWISE} == {(64, 64), (128, 128), (256, 256), (192, 128)}


def _sass(cfg, hdim, hdim_v, group, workdir):
    from kernels.sm90.compile import make_fwd_kernel
    from sass_cache import kernel_sass  # tests/sass_cache.py: one compile per kernel in the session

    return kernel_sass(make_fwd_kernel(cfg, "bfloat16", hdim, hdim_v, False, qhead_per_kvhead=group), workdir)


@pytest.mark.compile
@pytest.mark.parametrize("hdim,hdim_v,pingpong,overlap,group", PAIRWISE,
                         ids=[f"hd{r[0]}-pp{int(r[2])}-ov{int(r[3])}-g{r[4]}" for r in PAIRWISE])
def test_cluster_compiles_with_multicast_and_no_spills(tmp_path, hdim, hdim_v, pingpong, overlap, group):
    pytest.importorskip("cutlass")
    from kernels.sm90.sass import count, opcode_counts

    cfg = AttnConfig(cluster_m=2, pingpong=pingpong, intra_wg_overlap=overlap).resolve("sm90", hdim, False)
    sass = _sass(cfg, hdim, hdim_v, group, str(tmp_path))
    if sass is None:
        pytest.skip("nvdisasm not installed (pip nvidia-cuda-nvdisasm); the compile passed")
    c = opcode_counts(sass)
    multicast = sum(n for op, n in c.items() if op.startswith("UTMALDG") and ".MULTICAST" in op)
    plain = sum(n for op, n in c.items() if op.startswith("UTMALDG") and ".MULTICAST" not in op)
    assert multicast > 0 and plain > 0 and multicast > plain  # K and V multicast; Q loaded by each CTA
    assert count(c, "UCGABAR_ARV") >= 2 and count(c, "UCGABAR_WAIT") >= 2  # after barrier init, before exit
    # consumers release K / V stages on both CTAs' empty barriers (remote arrive)
    assert sum(n for op, n in c.items() if op.startswith("SYNCS.ARRIVE") and ".RED" in op) > 0
    assert count(c, "LDL") == 0 and count(c, "STL") == 0


@pytest.mark.compile
def test_default_has_no_cluster_in_sass(tmp_path):
    pytest.importorskip("cutlass")
    from kernels.sm90.sass import count, opcode_counts

    sass = _sass(AttnConfig().resolve("sm90", 128, False), 128, 128, 1, str(tmp_path))
    if sass is None:
        pytest.skip("nvdisasm not installed")
    c = opcode_counts(sass)
    assert not any(".MULTICAST" in op for op in c) and count(c, "UCGABAR_ARV") == 0
