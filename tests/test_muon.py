"""The optimizer setting (optimizers.py, docs/optimizer.md): AdamW by default, unchanged to the last bit; Muon for the
blocks' 2-D matrices and AdamW for the rest, its update the published algorithm's (a step written out here), through
every path: resume exactly, DDP on one and two gloo processes equal to one process, FSDP and an old torch refused in
one line, changing it on resume refused, the memory estimate counting Muon's one buffer."""
import math
import os
import subprocess
import sys

import pytest
import torch

import config as CF
from model import Llama, LlamaConfig
from optimizers import Optimizers, build_optimizer

from test_method_recipes import killed_during
from test_train import HERE, TINY, data_dir, read_log, run  # noqa: F401 (data_dir: a fixture)


def built(*settings):
    cfg = CF.load_config(TINY + list(settings))
    torch.manual_seed(0)
    model = Llama(CF.model_config(cfg))
    return model, build_optimizer(model, cfg, torch.device("cpu")), cfg


def test_adamw_is_the_default_and_muon_takes_exactly_the_blocks_matrices():
    model, adamw, _ = built()
    matrices = sum(p.dim() >= 2 for p in model.parameters())           # the token embedding does not decay by default
    assert type(adamw) is torch.optim.AdamW and [len(g["params"]) for g in adamw.param_groups] == [
        matrices - 1, len(list(model.parameters())) - matrices + 1]
    model, both, cfg = built("--optimizer=muon", "--backout_layer=2", "--backout_lr_mult=5")
    muon, adamw = both
    assert isinstance(both, Optimizers) and type(muon) is torch.optim.Muon and type(adamw) is torch.optim.AdamW
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert in_muon == {f"layers.{i}.{m}.weight" for i in range(4) for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj",
                       "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert in_adamw == set(names.values()) - in_muon and "tok_emb.weight" in in_adamw and "lm_head.weight" in in_adamw
    group = muon.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["momentum"], group["adjust_lr_fn"]) == (
        cfg.lr, cfg.weight_decay, 0.95, "match_rms_adamw")
    assert adamw.param_groups[2]["lr_mult"] == 5 and len(both.param_groups) == 4


def newton_schulz(g, steps=5, eps=1e-7):
    """The quintic Newton–Schulz iteration of Muon (Keller Jordan's), written out: X ≈ U Vᵀ of g = U S Vᵀ."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + eps)
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def test_a_muon_step_is_the_algorithm_written_out():
    """Three steps on one matrix against Keller Jordan's algorithm in fp32: Nesterov momentum, Newton–Schulz, decoupled
    weight decay, lr × 0.2·√max(A, B) (match_rms_adamw). PyTorch runs Newton–Schulz in bf16 and keeps the momentum as
    an average ((1 − μ)·g scale, which the normalisation removes): the change agrees within bf16's rounding, and the
    other lr adjustment (√max(1, A/B)) is far outside it."""
    torch.manual_seed(0)
    start = torch.randn(48, 32)
    grads = [torch.randn(48, 32) for _ in range(3)]

    def reference(factor):
        w, buf = start.clone(), torch.zeros(48, 32)
        for g in grads:
            buf = 0.95 * buf + g
            w = w * (1 - 0.01 * 0.1) - 0.01 * factor * newton_schulz(g + 0.95 * buf)
        return w - start
    w = torch.nn.Parameter(start.clone())
    opt = torch.optim.Muon([w], lr=0.01, weight_decay=0.1, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    for g in grads:
        w.grad = g.clone()
        opt.step()
    change = w.detach() - start
    off = lambda ref: ((change - ref).norm() / ref.norm()).item()          # noqa: E731
    assert off(reference(0.2 * math.sqrt(48))) < 0.01
    assert off(reference(math.sqrt(48 / 32))) > 0.08


def test_adamw_is_todays_run_to_the_last_bit_and_muon_another(data_dir, tmp_path):
    args = ["--max_steps=4", "--eval_interval=4", "--backout_layer=2", "--backout_lr_mult=5", "--jreg_lambda=1.0"]
    plain, plain_eval = run(data_dir, tmp_path / "plain", *args)
    adamw, adamw_eval = run(data_dir, tmp_path / "adamw", *args, "--optimizer=adamw", "--muon_momentum=0.9")
    assert [s["loss"] for s in adamw] == [s["loss"] for s in plain] and adamw_eval == plain_eval
    muon, _ = run(data_dir, tmp_path / "muon", *args, "--optimizer=muon")
    assert muon[0]["loss"] == plain[0]["loss"] and muon[-1]["loss"] != plain[-1]["loss"]   # the same start, other steps


def test_a_muon_run_resumes_exactly_and_its_optimizer_cannot_change(data_dir, tmp_path, monkeypatch):
    args = ["--max_steps=6", "--ckpt_interval=3", "--eval_interval=6", "--optimizer=muon"]
    full, _ = run(data_dir, tmp_path / "full", *args)
    killed_during(monkeypatch, 5, data_dir, tmp_path / "resumed", *args)
    ckpt = torch.load(tmp_path / "resumed" / "ckpt_0000003.pt", weights_only=True)
    assert any("momentum_buffer" in state for state in ckpt["optimizer"]["state"].values())   # Muon's, by name
    resumed, _ = run(data_dir, tmp_path / "resumed", *args)
    assert [s["loss"] for s in resumed] == [s["loss"] for s in full]
    with pytest.raises(SystemExit, match="other settings; resuming needs the same ones .*optimizer: run 'muon', now "
                                         "'adamw'"):
        run(data_dir, tmp_path / "resumed", "--max_steps=9", "--ckpt_interval=3", "--eval_interval=6",
            "--optimizer=adamw")


def test_muon_on_an_old_torch_or_under_fsdp_is_one_line(monkeypatch):
    with pytest.raises(SystemExit, match="'optimizer' = 'muon': muon under FSDP is not supported here"):
        CF.check_config(CF.load_config(TINY + ["--optimizer=muon", "--fsdp=True"]))
    monkeypatch.delattr(torch.optim, "Muon")
    monkeypatch.setattr(torch, "__version__", "2.8.0")
    with pytest.raises(SystemExit, match=r"'optimizer' = 'muon': muon is torch.optim.Muon, which torch 2.9 added; this "
                                         r"torch is 2.8.0"):
        CF.check_config(CF.load_config(TINY + ["--optimizer=muon"]))
    CF.check_config(CF.load_config(TINY))                              # AdamW needs no Muon
    for bad, what in (("--optimizer=sgd", "choose adamw or muon"), ("--muon_adjust_lr=none", "choose match_rms"),
                      ("--muon_momentum=1", r"must be in \[0, 1\)")):
        with pytest.raises(SystemExit, match=what):
            CF.check_config(CF.load_config(TINY + [bad]))


@pytest.mark.parametrize("nproc", [1, 2])
def test_muon_under_ddp_matches_one_process(data_dir, tmp_path, nproc):
    """torchrun's gloo processes (DDP averages the gradients before Muon orthogonalises them) give one process's
    numbers, on one process and on two."""
    args = ["--max_steps=4", "--eval_interval=4", "--ckpt_interval=4", "--optimizer=muon", "--jreg_lambda=1.0"]
    one, one_eval = run(data_dir, tmp_path / "one", *args)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(HERE, "train.py"), *TINY, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'ddp'}", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=300, env={**os.environ,
                       "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ddp, ddp_eval = read_log(tmp_path / "ddp")
    assert [s["loss"] for s in ddp] == pytest.approx([s["loss"] for s in one], rel=1e-5, abs=1e-6)
    assert ddp_eval[-1]["val_loss"] == pytest.approx(one_eval[-1]["val_loss"], rel=1e-5)


def test_the_memory_estimate_counts_muons_one_buffer():
    """Muon keeps one fp32 momentum buffer per block matrix, AdamW two moments for the rest: the estimate's optimizer
    part equals the state a step leaves, counted."""
    from scripts.bench import estimate
    model, both, cfg = built("--optimizer=muon")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    both.step()
    state = sum(t.numel() * t.element_size() for opt in both for s in opt.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    mcfg = model.config
    assert estimate(mcfg, 4, 64, "fp32", optimizer="muon")["optimizer"] == state
    assert estimate(mcfg, 4, 64, "fp32")["optimizer"] == 8 * model.num_params()


def test_a_nonfinite_step_under_muon_is_skipped_and_changes_nothing(data_dir, tmp_path, monkeypatch):
    """Bad-step skipping does not ask which optimizer runs: a NaN loss at step 3 leaves every weight and Muon's
    momentum as they were after step 2."""
    from test_train import nan_from_call
    args = ["--max_steps=2", "--eval_interval=0", "--ckpt_interval=1", "--optimizer=muon"]
    run(data_dir, tmp_path, *args)
    before = torch.load(tmp_path / "ckpt_0000002.pt", weights_only=True)
    nan_from_call(monkeypatch, 1, 2)                                     # step 3's two micro-batches
    steps, _ = run(data_dir, tmp_path, "--max_steps=3", "--eval_interval=0", "--ckpt_interval=1", "--optimizer=muon")
    after = torch.load(tmp_path / "ckpt_0000003.pt", weights_only=True)
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    for name, state in before["optimizer"]["state"].items():
        assert all(torch.equal(v, after["optimizer"]["state"][name][k]) for k, v in state.items() if torch.is_tensor(v))
