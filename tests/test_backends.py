"""Backend registry, availability/support reasons, and CPU runs of the backends that truly run on CPU."""
import warnings

import pytest
import torch

from experiments.backends import BACKENDS, UnknownBackendError, get_backend, register_backend
from experiments.backends.base import Backend
from experiments.backends.fa4_official import _head_dims_ok, installed_version
from experiments.backends.flex import FlexBackend, bottom_right_causal
from experiments.backends.sdpa import SdpaBackend
from experiments.shapes import Shape, make_inputs

EXPECTED = {"reference", "fa4_model", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex", "fa4_official",
            "fa4_official_det", "fa4"}
NO_CUDA = not torch.cuda.is_available()


def test_registry_has_every_backend():
    assert EXPECTED <= set(BACKENDS)
    for name in EXPECTED:
        b = get_backend(name)
        assert isinstance(b, Backend) and b.name == name
        assert get_backend(name) is b  # one instance per process


def test_unknown_backend_is_one_line_listing_known_names():
    with pytest.raises(UnknownBackendError) as ei:
        get_backend("flash_attn_9")
    msg = str(ei.value)
    assert "\n" not in msg and "backend='flash_attn_9'" in msg
    for name in EXPECTED:
        assert name in msg
    assert isinstance(ei.value, ValueError)


def test_register_backend_callable_and_lazy_string():
    class Dummy(Backend):
        cpu_capable = True

        def forward(self, q, k, v, causal, scale, cfg=None):
            return q, None

    register_backend("_dummy_test", Dummy)
    register_backend("_dummy_lazy", "experiments.backends.sdpa:flash")
    try:
        assert get_backend("_dummy_test").name == "_dummy_test"
        lazy = get_backend("_dummy_lazy")
        assert isinstance(lazy, SdpaBackend) and lazy.kind == "flash"
    finally:
        BACKENDS.pop("_dummy_test")
        BACKENDS.pop("_dummy_lazy")


def test_available_and_supports_return_bool_and_reason():
    shape = Shape(1, 64, 64, 1, 64)
    for name in EXPECTED:
        ok, why = get_backend(name).available()
        assert isinstance(ok, bool) and isinstance(why, str)
        assert ok or why.startswith(name)  # a reason that names the backend
        ok, why = get_backend(name).supports(shape)
        assert isinstance(ok, bool) and isinstance(why, str)


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-machine reasons")
def test_cuda_backends_unavailable_on_cpu_with_reason():
    for name in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex", "fa4_official", "fa4_official_det", "fa4"):
        ok, why = get_backend(name).available()
        assert not ok and "no CUDA device" in why, (name, why)
    for name in ("reference", "fa4_model"):
        assert get_backend(name).available() == (True, "")


def test_availability_probe_failure_is_a_reason_not_a_crash():
    class Broken(Backend):
        def _available(self):
            raise RuntimeError("driver exploded\nsecond line")

    b = Broken()
    b.name = "broken"
    ok, why = b.available()
    assert not ok and "driver exploded" in why and "\n" not in why


@pytest.mark.parametrize("name", ["reference", "fa4_model"])
@pytest.mark.parametrize("sq,sk", [(64, 64), (48, 160), (160, 48)])
def test_cpu_backends_forward_shapes(name, sq, sk):
    shape = Shape(2, sq, sk, 3, 64, causal=True)
    q, k, v = make_inputs(shape, seed=1)
    out, lse = get_backend(name).forward(q, k, v, True, None)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 3, sq) and lse.dtype == torch.float32
    assert not torch.isnan(out).any()


def test_reference_rejects_shapes_whose_score_matrix_does_not_fit():
    ok, why = get_backend("reference").supports(Shape(64, 65536, 65536, 64, 128))
    assert not ok and "GiB" in why


def _reference(q, k, v, causal):
    return get_backend("reference").forward(q, k, v, causal, None)


@pytest.mark.parametrize("sq,sk,causal", [(64, 64, True), (40, 96, True), (64, 64, False)])
def test_sdpa_math_on_cpu_matches_reference_with_bottom_right_causal(sq, sk, causal):
    b = SdpaBackend("math")
    b.name = "sdpa_math"
    shape = Shape(2, sq, sk, 2, 64, causal=causal)
    q, k, v = make_inputs(shape, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, lse = b.forward(q, k, v, causal, None)
    ref, _ = _reference(q, k, v, causal)
    assert lse is None and out.shape == ref.shape
    assert (out.float() - ref.float()).abs().max() < 0.03
    if causal and sq != sk:  # a top-left mask would be far off on the first rows
        tl = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                              is_causal=True).transpose(1, 2)
        assert (tl.float() - ref.float()).abs().max() > 0.1


def test_sdpa_supports_reasons():
    cud, fl = SdpaBackend("cudnn"), SdpaBackend("flash")
    cud.name, fl.name = "sdpa_cudnn", "sdpa_flash"
    ok, why = cud.supports(Shape(1, 64, 128, 1, 64, causal=True))
    assert not ok and "bottom-right" in why
    assert cud.supports(Shape(1, 64, 64, 1, 64, causal=True))[0]
    ok, why = fl.supports(Shape(1, 128, 64, 1, 64, causal=True))
    assert not ok and "seqlen_q > seqlen_k" in why
    ok, why = fl.supports(Shape(1, 64, 64, 1, 192, 128))
    assert not ok and "hdim_v" in why
    with pytest.raises(ValueError, match="kind="):
        SdpaBackend("triton")


def test_flex_mask_mod_is_bottom_right():
    mm = bottom_right_causal(offset=3)  # seqlen_k - seqlen_q = 3
    qi, kj = torch.tensor(0), torch.tensor(3)
    assert bool(mm(0, 0, qi, kj)) and not bool(mm(0, 0, qi, torch.tensor(4)))


@pytest.mark.parametrize("sq,sk", [(64, 128), (128, 64)])
def test_flex_eager_forward_on_cpu_matches_reference(sq, sk):
    f = FlexBackend(compile=False)
    f.name = "flex_eager"
    shape = Shape(1, sq, sk, 2, 64, causal=True)
    q, k, v = make_inputs(shape, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, lse = f.forward(q, k, v, True, None)
    ref, lse_ref = _reference(q, k, v, True)
    assert (out.float() - ref.float()).abs().max() < 0.03
    live = torch.isfinite(lse_ref)
    assert torch.allclose(lse[live], lse_ref[live], atol=1e-4)


def test_fa4_official_head_dim_table():
    assert _head_dims_ok(9, 256, 256) and _head_dims_ok(9, 192, 128) and _head_dims_ok(9, 96, 96)
    assert _head_dims_ok(10, 128, 128) and _head_dims_ok(10, 192, 128) and _head_dims_ok(10, 256, 256)
    assert not _head_dims_ok(10, 192, 192) and not _head_dims_ok(9, 260, 260) and not _head_dims_ok(9, 100, 100)
    v = installed_version()
    assert v is None or isinstance(v, str)


def test_fa4_supports_only_kernel_head_dims():
    ok, why = get_backend("fa4").supports(Shape(1, 64, 64, 1, 96))
    assert not ok and "(96, 96)" in why
    assert get_backend("fa4").supports(Shape(1, 64, 64, 1, 192, 128))[0]


def test_fa4_official_deterministic_flag():
    assert get_backend("fa4_official_det").deterministic is True
    assert get_backend("fa4_official").deterministic is False


def test_sdpa_no_kernel_becomes_not_implemented(monkeypatch):
    """SDPA's 'No available kernel' (an unsupported input) surfaces as NotImplementedError: a skip row."""
    b = SdpaBackend("math")
    b.name = "sdpa_math"

    def refuse(*a, **kw):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refuse)
    q, k, v = make_inputs(Shape(1, 16, 16, 1, 64), seed=0)
    with pytest.raises(NotImplementedError, match="sdpa_math: SDPA has no math kernel"):
        b.forward(q, k, v, False, None)
