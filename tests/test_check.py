"""The correctness rule: right backends pass, deliberately wrong ones (perturbed, NaN, wrong shape) fail."""
import math

import pytest
import torch

from experiments.backends import get_backend
from experiments.backends.base import Backend
from experiments.check import check_backend, compare
from experiments.shapes import Shape


class Perturbed(Backend):
    """The exact reference with one tensor made wrong on purpose."""

    cpu_capable = True

    def __init__(self, what: str, amount: float = 0.1):
        self.what, self.amount, self.name = what, amount, f"perturbed_{what}"
        self.ref = get_backend("reference")

    def forward(self, q, k, v, causal, scale, cfg=None):
        out, lse = self.ref.forward(q, k, v, causal, scale, cfg)
        if self.what == "out":
            out = out.clone()
            out[0, -1, 0, 0] += self.amount
        elif self.what == "nan":
            out = out.clone()
            out[0, -1, 0, :] = float("nan")
        elif self.what == "lse":
            lse = lse + self.amount
        elif self.what == "lse_shape":
            lse = lse.transpose(1, 2).contiguous()
        return out, lse

    def backward(self, q, k, v, dout, causal, scale, cfg=None):
        dq, dk, dv = self.ref.backward(q, k, v, dout, causal, scale, cfg)
        if self.what == "dk":
            dk = dk * (1 + self.amount)
        return dq, dk, dv


SHAPES = [Shape(1, 96, 96, 2, 64, causal=True), Shape(2, 64, 160, 2, 128, causal=True, dtype="float16"),
          Shape(1, 160, 64, 2, 64, causal=True), Shape(1, 64, 64, 2, 192, 128)]


@pytest.mark.parametrize("name", ["reference", "fa4_model"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label())
def test_right_backends_pass(name, shape):
    res = check_backend(name, shape)
    assert res.passed, res.failures()
    assert set(res.tensors) == {"out", "lse", "dq", "dk", "dv"}
    for t in res.tensors.values():
        assert t.bound == pytest.approx(2 * t.pt_err + t.atol)
        assert t.pt_err > 0  # bf16/fp16 plain math is never exact: the bound is measured, not assumed


@pytest.mark.parametrize("what,failing", [("out", {"out"}), ("nan", {"out"}), ("lse", {"lse"}),
                                          ("lse_shape", {"lse"}), ("dk", {"dk"})])
def test_wrong_backends_fail_on_the_wrong_tensor(what, failing):
    res = check_backend(Perturbed(what), SHAPES[0])
    assert not res.passed
    assert {n for n, t in res.tensors.items() if not t.passed} == failing
    rows = {r["metric"]: r for r in res.rows()}
    for n in failing:
        r = rows[f"err_{n}"]
        assert r["status"] == "fail" and r["error_class"] == "wrong_result" and r["reason"]


def test_small_perturbation_within_rounding_passes_large_fails():
    # half a bf16 ulp at |out| ~ 1 is inside the rule; 20 ulps is not
    assert check_backend(Perturbed("out", 2**-9), SHAPES[0], modes=("fwd",)).passed
    assert not check_backend(Perturbed("out", 20 * 2**-8), SHAPES[0], modes=("fwd",)).passed


def test_nan_is_reported():
    t = check_backend(Perturbed("nan"), SHAPES[0], modes=("fwd",)).tensors["out"]
    assert math.isnan(t.err) and "NaN" in t.note


def test_fresh_inputs_each_call_and_seed_recorded():
    a = check_backend("reference", SHAPES[0], modes=("fwd",))
    b = check_backend("reference", SHAPES[0], modes=("fwd",))
    assert a.seed != b.seed
    c = check_backend("reference", SHAPES[0], modes=("fwd",), seed=a.seed)
    assert c.tensors["out"].pt_err == a.tensors["out"].pt_err  # same seed replays the same inputs


def test_modes_select_tensors():
    assert set(check_backend("reference", SHAPES[0], modes=("fwd",)).tensors) == {"out", "lse"}
    assert set(check_backend("reference", SHAPES[0], modes=("bwd",)).tensors) == {"dq", "dk", "dv"}


def test_compare_rule_arithmetic_and_infinities():
    ref = torch.tensor([1.0, 2.0, float("-inf")], dtype=torch.float64)
    pt = torch.tensor([1.01, 2.0, float("-inf")])
    x = torch.tensor([1.0, 2.02, float("-inf")])
    t = compare("lse", x, pt, ref, torch.bfloat16, atol_ulps=1.0)
    assert t.pt_err == pytest.approx(0.01, rel=1e-4)
    assert t.atol == pytest.approx(2.0 * 2**-7)
    assert t.err == pytest.approx(0.02, rel=1e-4)
    assert t.passed == (t.err <= 2 * t.pt_err + t.atol)
    assert not compare("out", None, pt, ref, torch.bfloat16).passed


class WritesRows(Backend):
    """Takes out= buffers and writes only the first ``rows`` query rows of out (all of lse)."""

    cpu_capable = True
    takes_out = True

    def __init__(self, rows=None):
        self.rows, self.name = rows, f"writes_{rows}"

    def forward(self, q, k, v, causal, scale, cfg=None):
        return get_backend("reference").forward(q, k, v, causal, scale, cfg)

    def forward_into(self, q, k, v, causal, scale, cfg, out, lse):
        o, l = self.forward(q, k, v, causal, scale, cfg)
        n = o.shape[1] if self.rows is None else self.rows
        out[:, :n] = o[:, :n]
        lse.copy_(l)
        return out, lse


def test_poisoned_out_buffers_catch_unwritten_rows():
    shape = SHAPES[0]
    assert check_backend(WritesRows(None), shape, modes=("fwd",)).passed
    bad = check_backend(WritesRows(shape.seqlen_q - 1), shape, modes=("fwd",)).tensors["out"]
    assert not bad.passed and "NaN" in bad.note
