"""GQA, sliding-window and varlen shapes (issue 12.6): Shape validation and serialisation (old shapes and job keys
unchanged), inputs, the references against a naive per-head loop, FLOPs of the attended pairs, each backend's
support or skip reason, the CPU backends through the check, and a CPU compare sweep of reach-like shapes."""
import json
import math

import pytest
import torch

from experiments.backends import get_backend
from experiments.backends._features import expand_kv, reference_attention
from experiments.backends.base import Backend
from experiments.backends.fa4_official import official_window
from experiments.backends.flex import FlexBackend
from experiments.backends.sdpa import SdpaBackend
from experiments.bench import attn_flops
from experiments.check import check_backend, fit_check_shape, slice_shape
from experiments.results import job_key
from experiments.shapes import Shape, ShapeError, Varlen, make_inputs, paper_grid, random_seqlens
from kernels.flops import attended_pairs, attention_flops, visible_pairs
from kernels.reference import window_mask

OLD_FIELDS = ["batch", "seqlen_q", "seqlen_k", "heads", "hdim", "hdim_v", "causal", "dtype"]
GQA = Shape(2, 48, 48, 4, 32, causal=True, heads_kv=2, dtype="float16")
WIN = Shape(2, 40, 56, 2, 32, causal=True, window=(9, 0), dtype="float16")
WIN2 = Shape(1, 40, 40, 2, 32, window=(5, 3), dtype="float16")  # two-sided, not causal
VARLEN = Shape(3, 24, 24, 4, 32, causal=True, heads_kv=1, varlen="random:1", dtype="float16")
ALL3 = Shape(3, 20, 20, 4, 32, heads_kv=2, window=(4, 2), varlen=[7, 30, 23], dtype="float16")
FEATURE_SHAPES = [GQA, WIN, WIN2, VARLEN, ALL3]


# ---- Shape: validation, normalisation, serialisation ------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(heads_kv=3), "heads_kv=3: must divide heads=4"),
    (dict(heads_kv=0), "heads_kv=0"),
    (dict(heads_kv=True), "heads_kv=True"),
    (dict(window=(8,)), r"window=\(8,\): must be None or \[left, right\]"),
    (dict(window=(8, 1.5)), "must be None or"),
    (dict(window=(-2, 0), causal=True), "each bound must be >= -1"),
    (dict(window=(8, 4), causal=True), "right bound must be 0"),
    (dict(window=(8, 0)), "a right bound of 0 is causal attention"),
    (dict(varlen="docs8"), "varlen='docs8': supported are 'random'"),
    (dict(varlen="random:x"), "supported are"),
    (dict(varlen=[10, 10]), "2 lengths for batch=4"),
    (dict(varlen=[30, 30, 30, 30]), r"sum to 120; must be batch \* seqlen_q = 128"),
    (dict(varlen=[0, 64, 32, 32]), "ints >= 1"),
    (dict(varlen=3), "varlen=3: supported are None"),
    (dict(varlen="random", seqlen_k=64), "needs seqlen_q == seqlen_k"),
])
def test_bad_feature_values_are_one_line_shape_errors(kw, match):
    base = dict(batch=4, seqlen_q=32, seqlen_k=32, heads=4, hdim=64)
    with pytest.raises(ShapeError, match=match) as ei:
        Shape(**{**base, **kw})
    assert "\n" not in str(ei.value)


def test_normalised_spellings_are_one_shape():
    s = Shape(1, 64, 64, 8, 64, causal=True)
    assert Shape(1, 64, 64, 8, 64, causal=True, heads_kv=8) == s  # heads_kv == heads: plain multi-head
    assert Shape(1, 64, 64, 8, 64, causal=True, window=(-1, -1)) == s
    assert Shape(1, 64, 64, 8, 64, causal=True, window=(-1, 0)) == s  # causal, unbounded left: no window
    assert Shape(1, 64, 64, 8, 64, causal=True, window=[16, -1]).window == (16, 0)  # causal: right is the diagonal
    assert Shape(1, 64, 64, 8, 64, window=[16, -1]).window == (16, -1)
    assert Shape(2, 8, 8, 1, 64, varlen=[6, 10]).varlen == (6, 10)
    assert s.features == () and GQA.features == ("gqa",) and ALL3.features == ("gqa", "window", "varlen")


def test_old_shapes_serialise_and_key_as_before():
    """A shape without the new fields gives the 8-field dict it always gave, so its job key is unchanged: the key
    below was computed with experiments/shapes.py as it was before heads_kv / window / varlen (git 09a00ab)."""
    s = Shape(4, 8192, 8192, 16, 128, causal=True)
    assert list(s.to_dict()) == OLD_FIELDS
    assert job_key({"kind": "compare", "experiment": "fwd_peers", "shape": s.to_dict()}) == \
        "8617130316241919817c2a366643f66b318da885"
    assert s.label() == "b4 sq8192 sk8192 h16 d128 causal bf16"
    assert all(list(p.to_dict()) == OLD_FIELDS for p in paper_grid())


@pytest.mark.parametrize("shape", FEATURE_SHAPES, ids=lambda s: s.label())
def test_feature_shapes_round_trip_through_json(shape):
    d = shape.to_dict()
    assert [k for k in d if k not in OLD_FIELDS] == [k for k in ("heads_kv", "window", "varlen")
                                                    if getattr(shape, k) is not None]
    back = Shape.from_dict(json.loads(json.dumps(d)))
    assert back == shape and hash(back) == hash(shape) and back.seqlens == shape.seqlens


def test_labels_name_the_features():
    assert GQA.label() == "b2 sq48 sk48 h4/2 d32 causal fp16"
    assert WIN.label() == "b2 sq40 sk56 h2 d32 causal w9,0 fp16"
    assert VARLEN.label() == "b3 sq24 sk24 h4/1 d32 causal varlen:random:1 fp16"
    assert ALL3.label() == "b3 sq20 sk20 h4/2 d32 w4,2 varlen[3] fp16"


def test_random_seqlens_are_pinned_and_sum_to_the_tokens():
    assert random_seqlens(8, 16384) == (2828, 3275, 2287, 810, 737, 3351, 1792, 1304)  # any change shows here
    assert Shape(8, 2048, 2048, 16, 128, causal=True, varlen="random").seqlens == random_seqlens(8, 16384, 0)
    assert random_seqlens(8, 16384, 1) != random_seqlens(8, 16384, 0)
    for b, total in ((1, 5), (3, 3), (7, 9), (16, 4096)):
        lens = random_seqlens(b, total)
        assert len(lens) == b and sum(lens) == total and min(lens) >= 1
    with pytest.raises(ShapeError, match="cannot split 2 tokens into 3"):
        random_seqlens(3, 2)


# ---- inputs -------------------------------------------------------------------------------------------------------
def test_make_inputs_gqa_and_packed_layouts():
    q, k, v = make_inputs(GQA, seed=0)
    assert q.shape == (2, 48, 4, 32) and k.shape == v.shape == (2, 48, 2, 32) and q.dtype == torch.float16
    q, k, v = make_inputs(ALL3, seed=0)
    assert q.shape == (60, 4, 32) and k.shape == v.shape == (60, 2, 32) and all(t.is_contiguous() for t in (q, k, v))
    assert ALL3.out_shape() == (60, 4, 32) and ALL3.lse_shape() == (4, 60)
    kw = ALL3.call_kwargs("cpu")
    assert kw["window_size"] == (4, 2)
    vl = kw["varlen"]
    assert vl.cu_seqlens.dtype == torch.int32 and vl.cu_seqlens.tolist() == [0, 7, 37, 60] and vl.max_seqlen == 30
    assert vl.bounds() == [(0, 7), (7, 37), (37, 60)]
    assert Shape(1, 8, 8, 1, 64).call_kwargs() == {}  # dense shapes pass nothing new to the backends


# ---- the references against a naive loop ---------------------------------------------------------------------------
def naive_loop(q, k, v, causal, window, seqlens):
    """fp64 attention one (sequence, head, query row) at a time, the visible keys listed by hand."""
    packed = seqlens is not None
    if not packed:
        seqlens = [q.shape[1]] * q.shape[0]
    left, right = window if window is not None else (-1, -1)
    outs, lses, start = [], [], 0
    for b, n in enumerate(seqlens):
        if packed:
            qs, ks, vs = q[start:start + n], k[start:start + n], v[start:start + n]
            start += n
        else:
            qs, ks, vs = q[b], k[b], v[b]
        sq, sk = qs.shape[0], ks.shape[0]
        group = qs.shape[1] // ks.shape[1]
        o_seq, l_seq = [], []
        for h in range(qs.shape[1]):
            o_h, l_h = [], []
            for i in range(sq):
                diag = i + sk - sq
                keys = [j for j in range(sk)
                        if (not causal or j <= diag) and (left < 0 or j >= diag - left)
                        and (causal or right < 0 or j <= diag + right)]
                kh, vh = ks[keys, h // group].double(), vs[keys, h // group].double()
                s = kh @ qs[i, h].double() / math.sqrt(qs.shape[-1])
                lse = torch.logsumexp(s, 0)
                o_h.append(torch.softmax(s, 0) @ vh)
                l_h.append(lse)
            o_seq.append(torch.stack(o_h))
            l_seq.append(torch.stack(l_h))
        outs.append(torch.stack(o_seq, 1))  # (s, h, d)
        lses.append(torch.stack(l_seq))  # (h, s)
    if packed:
        return torch.cat(outs), torch.cat(lses, 1)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("shape", FEATURE_SHAPES, ids=lambda s: s.label())
def test_reference_matches_a_naive_per_head_loop_with_grads(shape):
    q, k, v = (t.double().requires_grad_() for t in make_inputs(shape, seed=3))
    kw = shape.call_kwargs()
    out, lse = reference_attention(q, k, v, shape.causal, None, dtype=torch.float64, **kw)
    out_n, lse_n = naive_loop(q, k, v, shape.causal, shape.window, shape.seqlens)
    assert out.shape == shape.out_shape() and lse.shape == shape.lse_shape()
    torch.testing.assert_close(out, out_n, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, lse_n, rtol=1e-10, atol=1e-10)
    dout = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, v), dout)
    g_n = torch.autograd.grad(out_n, (q, k, v), dout)
    assert g[1].shape == k.shape  # GQA: dK / dV have the K/V heads (the group's sum)
    for a, b in zip(g, g_n):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_expand_kv_maps_q_head_i_to_kv_head_i_over_group():
    q = torch.zeros(1, 1, 6, 2)
    k = torch.arange(3.0).view(1, 1, 3, 1).expand(1, 1, 3, 2)
    ke, _ = expand_kv(q, k, k)
    assert ke[0, 0, :, 0].tolist() == [0, 0, 1, 1, 2, 2]


# ---- FLOPs ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sq, sk", [(37, 37), (20, 45), (45, 20), (1, 9)])
@pytest.mark.parametrize("causal, window", [(True, (0, 0)), (True, (5, 0)), (False, (5, 3)), (False, (-1, 2)),
                                            (False, (3, -1)), (True, (-1, 0)), (False, (-1, -1)), (False, (100, 100))])
def test_window_pairs_count_the_mask(sq, sk, causal, window):
    mask = window_mask(sq, sk, causal, window)
    want = sq * sk if mask is None else int(mask.sum())
    assert attended_pairs(sq, sk, causal, window) == want
    if window == (-1, -1) or (causal and window[0] == -1):
        assert attended_pairs(sq, sk, causal, window) == visible_pairs(sq, sk, causal)


def test_flops_count_only_attended_pairs():
    plain = Shape(4, 8192, 8192, 16, 128, causal=True)
    assert attn_flops(plain) == attention_flops(4, 16, 8192, 8192, 128, 128, True)  # old shapes: the same call
    assert attn_flops(plain.replace(heads_kv=4)) == attn_flops(plain)  # GQA: the same matmul work
    win = plain.replace(window=(1024, 0))
    pairs = 4 * (1025 * 8192 - 1024 * 1025 // 2)  # rows see min(i, 1024) + 1 keys
    assert win.attended_pairs() == pairs
    assert attn_flops(win) == 2 * 16 * pairs * (128 + 128) and attn_flops(win, "bwd") == 2.5 * attn_flops(win)
    vl = Shape(8, 2048, 2048, 16, 128, causal=True, varlen="random")
    assert vl.attended_pairs() == sum(s * (s + 1) // 2 for s in vl.seqlens)
    assert attn_flops(vl) == 2 * 16 * vl.attended_pairs() * 256
    # unequal documents attend more pairs than equal ones (sum of squares), far fewer than one 16k sequence
    one_sequence = Shape(1, 16384, 16384, 16, 128, causal=True)
    assert attn_flops(vl.replace(varlen=None)) < attn_flops(vl) < attn_flops(one_sequence)
    both = Shape(3, 20, 20, 4, 32, window=(4, 2), varlen=[7, 30, 23])
    assert both.attended_pairs() == sum(attended_pairs(s, s, False, (4, 2)) for s in (7, 30, 23))
    # the Shape count is kernels.flops' (one source): a dense window shape is attention_flops with the window
    assert attn_flops(win, "bwd") == attention_flops(4, 16, 8192, 8192, 128, 128, True, "bwd", window=(1024, 0))


# ---- backends: what each takes, and the skip reasons ---------------------------------------------------------------
class Plain(Backend):
    cpu_capable = True

    def forward(self, q, k, v, causal, scale, cfg=None):
        return q, None


def test_a_backend_without_features_skips_them_with_the_reason():
    b = Plain()
    b.name = "plain"
    assert b.supports(Shape(1, 8, 8, 2, 64)) == (True, "")
    assert b.supports(GQA) == (False, "plain: does not take grouped K/V heads (GQA) (heads 4, heads_kv 2): "
                                      "not implemented in this backend")
    assert "does not take a sliding window (window [9, 0])" in b.supports(WIN)[1]
    assert "does not take packed variable-length batches (varlen [7, 30, 23])" in \
        b.supports(ALL3.replace(heads_kv=None, window=None))[1]


REACH = [Shape.from_dict(d) for d in [
    dict(batch=8, seqlen_q=4096, seqlen_k=4096, heads=32, heads_kv=8, hdim=128, causal=True),
    dict(batch=4, seqlen_q=8192, seqlen_k=8192, heads=16, hdim=128, causal=True, window=[1024, 0]),
    dict(batch=8, seqlen_q=2048, seqlen_k=2048, heads=16, hdim=128, causal=True, varlen="random"),
    dict(batch=2, seqlen_q=16384, seqlen_k=16384, heads=32, heads_kv=8, hdim=128, causal=True, window=[1024, 0])]]


def test_which_backend_takes_which_reach_shape():
    """supports() on the reach shapes (no device needed): ours, official FA4 and flex take all four; SDPA skips
    windows (dense masks only); the FA4 model skips windows; the reference takes all (memory permitting)."""
    from experiments.sweep import expand_shapes
    from test_sweep import composed

    assert [Shape.from_dict(d) for d in expand_shapes(composed("shape=reach")["shape"])] == REACH
    for name in ("fa4", "fa4_official", "fa4_official_det", "flex"):
        assert [get_backend(name).supports(s)[0] for s in REACH] == [True] * 4, name
    for name in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
        got = [get_backend(name).supports(s) for s in REACH]
        assert [ok for ok, _ in got] == [True, False, name != "sdpa_cudnn", False], name
        assert "dense (s_q, s_k) attn_mask" in got[1][1] and got[1][1].startswith(name)
    assert "cuDNN's jagged backward left NaN" in get_backend("sdpa_cudnn").supports(REACH[2])[1]
    ok, why = get_backend("fa4_model").supports(REACH[1])
    assert not ok and "has no sliding window" in why
    ok, why = SdpaBackend("flash").supports(ALL3.replace(window=None))
    assert not ok and "GQA with varlen" in why


def test_official_window_uses_none_for_unbounded():
    assert official_window((1024, 0)) == (1024, 0)
    assert official_window((-1, 3)) == (None, 3) and official_window([5, -1]) == (5, None)


def test_our_backward_skips_what_the_kernels_refuse():
    from kernels import AttnConfig

    b = get_backend("fa4")
    q, k, v = make_inputs(Shape(1, 64, 64, 2, 128, causal=True, varlen=[64]), seed=0)
    vl = Varlen.of([64])
    with pytest.raises(NotImplementedError, match="two_cta=True with a sliding window"):
        b.backward_fn(q, k, v, True, None, AttnConfig(two_cta=True), window_size=(16, 0))
    with pytest.raises(NotImplementedError, match="two_cta=True with varlen"):
        b.backward_fn(q, k, v, True, None, AttnConfig(two_cta=True), varlen=vl)
    q, k, v = make_inputs(Shape(1, 64, 64, 2, 256, causal=True, varlen=[64]), seed=0)
    with pytest.raises(NotImplementedError, match="with varlen: the sm90 variable-length backward supports head dims"):
        b.backward_fn(q, k, v, True, None, None, varlen=vl)


# ---- the CPU backends through the check (fwd + bwd, DESIGN.md rule) ------------------------------------------------
def _named(b, name):
    b.name = name
    return b


CPU_BACKENDS = {
    "reference": lambda: get_backend("reference"),
    "fa4_model": lambda: get_backend("fa4_model"),
    "flex_eager": lambda: _named(FlexBackend(compile=False), "flex_eager"),
    "sdpa_math": lambda: _named(SdpaBackend("math"), "sdpa_math"),
}


@pytest.mark.parametrize("shape", FEATURE_SHAPES, ids=lambda s: s.label())
@pytest.mark.parametrize("name", list(CPU_BACKENDS))
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_cpu_backends_pass_the_check_or_skip_with_a_reason(name, shape):
    b = CPU_BACKENDS[name]()
    ok, why = b.supports(shape)
    if not ok:
        assert why.startswith(name) and name in ("fa4_model", "sdpa_math")
        return
    try:
        modes = ("fwd",) if name == "flex_eager" else ("fwd", "bwd")  # FlexAttention has no CPU backward
        res = check_backend(b, shape, device="cpu", seed=11, modes=modes)
    except NotImplementedError as e:  # the math kernel takes no causal jagged input: a skip with its reason
        assert name == "sdpa_math" and shape.varlen is not None and "nested jagged" in str(e)
        return
    assert res.passed, res.failures()
    assert set(res.tensors) >= ({"out"} if name == "flex_eager" else {"out", "dq", "dk", "dv"})


def test_check_shrinks_feature_shapes_keeping_their_features(monkeypatch):
    import experiments.check as check

    monkeypatch.setattr(check, "check_fits", lambda s, device: (s.heads <= 2, "too big"))
    s = fit_check_shape(Shape(8, 64, 64, 32, 64, heads_kv=8), "cpu")
    assert (s.batch, s.heads, s.heads_kv) == (1, 2, 1)  # batch 8 -> 1, then heads 32/8 -> 16/4 -> 8/2 -> 4/1 -> 2/1
    s = fit_check_shape(Shape(4, 64, 64, 8, 64, heads_kv=1), "cpu")
    assert (s.heads, s.heads_kv) == (2, 1)  # MQA stays MQA
    s = fit_check_shape(Shape(4, 16, 16, 8, 64, varlen="random"), "cpu")
    assert s.batch == 4 and s.seqlens == random_seqlens(4, 64)  # a packed batch keeps its sequences
    assert slice_shape(VARLEN).seqlens == VARLEN.seqlens and slice_shape(VARLEN).heads == 1
    assert slice_shape(GQA) == Shape(1, 48, 48, 1, 32, causal=True, dtype="float16")


# ---- a CPU compare sweep of reach-like shapes ------------------------------------------------------------------------
def test_reach_cpu_sweep_end_to_end(tmp_path):
    """experiment=reach_cpu on two of its shapes: every shape and backend gives rows (checked, timed or skipped with a
    reason), the FLOPs are the attended pairs', and a rerun resumes."""
    from experiments.results import read_rows
    from experiments.sweep import run_sweep
    from test_sweep import composed

    cfg = composed("experiment=reach_cpu", "isolation=inline", "progress=false", f"results_dir={tmp_path}",
                   "bench.repeats=2", "bench.warmup=1", "experiment.peers=[reference,fa4,sdpa_flash,flex]",
                   "shape.shapes=[{batch: 2, seqlen_q: 32, seqlen_k: 32, heads: 4, heads_kv: 2, hdim: 64, "
                   "causal: true, window: [8, 0]}, {batch: 3, seqlen_q: 16, seqlen_k: 16, heads: 2, hdim: 64, causal: true, "
                   "varlen: [10, 30, 8]}]")

    class W:
        text = ""

        def write(self, s):
            W.text += s

        def flush(self):
            pass

    assert run_sweep(cfg, out=W()) == 0
    rows = read_rows(tmp_path / "reach_cpu" / "rows.jsonl")
    win = [r for r in rows if r.get("window") == [8, 0]]
    vl = [r for r in rows if r.get("varlen") == [10, 30, 8]]
    assert win and vl and all(r["heads_kv"] == 2 for r in win) and all("heads_kv" not in r for r in vl)
    skip = {r["backend"]: r["reason"] for r in win if r["status"] == "skip"}
    assert "has no sliding window" in skip["fa4_model"] and "no CUDA device" in skip["fa4"]
    ok = {(r["backend"], r["mode"], r["metric"]) for r in rows if r["status"] == "ok"}
    for mode, err in (("fwd", "err_out"), ("bwd", "err_dk")):
        for backend in ("reference", "fa4_model"):  # fa4_model: on the varlen shape (it skips the window one)
            assert {(backend, mode, err), (backend, mode, "time_ms")} <= ok, (backend, mode)
    assert all(r["passed"] for r in rows if r["metric"] and r["metric"].startswith("err_"))
    t = next(r for r in vl if r["metric"] == "time_ms" and r["mode"] == "fwd" and r["backend"] == "reference")
    assert t["flops"] == 2 * 2 * (10 * 11 + 30 * 31 + 8 * 9) // 2 * 128
    W.text = ""
    assert run_sweep(cfg, out=W()) == 0
    assert "2 already done, running 0" in W.text


class IgnoresFeatures(Backend):
    """Takes every feature but drops one: the window, or the sequence boundaries (one packed sequence)."""

    cpu_capable = True
    features = frozenset({"gqa", "window", "varlen"})

    def __init__(self, drop):
        self.drop = drop

    def forward(self, q, k, v, causal, scale, cfg=None, window_size=None, varlen=None):
        if self.drop == "window":
            window_size = None
        if self.drop == "varlen":
            varlen = Varlen.of([q.shape[0]])
        out, lse = reference_attention(q, k, v, causal, scale, dtype=torch.float64, window_size=window_size,
                                       varlen=varlen)
        return out.to(q.dtype), lse.float()


@pytest.mark.parametrize("drop, shape", [("window", WIN), ("window", WIN2), ("varlen", VARLEN)])
def test_the_check_fails_a_backend_that_ignores_a_feature(drop, shape):
    b = _named(IgnoresFeatures(drop), f"ignores_{drop}")
    res = check_backend(b, shape, device="cpu", seed=5, modes=("fwd", "bwd"))
    assert not res.passed and not res.tensors["out"].passed and not res.tensors["dq"].passed
