"""Tests of docs/ablations.md: each of its worked edits changes what training minimises, the loss train.train_step
backpropagates (the objective's loss · share + λ · penalty · share) with the objective built by train.py's own
Objective(...) call. The edits are the page's own: its config snippet is read from the page, and each of its diffs is
applied by `git apply` to a scratch copy of the repository's current files, from which the edited jreg.py / model.py /
loss.py is imported, so a diff on the page that no longer applies fails here."""
import ast
import dataclasses
import functools
import importlib.util
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

import config as CF
import jreg
import loss as LOSS
import model as M
import prepare_fineweb
import train
from lib import preparation as PREP
from parallel import parallelize
from conftest import assert_close_ulps

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
DOC = os.path.join(HERE, "docs", "ablations.md")
CPU = torch.device("cpu")

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py


def doc_blocks(lang):
    """The page's fenced code blocks of one language, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", open(DOC, encoding="utf-8").read(), re.S | re.M)


def git(*args, cwd, diff=None):
    """git ARGS in folder cwd (the diff on stdin), a CompletedProcess; no GIT_* variable of the caller's reaches it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", *args], input=diff, cwd=cwd, env=env, capture_output=True, text=True)


def applied(diff, scratch):
    """Folder `scratch`, a git repository of its own holding the repository's current copy of each file `diff` names,
    with `diff` applied by `git apply` (as a reader applies it at the repository's root). A diff that git does not
    take (no unified-diff headers, context that is no longer in the file) fails here, with git's own message."""
    scratch.mkdir(parents=True)
    assert git("init", "-q", cwd=scratch).returncode == 0
    named = git("apply", "--numstat", "-", cwd=scratch, diff=diff)       # the paths the diff touches (reads no file)
    assert named.returncode == 0, f"docs/ablations.md has a diff that is not a unified diff:\n{named.stderr}{diff}"
    for path in (line.split("\t", 2)[2] for line in named.stdout.splitlines()):
        if os.path.exists(os.path.join(HERE, path)):
            os.makedirs((scratch / path).parent, exist_ok=True)
            shutil.copy(os.path.join(HERE, path), scratch / path)
    done = git("apply", "-", cwd=scratch, diff=diff)
    assert done.returncode == 0, f"docs/ablations.md's diff no longer applies (fix the page):\n{done.stderr}{diff}"
    return scratch


def page_diff(name, marker=""):
    """The page's one diff of NAME.py that holds `marker`."""
    diffs = [d for d in doc_blocks("diff") if d.startswith(f"--- a/{name}.py\n") and marker in d]
    assert len(diffs) == 1, f"docs/ablations.md has {len(diffs)} diffs of {name}.py with {marker!r}"
    return diffs[0]


def edited_module(name, monkeypatch, tmp_path, marker=""):
    """NAME.py (jreg, model or loss) as the page's diff of it that holds `marker` edits it: the diff applied by `git
    apply` to a scratch copy of the repository in a folder of tmp_path, and the edited file imported from there under
    a name of its own (the repository's modules stay as they are; a test monkeypatches what it takes from this one)."""
    folder = applied(page_diff(name, marker), tmp_path / f"{name}_edited")
    spec = importlib.util.spec_from_file_location(f"{name}_as_docs_ablations_edits_it", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)                 # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def objective_as_train_builds_it(cfg, model):
    """loss.Objective(...) with the arguments of train.py's own call (train.build_model), evaluated on cfg and model."""
    calls = [node for node in ast.walk(ast.parse(inspect.getsource(train.build_model)))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Objective"]
    assert len(calls) == 1, "train.build_model builds the objective in one Objective(...) call"
    scope = {"cfg": cfg, "model": model}
    value = lambda node: eval(compile(ast.Expression(node), "train.py", "eval"), scope)     # noqa: E731
    kwargs = {k.arg: value(k.value) for k in calls[0].keywords}
    return LOSS.Objective(*map(value, calls[0].args), **kwargs), kwargs


def training_loss(objective, cfg, batch):
    """train.train_step on one micro-batch, one process, fp32 (it also runs the backward pass): the step's named means
    (loss, ce, jreg, psi, ...), tensors, as attributes."""
    counts = torch.tensor([train.token_counts(batch, cfg.jreg_skip_first)])
    spread = parallelize(objective, dataclasses.replace(cfg, compile=False), CPU)     # one process: as it is
    return types.SimpleNamespace(**train.train_step(spread, [batch], counts, nullcontext(), False))


def kjv_config(*args):
    return CF.load_config([os.path.join(HERE, "configs", "kjv_jreg.py"), *args])


def random_batch(cfg, T=32):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 257, (2, T + 1), generator=g)      # byte tokens, as configs/kjv.py's
    return tokens[:, :-1], tokens[:, 1:], None


def test_the_names_the_page_gives_exist():
    """Every function, class and line "Where things are" and the edits point to is where the page says."""
    doc = open(DOC, encoding="utf-8").read()
    from lib import hf
    import checkpoint
    from lib import commands
    names = {"train_step": train, "build_model": train, "validate": train, "main": train, "Llama.forward": M,
             "Llama.reset_parameters": M, "Llama.head_input": M, "INIT": M, "Block.forward": M,
             "Attention.forward": M, "MLP.forward": M, "RMSNorm": M, "cross_entropy": LOSS,
             "chunk_loss_and_grads": LOSS, "chunk_loss": LOSS, "Objective": LOSS, "Objective.__init__": LOSS,
             "Objective.forward": LOSS, "streams": jreg, "displacement": jreg, "layer_weights": jreg,
             "jreg_penalty": jreg, "WEIGHTINGS": jreg, "RESUMABLE": CF, "llama_to_hf": hf, "llama_from_hf": hf,
             "restore": checkpoint, "load_run": commands}
    for name, module in names.items():                 # named on the page, and there (an AttributeError if not)
        assert f"`{name}`" in doc or f"`{module.__name__}.{name}`" in doc, name
        functools.reduce(getattr, name.split("."), module)
    lines = {"part = loss * ce_share + lam * penalty * psi_share": train.train_step,
             "(part * world).backward()": train.train_step, "objective.jreg_lambda": train.train_step,
             "(self.weights * psi).sum()": LOSS.Objective.forward,
             "out.hidden_states[:-1] + [out.final_hidden]": jreg.streams}
    for line, where in lines.items():
        assert f"`{line}`" in doc and line in inspect.getsource(where), line
    build = inspect.getsource(train.build_model)
    comment = "what a step minimises, all its settings here"
    assert f'"{comment}"' in doc and f"# {comment}" in build
    passed = set(re.findall(r"\b\w+=cfg\.\w+\b", doc))          # the Objective(...) call's arguments the page quotes
    assert "jreg_lambda=cfg.jreg_lambda" in passed and all(argument in build for argument in passed), passed
    script = lambda name: open(os.path.join(HERE, "scripts", name), encoding="utf-8").read()     # noqa: E731
    assert "its model.py takes other weights" in script("bench.py")
    assert "def test_an_edit_to_the_head_reaches_the_training_loss(" in open(os.path.join(HERE, "test_jreg.py")).read()
    assert "jreg_weighting" not in CF.RESUMABLE and "jreg_final_norm" not in CF.RESUMABLE
    tests = set(re.findall(r"^Test: `(test_\w+)`", doc, re.M))
    assert tests and tests <= set(globals())


def test_every_diff_on_the_page_applies_with_git_apply(tmp_path):
    """Each diff on the page is a unified diff (its files' headers, each hunk's line numbers) that `git apply` takes
    against the repository's current files, and it changes the file it names (a reader applies it as it stands)."""
    diffs = doc_blocks("diff")
    assert diffs
    for i, diff in enumerate(diffs):
        path = re.match(r"--- a/(\S+)\n\+\+\+ b/\1\n@@ -\d+,\d+ \+\d+,\d+ @@", diff).group(1)
        folder = applied(diff, tmp_path / str(i))
        assert (folder / path).read_text(encoding="utf-8") != open(os.path.join(HERE, path), encoding="utf-8").read()


def test_final_norm_last_layer_is_configuration_only(tmp_path):
    """Edit 1: the page's config file (and its command line) turns the objective into CE + λ · Ψ_L of
    [h_0..h_{L-1}, norm(h_L)], the hand reference, which differs from kjv_jreg's and from the raw h_L's."""
    for name in ("kjv.py", "kjv_jreg.py"):
        shutil.copy(os.path.join(HERE, "configs", name), tmp_path)
    snippets = [block for block in doc_blocks("python") if 'include("kjv_jreg.py")' in block]
    assert len(snippets) == 1
    (tmp_path / "kjv_jreg_last_normed.py").write_text(snippets[0])
    cfg, base = CF.load_config([str(tmp_path / "kjv_jreg_last_normed.py")]), kjv_config()
    changed = {f.name for f in dataclasses.fields(CF.Config) if getattr(cfg, f.name) != getattr(base, f.name)}
    assert changed == {"jreg_final_norm", "jreg_weighting", "out_dir"}
    assert (cfg.jreg_final_norm, cfg.jreg_weighting, cfg.jreg_lambda, cfg.compile) == (True, "last", 1.0, False)
    commands = [line for block in doc_blocks("bash") for line in block.splitlines()
                if line.startswith("python train.py configs/kjv_jreg.py ")]
    assert len(commands) == 1
    argv = shlex.split(commands[0])[2:]
    assert CF.load_config([os.path.join(HERE, argv[0]), *argv[1:]]) == cfg         # the command: the same run

    torch.manual_seed(0)
    model = M.Llama(CF.model_config(cfg))
    with torch.no_grad():                   # a trained final-norm gain turns h_L (a gain of 1 only rescales it)
        model.norm.weight.mul_(1 + 0.5 * torch.randn_like(model.norm.weight))
    batch = random_batch(cfg)
    losses = {}
    for name, c in (("kjv_jreg", base), ("last, raw h_L", dataclasses.replace(cfg, jreg_final_norm=False)),
                    ("last, normed h_L", cfg)):
        objective, kwargs = objective_as_train_builds_it(c, model)
        losses[name] = training_loss(objective, c, batch).loss
    assert (kwargs["weighting"], kwargs["final_norm"]) == ("last", True)
    with torch.no_grad():
        out = model(*batch[:2])
        h = out.hidden_states[:-1] + [model.norm(out.hidden_states[-1])]
        psi_L = ((1 - F.cosine_similarity(h[-2], h[-1], dim=-1)) / 2).mean()
    # other kernels: the training step's chunk through torch.func.vjp vs the no-grad forward, and
    # F.cosine_similarity vs jreg.displacement: equal up to rounding. 16 ulps of the loss (~5.9; 1e-6 was 1.4 ulps):
    # a mean over 64 positions plus Ψ_L; the other objectives differ by 1e-2 or more
    assert_close_ulps(losses["last, normed h_L"], out.loss + cfg.jreg_lambda * psi_L, ulps=16)
    edit = losses.pop("last, normed h_L")
    assert all(abs(edit - other) > 1e-2 for other in losses.values()), (edit, losses)
    assert losses["kjv_jreg"] != losses["last, raw h_L"]          # close: at init, Ψ_l differs little across layers


def test_a_linear_weighting_changes_the_training_objective(monkeypatch, tmp_path):
    """Edit 2: the page's diff of jreg.py adds `linear`, w_l = 2l / (L(L+1)); config accepts it only after the edit;
    the other weightings are unchanged; the training loss becomes CE + λ Σ_l w_l Ψ_l, not kjv_jreg's."""
    with pytest.raises(SystemExit, match=r"'jreg_weighting' = 'linear': choose one of"):
        kjv_config("--jreg_weighting=linear")
    original, original_weightings = jreg.layer_weights, jreg.WEIGHTINGS
    edited = edited_module("jreg", monkeypatch, tmp_path)
    assert edited.WEIGHTINGS == (*original_weightings, "linear")
    monkeypatch.setattr(jreg, "layer_weights", edited.layer_weights)
    monkeypatch.setattr(LOSS, "layer_weights", edited.layer_weights)  # loss.py's `from jreg import layer_weights`
    monkeypatch.setattr(jreg, "WEIGHTINGS", edited.WEIGHTINGS)
    monkeypatch.setattr(CF, "WEIGHTINGS", edited.WEIGHTINGS)   # config.py's `from jreg import WEIGHTINGS`, at import
    base, cfg = kjv_config(), kjv_config("--jreg_weighting=linear")
    model = M.Llama(CF.model_config(cfg))
    L = model.config.n_layer
    w, l = jreg.layer_weights(L, cfg.jreg_alpha, "linear"), torch.arange(1, L + 1, dtype=torch.float32)
    assert torch.allclose(w, 2 * l / (L * (L + 1))) and abs(w.sum().item() - 1) < 1e-6
    for weighting in original_weightings:
        assert torch.equal(edited.layer_weights(L, 3.0, weighting), original(L, 3.0, weighting))

    batch = random_batch(cfg)
    before = training_loss(objective_as_train_builds_it(base, model)[0], base, batch)
    objective, kwargs = objective_as_train_builds_it(cfg, model)
    after = training_loss(objective, cfg, batch)
    assert kwargs["weighting"] == "linear" and torch.equal(objective.weights, w)
    assert torch.allclose(after.jreg, (w * after.psi).sum(), atol=1e-7)
    assert torch.allclose(after.loss, after.ce + cfg.jreg_lambda * (w * after.psi).sum(), atol=1e-6)
    hs = model(*batch[:2]).hidden_states
    assert torch.allclose(jreg.jreg_penalty(hs, cfg.jreg_alpha, "linear"), after.jreg, atol=1e-6)
    assert torch.equal(before.ce, after.ce) and abs(after.loss - before.loss) > 1e-3, (before.loss, after.loss)


def test_qk_norm_changes_training_and_generation(monkeypatch, tmp_path):
    """Edit 3: the page's diff of model.Attention (QK-norm) and of model.INIT (the new gains' start). Without its INIT
    rule the model is refused in one ValueError naming the gain; with it the gains start at 1. On the same weights and
    batch: the training loss and the KV-cached generation change (and cached = uncached still); the gradient reaches
    both new gains, which the optimizer holds without weight decay, and one step lowers the loss; an old state dict no
    longer loads strictly (no resume), export refuses the model in one line naming the gains, and an HF model no
    longer loads."""
    from lib.hf import llama_from_hf, llama_to_hf
    doc = " ".join(open(DOC, encoding="utf-8").read().split())
    quoted = lambda start: re.search(rf"`({start}[^`]*)`", doc).group(1).split("…")     # noqa: E731  the page's quote
    cfg = kjv_config()
    mcfg = CF.model_config(cfg)
    torch.manual_seed(0)
    plain = M.Llama(mcfg)
    edited = edited_module("model", monkeypatch, tmp_path, "q_norm")
    monkeypatch.setattr(M, "Attention", edited.Attention)            # what Block builds from now on
    with pytest.raises(ValueError, match=r"q_norm\.weight .* has no initialisation rule") as refused:
        M.Llama(mcfg)                                                # a new parameter that no rule of INIT names
    assert all(piece.strip(" ,") in f"ValueError: {refused.value}" for piece in quoted("ValueError: parameter"))
    assert [rule for rule in edited.INIT.items() if rule not in M.INIT.items()] == [
        (r"layers\.\d+\.attn\.[qk]_norm\.weight", 1.0)]                  # the one rule the diff adds
    monkeypatch.setattr(M, "INIT", edited.INIT)                      # what reset_parameters reads from now on
    model, _, optimizer = train.build_model(cfg, mcfg, CPU, None)      # as train.py builds it, then plain's weights
    gains = {f"layers.{i}.attn.{qk}_norm.weight" for i in range(mcfg.n_layer) for qk in "qk"}
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert set(missing) == gains and not unexpected
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: .*q_norm"):
        model.load_state_dict(plain.state_dict())                    # as checkpoint.restore and commands.load_run load
    params = dict(model.named_parameters())
    assert all(torch.equal(params[name], torch.ones(mcfg.head_dim)) for name in gains)   # reset_parameters: gains 1
    no_decay = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert all(id(params[name]) in no_decay for name in gains)

    x, y, _ = batch = random_batch(cfg)
    with torch.no_grad():                                            # generation: a prompt, then one token, cached
        def cached(m):
            cache = M.KVCache(m.config, 2, 12, "cpu", torch.float32)
            return torch.cat([m(x[:, :7], cache=cache).logits, m(x[:, 7:12], cache=cache).logits], 1)
        ours, theirs = cached(model.eval()), cached(plain.eval())
        assert torch.allclose(ours, model(x[:, :12]).logits[:, [6, 11]], atol=1e-5)   # the cache keeps normed keys
        assert (ours - theirs).abs().max() > 1e-3
        hf_plain = llama_to_hf(plain)
        assert torch.allclose(hf_plain(x).logits, plain(x).logits, atol=1e-5)          # export as before the edit...
        with pytest.raises(SystemExit, match="q_norm") as refused:
            llama_to_hf(model)                                       # ...and now one line naming the unmapped gains
    message = str(refused.value)
    assert "\n" not in message and all(piece.strip(" ,") in message for piece in quoted("error: the model has"))
    assert {name for name in gains if name in message} == gains
    with pytest.raises(RuntimeError, match="q_norm"):
        llama_from_hf(hf_plain)                                      # nor does an HF model load (scripts/convert_hf.py)
    model.train(), plain.train()

    before = training_loss(objective_as_train_builds_it(cfg, plain)[0], cfg, batch)
    model.zero_grad(set_to_none=True)
    after = training_loss(objective_as_train_builds_it(cfg, model)[0], cfg, batch)
    assert abs(after.loss - before.loss) > 1e-3, (before.loss, after.loss)
    assert all(params[name].grad is not None and params[name].grad.abs().sum() > 0 for name in gains)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert not all(torch.equal(params[name], torch.ones(mcfg.head_dim)) for name in gains)
    assert training_loss(objective_as_train_builds_it(cfg, model)[0], cfg, batch).loss < after.loss


def test_a_z_loss_changes_the_training_loss_and_its_gradient(monkeypatch, tmp_path):
    """Edit 4: the page's diff of loss.chunk_loss (a z-loss, one line). On the same weights and batch, training's loss
    grows by the z-loss computed by hand from the full logits, the step reports it as its own term beside an unchanged
    ce, the head's gradient changes, and evaluation's loss grows too. (Before the loss was a plain function under
    autograd, an edit to it changed evaluation only: training kept a hand-written gradient.)"""
    cfg = kjv_config()
    torch.manual_seed(0)
    model = M.Llama(CF.model_config(cfg))
    x, y, _ = batch = random_batch(cfg)
    objective = objective_as_train_builds_it(cfg, model)[0]

    def step_and_head_grad():
        model.zero_grad(set_to_none=True)
        stats = training_loss(objective, cfg, batch)
        with torch.no_grad():
            evaluated = model(x, y).loss
        return stats, model.lm_head.weight.grad.clone(), evaluated
    before, grad_before, eval_before = step_and_head_grad()
    monkeypatch.setattr(LOSS, "chunk_loss", edited_module("loss", monkeypatch, tmp_path, "z_loss").chunk_loss)
    after, grad_after, eval_after = step_and_head_grad()
    with torch.no_grad():
        lse = model(x).logits.float().logsumexp(-1)
    counted = y != -1
    z_loss = 1e-4 * (lse ** 2 * counted).sum() / counted.sum()
    assert z_loss > 1e-3                                                 # (log 320)² · 1e-4 at initialisation
    assert not hasattr(before, "z_loss") and after.z_loss.item() == pytest.approx(z_loss.item(), rel=1e-4)
    assert torch.equal(after.ce, before.ce)
    assert (after.loss - before.loss).item() == pytest.approx(z_loss.item(), rel=1e-4)
    assert eval_after - eval_before == pytest.approx(z_loss.item(), rel=1e-4)
    assert (grad_after - grad_before).abs().max() > 1e-6


def test_a_z_loss_is_logged_by_itself(monkeypatch, tmp_path, capsys):
    """Edit 4 again, through train.main: the z-loss term, computed in the one line the page adds, appears in the step's
    log line and in log.jsonl with no other edit, and the logged loss is ce + z_loss + λ · jreg."""
    source = tmp_path / "source.txt"
    source.write_text("\n".join(json.loads(line)["text"] for line in open(PREP.kjv_path(), encoding="utf-8"))[:40_000],
                      encoding="utf-8")
    prepare_fineweb.main(["--input", str(source), "--out_dir", str(tmp_path / "data"), "--prefix", "t", "--tokenizer",
                          "bytes", "--val_tokens", "2048", "--shard_tokens", "20000", "--quiet"])
    monkeypatch.setattr(LOSS, "chunk_loss", edited_module("loss", monkeypatch, tmp_path, "z_loss").chunk_loss)
    train.main(["--model=tiny", "--vocab_size=320", "--n_layer=2", "--d_model=32", "--n_head=2", "--n_kv_head=1",
                "--ffn_hidden=64", "--tokenizer=bytes", "--seq_len=32", "--micro_batch=4", "--batch_tokens=256",
                "--compile=False", "--eval_interval=0", "--max_steps=2", "--jreg_lambda=1",
                f"--data_dir={tmp_path / 'data'}", f"--out_dir={tmp_path / 'out'}"])
    steps = [json.loads(line) for line in open(tmp_path / "out" / "log.jsonl") if '"loss"' in line]
    assert len(steps) == 2 and all(s["z_loss"] > 1e-3 for s in steps)
    assert all(s["loss"] == pytest.approx(s["ce"] + s["z_loss"] + s["jreg"], rel=1e-6) for s in steps)
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(shown) == 2 and all(f"z_loss {s['z_loss']:.4f}" in line for s, line in zip(steps, shown))
