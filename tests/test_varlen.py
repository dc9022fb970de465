"""Variable-length packed batches (issue 12.2), forward and backward, on the CPU: ``kernels.attention_varlen``'s argument checks
(each one raises its own one-line message), the compile cache key, and compiles of the varlen forward kernel
(head dims 64 / 128 / 256 x causal both, dtype and GQA covered pairwise; plus (192, 128) and a window + softcap kernel)
with their SASS: no TMA store of O (row-predicated 16-byte STGs instead), no local-memory spills; the backward's
wiring, config errors, padded tile slots and compiles + SASS (hd 64 / 128, causal both, deterministic once). The GPU
side is tests/test_varlen_gpu.py.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from kernels import AttnConfig, ConfigError, InputError, attention_varlen  # noqa: E402
from kernels.varlen import _VarlenFwd  # noqa: E402

BF = torch.bfloat16


def _args(total_q=10, total_k=12, h=2, h_kv=2, d=64, dv=64, dtype=BF):
    q = torch.randn(total_q, h, d).to(dtype)
    k = torch.randn(total_k, h_kv, d).to(dtype)
    v = torch.randn(total_k, h_kv, dv).to(dtype)
    cu_q = torch.tensor([0, 3, 3, 10], dtype=torch.int32)  # lengths 3, 0, 7
    cu_k = torch.tensor([0, 5, 6, 12], dtype=torch.int32)  # lengths 5, 1, 6
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7, max_seqlen_k=6)


def _with(**changes):
    a = _args()
    a.update(changes)
    return a


def _i32(*vals):
    return torch.tensor(vals, dtype=torch.int32)


A = _args()
CASES = [  # (id, kwargs, exception type, message regex)
    ("q-not-tensor", _with(q=[1, 2]), TypeError, r"^q: expected a torch.Tensor, got list"),
    ("q-rank4", _with(q=A["q"][None]), InputError, r"^q: expected rank 3 \(total_tokens, heads, head_dim\)"),
    ("v-rank2", _with(v=A["v"][:, 0]), InputError, r"^v: expected rank 3"),
    ("kv-total", _with(v=A["v"][:11]), InputError, r"^total_k: k and v must share total tokens, got 12 and 11"),
    ("gqa-heads", _with(q=torch.randn(10, 3, 64).to(BF)), InputError, r"^heads: the K/V heads \(2\) must divide"),
    ("kv-heads", _with(v=torch.randn(12, 1, 64).to(BF)), InputError, r"^heads: k and v must share"),
    ("dtype", _with(q=A["q"].float(), k=A["k"].float(), v=A["v"].float()), InputError,
     r"^q: dtype torch.float32 is not supported"),
    ("mixed-dtype", _with(k=A["k"].half()), InputError, r"^q, k, v: must share one dtype"),
    ("qk-hdim", _with(k=torch.randn(12, 2, 128).to(BF)), InputError, r"^head_dim: q and k must share head_dim"),
    ("hdim", _with(q=torch.randn(10, 2, 96).to(BF), k=torch.randn(12, 2, 96).to(BF), v=torch.randn(12, 2, 96).to(BF)),
     InputError, r"^head_dim: \(qk, v\) = \(96, 96\) is not supported"),
    ("cu-list", _with(cu_seqlens_q=[0, 3, 3, 10]), TypeError, r"^cu_seqlens_q: expected an int32 torch.Tensor, got list"),
    ("cu-int64", _with(cu_seqlens_k=A["cu_seqlens_k"].long()), TypeError,
     r"^cu_seqlens_k: dtype torch.int64; expected torch.int32"),
    ("cu-2d", _with(cu_seqlens_q=A["cu_seqlens_q"][None]), InputError, r"^cu_seqlens_q: expected a 1-D tensor"),
    ("cu-len1", _with(cu_seqlens_q=_i32(0), cu_seqlens_k=_i32(0)), InputError, r"^cu_seqlens_q: 1 entries; needs batch"),
    ("cu-batch", _with(cu_seqlens_k=_i32(0, 12)), InputError,
     r"^cu_seqlens_q / cu_seqlens_k: batch mismatch, 3 sequences in q and 1 in k"),
    ("maxq-float", _with(max_seqlen_q=7.0), TypeError, r"^max_seqlen_q: expected a Python int, got float"),
    ("maxk-bool", _with(max_seqlen_k=True), TypeError, r"^max_seqlen_k: expected a Python int, got bool"),
    ("maxk-neg", _with(max_seqlen_k=-1), InputError, r"^max_seqlen_k=-1: must be in \[0, 2\^31\)"),
    ("causal", _with(causal=1), TypeError, r"^causal: expected a bool, got int"),
    ("scale", _with(softmax_scale=-1.0), ConfigError, r"^softmax_scale=-1.0"),
    ("softcap", _with(softcap=-2.0), ConfigError, r"^softcap=-2.0"),
    ("window", _with(window_size=(1, 2, 3)), ConfigError, r"^window_size="),
    ("config", _with(config={"tile_n": 64}), TypeError, r"^config: expected kernels.AttnConfig or None, got dict"),
    ("stride", _with(q=torch.randn(10, 64, 2).to(BF).transpose(1, 2)), InputError,
     r"^q: last dim \(head_dim\) must be contiguous"),
    ("first", _with(cu_seqlens_q=_i32(1, 3, 3, 10)), InputError, r"^cu_seqlens_q: first entry is 1; must be 0"),
    ("decreasing", _with(cu_seqlens_k=_i32(0, 5, 4, 12)), InputError,
     r"^cu_seqlens_k: entries must be non-decreasing, got 5 then 4 at index 1"),
    ("last-q", _with(cu_seqlens_q=_i32(0, 3, 3, 9)), InputError,
     r"^cu_seqlens_q: last entry is 9; must equal the total tokens 10"),
    ("last-k", _with(cu_seqlens_k=_i32(0, 5, 6, 13)), InputError,
     r"^cu_seqlens_k: last entry is 13; must equal the total tokens 12"),
    ("maxq-small", _with(max_seqlen_q=6), InputError,
     r"^max_seqlen_q=6 is smaller than the longest sequence \(7, sequence 2 of cu_seqlens_q\)"),
    ("maxk-small", _with(max_seqlen_k=5), InputError,
     r"^max_seqlen_k=5 is smaller than the longest sequence \(6, sequence 2 of cu_seqlens_k\)"),
    ("cpu", _args(), InputError, r"^q: device cpu is not supported; the kernels need a CUDA tensor"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_argument_errors(case):
    _, kwargs, exc, msg = case
    with pytest.raises(exc, match=msg) as e:
        attention_varlen(**kwargs)
    assert "\n" not in str(e.value)


def test_value_errors_are_value_errors():
    """InputError / ConfigError subclass ValueError (the brief's contract: ValueError or TypeError)."""
    assert issubclass(InputError, ValueError) and issubclass(ConfigError, ValueError)


def test_check_seqlens_false_skips_the_value_checks():
    """check_seqlens=False reads no cu_seqlens value (no device sync): bad values get as far as the device check."""
    bad = _with(cu_seqlens_q=_i32(1, 0, 3, 9), max_seqlen_q=1, check_seqlens=False)
    with pytest.raises(InputError, match=r"^q: device cpu is not supported"):
        attention_varlen(**bad)


def test_valid_edge_values_pass_the_checks():
    """All-empty sequences, max_seqlen larger than needed, GQA and (192, 128) head dims get past every check."""
    ok = [_with(max_seqlen_q=1000, max_seqlen_k=1000),
          _with(q=torch.randn(0, 2, 64).to(BF), cu_seqlens_q=_i32(0, 0, 0, 0), max_seqlen_q=0),
          _with(q=torch.randn(10, 8, 64).to(BF)),
          _with(q=torch.randn(10, 2, 192).to(BF), k=torch.randn(12, 2, 192).to(BF), v=torch.randn(12, 2, 128).to(BF))]
    for kw in ok:
        with pytest.raises(InputError, match=r"^q: device cpu is not supported"):
            attention_varlen(**kw)


# ---- backward (CPU: wiring, config errors, the padded layout, compiles + SASS) ------------------------------------------
def test_backward_calls_the_varlen_backward(monkeypatch):
    """_VarlenFwd.backward (the eager path; the op's registered autograd shares it) hands the saved tensors and
    arguments to attention_backward_varlen -- the config string resolved for the head dim -- and returns dq / dk / dv
    for q / k / v (None for the rest)."""
    import types

    import kernels.sm90.backward as bw

    seen = {}

    def fake(q, k, v, out, dout, lse, cu_q, cu_k, max_q, max_k, causal, scale, cfg, **kw):
        seen.update(max_q=max_q, max_k=max_k, causal=causal, scale=scale, cfg=cfg, cu=(cu_q, cu_k), **kw)
        return q + 1, k + 2, v + 3

    monkeypatch.setattr(bw, "attention_backward_varlen", fake)
    a = _args()
    out, lse = torch.zeros(10, 2, 64), torch.zeros(2, 10)
    ctx = types.SimpleNamespace(saved_tensors=(a["q"], a["k"], a["v"], out, lse, a["cu_seqlens_q"],
                                               a["cu_seqlens_k"]),
                                args=(7, 6, True, 0.125, '{"deterministic":true}', 5, -1, 30.0))
    grads = _VarlenFwd.backward(ctx, torch.ones(10, 2, 64), None)
    assert len(grads) == 13 and all(g is None for g in grads[3:])
    assert torch.equal(grads[0], a["q"] + 1) and torch.equal(grads[2], a["v"] + 3)
    assert seen.pop("cu") == (a["cu_seqlens_q"], a["cu_seqlens_k"])
    assert seen == dict(max_q=7, max_k=6, causal=True, scale=0.125,
                        cfg=AttnConfig(deterministic=True).resolve("sm90", 64, True), window_left=5, window_right=-1,
                        softcap=30.0)
    ctx.args = ctx.args[:5]  # a plain call: no window / softcap arguments, 10 inputs
    assert len(_VarlenFwd.backward(ctx, torch.ones(10, 2, 64), None)) == 10
    assert (seen["window_left"], seen["window_right"], seen["softcap"]) == (-1, -1, 0.0)


@pytest.mark.parametrize("cfg, hd, hv, msg", [
    (AttnConfig(two_cta=True), 128, 128, r"^two_cta=True with varlen"),
    (AttnConfig(), 256, 256, r"^\(head_dim, head_dim_v\)=\(256, 256\) with varlen"),
    (AttnConfig(), 192, 128, r"^\(head_dim, head_dim_v\)=\(192, 128\) with varlen"),
])
def test_backward_config_errors(cfg, hd, hv, msg):
    from kernels.varlen import check_varlen_backward

    with pytest.raises(ConfigError, match=msg):
        check_varlen_backward(cfg.resolve("sm90", hd, True), hd, hv)


def test_backward_80_row_tiles_run_as_64_with_varlen():
    """hd128's default (and an explicit) bwd_tile_m=80 has no varlen kernel: the varlen backward takes 64 rows."""
    pytest.importorskip("cutlass")
    from kernels.sm90.backward import backward_config
    from kernels.varlen import check_varlen_backward

    for cfg in (AttnConfig(), AttnConfig(bwd_tile_m=80)):
        r = cfg.resolve("sm90", 128, True)
        assert r.bwd_tile_m == 80 and backward_config(r, varlen=True).bwd_tile_m == 64
        check_varlen_backward(r, 128, 128)


def test_backward_kernel_guards():
    from kernels.sm90.bwd import FlashBwdSm90
    from kernels.sm90.backward import _varlen_key, compile_backward_varlen

    import cutlass

    with pytest.raises(ValueError, match="varlen=True with two_cta=True"):
        FlashBwdSm90(cutlass.BFloat16, 128, True, two_cta=True, varlen=True)
    assert FlashBwdSm90(cutlass.BFloat16, 128, True).varlen is False
    with pytest.raises(ConfigError, match="two_cta=True with varlen"):
        compile_backward_varlen(AttnConfig(two_cta=True), "bfloat16", 128, True)
    cfg = AttnConfig().resolve("sm90", 128, True)
    key = _varlen_key("bwd", cfg, "bfloat16", 128, True, 1, -1, -1, 0.0)
    assert ("varlen", True) in key[-1]


@pytest.mark.parametrize("tile_m", [64, 128])
def test_padded_tile_slots_never_overlap(tile_m):
    """The scheme of kernels/sm90/bwd_pre.py varlen_pad_offset: sequence b's ceil(s_b / tile_m) tile slots from
    (cu_q[b] + b * tile_m) // tile_m * tile_m end at or before sequence b + 1's first slot and inside
    varlen_total_q_pad rows (lengths 0, 1, tile_m +- 1, ...; also a batch of one starting anywhere)."""
    import random

    from kernels.sm90.backward import varlen_total_q_pad

    rng = random.Random(tile_m)
    for trial in range(200):
        lens = [rng.choice([0, 1, 2, tile_m - 1, tile_m, tile_m + 1, rng.randrange(1, 4 * tile_m)])
                for _ in range(rng.randrange(1, 12))]
        start = 0 if trial % 2 else rng.randrange(0, 3 * tile_m)  # a sub-batch of a longer packed tensor
        cu = [start]
        for n in lens:
            cu.append(cu[-1] + n)
        pad = varlen_total_q_pad(cu[-1], len(lens), tile_m)
        end_prev = 0
        for b, n in enumerate(lens):
            first = (cu[b] + b * tile_m) // tile_m * tile_m
            assert first % tile_m == 0 and first >= end_prev, (lens, b)
            end_prev = first + -(-n // tile_m) * tile_m
        assert end_prev <= pad and pad % tile_m == 0


VARLEN_BWD_COMPILE = [(64, True, {}), (128, False, {}), (128, True, dict(deterministic=True))]


@pytest.mark.compile
@pytest.mark.parametrize("case", VARLEN_BWD_COMPILE, ids=lambda c: f"d{c[0]}-c{int(c[1])}" + "".join(c[2]))
def test_compile_varlen_backward(tmp_path, case):
    """The three varlen backward kernels compile; SASS: no spills, the wgmma waits not serialised (<= 8
    WARPGROUP.DEPBAR, as tests/test_bwd_sass.py), dQ by bulk reductions, dK / dV by row-predicated 16-byte stores
    (no TMA store, which would clip only at the packed end), the postprocess's dQ likewise."""
    import glob

    from kernels.sm90.backward import compile_backward_varlen
    from kernels.sm90.sass import count, disassemble, find_nvdisasm, opcode_counts

    hd, causal, extra = case
    compile_backward_varlen(AttnConfig(**extra), "bfloat16", hd, causal, dump_dir=str(tmp_path))
    cubins = sorted(glob.glob(os.path.join(tmp_path, "*.cubin")))
    assert len(cubins) == 3
    if find_nvdisasm() is None:
        pytest.skip("compiled; nvdisasm not installed for the SASS checks")
    for cub in cubins:
        c = opcode_counts(disassemble(cub))
        assert count(c, "LDL") == 0 and count(c, "STL") == 0, cub
        if "bwdFlashBwdSm90" in cub:  # the main kernel
            assert count(c, "HGMMA") > 0 and count(c, "UTMALDG") > 0 and count(c, "UBLKRED") > 0
            assert count(c, "WARPGROUP.DEPBAR") <= 8
            assert count(c, "UTMASTG") == 0
            # dK and dV: 128 rows x hd x 2 B each over 256 MMA threads, 16 B per store
            assert count(c, "STG.E.128") == hd // 8
        elif "bwd_post" in cub:
            assert count(c, "STG.E.128") > 0 and count(c, "UTMASTG") == 0


# ---- compile cache key and kernel construction ------------------------------------------------------------------------
def test_cache_key_has_varlen_only_for_varlen():
    from kernels.interface import fwd_kernel_key
    from kernels.varlen import varlen_kernel_key

    cfg = AttnConfig().resolve("sm90", 128, True)
    plain = fwd_kernel_key(cfg, "bfloat16", 128, 128, True)
    assert plain[-1] == ()  # the plain forward's key is unchanged
    vk = varlen_kernel_key(cfg, "bfloat16", 128, 128, True)
    assert vk != plain and vk[:-1] == plain[:-1] and vk[-1] == (("varlen", True),)
    keys = {vk, varlen_kernel_key(cfg, "bfloat16", 128, 128, True, 4),
            varlen_kernel_key(cfg, "bfloat16", 128, 128, True, 1, 64, -1),
            varlen_kernel_key(cfg, "bfloat16", 128, 128, True, 1, -1, -1, 30.0)}
    assert len(keys) == 4


def test_kernel_flag_and_compile_guard():
    from kernels.sm90.compile import make_fwd_kernel
    from kernels.varlen import compile_varlen_fwd, make_varlen_fwd_kernel

    cfg = AttnConfig().resolve("sm90", 64, False)
    assert make_fwd_kernel(cfg, "bfloat16", 64, 64, False).varlen is False
    kern = make_varlen_fwd_kernel(cfg, "float16", 64, 64, False, qhead_per_kvhead=2)
    assert kern.varlen and kern.qhead_per_kvhead == 2 and (kern.tile_m, kern.tile_n) == (cfg.tile_m, cfg.tile_n)
    with pytest.raises(ValueError, match="without varlen=True"):
        compile_varlen_fwd(make_fwd_kernel(cfg, "bfloat16", 64, 64, False), tvm_ffi=False)


# ---- compile and SASS -------------------------------------------------------------------------------------------------
# head dims x causal in full; dtype and GQA group (1 or 4) pairwise with them and with each other
COMPILE_CASES = [(64, False, "bfloat16", 1), (64, True, "float16", 4), (128, False, "float16", 4),
                 (128, True, "bfloat16", 1), (256, False, "bfloat16", 4), (256, True, "float16", 1)]
# beyond the pairwise set: (192, 128) head dims, and a left window + softcap (the GPU test's window case)
EXTRA_CASES = [(192, True, "bfloat16", 1, {}), (128, True, "bfloat16", 1, dict(window_left=100, softcap=30.0))]


def test_compile_cases_are_pairwise_complete():
    import itertools

    factors = [(64, 128, 256), (False, True), ("bfloat16", "float16"), (1, 4)]
    for (i, a), (j, b) in itertools.combinations(enumerate(factors), 2):
        assert {(c[i], c[j]) for c in COMPILE_CASES} == set(itertools.product(a, b)), (i, j)


@pytest.mark.compile
@pytest.mark.parametrize("case", [c + ({},) for c in COMPILE_CASES] + EXTRA_CASES,
                         ids=lambda c: f"d{c[0]}-c{int(c[1])}-{c[2]}-g{c[3]}" + "".join(f"-{k}" for k in c[4]))
def test_compile_varlen(tmp_path, case):
    import glob

    from kernels.sm90.sass import count, disassemble, find_nvdisasm, opcode_counts
    from kernels.varlen import compile_varlen_fwd, make_varlen_fwd_kernel

    hd, causal, dtype, group, features = case
    hv = 128 if hd == 192 else hd
    cfg = AttnConfig().resolve("sm90", hd, causal)
    kern = make_varlen_fwd_kernel(cfg, dtype, hd, hv, causal, qhead_per_kvhead=group, **features)
    compile_varlen_fwd(kern, tvm_ffi=False, dump_dir=str(tmp_path))
    cubins = sorted(glob.glob(os.path.join(tmp_path, "*.cubin")))
    assert len(cubins) == 1
    if find_nvdisasm() is None:
        pytest.skip("compiled; nvdisasm not installed for the SASS checks")
    c = opcode_counts(disassemble(cubins[0]))
    assert count(c, "HGMMA") > 0 and count(c, "UTMALDG") > 0
    assert count(c, "UTMASTG") == 0  # O: no TMA store (it would clip at the packed end only)
    # row-predicated 16-byte stores of O: tile_m * hd_v * 2 B / (16 B * 2 * tile_m consumer threads) per thread
    assert count(c, "STG.E.128") == hv // 16
    if features.get("softcap"):
        assert count(c, "MUFU.TANH") > 0
    assert count(c, "LDL") == 0 and count(c, "STL") == 0  # no spills


def test_varlen_rejects_forced_persistent():
    """persistent=True has no varlen kernel: a ConfigError before anything is launched (CPU tensors suffice)."""
    q = torch.zeros(8, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ConfigError, match="persistent=True"):
        attention_varlen(q, q, q, cu, cu, 8, 8, config=AttnConfig(persistent=True))
