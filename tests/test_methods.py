"""The other fixes for the last layers beside JREG (docs/methods.md), each one setting that is off by default: off is
the plain pre-norm Llama to the last bit; on, each matches its paper's formula written here in a few lines of its
own (its own RMSNorm, the blocks' weights); every path takes them (KV-cached generation, export or its refusal, DDP and
FSDP on two processes, resume, evaluate.py's profile)."""
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import config as CF
from loss import Objective
from model import KVCache, Llama, LlamaConfig, apply_rope

from test_train import HERE, TINY, data_dir, read_log, run  # noqa: F401 (data_dir: a fixture)

METHODS = {"layernorm_scaling": True, "mix_ln": 0.25, "peri_ln": True, "backout_layer": 2}


def model(**method):
    torch.manual_seed(0)
    m = Llama(LlamaConfig(vocab_size=97, n_layer=4, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=48, max_seq_len=32,
                          **method))
    with torch.no_grad():                                     # gains that are not 1, as trained ones are not
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.mul_(1 + 0.3 * torch.rand_like(p))
    return m


def rms(x, w, eps=1e-5):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def reference(m, idx, lns=False, mix=0, peri=False, backout=0):
    """The streams h_0..h_L and the logits, from the papers' formulas, with m's weights."""
    T = idx.shape[1]
    cos, sin = m.rope_cos[:T], m.rope_sin[:T]

    def attn(a, x):
        B, n, hd = x.shape[0], a.n_head, a.head_dim
        q = apply_rope((x @ a.q_proj.weight.T).view(B, T, n, hd).transpose(1, 2), cos, sin)
        k = apply_rope((x @ a.k_proj.weight.T).view(B, T, a.n_kv_head, hd).transpose(1, 2), cos, sin)
        v = (x @ a.v_proj.weight.T).view(B, T, a.n_kv_head, hd).transpose(1, 2)
        k, v = k.repeat_interleave(n // a.n_kv_head, 1), v.repeat_interleave(n // a.n_kv_head, 1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + torch.full((T, T), -math.inf).triu(1)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1) @ a.o_proj.weight.T

    def mlp(f, x):
        return (F.silu(x @ f.gate_proj.weight.T) * (x @ f.up_proj.weight.T)) @ f.down_proj.weight.T
    x, hs = m.tok_emb.weight[idx], []
    hs.append(x)
    for i, b in enumerate(m.layers):
        ell = i + 1
        if i < mix:                                                            # Mix-LN: Post-LN
            h = rms(x + attn(b.attn, x), b.attn_norm.weight)
            x = rms(h + mlp(b.mlp, h), b.mlp_norm.weight)
        else:
            s = 1 / math.sqrt(ell) if lns else 1.0                             # LayerNorm Scaling
            out = (lambda y, n: rms(y, n.weight)) if peri else (lambda y, n: y)  # Peri-LN
            h = x + out(attn(b.attn, rms(x, b.attn_norm.weight) * s), b.attn_out_norm)
            x = h + out(mlp(b.mlp, rms(h, b.mlp_norm.weight) * s), b.mlp_out_norm)
        hs.append(x)
    top = x - m.backout_lambda * hs[backout] if backout else x                # Backout
    return hs, rms(top, m.norm.weight) @ m.lm_head.weight.T


@pytest.mark.parametrize("name", list(METHODS))
def test_each_method_is_its_formula(name):
    m, idx = model(**{name: METHODS[name]}), torch.randint(0, 97, (2, 12))
    ref = {"layernorm_scaling": dict(lns=True), "mix_ln": dict(mix=1), "peri_ln": dict(peri=True),
           "backout_layer": dict(backout=2)}[name]
    hs, logits = reference(m, idx, **ref)
    out = m(idx)
    assert len(out.hidden_states) == 5 and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(out.hidden_states, hs))
    assert torch.allclose(out.logits, logits, atol=1e-5)
    plain_hs, plain_logits = reference(m, idx)                                # and it is not the plain model
    assert (logits - plain_logits).abs().max() > 1e-3


def test_off_is_the_plain_llama_to_the_last_bit():
    """Every method off (the defaults, or set to off) computes exactly the plain pre-norm Llama's operations: the same
    state dict, the same streams and logits bit for bit as the plain blocks' forward written out."""
    m, idx = model(), torch.randint(0, 97, (2, 12))
    off = model(layernorm_scaling=False, mix_ln=0.0, peri_ln=False, backout_layer=0)
    assert m.state_dict().keys() == off.state_dict().keys() and not any("out_norm" in k or "backout" in k
                                                                         for k in m.state_dict())
    with torch.no_grad():
        cos, sin = m.rope_cos[:12], m.rope_sin[:12]
        x = m.tok_emb(idx)
        for b in m.layers:                                                   # the plain Llama block, as it was
            x = x + b.attn(b.attn_norm(x), cos, sin)
            x = x + b.mlp(b.mlp_norm(x))
        for mm in (m, off):
            out = mm(idx)
            assert torch.equal(out.hidden_states[-1], x) and torch.equal(out.logits, m.lm_head(m.norm(x)))


def test_layernorm_scaling_is_a_python_float_and_mix_ln_counts_whole_layers():
    m = model(layernorm_scaling=True, mix_ln=0.25)
    assert [b.scale for b in m.layers] == [1 / math.sqrt(ell) for ell in range(1, 5)]
    assert not any("scale" in k for k in m.state_dict())                     # no buffer: FSDP's meta init keeps it
    assert [b.post_ln for b in m.layers] == [True, False, False, False]      # ⌊0.25 · 4⌋ = 1
    assert [b.post_ln for b in model(mix_ln=0.6).layers] == [True, True, False, False]


def test_the_early_exit_loss_is_the_logit_lens_cross_entropy():
    """CE + w · mean over ℓ < L of CE(head(N(h_ℓ)), y), in the objective beside JREG's penalty; logged as early_exit."""
    m, idx = model(), torch.randint(0, 97, (2, 12))
    y = torch.randint(-1, 97, (2, 12))
    loss, penalty, terms, logged = Objective(m, early_exit=0.3)(idx, y)
    out = m(idx)
    ce = lambda h: F.cross_entropy(m.lm_head(m.norm(h)).flatten(0, 1), y.flatten(), ignore_index=-1)   # noqa: E731
    lens = 0.3 * sum(ce(h) for h in out.hidden_states[1:-1]) / 3
    assert torch.allclose(loss, ce(out.hidden_states[-1]) + lens, atol=1e-5)
    assert terms.keys() == {"ce", "early_exit"} and torch.allclose(terms["early_exit"], lens, atol=1e-5)
    assert torch.equal(Objective(m)(idx, y)[0], m(idx, y).loss)           # off: the model's loss alone


@pytest.mark.parametrize("name", list(METHODS))
def test_generation_with_the_kv_cache_equals_the_full_forward(name):
    m, idx = model(**{name: METHODS[name]}).eval(), torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        cache = KVCache(m.config, 2, 12, "cpu", torch.float32)
        cached = torch.cat([m(idx[:, :7], cache=cache).logits, m(idx[:, 7:], cache=cache).logits], 1)
        assert torch.allclose(cached, m(idx).logits[:, [6, 11]], atol=1e-5)


def test_export_folds_layernorm_scaling_and_refuses_the_others_in_one_line():
    from lib.hf import llama_to_hf
    m, idx = model(layernorm_scaling=True), torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        assert torch.allclose(llama_to_hf(m)(idx).logits, m(idx).logits, atol=1e-5)
    for name in ("mix_ln", "peri_ln", "backout_layer"):
        with pytest.raises(SystemExit, match=rf"^error: the model has {name} = .*: a Hugging Face Llama cannot compute"):
            llama_to_hf(model(**{name: METHODS[name]}))


def test_the_settings_are_checked_in_one_line():
    for bad, what in (("--mix_ln=1.5", "mix_ln = 1.5 is a fraction"), ("--backout_layer=8", "backout_layer = 8 is a "
                      "block 1..L-1"), ("--early_exit=-1", "early_exit"), ("--early_exit=inf", "'early_exit' = inf"),
                      ("--mix_ln=0.1", r"mix_ln = 0.1 of 4 layers turns no block Post-LN"),
                      ("--n_layer=1", "n_layer = 1 has none")):
        with pytest.raises(SystemExit, match=what):
            CF.model_config(CF.load_config(TINY + [bad] + (["--early_exit=0.1"] if bad == "--n_layer=1" else [])))
    assert CF.model_config(CF.load_config(TINY + ["--mix_ln=0", "--backout_layer=0"])).mix_ln == 0   # 0 is off


ALL_ON = ["--layernorm_scaling=True", "--mix_ln=0.25", "--peri_ln=True", "--backout_layer=2", "--early_exit=0.5",
          "--jreg_lambda=1.0"]


@pytest.mark.parametrize("mode,nproc", [("ddp", 2), ("ddp", 1), ("fsdp", 2), ("fsdp", 1)])
def test_every_method_on_two_processes_matches_one_and_resumes(data_dir, tmp_path, mode, nproc):
    """All five at once (and JREG): torchrun's gloo processes, DDP and FSDP2 on one and on two, give one plain
    process's numbers; the run resumes to the same numbers as one that ran through; evaluate.py profiles it."""
    args = ["--max_steps=4", "--eval_interval=4", "--ckpt_interval=2", *ALL_ON]
    one, one_eval = run(data_dir, tmp_path / "one", *args)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(HERE, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'two'}", *args,
           *(["--fsdp=True"] if mode == "fsdp" else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=300, env={**os.environ,
                       "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    two, two_eval = read_log(tmp_path / "two")
    for key in ("loss", "ce", "early_exit", "jreg"):
        assert [s[key] for s in two] == pytest.approx([s[key] for s in one], rel=1e-5, abs=1e-6), key
    assert two_eval[-1]["val_loss"] == pytest.approx(one_eval[-1]["val_loss"], rel=1e-5)
    if mode == "ddp":
        os.remove(tmp_path / "one" / "ckpt_0000004.pt")                     # resume from step 2 and redo 3-4
        resumed, _ = run(data_dir, tmp_path / "one", *args)
        assert [s["loss"] for s in resumed] == [s["loss"] for s in one]
        out = tmp_path / "profile.json"
        done = subprocess.run([sys.executable, "evaluate.py", str(tmp_path / "one"), "--profile", "--out", str(out)],
                              capture_output=True, text=True, cwd=HERE, timeout=300)
        assert done.returncode == 0 and out.exists(), done.stderr[-2000:]


@pytest.mark.parametrize("name", ["plain", *METHODS])
def test_the_lens_at_layer_L_is_the_models_own_loss_and_a_skipped_block_is_the_block_removed(name):
    """The logit lens and the skipped-block loss read a stream as the model reads its own (Llama.head_input): the lens
    at layer L is the model's loss, and skipping block i equals the forward with block i made the identity, for every
    method (Backout's − λ·h_k included, its h_k recomputed above a skipped block)."""
    from lib.profiles import profile_model, skip_block_logits
    m = model(**({} if name == "plain" else {name: METHODS[name]})).eval()
    windows = [torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    p = profile_model(m, windows)
    assert abs(p["logit_lens_loss"][-1] - p["analysis_loss"]) < 1e-6 and abs(p["loss"] - p["analysis_loss"]) < 1e-6
    idx = windows[0][:, :-1]
    with torch.no_grad():
        hidden = m(idx).hidden_states
        for i, block in enumerate(m.layers):
            skipped = skip_block_logits(m, idx, hidden, i)
            block.forward = lambda x, *args, **kwargs: x                       # the block removed, in the model
            assert torch.allclose(skipped, m(idx).logits, atol=1e-5), i
            del block.forward


def test_every_parameter_starts_from_one_rule_that_names_it(monkeypatch):
    """model.INIT gives each parameter its start; a parameter no rule names is refused when the model is built, and a
    rule's start is kept (a gate at 0 stays 0: it was set to 1 as "a 1-D parameter"). The rules draw the numbers the
    name-and-shape scheme drew, for every preset shape and method."""
    import model as M
    cfg = LlamaConfig(vocab_size=97, n_layer=4, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=48, max_seq_len=32)
    real_init = M.MLP.__init__

    def with_gate(self, c):
        real_init(self, c)
        self.gate_scale = torch.nn.Parameter(torch.zeros(1))
    monkeypatch.setattr(M.MLP, "__init__", with_gate)
    with pytest.raises(ValueError, match=r"^parameter layers\.0\.mlp\.gate_scale \(1,\) has no initialisation rule: "
                                         r"add its pattern to model.INIT$"):
        Llama(cfg)
    monkeypatch.setitem(M.INIT, r"layers\.\d+\.mlp\.gate_scale", 0.0)
    assert all(b.mlp.gate_scale.item() == 0.0 for b in Llama(cfg).layers)
    monkeypatch.setattr(M.MLP, "__init__", real_init)

    def by_name_and_shape(m):                                   # the scheme the rules replaced, as it was
        std = m.config.init_std
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif name == "backout_lambda":
                torch.nn.init.constant_(p, 0.5)
            elif p.dim() == 1:
                torch.nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                torch.nn.init.normal_(p, 0.0, std / math.sqrt(2 * m.config.n_layer))
            else:
                torch.nn.init.normal_(p, 0.0, std)
    for method in [{}, *({k: v} for k, v in METHODS.items()), {"tie_embeddings": True}]:
        m = Llama(LlamaConfig(**{**cfg.__dict__, **method}))
        torch.manual_seed(3)
        m.reset_parameters()
        ours = {name: p.detach().clone() for name, p in m.named_parameters()}
        torch.manual_seed(3)
        with torch.no_grad():
            by_name_and_shape(m)
        assert all(torch.equal(ours[name], p) for name, p in m.named_parameters()), method


def test_the_logged_loss_is_the_loss_back_propagated(monkeypatch):
    """A term added to the objective's loss without a name among its logged terms is trained, and logged in `loss`
    (which was rebuilt from the named terms alone)."""
    import loss as LOSS
    import train
    from parallel import parallelize
    m, idx = model(), torch.randint(0, 97, (2, 12))
    y = idx.roll(-1, 1)
    batch, cfg = (idx, y, None), CF.load_config(TINY + ["--compile=False", "--jreg_lambda=0.5"])
    counts = torch.tensor([train.token_counts(batch, False)])

    def logged(objective):
        return train.train_step(parallelize(objective, cfg, torch.device("cpu")), [batch], counts,
                                torch.autocast("cpu", enabled=False), False)
    plain = logged(Objective(m, jreg_lambda=0.5))
    real_forward = LOSS.Objective.forward
    monkeypatch.setattr(LOSS.Objective, "forward", lambda self, *a: (lambda loss, *rest: (loss + 0.25, *rest))(
        *real_forward(self, *a)))
    added = logged(Objective(m, jreg_lambda=0.5))
    assert torch.allclose(added["loss"], plain["loss"] + 0.25, atol=1e-6) and torch.equal(added["ce"], plain["ce"])
    assert torch.allclose(plain["loss"], plain["ce"] + 0.5 * plain["jreg"], atol=1e-6)
