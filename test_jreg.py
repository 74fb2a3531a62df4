"""Tests of model.py and jreg.py: hand-computed cases, independent references, Hugging Face parity."""
import math
import os

import numpy as np
import pytest
import torch

import config as CF
from jreg import Profile, displacement, jreg_penalty, jump_rate, layer_weights, streams
from loss import Objective
from model import Llama, LlamaConfig, PRESETS
from conftest import assert_close_ulps

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ---- Ψ and ζ on hand-built vectors ---------------------------------------------------------------------

def as_states(*vectors):
    """Each vector becomes a [1, 1, D] hidden state."""
    return [torch.tensor(v, dtype=torch.float32).view(1, 1, -1) for v in vectors]


def test_displacement_known_angles():
    e1, e2 = [1.0, 0.0], [0.0, 1.0]
    psi = displacement(as_states(e1, e2, e2, [0.0, -3.0], [-2.0, 2.0]))
    # orthogonal -> 0.5; identical -> 0; opposite -> 1; 45° off opposite: (1 - cos 135°)/2
    expected = [0.5, 0.0, 1.0, (1 + math.sqrt(0.5)) / 2]
    assert torch.allclose(psi, torch.tensor(expected), atol=1e-6)


def test_displacement_is_scale_invariant_and_means_over_tokens():
    a = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])          # two tokens
    b = torch.tensor([[[0.0, 5.0], [7.0, 0.0]]])           # token 0 turns 90°, token 1 stays
    assert torch.allclose(displacement([a, b]), torch.tensor([0.25]))
    assert torch.allclose(displacement([a, b], skip_first=True), torch.tensor([0.0]))
    mask = torch.tensor([[1, 0]])
    assert torch.allclose(displacement([a, b], mask=mask), torch.tensor([0.5]))


def numpy_displacement(states, mask=None, skip_first=False):
    """An independent reference: explicit loops over layers and tokens in float64."""
    hs = [s.detach().double().numpy() for s in states]
    B, T, _ = hs[0].shape
    out = []
    for l in range(1, len(hs)):
        vals = []
        for b in range(B):
            for t in range(T):
                if (mask is not None and not mask[b, t]) or (skip_first and t == 0):
                    continue
                x, y = hs[l - 1][b, t], hs[l][b, t]
                vals.append((1 - x @ y / (np.linalg.norm(x) * np.linalg.norm(y))) / 2)
        out.append(np.mean(vals))
    return np.array(out)


def numpy_jump_rate(psi):
    L = len(psi)                                   # psi[k-1] = Ψ_k
    return np.array([100 * sum(max(0.0, psi[k - 1] - psi[k - 2]) for k in range(l, L + 1)) for l in range(2, L + 1)])


@pytest.mark.parametrize("skip_first", [False, True])
def test_displacement_matches_reference_on_random_states(skip_first):
    g = torch.Generator().manual_seed(0)
    states = [torch.randn(3, 5, 16, generator=g) for _ in range(7)]
    mask = torch.rand(3, 5, generator=g) > 0.3
    mask[:, 1] = True
    ours = displacement(states, mask=mask, skip_first=skip_first)
    ref = numpy_displacement(states, mask=mask.numpy(), skip_first=skip_first)
    np.testing.assert_allclose(ours.numpy(), ref, atol=1e-6)


def test_profile_weights_every_token_of_all_batches_equally():
    """Profile over batches of different sizes and masks = the reference over all tokens pooled together."""
    g = torch.Generator().manual_seed(2)
    batches = [[torch.randn(b, t, 8, generator=g) for _ in range(4)] for b, t in ((2, 5), (1, 3), (3, 4))]
    finals = [torch.randn(hs[0].shape, generator=g) for hs in batches]
    masks = [torch.rand(hs[0].shape[:2], generator=g) > 0.3 for hs in batches]
    for m in masks:
        m[:, :2] = True                                          # right padding: real tokens first
    profile = Profile()
    for hs, fin, m in zip(batches, finals, masks):
        profile.add(hs, fin, mask=m, loss_sum=float(m.sum()), n_loss=int(m.sum()))
    out = profile.result()
    for key, normed, skip in (("psi", False, False), ("psi_normed", True, False), ("psi_skip_first", False, True),
                              ("psi_normed_skip_first", True, True)):
        per_token = [numpy_displacement_tokens(hs[:-1] + [fin] if normed else hs, m.numpy(), skip)
                     for hs, fin, m in zip(batches, finals, masks)]
        ref = np.concatenate(per_token, axis=1).mean(axis=1)
        np.testing.assert_allclose(out[key], ref, atol=1e-6)
        np.testing.assert_allclose(out[key.replace("psi", "zeta")], numpy_jump_rate(ref), atol=1e-4)
    assert out["n_tokens"] == sum(int(m.sum()) for m in masks) and out["loss"] == pytest.approx(1.0)
    one_layer = Profile()
    one_layer.add([torch.randn(1, 3, 4), torch.randn(1, 3, 4)], torch.randn(1, 3, 4))
    assert len(one_layer.result()["psi"]) == 1 and one_layer.result()["zeta"] == []   # ζ of one layer: empty


def numpy_displacement_tokens(states, mask, skip_first):
    """Per-token displacements [L, n_tokens] of the tokens kept by mask / skip_first (float64 loops)."""
    hs = [s.double().numpy() for s in states]
    keep = [(b, t) for b in range(hs[0].shape[0]) for t in range(hs[0].shape[1]) if mask[b, t] and not (skip_first and t == 0)]
    return np.array([[(1 - hs[l - 1][b, t] @ hs[l][b, t] / (np.linalg.norm(hs[l - 1][b, t]) * np.linalg.norm(hs[l][b, t]))) / 2
                      for b, t in keep] for l in range(1, len(hs))])


def test_empty_mask_gives_zero_displacement_and_zero_gradient():
    """No token to average over (an all-padding mask, or one token with skip_first): Ψ = 0, penalty 0, gradient 0.
    (Before: 0 / 0 = NaN, in the values and in the gradient.)"""
    states = [torch.randn(2, 1, 8, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(4)]
    for mask, skip_first in ((torch.zeros(2, 1, dtype=torch.bool), False), (None, True)):
        psi = displacement(states, mask=mask, skip_first=skip_first)
        penalty = jreg_penalty(states, 1.0, psi=psi)
        assert torch.equal(psi, torch.zeros(3)) and penalty.item() == 0.0
        grads = torch.autograd.grad(penalty, states)
        assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


def test_displacement_is_fp32_for_bf16_input():
    g = torch.Generator().manual_seed(1)
    states = [torch.randn(2, 4, 64, generator=g) for _ in range(4)]
    psi16 = displacement([s.bfloat16() for s in states])
    assert psi16.dtype == torch.float32
    ref = numpy_displacement([s.bfloat16().float() for s in states])
    np.testing.assert_allclose(psi16.numpy(), ref, atol=1e-6)


def test_jump_rate_hand_cases():
    # Ψ never rises -> ζ = 0 everywhere
    assert torch.equal(jump_rate(torch.tensor([0.5, 0.4, 0.4, 0.1])), torch.zeros(3))
    # Ψ = [0.1, 0.3, 0.2, 0.25]: rises +0.2 at l=2, -0.1 at l=3, +0.05 at l=4
    z = jump_rate(torch.tensor([0.1, 0.3, 0.2, 0.25]))
    assert torch.allclose(z, torch.tensor([25.0, 5.0, 5.0]), atol=1e-5)   # ζ_2, ζ_3, ζ_4
    assert abs(z[-1].item() - 5.0) < 1e-5                                  # ζ_L = 100·(Ψ_L − Ψ_{L−1})


def test_jump_rate_matches_reference():
    psi = torch.rand(12, generator=torch.Generator().manual_seed(2))
    np.testing.assert_allclose(jump_rate(psi).numpy(), numpy_jump_rate(psi.numpy()), atol=1e-4)


def test_layer_weights_closed_forms():
    L = 12
    for alpha in (0.5, 1.0, 3.0):
        w = layer_weights(L, alpha)
        e = np.exp(alpha * np.arange(1, L + 1))
        np.testing.assert_allclose(w.numpy(), e / e.sum(), rtol=1e-6)
        ed = np.exp(alpha * np.arange(1, L + 1) / L)
        np.testing.assert_allclose(layer_weights(L, alpha, "depth").numpy(), ed / ed.sum(), rtol=1e-6)
    for weighting in ("index", "depth", "uniform", "last"):
        assert abs(layer_weights(L, 1.0, weighting).sum().item() - 1) < 1e-6
    # α = 1: the last layer gets (e-1)/e · 1/(1 - e^-L) ≈ 1 - e^-1
    assert abs(layer_weights(L, 1.0)[-1].item() - (1 - math.exp(-1))) < 1e-5
    assert abs(layer_weights(L, 3.0)[-1].item() - (1 - math.exp(-3))) < 1e-5
    assert torch.equal(layer_weights(4, 1.0, "last"), torch.tensor([0.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(layer_weights(4, 1.0, "uniform"), torch.full((4,), 0.25))
    with pytest.raises(ValueError, match="unknown weighting"):
        layer_weights(4, 1.0, "nope")


def test_penalty_is_weighted_sum_of_displacements():
    g = torch.Generator().manual_seed(3)
    states = [torch.randn(2, 3, 8, generator=g) for _ in range(5)]
    psi = numpy_displacement(states)
    for weighting in ("index", "depth", "uniform", "last"):
        w = layer_weights(4, 2.0, weighting).double().numpy()
        assert abs(jreg_penalty(states, 2.0, weighting).item() - (w * psi).sum()) < 1e-6


# ---- the model --------------------------------------------------------------------------------------------

def tiny_config(**kw):
    base = dict(vocab_size=97, n_layer=3, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=48, max_seq_len=32)
    base.update(kw)
    return LlamaConfig(**base)


def test_forward_shapes_and_loss():
    torch.manual_seed(0)
    model = Llama(tiny_config())
    idx = torch.randint(0, 97, (2, 10))
    targets = idx.roll(-1, 1)
    targets[:, -1] = -1
    out, trained = model(idx), model(idx, targets)
    assert out.logits.shape == (2, 10, 97) and out.loss is None and trained.logits is None
    assert len(out.hidden_states) == 4 and all(h.shape == (2, 10, 32) for h in out.hidden_states)
    assert torch.equal(out.hidden_states[0], model.tok_emb(idx))
    assert torch.allclose(out.final_hidden, model.norm(out.hidden_states[-1]))
    ref = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 97), idx[:, 1:].reshape(-1))
    assert torch.allclose(trained.loss, ref)
    assert all(torch.equal(a, b) for a, b in zip(out.hidden_states, trained.hidden_states))
    out = trained
    assert abs(out.loss.item() - math.log(97)) < 0.1           # small init: near-uniform predictions


def test_streams_conventions():
    model = Llama(tiny_config())
    out = model(torch.randint(0, 97, (1, 5)))
    assert streams(out) is out.hidden_states
    normed = streams(out, final_norm=True)
    assert normed[-1] is out.final_hidden and normed[:-1] == out.hidden_states[:-1]


def test_init_is_depth_scaled():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=256, n_layer=8, n_head=4, n_kv_head=4, d_model=128, ffn_hidden=256))
    std = lambda p: p.std().item()
    assert abs(std(model.layers[0].attn.q_proj.weight) - 0.02) < 0.002
    assert abs(std(model.layers[0].mlp.down_proj.weight) - 0.02 / 4) < 0.0005
    assert abs(std(model.layers[0].attn.o_proj.weight) - 0.02 / 4) < 0.0005
    assert torch.equal(model.norm.weight, torch.ones(128))
    assert abs(std(model.tok_emb.weight) - 0.02) < 0.002 and abs(std(model.lm_head.weight) - 0.02) < 0.002
    # an ablation's bias (here attention biases and a LayerNorm) starts at 0, its gain at 1. (Before: every 1-D
    # parameter was set to 1, biases too.)
    model.layers[0].attn.q_proj = torch.nn.Linear(128, 128, bias=True)
    model.norm = torch.nn.LayerNorm(128)
    model.reset_parameters()
    assert torch.equal(model.layers[0].attn.q_proj.bias, torch.zeros(128)) and torch.equal(model.norm.bias, torch.zeros(128))
    assert torch.equal(model.norm.weight, torch.ones(128)) and abs(std(model.layers[0].attn.q_proj.weight) - 0.02) < 0.002


def test_the_training_objective_honours_every_jreg_setting():
    """loss.Objective (train.py's penalty) = jreg_penalty and displacement on the streams its settings name: α, the
    weighting, h_L raw or normed (a final-norm gain that turns h_L, as trained ones do), position 0, the mask."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=97, n_layer=3, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=48,
                              max_seq_len=32))
    with torch.no_grad():
        model.norm.weight.add_(0.3 * torch.randn(32))
    idx = torch.randint(0, 97, (2, 10))
    y, real = idx.roll(-1, 1), torch.ones(2, 10, dtype=torch.bool)
    real[1, 6:] = False
    for normed, skip, weighting, alpha in [(True, True, "depth", 3.0), (False, False, "last", 0.5),
                                           (True, False, "index", 3.0)]:
        objective = Objective(model, alpha=alpha, weighting=weighting, final_norm=normed, skip_first=skip)
        ce, penalty, terms, logged = objective(idx, y, real)
        psi = logged["psi"]
        assert terms.keys() == {"ce"} and torch.equal(terms["ce"], ce.detach()) and torch.equal(logged["jreg"], penalty)
        hs = streams(model(idx, y), normed)
        assert torch.allclose(psi, displacement(hs, mask=real, skip_first=skip), atol=1e-6)
        assert torch.allclose(penalty, jreg_penalty(hs, alpha, weighting, mask=real, skip_first=skip), atol=1e-6)


def test_a_cached_forward_goes_on_after_the_cache():
    """Two cached forwards give the last position's logits of one uncached forward; a left-padded row (pad) gives
    what the row alone gives (its positions start at its first real token)."""
    from model import KVCache
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=48,
                              max_seq_len=32)).eval()
    idx = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        full, cache = model(idx).logits, KVCache(model.config, 2, 12, "cpu", torch.float32)
        assert torch.allclose(model(idx[:, :7], cache=cache).logits, full[:, 6:7], atol=1e-5)
        assert torch.allclose(model(idx[:, 7:], cache=cache).logits, full[:, -1:], atol=1e-5)
        padded, cache = idx.clone(), KVCache(model.config, 2, 14, "cpu", torch.float32, pad=torch.tensor([0, 5]))
        padded[1, :5] = 0
        logits = model(padded, cache=cache).logits
        assert torch.allclose(logits[1], model(idx[1:, 5:]).logits[0, -1:], atol=1e-5)
        assert torch.allclose(logits[0], full[0, -1:], atol=1e-5)


def test_the_chunked_loss_is_the_cross_entropy_of_the_head():
    """loss.cross_entropy(head, h, y, loss_chunk) = F.cross_entropy(head(h), y, ignore_index=-1), its docstring's promise:
    with and without gradients, chunks that do not divide the positions (7 into 20), ignored targets, a head with a
    bias; the same gradients for h and the head; its one term, ce, is the loss itself, detached."""
    from loss import cross_entropy
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 41, bias=True)
    h, y = torch.randn(2, 10, 16, requires_grad=True), torch.randint(-1, 41, (2, 10))
    full = torch.nn.functional.cross_entropy(head(h).flatten(0, 1), y.flatten(), ignore_index=-1)
    chunked, terms = cross_entropy(head, h, y, loss_chunk=7)
    assert_close_ulps(chunked, full, ulps=16)
    assert terms.keys() == {"ce"} and torch.equal(terms["ce"], chunked.detach()) and not terms["ce"].requires_grad
    grads = [torch.autograd.grad(loss, [h, head.weight, head.bias]) for loss in (full, chunked)]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
    with torch.no_grad():
        assert_close_ulps(cross_entropy(head, h, y, loss_chunk=7)[0], full, ulps=16)


def test_an_edit_to_the_head_reaches_the_training_loss():
    """The training loss goes through lm_head: a soft-capped head with a bias changes the chunked loss (and its
    gradients) exactly as it changes the full-logits loss. (Before: the chunked loss multiplied lm_head.weight
    itself, so such an edit changed evaluation but not what training minimises.)"""
    class SoftCappedHead(torch.nn.Linear):
        def forward(self, h):
            return 5.0 * torch.tanh(super().forward(h) / 5.0)
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=48,
                              max_seq_len=32), loss_chunk=7)
    idx, y = torch.randint(0, 97, (2, 10)), torch.randint(-1, 97, (2, 10))
    plain = model(idx, y).loss.item()
    head = SoftCappedHead(32, 97, bias=True)
    with torch.no_grad():
        head.weight.copy_(10 * model.lm_head.weight)
        head.bias.normal_()
    model.lm_head = head
    full = torch.nn.functional.cross_entropy(model(idx).logits.flatten(0, 1), y.flatten(), ignore_index=-1)
    chunked = model(idx, y).loss
    assert abs(chunked.item() - plain) > 0.05
    # other kernels: chunks of 7 positions (each through torch.func.vjp) vs F.cross_entropy over all 20, summed in
    # another order: equal up to rounding. 16 ulps of the loss (~5): a 20-term mean's last bits; the edit moves it 0.05
    assert_close_ulps(chunked, full, ulps=16)
    grads = [torch.autograd.grad(loss, [head.weight, head.bias, model.layers[0].mlp.up_proj.weight])
             for loss in (full, model(idx, y).loss)]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_presets_match_paper_parameter_counts():
    counts = {}
    for name in ("170m", "1b", "3.4b"):
        with torch.device("meta"):
            counts[name] = Llama(PRESETS[name]).num_params()
    assert 155e6 < counts["170m"] < 170e6           # ≈ 162M with our head and FFN choices
    assert 1.00e9 < counts["1b"] < 1.06e9           # ≈ 1.03B
    assert 3.4e9 < counts["3.4b"] < 3.6e9           # ≈ 3.5B


def test_flops_per_token():
    model = Llama(tiny_config())
    cfg = model.config
    n = model.num_params() - cfg.vocab_size * cfg.d_model       # untied: the input embedding costs no FLOPs
    assert model.flops_per_token(16) == 6 * n + 6 * cfg.n_layer * cfg.d_model * 16


def test_penalty_gradient_reaches_every_block_and_lambda_zero_is_baseline():
    torch.manual_seed(0)
    idx = torch.randint(0, 97, (2, 12))
    targets = idx.roll(-1, 1)

    def grads(loss_fn):
        torch.manual_seed(1)
        model = Llama(tiny_config())
        loss_fn(model(idx, targets)).backward()
        return {n: p.grad for n, p in model.named_parameters()}

    base = grads(lambda out: out.loss)
    # λ = 0 in the training-loss formula: the gradients equal the baseline's exactly
    zero = grads(lambda out: out.loss + 0.0 * jreg_penalty(out.hidden_states, alpha=1.0))
    assert all(torch.equal(zero[n], base[n]) for n in base)
    # the penalty alone: its gradient reaches every block (and the embedding)
    pen = grads(lambda out: jreg_penalty(out.hidden_states, alpha=1.0))
    for i in range(3):
        g = sum(v.abs().sum().item() for n, v in pen.items() if n.startswith(f"layers.{i}.") and v is not None)
        assert g > 0, f"no penalty gradient in block {i}"
    assert pen["tok_emb.weight"].abs().sum() > 0
    # λ = 1 changes the gradients
    assert not torch.equal(grads(lambda out: out.loss + jreg_penalty(out.hidden_states, 1.0))["layers.2.mlp.up_proj.weight"],
                           base["layers.2.mlp.up_proj.weight"])


# ---- Hugging Face parity ------------------------------------------------------------------------------------

import transformers  # noqa: E402  (requirements-dev.txt: a missing package fails, never skips)
from lib.hf import llama_from_hf, llama_to_hf  # noqa: E402


def hf_llama(tied, n_kv_head=2, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=n_kv_head, max_position_embeddings=64, rope_theta=5000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():                         # HF inits norms to 1: perturb them so the gains are tested
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("tied,n_kv_head", [(False, 2), (True, 2), (False, 4)])
def test_hf_parity(tied, n_kv_head):
    hf = hf_llama(tied, n_kv_head)
    ours = llama_from_hf(hf).eval()
    assert ours.config.tie_embeddings == tied and ours.config.n_kv_head == n_kv_head
    assert ours.config.rope_theta == 5000.0 and ours.config.norm_eps == 1e-6
    if tied:
        assert ours.lm_head.weight is ours.tok_emb.weight
    idx = torch.randint(0, 101, (2, 23))
    raw_last = {}

    def grab_raw_last(module, inputs, output):          # the raw residual stream entering HF's final norm
        raw_last["h"] = inputs[0]

    hook = hf.model.norm.register_forward_hook(grab_raw_last)
    with torch.no_grad():
        ref = hf(idx, output_hidden_states=True)
        out = ours(idx)
    hook.remove()
    assert (out.logits - ref.logits).abs().max().item() <= 1e-5
    L = ours.config.n_layer
    for l in range(L):                            # h_0 .. h_{L-1}: raw streams in both
        assert (out.hidden_states[l] - ref.hidden_states[l]).abs().max().item() <= 1e-5
    assert (out.hidden_states[L] - raw_last["h"]).abs().max().item() <= 1e-5
    assert (out.final_hidden - ref.hidden_states[L]).abs().max().item() <= 1e-5   # HF's last entry is normed


@pytest.mark.parametrize("tied", [False, True])
def test_hf_round_trip_is_exact(tied):
    hf = hf_llama(tied)
    back = llama_to_hf(llama_from_hf(hf))
    assert back.config.tie_word_embeddings == tied
    sd, sd2 = hf.state_dict(), back.state_dict()
    assert sd.keys() == sd2.keys()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    idx = torch.randint(0, 101, (1, 9))
    with torch.no_grad():
        assert torch.equal(hf(idx).logits, back(idx).logits)


def test_from_hf_rejects_unsupported():
    cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=8, num_hidden_layers=1,
                                   num_attention_heads=2, attention_bias=True)
    with pytest.raises(NotImplementedError, match="bias"):
        llama_from_hf(transformers.LlamaForCausalLM(cfg))


# ---- torch.compile --------------------------------------------------------------------------------------------

def test_compiled_forward_matches_eager():
    torch.manual_seed(0)
    model = Llama(tiny_config(n_layer=2))
    idx = torch.randint(0, 97, (2, 16))
    compiled = torch.compile(model, fullgraph=True)               # fullgraph: any graph break is an error
    out_c = compiled(idx)                                         # needs a C compiler (CI has gcc): fails, never skips
    out_e = model(idx)
    assert torch.allclose(out_c.logits, out_e.logits, atol=1e-5)
    for a, b in zip(out_c.hidden_states, out_e.hidden_states):
        assert torch.allclose(a, b, atol=1e-5)
    loss_c, loss_e = torch.compile(model)(idx, idx).loss, model(idx, idx).loss   # the loss's chunks run compiled
    # inductor's generated kernels (their vector width and reduction order depend on the CPU) vs eager: equal up to
    # rounding. 16 ulps of the loss (~4.6; atol 1e-6 was under 2 ulps there): a mean over 32 positions' last bits
    assert_close_ulps(loss_c, loss_e, ulps=16)
    grads = [torch.autograd.grad(loss, list(model.parameters())) for loss in (loss_c, loss_e)]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*grads))
