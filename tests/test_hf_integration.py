"""kernels/integrations: the GQA switch (no extra dependency) and the transformers attention function "fa4lab"
(skipped without transformers). On a CPU the CUDA kernels are replaced by a stand-in: kernels.attention is
monkeypatched with the fp32 reference (kernels.reference.attention_exact), so these tests check the glue (layouts,
scaling, causality, GQA, masks, errors), not the kernels."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import AttnConfig, InputError
from kernels.integrations import gqa
from kernels.reference import attention_exact


# ---- GQA (plain torch) ------------------------------------------------------------------------------------------
def test_kv_for_kernel_repeats_each_kv_head_over_its_group():
    k = torch.randn(2, 5, 2, 8)
    v = torch.randn(2, 5, 2, 8)
    k4, v4 = gqa.kv_for_kernel(k, v, heads_q=8, native=False)
    assert k4.shape == (2, 5, 8, 8) and v4.shape == (2, 5, 8, 8) and k4.is_contiguous()
    for h in range(8):  # Q head h reads K/V head h // 4 (FlashAttention / transformers repeat_kv order)
        assert torch.equal(k4[:, :, h], k[:, :, h // 4]) and torch.equal(v4[:, :, h], v[:, :, h // 4])
    assert gqa.kv_for_kernel(k, v, heads_q=2)[0] is k  # no group: unchanged
    assert gqa.kv_for_kernel(k, v, heads_q=8, native=True)[0] is k  # native GQA: passed through
    with pytest.raises(InputError, match=r"K/V heads \(2\) must divide the Q heads \(3\)"):
        gqa.kv_for_kernel(k, v, heads_q=3, native=False)
    with pytest.raises(InputError, match="k and v must share the number of heads"):
        gqa.kv_for_kernel(k, v[:, :, :1], heads_q=4, native=False)


def test_native_gqa_is_one_switch(monkeypatch):
    k = v = torch.randn(1, 3, 1, 8)
    assert gqa.NATIVE_GQA  # kernels.attention takes grouped K/V natively (issue 12.1)
    assert gqa.kv_for_kernel(k, v, heads_q=4)[0] is k
    monkeypatch.setattr(gqa, "NATIVE_GQA", False)
    assert gqa.kv_for_kernel(k, v, heads_q=4)[0].shape == (1, 3, 4, 8)


# ---- transformers -----------------------------------------------------------------------------------------------
CALLS: list[dict] = []


def stand_in(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False):
    """kernels.attention's contract on a CPU: fp32 reference at fp32, output at q's dtype; grouped K/V (fewer heads
    than Q, native GQA) as the kernels read them: Q head i uses K/V head i // (heads_q / heads_kv)."""
    CALLS.append(dict(q=tuple(q.shape), k=tuple(k.shape), causal=causal, scale=softmax_scale, config=config))
    k, v = gqa.kv_for_kernel(k, v, q.shape[2], native=False)
    return attention_exact(q, k, v, causal=causal, softmax_scale=softmax_scale, dtype=torch.float32).to(q.dtype)


@pytest.fixture
def hf(monkeypatch):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
    from kernels.integrations import hf as hf_mod

    monkeypatch.setattr(kernels, "attention", stand_in)
    CALLS.clear()
    hf_mod.register()
    return hf_mod


def tiny_llama(attn: str, heads=4, kv_heads=1, layers=2, **extra):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=64 // heads,
                      max_position_embeddings=128, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    return model.eval()


def same_weights(model, ref):
    model.load_state_dict(ref.state_dict())
    return model


def logits_and_grads(model, ids, **kw):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, **kw)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kv_heads", [1, 4])
def test_llama_logits_and_grads_match_sdpa_and_eager(hf, kv_heads):
    ref = tiny_llama("sdpa", kv_heads=kv_heads)
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    want, want_g = logits_and_grads(ref, ids)
    eager = logits_and_grads(same_weights(tiny_llama("eager", kv_heads=kv_heads), ref), ids)[0]
    model = same_weights(tiny_llama("fa4lab", kv_heads=kv_heads), ref)
    assert model.config._attn_implementation == "fa4lab"
    got, got_g = logits_and_grads(model, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-4, atol=1e-6, msg=n)
    assert len(CALLS) == 2  # one call per layer, on (batch, seqlen, heads, dim) with K/V unexpanded (native GQA)
    c = CALLS[0]
    assert c["q"] == (2, 24, 4, 16) and c["k"] == (2, 24, kv_heads, 16)
    assert c["causal"] is True and c["scale"] == pytest.approx(16 ** -0.5) and c["config"] is None


def test_all_ones_mask_is_accepted_and_padding_is_a_clear_error(hf):
    ref = tiny_llama("sdpa")
    model = same_weights(tiny_llama("fa4lab"), ref)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        mask = torch.ones_like(ids)
        mask[0, :3] = 0  # left padding
        with pytest.raises(ValueError, match=r"fa4lab attention: attention_mask masks out tokens .*issue 12.2"):
            model(input_ids=ids, attention_mask=mask)


def test_greedy_generation_with_kv_cache_matches_sdpa(hf):
    """Decoding: one query against the cached keys (bottom-right causal, no mask)."""
    ref = tiny_llama("sdpa")
    model = same_weights(tiny_llama("fa4lab"), ref)
    ids = torch.randint(0, 95, (1, 8), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=95, attention_mask=torch.ones_like(ids))
    assert torch.equal(model.generate(ids, **kw), ref.generate(ids, **kw))
    assert any(c["q"][1] == 1 and c["k"][1] > 1 for c in CALLS)


def test_dropout_is_a_clear_error(hf):
    model = tiny_llama("fa4lab", attention_dropout=0.1).train()
    with pytest.raises(ValueError, match=r"fa4lab attention: dropout=0.1 is not supported"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    model.eval()(input_ids=torch.zeros(1, 4, dtype=torch.long))  # eval: dropout 0 reaches the kernels


def test_register_with_a_config_and_a_name(hf):
    cfg = AttnConfig(rescale_threshold=0.0)
    assert hf.register("fa4lab_tau0", config=cfg) == "fa4lab_tau0"
    model = tiny_llama("fa4lab_tau0")
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    assert CALLS and all(c["config"] is cfg for c in CALLS)


def test_unsupported_arguments_are_clear_errors(hf):
    fn = hf.fa4lab_attention_forward
    mod = torch.nn.Module()
    q = torch.randn(1, 2, 8, 16)
    k = v = torch.randn(1, 2, 8, 16)
    cases = [(dict(softcap=30.0), "softcap=30.0 is not supported yet"),
             (dict(sliding_window=4), "sliding_window=4 with 8 keys is not supported yet"),
             (dict(cu_seq_lens_q=torch.tensor([0, 8], dtype=torch.int32)), "cu_seq_lens_q given: packed"),
             (dict(s_aux=torch.zeros(2)), "attention sinks")]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn(mod, q, k, v, None, **kw)
    out, weights = fn(mod, q, k, v, None, sliding_window=8)  # a window covering every key changes nothing
    assert out.shape == (1, 8, 2, 16) and weights is None
    mod.is_causal = False
    fn(mod, q, k, v, None)
    assert CALLS[-1]["causal"] is False
    fn(mod, q, k, v, None, is_causal=True)  # the keyword wins over the module attribute
    assert CALLS[-1]["causal"] is True


def test_mask_is_trivial_reads_bool_and_additive_masks():
    from kernels.integrations.hf import mask_is_trivial

    sq, sk = 3, 5
    causal = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)  # bottom-right
    assert mask_is_trivial(None, sq, sk, True)
    assert mask_is_trivial(causal[None, None].expand(2, 1, sq, sk), sq, sk, True)
    assert not mask_is_trivial(causal[None, None], sq, sk, False)
    additive = torch.zeros(1, 1, sq, sk + 2).masked_fill(~torch.nn.functional.pad(causal, (0, 2)), -3e38)
    assert mask_is_trivial(additive, sq, sk, True)  # longer masks are read over their first sk columns (as eager)
    top_left = torch.ones(sq, sk, dtype=torch.bool).tril()
    assert not mask_is_trivial(top_left[None, None], sq, sk, True)
    assert mask_is_trivial(torch.ones(2, sk, dtype=torch.long), sq, sk, True)
    assert not mask_is_trivial(torch.tensor([[0, 1, 1, 1, 1]]), sq, sk, True)
    with pytest.raises(ValueError, match="attention_mask of rank 3"):
        mask_is_trivial(torch.ones(1, sq, sk), sq, sk, True)
