"""kernels/integrations: the GQA switch (no extra dependency) and the transformers attention function "fa4lab"
(skipped without transformers). On a CPU the CUDA kernels are replaced by a stand-in: kernels.attention is
monkeypatched with the fp32 reference (kernels.reference.attention_exact), and kernels.attention_varlen with a
per-sequence loop over it, so these tests check the glue (layouts, scaling, causality, sliding window, softcap, GQA,
masks, the unpadded varlen path, errors), not the kernels."""
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


def stand_in(q, k, v, causal=False, softmax_scale=None, config=None, return_lse=False, window_size=(-1, -1),
             softcap=0.0):
    """kernels.attention's contract on a CPU: fp32 reference at fp32, output at q's dtype; grouped K/V (fewer heads
    than Q, native GQA) as the kernels read them: Q head i uses K/V head i // (heads_q / heads_kv)."""
    CALLS.append(dict(kind="dense", q=tuple(q.shape), k=tuple(k.shape), causal=causal, scale=softmax_scale,
                      config=config, window=tuple(window_size), softcap=softcap))
    k, v = gqa.kv_for_kernel(k, v, q.shape[2], native=False)
    return attention_exact(q, k, v, causal=causal, softmax_scale=softmax_scale, dtype=torch.float32,
                           window_size=window_size, softcap=softcap).to(q.dtype)


def stand_in_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                    softmax_scale=None, config=None, return_lse=False, window_size=(-1, -1), softcap=0.0,
                    check_seqlens=True):
    """kernels.attention_varlen's contract on a CPU (packed (total, heads, dim), cu_seqlens int32; differentiable):
    the reference per sequence, each bottom-right aligned on its own."""
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32 and q.dim() == 3 and k.dim() == 3
    lq, lk = cu_seqlens_q.diff(), cu_seqlens_k.diff()
    assert max_seqlen_q == int(lq.max()) and max_seqlen_k == int(lk.max())
    assert int(cu_seqlens_q[-1]) == q.shape[0] and int(cu_seqlens_k[-1]) == k.shape[0]
    CALLS.append(dict(kind="varlen", q=tuple(q.shape), k=tuple(k.shape), causal=causal, scale=softmax_scale,
                      config=config, window=tuple(window_size), softcap=softcap, lq=lq.tolist(), lk=lk.tolist()))
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    for i in range(len(lq)):
        a, b, c, d = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]), int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        if b > a:
            out[a:b] = stand_in(q[None, a:b], k[None, c:d], v[None, c:d], causal, softmax_scale, config,
                                window_size=window_size, softcap=softcap)[0]
            CALLS.pop()
    return out


@pytest.fixture
def hf(monkeypatch):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
    from kernels.integrations import hf as hf_mod

    monkeypatch.setattr(kernels, "attention", stand_in)
    monkeypatch.setattr(kernels, "attention_varlen", stand_in_varlen)
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


def test_all_ones_mask_is_accepted(hf):
    ref = tiny_llama("sdpa")
    model = same_weights(tiny_llama("fa4lab"), ref)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert {c["kind"] for c in CALLS} == {"dense"}


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
    cases = [(dict(cu_seq_lens_q=torch.tensor([0, 8], dtype=torch.int32)), "cu_seq_lens_q given: packed"),
             (dict(s_aux=torch.zeros(2)), "attention sinks"),
             (dict(sliding_window=0), "sliding_window=0: expected an int >= 1")]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn(mod, q, k, v, None, **kw)
    out, weights = fn(mod, q, k, v, None, sliding_window=8)  # a window covering every key changes nothing
    assert out.shape == (1, 8, 2, 16) and weights is None and CALLS[-1]["window"] == (-1, -1)
    mod.is_causal = False
    fn(mod, q, k, v, None)
    assert CALLS[-1]["causal"] is False
    fn(mod, q, k, v, None, is_causal=True)  # the keyword wins over the module attribute
    assert CALLS[-1]["causal"] is True
    block = torch.block_diag(torch.ones(3, 3), torch.ones(5, 5)).bool().tril()[None, None]  # packed sequences
    with pytest.raises(ValueError, match="not the causal / sliding-window / full pattern plus padding"):
        fn(mod, q, k, v, block, is_causal=True)


def test_window_and_softcap_reach_the_kernel(hf):
    """transformers' sliding_window counts the current token: (W - 1, 0) causal, (W - 1, W - 1) bidirectional (as
    transformers' FlashAttention path); softcap None / 0 is off; the scale is passed as given."""
    fn = hf.fa4lab_attention_forward
    mod = torch.nn.Module()
    q = torch.randn(1, 2, 8, 16)
    k = v = torch.randn(1, 2, 8, 16)
    fn(mod, q, k, v, None, sliding_window=4, softcap=30.0, scaling=0.1)
    c = CALLS[-1]
    assert (c["window"], c["softcap"], c["scale"], c["causal"]) == ((3, 0), 30.0, 0.1, True)
    fn(mod, q, k, v, None, sliding_window=3, is_causal=False, softcap=None)
    assert (CALLS[-1]["window"], CALLS[-1]["softcap"]) == ((2, 2), 0.0)
    out = fn(mod, q, k, v, None, sliding_window=4, softcap=2.0)[0]
    want = attention_exact(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, window_size=(3, 0),
                           softcap=2.0, dtype=torch.float32)
    torch.testing.assert_close(out, want)


def tiny_mistral(attn: str, sliding_window=6, layers=2):
    from transformers import AutoModelForCausalLM, MistralConfig

    cfg = MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                        sliding_window=sliding_window, initializer_range=0.2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32).eval()


def tiny_gemma2(attn: str, softcap=0.5, sliding_window=5):
    from transformers import AutoModelForCausalLM, Gemma2Config

    cfg = Gemma2Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, max_position_embeddings=128, sliding_window=sliding_window,
                       attn_logit_softcapping=softcap, final_logit_softcapping=None, query_pre_attn_scalar=32,
                       layer_types=["sliding_attention", "full_attention"], initializer_range=0.2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32).eval()


def test_mistral_sliding_window_logits_and_grads_match_sdpa(hf):
    ref = tiny_mistral("sdpa")
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(4))
    want, want_g = logits_and_grads(ref, ids)
    model = same_weights(tiny_mistral("fa4lab"), ref)
    got, got_g = logits_and_grads(model, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-4, atol=1e-6, msg=n)
    assert [c["window"] for c in CALLS] == [(5, 0)] * 2 and all(c["kind"] == "dense" for c in CALLS)
    full = same_weights(tiny_mistral("sdpa", sliding_window=None), ref)  # the window changes these logits
    with torch.no_grad():
        assert (full(input_ids=ids).logits - want).abs().max() > 1e-3


def test_gemma2_softcap_window_and_scale_match_eager(hf):
    ref = tiny_gemma2("eager")
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(5))
    want, want_g = logits_and_grads(ref, ids)
    model = same_weights(tiny_gemma2("fa4lab"), ref)
    got, got_g = logits_and_grads(model, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-4, atol=1e-6, msg=n)
    assert [(c["window"], c["softcap"]) for c in CALLS] == [((4, 0), 0.5), ((-1, -1), 0.5)]  # sliding, full layer
    assert all(c["scale"] == pytest.approx(32 ** -0.5) for c in CALLS)
    loose = same_weights(tiny_gemma2("eager", softcap=None), ref)  # the softcap changes these logits
    with torch.no_grad():
        assert (loose(input_ids=ids).logits - want).abs().max() > 1e-3


def padded_batch(seed=6, s=20, lengths=(20, 13, 9), left=(False, True, False)):
    ids = torch.randint(0, 95, (len(lengths), s), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros_like(ids)
    for b, (n, lp) in enumerate(zip(lengths, left)):
        sl = slice(s - n, s) if lp else slice(0, n)
        mask[b, sl] = 1
    return ids.masked_fill(mask == 0, 95), mask


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_padded_batch_inference_runs_varlen_and_matches_reference(hf, family):
    """A padded batch under no_grad: unpadded through attention_varlen; logits on the kept tokens equal the reference
    implementation's on the same padded batch, and a right-padded sequence's equal its own unpadded run."""
    make, ref_attn = (tiny_mistral, "sdpa") if family == "mistral" else (tiny_gemma2, "eager")
    ref = make(ref_attn)
    model = same_weights(make("fa4lab"), ref)
    ids, mask = padded_batch()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        got = model(input_ids=ids, attention_mask=mask).logits
        keep = mask.bool()
        torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)
        alone = ref(input_ids=ids[2:3, :9]).logits[0]  # sequence 2 is right padded: positions unchanged
        torch.testing.assert_close(got[2, :9], alone, rtol=1e-5, atol=1e-5)
    varlen = [c for c in CALLS if c["kind"] == "varlen"]
    assert len(varlen) == 2 and len(varlen) == len(CALLS)
    assert all(c["lq"] == c["lk"] == [20, 13, 9] and c["q"] == (42, 4, 16) and c["k"] == (42, 2, 16) for c in varlen)
    assert varlen[0]["window"] == ((5, 0) if family == "mistral" else (4, 0))
    assert varlen[0]["softcap"] == (0.0 if family == "mistral" else 0.5)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_padded_batch_training_grads_match_reference(hf, family):
    """A padded batch with gradients goes through attention_varlen (forward and backward): a loss over the kept tokens
    gives the reference implementation's parameter gradients on the same padded batch."""
    make, ref_attn = (tiny_mistral, "sdpa") if family == "mistral" else (tiny_gemma2, "eager")
    ref = make(ref_attn)
    model = same_weights(make("fa4lab"), ref)
    ids, mask = padded_batch()
    keep = mask.bool()
    grads = []
    for m in (ref, model):
        m.zero_grad(set_to_none=True)
        m(input_ids=ids, attention_mask=mask).logits[keep].float().square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert [c["kind"] for c in CALLS] == ["varlen"] * 2


def test_left_padded_generation_matches_sdpa(hf):
    """Batched greedy decoding of left-padded prompts: the prefill and the one-query steps whose (sliding-window) cache
    still holds padding run through varlen; once the padding has left the window the mask is trivial (dense)."""
    ref = tiny_mistral("sdpa", sliding_window=8)
    model = same_weights(tiny_mistral("fa4lab", sliding_window=8), ref)
    ids, mask = padded_batch(seed=7, s=10, lengths=(10, 6), left=(True, True))
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=95)
    assert torch.equal(model.generate(ids, **kw), ref.generate(ids, **kw))
    kinds = [(c["kind"], c["q"][0] if c["kind"] == "varlen" else c["q"][1]) for c in CALLS]
    assert kinds[0] == ("varlen", 16) and ("varlen", 2) in kinds and kinds[-1] == ("dense", 1)


def test_padding_from_mask_accepts_pattern_plus_padding_only():
    from kernels.integrations.hf import padding_from_mask

    def sdpa_like(pad, sq, causal=True, window=(-1, -1)):  # pattern & key padding, as transformers' sdpa_mask
        sk = pad.shape[1]
        r = torch.arange(sq)[:, None] + (sk - sq)
        c = torch.arange(sk)[None, :]
        ok = (c <= r) if causal else torch.ones(sq, sk, dtype=torch.bool)
        if window[0] >= 0:
            ok = ok & (c >= r - window[0])
        return (ok[None] & pad[:, None, :].bool())[:, None]

    pad = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    qv, kv = padding_from_mask(sdpa_like(pad, 6), 3, 6, 6, True)
    assert torch.equal(qv, pad.bool()) and torch.equal(kv, pad.bool())
    qv, kv = padding_from_mask(sdpa_like(pad, 6, window=(1, 0)), 3, 6, 6, True, (1, 0))
    assert torch.equal(qv, pad.bool())
    qv, kv = padding_from_mask(sdpa_like(pad[:1], 1), 1, 1, 6, True)  # decoding, left padded
    assert qv.tolist() == [[True]] and kv.tolist() == [[False, False, True, True, True, True]]
    qv, kv = padding_from_mask(sdpa_like(pad, 6, causal=False), 3, 6, 6, False)  # every query row kept
    assert qv.all() and torch.equal(kv, pad.bool())
    assert padding_from_mask(pad, 3, 6, 6, True)[0].tolist() == pad.bool().tolist()  # 2D: FlashAttention semantics
    middle = torch.tensor([[1, 1, 0, 1, 1, 1]])  # a hole: the window would count the hole, the packed call would not
    assert padding_from_mask(sdpa_like(middle, 6, window=(1, 0)), 1, 6, 6, True, (1, 0)) is None
    assert padding_from_mask(sdpa_like(middle, 6), 1, 6, 6, True) is not None  # causal alone: the hole is harmless
    static = (torch.arange(6)[None, :] <= torch.arange(3)[:, None])[None, None]  # static cache prefill: keys 0..2
    assert padding_from_mask(static, 1, 3, 6, True) is None
    block = torch.block_diag(torch.ones(3, 3), torch.ones(3, 3)).bool().tril()[None, None]
    assert padding_from_mask(block, 1, 6, 6, True) is None
    per_head = torch.cat([sdpa_like(pad[:1], 6), sdpa_like(pad[2:], 6)], dim=1)
    assert padding_from_mask(per_head, 1, 6, 6, True) is None


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
    window = causal & (torch.arange(sk)[None, :] >= torch.arange(sq)[:, None] + (sk - sq) - 1)
    assert mask_is_trivial(window[None, None], sq, sk, True, (1, 0))
    assert not mask_is_trivial(window[None, None], sq, sk, True)
