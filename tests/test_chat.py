"""Tests of chat.py: cached generation against recomputation and transformers, sampling, stops, the terminal chat."""
import dataclasses
import io
import os
import subprocess
import sys

import pytest
import torch

import torch.nn.functional as F

from scripts import chat
from lib.generation import generate, generate_uncached
from lib.hf import llama_to_hf
from model import Attention, KVCache, Llama, LlamaConfig, apply_rope
from tokenizer import get_tokenizer
from lib.conversations import prompt_ids, render
from lib import conversations
import tokenizer
from conftest import assert_close_ulps
from lib import generation

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
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
    """A tiny model that has memorised three conversations under prepare_sft.py's template (byte tokens):
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
    hf = llama_to_hf(model).eval()
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
    draws = generation.sample(logits, 1.0, 0.7, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1} and abs((draws == 0).float().mean().item() - 0.625) < 0.02


def test_a_stop_text_that_starts_inside_a_token_keeps_the_text_before_it():
    """As FastChat's output[:output.find(stop)]: a token holding the answer's last character and the stop text's first
    gives that character back. (Before: "Yes.<|user|>" was cut to "Yes".)"""
    enc = get_tokenizer("gpt2")
    for glue in (".<", " <"):
        tokens = enc.encode_ordinary("Yes") + [enc.encode_single_token(glue)] + enc.encode_ordinary("|user|>\nhi")
        assert enc.decode(generation.cut_at_stop_text(tokens, enc, ("<|user|>",))) == "Yes" + glue[0]


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


def padded_model():
    """A byte-vocabulary model whose head is padded to 320 rows, and padded row 317 wins every choice: the head reads
    channel 0 alone, which stays positive (the embedding sets it, no block writes to it)."""
    torch.manual_seed(0)
    model = Llama(dataclasses.replace(CFG, vocab_size=320)).eval()
    with torch.no_grad():
        model.norm.weight.zero_()
        model.norm.weight[0] = 1
        model.tok_emb.weight[:, 0] = 5.0
        for block in model.layers:
            block.attn.o_proj.weight[0] = block.mlp.down_proj.weight[0] = 0
        model.lm_head.weight[317, 0] = 100.0
    return model


def test_padded_ids_are_never_generated(enc, tmp_path, monkeypatch, capsys):
    model, kw = padded_model(), dict(stop_ids=(), stop_texts=())
    assert generate(model, PROMPTS, 8, **kw) == [[317] * 8] * 4                  # without enc: the whole head
    for temperature, top_k in ((0.0, 50), (1.0, 50), (1.0, 0)):
        out = generate(model, PROMPTS, 30, temperature, enc=enc, seed=0, top_k=top_k, **kw)
        assert max(map(max, out)) < 257 and len({t for row in out for t in row}) > (temperature > 0) * 20
    assert max(map(max, generate(model, PROMPTS, 30, 1.0, enc=enc, seed=0, vocab_limit=100, **kw))) < 100
    save_run(model, tmp_path)                                                    # chat.py decodes every reply
    for argv in (["--temperature", "0"], ["--temperature", "1", "--seed", "0"]):
        assert len(run_chat([str(tmp_path), "--max_new_tokens", "8"] + argv, "a\n", monkeypatch, capsys)[0]) == 1


def test_top_k_then_top_p():
    logits, gen = torch.tensor([0.5, 0.3, 0.2]).log().expand(20000, 3), lambda: torch.Generator().manual_seed(0)
    draws = generation.sample(logits, 1.0, 1.0, gen(), top_k=2)
    assert set(draws.tolist()) == {0, 1} and abs((draws == 0).float().mean().item() - 0.625) < 0.02
    assert set(generation.sample(logits, 1.0, 0.6, gen(), top_k=2).tolist()) == {0}      # top_p of the top 2: 0.625 > 0.6
    assert set(generation.sample(logits, 1.0, 0.6, gen()).tolist()) == {0, 1}            # top_p alone: 0.5 < 0.6
    assert set(generation.sample(logits, 1.0, 1.0, gen(), top_k=0).tolist()) == {0, 1, 2}
    model, kw = random_model(), dict(max_new_tokens=20, stop_ids=(), stop_texts=())
    assert generate(model, PROMPTS, temperature=1.0, top_k=1, seed=3, **kw) == generate(model, PROMPTS, **kw)
    default = generate(model, PROMPTS, temperature=3.0, seed=4, **kw)               # default: top_k 50
    assert default == generate(model, PROMPTS, temperature=3.0, seed=4, top_k=50, **kw)
    assert default != generate(model, PROMPTS, temperature=3.0, seed=4, top_k=0, **kw)


def test_a_stop_text_at_the_start_does_not_stop(trained, enc):
    """As FastChat's gen_model_answer: the reply is cut at a stop text only where text.find(stop) > 0."""
    ids, stop = enc.encode_ordinary, ("<|user|>",)
    assert generation.cut_at_stop_text(ids("<|user|>x<|user|>"), enc, stop) is None
    assert generation.cut_at_stop_text(ids("ab<|user|>x"), enc, stop) == ids("ab")
    yes = prompt_ids([U("c")], enc)
    assert enc.decode(generate(trained, [yes], 30, enc=enc, stop_texts=("Yes",))[0]).startswith("Yes\n<|user|>\nc")
    assert generate(trained, [yes], 30, enc=enc, stop_texts=("es",))[0] == ids("Y")


def training_forward_as_before(model, idx, targets):
    """model.py's training forward as it was before generation shared it, written out: (logits, loss, streams)."""
    (B, T), cos, sin = idx.shape, model.rope_cos[:idx.size(1)], model.rope_sin[:idx.size(1)]
    x = model.tok_emb(idx)
    streams = [x]
    for block in model.layers:
        a, h = block.attn, block.attn_norm(x)
        q = a.q_proj(h).view(B, T, a.n_head, a.head_dim).transpose(1, 2)
        k = a.k_proj(h).view(B, T, a.n_kv_head, a.head_dim).transpose(1, 2)
        v = a.v_proj(h).view(B, T, a.n_kv_head, a.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=a.n_kv_head != a.n_head)
        x = x + a.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        x = x + block.mlp(block.mlp_norm(x))
        streams.append(x)
    logits = model.lm_head(model.norm(x))
    return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=-1), streams


def test_training_forward_is_unchanged_and_a_full_prefill_equals_it():
    model = random_model()
    torch.manual_seed(1)
    idx, targets = torch.randint(0, 257, (3, 40)), torch.randint(-1, 257, (3, 40))
    out, ref = model(idx), training_forward_as_before(model, idx, targets)
    loss = F.cross_entropy(out.logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=-1)
    assert torch.equal(out.logits, ref[0]) and torch.equal(loss, ref[1])
    assert all(torch.equal(a, b) for a, b in zip(out.hidden_states, ref[2], strict=True))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(grads, torch.autograd.grad(ref[1], list(model.parameters()))))
    with torch.no_grad():                       # with a cache: the masked attention kernel, the head on one position
        cached = model(idx, cache=KVCache(model.config, 3, 40, "cpu", torch.float32))
    for a, b in zip(cached.hidden_states, out.hidden_states, strict=True):   # other kernels: equal up to rounding
        assert_close_ulps(a, b)
    assert_close_ulps(cached.logits, out.logits[:, -1:])                    # the last position's
    assert torch.equal(cached.logits, model.lm_head(cached.final_hidden[:, -1:]))   # the same product: exact


def test_generation_and_training_share_one_attention(monkeypatch):
    """An ablation of Attention (its output scaled) changes cached generation and the training forward alike."""
    model, kw = random_model(), dict(stop_ids=(), stop_texts=())
    before = generate(model, PROMPTS, 12, **kw)
    forward = Attention.forward
    monkeypatch.setattr(Attention, "forward", lambda self, *a, **k: 3.0 * forward(self, *a, **k))
    after = generate(model, PROMPTS, 12, **kw)
    assert after != before and after == [generate_uncached(model, [p], 12)[0] for p in PROMPTS]


# ---- the command line ------------------------------------------------------------------------------------

def run_chat(argv, stdin, monkeypatch, capsys):
    """chat.main in this process, with stdin piped: (the replies it prints, its stderr)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    chat.main(argv)
    out = capsys.readouterr()
    return [line.removeprefix("assistant> ") for line in out.out.splitlines() if line.startswith("assistant> ")], out.err


def save_run(model, path):
    """A run folder holding one checkpoint of model (byte tokens), as train.py writes it (checkpoint.Checkpoints.save)."""
    ckpt = {"model": model.state_dict(), "optimizer": {}, "model_config": dataclasses.asdict(model.config),
            "config": {"tokenizer": "bytes"}, "step": 300, "tokens": 0, "data_state": {}, "rng": {}}
    torch.save(ckpt, path / "ckpt_0000300.pt")
    return str(path)


@pytest.fixture
def run_dir(trained, tmp_path):
    return save_run(trained, tmp_path)


def test_chat_command_line(run_dir):
    """python -m scripts.chat RUN_DIR, stdin piped: multi-turn (the second turn sees the first), /clear, end of input."""
    r = subprocess.run([sys.executable, "-m", "scripts.chat", run_dir, "--temperature", "0",
                        "--max_new_tokens", "6"], input="a\nb\n/clear\nb\n", cwd=HERE, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["assistant> Hi!", "assistant> Bye!", "assistant> Nope"]
    assert "chatting with" in r.stderr


def test_chat_history_and_steps(run_dir, monkeypatch, capsys):
    args = [run_dir, "--temperature", "0", "--step", "300"]
    assert run_chat(args + ["--max_new_tokens", "6"], "a\nb\n", monkeypatch, capsys)[0] == ["Hi!", "Bye!"]
    # the whole history stays while its prompt fits (64 tokens): the reply is capped at what is left instead
    replies, err = run_chat(args + ["--max_new_tokens", "20", "--top_k", "1"], "a\nb\n", monkeypatch, capsys)
    assert replies == ["Hi!", "Bye!"] and "dropped" not in err
    # a 59-token prompt leaves 5 tokens for its reply; the next prompt does not fit with it: that exchange goes
    replies, err = run_chat(args, "x" * 34 + "\nb\n", monkeypatch, capsys)
    assert replies[1:] == ["Nope"] and "(the oldest 2 messages dropped: the conversation outgrew the context" in err
    assert "(reply cut at 5 tokens: the context of 64 is full)" in err
    replies, err = run_chat(args, "x" * 70 + "\nb\n", monkeypatch, capsys)
    assert replies == ["Nope"] and "(message too long for the model's context of 64 tokens)" in err
    with pytest.raises(SystemExit, match=f"error: --step 7: no such checkpoint in {run_dir}"):
        chat.main([run_dir, "--step", "7"])


def test_stream_shows_whole_characters_and_no_stop_text(enc):
    tokens = enc.encode_ordinary("  héllo wörld ✓ 日本\n<|user|>")
    shown = [chat.shown_part(enc.decode(tokens[:k]).lstrip(), ("<|user|>",)) for k in range(len(tokens))]
    assert all("\ufffd" not in s and "<" not in s for s in shown) and shown[-1] == "héllo wörld ✓ 日本"
    assert all(b.startswith(a) for a, b in zip(shown, shown[1:])) and len(set(shown)) > 10


def test_ctrl_c_stops_a_reply_and_the_chat_goes_on(run_dir, monkeypatch, capsys):
    """Ctrl-C after two tokens of a reply: they were shown (streamed) and stay as the reply; Ctrl-C before any text:
    the question is dropped; Ctrl-C at the prompt: a fresh prompt; the chat goes on to the end of input."""
    lines, calls, forward, prompts = ["a", KeyboardInterrupt, "b", "c", "b"], [], Llama.forward, []
    countdown = {"a": 3, "c": 1}                                 # forward calls: the prompt, then one per token

    def fake_input(prompt=""):
        line = lines.pop(0) if lines else EOFError
        if not isinstance(line, str):
            raise line
        calls[:] = [countdown.get(line, 0)]
        return line

    def interrupted_forward(self, *a, **k):
        calls[0] -= 1
        if calls[0] == 0:
            raise KeyboardInterrupt
        return forward(self, *a, **k)
    chat_prompt = conversations.chat_prompt
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr(Llama, "forward", interrupted_forward)
    monkeypatch.setattr(conversations, "chat_prompt", lambda m, e: prompts.append(list(m)) or chat_prompt(m, e))
    chat.main([run_dir, "--temperature", "0", "--max_new_tokens", "6"])
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == "assistant> Hi"
    whole = [p for p in prompts if p[0] == U("a")]                 # each turn's prompt with the whole history
    assert whole[1] == [U("a"), A("Hi"), U("b")] and whole[-1] == whole[1] + [whole[2][3], U("b")]
    assert "(stopped: the part shown is kept as the reply)" in out.err and "(stopped: question dropped)" in out.err


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
    assert conversations.chat_prompt([U("a")], tokenizer.HFTokenizer(tok)) == prompt_ids([U("a")], enc)
    assert generation.vocab_of(tokenizer.HFTokenizer(tok)) == generation.vocab_of(tok) == generation.vocab_of(enc) == 257
    llama_to_hf(trained).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    argv = ["--hf", str(tmp_path), "--temperature", "0", "--max_new_tokens", "6"]
    assert run_chat(argv, "a\nb\n", monkeypatch, capsys)[0] == ["Hi!", "Bye!"]
    hf = llama_to_hf(trained)
    hf.generation_config.eos_token_id = [256, ord("!")]            # an end-of-turn id beside the tokenizer's eos
    hf.save_pretrained(tmp_path)
    assert run_chat(argv, "a\n", monkeypatch, capsys)[0] == ["Hi"]              # as Hugging Face's generate stops
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    assert conversations.chat_prompt([U("a"), A("b"), U("c")], tokenizer.HFTokenizer(tok)) == list(b"[a][b][c]>")


@pytest.mark.parametrize("argv, message", [
    (["r", "--temperature", "-1"], "--temperature must be finite"), (["r", "--temperature", "nan"], "--temperature"),
    (["r", "--top_p", "0"], r"--top_p must be in \(0, 1\]"), (["r", "--top_p", "1.5"], "--top_p"),
    (["r", "--max_new_tokens", "0"], "argument --max_new_tokens: must be an integer >= 1"), (["r", "--step", "-1"], "argument --step: must be an integer >= 0"),
    ([], "give a run folder or --hf"), (["r", "--hf", "x"], "give a run folder or --hf, not both"), (["r", "--gguf", "f"], "--gguf needs --hf"),
    (["r", "--top_k", "-1"], "argument --top_k: must be an integer >= 0"), (["/nonexistent/run"], "run folder /nonexistent/run does not exist"),
])
def test_option_errors(argv, message):
    with pytest.raises(SystemExit, match="error: " + message):
        chat.main(argv)


def test_device_errors(monkeypatch):
    from scripts import bench
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("tpu", "cuda"):
        with pytest.raises(SystemExit, match=f"error: --device {device}: choose cpu"):
            chat.main(["r", "--device", device])
        with pytest.raises(SystemExit, match=f"error: --device {device}: choose cpu"):
            bench.main(["--device", device, "--no_hf"])


def test_bench(capsys):
    from scripts import bench
    bench.main(["--generate", "--preset", "tiny", "--prompt_len", "8", "--max_new_tokens", "4", "--repeats", "1",
                "--micro_batch", "1", "--device", "auto"])          # auto: the device main() chose
    out = capsys.readouterr().out
    assert "cached" in out and "uncached" in out and "same tokens: True" in out


def test_bench_against_a_revision_of_model_py(capsys, monkeypatch):
    """--against REV races model.py now against model.py at a git revision with the same weights, and says whether
    the two compute the same loss: they do at HEAD, and an ablation of the attention now makes them differ."""
    from scripts import bench
    argv = ["--against", "HEAD", "--preset", "tiny", "--vocab_size", "320", "--seq_len", "32", "--micro_batch", "2",
            "--repeats", "1", "--warmup", "0"]
    bench.main(argv)
    assert "speed now / HEAD = " in (out := capsys.readouterr().out) and "same loss: True" in out
    forward = Attention.forward
    monkeypatch.setattr(Attention, "forward", lambda self, *a, **k: 3.0 * forward(self, *a, **k))
    bench.main(argv)
    assert "same loss: False" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: --against no-such-rev: "):
        bench.main(["--against", "no-such-rev", "--preset", "tiny"])

    class Gated(Llama):                                   # an ablation that adds a parameter
        def __init__(self, cfg):
            super().__init__(cfg)
            self.gate = torch.nn.Parameter(torch.ones(1))
    monkeypatch.setattr(bench, "Llama", Gated)
    with pytest.raises(SystemExit, match=r"error: --against HEAD: its model.py takes other weights \(RuntimeError: "):
        bench.main(argv)
