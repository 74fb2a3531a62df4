"""
Tests of survey.py on tiny random transformers models saved to folders with a tokenizer built offline: a GPT-2 and a
GPT-NeoX (non-Llama families, profiled through forward hooks) and a Llama (converted to our code). CPU only, offline.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import evaluate as E
from scripts import survey
from lib import profiles
from lib.hf import load_hf

TEXT = "In the beginning God created the heaven and the earth. And the earth was without form, and void. " * 12


pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py


def tokenizer():
    """A byte-level BPE trained here (the `tokenizers` library), wrapped as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([TEXT] * 3, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                           show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def tiny_model(family, vocab_size):
    import transformers as T
    torch.manual_seed(0)
    if family == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=32, n_layer=4, n_head=2))
    if family == "gpt_neox":
        return T.GPTNeoXForCausalLM(T.GPTNeoXConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=4,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     max_position_embeddings=64))
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=1,
                                            max_position_embeddings=64, initializer_range=0.2))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tok = tokenizer()
    for family in ("gpt2", "gpt_neox", "llama"):
        tiny_model(family, len(tok)).save_pretrained(str(root / family))
        tok.save_pretrained(str(root / family))
    (root / "text.txt").write_text(TEXT)
    return root


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_hooks_give_the_streams_transformers_reports(folders, family):
    """Ψ through forward hooks on the blocks equals Ψ from output_hidden_states (h_0..h_(L−1) raw, h_L normed), and
    the raw h_L is the final norm's input."""
    model, _ = load_hf(str(folders / family))
    assert profiles.profile_target(model) is model                  # not a Llama: profiled through hooks
    windows = torch.randint(0, model.config.vocab_size, (2, 17))
    p = profiles.profile_model(model, [windows], analysis_tokens=0)
    norm_input = []
    handle = profiles.blocks_and_norm(model)[1].register_forward_pre_hook(lambda m, a: norm_input.append(a[0]))
    with torch.no_grad():
        hs = list(model(windows[:, :-1], output_hidden_states=True).hidden_states)
    handle.remove()
    psi = lambda a, b: float(((1 - F.cosine_similarity(a, b, dim=-1)) / 2).mean())      # noqa: E731
    assert len(hs) == 5 and p["n_layer"] == 4
    assert p["psi_normed"] == pytest.approx([psi(a, b) for a, b in zip(hs[:-1], hs[1:])], abs=1e-6)
    assert p["psi"] == pytest.approx([psi(a, b) for a, b in zip(hs[:-2], hs[1:-1])] + [psi(hs[-2], norm_input[0])],
                                     abs=1e-6)
    with torch.no_grad():                                     # the loss is the model's own
        logits = model(windows[:, :-1]).logits
    assert p["loss"] == pytest.approx(float(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())), abs=1e-5)


def test_survey_of_three_families_table_json_and_plot(folders, tmp_path, capsys, monkeypatch):
    from test_evaluate import plot_problems, saved_figures
    out, plots, figs = tmp_path / "s.json", tmp_path / "plots", saved_figures(monkeypatch)
    dirs = [str(folders / f) for f in ("gpt2", "gpt_neox", "llama")]
    survey.main(["--hf", *dirs, "--text", str(folders / "text.txt"), "--tokens", "64", "--seq_len", "16",
                 "--batch_size", "3", "--out", str(out), "--plot", str(plots)])
    res = json.loads(out.read_text())
    assert res["complete"] and list(res["models"]) == dirs
    for name, r in res["models"].items():
        assert r["profile"]["n_tokens"] == 64 and r["seq_len"] == 16 and r["load_s"] >= 0 and r["profile_s"] >= 0
        assert r["params"] == sum(p.numel() for p in load_hf(name)[0].parameters())       # tied weights once
        s, p = r["summary"]["raw"], r["profile"]
        assert s["zeta_L"] == p["zeta"][-1] and s["zeta_L_minus_2"] == p["zeta"][-3]
        assert s["middle_psi"] == pytest.approx(np.mean(p["psi"][1:p["n_layer"] - 2]))        # layers 2..L−2
        assert s["psi_L_over_middle"] == pytest.approx(p["psi"][-1] / s["middle_psi"])
        assert r["summary"]["normed"]["zeta_L"] == p["zeta_normed"][-1]
    llama = res["models"][dirs[2]]
    assert llama["source"]["class"] == "LlamaForCausalLM" and llama["n_layer"] == 5
    printed = capsys.readouterr().out
    shown = {survey.table({d: res["models"][d]}).splitlines()[-1].split(" | ")[0] for d in dirs}  # long paths: their end
    rows = [line for line in printed.splitlines() if line.split(" | ")[0] in shown]
    zetas = [float(line.split(" | ")[4]) for line in rows]
    assert len(rows) == 3 and zetas == sorted(zetas, reverse=True)          # sorted by ζ_L (raw), largest first
    assert (plots / "psi_profiles.png").stat().st_size > 1000
    assert plot_problems(figs["psi_profiles.png"]) == []            # folders by their names, one panel per depth
    assert [ax.get_title() for ax in figs["psi_profiles.png"].axes] == ["models of 4 layers", "llama, 5 layers"]


def test_revisions_pass_through_and_form_a_series(folders, tmp_path, monkeypatch):
    """NAME@REVISION passes revision= to from_pretrained; numbered revisions are drawn as ζ against the step."""
    calls = []

    def fake_load_hf(path, gguf_file=None, device="cpu", dtype=torch.float32, revision=None):
        calls.append((path, revision))
        return real_load_hf(str(folders / "gpt2"), device=device, dtype=dtype)
    real_load_hf = load_hf
    monkeypatch.setattr(survey, "load_hf", fake_load_hf)
    out, plots = tmp_path / "s.json", tmp_path / "plots"
    survey.main(["--hf", "org/pythia@step20", "org/pythia@step3", "org/pythia@main", "org/olmo@step40-tokens4B",
                 "org/pythia@607a30d783dfa663caf39e06633721c8d4cfcd74", "--text", str(folders / "text.txt"),
                 "--tokens", "32", "--seq_len", "16", "--out", str(out), "--plot", str(plots)])
    assert calls[:3] == [("org/pythia", "step20"), ("org/pythia", "step3"), ("org/pythia", "main")]
    res = json.loads(out.read_text())["models"]
    assert [r["step"] for r in res.values()] == [20, 3, None, 40, None]      # (Before: a commit hash was step 74)
    assert res["org/pythia@step3"]["source"]["revision"] == "step3"
    assert (plots / "zeta_over_checkpoints.png").stat().st_size > 1000


def test_gguf_run_folders_and_a_failed_model(folders, tmp_path, monkeypatch, capsys):
    """A .gguf path loads from its folder with gguf_file=; our run folders (RUN@STEP) take part; a model that fails
    to load is recorded, the others are surveyed, and the command ends with one error line."""
    import dataclasses
    from model import Llama, LlamaConfig
    run = tmp_path / "run"
    run.mkdir()
    for step in (1, 2):
        model = Llama(LlamaConfig(vocab_size=320, n_layer=4, n_head=2, n_kv_head=1, d_model=32, ffn_hidden=64,
                                  max_seq_len=64))
        torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                    "config": {"tokenizer": "bytes"}, "step": step}, run / f"ckpt_{step:07d}.pt")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    calls = []

    def fake_load_hf(path, gguf_file=None, device="cpu", dtype=torch.float32, revision=None):
        calls.append((path, gguf_file))
        raise SystemExit(f"error: could not load Hugging Face model {path}: no")
    monkeypatch.setattr(survey, "load_hf", fake_load_hf)
    out = tmp_path / "s.json"
    with pytest.raises(SystemExit, match="^error: 1 of 3 models could not be surveyed: .*m.gguf$"):
        survey.main(["--hf", str(tmp_path / "m.gguf"), "--runs", f"{run}@1", str(run), "--text",
                     str(folders / "text.txt"), "--tokens", "32", "--seq_len", "16", "--out", str(out)])
    assert calls == [(str(tmp_path), "m.gguf")]
    assert f"| {tmp_path / 'm.gguf'} | failed: could not load" in capsys.readouterr().out   # (Before: "could not be
    res = json.loads(out.read_text())                                            # loaded" for a profile's error too)
    assert res["complete"] and "could not load" in res["models"][str(tmp_path / "m.gguf")]["error"]
    assert res["models"][f"{run}@1"]["source"]["step"] == 1 and res["models"][str(run)]["source"]["step"] == 2
    assert res["models"][str(run)]["params"] == sum(p.numel() for p in model.parameters())


def test_real_loading_failures_are_recorded_in_one_line(folders, tmp_path):
    """Models that fail to load for real (a broken GGUF file, a folder without weights) are recorded with one line
    naming the model and the part that failed; the others are surveyed."""
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    empty = tmp_path / "no_weights"
    tokenizer().save_pretrained(str(empty))
    (empty / "config.json").write_text((folders / "llama" / "config.json").read_text())
    out = tmp_path / "s.json"
    with pytest.raises(SystemExit, match="^error: 2 of 3 models could not be surveyed"):
        survey.main(["--hf", str(tmp_path / "m.gguf"), str(empty), str(folders / "gpt2"), "--text",
                     str(folders / "text.txt"), "--tokens", "32", "--seq_len", "16", "--out", str(out)])
    res = json.loads(out.read_text())["models"]
    assert res[str(tmp_path / "m.gguf")]["error"].startswith(f"could not load the tokenizer of Hugging Face model "
                                                                f"{tmp_path / 'm.gguf'}: ")
    assert res[str(empty)]["error"].startswith(f"could not load the weights of Hugging Face model {empty}: OSError")
    assert all("\n" not in r.get("error", "") for r in res.values()) and "summary" in res[str(folders / "gpt2")]


ERRORS = {   # arguments -> what the one error line names
    "no_models": (["--text", "{text}"], "give models"),
    "missing_text": (["--hf", "org/m", "--text", "{tmp}/none.txt"], "none.txt"),
    "text_without_text_field": (["--hf", "org/m", "--text", "{tmp}/notext.jsonl"], "--text {tmp}/notext.jsonl: "),
    "text_not_utf8": (["--hf", "org/m", "--text", "{tmp}/latin1.txt"], "--text {tmp}/latin1.txt: "),
    "missing_folder": (["--hf", "{tmp}/none", "--text", "{text}"], "none"),
    "missing_gguf": (["--hf", "{tmp}/x.gguf", "--text", "{text}"], "x.gguf"),
    "missing_run": (["--runs", "{tmp}", "--text", "{text}"], "no checkpoints"),
    "run_revision": (["--runs", "{tmp}@main", "--text", "{text}"], "RUN_DIR@STEP"),
    "run_step": (["--runs", "{run}@30", "--text", "{text}"], "--runs {run}@30: no such checkpoint in"),
    "folder_revision": (["--hf", "{folders}/llama@step1000", "--text", "{text}"], "llama@step1000: a revision is a hub"),
    "gguf_revision": (["--hf", "{tmp}/m.gguf@main", "--text", "{text}"], "m.gguf@main: a revision is a hub"),
    "not_a_model_folder": (["--hf", "{tmp}", "--text", "{text}"], "no config.json"),
    "twice": (["--hf", "org/m", "org/m", "--text", "{text}"], "twice"),
    "unwritable_out": (["--hf", "org/m", "--text", "{text}", "--out", "{text}/x.json"], "--out"),
    **{f"{o}={v}": (["--hf", "org/m", "--text", "{text}", o, v], o) for o, v in [
        ("--tokens", "0"), ("--seq_len", "1"), ("--batch_size", "0"), ("--analysis_tokens", "-2"), ("--tokens", "1.5"),
        ("--device", "gpu")]},
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_before_any_model_is_loaded(case, folders, tmp_path, monkeypatch):
    monkeypatch.setattr(survey, "load_hf", lambda *a, **k: pytest.fail("a model was loaded"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "notext.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "latin1.txt").write_bytes("the café".encode("latin-1"))
    (tmp_path / "run").mkdir()
    torch.save({}, tmp_path / "run" / "ckpt_0000010.pt")
    args, named = ERRORS[case]
    with pytest.raises(SystemExit) as e:
        survey.main([a.format(tmp=tmp_path, text=folders / "text.txt", folders=folders, run=tmp_path / "run")
                     for a in args])
    msg = str(e.value.code)
    assert msg.startswith("error: ") and named.format(tmp=tmp_path, run=tmp_path / "run") in msg and "\n" not in msg, msg
