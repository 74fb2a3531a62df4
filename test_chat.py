"""Tests of chat.py: cached generation against recomputation and transformers, sampling, stops, the terminal chat."""
import dataclasses
import io
import os
import subprocess
import sys

import pytest
import torch

import chat
from chat import generate, generate_uncached
from model import Llama, LlamaConfig
from prepare_fineweb import get_tokenizer
from sft import prompt_ids, render

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = LlamaConfig(vocab_size=257, n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=128, max_seq_len=64)
PROMPTS = [[5, 17, 3, 250, 9, 9, 41], [88], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [7, 7]]


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def random_model(**changes):
    """A random model with peaked logits (init_std 0.3), so that greedy tokens are far from ties."""
    torch.manual_seed(0)
    return Llama(dataclasses.replace(CFG, init_std=0.3, **changes)).eval()


pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py


@pytest.fixture(scope="module")
def enc():
    return get_tokenizer("bytes")                    # bytes 0..255, <|endoftext|> = 256


@pytest.fixture(scope="module")
def trained(enc):
    """A tiny model that has memorised three conversations under sft.py's template (byte tokens):
    a -> "Hi!", then b -> "Bye!"; b alone -> "Nope"; c -> "Yes" followed by a new user header instead of EOT."""
    convs = [render([U("a"), A("Hi!"), U("b"), A("Bye!")], enc)[0], render([U("b"), A("Nope")], enc)[0],
             prompt_ids([U("c")], enc) + enc.encode_ordinary("Yes\n<|user|>\nc")]
    x = torch.zeros(len(convs), CFG.max_seq_len, dtype=torch.long)
    y = torch.full_like(x, -1)
    for i, c in enumerate(convs):
        x[i, :len(c) - 1], y[i, :len(c) - 1] = torch.tensor(c[:-1]), torch.tensor(c[1:])
    torch.manual_seed(0)
    model = Llama(CFG)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(300):
        loss = model(x, y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1
    return model.eval()


# ---- generation ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes", [{}, {"n_kv_head": 4}, {"n_kv_head": 1, "tie_embeddings": True}])
def test_cached_greedy_equals_recomputation(changes):
    model = random_model(**changes)
    for prompt in PROMPTS:
        got = generate(model, [prompt], 24, stop_ids=(), stop_texts=())[0]
        assert got == generate_uncached(model, [prompt], 24)[0]
        assert len(set(got)) > 3                      # not a degenerate repetition


def test_batched_left_padded_equals_one_by_one():
    model = random_model()
    one_by_one = [generate(model, [p], 20, stop_ids=(), stop_texts=())[0] for p in PROMPTS]
    assert generate(model, PROMPTS, 20, stop_ids=(), stop_texts=()) == one_by_one
    assert generate(model, PROMPTS[::-1], 20, stop_ids=(), stop_texts=()) == one_by_one[::-1]


def test_greedy_equals_transformers_generate():
    model = random_model()
    hf = model.to_hf().eval()
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0     # no stop token
    ours = generate(model, PROMPTS, 20, stop_ids=(), stop_texts=())
    for prompt, tokens in zip(PROMPTS, ours):
        theirs = hf.generate(input_ids=torch.tensor([prompt]), do_sample=False, max_new_tokens=20)
        assert theirs[0, len(prompt):].tolist() == tokens
    P = max(map(len, PROMPTS))                        # transformers' own left-padded batch
    ids = torch.tensor([[0] * (P - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in PROMPTS])
    theirs = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
    assert theirs[:, P:].tolist() == ours


def test_sampling_seeded_and_top_p():
    model = random_model()
    kw = dict(max_new_tokens=20, stop_ids=(), stop_texts=())
    a = generate(model, PROMPTS, temperature=1.0, seed=1, **kw)
    assert a == generate(model, PROMPTS, temperature=1.0, seed=1, **kw)
    assert a != generate(model, PROMPTS, temperature=1.0, seed=2, **kw)
    assert a != generate(model, PROMPTS, **kw)
    assert generate(model, PROMPTS, temperature=1.0, top_p=1e-6, seed=3, **kw) == generate(model, PROMPTS, **kw)
    # the nucleus: probabilities 0.5, 0.3, 0.2; top_p 0.7 keeps the first two, in their ratio
    logits = torch.tensor([0.5, 0.3, 0.2]).log().expand(20000, 3)
    draws = chat.sample(logits, 1.0, 0.7, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1} and abs((draws == 0).float().mean().item() - 0.625) < 0.02


def test_stops_and_limits(trained, enc):
    hi, bye, nope, yes = (prompt_ids(m, enc) for m in ([U("a")], [U("a"), A("Hi!"), U("b")], [U("b")], [U("c")]))
    out = generate(trained, [hi, bye, nope, yes], 30, enc=enc)
    assert [enc.decode(t) for t in out] == ["Hi!", "Bye!", "Nope", "Yes\n"]  # EOT / "<|user|>" excluded
    raw = generate(trained, [yes], 30, stop_ids=(), stop_texts=())[0]        # what the stop text cut off
    assert enc.decode(raw).startswith("Yes\n<|user|>\nc")
    assert generate(trained, [yes], 30, enc=enc, stop_texts=("s\n<|u",))[0] == enc.encode_ordinary("Ye")
    assert enc.decode(generate(trained, [hi], 30, stop_ids=(), stop_texts=())[0]).startswith("Hi!<|endoftext|>")
    for n in (1, 2, 5):
        assert [len(t) for t in generate(trained, [hi, yes], n, stop_ids=(), stop_texts=())] == [n, n]
    assert generate(trained, [hi], 0, enc=enc) == [[]]
    long = list(range(60))                                                     # context: 64 tokens in all
    assert [len(t) for t in generate(trained, [long, hi], 30, stop_ids=(), stop_texts=())] == [4, 30]
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(trained, [list(range(64))])
    with pytest.raises(ValueError, match="enc"):
        generate(trained, [hi])


# ---- the command line ------------------------------------------------------------------------------------

def run_chat(argv, stdin, monkeypatch, capsys):
    """chat.main in this process, with stdin piped: (the replies it prints, its stderr)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    chat.main(argv)
    out = capsys.readouterr()
    return [line.removeprefix("assistant> ") for line in out.out.splitlines() if line.startswith("assistant> ")], out.err


@pytest.fixture
def run_dir(trained, tmp_path):
    """A run folder holding one checkpoint, as train.py's save_checkpoint writes it."""
    ckpt = {"model": trained.state_dict(), "optimizer": {}, "model_config": dataclasses.asdict(CFG),
            "config": {"tokenizer": "bytes"}, "step": 300, "tokens": 0, "data_state": {}, "rng": {}}
    torch.save(ckpt, tmp_path / "ckpt_0000300.pt")
    return str(tmp_path)


def test_chat_command_line(run_dir):
    """python chat.py RUN_DIR, stdin piped: multi-turn (the second turn sees the first), /clear, end of input."""
    r = subprocess.run([sys.executable, os.path.join(HERE, "chat.py"), run_dir, "--temperature", "0",
                        "--max_new_tokens", "6"], input="a\nb\n/clear\nb\n", cwd=HERE, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["assistant> Hi!", "assistant> Bye!", "assistant> Nope"]
    assert "chatting with" in r.stderr


def test_chat_history_and_steps(run_dir, monkeypatch, capsys):
    args = [run_dir, "--temperature", "0", "--step", "300"]
    assert run_chat(args + ["--max_new_tokens", "6"], "a\nb\n", monkeypatch, capsys)[0] == ["Hi!", "Bye!"]
    # 20 tokens of room do not fit after the first exchange in a 64-token context: it is dropped
    assert run_chat(args + ["--max_new_tokens", "20"], "a\nb\n", monkeypatch, capsys)[0] == ["Hi!", "Nope"]
    replies, err = run_chat(args, "x" * 70 + "\nb\n", monkeypatch, capsys)
    assert replies == ["Nope"] and "(message too long for the model's context of 64 tokens)" in err
    with pytest.raises(SystemExit, match=f"error: --step 7: no such checkpoint in {run_dir}"):
        chat.main([run_dir, "--step", "7"])


def test_chat_hf_folder(trained, enc, tmp_path, monkeypatch, capsys):
    """--hf: a transformers folder (our model's to_hf) with a byte-level tokenizer that matches `enc`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    vocab = {ch: b for b, ch in bytes_to_unicode().items()} | {"<|endoftext|>": 256}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
    assert chat.chat_prompt([U("a")], chat.HFTokenizer(tok)) == prompt_ids([U("a")], enc)
    trained.to_hf().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    argv = ["--hf", str(tmp_path), "--temperature", "0", "--max_new_tokens", "6"]
    assert run_chat(argv, "a\nb\n", monkeypatch, capsys)[0] == ["Hi!", "Bye!"]
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    assert chat.chat_prompt([U("a"), A("b"), U("c")], chat.HFTokenizer(tok)) == list(b"[a][b][c]>")


@pytest.mark.parametrize("argv, message", [
    (["r", "--temperature", "-1"], "--temperature must be finite"), (["r", "--temperature", "nan"], "--temperature"),
    (["r", "--top_p", "0"], r"--top_p must be in \(0, 1\]"), (["r", "--top_p", "1.5"], "--top_p"),
    (["r", "--max_new_tokens", "0"], "--max_new_tokens must be >= 1"), (["r", "--step", "-1"], "--step must be >= 0"),
    ([], "give a run folder or --hf"), (["r", "--hf", "x"], "give a run folder or --hf, not both"), (["r", "--gguf", "f"], "--gguf needs --hf"),
    (["--bench", "--batch", "0"], "--batch must be >= 1"), (["/nonexistent/run"], "run folder /nonexistent/run does not exist"),
])
def test_option_errors(argv, message):
    with pytest.raises(SystemExit, match="error: " + message):
        chat.main(argv)


def test_bench(capsys):
    chat.main(["--bench", "--preset", "tiny", "--prompt_len", "8", "--max_new_tokens", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "cached" in out and "uncached" in out and "same tokens: True" in out
