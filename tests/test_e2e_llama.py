"""The e2e_llama experiment on a CPU: the plain-torch Llama model (shapes, RoPE, GQA), the attention backends that run
here, the expansion (presets, parameter errors), and a tiny job end to end (rows schema, the check catching a wrong
attention, round-robin timing rows)."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from experiments import e2e_llama as E
from experiments import llama_model as L
from kernels.reference import attention_exact

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(preset="cpu", layers=1, hidden=128, head_dims=[64], gqa=2, ffn=128, vocab=64, seqlen=32, tokens=64,
            warmup=0, rounds=2)


def tiny_job(**over) -> dict:
    return E.expand({**TINY, **over})[0]


# ---- the model ------------------------------------------------------------------------------------------------------
def test_model_shapes_parameter_count_and_gqa_projections():
    spec = L.LlamaSpec(layers=2, hidden=64, heads=4, kv_heads=1, head_dim=16, ffn=96, vocab=50)
    torch.manual_seed(0)
    model = L.LlamaModel(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.n_params()
    att = model.layers[0].attn
    assert att.q_proj.out_features == 64 and att.k_proj.out_features == 16 and att.v_proj.out_features == 16
    seen = []

    def attn(q, k, v, scale):
        seen.append((tuple(q.shape), tuple(k.shape), tuple(v.shape), scale))
        return L.sdpa(q, k, v, scale)

    model.set_attention(attn)
    logits = model(torch.randint(0, 50, (3, 10)))
    assert logits.shape == (3, 10, 50)
    assert seen == [((3, 10, 4, 16), (3, 10, 1, 16), (3, 10, 1, 16), 0.25)] * 2  # K/V reach the backend unexpanded
    with pytest.raises(ValueError, match="kv_heads=3: must divide heads=4"):
        L.LlamaSpec(heads=4, kv_heads=3)
    flops = spec.train_step_flops(2, 10)
    assert flops > 6 * 20 * (2 * spec.layer_matmul_params() + 64 * 50)  # dense part plus the attention


def test_rope_keeps_norms_and_makes_scores_relative():
    cos, sin = L.rope_tables(16, 8, 10000.0, "cpu", torch.float64)
    x = torch.randn(1, 16, 2, 8, dtype=torch.float64)
    r = L.apply_rope(x, cos, sin)
    torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))
    q = torch.randn(8, dtype=torch.float64).expand(1, 16, 1, 8)
    k = torch.randn(8, dtype=torch.float64).expand(1, 16, 1, 8)
    rq, rk = L.apply_rope(q, cos, sin)[0, :, 0], L.apply_rope(k, cos, sin)[0, :, 0]
    torch.testing.assert_close(rq[5] @ rk[3], rq[9] @ rk[7])  # depends on the position difference only


@pytest.mark.parametrize("name", ["sdpa", "sdpa_gqa", "fa4_model"])
def test_cpu_backends_agree_with_the_exact_reference_on_grouped_kv(name):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 40, 8, 64, generator=g)
    k = torch.randn(2, 40, 2, 64, generator=g)
    v = torch.randn(2, 40, 2, 64, generator=g)
    want = attention_exact(q, k.repeat_interleave(4, 2), v.repeat_interleave(4, 2), causal=True, softmax_scale=0.1)
    assert L.available(name, "cpu") == (True, "")
    got = L.attention_fn(name)(q, k, v, 0.1)
    torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-4)


def test_cuda_backends_are_skips_on_a_cpu():
    for name in ("fa4lab", "fa4_official"):
        ok, why = L.available(name, "cpu")
        assert not ok and why == f"{name}: needs a CUDA GPU (this run is on cpu)"
    assert L.available("nope", "cpu")[1].startswith("nope: unknown e2e attention backend; known: sdpa")


# ---- expansion ------------------------------------------------------------------------------------------------------
def test_presets_and_expansion():
    jobs = E.expand({"preset": "h200"})
    assert [j["model"]["head_dim"] for j in jobs] == [64, 128]
    assert [(j["model"]["heads"], j["model"]["kv_heads"]) for j in jobs] == [(32, 8), (16, 4)]  # GQA 4:1
    j = jobs[0]
    assert j["batch"] * j["seqlen"] == 16384 and j["seqlen"] == 4096 and j["dtype"] == "bfloat16"
    assert j["backends"] == ["sdpa", "fa4lab", "fa4_official"] and j["baseline"] == "sdpa"
    assert j["model"]["layers"] == 8 and j["model"]["hidden"] == 2048
    assert E.resolve_params({}, cuda=False)["preset"] == "cpu" and E.resolve_params({}, cuda=True)["preset"] == "h200"
    assert E.expand({"preset": "h200", "head_dims": [128]})[0]["model"]["head_dim"] == 128


@pytest.mark.parametrize("params, msg", [
    ({"bogus": 1}, r"params: unknown key\(s\) \['bogus'\]"),
    ({"preset": "a100"}, "preset='a100': supported presets are auto, h200, cpu"),
    ({"backends": ["sdpa", "nope"]}, "known e2e attention backends: sdpa"),
    ({"baseline": "fa4lab", "backends": ["sdpa"]}, "baseline='fa4lab': must be one of backends"),
    ({"tokens": 100}, "tokens=100: must be a multiple of seqlen"),
    ({"head_dims": [96]}, "head_dims: 96 does not divide hidden=256"),
    ({"dtype": "int8"}, "dtype='int8'"),
])
def test_bad_parameters_are_one_line_errors(params, msg):
    with pytest.raises(ValueError, match=msg):
        E.expand({"preset": "cpu", **params})


def test_the_experiment_composes_and_expands_through_the_sweep():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from experiments.results import job_key
    from experiments.runners import RUNNERS
    from experiments.sweep import expand_jobs

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["experiment=e2e_llama",
                                                                  "experiment.params.preset=h200"]), resolve=True)
    jobs = expand_jobs(cfg)
    assert len(jobs) == 2 and all(j["experiment"] == "e2e_llama" and j["kind"] == "e2e_llama" for j in jobs)
    assert len({job_key(j) for j in jobs}) == 2 and RUNNERS["e2e_llama"] == "experiments.e2e_llama:run"


# ---- a job on the CPU -----------------------------------------------------------------------------------------------
SHAPE_KEYS = ("batch", "seqlen_q", "seqlen_k", "heads", "hdim", "hdim_v", "causal", "dtype")
ROW_KEYS = ("experiment", "kind", "backend", "variant", "mode", "metric", "value", "status", "reason", "error_class",
            "config", *SHAPE_KEYS, "layers", "hidden", "kv_heads", "n_params", "tokens")


def test_tiny_job_rows():
    rows = E.run(tiny_job(backends=["sdpa", "fa4_model", "fa4lab"]))
    for r in rows:
        assert all(k in r for k in ROW_KEYS), sorted(set(ROW_KEYS) - set(r))
        assert r["experiment"] == "e2e_llama" and r["mode"] == "train" and r["causal"] is True
    got = {(r["backend"], r["metric"]): r for r in rows}
    assert got[("fa4lab", None)]["status"] == "skip" and "needs a CUDA GPU" in got[("fa4lab", None)]["reason"]
    for b in ("sdpa", "fa4_model"):
        for m in ("first_call_s", "second_call_s", "err_logits", "err_grads", "time_ms"):
            assert got[(b, m)]["status"] == "ok", got[(b, m)]
        assert got[(b, "peak_mem_gib")]["status"] == "skip"  # CUDA allocator statistics only
        assert got[(b, "time_ms")]["n"] == 2 and len(got[(b, "time_ms")]["times_ms"]) == 2
    r = got[("sdpa", "err_logits")]
    assert r["heads"] == 2 and r["kv_heads"] == 1 and r["hdim"] == 64 and r["batch"] == 2 and r["seqlen_q"] == 32
    assert 0 < r["value"] < 0.05 and r["vs_baseline"] == 0.0 and r["bound"] == pytest.approx(2 * r["value"] + 2 ** -8)
    m = got[("fa4_model", "err_grads")]
    assert m["n_params_checked"] == 3 + 9  # embedding, final norm, LM head + one layer's 9 tensors
    assert 0 < m["vs_baseline"] < 0.1 and m["rule_ratio_max"] <= 1
    ratio = got[("fa4_model", "time_ratio")]
    assert ratio["value"] > 0 and ratio["n"] == 2 and ("sdpa", "time_ratio") not in got


def test_the_check_flags_a_wrong_attention(monkeypatch):
    """A backend that forgets the causal mask: its logits and gradients fail the rule (wrong_result rows)."""
    def acausal(q, k, v, scale):
        k, v = k.repeat_interleave(q.shape[2] // k.shape[2], 2), v.repeat_interleave(q.shape[2] // k.shape[2], 2)
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale).transpose(1, 2)

    monkeypatch.setitem(L.ATTENTION, "acausal", (lambda config=None: acausal, False, None))
    job = tiny_job()
    job["backends"] = ["sdpa", "acausal"]
    job["bench"]["rounds"] = 1
    rows = {(r["backend"], r["metric"]): r for r in E.run(job)}
    for m in ("err_logits", "err_grads"):
        r = rows[("acausal", m)]
        assert r["status"] == "fail" and r["error_class"] == "wrong_result" and "rel err" in r["reason"]
    assert rows[("acausal", "time_ms")]["status"] == "ok"  # still timed, as compare jobs do


def test_a_backend_that_raises_is_a_fail_row_and_the_rest_runs(monkeypatch):
    def broken(q, k, v, scale):
        raise RuntimeError("boom")

    monkeypatch.setitem(L.ATTENTION, "broken", (lambda config=None: broken, False, None))
    job = tiny_job()
    job["backends"] = ["sdpa", "broken"]
    job["check"] = False
    rows = E.run(job)
    fail = [r for r in rows if r["backend"] == "broken"]
    assert len(fail) == 1 and fail[0]["status"] == "fail" and fail[0]["reason"] == "RuntimeError: boom"
    assert {r["metric"] for r in rows if r["backend"] == "sdpa"} == {"first_call_s", "second_call_s", "peak_mem_gib",
                                                                     "time_ms"}


def test_sweep_writes_the_rows(tmp_path):
    from experiments.results import read_rows
    from experiments.sweep import run_sweep

    cfg = {"experiment": {"name": "e2e_llama", "kind": "e2e_llama", "expand": "experiments.e2e_llama:expand",
                          "params": {**TINY, "backends": ["sdpa", "fa4lab"], "rounds": 1}},
           "results_dir": str(tmp_path), "isolation": "inline", "progress": False}
    out = io.StringIO()
    assert run_sweep(cfg, out=out) == 0
    rows = read_rows(tmp_path / "e2e_llama" / "rows.jsonl")
    assert {r["backend"] for r in rows} == {"sdpa", "fa4lab"} and all(r["job_key"] for r in rows)
    assert "e2e_llama: 1 jobs, 0 already done, running 1" in out.getvalue()
    assert run_sweep(cfg, out=io.StringIO()) == 0 and len(read_rows(tmp_path / "e2e_llama" / "rows.jsonl")) == len(rows)


@pytest.mark.gpu
def test_small_job_on_the_gpu_passes_the_check():
    """GPU host: a small model with ours, SDPA and official FA4 (where installed): every check row passes."""
    job = E.expand({"preset": "h200", "layers": 2, "hidden": 512, "head_dims": [64], "ffn": 1024, "vocab": 1000,
                    "seqlen": 512, "tokens": 1024, "warmup": 1, "rounds": 3, "settle_s": 0.0})[0]
    rows = E.run(job)
    assert not [r for r in rows if r["status"] == "fail"], [r["reason"] for r in rows if r["status"] == "fail"]
    got = {(r["backend"], r["metric"]): r for r in rows}
    for m in ("err_logits", "err_grads", "peak_mem_gib", "time_ms", "time_ratio"):
        assert got[("fa4lab", m)]["status"] == "ok"
    assert got[("fa4lab", "peak_mem_gib")]["value"] > 0
