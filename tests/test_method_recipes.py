"""Each method as its authors run it (docs/methods.md, "Each method's recipe"): the settings around the formulas, each
off by default, off giving today's numbers to the last bit; on, each equal to the published code where a package ships
it (OLMo-core's LayerNorm-Scaling and Peri-LN blocks, torchtune's early-exit loss and rotational curriculum, built with
our weights), and through training: resumed runs equal a run that went through, λ's own learning rate."""
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import config as CF
import train
from loss import Objective
from model import Llama, LlamaConfig

from test_methods import model
from test_train import TINY, data_dir, read_log, run  # noqa: F401 (data_dir: a fixture)


def olmo_block(kind, ours, layer, cfg):
    """OLMo-core's block of this kind (LayerNormScaledTransformerBlock or PeriNormTransformerBlock), our block's weights
    loaded into it."""
    from olmo_core.nn.attention import AttentionConfig
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.layer_norm import LayerNormConfig, LayerNormType
    from olmo_core.nn.rope import RoPEConfig
    from olmo_core.nn.transformer import block as olmo
    block = getattr(olmo, kind)(
        d_model=cfg.d_model, block_idx=layer, n_layers=cfg.n_layer,
        sequence_mixer=AttentionConfig(n_heads=cfg.n_head, n_kv_heads=cfg.n_kv_head, bias=False,
                                       rope=RoPEConfig(theta=int(cfg.rope_theta))),
        feed_forward=FeedForwardConfig(hidden_size=cfg.ffn_hidden, bias=False),
        layer_norm=LayerNormConfig(name=LayerNormType.rms, eps=cfg.norm_eps, bias=False))
    names = {"attention.w_q": "attn.q_proj", "attention.w_k": "attn.k_proj", "attention.w_v": "attn.v_proj",
             "attention.w_out": "attn.o_proj", "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj",
             "feed_forward.w3": "mlp.up_proj", "attention_norm": "attn_norm", "feed_forward_norm": "mlp_norm",
             "post_attention_norm": "attn_out_norm", "post_feed_forward_norm": "mlp_out_norm"}
    sd = ours.state_dict()
    theirs = {k: sd[names[k.rsplit(".", 1)[0]] + ".weight"] for k in block.state_dict() if k.endswith(".weight")}
    block.load_state_dict(theirs, strict=False)                # strict=False: LNS's ln_scale buffer is its own
    return block


@pytest.mark.parametrize("kind,method", [("LayerNormScaledTransformerBlock", "layernorm_scaling"),
                                         ("PeriNormTransformerBlock", "peri_ln")])
def test_our_block_is_olmo_cores(kind, method):
    """Each block of the model equals OLMo-core's block of the method, built with the same weights."""
    m, x = model(**{method: True}), torch.randn(2, 12, 32)
    cos, sin = m.rope_cos[:12], m.rope_sin[:12]
    with torch.no_grad():
        for layer, ours in enumerate(m.layers):
            theirs = olmo_block(kind, ours, layer, m.config)
            assert torch.allclose(ours(x, cos, sin), theirs(x), atol=1e-5), layer
        plain = olmo_block("TransformerBlock", model().layers[1], 1, m.config)   # and it is not the plain block
        assert not torch.allclose(m.layers[1](x, cos, sin), plain(x), atol=1e-3)


def test_the_embedding_norm_is_olmo_cores_and_the_lns_init_is_std_002_everywhere():
    """embedding_norm: h_0 = N(E[x]) with its own gain, as OLMo-core's Transformer applies embedding_norm; the blocks
    see it. depth_scaled_init=False: o_proj and down_proj drawn at init_std like every matrix (the LNS repository's
    init); True (today's): at init_std/√(2L)."""
    from olmo_core.nn.layer_norm import RMSNorm as OlmoRMSNorm
    m, idx = model(peri_ln=True, embedding_norm=True), torch.randint(0, 97, (2, 12))
    theirs = OlmoRMSNorm(size=32, eps=1e-5, bias=False)
    with torch.no_grad():
        theirs.weight.copy_(m.embedding_norm.weight)
        out = m(idx)
        assert torch.allclose(out.hidden_states[0], theirs(m.tok_emb(idx)), atol=1e-6)
        assert torch.equal(out.hidden_states[1], m.layers[0](out.hidden_states[0], m.rope_cos[:12], m.rope_sin[:12]))
    stds = {}
    for scaled in (True, False):
        torch.manual_seed(0)
        big = Llama(LlamaConfig(n_layer=8, d_model=256, ffn_hidden=512, n_head=4, n_kv_head=4, vocab_size=64,
                                depth_scaled_init=scaled))
        stds[scaled] = [big.layers[3].attn.o_proj.weight.std().item(), big.layers[3].mlp.down_proj.weight.std().item(),
                        big.layers[3].attn.q_proj.weight.std().item()]
    assert stds[False] == pytest.approx([0.02] * 3, rel=0.02)
    assert stds[True] == pytest.approx([0.02 / 4, 0.02 / 4, 0.02], rel=0.02)          # √(2·8) = 4


class Unembed(torch.nn.Module):
    """What torchtune's early_exit_loss calls: model.unembed (the final norm and the head) and model.layers."""

    def __init__(self, m):
        super().__init__()
        self.m, self.layers = m, m.layers

    def unembed(self, h):
        return self.m.lm_head(self.m.norm(h))


@pytest.mark.parametrize("every", [0, 2, 3])
def test_the_layerskip_loss_is_torchtunes_early_exit_loss_with_its_rotational_curriculum(every):
    """early_exit_scale="sum_l" is torchtune's early_exit_loss with sum_l_loss_scale and e_scale = early_exit, over the
    exits its RotationalEarlyExitCurriculum trains at each step (layers "::R", rolled by one a step, the last always),
    read at the blocks' outputs (our exit ℓ is its layer index ℓ − 1; h_L its last)."""
    from torchtune.modules.common_utils import slice_str_to_array
    from torchtune.modules.early_exit_loss import RotationalEarlyExitCurriculum, early_exit_loss, sum_l_loss_scale
    L, m = 4, model()
    with torch.no_grad():
        m.lm_head.weight.mul_(30)                                # sharp logits: each exit's loss its own
    idx, y = torch.randint(0, 97, (2, 12)), torch.randint(-1, 97, (2, 12))
    objective = Objective(m, early_exit=0.3, early_exit_scale="sum_l", early_exit_every=every)
    curriculum = RotationalEarlyExitCurriculum(slice_str_to_array(f"::{every}" if every else ":", L), max_steps=10)
    out, losses = m(idx), []
    for step in range(6):
        objective.at_step(step)
        ours = objective(idx, y)[0]
        ids = [i for i, on in enumerate(curriculum.get()) if on]
        theirs = early_exit_loss(Unembed(m), {i: out.hidden_states[i + 1] for i in ids}, y,
                                 torch.nn.CrossEntropyLoss(ignore_index=-1), 0.3, sum_l_loss_scale)
        assert torch.allclose(ours, theirs, atol=1e-5), step
        assert objective.trained == [i + 1 for i in ids if i < L - 1]
        losses.append(ours.item())
        curriculum.step()
    assert (len(set(losses)) > 1) == bool(every)                 # the rotation changes the loss from step to step


def test_a_uniform_rotation_averages_the_trained_exits_and_no_exit_trained_is_the_last_layers_loss():
    m = model()
    idx, y = torch.randint(0, 97, (2, 12)), torch.randint(-1, 97, (2, 12))
    out = m(idx)
    ce = lambda h: F.cross_entropy(m.lm_head(m.norm(h)).flatten(0, 1), y.flatten(), ignore_index=-1)   # noqa: E731
    objective = Objective(m, early_exit=0.5, early_exit_every=2)
    for step, trained in ((0, [1, 3]), (1, [2]), (2, [3, 1])):
        objective.at_step(step)
        assert sorted(objective.trained) == sorted(trained)
        want = ce(out.hidden_states[-1]) + 0.5 * sum(ce(out.hidden_states[ell]) for ell in trained) / len(trained)
        assert torch.allclose(objective(idx, y)[0], want, atol=1e-5)
    objective = Objective(m, early_exit=0.5, early_exit_every=4)              # L = 4: step 3 trains no exit < L
    objective.at_step(3)
    assert objective.trained == [] and torch.allclose(objective(idx, y)[0], ce(out.hidden_states[-1]), atol=1e-6)


def killed_during(monkeypatch, step, data_dir, out_dir, *args):
    """A run of args into out_dir, killed (KeyboardInterrupt) during `step`: what went before it is its checkpoints."""
    real = train.lr_at
    monkeypatch.setattr(train, "lr_at", lambda s, cfg: (_ for _ in ()).throw(KeyboardInterrupt()) if s == step - 1
                        else real(s, cfg))
    with pytest.raises(KeyboardInterrupt):
        run(data_dir, out_dir, *args)
    monkeypatch.setattr(train, "lr_at", real)


RECIPES = {"lns": ["--layernorm_scaling=True", "--depth_scaled_init=False"],
           "periln": ["--peri_ln=True", "--embedding_norm=True"],
           "early_exit": ["--early_exit=0.1", "--early_exit_scale=sum_l", "--early_exit_every=2"],
           "backout": ["--backout_layer=3", "--backout_lr_mult=5"]}


def test_off_is_todays_run_to_the_last_bit(data_dir, tmp_path):
    """Each recipe setting written out at its default gives the run of the settings before them, bit for bit."""
    args = ["--max_steps=3", "--eval_interval=3"]
    plain, plain_eval = run(data_dir, tmp_path / "plain", *args, "--early_exit=0.1", "--backout_layer=2")
    off, off_eval = run(data_dir, tmp_path / "off", *args, "--early_exit=0.1", "--backout_layer=2",
                        "--depth_scaled_init=True", "--embedding_norm=False", "--early_exit_scale=uniform",
                        "--early_exit_every=0", "--backout_lr_mult=1")
    assert [(s["loss"], s["ce"], s["early_exit"]) for s in off] == [(s["loss"], s["ce"], s["early_exit"])
                                                                    for s in plain]
    assert off_eval == plain_eval


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_each_recipe_trains_resumes_exactly_and_differs_from_todays_variant(data_dir, tmp_path, recipe, monkeypatch):
    """Each recipe trains, and a run killed after a checkpoint resumes to the same numbers as one that went through
    (the rotation follows the step, λ's learning rate its group); its numbers are not those of today's variant."""
    args = ["--max_steps=6", "--ckpt_interval=3", "--eval_interval=6", *RECIPES[recipe]]
    full, _ = run(data_dir, tmp_path / "full", *args)
    killed_during(monkeypatch, 5, data_dir, tmp_path / "resumed", *args)
    resumed, _ = run(data_dir, tmp_path / "resumed", *args)
    assert [s["loss"] for s in resumed] == [s["loss"] for s in full]
    variant = [a for a in RECIPES[recipe] if a.split("=")[0] in ("--layernorm_scaling", "--peri_ln", "--early_exit",
                                                                   "--backout_layer")]
    today, _ = run(data_dir, tmp_path / "today", "--max_steps=6", "--eval_interval=6", *variant)
    assert today[-1]["loss"] != full[-1]["loss"]


def test_backouts_lambda_trains_at_its_own_learning_rate(data_dir, tmp_path, monkeypatch):
    """backout_lr_mult = 5: λ alone sits in a group at 5 × the schedule's lr, without weight decay; every other
    parameter's group is as before."""
    seen = []
    real = train.build_model

    def spy(*a, **k):
        out = real(*a, **k)
        seen.append(out)
        return out
    monkeypatch.setattr(train, "build_model", spy)
    run(data_dir, tmp_path / "run", "--max_steps=2", "--eval_interval=0", "--warmup_steps=0", "--backout_layer=2",
        "--backout_lr_mult=5")
    m, _, optimizer = seen[0]
    groups = optimizer.param_groups
    assert len(groups) == 3 and groups[2]["params"] == [m.backout_lambda] and groups[2]["weight_decay"] == 0.0
    assert groups[2]["lr"] == pytest.approx(5 * groups[0]["lr"]) and groups[0]["lr"] > 0
    assert all(p is not m.backout_lambda for g in groups[:2] for p in g["params"])


def test_a_recipe_setting_without_its_method_is_one_line():
    for bad, what in ((["--early_exit_scale=sum_l"], "'early_exit_scale' = 'sum_l': shapes the early-exit loss, "
                       "which is off"), (["--early_exit_every=2"], "'early_exit_every' = 2: shapes"),
                      (["--early_exit=0.1", "--early_exit_scale=depth"], "choose one of"),
                      (["--early_exit=0.1", "--early_exit_every=-1"], "'early_exit_every' = -1: must be"),
                      (["--backout_lr_mult=5"], "'backout_lr_mult' = 5.0: is Backout's λ's, and Backout is off")):
        with pytest.raises(SystemExit, match=what):
            CF.check_config(CF.load_config(TINY + bad))


def test_bench_steps_times_each_configs_step_as_a_ratio_to_the_first(tmp_path, capsys):
    """scripts/bench.py --steps: each config's own training step (its methods and objective), interleaved; the first's
    ratio is 1 and the record names every config (timings are printed, never asserted)."""
    from scripts import bench
    configs = []
    for name, extra in (("plain", ""), ("layerskip", 'early_exit = 0.1\nearly_exit_scale = "sum_l"\n'
                                                     "early_exit_every = 2\n"), ("backout", "backout_layer = 2\n")):
        path = tmp_path / f"{name}.py"
        path.write_text('model = "tiny"\nn_layer = 4\nd_model = 64\nn_head = 4\nn_kv_head = 2\nffn_hidden = 128\n'
                        'vocab_size = 320\ntokenizer = "bytes"\nseq_len = 64\nmicro_batch = 2\nbatch_tokens = 128\n'
                        'device = "cpu"\ncompile = False\n' + extra)
        configs.append(str(path))
    out = tmp_path / "steps.json"
    bench.main(["--steps", *configs, "--repeats", "3", "--warmup", "1", "--json", str(out)])
    record = __import__("json").load(open(out))["results"]
    assert record["first"] == "plain" and record["ratio"]["plain"] == 1.0
    assert set(record["ratio"]) == {"plain", "layerskip", "backout"} and all(v > 0 for v in record["ratio"].values())
    assert "× plain" in capsys.readouterr().out
